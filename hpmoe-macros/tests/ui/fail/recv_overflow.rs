// A receive window too small for what the routing sends: a skewed routing sized as if it were
// balanced (capacity factor 1.0).
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch, combine};
    import std::device::ascend_a3;

    device = ascend_a3 { ranks: 8 };
    route skew = zipf(experts: 64, topk: 4, s: 1.5, capacity_factor: 1.0);

    taskflow f(x: bf16[512, 256]) -> bf16[512, 256] {
        return combine(dispatch(x, skew), skew);
    }
}

fn main() {}
