// Identifiers beyond ASCII: Rust takes them, the language does not (as in a file). A
// taskflow named so has no handle name; each is an error at the identifier.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    param café = 64;
    taskflow _٣(h: bf16[64, 256]) -> bf16[64, 128] {
        return swiglu(h) tile(m: 16);
    }
}

fn main() {}
