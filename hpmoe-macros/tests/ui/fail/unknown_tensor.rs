// A tensor that is not defined (`w_dwn` for `w_down`).
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{gmm};
    taskflow proj(x: bf16[64, 256], w_down: bf16[1, 256, 128]) -> bf16[64, 128] {
        return gmm(x, w_dwn);
    }
}

fn main() {}
