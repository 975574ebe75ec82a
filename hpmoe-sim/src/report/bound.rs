//! Lower bounds on the latency of a workload under any schedule of its task graph: a
//! workload, its schedule's counters, the device model in; [`Bounds`] out, each bound with the
//! rank that reaches it.
//!
//! Every task has a shortest duration `d` (`Workload::min_duration`: all reads at the faster
//! of the L2 and HBM rates, no contention, its link part alone, plus the task overhead), a
//! head `h` (the earliest it can start: the longest chain of shortest durations, signal
//! latencies and kernel launches before it, from the first launch) and a tail `q` (the
//! least time from its end to the end of the layer: the longest chain after it, and for a put
//! the time its last data takes to land, `link_latency - task_overhead`). Then:
//!
//! - **work** (per rank and engine, at `P` cores): any set `S` of the rank's tasks of the
//!   engine needs `W(S)/P` of core time after the earliest head in `S`, and the last of them
//!   to end is followed by at least the least tail in `S`: `min h + W(S)/P + min q`. Taken
//!   over the sets of the tasks with the largest heads (and, separately, the largest tails),
//!   which includes the whole rank: `start + W/P`;
//! - **hbm** (per rank): the compulsory misses, every taskflow-input block read once, over
//!   the die's HBM bandwidth, after the first launch (write-backs share the bandwidth but may
//!   finish after the layer, so they do not count);
//! - **link** (per rank): the bytes it sends over its egress rate and those it receives over
//!   its ingress rate (`DeviceModel`), after the earliest head of a put that uses the link,
//!   and followed by the landing latency of the last byte;
//! - **critical path**: the largest `h + d + q`.
//!
//! The bound is the largest of them; its kind names which binds.

use crate::model::{DeviceModel, AIC, AIV};
use crate::sim::Workload;
use hpmoe_dsl::schedule::Schedule;

/// The lower bounds, in seconds, and the rank that reaches each per-rank bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounds {
    pub aic_work: f64,
    pub aiv_work: f64,
    pub hbm: f64,
    pub link: f64,
    pub critical_path: f64,
    /// The rank of the AIC work, AIV work, HBM and link bounds.
    pub ranks: [u32; 4],
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
}

/// Heads and tails of every task (see the module doc). Tasks on a dependency cycle (never
/// ready) keep the first launch as head and no tail.
pub fn heads_tails(w: &Workload, s: &Schedule, m: &DeviceModel, rank: &[u32]) -> (Vec<f64>, Vec<f64>) {
    let n = w.tasks();
    let counters = s.threshold.len();
    let mut indeg: Vec<u32> = (0..n)
        .map(|t| s.waits.row(t).iter().filter(|&&c| s.threshold[c as usize] > 0).count() as u32)
        .collect();
    let lat = |t: usize, c: usize| {
        if s.counter_rank[c] == rank[t] {
            m.event_latency
        } else {
            m.link_latency
        }
    };
    let mut head = vec![w.start_time; n];
    let mut ready = vec![0.0f64; counters];
    let mut count = vec![0u32; counters];
    let mut stack: Vec<u32> = (0..n as u32).filter(|&t| indeg[t as usize] == 0).collect();
    stack.reverse();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    while let Some(t) = stack.pop() {
        order.push(t);
        let t = t as usize;
        let fin = head[t] + w.min_duration[t];
        for &c in s.signals.row(t) {
            let c = c as usize;
            ready[c] = ready[c].max(fin + lat(t, c));
            count[c] += 1;
            if count[c] == s.threshold[c] {
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
        }
    }
    // Tails, in reverse of that order: every waiter of a counter a task signals comes later.
    let land = (m.link_latency - m.task_overhead).max(0.0);
    let mut tail = vec![0.0f64; n];
    let mut after = vec![f64::NAN; counters];
    for &t in order.iter().rev() {
        let t = t as usize;
        let mut q = if w.task_flows(t).is_empty() { 0.0 } else { land };
        for &c in s.signals.row(t) {
            let c = c as usize;
            if after[c].is_nan() {
                after[c] = w
                    .waiters
                    .row(c)
                    .iter()
                    .map(|&x| w.min_duration[x as usize] + tail[x as usize])
                    .fold(0.0, f64::max);
            }
            if !w.waiters.row(c).is_empty() {
                q = q.max(lat(t, c) + w.delay[c] + after[c]);
            }
        }
        tail[t] = q;
    }
    (head, tail)
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

/// The lower bounds of a workload (task ranks `rank`).
pub fn bounds(w: &Workload, s: &Schedule, m: &DeviceModel, rank: &[u32]) -> Bounds {
    let ranks = w.ranks as usize;
    let n = w.tasks();
    let (head, tail) = heads_tails(w, s, m, rank);
    let mut per: Vec<[Vec<(f64, f64, f64)>; 2]> = (0..ranks).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut sent = vec![0.0f64; ranks];
    let mut recv = vec![0.0f64; ranks];
    let mut out_from = vec![f64::INFINITY; ranks];
    let mut in_from = vec![f64::INFINITY; ranks];
    let mut critical = w.start_time;
    for t in 0..n {
        let r = rank[t] as usize;
        let d = w.min_duration[t];
        per[r][w.class[t] as usize].push((head[t], d, tail[t]));
        critical = critical.max(head[t] + d + tail[t]);
        for f in w.task_flows(t) {
            let dst = w.flow_dst[f] as usize;
            sent[r] += w.flow_bytes[f];
            recv[dst] += w.flow_bytes[f];
            out_from[r] = out_from[r].min(head[t]);
            in_from[dst] = in_from[dst].min(head[t]);
        }
    }
    let t0 = w.start_time;
    let compulsory = w.compulsory_bytes();
    let argmax = |f: &mut dyn FnMut(usize) -> f64| {
        (0..ranks).fold((0.0f64, 0u32), |a, r| {
            let v = f(r);
            if v > a.0 {
                (v, r as u32)
            } else {
                a
            }
        })
    };
    let cores = [m.aic_cores as f64, m.aiv_cores as f64];
    let aic = argmax(&mut |r| work_bound(&mut per[r][AIC], cores[AIC], t0));
    let aiv = argmax(&mut |r| work_bound(&mut per[r][AIV], cores[AIV], t0));
    let hbm = argmax(&mut |r| {
        if compulsory[r] > 0.0 {
            t0 + compulsory[r] / m.hbm_bandwidth
        } else {
            0.0
        }
    });
    let land = m.link_latency;
    let link = argmax(&mut |r| {
        let out = if sent[r] > 0.0 {
            out_from[r] + sent[r] / m.link_egress + land
        } else {
            0.0
        };
        let inn = if recv[r] > 0.0 {
            in_from[r] + recv[r] / m.link_ingress + land
        } else {
            0.0
        };
        out.max(inn)
    });
    Bounds {
        aic_work: aic.0,
        aiv_work: aiv.0,
        hbm: hbm.0,
        link: link.0,
        critical_path: critical,
        ranks: [aic.1, aiv.1, hbm.1, link.1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
