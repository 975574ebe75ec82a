// A verification error found after lowering, at compile time. Races (a reader not ordered
// after its writer) cannot be written in the language: dependencies are derived from the
// regions each tile reads and writes. This case shows the verifier's other coverage error: a
// user `comm` op whose puts fill only half of its output's columns, so the `add` that reads
// the whole output reads rows no task writes (E1301, missing producer).
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch, add};
    import std::device::ascend_a3;

    device = ascend_a3 { ranks: 2 };
    route r = balanced(experts: 4, topk: 2);

    comm combine_half<T>(y: T[r.recv, H], r: route) -> T[r.tokens, 2 * H] {
        put out @ r.src_rank(m) [r.src_token(m), h] += y[m, h];
    }

    taskflow f(x: bf16[64, 128], z: bf16[64, 256]) -> bf16[64, 256] {
        let xd = dispatch(x, r) tile(t: 16);
        let y = combine_half(xd, r) tile(m: 16);
        return add(y, z);
    }
}

fn main() {}
