//! Communication order: `order(ratr)` on every sending call (a put to `r.rank(t, j)` and a put
//! back to `r.src_rank(m)`) under `expert_level` and `kernel_by_kernel`, and the steps of
//! `kernel_by_kernel`'s pairwise AllToAll.
//!
//! The program: 4 ranks of 256 tokens, 16 experts (4 per rank), top-4, balanced routing. Token
//! g (counted over all ranks, g = 256 * rank + t) picks experts 4g .. 4g + 3 (mod 16), i.e. the
//! 4 experts of rank g mod 4. So every rank sends 64 tokens x 4 choices to every rank: 64 rows
//! per destination expert, 2 dispatch tiles of 32 each, 8 tiles per (source, destination) pair;
//! and every (expert, source) segment of a receive window has 64 rows, 2 combine tiles of 32,
//! again 8 tiles per pair. These counts are worked out here by hand from the routing's
//! definition in `stdlib/route.hpm`.

use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Value;
use hpmoe_dsl::lower::{DimKind, TaskGraph};
use hpmoe_dsl::schedule::{self, collective, Policy, PolicySpec, Schedule};
use hpmoe_dsl::SourceMap;
use std::collections::BTreeMap;

const RANKS: u32 = 4;
const DISPATCH: usize = 0;
const COMBINE: usize = 4;

fn program(order: &str) -> Checked {
    let text = format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = 256;\nparam hidden = 64;\nparam inter = 64;\nparam experts = 16;\n\
         param topk = 4;\nparam local = experts / 4;\n\
         device = ascend_a3 {{ ranks: 4 }};\nroute r = balanced(experts: experts, topk: topk);\n\
         taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
         let xd = dispatch(x, r) tile(t: 32) {order};\n\
         let h = gmm(xd, w_up) tile(m: 32, n: 64, k: 16);\n\
         let a = swiglu(h) tile(m: 16);\n\
         let y = gmm(a, w_down) tile(m: 32, n: 64, k: 16);\n\
         return combine(y, r) tile(m: 32) {order};\n}}\n"
    );
    let mut sm = SourceMap::new();
    let out = check_text("order.hpm", &text, None, &Options::default(), &mut sm);
    match out.checked {
        Some(p) => p,
        None => panic!(
            "{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        ),
    }
}

fn spec(p: &Checked, policy: Policy, options: &[(&str, Value)]) -> PolicySpec {
    let o: BTreeMap<String, Value> = options.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    PolicySpec::with_options(p, policy, &o).expect("valid options")
}

fn compile(p: &Checked, s: &PolicySpec) -> Compiled {
    match p.compile(&p.taskflows[0], s, &CompileOptions::default()) {
        Ok(c) => c,
        Err(ds) => panic!("{:#?}", ds.iter().map(|d| d.message.clone()).collect::<Vec<_>>()),
    }
}

/// The destination of a task, read from its tile and the layout directly: the rank of the
/// destination expert of a dispatch chunk, the source rank of the first row of a combine
/// chunk (whether or not the chunk was split by source).
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

/// A call's tasks on one rank in the order the static schedule issues them (queue position,
/// then core).
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

/// The destinations of a call's tasks on every rank, in issue order.
fn dests(c: &Compiled, node: usize) -> Vec<Vec<u32>> {
    (0..RANKS)
        .map(|r| {
            issue_order(&c.graph, &c.schedule, node, r)
                .iter()
                .map(|&t| dest(&c.graph, t as usize))
                .collect()
        })
        .collect()
}

/// Rank i issues n tiles to rank i, then n to i+1, ... (the rotated order, by hand).
fn rotated(rank: u32, n: usize) -> Vec<u32> {
    (0..RANKS)
        .flat_map(|k| std::iter::repeat_n((rank + k) % RANKS, n))
        .collect()
}

/// Every rank issues n tiles to rank 0, then n to rank 1, ... (the lowering's order of a
/// dispatch: by destination expert).
fn unrotated(n: usize) -> Vec<u32> {
    (0..RANKS).flat_map(|d| std::iter::repeat_n(d, n)).collect()
}

/// The lowering's order of a combine: by local expert (4), inside an expert by source rank,
/// n tiles per (expert, source) segment; so every rank walks ranks 0, 1, 2, 3 four times.
fn unrotated_combine(n: usize) -> Vec<u32> {
    (0..4)
        .flat_map(|_| (0..RANKS).flat_map(move |d| std::iter::repeat_n(d, n)))
        .collect()
}

fn unrotated_of(node: usize, n: usize) -> Vec<u32> {
    if node == COMBINE {
        unrotated_combine(n / 4)
    } else {
        unrotated(n)
    }
}

#[test]
fn ratr_on_combine_orders_its_tiles_by_rotated_destination() {
    let p = program("order(ratr)");
    // kernel_by_kernel with the unordered collective: the taskflow's tiles of 32 rows, 8 per
    // (source, destination) pair for both calls.
    let unordered = ("alltoall", Value::Name("unordered".into()));
    let on = compile(&p, &spec(&p, Policy::KernelByKernel, std::slice::from_ref(&unordered)));
    let off = compile(
        &p,
        &spec(
            &p,
            Policy::KernelByKernel,
            &[unordered.clone(), ("ratr", Value::Bool(false))],
        ),
    );
    // With ratr, the rotation runs once per local expert (4), 2 tiles per (expert, pair).
    for node in [DISPATCH, COMBINE] {
        let (d_on, d_off) = (dests(&on, node), dests(&off, node));
        for r in 0..RANKS {
            let by_expert: Vec<u32> = (0..4).flat_map(|_| rotated(r, 2)).collect();
            assert_eq!(d_on[r as usize], by_expert, "call {node} rank {r} with ratr");
            assert_eq!(
                d_off[r as usize],
                unrotated_of(node, 8),
                "call {node} rank {r} without ratr"
            );
        }
    }
    // expert_level (exact capacity) retiles communication to 128 rows: one dispatch tile per
    // destination expert (64 rows), 4 per pair; a combine tile split by source is one
    // (expert, source) segment, 4 per pair; unsplit, an expert's 256 rows make 2 tiles that
    // start at sources 0 and 2.
    let exact = ("static_capacity", Value::Bool(false));
    let on = compile(&p, &spec(&p, Policy::ExpertLevel, std::slice::from_ref(&exact)));
    let off = compile(
        &p,
        &spec(&p, Policy::ExpertLevel, &[exact.clone(), ("ratr", Value::Bool(false))]),
    );
    // With ratr, expert_level sends expert by expert (local expert 0's rows to every rank in
    // rotated order, then local expert 1's, ...): 4 rounds of one tile per destination.
    let (dis_off, com_off) = (dests(&off, DISPATCH), dests(&off, COMBINE));
    for r in 0..RANKS {
        let by_expert: Vec<u32> = (0..4).flat_map(|_| rotated(r, 1)).collect();
        assert_eq!(dests(&on, DISPATCH)[r as usize], by_expert, "dispatch rank {r}");
        assert_eq!(dests(&on, COMBINE)[r as usize], by_expert, "combine rank {r}");
        assert_eq!(dis_off[r as usize], unrotated(4));
        assert_eq!(com_off[r as usize], [0, 2, 0, 2, 0, 2, 0, 2]);
    }
}

#[test]
fn without_the_hint_nothing_is_reordered() {
    let p = program("");
    let c = compile(
        &p,
        &spec(
            &p,
            Policy::KernelByKernel,
            &[("alltoall", Value::Name("unordered".into()))],
        ),
    );
    for node in [DISPATCH, COMBINE] {
        for (r, d) in dests(&c, node).iter().enumerate() {
            assert_eq!(*d, unrotated_of(node, 8), "call {node} rank {r}");
        }
    }
}

#[test]
fn combine_tiles_split_where_the_source_changes_only_when_ordered() {
    // Every (expert, source) segment holds 64 rows: 2 tiles of 32 either way, so split or
    // not, 4 experts x 4 sources x 2 = 32 combine tiles per rank; with tiles of 48 rows an
    // expert's 256 rows make ceil(256 / 48) = 6 tiles unsplit, and 4 x ceil(64 / 48) = 8 split.
    let text48 = |order: &str| {
        let p = program(order);
        let mut tf = p.taskflows[0].clone();
        tf.nodes[COMBINE].tile = vec![("m".into(), 48)];
        (p, tf)
    };
    for (order, ratr, want) in [
        ("order(ratr)", true, 8 * 4),
        ("order(ratr)", false, 6 * 4),
        ("", true, 6 * 4),
    ] {
        let (p, tf) = text48(order);
        let s = spec(
            &p,
            Policy::KernelByKernel,
            &[
                ("alltoall", Value::Name("unordered".into())),
                ("ratr", Value::Bool(ratr)),
            ],
        );
        let c = p.compile(&tf, &s, &CompileOptions::default()).expect("compiles");
        for r in 0..RANKS as usize {
            assert_eq!(
                c.graph.nodes[COMBINE].per_rank[r].count, want,
                "{order} ratr={ratr} rank {r}"
            );
        }
    }
}

#[test]
fn pairwise_alltoall_runs_steps_in_order() {
    let p = program("");
    let s = spec(&p, Policy::KernelByKernel, &[]);
    assert_eq!(s.alltoall, schedule::AllToAll::Pairwise, "the default baseline");
    let c = compile(&p, &s);
    let (g, sc) = (&c.graph, &c.schedule);
    // Without the hint, the collective still runs by step: rank i starts with itself.
    for node in [DISPATCH, COMBINE] {
        for (r, d) in dests(&c, node).iter().enumerate() {
            assert_eq!(*d, rotated(r as u32, 8), "call {node} rank {r}");
        }
    }
    let steps = collective::step_counters(g, sc);
    // One counter per (call, rank, step 1..3): 2 x 4 x 3.
    assert_eq!(steps.len(), 2 * 4 * 3);
    let mut waiters: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut signallers: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for t in 0..g.len() {
        for &cn in sc.waits.row(t) {
            if steps.contains(&(cn as usize)) {
                waiters.entry(cn as usize).or_default().push(t as u32);
            }
        }
        for cn in sc.signals(t) {
            if steps.contains(&(cn as usize)) {
                signallers.entry(cn as usize).or_default().push(t as u32);
            }
        }
    }
    let step_of = |t: u32| (dest(g, t as usize) + RANKS - g.rank[t as usize]) % RANKS;
    let mut seen = std::collections::BTreeSet::new();
    for cn in steps.clone() {
        let w = &waiters[&cn];
        let i = g.rank[w[0] as usize];
        let k = step_of(w[0]);
        assert!(k >= 1);
        // The counter's waiters: all 8 tiles of rank i's step k of one call.
        assert_eq!(w.len(), 8);
        assert!(w.iter().all(|&t| g.rank[t as usize] == i && step_of(t) == k));
        let node = g.node[w[0] as usize];
        assert!(w.iter().all(|&t| g.node[t as usize] == node));
        assert!(seen.insert((node, i, k)), "one counter per (call, rank, step)");
        // Its signallers: rank i's own step k-1 and what rank i-(k-1) sent to i at step k-1.
        let from = (i + RANKS - (k - 1)) % RANKS;
        let sig = &signallers[&cn];
        assert!(sig.iter().all(|&t| g.node[t as usize] == node));
        let own = sig
            .iter()
            .filter(|&&t| g.rank[t as usize] == i && step_of(t) == k - 1)
            .count();
        let recv = sig
            .iter()
            .filter(|&&t| g.rank[t as usize] == from && dest(g, t as usize) == i)
            .count();
        assert_eq!(own, 8, "rank {i} step {k}: own previous step");
        assert_eq!(recv, 8, "rank {i} step {k}: what it receives at step {}", k - 1);
        // Step 1's previous exchange is the local copy: the same 8 tiles.
        let want = if k == 1 { 8 } else { 16 };
        assert_eq!(sig.len(), want);
        assert_eq!(sc.threshold[cn], want as u32);
        assert_eq!(sc.counter_rank[cn], i);
    }
    // The unordered collective has no steps.
    let u = compile(
        &p,
        &spec(
            &p,
            Policy::KernelByKernel,
            &[("alltoall", Value::Name("unordered".into()))],
        ),
    );
    assert!(collective::step_counters(&u.graph, &u.schedule).is_empty());
}

#[test]
fn step_counters_are_named_in_the_schedule_json() {
    let p = program("");
    let c = compile(&p, &spec(&p, Policy::KernelByKernel, &[]));
    let j = schedule::schedule_json(&c.graph, &c.schedule);
    let kinds: Vec<&str> = j["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.iter().filter(|&&k| k == "step").count(), 24);
    let n = kinds.len();
    // Dependencies first, then steps, then kernel barriers (4 calls after the first, x 4 ranks).
    assert!(kinds[n - 16..].iter().all(|&k| k == "barrier"));
    assert!(kinds[n - 40..n - 16].iter().all(|&k| k == "step"));
}

/// Kernel barriers: the barrier of call k on rank r is waited on by call k's tasks on r and
/// signalled by call k-1's tasks on every rank when either call communicates (dispatch and
/// the first GMM, the second GMM and combine), else by those on r alone; its threshold is
/// that count. The signals of a barrier over every rank are not listed task by task: the
/// schedule holds no more than the same queues without barriers, plus a word per barrier.
#[test]
fn kernel_barriers_wait_for_the_previous_call() {
    let p = program("");
    let c = compile(&p, &spec(&p, Policy::KernelByKernel, &[]));
    let (g, sc) = (&c.graph, &c.schedule);
    let calls = g.nodes.len();
    assert_eq!(sc.barriers as usize, (calls - 1) * RANKS as usize);
    let first = sc.threshold.len() - sc.barriers as usize;
    let communicates = |k: usize| k == DISPATCH || k == COMBINE;
    let by = sc.signallers();
    for k in 1..calls {
        for r in 0..RANKS {
            let b = first + (k - 1) * RANKS as usize + r as usize;
            assert_eq!(sc.counter_rank[b], r);
            let every = communicates(k) || communicates(k - 1);
            let want: Vec<u32> = (0..g.len() as u32)
                .filter(|&t| g.node[t as usize] as usize == k - 1 && (every || g.rank[t as usize] == r))
                .collect();
            assert!(!want.is_empty());
            assert_eq!(by.row(b), &want[..], "barrier of call {k} on rank {r}");
            assert_eq!(sc.threshold[b] as usize, want.len());
            let waiters: Vec<u32> = (0..g.len() as u32)
                .filter(|&t| sc.waits.row(t as usize).contains(&(b as u32)))
                .collect();
            let want: Vec<u32> = (0..g.len() as u32)
                .filter(|&t| g.node[t as usize] as usize == k && g.rank[t as usize] == r)
                .collect();
            assert_eq!(waiters, want, "waiters of call {k}'s barrier on rank {r}");
        }
    }
    // The index that does not write the fanouts out names the same tasks, for every counter
    // (under this policy and under one without barriers).
    let index = sc.signaller_index();
    for k in 0..sc.threshold.len() {
        assert_eq!(index.row(sc, k).collect::<Vec<_>>(), by.row(k), "counter {k}");
    }
    let e = compile(&p, &spec(&p, Policy::ExpertLevel, &[]));
    let (ei, eb) = (e.schedule.signaller_index(), e.schedule.signallers());
    for k in 0..e.schedule.threshold.len() {
        assert_eq!(ei.row(&e.schedule, k).collect::<Vec<_>>(), eb.row(k), "counter {k}");
    }
    // Listed signals: the graph's dependencies and the AllToAll's steps only.
    let listed = sc.signal_list.idx.len();
    let steps: usize = collective::step_counters(g, sc).map(|c| sc.threshold[c] as usize).sum();
    assert_eq!(listed, g.counters.idx.len() + steps);
    assert!(hpmoe_dsl::verify::verify_schedule(p.program(), &p.taskflows[0], g, sc).is_empty());
}
