// A call with one argument too many.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{gmm};
    taskflow proj(x: bf16[64, 256], w: bf16[1, 256, 128]) -> bf16[64, 128] {
        return gmm(x, w, w);
    }
}

fn main() {}
