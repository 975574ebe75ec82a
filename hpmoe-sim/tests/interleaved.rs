//! The `interleaved` policy against the other two, the L2 effect of tile interleaving, and
//! the lower bound: the 40-case matrix (the 8 MoE example taskflows x 5 routings) at small
//! shapes, the SwiGLU + Add microbenchmark's hit bytes computed by hand, and the bound below
//! the simulated latency of every policy on every example and on random small programs.

use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{check_path, check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::schedule::{candidate, Policy, PolicySpec, Priority, CANDIDATES};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::pipeline;
use hpmoe_sim::report::Report;
use hpmoe_sim::sim::{self, SimOptions};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn checked(path: &Path, overrides: &[&str], routing: Option<&str>) -> Checked {
    let opts = Options {
        overrides: overrides
            .iter()
            .map(|o| Override::parse(o).expect("an override"))
            .collect(),
        routing: routing.map(str::to_string),
        ..Options::default()
    };
    let out = check_path(path, &opts, &mut SourceMap::new());
    out.checked
        .unwrap_or_else(|| panic!("{} does not check: {:?}", path.display(), out.diagnostics))
}

fn compile(p: &Checked, tf: usize, spec: &PolicySpec) -> Compiled {
    let mut clock = hpmoe_dsl::timing::Clock::new();
    pipeline::compile(p, &p.taskflows[tf], spec, &CompileOptions::default(), &mut clock)
        .unwrap_or_else(|ds| panic!("does not compile: {ds:?}"))
}

/// Compiles and simulates taskflow `tf` under `spec`: its report.
fn report(p: &Checked, tf: usize, spec: &PolicySpec) -> Report {
    let t = &p.taskflows[tf];
    let c = compile(p, tf, spec);
    let s = sim::simulate_compiled(p, t, &c, SimOptions::default()).unwrap_or_else(|e| panic!("{e:?}"));
    Report::new(p, t, &c.graph, &c.schedule, &s.workload, &s.model, &s.result)
}

fn spec(p: &Checked, tf: usize, policy: Policy) -> PolicySpec {
    p.select_policy(&p.taskflows[tf].name, Some(policy))
}

/// The bound holds (up to rounding of sums in a different order).
fn bound_holds(r: &Report, what: &str) {
    assert!(
        r.bound <= r.latency * (1.0 + 1e-9),
        "{what}: bound {} us ({}) above the latency {} us; bounds {:?}",
        r.bound * 1e6,
        r.bound_kind,
        r.latency * 1e6,
        r.bounds
    );
}

const MOE_EXAMPLES: [&str; 8] = [
    "deepseek_v3_ep4_fwd",
    "deepseek_v3_ep4_bwd",
    "deepseek_v3_ep8_fwd",
    "deepseek_v3_ep8_bwd",
    "deepseek_v3_ep16_fwd",
    "deepseek_v3_ep16_bwd",
    "qwen_moe_ep8_fwd",
    "qwen_moe_ep8_bwd",
];

/// The examples' own routing (balanced), then replacements of its kind.
const ROUTINGS: [Option<&str>; 5] = [
    None,
    Some("zipf(s: 0.8)"),
    Some("zipf(s: 1.2)"),
    Some("hotspot(max_over_mean: 1.5)"),
    Some("hotspot(max_over_mean: 2)"),
];

/// Small shapes of an example (the same call graph and tiles, fewer and narrower rows).
fn small_shape(name: &str) -> &'static [&'static str] {
    if name.starts_with("qwen") {
        &["tokens=256", "hidden=1024", "inter=256"]
    } else {
        &["tokens=256", "hidden=1024", "inter=256", "experts=32"]
    }
}

#[test]
fn interleaved_never_loses_on_the_forty_case_matrix() {
    let mut losses = Vec::new();
    for name in MOE_EXAMPLES {
        let path = root().join("examples").join(format!("{name}.hpm"));
        for routing in ROUTINGS {
            let p = checked(&path, small_shape(name), routing);
            let routing = routing.unwrap_or("balanced");
            let lat: Vec<f64> = [Policy::Interleaved, Policy::ExpertLevel, Policy::KernelByKernel]
                .into_iter()
                .map(|policy| {
                    let r = report(&p, 0, &spec(&p, 0, policy));
                    bound_holds(&r, &format!("{name} {routing} {policy:?}"));
                    r.latency
                })
                .collect();
            if lat[0] > lat[1].min(lat[2]) {
                losses.push(format!(
                    "{name} {routing}: interleaved {:.1} us, expert_level {:.1} us, kbk {:.1} us",
                    lat[0] * 1e6,
                    lat[1] * 1e6,
                    lat[2] * 1e6
                ));
            }
        }
    }
    assert!(losses.is_empty(), "interleaved loses:\n{}", losses.join("\n"));
}

#[test]
fn every_example_stays_above_its_bound_under_every_policy() {
    for name in ["geglu", "deepseek_v3_layer", "swiglu_add"] {
        let path = root().join("examples").join(format!("{name}.hpm"));
        let small: &[&str] = if name == "swiglu_add" {
            &["rows=2048"]
        } else {
            &["tokens=256", "hidden=1024", "inter=256"]
        };
        let p = checked(&path, small, None);
        for tf in 0..p.taskflows.len() {
            for policy in Policy::all() {
                let r = report(&p, tf, &spec(&p, tf, policy));
                bound_holds(&r, &format!("{name} {} {policy:?}", p.taskflows[tf].name));
            }
        }
    }
}

/// SwiGLU + Add: `h` (rows x 4096 bf16) and `res` (rows x 2048) are read once from HBM
/// whatever the order; the intermediate `a` (rows x 2048, written by SwiGLU and read by Add)
/// is the only data read twice. Read bytes: h + res + a = rows x 8192 x 2; the L2 (192 MiB
/// on the A3 die) can only ever serve `a`, a quarter of them. At 32768 rows SwiGLU alone
/// moves 256 MiB of `h` and 128 MiB of `a` through the L2, so run serially (every SwiGLU
/// tile, then every Add tile) no tile of `a` is left when Add reads it; tile-interleaved,
/// each Add tile reads its `a` tile from L2 right after it was written. At 4096 rows
/// everything (48 MiB) fits and both orders hit on all of `a`.
#[test]
fn tile_interleaving_hits_on_the_intermediate_where_serial_execution_misses() {
    let path = root().join("examples/swiglu_add.hpm");
    for (rows, serial_hits) in [(32768u64, false), (4096, true)] {
        let p = checked(&path, &[&format!("rows={rows}")], None);
        let a_bytes = (rows * 2048 * 2) as f64;
        let read = (rows * 8192 * 2) as f64;
        let il = report(&p, 0, &spec(&p, 0, Policy::Interleaved));
        let kbk = report(&p, 0, &spec(&p, 0, Policy::KernelByKernel));
        assert_eq!(il.l2_hit_bytes + il.l2_miss_bytes, read, "{rows} rows: bytes read");
        assert_eq!(kbk.l2_hit_bytes + kbk.l2_miss_bytes, read, "{rows} rows: bytes read");
        assert!(
            (il.l2_hit_bytes - a_bytes).abs() <= a_bytes * 1e-6,
            "{rows} rows: interleaved reads all of `a` from L2: {} of {a_bytes}",
            il.l2_hit_bytes
        );
        if serial_hits {
            assert!(
                (kbk.l2_hit_bytes - a_bytes).abs() <= a_bytes * 1e-6,
                "{rows} rows: {}",
                kbk.l2_hit_bytes
            );
        } else {
            assert_eq!(kbk.l2_hit_bytes, 0.0, "{rows} rows: serial misses on `a`");
            assert!(
                il.latency < kbk.latency,
                "{rows} rows: interleaved {} us, kbk {} us",
                il.latency * 1e6,
                kbk.latency * 1e6
            );
        }
    }
}

#[test]
fn the_choice_among_candidates_is_deterministic_and_never_slower() {
    let path = root().join("examples/deepseek_v3_ep8_bwd.hpm");
    let p = checked(&path, small_shape("deepseek_v3_ep8_bwd"), Some("zipf(s: 1.2)"));
    let on = spec(&p, 0, Policy::Interleaved);
    assert!(on.candidates, "the stdlib's default");
    let a = compile(&p, 0, &on);
    let b = compile(&p, 0, &on);
    assert_eq!(a.schedule.queues.idx, b.schedule.queues.idx);
    assert_eq!(a.schedule.origin, b.schedule.origin);
    let mut off = on.clone();
    off.candidates = false;
    let own = report(&p, 0, &off);
    let best = report(&p, 0, &on);
    assert!(best.latency <= own.latency);
    assert!(
        best.options
            .iter()
            .any(|(k, v)| k == "schedule" && v == a.schedule.origin),
        "the report names the schedule chosen: {:?}",
        best.options
    );
}

fn moe(
    tokens: u64,
    experts: u64,
    topk: u64,
    ranks: u64,
    route: &str,
    tiles: (u64, u64, u64),
    backward: bool,
) -> String {
    let (t, m, s) = tiles;
    let head = format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = {tokens};\nparam hidden = 64;\nparam inter = 32;\nparam experts = {experts};\n\
         param topk = {topk};\nparam ranks = {ranks};\nparam local = experts / ranks;\n\
         device = ascend_a3 {{ ranks: ranks }};\nroute r = {route};\n"
    );
    let body = if backward {
        format!(
            "taskflow bwd(dy: bf16[tokens, hidden], xd: bf16[r.recv, hidden], h: bf16[r.recv, 2 * inter], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden])\n\
             -> (dx: bf16[tokens, hidden], dw_up: bf16[local, hidden, 2 * inter], dw_down: bf16[local, inter, hidden]) {{\n\
             let dyd = combine_grad(dy, r) tile(t: {t}) order(ratr);\n\
             let a = swiglu(h) tile(m: {s});\n\
             let da = gmm_grad_x(dyd, w_down) tile(m: {m}, k: 32, n: 16);\n\
             let dw_down = gmm_grad_w(a, dyd, r) tile(k: 32, n: 32, m: 16);\n\
             let dh = swiglu_grad(da, h) tile(m: {s});\n\
             let dxd = gmm_grad_x(dh, w_up) tile(m: {m}, k: 32, n: 16);\n\
             let dw_up = gmm_grad_w(xd, dh, r) tile(k: 32, n: 32, m: 16);\n\
             let dx = dispatch_grad(dxd, r) tile(m: {t}) order(ratr);\n\
             return (dx, dw_up, dw_down);\n}}\n"
        )
    } else {
        format!(
            "taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
             let xd = dispatch(x, r) tile(t: {t}) order(ratr);\n\
             let h = gmm(xd, w_up) tile(m: {m}, n: 32, k: 16);\n\
             let a = swiglu(h) tile(m: {s});\n\
             let y = gmm(a, w_down) tile(m: {m}, n: 32, k: 16);\n\
             return combine(y, r) tile(m: {t}) order(ratr);\n}}\n"
        )
    };
    head + &body
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// On random small programs: every policy (and `interleaved` with each priority, with and
    /// without candidates) stays above the bound, and every candidate schedule verifies,
    /// runs to the end and stays above the bound too.
    #[test]
    fn the_bound_is_below_every_schedule(
        ranks in prop::sample::select(vec![1u64, 2, 4]),
        local in 1u64..4,
        topk in 1u64..3,
        tokens in 1u64..40,
        route in 0usize..3,
        t in prop::sample::select(vec![4u64, 16]),
        m in prop::sample::select(vec![16u64, 32]),
        s in prop::sample::select(vec![8u64, 16]),
        backward in any::<bool>(),
    ) {
        let experts = ranks * local;
        let topk = topk.min(experts);
        let route = match route {
            0 => "balanced(experts: experts, topk: topk)".to_string(),
            1 => "zipf(experts: experts, topk: topk, s: 1.2, seed: 2)".to_string(),
            _ => "uniform(experts: experts, topk: topk, seed: 5)".to_string(),
        };
        let text = moe(tokens, experts, topk, ranks, &route, (t, m, s), backward);
        let out = check_text("test.hpm", &text, None, &Options::default(), &mut SourceMap::new());
        let p = out.checked.unwrap_or_else(|| panic!("does not check: {:?}", out.diagnostics));
        let tf = &p.taskflows[0];
        let mut specs: Vec<PolicySpec> = Policy::all().iter().map(|&pol| spec(&p, 0, pol)).collect();
        for priority in [Priority::CriticalPath, Priority::Fifo, Priority::OpOrder, Priority::Wavefront] {
            for candidates in [false, true] {
                let mut sp = spec(&p, 0, Policy::Interleaved);
                sp.priority = priority;
                sp.candidates = candidates;
                specs.push(sp);
            }
        }
        for sp in &specs {
            let r = report(&p, 0, sp);
            bound_holds(&r, &format!("{sp:?}"));
        }
        let sp = spec(&p, 0, Policy::Interleaved);
        let c = p.compile(tf, &sp, &CompileOptions::default()).expect("compiles");
        for k in 0..CANDIDATES {
            let Some((sched, name)) = candidate(&p, tf, &c.graph, &sp, k) else { continue };
            let ds = hpmoe_dsl::verify::verify_schedule(&p, tf, &c.graph, &sched);
            prop_assert!(ds.is_empty(), "candidate {name}: {ds:?}");
            let model = hpmoe_sim::model::DeviceModel::new(&p.device).expect("a model");
            let w = sim::Workload::new(&p, tf, &c.graph, &sched, &model);
            let res = sim::simulate(&w, &sched, &model, SimOptions::default());
            let res = res.unwrap_or_else(|st| panic!("candidate {name} stalls: {st:?}"));
            let r = Report::new(&p, tf, &c.graph, &sched, &w, &model, &res);
            bound_holds(&r, name);
            let kb = hpmoe_sim::report::kernel_bound(&w, &sched, &model, &c.graph.rank);
            prop_assert!(kb <= r.latency * (1.0 + 1e-9), "candidate {name}: kernel bound {kb} above {}", r.latency);
            prop_assert_eq!(kb > 0.0, sched.barriers > 0, "candidate {}: kernel bound {}", name, kb);
        }
        // The kernel-by-kernel policy's own schedule (barriers and launches).
        let sp = spec(&p, 0, Policy::KernelByKernel);
        let c = p.compile(tf, &sp, &CompileOptions::default()).expect("compiles");
        let model = hpmoe_sim::model::DeviceModel::new(&p.device).expect("a model");
        let w = sim::Workload::new(&p, tf, &c.graph, &c.schedule, &model);
        let res = sim::simulate(&w, &c.schedule, &model, SimOptions::default()).expect("runs");
        let kb = hpmoe_sim::report::kernel_bound(&w, &c.schedule, &model, &c.graph.rank);
        prop_assert!(kb <= res.makespan * (1.0 + 1e-9), "kernel_by_kernel: kernel bound {kb} above {}", res.makespan);
    }
}

/// Above `CANDIDATE_MAX_TASKS` tasks `interleaved` compares only two schedules and says so.
#[test]
fn a_graph_above_the_candidate_limit_compares_two_schedules() {
    let rows = (pipeline::CANDIDATE_MAX_TASKS / 1024 + 1) as u64;
    let text = format!(
        "import std::device::ascend_a3;\ndevice = ascend_a3 {{ ranks: 1 }};\n\
         op e<T>(x: T[M, N]) -> T[M, N] on aiv {{ out[m, n] = x[m, n] + 1.0; }}\n\
         taskflow f(x: f32[{rows}, 1024]) -> f32[{rows}, 1024] {{ return e(x) tile(m: 1, n: 1); }}\n"
    );
    let out = check_text("big.hpm", &text, None, &Options::default(), &mut SourceMap::new());
    let p = out
        .checked
        .unwrap_or_else(|| panic!("does not check: {:?}", out.diagnostics));
    let mut clock = hpmoe_dsl::timing::Clock::new();
    let opts = CompileOptions {
        max_tasks: 4 << 20,
        ..CompileOptions::default()
    };
    let c = pipeline::compile(
        &p,
        &p.taskflows[0],
        &spec(&p, 0, Policy::Interleaved),
        &opts,
        &mut clock,
    )
    .unwrap_or_else(|ds| panic!("does not compile: {ds:?}"));
    assert!(c.graph.len() > pipeline::CANDIDATE_MAX_TASKS);
    assert!(
        c.schedule.origin.ends_with("(of two candidates: above 2097152 tasks)"),
        "{}",
        c.schedule.origin
    );
    assert_eq!(
        pipeline::CANDIDATE_MAX_TASKS,
        2097152,
        "the origin and the docs quote this number"
    );
}

/// The kernel bound stays below the kernel-by-kernel makespan when a rank receives no rows,
/// so some of its kernels are empty there (an empty kernel releases the next one at once:
/// the kernels around it may overlap).
#[test]
fn the_kernel_bound_holds_with_empty_kernels() {
    for seed in 0..6 {
        let route = format!("uniform(experts: experts, topk: topk, seed: {seed})");
        let text = moe(1, 4, 1, 4, &route, (4, 16, 8), seed % 2 == 1);
        let out = check_text("test.hpm", &text, None, &Options::default(), &mut SourceMap::new());
        let p = out
            .checked
            .unwrap_or_else(|| panic!("does not check: {:?}", out.diagnostics));
        let tf = &p.taskflows[0];
        let c = p
            .compile(tf, &spec(&p, 0, Policy::KernelByKernel), &CompileOptions::default())
            .expect("compiles");
        let model = hpmoe_sim::model::DeviceModel::new(&p.device).expect("a model");
        let w = sim::Workload::new(&p, tf, &c.graph, &c.schedule, &model);
        let res = sim::simulate(&w, &c.schedule, &model, SimOptions::default()).expect("runs");
        let kb = hpmoe_sim::report::kernel_bound(&w, &c.schedule, &model, &c.graph.rank);
        assert!(
            kb > 0.0 && kb <= res.makespan * (1.0 + 1e-9),
            "seed {seed}: {kb} against {}",
            res.makespan
        );
    }
}
