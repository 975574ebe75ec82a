//! Simulation throughput (simulated tasks per second) on the DeepSeek-V3 MoE layer (H 7168,
//! I 2048, 256 experts, top-8, 4096 tokens per rank), forward and backward, at EP8 and EP64,
//! under the interleaved and kernel-by-kernel schedules. `simulate_tasks` times the event
//! loop alone in simulated tasks per second, `simulate_events` the same in events per second;
//! `prepare_tasks` the workload (per-task costs, L2 blocks, flows) it needs.
//!
//! Run: `cargo bench -p hpmoe-sim --bench sim`.

use divan::counter::ItemsCount;
use divan::Bencher;
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{check_path, Checked, CompileOptions, Compiled};
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::model::DeviceModel;
use hpmoe_sim::sim::{simulate, SimOptions, Workload};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

const CASES: &[(&str, u32, Policy)] = &[
    ("deepseek_v3_ep8_fwd.hpm", 8, Policy::Interleaved),
    ("deepseek_v3_ep8_bwd.hpm", 8, Policy::Interleaved),
    ("deepseek_v3_ep8_fwd.hpm", 64, Policy::Interleaved),
    ("deepseek_v3_ep8_bwd.hpm", 64, Policy::Interleaved),
    ("deepseek_v3_ep8_fwd.hpm", 64, Policy::KernelByKernel),
    ("deepseek_v3_ep8_bwd.hpm", 64, Policy::KernelByKernel),
];

fn compiled(case: usize) -> (Checked, Compiled) {
    let (file, ranks, policy) = CASES[case];
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let opts = Options {
        overrides: vec![Override::parse(&format!("ranks={ranks}")).expect("an override")],
        ..Options::default()
    };
    let p = check_path(&path, &opts, &mut SourceMap::new())
        .checked
        .expect("the example checks");
    let spec = PolicySpec::defaults(&p, policy);
    let opts = CompileOptions {
        verify: false,
        ..CompileOptions::default()
    };
    let c = p.compile(&p.taskflows[0], &spec, &opts).expect("it compiles");
    let (file, ranks, policy) = CASES[case];
    eprintln!(
        "{} EP{ranks} {}: {} tasks",
        file.trim_end_matches(".hpm"),
        policy.name(),
        c.graph.len()
    );
    (p, c)
}

#[divan::bench(args = [0, 1, 2, 3, 4, 5], sample_count = 10, sample_size = 1)]
fn simulate_tasks(b: Bencher, case: usize) {
    let (p, c) = compiled(case);
    let m = DeviceModel::new(&p.device).expect("a device");
    let w = Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    b.counter(ItemsCount::new(c.graph.len()))
        .bench(|| simulate(&w, &c.schedule, &m, SimOptions::default()).expect("no stall"));
}

/// The same loop counted in events (task starts and ends, signals, flow and HBM updates).
#[divan::bench(args = [0, 1, 2, 3, 4, 5], sample_count = 10, sample_size = 1)]
fn simulate_events(b: Bencher, case: usize) {
    let (p, c) = compiled(case);
    let m = DeviceModel::new(&p.device).expect("a device");
    let w = Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    let events = simulate(&w, &c.schedule, &m, SimOptions::default())
        .expect("no stall")
        .events;
    eprintln!(
        "  {events} events, {:.2} per task",
        events as f64 / c.graph.len() as f64
    );
    b.counter(ItemsCount::new(events as usize))
        .bench(|| simulate(&w, &c.schedule, &m, SimOptions::default()).expect("no stall"));
}

#[divan::bench(args = [0, 1, 2, 3], sample_count = 3, sample_size = 1)]
fn prepare_tasks(b: Bencher, case: usize) {
    let (p, c) = compiled(case);
    let m = DeviceModel::new(&p.device).expect("a device");
    b.counter(ItemsCount::new(c.graph.len()))
        .bench(|| Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m));
}
