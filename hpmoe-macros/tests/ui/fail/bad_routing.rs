// Routing parameters that cannot describe a routing: top-16 of 8 experts.
use hpmoe_macros::taskflow;

taskflow! {
    import std::device::ascend_a3;
    device = ascend_a3 { ranks: 8 };
    route r = balanced(experts: 8, topk: 16);
}

fn main() {}
