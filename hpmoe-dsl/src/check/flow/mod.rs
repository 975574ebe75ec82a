//! Taskflows: op calls are resolved, their dtypes and symbolic shapes unified with the
//! arguments, their bodies made concrete (index ranges, coverage of the output), their
//! engines and tiles checked against the device's buffers. Also the schedules.
//!
//! In: the root module's `taskflow` and `schedule` items, with the op signatures of
//! [`super::ops`], the routings of [`super::routes`] and the checked device. Out: the
//! `ir::Taskflow`s and `ir::ScheduleSpec`s of the program, or diagnostics.
//!
//! - this file: taskflow signatures and calls, unification of dtypes and shapes;
//! - [`linear`]: solving linear dimensions such as `2 * N`;
//! - [`concrete`]: concrete bodies (index ranges, offsets, executable expressions);
//! - [`coverage`]: every output element written exactly once;
//! - [`buffers`]: whether one tile fits the engine's buffers;
//! - [`schedules`]: the `schedule` declarations.

mod buffers;
mod concrete;
mod coverage;
mod linear;
mod schedules;

use super::consts::BareNames;
use super::ops::{CheckedParam, OpSig, RouteDim, SigDtype, Sym, SymIndex, SymScalar, SymTarget};
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
enum ArgVal {
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

struct Flow {
    module: usize,
    tf: ir::Taskflow,
    /// `let` names and inputs → tensor, definition span, used.
    names: BTreeMap<String, (TensorId, Span, bool)>,
    /// `let` names whose call failed (already reported): uses stay silent.
    poisoned: std::collections::BTreeSet<String>,
    nested: usize,
}

/// A range being inferred for a body variable.
#[derive(Clone, Copy, Debug, PartialEq)]
enum R {
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
                Some(RouteDim::Tokens) => match self.routes[id.0 as usize].tokens_bound {
                    Some(_) => Some(Dim::Fixed(spec.tokens)),
                    None => {
                        self.err(
                            Diagnostic::error(Code::UnboundShapeSymbol, format!("`{rn}.tokens` is not known here"))
                                .primary(e.span, "no tensor has been routed through it yet")
                                .help("use the param that sizes the tokens"),
                        );
                        None
                    }
                },
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
                let mut d = Diagnostic::error(Code::UnknownDtype, format!("unknown dtype `{}`", t.dtype.name))
                    .primary(t.dtype.span, "not a dtype");
                if let Some(b) = crate::suggest::closest(&t.dtype.name, ["bf16", "f16", "f32", "i32"].into_iter()) {
                    d = d.help(format!("did you mean `{b}`?"));
                }
                self.err(d);
                return None;
            }
        };
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

    fn show_shape(&self, dt: DType, dims: &[Dim]) -> String {
        format!(
            "{}[{}]",
            dt.name(),
            dims.iter().map(|d| self.show_dim(*d)).collect::<Vec<_>>().join(", ")
        )
    }

    pub(super) fn check_taskflow(&mut self, r: ItemRef) {
        let file = self.file_of(r);
        let item = &file.items[r.item];
        let ItemKind::Taskflow(tfd) = &item.kind else { return };
        let mut fl = Flow {
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
            fl.names.insert(p.name.name.clone(), (id, p.name.span, true));
        }
        // Declared outputs.
        let declared: Vec<(String, Span, Option<Shape>)> = match &tfd.ret {
            TaskflowRet::Single(t) => vec![("out".to_string(), t.span, self.flow_type(r.module, t))],
            TaskflowRet::Named(list) => list
                .iter()
                .map(|(n, t)| (n.name.clone(), t.span, self.flow_type(r.module, t)))
                .collect(),
        };
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
                            fl.names.insert(name.name.clone(), (t, name.span, false));
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
            // Without a `return`, what is unused is not known yet.
            if !used && returned {
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
    fn flow_call(&mut self, fl: &mut Flow, e: &Expr, annots: &[Annot], name: &str, is_let: bool) -> Option<TensorId> {
        match &e.kind {
            ExprKind::Name(n) => {
                if let Some((t, _, used)) = fl.names.get_mut(n) {
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
                if fl.poisoned.contains(n) {
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
                            if !fl.names.contains_key(n)
                                && self
                                    .lookup(fl.module, n)
                                    .is_some_and(|r| matches!(self.item(r).kind, ItemKind::Route(_))) =>
                        {
                            let rr = self.lookup(fl.module, n)?;
                            match self.route_id(rr) {
                                Some(id) => vals.push(ArgVal::Route(id)),
                                None => ok = false,
                            }
                        }
                        ExprKind::Call { .. } => {
                            fl.nested += 1;
                            let nm = format!("{}#{}", KindName::kind_name(&a.value.kind), fl.nested);
                            match self.flow_call(fl, &a.value, &[], &nm, false) {
                                Some(t) => vals.push(ArgVal::Tensor(t)),
                                None => ok = false,
                            }
                        }
                        _ => match self.flow_call(fl, &a.value, &[], "", false) {
                            Some(t) => vals.push(ArgVal::Tensor(t)),
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
        let mut cands = self.names_where(m, |k| matches!(k, ItemKind::Op(_)));
        if let Some(sm) = self.modules.iter().position(|x| x.std_name.as_deref() == Some("moe")) {
            cands.extend(self.modules[sm].ast.items.iter().filter_map(|it| match &it.kind {
                ItemKind::Op(o) => Some(o.name.name.clone()),
                _ => None,
            }));
        }
        let mut d = Diagnostic::error(Code::UnknownName, format!("unknown op `{fname}`")).primary(span, "not defined");
        if let Some(b) = crate::suggest::closest(fname, cands.iter().map(|s| s.as_str())) {
            d = d.help(format!("did you mean `{b}`?"));
        }
        self.err(d);
    }

    /// Evaluates a symbolic integer. `Ok(None)`: depends on an unbound symbol.
    fn eval_sym(
        &mut self,
        s: &Sym,
        binds: &[Option<Bound>],
        routes: &[Option<RouteId>],
        span: Span,
    ) -> Result<Option<Dim>, ()> {
        match s {
            // Negative values travel wrapped in `Dim::Fixed` and are read back as i64.
            Sym::Int(i) => Ok(Some(Dim::Fixed(*i as u64))),
            Sym::Var(v) => Ok(binds.get(*v).and_then(|b| b.as_ref()).map(|b| b.dim)),
            Sym::Route(p, d) => {
                let Some(id) = routes.get(*p).copied().flatten() else {
                    return Ok(None);
                };
                let st = &self.routes[id.0 as usize];
                Ok(match d {
                    RouteDim::Recv => Some(Dim::Recv(id)),
                    RouteDim::Tokens => st.tokens_bound.map(|_| Dim::Fixed(st.spec.tokens)),
                    RouteDim::Topk => Some(Dim::Fixed(st.spec.topk)),
                    RouteDim::Experts => Some(Dim::Fixed(st.spec.experts)),
                    RouteDim::LocalExperts => Some(Dim::Fixed(st.spec.local_experts())),
                    RouteDim::Ranks => Some(Dim::Fixed(st.spec.ranks)),
                })
            }
            Sym::Neg(a) => {
                let Some(x) = self.eval_sym(a, binds, routes, span)? else {
                    return Ok(None);
                };
                let x = self.fixed_of(x, span)?;
                let Some(neg) = x.checked_neg() else {
                    self.overflow(span);
                    return Err(());
                };
                self.int_dim(neg, span)
            }
            Sym::Bin(_, a, b) | Sym::Call(_, a, b) => {
                let x = self.eval_sym(a, binds, routes, span)?;
                let y = self.eval_sym(b, binds, routes, span)?;
                let (Some(x), Some(y)) = (x, y) else { return Ok(None) };
                let x = self.fixed_of(x, span)?;
                let y = self.fixed_of(y, span)?;
                let r = match s {
                    Sym::Bin(op, ..) => match self.arith(*op, Value::Int(x), Value::Int(y), span, span) {
                        Some(Value::Int(v)) => v,
                        _ => return Err(()),
                    },
                    Sym::Call(f, ..) => match f.as_str() {
                        "min" => x.min(y),
                        "max" => x.max(y),
                        _ if y == 0 => {
                            self.err(
                                Diagnostic::error(Code::DivisionByZero, "division by zero in a dimension")
                                    .primary(span, "here"),
                            );
                            return Err(());
                        }
                        f => {
                            let q = x.checked_div_euclid(y).zip(x.checked_rem_euclid(y)).and_then(|(q, r)| {
                                if f == "floor_div" || r == 0 {
                                    Some(q)
                                } else {
                                    q.checked_add(1)
                                }
                            });
                            match q {
                                Some(q) => q,
                                None => {
                                    self.overflow(span);
                                    return Err(());
                                }
                            }
                        }
                    },
                    _ => return Err(()),
                };
                self.int_dim(r, span)
            }
        }
    }

    /// An integer as a dimension value (negative values are kept as a "fixed" wrap-free
    /// marker only for offsets; callers of dimensions check positivity).
    fn int_dim(&mut self, v: i64, _span: Span) -> Result<Option<Dim>, ()> {
        Ok(Some(Dim::Fixed(v as u64)))
    }

    fn fixed_of(&mut self, d: Dim, span: Span) -> Result<i64, ()> {
        match d {
            Dim::Fixed(n) => Ok(n as i64),
            Dim::Recv(r) => {
                let name = self.routes[r.0 as usize].spec.name.clone();
                self.err(
                    Diagnostic::error(
                        Code::ShapeMismatch,
                        format!("`{name}.recv` is ragged and cannot be used in arithmetic"),
                    )
                    .primary(span, "arithmetic on a ragged dimension")
                    .note("the number of received rows differs per rank; it can only be passed through whole"),
                );
                Err(())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn instantiate(
        &mut self,
        fl: &mut Flow,
        sig: &Rc<OpSig>,
        vals: &[ArgVal],
        spans: &[Span],
        call_span: Span,
        annots: &[Annot],
        name: &str,
    ) -> Option<TensorId> {
        if vals.len() != sig.params.len() {
            self.err(
                Diagnostic::error(
                    Code::WrongArgCount,
                    format!(
                        "`{}` takes {} argument(s), got {}",
                        sig.name,
                        sig.params.len(),
                        vals.len()
                    ),
                )
                .primary(call_span, "wrong number of arguments")
                .note(format!("the signature is `{}`", sig.signature_text()))
                .secondary(sig.name_span, "defined here"),
            );
            return None;
        }
        let mut gen: Vec<Option<(DType, Span, String)>> = vec![None; sig.generics.len()];
        let mut routes: Vec<Option<RouteId>> = vec![None; sig.params.len()];
        let mut ok = true;
        // Kinds, routing params, dtypes, ranks.
        for (i, (p, v)) in sig.params.iter().zip(vals).enumerate() {
            match (p, v) {
                (CheckedParam::Route { .. }, ArgVal::Route(id)) => routes[i] = Some(*id),
                (CheckedParam::Tensor { name: pn, ty, .. }, ArgVal::Tensor(t)) => {
                    let tt = fl.tf.tensor(*t).clone();
                    if tt.shape.len() != ty.dims.len() {
                        self.err(
                            Diagnostic::error(
                                Code::RankMismatch,
                                format!(
                                    "`{}` expects `{pn}` with {} dimension(s), got `{}` with {}",
                                    sig.name,
                                    ty.dims.len(),
                                    tt.name,
                                    tt.shape.len()
                                ),
                            )
                            .primary(spans[i], format!("this is {}", self.show_shape(tt.dtype, &tt.shape)))
                            .note(format!("the signature is `{}`", sig.signature_text())),
                        );
                        ok = false;
                    }
                    match ty.dtype {
                        SigDtype::Concrete(d) if d != tt.dtype => {
                            self.err(
                                Diagnostic::error(
                                    Code::DtypeMismatch,
                                    format!(
                                        "`{}` expects `{pn}` of dtype {}, got {}",
                                        sig.name,
                                        d.name(),
                                        tt.dtype.name()
                                    ),
                                )
                                .primary(spans[i], format!("this is {}", tt.dtype.name())),
                            );
                            ok = false;
                        }
                        SigDtype::Generic(g) => match &gen[g] {
                            Some((d, sp, from)) if *d != tt.dtype => {
                                self.err(
                                    Diagnostic::error(
                                        Code::DtypeMismatch,
                                        format!(
                                            "`{}` is {} from `{from}` but {} from `{pn}`",
                                            sig.generics[g],
                                            d.name(),
                                            tt.dtype.name()
                                        ),
                                    )
                                    .primary(spans[i], format!("this is {}", tt.dtype.name()))
                                    .secondary(*sp, format!("{} = {} from here", sig.generics[g], d.name()))
                                    .help("convert one of them, or make the op generic over two dtypes"),
                                );
                                ok = false;
                            }
                            Some(_) => {}
                            None => gen[g] = Some((tt.dtype, spans[i], pn.clone())),
                        },
                        _ => {}
                    }
                }
                (CheckedParam::Route { name: pn, .. }, ArgVal::Tensor(t)) => {
                    let tn = fl.tf.tensor(*t).name.clone();
                    self.err(
                        Diagnostic::error(
                            Code::WrongKind,
                            format!("`{}` expects a routing for `{pn}`, got the tensor `{tn}`", sig.name),
                        )
                        .primary(spans[i], "expected a routing"),
                    );
                    ok = false;
                }
                (CheckedParam::Tensor { name: pn, .. }, ArgVal::Route(r)) => {
                    let rn = self.routes[r.0 as usize].spec.name.clone();
                    self.err(
                        Diagnostic::error(
                            Code::WrongKind,
                            format!("`{}` expects a tensor for `{pn}`, got the routing `{rn}`", sig.name),
                        )
                        .primary(spans[i], "expected a tensor"),
                    );
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        // Shape unification.
        let mut binds: Vec<Option<Bound>> = vec![None; sig.syms.len()];
        struct C<'s> {
            sym: &'s Sym,
            actual: Dim,
            span: Span,
            /// (parameter index, dimension).
            desc: (usize, usize),
        }
        let describe = |(pi, k): (usize, usize)| format!("dimension {k} of `{}`", sig.params[pi].name());
        let mut pending = Vec::with_capacity(
            sig.params
                .iter()
                .map(|p| match p {
                    CheckedParam::Tensor { ty, .. } => ty.dims.len(),
                    CheckedParam::Route { .. } => 0,
                })
                .sum(),
        );
        for (i, (p, v)) in sig.params.iter().zip(vals).enumerate() {
            if let (CheckedParam::Tensor { ty, .. }, ArgVal::Tensor(t)) = (p, v) {
                let tt = fl.tf.tensor(*t);
                for (k, (s, d)) in ty.dims.iter().zip(&tt.shape).enumerate() {
                    pending.push(C {
                        sym: s,
                        actual: *d,
                        span: spans[i],
                        desc: (i, k),
                    });
                }
            }
        }
        loop {
            let mut progress = false;
            let mut next = Vec::new();
            for c in pending {
                match self.eval_sym(c.sym, &binds, &routes, c.span) {
                    Err(()) => ok = false,
                    Ok(Some(d)) => {
                        if d != c.actual {
                            let shown = c.sym.show(&sig.syms, &sig.params);
                            let mut vs = Vec::new();
                            c.sym.vars(&mut vs);
                            let mut diag = Diagnostic::error(
                                Code::ShapeMismatch,
                                format!(
                                    "shape mismatch in `{}`: {} is {}, but the signature says {shown} = {}",
                                    sig.name,
                                    describe(c.desc),
                                    self.show_dim(c.actual),
                                    self.show_dim(d)
                                ),
                            )
                            .primary(c.span, format!("{} is {}", describe(c.desc), self.show_dim(c.actual)));
                            for v in vs {
                                if let Some(b) = &binds[v] {
                                    let bd = self.show_dim(b.dim);
                                    diag = diag
                                        .secondary(b.span, format!("{} = {bd} from {}", sig.syms[v], describe(b.from)));
                                }
                            }
                            if let Sym::Route(p, rd) = &c.sym {
                                if let Some(id) = routes[*p] {
                                    if *rd == RouteDim::Tokens {
                                        if let Some(bs) = self.routes[id.0 as usize].tokens_bound {
                                            diag = diag.secondary(
                                                bs,
                                                format!(
                                                    "{}.tokens = {} from here",
                                                    self.routes[id.0 as usize].spec.name,
                                                    self.routes[id.0 as usize].spec.tokens
                                                ),
                                            );
                                        }
                                    }
                                }
                            }
                            diag = diag.note(format!("the signature is `{}`", sig.signature_text()));
                            self.err(diag);
                            ok = false;
                        }
                    }
                    Ok(None) => {
                        if let Sym::Var(v) = &c.sym {
                            binds[*v] = Some(Bound {
                                dim: c.actual,
                                span: c.span,
                                from: c.desc,
                            });
                            progress = true;
                        } else if let (Sym::Route(p, RouteDim::Tokens), Dim::Fixed(n)) = (&c.sym, c.actual) {
                            if let Some(id) = routes[*p] {
                                let st = &mut self.routes[id.0 as usize];
                                st.spec.tokens = n;
                                st.tokens_bound = Some(c.span);
                                progress = true;
                            }
                        } else if let Some((v, val)) = self.solve_linear(c.sym, c.actual, &binds, &routes, c.span) {
                            binds[v] = Some(Bound {
                                dim: Dim::Fixed(val),
                                span: c.span,
                                from: c.desc,
                            });
                            progress = true;
                            // Re-check this constraint with the binding.
                            next.push(c);
                        } else {
                            next.push(c);
                        }
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            if !progress {
                for c in next {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!(
                                "cannot determine {} of `{}` from `{}`",
                                c.sym.show(&sig.syms, &sig.params),
                                sig.name,
                                self.show_dim(c.actual)
                            ),
                        )
                        .primary(c.span, "this dimension does not determine the symbols")
                        .note(format!("the signature is `{}`", sig.signature_text())),
                    );
                }
                ok = false;
                break;
            }
            pending = next;
        }
        if !ok {
            return None;
        }
        // The result.
        let dtype = match sig.ret.dtype {
            SigDtype::Concrete(d) => d,
            SigDtype::Generic(g) => gen[g].as_ref()?.0,
        };
        let mut out_shape = Vec::with_capacity(sig.ret.dims.len());
        for (s, sp) in sig.ret.dims.iter().zip(&sig.ret.dim_spans) {
            match self.eval_sym(s, &binds, &routes, call_span) {
                Ok(Some(Dim::Fixed(n))) if n as i64 >= 1 => out_shape.push(Dim::Fixed(n)),
                Ok(Some(Dim::Recv(r))) => out_shape.push(Dim::Recv(r)),
                Ok(Some(Dim::Fixed(n))) => {
                    self.err(
                        Diagnostic::error(
                            Code::NegativeDimension,
                            format!("the result of `{}` would have dimension {}", sig.name, n as i64),
                        )
                        .primary(call_span, "in this call")
                        .secondary(*sp, "computed from this"),
                    );
                    return None;
                }
                Ok(None) => {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!(
                                "the result dimension {} of `{}` is not determined",
                                s.show(&sig.syms, &sig.params),
                                sig.name
                            ),
                        )
                        .primary(call_span, "in this call")
                        .secondary(*sp, "this dimension"),
                    );
                    return None;
                }
                Err(()) => return None,
            }
        }
        if !self.tensor_fits(dtype, &out_shape, call_span) {
            return None;
        }
        // Inputs' dtypes and shapes.
        let inputs: Vec<TensorId> = vals
            .iter()
            .filter_map(|v| match v {
                ArgVal::Tensor(t) => Some(*t),
                ArgVal::Route(_) => None,
            })
            .collect();
        let route_ids: Vec<RouteId> = routes.iter().flatten().copied().collect();
        for t in &inputs {
            if let Some((_, _, used)) = fl.names.values_mut().find(|(id, _, _)| id == t) {
                *used = true;
            }
        }
        let in_shapes: Vec<(DType, Vec<Dim>)> = inputs
            .iter()
            .map(|t| (fl.tf.tensor(*t).dtype, fl.tf.tensor(*t).shape.clone()))
            .collect();
        // Calls of one op with the same argument types have the same concrete body. The key
        // is copied only when it is new.
        let key = (sig.id, in_shapes, routes);
        let body = match self.bodies.get(&key) {
            Some(b) => b.clone(),
            None => {
                let b = std::sync::Arc::new(self.concretize(sig, &binds, &key.2, &key.1, &out_shape, call_span)?);
                self.bodies.insert(key.clone(), b.clone());
                b
            }
        };
        let (_, in_shapes, routes) = key;
        // Annotations.
        let mut engine = sig.engine;
        let mut tile_over: Vec<(String, u64, Span)> = Vec::new();
        let mut order = Vec::new();
        let mut priority = 0i64;
        // The last span of each kind of annotation seen.
        let mut seen_annot: [Option<Span>; 4] = [None; 4];
        for a in annots {
            let (key, slot) = match a {
                Annot::Tile { .. } => ("tile", 0),
                Annot::On { .. } => ("on", 1),
                Annot::Order { .. } => ("order", 2),
                Annot::Priority { .. } => ("priority", 3),
            };
            if let Some(prev) = seen_annot[slot].replace(a.span()) {
                self.err(
                    Diagnostic::error(Code::DuplicateArgument, format!("`{key}` is given twice"))
                        .primary(a.span(), "again here")
                        .secondary(prev, "first here"),
                );
                ok = false;
                continue;
            }
            match a {
                Annot::On { engine: e, .. } => match Engine::parse(&e.name) {
                    Some(x) => {
                        if sig.is_comm && x != Engine::Aiv {
                            self.err(
                                Diagnostic::error(
                                    Code::WrongEngine,
                                    format!(
                                        "`{}` communicates, which the vector cores drive; it cannot run on `{}`",
                                        sig.name, e.name
                                    ),
                                )
                                .primary(e.span, "comm ops run on aiv"),
                            );
                            ok = false;
                        } else if x == Engine::Aic && sig.contraction.is_none() {
                            self.err(
                                Diagnostic::error(
                                    Code::WrongEngine,
                                    format!("`{}` is not a contraction, so the cube cores cannot run it", sig.name),
                                )
                                .primary(e.span, "`aic` runs only `sum(k) a[..] * b[..]`")
                                .secondary(sig.body_span, "the op's body")
                                .help("remove `on aic`"),
                            );
                            ok = false;
                        } else {
                            engine = x;
                        }
                    }
                    None => {
                        let mut d = Diagnostic::error(Code::UnknownEngine, format!("unknown engine `{}`", e.name))
                            .primary(e.span, "expected `aic` or `aiv`");
                        if let Some(b) = crate::suggest::closest(&e.name, ["aic", "aiv"].into_iter()) {
                            d = d.help(format!("did you mean `{b}`?"));
                        }
                        self.err(d);
                        ok = false;
                    }
                },
                Annot::Tile { fields, .. } => {
                    for f in fields {
                        if let Some(prev) = tile_over.iter().find(|(n, _, _)| *n == f.name.name) {
                            let p = prev.2;
                            self.err(
                                Diagnostic::error(
                                    Code::DuplicateArgument,
                                    format!("tile key `{}` is given twice", f.name.name),
                                )
                                .primary(f.span, "again here")
                                .secondary(p, "first here"),
                            );
                            ok = false;
                            continue;
                        }
                        if !body.vars.iter().any(|v| v.name == f.name.name) {
                            let mut names: Vec<String> = body.vars.iter().map(|v| v.name.clone()).collect();
                            names.sort();
                            names.dedup();
                            let mut d = Diagnostic::error(
                                Code::BadTile,
                                format!("`{}` is not an index variable of `{}`", f.name.name, sig.name),
                            )
                            .primary(f.name.span, "unknown tile key");
                            d = match crate::suggest::closest(&f.name.name, names.iter().map(|s| s.as_str())) {
                                Some(b) => d.help(format!(
                                    "did you mean `{b}`? the index variables are: {}",
                                    names.join(", ")
                                )),
                                None => d.help(format!(
                                    "the index variables of `{}` are: {}",
                                    sig.name,
                                    names.join(", ")
                                )),
                            };
                            self.err(d);
                            ok = false;
                            continue;
                        }
                        let Some(v) = self.eval_const(fl.module, &f.value, BareNames::Reject) else {
                            ok = false;
                            continue;
                        };
                        let Some(n) = self.expect_int(v, f.value.span, "an integer tile size") else {
                            ok = false;
                            continue;
                        };
                        if n < 1 {
                            self.err(
                                Diagnostic::error(
                                    Code::BadTile,
                                    format!("tile size {n} for `{}` must be at least 1", f.name.name),
                                )
                                .primary(f.value.span, "too small"),
                            );
                            ok = false;
                            continue;
                        }
                        tile_over.push((f.name.name.clone(), n as u64, f.span));
                    }
                }
                Annot::Order { hints, .. } => {
                    for h in hints {
                        if h.name != "ratr" {
                            let mut d =
                                Diagnostic::error(Code::UnknownArgument, format!("unknown ordering hint `{}`", h.name))
                                    .primary(h.span, "not a hint");
                            d = d.help(if crate::suggest::closest(&h.name, ["ratr"].into_iter()).is_some() {
                                "did you mean `ratr`?"
                            } else {
                                "the ordering hint is `ratr` (rank-aware reordering of communication tiles)"
                            });
                            self.err(d);
                            ok = false;
                        } else if !sig.is_comm {
                            self.err(
                                Diagnostic::error(
                                    Code::InvalidValue,
                                    format!(
                                        "`order(ratr)` reorders communication, but `{}` does not communicate",
                                        sig.name
                                    ),
                                )
                                .primary(h.span, "only for comm ops"),
                            );
                            ok = false;
                        } else {
                            order.push(h.name.clone());
                        }
                    }
                }
                Annot::Priority { value, .. } => {
                    let Some(v) = self.eval_const(fl.module, value, BareNames::Reject) else {
                        ok = false;
                        continue;
                    };
                    match self.expect_int(v, value.span, "an integer priority") {
                        Some(p) => priority = p,
                        None => ok = false,
                    }
                }
            }
        }
        if !ok {
            return None;
        }
        // Tiles: call > op default > whole range.
        let mut names: Vec<String> = Vec::with_capacity(body.vars.len());
        for v in &body.vars {
            if !names.contains(&v.name) {
                names.push(v.name.clone());
            }
        }
        let mut tile = Vec::with_capacity(names.len());
        for n in names {
            let size = tile_over
                .iter()
                .find(|(k, _, _)| *k == n)
                .map(|(_, s, _)| *s)
                .or_else(|| sig.tile.iter().find(|(k, _, _)| *k == n).map(|(_, s, _)| *s));
            let extent = body
                .vars
                .iter()
                .filter(|v| v.name == n)
                .filter_map(|v| match v.range {
                    VarRange::Fixed { lo, hi } => Some((hi - lo).max(0) as u64),
                    _ => None,
                })
                .max();
            let size = match (size, extent) {
                (Some(s), Some(e)) => s.min(e.max(1)),
                (Some(s), None) => s,
                (None, Some(e)) => e.max(1),
                // Ragged ranges without a tile: one tile of the whole window.
                (None, None) => u64::MAX,
            };
            tile.push((n, size));
        }
        let tile_span = annots
            .iter()
            .find(|a| matches!(a, Annot::Tile { .. }))
            .map_or(call_span, |a| a.span());
        // A fitting tile fits again for the same op, argument types and engine.
        let fit_key = (sig.id, in_shapes, routes, tile, engine);
        let tile = if self.fits.contains(&fit_key) {
            fit_key.3
        } else {
            let (_, in_shapes, _, tile, _) = &fit_key;
            if !self.check_buffers(sig, &body, tile, in_shapes, dtype, engine, call_span, tile_span) {
                return None;
            }
            let tile = tile.clone();
            self.fits.insert(fit_key);
            tile
        };
        // The output tensor.
        let out_id = TensorId(fl.tf.tensors.len() as u32);
        let node_id = NodeId(fl.tf.nodes.len() as u32);
        let grouped = match out_shape.first() {
            Some(Dim::Recv(r)) => Some(*r),
            _ => None,
        };
        fl.tf.tensors.push(Tensor {
            name: name.to_string(),
            dtype,
            shape: out_shape,
            home: if sig.is_comm { Home::Window } else { Home::Hbm },
            grouped,
            producer: Some(node_id),
            span: call_span,
        });
        fl.tf.nodes.push(ir::Node {
            op: sig.id,
            name: name.to_string(),
            inputs,
            routes: route_ids,
            output: out_id,
            engine,
            dtype,
            tile,
            order,
            priority,
            body,
            span: call_span,
        });
        Some(out_id)
    }
}

/// Every `group(v)` index with the dimension it indexes.
fn collect_group_uses(sig: &OpSig, ins: &[(DType, Vec<Dim>)], out: &[Dim], acc: &mut Vec<(usize, Dim, Span)>) {
    fn walk(e: &SymScalar, ins: &[(DType, Vec<Dim>)], acc: &mut Vec<(usize, Dim, Span)>) {
        match e {
            SymScalar::Read { input, index, .. } => {
                for (k, ix) in index.iter().enumerate() {
                    if let SymIndex::Group(v, sp) = ix {
                        if let Some(d) = ins.get(*input).and_then(|x| x.1.get(k)) {
                            acc.push((*v, *d, *sp));
                        }
                    }
                }
            }
            SymScalar::Neg(a) => walk(a, ins, acc),
            SymScalar::Bin(_, a, b) => {
                walk(a, ins, acc);
                walk(b, ins, acc);
            }
            SymScalar::Call(_, xs) => xs.iter().for_each(|x| walk(x, ins, acc)),
            SymScalar::Sum { body, .. } => walk(body, ins, acc),
            _ => {}
        }
    }
    for st in &sig.body.stmts {
        walk(&st.value, ins, acc);
        if let SymTarget::Out(ix) = &st.target {
            for (k, i) in ix.iter().enumerate() {
                if let SymIndex::Group(v, sp) = i {
                    if let Some(d) = out.get(k) {
                        acc.push((*v, *d, *sp));
                    }
                }
            }
        }
    }
    // A `sum(m in group(g))` makes `g` index groups: its dimension is the output's.
    for (i, v) in sig.body.vars.iter().enumerate() {
        if let Some(g) = v.group_of {
            for st in &sig.body.stmts {
                if let SymTarget::Out(ix) = &st.target {
                    for (k, idx) in ix.iter().enumerate() {
                        if matches!(idx, SymIndex::Affine { var, .. } if *var == g) {
                            if let Some(d) = out.get(k) {
                                acc.push((i, *d, v.span));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Marks every taskflow name an expression reads as used.
fn mark_used(fl: &mut Flow, e: &Expr) {
    match &e.kind {
        ExprKind::Name(n) => {
            if let Some((_, _, used)) = fl.names.get_mut(n) {
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
