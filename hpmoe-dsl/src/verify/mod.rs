//! Verification: a lowered task graph (and a schedule) in; diagnostics out, empty when the
//! graph computes every output exactly once without races and the schedule cannot deadlock.
//!
//! The checks derive every task's regions themselves ([`Deriver`], in `derive.rs`: from the
//! call's analysed body — its variables, statements and index maps —, the task's tile
//! chunks and the routing layouts) and trust neither the lowering's dependencies nor its
//! regions: the derivation shares no code with `lower::regions`, so a wrong region there
//! shows up here as a race (a dependency the lowering missed). Only the index of writes
//! ([`WriterIndex`](crate::lower::regions::WriterIndex), a container of boxes that answers
//! overlap queries and derives nothing) and the [`Region`] value type are shared.
//!
//! - missing producer: every region read from a produced tensor is covered by writes;
//! - race: every writer of a region read is ordered before the reader (a direct edge, or a
//!   dependency path);
//! - write conflict: overlapping writes (other than `+=` accumulations) are ordered;
//! - cycle: the dependencies are acyclic;
//! - schedule: every task queued once on a core of its rank and engine; the schedule waits
//!   for every dependency; every counter's threshold equals the signals that reach it; and
//!   dependencies plus queue order can always make progress (no deadlock).
//!
//! Cost: linear in tasks and edges, plus the overlaps the regions have (n log n sorting).
//! Each task's regions are derived once: when every call reads only outputs of calls whose
//! tasks come before its own (always, for a lowered graph), one pass in task order checks a
//! task's reads against the writes indexed so far and then indexes its writes. The cycle
//! check is linear when task ids are already topological. Path searches only run for
//! writer/reader pairs without a direct edge, which a correct lowering never produces, and
//! are bounded.

use crate::diag::{Code, Diagnostic};
use crate::ir::{Program, Taskflow};
use crate::lower::regions::WriterIndex;
use crate::lower::{Region, TaskGraph, NO_COUNTER};
use crate::schedule::Schedule;
use std::collections::VecDeque;

mod derive;

pub use derive::{put_back_writes, Deriver};

/// At most this many diagnostics per kind (the first ones name the problem).
const MAX_PER_KIND: usize = 5;
/// Tasks visited by one path search before giving up (and reporting no ordering).
const MAX_SEARCH: usize = 1 << 20;

/// A description of a task for messages: `rank 3, `h` (gmm) tile m 128..256, n 0..256`.
pub fn describe(program: &Program, tf: &Taskflow, g: &TaskGraph, t: usize) -> String {
    let node = &tf.nodes[g.node[t] as usize];
    let nt = &g.nodes[g.node[t] as usize];
    let tile: Vec<String> = nt
        .dims
        .iter()
        .zip(g.chunks(t))
        .map(|(d, c)| match d.kind {
            crate::lower::DimKind::Send { .. } => format!("{} to expert {} [{}..{}]", d.name, c.group, c.lo, c.hi),
            _ => format!("{} {}..{}", d.name, c.lo, c.hi),
        })
        .collect();
    format!(
        "task {t} (rank {}, `{}` = {}, tile {})",
        g.rank[t],
        node.name,
        program.op(node.op).name,
        tile.join(", ")
    )
}

fn region_text(tf: &Taskflow, r: &Region) -> String {
    format!("`{}`{} on rank {}", tf.tensor(r.tensor).name, r.text(), r.rank)
}

/// Whether `from` reaches `to` along dependency edges (searching backwards from `to`).
fn reaches(g: &TaskGraph, from: u32, to: u32, seen: &mut [u32], stamp: u32) -> bool {
    let mut q = VecDeque::new();
    q.push_back(to);
    let mut visited = 0usize;
    while let Some(t) = q.pop_front() {
        for &p in g.preds(t as usize) {
            if p == from {
                return true;
            }
            if seen[p as usize] != stamp {
                seen[p as usize] = stamp;
                visited += 1;
                if visited > MAX_SEARCH {
                    return false;
                }
                q.push_back(p);
            }
        }
    }
    false
}

/// Verifies a task graph.
pub fn verify_graph(program: &Program, tf: &Taskflow, g: &TaskGraph) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let n = g.len();
    // Cycles first: the other checks search paths.
    if let Some(d) = find_cycle(program, tf, g) {
        out.push(d);
        return out;
    }
    let mut index = WriterIndex::new(tf, g.ranks as usize);
    // About one write per task, mostly on the task's rank; a put of received rows back to
    // their sources writes one row at a time, on the rank that sent it.
    for (ni, (node, nt)) in tf.nodes.iter().zip(&g.nodes).enumerate() {
        match put_back_writes(tf, g, ni) {
            Some(rows) => {
                for (r, &n) in rows.iter().enumerate().take(g.ranks as usize) {
                    index.reserve(node.output, r as u32, n);
                }
            }
            None => {
                for (r, rt) in nt.per_rank.iter().enumerate() {
                    index.reserve(node.output, r as u32, rt.count as usize);
                }
            }
        }
    }
    let mut derived = Deriver::default();
    let mut acc_tensor = vec![false; tf.tensors.len()];
    // A task writes only its call's output. When every call reads only outputs of earlier
    // calls (and its tasks come after theirs), all writers of a tensor are indexed before
    // its first reader: one pass over the tasks adds writes and checks reads. Otherwise the
    // writes are all indexed first.
    // Per call: the gate tensors it also reads (its routing is made from them).
    let gates: Vec<Vec<(crate::ir::TensorId, [u64; 2])>> =
        (0..tf.nodes.len()).map(|ni| program.gate_reads(tf, ni)).collect();
    let one_pass = reads_follow_writes(tf, g, &gates);
    if !one_pass {
        for t in 0..n {
            crate::cancel::check_every(t);
            derived.derive(tf, g, t);
            for w in &derived.writes {
                index.add(w, t as u32);
                if w.accumulate {
                    acc_tensor[w.tensor.0 as usize] = true;
                }
            }
        }
    }
    let (mut missing, mut races, mut conflicts) = (0usize, 0usize, 0usize);
    let mut seen = vec![u32::MAX; n];
    let mut stamp = 0u32;
    let mut writers: Vec<u32> = Vec::new();
    let mut regions: Vec<Region> = Vec::new();
    let mut buffers = Buffers::default();
    // A read of the same region by a task with the same producers (the same counter) has
    // the same writers and the same answer: check it once per call and rank.
    let mut checked: rustc_hash::FxHashSet<(Region, u32)> = Default::default();
    let mut checked_key = (u32::MAX, u32::MAX);
    let mut last_checked: Option<(Region, u32)> = None;
    for t in 0..n as u32 {
        crate::cancel::check_every(t as usize);
        if (g.node[t as usize], g.rank[t as usize]) != checked_key {
            checked.clear();
            last_checked = None;
            checked_key = (g.node[t as usize], g.rank[t as usize]);
        }
        derived.derive(tf, g, t as usize);
        for &(z, shape) in &gates[g.node[t as usize] as usize] {
            let whole = Region::whole(z, g.rank[t as usize], &shape);
            if !derived.reads.contains(&whole) {
                derived.reads.push(whole);
            }
        }
        for r in derived.reads.iter().filter(|r| tf.tensor(r.tensor).producer.is_some()) {
            // The last key checked is in the set: skip hashing it again.
            let key = (*r, g.wait[t as usize]);
            if last_checked == Some(key) {
                continue;
            }
            last_checked = Some(key);
            if !checked.insert(key) {
                continue;
            }
            let t = &t;
            writers.clear();
            regions.clear();
            let accumulated = acc_tensor[r.tensor.0 as usize];
            // Plain writes are disjoint (write conflicts are reported separately): the read is
            // covered when the parts of it they write add up to its volume. Only a shortfall,
            // or accumulated writes, need the writes themselves.
            let mut written: u64 = 0;
            index.records_over(r, &mut |w, bounds| {
                writers.push(w);
                if !accumulated {
                    written += clipped_volume(r, bounds);
                }
            });
            if accumulated || written < r.volume() {
                index.writes_over(r, &mut |_, reg| regions.push(reg));
            }
            writers.sort_unstable();
            writers.dedup();
            let gap = if accumulated || written < r.volume() {
                uncovered(r, &regions, accumulated, &mut buffers)
            } else {
                None
            };
            if let Some(gap) = gap {
                if missing < MAX_PER_KIND {
                    let node = &tf.nodes[g.node[*t as usize] as usize];
                    let producer = tf.tensor(r.tensor).producer.map(|p| tf.node(p));
                    let mut d = Diagnostic::error(
                        Code::MissingProducer,
                        format!(
                            "{} reads {}, but no task writes {gap}",
                            describe(program, tf, g, *t as usize),
                            region_text(tf, r)
                        ),
                    )
                    .primary(node.span, "this call reads it");
                    if let Some(p) = producer {
                        d = d.secondary(p.span, "this call should write it");
                    }
                    out.push(d);
                }
                missing += 1;
            }
            // Every writer ordered before the reader.
            for &w in &writers {
                if g.preds(*t as usize).binary_search(&w).is_ok() {
                    continue;
                }
                stamp = stamp.wrapping_add(1);
                if reaches(g, w, *t, &mut seen, stamp) {
                    continue;
                }
                if races < MAX_PER_KIND {
                    let rn = &tf.nodes[g.node[*t as usize] as usize];
                    let wn = &tf.nodes[g.node[w as usize] as usize];
                    out.push(
                        Diagnostic::error(
                            Code::Race,
                            format!(
                                "race: {} reads {} that {} writes, with no dependency between them",
                                describe(program, tf, g, *t as usize),
                                region_text(tf, r),
                                describe(program, tf, g, w as usize)
                            ),
                        )
                        .primary(rn.span, "the reader")
                        .secondary(wn.span, "the writer"),
                    );
                }
                races += 1;
            }
        }
        if one_pass {
            for w in &derived.writes {
                index.add(w, t);
                if w.accumulate {
                    acc_tensor[w.tensor.0 as usize] = true;
                }
            }
        }
    }
    // Write conflicts: overlapping writes of one tensor on one rank must be ordered.
    for (ti, _) in tf.tensors.iter().enumerate() {
        for rank in 0..g.ranks {
            index.overlapping_pairs(crate::ir::TensorId(ti as u32), rank, &mut |(ri, ti_), (_, tj)| {
                stamp = stamp.wrapping_add(1);
                let ordered = reaches(g, ti_, tj, &mut seen, stamp) || {
                    stamp = stamp.wrapping_add(1);
                    reaches(g, tj, ti_, &mut seen, stamp)
                };
                if ordered {
                    return;
                }
                if conflicts < MAX_PER_KIND {
                    let a = &tf.nodes[g.node[ti_ as usize] as usize];
                    let b = &tf.nodes[g.node[tj as usize] as usize];
                    out.push(
                        Diagnostic::error(
                            Code::WriteConflict,
                            format!(
                                "{} and {} both write {} with no ordering between them",
                                describe(program, tf, g, ti_ as usize),
                                describe(program, tf, g, tj as usize),
                                region_text(tf, &ri)
                            ),
                        )
                        .primary(b.span, "second writer")
                        .secondary(a.span, "first writer"),
                    );
                }
                conflicts += 1;
            });
        }
    }
    for (count, code, what) in [
        (missing, Code::MissingProducer, "missing producers"),
        (races, Code::Race, "races"),
        (conflicts, Code::WriteConflict, "write conflicts"),
    ] {
        if count > MAX_PER_KIND {
            out.push(Diagnostic::error(
                code,
                format!("... {} more {what} in `{}`", count - MAX_PER_KIND, tf.name),
            ));
        }
    }
    out
}

/// Whether the tasks of every call come after those of the calls whose outputs it reads
/// (then a task's reads only need the writes of earlier tasks).
fn reads_follow_writes(tf: &Taskflow, g: &TaskGraph, gates: &[Vec<(crate::ir::TensorId, [u64; 2])>]) -> bool {
    // Per tensor: the last task of the calls writing it (a task writes its call's output).
    let mut last_writer: Vec<Option<u32>> = vec![None; tf.tensors.len()];
    // Per call: its first task.
    let mut first: Vec<Option<u32>> = vec![None; tf.nodes.len()];
    for t in 0..g.len() {
        crate::cancel::check_every(t);
        let ni = g.node[t] as usize;
        let Some(node) = tf.nodes.get(ni) else { return false };
        let Some(lw) = last_writer.get_mut(node.output.0 as usize) else {
            return false;
        };
        *lw = Some(t as u32);
        first[ni].get_or_insert(t as u32);
    }
    tf.nodes.iter().enumerate().all(|(ni, node)| {
        let Some(f) = first[ni] else { return true };
        let gates = gates.get(ni).into_iter().flatten().map(|g| g.0);
        node.inputs
            .iter()
            .copied()
            .chain(gates)
            .all(|i| match last_writer.get(i.0 as usize) {
                Some(Some(w)) => *w < f,
                _ => true,
            })
    })
}

/// The volume of the part of `r` inside a write record's bounds (`lo, hi` per dimension of
/// the record; `r`'s own bounds past them).
fn clipped_volume(r: &Region, bounds: &[i64]) -> u64 {
    (0..r.ndim as usize)
        .map(|d| {
            let (lo, hi) = match (bounds.get(2 * d), bounds.get(2 * d + 1)) {
                (Some(&lo), Some(&hi)) => (lo, hi),
                _ => (r.lo[d], r.hi[d]),
            };
            (hi.min(r.hi[d]) - lo.max(r.lo[d])).max(0) as u64
        })
        .product()
}

/// Reused buffers of [`uncovered`].
#[derive(Default)]
struct Buffers {
    clipped: Vec<Region>,
    rows: Vec<(i64, i64)>,
}

/// The part of `r` that `writes` leave uncovered, described, or `None` when covered.
fn uncovered(r: &Region, writes: &[Region], accumulate: bool, buf: &mut Buffers) -> Option<String> {
    let nd = r.ndim as usize;
    let clip = |w: &Region| -> Region {
        let mut c = *w;
        for d in 0..nd {
            c.lo[d] = w.lo[d].max(r.lo[d]);
            c.hi[d] = w.hi[d].min(r.hi[d]);
        }
        c
    };
    let clipped = &mut buf.clipped;
    clipped.clear();
    clipped.extend(writes.iter().map(clip).filter(|c| !c.is_empty()));
    let want = r.volume();
    if !accumulate {
        // Plain writes are disjoint (write conflicts are reported separately).
        let got: u64 = clipped.iter().map(|c| c.volume()).sum();
        if got >= want {
            return None;
        }
    } else {
        // Accumulations may overlap: every row must be covered by writes spanning the rest.
        let full_rest = |c: &Region| (1..nd).all(|d| c.lo[d] <= r.lo[d] && c.hi[d] >= r.hi[d]);
        let rows = &mut buf.rows;
        rows.clear();
        rows.extend(clipped.iter().filter(|c| full_rest(c)).map(|c| (c.lo[0], c.hi[0])));
        rows.sort_unstable();
        let mut at = r.lo[0];
        for &(a, b) in rows.iter() {
            if a > at {
                break;
            }
            at = at.max(b);
        }
        if at >= r.hi[0] {
            return None;
        }
        return Some(format!("rows {}..", at));
    }
    // Name the first uncovered row.
    let mut rows: Vec<(i64, i64)> = clipped.iter().map(|c| (c.lo[0], c.hi[0])).collect();
    rows.sort_unstable();
    let mut at = r.lo[0];
    for (a, b) in rows {
        if a > at {
            return Some(format!("rows {at}..{a}"));
        }
        at = at.max(b);
    }
    if at < r.hi[0] {
        Some(format!("rows {at}..{}", r.hi[0]))
    } else {
        Some("part of it".into())
    }
}

/// Finds a dependency cycle and describes it.
fn find_cycle(program: &Program, tf: &Taskflow, g: &TaskGraph) -> Option<Diagnostic> {
    if crate::schedule::ids_are_topological(g) || crate::schedule::topo_order(g).is_some() {
        return None;
    }
    // Tasks Kahn could not order all lie on or behind a cycle; walk predecessors among them
    // until a task repeats.
    let n = g.len();
    let mut remaining: Vec<u32> = (0..g.counters.len()).map(|c| g.counters.row(c).len() as u32).collect();
    let mut done = vec![false; n];
    let mut q: VecDeque<u32> = (0..n as u32).filter(|&t| g.wait[t as usize] == NO_COUNTER).collect();
    while let Some(t) = q.pop_front() {
        done[t as usize] = true;
        for &c in g.signals.row(t as usize) {
            remaining[c as usize] -= 1;
            if remaining[c as usize] == 0 {
                q.extend(g.waiters.row(c as usize).iter().copied());
            }
        }
    }
    let start = (0..n).find(|&t| !done[t])?;
    let mut pos = vec![usize::MAX; n];
    let mut path: Vec<usize> = Vec::new();
    let mut t = start;
    loop {
        if pos[t] != usize::MAX {
            let cycle = &path[pos[t]..];
            let names: Vec<String> = cycle.iter().take(6).map(|&x| describe(program, tf, g, x)).collect();
            let mut d = Diagnostic::error(
                Code::Cycle,
                format!(
                    "dependency cycle of {} tasks: {}{}",
                    cycle.len(),
                    names.join(" -> "),
                    if cycle.len() > 6 { " -> ..." } else { "" }
                ),
            );
            let mut spans: Vec<crate::Span> = cycle.iter().map(|&x| tf.nodes[g.node[x] as usize].span).collect();
            spans.dedup();
            for (i, sp) in spans.into_iter().enumerate() {
                d = if i == 0 {
                    d.primary(sp, "on the cycle")
                } else {
                    d.secondary(sp, "on the cycle")
                };
            }
            return Some(d);
        }
        pos[t] = path.len();
        path.push(t);
        let next = g.preds(t).iter().copied().find(|&p| !done[p as usize])?;
        t = next as usize;
    }
}

/// Verifies a schedule of a verified task graph.
pub fn verify_schedule(program: &Program, tf: &Taskflow, g: &TaskGraph, s: &Schedule) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let n = g.len();
    // Queues.
    let mut seen = vec![0u8; n];
    let mut bad = 0;
    for c in 0..s.queues.len() {
        for &t in s.queues.row(c) {
            let tu = t as usize;
            if tu >= n {
                continue;
            }
            seen[tu] = seen[tu].saturating_add(1);
            let wrong = s.core_rank(c as u32) != g.rank[tu]
                || s.core_engine(c as u32) != g.engine(tf, tu)
                || s.core[tu] != c as u32;
            if wrong && bad < MAX_PER_KIND {
                out.push(
                    Diagnostic::error(
                        Code::BadQueue,
                        format!(
                            "{} is queued on {} of rank {}",
                            describe(program, tf, g, tu),
                            s.core_name(c as u32),
                            s.core_rank(c as u32)
                        ),
                    )
                    .primary(tf.nodes[g.node[tu] as usize].span, "this call's task"),
                );
                bad += 1;
            }
        }
    }
    for (t, &k) in seen.iter().enumerate() {
        if k != 1 && bad < MAX_PER_KIND {
            out.push(
                Diagnostic::error(
                    Code::BadQueue,
                    format!("{} is queued {k} times", describe(program, tf, g, t)),
                )
                .primary(tf.nodes[g.node[t] as usize].span, "this call's task"),
            );
            bad += 1;
        }
    }
    if bad > 0 {
        return out;
    }
    // Every dependency is waited for, and every producer signals its consumers' counter.
    for t in 0..n {
        crate::cancel::check_every(t);
        let c = g.wait[t];
        if c != NO_COUNTER && !s.waits.row(t).contains(&c) {
            out.push(
                Diagnostic::error(
                    Code::Race,
                    format!(
                        "{} does not wait for its producers (counter {c})",
                        describe(program, tf, g, t)
                    ),
                )
                .primary(tf.nodes[g.node[t] as usize].span, "this call's task"),
            );
            return out;
        }
    }
    for c in 0..g.counters.len() {
        for &p in g.counters.row(c) {
            if !s.signals(p as usize).any(|x| x == c as u32) {
                out.push(
                    Diagnostic::error(
                        Code::Race,
                        format!(
                            "{} never signals counter {c}, which its consumers wait on",
                            describe(program, tf, g, p as usize)
                        ),
                    )
                    .primary(tf.nodes[g.node[p as usize] as usize].span, "this call's task"),
                );
                return out;
            }
        }
    }
    // Thresholds equal the number of signals that can arrive. A task of a kernel whose
    // barrier is every rank's signals every rank's counter: those are counted per kernel
    // (thousands of ranks times millions of tasks otherwise).
    let groups = FanoutGroups::new(s);
    let mut arriving = vec![0u32; s.threshold.len()];
    let mut per_kernel = vec![0u32; s.fanout.len()];
    for t in 0..n {
        crate::cancel::check_every(t);
        for &c in s.signal_list.row(t) {
            if let Some(a) = arriving.get_mut(c as usize) {
                *a += 1;
            }
        }
        match groups.of_task(s, t) {
            Some(k) => per_kernel[k] += 1,
            None => {
                for c in s.fanout_of(t) {
                    if let Some(a) = arriving.get_mut(c as usize) {
                        *a += 1;
                    }
                }
            }
        }
    }
    for (k, &m) in per_kernel.iter().enumerate() {
        for c in groups.counters(k) {
            if let Some(a) = arriving.get_mut(c as usize) {
                *a += m;
            }
        }
    }
    let mut mism = 0;
    for (c, (&th, &got)) in s.threshold.iter().zip(&arriving).enumerate() {
        if th != got {
            if mism < MAX_PER_KIND {
                let waiter = (0..n).find(|&t| s.waits.row(t).contains(&(c as u32)));
                let mut d = Diagnostic::error(
                    Code::ThresholdMismatch,
                    format!(
                        "counter {c} on rank {} waits for {th} signal(s), but {got} task(s) signal it{}",
                        s.counter_rank.get(c).copied().unwrap_or(0),
                        if th > got {
                            ": its waiters would hang"
                        } else {
                            ": its waiters could start too early"
                        }
                    ),
                );
                if let Some(w) = waiter {
                    d = d.primary(
                        tf.nodes[g.node[w] as usize].span,
                        format!("{} waits on it", describe(program, tf, g, w)),
                    );
                }
                out.push(d);
            }
            mism += 1;
        }
    }
    if mism > 0 {
        return out;
    }
    // Progress: run the queues abstractly; a task starts when it heads its queue and its
    // counters reached their thresholds. A counter of an every-rank barrier has, besides its
    // own count, its kernel's count of tasks done (one signal to each of its counters); a
    // kernel's counters with parked tasks wait in a heap by the kernel count they need.
    let mut count = vec![0u32; s.threshold.len()];
    let mut kernel_done = vec![0u32; s.fanout.len()];
    let mut needs: Vec<std::collections::BinaryHeap<std::cmp::Reverse<(i64, u32)>>> =
        vec![Default::default(); s.fanout.len()];
    let mut head = vec![0usize; s.queues.len()];
    let mut blocked_on: Vec<Vec<u32>> = vec![Vec::new(); s.threshold.len()];
    let mut ready: Vec<u32> = Vec::new();
    let arrived =
        |c: usize, count: &[u32], kernel_done: &[u32]| count[c] + groups.kernel_of(c).map_or(0, |k| kernel_done[k]);
    let satisfied = |t: usize, count: &[u32], kernel_done: &[u32]| {
        s.waits
            .row(t)
            .iter()
            .all(|&c| arrived(c as usize, count, kernel_done) >= s.threshold[c as usize])
    };
    // The kernel count at which counter `c` of kernel `k` reaches its threshold.
    let need = |c: usize, count: &[u32]| i64::from(s.threshold[c]) - i64::from(count[c]);
    for c in 0..s.queues.len() {
        if let Some(&t) = s.queues.row(c).first() {
            ready.push(t);
        }
    }
    let mut done = 0usize;
    let mut pending: Vec<u32> = Vec::new();
    while let Some(t) = ready.pop() {
        let tu = t as usize;
        if !satisfied(tu, &count, &kernel_done) {
            // Park on its first unmet counter.
            if let Some(&c) = s
                .waits
                .row(tu)
                .iter()
                .find(|&&c| arrived(c as usize, &count, &kernel_done) < s.threshold[c as usize])
            {
                blocked_on[c as usize].push(t);
                if let Some(k) = groups.kernel_of(c as usize) {
                    needs[k].push(std::cmp::Reverse((need(c as usize, &count), c)));
                }
            }
            continue;
        }
        done += 1;
        let core = s.core[tu] as usize;
        head[core] += 1;
        if let Some(&next) = s.queues.row(core).get(head[core]) {
            ready.push(next);
        }
        let kernel = groups.of_task(s, tu);
        let listed = s.signal_list.row(tu).iter().copied();
        let fanned = if kernel.is_some() { 0..0 } else { s.fanout_of(tu) };
        for c in listed.chain(fanned) {
            let Some(k) = count.get_mut(c as usize) else { continue };
            *k += 1;
            if arrived(c as usize, &count, &kernel_done) >= s.threshold[c as usize] {
                pending.append(&mut blocked_on[c as usize]);
                ready.append(&mut pending);
            } else if let (Some(k), false) = (groups.kernel_of(c as usize), blocked_on[c as usize].is_empty()) {
                // Its need fell: listed again at the lower need.
                needs[k].push(std::cmp::Reverse((need(c as usize, &count), c)));
            }
        }
        if let Some(k) = kernel {
            kernel_done[k] += 1;
            let at = i64::from(kernel_done[k]);
            while let Some(&std::cmp::Reverse((want, c))) = needs[k].peek() {
                if want > at {
                    break;
                }
                needs[k].pop();
                let cu = c as usize;
                if blocked_on[cu].is_empty() {
                    continue;
                }
                if arrived(cu, &count, &kernel_done) >= s.threshold[cu] {
                    pending.append(&mut blocked_on[cu]);
                    ready.append(&mut pending);
                } else {
                    needs[k].push(std::cmp::Reverse((need(cu, &count), c)));
                }
            }
        }
    }
    if done < n {
        // Describe the wait: heads of queues that cannot start.
        let mut lines = Vec::new();
        let mut first_span = None;
        for c in 0..s.queues.len() {
            let Some(&t) = s.queues.row(c).get(head[c]) else {
                continue;
            };
            let tu = t as usize;
            let Some(&ctr) = s
                .waits
                .row(tu)
                .iter()
                .find(|&&x| count[x as usize] < s.threshold[x as usize])
            else {
                continue;
            };
            let missing: Vec<String> = (0..n)
                .filter(|&p| {
                    s.signals(p).any(|x| x == ctr)
                        && s.queues
                            .row(s.core[p] as usize)
                            .iter()
                            .position(|&x| x as usize == p)
                            .is_some_and(|i| i >= head[s.core[p] as usize])
                })
                .take(2)
                .map(|p| {
                    format!(
                        "{} (queued on {} of rank {})",
                        describe(program, tf, g, p),
                        s.core_name(s.core[p]),
                        s.core_rank(s.core[p])
                    )
                })
                .collect();
            lines.push(format!(
                "{} of rank {} waits at {} on counter {ctr} ({}/{} signals); still to signal: {}",
                s.core_name(c as u32),
                s.core_rank(c as u32),
                describe(program, tf, g, tu),
                count[ctr as usize],
                s.threshold[ctr as usize],
                missing.join(", ")
            ));
            first_span.get_or_insert(tf.nodes[g.node[tu] as usize].span);
            if lines.len() >= 4 {
                break;
            }
        }
        let mut d = Diagnostic::error(
            Code::Deadlock,
            format!("the schedule deadlocks after {done} of {n} tasks"),
        );
        if let Some(sp) = first_span {
            d = d.primary(sp, "a blocked task of this call");
        }
        for l in lines {
            d = d.note(l);
        }
        out.push(d);
    }
    out
}

/// The kernels whose barrier is every rank's ([`crate::schedule::Fanout::EveryRank`]): each of
/// their tasks signals every counter of the range, so such signals are counted per kernel.
/// A kernel whose range shares a counter with another's is left out (its tasks' signals are
/// counted one by one).
struct FanoutGroups {
    /// Per counter: the kernel whose range holds it (`NONE` for none; empty when no range is kept).
    kernel: Vec<u32>,
    /// Per kernel: its range, when counted per kernel.
    range: Vec<Option<std::ops::Range<u32>>>,
}

impl FanoutGroups {
    const NONE: u32 = u32::MAX;

    fn new(s: &Schedule) -> FanoutGroups {
        let ranges: Vec<Option<std::ops::Range<u32>>> = s
            .fanout
            .iter()
            .map(|f| match *f {
                Some(crate::schedule::Fanout::EveryRank { first, ranks }) => Some(first..first.saturating_add(ranks)),
                _ => None,
            })
            .collect();
        let (range, kernel) = crate::schedule::disjoint_ranges(&ranges, s.threshold.len());
        FanoutGroups { kernel, range }
    }

    /// The kernel task `t`'s every-rank signals are counted with (`None`: counted one by one).
    fn of_task(&self, s: &Schedule, t: usize) -> Option<usize> {
        let k = *s.kernel.get(t)? as usize;
        self.range.get(k)?.as_ref().map(|_| k)
    }

    /// The kernel whose count counter `c` adds.
    fn kernel_of(&self, c: usize) -> Option<usize> {
        self.kernel.get(c).filter(|&&k| k != Self::NONE).map(|&k| k as usize)
    }

    /// The counters of kernel `k`'s range (empty when not counted per kernel).
    fn counters(&self, k: usize) -> std::ops::Range<u32> {
        self.range.get(k).cloned().flatten().unwrap_or(0..0)
    }
}
