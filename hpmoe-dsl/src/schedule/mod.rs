//! Static schedules: a task graph and a policy in; every task's core and its place in the
//! core's queue, and the counters (with derived thresholds) that enforce the dependencies,
//! out. Nothing is written by hand: a counter's threshold is the number of tasks that signal
//! it.
//!
//! Policies: `kernel_by_kernel` (the baseline: one kernel per op call over all cores of its
//! engine, a barrier at the end of each kernel, dispatch and combine as collectives with a
//! cross-rank barrier), `expert_level` (the reference runtime: static queues filled
//! round-robin, per-expert pipelining from the dependencies, half the vector cores),
//! `interleaved` (tile-level list scheduling by priority, all vector cores; see
//! `interleaved.rs`, which also builds the candidate schedules the simulator compares with
//! it). Transforms: `ratr` (rank-aware reordering of communication:
//! each source rank starts at a different destination; under `expert_level` and
//! `interleaved` round by round of local experts, `collective::ratr_key`) and the interleaving of independent
//! backward GMM branches on the cube queues.

pub mod collective;
pub mod cost;
mod export;
mod interleaved;
mod ready;

pub use interleaved::{candidate, CANDIDATES};

use collective::ratr_step;
pub use collective::send_dest;

pub use export::{schedule_json, summary_text, tasks_json, write_schedule_json, write_tasks_json};

use crate::ir::{Engine, Program, Taskflow};
use crate::lower::{Csr, TaskGraph, NO_COUNTER};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub use crate::policy::{AllToAll, Policy, PolicySpec, Priority};

/// A static schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub policy: PolicySpec,
    pub aic_cores: u32,
    pub aiv_cores: u32,
    /// Per task: its core, numbered `rank * (aic + aiv) + local` with the cube cores first.
    pub core: Vec<u32>,
    /// Per core: its tasks in execution order.
    pub queues: Csr,
    /// Counters: those of the task graph, then the step counters of `kernel_by_kernel`'s
    /// pairwise AllToAll ([`collective::step_counters`]), then the kernel barriers of
    /// `kernel_by_kernel`. Per task, the counters it waits on, and those it signals besides
    /// its kernel's barriers (all of them: [`Schedule::signals`]).
    pub waits: Csr,
    pub signal_list: Csr,
    /// Per kernel (indexed by [`Schedule::kernel`]): the kernel barriers each of its tasks
    /// signals, the next kernel's. A barrier that waits for every rank would take a list
    /// entry per task and rank; described here, it takes none.
    pub fanout: Vec<Option<Fanout>>,
    /// Per counter: the number of signals it waits for (derived from `signals`).
    pub threshold: Vec<u32>,
    /// Per counter: the rank holding it.
    pub counter_rank: Vec<u32>,
    /// Per task: the kernel it belongs to (`kernel_by_kernel`: its op call, for launch
    /// overheads), or `u32::MAX`.
    pub kernel: Vec<u32>,
    /// Counters that are kernel barriers (the last ones).
    pub barriers: u32,
    /// The estimate the list scheduler reached (seconds; 0 for static policies).
    pub estimate: f64,
    /// How the queues were built: `"policy"` for the policy's own scheduler, else the name of
    /// the `interleaved` candidate chosen (see [`candidate`]).
    pub origin: &'static str,
}

/// The kernel barriers every task of one kernel signals: `first + r` is the next kernel's
/// barrier on rank `r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fanout {
    /// The barrier of the task's own rank.
    OwnRank { first: u32 },
    /// The barriers of every rank, `first..first + ranks` (the next kernel, or this one, is
    /// a collective).
    EveryRank { first: u32, ranks: u32 },
}

/// Of these ranges of counters (`None`: no range), the ones that share no counter with
/// another (the others become `None`), and per counter the index of the range that holds it
/// (`u32::MAX` for none; an empty list when no range is left). Ranges past `counters` or
/// empty are dropped. The schedule check and the simulator count an every-rank barrier's
/// signals per range ([`Fanout::EveryRank`]) only where no other range shares its counters.
pub fn disjoint_ranges(
    ranges: &[Option<std::ops::Range<u32>>],
    counters: usize,
) -> (Vec<Option<std::ops::Range<u32>>>, Vec<u32>) {
    const NONE: u32 = u32::MAX;
    let mut kept: Vec<Option<std::ops::Range<u32>>> = vec![None; ranges.len()];
    let mut owner: Vec<u32> = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        let Some(r) = r else { continue };
        let (lo, hi) = (r.start as usize, r.end as usize);
        if hi > counters || lo >= hi {
            continue;
        }
        if owner.is_empty() {
            owner = vec![NONE; counters];
        }
        if owner[lo..hi].iter().all(|&x| x == NONE) {
            owner[lo..hi].fill(i as u32);
            kept[i] = Some(r.clone());
        } else {
            // Shared with another range: neither is kept.
            for &x in &owner[lo..hi] {
                if x != NONE {
                    kept[x as usize] = None;
                }
            }
        }
    }
    // Only the ranges kept name their counters.
    owner.fill(NONE);
    for (i, r) in kept.iter().enumerate() {
        if let Some(r) = r {
            owner[r.start as usize..r.end as usize].fill(i as u32);
        }
    }
    if kept.iter().all(Option::is_none) {
        owner = Vec::new();
    }
    (kept, owner)
}

/// The tasks that signal each counter of a schedule ([`Schedule::signaller_index`]).
#[derive(Clone, Debug, Default)]
pub struct SignallerIndex {
    /// Per counter: the tasks whose list names it.
    listed: Csr,
    /// Per kernel with a fanout: its tasks.
    by_kernel: Csr,
}

impl SignallerIndex {
    /// The tasks that signal counter `c` (those listing it, then those of the kernel whose
    /// barriers it is among), in task order within each part.
    pub fn row<'a>(&'a self, s: &'a Schedule, c: usize) -> impl Iterator<Item = u32> + 'a {
        let listed = if c + 1 < self.listed.off.len() {
            self.listed.row(c)
        } else {
            &[]
        };
        // The kernel whose fanout holds `c`, and the rank a barrier per rank belongs to.
        let fan = s.fanout.iter().enumerate().find_map(|(k, f)| {
            let (first, end, rank) = match (*f)? {
                Fanout::OwnRank { first } => {
                    let ranks = s.queues.len() as u32 / s.cores_per_rank().max(1);
                    (
                        first,
                        first.saturating_add(ranks),
                        Some(s.counter_rank.get(c).copied().unwrap_or(u32::MAX)),
                    )
                }
                Fanout::EveryRank { first, ranks } => (first, first.saturating_add(ranks), None),
            };
            ((first as usize..end as usize).contains(&c)).then_some((k, rank))
        });
        let kernel_tasks = match fan {
            Some((k, _)) if k + 1 < self.by_kernel.off.len() => self.by_kernel.row(k),
            _ => &[],
        };
        let own = fan.and_then(|(_, r)| r);
        listed.iter().copied().chain(
            kernel_tasks
                .iter()
                .copied()
                .filter(move |&t| own.is_none_or(|r| s.core.get(t as usize).is_some_and(|&cr| s.core_rank(cr) == r))),
        )
    }
}

impl Schedule {
    /// The counters task `t` signals: its list, then its kernel's barriers (rank order).
    pub fn signals(&self, t: usize) -> impl Iterator<Item = u32> + Clone + '_ {
        let list = self.signal_list.row(t).iter().copied();
        list.chain(self.fanout_of(t))
    }

    /// The kernel barriers task `t` signals (an empty range when none).
    pub fn fanout_of(&self, t: usize) -> std::ops::Range<u32> {
        let f = self
            .kernel
            .get(t)
            .and_then(|&k| self.fanout.get(k as usize))
            .copied()
            .flatten();
        match f {
            Some(Fanout::OwnRank { first }) => {
                let r = self.core.get(t).map_or(0, |&c| self.core_rank(c));
                let c = first.saturating_add(r);
                c..c.saturating_add(1)
            }
            Some(Fanout::EveryRank { first, ranks }) => first..first.saturating_add(ranks),
            None => 0..0,
        }
    }

    /// Every counter's signalling tasks without writing out the fanouts: the transpose of
    /// the signal lists, and each kernel's tasks (memory linear in the tasks and edges, where
    /// [`Schedule::signallers`] holds a row entry per task and rank of a barrier over every
    /// rank).
    pub fn signaller_index(&self) -> SignallerIndex {
        let n = self.core.len();
        let listed = self.signal_list.transpose_into(self.threshold.len());
        let kernels = self.fanout.len();
        let pairs: Vec<(u32, u32)> = (0..n)
            .filter_map(|t| {
                let k = *self.kernel.get(t)?;
                ((k as usize) < kernels && self.fanout[k as usize].is_some()).then_some((k, t as u32))
            })
            .collect();
        let by_kernel = if pairs.is_empty() {
            Csr::default()
        } else {
            Csr::from_pairs(kernels, &pairs)
        };
        SignallerIndex { listed, by_kernel }
    }

    /// Every counter's signalling tasks (the transpose of [`Schedule::signals`], a row entry
    /// per task and rank of a barrier over every rank: for tests and small schedules).
    pub fn signallers(&self) -> Csr {
        let counters = self.threshold.len();
        let pairs: Vec<(u32, u32)> = (0..self.core.len())
            .flat_map(|t| self.signals(t).map(move |c| (c, t as u32)))
            .filter(|&(c, _)| (c as usize) < counters)
            .collect();
        Csr::from_pairs(counters, &pairs)
    }

    /// Memory the schedule holds (its per-task, per-core and per-counter arrays), in bytes.
    pub fn resident_bytes(&self) -> usize {
        let words = self.core.len()
            + self.queues.off.len()
            + self.queues.idx.len()
            + self.waits.off.len()
            + self.waits.idx.len()
            + self.signal_list.off.len()
            + self.signal_list.idx.len()
            + self.fanout.len() * 3
            + self.threshold.len()
            + self.counter_rank.len()
            + self.kernel.len();
        words * std::mem::size_of::<u32>()
    }

    pub fn cores_per_rank(&self) -> u32 {
        self.aic_cores + self.aiv_cores
    }
    pub fn core_engine(&self, core: u32) -> Engine {
        if core % self.cores_per_rank() < self.aic_cores {
            Engine::Aic
        } else {
            Engine::Aiv
        }
    }
    pub fn core_rank(&self, core: u32) -> u32 {
        core / self.cores_per_rank()
    }
    /// A digest of everything that decides how the schedule runs (cores, queues, counters,
    /// kernels; not its policy, origin or estimate): two schedules of one graph and policy
    /// with the same fingerprint simulate alike, so a candidate equal to one already
    /// simulated need not run again.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.aic_cores, self.aiv_cores, self.barriers).hash(&mut h);
        self.core.hash(&mut h);
        for c in [&self.queues, &self.waits, &self.signal_list] {
            c.off.hash(&mut h);
            c.idx.hash(&mut h);
        }
        self.fanout.hash(&mut h);
        self.threshold.hash(&mut h);
        self.counter_rank.hash(&mut h);
        self.kernel.hash(&mut h);
        h.finish()
    }
    /// `aic3` / `aiv17`.
    pub fn core_name(&self, core: u32) -> String {
        let l = core % self.cores_per_rank();
        if l < self.aic_cores {
            format!("aic{l}")
        } else {
            format!("aiv{}", l - self.aic_cores)
        }
    }
}

/// A topological order of the task graph (Kahn; ties by task id).
pub fn topo_order(g: &TaskGraph) -> Option<Vec<u32>> {
    let n = g.len();
    // Lowering numbers tasks call by call in topological order, so every producer normally
    // precedes its consumers; then the smallest ready id is always the next id and Kahn's
    // order is the identity.
    if ids_are_topological(g) {
        return Some((0..n as u32).collect());
    }
    let mut remaining: Vec<u32> = (0..g.counters.len()).map(|c| g.counters.row(c).len() as u32).collect();
    let mut ready: Vec<u32> = (0..n as u32).filter(|&t| g.wait[t as usize] == NO_COUNTER).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(n);
    let mut heap: BinaryHeap<Reverse<u32>> = ready.into_iter().map(Reverse).collect();
    while let Some(Reverse(t)) = heap.pop() {
        order.push(t);
        for &c in g.signals.row(t as usize) {
            remaining[c as usize] -= 1;
            if remaining[c as usize] == 0 {
                for &w in g.waiters.row(c as usize) {
                    heap.push(Reverse(w));
                }
            }
        }
    }
    (order.len() == n).then_some(order)
}

/// Whether every task's producers have smaller ids (then the graph is acyclic and task-id
/// order is topological).
pub fn ids_are_topological(g: &TaskGraph) -> bool {
    // The largest producer of each counter (`None`: no producer, its waiters never start).
    let last: Vec<Option<u32>> = (0..g.counters.len())
        .map(|c| g.counters.row(c).iter().copied().max())
        .collect();
    g.wait
        .iter()
        .enumerate()
        .all(|(t, &c)| c == NO_COUNTER || matches!(last.get(c as usize), Some(&Some(p)) if (p as usize) < t))
}

/// The longest path (in estimated seconds) from each task to the end of the graph.
fn critical_path(g: &TaskGraph, order: &[u32], dur: &[f64]) -> Vec<f64> {
    let mut cp = vec![0.0; g.len()];
    let mut best = vec![0.0f64; g.counters.len()];
    for &t in order.iter().rev() {
        let t = t as usize;
        let after = g.signals.row(t).iter().map(|&c| best[c as usize]).fold(0.0, f64::max);
        cp[t] = dur[t] + after;
        let c = g.wait[t];
        if c != NO_COUNTER && cp[t] > best[c as usize] {
            best[c as usize] = cp[t];
        }
    }
    cp
}

/// Whether the op call writes through communication.
fn is_comm(tf: &Taskflow, node: usize) -> bool {
    tf.tensor(tf.nodes[node].output).home == crate::ir::Home::Window
}

/// Builds the schedule of a policy. The graph must be acyclic (verified).
pub fn schedule(program: &Program, tf: &Taskflow, g: &TaskGraph, spec: &PolicySpec) -> Schedule {
    let dev = &program.device;
    let aic = dev.aic_cores();
    let aiv = dev.aiv_cores();
    let n = g.len();
    let dur = cost::all(program, tf, g);
    let order = topo_order(g).unwrap_or_else(|| (0..n as u32).collect());
    let aiv_used = match spec.policy {
        Policy::Interleaved if spec.aiv_workers > 0 => spec.aiv_workers.min(aiv),
        Policy::ExpertLevel => ((aiv as f64 * spec.aiv_fraction).round() as u32).clamp(1, aiv),
        _ => aiv,
    };
    let cpr = aic + aiv;
    let mut core = vec![0u32; n];
    let mut kernel = vec![u32::MAX; n];
    let mut per_core: Vec<Vec<u32>> = vec![Vec::new(); (g.ranks * cpr) as usize];
    let mut estimate = 0.0;
    // The order in which each (rank, engine) pool receives its tasks.
    match spec.policy {
        Policy::Interleaved => {
            let pools = interleaved::Pools { aic, aiv_used, cpr };
            estimate = interleaved::place(tf, g, spec, (&order, &dur), &pools, &mut core, &mut per_core);
        }
        Policy::ExpertLevel | Policy::KernelByKernel => {
            // Per (rank, engine): tasks in op order; within a call, by expert (the tile order
            // already groups rows by expert) and, for communication with ratr, by rotated
            // destination (expert round by expert round, but for the pairwise AllToAllV's
            // steps); independent
            // backward GMM calls are interleaved on the cube queue.
            let mut lists: Vec<Vec<u32>> = vec![Vec::new(); g.ranks as usize * 2];
            let interleave = spec.policy == Policy::ExpertLevel && spec.interleave_backward;
            let groups = node_groups(tf, interleave);
            for grp in &groups {
                for r in 0..g.ranks {
                    for eng in [Engine::Aic, Engine::Aiv] {
                        let mut per_node: Vec<Vec<u32>> = Vec::new();
                        for &ni in grp {
                            if tf.nodes[ni].engine != eng {
                                continue;
                            }
                            let nt = &g.nodes[ni];
                            let base = nt.base[r as usize];
                            let mut ts: Vec<u32> = (base..base + nt.per_rank[r as usize].count).collect();
                            if collective::by_step(spec, tf, ni) {
                                if collective::pairwise(spec) {
                                    // A collective's order: step by step.
                                    ts.sort_by_key(|&t| (ratr_step(g, t as usize), t));
                                } else {
                                    ts.sort_by_cached_key(|&t| (collective::ratr_key(g, t as usize), t));
                                }
                            }
                            per_node.push(ts);
                        }
                        let list = &mut lists[r as usize * 2 + if eng == Engine::Aic { 0 } else { 1 }];
                        // Round-robin merge of the calls of a group.
                        let mut i = 0;
                        loop {
                            let mut any = false;
                            for v in &per_node {
                                if let Some(&t) = v.get(i) {
                                    list.push(t);
                                    any = true;
                                }
                            }
                            if !any {
                                break;
                            }
                            i += 1;
                        }
                    }
                }
            }
            for (li, list) in lists.iter().enumerate() {
                let r = (li / 2) as u32;
                let (first, count) = if li % 2 == 0 { (0, aic) } else { (aic, aiv_used) };
                // Slot i goes to worker i mod count; each worker keeps slot order.
                for (slot, &t) in list.iter().enumerate() {
                    let c = r * cpr + first + (slot as u32 % count.max(1));
                    core[t as usize] = c;
                    per_core[c as usize].push(t);
                }
            }
            if spec.policy == Policy::KernelByKernel {
                kernel.copy_from_slice(&g.node);
            }
        }
    }
    let queues = {
        let mut off = vec![0u32];
        let mut idx = Vec::with_capacity(n);
        for q in &per_core {
            idx.extend_from_slice(q);
            off.push(idx.len() as u32);
        }
        Csr { off, idx }
    };
    // Counters: the graph's, then (kernel by kernel, pairwise AllToAll) the step counters of
    // its collectives, then (kernel by kernel) one barrier per (kernel, rank): kernel k on
    // rank r waits until kernel k-1 finished on rank r, or on every rank when either is a
    // collective (communication).
    let gc = g.counters.len() as u32;
    let mut wait_pairs: Vec<(u32, u32)> = Vec::with_capacity(n);
    let mut signal_pairs: Vec<(u32, u32)> = Vec::with_capacity(g.counters.idx.len() + n);
    let mut counter_rank = g.counter_rank.clone();
    for t in 0..n {
        if g.wait[t] != NO_COUNTER {
            wait_pairs.push((t as u32, g.wait[t]));
        }
        for &c in g.signals.row(t) {
            signal_pairs.push((t as u32, c));
        }
    }
    // Then the steps of a pairwise AllToAll (see `collective`).
    let steps = if collective::pairwise(spec) {
        collective::pairwise_steps(tf, g, gc, &mut wait_pairs, &mut signal_pairs, &mut counter_rank)
    } else {
        0
    };
    let gc = gc + steps;
    let mut barriers = 0;
    // Kernel k's barrier on rank r waits for kernel k-1's tasks: those of every rank when
    // either kernel is a collective (their signals are described by a fanout, not listed).
    let mut fanout: Vec<Option<Fanout>> = Vec::new();
    let mut barrier_threshold: Vec<u32> = Vec::new();
    if spec.policy == Policy::KernelByKernel {
        let nodes = tf.nodes.len();
        fanout = vec![None; nodes];
        for k in 1..nodes {
            let collective = is_comm(tf, k) || is_comm(tf, k - 1);
            let first = gc + barriers;
            let prev = &g.nodes[k - 1];
            let every: u32 = prev.per_rank.iter().map(|p| p.count).sum();
            for r in 0..g.ranks {
                barriers += 1;
                counter_rank.push(r);
                let nt = &g.nodes[k];
                let base = nt.base[r as usize];
                for t in base..base + nt.per_rank[r as usize].count {
                    wait_pairs.push((t, first + r));
                }
                barrier_threshold.push(if collective {
                    every
                } else {
                    prev.per_rank[r as usize].count
                });
            }
            fanout[k - 1] = Some(if collective {
                Fanout::EveryRank { first, ranks: g.ranks }
            } else {
                Fanout::OwnRank { first }
            });
        }
    }
    let waits = Csr::from_pairs(n, &wait_pairs);
    let signal_list = Csr::from_pairs(n, &signal_pairs);
    let mut threshold = vec![0u32; gc as usize];
    for &(_, c) in &signal_pairs {
        threshold[c as usize] += 1;
    }
    threshold.extend_from_slice(&barrier_threshold);
    Schedule {
        policy: spec.clone(),
        aic_cores: aic,
        aiv_cores: aiv,
        core,
        queues,
        waits,
        signal_list,
        fanout,
        threshold,
        counter_rank,
        kernel,
        barriers,
        estimate,
        origin: "policy",
    }
}

/// Groups of op calls scheduled together: each call alone, except (when `interleave`) runs
/// of consecutive independent cube calls, whose tasks are merged round-robin.
fn node_groups(tf: &Taskflow, interleave: bool) -> Vec<Vec<usize>> {
    let n = tf.nodes.len();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut seen = Vec::new();
    // The calls whose outputs a call reads.
    let producers = |c: usize| {
        tf.nodes[c]
            .inputs
            .iter()
            .filter_map(|&inp| tf.tensor(inp).producer.map(|p| p.0 as usize))
    };
    for i in 0..n {
        if interleave && tf.nodes[i].engine == Engine::Aic {
            if let Some(last) = groups.last_mut() {
                let all_aic = last.iter().all(|&j| tf.nodes[j].engine == Engine::Aic);
                // (The calls are in a topological order: a call never depends on a later one.)
                if all_aic && last.len() < 2 && last.iter().all(|&j| !depends_on(&producers, i, j, &mut seen)) {
                    last.push(i);
                    continue;
                }
            }
        }
        groups.push(vec![i]);
    }
    groups
}

/// Whether call `i` depends on call `j < i`, through any chain of calls; `producers(c)`:
/// the calls whose outputs call `c` reads. The calls are in a topological order (a call
/// reads only earlier calls' outputs), so such a chain only passes through the calls
/// between them: the walk visits at most those, and a graph of many calls is grouped in
/// time linear in its size (a table of every call's dependencies was quadratic in time and
/// memory).
fn depends_on<I: Iterator<Item = usize>>(
    producers: &impl Fn(usize) -> I,
    i: usize,
    j: usize,
    seen: &mut Vec<bool>,
) -> bool {
    // `seen`: per call of `j..=i`, whether the walk reached it (reused between queries).
    seen.clear();
    seen.resize(i - j + 1, false);
    let mut stack = vec![i];
    seen[i - j] = true;
    while let Some(c) = stack.pop() {
        for p in producers(c) {
            if p == j {
                return true;
            }
            if p > j && p < c && !seen[p - j] {
                seen[p - j] = true;
                stack.push(p);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::depends_on;

    #[test]
    fn ranges_sharing_a_counter_are_both_left_out() {
        let none = u32::MAX;
        // 0..2 and 1..3 share counter 1; 4..6 stands alone; 5..9 passes the 8 counters; 7..7 is empty.
        let (kept, owner) =
            super::disjoint_ranges(&[Some(0..2), None, Some(1..3), Some(4..6), Some(5..9), Some(7..7)], 8);
        assert_eq!(kept, vec![None, None, None, Some(4..6), None, None]);
        assert_eq!(owner, vec![none, none, none, none, 3, 3, none, none]);
        // Nothing kept: no per-counter list.
        let (kept, owner) = super::disjoint_ranges(&[Some(0..2), Some(0..2)], 8);
        assert_eq!(kept, vec![None, None]);
        assert!(owner.is_empty());
    }

    proptest::proptest! {
        /// A call depends on an earlier one exactly when the transitive closure of the
        /// producer lists (worked out over all calls, in order) says so.
        #[test]
        fn a_dependency_walk_agrees_with_the_transitive_closure(
            edges in proptest::collection::vec(proptest::collection::vec(0usize..64, 0..4), 1..40),
        ) {
            // Call `c` reads the outputs of the calls `e % c` for its listed `e` (earlier).
            let preds: Vec<Vec<usize>> = edges
                .iter()
                .enumerate()
                .map(|(c, es)| if c == 0 { Vec::new() } else { es.iter().map(|e| e % c).collect() })
                .collect();
            let n = preds.len();
            let mut closure = vec![vec![false; n]; n];
            for c in 0..n {
                for &p in &preds[c] {
                    closure[c][p] = true;
                    for k in 0..n {
                        if closure[p][k] {
                            closure[c][k] = true;
                        }
                    }
                }
            }
            let producers = |c: usize| preds[c].clone().into_iter();
            let mut seen = Vec::new();
            for i in 0..n {
                for j in 0..i {
                    proptest::prop_assert_eq!(depends_on(&producers, i, j, &mut seen), closure[i][j], "{} on {}", i, j);
                }
            }
        }
    }
}
