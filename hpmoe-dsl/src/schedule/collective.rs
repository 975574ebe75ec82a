//! The order of communication tasks: each task's destination rank, rank-aware order
//! (`order(ratr)`), and `kernel_by_kernel`'s communication calls run as a collective library
//! runs an AllToAllV.
//!
//! Rank-aware order: a sending task of rank `i` to rank `d` has step `(d - i) mod ranks`; a
//! call's tasks on a rank run by step, so rank `i` starts with its own rows, then rank `i+1`,
//! and at any moment the ranks write to different destinations instead of all to rank 0.
//! Except in the pairwise AllToAllV below they run by ([`ratr_key`]) local-expert round,
//! then step: the rotation is repeated once per local expert.
//! The destination of a task is that of its chunk: a put through `r.rank(t, j)` is chunked
//! per destination expert, a put back through `r.src_rank(m)` per local expert and, when
//! ordered, also where the rows' source rank changes (`lower::DestTiles`), so every task of
//! an ordered call has one destination.
//!
//! The pairwise AllToAllV (HCCL's `Pairwise` algorithm for AlltoAll/AlltoAllV, hicann/hccl
//! `docs/coll_algo_intro`): `ranks - 1` steps after the local copy (step 0); at step `k` rank
//! `i` sends to `i + k` and receives from `i - k`, so no port feeds many peers at once; its
//! cost is `(p - 1) alpha + beta * sum_k max_i n(i, i + k)`: each step waits for the
//! previous one. Here a step's tasks on rank `i` wait on one counter signalled by rank `i`'s
//! tasks of its last earlier non-empty step (its own sends are done) and by the tasks of
//! rank `i - (k - 1)` that sent to `i` at step `k - 1` (the rows it receives are in). A
//! remote signal arrives after the link latency, so each step costs at least one latency.

use super::Schedule;
use crate::ir::Taskflow;
use crate::lower::{DimKind, TaskGraph};
use crate::policy::{AllToAll, Policy, PolicySpec};

/// The destination rank of a communication task: for a put through `r.rank(t, j)` the rank
/// of its chunk's destination expert; for a put back through `r.src_rank(m)` whose chunks
/// end at source changes, the source rank of its rows. `None` for other tasks (and for a
/// put back whose chunks may span several source ranks).
pub fn send_dest(g: &TaskGraph, t: usize) -> Option<u32> {
    comm_place(g, t).0
}

/// A communication task's destination rank ([`send_dest`]) and the local expert its rows
/// belong to (at the destination for a put through `r.rank(t, j)`, at the sender for a put
/// back through `r.src_rank(m)`), from its chunk of the first send or receive dimension
/// (the destination of a put back from the first one split by source).
fn comm_place(g: &TaskGraph, t: usize) -> (Option<u32>, Option<u32>) {
    let Some(nt) = g.node.get(t).map(|&n| &g.nodes[n as usize]) else {
        return (None, None);
    };
    let chunks = g.chunks(t);
    let rank = g.rank[t] as usize;
    let mut round = None;
    for (d, dim) in nt.dims.iter().enumerate() {
        let (route, send) = match &dim.kind {
            DimKind::Send { route, .. } => (route, true),
            DimKind::Recv(route) => (route, false),
            _ => continue,
        };
        let (Some(l), Some(c)) = (g.layouts.get(route.0 as usize).and_then(Option::as_ref), chunks.get(d)) else {
            return (None, round);
        };
        if send {
            let e = c.group as usize;
            let local = (e % l.local_experts().max(1)) as u32;
            return (Some(l.rank_of_expert(e) as u32), round.or(Some(local)));
        }
        let Ok(row) = u32::try_from(c.lo) else {
            return (None, round);
        };
        round = round.or(Some(l.group_of_row(rank, row) as u32));
        if dim.by_source {
            return (l.source_of_row(rank, row), round);
        }
    }
    (None, round)
}

/// The rank-aware step of a communication task: `(dest - src) mod ranks` (0 for others).
pub fn ratr_step(g: &TaskGraph, t: usize) -> u32 {
    step_to(g, t, send_dest(g, t))
}

fn step_to(g: &TaskGraph, t: usize, dest: Option<u32>) -> u32 {
    match dest {
        Some(d) => (d + g.ranks - g.rank[t] % g.ranks) % g.ranks,
        None => 0,
    }
}

/// The position of a communication task in rank-aware order: (round, step). The round is
/// the local expert its rows belong to (at the destination for a put through `r.rank(t, j)`,
/// at the sender for a put back through `r.src_rank(m)`); the step is [`ratr_step`]. A rank
/// sends local expert 0's rows to every destination in rotated order, then local expert
/// 1's, and so on: every rank receives the rows of its first expert from every source early
/// (the expert's products can start) and sends back each expert's outputs as soon as they
/// are made, while at any moment the ranks still write to different destinations.
pub fn ratr_key(g: &TaskGraph, t: usize) -> (u32, u32) {
    let (dest, round) = comm_place(g, t);
    (round.unwrap_or(0), step_to(g, t, dest))
}

/// Whether a call's tasks on a rank run by rank-aware step under `expert_level` and
/// `kernel_by_kernel`: a communication call annotated `order(ratr)` when the policy's `ratr`
/// is on, and under `kernel_by_kernel` with the pairwise AllToAll every communication call.
pub fn by_step(spec: &PolicySpec, tf: &Taskflow, node: usize) -> bool {
    if !super::is_comm(tf, node) {
        return false;
    }
    if pairwise(spec) {
        return true;
    }
    spec.ratr && tf.nodes[node].order.iter().any(|o| o == "ratr")
}

/// Whether the policy runs communication calls as a pairwise AllToAllV.
pub fn pairwise(spec: &PolicySpec) -> bool {
    spec.policy == Policy::KernelByKernel && spec.alltoall == AllToAll::Pairwise
}

/// The step counters of the pairwise AllToAllV of every communication call (see the module
/// doc), numbered from `first`: per (call, rank, step > 0) with something to wait for, the
/// tasks of the step wait on it (pushed to `waits`) and the tasks it waits for signal it
/// (pushed to `signals`); the rank holding each goes to `counter_rank`. Returns how many
/// were made.
pub(super) fn pairwise_steps(
    tf: &Taskflow,
    g: &TaskGraph,
    first: u32,
    waits: &mut Vec<(u32, u32)>,
    signals: &mut Vec<(u32, u32)>,
    counter_rank: &mut Vec<u32>,
) -> u32 {
    let p = g.ranks as usize;
    let mut made = 0u32;
    for (ni, nt) in g.nodes.iter().enumerate() {
        if !super::is_comm(tf, ni) {
            continue;
        }
        // by_step[rank][step]: the call's tasks of that rank sending at that step.
        let mut by: Vec<Vec<Vec<u32>>> = vec![vec![Vec::new(); p]; p];
        for r in 0..p {
            let base = nt.base[r];
            for t in base..base + nt.per_rank[r].count {
                let k = ratr_step(g, t as usize) as usize;
                by[r][k].push(t);
            }
        }
        for i in 0..p {
            let mut own_last: Option<usize> = None;
            for k in 0..p {
                if k > 0 {
                    let from = (i + p - (k - 1)) % p;
                    let mut sig: Vec<u32> = own_last.map(|s| by[i][s].clone()).unwrap_or_default();
                    if from != i || own_last != Some(k - 1) {
                        sig.extend_from_slice(&by[from][k - 1]);
                    }
                    if !by[i][k].is_empty() && !sig.is_empty() {
                        let c = first + made;
                        made += 1;
                        counter_rank.push(i as u32);
                        for &t in &by[i][k] {
                            waits.push((t, c));
                        }
                        for &t in &sig {
                            signals.push((t, c));
                        }
                    }
                }
                if !by[i][k].is_empty() {
                    own_last = Some(k);
                }
            }
        }
    }
    made
}

/// The step counters of a schedule: ids `graph counters..` up to the kernel barriers.
pub fn step_counters(g: &TaskGraph, s: &Schedule) -> std::ops::Range<usize> {
    let gc = g.counters.len();
    gc..s.threshold.len().saturating_sub(s.barriers as usize).max(gc)
}
