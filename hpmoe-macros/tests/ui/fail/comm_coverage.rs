// A coverage error found at compile time, before lowering: a user `comm` op whose puts fill
// only half of its output's columns (E0503). The checker proves from the put's index
// expressions which elements of the output are written; the verifier's own missing-producer
// check (E1301) stays behind it for what lowering produces.
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
