// Dtypes that do not agree: the generic `T` of `add` is bf16 from `a` and f16 from `b`.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{add};
    taskflow sum2(a: bf16[64, 64], b: f16[64, 64]) -> bf16[64, 64] {
        return add(a, b);
    }
}

fn main() {}
