// A verification error found after lowering, at compile time. The language cannot write a
// dependency cycle between taskflow statements (a `let` can only use earlier names), so this
// case shows the verifier's other ordering error: a user `comm` op that combines with `=`
// instead of `+=`, so the top-k copies of a token write the same row with no ordering
// (E1303, write conflict).
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch};
    import std::device::ascend_a3;

    device = ascend_a3 { ranks: 2 };
    route r = balanced(experts: 4, topk: 2);

    comm combine_set<T>(y: T[r.recv, H], r: route) -> T[r.tokens, H] {
        put out @ r.src_rank(m) [r.src_token(m), h] = y[m, h];
    }

    taskflow f(x: bf16[64, 128]) -> bf16[64, 128] {
        let xd = dispatch(x, r) tile(t: 16);
        return combine_set(xd, r) tile(m: 16);
    }
}

fn main() {}
