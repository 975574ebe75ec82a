// A syntax error: a param without `=`. The caret is on the token the parser stopped at.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    param rows 64;
    taskflow act(h: bf16[64, 256]) -> bf16[64, 128] {
        return swiglu(h) tile(m: 16);
    }
}

fn main() {}
