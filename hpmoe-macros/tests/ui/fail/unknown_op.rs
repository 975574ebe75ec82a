// An op that does not exist (a typo of `swiglu`): the error is at the name, with a suggestion.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{swiglu};
    taskflow act(h: bf16[64, 256]) -> bf16[64, 128] {
        return swiglo(h) tile(m: 16);
    }
}

fn main() {}
