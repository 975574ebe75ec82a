// Rust literals the language does not have: a suffixed integer and a byte string. The
// other param is still a typed builder method of the handle (no cascade of errors).
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    param rows = 64u32;
    param name = b"x";
    taskflow act(h: bf16[64, 256]) -> bf16[64, 128] {
        return swiglu(h) tile(m: 16);
    }
}

fn main() {
    let _ = Act::new().rows(32);
}
