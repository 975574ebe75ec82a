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

fn task_json(program: &Program, tf: &Taskflow, g: &TaskGraph, t: usize) -> J {
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
}

/// Every task: id, rank, engine, op call, tile, cost and predecessors.
pub fn tasks_json(program: &Program, tf: &Taskflow, g: &TaskGraph) -> J {
    let tasks: Vec<J> = (0..g.len()).map(|t| task_json(program, tf, g, t)).collect();
    json!({ "taskflow": tf.name, "ranks": g.ranks, "tasks": tasks, "edges": g.edges() })
}

/// [`tasks_json`] written as it is produced: the bytes of `serde_json::to_writer` of it,
/// without holding the whole tree, which can be many times the size of the graph.
pub fn write_tasks_json(
    w: &mut dyn std::io::Write,
    program: &Program,
    tf: &Taskflow,
    g: &TaskGraph,
) -> std::io::Result<()> {
    // Keys in serde_json's (sorted) order.
    write!(w, "{{\"edges\":{},\"ranks\":{},\"taskflow\":", g.edges(), g.ranks)?;
    serde_json::to_writer(&mut *w, &tf.name)?;
    w.write_all(b",\"tasks\":[")?;
    for t in 0..g.len() {
        if t > 0 {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut *w, &task_json(program, tf, g, t))?;
    }
    w.write_all(b"]}")
}

fn queues_json(s: &Schedule) -> Vec<J> {
    let mut queues = Vec::new();
    for c in 0..s.queues.len() {
        let q = s.queues.row(c);
        if q.is_empty() {
            continue;
        }
        queues.push(json!({"rank": s.core_rank(c as u32), "core": s.core_name(c as u32), "tasks": q}));
    }
    queues
}

/// Signalling and waiting tasks per counter (the signallers without writing out the kernel
/// barriers' fanouts, whose rows are made one at a time as they are written).
fn counter_tasks(g: &TaskGraph, s: &Schedule) -> (super::SignallerIndex, crate::lower::Csr) {
    let mut wait: Vec<(u32, u32)> = Vec::new();
    for t in 0..g.len() {
        wait.extend(s.waits.row(t).iter().map(|&c| (c, t as u32)));
    }
    (
        s.signaller_index(),
        crate::lower::Csr::from_pairs(s.threshold.len(), &wait),
    )
}

fn counter_json(g: &TaskGraph, s: &Schedule, c: usize, by: &super::SignallerIndex, waiters: &crate::lower::Csr) -> J {
    json!({
        "id": c,
        "rank": s.counter_rank[c],
        "kind": if c < g.counters.len() {
            "dependency"
        } else if super::collective::step_counters(g, s).contains(&c) {
            "step"
        } else {
            "barrier"
        },
        "threshold": s.threshold[c],
        "signalled_by": by.row(s, c).collect::<Vec<u32>>(),
        "waited_by": waiters.row(c),
    })
}

/// [`schedule_json`] written as it is produced (the same bytes, without the whole tree).
pub fn write_schedule_json(w: &mut dyn std::io::Write, g: &TaskGraph, s: &Schedule) -> std::io::Result<()> {
    let (by, waiters) = counter_tasks(g, s);
    // Keys in serde_json's (sorted) order.
    write!(w, "{{\"cores_per_rank\":")?;
    serde_json::to_writer(&mut *w, &json!({"aic": s.aic_cores, "aiv": s.aiv_cores}))?;
    w.write_all(b",\"counters\":[")?;
    for c in 0..s.threshold.len() {
        if c > 0 {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut *w, &counter_json(g, s, c, &by, &waiters))?;
    }
    w.write_all(b"],\"policy\":")?;
    serde_json::to_writer(&mut *w, s.policy.policy.name())?;
    w.write_all(b",\"queues\":")?;
    serde_json::to_writer(&mut *w, &queues_json(s))?;
    w.write_all(b",\"taskflow\":")?;
    serde_json::to_writer(&mut *w, &g.taskflow)?;
    w.write_all(b"}")
}

/// Per (rank, core) queues and every counter with its threshold and signalling tasks.
pub fn schedule_json(g: &TaskGraph, s: &Schedule) -> J {
    let (by, waiters) = counter_tasks(g, s);
    let counters: Vec<J> = (0..s.threshold.len())
        .map(|c| counter_json(g, s, c, &by, &waiters))
        .collect();
    json!({
        "taskflow": g.taskflow,
        "policy": s.policy.policy.name(),
        "cores_per_rank": {"aic": s.aic_cores, "aiv": s.aiv_cores},
        "queues": queues_json(s),
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
            "schedule {}: {} non-empty core queues, {} counters ({} kernel barriers{})",
            s.policy.policy.name(),
            used,
            s.threshold.len(),
            s.barriers,
            match super::collective::step_counters(g, s).len() {
                0 => String::new(),
                n => format!(", {n} AllToAll step counters"),
            }
        );
        if s.estimate > 0.0 {
            let _ = writeln!(out, "  list-scheduling estimate: {:.1} us", s.estimate * 1e6);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Options;
    use crate::driver::{check_text, CompileOptions};
    use crate::schedule::Policy;

    /// The streamed JSON is byte for byte the serialised tree, for every policy.
    #[test]
    fn streamed_json_equals_the_tree() {
        let src = include_str!("../../../tests/ok/moe_backward.hpm");
        let mut sources = crate::SourceMap::new();
        let checked = check_text("moe_backward.hpm", src, None, &Options::default(), &mut sources)
            .checked
            .expect("checks");
        let p = checked.program();
        for pol in Policy::all() {
            let spec = checked.select_policy(&p.taskflows[0].name, Some(pol));
            let tf = &p.taskflows[0];
            let opts = CompileOptions {
                max_tasks: 1 << 20,
                verify: true,
            };
            let c = checked.compile(tf, &spec, &opts).expect("compiles");
            let mut a = Vec::new();
            write_tasks_json(&mut a, p, tf, &c.graph).unwrap();
            assert_eq!(
                a,
                serde_json::to_vec(&tasks_json(p, tf, &c.graph)).unwrap(),
                "{}",
                pol.name()
            );
            let mut b = Vec::new();
            write_schedule_json(&mut b, &c.graph, &c.schedule).unwrap();
            assert_eq!(
                b,
                serde_json::to_vec(&schedule_json(&c.graph, &c.schedule)).unwrap(),
                "{}",
                pol.name()
            );
        }
    }
}
