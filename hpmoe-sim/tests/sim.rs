//! The timing simulator: invariants on every example under every policy, analytic cases
//! built from small programs, determinism, traces, charts and stall reports (the `hpmoe run`
//! command's tests are in `app/tests/cli.rs`).
//! No test depends on wall-clock time.

use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{check_path, check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Program;
use hpmoe_dsl::schedule::Policy;
use hpmoe_dsl::SourceMap;
use hpmoe_sim::model::{DeviceModel, AIC, AIV};
use hpmoe_sim::report::Report;
use hpmoe_sim::sim::{self, simulate, SimError, SimOptions, Simulated};
use hpmoe_sim::trace::{self, Filter, Run};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn options(overrides: &[&str]) -> Options {
    Options {
        overrides: overrides
            .iter()
            .map(|o| Override::parse(o).expect("an override"))
            .collect(),
        ..Options::default()
    }
}

fn program_file(path: &Path, overrides: &[&str]) -> Checked {
    let out = check_path(path, &options(overrides), &mut SourceMap::new());
    out.checked
        .unwrap_or_else(|| panic!("{} does not check: {:?}", path.display(), out.diagnostics))
}

fn program_text(text: &str, dir: Option<&Path>) -> Checked {
    let mut sources = SourceMap::new();
    let out = check_text("test.hpm", text, dir, &Options::default(), &mut sources);
    match out.checked {
        Some(p) => p,
        None => {
            let ds = hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sources,
                hpmoe_dsl::diag::RenderStyle::Plain,
            );
            panic!("the test program does not check:\n{ds}")
        }
    }
}

fn compile(p: &Checked, policy: Option<Policy>) -> Compiled {
    let tf = &p.taskflows[0];
    let spec = p.select_policy(&tf.name, policy);
    p.compile(tf, &spec, &CompileOptions::default())
        .unwrap_or_else(|ds| panic!("does not compile: {ds:?}"))
}

fn simulated(p: &Program, c: &Compiled, record: bool) -> (Simulated, Report) {
    let s = sim::simulate_compiled(
        p,
        &p.taskflows[0],
        c,
        SimOptions {
            record_bandwidth: record,
            ..SimOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let r = Report::new(
        p,
        &p.taskflows[0],
        &c.graph,
        &c.schedule,
        &s.workload,
        &s.model,
        &s.result,
    );
    (s, r)
}

fn trace_of(p: &Program, c: &Compiled, s: &Simulated, filter: &Filter) -> String {
    let run = Run {
        program: p,
        tf: &p.taskflows[0],
        graph: &c.graph,
        schedule: &c.schedule,
        workload: &s.workload,
        result: &s.result,
    };
    trace::to_string(&run, filter)
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-30)
}

/// The invariants every simulation keeps.
fn check_invariants(name: &str, p: &Program, c: &Compiled, s: &Simulated, r: &Report) {
    let (g, sch, w, res, m) = (&c.graph, &c.schedule, &s.workload, &s.result, &s.model);
    let n = g.len();
    // Every task ran, inside the run, after the first launch.
    for t in 0..n {
        assert!(
            res.start[t] >= w.start_time && res.end[t] >= res.start[t],
            "{name}: task {t} times"
        );
        assert!(res.end[t] <= res.makespan, "{name}: task {t} ends after the makespan");
    }
    // No core runs two tasks at once.
    for core in 0..sch.queues.len() {
        let mut ts: Vec<u32> = sch.queues.row(core).to_vec();
        ts.sort_by(|&a, &b| res.start[a as usize].total_cmp(&res.start[b as usize]));
        for pair in ts.windows(2) {
            let (a, b) = (pair[0] as usize, pair[1] as usize);
            assert!(
                res.end[a] <= res.start[b],
                "{name}: core {core} runs tasks {a} and {b} at once"
            );
        }
    }
    // No task starts before its predecessors' signals arrive.
    let signallers = sch.signallers();
    for k in 0..sch.threshold.len() {
        if sch.threshold[k] == 0 {
            continue;
        }
        let ready = res.counter_time[k];
        for &p_ in signallers.row(k) {
            let pu = p_ as usize;
            let lat = if sch.counter_rank[k] == g.rank[pu] {
                m.event_latency
            } else {
                m.link_latency
            };
            let arrive = res.end[pu] + lat + w.delay[k];
            assert!(
                ready >= arrive * (1.0 - 1e-12),
                "{name}: counter {k} ready at {ready} before task {pu}'s signal ({arrive})"
            );
        }
    }
    for t in 0..n {
        for &k in sch.waits.row(t) {
            if sch.threshold[k as usize] > 0 {
                assert!(
                    res.start[t] >= res.counter_time[k as usize],
                    "{name}: task {t} starts before counter {k}"
                );
            }
        }
    }
    // Bytes are conserved on the links, and the fluid model moved exactly them.
    let sent: f64 = res.sent.iter().sum();
    let received: f64 = res.received.iter().sum();
    let flows: f64 = w.flow_bytes.iter().sum();
    let remote: f64 = g.remote.iter().map(|&x| x as f64).sum();
    assert!(
        close(sent, received, 1e-12) && close(sent, flows, 1e-12),
        "{name}: sent {sent}, received {received}, flows {flows}"
    );
    assert!(
        close(sent, remote, 1e-6),
        "{name}: sent {sent}, lowered remote bytes {remote}"
    );
    for rk in 0..g.ranks as usize {
        assert!(
            close(res.moved_out[rk], res.sent[rk], 1e-9),
            "{name}: rank {rk} moved {} of {}",
            res.moved_out[rk],
            res.sent[rk]
        );
    }
    // The makespan is at least every lower bound.
    let b = &r.bounds;
    for (what, v) in [
        ("aic", b.aic_work),
        ("aiv", b.aiv_work),
        ("hbm", b.hbm),
        ("link", b.link),
        ("critical path", b.critical_path),
    ] {
        assert!(
            res.makespan >= v * (1.0 - 1e-12),
            "{name}: makespan {} below the {what} bound {v}",
            res.makespan
        );
    }
    assert!(
        r.efficiency > 0.0 && r.efficiency <= 1.0 + 1e-12,
        "{name}: efficiency {}",
        r.efficiency
    );
    // Utilisations are fractions.
    for (what, v) in [
        ("aic", r.aic_busy),
        ("aiv", r.aiv_busy),
        ("cube", r.cube_mac_utilisation),
        ("link", r.link_busy),
        ("hbm", r.hbm_utilisation),
    ] {
        assert!((0.0..=1.0 + 1e-9).contains(&v), "{name}: {what} utilisation {v}");
    }
    let _ = p;
}

/// Small sizes of every example, so the whole set runs quickly in a debug build.
fn small(path: &Path) -> Vec<&'static str> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if text.contains("param tokens") {
        vec!["tokens=256"]
    } else if text.contains("param rows") {
        vec!["rows=512"]
    } else {
        vec![]
    }
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "hpm"))
        .collect();
    v.sort();
    v
}

#[test]
fn invariants_on_every_example_and_policy() {
    let files = examples();
    assert!(files.len() >= 8, "examples: {files:?}");
    for f in &files {
        let p = program_file(f, &small(f));
        for pol in Policy::all() {
            let name = format!(
                "{} under {}",
                f.file_name().and_then(|x| x.to_str()).unwrap_or("?"),
                pol.name()
            );
            let c = compile(&p, Some(pol));
            let (s, r) = simulated(&p, &c, true);
            check_invariants(&name, &p, &c, &s, &r);
        }
    }
}

#[test]
fn full_size_deepseek_ep8_forward_keeps_the_invariants() {
    let f = root().join("examples/deepseek_v3_ep8_fwd.hpm");
    let p = program_file(&f, &[]);
    for pol in [Policy::KernelByKernel, Policy::Interleaved] {
        let c = compile(&p, Some(pol));
        let (s, r) = simulated(&p, &c, false);
        check_invariants(pol.name(), &p, &c, &s, &r);
    }
}

/// A simulation beside others ([`sim::simulate_racing`]) gives what a simulation alone gives
/// when it ends, offers its latency, and gives up only once its clock is strictly past a
/// latency offered.
#[test]
fn a_racing_simulation_ends_as_one_alone_or_gives_up_strictly_past_another() {
    let p = program_file(&root().join("examples/deepseek_v3_ep8_fwd.hpm"), &[]);
    let c = compile(&p, Some(Policy::KernelByKernel));
    let (alone, _) = simulated(&p, &c, false);
    let (w, m) = (&alone.workload, &alone.model);
    let makespan = alone.result.makespan;
    assert!(alone.result.events > 3 * 4096, "enough events to give up midway");
    let run = |offered: Option<f64>, limit: f64| {
        let race = sim::Race::new();
        if let Some(o) = offered {
            race.offer(o);
        }
        let r = sim::simulate_racing(w, &c.schedule, m, SimOptions::default(), limit, &[], &race).expect("no stall");
        (r, race.best())
    };
    // Alone in its race: the same result, to the bit, and its latency offered.
    let (r, best) = run(None, f64::INFINITY);
    let r = r.expect("ends");
    assert_eq!(r.end, alone.result.end);
    assert_eq!(r.makespan.to_bits(), makespan.to_bits());
    assert_eq!(best.to_bits(), makespan.to_bits());
    // Another ended at a third of its latency: it gives up, and the best stays the other's.
    let (r, best) = run(Some(makespan / 3.0), f64::INFINITY);
    assert!(r.is_none());
    assert_eq!(best, makespan / 3.0);
    // Another as fast (or its own limit that far): it is never strictly past it, so it ends.
    let (r, _) = run(Some(makespan), f64::INFINITY);
    assert_eq!(r.expect("ends at the latency offered").end, alone.result.end);
    let (r, _) = run(None, makespan);
    assert!(r.is_some());
    // Its own limit below its latency: it gives up too.
    let (r, _) = run(None, makespan * 0.999);
    assert!(r.is_none());
}

#[test]
fn runs_are_byte_identical() {
    let f = root().join("examples/deepseek_v3_ep4_bwd.hpm");
    let p = program_file(&f, &["tokens=256"]);
    let outputs = |pol: Policy| {
        let c = compile(&p, Some(pol));
        let (s, r) = simulated(&p, &c, true);
        let json = serde_json::to_string(&r.json()).expect("json");
        let trace = trace_of(&p, &c, &s, &Filter::default());
        let run = Run {
            program: &p,
            tf: &p.taskflows[0],
            graph: &c.graph,
            schedule: &c.schedule,
            workload: &s.workload,
            result: &s.result,
        };
        let svg = hpmoe_sim::gantt::to_string(
            &run,
            &Filter {
                ranks: Some(vec![0, 1]),
                window: None,
            },
        );
        (json, r.human(), trace, svg)
    };
    for pol in Policy::all() {
        let a = outputs(pol);
        let b = outputs(pol);
        assert!(a == b, "{} is not deterministic", pol.name());
    }
}

#[test]
fn the_trace_is_chrome_json() {
    let f = root().join("examples/deepseek_v3_ep4_fwd.hpm");
    let p = program_file(&f, &["tokens=256"]);
    let c = compile(&p, Some(Policy::Interleaved));
    let (s, _) = simulated(&p, &c, true);
    let text = trace_of(&p, &c, &s, &Filter::default());
    let v: serde_json::Value = serde_json::from_str(&text).expect("the trace parses");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let mut kinds = std::collections::BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        *kinds.entry(ph.to_string()).or_insert(0) += 1;
        if ph == "X" {
            for key in ["ts", "dur", "pid", "tid"] {
                assert!(e[key].is_number(), "X event without {key}: {e}");
            }
            for key in ["op", "call", "tile", "rank"] {
                assert!(!e["args"][key].is_null(), "X event without args.{key}: {e}");
            }
        }
    }
    assert_eq!(
        kinds.get("X").copied().unwrap_or(0),
        c.graph.len(),
        "one X event per task"
    );
    for k in ["M", "s", "f", "C"] {
        assert!(kinds.get(k).copied().unwrap_or(0) > 0, "no `{k}` events: {kinds:?}");
    }
    assert_eq!(kinds.get("s"), kinds.get("f"));
    // Thread names for every core of every rank.
    let names = events.iter().filter(|e| e["name"] == "thread_name").count();
    assert_eq!(names as u32, c.graph.ranks * c.schedule.cores_per_rank());
    // Filters keep a rank and a window.
    let filter = Filter {
        ranks: Some(vec![1]),
        window: Some((100e-6, 200e-6)),
    };
    let small: serde_json::Value = serde_json::from_str(&trace_of(&p, &c, &s, &filter)).expect("parses");
    for e in small["traceEvents"].as_array().expect("events") {
        assert_eq!(e["pid"], 1, "{e}");
        if e["ph"] == "X" {
            let (ts, dur) = (e["ts"].as_f64().unwrap_or(0.0), e["dur"].as_f64().unwrap_or(0.0));
            assert!(ts <= 200.0 + 1e-6 && ts + dur >= 100.0 - 1e-6, "{e}");
        }
    }
}

#[test]
fn the_gantt_chart_is_svg_with_a_legend() {
    let f = root().join("examples/deepseek_v3_ep4_fwd.hpm");
    let p = program_file(&f, &["tokens=256"]);
    let c = compile(&p, Some(Policy::KernelByKernel));
    let (s, _) = simulated(&p, &c, false);
    let run = Run {
        program: &p,
        tf: &p.taskflows[0],
        graph: &c.graph,
        schedule: &c.schedule,
        workload: &s.workload,
        result: &s.result,
    };
    let svg = hpmoe_sim::gantt::to_string(
        &run,
        &Filter {
            ranks: Some(vec![0]),
            window: None,
        },
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for call in ["xd (dispatch", "h (gmm", "a (swiglu", "y (gmm", "out (combine"] {
        assert!(svg.contains(call), "legend misses {call}");
    }
    assert!(svg.contains(" us</text>") || svg.contains(" ms</text>"), "no time axis");
    assert!(svg.contains("aiv47") || svg.contains("aiv46"), "no lane labels");
}

// ---- analytic cases -------------------------------------------------------------------

const MATMUL: &str = r#"
import std::device::ascend_a3;
device = ascend_a3 { ranks: 1 };
op mm<T>(x: T[M, K], w: T[K, N]) -> T[M, N] on aic {
    out[m, n] = sum(k) x[m, k] * w[k, n];
}
taskflow one_tile(x: bf16[128, 2048], w: bf16[2048, 256]) -> bf16[128, 256] {
    return mm(x, w) tile(m: 128, n: 256, k: 64);
}
"#;

#[test]
fn one_gmm_tile_alone_equals_the_formula() {
    let p = program_text(MATMUL, None);
    let c = compile(&p, Some(Policy::Interleaved));
    assert_eq!(c.graph.len(), 1);
    let (s, _) = simulated(&p, &c, false);
    let m = DeviceModel::new(&p.device).expect("model");
    let flops = 2.0 * 128.0 * 256.0 * 2048.0;
    let bytes_in = (128.0 * 2048.0 + 2048.0 * 256.0) * 2.0;
    let bytes_out = 128.0 * 256.0 * 2.0;
    // Nothing is in L2 yet: the inputs come from HBM at the core's rate (alone, below the
    // die's bandwidth); the output goes to L2.
    let compute = flops / (m.cube_flops);
    let memory = bytes_in / m.core_hbm[AIC] + bytes_out / m.core_l2_write[AIC];
    let expected = m.kernel_launch + m.task_overhead + compute.max(memory);
    assert!(
        close(s.result.end[0], expected, 1e-12),
        "{} vs {expected}",
        s.result.end[0]
    );
    assert!(close(s.result.makespan, expected, 1e-12));
    assert!(close(s.result.miss[0] as f64, bytes_in, 1e-6));
}

/// Two ranks, balanced routing over two experts: each rank keeps half its rows and puts the
/// other half to the other rank, in puts of `tile / 2` rows; a vector op consumes the window.
/// The ranks are two dies of one node (one die per package) unless `extra` says otherwise;
/// the pair's rate is `link`, the port far faster.
fn put_program_with(link: &str, tokens: u32, tile: u32, extra: &str) -> String {
    format!(
        r#"
import std::moe::dispatch;
import std::device::ascend_a3;
param tokens = {tokens};
device = ascend_a3 {{ ranks: 2, dies_per_package: 1 count, link_bandwidth: 1000 GB/s,
    pair_bandwidth: {link}, link_efficiency: 1.0 ratio, put_chunk_bytes: 64 KiB, {extra} }};
route r = balanced(experts: 2, topk: 1);
op twice<T>(x: T[M, N]) -> T[M, N] on aiv {{
    out[m, n] = x[m, n] + x[m, n];
}}
taskflow put_once(x: bf16[tokens, 512]) -> bf16[r.recv, 512] {{
    let xd = dispatch(x, r) tile(t: {tile});
    return twice(xd) tile(m: 8);
}}
"#
    )
}

fn put_program(link: &str) -> String {
    put_program_with(link, 512, 512, "")
}

/// The put of rank 0 (the first one), its duration, and the time from its start to its first
/// consumer's start on rank 1.
fn one_put(text: &str) -> (f64, f64, f64, f64, hpmoe_sim::model::DeviceModel) {
    let p = program_text(text, None);
    let c = compile(&p, Some(Policy::Interleaved));
    let (s, _) = simulated(&p, &c, false);
    let (g, w, res) = (&c.graph, &s.workload, &s.result);
    let put = (0..g.len())
        .find(|&t| g.rank[t] == 0 && !w.task_flows(t).is_empty())
        .expect("a remote put");
    let first_consumer = (0..g.len())
        .filter(|&t| g.preds(t).contains(&(put as u32)))
        .map(|t| res.start[t])
        .fold(f64::INFINITY, f64::min);
    let fill = w.read_total[put].min(s.model.put_chunk_bytes) / s.model.core_hbm[AIV];
    (
        w.remote_bytes(put),
        fill,
        res.end[put] - res.start[put],
        first_consumer - res.start[put],
        s.model.clone(),
    )
}

/// What a put of `k` messages of `bytes` in all takes alone on its pair, from its issue to
/// its last byte leaving, with one message in flight: `put_overhead + peer_setup` before its
/// first byte, its bytes at the pair's rate `b`, and `put_overhead + latency` more for each
/// further message (the alpha-beta cost of a point-to-point put per message, the first
/// message's latency landing after the task). Written out from the documented model.
fn alpha_beta(k: f64, bytes: f64, b: f64, latency: f64, m: &hpmoe_sim::model::DeviceModel) -> f64 {
    let t = &m.topology;
    t.put_overhead + t.peer_setup + bytes / b + (k - 1.0) * (t.put_overhead + latency)
}

#[test]
fn one_put_alone_equals_latency_plus_bytes_over_bandwidth() {
    let (bytes, fill, dur, gap, m) = one_put(&put_program("1 GB/s"));
    assert!(close(bytes, 256.0 * 512.0 * 2.0, 1e-12), "{bytes}");
    // 256 rows of 1 KiB, one message each, 0.7 us apart on the path (two dies of one node);
    // the task ends with its last byte; its signal lands link_latency later.
    let moving = alpha_beta(256.0, bytes, 1e9, 0.7e-6, &m);
    assert!(close(dur, m.task_overhead + fill + moving, 1e-12), "{dur}");
    assert!(close(gap, dur + 0.7e-6, 1e-12), "{gap} vs {dur} + 0.7 us");
}

/// Two ranks, balanced over two experts: rank 0 sends half of its `2 rows` tokens, `rows`
/// rows of `hidden` bf16 values (messages of `2 hidden` bytes), to rank 1; the pair's rate
/// `link`.
fn sized_put(rows: u32, hidden: u32, link: &str) -> (f64, f64, f64, hpmoe_sim::model::DeviceModel) {
    let text = format!(
        r#"
import std::moe::dispatch;
import std::device::ascend_a3;
device = ascend_a3 {{ ranks: 2, dies_per_package: 1 count, link_bandwidth: 1000 GB/s,
    pair_bandwidth: {link}, link_efficiency: 1.0 ratio, put_chunk_bytes: 64 KiB }};
route r = balanced(experts: 2, topk: 1);
op twice<T>(x: T[M, N]) -> T[M, N] on aiv {{
    out[m, n] = x[m, n] + x[m, n];
}}
taskflow put_once(x: bf16[{tokens}, {hidden}]) -> bf16[r.recv, {hidden}] {{
    let xd = dispatch(x, r) tile(t: {tokens});
    return twice(xd) tile(m: 8);
}}
"#,
        tokens = 2 * rows
    );
    let (bytes, fill, dur, _, m) = one_put(&text);
    (bytes, fill, dur, m)
}

#[test]
fn bandwidth_against_message_size_follows_alpha_beta() {
    // 16 messages of m bytes on a 10 GB/s pair with 0.7 us latency: achieved bandwidth
    // 16 m / (0.4 us + 16 m / 10 GB/s + 15 x 0.8 us), by hand:
    for (hidden, msg, gbps) in [
        // 128 B messages: 2048 B in 12.6048 us: 0.162 GB/s.
        (64u32, 128.0, 2048.0 / 12.6048e-6 / 1e9),
        // 1 KiB: 16384 B in 14.0384 us: 1.167 GB/s.
        (512, 1024.0, 16384.0 / 14.0384e-6 / 1e9),
        // 16 KiB: 262144 B in 38.6144 us: 6.789 GB/s.
        (8192, 16384.0, 262144.0 / 38.6144e-6 / 1e9),
    ] {
        let (bytes, fill, dur, m) = sized_put(16, hidden, "10 GB/s");
        assert_eq!(bytes, 16.0 * msg);
        let moving = dur - m.task_overhead - fill;
        assert!(close(moving, alpha_beta(16.0, bytes, 10e9, 0.7e-6, &m), 1e-9));
        let got = bytes / moving / 1e9;
        assert!(close(got, gbps, 1e-9), "{msg} B messages: {got} GB/s vs {gbps}");
    }
    // Larger messages get closer to the link's rate: the curve rises monotonically.
    let bw = |h: u32| {
        let (b, fill, dur, m) = sized_put(16, h, "10 GB/s");
        b / (dur - m.task_overhead - fill)
    };
    assert!(bw(64) < bw(512) && bw(512) < bw(8192) && bw(8192) < 10e9);
}

#[test]
fn a_path_between_nodes_costs_its_hops() {
    // One die per node: the pair is across nodes. Its latency is link_latency (1 us) plus
    // 2 hops of 3 us = 7 us; its rate the cross pair rate; each of its 256 messages after
    // the first pays put_overhead and that latency.
    let extra = "dies_per_node: 1 count, link_latency: 1 us, cross_hops: 2 count, cross_hop_latency: 3 us, \
                 cross_pair_bandwidth: 2 GB/s, cross_port_bandwidth: 1000 GB/s";
    let (bytes, fill, dur, gap, m) = one_put(&put_program_with("1 GB/s", 512, 512, extra));
    let moving = alpha_beta(256.0, bytes, 2e9, 7e-6, &m);
    assert!(close(dur, m.task_overhead + fill + moving, 1e-12), "{dur}");
    assert!(close(gap - dur, 7e-6, 1e-9), "{}", gap - dur);
    // The same put inside a node (one hop less on both ends: 1 us) is faster by 255 x 6 us
    // of message latency, besides the rates.
    let (b2, fill2, dur2, _, m2) = one_put(&put_program_with("2 GB/s", 512, 512, "link_latency: 1 us"));
    assert_eq!(b2, bytes);
    let (x1, x2) = (dur - m.task_overhead - fill, dur2 - m2.task_overhead - fill2);
    assert!(close(x1 - x2, 255.0 * 6e-6, 1e-9), "{x1} - {x2}");
}

#[test]
fn the_puts_in_flight_limit_serialises_puts() {
    // Four puts of rank 0 (its 256 rows for rank 1 in tiles of 64 rows) issued at once with
    // put_overhead 10 us. Each alone takes 10 us + x, x = 64 KiB / 1 GB/s + 63 x (10 us +
    // 0.7 us) of further messages. With 48 slots per die they run side by side (their
    // window caps sum to 4 x 64 KiB / x, well under the pair's 1 GB/s): the last ends
    // 10 us + x after the first starts. With one slot per die each waits for the previous:
    // 4 x (10 us + x). The difference is 3 x (10 us + x).
    let last_end = |slots: u32| {
        let extra = format!("put_overhead: 10 us, peer_setup: 1 ns, die_puts_in_flight: {slots} count");
        let p = program_text(&put_program_with("1 GB/s", 512, 64, &extra), None);
        let c = compile(&p, Some(Policy::Interleaved));
        let (s, _) = simulated(&p, &c, false);
        let (g, w, res) = (&c.graph, &s.workload, &s.result);
        let puts: Vec<usize> = (0..g.len())
            .filter(|&t| g.rank[t] == 0 && !w.task_flows(t).is_empty())
            .collect();
        assert_eq!(puts.len(), 4);
        let first = puts.iter().map(|&t| res.start[t]).fold(f64::INFINITY, f64::min);
        let last = puts.iter().map(|&t| res.end[t]).fold(0.0, f64::max);
        last - first
    };
    let x = 65536.0 / 1e9 + 63.0 * (10e-6 + 0.7e-6);
    let (wide, narrow) = (last_end(48), last_end(1));
    // Up to the 1 ns peer_setup of the first put, which the shared case spreads over four.
    assert!((narrow - wide - 3.0 * (10e-6 + x)).abs() < 2e-9, "{narrow} - {wide}");
}

#[test]
fn more_messages_in_flight_per_core_hide_their_latency() {
    // The put of 256 messages alone: with q messages in flight, the 255 further messages
    // cost 255 x 0.8 us / q; q = 4 saves 3/4 of it.
    let (b, fill1, d1, _, m1) = one_put(&put_program_with("1 GB/s", 512, 512, ""));
    let (_, fill4, d4, _, m4) = one_put(&put_program_with("1 GB/s", 512, 512, "core_puts_in_flight: 4 count"));
    let x1 = d1 - m1.task_overhead - fill1;
    let x4 = d4 - m4.task_overhead - fill4;
    assert!(close(x1, alpha_beta(256.0, b, 1e9, 0.7e-6, &m1), 1e-12));
    assert!(close(x1 - x4, 0.75 * 255.0 * 0.8e-6, 1e-9), "{x1} - {x4}");
}

const CHAIN: &str = r#"
import std::device::ascend_a3;
device = ascend_a3 { ranks: 1 };
op twice<T>(x: T[M, N]) -> T[M, N] on aiv {
    out[m, n] = x[m, n] + x[m, n];
}
taskflow chain(x: bf16[64, 1024]) -> bf16[64, 1024] {
    let a = twice(x) tile(m: 64);
    let b = twice(a) tile(m: 64);
    return twice(b) tile(m: 64);
}
"#;

#[test]
fn a_chain_of_tasks_equals_the_sum() {
    let p = program_text(CHAIN, None);
    let c = compile(&p, Some(Policy::Interleaved));
    assert_eq!(c.graph.len(), 3);
    let (s, _) = simulated(&p, &c, false);
    let (res, m) = (&s.result, &s.model);
    let bytes = 64.0 * 1024.0 * 2.0;
    let compute = 64.0 * 1024.0 * 2.0 / m.vector_bytes * 1.0; // one op per element, 2-byte elements
                                                              // The first reads its input from HBM, the others their producer's output from L2.
    let first = m.task_overhead + compute.max(bytes / m.core_hbm[AIV] + bytes / m.core_l2_write[AIV]);
    let next = m.task_overhead + compute.max(bytes / m.core_l2_read[AIV] + bytes / m.core_l2_write[AIV]);
    let durations = [first, next, next];
    for t in 0..3 {
        assert!(
            close(res.end[t] - res.start[t], durations[t], 1e-12),
            "task {t}: {} vs {}",
            res.end[t] - res.start[t],
            durations[t]
        );
    }
    let expected = m.kernel_launch + durations.iter().sum::<f64>() + 2.0 * m.event_latency;
    assert!(close(res.makespan, expected, 1e-12), "{} vs {expected}", res.makespan);
}

/// `ranks` ranks; every token of every rank goes to expert 0 on rank 0.
fn hotspot_program(dir: &Path, ranks: usize) -> Checked {
    let tokens = 256;
    let data = vec![0.0; ranks * tokens];
    hpmoe_dsl::npy::write(
        &dir.join("routes.npy"),
        hpmoe_dsl::npy::NpyType::I32,
        &[ranks, tokens, 1],
        &data,
    )
    .expect("write npy");
    let text = format!(
        r#"
import std::moe::dispatch;
import std::device::ascend_a3;
device = ascend_a3 {{ ranks: {ranks}, dies_per_package: 1 count, link_bandwidth: 1 GB/s,
    pair_bandwidth: 1 GB/s, link_efficiency: 1.0 ratio }};
route r = file(path: "routes.npy", experts: {ranks});
op twice<T>(x: T[M, N]) -> T[M, N] on aiv {{
    out[m, n] = x[m, n] + x[m, n];
}}
taskflow hot(x: bf16[{tokens}, 512]) -> bf16[r.recv, 512] {{
    let xd = dispatch(x, r) tile(t: 256);
    return twice(xd) tile(m: 64);
}}
"#
    );
    program_text(&text, Some(dir))
}

#[test]
fn n_ranks_writing_one_destination_take_n_times_as_long() {
    let dir = std::env::temp_dir().join(format!("hpmoe-sim-hotspot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let link_time = |ranks: usize| {
        let p = hotspot_program(&dir, ranks);
        let c = compile(&p, Some(Policy::Interleaved));
        let (s, _) = simulated(&p, &c, false);
        let (g, w, res, m) = (&c.graph, &s.workload, &s.result, &s.model);
        let puts: Vec<usize> = (0..g.len()).filter(|&t| !w.task_flows(t).is_empty()).collect();
        assert_eq!(puts.len(), ranks - 1, "one put per writer");
        // Every writer started at once and took the same time.
        let t = puts[0];
        for &x in &puts {
            assert!(close(res.end[x] - res.start[x], res.end[t] - res.start[t], 1e-12));
        }
        let fill = w.read_total[t].min(m.put_chunk_bytes) / m.core_hbm[AIV];
        let alpha = m.topology.put_overhead + m.topology.peer_setup;
        let transfer = res.end[t] - res.start[t] - m.task_overhead - fill - alpha;
        (transfer, w.remote_bytes(t))
    };
    // One writer: 256 messages of 1 KiB, bound by their window (255 x 0.8 us more than
    // the bytes at 1 GB/s).
    let (one, bytes) = link_time(2);
    let windowed = bytes / 1e9 + 255.0 * 0.8e-6;
    assert!(close(one, windowed, 1e-12), "one writer: {one} vs {windowed}");
    // N writers share the destination's 1 GB/s ingress, 1/N each, below each one's window
    // rate: N times the bytes' time at the full rate.
    for n in [3usize, 5] {
        let (t, _) = link_time(n + 1);
        let expected = n as f64 * bytes / 1e9;
        assert!(close(t, expected, 1e-9), "{n} writers: {t} vs {expected}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const L2_CASE: &str = r#"
import std::device::ascend_a3;
device = ascend_a3 { ranks: 1, l2_size: 1 MiB };
op twice<T>(x: T[M, N]) -> T[M, N] on aiv {
    out[m, n] = x[m, n] + x[m, n];
}
taskflow l2(x: bf16[64, 256], y: bf16[4096, 256])
    -> (b: bf16[64, 256], z: bf16[4096, 256], c: bf16[64, 256]) {
    let a = twice(x) tile(m: 64);
    let b = twice(a) tile(m: 64);
    let z = twice(y) tile(m: 64);
    let c = twice(a) tile(m: 64);
    return (b, z, c);
}
schedule l2 = kernel_by_kernel;
"#;

#[test]
fn a_consumer_right_after_its_producer_hits_and_one_after_a_large_working_set_misses() {
    let p = program_text(L2_CASE, None);
    let c = compile(&p, None);
    assert_eq!(c.schedule.policy.policy, Policy::KernelByKernel);
    let (s, r) = simulated(&p, &c, false);
    let (g, res) = (&c.graph, &s.result);
    let task_of = |call: &str| {
        let ni = p.taskflows[0].nodes.iter().position(|n| n.name == call).expect("call");
        (0..g.len()).find(|&t| g.node[t] as usize == ni).expect("task")
    };
    let (b, cc) = (task_of("b"), task_of("c"));
    let bytes = 64.0 * 256.0 * 2.0;
    assert_eq!(res.miss[b], 0.0, "right after its producer: a hit");
    assert!(close(res.hit[b] as f64, bytes, 1e-9));
    assert_eq!(res.hit[cc], 0.0, "after 4 MiB went through a 1 MiB L2: a miss");
    assert!(close(res.miss[cc] as f64, bytes, 1e-9));
    assert!(r.l2_hit_rate() > 0.0 && r.l2_hit_rate() < 1.0);
    // The misses of the large working set cost write-backs of dirty blocks.
    assert!(r.writeback_bytes > 0.0);
}

// ---- stalls -----------------------------------------------------------------------------

#[test]
fn a_schedule_that_cannot_progress_ends_with_a_wait_for_report() {
    let p = program_text(CHAIN, None);
    let mut c = compile(&p, Some(Policy::Interleaved));
    // Raise the threshold of the counter the last task waits on: it can never be reached.
    let last = c.graph.len() - 1;
    let k = c.schedule.waits.row(last)[0] as usize;
    c.schedule.threshold[k] += 1;
    let m = DeviceModel::new(&p.device).expect("model");
    let w = hpmoe_sim::sim::Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    let st = match simulate(&w, &c.schedule, &m, SimOptions::default()) {
        Err(st) => st,
        Ok(_) => panic!("a broken threshold must stall"),
    };
    assert_eq!(st.done, 2);
    assert_eq!(st.total, 3);
    assert_eq!(st.waits.len(), 1);
    assert_eq!(st.waits[0].task as usize, last);
    assert_eq!(st.waits[0].counter as usize, k);
    assert_eq!((st.waits[0].arrived, st.waits[0].threshold), (1, 2));
    let d = sim::stall_diagnostic(&p, &p.taskflows[0], &c.graph, &c.schedule, &st);
    assert_eq!(d.code, hpmoe_dsl::Code::Deadlock);
    let text = format!("{} {:?}", d.message, d.notes);
    assert!(text.contains("1 of 2 signals"), "{text}");
    // Through the convenience API it is an error, not a panic.
    assert!(matches!(
        sim::simulate_compiled(&p, &p.taskflows[0], &c, SimOptions::default()),
        Err(SimError::Stall(_))
    ));
}

/// One cube task of a 128 x 256 x 1024 product on an A3 die, on bf16 or int8 operands.
fn cube_task_seconds(dtype: &str) -> (f64, f64) {
    let text = format!(
        "import std::device::ascend_a3;\ndevice = ascend_a3 {{ ranks: 1 }};\n\
         op mm<T>(x: T[M, K], w: T[K, N]) -> f32[M, N] on aic {{ out[m, n] = sum(k) x[m, k] * w[k, n]; }}\n\
         taskflow f(x: {dtype}[128, 1024], w: {dtype}[1024, 256]) -> f32[128, 256] {{\n\
           return mm(x, w) tile(m: 128, n: 256, k: 64);\n}}\n"
    );
    let p = program_text(&text, None);
    let c = compile(&p, Some(Policy::Interleaved));
    assert_eq!(c.graph.len(), 1, "one task");
    let (s, _) = simulated(&p, &c, false);
    (s.workload.compute[0], s.result.makespan)
}

#[test]
fn an_int8_contraction_takes_half_the_cube_time_of_bf16() {
    // By hand: 2 x 128 x 256 x 1024 = 67,108,864 FLOP. bf16: 8192 FLOP/cycle x 1.85 GHz x
    // 0.85 = 1.288192e13 FLOP/s per core -> 5.2095e-6 s; int8: 16384 op/cycle (16x32x16
    // MAC) -> 2.6048e-6 s.
    let (bf16, bf16_total) = cube_task_seconds("bf16");
    let (int8, int8_total) = cube_task_seconds("i8");
    assert!((bf16 - 5.209_538_95e-6).abs() < 1e-12, "bf16 compute {bf16}");
    assert!((int8 - 2.604_769_475e-6).abs() < 1e-12, "int8 compute {int8}");
    // End to end the task also pays the launch and the per-task overhead (10 us + 0.5 us on
    // A3), and int8 operands also halve the bytes read: the int8 run is faster, by less
    // than its whole time.
    assert!(int8_total < bf16_total, "{int8_total} vs {bf16_total}");
    assert!(int8_total > 10.5e-6, "{int8_total}: launch and task overhead");
    // fp8 operands: no fp8 MAC on 910B/A3, so the bf16 rate.
    let (fp8, _) = cube_task_seconds("fp8e4m3");
    assert!((fp8 - bf16).abs() < 1e-15, "fp8 compute {fp8}");
}

#[test]
fn hbm_utilisation_leaves_out_the_write_backs_after_the_layer() {
    // SwiGLU + Add at 32768 rows, kernel by kernel: the intermediate (0.27 GB) does not fit
    // in L2 and its dirty blocks go back to HBM, some of it after the last task ended. All
    // the bytes HBM moved exceed what it could move within the latency (the old measure gave
    // 113%); those moved by the end of the layer do not, and are fewer than all of them.
    let f = root().join("examples/swiglu_add.hpm");
    let p = program_file(&f, &["rows=32768"]);
    let c = compile(&p, Some(Policy::KernelByKernel));
    let (s, r) = simulated(&p, &c, false);
    let res = &s.result;
    let capacity = s.model.hbm_bandwidth * res.makespan * f64::from(r.ranks);
    let all: f64 = res.hbm_bytes.iter().sum();
    let layer: f64 = res.hbm_layer_bytes.iter().sum();
    assert!(all > capacity, "HBM moved {all} B, at most {capacity} B in the layer");
    assert!(
        layer <= capacity * (1.0 + 1e-9) && layer < all,
        "{layer} of {all} B by the end"
    );
    assert!(
        r.hbm_utilisation <= 1.0 && r.hbm_utilisation > 0.5,
        "{}",
        r.hbm_utilisation
    );
}

#[test]
fn every_rank_barriers_counted_per_barrier_give_what_one_by_one_gives() {
    // Kernel by kernel, a collective's kernel ends at a barrier of every rank; its signals
    // are counted per barrier. The times of every task, counter and flow are those of the
    // signals delivered one counter at a time.
    for (file, sets) in [
        ("examples/deepseek_v3_ep8_fwd.hpm", vec!["tokens=256"]),
        ("examples/deepseek_v3_ep8_bwd.hpm", vec!["tokens=128"]),
        ("examples/qwen_moe_ep8_fwd.hpm", vec![]),
        ("examples/deepseek_v3_ep8_fwd.hpm", vec!["tokens=64", "ranks=32"]),
    ] {
        let p = program_file(&root().join(file), &sets);
        let c = compile(&p, Some(Policy::KernelByKernel));
        assert!(
            c.schedule
                .fanout
                .iter()
                .any(|f| matches!(f, Some(hpmoe_dsl::schedule::Fanout::EveryRank { .. }))),
            "{file}: an every-rank barrier"
        );
        let m = DeviceModel::new(&p.device).expect("model");
        let w = hpmoe_sim::sim::Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
        let run = |one_by_one: bool| {
            let opts = SimOptions {
                barriers_one_by_one: one_by_one,
                ..SimOptions::default()
            };
            simulate(&w, &c.schedule, &m, opts).expect("runs")
        };
        let (a, b) = (run(false), run(true));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(a.makespan.to_bits(), b.makespan.to_bits(), "{file}");
        assert_eq!(bits(&a.start), bits(&b.start), "{file}");
        assert_eq!(bits(&a.end), bits(&b.end), "{file}");
        assert_eq!(bits(&a.counter_time), bits(&b.counter_time), "{file}");
        assert_eq!(bits(&a.flow_end), bits(&b.flow_end), "{file}");
        assert_eq!(a.events, b.events, "{file}");
    }
}

#[test]
fn a_bounded_simulation_gives_the_makespan_only_below_its_limit() {
    let p = program_file(&root().join("examples/qwen_moe_ep8_fwd.hpm"), &[]);
    let c = compile(&p, Some(Policy::Interleaved));
    let m = DeviceModel::new(&p.device).expect("model");
    let w = hpmoe_sim::sim::Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    let progress = sim::Progress::new();
    let opts = SimOptions {
        progress: Some(progress.clone()),
        ..SimOptions::default()
    };
    let full = simulate(&w, &c.schedule, &m, opts.clone()).expect("runs").makespan;
    assert_eq!(progress.tasks(), (c.graph.len() as u64, c.graph.len() as u64));
    assert_eq!(
        sim::makespan_below(&w, &c.schedule, &m, opts.clone(), f64::INFINITY),
        Some(full)
    );
    assert_eq!(
        sim::makespan_below(&w, &c.schedule, &m, opts.clone(), full * 1.001),
        Some(full)
    );
    // Strictly below: a schedule exactly as fast as the limit is not kept.
    assert_eq!(sim::makespan_below(&w, &c.schedule, &m, opts.clone(), full), None);
    // Given up half-way: fewer tasks ended than the schedule has.
    assert_eq!(sim::makespan_below(&w, &c.schedule, &m, opts, full * 0.5), None);
    let (done, total) = progress.tasks();
    assert!(done < total, "{done} of {total}");
}

#[test]
fn a_task_start_plus_its_chain_never_passes_the_makespan() {
    // The chains (the least time from a task's start to the end of the layer, its queue run
    // one task after the other) are checked against full simulations of every policy, and
    // the simulation cut by them gives the same answers as the one cut only by the clock.
    for (file, sets) in [
        ("examples/qwen_moe_ep8_fwd.hpm", &[][..]),
        ("examples/deepseek_v3_ep4_bwd.hpm", &["tokens=256", "experts=16"][..]),
        ("examples/comm_bench.hpm", &["ranks=16"][..]),
    ] {
        let p = program_file(&root().join(file), sets);
        let m = DeviceModel::new(&p.device).expect("model");
        for policy in [Policy::KernelByKernel, Policy::ExpertLevel, Policy::Interleaved] {
            let c = compile(&p, Some(policy));
            let tf = &p.taskflows[0];
            let w = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &c.schedule, &m);
            let (_, chains) = hpmoe_sim::report::bounds_and_chains(&w, &c.schedule, &m, &c.graph.rank, true);
            assert_eq!(chains.len(), c.graph.len());
            let full = simulate(&w, &c.schedule, &m, SimOptions::default()).expect("runs");
            let mut tight = 0usize;
            for (i, info) in w.plan.info.iter().enumerate() {
                let t = info.task as usize;
                let reach = full.start[t] + chains[i];
                assert!(
                    reach <= full.makespan * (1.0 + 1e-9),
                    "{file} {policy:?}: task {t} starts at {} with a chain of {}, past the makespan {}",
                    full.start[t],
                    chains[i],
                    full.makespan
                );
                if reach >= full.makespan * 0.5 {
                    tight += 1;
                }
            }
            assert!(tight > 0, "{file} {policy:?}: no chain reaches half the makespan");
            let below = |limit: f64| {
                sim::simulate_below_chained(&w, &c.schedule, &m, SimOptions::default(), limit, &chains)
                    .map(|r| r.makespan)
            };
            assert_eq!(below(f64::INFINITY), Some(full.makespan));
            assert_eq!(below(full.makespan * 1.001), Some(full.makespan));
            assert_eq!(below(full.makespan), None);
            assert_eq!(below(full.makespan * 0.9), None);
            // Cut by the chains, a losing simulation ends no later than one cut by the clock.
            let (plain, cut) = (sim::Progress::new(), sim::Progress::new());
            let with = |p: &sim::Progress| SimOptions {
                progress: Some(p.clone()),
                ..SimOptions::default()
            };
            assert_eq!(
                sim::makespan_below(&w, &c.schedule, &m, with(&plain), full.makespan * 0.95),
                None
            );
            assert_eq!(
                sim::simulate_below_chained(&w, &c.schedule, &m, with(&cut), full.makespan * 0.95, &chains)
                    .map(|r| r.makespan),
                None
            );
            assert!(cut.tasks().0 <= plain.tasks().0, "{file} {policy:?}");
        }
    }
}

#[test]
fn trace_slices_on_one_core_never_overlap() {
    // Perfetto nests an X slice that starts before the previous one on its thread ended.
    let p = program_file(&root().join("examples/deepseek_v3_ep4_fwd.hpm"), &["tokens=256"]);
    let c = compile(&p, Some(Policy::Interleaved));
    let (s, _) = simulated(&p, &c, false);
    let text = trace_of(&p, &c, &s, &Filter::default());
    let v: serde_json::Value = serde_json::from_str(&text).expect("the trace parses");
    let mut per_core: std::collections::BTreeMap<(i64, i64), Vec<(i64, i64)>> = Default::default();
    let ns = |x: &serde_json::Value| (x.as_f64().expect("a number") * 1000.0).round() as i64;
    for e in v["traceEvents"].as_array().expect("events") {
        if e["ph"] == "X" {
            let key = (e["pid"].as_i64().expect("pid"), e["tid"].as_i64().expect("tid"));
            per_core.entry(key).or_default().push((ns(&e["ts"]), ns(&e["dur"])));
        }
    }
    let mut pairs = 0;
    for (core, mut slices) in per_core {
        slices.sort();
        for w in slices.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "core {core:?}: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
            pairs += 1;
        }
    }
    assert!(pairs > 100, "too few consecutive slices to test: {pairs}");
}

#[test]
fn a_rescheduled_workload_simulates_as_a_fresh_one() {
    let p = program_file(&root().join("examples/deepseek_v3_ep4_bwd.hpm"), &["tokens=256"]);
    let tf = &p.taskflows[0];
    let c = compile(&p, Some(Policy::Interleaved));
    let m = DeviceModel::new(&p.device).expect("model");
    let mut w = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &c.schedule, &m);
    let mut compared = 0;
    for k in 0..hpmoe_dsl::schedule::CANDIDATES {
        let Some((s, name)) = hpmoe_dsl::schedule::candidate(&p, tf, &c.graph, &c.schedule.policy, k) else {
            continue;
        };
        w.reschedule(&c.graph, &s, &m);
        let fresh = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &s, &m);
        let a = simulate(&w, &s, &m, SimOptions::default()).expect("runs");
        let b = simulate(&fresh, &s, &m, SimOptions::default()).expect("runs");
        assert_eq!(a.makespan.to_bits(), b.makespan.to_bits(), "{name}");
        assert_eq!(a.start, b.start, "{name}");
        assert_eq!(a.end, b.end, "{name}");
        assert_eq!(a.hbm_bytes, b.hbm_bytes, "{name}");
        compared += 1;
    }
    // The kernel-by-kernel candidate has barriers and launches: its counters differ.
    assert!(compared >= 4, "{compared}");
}

/// A routing of 2 ranks x 4 tokens x top-2 over 4 experts (2 per rank), written by hand:
/// expert e lives on rank e / 2.
const VIEW_IDS: [[[i32; 2]; 4]; 2] = [
    // rank 0: t0 both on rank 0; t1 ranks 0 and 1; t2 both on rank 1; t3 ranks 1 and 0
    [[0, 1], [0, 2], [2, 3], [3, 1]],
    // rank 1: t0 both on rank 0; t1 both local; t2 ranks 0 and 1; t3 ranks 0 and 1
    [[0, 1], [2, 3], [1, 2], [0, 3]],
];

fn view_program(dir: &Path, body: &str, out: &str) -> Checked {
    let ids: Vec<f64> = VIEW_IDS.iter().flatten().flatten().map(|&e| f64::from(e)).collect();
    hpmoe_dsl::npy::write(&dir.join("ids.npy"), hpmoe_dsl::npy::NpyType::I32, &[2, 4, 2], &ids).expect("ids.npy");
    let text = format!(
        r#"import std::moe::{{dispatch, combine}};
import std::device::ascend_a3;
device = ascend_a3 {{ ranks: 2 }};
route r = file(path: "ids.npy", experts: 4);
route rr = by_rank(r);
route rl = fanout(rr);
taskflow t(x: bf16[4, 512]) -> bf16[{out}, 512] {{
    {body}
}}
"#
    );
    program_text(&text, Some(dir))
}

#[test]
fn by_rank_dispatch_sends_each_token_once_per_destination_rank() {
    let dir = std::env::temp_dir().join(format!("hpmoe-sim-views-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let row = 512.0 * 2.0;
    // Counted by hand from VIEW_IDS: per token, the ranks other than its own it sends to.
    // Per (token, choice): rank 0 sends t1 once, t2 twice, t3 once; rank 1 sends t0 twice,
    // t2 once, t3 once. Per (token, rank): rank 0 sends t1, t2, t3 once each; rank 1 t0, t2,
    // t3 once each.
    let cases = [
        ("return dispatch(x, r) tile(t: 4);", "r.recv", 8.0),
        (
            "let xr = dispatch(x, rr) tile(t: 4);\n    return dispatch(xr, rl) tile(t: 4);",
            "rl.recv",
            6.0,
        ),
        ("return dispatch(x, rr) tile(t: 4);", "rr.recv", 6.0),
    ];
    for (body, out, rows) in cases {
        let p = view_program(&dir, body, out);
        let c = compile(&p, Some(Policy::Interleaved));
        let (s, _) = simulated(&p, &c, false);
        let remote: f64 = (0..c.graph.len()).map(|t| s.workload.remote_bytes(t)).sum();
        assert_eq!(remote, rows * row, "{body}");
    }
    // Each rank's windows, also by hand: rank 0 receives (by_rank) its own t0, t1, t3 and
    // rank 1's t0, t2, t3; rank 1 its own t1, t2, t3 and rank 0's t1, t2, t3.
    let p = view_program(
        &dir,
        "let xr = dispatch(x, rr) tile(t: 4);\n    return dispatch(xr, rl) tile(t: 4);",
        "rl.recv",
    );
    let c = compile(&p, Some(Policy::Interleaved));
    let layouts = &c.graph.layouts;
    let rr = layouts[1].as_ref().expect("rr is used");
    let rl = layouts[2].as_ref().expect("rl is used");
    assert_eq!((rr.rows(0), rr.rows(1)), (6, 6));
    // The fanout window holds r's rows: each rank receives 4 (token, choice) rows of r from
    // itself and 4 from the other.
    assert_eq!((rl.rows(0), rl.rows(1)), (8, 8));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn task_durations_do_not_depend_on_the_schedule() {
    // The choice among candidate schedules computes the workload's durations once and bounds
    // every candidate with them: they must be what a fresh computation gives for each
    // candidate's schedule, whether the workload was rescheduled or built for it.
    for (file, sets) in [
        ("examples/deepseek_v3_ep4_bwd.hpm", &["tokens=256", "experts=16"][..]),
        ("examples/qwen_moe_ep8_fwd.hpm", &[][..]),
        ("examples/comm_bench.hpm", &["ranks=16"][..]),
    ] {
        let p = program_file(&root().join(file), sets);
        let m = DeviceModel::new(&p.device).expect("model");
        let tf = &p.taskflows[0];
        let c = compile(&p, Some(Policy::Interleaved));
        let rank = &c.graph.rank;
        let spec = c.schedule.policy.clone();
        let mut w = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &c.schedule, &m);
        let first = hpmoe_sim::report::durations(&w, &m, rank);
        let bits = |d: &hpmoe_sim::report::Durations| -> Vec<u64> {
            [&d.d, &d.release, &d.landing, &d.must_miss, &d.slack]
                .iter()
                .flat_map(|v| v.iter().map(|x| x.to_bits()))
                .collect()
        };
        let mut other_orders = 0;
        for k in 0..hpmoe_dsl::schedule::CANDIDATES {
            let Some((s, _)) = hpmoe_dsl::schedule::candidate(&p, tf, &c.graph, &spec, k) else {
                continue;
            };
            if s.fingerprint() != c.schedule.fingerprint() {
                other_orders += 1;
            }
            w.reschedule(&c.graph, &s, &m);
            assert_eq!(
                bits(&hpmoe_sim::report::durations(&w, &m, rank)),
                bits(&first),
                "{file}: candidate {k}"
            );
            let fresh = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &s, &m);
            assert_eq!(
                bits(&hpmoe_sim::report::durations(&fresh, &m, rank)),
                bits(&first),
                "{file}: candidate {k}"
            );
            // The bounds from the kept durations are the bounds.
            assert_eq!(
                hpmoe_sim::report::bounds_and_chains_with(&w, &s, &m, rank, true, &first),
                hpmoe_sim::report::bounds_and_chains(&fresh, &s, &m, rank, true),
                "{file}: candidate {k}"
            );
            assert_eq!(
                hpmoe_sim::report::kernel_bound_with(&w, &s, &m, rank, &first),
                hpmoe_sim::report::kernel_bound(&fresh, &s, &m, rank),
                "{file}: candidate {k}"
            );
        }
        assert!(other_orders > 0, "{file}: every candidate is the policy's own schedule");
        // Durations of another workload are not trusted: the bounds are the bounds.
        let s = &c.schedule;
        w.reschedule(&c.graph, s, &m);
        let other = hpmoe_sim::report::Durations::default();
        assert_eq!(
            hpmoe_sim::report::bounds_and_chains_with(&w, s, &m, rank, true, &other),
            hpmoe_sim::report::bounds_and_chains(&w, s, &m, rank, true),
            "{file}"
        );
        assert_eq!(
            hpmoe_sim::report::kernel_bound_with(&w, s, &m, rank, &other),
            hpmoe_sim::report::kernel_bound(&w, s, &m, rank),
            "{file}"
        );
    }
}

/// A kernel-by-kernel schedule describes the signals of its barriers over every rank by a
/// fanout per kernel; the simulator delivers them and the bounds gather them per source rank
/// without a list. Written out as a list, task by task (the plain form every consumer also
/// reads), the same schedule must simulate and bound the same, to the bit.
#[test]
fn barrier_fanouts_simulate_and_bound_as_their_signals_listed() {
    for (file, overrides) in [
        ("deepseek_v3_ep4_fwd.hpm", &["tokens=256"][..]),
        ("deepseek_v3_ep8_bwd.hpm", &["tokens=128"][..]),
        ("qwen_moe_ep8_fwd.hpm", &["tokens=128", "ranks=16"][..]),
    ] {
        let p = program_file(&root().join("examples").join(file), overrides);
        let tf = &p.taskflows[0];
        let c = compile(&p, Some(Policy::KernelByKernel));
        let s = &c.schedule;
        assert!(
            s.fanout
                .iter()
                .any(|f| matches!(f, Some(hpmoe_dsl::schedule::Fanout::EveryRank { .. }))),
            "{file}: a barrier over every rank"
        );
        let mut listed = s.clone();
        let pairs: Vec<(u32, u32)> = (0..c.graph.len())
            .flat_map(|t| s.signals(t).map(move |k| (t as u32, k)))
            .collect();
        listed.signal_list = hpmoe_dsl::lower::Csr::from_pairs(c.graph.len(), &pairs);
        listed.fanout.clear();
        assert!(hpmoe_dsl::verify::verify_schedule(&p, tf, &c.graph, &listed).is_empty());
        let m = DeviceModel::new(&p.device).expect("a model");
        let wa = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, s, &m);
        let wb = hpmoe_sim::sim::Workload::new(&p, tf, &c.graph, &listed, &m);
        let a = simulate(&wa, s, &m, SimOptions::default()).expect("runs");
        let b = simulate(&wb, &listed, &m, SimOptions::default()).expect("runs");
        assert_eq!(a.makespan.to_bits(), b.makespan.to_bits(), "{file}");
        assert_eq!(a.start, b.start, "{file}");
        assert_eq!(a.end, b.end, "{file}");
        assert_eq!(a.counter_time, b.counter_time, "{file}");
        let du = hpmoe_sim::report::durations(&wa, &m, &c.graph.rank);
        let (ha, ta, sa) = hpmoe_sim::report::heads_tails(&wa, s, &m, &c.graph.rank, &du);
        let (hb, tb, sb) = hpmoe_sim::report::heads_tails(&wb, &listed, &m, &c.graph.rank, &du);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ha), bits(&hb), "{file}: heads");
        assert_eq!(bits(&ta), bits(&tb), "{file}: tails");
        assert_eq!(bits(&sa), bits(&sb), "{file}: spans");
    }
}

#[test]
fn paced_link_solves_stay_close_to_exact_ones_and_are_reported() {
    // A fused DeepSeek-V3 layer on 16 ranks (240 pairs with traffic, the puts of ranks
    // soon out of step): with a tiny budget the link rates are re-shared at intervals, with
    // none they are solved at every instant. Pacing is reported, makes far fewer solves,
    // moves the same bytes and keeps the latency within one percent; with the default
    // budget so small a run is exact.
    let p = program_file(
        &root().join("examples/deepseek_v3_ep8_fwd.hpm"),
        &["ranks=16", "tokens=64"],
    );
    let c = compile(&p, Some(Policy::Interleaved));
    let m = DeviceModel::new(&p.device).expect("model");
    let w = hpmoe_sim::sim::Workload::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &m);
    let run = |link_budget: sim::LinkBudget| {
        let opts = SimOptions {
            link_budget,
            ..SimOptions::default()
        };
        simulate(&w, &c.schedule, &m, opts).expect("runs")
    };
    let exact = run(sim::LinkBudget::UNLIMITED);
    assert_eq!(exact.link_pacing, None);
    let default = run(sim::LinkBudget::default());
    assert_eq!(default.link_pacing, None);
    assert_eq!(default.makespan.to_bits(), exact.makespan.to_bits());
    let tiny = sim::LinkBudget {
        exact_min: 1_000,
        exact: 10_000,
        interval: 10e-9,
        interval_work: 20_000,
    };
    let paced = run(tiny);
    let pacing = paced.link_pacing.expect("paced");
    assert!(pacing.from > 0.0 && pacing.from < paced.makespan, "{pacing:?}");
    assert!(pacing.projected_work > tiny.exact && pacing.exact_work >= tiny.exact_min);
    assert!(pacing.last >= pacing.first && pacing.first == tiny.interval);
    assert!(
        paced.link.solves * 2 < exact.link.solves,
        "{} paced solves against {} exact",
        paced.link.solves,
        exact.link.solves
    );
    let total = |v: &[f64]| v.iter().sum::<f64>();
    assert!(close(total(&paced.sent), total(&exact.sent), 1e-9));
    assert!(close(total(&paced.received), total(&exact.received), 1e-9));
    assert!(
        close(paced.makespan, exact.makespan, 0.01),
        "paced {} us, exact {} us",
        paced.makespan * 1e6,
        exact.makespan * 1e6
    );
    // Counted in work, not time: the same input is paced the same way again.
    let again = run(tiny);
    assert_eq!(again.makespan.to_bits(), paced.makespan.to_bits());
    assert_eq!(again.link_pacing, paced.link_pacing);
    // The report carries the note, in text and JSON.
    let r = Report::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &w, &m, &paced);
    assert!(r.human().contains("re-shared every"), "{}", r.human());
    assert!(r.json()["link_pacing"]["from_us"].as_f64().is_some());
    let r = Report::new(&p, &p.taskflows[0], &c.graph, &c.schedule, &w, &m, &exact);
    assert!(r.json()["link_pacing"].is_null());
}
