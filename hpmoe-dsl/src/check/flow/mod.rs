//! Taskflows: op calls are resolved, their dtypes and symbolic shapes unified with the
//! arguments, their bodies made concrete (index ranges, coverage of the output), their
//! engines and tiles checked against the device's buffers. Also the schedules.
//!
//! In: the root module's `taskflow` and `schedule` items, with the op signatures of
//! [`super::ops`], the routings of [`super::routes`] and the checked device. Out: the
//! `ir::Taskflow`s and `ir::ScheduleSpec`s of the program, or diagnostics.
//!
//! - this file: taskflow signatures, the flow of calls through a taskflow;
//! - [`linear`]: solving linear dimensions such as `2 * N`;
//! - [`concrete`]: concrete bodies (index ranges, offsets, executable expressions);
//! - [`coverage`]: every output element written exactly once;
//! - [`buffers`]: whether one tile fits the engine's buffers;
//! - [`unify`]: a call's generics and symbolic shapes bound to its arguments;
//! - [`schedules`]: the `schedule` declarations.

mod buffers;
mod concrete;
mod coverage;
mod linear;
mod schedules;
mod unify;

use super::consts::BareNames;
use super::ops::{CastTo, CheckedParam, OpSig, RouteDim, SigDtype, Sym, SymIndex, SymScalar, SymTarget};
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{
    self, BodyStmt, BodyVar, ConcreteBody, Contraction, DType, Dim, Engine, Home, Index, NodeId, RouteId, SExpr,
    Target, Tensor, TensorId, Value, VarKind, VarRange,
};
use crate::syntax::ast::{
    Annot, Expr, ExprKind, FlowStmtKind, ItemKind, ParamType, SignatureKind, TaskflowRet, TensorType,
};
use crate::syntax::token::Span;
use std::collections::BTreeMap;
use std::rc::Rc;

/// A tensor's dtype and dimensions.
type Shape = (DType, Vec<Dim>);

/// An argument of an op call.
#[derive(Clone, Copy, Debug)]
enum CallArg {
    Tensor(TensorId),
    Route(RouteId),
}

/// A bound shape symbol: its value and the argument it came from.
#[derive(Clone, Debug)]
struct Bound {
    dim: Dim,
    span: Span,
    /// (parameter index, dimension) the value came from.
    from: (usize, usize),
}

/// A taskflow under construction: the IR so far and the names in scope.
struct TaskflowDraft {
    module: usize,
    tf: ir::Taskflow,
    /// `let` names and inputs → tensor, definition span, used.
    names: BTreeMap<String, (TensorId, Span, bool)>,
    /// The name of each tensor in `names` (each name has its own tensor), so that a call
    /// marks its inputs' names used without a search of every name.
    tensor_names: rustc_hash::FxHashMap<TensorId, String>,
    /// `let` names whose call failed (already reported): uses stay silent.
    poisoned: std::collections::BTreeSet<String>,
    nested: usize,
}

/// A range being inferred for a body variable.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RangeDraft {
    Unknown,
    Fixed(i64, i64),
    Recv(RouteId),
}

impl Checker<'_> {
    fn flow_dim(&mut self, m: usize, e: &Expr) -> Option<Dim> {
        if let ExprKind::Field { base, field } = &e.kind {
            let rn = base.name().unwrap_or("");
            let r = match self.lookup(m, rn) {
                Some(r) if matches!(self.item(r).kind, ItemKind::Route(_)) => r,
                _ => {
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{rn}` is not a routing"))
                            .primary(base.span, "expected a `route` name"),
                    );
                    return None;
                }
            };
            let id = self.route_id(r)?;
            let spec = self.routes[id.0 as usize].spec.clone();
            let d = super::ops::ROUTE_DIMS
                .iter()
                .find(|(n, _)| *n == field.name)
                .map(|(_, d)| *d);
            return match d {
                Some(RouteDim::Recv) => Some(Dim::Recv(id)),
                Some(RouteDim::Topk) => Some(Dim::Fixed(spec.topk)),
                Some(RouteDim::Experts) => Some(Dim::Fixed(spec.experts)),
                Some(RouteDim::LocalExperts) => Some(Dim::Fixed(spec.local_experts())),
                Some(RouteDim::Ranks) => Some(Dim::Fixed(spec.ranks)),
                Some(RouteDim::Tokens) if matches!(spec.kind, crate::ir::RouteKind::Fanout { .. }) => {
                    spec.kind.derived_from().map(Dim::Recv)
                }
                Some(RouteDim::Tokens) => {
                    let owner = self.token_route(id);
                    match self.routes[owner.0 as usize].tokens_bound {
                        Some(_) => Some(Dim::Fixed(self.routes[owner.0 as usize].spec.tokens)),
                        None => {
                            self.err(
                            Diagnostic::error(Code::UnboundShapeSymbol, format!("`{rn}.tokens` is not known here"))
                                .primary(e.span, "no tensor has been routed through it yet")
                                .help(format!("give the tokens per rank in the declaration: `route {rn} = KIND(..., tokens: N)`")),
                        );
                            None
                        }
                    }
                }
                None => {
                    self.err(
                        Diagnostic::error(
                            Code::UnknownName,
                            format!("a routing has no dimension `{}`", field.name),
                        )
                        .primary(field.span, "unknown"),
                    );
                    None
                }
            };
        }
        let v = self.eval_const(m, e, BareNames::Reject)?;
        let n = self.expect_int(v, e.span, "an integer dimension")?;
        if n < 1 {
            self.err(
                Diagnostic::error(Code::NegativeDimension, format!("dimension {n} must be at least 1"))
                    .primary(e.span, "not a valid size"),
            );
            return None;
        }
        Some(Dim::Fixed(n as u64))
    }

    fn flow_type(&mut self, m: usize, t: &TensorType) -> Option<(DType, Vec<Dim>)> {
        let dtype = match DType::parse(&t.dtype.name) {
            Some(d) => d,
            None => {
                self.err(crate::check::ops::unknown_dtype(&t.dtype, &[]));
                return None;
            }
        };
        if !self.dims_fit(t) {
            return None;
        }
        let mut dims = Vec::new();
        let mut ok = true;
        for d in &t.dims {
            match self.flow_dim(m, d) {
                Some(x) => dims.push(x),
                None => ok = false,
            }
        }
        if ok && !self.tensor_fits(dtype, &dims, t.span) {
            return None;
        }
        ok.then_some((dtype, dims))
    }

    /// Whether a tensor's size in bytes fits in a signed 64-bit integer (received rows count
    /// once); reports an overflow otherwise.
    fn tensor_fits(&mut self, dtype: DType, dims: &[Dim], span: Span) -> bool {
        let mut bytes = dtype.size() as i64;
        for d in dims {
            if let Dim::Fixed(n) = d {
                match i64::try_from(*n).ok().and_then(|n| bytes.checked_mul(n)) {
                    Some(b) => bytes = b,
                    None => {
                        self.err(
                            Diagnostic::error(
                                Code::Overflow,
                                format!("the tensor {} is too large", self.show_shape(dtype, dims)),
                            )
                            .primary(span, "its size in bytes does not fit in 64 bits"),
                        );
                        return false;
                    }
                }
            }
        }
        true
    }

    fn show_dim(&self, d: Dim) -> String {
        match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Recv(r) => format!("{}.recv", self.routes[r.0 as usize].spec.name),
        }
    }

    pub(in crate::check) fn show_shape(&self, dt: DType, dims: &[Dim]) -> String {
        format!(
            "{}[{}]",
            dt.name(),
            dims.iter().map(|d| self.show_dim(*d)).collect::<Vec<_>>().join(", ")
        )
    }

    /// A backward `F_bwd` and its forward `F`: every input of the backward named like a
    /// tensor of the forward is that saved tensor, so it must have its dtype and shape
    /// (E0520).
    pub(super) fn check_layer_pairs(&mut self) {
        let mut errs = Vec::new();
        for b in &self.taskflows {
            let Some(f) = b
                .name
                .strip_suffix("_bwd")
                .and_then(|n| self.taskflows.iter().find(|t| t.name == n))
            else {
                continue;
            };
            for (bi, fi) in b.saved_from(f) {
                let (bt, ft) = (b.tensor(bi), f.tensor(fi));
                if bt.dtype != ft.dtype || bt.shape != ft.shape {
                    errs.push(
                        Diagnostic::error(
                            Code::SavedMismatch,
                            format!(
                                "`{}` of the backward `{}` is `{}` of its forward `{}`, but has type {} where the forward has {}",
                                bt.name,
                                b.name,
                                ft.name,
                                f.name,
                                self.show_shape(bt.dtype, &bt.shape),
                                self.show_shape(ft.dtype, &ft.shape)
                            ),
                        )
                        .primary(bt.span, "this saved activation")
                        .secondary(ft.span, "the forward's tensor")
                        .help(format!(
                            "declare it as {}, or rename it if it is not the forward's `{}`",
                            self.show_shape(ft.dtype, &ft.shape),
                            ft.name
                        )),
                    );
                }
            }
        }
        for d in errs {
            self.err(d);
        }
    }

    pub(super) fn check_taskflow(&mut self, r: ItemRef) {
        let file = self.file_of(r);
        let item = &file.items[r.item];
        let ItemKind::Taskflow(tfd) = &item.kind else { return };
        let mut fl = TaskflowDraft {
            module: r.module,
            tf: ir::Taskflow {
                name: tfd.name.name.clone(),
                tensors: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                nodes: Vec::new(),
                span: item.span,
            },
            names: BTreeMap::new(),
            tensor_names: Default::default(),
            poisoned: Default::default(),
            nested: 0,
        };
        let mut ok = true;
        for p in &tfd.params {
            let ParamType::Tensor(t) = &p.ty else {
                self.err(
                    Diagnostic::error(Code::WrongKind, "a taskflow input is a tensor")
                        .primary(p.span, "routings are declared with `route` at the top level"),
                );
                ok = false;
                continue;
            };
            if fl.names.contains_key(&p.name.name) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateDefinition,
                        format!("input `{}` is declared twice", p.name.name),
                    )
                    .primary(p.name.span, "again here"),
                );
                ok = false;
                continue;
            }
            let Some((dtype, shape)) = self.flow_type(r.module, t) else {
                // Already reported: uses of the input stay silent.
                fl.poisoned.insert(p.name.name.clone());
                ok = false;
                continue;
            };
            let id = TensorId(fl.tf.tensors.len() as u32);
            let grouped = match shape.first() {
                Some(Dim::Recv(r)) => Some(*r),
                _ => None,
            };
            fl.tf.tensors.push(Tensor {
                name: p.name.name.clone(),
                dtype,
                shape,
                home: Home::Input,
                grouped,
                producer: None,
                span: p.span,
            });
            fl.tf.inputs.push(id);
            fl.bind(&p.name.name, id, p.name.span, true);
        }
        // Declared outputs.
        let declared: Vec<(String, Span, Option<Shape>)> = match &tfd.ret {
            TaskflowRet::Single(t) => vec![("out".to_string(), t.span, self.flow_type(r.module, t))],
            TaskflowRet::Named(list) => list
                .iter()
                .map(|(n, t)| (n.name.clone(), t.span, self.flow_type(r.module, t)))
                .collect(),
        };
        // Each output has a name of its own: its `.npy` file in a dump, and the name a
        // backward's saved activation matches.
        if let TaskflowRet::Named(list) = &tfd.ret {
            let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
            for (n, _) in list {
                if let Some(first) = seen.insert(n.name.as_str(), n.span) {
                    self.err(
                        Diagnostic::error(
                            Code::DuplicateDefinition,
                            format!("output `{}` is declared twice", n.name),
                        )
                        .primary(n.span, "again here")
                        .secondary(first, "first declared here"),
                    );
                    ok = false;
                }
            }
        }
        let mut returned = false;
        for st in &tfd.body {
            match &st.kind {
                FlowStmtKind::Let { name, value } => {
                    if returned {
                        self.err(
                            Diagnostic::error(Code::UnexpectedToken, "statement after `return`")
                                .primary(st.span, "never reached"),
                        );
                        ok = false;
                    }
                    if fl.names.contains_key(&name.name) {
                        let prev = fl.names[&name.name].1;
                        self.err(
                            Diagnostic::error(
                                Code::DuplicateDefinition,
                                format!("`{}` is already defined in this taskflow", name.name),
                            )
                            .primary(name.span, "defined again here")
                            .secondary(prev, "first defined here"),
                        );
                        ok = false;
                        continue;
                    }
                    match self.flow_call(&mut fl, value, &st.annots, &name.name, true) {
                        Some(t) => {
                            fl.bind(&name.name, t, name.span, false);
                        }
                        None => {
                            // Names the failed call reads are not "unused".
                            mark_used(&mut fl, value);
                            fl.poisoned.insert(name.name.clone());
                            ok = false;
                        }
                    }
                }
                FlowStmtKind::Return { value } => {
                    returned = true;
                    let items: Vec<&Expr> = match &value.kind {
                        ExprKind::Tuple(xs) => xs.iter().collect(),
                        _ => vec![value],
                    };
                    if items.len() != declared.len() {
                        self.err(
                            Diagnostic::error(
                                Code::WrongArgCount,
                                format!(
                                    "the taskflow returns {} output(s), but `return` gives {}",
                                    declared.len(),
                                    items.len()
                                ),
                            )
                            .primary(value.span, "wrong number of outputs")
                            .secondary(tfd.body_span, "in this taskflow"),
                        );
                        ok = false;
                        continue;
                    }
                    for (e, (oname, dspan, dty)) in items.into_iter().zip(&declared) {
                        let annots = if value.kind == e.kind { &st.annots[..] } else { &[] };
                        let Some(t) = self.flow_call(&mut fl, e, annots, oname, false) else {
                            mark_used(&mut fl, e);
                            ok = false;
                            continue;
                        };
                        // An input and an output are both named in a dump (`NAME.npy`) and
                        // by `--input`: an output named like another tensor's input is
                        // ambiguous.
                        if let Some(&(other, at, _)) = fl.names.get(oname.as_str()) {
                            if other != t && fl.tf.tensor(other).home == Home::Input {
                                self.err(
                                    Diagnostic::error(
                                        Code::DuplicateDefinition,
                                        format!("output `{oname}` has the name of an input of this taskflow, another tensor"),
                                    )
                                    .primary(e.span, format!("output `{oname}` is this value"))
                                    .secondary(at, format!("input `{oname}` is declared here"))
                                    .secondary(*dspan, "the output is declared here")
                                    .help("give the output or the input another name (a dump writes both as `NAME.npy`)"),
                                );
                                ok = false;
                            }
                        }
                        let got = fl.tf.tensor(t).clone();
                        if let Some((dt, dims)) = dty {
                            if got.dtype != *dt || got.shape != *dims {
                                let code = if got.dtype != *dt {
                                    Code::DtypeMismatch
                                } else {
                                    Code::ShapeMismatch
                                };
                                self.err(
                                    Diagnostic::error(
                                        code,
                                        format!(
                                            "output `{oname}` is declared {} but the taskflow returns {}",
                                            self.show_shape(*dt, dims),
                                            self.show_shape(got.dtype, &got.shape)
                                        ),
                                    )
                                    .primary(e.span, format!("this is {}", self.show_shape(got.dtype, &got.shape)))
                                    .secondary(*dspan, "declared here"),
                                );
                                ok = false;
                            }
                        } else {
                            ok = false;
                        }
                        fl.tf.outputs.push((oname.clone(), t));
                    }
                }
            }
        }
        if !returned {
            self.err(
                Diagnostic::error(
                    Code::MissingReturn,
                    format!("taskflow `{}` has no `return`", tfd.name.name),
                )
                .primary(tfd.body_span, "the body must end with `return ...;`"),
            );
            ok = false;
        }
        for (n, (_, sp, used)) in &fl.names {
            // A router's gate is used by the routing it chooses.
            let gate = self
                .routes
                .iter()
                .any(|r| r.gate.as_ref().is_some_and(|(t, g, _)| *t == tfd.name.name && g == n));
            // Without a `return`, what is unused is not known yet.
            if !used && returned && !gate {
                self.diags.push(
                    Diagnostic::warning(Code::UnusedValue, format!("`{n}` is computed but never used"))
                        .primary(*sp, "unused")
                        .help("remove it, or use it"),
                );
            }
        }
        if ok {
            self.taskflows.push(fl.tf);
        }
    }

    /// Checks a call (or a name) in a taskflow; returns the tensor it produces.
    fn flow_call(
        &mut self,
        fl: &mut TaskflowDraft,
        e: &Expr,
        annots: &[Annot],
        name: &str,
        is_let: bool,
    ) -> Option<TensorId> {
        match &e.kind {
            // Already reported where it was parsed.
            ExprKind::Error => None,
            ExprKind::Name(n) => {
                if let Some((t, _, used)) = fl.names.get_mut(&**n) {
                    *used = true;
                    if !annots.is_empty() {
                        let sp = annots[0].span();
                        self.err(
                            Diagnostic::error(Code::UnexpectedToken, "annotations apply to op calls")
                                .primary(sp, "not after a name"),
                        );
                        return None;
                    }
                    if is_let {
                        self.err(
                            Diagnostic::error(Code::WrongKind, format!("`let {name} = {n}` only renames a tensor"))
                                .primary(e.span, "expected an op call")
                                .help(format!("use `{n}` directly")),
                        );
                        return None;
                    }
                    return Some(*t);
                }
                if fl.poisoned.contains(&**n) {
                    return None;
                }
                let locals: Vec<String> = fl.names.keys().cloned().collect();
                if let Some(r) = self.lookup(fl.module, n) {
                    let w = super::consts::item_kind_word(&self.item(r).kind);
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{n}` is {w}, not a tensor"))
                            .primary(e.span, "expected a tensor"),
                    );
                } else {
                    self.unknown_name_among(fl.module, n, e.span, "tensor", &locals);
                }
                None
            }
            ExprKind::Call { callee, args } => {
                let Some(fname) = callee.name() else {
                    self.err(
                        Diagnostic::error(Code::WrongKind, "only ops can be called")
                            .primary(callee.span, "expected an op name"),
                    );
                    return None;
                };
                let op_ref = match self.lookup(fl.module, fname) {
                    Some(r) if matches!(self.item(r).kind, ItemKind::Op(_)) => r,
                    Some(r) => {
                        let w = super::consts::item_kind_word(&self.item(r).kind);
                        self.err(
                            Diagnostic::error(Code::WrongKind, format!("`{fname}` is {w}, not an op"))
                                .primary(callee.span, "cannot be called"),
                        );
                        return None;
                    }
                    None if fl.names.contains_key(fname) || fl.poisoned.contains(fname) => {
                        mark_used(fl, e);
                        if fl.names.contains_key(fname) {
                            self.err(
                                Diagnostic::error(Code::WrongKind, format!("`{fname}` is a tensor, not an op"))
                                    .primary(callee.span, "cannot be called")
                                    .help("only ops and comm ops can be called"),
                            );
                        }
                        return None;
                    }
                    None => {
                        mark_used(fl, e);
                        self.unknown_op(fl.module, fname, callee.span);
                        return None;
                    }
                };
                // Arguments (nested calls first).
                let mut vals = Vec::with_capacity(args.len());
                let mut spans = Vec::with_capacity(args.len());
                let mut ok = true;
                for a in args {
                    if let Some(n) = &a.name {
                        self.err(
                            Diagnostic::error(Code::UnknownArgument, "op arguments are positional")
                                .primary(n.span, "remove the name"),
                        );
                        ok = false;
                        continue;
                    }
                    spans.push(a.value.span);
                    match &a.value.kind {
                        ExprKind::Name(n)
                            if !fl.names.contains_key(&**n)
                                && self
                                    .lookup(fl.module, n)
                                    .is_some_and(|r| matches!(self.item(r).kind, ItemKind::Route(_))) =>
                        {
                            let rr = self.lookup(fl.module, n)?;
                            match self.route_id(rr) {
                                Some(id) => vals.push(CallArg::Route(id)),
                                None => ok = false,
                            }
                        }
                        ExprKind::Call { .. } => {
                            fl.nested += 1;
                            let nm = format!("{}#{}", KindName::kind_name(&a.value.kind), fl.nested);
                            match self.flow_call(fl, &a.value, &[], &nm, false) {
                                Some(t) => vals.push(CallArg::Tensor(t)),
                                None => ok = false,
                            }
                        }
                        _ => match self.flow_call(fl, &a.value, &[], "", false) {
                            Some(t) => vals.push(CallArg::Tensor(t)),
                            None => ok = false,
                        },
                    }
                }
                let sig = self.op_sig(op_ref)?;
                if !ok {
                    return None;
                }
                self.instantiate(fl, &sig, &vals, &spans, e.span, annots, name)
            }
            _ => {
                self.err(
                    Diagnostic::error(Code::WrongKind, "expected an op call or a tensor name")
                        .primary(e.span, "not a call"),
                );
                None
            }
        }
    }

    fn unknown_op(&mut self, m: usize, fname: &str, span: Span) {
        if self.modules[m].poisoned.contains(fname) {
            return;
        }
        // Known in the stdlib but not imported?
        if let Some(sm) = self
            .modules
            .iter()
            .position(|x| x.std_name.as_deref() == Some("moe"))
            .or_else(|| self.load_std("moe", &mut Vec::new()))
        {
            if self.modules[sm]
                .ast
                .items
                .iter()
                .any(|it| matches!(it.kind, ItemKind::Op(_)) && it.kind.name().is_some_and(|n| n.name == fname))
            {
                self.err(
                    Diagnostic::error(Code::UnknownName, format!("unknown op `{fname}`"))
                        .primary(span, "not imported")
                        .help(format!("import it: `import std::moe::{fname};`")),
                );
                return;
            }
        }
        let mut d = Diagnostic::error(Code::UnknownName, format!("unknown op `{fname}`")).primary(span, "not defined");
        if crate::suggest::has_budget() {
            let mut cands = self.names_where(m, |k| matches!(k, ItemKind::Op(_)));
            if let Some(sm) = self.modules.iter().position(|x| x.std_name.as_deref() == Some("moe")) {
                cands.extend(self.modules[sm].ast.items.iter().filter_map(|it| match &it.kind {
                    ItemKind::Op(o) => Some(o.name.name.clone()),
                    _ => None,
                }));
            }
            if let Some(b) = crate::suggest::closest(fname, cands.iter().map(|s| s.as_str())) {
                d = d.help(format!("did you mean `{b}`?"));
            }
        }
        self.err(d);
    }
}

impl TaskflowDraft {
    /// Binds a name to a tensor (the name's definition span, whether it counts as used).
    fn bind(&mut self, name: &str, t: TensorId, span: Span, used: bool) {
        self.names.insert(name.to_string(), (t, span, used));
        self.tensor_names.insert(t, name.to_string());
    }

    /// Marks the name of tensor `t`, if it has one, as used.
    fn mark_tensor_used(&mut self, t: TensorId) {
        if let Some(e) = self.tensor_names.get(&t).and_then(|n| self.names.get_mut(n)) {
            e.2 = true;
        }
    }
}

/// Marks every taskflow name an expression reads as used.
fn mark_used(fl: &mut TaskflowDraft, e: &Expr) {
    match &e.kind {
        ExprKind::Name(n) => {
            if let Some((_, _, used)) = fl.names.get_mut(&**n) {
                *used = true;
            }
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| mark_used(fl, &a.value)),
        ExprKind::Tuple(xs) => xs.iter().for_each(|x| mark_used(fl, x)),
        _ => {}
    }
}

trait KindName {
    fn kind_name(&self) -> String;
}

impl KindName for ExprKind {
    fn kind_name(&self) -> String {
        match self {
            ExprKind::Call { callee, .. } => callee.name().unwrap_or("call").to_string(),
            _ => "value".into(),
        }
    }
}
