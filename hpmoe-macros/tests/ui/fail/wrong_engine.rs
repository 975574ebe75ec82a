// Elementwise work moved onto the cube cores, which only run contractions.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    taskflow act(h: bf16[64, 256]) -> bf16[64, 128] {
        return swiglu(h) tile(m: 16) on aic;
    }
}

fn main() {}
