//! Routings the program computes: a router with `gate: tf.z` chooses its experts from the
//! logits `z` that taskflow `tf` computes. In: a checked program and the numerics options
//! (its `--input` files). Out: the program re-routed by the logits a numerics run of each
//! gate's taskflow computed, and what was done, per routing.
//!
//! The logits do not depend on the routing they choose (the checker refuses a gate computed
//! through its own routing), so the gate's taskflow runs once with the routing drawn from the
//! router's seed, and `z` is read from its memories; the program's routings (and their views
//! and receive windows) are then made from `z`, and every taskflow runs on them.

use super::{run_bound, schedule_order, NumericsOptions};
use hpmoe_dsl::diag::{Code, Diagnostic};
use hpmoe_dsl::driver::{Checked, CompileOptions};
use hpmoe_dsl::ir::{RouteId, Taskflow};
use hpmoe_dsl::policy::Policy;
use std::path::PathBuf;

/// One routing made from the logits a taskflow computed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GateRun {
    pub routing: String,
    pub taskflow: String,
    pub tensor: String,
}

/// The `--input NAME=FILE` files of `tf`: `NAME` is an input of `tf`, or `TF.NAME` names
/// `tf` and one of its inputs (a name of another taskflow is not `tf`'s).
pub fn inputs_of(tf: &Taskflow, inputs: &[(String, PathBuf)]) -> Vec<(String, PathBuf)> {
    let has = |n: &str| tf.inputs.iter().any(|&i| tf.tensor(i).name == n);
    inputs
        .iter()
        .filter_map(|(n, f)| match n.split_once('.') {
            Some((t, a)) if t == tf.name && has(a) => Some((a.to_string(), f.clone())),
            Some(_) => None,
            None => has(n).then(|| (n.clone(), f.clone())),
        })
        .collect()
}

/// The program with every gated router routed by the logits its gate's taskflow computes
/// (inputs: `opts.inputs`, addressed as for [`inputs_of`], else seeded), that taskflow run
/// under `policy` (`None`: its own), so that its tiles, and the rounding of its sums, are
/// those of the run that follows; `None` when the program has no gated router.
pub fn route_by_gates(
    checked: &Checked,
    policy: Option<Policy>,
    opts: &NumericsOptions,
) -> Result<Option<(Checked, Vec<GateRun>)>, Vec<Diagnostic>> {
    let p = checked.program();
    let gated = p.gated_routes();
    if gated.is_empty() {
        return Ok(None);
    }
    let mut logits: Vec<(RouteId, Vec<f64>)> = Vec::new();
    let mut runs = Vec::new();
    // Each gate taskflow runs once, for all the routings it gates.
    let mut done: Vec<(String, super::Memories)> = Vec::new();
    for id in gated {
        let spec = p.route(id);
        let Some(gate) = spec.kind.router().and_then(|r| r.gate.clone()) else {
            continue;
        };
        let Some(tf) = p.taskflow(&gate.taskflow) else {
            continue;
        };
        let mem = match done.iter().find(|(n, _)| *n == tf.name) {
            Some((_, m)) => m,
            None => {
                let policy = checked.select_policy(&tf.name, policy);
                let compiled = checked.compile(
                    tf,
                    &policy,
                    &CompileOptions {
                        verify: false,
                        ..Default::default()
                    },
                )?;
                let order = schedule_order(&compiled.graph, &compiled.schedule);
                let nopts = NumericsOptions {
                    inputs: inputs_of(tf, &opts.inputs),
                    dump: None,
                    ..opts.clone()
                };
                let (_, mem) = run_bound(p, tf, &compiled.graph, &compiled.schedule, &order, &nopts, None, true)
                    .map_err(|d| vec![d])?;
                let Some(mem) = mem else { continue };
                done.push((tf.name.clone(), mem));
                &done[done.len() - 1].1
            }
        };
        let Some(z) = mem.get(&gate.tensor) else {
            return Err(vec![Diagnostic::error(
                Code::BadGate,
                format!(
                    "the numerics of `{}` kept no tensor `{}` for the gate of `{}`",
                    tf.name, gate.tensor, spec.name
                ),
            )
            .primary(gate.span, "this gate")]);
        };
        let values: Vec<f64> = z.data.concat();
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(vec![Diagnostic::error(
                Code::BadGate,
                format!(
                    "the gate `{}.{}` of `{}` computed a logit that is not finite ({} at element {bad})",
                    tf.name, gate.tensor, spec.name, values[bad]
                ),
            )
            .primary(gate.span, "these logits")
            .help(
                "check the gate's inputs and weights: a router cannot order NaN or infinite scores",
            )]);
        }
        logits.push((id, values));
        runs.push(GateRun {
            routing: spec.name.clone(),
            taskflow: tf.name.clone(),
            tensor: gate.tensor.clone(),
        });
    }
    let rerouted = checked.with_gate_logits(logits).map_err(|d| vec![d])?;
    Ok(Some((rerouted, runs)))
}
