//! Communication per phase and the busiest rank beside the means.
//!
//! A comm phase is one communicating op call (its output is a receive window or its op puts).
//! Its time runs from the first start of one of its tasks on any rank to the later of its
//! last task end and its last byte landing (a flow's end plus its path latency). Per rank:
//! the bytes it received from other ranks (`remote`), the bytes its own tasks of the call
//! wrote locally (`local`), and its achieved bandwidth, remote bytes received / phase time
//! (the figure all-to-all benchmarks publish as per-rank bandwidth); mean, min and max over
//! ranks.
//!
//! Hot rank: per-rank cube MAC utilisation, AIC and AIV busy fractions, bytes sent and
//! received, with the mean and the maximum (and which rank) side by side, since a skewed
//! routing leaves the mean far below the rank every other waits on.

use crate::model::{DeviceModel, AIC};
use crate::sim::{SimResult, Workload};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::lower::TaskGraph;
use serde_json::{json, Value as J};
use std::fmt::Write;

/// Mean, minimum and maximum over ranks, and the rank of the maximum (the first one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub max_rank: u32,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread {
                mean: 0.0,
                min: 0.0,
                max: 0.0,
                max_rank: 0,
            };
        }
        let mut max_rank = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[max_rank] {
                max_rank = i;
            }
        }
        Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v[max_rank],
            max_rank: max_rank as u32,
        }
    }

    fn json(&self, scale: f64) -> J {
        json!({
            "mean": self.mean * scale,
            "min": self.min * scale,
            "max": self.max * scale,
            "max_rank": self.max_rank,
        })
    }
}

/// One communicating op call.
#[derive(Clone, Debug, PartialEq)]
pub struct CommPhase {
    pub call: String,
    pub op: String,
    pub start: f64,
    pub end: f64,
    /// Puts (flows) and bytes of the call, in all.
    pub puts: u64,
    pub remote_bytes: f64,
    pub local_bytes: f64,
    /// Per rank: remote bytes received, local bytes written, remote bytes sent.
    pub received: Vec<f64>,
    pub local: Vec<f64>,
    pub sent: Vec<f64>,
}

impl CommPhase {
    pub fn time(&self) -> f64 {
        (self.end - self.start).max(0.0)
    }

    /// Per rank: remote bytes received / phase time (B/s).
    pub fn bandwidth(&self) -> Vec<f64> {
        let t = self.time();
        self.received
            .iter()
            .map(|&b| if t > 0.0 { b / t } else { 0.0 })
            .collect()
    }

    /// Mean bytes of one put.
    pub fn mean_put(&self) -> f64 {
        if self.puts > 0 {
            self.remote_bytes / self.puts as f64
        } else {
            0.0
        }
    }
}

/// Per-rank figures whose maximum matters beside the mean.
#[derive(Clone, Debug, PartialEq)]
pub struct HotRank {
    pub cube_mac_utilisation: Spread,
    pub aic_busy: Spread,
    pub aiv_busy: Spread,
    pub sent: Spread,
    pub received: Spread,
}

/// Communication phases and hot-rank figures of one simulated schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct CommReport {
    pub phases: Vec<CommPhase>,
    pub hot: HotRank,
}

impl CommReport {
    pub fn new(
        program: &Program,
        tf: &Taskflow,
        g: &TaskGraph,
        w: &Workload,
        m: &DeviceModel,
        r: &SimResult,
    ) -> CommReport {
        let ranks = w.ranks as usize;
        let n = w.tasks();
        let makespan = r.makespan.max(f64::MIN_POSITIVE);
        let mut index = vec![usize::MAX; tf.nodes.len()];
        let mut phases: Vec<CommPhase> = Vec::new();
        for (ni, node) in tf.nodes.iter().enumerate() {
            if w.node_comm[ni] {
                index[ni] = phases.len();
                phases.push(CommPhase {
                    call: node.name.clone(),
                    op: program.op(node.op).name.clone(),
                    start: f64::INFINITY,
                    end: 0.0,
                    puts: 0,
                    remote_bytes: 0.0,
                    local_bytes: 0.0,
                    received: vec![0.0; ranks],
                    local: vec![0.0; ranks],
                    sent: vec![0.0; ranks],
                });
            }
        }
        let topo = &m.topology;
        let mut cube = vec![0.0f64; ranks];
        let mut busy = vec![[0.0f64; 2]; ranks];
        for t in 0..n {
            let rank = g.rank[t] as usize;
            let c = w.class[t] as usize;
            busy[rank][c] += r.end[t] - r.start[t];
            if c == AIC {
                cube[rank] += w.compute[t] * m.cube_flops;
            }
            let k = index[g.node[t] as usize];
            let Some(p) = phases.get_mut(k) else {
                continue;
            };
            p.start = p.start.min(r.start[t]);
            p.end = p.end.max(r.end[t]);
            p.local[rank] += w.local_out[t];
            p.local_bytes += w.local_out[t];
            for f in w.task_flows(t) {
                let d = w.flow_dst[f];
                let b = w.flow_bytes[f];
                p.puts += 1;
                p.remote_bytes += b;
                p.received[d as usize] += b;
                p.sent[rank] += b;
                let landed = r.flow_end[f] + topo.latency(rank as u32, d);
                if landed.is_finite() {
                    p.end = p.end.max(landed);
                }
            }
        }
        for p in &mut phases {
            if !p.start.is_finite() {
                p.start = 0.0;
            }
        }
        let per = |f: &dyn Fn(usize) -> f64| -> Vec<f64> { (0..ranks).map(f).collect() };
        let peak = m.cube_peak * m.aic_cores as f64 * makespan;
        let hot = HotRank {
            cube_mac_utilisation: Spread::of(&per(&|i| cube[i] / peak)),
            aic_busy: Spread::of(&per(&|i| busy[i][AIC] / (m.aic_cores as f64 * makespan))),
            aiv_busy: Spread::of(&per(&|i| busy[i][1] / (m.aiv_cores as f64 * makespan))),
            sent: Spread::of(&r.sent),
            received: Spread::of(&r.received),
        };
        CommReport { phases, hot }
    }

    /// The tables `hpmoe run` prints.
    pub fn human(&self) -> String {
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let mut o = String::new();
        let h = &self.hot;
        let _ = writeln!(
            o,
            "  hot rank (mean / max, rank): cube MAC utilisation {} / {} (rank {}) | AIC busy {} / {} (rank {}) | AIV busy {} / {} (rank {}) | received {:.1} / {:.1} MB (rank {})",
            pct(h.cube_mac_utilisation.mean),
            pct(h.cube_mac_utilisation.max),
            h.cube_mac_utilisation.max_rank,
            pct(h.aic_busy.mean),
            pct(h.aic_busy.max),
            h.aic_busy.max_rank,
            pct(h.aiv_busy.mean),
            pct(h.aiv_busy.max),
            h.aiv_busy.max_rank,
            h.received.mean / 1e6,
            h.received.max / 1e6,
            h.received.max_rank
        );
        if self.phases.is_empty() {
            return o;
        }
        let _ = writeln!(
            o,
            "  comm phases (achieved bandwidth = remote bytes received per rank / phase time):"
        );
        let _ = writeln!(
            o,
            "    {:<12} {:<14} {:>10} {:>8} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10}",
            "call", "op", "time us", "puts", "put KB", "remote MB", "local MB", "mean GB/s", "min GB/s", "max GB/s"
        );
        for p in &self.phases {
            let bw = Spread::of(&p.bandwidth());
            let _ = writeln!(
                o,
                "    {:<12} {:<14} {:>10.1} {:>8} {:>10.1} {:>11.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                p.call,
                p.op,
                p.time() * 1e6,
                p.puts,
                p.mean_put() / 1e3,
                p.remote_bytes / 1e6,
                p.local_bytes / 1e6,
                bw.mean / 1e9,
                bw.min / 1e9,
                bw.max / 1e9
            );
        }
        o
    }

    /// `comm_phases` and `hot_rank` of the JSON report (schema in docs/FORMATS.md).
    pub fn json(&self) -> (J, J) {
        let phases = self
            .phases
            .iter()
            .map(|p| {
                let bw = Spread::of(&p.bandwidth());
                json!({
                    "call": p.call,
                    "op": p.op,
                    "start_us": p.start * 1e6,
                    "end_us": p.end * 1e6,
                    "time_us": p.time() * 1e6,
                    "puts": p.puts,
                    "mean_put_bytes": p.mean_put(),
                    "remote_bytes": p.remote_bytes,
                    "local_bytes": p.local_bytes,
                    "bandwidth_gbps": bw.json(1e-9),
                    "per_rank": (0..p.received.len()).map(|i| json!({
                        "rank": i,
                        "received_bytes": p.received[i],
                        "sent_bytes": p.sent[i],
                        "local_bytes": p.local[i],
                        "bandwidth_gbps": p.bandwidth()[i] / 1e9,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect::<Vec<_>>();
        let h = &self.hot;
        let hot = json!({
            "cube_mac_utilisation": h.cube_mac_utilisation.json(1.0),
            "aic_busy": h.aic_busy.json(1.0),
            "aiv_busy": h.aiv_busy.json(1.0),
            "sent_bytes": h.sent.json(1.0),
            "received_bytes": h.received.json(1.0),
        });
        (J::Array(phases), hot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_names_the_first_busiest_rank() {
        let s = Spread::of(&[1.0, 4.0, 2.0, 4.0]);
        assert_eq!((s.mean, s.min, s.max, s.max_rank), (2.75, 1.0, 4.0, 1));
        assert_eq!(Spread::of(&[]).max, 0.0);
    }
}
