// Several independent errors in one invocation are all reported, each at its tokens; the
// handle is still generated, so the code that uses it compiles and adds no error of its own.
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch, gmm, swiglu, combine};
    import std::device::ascend_a3;

    param tokens = 256;
    param hidden = 512;
    param inter = 128;
    param experts = 16;
    param ranks = 2;

    device = ascend_a3 { ranks: ranks };
    route r = balanced(experts: experts, topk: 2);

    taskflow moe_ffn(x: bf16[tokens, hidden],
                     w_up: bf16[experts / ranks, hidden, 2 * inter],
                     w_down: bf16[experts / ranks, inter, hidden]) -> bf16[tokens, hidden] {
        let xd = dispatch(x, r) tile(t: 64);
        let h = gmm(xd, w_up) tile(m: 64, n: 128);
        let a = swiglo(h) tile(m: 64);
        let y = gmm(a, w_dwn) tile(m: 64, n: 128);
        return combine(y, r) tile(m: 64);
    }
}

fn main() {
    let flow = MoeFfn::new().tokens(128).hidden(256);
    let _ = MoeFfn::INPUTS.w_up;
    let _ = MoeFfn::OUTPUTS.out;
    let _ = flow.compile(None);
}
