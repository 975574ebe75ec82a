//! Lowering, verification and scheduling: the reference runtime's task counts, rank-aware
//! reordering, mutation tests of the verifier (each injected fault gives its code, including
//! faults injected into the lowering's own region derivation), and a property test over
//! random small configurations under every policy (which also checks that the verifier's
//! derivation of the regions agrees with the lowering's).

use hpmoe_dsl::check::Options;
use hpmoe_dsl::diag::Code;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::{Home, Program};
use hpmoe_dsl::lower::regions::fault::{self, Fault};
use hpmoe_dsl::lower::{self, Csr, LowerOptions, Region, TaskGraph, NO_COUNTER};
use hpmoe_dsl::schedule::{self, Policy, PolicySpec, Schedule};
use hpmoe_dsl::verify::{put_back_writes, verify_graph, verify_schedule, Deriver};
use hpmoe_dsl::SourceMap;
use proptest::prelude::*;

fn program(text: &str) -> Checked {
    let mut sm = SourceMap::new();
    let out = check_text("test.hpm", text, None, &Options::default(), &mut sm);
    match out.checked {
        Some(p) => p,
        None => panic!(
            "program does not check:\n{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        ),
    }
}

fn compile(p: &Checked, tf: usize, policy: Policy) -> Compiled {
    let spec = p.select_policy(&p.taskflows[tf].name, Some(policy));
    match p.compile(&p.taskflows[tf], &spec, &CompileOptions::default()) {
        Ok(c) => c,
        Err(ds) => panic!(
            "{policy:?}: {:#?}",
            ds.iter().map(|d| d.message.clone()).collect::<Vec<_>>()
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn moe(
    tokens: u64,
    hidden: u64,
    inter: u64,
    experts: u64,
    topk: u64,
    ranks: u64,
    route: &str,
    tiles: (u64, u64, u64, u64),
    backward: bool,
) -> String {
    let (t, m, n, s) = tiles;
    let head = format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = {tokens};\nparam hidden = {hidden};\nparam inter = {inter};\nparam experts = {experts};\n\
         param topk = {topk};\nparam ranks = {ranks};\nparam local = experts / ranks;\n\
         device = ascend_a3 {{ ranks: ranks }};\nroute r = {route};\n"
    );
    let fwd = format!(
        "taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
         let xd = dispatch(x, r) tile(t: {t}) order(ratr);\n\
         let h = gmm(xd, w_up) tile(m: {m}, n: {n}, k: 16);\n\
         let a = swiglu(h) tile(m: {s});\n\
         let y = gmm(a, w_down) tile(m: {m}, n: {n}, k: 16);\n\
         return combine(y, r) tile(m: {t}) order(ratr);\n}}\n"
    );
    let bwd = format!(
        "taskflow bwd(dy: bf16[tokens, hidden], xd: bf16[r.recv, hidden], h: bf16[r.recv, 2 * inter], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden])\n\
         -> (dx: bf16[tokens, hidden], dw_up: bf16[local, hidden, 2 * inter], dw_down: bf16[local, inter, hidden]) {{\n\
         let dyd = combine_grad(dy, r) tile(t: {t}) order(ratr);\n\
         let a = swiglu(h) tile(m: {s});\n\
         let da = gmm_grad_x(dyd, w_down) tile(m: {m}, k: {n}, n: 16);\n\
         let dw_down = gmm_grad_w(a, dyd, r) tile(k: {n}, n: {n}, m: 16);\n\
         let dh = swiglu_grad(da, h) tile(m: {s});\n\
         let dxd = gmm_grad_x(dh, w_up) tile(m: {m}, k: {n}, n: 16);\n\
         let dw_up = gmm_grad_w(xd, dh, r) tile(k: {n}, n: {n}, m: 16);\n\
         let dx = dispatch_grad(dxd, r) tile(m: {t}) order(ratr);\n\
         return (dx, dw_up, dw_down);\n}}\n"
    );
    if backward {
        head + &fwd + &bwd
    } else {
        head + &fwd
    }
}

fn per_rank_counts(g: &TaskGraph) -> Vec<Vec<u32>> {
    g.nodes
        .iter()
        .map(|n| n.per_rank.iter().map(|r| r.count).collect())
        .collect()
}

#[test]
fn expert_level_reproduces_the_reference_task_counts() {
    // TP2 EP2, sequence 1024 (512 tokens per rank), 16 experts, top-8, H 5120, I 2048, 24
    // cube cores: 64 / 192 / 64 / 192 / 64 tasks per rank with static worst-case capacity.
    let p = program(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/ok/reference_worked_example.hpm"
        ))
        .unwrap(),
    );
    let c = compile(&p, 0, Policy::ExpertLevel);
    let counts = per_rank_counts(&c.graph);
    for rank in 0..2 {
        let got: Vec<u32> = counts.iter().map(|n| n[rank]).collect();
        assert_eq!(got, vec![64, 192, 64, 192, 64], "rank {rank}");
    }
    // With exact capacity and the taskflow's own tiles the counts follow the real rows:
    // 512 tokens x 8 choices / 16 experts = 256 rows per (source, expert) = 2 tiles of 128.
    let c = compile(&p, 0, Policy::Interleaved);
    assert_eq!(per_rank_counts(&c.graph)[0], vec![32, 32]);
}

/// `expert_level` cuts a cube op one task per cube core per expert: the expert dimension of a
/// weight gradient one expert per task, and a dense product (a shared expert, one "expert")
/// into one task per cube core over its widest column dimension, whole rows each.
#[test]
fn expert_level_tiles_a_dense_product_one_task_per_cube_core() {
    let p = program(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         device = ascend_a3 { ranks: 2 };\n\
         route r = balanced(experts: 4, topk: 2);\n\
         taskflow f(x: bf16[512, 256], w: bf16[2, 256, 512], ws: bf16[256, 1024], dy: bf16[512, 512])\n\
           -> (y: bf16[r.recv, 512], ys: bf16[512, 1024], dw: bf16[2, 256, 512], dws: bf16[256, 1024]) {\n\
             let xd = dispatch(x, r);\n\
             let y = gmm(xd, w);\n\
             let ys = mm(x, ws);\n\
             let dyd = dispatch(dy, r);\n\
             let dw = gmm_grad_w(xd, dyd, r);\n\
             let dws = mm_grad_w(x, ys);\n\
             return (y, ys, dw, dws);\n\
         }\n",
    );
    let c = compile(&p, 0, Policy::ExpertLevel);
    let aic = p.program().device.aic_cores();
    let counts = per_rank_counts(&c.graph);
    let call = |name: &str| {
        let tf = &p.taskflows[0];
        tf.nodes.iter().position(|n| tf.tensor(n.output).name == name).unwrap()
    };
    for rank in 0..2 {
        // 1024 columns = 64 units of 16 over 24 cube cores; all 512 rows in each task.
        assert_eq!(counts[call("ys")][rank], aic, "rank {rank}: mm");
        // 1024 columns of the weight gradient likewise, all 256 rows of k.
        assert_eq!(counts[call("dws")][rank], aic, "rank {rank}: mm_grad_w");
        // Two local experts, each cut into one task per cube core over its 512 columns.
        assert_eq!(counts[call("dw")][rank], 2 * aic, "rank {rank}: gmm_grad_w");
    }
}

/// Each rank's dispatch tasks in the order the static schedule issues them.
fn issue_order(g: &TaskGraph, s: &Schedule, node: usize, rank: u32) -> Vec<u32> {
    let nt = &g.nodes[node];
    let base = nt.base[rank as usize];
    let mut ts: Vec<(usize, u32, u32)> = (base..base + nt.per_rank[rank as usize].count)
        .map(|t| {
            let core = s.core[t as usize];
            let pos = s.queues.row(core as usize).iter().position(|&x| x == t).unwrap();
            (pos, core, t)
        })
        .collect();
    ts.sort();
    ts.into_iter().map(|(_, _, t)| t).collect()
}

fn destinations_distinct_at_every_step(c: &Compiled, ranks: u32) -> bool {
    let orders: Vec<Vec<u32>> = (0..ranks).map(|r| issue_order(&c.graph, &c.schedule, 0, r)).collect();
    let steps = orders.iter().map(|o| o.len()).min().unwrap();
    (0..steps).all(|i| {
        let mut dests: Vec<u32> = orders
            .iter()
            .map(|o| schedule::send_dest(&c.graph, o[i] as usize).unwrap())
            .collect();
        dests.sort();
        dests.dedup();
        dests.len() == ranks as usize
    })
}

#[test]
fn ratr_spreads_destinations() {
    let p = program(&moe(
        256,
        64,
        64,
        16,
        4,
        4,
        "balanced(experts: experts, topk: topk)",
        (32, 32, 64, 16),
        false,
    ));
    let spec = p.select_policy(&p.taskflows[0].name, Some(Policy::ExpertLevel));
    let c = p.compile(&p.taskflows[0], &spec, &CompileOptions::default()).unwrap();
    assert!(
        destinations_distinct_at_every_step(&c, 4),
        "with ratr every step targets distinct ranks"
    );
    let mut no = spec.clone();
    no.ratr = false;
    let c = p.compile(&p.taskflows[0], &no, &CompileOptions::default()).unwrap();
    assert!(
        !destinations_distinct_at_every_step(&c, 4),
        "without ratr all ranks start at rank 0"
    );
}

fn codes(ds: &[hpmoe_dsl::Diagnostic]) -> Vec<Code> {
    ds.iter().map(|d| d.code).collect()
}

fn small() -> (Checked, Compiled) {
    let p = program(&moe(
        64,
        32,
        32,
        8,
        2,
        2,
        "uniform(experts: experts, topk: topk, seed: 3)",
        (16, 32, 32, 16),
        false,
    ));
    let c = compile(&p, 0, Policy::Interleaved);
    assert!(verify_graph(&p, &p.taskflows[0], &c.graph).is_empty());
    (p, c)
}

/// A task of call `node` that waits for something, and one of its producers.
fn some_edge(g: &TaskGraph, node: u32) -> (usize, u32) {
    (0..g.len())
        .find_map(|t| (g.node[t] == node && g.wait[t] != NO_COUNTER).then(|| (t, g.preds(t)[0])))
        .unwrap()
}

/// Replaces the schedule's queues.
fn set_queues(s: &mut Schedule, queues: &[Vec<u32>]) {
    let mut off = vec![0u32];
    let mut idx = Vec::new();
    for q in queues {
        idx.extend_from_slice(q);
        off.push(idx.len() as u32);
    }
    s.queues = Csr { off, idx };
}

/// Gives task `t` its own counter with these producers.
fn set_preds(g: &mut TaskGraph, t: usize, preds: &[u32]) {
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for c in 0..g.counters.len() {
        for &p in g.counters.row(c) {
            pairs.push((c as u32, p));
        }
    }
    let new = g.counters.len() as u32;
    for &p in preds {
        pairs.push((new, p));
    }
    g.counters = Csr::from_pairs(new as usize + 1, &pairs);
    g.counter_rank.push(g.rank[t]);
    g.wait[t] = new;
    g.rebuild_reverse();
}

#[test]
fn mutation_drop_an_edge_is_a_race() {
    let (p, mut c) = small();
    let (t, w) = some_edge(&c.graph, 1);
    let rest: Vec<u32> = c.graph.preds(t).iter().copied().filter(|&x| x != w).collect();
    set_preds(&mut c.graph, t, &rest);
    let ds = verify_graph(&p, &p.taskflows[0], &c.graph);
    assert!(codes(&ds).contains(&Code::Race), "{ds:#?}");
    assert!(
        ds[0].message.contains("gmm") && ds[0].message.contains("dispatch"),
        "names both calls: {}",
        ds[0].message
    );
}

#[test]
fn mutation_shrink_a_tile_is_a_missing_producer() {
    let (p, mut c) = small();
    // The gmm-up call's last column chunk on rank 0 loses its last 8 columns.
    let nt = &mut c.graph.nodes[1];
    let last = nt.per_rank[0].chunks[1].last_mut().unwrap();
    last.hi -= 8;
    let ds = verify_graph(&p, &p.taskflows[0], &c.graph);
    assert!(codes(&ds).contains(&Code::MissingProducer), "{ds:#?}");
}

#[test]
fn mutation_second_writer_is_a_write_conflict() {
    let (p, mut c) = small();
    let g = &mut c.graph;
    let base = g.nodes[1].base[0] as usize;
    g.tile[base + 1] = g.tile[base];
    let ds = verify_graph(&p, &p.taskflows[0], &c.graph);
    assert!(codes(&ds).contains(&Code::WriteConflict), "{ds:#?}");
}

#[test]
fn mutation_added_cycle_is_a_cycle() {
    let (p, mut c) = small();
    let (t, w) = some_edge(&c.graph, 2);
    // The producer now also waits for its consumer.
    let mut preds = c.graph.preds(w as usize).to_vec();
    preds.push(t as u32);
    preds.sort();
    set_preds(&mut c.graph, w as usize, &preds);
    let ds = verify_graph(&p, &p.taskflows[0], &c.graph);
    assert_eq!(codes(&ds), vec![Code::Cycle], "{ds:#?}");
}

#[test]
fn mutation_lowered_threshold_is_a_mismatch() {
    let (p, mut c) = small();
    let ctr = c.graph.wait.iter().copied().find(|&x| x != NO_COUNTER).unwrap();
    c.schedule.threshold[ctr as usize] -= 1;
    let ds = verify_schedule(&p, &p.taskflows[0], &c.graph, &c.schedule);
    assert_eq!(codes(&ds), vec![Code::ThresholdMismatch], "{ds:#?}");
}

#[test]
fn mutation_swapped_queue_entries_deadlock() {
    let (p, mut c) = small();
    // A SwiGLU task t waits for a GMM task w, which waits for a dispatch task d. Queue t on
    // d's vector core in front of d: t waits for w, w for d, and d for t's core.
    let (t, w) = some_edge(&c.graph, 2);
    let d = c.graph.preds(w as usize)[0];
    let tfl = &p.taskflows[0];
    assert_eq!(c.graph.engine(tfl, t), c.graph.engine(tfl, d as usize));
    let s = &mut c.schedule;
    let mut queues: Vec<Vec<u32>> = (0..s.queues.len()).map(|q| s.queues.row(q).to_vec()).collect();
    let (ct, cd) = (s.core[t] as usize, s.core[d as usize] as usize);
    queues[ct].retain(|&x| x as usize != t);
    let pos = queues[cd].iter().position(|&x| x == d).unwrap();
    queues[cd].insert(pos, t as u32);
    s.core[t] = cd as u32;
    set_queues(s, &queues);
    let ds = verify_schedule(&p, tfl, &c.graph, &c.schedule);
    assert_eq!(codes(&ds), vec![Code::Deadlock], "{ds:#?}");
    assert!(!ds[0].notes.is_empty(), "the deadlock report names the waits");
}

/// A kernel-by-kernel schedule of the small layer: a kernel whose barrier is every rank's
/// (its range of counters, its index), and a task that waits on one of its counters, of the
/// engine of a task of an earlier kernel on its rank.
fn every_rank_barrier() -> (Checked, Compiled, std::ops::Range<u32>, usize, usize) {
    let (p, _) = small();
    let c = compile(&p, 0, Policy::KernelByKernel);
    let s = &c.schedule;
    let tfl = &p.taskflows[0];
    let found = s.fanout.iter().enumerate().find_map(|(kernel, f)| {
        let Some(schedule::Fanout::EveryRank { first, ranks }) = *f else {
            return None;
        };
        let range = first..first + ranks;
        let waiter = (0..c.graph.len()).find(|&t| {
            s.waits.row(t).iter().any(|w| range.contains(w))
                && (0..c.graph.len()).any(|d| {
                    (s.kernel[d] as usize) < kernel
                        && c.graph.rank[d] == c.graph.rank[t]
                        && c.graph.engine(tfl, d) == c.graph.engine(tfl, t)
                })
        })?;
        Some((range, kernel, waiter))
    });
    let (range, kernel, waiter) = found.expect("a kernel whose barrier is every rank's, and a waiter");
    assert!(range.len() > 1);
    assert!(verify_schedule(&p, tfl, &c.graph, s).is_empty());
    (p, c, range, kernel, waiter)
}

#[test]
fn mutation_every_rank_barrier_threshold_is_a_mismatch() {
    // Each task of the kernel signals every rank's counter: a threshold one off either way
    // no longer equals the signals that arrive.
    for delta in [-1i64, 1] {
        let (p, mut c, range, _, _) = every_rank_barrier();
        let k = range.start as usize + 1;
        c.schedule.threshold[k] = (i64::from(c.schedule.threshold[k]) + delta) as u32;
        let ds = verify_schedule(&p, &p.taskflows[0], &c.graph, &c.schedule);
        assert_eq!(codes(&ds), vec![Code::ThresholdMismatch], "{delta}: {ds:#?}");
    }
}

#[test]
fn mutation_waiter_ahead_of_an_every_rank_barrier_deadlocks() {
    // Queue a task that waits on the barrier in front of a task of an earlier kernel on that
    // task's core: the barrier's kernel comes after every task of the earlier one (each
    // kernel waits for the one before), so the barrier needs the task behind it.
    let (p, mut c, _, kernel, w) = every_rank_barrier();
    let s = &mut c.schedule;
    // A task of an earlier kernel on the waiter's rank and engine (a task is queued on its
    // own).
    let tfl = &p.taskflows[0];
    let d = (0..c.graph.len())
        .find(|&t| {
            (s.kernel[t] as usize) < kernel
                && c.graph.rank[t] == c.graph.rank[w]
                && c.graph.engine(tfl, t) == c.graph.engine(tfl, w)
        })
        .expect("a task of the kernel beside the waiter");
    let mut queues: Vec<Vec<u32>> = (0..s.queues.len()).map(|q| s.queues.row(q).to_vec()).collect();
    let (cw, cd) = (s.core[w] as usize, s.core[d] as usize);
    queues[cw].retain(|&x| x as usize != w);
    let pos = queues[cd].iter().position(|&x| x as usize == d).unwrap();
    queues[cd].insert(pos, w as u32);
    s.core[w] = cd as u32;
    set_queues(s, &queues);
    let ds = verify_schedule(&p, &p.taskflows[0], &c.graph, &c.schedule);
    assert_eq!(codes(&ds), vec![Code::Deadlock], "{ds:#?}");
}

/// Every element of every output is written exactly once (accumulated outputs: each token
/// row receives `topk` contributions).
fn outputs_covered_once(p: &Program, tf: usize, g: &TaskGraph) {
    let tf = &p.taskflows[tf];
    let mut scratch = Default::default();
    let mut vol = vec![vec![0u64; g.ranks as usize]; tf.tensors.len()];
    let mut acc_rows = vec![vec![std::collections::BTreeMap::<i64, u64>::new(); g.ranks as usize]; tf.tensors.len()];
    for t in 0..g.len() {
        let a = lower::regions::tile_access(p, tf, g, t, &mut scratch);
        for w in &a.writes {
            if w.accumulate {
                *acc_rows[w.tensor.0 as usize][w.rank as usize]
                    .entry(w.lo[0])
                    .or_default() += 1;
            } else {
                vol[w.tensor.0 as usize][w.rank as usize] += w.volume();
            }
        }
    }
    for (name, tid) in &tf.outputs {
        let t = tf.tensor(*tid);
        for r in 0..g.ranks as usize {
            let rows = match t.shape[0] {
                hpmoe_dsl::ir::Dim::Fixed(n) => n,
                hpmoe_dsl::ir::Dim::Recv(rid) => g.layouts[rid.0 as usize].as_ref().unwrap().rows(r) as u64,
            };
            let rest: u64 = t.shape[1..].iter().map(|d| d.fixed().unwrap()).product();
            if t.home == Home::Window && !acc_rows[tid.0 as usize][r].is_empty() {
                let topk = p.routes[0].topk;
                assert_eq!(
                    acc_rows[tid.0 as usize][r].len() as u64,
                    rows,
                    "output {name} rank {r}: every row"
                );
                assert!(
                    acc_rows[tid.0 as usize][r].values().all(|&c| c == topk),
                    "output {name} rank {r}: topk contributions"
                );
            } else {
                assert_eq!(
                    vol[tid.0 as usize][r],
                    rows * rest,
                    "output {name} rank {r} written exactly once"
                );
            }
        }
    }
}

/// The verifier derives every task's regions as the lowering does (empty boxes aside).
fn derivations_agree(p: &Program, tf: usize, g: &TaskGraph) {
    let tf = &p.taskflows[tf];
    let mut scratch = Default::default();
    let mut derived = Deriver::default();
    let nonempty = |rs: &[Region]| rs.iter().copied().filter(|r| !r.is_empty()).collect::<Vec<_>>();
    // Per call and rank: the writes its tasks make there.
    let mut writes = vec![vec![0usize; g.ranks as usize]; tf.nodes.len()];
    for t in 0..g.len() {
        let a = lower::regions::tile_access(p, tf, g, t, &mut scratch);
        derived.derive(tf, g, t);
        assert_eq!(nonempty(&derived.reads), nonempty(&a.reads), "reads of task {t}");
        assert_eq!(nonempty(&derived.writes), nonempty(&a.writes), "writes of task {t}");
        for w in &derived.writes {
            writes[g.node[t] as usize][w.rank as usize] += 1;
        }
    }
    // The verifier sizes its index of writes by the rows a put sends back: exactly the
    // writes the put's tasks make on each rank.
    for (ni, per_rank) in writes.iter().enumerate() {
        if let Some(hint) = put_back_writes(tf, g, ni) {
            assert_eq!(&hint, per_rank, "writes of `{}` per rank", tf.nodes[ni].name);
        }
    }
}

/// Lowers taskflow 0 of `p` (as the interleaved policy does) with `f` injected into the
/// lowering's region derivation, and verifies the result.
fn lower_with_fault(p: &Program, f: Fault) -> (TaskGraph, Vec<hpmoe_dsl::Diagnostic>) {
    let layouts = lower::layouts(p, false).unwrap();
    fault::inject(Some(f));
    let g = lower::lower(p, &p.taskflows[0], layouts, &LowerOptions::default());
    fault::inject(None);
    let g = g.unwrap();
    let ds = verify_graph(p, &p.taskflows[0], &g);
    (g, ds)
}

/// The faulty lowering gave task `t` other producers than the correct one (the fault took
/// effect), and the verifier, deriving the regions itself, reports a race and nothing else.
fn caught_as_race(c: &Compiled, g: &TaskGraph, ds: &[hpmoe_dsl::Diagnostic], t: usize) {
    assert_ne!(
        g.preds(t),
        c.graph.preds(t),
        "the fault changes the producers of task {t}"
    );
    assert!(!ds.is_empty(), "the verifier catches the fault");
    assert!(
        codes(ds).iter().all(|&c| c == Code::Race),
        "the verifier's own regions are right: only races: {ds:#?}"
    );
}

#[test]
fn fault_shrunken_read_in_the_lowering_is_a_race() {
    let (p, c) = small();
    // A gmm-down task whose rows of `a` come from several SwiGLU tasks; its read of `a`
    // shrinks to one element, so the lowering finds only one of them.
    let t = (0..c.graph.len())
        .find(|&t| c.graph.node[t] == 3 && c.graph.preds(t).len() >= 2)
        .unwrap();
    let (g, ds) = lower_with_fault(&p, Fault::ShrinkRead { task: t as u32 });
    caught_as_race(&c, &g, &ds, t);
    assert!(
        ds[0].message.contains(&format!("task {t} ")),
        "names the reader: {}",
        ds[0].message
    );
}

#[test]
fn fault_shifted_write_in_the_lowering_is_a_race() {
    let (p, c) = small();
    // The first gmm-up task with consumers writes, for the lowering, the next rows instead
    // of its own: its consumers do not wait for it.
    let g0 = &c.graph;
    let w = (0..g0.len())
        .find(|&w| g0.node[w] == 1 && (0..g0.len()).any(|t| g0.preds(t).contains(&(w as u32))))
        .unwrap();
    let rows = g0.chunks(w)[0];
    let consumer = (0..g0.len()).find(|&t| g0.preds(t).contains(&(w as u32))).unwrap();
    let (g, ds) = lower_with_fault(
        &p,
        Fault::ShiftWrite {
            task: w as u32,
            by: rows.hi - rows.lo,
        },
    );
    caught_as_race(&c, &g, &ds, consumer);
    assert!(
        ds.iter().any(|d| d.message.contains(&format!("task {w} "))),
        "names the writer: {ds:#?}"
    );
}

#[test]
fn fault_dropped_read_in_the_lowering_is_a_race() {
    let (p, c) = small();
    // A SwiGLU task reads nothing, for the lowering: it waits for nothing.
    let t = some_edge(&c.graph, 2).0;
    let (g, ds) = lower_with_fault(&p, Fault::DropReads { task: t as u32 });
    assert_eq!(g.wait[t], NO_COUNTER);
    caught_as_race(&c, &g, &ds, t);
    assert!(
        ds[0].message.contains(&format!("task {t} ")) && ds[0].message.contains("`h`"),
        "names the reader and the tensor: {}",
        ds[0].message
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn every_policy_verifies_and_covers_outputs(
        ranks in prop::sample::select(vec![1u64, 2, 3, 4, 8]),
        local in 1u64..4,
        topk in 1u64..4,
        tokens in 1u64..48,
        route in 0usize..4,
        t in prop::sample::select(vec![4u64, 16, 128]),
        m in prop::sample::select(vec![16u64, 32, 128]),
        n in prop::sample::select(vec![16u64, 32, 64]),
        s in prop::sample::select(vec![8u64, 16, 64]),
        backward in any::<bool>(),
    ) {
        let experts = ranks * local;
        let topk = topk.min(experts);
        let route = match route {
            0 => "balanced(experts: experts, topk: topk)".to_string(),
            1 => "uniform(experts: experts, topk: topk, seed: 5)".to_string(),
            2 => "zipf(experts: experts, topk: topk, s: 1.3, seed: 2)".to_string(),
            _ => {
                let fmax = (topk.min(local) * ranks) as f64 / topk as f64;
                format!("hotspot(experts: experts, topk: topk, max_over_mean: {:.3}, seed: 9)", 1.0 + (fmax - 1.0) * 0.5)
            }
        };
        let p = program(&moe(tokens, 32, 32, experts, topk, ranks, &route, (t, m, n, s), backward));
        for tf in 0..p.taskflows.len() {
            for policy in Policy::all() {
                let c = compile(&p, tf, policy);
                outputs_covered_once(&p, tf, &c.graph);
                derivations_agree(&p, tf, &c.graph);
            }
        }
    }
}

#[test]
fn mutation_task_on_wrong_engine_is_a_bad_queue() {
    let (p, mut c) = small();
    // Move a cube task onto a vector core of its rank.
    let t = (0..c.graph.len())
        .find(|&t| c.graph.engine(&p.taskflows[0], t) == hpmoe_dsl::ir::Engine::Aic)
        .unwrap();
    let s = &mut c.schedule;
    let from = s.core[t] as usize;
    let to = (s.core_rank(from as u32) * s.cores_per_rank() + s.aic_cores) as usize;
    let mut queues: Vec<Vec<u32>> = (0..s.queues.len()).map(|q| s.queues.row(q).to_vec()).collect();
    queues[from].retain(|&x| x as usize != t);
    queues[to].push(t as u32);
    s.core[t] = to as u32;
    set_queues(s, &queues);
    let ds = verify_schedule(&p, &p.taskflows[0], &c.graph, &c.schedule);
    assert_eq!(codes(&ds), vec![Code::BadQueue], "{ds:#?}");
}

/// A `file(...)` routing declared in an imported module names files relative to that
/// module: the checker reads their header there, and lowering must read the same files.
#[test]
fn file_routing_of_an_imported_module_lowers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ok/imported_file_routing.hpm");
    let mut sm = SourceMap::new();
    let out = hpmoe_dsl::driver::check_path(&path, &Options::default(), &mut sm);
    let p = out.checked.expect("the program checks");
    for policy in Policy::all() {
        let c = compile(&p, 0, policy);
        // 4 ranks x 8 tokens x top-2 choices, sent and combined.
        assert!(!c.graph.is_empty(), "{policy:?}");
    }
    let l = p.layouts(false).expect("the routing is read");
    let recv: u64 = l[0].as_ref().expect("used").routing.recv_counts().iter().sum();
    assert_eq!(recv, 4 * 8 * 2);
}

/// `interleave_backward` is an option of `expert_level` (where the cube queues alternate the
/// tiles of the two backward GMM calls) and changes its schedule.
#[test]
fn interleave_backward_changes_the_expert_level_cube_queues() {
    let p = program(&moe(
        64,
        32,
        32,
        8,
        2,
        2,
        "uniform(experts: experts, topk: topk, seed: 3)",
        (16, 32, 32, 16),
        true,
    ));
    let tf = p
        .taskflows
        .iter()
        .position(|t| t.name == "bwd")
        .expect("a backward taskflow");
    let on = PolicySpec::defaults(&p, Policy::ExpertLevel);
    assert!(on.interleave_backward, "the stdlib's default");
    let mut options = std::collections::BTreeMap::new();
    options.insert("interleave_backward".to_string(), hpmoe_dsl::ir::Value::Bool(false));
    let off = PolicySpec::with_options(&p, Policy::ExpertLevel, &options).expect("an option of expert_level");
    let a = p.compile(&p.taskflows[tf], &on, &CompileOptions::default()).unwrap();
    let b = p.compile(&p.taskflows[tf], &off, &CompileOptions::default()).unwrap();
    assert_ne!(a.schedule.queues.idx, b.schedule.queues.idx);
    // Under `interleaved` the option does not exist: asking for it is an error, not a no-op.
    assert!(PolicySpec::with_options(&p, Policy::Interleaved, &options).is_err());
}

/// A program may declare one of the scheduler's policies again with other defaults: its
/// `schedule` and a front end's `--policy` then both use them.
#[test]
fn a_redeclared_policy_brings_its_own_defaults() {
    let text = "import std::moe::{add};\n\
        policy expert_level(aiv_fraction: float = 1.0, static_capacity: bool = false, ratr: bool = false, interleave_backward: bool = false);\n\
        taskflow t(x: f32[64, 64]) -> f32[64, 64] { return add(x, x); }\n";
    let p = program(text);
    for spec in [
        PolicySpec::defaults(&p, Policy::ExpertLevel),
        p.select_policy("t", Some(Policy::ExpertLevel)),
    ] {
        assert_eq!(spec.aiv_fraction, 1.0);
        assert!(!spec.static_capacity && !spec.ratr && !spec.interleave_backward);
    }
    // The other policies keep the stdlib's.
    assert_eq!(
        PolicySpec::defaults(&p, Policy::Interleaved).priority,
        schedule::Priority::CriticalPath
    );
    assert!(PolicySpec::defaults(&p, Policy::Interleaved).ratr);
}

/// `priority(N)` on a call: among ready tasks the higher priority is placed first, so on
/// every core queue of the list scheduler the prioritised call's tiles come before the
/// other call's, whichever of the two is written first.
#[test]
fn a_call_priority_places_its_tiles_first() {
    for (pa, pb) in [(0, 5), (5, 0)] {
        let text = format!(
            "import std::moe::{{add}};\n\
             schedule t = interleaved {{ priority: fifo, candidates: false }};\n\
             taskflow t(x: f32[256, 64]) -> (a: f32[256, 64], b: f32[256, 64]) {{\n\
             let a = add(x, x) tile(m: 1) priority({pa});\n\
             let b = add(x, x) tile(m: 1) priority({pb});\n\
             return (a, b);\n}}\n"
        );
        let p = program(&text);
        let c = compile(&p, 0, Policy::Interleaved);
        let first = if pb > pa { 1 } else { 0 };
        let mut both = 0;
        for q in 0..c.schedule.queues.len() {
            let nodes: Vec<u32> = c
                .schedule
                .queues
                .row(q)
                .iter()
                .map(|&t| c.graph.node[t as usize])
                .collect();
            // Once the other call's tiles start on a core, the prioritised call's are done.
            let switch = nodes.iter().position(|&n| n != first).unwrap_or(nodes.len());
            assert!(
                nodes[switch..].iter().all(|&n| n != first),
                "priorities ({pa}, {pb}), queue {q}: {nodes:?}"
            );
            if switch > 0 && switch < nodes.len() {
                both += 1;
            }
        }
        assert!(both > 0, "some queue runs tiles of both calls");
    }
}

/// Lowering works the tiles out on the threads of the current pool: on one thread or on
/// several, the graph is the same, task for task, to the bit (costs, counters, producers,
/// the reverse tables), forward and backward, with ragged windows and a static one.
#[test]
fn the_graph_does_not_depend_on_the_threads() {
    let p = program(&moe(
        96,
        32,
        32,
        8,
        2,
        4,
        "zipf(experts: experts, topk: topk, s: 1.1, seed: 5)",
        (16, 32, 32, 16),
        true,
    ));
    for static_capacity in [false, true] {
        let layouts = lower::layouts(&p, static_capacity).unwrap();
        for tf in &p.taskflows {
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| lower::lower(&p, tf, layouts.clone(), &LowerOptions::default()).unwrap())
            };
            let one = on(1);
            assert!(one.edges() > 0);
            for threads in [2, 3, 5] {
                let g = on(threads);
                assert!(one.same_tasks(&g), "{} on {threads} threads", tf.name);
                assert_eq!(one.signals, g.signals);
                assert_eq!(one.waiters, g.waiters);
                assert!((0..g.len()).all(|t| one.preds(t) == g.preds(t)));
            }
        }
    }
}

/// Each `grad` names its derived ops with the first free suffix, past the names the root file
/// takes (a written op) and those earlier `grad`s took; two calls of one op in a forward share
/// one derived op.
#[test]
fn grads_name_derived_ops_with_the_first_free_suffix() {
    let text = "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
        op s<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = silu(x[m, n]); }\n\
        op s_vjp_x_2<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }\n\
        taskflow f(x: f32[64, 64]) -> f32[64, 64] { let y = s(x); return s(y); }\n\
        taskflow g1 = grad(f, wrt: [x]);\ntaskflow g2 = grad(f, wrt: [x]);\ntaskflow g3 = grad(f, wrt: [x]);\n";
    let p = program(text);
    let mut names: Vec<&str> = p
        .ops
        .iter()
        .map(|o| o.name.as_str())
        .filter(|n| n.starts_with("s_vjp"))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["s_vjp_x", "s_vjp_x_2", "s_vjp_x_3", "s_vjp_x_4"]);
}
