//! Constant expressions: params (evaluated lazily, cycles reported), overrides from the
//! command line, and checked integer arithmetic.

use super::{Checker, ItemRef, ModId, ParamState};
use crate::diag::{Code, Diagnostic};
use crate::ir::Value;
use crate::syntax::ast::{BinOp, Expr, ExprKind, ItemKind};
use crate::syntax::token::Span;

/// How bare names that are not params are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BareNames {
    /// An error (params, dimensions).
    Reject,
    /// A [`Value::Name`] (schedule options such as `priority: critical_path`).
    Accept,
}

/// How many params' names are looked up ahead of their evaluation at once: enough misses
/// to overlap, few enough that their entries stay in cache until used.
pub(super) const WARM_PARAMS: usize = 32;

impl Checker<'_> {
    pub(super) fn apply_param_overrides(&mut self) {
        let root = self.root;
        for ov in self.opts.overrides.clone() {
            if ov.name.starts_with("device.") {
                continue;
            }
            match self.lookup(root, &ov.name) {
                Some(r) if matches!(self.item(r).kind, ItemKind::Param(_)) => {
                    let v = match ov.value {
                        Value::Int(_) | Value::Float(_) | Value::Bool(_) => ov.value.clone(),
                        _ => {
                            self.err(
                                Diagnostic::error(
                                    Code::BadOverride,
                                    format!("`--set {}={}`: a param takes a number", ov.name, ov.value),
                                )
                                .help("write e.g. `--set tokens=1024`"),
                            );
                            continue;
                        }
                    };
                    self.params.insert(r, ParamState::Done(Some(v)));
                }
                _ => {
                    let mut d = Diagnostic::error(
                        Code::BadOverride,
                        format!("`--set {}`: the program has no param `{}`", ov.name, ov.name),
                    );
                    // Names are gathered only while the suggestion budget lasts: thousands of
                    // `--set`s of a program with thousands of params stay linear.
                    if crate::suggest::has_budget() {
                        let names = self.names_where(root, |k| matches!(k, ItemKind::Param(_)));
                        if let Some(b) = crate::suggest::closest(&ov.name, names.iter().map(|s| s.as_str())) {
                            d = d.help(format!("did you mean `{b}`?"));
                        } else if names.is_empty() {
                            d = d.help("the program defines no params");
                        } else {
                            d = d.help(format!("the params are: {}", crate::suggest::listing(&names)));
                        }
                    }
                    self.err(d);
                }
            }
        }
    }

    /// The value of a param item, evaluating it on first use.
    pub(crate) fn param_value(&mut self, r: ItemRef) -> Option<Value> {
        if !self.params.contains_key(&r) {
            self.eval_param_deps(r);
        }
        match self.params.get(&r) {
            Some(ParamState::Done(v)) => return v.clone(),
            Some(ParamState::InProgress) => {
                let (name, span) = match &self.item(r).kind {
                    ItemKind::Param(p) => (p.name.name.clone(), p.name.span),
                    _ => return None,
                };
                self.err(
                    Diagnostic::error(
                        Code::UnknownName,
                        format!("param `{name}` is defined in terms of itself"),
                    )
                    .primary(span, "this param's value depends on itself")
                    .help("break the cycle: give one of the params a literal value"),
                );
                self.params.insert(r, ParamState::Done(None));
                return None;
            }
            None => {}
        }
        self.params.insert(r, ParamState::InProgress);
        // A shared handle to the file, so the expression is read in place.
        let file = self.file_of(r);
        let ItemKind::Param(p) = &file.items[r.item].kind else {
            return None;
        };
        let v = self.eval_const(r.module, &p.value, BareNames::Reject);
        // A cycle may have already marked it.
        if let Some(ParamState::Done(None)) = self.params.get(&r) {
            return None;
        }
        self.params.insert(r, ParamState::Done(v.clone()));
        v
    }

    /// Evaluates, in dependency order and without recursion, the params that `root`'s value
    /// names (directly or through other params) and that are not evaluated yet, so that
    /// evaluating a param never nests the evaluation of others: a chain of params of any
    /// length, in any order of definition, uses a bounded stack. A param reached again
    /// while its own dependencies are being walked is a cycle and is reported there.
    fn eval_param_deps(&mut self, root: ItemRef) {
        let deps = self.param_deps(root);
        if deps.is_empty() {
            // The usual case (params used after their definitions, evaluated in order).
            return;
        }
        let mut stack: Vec<(ItemRef, Vec<ItemRef>)> = vec![(root, deps)];
        let mut on_stack: rustc_hash::FxHashSet<ItemRef> = std::iter::once(root).collect();
        while let Some((node, deps)) = stack.last_mut() {
            if let Some(d) = deps.pop() {
                if self.params.contains_key(&d) {
                    continue;
                }
                if on_stack.contains(&d) {
                    self.params.insert(d, ParamState::InProgress);
                    self.param_value(d);
                    continue;
                }
                on_stack.insert(d);
                let dd = self.param_deps(d);
                stack.push((d, dd));
            } else {
                let node = *node;
                stack.pop();
                on_stack.remove(&node);
                if node != root {
                    self.param_value(node);
                }
            }
        }
    }

    /// The not yet evaluated params a param's value names, last first.
    fn param_deps(&self, r: ItemRef) -> Vec<ItemRef> {
        let ItemKind::Param(p) = &self.item(r).kind else {
            return Vec::new();
        };
        let mut out = Vec::new();
        self.unevaluated_params_in(r.module, &p.value, &mut out);
        out.reverse();
        out
    }

    /// Looks up, one after the other, the names the values of a run of params use, before
    /// they are evaluated: in a large program the scope table is far larger than the caches
    /// and each name's first look-up is a miss, which the evaluation of a param waits for
    /// one at a time; here the look-ups do not depend on each other, so the processor
    /// overlaps their misses, and the evaluation finds the entries in cache.
    pub(super) fn warm_param_names(&self, m: ModId, items: &[usize]) {
        let file = std::rc::Rc::clone(&self.modules[m].ast);
        let mut names: Vec<&str> = Vec::with_capacity(2 * items.len());
        for &i in items {
            if let ItemKind::Param(p) = &file.items[i].kind {
                p.value.for_each_value_name(&mut |n| names.push(n));
            }
        }
        for n in names {
            std::hint::black_box(self.lookup(m, n));
        }
    }

    /// Appends the not yet evaluated params an expression names, left to right.
    fn unevaluated_params_in(&self, m: ModId, e: &Expr, out: &mut Vec<ItemRef>) {
        e.for_each_value_name(&mut |n| {
            if let Some(d) = self.lookup(m, n) {
                if matches!(self.item(d).kind, ItemKind::Param(_)) && !self.params.contains_key(&d) {
                    out.push(d);
                }
            }
        });
    }

    /// Evaluates a constant expression in a module's scope.
    pub(crate) fn eval_const(&mut self, m: ModId, e: &Expr, bare: BareNames) -> Option<Value> {
        match &e.kind {
            ExprKind::Int(v) => match i64::try_from(*v) {
                Ok(i) => Some(Value::Int(i)),
                Err(_) => {
                    self.err(
                        Diagnostic::error(Code::Overflow, format!("`{v}` does not fit in a signed 64-bit integer"))
                            .primary(e.span, "too large")
                            .note("integers are at most 9223372036854775807"),
                    );
                    None
                }
            },
            ExprKind::Float(f) => Some(Value::Float(*f)),
            ExprKind::Str(s) => Some(Value::Str(s.to_string())),
            ExprKind::Name(n) => {
                if let Some(r) = self.lookup(m, n) {
                    if let ItemKind::Param(_) = self.item(r).kind {
                        return self.param_value(r);
                    }
                    if bare == BareNames::Accept {
                        return Some(Value::Name(n.to_string()));
                    }
                    let kind = item_kind_word(&self.item(r).kind);
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{n}` is {kind}, not a param"))
                            .primary(e.span, "expected a constant"),
                    );
                    return None;
                }
                match &**n {
                    "true" => return Some(Value::Bool(true)),
                    "false" => return Some(Value::Bool(false)),
                    _ => {}
                }
                if bare == BareNames::Accept {
                    return Some(Value::Name(n.to_string()));
                }
                self.unknown_name(m, n, e.span, "param");
                None
            }
            ExprKind::Neg(inner) => {
                let v = self.eval_const(m, inner, BareNames::Reject)?;
                match v {
                    Value::Int(i) => match i.checked_neg() {
                        Some(x) => Some(Value::Int(x)),
                        None => {
                            self.overflow(e.span);
                            None
                        }
                    },
                    Value::Float(f) => Some(Value::Float(-f)),
                    other => {
                        self.type_mismatch(e.span, "a number", &other);
                        None
                    }
                }
            }
            ExprKind::Binary(op, a, b) => {
                let x = self.eval_const(m, a, BareNames::Reject);
                let y = self.eval_const(m, b, BareNames::Reject);
                let (x, y) = (x?, y?);
                self.arith(*op, x, y, e.span, b.span)
            }
            ExprKind::Call { callee, args } => {
                let fname = callee.name().unwrap_or("");
                if !matches!(fname, "min" | "max" | "ceil_div" | "floor_div") {
                    self.err(
                        Diagnostic::error(
                            Code::UnknownName,
                            format!("`{fname}` is not a function of constant expressions"),
                        )
                        .primary(callee.span, "unknown function")
                        .help("constant expressions may use min, max, ceil_div and floor_div"),
                    );
                    return None;
                }
                if args.len() != 2 || args.iter().any(|a| a.name.is_some()) {
                    self.err(
                        Diagnostic::error(
                            Code::WrongArgCount,
                            format!("`{fname}` takes 2 positional arguments, got {}", args.len()),
                        )
                        .primary(e.span, "here"),
                    );
                    return None;
                }
                let x = self.eval_const(m, &args[0].value, BareNames::Reject);
                let y = self.eval_const(m, &args[1].value, BareNames::Reject);
                let (x, y) = (x?, y?);
                match (fname, x, y) {
                    ("min", Value::Int(a), Value::Int(b)) => Some(Value::Int(a.min(b))),
                    ("max", Value::Int(a), Value::Int(b)) => Some(Value::Int(a.max(b))),
                    ("min", a, b) | ("max", a, b) => {
                        let (Some(a), Some(b)) = (a.as_f64(), b.as_f64()) else {
                            self.err(
                                Diagnostic::error(Code::TypeMismatch, format!("`{fname}` takes numbers"))
                                    .primary(e.span, "here"),
                            );
                            return None;
                        };
                        Some(Value::Float(if fname == "min" { a.min(b) } else { a.max(b) }))
                    }
                    (_, Value::Int(a), Value::Int(b)) => {
                        if b == 0 {
                            self.err(
                                Diagnostic::error(Code::DivisionByZero, "division by zero")
                                    .primary(args[1].value.span, "this is zero"),
                            );
                            return None;
                        }
                        let (Some(q), Some(r)) = (a.checked_div_euclid(b), a.checked_rem_euclid(b)) else {
                            self.overflow(e.span);
                            return None;
                        };
                        if fname == "floor_div" || r == 0 {
                            Some(Value::Int(q))
                        } else {
                            q.checked_add(1).map(Value::Int).or_else(|| {
                                self.overflow(e.span);
                                None
                            })
                        }
                    }
                    (_, a, b) => {
                        let bad = if matches!(a, Value::Int(_)) { b } else { a };
                        self.type_mismatch(e.span, "integers", &bad);
                        None
                    }
                }
            }
            ExprKind::Field { .. }
            | ExprKind::Index { .. }
            | ExprKind::Tuple(_)
            | ExprKind::Sum { .. }
            | ExprKind::Cast { .. } => {
                self.err(
                    Diagnostic::error(Code::TypeMismatch, "not a constant expression")
                        .primary(e.span, "expected a number built from literals and params"),
                );
                None
            }
            ExprKind::Error => None,
        }
    }

    /// Checked arithmetic on two values.
    pub(crate) fn arith(&mut self, op: BinOp, x: Value, y: Value, span: Span, rhs_span: Span) -> Option<Value> {
        match (x, y) {
            (Value::Int(a), Value::Int(b)) => {
                let r = match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::Div | BinOp::Rem => {
                        if b == 0 {
                            self.err(
                                Diagnostic::error(Code::DivisionByZero, "division by zero")
                                    .primary(rhs_span, "this is zero"),
                            );
                            return None;
                        }
                        let Some(rem) = a.checked_rem(b) else {
                            self.overflow(span);
                            return None;
                        };
                        if op == BinOp::Div && rem != 0 {
                            self.err(
                                Diagnostic::error(Code::NotDivisible, format!("{a} / {b} is not exact"))
                                    .primary(span, format!("{a} is not a multiple of {b}"))
                                    .help("integer `/` must divide exactly; use `ceil_div(a, b)` or `floor_div(a, b)` to round"),
                            );
                            return None;
                        }
                        if op == BinOp::Div {
                            a.checked_div(b)
                        } else {
                            a.checked_rem(b)
                        }
                    }
                };
                match r {
                    Some(v) => Some(Value::Int(v)),
                    None => {
                        self.overflow(span);
                        None
                    }
                }
            }
            (a, b) => {
                let (Some(fa), Some(fb)) = (a.as_f64(), b.as_f64()) else {
                    let bad = if a.as_f64().is_none() { a } else { b };
                    self.type_mismatch(span, "numbers", &bad);
                    return None;
                };
                let r = match op {
                    BinOp::Add => fa + fb,
                    BinOp::Sub => fa - fb,
                    BinOp::Mul => fa * fb,
                    BinOp::Div => {
                        if fb == 0.0 {
                            self.err(
                                Diagnostic::error(Code::DivisionByZero, "division by zero")
                                    .primary(rhs_span, "this is zero"),
                            );
                            return None;
                        }
                        fa / fb
                    }
                    BinOp::Rem => {
                        if fb == 0.0 {
                            self.err(
                                Diagnostic::error(Code::DivisionByZero, "division by zero")
                                    .primary(rhs_span, "this is zero"),
                            );
                            return None;
                        }
                        fa % fb
                    }
                };
                if !r.is_finite() {
                    self.overflow(span);
                    return None;
                }
                Some(Value::Float(r))
            }
        }
    }

    pub(crate) fn overflow(&mut self, span: Span) {
        self.err(
            Diagnostic::error(Code::Overflow, "arithmetic overflow")
                .primary(span, "the result does not fit in 64 bits")
                .note("shape and parameter arithmetic is checked; it never wraps"),
        );
    }

    pub(crate) fn type_mismatch(&mut self, span: Span, expected: &str, got: &Value) {
        self.err(
            Diagnostic::error(
                Code::TypeMismatch,
                format!("expected {expected}, found {} `{}`", got.kind(), show_value(got)),
            )
            .primary(span, format!("expected {expected}")),
        );
    }

    /// Reports an unknown name with a suggestion from the module's scope.
    pub(crate) fn unknown_name(&mut self, m: ModId, name: &str, span: Span, what: &str) {
        self.unknown_name_among(m, name, span, what, &[]);
    }

    pub(crate) fn unknown_name_among(&mut self, m: ModId, name: &str, span: Span, what: &str, local: &[String]) {
        if self.modules[m].poisoned.contains(name) {
            return;
        }
        let mut d =
            Diagnostic::error(Code::UnknownName, format!("unknown {what} `{name}`")).primary(span, "not defined");
        if crate::suggest::has_budget() {
            let mut cands: Vec<String> = local.to_vec();
            cands.extend(self.scope_names(m));
            if let Some(b) = crate::suggest::closest(name, cands.iter().map(|s| s.as_str())) {
                d = d.help(format!("did you mean `{b}`?"));
            }
        }
        self.err(d);
    }

    /// An integer value, or a diagnostic.
    pub(crate) fn expect_int(&mut self, v: Value, span: Span, what: &str) -> Option<i64> {
        match v {
            Value::Int(i) => Some(i),
            other => {
                self.type_mismatch(span, what, &other);
                None
            }
        }
    }
}

/// A value as written in a message: a whole float keeps its `.0`, so `4.0` is not shown as
/// the integer `4`.
pub(crate) fn show_value(v: &Value) -> String {
    match v {
        Value::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        other => other.to_string(),
    }
}

pub(crate) fn item_kind_word(k: &ItemKind) -> &'static str {
    match k {
        ItemKind::Import(_) => "an import",
        ItemKind::Param(_) => "a param",
        ItemKind::Device(_) => "a device",
        ItemKind::Route(_) => "a routing",
        ItemKind::Op(o) if o.kind == crate::syntax::ast::OpKind::Comm => "a comm op",
        ItemKind::Op(_) => "an op",
        ItemKind::Taskflow(_) | ItemKind::Grad(_) => "a taskflow",
        ItemKind::Schedule(_) => "a schedule",
        ItemKind::Profile(_) => "a device profile",
        ItemKind::Signature(s) if s.kind == crate::syntax::ast::SignatureKind::Routing => "a routing kind",
        ItemKind::Signature(_) => "a scheduling policy",
    }
}
