//! Exports of task graphs and schedules (`hpmoe lower --emit tasks|schedule`): a human
//! summary and JSON (schema in docs/FORMATS.md). Deterministic.

use super::Schedule;
use crate::ir::{Engine, Program, Taskflow};
use crate::lower::{counts_per_node, TaskGraph};
use serde_json::{json, Value as J};
use std::fmt::Write;

fn chunks_json(g: &TaskGraph, t: usize) -> J {
    let nt = &g.nodes[g.node[t] as usize];
    let c = g.chunks(t);
    let m: serde_json::Map<String, J> = nt
        .dims
        .iter()
        .zip(&c)
        .map(|(d, ch)| (d.name.clone(), json!({"lo": ch.lo, "hi": ch.hi, "group": ch.group})))
        .collect();
    J::Object(m)
}

/// Every task: id, rank, engine, op call, tile, cost and predecessors.
pub fn tasks_json(program: &Program, tf: &Taskflow, g: &TaskGraph) -> J {
    let tasks: Vec<J> = (0..g.len())
        .map(|t| {
            let node = &tf.nodes[g.node[t] as usize];
            json!({
                "id": t,
                "rank": g.rank[t],
                "engine": node.engine,
                "call": node.name,
                "op": program.op(node.op).name,
                "tile": chunks_json(g, t),
                "cost": { "flops": g.flops[t], "bytes_in": g.bytes_in[t], "bytes_out": g.bytes_out[t], "remote_bytes": g.remote[t] },
                "deps": g.preds(t),
            })
        })
        .collect();
    json!({ "taskflow": tf.name, "ranks": g.ranks, "tasks": tasks, "edges": g.edges() })
}

/// Per (rank, core) queues and every counter with its threshold and signalling tasks.
pub fn schedule_json(g: &TaskGraph, s: &Schedule) -> J {
    let mut queues = Vec::new();
    for c in 0..s.queues.len() {
        let q = s.queues.row(c);
        if q.is_empty() {
            continue;
        }
        queues.push(json!({"rank": s.core_rank(c as u32), "core": s.core_name(c as u32), "tasks": q}));
    }
    // Signallers per counter.
    let mut by_counter: Vec<Vec<u32>> = vec![Vec::new(); s.threshold.len()];
    for t in 0..g.len() {
        for &c in s.signals.row(t) {
            by_counter[c as usize].push(t as u32);
        }
    }
    let mut waiters: Vec<Vec<u32>> = vec![Vec::new(); s.threshold.len()];
    for t in 0..g.len() {
        for &c in s.waits.row(t) {
            waiters[c as usize].push(t as u32);
        }
    }
    let counters: Vec<J> = (0..s.threshold.len())
        .map(|c| {
            json!({
                "id": c,
                "rank": s.counter_rank[c],
                "kind": if (c as u32) < g.counters.len() as u32 { "dependency" } else { "barrier" },
                "threshold": s.threshold[c],
                "signalled_by": by_counter[c],
                "waited_by": waiters[c],
            })
        })
        .collect();
    json!({
        "taskflow": g.taskflow,
        "policy": s.policy.policy.name(),
        "cores_per_rank": {"aic": s.aic_cores, "aiv": s.aiv_cores},
        "queues": queues,
        "counters": counters,
    })
}

/// Counts per op call, engine and rank; edges; counters.
pub fn summary_text(program: &Program, tf: &Taskflow, g: &TaskGraph, s: Option<&Schedule>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "taskflow {}: {} tasks on {} ranks, {} dependency edges through {} counters",
        tf.name,
        g.len(),
        g.ranks,
        g.edges(),
        g.counters.len()
    );
    let _ = writeln!(
        out,
        "  {:<14} {:<14} {:<6} {:>10} {:>12} {:>12}",
        "call", "op", "engine", "tasks", "min/rank", "max/rank"
    );
    for (i, (name, op, e, c)) in counts_per_node(program, tf, g).into_iter().enumerate() {
        let per: Vec<u32> = g.nodes[i].per_rank.iter().map(|r| r.count).collect();
        let _ = writeln!(
            out,
            "  {:<14} {:<14} {:<6} {:>10} {:>12} {:>12}",
            name,
            op,
            e.name(),
            c,
            per.iter().min().copied().unwrap_or(0),
            per.iter().max().copied().unwrap_or(0)
        );
    }
    let bytes = g.resident_bytes();
    let _ = writeln!(
        out,
        "  graph memory: {:.1} MiB ({:.1} B per task, {} stored counter entries for {} logical edges)",
        bytes as f64 / 1048576.0,
        bytes as f64 / g.len().max(1) as f64,
        g.counters.idx.len(),
        g.edges()
    );
    let aic: usize = (0..g.len()).filter(|&t| g.engine(tf, t) == Engine::Aic).count();
    let _ = writeln!(out, "  engines: {} aic tasks, {} aiv tasks", aic, g.len() - aic);
    if let Some(s) = s {
        let used = (0..s.queues.len()).filter(|&c| !s.queues.row(c).is_empty()).count();
        let _ = writeln!(
            out,
            "schedule {}: {} non-empty core queues, {} counters ({} kernel barriers)",
            s.policy.policy.name(),
            used,
            s.threshold.len(),
            s.barriers
        );
        if s.estimate > 0.0 {
            let _ = writeln!(out, "  list-scheduling estimate: {:.1} us", s.estimate * 1e6);
        }
    }
    out
}
