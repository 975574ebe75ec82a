// The handle's API on a small MoE-FFN forward: builder methods for the params, the typed
// signatures, the program re-checked with overrides, and a run-time compilation.
use hpmoe_dsl::embed::Dim;
use hpmoe_dsl::ir::DType;
use hpmoe_dsl::schedule::Policy;
use hpmoe_macros::taskflow;

taskflow! {
    import std::moe::{dispatch, gmm, swiglu, combine};
    import std::device::ascend_a3;

    /// Tokens per rank.
    param tokens = 256;
    param hidden = 512;
    param inter = 128;
    param experts = 16;
    param topk = 2;
    param ranks = 2;

    device = ascend_a3 { ranks: ranks };
    route r = balanced(experts: experts, topk: topk);

    /// A small MoE-FFN layer.
    taskflow moe_ffn(x: bf16[tokens, hidden],
                     w_up: bf16[experts / ranks, hidden, 2 * inter],
                     w_down: bf16[experts / ranks, inter, hidden]) -> bf16[tokens, hidden] {
        let xd = dispatch(x, r) tile(t: 64) order(ratr);
        let h = gmm(xd, w_up) tile(m: 64, n: 128);
        let a = swiglu(h) tile(m: 64);
        let y = gmm(a, w_down) tile(m: 64, n: 128);
        return combine(y, r) tile(m: 64) order(ratr);
    }

    schedule moe_ffn = expert_level;
}

fn main() {
    assert_eq!(MoeFfn::NAME, "moe_ffn");
    assert_eq!(MoeFfn::PARAMS.len(), 6);
    let x = MoeFfn::INPUTS.x;
    assert_eq!(
        (x.name, x.dtype, x.shape),
        ("x", DType::Bf16, &[Dim::Fixed(256), Dim::Fixed(512)][..])
    );
    assert_eq!(x.written, "bf16[tokens, hidden]");
    assert_eq!(
        MoeFfn::INPUTS.w_up.shape,
        &[Dim::Fixed(8), Dim::Fixed(512), Dim::Fixed(256)][..]
    );
    assert_eq!(MoeFfn::OUTPUTS.out.bytes(), 256 * 512 * 2);

    let flow = MoeFfn::new().tokens(128).ranks(4);
    let program = flow.program().unwrap();
    assert_eq!(
        program.params[0],
        ("tokens".to_string(), hpmoe_dsl::ir::Value::Int(128))
    );
    // The declared policy by default; another one on request.
    let c = flow.compile(None).unwrap();
    assert_eq!(c.policy.policy, Policy::ExpertLevel);
    let c = flow.compile(Some(Policy::Interleaved)).unwrap();
    assert!(c.summary().contains("schedule interleaved"));
    // An override that breaks the program is a run-time error with its diagnostics.
    let err = MoeFfn::new().ranks(3).program().unwrap_err();
    assert!(err.to_string().contains("E0803"), "{err}");
}
