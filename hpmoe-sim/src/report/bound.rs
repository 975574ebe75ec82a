//! Lower bounds on the latency of a workload under any schedule of its task graph: a
//! workload, its schedule's counters, the device model in; [`Bounds`] out, each bound with the
//! rank (or fabric resource) that reaches it.
//!
//! Every task has a shortest duration `d` (see [`durations`]: its compute, or its reads with
//! the bytes that must come from HBM at the per-core HBM rate and the rest at the faster of
//! the L2 and HBM rates, or its puts over the rates of its own path and put slots; plus the
//! task overhead), a head `h` (the earliest it can start: the longest chain of shortest
//! durations, signal latencies over the pair's path and kernel launches before it, from the
//! first launch; a counter on another rank than its signallers is signalled no earlier than
//! the bytes they put to that rank take through its port in after the earliest of their
//! puts starts, so a consumer of received rows starts after they arrived) and a tail `q` (the least time from its end to the end of the layer: the
//! longest chain after it through the counters it signals). A put's last byte lands at least
//! its path latency after the put's link part: the *span* of a task (least time from its start
//! to the end of what follows) is the larger of `d + q` and that landing. Then:
//!
//! - **work** (per rank and engine, at `P` cores): any set `S` of the rank's tasks of the
//!   engine needs `W(S)/P` of core time after the earliest head in `S`, and the last of them
//!   to end is followed by at least the least tail in `S`: `min h + W(S)/P + min q`. Taken
//!   over the sets of the tasks with the largest heads (and, separately, the largest tails),
//!   which includes the whole rank: `start + W/P`. The whole rank's work also counts the
//!   first read of every input block from HBM at the per-core HBM rate by one of its
//!   readers (the least increase over the readers, beyond each one's slack);
//! - **hbm** (per rank): the bytes no schedule serves from L2 over the die's HBM bandwidth,
//!   as jobs in the same head/tail form on one server: every taskflow-input block that fits
//!   in L2 is read from HBM once (its least read share, between the earliest head and the
//!   least tail of its readers), and every read of a block larger than the whole L2 misses
//!   (the L2 model streams such a block through). Write-backs share the bandwidth but may
//!   finish after the layer, so they do not count;
//! - **link** (per fabric resource): the flows through each resource of the topology (a
//!   rank's port out and in, a pair's own link or package link, cross ports, node uplinks,
//!   see `model::link`) at its rate, and a die's put slots (`die_puts_in_flight`, each
//!   flow holding one from its descriptor to its last byte, a phase's first put to a peer
//!   also its setup), as jobs: released at the put's head plus its first chunk's read and the
//!   put overhead, followed by the landing latency of the pair;
//! - **arrival** (comm/compute coupling, per fabric resource): the same jobs, each followed
//!   by what must still run once its data is in: the task overhead and the put's tail (the
//!   consumers on the destination that wait for the rows, and what follows them). A rank
//!   cannot compute on rows before they arrive: the last flow through the hot port lands no
//!   earlier than the port's transfer time, and its consumers' work comes after;
//! - **critical path**: the largest `h + span`.
//!
//! The bound is the largest of them; its kind names which binds (and for link and arrival,
//! the resource).

use crate::model::{DeviceModel, AIC, AIV};
use crate::sim::Workload;
use hpmoe_dsl::schedule::Schedule;
use std::fmt;

const NONE: u32 = u32::MAX;
const MIXED: u32 = u32::MAX - 1;

/// A resource of the fabric for the link bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkResource {
    /// No flow.
    #[default]
    None,
    /// A rank's port to the dies outside its package, out and in.
    PortOut(u32),
    PortIn(u32),
    /// A pair's own link (the package link between the two dies of a package).
    Pair(u32, u32),
    /// A rank's cross port (to other nodes), out and in.
    CrossOut(u32),
    CrossIn(u32),
    /// A node's uplink and downlink.
    UplinkOut(u32),
    UplinkIn(u32),
    /// A die's put slots.
    PutSlots(u32),
}

impl LinkResource {
    /// A rank it belongs to (the first die of a node for an uplink).
    pub fn rank(&self, dies_per_node: u32) -> Option<u32> {
        match *self {
            LinkResource::None => None,
            LinkResource::PortOut(r)
            | LinkResource::PortIn(r)
            | LinkResource::CrossOut(r)
            | LinkResource::CrossIn(r)
            | LinkResource::PutSlots(r)
            | LinkResource::Pair(r, _) => Some(r),
            LinkResource::UplinkOut(n) | LinkResource::UplinkIn(n) => Some(n * dies_per_node),
        }
    }
}

impl fmt::Display for LinkResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LinkResource::None => write!(f, "none"),
            LinkResource::PortOut(r) => write!(f, "port out of rank {r}"),
            LinkResource::PortIn(r) => write!(f, "port in of rank {r}"),
            LinkResource::Pair(s, d) => write!(f, "link {s}->{d}"),
            LinkResource::CrossOut(r) => write!(f, "cross port out of rank {r}"),
            LinkResource::CrossIn(r) => write!(f, "cross port in of rank {r}"),
            LinkResource::UplinkOut(n) => write!(f, "uplink of node {n}"),
            LinkResource::UplinkIn(n) => write!(f, "downlink of node {n}"),
            LinkResource::PutSlots(r) => write!(f, "put slots of rank {r}"),
        }
    }
}

/// The lower bounds, in seconds, and the rank that reaches each per-rank bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounds {
    pub aic_work: f64,
    pub aiv_work: f64,
    pub hbm: f64,
    pub link: f64,
    pub arrival: f64,
    pub critical_path: f64,
    /// The rank of the AIC work, AIV work, HBM, link and arrival bounds.
    pub ranks: [u32; 5],
    /// The fabric resource of the link and arrival bounds.
    pub link_resource: LinkResource,
    pub arrival_resource: LinkResource,
    /// Bytes the HBM bound counts on its rank.
    pub hbm_bytes: f64,
}

impl Bounds {
    /// The largest bound and its name.
    pub fn max(&self) -> (f64, &'static str) {
        self.binding().0
    }

    /// The largest bound, its name and (for a per-rank bound) its rank.
    pub fn binding(&self) -> ((f64, &'static str), Option<u32>) {
        let all = [
            (self.aic_work, "aic work", Some(self.ranks[0])),
            (self.aiv_work, "aiv work", Some(self.ranks[1])),
            (self.hbm, "hbm traffic", Some(self.ranks[2])),
            (self.link, "link traffic", Some(self.ranks[3])),
            (self.arrival, "data arrival", Some(self.ranks[4])),
            (self.critical_path, "critical path", None),
        ];
        all.iter().fold(
            ((0.0, "critical path"), None),
            |a, &(v, k, r)| {
                if v > a.0 .0 {
                    ((v, k), r)
                } else {
                    a
                }
            },
        )
    }

    /// The fabric resource of the binding bound, if it is a link or arrival bound.
    pub fn binding_resource(&self) -> Option<LinkResource> {
        match self.max().1 {
            "link traffic" => Some(self.link_resource),
            "data arrival" => Some(self.arrival_resource),
            _ => None,
        }
    }
}

/// Per task, what the bounds need beside the workload: the shortest duration, the least time
/// from its start to its first byte moving (first chunk read and put overhead), the least
/// time from its start to the landing of its last byte (0 without puts) and the bytes it
/// must read from HBM.
#[derive(Clone, Debug, Default)]
pub struct Durations {
    pub d: Vec<f64>,
    pub release: Vec<f64>,
    pub landing: Vec<f64>,
    pub must_miss: Vec<f64>,
    /// How much longer its reads could take before they set its duration.
    pub slack: Vec<f64>,
}

impl Durations {
    /// Whether these are per task of a workload of `n` tasks (every array that long).
    fn fits(&self, n: usize) -> bool {
        [&self.d, &self.release, &self.landing, &self.must_miss, &self.slack]
            .iter()
            .all(|v| v.len() == n)
    }
}

/// Read shares of every task's blocks in `within`, as the simulator splits a run: the whole
/// run's bytes for a run of one block, else in proportion to block sizes (of the whole run).
/// `f(task, block, share)`, tasks in the plan's order.
fn for_each_share_within(w: &Workload, within: std::ops::Range<usize>, mut f: impl FnMut(usize, usize, f64)) {
    for info in &w.plan.info {
        let t = info.task as usize;
        for_each_share_in(w, info, within.clone(), |b, share| f(t, b, share));
    }
}

/// The read shares of one task (its description in the plan) of the blocks in `within`, as
/// [`for_each_share_within`] gives them. `f(block, share)`.
fn for_each_share_in(
    w: &Workload,
    info: &crate::sim::workload::TaskInfo,
    within: std::ops::Range<usize>,
    mut f: impl FnMut(usize, f64),
) {
    let plan = &w.plan;
    for run in &plan.runs[info.reads as usize..info.read_end as usize] {
        let (a, b) = (run.first as usize, (run.first + run.count) as usize);
        if b <= within.start || a >= within.end {
            continue;
        }
        if run.count == 1 {
            f(a, run.bytes);
            continue;
        }
        let all: f64 = w.block_size[a..b].iter().sum();
        if all <= 0.0 {
            continue;
        }
        for blk in a.max(within.start)..b.min(within.end) {
            f(blk, run.bytes * w.block_size[blk] / all);
        }
    }
}

/// A lower bound on the makespan of a schedule with kernel barriers (`kernel_by_kernel`):
/// on a rank, kernel k starts after kernel k - 1 finished there, so a run of kernels that
/// all have tasks on the rank never overlaps and needs at least the sum of each kernel's
/// least span: its longest task, and its work per engine over that engine's cores. A kernel
/// with no task on the rank releases the next one at once, so it ends the run. The bound is
/// the longest run over all ranks; 0 without barriers.
pub fn kernel_bound(w: &Workload, s: &Schedule, m: &DeviceModel, rank: &[u32]) -> f64 {
    if s.barriers == 0 {
        return 0.0;
    }
    kernel_bound_with(w, s, m, rank, &durations(w, m, rank))
}

/// [`kernel_bound`] with the workload's [`durations`] given (they do not depend on the
/// schedule: the candidates of one workload share them).
/// Durations of another workload (of another task count) are not used: they are computed.
pub fn kernel_bound_with(w: &Workload, s: &Schedule, m: &DeviceModel, rank: &[u32], du: &Durations) -> f64 {
    if s.barriers == 0 {
        return 0.0;
    }
    let fresh;
    let du = if du.fits(w.tasks()) {
        du
    } else {
        fresh = durations(w, m, rank);
        &fresh
    };
    let ranks = w.ranks as usize;
    let kernels = s
        .kernel
        .iter()
        .filter(|&&k| k != u32::MAX)
        .max()
        .map_or(0, |&k| k as usize + 1);
    // Per (rank, kernel): work per engine class, the longest task and the task count.
    let mut work = vec![[0.0f64; 4]; ranks * kernels];
    for t in 0..w.tasks() {
        let k = s.kernel[t];
        if k == u32::MAX {
            return 0.0;
        }
        let e = &mut work[rank[t] as usize * kernels + k as usize];
        e[w.class[t] as usize] += du.d[t];
        e[2] = e[2].max(du.d[t]);
        e[3] += 1.0;
    }
    let cores = [m.aic_cores as f64, m.aiv_cores as f64];
    let mut longest = 0.0f64;
    for r in 0..ranks {
        let mut run = 0.0;
        for e in &work[r * kernels..(r + 1) * kernels] {
            run = if e[3] == 0.0 {
                0.0
            } else {
                run + (e[AIC] / cores[AIC]).max(e[AIV] / cores[AIV]).max(e[2])
            };
            longest = longest.max(run);
        }
    }
    longest + w.start_time
}

/// The shortest duration of every task (see the module doc), and its parts.
pub fn durations(w: &Workload, m: &DeviceModel, rank: &[u32]) -> Durations {
    use rayon::prelude::*;
    let n = w.tasks();
    let topo = &m.topology;
    // Per internal task: its bytes read and those of blocks that never fit in L2, summed
    // share by share in the order of its runs (each task on one thread, so the sums are
    // those of one pass).
    let plan = &w.plan;
    let sums: Vec<(f64, f64)> = plan
        .info
        .par_iter()
        .with_min_len(4096)
        .map(|info| {
            let (mut read, mut must) = (0.0f64, 0.0f64);
            for_each_share_in(w, info, 0..w.blocks(), |b, share| {
                read += share;
                if w.block_size[b] > m.l2_size {
                    must += share;
                }
            });
            (read, must)
        })
        .collect();
    let cores = f64::from(topo.core_puts.max(1));
    let mut out = Durations {
        d: vec![0.0; n],
        release: vec![0.0; n],
        landing: vec![0.0; n],
        must_miss: vec![0.0; n],
        slack: vec![0.0; n],
    };
    (
        out.d.par_iter_mut(),
        out.slack.par_iter_mut(),
        out.release.par_iter_mut(),
        out.landing.par_iter_mut(),
        out.must_miss.par_iter_mut(),
    )
        .into_par_iter()
        .with_min_len(4096)
        .enumerate()
        .for_each(|(t, (d_out, slack_out, release_out, landing_out, must_out))| {
            let (read, must) = sums[plan.pos[t] as usize];
            let c = w.class[t] as usize;
            let best = m.best_read_rate(c);
            let mm = must.min(read);
            let mem = mm / m.core_hbm[c] + (read - mm) / best + w.local_out[t] / m.core_l2_write[c];
            let flows = w.task_flows(t);
            let (mut link, mut release, mut landing) = (0.0, 0.0, 0.0f64);
            if !flows.is_empty() {
                let total = w.read_total[t];
                let fill = if total > 0.0 {
                    let mt = mm.min(total);
                    total.min(m.put_chunk_bytes) * (mt / total / m.core_hbm[c] + (total - mt) / total / best)
                } else {
                    0.0
                };
                let s = rank[t];
                let (mut slots, mut longest, mut port, mut lat_min) = (0.0, 0.0f64, 0.0, f64::INFINITY);
                release = fill + topo.put_overhead;
                for f in flows {
                    let dst = w.flow_dst[f];
                    let b = w.flow_bytes[f];
                    let one = b / topo.pair_cap(s, dst);
                    let lat = topo.latency(s, dst);
                    slots += topo.put_overhead + one;
                    longest = longest.max(one);
                    if !matches!(topo.tier(s, dst), crate::model::link::Tier::Package) {
                        port += b;
                    }
                    lat_min = lat_min.min(lat);
                    // This flow's last byte lands no earlier than alone on its pair.
                    landing = landing.max(release + one + lat);
                }
                link = fill + (slots / cores).max(topo.put_overhead + longest.max(port / topo.port_bandwidth));
                // The last of them to leave lands at least the least latency later.
                landing = landing.max(link + lat_min);
            }
            *d_out = m.task_overhead + w.compute[t].max(mem).max(link);
            *slack_out = (w.compute[t].max(link) - mem).max(0.0);
            *release_out = release;
            *landing_out = landing;
            *must_out = mm;
        });
    out
}

/// Counts task `t`'s puts to a counter's rank (released at `release`, `bytes` in all, at
/// `latency`) in that counter's inflow, once per task.
fn note_inflow(e: &mut (f64, f64, f64, u32), t: usize, release: f64, bytes: f64, latency: impl FnOnce() -> f64) {
    if e.3 != t as u32 {
        e.3 = t as u32;
        e.0 = e.0.min(release);
        e.1 += bytes;
        e.2 = e.2.min(latency());
    }
}

/// Marks counter `c` reached: its ready time then (the bytes crossing into its rank
/// included), given to its waiters; those with nothing left to wait for go on `stack`.
#[allow(clippy::too_many_arguments)]
fn release(
    c: usize,
    ready: &mut [f64],
    inflow: &[(f64, f64, f64, u32)],
    head: &mut [f64],
    indeg: &mut [u32],
    stack: &mut Vec<u32>,
    w: &Workload,
    m: &DeviceModel,
) {
    let (rel, bytes, l, _) = inflow[c];
    if bytes > 0.0 {
        let last = rel + bytes / m.topology.port_bandwidth + m.task_overhead + l;
        ready[c] = ready[c].max(last);
    }
    let at = ready[c] + w.delay[c];
    for &x in w.waiters.row(c) {
        let x = x as usize;
        head[x] = head[x].max(at);
        indeg[x] -= 1;
        if indeg[x] == 0 {
            stack.push(x as u32);
        }
    }
}

/// A schedule's kernel barriers over every rank (`Fanout::EveryRank` of two ranks or more)
/// laid out as [`heads_tails`] gathers them: barrier `first + r` on rank `r`, one threshold
/// for all. Any other fanout is walked counter by counter.
struct Fans {
    /// Per kernel: its index in `list`, or `None`.
    by_kernel: Vec<Option<usize>>,
    /// (first counter, ranks).
    list: Vec<(u32, u32)>,
    ranks: usize,
}

impl Fans {
    fn new(s: &Schedule, ranks: u32) -> Fans {
        let mut by_kernel = vec![None; s.fanout.len()];
        let mut list = Vec::new();
        for (k, f) in s.fanout.iter().enumerate() {
            let Some(hpmoe_dsl::schedule::Fanout::EveryRank { first, ranks: n }) = *f else {
                continue;
            };
            let (lo, hi) = (first as usize, first as usize + n as usize);
            let laid_out = n == ranks
                && n >= 2
                && hi <= s.threshold.len()
                && (lo..hi).all(|c| s.counter_rank[c] as usize == c - lo && s.threshold[c] == s.threshold[lo]);
            if laid_out {
                by_kernel[k] = Some(list.len());
                list.push((first, n));
            }
        }
        Fans {
            by_kernel,
            list,
            ranks: ranks as usize,
        }
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    /// The gathered fanout task `t` signals, if any.
    fn of(&self, s: &Schedule, t: usize) -> Option<usize> {
        let k = *s.kernel.get(t)? as usize;
        *self.by_kernel.get(k)?
    }
}

/// Heads, tails and spans of every task (see the module doc) for shortest durations `du`.
/// Tasks on a dependency cycle (never ready) keep the first launch as head and no tail.
pub fn heads_tails(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    rank: &[u32],
    du: &Durations,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = w.tasks();
    let d = &du.d;
    let counters = s.threshold.len();
    let mut indeg: Vec<u32> = (0..n)
        .map(|t| s.waits.row(t).iter().filter(|&&c| s.threshold[c as usize] > 0).count() as u32)
        .collect();
    let lat = |t: usize, c: usize| {
        let r = s.counter_rank[c];
        if r == rank[t] {
            m.event_latency
        } else {
            m.topology.latency(rank[t], r)
        }
    };
    let topo = &m.topology;
    let mut head = vec![w.start_time; n];
    let mut ready = vec![0.0f64; counters];
    let mut count = vec![0u32; counters];
    // Per counter on another rank than its signallers: the earliest release of their puts to
    // that rank, the bytes those move through its port in, the least latency: every one of
    // those bytes has crossed the port before the counter is signalled.
    let mut inflow: Vec<(f64, f64, f64, u32)> = vec![(f64::INFINITY, 0.0, f64::INFINITY, NONE); counters];
    let mut to_rank = vec![0.0f64; w.ranks as usize];
    let mut stack: Vec<u32> = (0..n as u32).filter(|&t| indeg[t as usize] == 0).collect();
    stack.reverse();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    // Barriers over every rank (`Fanout::EveryRank`) take the same values as if each task's
    // signals were walked one by one, gathered per source rank instead: a counter's ready
    // time is the largest `finish + latency` over its signallers, which is the largest
    // finish per source rank plus that rank's latency (adding a latency keeps the order of
    // finishes), and all of a fanout's counters fill together, at its last task.
    let fans = Fans::new(s, w.ranks);
    let mut fan_fin = vec![f64::NEG_INFINITY; fans.len() * fans.ranks];
    let mut fan_count = vec![0u32; fans.len()];
    while let Some(t) = stack.pop() {
        order.push(t);
        let t = t as usize;
        let fin = head[t] + d[t];
        let flows = w.task_flows(t);
        for f in flows.clone() {
            let dst = w.flow_dst[f];
            if !matches!(topo.tier(rank[t], dst), crate::model::link::Tier::Package) {
                to_rank[dst as usize] += w.flow_bytes[f];
            }
        }
        let fan = fans.of(s, t);
        let listed = s.signal_list.row(t).iter().copied();
        let own = if fan.is_some() { 0..0 } else { s.fanout_of(t) };
        for c in listed.chain(own) {
            let c = c as usize;
            ready[c] = ready[c].max(fin + lat(t, c));
            let cr = s.counter_rank[c];
            // (A task signalling a counter twice moves its bytes once.)
            if cr != rank[t] && (cr as usize) < to_rank.len() && to_rank[cr as usize] > 0.0 {
                let release = head[t] + du.release[t];
                note_inflow(&mut inflow[c], t, release, to_rank[cr as usize], || {
                    topo.latency(rank[t], cr)
                });
            }
            count[c] += 1;
            if count[c] == s.threshold[c] {
                release(c, &mut ready, &inflow, &mut head, &mut indeg, &mut stack, w, m);
            }
        }
        if let Some(fi) = fan {
            let (first, _) = fans.list[fi];
            let rt = rank[t] as usize;
            let x = &mut fan_fin[fi * fans.ranks + rt];
            *x = x.max(fin);
            // Bytes moved to each other rank, once per destination.
            for f in flows.clone() {
                let cr = w.flow_dst[f];
                let c = (first + cr) as usize;
                if cr != rank[t] && to_rank[cr as usize] > 0.0 {
                    let release = head[t] + du.release[t];
                    note_inflow(&mut inflow[c], t, release, to_rank[cr as usize], || {
                        topo.latency(rank[t], cr)
                    });
                }
            }
            fan_count[fi] += 1;
            if fan_count[fi] == s.threshold[first as usize] {
                for r in 0..fans.ranks {
                    let c = first as usize + r;
                    for (src, &f) in fan_fin[fi * fans.ranks..(fi + 1) * fans.ranks].iter().enumerate() {
                        let l = if src == r {
                            m.event_latency
                        } else {
                            topo.latency(src as u32, r as u32)
                        };
                        ready[c] = ready[c].max(f + l);
                    }
                    release(c, &mut ready, &inflow, &mut head, &mut indeg, &mut stack, w, m);
                }
            }
        }
        for f in flows {
            to_rank[w.flow_dst[f] as usize] = 0.0;
        }
    }
    // Tails and spans, in reverse of that order: every waiter of a counter a task signals
    // comes later.
    let mut tail = vec![0.0f64; n];
    let mut span = vec![0.0f64; n];
    let mut after = vec![f64::NAN; counters];
    // Per (fanout, source rank): the largest `latency + delay + after` over its counters
    // (the same for every task of that rank, all of the fanout's waiters being later).
    let mut fan_q = vec![f64::NAN; fans.len() * fans.ranks];
    for &t in order.iter().rev() {
        let t = t as usize;
        let mut q = 0.0f64;
        let fan = fans.of(s, t);
        let own = if fan.is_some() { 0..0 } else { s.fanout_of(t) };
        let through = |c: usize, after: &mut [f64]| {
            if after[c].is_nan() {
                after[c] = w.waiters.row(c).iter().map(|&x| span[x as usize]).fold(0.0, f64::max);
            }
            if w.waiters.row(c).is_empty() {
                f64::NEG_INFINITY
            } else {
                lat(t, c) + w.delay[c] + after[c]
            }
        };
        for c in s.signal_list.row(t).iter().copied().chain(own) {
            q = q.max(through(c as usize, &mut after));
        }
        if let Some(fi) = fan {
            let k = fi * fans.ranks + rank[t] as usize;
            if fan_q[k].is_nan() {
                let (first, ranks) = fans.list[fi];
                fan_q[k] = (first..first + ranks)
                    .map(|c| through(c as usize, &mut after))
                    .fold(f64::NEG_INFINITY, f64::max);
            }
            q = q.max(fan_q[k]);
        }
        tail[t] = q;
        span[t] = (d[t] + q).max(du.landing[t]);
    }
    (head, tail, span)
}

/// The work bound of one set of tasks `(head, duration, tail)` on `p` cores (see the module
/// doc): the best over the sets of the largest heads and of the largest tails.
pub fn work_bound(tasks: &mut [(f64, f64, f64)], p: f64, start: f64) -> f64 {
    if tasks.is_empty() {
        return 0.0;
    }
    let mut best = start + tasks.iter().map(|x| x.1).sum::<f64>() / p;
    for by_head in [true, false] {
        if by_head {
            tasks.sort_by(|a, b| b.0.total_cmp(&a.0));
        } else {
            tasks.sort_by(|a, b| b.2.total_cmp(&a.2));
        }
        let (mut work, mut min_h, mut min_q) = (0.0f64, f64::INFINITY, f64::INFINITY);
        for &(h, d, q) in tasks.iter() {
            work += d;
            min_h = min_h.min(h);
            min_q = min_q.min(q);
            best = best.max(min_h + work / p + min_q);
        }
    }
    best
}

/// The largest of `f(i)` over `0..k` and its argument (0 when every value is 0).
fn argmax(k: usize, mut f: impl FnMut(usize) -> f64) -> (f64, usize) {
    (0..k).fold((0.0f64, 0usize), |a, i| {
        let v = f(i);
        if v > a.0 {
            (v, i)
        } else {
            a
        }
    })
}

/// The lower bounds of a workload (task ranks `rank`).
pub fn bounds(w: &Workload, s: &Schedule, m: &DeviceModel, rank: &[u32]) -> Bounds {
    bounds_and_chains(w, s, m, rank, false).0
}

/// [`bounds`] and, with `chains`, a lower bound on what remains once each task starts: per
/// task of the event loop's plan (internal id, in queue order), the least time from its
/// start to the end of the layer given that its core runs it and then the rest of its queue
/// one after the other: `c[i] = d[i] + max(q[i], c[i + 1])` along the queue (the last
/// task's `c` is `d + q`). A simulation at time `t` starting task `i` ends no earlier than
/// `t + c[i]` (empty without `chains`).
pub fn bounds_and_chains(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    rank: &[u32],
    chains: bool,
) -> (Bounds, Vec<f64>) {
    bounds_and_chains_with(w, s, m, rank, chains, &durations(w, m, rank))
}

/// [`bounds_and_chains`] with the workload's [`durations`] given (they do not depend on the
/// schedule: the candidates of one workload share them). Durations of another workload (of
/// another task count) are not used: they are computed.
pub fn bounds_and_chains_with(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    rank: &[u32],
    chains: bool,
    du: &Durations,
) -> (Bounds, Vec<f64>) {
    let ranks = w.ranks as usize;
    let n = w.tasks();
    let fresh;
    let du = if du.fits(n) {
        du
    } else {
        fresh = durations(w, m, rank);
        &fresh
    };
    let (head, tail, span) = heads_tails(w, s, m, rank, du);
    let mut chain = Vec::new();
    if chains {
        let plan = &w.plan;
        chain = vec![0.0f64; plan.info.len()];
        for c in 0..plan.queue_off.len().saturating_sub(1) {
            let (lo, hi) = (plan.queue_off[c] as usize, plan.queue_off[c + 1] as usize);
            let mut after = 0.0f64;
            for i in (lo..hi).rev() {
                let t = plan.info[i].task as usize;
                after = du.d[t] + tail[t].max(after);
                chain[i] = after;
            }
        }
    }
    let t0 = w.start_time;
    // Work and critical path.
    let mut per: Vec<[Vec<(f64, f64, f64)>; 2]> = (0..ranks).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut critical = t0;
    for t in 0..n {
        per[rank[t] as usize][w.class[t] as usize].push((head[t], du.d[t], tail[t]));
        critical = critical.max(head[t] + span[t]);
    }
    // The first read of an input block that fits in L2 misses: one of its readers reads its
    // share at the core's HBM rate instead of the best one. The least increase of a reader's
    // duration that this forces (beyond the reader's slack), summed over the blocks, is core
    // time on the readers' rank and engine that no schedule avoids (a task's increase is
    // convex in the bytes it pays for, so the sum over its blocks is at most its increase).
    //
    // The same pass gathers, for the HBM bound below, per input block that fits: the earliest
    // head, least share and least tail of its readers, and their rank (a block read from two
    // dies is left out: either could fetch it).
    let after_end = |t: usize| m.task_overhead + tail[t];
    let blocks = w.blocks();
    let mut first: Vec<(f64, f64, f64, u32)> = vec![(f64::INFINITY, f64::INFINITY, f64::INFINITY, NONE); blocks];
    let mut extra = vec![[0.0f64; 2]; ranks];
    {
        let delta = [AIC, AIV].map(|c| (1.0 / m.core_hbm[c] - 1.0 / m.best_read_rate(c)).max(0.0));
        let mut least: Vec<(f64, u32, u8)> = vec![(f64::INFINITY, NONE, 0); blocks];
        // Only the input blocks that fit count: the reads of no other block are walked.
        let counted = |b: usize| w.block_input[b] && w.block_size[b] <= m.l2_size;
        let (lo, hi) = if walk_all() {
            (0, blocks)
        } else {
            let lo = (0..blocks).find(|&b| counted(b)).unwrap_or(blocks);
            (lo, (lo..blocks).rev().find(|&b| counted(b)).map_or(lo, |b| b + 1))
        };
        for_each_share_within(w, lo..hi, |t, b, share| {
            if counted(b) {
                let c = w.class[t];
                let inc = (share * delta[c as usize] - du.slack[t]).max(0.0);
                let e = &mut least[b];
                if e.1 == NONE {
                    *e = (inc, rank[t], c);
                } else if e.1 != rank[t] || e.2 != c {
                    e.1 = MIXED;
                } else {
                    e.0 = e.0.min(inc);
                }
                let e = &mut first[b];
                e.0 = e.0.min(head[t]);
                e.1 = e.1.min(share);
                e.2 = e.2.min(after_end(t));
                e.3 = if e.3 == NONE || e.3 == rank[t] { rank[t] } else { MIXED };
            }
        });
        for &(inc, r, c) in &least {
            if r != NONE && r != MIXED && inc.is_finite() {
                extra[r as usize][c as usize] += inc;
            }
        }
    }
    let cores = [m.aic_cores as f64, m.aiv_cores as f64];
    let whole = |v: &[(f64, f64, f64)], p: f64, e: f64| {
        if v.is_empty() {
            return 0.0;
        }
        let h = v.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
        let q = v.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
        h + (v.iter().map(|x| x.1).sum::<f64>() + e) / p + q
    };
    let aic = argmax(ranks, |r| {
        whole(&per[r][AIC], cores[AIC], extra[r][AIC]).max(work_bound(&mut per[r][AIC], cores[AIC], t0))
    });
    let aiv = argmax(ranks, |r| {
        whole(&per[r][AIV], cores[AIV], extra[r][AIV]).max(work_bound(&mut per[r][AIV], cores[AIV], t0))
    });
    drop(per);
    // HBM: must-miss reads per task, and the least read share of every input block that fits.
    let mut jobs: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); ranks];
    let mut hbm_bytes = vec![0.0f64; ranks];
    for t in 0..n {
        if du.must_miss[t] > 0.0 {
            let r = rank[t] as usize;
            jobs[r].push((head[t], du.must_miss[t] / m.hbm_bandwidth, after_end(t)));
            hbm_bytes[r] += du.must_miss[t];
        }
    }
    for &(h, bytes, q, r) in first.iter() {
        if bytes.is_finite() && bytes > 0.0 && r != NONE && r != MIXED {
            let r = r as usize;
            jobs[r].push((h, bytes / m.hbm_bandwidth, q));
            hbm_bytes[r] += bytes;
        }
    }
    let hbm = argmax(ranks, |r| work_bound(&mut jobs[r], 1.0, t0));
    drop(jobs);
    let (link, link_res, arrival, arrival_res) = link_bounds(w, m, rank, du, &head, &tail);
    let dpn = m.topology.dies_per_node;
    let b = Bounds {
        aic_work: aic.0,
        aiv_work: aiv.0,
        hbm: hbm.0,
        link,
        arrival,
        critical_path: critical,
        ranks: [
            aic.1 as u32,
            aiv.1 as u32,
            hbm.1 as u32,
            link_res.rank(dpn).unwrap_or(0),
            arrival_res.rank(dpn).unwrap_or(0),
        ],
        link_resource: link_res,
        arrival_resource: arrival_res,
        hbm_bytes: hbm_bytes[hbm.1],
    };
    (b, chain)
}

/// The link and arrival bounds, and the resource reaching each.
fn link_bounds(
    w: &Workload,
    m: &DeviceModel,
    rank: &[u32],
    du: &Durations,
    head: &[f64],
    tail: &[f64],
) -> (f64, LinkResource, f64, LinkResource) {
    use crate::model::link::Tier;
    let topo = &m.topology;
    let r = topo.ranks.max(w.ranks) as usize;
    let dpn = topo.dies_per_node.max(1);
    let nodes = r.div_ceil(dpn as usize);
    let cross_port = topo.cross_port_bandwidth < topo.port_bandwidth;
    let uplinks = topo.uplink_ratio < 1.0;
    let up = dpn as f64 * topo.cross_port_bandwidth.min(topo.port_bandwidth) * topo.uplink_ratio;
    // Resources: ports out, in; cross ports out, in; uplinks, downlinks; put slots; then
    // pairs in order of first use. Jobs: (release, bytes or seconds, landing, after end).
    let slots_at = 4 * r + 2 * nodes;
    let fixed = slots_at + r;
    let mut jobs: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); fixed + w.pairs.len()];
    let mut setups = vec![0u32; r];
    let mut seen = vec![false; w.contacts as usize];
    for f in 0..w.flows() {
        let t = w.flow_task[f] as usize;
        let (s, d) = (rank[t], w.flow_dst[f]);
        let b = w.flow_bytes[f];
        let rel = head[t] + du.release[t];
        let land = topo.latency(s, d);
        let end = m.task_overhead + tail[t];
        let (su, dd) = (s as usize, d as usize);
        let mut add = |k: usize, x: f64| jobs[k].push((rel, x, land, end));
        add(fixed + w.flow_pair[f] as usize, b);
        match topo.tier(s, d) {
            Tier::Package => {}
            tier => {
                add(su, b);
                add(r + dd, b);
                if tier == Tier::Cross {
                    if cross_port {
                        add(2 * r + su, b);
                        add(3 * r + dd, b);
                    }
                    if uplinks {
                        add(4 * r + su / dpn as usize, b);
                        add(4 * r + nodes + dd / dpn as usize, b);
                    }
                }
            }
        }
        // A put slot is held from the descriptor, before the put overhead.
        let slot = topo.put_overhead + b / topo.pair_cap(s, d);
        jobs[slots_at + su].push((rel - topo.put_overhead, slot, land, end));
        let c = w.flow_contact[f] as usize;
        if !seen[c] {
            seen[c] = true;
            setups[su] += 1;
        }
    }
    let resource = |k: usize| -> (LinkResource, f64, f64) {
        // (name, rate or servers, whether seconds)
        if k < r {
            (LinkResource::PortOut(k as u32), topo.port_bandwidth, 0.0)
        } else if k < 2 * r {
            (LinkResource::PortIn((k - r) as u32), topo.port_bandwidth, 0.0)
        } else if k < 3 * r {
            (
                LinkResource::CrossOut((k - 2 * r) as u32),
                topo.cross_port_bandwidth,
                0.0,
            )
        } else if k < 4 * r {
            (
                LinkResource::CrossIn((k - 3 * r) as u32),
                topo.cross_port_bandwidth,
                0.0,
            )
        } else if k < 4 * r + nodes {
            (LinkResource::UplinkOut((k - 4 * r) as u32), up, 0.0)
        } else if k < slots_at {
            (LinkResource::UplinkIn((k - 4 * r - nodes) as u32), up, 0.0)
        } else if k < fixed {
            let rk = (k - slots_at) as u32;
            (LinkResource::PutSlots(rk), f64::from(topo.die_puts.max(1)), 1.0)
        } else {
            let (s, d) = w.pairs[k - fixed];
            (LinkResource::Pair(s, d), topo.pair_cap(s, d), 0.0)
        }
    };
    let mut best = [(0.0f64, LinkResource::None), (0.0f64, LinkResource::None)];
    let mut v: Vec<(f64, f64, f64)> = Vec::new();
    for (k, js) in jobs.iter().enumerate() {
        if js.is_empty() {
            continue;
        }
        let (name, rate, seconds) = resource(k);
        let (per, p) = if seconds > 0.0 { (1.0, rate) } else { (1.0 / rate, 1.0) };
        for (i, with_tail) in [false, true].into_iter().enumerate() {
            v.clear();
            v.extend(
                js.iter()
                    .map(|&(h, x, land, end)| (h, x * per, if with_tail { land.max(end) } else { land })),
            );
            let start = v.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
            let mut b = work_bound(&mut v, p, start);
            if let LinkResource::PutSlots(rk) = name {
                // Every contact's first put also holds its slot for the peer setup.
                let min_q = v.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
                let work: f64 = v.iter().map(|x| x.1).sum::<f64>() + f64::from(setups[rk as usize]) * topo.peer_setup;
                b = b.max(start + work / p + min_q);
            }
            if b > best[i].0 {
                best[i] = (b, name);
            }
        }
    }
    (best[0].0, best[0].1, best[1].0, best[1].1)
}

/// Whether the bounds walk the reads of every block (tests compare that with the walk of
/// the counted blocks' range only).
#[cfg(not(test))]
fn walk_all() -> bool {
    false
}

#[cfg(test)]
thread_local! {
    static WALK_ALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn walk_all() -> bool {
    WALK_ALL.with(std::cell::Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The durations are the same, to the bit, on one thread and on several; the bounds are
    /// the same whether they walk the reads of every block or only those within the range of
    /// the blocks they count. On examples whose weight-gradient tasks read many blocks, under
    /// both policies.
    #[test]
    fn durations_and_bounds_do_not_depend_on_threads_or_the_walk() {
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a pool");
        let (one, three) = (pool(1), pool(3));
        let mut tasks = 0;
        let examples: &[(&str, &[&str])] = &[
            ("deepseek_v3_ep8_bwd.hpm", &["ranks=16"]),
            ("deepseek_v3_train_layer.hpm", &[]),
        ];
        crate::testing::each_compiled(examples, |file, p, tf, c, model, policy| {
            let w = Workload::new(p, tf, &c.graph, &c.schedule, model);
            let rank = &c.graph.rank;
            let bits = |d: &Durations| -> Vec<[u64; 5]> {
                (0..d.d.len())
                    .map(|t| [d.d[t], d.release[t], d.landing[t], d.must_miss[t], d.slack[t]].map(f64::to_bits))
                    .collect()
            };
            let a = one.install(|| durations(&w, model, rank));
            let b = three.install(|| durations(&w, model, rank));
            assert_eq!(a.d.len(), w.tasks());
            assert!(bits(&a) == bits(&b), "{file} {} {policy:?}: durations differ", tf.name);
            let ranged = bounds_and_chains_with(&w, &c.schedule, model, rank, true, &a);
            WALK_ALL.with(|x| x.set(true));
            let whole = bounds_and_chains_with(&w, &c.schedule, model, rank, true, &a);
            WALK_ALL.with(|x| x.set(false));
            assert_eq!(ranged.0, whole.0, "{file} {} {policy:?}: bounds differ", tf.name);
            let chain_bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(chain_bits(&ranged.1) == chain_bits(&whole.1));
            tasks += w.tasks();
        });
        assert!(tasks > 100_000, "only {tasks} tasks compared");
    }

    #[test]
    fn work_bound_of_released_tasks() {
        // Two cores. Four tasks of 1 s with no head or tail: 2 s. One of them may start
        // only at 3 s: it ends at 4 s at the earliest, and the set {it} gives 3 + 1/2 = 3.5.
        // Three tasks with head 3 give 3 + 3/2 = 4.5.
        let mut v = vec![(0.0, 1.0, 0.0); 4];
        assert_eq!(work_bound(&mut v, 2.0, 0.0), 2.0);
        let mut v = vec![(0.0, 1.0, 0.0), (0.0, 1.0, 0.0), (0.0, 1.0, 0.0), (3.0, 1.0, 0.0)];
        assert_eq!(work_bound(&mut v, 2.0, 0.0), 3.5);
        let mut v = vec![(0.0, 1.0, 0.0), (3.0, 1.0, 0.0), (3.0, 1.0, 0.0), (3.0, 1.0, 0.0)];
        assert_eq!(work_bound(&mut v, 2.0, 0.0), 4.5);
        // Tails: two tasks of 2 s on one core, each followed by 1 s: 2 + 2 + 1 = 5.
        let mut v = vec![(0.0, 2.0, 1.0), (0.0, 2.0, 1.0)];
        assert_eq!(work_bound(&mut v, 1.0, 0.0), 5.0);
        // Heads and tails at once: a task released at 1 s with a 2 s tail on its own core.
        let mut v = vec![(1.0, 1.0, 2.0)];
        assert_eq!(work_bound(&mut v, 1.0, 0.0), 4.0);
    }

    #[test]
    fn resources_are_named() {
        assert_eq!(LinkResource::PortIn(3).to_string(), "port in of rank 3");
        assert_eq!(LinkResource::Pair(0, 1).to_string(), "link 0->1");
        assert_eq!(LinkResource::UplinkOut(1).rank(8), Some(8));
        assert_eq!(LinkResource::None.rank(8), None);
    }
}
