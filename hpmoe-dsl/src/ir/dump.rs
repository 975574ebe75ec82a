//! Text and JSON dumps of a checked program (`hpmoe lower --emit ops`). Deterministic: the
//! same program gives the same bytes.

use super::*;
use serde_json::{json, Value as J};
use std::fmt::Write;

fn dim_text(p: &Program, d: Dim) -> String {
    match d {
        Dim::Fixed(n) => n.to_string(),
        Dim::Recv(r) => format!("{}.recv", p.route(r).name),
    }
}

fn shape_text(p: &Program, t: &Tensor) -> String {
    format!(
        "{}[{}]",
        t.dtype.name(),
        t.shape.iter().map(|d| dim_text(p, *d)).collect::<Vec<_>>().join(", ")
    )
}

fn range_text(p: &Program, b: &ConcreteBody, r: VarRange) -> String {
    match r {
        VarRange::Fixed { lo, hi } => format!("{lo}..{hi}"),
        VarRange::Recv(id) => format!("{}.recv", p.route(id).name),
        VarRange::GroupRows { group, .. } => {
            format!("rows of group {}", b.vars.get(group).map_or("?", |v| v.name.as_str()))
        }
    }
}

fn tile_text(tile: &[(String, u64)]) -> String {
    tile.iter()
        .map(|(n, s)| {
            if *s == u64::MAX {
                format!("{n}: all")
            } else {
                format!("{n}: {s}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A readable dump of the op graph.
pub fn program_text(p: &Program) -> String {
    let mut s = String::new();
    let d = &p.device;
    let _ = writeln!(
        s,
        "device {} (ranks {}, {} aic + {} aiv cores per rank)",
        d.profile,
        d.ranks(),
        d.aic_cores(),
        d.aiv_cores()
    );
    if !p.params.is_empty() {
        let _ = writeln!(
            s,
            "params {}",
            p.params
                .iter()
                .map(|(n, v)| format!("{n} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for r in &p.routes {
        let _ = writeln!(
            s,
            "route {} = {} (experts {}, topk {}, ranks {}, tokens {}, window {} rows{})",
            r.name,
            route_kind_text(p, &r.kind),
            r.experts,
            r.topk,
            r.ranks,
            r.tokens,
            r.capacity,
            r.drop.map_or(String::new(), |d| format!(
                ", drop beyond {} rows per expert by {} order{}",
                d.expert_capacity(r.ranks, r.tokens, r.topk, r.experts),
                match d.order {
                    crate::ir::DropOrder::Token => "token",
                    crate::ir::DropOrder::Score => "score",
                },
                if d.renormalize { ", renormalised" } else { "" }
            ))
        );
    }
    for tf in &p.taskflows {
        let _ = writeln!(s, "\ntaskflow {}", tf.name);
        for i in &tf.inputs {
            let t = tf.tensor(*i);
            let _ = writeln!(s, "  input  {}: {}", t.name, shape_text(p, t));
        }
        for n in &tf.nodes {
            let op = p.op(n.op);
            let out = tf.tensor(n.output);
            let args: Vec<String> = n
                .inputs
                .iter()
                .map(|t| tf.tensor(*t).name.clone())
                .chain(n.routes.iter().map(|r| p.route(*r).name.clone()))
                .collect();
            let _ = writeln!(
                s,
                "  {} = {}({}) on {}: {}  tile({}){}{}",
                n.name,
                op.name,
                args.join(", "),
                n.engine.name(),
                shape_text(p, out),
                tile_text(&n.tile),
                if n.order.is_empty() {
                    String::new()
                } else {
                    format!(" order({})", n.order.join(", "))
                },
                if n.priority != 0 {
                    format!(" priority({})", n.priority)
                } else {
                    String::new()
                }
            );
            let names: Vec<String> = n.inputs.iter().map(|t| tf.tensor(*t).name.clone()).collect();
            for st in &n.body.stmts {
                let vars: Vec<String> = st
                    .vars
                    .iter()
                    .map(|v| {
                        format!(
                            "{} in {}",
                            n.body.vars[*v].name,
                            range_text(p, &n.body, n.body.vars[*v].range)
                        )
                    })
                    .collect();
                let mut red = Vec::new();
                st.value.reduction_vars(&mut red);
                let red: Vec<String> = red
                    .iter()
                    .map(|v| {
                        format!(
                            "{} in {}",
                            n.body.vars[*v].name,
                            range_text(p, &n.body, n.body.vars[*v].range)
                        )
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "      for {}{}: {} {} {}   ({} ops/term)",
                    vars.join(", "),
                    if red.is_empty() {
                        String::new()
                    } else {
                        format!("; sum {}", red.join(", "))
                    },
                    target_text(&st.target, &n.body),
                    if st.accumulate { "+=" } else { "=" },
                    ShowExpr {
                        expr: &st.value,
                        body: &n.body,
                        inputs: &names
                    },
                    st.value.ops_per_term()
                );
            }
        }
        for (name, t) in &tf.outputs {
            let _ = writeln!(
                s,
                "  output {}: {} = {}",
                name,
                shape_text(p, tf.tensor(*t)),
                tf.tensor(*t).name
            );
        }
        if let Some(sc) = p.schedule_for(&tf.name) {
            let _ = writeln!(
                s,
                "  schedule {} {{ {} }}",
                sc.policy,
                sc.options
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    s
}

fn target_text(t: &Target, b: &ConcreteBody) -> String {
    struct I<'a>(&'a Index, &'a ConcreteBody);
    impl std::fmt::Display for I<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            super::body::show_index(self.0, self.1, f)
        }
    }
    match t {
        Target::Out(ix) => format!(
            "out[{}]",
            ix.iter().map(|i| I(i, b).to_string()).collect::<Vec<_>>().join(", ")
        ),
        Target::Put { rank, index } => format!(
            "put out @ {} [{}]",
            I(rank, b),
            index.iter().map(|i| I(i, b).to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn route_kind_text(p: &Program, k: &RouteKind) -> String {
    match k {
        RouteKind::ByRank { of } => format!("by_rank({})", p.route(*of).name),
        RouteKind::Fanout { of } => format!("fanout({})", p.route(*of).name),
        RouteKind::Balanced => "balanced".into(),
        RouteKind::Uniform { seed } => format!("uniform(seed {seed})"),
        RouteKind::Zipf { s, seed } => format!("zipf(s {s}, seed {seed})"),
        RouteKind::Hotspot { max_over_mean, seed } => format!("hotspot(max_over_mean {max_over_mean}, seed {seed})"),
        RouteKind::File { path, .. } => format!("file({path:?})"),
        RouteKind::Router(r) => format!(
            "router({}, normalize {}, scale {}, groups {}/{}, logits {}{})",
            match r.score {
                crate::ir::ScoreFn::Softmax => "softmax",
                crate::ir::ScoreFn::Sigmoid => "sigmoid",
            },
            r.normalize,
            r.scale,
            r.topk_group,
            r.n_group,
            r.logits
                .as_ref()
                .map_or(format!("drawn(skew {}, seed {})", r.skew, r.seed), |p| format!("{p:?}")),
            r.bias.as_ref().map_or(String::new(), |b| format!(", bias {b:?}"))
        ),
    }
}

fn dim_json(p: &Program, d: Dim) -> J {
    match d {
        Dim::Fixed(n) => json!(n),
        Dim::Recv(r) => json!({ "recv": p.route(r).name }),
    }
}

/// The op graph as JSON (schema documented in docs/FORMATS.md).
pub fn program_json(p: &Program) -> J {
    let mut fields: Vec<crate::ir::FieldValue> = p.device.fields().collect();
    fields.sort_by_key(|f| f.spec.name);
    let device: serde_json::Map<String, J> = fields
        .iter()
        .map(|f| {
            (
                f.spec.name.to_string(),
                json!({ "value": f.value, "unit": f.unit.name, "quantity": f.spec.quantity }),
            )
        })
        .collect();
    let routes: Vec<J> = p
        .routes
        .iter()
        .map(|r| {
            let mut j = json!({
                "name": r.name, "kind": r.kind, "experts": r.experts, "topk": r.topk,
                "ranks": r.ranks, "tokens": r.tokens, "capacity": r.capacity,
            });
            if let (Some(d), Some(m)) = (r.drop, j.as_object_mut()) {
                m.insert(
                    "drop".into(),
                    json!({
                        "capacity_factor": d.capacity_factor, "order": d.order, "renormalize": d.renormalize,
                        "expert_capacity": d.expert_capacity(r.ranks, r.tokens, r.topk, r.experts),
                    }),
                );
            }
            j
        })
        .collect();
    let ops: Vec<J> = p
        .ops
        .iter()
        .map(|o| json!({ "name": o.name, "comm": o.is_comm, "engine": o.engine, "signature": o.signature }))
        .collect();
    let taskflows: Vec<J> = p
        .taskflows
        .iter()
        .map(|tf| {
            let tensors: Vec<J> = tf
                .tensors
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name, "dtype": t.dtype,
                        "shape": t.shape.iter().map(|d| dim_json(p, *d)).collect::<Vec<_>>(),
                        "home": t.home, "producer": t.producer.map(|n| n.0),
                    })
                })
                .collect();
            let nodes: Vec<J> = tf
                .nodes
                .iter()
                .map(|n| {
                    let names: Vec<String> = n.inputs.iter().map(|t| tf.tensor(*t).name.clone()).collect();
                    json!({
                        "name": n.name, "op": p.op(n.op).name, "engine": n.engine, "dtype": n.dtype,
                        "inputs": n.inputs.iter().map(|t| t.0).collect::<Vec<_>>(),
                        "routes": n.routes.iter().map(|r| p.route(*r).name.clone()).collect::<Vec<_>>(),
                        "output": n.output.0,
                        "tile": n.tile.iter().map(|(k, v)| (k.clone(), if *v == u64::MAX { J::Null } else { json!(v) })).collect::<serde_json::Map<_, _>>(),
                        "order": n.order, "priority": n.priority,
                        "vars": n.body.vars.iter().map(|v| json!({"name": v.name, "kind": v.kind, "range": range_text(p, &n.body, v.range)})).collect::<Vec<_>>(),
                        "statements": n.body.stmts.iter().map(|st| json!({
                            "target": target_text(&st.target, &n.body),
                            "accumulate": st.accumulate,
                            "value": ShowExpr { expr: &st.value, body: &n.body, inputs: &names }.to_string(),
                            "ops_per_term": st.value.ops_per_term(),
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "name": tf.name,
                "inputs": tf.inputs.iter().map(|t| t.0).collect::<Vec<_>>(),
                "outputs": tf.outputs.iter().map(|(n, t)| json!({"name": n, "tensor": t.0})).collect::<Vec<_>>(),
                "tensors": tensors,
                "nodes": nodes,
                "schedule": p.schedule_for(&tf.name).map(|s| json!({"policy": s.policy, "options": s.options})),
            })
        })
        .collect();
    json!({
        "params": p.params.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "device": { "profile": p.device.profile, "fields": device },
        "routes": routes,
        "ops": ops,
        "taskflows": taskflows,
    })
}
