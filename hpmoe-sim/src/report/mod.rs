//! Reports: a simulated schedule ([`SimResult`]) with its workload, schedule and device model
//! in; a [`Report`] out, printed as readable tables ([`Report::human`]) or JSON
//! ([`Report::json`], schema in `docs/FORMATS.md`), and the [`Comparison`] of two policies.
//!
//! What is measured (times in seconds internally, microseconds in the output):
//! - Dispatch-to-Combine latency: per rank, when its last task ended or its last incoming data
//!   landed; the layer's latency is the maximum over ranks (the simulation starts at 0, the
//!   first kernel launch included);
//! - per op call (phase): first start, last end, active time (the union over every rank of
//!   the intervals in which one of its tasks runs), busy core-time;
//! - per engine: busy fraction (core-time over cores x ranks x latency), cube MAC
//!   utilisation (cube FLOPs over the peak), link busy fraction and utilisation, HBM
//!   utilisation;
//! - per rank: communication time (a put of the rank runs), exposed communication (a put
//!   runs and no compute task does), vector-only time (vector compute runs, no cube task);
//! - L2 hit rate (bytes read from L2 over bytes read);
//! - the lower bound (`bound.rs`): the largest of per-rank engine work over its cores
//!   (each task at its shortest, after the earliest start and before the least remaining
//!   path of the tasks it counts), HBM traffic no schedule serves from L2 (every input
//!   region read once, every read of a block larger than L2) over HBM bandwidth, the flows
//!   through each fabric resource (ports, links, cross ports, uplinks, put slots) at its
//!   rate, the same followed by the work that waits for the data (data arrival), and the
//!   critical path (shortest durations plus signal latencies and kernel launches), with the
//!   rank or resource that binds; efficiency = bound / latency.

mod bound;

pub use bound::{
    bounds, bounds_and_chains, bounds_and_chains_with, durations, heads_tails, kernel_bound, kernel_bound_with,
    work_bound, Bounds, Durations, LinkResource,
};

pub mod comm;

use crate::model::{DeviceModel, AIC, AIV};
use crate::sim::{LinkPacing, SimResult, Workload};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::lower::TaskGraph;
use hpmoe_dsl::schedule::Schedule;
use serde_json::{json, Value as J};
use std::fmt::Write;

/// One op call.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub call: String,
    pub op: String,
    pub engine: &'static str,
    pub comm: bool,
    pub tasks: u64,
    pub first_start: f64,
    pub last_end: f64,
    /// Union over ranks of the intervals in which a task of the call runs.
    pub active: f64,
    /// Sum of task durations (core-seconds).
    pub busy: f64,
}

/// One rank.
#[derive(Clone, Debug, PartialEq)]
pub struct RankStats {
    pub latency: f64,
    pub aic_busy: f64,
    pub aiv_busy: f64,
    pub sent: f64,
    pub received: f64,
    /// Time a put of this rank runs.
    pub comm: f64,
    /// Time a put runs and no compute task does.
    pub exposed: f64,
    /// Time vector compute runs and no cube task does.
    pub vector_only: f64,
    /// Time a cube task runs.
    pub cube_active: f64,
}

/// Everything measured on one simulated schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub taskflow: String,
    pub policy: String,
    pub options: Vec<(String, String)>,
    pub ranks: u32,
    pub aic_cores: u32,
    pub aiv_cores: u32,
    /// Vector cores with work on the busiest rank.
    pub aiv_used: u32,
    pub tasks: usize,
    pub events: u64,
    /// Whether the link rates were re-shared at intervals (the solves' budget was passed).
    pub link_pacing: Option<LinkPacing>,
    pub latency: f64,
    pub rank_latency: Vec<f64>,
    pub bounds: Bounds,
    pub bound: f64,
    pub bound_kind: &'static str,
    pub efficiency: f64,
    pub aic_busy: f64,
    pub aiv_busy: f64,
    pub cube_mac_utilisation: f64,
    pub link_busy: f64,
    pub link_utilisation: f64,
    pub hbm_utilisation: f64,
    pub l2_hit_bytes: f64,
    pub l2_miss_bytes: f64,
    pub hbm_bytes: f64,
    pub writeback_bytes: f64,
    pub remote_bytes: f64,
    pub phases: Vec<Phase>,
    pub per_rank: Vec<RankStats>,
    /// Communication per phase and hot-rank figures.
    pub comm: comm::CommReport,
}

/// The speedup of one policy over another on a taskflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub taskflow: String,
    pub base: String,
    pub other: String,
    pub base_latency: f64,
    pub other_latency: f64,
}

impl Comparison {
    pub fn new(base: &Report, other: &Report) -> Comparison {
        Comparison {
            taskflow: base.taskflow.clone(),
            base: base.policy.clone(),
            other: other.policy.clone(),
            base_latency: base.latency,
            other_latency: other.latency,
        }
    }
    /// How many times faster `other` is than `base`.
    pub fn speedup(&self) -> f64 {
        if self.other_latency > 0.0 {
            self.base_latency / self.other_latency
        } else {
            0.0
        }
    }
    pub fn human(&self) -> String {
        format!(
            "speedup of {} over {} on {}: {:.3}x ({:.1} us -> {:.1} us)\n",
            self.other,
            self.base,
            self.taskflow,
            self.speedup(),
            self.base_latency * 1e6,
            self.other_latency * 1e6
        )
    }
    pub fn json(&self) -> J {
        json!({
            "taskflow": self.taskflow,
            "base": self.base,
            "other": self.other,
            "base_latency_us": self.base_latency * 1e6,
            "other_latency_us": self.other_latency * 1e6,
            "speedup": self.speedup(),
        })
    }
}

/// A key whose integer order is `f64::total_cmp`'s order.
fn order_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

/// Total length of the union of intervals (sorted in place by start).
fn union_length(iv: &mut [(f64, f64)]) -> f64 {
    // Equal keys are equal intervals, so an unstable sort gives the same union.
    iv.sort_unstable_by_key(|&(a, b)| (order_key(a), order_key(b)));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for &(a, b) in iv.iter() {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    if let Some((a, b)) = cur {
        total += b - a;
    }
    total
}

/// Policy options in words.
fn options(s: &Schedule, aiv_used: u32) -> Vec<(String, String)> {
    let p = &s.policy;
    let mut o = Vec::new();
    if p.policy == hpmoe_dsl::schedule::Policy::Interleaved {
        o.push(("priority".into(), p.priority.name().into()));
        if p.candidates {
            o.push(("schedule".into(), s.origin.into()));
        }
    }
    o.push(("ratr".into(), p.ratr.to_string()));
    o.push(("static_capacity".into(), p.static_capacity.to_string()));
    o.push(("aiv_cores_used".into(), aiv_used.to_string()));
    if p.policy == hpmoe_dsl::schedule::Policy::KernelByKernel {
        o.push(("launch_overhead".into(), p.launch_overhead.to_string()));
        o.push(("alltoall".into(), p.alltoall.name().into()));
    }
    o
}

impl Report {
    /// Measures a simulated schedule.
    pub fn new(
        program: &Program,
        tf: &Taskflow,
        g: &TaskGraph,
        s: &Schedule,
        w: &Workload,
        m: &DeviceModel,
        r: &SimResult,
    ) -> Report {
        let n = w.tasks();
        let ranks = w.ranks as usize;
        let makespan = r.makespan.max(f64::MIN_POSITIVE);
        let cpr = s.cores_per_rank();
        let aiv_used = (0..ranks as u32)
            .map(|rk| {
                (s.aic_cores..cpr)
                    .filter(|&l| !s.queues.row((rk * cpr + l) as usize).is_empty())
                    .count() as u32
            })
            .max()
            .unwrap_or(0);
        // Engines.
        let mut busy = [0.0f64; 2];
        let mut rank_busy = vec![[0.0f64; 2]; ranks];
        let mut cube_flops = 0.0;
        let (mut hit, mut miss) = (0.0f64, 0.0f64);
        for t in 0..n {
            let d = r.end[t] - r.start[t];
            let c = w.class[t] as usize;
            busy[c] += d;
            rank_busy[g.rank[t] as usize][c] += d;
            if c == AIC {
                cube_flops += w.compute[t] * m.cube_flops;
            }
            hit += r.hit[t] as f64;
            miss += r.miss[t] as f64;
        }
        let rk = ranks as f64;
        // Phases.
        let mut phases = Vec::with_capacity(tf.nodes.len());
        let mut by_node: Vec<Vec<(f64, f64)>> = vec![Vec::new(); tf.nodes.len()];
        for t in 0..n {
            by_node[g.node[t] as usize].push((r.start[t], r.end[t]));
        }
        for (ni, node) in tf.nodes.iter().enumerate() {
            let iv = &mut by_node[ni];
            let first = iv.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
            let last = iv.iter().map(|x| x.1).fold(0.0, f64::max);
            let busy: f64 = iv.iter().map(|x| x.1 - x.0).sum();
            let tasks = iv.len() as u64;
            phases.push(Phase {
                call: node.name.clone(),
                op: program.op(node.op).name.clone(),
                engine: node.engine.name(),
                comm: w.node_comm[ni],
                tasks,
                first_start: if tasks > 0 { first } else { 0.0 },
                last_end: last,
                active: union_length(iv),
                busy,
            });
        }
        // Per rank sweeps: +1/-1 per category (0 cube, 1 vector compute, 2 communication),
        // bucketed by rank, then ordered by (time, ends before starts). Events that tie on both
        // are a zero-length step, so their order does not change the sums.
        let mut first = vec![0usize; ranks + 1];
        for t in 0..n {
            first[g.rank[t] as usize + 1] += 2;
        }
        for i in 0..ranks {
            first[i + 1] += first[i];
        }
        let mut fill = first.clone();
        let mut evs: Vec<(u32, f64, i8, u8)> = vec![(0, 0.0, 0, 0); 2 * n];
        for t in 0..n {
            let rank = g.rank[t];
            let cat = if w.node_comm[g.node[t] as usize] { 2 } else { w.class[t] };
            let at = &mut fill[rank as usize];
            evs[*at] = (rank, r.start[t], 1, cat);
            evs[*at + 1] = (rank, r.end[t], -1, cat);
            *at += 2;
        }
        for i in 0..ranks {
            evs[first[i]..first[i + 1]].sort_unstable_by_key(|e| (order_key(e.1), e.2));
        }
        let mut per_rank: Vec<RankStats> = (0..ranks)
            .map(|i| RankStats {
                latency: r.rank_done[i],
                aic_busy: rank_busy[i][AIC] / (m.aic_cores as f64 * makespan),
                aiv_busy: rank_busy[i][AIV] / (m.aiv_cores as f64 * makespan),
                sent: r.sent[i],
                received: r.received[i],
                comm: 0.0,
                exposed: 0.0,
                vector_only: 0.0,
                cube_active: 0.0,
            })
            .collect();
        let mut i = 0;
        while i < evs.len() {
            let rank = evs[i].0;
            let mut cnt = [0i64; 3];
            let mut prev = evs[i].1;
            let st = &mut per_rank[rank as usize];
            while i < evs.len() && evs[i].0 == rank {
                let (_, time, delta, cat) = evs[i];
                let dt = time - prev;
                if dt > 0.0 {
                    if cnt[2] > 0 {
                        st.comm += dt;
                        if cnt[0] == 0 && cnt[1] == 0 {
                            st.exposed += dt;
                        }
                    }
                    if cnt[1] > 0 && cnt[0] == 0 {
                        st.vector_only += dt;
                    }
                    if cnt[0] > 0 {
                        st.cube_active += dt;
                    }
                }
                cnt[cat as usize] += delta as i64;
                prev = time;
                i += 1;
            }
        }
        let bounds = bounds(w, s, m, &g.rank);
        let (bound, bound_kind) = bounds.max();
        let sent: f64 = r.sent.iter().sum();
        let hbm_bytes: f64 = r.hbm_bytes.iter().sum();
        let hbm_layer: f64 = r.hbm_layer_bytes.iter().sum();
        let busy_out: f64 = r.busy_out.iter().sum();
        Report {
            taskflow: tf.name.clone(),
            policy: s.policy.policy.name().to_string(),
            options: options(s, aiv_used),
            ranks: w.ranks,
            aic_cores: m.aic_cores,
            aiv_cores: m.aiv_cores,
            aiv_used,
            tasks: n,
            events: r.events,
            link_pacing: r.link_pacing,
            latency: r.makespan,
            rank_latency: r.rank_done.clone(),
            bounds,
            bound,
            bound_kind,
            efficiency: bound / makespan,
            aic_busy: busy[AIC] / (m.aic_cores as f64 * rk * makespan),
            aiv_busy: busy[AIV] / (m.aiv_cores as f64 * rk * makespan),
            cube_mac_utilisation: cube_flops / (m.cube_peak * m.aic_cores as f64 * rk * makespan),
            link_busy: busy_out / (rk * makespan),
            link_utilisation: sent / (m.link_egress * rk * makespan),
            hbm_utilisation: hbm_layer / (m.hbm_bandwidth * rk * makespan),
            l2_hit_bytes: hit,
            l2_miss_bytes: miss,
            hbm_bytes,
            writeback_bytes: r.hbm_writeback.iter().sum(),
            remote_bytes: sent,
            phases,
            per_rank,
            comm: comm::CommReport::new(program, tf, g, w, m, r),
        }
    }

    fn mean(&self, f: impl Fn(&RankStats) -> f64) -> f64 {
        self.per_rank.iter().map(f).sum::<f64>() / self.per_rank.len().max(1) as f64
    }

    /// Mean over ranks of communication time, exposed communication and vector-only time.
    pub fn comm_mean(&self) -> f64 {
        self.mean(|r| r.comm)
    }
    pub fn exposed_mean(&self) -> f64 {
        self.mean(|r| r.exposed)
    }
    pub fn vector_only_mean(&self) -> f64 {
        self.mean(|r| r.vector_only)
    }
    pub fn l2_hit_rate(&self) -> f64 {
        let all = self.l2_hit_bytes + self.l2_miss_bytes;
        if all > 0.0 {
            self.l2_hit_bytes / all
        } else {
            0.0
        }
    }
    fn share(&self, x: f64) -> f64 {
        if self.latency > 0.0 {
            x / self.latency
        } else {
            0.0
        }
    }

    /// Readable tables.
    pub fn human(&self) -> String {
        let us = 1e6;
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let gb = |x: f64| x / 1e9;
        let mut o = String::new();
        let opts: Vec<String> = self.options.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            o,
            "{} under {} ({}): {} ranks x ({} AIC + {} AIV), {} tasks",
            self.taskflow,
            self.policy,
            opts.join(", "),
            self.ranks,
            self.aic_cores,
            self.aiv_cores,
            self.tasks
        );
        let lat = &self.rank_latency;
        let lmin = lat.iter().copied().fold(f64::INFINITY, f64::min);
        let lmean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
        let _ = writeln!(
            o,
            "  Dispatch-to-Combine latency  {:>10.1} us  (max over ranks; min {:.1}, mean {:.1})",
            self.latency * us,
            lmin * us,
            lmean * us
        );
        if let Some(p) = &self.link_pacing {
            let _ = writeln!(o, "  note: {}", pacing_note(p));
        }
        let _ = writeln!(
            o,
            "  lower bound                  {:>10.1} us  ({}{}); efficiency {}",
            self.bound * us,
            self.bound_kind,
            match (self.bounds.binding_resource(), self.bounds.binding().1) {
                (Some(res), _) => format!(" on {res}"),
                (None, Some(r)) => format!(" of rank {r}"),
                (None, None) => String::new(),
            },
            pct(self.efficiency)
        );
        let b = &self.bounds;
        let _ = writeln!(
            o,
            "    bounds (us): aic work {:.1} (rank {}) | aiv work {:.1} (rank {}) | hbm {:.1} (rank {}, {}) | links {:.1} ({}) | data arrival {:.1} ({}) | critical path {:.1}",
            b.aic_work * us,
            b.ranks[0],
            b.aiv_work * us,
            b.ranks[1],
            b.hbm * us,
            b.ranks[2],
            bytes(b.hbm_bytes),
            b.link * us,
            b.link_resource,
            b.arrival * us,
            b.arrival_resource,
            b.critical_path * us
        );
        let _ = writeln!(
            o,
            "  engines: AIC busy {} (cube MAC utilisation {}) | AIV busy {} | links busy {} (utilisation {}) | HBM utilisation {}",
            pct(self.aic_busy),
            pct(self.cube_mac_utilisation),
            pct(self.aiv_busy),
            pct(self.link_busy),
            pct(self.link_utilisation),
            pct(self.hbm_utilisation)
        );
        let _ = writeln!(
            o,
            "  memory: L2 hit rate {} ({:.2} GB from L2, {:.2} GB from HBM); HBM moved {:.2} GB ({:.2} GB write-back); {:.2} GB put to other ranks",
            pct(self.l2_hit_rate()),
            gb(self.l2_hit_bytes),
            gb(self.l2_miss_bytes),
            gb(self.hbm_bytes),
            gb(self.writeback_bytes),
            gb(self.remote_bytes)
        );
        let comm = self.comm_mean();
        let exposed = self.exposed_mean();
        let _ = writeln!(
            o,
            "  communication (mean per rank): active {:.1} us ({} of latency), exposed {:.1} us ({} of latency, {} of communication); vector-only {:.1} us ({})",
            comm * us,
            pct(self.share(comm)),
            exposed * us,
            pct(self.share(exposed)),
            pct(if comm > 0.0 { exposed / comm } else { 0.0 }),
            self.vector_only_mean() * us,
            pct(self.share(self.vector_only_mean()))
        );
        let _ = writeln!(o, "  phases (op calls):");
        let _ = writeln!(
            o,
            "    {:<12} {:<14} {:<6} {:>8} {:>11} {:>11} {:>11} {:>7} {:>12}",
            "call", "op", "engine", "tasks", "start us", "end us", "active us", "share", "busy core-us"
        );
        for p in &self.phases {
            let _ = writeln!(
                o,
                "    {:<12} {:<14} {:<6} {:>8} {:>11.1} {:>11.1} {:>11.1} {:>7} {:>12.0}",
                p.call,
                p.op,
                if p.comm { "comm" } else { p.engine },
                p.tasks,
                p.first_start * us,
                p.last_end * us,
                p.active * us,
                pct(self.share(p.active)),
                p.busy * us
            );
        }
        o.push_str(&self.comm.human());
        if self.per_rank.len() <= 16 {
            let _ = writeln!(o, "  per rank:");
            let _ = writeln!(
                o,
                "    {:>4} {:>11} {:>9} {:>9} {:>10} {:>11} {:>12} {:>9} {:>9}",
                "rank",
                "latency us",
                "AIC busy",
                "AIV busy",
                "comm us",
                "exposed us",
                "vec-only us",
                "sent MB",
                "recv MB"
            );
            for (i, r) in self.per_rank.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "    {:>4} {:>11.1} {:>9} {:>9} {:>10.1} {:>11.1} {:>12.1} {:>9.1} {:>9.1}",
                    i,
                    r.latency * us,
                    pct(r.aic_busy),
                    pct(r.aiv_busy),
                    r.comm * us,
                    r.exposed * us,
                    r.vector_only * us,
                    r.sent / 1e6,
                    r.received / 1e6
                );
            }
        } else {
            let _ = writeln!(o, "  per rank: {} ranks (see --format json)", self.per_rank.len());
        }
        o
    }

    /// The JSON form (schema in docs/FORMATS.md).
    pub fn json(&self) -> J {
        let us = 1e6;
        let b = &self.bounds;
        let opts: serde_json::Map<String, J> = self
            .options
            .iter()
            .map(|(k, v)| (k.clone(), J::String(v.clone())))
            .collect();
        let comm = self.comm_mean();
        let exposed = self.exposed_mean();
        let (comm_phases, hot_rank) = self.comm.json();
        json!({
            "taskflow": self.taskflow,
            "policy": self.policy,
            "options": opts,
            "ranks": self.ranks,
            "cores_per_rank": {"aic": self.aic_cores, "aiv": self.aiv_cores, "aiv_used": self.aiv_used},
            "tasks": self.tasks,
            "events": self.events,
            "link_pacing": self.link_pacing.map(|p| json!({
                "from_us": p.from * us,
                "first_interval_ns": p.first * 1e9,
                "last_interval_ns": p.last * 1e9,
                "exact_work": p.exact_work,
                "projected_work": p.projected_work,
            })),
            "latency_us": self.latency * us,
            "rank_latency_us": self.rank_latency.iter().map(|x| x * us).collect::<Vec<_>>(),
            "lower_bound_us": self.bound * us,
            "bound_kind": self.bound_kind,
            "bounds_us": {
                "aic_work": b.aic_work * us,
                "aiv_work": b.aiv_work * us,
                "hbm": b.hbm * us,
                "link": b.link * us,
                "arrival": b.arrival * us,
                "critical_path": b.critical_path * us,
            },
            "bound_ranks": {
                "aic_work": b.ranks[0],
                "aiv_work": b.ranks[1],
                "hbm": b.ranks[2],
                "link": b.ranks[3],
                "arrival": b.ranks[4],
            },
            "bound_link_resource": b.link_resource.to_string(),
            "bound_arrival_resource": b.arrival_resource.to_string(),
            "bound_hbm_bytes": b.hbm_bytes,
            "efficiency": self.efficiency,
            "engines": {
                "aic_busy": self.aic_busy,
                "aiv_busy": self.aiv_busy,
                "cube_mac_utilisation": self.cube_mac_utilisation,
                "link_busy": self.link_busy,
                "link_utilisation": self.link_utilisation,
                "hbm_utilisation": self.hbm_utilisation,
            },
            "memory": {
                "l2_hit_rate": self.l2_hit_rate(),
                "l2_hit_bytes": self.l2_hit_bytes,
                "l2_miss_bytes": self.l2_miss_bytes,
                "hbm_bytes": self.hbm_bytes,
                "writeback_bytes": self.writeback_bytes,
                "remote_bytes": self.remote_bytes,
            },
            "communication": {
                "active_us": comm * us,
                "exposed_us": exposed * us,
                "active_share": self.share(comm),
                "exposed_share": self.share(exposed),
                "exposed_fraction": if comm > 0.0 { exposed / comm } else { 0.0 },
                "vector_only_us": self.vector_only_mean() * us,
                "vector_only_share": self.share(self.vector_only_mean()),
            },
            "phases": self.phases.iter().map(|p| json!({
                "call": p.call,
                "op": p.op,
                "engine": p.engine,
                "comm": p.comm,
                "tasks": p.tasks,
                "first_start_us": p.first_start * us,
                "last_end_us": p.last_end * us,
                "active_us": p.active * us,
                "share": self.share(p.active),
                "busy_core_us": p.busy * us,
            })).collect::<Vec<_>>(),
            "per_rank": self.per_rank.iter().enumerate().map(|(i, r)| json!({
                "rank": i,
                "latency_us": r.latency * us,
                "aic_busy": r.aic_busy,
                "aiv_busy": r.aiv_busy,
                "comm_us": r.comm * us,
                "exposed_us": r.exposed * us,
                "vector_only_us": r.vector_only * us,
                "cube_active_us": r.cube_active * us,
                "sent_bytes": r.sent,
                "received_bytes": r.received,
            })).collect::<Vec<_>>(),
            "comm_phases": comm_phases,
            "hot_rank": hot_rank,
        })
    }
}

/// What a paced link model means for the figures, in one sentence.
pub fn pacing_note(p: &LinkPacing) -> String {
    let interval = if p.first == p.last {
        format!("{:.0} ns", p.first * 1e9)
    } else {
        format!("{:.0}-{:.0} ns", p.first * 1e9, p.last * 1e9)
    };
    format!(
        "the link rates were re-shared every {interval} from {:.1} us on, not at every instant: solving them exactly was projected at {:.1e} units of work, over the budget of {:.1e} (`--exact-links` solves them all); each flow start or end reached the rates up to {:.0} ns late",
        p.from * 1e6,
        p.projected_work as f64,
        p.budget as f64,
        p.last * 1e9
    )
}

/// A byte count in the decimal unit that keeps three significant figures: `512 B`,
/// `4.19 MB`, `1.23 GB`.
fn bytes(x: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")];
    for (scale, unit) in UNITS {
        if x >= scale {
            let v = x / scale;
            let digits = if v >= 100.0 {
                0
            } else if v >= 10.0 {
                1
            } else {
                2
            };
            return format!("{v:.digits$} {unit}");
        }
    }
    format!("{x:.0} B")
}

#[cfg(test)]
mod bytes_tests {
    use super::bytes;

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(bytes(0.0), "0 B");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(4_194_304.0), "4.19 MB");
        assert_eq!(bytes(12_345_678.0), "12.3 MB");
        assert_eq!(bytes(340.9e9), "341 GB");
        assert_eq!(bytes(1.5e12), "1.50 TB");
    }
}
