//! Lowering, verification and scheduling throughput on the DeepSeek-V3 MoE layer (H 7168,
//! I 2048, 256 experts, top-8, 4096 tokens per rank), forward and backward, at EP8 and EP64.
//!
//! Run: `cargo bench -p hpmoe-dsl --bench lowering`.

use divan::counter::ItemsCount;
use divan::Bencher;
use hpmoe_dsl::check::{check_path, Options, Override};
use hpmoe_dsl::ir::Program;
use hpmoe_dsl::lower::{self, LowerOptions};
use hpmoe_dsl::schedule::{self, Policy, PolicySpec};
use hpmoe_dsl::SourceMap;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

fn program(file: &str, ranks: u32) -> Program {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let opts = Options {
        overrides: vec![Override::parse(&format!("ranks={ranks}")).unwrap()],
        ..Options::default()
    };
    check_path(&path, &opts, &mut SourceMap::new())
        .program
        .expect("the example checks")
}

const CASES: &[(&str, u32)] = &[
    ("deepseek_v3_ep8_fwd.hpm", 8),
    ("deepseek_v3_ep8_bwd.hpm", 8),
    ("deepseek_v3_ep8_fwd.hpm", 64),
    ("deepseek_v3_ep8_bwd.hpm", 64),
];

fn name(i: usize) -> String {
    format!(
        "{}@EP{}",
        CASES[i].0.trim_end_matches(".hpm").replace("deepseek_v3_ep8_", ""),
        CASES[i].1
    )
}

// Ten samples: a lowering takes 10 to 100 ms, so the fastest of ten is still quick to get,
// and on a shared machine the fastest of three is often a slow one.
#[divan::bench(args = [0, 1, 2, 3], sample_count = 10, sample_size = 1)]
fn lower_tasks(b: Bencher, case: usize) {
    let p = program(CASES[case].0, CASES[case].1);
    let layouts = lower::layouts(&p, false).unwrap();
    let n = lower::lower(&p, &p.taskflows[0], layouts.clone(), &LowerOptions::default())
        .unwrap()
        .len();
    eprintln!("{}: {n} tasks", name(case));
    // The routing layouts are lowering's input (made once by `lower::layouts`): their copy
    // for each sample is made outside the timing.
    b.counter(ItemsCount::new(n))
        .with_inputs(|| layouts.clone())
        .bench_values(|l| lower::lower(&p, &p.taskflows[0], l, &LowerOptions::default()).unwrap());
}

#[divan::bench(args = [0, 1, 2, 3], sample_count = 3, sample_size = 1)]
fn verify_graph(b: Bencher, case: usize) {
    let p = program(CASES[case].0, CASES[case].1);
    let layouts = lower::layouts(&p, false).unwrap();
    let g = lower::lower(&p, &p.taskflows[0], layouts, &LowerOptions::default()).unwrap();
    b.counter(ItemsCount::new(g.len())).bench(|| {
        let ds = hpmoe_dsl::verify::verify_graph(&p, &p.taskflows[0], &g);
        assert!(ds.is_empty());
    });
}

#[divan::bench(args = [0, 1, 2, 3], sample_count = 3, sample_size = 1)]
fn schedule_interleaved(b: Bencher, case: usize) {
    let p = program(CASES[case].0, CASES[case].1);
    let layouts = lower::layouts(&p, false).unwrap();
    let g = lower::lower(&p, &p.taskflows[0], layouts, &LowerOptions::default()).unwrap();
    let spec = PolicySpec::defaults(&p, Policy::Interleaved);
    b.counter(ItemsCount::new(g.len()))
        .bench(|| schedule::schedule(&p, &p.taskflows[0], &g, &spec));
}
