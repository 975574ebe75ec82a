//! `taskflow NAME = grad(FORWARD, wrt: [..], save: [..]);`: the backward of a checked
//! taskflow, derived into ordinary syntax and checked like a written one.
//!
//! In: the forward's checked op graph (its tensors' concrete types, calls, tiles) and the
//! syntax of the ops it calls. Out: derived op items (the vector-Jacobian product of each
//! op with respect to each differentiated input, see [`body`]) appended to the module of
//! the op they derive from, so that their names mean what the forward op's names mean, and
//! the `grad` item replaced by the derived taskflow. The checker then checks the derived
//! ops and the taskflow as it checks written ones: every later stage sees ordinary items.
//!
//! The taskflow: the inputs are the output gradients (`dy` for a single output, `dNAME`
//! for named ones), then the forward's inputs and saved tensors the backward reads (named
//! as in the forward, so a layer's backward `F_bwd` is fed by the forward's memories); the
//! forward calls whose results are read but not saved are recomputed first; then, in
//! reverse order, each call's products; a tensor with several consumers gets the sum of
//! their gradients. The outputs are `dNAME` for each `wrt` input.

mod body;

use super::{Checker, ItemRef, ModId};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Dim, TensorId};
use crate::syntax::ast::{
    self, Annot, Arg, Expr, ExprKind, Field, FlowStmt, FlowStmtKind, GradDecl, Ident, Item, ItemKind, OpDef, OpKind,
    OpParam, ParamType, Stmt, Taskflow, TaskflowRet, TensorType,
};
use crate::syntax::token::Span;
use body::{ident, int, name, Names, NonDiff};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// A derived op: its item and the module it belongs to.
struct NewOp {
    module: ModId,
    def: OpDef,
    docs: Vec<String>,
    span: Span,
}

/// A call of the backward: `let NAME = OP(ARGS) ANNOTS;`.
struct Call {
    name: String,
    op: String,
    args: Vec<String>,
    annots: Vec<Annot>,
    span: Span,
}

/// The state of one derivation.
struct Derivation<'f> {
    fwd: &'f ir::Taskflow,
    /// Names used in the backward (inputs and lets).
    used: BTreeSet<String>,
    /// The backward name of each forward tensor that is available (input, saved, recomputed).
    primal: BTreeMap<TensorId, String>,
    /// Inputs of the backward: (name, forward tensor or output gradient type).
    inputs: Vec<(String, TensorId)>,
    recompute: Vec<Call>,
    calls: Vec<Call>,
    /// Gradient contributions still to be summed, per forward tensor.
    pending: BTreeMap<TensorId, Vec<String>>,
    /// How many contributions each tensor gets.
    expected: BTreeMap<TensorId, usize>,
    /// The final gradient name of each tensor.
    grads: BTreeMap<TensorId, String>,
    new_ops: Vec<NewOp>,
    /// `new_ops` by module and text (the op's debug form without its name), and their names:
    /// a derived op is matched with an equal earlier one, and named, without a comparison
    /// with every earlier one.
    op_keys: rustc_hash::FxHashMap<(ModId, String), Vec<usize>>,
    op_names: rustc_hash::FxHashSet<String>,
    saved: BTreeSet<TensorId>,
    /// The tensors listed in `straight_through`.
    straight: BTreeSet<TensorId>,
    span: Span,
}

fn sanitize(n: &str) -> String {
    n.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

fn fresh(base: &str, used: &mut BTreeSet<String>) -> String {
    let base = sanitize(base);
    let mut n = base.clone();
    let mut k = 2;
    while used.contains(&n) {
        n = format!("{base}_{k}");
        k += 1;
    }
    used.insert(n.clone());
    n
}

impl Checker<'_> {
    /// Expands every `grad` item of the root, in order, once the written taskflows are
    /// checked.
    pub(super) fn expand_grads(&mut self) {
        let root = self.root;
        for i in 0..self.modules[root].ast.items.len() {
            let r = ItemRef { module: root, item: i };
            let item = self.item(r);
            let ItemKind::Grad(g) = &item.kind else { continue };
            let (g, span, docs) = (g.clone(), item.span, item.docs.clone());
            let Some((ops, tf)) = self.derive(&g, span) else {
                // A failed derivation fails the check: a `grad` never vanishes silently (when
                // nothing else was reported, say so here).
                if self.diags.error_count() == 0 {
                    let d = self.grad_error(
                        g.call_span,
                        format!("the backward `{}` cannot be derived", g.name.name),
                        "no backward derived here",
                    );
                    self.err(d);
                }
                continue;
            };
            let written: Vec<NewOp> = ops.iter().map(|op| self.for_root(op)).collect();
            if let Some(info) = self.grads.last_mut() {
                (info.taskflow_source, info.ops_source) = derived_source(&written, &tf);
            }
            // The derived ops, in the modules of the ops they derive from.
            let mut refs = Vec::new();
            // The files are changed in place (no other handle to them is held here), not
            // copied: a copy per `grad` made a program of many `grad`s quadratic.
            for op in ops {
                let m = op.module;
                let file = Rc::make_mut(&mut self.modules[m].ast);
                let k = file.items.len();
                let name = op.def.name.name.clone();
                file.items.push(Item {
                    docs: op.docs,
                    kind: ItemKind::Op(Box::new(op.def)),
                    span: op.span,
                });
                let at = ItemRef { module: m, item: k };
                self.modules[root].scope.insert(name.into(), (at, op.span));
                refs.push(at);
            }
            Rc::make_mut(&mut self.modules[root].ast).items[i] = Item {
                docs,
                kind: ItemKind::Taskflow(Box::new(tf)),
                span,
            };
            let from = self.diags.len();
            for at in refs {
                self.op_sig(at);
            }
            self.check_taskflow(r);
            self.diags.note_since(
                from,
                &format!("in the backward that `grad` derives from `{}`", g.forward.name),
            );
        }
        // Taskflows in the order of the source.
        self.taskflows.sort_by_key(|t| (t.span.file, t.span.lo));
    }

    /// A derived op as it is written into the root file: a param of its own module that the
    /// root file does not see under that name is replaced by its value.
    fn for_root(&mut self, op: &NewOp) -> NewOp {
        let mut names = BTreeSet::new();
        body::body_names(&op.def.body, &mut names);
        for p in &op.def.params {
            if let ParamType::Tensor(t) = &p.ty {
                t.dims.iter().for_each(|d| names_in(d, &mut names));
            }
        }
        op.def.ret.dims.iter().for_each(|d| names_in(d, &mut names));
        let mut map: BTreeMap<String, Expr> = BTreeMap::new();
        for n in names {
            let Some(r) = self.lookup(op.module, &n) else { continue };
            if !matches!(self.item(r).kind, ItemKind::Param(_)) || self.lookup(self.root, &n) == Some(r) {
                continue;
            }
            let sp = Span::default();
            let lit = |kind: ExprKind, negative: bool| {
                let e = Expr { kind, span: sp };
                if negative {
                    body::neg(e)
                } else {
                    e
                }
            };
            let e = match self.param_value(r) {
                Some(ir::Value::Int(v)) => lit(ExprKind::Int(v.unsigned_abs()), v < 0),
                Some(ir::Value::Float(v)) if v.is_finite() => lit(ExprKind::Float(v.abs()), v.is_sign_negative()),
                _ => continue,
            };
            map.insert(n, e);
        }
        let mut def = op.def.clone();
        if !map.is_empty() {
            for st in &mut def.body {
                match st {
                    Stmt::Let { value, .. } => subst_names(value, &map),
                    Stmt::Assign { index, value, .. } => {
                        index.iter_mut().for_each(|e| subst_names(e, &map));
                        subst_names(value, &map);
                    }
                    Stmt::Put { rank, index, value, .. } => {
                        subst_names(rank, &map);
                        index.iter_mut().for_each(|e| subst_names(e, &map));
                        subst_names(value, &map);
                    }
                }
            }
            for p in &mut def.params {
                if let ParamType::Tensor(t) = &mut p.ty {
                    t.dims.iter_mut().for_each(|d| subst_names(d, &map));
                }
            }
            def.ret.dims.iter_mut().for_each(|d| subst_names(d, &map));
        }
        NewOp {
            module: op.module,
            def,
            docs: op.docs.clone(),
            span: op.span,
        }
    }

    fn grad_error(&mut self, span: Span, msg: String, label: &str) -> Diagnostic {
        let _ = self;
        Diagnostic::error(Code::BadGrad, msg).primary(span, label.to_string())
    }

    /// The derived op items and taskflow of one `grad`, or `None` after reporting.
    fn derive(&mut self, g: &GradDecl, span: Span) -> Option<(Vec<NewOp>, Taskflow)> {
        let root = self.root;
        let fname = &g.forward.name;
        let is_tf = self
            .lookup(root, fname)
            .is_some_and(|r| matches!(self.item(r).kind, ItemKind::Taskflow(_) | ItemKind::Grad(_)));
        let Some(fwd) = self.taskflows.iter().find(|t| &t.name == fname).cloned() else {
            if !is_tf {
                let mut d = self.grad_error(
                    g.forward.span,
                    format!("`grad` of `{fname}`, which is not a taskflow"),
                    "not a taskflow",
                );
                if crate::suggest::has_budget() {
                    let names = self.names_where(root, |k| matches!(k, ItemKind::Taskflow(_)));
                    if let Some(b) = crate::suggest::closest(fname, names.iter().map(|s| s.as_str())) {
                        d = d.help(format!("did you mean `{b}`?"));
                    }
                }
                self.err(d);
            }
            if fname == &g.name.name {
                let d = self
                    .grad_error(
                        g.forward.span,
                        format!("`{fname}` is the backward declared here: it cannot be its own forward"),
                        "the taskflow this `grad` declares",
                    )
                    .help("name the forward taskflow, e.g. `grad(moe_ffn, wrt: [x])`");
                self.err(d);
                return None;
            }
            // A `grad` declared earlier whose derivation failed was reported already.
            let later = self.lookup(root, fname).is_some_and(|r| {
                matches!(self.item(r).kind, ItemKind::Grad(_)) && r.module == root && self.item(r).span.lo > span.lo
            });
            if later {
                let d = self
                    .grad_error(
                        g.forward.span,
                        format!("`{fname}` is derived by a `grad` declared later"),
                        "not derived yet",
                    )
                    .help(format!("declare `{fname}` before the `grad` that differentiates it"));
                self.err(d);
            }
            // Otherwise the forward has errors, already reported.
            return None;
        };
        let mut ok = true;
        // wrt: inputs of the forward.
        let mut wrt: Vec<(TensorId, Ident)> = Vec::new();
        for w in &g.wrt {
            match fwd.inputs.iter().find(|&&t| fwd.tensor(t).name == w.name) {
                Some(&t) => {
                    if wrt.iter().any(|(x, _)| *x == t) {
                        self.err(self_dup(w));
                        ok = false;
                    } else {
                        wrt.push((t, w.clone()));
                    }
                }
                None => {
                    let inputs: Vec<String> = fwd.inputs.iter().map(|&t| fwd.tensor(t).name.clone()).collect();
                    let msg = if fwd.named(&w.name).is_some() {
                        format!(
                            "`wrt` names `{}`, which `{fname}` computes: only its inputs are differentiated",
                            w.name
                        )
                    } else {
                        format!("`{fname}` has no input `{}` to differentiate", w.name)
                    };
                    let mut d = self
                        .grad_error(w.span, msg, "not an input of the forward")
                        .note(format!("the inputs of `{fname}` are {}", inputs.join(", ")));
                    if let Some(b) = crate::suggest::closest(&w.name, inputs.iter().map(|s| s.as_str())) {
                        d = d.help(format!("did you mean `{b}`?"));
                    }
                    self.err(d);
                    ok = false;
                }
            }
        }
        if g.wrt.is_empty() {
            let d = self.grad_error(
                g.call_span,
                "`wrt: []` names no input to differentiate".into(),
                "nothing to derive",
            );
            self.err(d);
            ok = false;
        }
        let mut saved = BTreeSet::new();
        for s in &g.save {
            match fwd.named(&s.name) {
                Some(t) if fwd.tensor(t).producer.is_some() => {
                    saved.insert(t);
                }
                Some(_) => {
                    self.err(
                        Diagnostic::warning(
                            Code::UnusedValue,
                            format!("`{}` is an input of `{fname}`: the backward always has it", s.name),
                        )
                        .primary(s.span, "no need to save it"),
                    );
                }
                None => {
                    let names: Vec<String> = fwd.tensors.iter().map(|t| t.name.clone()).collect();
                    let mut d = self.grad_error(
                        s.span,
                        format!("`save` names `{}`, which is not a tensor of `{fname}`", s.name),
                        "not a tensor of the forward",
                    );
                    if let Some(b) = crate::suggest::closest(&s.name, names.iter().map(|s| s.as_str())) {
                        d = d.help(format!("did you mean `{b}`?"));
                    }
                    self.err(d);
                    ok = false;
                }
            }
        }
        // `straight_through` and `detach`: tensors of the forward.
        let mut lookup_list = |c: &mut Checker, names: &[Ident], key: &str| -> Vec<(TensorId, Ident)> {
            let mut out: Vec<(TensorId, Ident)> = Vec::new();
            let mut seen = vec![false; fwd.tensors.len()];
            for s in names {
                match fwd.named(&s.name) {
                    Some(t) if std::mem::replace(&mut seen[t.0 as usize], true) => {
                        let d = c.grad_error(s.span, format!("`{}` is named twice in `{key}`", s.name), "again here");
                        c.err(d);
                        ok = false;
                    }
                    Some(t) => out.push((t, s.clone())),
                    None => {
                        let names: Vec<String> = fwd.tensors.iter().map(|t| t.name.clone()).collect();
                        let mut d = c.grad_error(
                            s.span,
                            format!("`{key}` names `{}`, which is not a tensor of `{fname}`", s.name),
                            "not a tensor of the forward",
                        );
                        if let Some(b) = crate::suggest::closest(&s.name, names.iter().map(|s| s.as_str())) {
                            d = d.help(format!("did you mean `{b}`?"));
                        }
                        c.err(d);
                        ok = false;
                    }
                }
            }
            out
        };
        let straight = lookup_list(self, &g.straight_through, "straight_through");
        let detached = lookup_list(self, &g.detach, "detach");
        for (t, s) in &straight {
            let tensor = fwd.tensor(*t);
            if rounded(tensor.dtype) {
                continue;
            }
            // A float tensor: its call must round inside (a fake quantisation).
            let rounds = tensor.producer.and_then(|p| {
                let opr = self.op_item(fwd.nodes[p.0 as usize].op)?;
                match &self.item(opr).kind {
                    ItemKind::Op(def) => Some(body::rounds(&def.body)),
                    _ => None,
                }
            });
            match rounds {
                Some(true) => {}
                Some(false) => self.err(
                    Diagnostic::warning(
                        Code::UnusedValue,
                        format!(
                            "the call that computes `{}` does not round: nothing passes straight through it",
                            s.name
                        ),
                    )
                    .primary(
                        s.span,
                        format!("a `{}` tensor computed without rounding", tensor.dtype.name()),
                    ),
                ),
                None => {
                    let d = self
                        .grad_error(
                            s.span,
                            format!(
                                "`{}` is an input of the float dtype `{}`: it holds no rounded values to pass the gradient through",
                                s.name,
                                tensor.dtype.name()
                            ),
                            "not a rounded tensor",
                        )
                        .help(
                            "`straight_through` lists tensors of dtype i8, u8, i32, fp8e4m3 or fp8e5m2, and tensors \
                             computed by a call that rounds (a cast to one of them in its body)",
                        );
                    self.err(d);
                    ok = false;
                }
            }
        }
        // Membership by tensor (the lists may be as long as the forward).
        let mask = |list: &[(TensorId, Ident)]| {
            let mut m = vec![false; fwd.tensors.len()];
            list.iter().for_each(|(t, _)| m[t.0 as usize] = true);
            m
        };
        let is_wrt = mask(&wrt);
        for (t, s) in &detached {
            if is_wrt[t.0 as usize] {
                let d = self
                    .grad_error(
                        s.span,
                        format!("`{}` is differentiated (in `wrt`) and detached", s.name),
                        "also in `wrt`",
                    )
                    .help("a detached tensor is a constant of the backward: remove it from one of the lists");
                self.err(d);
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        // Activity: tensors that depend on a wrt input (a detached tensor is a constant);
        // gradients: active tensors on a path to an output.
        let n = fwd.tensors.len();
        let activity = |detach: &[bool]| -> (Vec<bool>, Vec<bool>, BTreeMap<TensorId, usize>) {
            let mut active = vec![false; n];
            for (t, _) in &wrt {
                active[t.0 as usize] = true;
            }
            for node in &fwd.nodes {
                if node.inputs.iter().any(|t| active[t.0 as usize]) && !detach[node.output.0 as usize] {
                    active[node.output.0 as usize] = true;
                }
            }
            let mut expected: BTreeMap<TensorId, usize> = BTreeMap::new();
            let mut has_grad = vec![false; n];
            for (_, t) in &fwd.outputs {
                if active[t.0 as usize] {
                    has_grad[t.0 as usize] = true;
                    *expected.entry(*t).or_default() += 1;
                }
            }
            for node in fwd.nodes.iter().rev() {
                if !has_grad[node.output.0 as usize] {
                    continue;
                }
                for t in &node.inputs {
                    if active[t.0 as usize] {
                        has_grad[t.0 as usize] = true;
                        *expected.entry(*t).or_default() += 1;
                    }
                }
            }
            (active, has_grad, expected)
        };
        let (active, has_grad, expected) = activity(&mask(&detached));
        if !detached.is_empty() {
            let (_, undetached, _) = activity(&vec![false; n]);
            for (t, s) in &detached {
                if !undetached[t.0 as usize] {
                    let what = if fwd.tensor(*t).producer.is_none() {
                        "an input not in `wrt`: the backward treats it as a constant already"
                    } else {
                        "not on a path from a `wrt` input to an output: no gradient flows through it"
                    };
                    self.err(
                        Diagnostic::warning(Code::UnusedValue, format!("detaching `{}` changes nothing", s.name))
                            .primary(s.span, what),
                    );
                }
            }
        }
        for (t, w) in &wrt {
            if !has_grad[t.0 as usize] {
                let d = self
                    .grad_error(
                        w.span,
                        format!("no output of `{fname}` depends on `{}`", w.name),
                        "its gradient is zero",
                    )
                    .help("remove it from `wrt`");
                self.err(d);
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        for (t, s) in &straight {
            if !has_grad[t.0 as usize] {
                self.err(
                    Diagnostic::warning(
                        Code::UnusedValue,
                        format!(
                            "`{}` is not on the path of the gradient: nothing passes through it",
                            s.name
                        ),
                    )
                    .primary(s.span, "no gradient flows through it"),
                );
            }
        }
        let is_straight = mask(&straight);
        // A gradient flows through every tensor that has one: a tensor of a quantised or
        // integer dtype holds rounded values, whose derivative is zero almost everywhere.
        // Without `straight_through` every such tensor is refused (a gradient stored in its
        // dtype would be rounded too); with it, gradients of such tensors are f32, a listed
        // tensor's rounding is differentiated as the identity, an input must be listed, and a
        // call that rounds into an unlisted tensor is refused where its body casts.
        for (i, t) in fwd.tensors.iter().enumerate() {
            if !has_grad[i] || !rounded(t.dtype) {
                continue;
            }
            if is_straight[i] || (!straight.is_empty() && t.producer.is_some()) {
                continue;
            }
            let what = if t.dtype.is_integer() {
                "an integer"
            } else {
                "a quantised"
            };
            let d = Diagnostic::error(
                Code::NotDifferentiable,
                format!(
                    "`{}` is on the path of the gradient but has {what} dtype, `{}`: rounding has no derivative",
                    t.name,
                    t.dtype.name()
                ),
            )
            .primary(t.span, format!("`{}` holds rounded values", t.dtype.name()))
            .secondary(g.call_span, "the backward derived here")
            .help(format!(
                "list `{}` in `straight_through: [..]` to pass the gradient through its rounding unchanged \
                 (a straight-through estimator), or differentiate a forward whose differentiated path is in a \
                 float dtype (bf16, f16, f32)",
                t.name
            ));
            self.err(d);
            ok = false;
        }
        if !ok {
            return None;
        }
        let errors_before = self.diags.error_count();
        let mut dv = Derivation {
            fwd: &fwd,
            // Gradients are never named like a forward tensor, which keeps its name here.
            used: fwd.tensors.iter().map(|t| t.name.clone()).collect(),
            primal: BTreeMap::new(),
            inputs: Vec::new(),
            recompute: Vec::new(),
            calls: Vec::new(),
            pending: BTreeMap::new(),
            expected,
            grads: BTreeMap::new(),
            new_ops: Vec::new(),
            op_keys: Default::default(),
            op_names: Default::default(),
            saved,
            straight: straight.iter().map(|(t, _)| *t).collect(),
            span,
        };
        // Output gradients.
        let single = fwd.outputs.len() == 1 && fwd.outputs[0].0 == "out";
        let mut out_grads = Vec::new();
        for (oname, t) in &fwd.outputs {
            if !active[t.0 as usize] {
                continue;
            }
            let gname = if single { "dy".to_string() } else { format!("d{oname}") };
            let gname = fresh(&gname, &mut dv.used);
            out_grads.push((gname.clone(), *t));
            dv.pending.entry(*t).or_default().push(gname);
        }
        // The calls, in reverse.
        // Every call is derived, so that each op without a gradient is reported.
        let mut failed = false;
        for (k, node) in fwd.nodes.iter().enumerate().rev() {
            if !has_grad[node.output.0 as usize] {
                continue;
            }
            let Some(dout) = dv.grad_of(node.output, self) else {
                failed = true;
                continue;
            };
            for (pos, t) in node.inputs.iter().enumerate() {
                if !active[t.0 as usize] {
                    continue;
                }
                match self.vjp_call(&mut dv, k, pos, &dout) {
                    Some(c) => dv.pending.entry(*t).or_default().push(c),
                    None => failed = true,
                }
            }
        }
        if failed {
            if self.diags.error_count() == errors_before {
                let d = Diagnostic::error(
                    Code::NotDifferentiable,
                    format!("the backward of `{fname}` cannot be derived"),
                )
                .primary(g.call_span, "here");
                self.err(d);
            }
            return None;
        }
        let mut results = Vec::new();
        for (t, w) in &wrt {
            let Some(gname) = dv.grad_of(*t, self) else {
                let d = Diagnostic::error(
                    Code::NotDifferentiable,
                    format!("the gradient of `{}` cannot be derived", w.name),
                )
                .primary(w.span, "here");
                self.err(d);
                return None;
            };
            // A gradient that is an output gradient unchanged (the forward passes the input
            // on) is copied: an output is computed.
            let gname = if out_grads.iter().any(|(n, _)| *n == gname) {
                let rank = fwd.tensor(*t).shape.len();
                let op = self.copy_op(&mut dv, rank);
                let n = fresh(&format!("d{}", w.name), &mut dv.used);
                dv.calls.push(Call {
                    name: n.clone(),
                    op,
                    args: vec![gname],
                    annots: Vec::new(),
                    span,
                });
                n
            } else {
                gname
            };
            results.push((format!("d{}", w.name), gname, *t));
        }
        // The taskflow's syntax.
        let sp = span;
        let ty = |c: &Checker, t: TensorId| -> TensorType { c.type_syntax(fwd.tensor(t), sp) };
        let gty = |c: &Checker, t: TensorId| -> TensorType {
            let mut g = fwd.tensor(t).clone();
            g.dtype = dv.grad_dtype(t);
            c.type_syntax(&g, sp)
        };
        let mut params = Vec::new();
        for (gname, t) in &out_grads {
            params.push(OpParam {
                name: ident(gname, sp),
                ty: ParamType::Tensor(gty(self, *t)),
                span: sp,
            });
        }
        let mut ins = dv.inputs.clone();
        ins.sort_by_key(|(_, t)| *t);
        for (pname, t) in &ins {
            params.push(OpParam {
                name: ident(pname, sp),
                ty: ParamType::Tensor(ty(self, *t)),
                span: sp,
            });
        }
        let mut outs_used = BTreeSet::new();
        let ret = TaskflowRet::Named(
            results
                .iter()
                .map(|(o, _, t)| (ident(&fresh(o, &mut outs_used), sp), gty(self, *t)))
                .collect(),
        );
        let mut body = Vec::new();
        for c in dv.recompute.iter().chain(&dv.calls) {
            body.push(FlowStmt {
                kind: FlowStmtKind::Let {
                    name: ident(&c.name, c.span),
                    value: call_expr(&c.op, &c.args, c.span),
                },
                annots: c.annots.clone(),
                span: c.span,
            });
        }
        body.push(FlowStmt {
            kind: FlowStmtKind::Return {
                value: Expr {
                    kind: ExprKind::Tuple(results.iter().map(|(_, g, _)| name(g, sp)).collect()),
                    span: sp,
                },
            },
            annots: Vec::new(),
            span: sp,
        });
        let read: BTreeSet<TensorId> = dv.inputs.iter().map(|(_, x)| *x).collect();
        for s in &g.save {
            if let Some(t) = fwd.named(&s.name) {
                if dv.saved.contains(&t) && !read.contains(&t) {
                    self.err(
                        Diagnostic::warning(
                            Code::UnusedValue,
                            format!("the backward does not read the saved `{}`", s.name),
                        )
                        .primary(s.span, "not needed by the gradient"),
                    );
                }
            }
        }
        let new_ops = std::mem::take(&mut dv.new_ops);
        let mut info = ir::GradInfo {
            taskflow: g.name.name.clone(),
            forward: fwd.name.clone(),
            saved: Vec::new(),
            recomputed: Vec::new(),
            span,
            taskflow_source: String::new(),
            ops_source: String::new(),
        };
        let recomputed: BTreeSet<&str> = dv.recompute.iter().map(|c| c.name.as_str()).collect();
        for (t, n) in &dv.primal {
            if recomputed.contains(n.as_str()) {
                info.recomputed.push(*t);
            } else if fwd.tensor(*t).producer.is_some() {
                info.saved.push(*t);
            }
        }
        self.grads.push(info);
        Some((
            new_ops,
            Taskflow {
                name: g.name.clone(),
                params,
                ret,
                body,
                body_span: sp,
            },
        ))
    }

    /// The syntax of a concrete tensor type (`bf16[4096, r.recv]`).
    fn type_syntax(&self, t: &ir::Tensor, sp: Span) -> TensorType {
        TensorType {
            dtype: ident(t.dtype.name(), sp),
            dims: t.shape.iter().map(|d| self.dim_syntax(*d, None, sp)).collect(),
            span: sp,
        }
    }

    /// The syntax of a concrete dimension; a receive window as `ROUTE.recv`, with `route`
    /// naming the routing (default: its declared name).
    fn dim_syntax(&self, d: Dim, route: Option<&str>, sp: Span) -> Expr {
        match d {
            Dim::Fixed(n) => int(n, sp),
            Dim::Recv(r) => {
                let rn = route.map_or_else(|| self.routes[r.0 as usize].spec.name.clone(), str::to_string);
                Expr {
                    kind: ExprKind::Field {
                        base: Box::new(name(&rn, sp)),
                        field: Box::new(ident("recv", sp)),
                    },
                    span: sp,
                }
            }
        }
    }

    /// The op item a call of the forward calls.
    fn op_item(&self, op: ir::OpId) -> Option<ItemRef> {
        self.op_sigs
            .iter()
            .filter_map(|(r, s)| s.as_ref().filter(|s| s.id == op).map(|_| *r))
            .min()
    }

    /// Adds the product of call `k` of the forward with respect to its tensor input `pos`,
    /// returning the name of the contribution.
    fn vjp_call(&mut self, dv: &mut Derivation, k: usize, pos: usize, dout: &str) -> Option<String> {
        let fwd = dv.fwd;
        let node = &fwd.nodes[k];
        let opr = self.op_item(node.op)?;
        let sig = self.op_sigs.get(&opr).cloned().flatten()?;
        let file = self.file_of(opr);
        let ItemKind::Op(def) = &file.items[opr.item].kind else {
            return None;
        };
        // The AST parameter of tensor input `pos`.
        let tensor_params: Vec<usize> = def
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.ty, ParamType::Tensor(_)))
            .map(|(i, _)| i)
            .collect();
        let pi = *tensor_params.get(pos)?;
        let input = def.params[pi].name.name.clone();
        // Constants of the body: shape symbols, params in scope, parameters.
        let mut constants: BTreeSet<String> = sig.syms.iter().cloned().collect();
        constants.extend(def.params.iter().map(|p| p.name.name.clone()));
        let mut all = BTreeSet::new();
        body::body_names(&def.body, &mut all);
        for n in &all {
            if let Some(r) = self.lookup(opr.module, n) {
                if matches!(self.item(r).kind, ItemKind::Param(_)) {
                    constants.insert(n.clone());
                }
            }
        }
        let names = Names {
            constants: &constants,
            straight_through: dv.straight.contains(&node.output),
        };
        let mut used = all.clone();
        used.extend(constants.iter().cloned());
        let dparam = fresh("dout", &mut used);
        let route_names: Vec<String> = def
            .params
            .iter()
            .filter(|p| matches!(p.ty, ParamType::Route(_)))
            .map(|p| p.name.name.clone())
            .collect();
        let err = |c: &mut Checker, e: NonDiff| {
            let mut d = Diagnostic::error(
                Code::NotDifferentiable,
                format!(
                    "`{}` cannot be differentiated with respect to `{input}`: {}",
                    def.name.name, e.message
                ),
            )
            .primary(e.span, e.label)
            .secondary(
                node.span,
                format!("this call of `{}` is on the path to the output", def.name.name),
            );
            if let Some(h) = e.help {
                d = d.help(h);
            }
            let out = &fwd.tensor(node.output).name;
            d = if e.rounding {
                d.help(format!(
                    "list `{out}` in `straight_through: [..]` to pass the gradient through this rounding unchanged \
                     (a straight-through estimator)"
                ))
            } else if e.message.contains("differentiable") || e.message.contains("derivative") {
                d.note(format!(
                    "`detach: [{out}]` would treat `{out}` as a constant of the backward, with no gradient through it"
                ))
            } else {
                d
            };
            c.err(d);
        };
        type Derived<'e> = (Vec<Stmt>, Option<&'e str>, Vec<(String, u64)>, Vec<String>);
        let (stmts, engine, tile, order): Derived = match def.kind {
            OpKind::Compute => {
                let unit: Vec<bool> = fwd
                    .tensor(node.inputs[pos])
                    .shape
                    .iter()
                    .map(|d| *d == Dim::Fixed(1))
                    .collect();
                let derived = match body::compute_vjp(&def.body, &input, &dparam, &names, &mut used, &unit) {
                    Ok(d) => d,
                    Err(e) => {
                        err(self, e);
                        return None;
                    }
                };
                if derived.is_empty() {
                    err(
                        self,
                        NonDiff {
                            span: def.body_span,
                            message: "the body never reads it".into(),
                            label: "no read of the input in this body".into(),
                            help: None,
                            rounding: false,
                        },
                    );
                    return None;
                }
                // `out[I] = dout[I]` over the same shape: the gradient is the output's.
                if let ParamType::Tensor(pt) = &def.params[pi].ty {
                    if body::is_identity(&derived, &dparam, &names) && same_type(pt, &def.ret) {
                        return Some(dout.to_string());
                    }
                }
                let aic = body::is_contraction(&derived);
                // The forward's tiles were sized for its operands: a product whose output
                // gradient is wider (an f32 gradient of an int8 product) takes proportionally
                // shorter reduction steps, so that its k-step holds as many bytes.
                let fwd_width = node
                    .inputs
                    .iter()
                    .map(|&t| fwd.tensor(t).dtype.size())
                    .max()
                    .unwrap_or(1);
                let grad_width = dv.grad_dtype(node.output).size();
                let shrink = (grad_width / fwd_width.max(1)).max(1);
                let tile = derived_tile(&sig, node, &derived, &names, shrink);
                let stmts = derived
                    .into_iter()
                    .map(|s| Stmt::Assign {
                        target: ident("out", s.value.span),
                        index: s.index,
                        accumulate: false,
                        span: s.value.span,
                        value: s.value,
                    })
                    .collect();
                (stmts, Some(if aic { "aic" } else { "aiv" }), tile, Vec::new())
            }
            OpKind::Comm => {
                let adj = match body::comm_adjoint(&def.body, &input, &dparam, &names, &mut used) {
                    Ok(a) => a,
                    Err(e) => {
                        err(self, e);
                        return None;
                    }
                };
                // The row variable of one direction takes the tile of the other's.
                let size = |v: &str| node.tile.iter().find(|(n, _)| n == v).map(|(_, s)| *s);
                let mut tile = Vec::new();
                let (from, to) = match adj.forward {
                    body::PutDir::Send => ("t", "m"),
                    body::PutDir::Return => ("m", "t"),
                };
                let row_from = row_var(&def.body, adj.forward).unwrap_or_else(|| from.to_string());
                let row_to =
                    row_var(std::slice::from_ref(&adj.stmt), other(adj.forward)).unwrap_or_else(|| to.to_string());
                if let Some(s) = size(&row_from) {
                    tile.push((row_to, s));
                }
                (vec![adj.stmt], None, tile, node.order.clone())
            }
        };
        // The signature: the output gradient, the inputs the body reads, the routings.
        let mut read = BTreeSet::new();
        for s in &stmts {
            match s {
                Stmt::Assign { value, .. } | Stmt::Put { value, .. } => body::tensors_read(value, &mut read),
                Stmt::Let { .. } => {}
            }
        }
        // The output gradient's type: the output's, in f32 where a straight-through
        // gradient of a rounded tensor is.
        let mut dout_ty = def.ret.clone();
        let gdt = dv.grad_dtype(node.output);
        if gdt != fwd.tensor(node.output).dtype {
            dout_ty.dtype = ident(gdt.name(), dout_ty.dtype.span);
        }
        let mut params = vec![OpParam {
            name: ident(&dparam, def.ret.span),
            ty: ParamType::Tensor(dout_ty),
            span: def.ret.span,
        }];
        let mut args = vec![dout.to_string()];
        let mut bound: BTreeSet<String> = BTreeSet::new();
        sym_names(&def.ret, &sig.syms, &mut bound);
        let mut tpos = 0usize;
        let mut rpos = 0usize;
        for p in &def.params {
            match &p.ty {
                ParamType::Tensor(t) => {
                    let here = tpos;
                    tpos += 1;
                    if !read.contains(&p.name.name) {
                        continue;
                    }
                    sym_names(t, &sig.syms, &mut bound);
                    params.push(p.clone());
                    let ft = node.inputs[here];
                    args.push(self.primal(dv, ft)?);
                }
                ParamType::Route(_) => {
                    params.push(p.clone());
                    let rid = *node.routes.get(rpos)?;
                    rpos += 1;
                    args.push(self.routes[rid.0 as usize].spec.name.clone());
                }
            }
        }
        let ParamType::Tensor(pty) = &def.params[pi].ty else {
            return None;
        };
        let mut ret = pty.clone();
        // The gradient's dtype: f32 for a rounded tensor under a straight-through estimator;
        // a generic no parameter binds (the primal input is not read) takes the primal's.
        let primal_dt = fwd.tensor(node.inputs[pos]).dtype;
        let gdt = dv.grad_dtype(node.inputs[pos]);
        // Whether a parameter of the derived op is typed `name` (a generic it binds).
        let binds = |params: &[OpParam], name: &str| {
            params
                .iter()
                .any(|p| matches!(&p.ty, ParamType::Tensor(t) if t.dtype.name == name))
        };
        let is_generic = def.generics.iter().any(|g| g.name == ret.dtype.name);
        if gdt != primal_dt || (is_generic && !binds(&params, &ret.dtype.name)) {
            ret.dtype = ident(gdt.name(), ret.dtype.span);
        }
        // Dimensions no parameter binds take the call's concrete size.
        let concrete = &fwd.tensor(node.inputs[pos]).shape;
        for (d, dim) in ret.dims.iter_mut().enumerate() {
            let mut ns = BTreeSet::new();
            sym_names_expr(dim, &sig.syms, &mut ns);
            if ns.iter().all(|s| bound.contains(s)) {
                continue;
            }
            let c = concrete.get(d)?;
            let route = match c {
                Dim::Recv(rid) => {
                    let i = node.routes.iter().position(|r| r == rid);
                    match i.and_then(|i| route_names.get(i)) {
                        Some(n) => Some(n.clone()),
                        None => {
                            err(
                                self,
                                NonDiff {
                                    span: dim.span,
                                    message:
                                        "the size of this dimension of the gradient is not known to the derived op"
                                            .into(),
                                    label: "a receive window of a routing the op does not take".into(),
                                    help: None,
                                    rounding: false,
                                },
                            );
                            return None;
                        }
                    }
                }
                Dim::Fixed(_) => None,
            };
            *dim = self.dim_syntax(*c, route.as_deref(), dim.span);
        }
        let base = format!("{}_vjp_{}", def.name.name, input);
        // The generics the derived signature still uses.
        let generics = def
            .generics
            .iter()
            .filter(|g| g.name == ret.dtype.name || binds(&params, &g.name))
            .cloned()
            .collect();
        let def_new = OpDef {
            kind: def.kind,
            name: ident(&base, def.name.span),
            generics,
            params,
            ret,
            engine: engine.map(|e| ident(e, def.name.span)),
            tile: Vec::new(),
            body: stmts,
            body_span: def.body_span,
        };
        let opname = self.add_derived_op(
            dv,
            opr.module,
            def_new,
            &def.name.name,
            &input,
            file.items[opr.item].span,
        );
        let gname = format!("d{}", fwd.tensor(node.inputs[pos]).name);
        let cname = if dv.expected.get(&node.inputs[pos]).copied().unwrap_or(0) > 1 {
            fresh(&format!("{gname}_{}", node.name), &mut dv.used)
        } else {
            fresh(&gname, &mut dv.used)
        };
        let mut annots = Vec::new();
        let sp = node.span;
        let tile: Vec<(String, u64)> = tile.into_iter().filter(|(_, s)| *s != u64::MAX).collect();
        if !tile.is_empty() {
            annots.push(tile_annot(&tile, sp));
        }
        if !order.is_empty() {
            annots.push(Annot::Order {
                hints: order.iter().map(|h| ident(h, sp)).collect(),
                span: sp,
            });
        }
        if node.priority != 0 {
            annots.push(Annot::Priority {
                value: int(node.priority.unsigned_abs(), sp),
                span: sp,
            });
        }
        dv.calls.push(Call {
            name: cname.clone(),
            op: opname,
            args,
            annots,
            span: sp,
        });
        Some(cname)
    }

    /// Registers a derived op (one per distinct body), returning the name to call.
    fn add_derived_op(
        &mut self,
        dv: &mut Derivation,
        module: ModId,
        mut def: OpDef,
        op: &str,
        input: &str,
        span: Span,
    ) -> String {
        let base = def.name.name.clone();
        let unnamed = Ident {
            name: String::new(),
            span: Span::default(),
        };
        let name = std::mem::replace(&mut def.name, unnamed);
        let key = (module, format!("{def:?}"));
        def.name = name;
        for &k in dv.op_keys.get(&key).into_iter().flatten() {
            let o = &dv.new_ops[k];
            let mut a = o.def.clone();
            a.name = def.name.clone();
            if a == def && o.module == module {
                return o.def.name.name.clone();
            }
        }
        // The first free name of `base`, `base_2`, `base_3`, ...
        let name_at = |k: u32| if k == 1 { base.clone() } else { format!("{base}_{k}") };
        let mut k = self.derived_name_from.get(&base).copied().unwrap_or(1);
        while self.lookup(self.root, &name_at(k)).is_some() {
            k += 1;
        }
        self.derived_name_from.insert(base.clone(), k);
        let mut n = name_at(k);
        while self.lookup(self.root, &n).is_some() || dv.op_names.contains(&n) {
            k += 1;
            n = name_at(k);
        }
        def.name.name = n.clone();
        dv.op_keys.entry(key).or_default().push(dv.new_ops.len());
        dv.op_names.insert(n.clone());
        dv.new_ops.push(NewOp {
            module,
            def,
            docs: vec![format!(
                "Derived by `grad`: the vector-Jacobian product of `{op}` with respect to `{input}`."
            )],
            span,
        });
        n
    }

    /// The backward name of a forward tensor the backward reads: an input, a saved tensor,
    /// or a recomputed one. The calls a recomputed tensor needs come first, in the order of
    /// their arguments (depth first, with a stack of its own: a chain of calls as long as the
    /// forward's is no recursion).
    fn primal(&mut self, dv: &mut Derivation, t: TensorId) -> Option<String> {
        // (tensor, whether its arguments are named already)
        let mut stack = vec![(t, false)];
        while let Some((u, args_named)) = stack.pop() {
            if dv.primal.contains_key(&u) {
                continue;
            }
            if args_named {
                self.recompute(dv, u)?;
                continue;
            }
            let fwd = dv.fwd;
            let tensor = fwd.tensor(u);
            let Some(p) = tensor.producer.filter(|_| !dv.saved.contains(&u)) else {
                // An input of the forward or a saved tensor: an input of the backward, by name.
                let n = tensor.name.clone();
                dv.inputs.push((n.clone(), u));
                dv.primal.insert(u, n);
                continue;
            };
            let node = &fwd.nodes[p.0 as usize];
            let opr = self.op_item(node.op)?;
            let file = self.file_of(opr);
            let ItemKind::Op(def) = &file.items[opr.item].kind else {
                return None;
            };
            let tensors = def
                .params
                .iter()
                .filter(|prm| matches!(prm.ty, ParamType::Tensor(_)))
                .count();
            let inputs = node.inputs.get(..tensors)?;
            stack.push((u, true));
            // The first argument on top: it and all it needs are named before the second.
            stack.extend(inputs.iter().rev().map(|&a| (a, false)));
        }
        dv.primal.get(&t).cloned()
    }

    /// Recomputes the call that produces `t`, whose tensor arguments are all named.
    fn recompute(&mut self, dv: &mut Derivation, t: TensorId) -> Option<()> {
        let fwd = dv.fwd;
        let tensor = fwd.tensor(t);
        let p = tensor.producer?;
        let node = &fwd.nodes[p.0 as usize];
        let mut args = Vec::new();
        let (mut ti, mut ri) = (0usize, 0usize);
        let opr = self.op_item(node.op)?;
        let file = self.file_of(opr);
        let ItemKind::Op(def) = &file.items[opr.item].kind else {
            return None;
        };
        for prm in &def.params {
            match prm.ty {
                ParamType::Tensor(_) => {
                    let a = *node.inputs.get(ti)?;
                    ti += 1;
                    args.push(dv.primal.get(&a)?.clone());
                }
                ParamType::Route(_) => {
                    let rid = *node.routes.get(ri)?;
                    ri += 1;
                    args.push(self.routes[rid.0 as usize].spec.name.clone());
                }
            }
        }
        // A `let` of the forward keeps its name; a nested call's result (`op#N`) gets one.
        let n = if sanitize(&tensor.name) == tensor.name {
            tensor.name.clone()
        } else {
            fresh(&tensor.name, &mut dv.used)
        };
        let sp = node.span;
        let mut annots = vec![tile_annot(
            &node
                .tile
                .iter()
                .filter(|(_, s)| *s != u64::MAX)
                .cloned()
                .collect::<Vec<_>>(),
            sp,
        )];
        annots.push(Annot::On {
            engine: ident(node.engine.name(), sp),
            span: sp,
        });
        if !node.order.is_empty() {
            annots.push(Annot::Order {
                hints: node.order.iter().map(|h| ident(h, sp)).collect(),
                span: sp,
            });
        }
        dv.recompute.push(Call {
            name: n.clone(),
            op: def.name.name.clone(),
            args,
            annots,
            span: sp,
        });
        dv.primal.insert(t, n);
        Some(())
    }
}

/// The derived taskflow and the derived ops (each with its doc comment), as source text in
/// canonical layout: what `hpmoe fmt --expand-grad` writes in place of the `grad` item. The
/// `grad` item's own doc comments are not part of it (they stay before it in the file).
fn derived_source(ops: &[NewOp], tf: &Taskflow) -> (String, String) {
    let text = |items: Vec<Item>| {
        let mut file = ast::File {
            docs: Vec::new(),
            items,
        };
        ast::erase_spans(&mut file);
        crate::syntax::fmt::format_file(&file, &[], "")
    };
    let taskflow = text(vec![Item {
        docs: Vec::new(),
        kind: ItemKind::Taskflow(Box::new(tf.clone())),
        span: Span::default(),
    }]);
    let ops = text(
        ops.iter()
            .map(|op| Item {
                docs: op.docs.clone(),
                kind: ItemKind::Op(Box::new(op.def.clone())),
                span: Span::default(),
            })
            .collect(),
    );
    (taskflow, ops)
}

fn self_dup(w: &Ident) -> Diagnostic {
    Diagnostic::error(Code::BadGrad, format!("`{}` is named twice in `wrt`", w.name)).primary(w.span, "again here")
}

/// Whether a dtype holds rounded values (an integer or a quantised float).
fn rounded(dt: ir::DType) -> bool {
    dt.is_integer() || dt.rounds_on_store()
}

impl Derivation<'_> {
    /// The dtype of a tensor's gradient: its own, or f32 for an integer or quantised tensor
    /// under a straight-through estimator.
    fn grad_dtype(&self, t: TensorId) -> ir::DType {
        let dt = self.fwd.tensor(t).dtype;
        if !self.straight.is_empty() && rounded(dt) {
            ir::DType::F32
        } else {
            dt
        }
    }

    /// The final gradient of a tensor: its one contribution, or their sum.
    fn grad_of(&mut self, t: TensorId, ck: &mut Checker) -> Option<String> {
        if let Some(g) = self.grads.get(&t) {
            return Some(g.clone());
        }
        let parts = self.pending.remove(&t).unwrap_or_default();
        let g = match parts.as_slice() {
            [] => return None,
            [one] => one.clone(),
            _ => {
                let tensor = self.fwd.tensor(t).clone();
                let rank = tensor.shape.len();
                let op = ck.accumulate_op(self, rank, tensor.span);
                let mut acc = parts[0].clone();
                for (i, p) in parts[1..].iter().enumerate() {
                    let n = if i + 2 == parts.len() {
                        fresh(&format!("d{}", tensor.name), &mut self.used)
                    } else {
                        fresh(&format!("d{}_sum", tensor.name), &mut self.used)
                    };
                    let mut tile = Vec::new();
                    for d in 0..rank.saturating_sub(1) {
                        tile.push((format!("i{d}"), if d + 2 == rank { 64 } else { 1 }));
                    }
                    self.calls.push(Call {
                        name: n.clone(),
                        op: op.clone(),
                        args: vec![acc, p.clone()],
                        annots: if tile.is_empty() {
                            Vec::new()
                        } else {
                            vec![tile_annot(&tile, self.span)]
                        },
                        span: self.span,
                    });
                    acc = n;
                }
                acc
            }
        };
        self.grads.insert(t, g.clone());
        Some(g)
    }
}

impl Checker<'_> {
    /// The elementwise sum of two gradients of rank `rank` (an op in the root module).
    fn accumulate_op(&mut self, dv: &mut Derivation, rank: usize, _span: Span) -> String {
        self.elementwise_op(dv, rank, 2)
    }

    /// A copy of a gradient of rank `rank`.
    fn copy_op(&mut self, dv: &mut Derivation, rank: usize) -> String {
        self.elementwise_op(dv, rank, 1)
    }

    /// `grad_sumN` (`out = a + b`) or, with one operand, `grad_copyN` (`out = a`).
    fn elementwise_op(&mut self, dv: &mut Derivation, rank: usize, operands: usize) -> String {
        let sp = dv.span;
        let vars: Vec<String> = (0..rank).map(|d| format!("i{d}")).collect();
        let syms: Vec<String> = (0..rank).map(|d| format!("N{d}")).collect();
        let ty = TensorType {
            dtype: ident("T", sp),
            dims: syms.iter().map(|s| name(s, sp)).collect(),
            span: sp,
        };
        let ix: Vec<Expr> = vars.iter().map(|v| name(v, sp)).collect();
        let def = OpDef {
            kind: OpKind::Compute,
            name: ident(
                &format!("{}{rank}", if operands == 2 { "grad_sum" } else { "grad_copy" }),
                sp,
            ),
            generics: vec![ident("T", sp)],
            params: ["a", "b"][..operands]
                .iter()
                .map(|p| OpParam {
                    name: ident(p, sp),
                    ty: ParamType::Tensor(ty.clone()),
                    span: sp,
                })
                .collect(),
            ret: ty.clone(),
            engine: Some(ident("aiv", sp)),
            tile: Vec::new(),
            body: vec![Stmt::Assign {
                target: ident("out", sp),
                index: ix.clone(),
                accumulate: false,
                value: if operands == 2 {
                    body::add(body::index("a", ix.clone(), sp), body::index("b", ix, sp))
                } else {
                    body::index("a", ix, sp)
                },
                span: sp,
            }],
            body_span: sp,
        };
        let root = self.root;
        let n = self.add_derived_op(dv, root, def, "+", "both terms", sp);
        if let Some(o) = dv.new_ops.iter_mut().find(|o| o.def.name.name == n) {
            o.docs = vec![if operands == 2 {
                "Derived by `grad`: the sum of two gradients of one tensor.".to_string()
            } else {
                "Derived by `grad`: a copy of an output gradient.".to_string()
            }];
        }
        n
    }
}

fn other(d: body::PutDir) -> body::PutDir {
    match d {
        body::PutDir::Send => body::PutDir::Return,
        body::PutDir::Return => body::PutDir::Send,
    }
}

/// The row variable of a put: `t` of `r.rank(t, j)`, `m` of `r.src_rank(m)`.
fn row_var(body: &[Stmt], _dir: body::PutDir) -> Option<String> {
    body.iter().find_map(|s| match s {
        Stmt::Put { rank, .. } => match &rank.kind {
            ExprKind::Call { args, .. } => args.first().and_then(|a| a.value.name()).map(str::to_string),
            _ => None,
        },
        _ => None,
    })
}

fn call_expr(op: &str, args: &[String], sp: Span) -> Expr {
    Expr {
        kind: ExprKind::Call {
            callee: Box::new(name(op, sp)),
            args: args
                .iter()
                .map(|a| Arg {
                    name: None,
                    value: name(a, sp),
                })
                .collect(),
        },
        span: sp,
    }
}

fn tile_annot(tile: &[(String, u64)], sp: Span) -> Annot {
    Annot::Tile {
        fields: tile
            .iter()
            .map(|(n, s)| Field {
                docs: Vec::new(),
                name: ident(n, sp),
                value: int(*s, sp),
                unit: None,
                span: sp,
            })
            .collect(),
        span: sp,
    }
}

/// Whether two types of a signature are written alike.
fn same_type(a: &TensorType, b: &TensorType) -> bool {
    let show = |t: &TensorType| {
        let mut t = t.clone();
        let mut f = ast::File {
            docs: Vec::new(),
            items: vec![Item {
                docs: Vec::new(),
                kind: ItemKind::Op(Box::new(OpDef {
                    kind: OpKind::Compute,
                    name: ident("", Span::default()),
                    generics: Vec::new(),
                    params: Vec::new(),
                    ret: std::mem::replace(
                        &mut t,
                        TensorType {
                            dtype: ident("", Span::default()),
                            dims: Vec::new(),
                            span: Span::default(),
                        },
                    ),
                    engine: None,
                    tile: Vec::new(),
                    body: Vec::new(),
                    body_span: Span::default(),
                })),
                span: Span::default(),
            }],
        };
        ast::erase_spans(&mut f);
        match f.items.remove(0).kind {
            ItemKind::Op(o) => o.ret,
            _ => unreachable!("built as an op"),
        }
    };
    show(a) == show(b)
}

fn sym_names_expr(e: &Expr, syms: &[String], out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Name(n) if syms.iter().any(|s| **s == **n) => {
            out.insert(n.to_string());
        }
        ExprKind::Neg(a) => sym_names_expr(a, syms, out),
        ExprKind::Binary(_, a, b) => {
            sym_names_expr(a, syms, out);
            sym_names_expr(b, syms, out);
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| sym_names_expr(&a.value, syms, out)),
        _ => {}
    }
}

fn sym_names(t: &TensorType, syms: &[String], out: &mut BTreeSet<String>) {
    for d in &t.dims {
        sym_names_expr(d, syms, out);
    }
}

/// The tile of a derived compute op from the forward call's tile: a variable that keeps its
/// role keeps its size; a forward output variable that the gradient sums and a forward
/// reduction variable that it writes exchange their sizes (so `gmm`'s `m: 128, n: 256,
/// k: 64` gives the input gradient `m: 128, k: 256, n: 64`); a new group variable is one
/// group per tile; a reduction copied from the forward into the derivative is untiled.
/// The derived reductions' sizes are divided by `shrink` (at least 1).
fn derived_tile(
    sig: &super::ops::OpSig,
    node: &ir::Node,
    derived: &[body::DerivedStmt],
    names: &Names,
    shrink: u64,
) -> Vec<(String, u64)> {
    let fsize = |v: &str| node.tile.iter().find(|(n, _)| n == v).map(|(_, s)| *s);
    let is_fwd_out = |v: &str| sig.body.vars.iter().any(|x| x.name == v && x.kind == ir::VarKind::Out);
    let is_fwd_var = |v: &str| sig.body.vars.iter().any(|x| x.name == v);
    // The derived statements' output and reduction variables.
    let mut outs: Vec<String> = Vec::new();
    let mut reds: Vec<String> = Vec::new();
    for s in derived {
        for ix in &s.index {
            let mut ns = BTreeSet::new();
            names_in(ix, &mut ns);
            for n in ns {
                if names.constants.contains(&n) {
                    continue;
                }
                if !outs.contains(&n) {
                    outs.push(n);
                }
            }
        }
        binder_vars(&s.value, &mut reds);
    }
    reds.retain(|v| !outs.contains(v));
    let to_red: Vec<&String> = reds.iter().filter(|v| is_fwd_out(v)).collect();
    let to_out: Vec<&String> = outs.iter().filter(|v| is_fwd_var(v) && !is_fwd_out(v)).collect();
    let mut tile = Vec::new();
    for v in outs.iter().chain(&reds) {
        let size = if let Some(i) = to_red.iter().position(|x| *x == v) {
            to_out.get(i).and_then(|w| fsize(w)).or_else(|| fsize(v))
        } else if let Some(i) = to_out.iter().position(|x| *x == v) {
            to_red.get(i).and_then(|w| fsize(w)).or_else(|| fsize(v))
        } else if is_fwd_var(v) {
            fsize(v)
        } else if outs.contains(v) {
            // A new group variable: one group per task.
            Some(1)
        } else {
            // A reduction copied from the forward: its whole range.
            None
        };
        if let Some(s) = size {
            let s = if reds.contains(v) && s != u64::MAX {
                (s / shrink).max(1)
            } else {
                s
            };
            tile.push((v.clone(), s));
        }
    }
    tile
}

/// Replaces every name of `map` used as a value in `e` (not a callee, a tensor or a routing).
fn subst_names(e: &mut Expr, map: &BTreeMap<String, Expr>) {
    match &mut e.kind {
        ExprKind::Name(n) => {
            if let Some(v) = map.get(&**n) {
                *e = v.clone();
            }
        }
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } | ExprKind::Sum { body: a, .. } => subst_names(a, map),
        ExprKind::Binary(_, a, b) => {
            subst_names(a, map);
            subst_names(b, map);
        }
        ExprKind::Call { args, .. } => args.iter_mut().for_each(|a| subst_names(&mut a.value, map)),
        ExprKind::Index { index, .. } => index.iter_mut().for_each(|i| subst_names(i, map)),
        ExprKind::Tuple(items) => items.iter_mut().for_each(|i| subst_names(i, map)),
        _ => {}
    }
}

fn names_in(e: &Expr, out: &mut BTreeSet<String>) {
    e.for_each_value_name(&mut |n| {
        out.insert(n.to_string());
    });
}

fn binder_vars(e: &Expr, out: &mut Vec<String>) {
    match &e.kind {
        ExprKind::Sum { binders, body, .. } => {
            for b in binders {
                if !out.contains(&b.var().name) {
                    out.push(b.var().name.clone());
                }
            }
            binder_vars(body, out);
        }
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } => binder_vars(a, out),
        ExprKind::Binary(_, a, b) => {
            binder_vars(a, out);
            binder_vars(b, out);
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| binder_vars(&a.value, out)),
        _ => {}
    }
}
