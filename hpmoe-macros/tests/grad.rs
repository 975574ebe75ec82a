//! `taskflow!` with a backward derived by `grad`: the derived taskflow gets a typed handle
//! like a written one (its inputs and outputs from the checked derivation), and compiles at
//! run time to the same task graph as the program checked from text.

use hpmoe_dsl::embed::Dim;
use hpmoe_dsl::ir::DType;
use hpmoe_dsl::schedule::Policy;
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch, gmm, swiglu, combine};
    import std::device::ascend_a3;

    param tokens = 128;
    param hidden = 256;
    param inter = 64;
    param experts = 8;
    param ranks = 2;

    device = ascend_a3 { ranks: ranks };
    route r = balanced(experts: experts, topk: 2);

    taskflow moe_ffn(x: bf16[tokens, hidden],
                     w_up: bf16[experts / ranks, hidden, 2 * inter],
                     w_down: bf16[experts / ranks, inter, hidden]) -> bf16[tokens, hidden] {
        let xd = dispatch(x, r) tile(t: 64);
        let h = gmm(xd, w_up) tile(m: 64, n: 128);
        let a = swiglu(h) tile(m: 64);
        let y = gmm(a, w_down) tile(m: 64, n: 128);
        return combine(y, r) tile(m: 64);
    }

    /// The derived backward.
    taskflow moe_ffn_bwd = grad(moe_ffn, wrt: [x, w_up, w_down], save: [xd, h]);
}

#[test]
fn a_derived_backward_has_a_typed_handle() {
    assert_eq!(MoeFfnBwd::NAME, "moe_ffn_bwd");
    let dy = MoeFfnBwd::INPUTS.dy;
    assert_eq!(
        (dy.name, dy.dtype, dy.shape),
        ("dy", DType::Bf16, &[Dim::Fixed(128), Dim::Fixed(256)][..])
    );
    assert_eq!(dy.written, "bf16[128, 256]");
    // The saved receive window, with the routing's capacity.
    let xd = MoeFfnBwd::INPUTS.xd;
    assert_eq!(xd.written, "bf16[r.recv, 256]");
    assert!(matches!(xd.shape[0], Dim::Recv { route: "r", .. }));
    let dw_up = MoeFfnBwd::OUTPUTS.dw_up;
    assert_eq!(
        (dw_up.dtype, dw_up.shape),
        (DType::Bf16, &[Dim::Fixed(4), Dim::Fixed(256), Dim::Fixed(128)][..])
    );
    assert_eq!(MoeFfnBwd::OUTPUTS.dx.written, "bf16[128, 256]");

    // Compiled at run time with a param changed: the same graph as the checked text.
    let c = MoeFfnBwd::new().tokens(64).compile(Some(Policy::Interleaved)).unwrap();
    assert_eq!(c.taskflow().name, "moe_ffn_bwd");
    let text = MoeFfnBwd::SOURCE
        .text
        .replace("param tokens = 128;", "param tokens = 64;");
    let mut sm = hpmoe_dsl::SourceMap::new();
    let checked = hpmoe_dsl::driver::check_text("t.hpm", &text, None, &Default::default(), &mut sm)
        .checked
        .unwrap();
    let spec = hpmoe_dsl::schedule::PolicySpec::defaults(&checked, Policy::Interleaved);
    let g = checked
        .compile(checked.taskflow("moe_ffn_bwd").unwrap(), &spec, &Default::default())
        .unwrap();
    assert_eq!(c.compiled.graph.len(), g.graph.len());
    assert!(!g.graph.is_empty());
}
