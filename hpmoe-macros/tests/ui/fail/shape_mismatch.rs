// Shapes that do not agree: `K` is 256 from `x` but 512 from `w`.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{gmm};
    param hidden = 256;
    taskflow proj(x: bf16[64, hidden], w: bf16[1, 2 * hidden, 128]) -> bf16[64, 128] {
        return gmm(x, w) tile(m: 64, n: 128);
    }
}

fn main() {}
