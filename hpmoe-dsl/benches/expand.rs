//! The `taskflow!` expansion: tokens → parse → check → lower, verify and schedule every
//! taskflow → the handle's tokens, as the macro runs it at compile time (here optimised; a
//! proc macro's dependencies are built with the host profile).
//!
//! Run: `cargo bench -p hpmoe-dsl --features proc-macro2 --bench expand`.

use divan::Bencher;
use hpmoe_dsl::embed::{expand_with, ExpandOptions};
use proc_macro2::TokenStream;
use std::str::FromStr;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

fn run(b: Bencher, rel: &str, max_tasks: u64) {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let opts = ExpandOptions {
        max_tasks,
        ..ExpandOptions::default()
    };
    // The expansion must succeed (no `compile_error!`).
    let out = expand_with(TokenStream::from_str(&text).unwrap(), &opts).to_string();
    assert!(!out.contains("compile_error"), "{out}");
    // `proc_macro2` token streams are not `Sync`: each sample gets a stream parsed (untimed)
    // from the text.
    b.with_inputs(|| TokenStream::from_str(&text).unwrap())
        .bench_values(|ts| expand_with(ts, &opts));
}

/// The stdlib MoE-FFN forward example (`tests/ok/moe_forward.hpm`: EP8, 2048 tokens per
/// rank, 64 experts), checked, lowered, verified and scheduled.
#[divan::bench(sample_count = 20)]
fn moe_forward(b: Bencher) {
    run(b, "tests/ok/moe_forward.hpm", hpmoe_dsl::embed::MAX_COMPILE_TIME_TASKS);
}

/// The same, checked only (no lowering).
#[divan::bench(sample_count = 20)]
fn moe_forward_check_only(b: Bencher) {
    run(b, "tests/ok/moe_forward.hpm", 0);
}

/// DeepSeek-V3 EP8 forward (4096 tokens per rank, 256 experts; about 98 000 tasks).
#[divan::bench(sample_count = 10)]
fn deepseek_v3_ep8_fwd(b: Bencher) {
    run(
        b,
        "examples/deepseek_v3_ep8_fwd.hpm",
        hpmoe_dsl::embed::MAX_COMPILE_TIME_TASKS,
    );
}
