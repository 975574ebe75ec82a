// A vector tile whose rows do not fit in the Unified Buffer (192 KiB on the A3, double
// buffered): one row of 2 x 65536 bf16 inputs is already 256 KiB.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    param wide = 65536;
    taskflow act(h: bf16[64, 2 * wide]) -> bf16[64, wide] {
        return swiglu(h) tile(m: 1);
    }
}

fn main() {}
