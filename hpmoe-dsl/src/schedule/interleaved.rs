//! The `interleaved` policy: a list scheduler over the tile tasks of every op call, and the
//! candidate schedules of the same task graph that the simulator's pipeline compares with it.
//!
//! List scheduling: tasks become ready when every producer is placed; the ready task with the
//! highest priority (user priority first, then the policy's key) is placed on a core of its
//! engine and rank: the earliest free one; with `wavefront`, the one whose estimated free
//! time is the latest not after the task is ready (best fit: a core that is free earlier
//! stays free for a task that is ready earlier), else the earliest free one. Each core's
//! queue then runs in order of estimated start. Keys (`Priority`):
//!
//! - `critical_path`: the longest estimated path to the end of the graph;
//! - `fifo`: topological position; `op_order`: call, then tile;
//! - `wavefront`: the tile's position within its call on its rank as a fraction (the k-th
//!   of n tiles at (k + 1/2)/n), then the call: the calls advance together, a consumer tile
//!   right behind its producer (so the producer's output is read back from L2, and an
//!   expert's tiles, consecutive within a call, run together while its weights are resident).
//!
//! Communication calls with `order(ratr)` take their tiles in rotated-destination order.
//!
//! Candidates ([`candidate`]): list schedules can lose to a static order (the estimate knows
//! neither contention nor L2), so with the `candidates` option the pipeline also simulates
//! the same graph in other orders and keeps the fastest. The scheduler itself cannot run the
//! simulator; it only builds the candidates.

use super::collective::ratr_key;
use super::ready::MinSet;
use super::{critical_path, is_comm, schedule, Schedule};
use crate::ir::{Engine, Program, Taskflow};
use crate::lower::{Csr, TaskGraph, NO_COUNTER};
use crate::policy::{Policy, PolicySpec, Priority};
use std::collections::BTreeSet;

/// The engine pools of the list scheduler.
pub(super) struct Pools {
    pub aic: u32,
    pub aiv_used: u32,
    pub cpr: u32,
}

/// Places every task (list scheduling, see the module doc) given a topological `order` and
/// the estimated duration of every task; fills `core` and `per_core`
/// (queues in estimated start order) and returns the estimated makespan.
pub(super) fn place(
    tf: &Taskflow,
    g: &TaskGraph,
    spec: &PolicySpec,
    (order, dur): (&[u32], &[f64]),
    pools_of: &Pools,
    core: &mut [u32],
    per_core: &mut [Vec<u32>],
) -> f64 {
    let n = g.len();
    let Pools { aic, aiv_used, cpr } = *pools_of;
    let cp = critical_path(g, order, dur);
    let mut topo_pos = vec![0u32; n];
    for (i, &t) in order.iter().enumerate() {
        topo_pos[t as usize] = i as u32;
    }
    let ratr_node: Vec<bool> = (0..tf.nodes.len())
        .map(|i| spec.ratr && is_comm(tf, i) && tf.nodes[i].order.iter().any(|o| o == "ratr"))
        .collect();
    // Per (call, rank): the largest critical path of its tiles (a ratr call's tiles share
    // it) and each tile's position within the call (rotated-destination order for ratr).
    let mut node_cp = vec![0.0f64; tf.nodes.len() * g.ranks as usize];
    let mut within = vec![(0u32, 1u32); n];
    for (ni, nt) in g.nodes.iter().enumerate() {
        for r in 0..g.ranks as usize {
            let (base, count) = (nt.base[r], nt.per_rank[r].count);
            let mut ts: Vec<u32> = (base..base + count).collect();
            if ratr_node[ni] {
                ts.sort_by_cached_key(|&t| (ratr_key(g, t as usize), t));
            }
            for (k, &t) in ts.iter().enumerate() {
                within[t as usize] = (k as u32, count.max(1));
                let e = &mut node_cp[ni * g.ranks as usize + r];
                *e = e.max(cp[t as usize]);
            }
        }
    }
    let keyed: Vec<(u64, u64, u32, u32)> = (0..n)
        .map(|t| {
            let node = g.node[t] as usize;
            let prio = tf.nodes[node].priority;
            let (main, step) = if ratr_node[node] {
                let (round, step) = ratr_key(g, t);
                (
                    node_cp[node * g.ranks as usize + g.rank[t] as usize],
                    (round as u64 * g.ranks as u64 + step as u64).min(u32::MAX as u64) as u32,
                )
            } else {
                (cp[t], 0)
            };
            let (k0, k1) = match spec.priority {
                Priority::CriticalPath => (u64::MAX - (main * 1e12) as u64, step),
                Priority::Fifo => (topo_pos[t] as u64, 0),
                Priority::OpOrder => (node as u64, 0),
                Priority::Wavefront => {
                    let (k, count) = within[t];
                    let frac = (2 * k as u64 + 1) as f64 / (2 * count as u64) as f64;
                    ((frac * (1u64 << 40) as f64) as u64, node as u32)
                }
            };
            // User priorities come first: higher runs earlier.
            let up = (i64::MAX as i128 - prio as i128) as u64;
            (up, k0, k1, topo_pos[t])
        })
        .collect();
    let mut idx: Vec<u32> = (0..n as u32).collect();
    idx.sort_by_key(|&t| {
        let k = keyed[t as usize];
        (k.1, k.2, k.3)
    });
    let mut rank_of = vec![0u32; n];
    for (i, &t) in idx.iter().enumerate() {
        rank_of[t as usize] = i as u32;
    }
    // A ready list by priority (user priority, then `rank_of`): each task's position in that
    // order, popped smallest first. The placement order is both by priority and topological.
    let by_pos: Vec<u32> = if keyed.iter().all(|k| k.0 == keyed[0].0) {
        idx
    } else {
        let mut by = idx;
        by.sort_by_key(|&t| keyed[t as usize].0);
        by
    };
    let mut pos_of = vec![0u32; n];
    for (i, &t) in by_pos.iter().enumerate() {
        pos_of[t as usize] = i as u32;
    }
    let mut remaining: Vec<u32> = (0..g.counters.len()).map(|c| g.counters.row(c).len() as u32).collect();
    let mut ready = MinSet::new(n);
    for t in 0..n {
        if g.wait[t] == NO_COUNTER {
            ready.insert(pos_of[t]);
        }
    }
    let mut ready_at = vec![0u64; n];
    let mut start = vec![0u64; n];
    // Per (rank, engine): the cores by (estimated free time in ps, core).
    let mut pools: Vec<BTreeSet<(u64, u32)>> = Vec::with_capacity(g.ranks as usize * 2);
    for r in 0..g.ranks {
        pools.push((0..aic).map(|c| (0u64, r * cpr + c)).collect());
        pools.push((0..aiv_used).map(|c| (0u64, r * cpr + aic + c)).collect());
    }
    let to_ps = |x: f64| (x * 1e12) as u64;
    let best_fit = spec.priority == Priority::Wavefront;
    let mut estimate = 0u64;
    while let Some(p) = ready.pop() {
        let t = by_pos[p as usize];
        let tu = t as usize;
        let e = tf.nodes[g.node[tu] as usize].engine;
        let pool = &mut pools[g.rank[tu] as usize * 2 + if e == Engine::Aic { 0 } else { 1 }];
        let at = ready_at[tu];
        let fit = if best_fit {
            pool.range(..=(at, u32::MAX)).next_back().copied()
        } else {
            None
        };
        let pick = fit.or_else(|| pool.first().copied());
        let Some((free, c)) = pick else { continue };
        pool.remove(&(free, c));
        let s = free.max(at);
        let end = s + to_ps(dur[tu]).max(1);
        start[tu] = s;
        estimate = estimate.max(end);
        pool.insert((end, c));
        core[tu] = c;
        per_core[c as usize].push(t);
        for &cn in g.signals.row(tu) {
            remaining[cn as usize] -= 1;
            let last = remaining[cn as usize] == 0;
            for &w in g.waiters.row(cn as usize) {
                let wu = w as usize;
                ready_at[wu] = ready_at[wu].max(end);
                if last {
                    ready.insert(pos_of[wu]);
                }
            }
        }
    }
    // Queues run in order of estimated start (ties by priority). A queue in this order is
    // deadlock-free: a task starts after every producer ended, so along any wait the
    // estimated start strictly increases.
    for q in per_core.iter_mut() {
        q.sort_by_key(|&t| (start[t as usize], rank_of[t as usize]));
    }
    estimate as f64 / 1e12
}

/// How many candidates [`candidate`] builds (besides the policy's own schedule).
pub const CANDIDATES: usize = 6;

/// Candidate `k` (`0..CANDIDATES`) of an `interleaved` policy on its own task graph, and its
/// name; `None` when it is the policy's own schedule. Every candidate carries the policy's
/// spec (so it runs and reports as `interleaved`) and is as valid as the policy's own: the
/// same graph, every queue in an order in which a task's producers come first.
///
/// 0, 1: the list schedule with priority `critical_path`, `wavefront` (unless it is the
/// policy's own priority); 2, 3: the expert-level order (tiles call by call, round-robin over
/// the cores; independent backward GMM calls alternated) over all and over half of the
/// vector cores; 4: the kernel-by-kernel order without its barriers; 5: the kernel-by-kernel
/// schedule with its barriers and launches.
pub fn candidate(
    program: &Program,
    tf: &Taskflow,
    g: &TaskGraph,
    spec: &PolicySpec,
    k: usize,
) -> Option<(Schedule, &'static str)> {
    if spec.policy != Policy::Interleaved {
        return None;
    }
    let mut other = spec.clone();
    other.candidates = false;
    let (mut s, name) = match k {
        0 | 1 => {
            let (p, name) = if k == 0 {
                (Priority::CriticalPath, "list (critical_path)")
            } else {
                (Priority::Wavefront, "list (wavefront)")
            };
            if spec.priority == p {
                return None;
            }
            other.priority = p;
            (schedule(program, tf, g, &other), name)
        }
        2 | 3 => {
            other.policy = Policy::ExpertLevel;
            other.interleave_backward = true;
            let aiv = program.device.aiv_cores().max(1);
            let all = if spec.aiv_workers > 0 {
                (spec.aiv_workers.min(aiv) as f64 / aiv as f64).max(1.0 / aiv as f64)
            } else {
                1.0
            };
            other.aiv_fraction = if k == 2 { all } else { all * 0.5 };
            let name = if k == 2 {
                "expert-level order"
            } else {
                "expert-level order (half the vector cores)"
            };
            (schedule(program, tf, g, &other), name)
        }
        4 | 5 => {
            other.policy = Policy::KernelByKernel;
            if k == 4 {
                // Without its barriers the order is no collective's: rank-aware order by
                // expert round, as under expert_level.
                other.alltoall = crate::policy::AllToAll::Unordered;
            }
            let mut s = schedule(program, tf, g, &other);
            if k == 4 {
                strip_barriers(g, &mut s);
                (s, "kernel-by-kernel order")
            } else {
                (s, "kernel by kernel (barriers)")
            }
        }
        _ => return None,
    };
    s.policy = spec.clone();
    s.origin = name;
    s.estimate = 0.0;
    Some((s, name))
}

/// Removes the kernel barriers (counters past the graph's) of a kernel-by-kernel schedule:
/// its queues stay, the graph's counters alone order the tasks.
fn strip_barriers(g: &TaskGraph, s: &mut Schedule) {
    let gc = g.counters.len() as u32;
    let n = g.len();
    let keep = |rows: &Csr| {
        let pairs: Vec<(u32, u32)> = (0..n)
            .flat_map(|t| rows.row(t).iter().filter(|&&c| c < gc).map(move |&c| (t as u32, c)))
            .collect();
        Csr::from_pairs(n, &pairs)
    };
    s.waits = keep(&s.waits);
    s.signal_list = keep(&s.signal_list);
    s.fanout.clear();
    s.threshold.truncate(gc as usize);
    s.counter_rank.truncate(gc as usize);
    s.barriers = 0;
    s.kernel = vec![u32::MAX; n];
}
