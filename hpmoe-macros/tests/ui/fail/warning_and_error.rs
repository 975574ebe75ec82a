// A warning of the language (E0205, a value computed but never used) is a Rust warning at its
// tokens; the error beside it is a compile error.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{add, swiglu};
    taskflow f(x: f32[64, 128], y: f32[64, 64]) -> f32[64, 64] {
        let a = swiglu(x) tile(m: 16);
        let dead = add(a, y);
        return add(a, z);
    }
}

fn main() {}
