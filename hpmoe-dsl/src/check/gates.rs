//! Router gates: `router(..., gate: tf.z)` names a tensor a taskflow computes as the
//! router's logits. In: the checked routings (with the gate as written) and the checked
//! taskflows. Out: each gated router's [`GateRef`] resolved to the tensor, or a diagnostic:
//! an unknown taskflow or tensor (E0201), or a tensor that cannot be logits (E0913: its
//! dtype, its shape `[tokens, experts]` (a receive window's ragged rows are not tokens), or
//! a value computed through the routing it gates, through another gated routing, or after
//! the first call that routes through it). A gate whose rows give the routing's tokens per rank binds them when
//! no call did.

use super::Checker;
use crate::diag::{Code, Diagnostic};
use crate::ir::{DType, Dim, GateRef, RouteId, RouteKind, Taskflow, TensorId};
use crate::syntax::ast::ItemKind;

impl Checker<'_> {
    /// Resolves the gate of every router that has one (after the taskflows are checked).
    pub(super) fn resolve_gates(&mut self) {
        for i in 0..self.routes.len() {
            let Some((tfn, tn, span)) = self.routes[i].gate.clone() else {
                continue;
            };
            if let Some(g) = self.resolve_gate(i, &tfn, &tn, span) {
                if let RouteKind::Router(r) = &mut self.routes[i].spec.kind {
                    r.gate = Some(g);
                }
            }
        }
    }

    fn resolve_gate(&mut self, i: usize, tfn: &str, tn: &str, span: crate::syntax::token::Span) -> Option<GateRef> {
        let route = self.routes[i].spec.name.clone();
        let Some(ti) = self.taskflows.iter().position(|t| t.name == tfn) else {
            // A taskflow that failed its own checks is already reported.
            let is_tf = |k: &ItemKind| matches!(k, ItemKind::Taskflow(_) | ItemKind::Grad(_));
            if self.lookup(self.root, tfn).is_some_and(|r| is_tf(&self.item(r).kind)) {
                return None;
            }
            let mut d = Diagnostic::error(
                Code::UnknownName,
                format!("no taskflow `{tfn}` computes the gate of `{route}`"),
            )
            .primary(span, "not a taskflow of this program");
            if crate::suggest::has_budget() {
                let declared = self.names_where(self.root, is_tf);
                d = match crate::suggest::closest(tfn, declared.iter().map(|s| s.as_str())) {
                    Some(b) => d.help(format!("did you mean `{b}.{tn}`?")),
                    None if declared.is_empty() => d.help("declare the taskflow that computes the logits"),
                    None => d.help(format!("the taskflows are: {}", crate::suggest::listing(&declared))),
                };
            }
            self.err(d);
            return None;
        };
        let tf = self.taskflows[ti].clone();
        let Some(id) = tf.named(tn) else {
            let names: Vec<&str> = tf
                .tensors
                .iter()
                .map(|t| t.name.as_str())
                .filter(|n| !n.contains('#'))
                .collect();
            let mut d = Diagnostic::error(Code::UnknownName, format!("taskflow `{tfn}` has no tensor `{tn}`"))
                .primary(span, "not an input, `let` or output of it");
            if let Some(b) = crate::suggest::closest(tn, names.iter().copied()) {
                d = d.help(format!("did you mean `{tfn}.{b}`?"));
            }
            self.err(d);
            return None;
        };
        let t = tf.tensor(id).clone();
        let spec = self.routes[i].spec.clone();
        let shown = self.show_shape(t.dtype, &t.shape);
        let bad = |msg: String| {
            Diagnostic::error(Code::BadGate, msg)
                .primary(span, "the router's logits")
                .secondary(t.span, format!("`{tn}` is {shown}"))
        };
        if !matches!(t.dtype, DType::F32 | DType::Bf16 | DType::F16) {
            let d = bad(format!(
                "the gate `{tfn}.{tn}` of `{route}` is {shown}; logits are f32, bf16 or f16"
            ))
            .help("compute the logits in floating point");
            self.err(d);
            return None;
        }
        let rows = match t.shape.as_slice() {
            [Dim::Fixed(rows), Dim::Fixed(e)] if *e == spec.experts => *rows,
            _ => {
                let d = bad(format!(
                    "the gate `{tfn}.{tn}` of `{route}` is {shown}; logits are [tokens, {}] (one per expert)",
                    spec.experts
                ))
                .help(format!(
                    "compute [tokens, {}] logits, e.g. `mm(x, w_gate)` with w_gate [hidden, {}]",
                    spec.experts, spec.experts
                ));
                self.err(d);
                return None;
            }
        };
        match self.routes[i].tokens_bound {
            Some(b) if spec.tokens != rows => {
                let d = bad(format!(
                    "the gate `{tfn}.{tn}` of `{route}` has {rows} rows, but `{route}` routes {} tokens per rank",
                    spec.tokens
                ))
                .secondary(b, format!("{} tokens per rank from here", spec.tokens))
                .help("the gate gives one row of logits per token");
                self.err(d);
                return None;
            }
            Some(_) => {}
            None if rows == 0 => {}
            None => self.bind_tokens(RouteId(i as u32), rows, t.span),
        }
        if let Some((call, via)) = through_route(self, &tf, id, i) {
            let d = if via == i {
                bad(format!(
                    "the gate `{tfn}.{tn}` of `{route}` is computed through `{route}` itself (by `{call}`)"
                ))
                .note("a routing cannot depend on the tokens it routes")
            } else {
                let other = self.routes[via].spec.name.clone();
                bad(format!(
                    "the gate `{tfn}.{tn}` of `{route}` is computed through `{other}` (by `{call}`), whose experts a gate chooses too"
                ))
                .note("a gate's logits are computed once, on routings that no gate chooses")
            }
            .help("compute the logits from the tokens before they are dispatched");
            self.err(d);
            return None;
        }
        if let Some(call) = first_through(self, &tf, i).filter(|&c| t.producer.is_some_and(|p| p.0 as usize > c)) {
            let d = bad(format!(
                "the gate `{tfn}.{tn}` of `{route}` is computed after `{}`, which routes through `{route}`",
                tf.nodes[call].name
            ))
            .secondary(
                tf.nodes[call].span,
                format!("routes through `{route}` before its logits exist"),
            )
            .help(format!(
                "compute `{tn}` before the first call that routes through `{route}`"
            ));
            self.err(d);
            return None;
        }
        Some(GateRef {
            taskflow: tfn.to_string(),
            tensor: tn.to_string(),
            id,
            span,
        })
    }
}

/// The routing a view is derived from, through every view.
fn base_of(ck: &Checker<'_>, mut r: RouteId) -> usize {
    for _ in 0..ck.routes.len() {
        match ck.routes.get(r.0 as usize).and_then(|s| s.spec.kind.derived_from()) {
            Some(of) => r = of,
            None => break,
        }
    }
    r.0 as usize
}

/// The first call of `tf` that routes through routing `route` or a view of it.
fn first_through(ck: &Checker<'_>, tf: &Taskflow, route: usize) -> Option<usize> {
    tf.nodes
        .iter()
        .position(|n| n.routes.iter().any(|&r| base_of(ck, r) == route))
}

/// The first call of `tf` on which `target` depends that routes through routing `route`, or
/// through another routing a gate chooses (or a view of either), with that routing.
fn through_route(ck: &Checker<'_>, tf: &Taskflow, target: TensorId, route: usize) -> Option<(String, usize)> {
    let gated = |r: RouteId| {
        let b = base_of(ck, r);
        (b == route || ck.routes.get(b).is_some_and(|s| s.gate.is_some())).then_some(b)
    };
    // Per tensor: the first such call it depends on, and its routing (nodes are in
    // topological order, so one pass suffices).
    let mut via: Vec<Option<(usize, usize)>> = vec![None; tf.tensors.len()];
    for (ni, n) in tf.nodes.iter().enumerate() {
        let own = n.routes.iter().find_map(|&r| gated(r)).map(|b| (ni, b));
        let from = n.inputs.iter().find_map(|i| via.get(i.0 as usize).copied().flatten());
        if let Some(v) = via.get_mut(n.output.0 as usize) {
            *v = own.or(from);
        }
    }
    via.get(target.0 as usize)
        .copied()
        .flatten()
        .map(|(ni, b)| (tf.nodes[ni].name.clone(), b))
}
