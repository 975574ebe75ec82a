//! Communication order as the simulated run shows it, read from the Chrome trace: under
//! `kernel_by_kernel`, `order(ratr)` changes the order in which a rank's combine tiles go out
//! (each core's tiles by rotated destination: the rank itself first), and the pairwise
//! AllToAll starts no tile of step k before the previous step's exchange has ended.
//!
//! The program: 4 ranks of 256 tokens, 16 experts, top-4, balanced routing: token g (over all
//! ranks) goes to the 4 experts of rank g mod 4, so every (source, destination) pair carries
//! 256 rows (8 tiles of 32 for each call). Two vector cores per rank, so the tiles of a call
//! queue up and their order shows in time.

use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Value;
use hpmoe_dsl::lower::{DimKind, TaskGraph};
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::sim::{self, SimOptions};
use hpmoe_sim::trace::{self, Filter, Run};
use std::collections::BTreeMap;

const RANKS: u32 = 4;

fn program(order: &str) -> Checked {
    let text = format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = 256;\nparam hidden = 256;\nparam inter = 64;\nparam experts = 16;\n\
         param topk = 4;\nparam local = experts / 4;\n\
         device = ascend_a3 {{ ranks: 4, aiv_cores: 2 }};\nroute r = balanced(experts: experts, topk: topk);\n\
         taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
         let xd = dispatch(x, r) tile(t: 32) {order};\n\
         let h = gmm(xd, w_up) tile(m: 32, n: 64, k: 16);\n\
         let a = swiglu(h) tile(m: 16);\n\
         let y = gmm(a, w_down) tile(m: 32, n: 64, k: 16);\n\
         return combine(y, r) tile(m: 32) {order};\n}}\n"
    );
    let mut sm = SourceMap::new();
    let out = check_text("order.hpm", &text, None, &Options::default(), &mut sm);
    out.checked.unwrap_or_else(|| {
        panic!(
            "{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        )
    })
}

fn compile(p: &Checked, options: &[(&str, Value)]) -> Compiled {
    let o: BTreeMap<String, Value> = options.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let spec = PolicySpec::with_options(p, Policy::KernelByKernel, &o).expect("options");
    p.compile(&p.taskflows[0], &spec, &CompileOptions::default())
        .unwrap_or_else(|ds| panic!("{ds:?}"))
}

/// The destination of a task, from its tile and the layout.
fn dest(g: &TaskGraph, t: usize) -> u32 {
    let nt = &g.nodes[g.node[t] as usize];
    let c = g.chunks(t);
    match &nt.dims[0].kind {
        DimKind::Send { .. } => c[0].group / 4,
        DimKind::Recv(route) => {
            let l = g.layouts[route.0 as usize].as_ref().unwrap();
            l.recv[g.rank[t] as usize]
                .get(c[0].lo as usize)
                .expect("a window row")
                .src_rank
        }
        k => panic!("not a communication dimension: {k:?}"),
    }
}

/// One task as the trace shows it.
#[derive(Clone, Copy, Debug)]
struct Event {
    task: usize,
    rank: u32,
    core: u32,
    start: f64,
    end: f64,
}

/// The trace's events of one call.
fn events(p: &Checked, c: &Compiled, call: &str) -> Vec<Event> {
    let s = sim::simulate_compiled(p, &p.taskflows[0], c, SimOptions::default()).expect("simulates");
    let run = Run {
        program: p,
        tf: &p.taskflows[0],
        graph: &c.graph,
        schedule: &c.schedule,
        workload: &s.workload,
        result: &s.result,
    };
    let v: serde_json::Value = serde_json::from_str(&trace::to_string(&run, &Filter::default())).expect("json");
    let mut out: Vec<Event> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["call"] == call)
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            Event {
                task: e["args"]["task"].as_u64().unwrap() as usize,
                rank: e["pid"].as_u64().unwrap() as u32,
                core: e["tid"].as_u64().unwrap() as u32,
                start: ts,
                end: ts + e["dur"].as_f64().unwrap(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.task.cmp(&b.task)));
    out
}

/// Per (rank, core): the destinations of the call's tiles in the order they ran.
fn per_core(g: &TaskGraph, ev: &[Event]) -> BTreeMap<(u32, u32), Vec<u32>> {
    let mut m: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for e in ev {
        m.entry((e.rank, e.core)).or_default().push(dest(g, e.task));
    }
    m
}

#[test]
fn ratr_on_combine_changes_the_order_tiles_run_in() {
    let p = program("order(ratr)");
    let unordered = ("alltoall", Value::Name("unordered".into()));
    let on = compile(&p, std::slice::from_ref(&unordered));
    let off = compile(&p, &[unordered.clone(), ("ratr", Value::Bool(false))]);
    for call in ["xd", "out"] {
        let e_on = events(&p, &on, call);
        let e_off = events(&p, &off, call);
        assert_eq!(e_on.len(), 4 * 32);
        for ((rank, core), d) in per_core(&on.graph, &e_on) {
            // Each core runs every other tile of its rank's rotated list, which rotates once
            // per local expert (4) with 2 tiles per (expert, pair): per expert, one tile to
            // the rank itself, then one to the next rank, ...
            let want: Vec<u32> = (0..4)
                .flat_map(|_| (0..RANKS).map(move |k| (rank + k) % RANKS))
                .collect();
            assert_eq!(d, want, "{call} with ratr, rank {rank} core {core}");
        }
        for ((rank, core), d) in per_core(&off.graph, &e_off) {
            // Without it every rank starts with rank 0 (dispatch: by destination expert;
            // combine: by local expert, inside it by source rank).
            assert_eq!(d[0], 0, "{call} without ratr, rank {rank} core {core}");
            let want: Vec<u32> = if call == "xd" {
                (0..RANKS).flat_map(|k| std::iter::repeat_n(k, 4)).collect()
            } else {
                (0..4).flat_map(|_| 0..RANKS).collect()
            };
            assert_eq!(d, want, "{call} without ratr, rank {rank} core {core}");
        }
    }
}

#[test]
fn pairwise_steps_wait_for_the_previous_exchange() {
    let p = program("");
    let c = compile(&p, &[]);
    let g = &c.graph;
    for call in ["xd", "out"] {
        let ev = events(&p, &c, call);
        let step = |e: &Event| (dest(g, e.task) + RANKS - e.rank) % RANKS;
        for i in 0..RANKS {
            for k in 1..RANKS {
                let from = (i + RANKS - (k - 1)) % RANKS;
                let first = ev
                    .iter()
                    .filter(|e| e.rank == i && step(e) == k)
                    .map(|e| e.start)
                    .fold(f64::INFINITY, f64::min);
                let prev_end = ev
                    .iter()
                    .filter(|e| {
                        (e.rank == i && step(e) == k - 1)
                            || (e.rank == from && dest(g, e.task) == i && step(e) == k - 1)
                    })
                    .map(|e| e.end)
                    .fold(0.0, f64::max);
                assert!(first.is_finite() && prev_end > 0.0);
                assert!(
                    first >= prev_end - 1e-3,
                    "{call}: rank {i} step {k} starts at {first} us, before step {} ended at {prev_end} us",
                    k - 1
                );
            }
        }
        // And every rank runs its steps in order 0, 1, 2, 3 (by start time).
        for i in 0..RANKS {
            let steps: Vec<u32> = ev.iter().filter(|e| e.rank == i).map(step).collect();
            assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{call} rank {i}: {steps:?}");
        }
    }
    // The unordered collective lets a later step's tile start before an earlier one ended:
    // its tiles are not in steps at all (rank 1 starts with rank 0, its step 3).
    let u = compile(&p, &[("alltoall", Value::Name("unordered".into()))]);
    let ev = events(&p, &u, "xd");
    let first = ev.iter().find(|e| e.rank == 1).unwrap();
    assert_eq!(dest(&u.graph, first.task), 0);
}
