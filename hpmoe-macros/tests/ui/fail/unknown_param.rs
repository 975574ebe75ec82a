// The handle is typed: a param the program does not have is a Rust error at the method call.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    param rows = 64;
    taskflow act(h: bf16[rows, 256]) -> bf16[rows, 128] {
        return swiglu(h) tile(m: 16);
    }
}

fn main() {
    let _ = Act::new().rows(32).cols(8);
    let _: u64 = Act::INPUTS.h.dtype;
}
