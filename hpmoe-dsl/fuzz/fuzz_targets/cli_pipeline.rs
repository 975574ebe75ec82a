//! The command-line pipeline as `hpmoe lower` / `hpmoe run` drive it: a source text (an
//! example with bytes spliced in, or arbitrary text), `--set NAME=VALUE` overrides,
//! `--device`, `--routing` and `--policy` strings, then checking, taskflow and policy
//! selection, lowering, verification and scheduling under a small task limit. A run ends
//! in a checked program that compiles, or in diagnostics with a code; nothing may panic,
//! hang or exhaust memory.
#![no_main]

use arbitrary::Arbitrary;
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{check_text, CompileOptions};
use hpmoe_dsl::schedule::Policy;
use hpmoe_dsl::SourceMap;
use libfuzzer_sys::fuzz_target;

/// Programs to start from: each example of the repository, embedded at build time.
const SEEDS: &[&str] = &[
    include_str!("../../../examples/swiglu_add.hpm"),
    include_str!("../../../examples/deepseek_v3_ep4_fwd.hpm"),
    include_str!("../../../examples/quant_dispatch.hpm"),
    include_str!("../../../tests/ok/user_comm.hpm"),
    include_str!("../../../tests/ok/comm_multi.hpm"),
];

#[derive(Arbitrary, Debug)]
struct Cli {
    seed: u8,
    /// Bytes to splice into the seed at `at` (replacing `cut` bytes), or the whole text.
    splice: Vec<u8>,
    at: u16,
    cut: u8,
    whole: bool,
    sets: Vec<(String, String)>,
    device: Option<String>,
    routing: Option<String>,
    policy: Option<String>,
    taskflow: Option<String>,
    max_tasks: u32,
}

fuzz_target!(|c: Cli| {
    let text = if c.whole {
        String::from_utf8_lossy(&c.splice).into_owned()
    } else {
        let base = SEEDS[c.seed as usize % SEEDS.len()].as_bytes();
        let at = (c.at as usize).min(base.len());
        let end = (at + c.cut as usize).min(base.len());
        let mut v = base[..at].to_vec();
        v.extend_from_slice(&c.splice);
        v.extend_from_slice(&base[end..]);
        String::from_utf8_lossy(&v).into_owned()
    };
    // `--set` parses as the CLI does; a refused override is a usage error, not a panic.
    let mut overrides = Vec::new();
    for (n, v) in c.sets.iter().take(8) {
        match Override::parse(&format!("{n}={v}")) {
            Ok(o) => overrides.push(o),
            Err(e) => {
                assert!(!e.is_empty());
                return;
            }
        }
    }
    let opts = Options {
        overrides,
        device: c.device.clone(),
        routing: c.routing.clone(),
        allow_paths: Vec::new(),
    };
    let mut sources = SourceMap::new();
    let out = check_text("fuzz.hpm", &text, None, &opts, &mut sources);
    for d in out.diagnostics.as_slice() {
        let _ = hpmoe_dsl::diag::render(d, &sources, hpmoe_dsl::diag::RenderStyle::Plain);
    }
    let Some(checked) = out.checked else {
        assert!(out.diagnostics.has_errors(), "refused without an error");
        return;
    };
    let policy = match c.policy.as_deref().map(Policy::parse) {
        Some(Some(p)) => Some(p),
        Some(None) => return,
        None => None,
    };
    let tfs = match checked.select_taskflows(c.taskflow.as_deref()) {
        Ok(t) => t,
        Err(d) => {
            assert!(!d.message.is_empty());
            return;
        }
    };
    let copts = CompileOptions {
        max_tasks: u64::from(c.max_tasks % 200_000),
        verify: true,
    };
    for tf in tfs {
        let spec = checked.select_policy(&tf.name, policy);
        // Refusals (limits, sizes) are diagnostics with a code; a compiled graph is whole.
        match checked.compile(tf, &spec, &copts) {
            Ok(compiled) => assert!(compiled.graph.len() as u64 <= copts.max_tasks),
            Err(ds) => assert!(!ds.is_empty() && ds.iter().all(|d| !d.message.is_empty())),
        }
    }
});
