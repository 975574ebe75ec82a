//! The DeepSeek-V3-style MoE-FFN forward at expert-parallel degree 8, written inline with
//! `taskflow!`: the program is parsed, checked, lowered, verified and scheduled while this
//! file compiles (a mistake in it is a compile error at its tokens). At run time the handle
//! re-checks it with the chosen params and compiles it with the interleaved policy.
//!
//! Run: `cargo run --release --example macro_moe [TOKENS_PER_RANK]`.

use hpmoe_dsl::schedule::Policy;
use hpmoe_macros::taskflow;

taskflow! {
    //! DeepSeek-V3-style MoE-FFN forward at expert-parallel degree 8 on Ascend A3 dies.
    //!
    //! 256 routed experts of hidden size 7168 and intermediate size 2048, top-8 routing,
    //! 4096 tokens per rank. Each rank holds 256 / 8 = 32 experts.

    import std::moe::{dispatch, gmm, swiglu, combine};
    import std::device::ascend_a3;

    /// Tokens per rank.
    param tokens = 4096;
    param hidden = 7168;
    param inter = 2048;
    param experts = 256;
    param topk = 8;
    /// The expert-parallel degree.
    param ranks = 8;

    device = ascend_a3 { ranks: ranks };
    route r = balanced(experts: experts, topk: topk);

    /// One MoE-FFN layer: dispatch, grouped up-projection, SwiGLU, grouped down-projection,
    /// combine.
    taskflow moe_ffn(x: bf16[tokens, hidden],
                     w_up: bf16[experts / ranks, hidden, 2 * inter],
                     w_down: bf16[experts / ranks, inter, hidden]) -> bf16[tokens, hidden] {
        let xd = dispatch(x, r) tile(t: 128) order(ratr);
        let h = gmm(xd, w_up) tile(m: 128, n: 256);
        let a = swiglu(h) tile(m: 64);
        let y = gmm(a, w_down) tile(m: 128, n: 256);
        return combine(y, r) tile(m: 128) order(ratr);
    }

    schedule moe_ffn = interleaved { priority: critical_path };
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tokens: i64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 4096,
    };
    println!("taskflow `{}` (checked at compile time)", MoeFfn::NAME);
    for p in MoeFfn::PARAMS {
        println!("  param {} = {:?}", p.name, p.default);
    }
    let inputs = MoeFfn::INPUTS;
    for t in [inputs.x, inputs.w_up, inputs.w_down] {
        println!("  input  {t}  ({} MiB per rank)", t.bytes() >> 20);
    }
    println!("  output {}", MoeFfn::OUTPUTS.out);

    let flow = MoeFfn::new().tokens(tokens);
    let compiled = flow.compile(Some(Policy::Interleaved))?;
    print!("{}", compiled.summary());

    // Simulate it on the device model and print the report.
    let tf = &compiled.program.taskflows[compiled.index];
    let sim = hpmoe_sim::sim::simulate_compiled(&compiled.program, tf, &compiled.compiled, Default::default())
        .map_err(|e| format!("simulation failed: {e:?}"))?;
    let report = hpmoe_sim::report::Report::new(
        &compiled.program,
        tf,
        &compiled.compiled.graph,
        &compiled.compiled.schedule,
        &sim.workload,
        &sim.model,
        &sim.result,
    );
    println!();
    print!("{}", report.human());
    Ok(())
}
