//! Vector-Jacobian products of op bodies, derived symbolically on the syntax tree.
//!
//! A compute op's statement `out[I] = E` contributes, for every read `p[A]` of the input
//! `p` in `E`, the term `dout[I] * dE/dp[A]` to the gradient element `dp[A]`. The variables
//! of `A` become the output variables of the derived statement; every other variable of
//! the term (the forward's output variables and the reductions around the read) is summed.
//! A read `p[.., group(m), ..]` becomes an output variable `g` over the groups with
//! `sum(m in group(g))`. Reads with the same index are one statement (their terms added);
//! reads with different indices are separate statements, as `swiglu_grad` writes the gate
//! and the up half of its output.
//!
//! A comm op's adjoint exchanges the two directions of a routing: a put through
//! `r.rank(t, j)` to `r.slot(t, j)` (dispatch) becomes a put back through `r.src_rank(m)` to
//! `r.src_token(m)` with `+=` (`dispatch_grad`), and the other way round (`combine` becomes
//! `combine_grad`); the gate weight `r.weight(t, j)` and `r.src_weight(m)` exchange too.

use crate::syntax::ast::{Arg, BinOp, Binder, Expr, ExprKind, Ident, ReduceOp, Stmt};
use crate::syntax::token::Span;
use std::collections::BTreeSet;

/// Why a body has no derived gradient: the expression and what is wrong with it.
#[derive(Clone, Debug)]
pub(crate) struct NonDiff {
    pub span: Span,
    pub message: String,
    pub label: String,
    pub help: Option<String>,
    /// The input is rounded (a cast to an integer or quantised dtype), which a
    /// straight-through estimator would pass.
    pub rounding: bool,
}

impl NonDiff {
    fn new(span: Span, message: impl Into<String>, label: impl Into<String>) -> Self {
        NonDiff {
            span,
            message: message.into(),
            label: label.into(),
            help: None,
            rounding: false,
        }
    }
    fn help(mut self, h: impl Into<String>) -> Self {
        self.help = Some(h.into());
        self
    }
}

pub(crate) type DResult<T> = Result<T, NonDiff>;

/// The names of a body: which are index variables (everything else is a constant: a shape
/// symbol, a param, a routing).
pub(crate) struct Names<'a> {
    /// Names that are not index variables: shape symbols, params, routing parameters.
    pub constants: &'a BTreeSet<String>,
    /// A cast to an integer or quantised dtype is differentiated as the identity (a
    /// straight-through estimator of its rounding).
    pub straight_through: bool,
}

impl Names<'_> {
    fn is_var(&self, n: &str) -> bool {
        !self.constants.contains(n)
    }
}

// ---------------------------------------------------------------- expression builders

pub(crate) fn name(n: &str, span: Span) -> Expr {
    Expr {
        kind: ExprKind::Name(n.into()),
        span,
    }
}

pub(crate) fn ident(n: &str, span: Span) -> Ident {
    Ident {
        name: n.to_string(),
        span,
    }
}

pub(crate) fn int(v: u64, span: Span) -> Expr {
    Expr {
        kind: ExprKind::Int(v),
        span,
    }
}

fn float(v: f64, span: Span) -> Expr {
    if v >= 0.0 && v.fract() == 0.0 && v < 1e15 {
        return int(v as u64, span);
    }
    if v < 0.0 {
        return neg(float(-v, span));
    }
    Expr {
        kind: ExprKind::Float(v),
        span,
    }
}

fn is_const(e: &Expr, v: f64) -> bool {
    match &e.kind {
        ExprKind::Int(i) => *i as f64 == v,
        ExprKind::Float(f) => *f == v,
        _ => false,
    }
}

fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    let span = a.span.to(b.span);
    Expr {
        kind: ExprKind::Binary(op, Box::new(a), Box::new(b)),
        span,
    }
}

pub(crate) fn neg(a: Expr) -> Expr {
    if is_const(&a, 0.0) {
        return a;
    }
    if let ExprKind::Neg(x) = a.kind {
        return *x;
    }
    let span = a.span;
    Expr {
        kind: ExprKind::Neg(Box::new(a)),
        span,
    }
}

pub(crate) fn add(a: Expr, b: Expr) -> Expr {
    if is_const(&a, 0.0) {
        return b;
    }
    if is_const(&b, 0.0) {
        return a;
    }
    if let ExprKind::Neg(x) = b.kind {
        return bin(BinOp::Sub, a, *x);
    }
    bin(BinOp::Add, a, b)
}

fn sub(a: Expr, b: Expr) -> Expr {
    if is_const(&b, 0.0) {
        return a;
    }
    if is_const(&a, 0.0) {
        return neg(b);
    }
    bin(BinOp::Sub, a, b)
}

pub(crate) fn mul(a: Expr, b: Expr) -> Expr {
    if is_const(&a, 0.0) || is_const(&b, 1.0) {
        return a;
    }
    if is_const(&b, 0.0) || is_const(&a, 1.0) {
        return b;
    }
    if let ExprKind::Neg(x) = &a.kind {
        if is_const(x, 1.0) {
            return neg(b);
        }
    }
    if let ExprKind::Neg(x) = &b.kind {
        if is_const(x, 1.0) {
            return neg(a);
        }
    }
    bin(BinOp::Mul, a, b)
}

fn div(a: Expr, b: Expr) -> Expr {
    if is_const(&a, 0.0) || is_const(&b, 1.0) {
        return a;
    }
    bin(BinOp::Div, a, b)
}

pub(crate) fn call(f: &str, args: Vec<Expr>, span: Span) -> Expr {
    Expr {
        kind: ExprKind::Call {
            callee: Box::new(name(f, span)),
            args: args.into_iter().map(|value| Arg { name: None, value }).collect(),
        },
        span,
    }
}

/// `r.FIELD(args)`.
fn route_call(r: &str, field: &str, args: &[&str], span: Span) -> Expr {
    Expr {
        kind: ExprKind::Call {
            callee: Box::new(Expr {
                kind: ExprKind::Field {
                    base: Box::new(name(r, span)),
                    field: Box::new(ident(field, span)),
                },
                span,
            }),
            args: args
                .iter()
                .map(|a| Arg {
                    name: None,
                    value: name(a, span),
                })
                .collect(),
        },
        span,
    }
}

pub(crate) fn index(t: &str, ix: Vec<Expr>, span: Span) -> Expr {
    Expr {
        kind: ExprKind::Index {
            base: Box::new(name(t, span)),
            index: ix.into(),
        },
        span,
    }
}

fn sum(binders: Vec<Binder>, body: Expr) -> Expr {
    if binders.is_empty() {
        return body;
    }
    let span = body.span;
    Expr {
        kind: ExprKind::Sum {
            op: ReduceOp::Sum,
            binders: binders.into(),
            body: Box::new(body),
        },
        span,
    }
}

// ---------------------------------------------------------------- lets and names

/// Replaces the names of `lets` in `e` by their values (already inlined).
fn inline(e: &Expr, lets: &[(String, Expr)]) -> Expr {
    let mut e = e.clone();
    fn walk(e: &mut Expr, lets: &[(String, Expr)]) {
        if let ExprKind::Name(n) = &e.kind {
            if let Some((_, v)) = lets.iter().rev().find(|(l, _)| **l == **n) {
                *e = v.clone();
            }
            return;
        }
        for c in children_mut(e) {
            walk(c, lets);
        }
    }
    walk(&mut e, lets);
    e
}

fn children_mut(e: &mut Expr) -> Vec<&mut Expr> {
    match &mut e.kind {
        ExprKind::Neg(a) => vec![&mut **a],
        ExprKind::Binary(_, a, b) => vec![&mut **a, &mut **b],
        ExprKind::Call { args, .. } => args.iter_mut().map(|a| &mut a.value).collect(),
        ExprKind::Sum { body, .. } => vec![&mut **body],
        ExprKind::Cast { arg, .. } => vec![&mut **arg],
        ExprKind::Index { index, .. } => index.iter_mut().collect(),
        ExprKind::Tuple(xs) => xs.iter_mut().collect(),
        _ => Vec::new(),
    }
}

/// Whether a body rounds: a cast to an integer or quantised dtype anywhere in it.
pub(crate) fn rounds(body: &[Stmt]) -> bool {
    fn expr(e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Cast { dtype, arg } => !float_cast(&dtype.name) || expr(arg),
            ExprKind::Neg(a) => expr(a),
            ExprKind::Binary(_, a, b) => expr(a) || expr(b),
            ExprKind::Call { args, .. } => args.iter().any(|a| expr(&a.value)),
            ExprKind::Sum { body, .. } => expr(body),
            ExprKind::Index { index, .. } => index.iter().any(expr),
            ExprKind::Tuple(xs) => xs.iter().any(expr),
            _ => false,
        }
    }
    body.iter().any(|st| match st {
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Put { value, .. } => expr(value),
    })
}

/// Every name in `e` (variables, symbols, tensors), for fresh names.
fn collect_names(e: &Expr, out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Name(n) => {
            out.insert(n.to_string());
        }
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } => collect_names(a, out),
        ExprKind::Binary(_, a, b) => {
            collect_names(a, out);
            collect_names(b, out);
        }
        ExprKind::Call { callee, args } => {
            collect_names(callee, out);
            args.iter().for_each(|a| collect_names(&a.value, out));
        }
        ExprKind::Sum { binders, body, .. } => {
            for b in binders {
                out.insert(b.var().name.clone());
            }
            collect_names(body, out);
        }
        ExprKind::Index { base, index } => {
            collect_names(base, out);
            index.iter().for_each(|x| collect_names(x, out));
        }
        ExprKind::Field { base, .. } => collect_names(base, out),
        ExprKind::Tuple(xs) => xs.iter().for_each(|x| collect_names(x, out)),
        _ => {}
    }
}

fn fresh(base: &str, used: &mut BTreeSet<String>) -> String {
    let mut n = base.to_string();
    let mut k = 2;
    while used.contains(&n) {
        n = format!("{base}{k}");
        k += 1;
    }
    used.insert(n.clone());
    n
}

/// The index variables of an index expression (in order).
fn vars_of(e: &Expr, names: &Names, out: &mut Vec<String>) {
    let mut all = BTreeSet::new();
    collect_names(e, &mut all);
    let mut seen = Vec::new();
    fn walk(e: &Expr, names: &Names, seen: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(n) if names.is_var(n) && !seen.iter().any(|s| **s == **n) => seen.push(n.to_string()),
            ExprKind::Call { args, .. } => args.iter().for_each(|a| walk(&a.value, names, seen)),
            ExprKind::Neg(a) => walk(a, names, seen),
            ExprKind::Binary(_, a, b) => {
                walk(a, names, seen);
                walk(b, names, seen);
            }
            _ => {}
        }
    }
    walk(e, names, &mut seen);
    out.extend(seen);
}

/// The variables an expression ranges over outside reductions (index variables it names).
fn free_vars(e: &Expr, names: &Names, bound: &mut Vec<String>, out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Name(n) if names.is_var(n) && !bound.iter().any(|b| **b == **n) => {
            out.insert(n.to_string());
        }
        ExprKind::Sum { binders, body, .. } => {
            let k = bound.len();
            bound.extend(binders.iter().map(|b| b.var().name.clone()));
            free_vars(body, names, bound, out);
            bound.truncate(k);
        }
        ExprKind::Call { callee, args } => {
            if !matches!(callee.kind, ExprKind::Name(_)) {
                free_vars(callee, names, bound, out);
            }
            args.iter().for_each(|a| free_vars(&a.value, names, bound, out));
        }
        ExprKind::Field { base, .. } if !matches!(base.kind, ExprKind::Name(_)) => {
            free_vars(base, names, bound, out);
        }
        ExprKind::Index { index, .. } => index.iter().for_each(|x| free_vars(x, names, bound, out)),
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } => free_vars(a, names, bound, out),
        ExprKind::Binary(_, a, b) => {
            free_vars(a, names, bound, out);
            free_vars(b, names, bound, out);
        }
        ExprKind::Tuple(xs) => xs.iter().for_each(|x| free_vars(x, names, bound, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------- occurrences

/// A read of the differentiated input in a statement's value.
#[derive(Clone, Debug)]
struct Occurrence {
    /// Child numbers from the statement's value down to the read.
    path: Vec<usize>,
    /// The reduction binders around the read, outermost first.
    binders: Vec<(ReduceOp, Binder, Span)>,
    index: Vec<Expr>,
    span: Span,
}

fn occurrences(
    e: &Expr,
    input: &str,
    path: &mut Vec<usize>,
    binders: &mut Vec<(ReduceOp, Binder, Span)>,
    out: &mut Vec<Occurrence>,
) {
    match &e.kind {
        ExprKind::Index { base, index } if base.name() == Some(input) => {
            out.push(Occurrence {
                path: path.clone(),
                binders: binders.clone(),
                index: index.to_vec(),
                span: e.span,
            });
        }
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } => {
            path.push(0);
            occurrences(a, input, path, binders, out);
            path.pop();
        }
        ExprKind::Binary(_, a, b) => {
            for (i, c) in [a, b].into_iter().enumerate() {
                path.push(i);
                occurrences(c, input, path, binders, out);
                path.pop();
            }
        }
        ExprKind::Call { args, .. } => {
            for (i, a) in args.iter().enumerate() {
                path.push(i);
                occurrences(&a.value, input, path, binders, out);
                path.pop();
            }
        }
        ExprKind::Sum { op, binders: bs, body } => {
            let k = binders.len();
            binders.extend(bs.iter().map(|b| (*op, b.clone(), e.span)));
            path.push(0);
            occurrences(body, input, path, binders, out);
            path.pop();
            binders.truncate(k);
        }
        _ => {}
    }
}

/// Whether a cast to this dtype keeps real values (a float type that is not a quantised
/// payload, or an op's generic: a tensor of a quantised dtype on the gradient's path is
/// refused where the derivation starts).
fn float_cast(dtype: &str) -> bool {
    !matches!(dtype, "i8" | "u8" | "i32" | "fp8e4m3" | "fp8e5m2")
}

/// `f'(a)` for the scalar functions with a derivative.
fn derivative(f: &str, a: &Expr, span: Span) -> Option<Expr> {
    let c = |v: f64| float(v, span);
    let f1 = |g: &str| call(g, vec![a.clone()], span);
    Some(match f {
        "exp" => f1("exp"),
        "log" => div(c(1.0), a.clone()),
        "sqrt" => div(c(0.5), f1("sqrt")),
        "rsqrt" => div(mul(c(-0.5), f1("rsqrt")), a.clone()),
        "tanh" => sub(c(1.0), mul(f1("tanh"), f1("tanh"))),
        "sigmoid" => mul(f1("sigmoid"), sub(c(1.0), f1("sigmoid"))),
        "silu" => f1("dsilu"),
        // silu'' = s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x).
        "dsilu" => mul(
            mul(f1("sigmoid"), sub(c(1.0), f1("sigmoid"))),
            add(c(2.0), mul(a.clone(), sub(c(1.0), mul(c(2.0), f1("sigmoid"))))),
        ),
        // gelu_tanh(x) = 0.5 x (1 + t), t = tanh(k (x + 0.044715 x^3)), k = sqrt(2 / pi):
        // its derivative is 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2).
        "gelu" | "gelu_tanh" => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let cube = mul(mul(a.clone(), a.clone()), a.clone());
            let t = call("tanh", vec![mul(c(k), add(a.clone(), mul(c(0.044715), cube)))], span);
            add(
                mul(c(0.5), add(c(1.0), t.clone())),
                mul(
                    mul(mul(c(0.5), a.clone()), sub(c(1.0), mul(t.clone(), t))),
                    mul(c(k), add(c(1.0), mul(c(3.0 * 0.044715), mul(a.clone(), a.clone())))),
                ),
            )
        }
        // erf'(x) = 2 / sqrt(pi) exp(-x^2).
        "erf" => mul(
            c(std::f64::consts::FRAC_2_SQRT_PI),
            call("exp", vec![neg(mul(a.clone(), a.clone()))], span),
        ),
        // gelu_erf(x) = 0.5 x (1 + erf(x / sqrt(2))): its derivative is
        // 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi).
        "gelu_erf" => add(
            mul(
                c(0.5),
                add(
                    c(1.0),
                    call("erf", vec![mul(a.clone(), c(std::f64::consts::FRAC_1_SQRT_2))], span),
                ),
            ),
            mul(
                mul(a.clone(), c(1.0 / (2.0 * std::f64::consts::PI).sqrt())),
                call("exp", vec![mul(c(-0.5), mul(a.clone(), a.clone()))], span),
            ),
        ),
        _ => return None,
    })
}

/// The derivative of `e` with respect to the read at `path` (every other read a constant).
/// Reductions on the path are transparent: their variables are free in the result and the
/// caller sums or fixes them.
fn diff(e: &Expr, path: &[usize], st: bool) -> DResult<Expr> {
    let Some((&c, rest)) = path.split_first() else {
        return Ok(int(1, e.span));
    };
    match &e.kind {
        ExprKind::Neg(a) => Ok(neg(diff(a, rest, st)?)),
        ExprKind::Binary(op, a, b) => {
            let (x, other) = if c == 0 { (a, b) } else { (b, a) };
            let d = diff(x, rest, st)?;
            Ok(match (op, c) {
                (BinOp::Add, _) => d,
                (BinOp::Sub, 0) => d,
                (BinOp::Sub, _) => neg(d),
                (BinOp::Mul, 0) => mul(d, (**other).clone()),
                (BinOp::Mul, _) => mul((**other).clone(), d),
                (BinOp::Div, 0) => div(d, (**other).clone()),
                (BinOp::Div, _) => neg(mul(div((**a).clone(), mul((**b).clone(), (**b).clone())), d)),
                (BinOp::Rem, _) => {
                    return Err(NonDiff::new(
                        e.span,
                        "`%` has no derivative",
                        "the remainder of the differentiated input",
                    ))
                }
            })
        }
        ExprKind::Call { callee, args } => {
            let f = callee.name().unwrap_or("");
            let arg = &args[c].value;
            let d = diff(arg, rest, st)?;
            match derivative(f, arg, e.span) {
                Some(fp) => Ok(mul(fp, d)),
                None => {
                    let (msg, help) = match f {
                        "max" | "min" | "relu" | "abs" | "clamp" => (
                            format!("`{f}` is not differentiable"),
                            "a comparison has no derivative in the language (it selects one argument); write the backward by hand",
                        ),
                        "round" => (
                            "`round` is not differentiable".to_string(),
                            "its derivative is zero almost everywhere; write the backward by hand",
                        ),
                        _ => (
                            format!("`{f}` has no known derivative"),
                            "the derivable functions are exp, log, sqrt, rsqrt, tanh, sigmoid, silu, dsilu, gelu, gelu_tanh, gelu_erf and erf",
                        ),
                    };
                    Err(NonDiff::new(e.span, msg, "the differentiated input passes through this").help(help))
                }
            }
        }
        ExprKind::Sum { op, body, .. } => {
            if *op == ReduceOp::Max {
                return Err(NonDiff::new(
                    e.span,
                    "`max(..)` reductions are not differentiable",
                    "the differentiated input is reduced by `max` here",
                )
                .help("the gradient of a maximum goes to the selected term only, which the language cannot select; write the backward by hand"));
            }
            diff(body, rest, st)
        }
        ExprKind::Cast { dtype, arg } => {
            if !float_cast(&dtype.name) && !st {
                let mut d = NonDiff::new(
                    e.span,
                    format!("a cast to `{}` is not differentiable", dtype.name),
                    if matches!(dtype.name.as_str(), "fp8e4m3" | "fp8e5m2") {
                        "rounds the differentiated input to a quantised float"
                    } else {
                        "rounds the differentiated input to an integer"
                    },
                );
                d.rounding = true;
                return Err(d);
            }
            diff(arg, rest, st)
        }
        _ => Ok(int(0, e.span)),
    }
}

/// Replaces the plain index `g` by `group(m)` in every read of `e`.
fn subst_group(e: &mut Expr, g: &str, m: &str) -> DResult<()> {
    match &mut e.kind {
        ExprKind::Index { index, .. } => {
            for ix in index {
                if ix.name() == Some(g) {
                    let sp = ix.span;
                    *ix = call("group", vec![name(m, sp)], sp);
                } else {
                    let mut ns = BTreeSet::new();
                    collect_names(ix, &mut ns);
                    if ns.contains(g) {
                        return Err(NonDiff::new(
                            ix.span,
                            format!("the group index `{g}` cannot be replaced by `group({m})` here"),
                            "an index of the group variable other than itself",
                        ));
                    }
                }
            }
            Ok(())
        }
        ExprKind::Name(n) if **n == *g => Err(NonDiff::new(
            e.span,
            format!("the group variable `{g}` is used as a value"),
            "its value has no expression in the row variable",
        )),
        _ => {
            for c in children_mut(e) {
                subst_group(c, g, m)?;
            }
            Ok(())
        }
    }
}

/// One index dimension of a read, solved for the derived output.
enum Solved {
    /// `v`, `v + c` or `v - c`: the derived output is indexed by the same expression.
    Affine(String),
    /// `group(v)`: a new output variable over the groups.
    Group(String),
}

fn solve(ix: &Expr, names: &Names) -> DResult<Solved> {
    let bad = |what: &str| {
        NonDiff::new(
            ix.span,
            "an index that the gradient cannot invert",
            what.to_string(),
        )
        .help("the gradient of an input is derived when each of its indices is `v`, `v + c`, `v - c` or `group(v)` with a distinct index variable `v`")
    };
    if let ExprKind::Call { callee, args } = &ix.kind {
        if callee.name() == Some("group") && args.len() == 1 {
            if let Some(v) = args[0].value.name().filter(|v| names.is_var(v)) {
                return Ok(Solved::Group(v.to_string()));
            }
        }
        return Err(bad("not a variable plus a constant"));
    }
    let mut vs = Vec::new();
    vars_of(ix, names, &mut vs);
    let [v] = vs.as_slice() else {
        return Err(bad(if vs.is_empty() {
            "a constant index: only one slice is read"
        } else {
            "more than one variable"
        }));
    };
    // v, v + c, c + v, v - c with c free of variables.
    let ok = match &ix.kind {
        ExprKind::Name(n) => **n == **v,
        ExprKind::Binary(BinOp::Add, a, b) => a.name() == Some(v) || b.name() == Some(v),
        ExprKind::Binary(BinOp::Sub, a, _) => a.name() == Some(v),
        _ => false,
    };
    if !ok {
        return Err(bad("a multiple of the variable (a strided read)"));
    }
    Ok(Solved::Affine(v.clone()))
}

/// What the derived statement of a compute op needs of its forward.
pub(crate) struct DerivedStmt {
    pub index: Vec<Expr>,
    pub value: Expr,
}

/// The gradient statements of input `input` of a compute op body; `dout` names the
/// output gradient. `used` holds every name of the op (for fresh variables).
pub(crate) fn compute_vjp(
    body: &[Stmt],
    input: &str,
    dout: &str,
    names: &Names,
    used: &mut BTreeSet<String>,
    unit_dims: &[bool],
) -> DResult<Vec<DerivedStmt>> {
    let mut lets: Vec<(String, Expr)> = Vec::new();
    // (index text key, index, value)
    let mut groups: Vec<(Vec<Expr>, Vec<Expr>, Expr)> = Vec::new();
    for st in body {
        match st {
            Stmt::Let { name: n, value, .. } => {
                let v = inline(value, &lets);
                lets.push((n.name.clone(), v));
            }
            Stmt::Assign {
                index: out_ix, value, ..
            } => {
                let value = inline(value, &lets);
                let mut occ = Vec::new();
                occurrences(&value, input, &mut Vec::new(), &mut Vec::new(), &mut occ);
                let mut out_vars = Vec::new();
                for ix in out_ix {
                    vars_of(ix, names, &mut out_vars);
                }
                // Reads with the same index and reductions: one term, `dout * (d1 + d2)`.
                let mut local: Vec<LocalTerm> = Vec::new();
                for o in occ {
                    let mut d = diff(&value, &o.path, names.straight_through)?;
                    // The reductions in the derivative are copies of the forward's: their
                    // variables get fresh names, so that none captures a variable the read
                    // fixes or the gradient sums.
                    freshen_binders(&mut d, used);
                    let sp = o.span;
                    let mut dread = index(dout, out_ix.clone(), sp);
                    let mut term = d;
                    // Solve the read's index.
                    let mut fixed: Vec<String> = Vec::new();
                    let mut new_index = Vec::new();
                    let mut group_binders: Vec<Binder> = Vec::new();
                    for (dim, ix) in o.index.iter().enumerate() {
                        // A constant index of a dimension of size 1 (a column broadcast): the
                        // gradient's whole dimension.
                        let mut vs = Vec::new();
                        vars_of(ix, names, &mut vs);
                        if vs.is_empty() && unit_dims.get(dim).copied().unwrap_or(false) {
                            let j = fresh("j", used);
                            fixed.push(j.clone());
                            new_index.push(name(&j, ix.span));
                            continue;
                        }
                        let s = solve(ix, names)?;
                        let v = match &s {
                            Solved::Affine(v) | Solved::Group(v) => v.clone(),
                        };
                        if fixed.contains(&v) || group_binders.iter().any(|b| b.var().name == v) {
                            return Err(NonDiff::new(
                                ix.span,
                                "an index that the gradient cannot invert",
                                format!("`{v}` indexes two dimensions of this read"),
                            )
                            .help("a read such as `x[m, m]` reads a diagonal; its gradient is not a whole tensor"));
                        }
                        match s {
                            Solved::Affine(_) => {
                                fixed.push(v);
                                new_index.push(ix.clone());
                            }
                            Solved::Group(_) => {
                                let g = fresh("g", used);
                                group_binders.push(Binder::InGroup {
                                    var: ident(&v, ix.span),
                                    group: ident(&g, ix.span),
                                });
                                new_index.push(name(&g, ix.span));
                            }
                        }
                    }
                    // The free variables of the term: the forward's output variables and the
                    // reductions around the read.
                    let mut free: Vec<String> = out_vars.clone();
                    let mut path_groups: Vec<(String, String, Span)> = Vec::new();
                    for (op, b, bsp) in &o.binders {
                        if *op != ReduceOp::Sum {
                            return Err(NonDiff::new(
                                *bsp,
                                "`max(..)` reductions are not differentiable",
                                "here",
                            ));
                        }
                        let v = b.var().name.clone();
                        if let Binder::InGroup { group, .. } = b {
                            path_groups.push((v.clone(), group.name.clone(), *bsp));
                        }
                        if !free.contains(&v) {
                            free.push(v);
                        }
                    }
                    // A row fixed by the read, summed over its group in the forward: the group
                    // is the row's own.
                    let mut summed_groups: Vec<Binder> = Vec::new();
                    let mut dropped: Vec<String> = Vec::new();
                    for (m, g, bsp) in &path_groups {
                        if fixed.contains(m) {
                            if fixed.contains(g) {
                                return Err(NonDiff::new(
                                    *bsp,
                                    "an index that the gradient cannot invert",
                                    "the read fixes a row and its group",
                                ));
                            }
                            subst_group(&mut term, g, m)?;
                            subst_group(&mut dread, g, m)?;
                            dropped.push(g.clone());
                        } else {
                            summed_groups.push(Binder::InGroup {
                                var: ident(m, *bsp),
                                group: ident(g, *bsp),
                            });
                            dropped.push(m.clone());
                        }
                    }
                    let grouped: Vec<String> = group_binders.iter().map(|b| b.var().name.clone()).collect();
                    let full: Vec<Binder> = free
                        .iter()
                        .filter(|v| !fixed.contains(v) && !grouped.contains(v) && !dropped.contains(v))
                        .map(|v| Binder::Full(ident(v, sp)))
                        .collect();
                    // Variables the term still names must be output variables or summed.
                    let mut left = BTreeSet::new();
                    free_vars(&mul(dread.clone(), term.clone()), names, &mut Vec::new(), &mut left);
                    for v in &left {
                        let known = fixed.contains(v)
                            || grouped.contains(v)
                            || full.iter().any(|b| &b.var().name == v)
                            || summed_groups.iter().any(|b| &b.var().name == v)
                            || dropped.contains(v);
                        if !known {
                            return Err(NonDiff::new(
                                sp,
                                "an index that the gradient cannot invert",
                                format!("`{v}` has no range in the gradient"),
                            ));
                        }
                    }
                    let mut inner = group_binders;
                    inner.extend(summed_groups);
                    let key = binder_key(&full, &inner);
                    match local.iter_mut().find(|l| l.1 == key && same_index(&l.0, &new_index)) {
                        Some(l) => l.5 = add(l.5.clone(), term),
                        None => local.push((new_index, key, full, inner, dread, term)),
                    }
                }
                for (new_index, _, full, inner, dread, d) in local {
                    let mut value = sum(full, sum(inner, mul(dread, d)));
                    // The same elements under other variable names (`x[m, n]` and, inside
                    // a reduction, `x[m, k]`): one statement, in the first one's names.
                    let found = groups.iter().position(|(k, _, _)| {
                        same_index(k, &new_index) || same_index(&shape_key(k, names), &shape_key(&new_index, names))
                    });
                    match found {
                        Some(i) => {
                            let target = groups[i].1.clone();
                            rename_index_vars(&mut value, &new_index, &target, names, used);
                            let v = &mut groups[i].2;
                            *v = add(v.clone(), value);
                        }
                        None => groups.push((new_index.clone(), new_index, value)),
                    }
                }
            }
            Stmt::Put { span, .. } => {
                return Err(NonDiff::new(
                    *span,
                    "a `put` in a compute op",
                    "not differentiable here",
                ));
            }
        }
    }
    Ok(groups
        .into_iter()
        .map(|(_, index, value)| DerivedStmt { index, value })
        .collect())
}

/// A term of a derived statement: its output index, the key of its reductions, the summed
/// and the group-summed binders, the read of the output gradient and the derivative.
type LocalTerm = (Vec<Expr>, String, Vec<Binder>, Vec<Binder>, Expr, Expr);

fn binder_key(full: &[Binder], inner: &[Binder]) -> String {
    let one = |b: &Binder| match b {
        Binder::Full(v) => v.name.clone(),
        Binder::InGroup { var, group } => format!("{} in {}", var.name, group.name),
    };
    let f: Vec<String> = full.iter().map(one).collect();
    let i: Vec<String> = inner.iter().map(one).collect();
    format!("{}|{}", f.join(","), i.join(","))
}

/// An index with each variable replaced by its dimension's placeholder (`_0`, `_1`).
fn shape_key(ix: &[Expr], names: &Names) -> Vec<Expr> {
    ix.iter()
        .enumerate()
        .map(|(d, e)| {
            let mut e = e.clone();
            let mut vs = Vec::new();
            vars_of(&e, names, &mut vs);
            for v in vs {
                rename(&mut e, &v, &format!("_{d}"));
            }
            e
        })
        .collect()
}

/// Gives the variables bound by every reduction in `e` fresh names.
fn freshen_binders(e: &mut Expr, used: &mut BTreeSet<String>) {
    if let ExprKind::Sum { binders, body, .. } = &mut e.kind {
        for b in binders.iter_mut() {
            let old = b.var().name.clone();
            let new = fresh(&old, used);
            rename(body, &old, &new);
            match b {
                Binder::Full(v) | Binder::InGroup { var: v, .. } => v.name = new,
            }
        }
        freshen_binders(body, used);
        return;
    }
    for c in children_mut(e) {
        freshen_binders(c, used);
    }
}

/// Renames a variable everywhere in `e` (reads, binders).
fn rename(e: &mut Expr, from: &str, to: &str) {
    match &mut e.kind {
        ExprKind::Name(n) if **n == *from => *n = to.into(),
        ExprKind::Sum { binders, body, .. } => {
            for b in binders.iter_mut() {
                match b {
                    Binder::Full(v) if v.name == from => v.name = to.to_string(),
                    Binder::InGroup { var, group } => {
                        if var.name == from {
                            var.name = to.to_string();
                        }
                        if group.name == from {
                            group.name = to.to_string();
                        }
                    }
                    _ => {}
                }
            }
            rename(body, from, to);
        }
        _ => {
            for c in children_mut(e) {
                rename(c, from, to);
            }
        }
    }
}

/// Renames the output variables of `value` (written at `from`) to those of `to`, an index of
/// the same elements; bound variables of `value` that would capture a new name are renamed
/// first.
fn rename_index_vars(value: &mut Expr, from: &[Expr], to: &[Expr], names: &Names, used: &mut BTreeSet<String>) {
    let mut pairs = Vec::new();
    for (a, b) in from.iter().zip(to) {
        let (mut va, mut vb) = (Vec::new(), Vec::new());
        vars_of(a, names, &mut va);
        vars_of(b, names, &mut vb);
        if let (Some(x), Some(y)) = (va.first(), vb.first()) {
            if x != y {
                pairs.push((x.clone(), y.clone()));
            }
        }
    }
    let mut bound = Vec::new();
    binders_of(value, &mut bound);
    for (_, y) in &pairs {
        if bound.contains(y) {
            let f = fresh(y, used);
            rename(value, y, &f);
        }
    }
    // Through temporaries, so that exchanged names do not collide.
    let temps: Vec<String> = pairs.iter().map(|(x, _)| fresh(&format!("{x}_"), used)).collect();
    for ((x, _), t) in pairs.iter().zip(&temps) {
        rename(value, x, t);
    }
    for ((_, y), t) in pairs.iter().zip(&temps) {
        rename(value, t, y);
    }
}

fn binders_of(e: &Expr, out: &mut Vec<String>) {
    if let ExprKind::Sum { binders, body, .. } = &e.kind {
        for b in binders {
            out.push(b.var().name.clone());
        }
        binders_of(body, out);
        return;
    }
    let mut e = e.clone();
    for c in children_mut(&mut e) {
        binders_of(c, out);
    }
}

fn same_index(a: &[Expr], b: &[Expr]) -> bool {
    fn strip(e: &Expr) -> Expr {
        let mut f = crate::syntax::ast::File {
            docs: Vec::new(),
            items: vec![crate::syntax::ast::Item {
                docs: Vec::new(),
                kind: crate::syntax::ast::ItemKind::Param(crate::syntax::ast::Param {
                    name: ident("", Span::default()),
                    value: e.clone(),
                }),
                span: Span::default(),
            }],
        };
        crate::syntax::ast::erase_spans(&mut f);
        match f.items.remove(0).kind {
            crate::syntax::ast::ItemKind::Param(p) => p.value,
            _ => unreachable!("built as a param"),
        }
    }
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| strip(x) == strip(y))
}

/// The two directions of a put through a routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PutDir {
    /// `put out @ r.rank(t, j) [r.slot(t, j), ..]`: token rows to the experts' windows.
    Send,
    /// `put out @ r.src_rank(m) [r.src_token(m), ..]`: window rows back to their tokens.
    Return,
}

/// The adjoint of a comm op with one put: its statement, and the direction of the forward.
pub(crate) struct CommAdjoint {
    pub stmt: Stmt,
    pub forward: PutDir,
}

fn route_fn(e: &Expr) -> Option<(&str, &str, Vec<&str>)> {
    let ExprKind::Call { callee, args } = &e.kind else {
        return None;
    };
    let ExprKind::Field { base, field } = &callee.kind else {
        return None;
    };
    let r = base.name()?;
    let args = args.iter().map(|a| a.value.name()).collect::<Option<Vec<_>>>()?;
    Some((r, field.name.as_str(), args))
}

/// Splits a product into its factors.
fn factors(e: &Expr, out: &mut Vec<Expr>) {
    if let ExprKind::Binary(BinOp::Mul, a, b) = &e.kind {
        factors(a, out);
        factors(b, out);
    } else {
        out.push(e.clone());
    }
}

/// The adjoint of a comm op's body with respect to its tensor input `input`.
pub(crate) fn comm_adjoint(
    body: &[Stmt],
    input: &str,
    dout: &str,
    names: &Names,
    used: &mut BTreeSet<String>,
) -> DResult<CommAdjoint> {
    let unknown = |span: Span| {
        NonDiff::new(span, "this communication has no derived adjoint", "not a known put pattern").help(
            "the adjoints derived are those of `put out @ r.rank(t, j) [r.slot(t, j), ..] = w * x[t, ..]` \
             and of `put out @ r.src_rank(m) [r.src_token(m), ..] += w * y[m, ..]`, w a product of constants and the gate weight",
        )
    };
    let puts: Vec<&Stmt> = body.iter().filter(|s| matches!(s, Stmt::Put { .. })).collect();
    let [Stmt::Put {
        rank,
        index: ix,
        value,
        span,
        ..
    }] = puts.as_slice()
    else {
        let sp = body.first().map(|s| s.span()).unwrap_or_default();
        return Err(unknown(sp));
    };
    if body.len() != 1 {
        return Err(unknown(*span));
    }
    let Some((r, rf, rargs)) = route_fn(rank) else {
        return Err(unknown(rank.span));
    };
    let Some(first) = ix.first() else {
        return Err(unknown(*span));
    };
    let Some((r2, sf, sargs)) = route_fn(first) else {
        return Err(unknown(first.span));
    };
    let rest: Vec<Expr> = ix[1..].to_vec();
    if r2 != r || rest.iter().any(|e| e.name().is_none_or(|n| !names.is_var(n))) {
        return Err(unknown(*span));
    }
    let dir = match (rf, sf, rargs.as_slice(), sargs.as_slice()) {
        ("rank", "slot", [t, j], [t2, j2]) if t == t2 && j == j2 => PutDir::Send,
        ("src_rank", "src_token", [m], [m2]) if m == m2 => PutDir::Return,
        _ => return Err(unknown(rank.span)),
    };
    let row = rargs[0];
    let mut fs = Vec::new();
    factors(value, &mut fs);
    let mut read = None;
    let mut weights = 0usize;
    let mut consts = Vec::new();
    for f in fs {
        if let ExprKind::Index { base, index: rix } = &f.kind {
            if base.name() == Some(input) && read.is_none() {
                let ok = rix.len() == ix.len()
                    && rix[0].name() == Some(row)
                    && rix[1..]
                        .iter()
                        .zip(&rest)
                        .all(|(a, b)| a.name().is_some() && a.name() == b.name());
                if !ok {
                    return Err(unknown(f.span));
                }
                read = Some(f.clone());
                continue;
            }
            return Err(unknown(f.span));
        }
        if let Some((fr, ff, fargs)) = route_fn(&f) {
            let is_w = fr == r
                && match dir {
                    PutDir::Send => ff == "weight" && fargs == rargs,
                    PutDir::Return => ff == "src_weight" && fargs == rargs,
                };
            if is_w {
                weights += 1;
                continue;
            }
            return Err(unknown(f.span));
        }
        let mut fv = BTreeSet::new();
        free_vars(&f, names, &mut Vec::new(), &mut fv);
        if !fv.is_empty() {
            return Err(unknown(f.span));
        }
        consts.push(f);
    }
    let Some(read) = read else {
        return Err(unknown(value.span));
    };
    let sp = read.span;
    let (stmt, _) = match dir {
        PutDir::Send => {
            let m = fresh("m", used);
            let mut v = index(
                dout,
                std::iter::once(name(&m, sp)).chain(rest.iter().cloned()).collect(),
                sp,
            );
            for _ in 0..weights {
                v = mul(route_call(r, "src_weight", &[&m], sp), v);
            }
            for c in consts.into_iter().rev() {
                v = mul(c, v);
            }
            let st = Stmt::Put {
                target: ident("out", *span),
                rank: route_call(r, "src_rank", &[&m], rank.span),
                index: std::iter::once(route_call(r, "src_token", &[&m], first.span))
                    .chain(rest.iter().cloned())
                    .collect(),
                accumulate: true,
                value: v,
                span: *span,
            };
            (st, m)
        }
        PutDir::Return => {
            let t = fresh("t", used);
            let j = fresh("j", used);
            let mut v = index(
                dout,
                std::iter::once(name(&t, sp)).chain(rest.iter().cloned()).collect(),
                sp,
            );
            for _ in 0..weights {
                v = mul(route_call(r, "weight", &[&t, &j], sp), v);
            }
            for c in consts.into_iter().rev() {
                v = mul(c, v);
            }
            let st = Stmt::Put {
                target: ident("out", *span),
                rank: route_call(r, "rank", &[&t, &j], rank.span),
                index: std::iter::once(route_call(r, "slot", &[&t, &j], first.span))
                    .chain(rest.iter().cloned())
                    .collect(),
                accumulate: false,
                value: v,
                span: *span,
            };
            (st, t)
        }
    };
    Ok(CommAdjoint { stmt, forward: dir })
}

/// Whether the derived statements are `out[I] = dout[I]` with plain variables.
pub(crate) fn is_identity(stmts: &[DerivedStmt], dout: &str, names: &Names) -> bool {
    let [s] = stmts else { return false };
    let ExprKind::Index { base, index: ix } = &s.value.kind else {
        return false;
    };
    base.name() == Some(dout)
        && same_index(ix, &s.index)
        && s.index.iter().all(|e| e.name().is_some_and(|n| names.is_var(n)))
}

/// Whether a derived value is a contraction the cube runs: `sum(..) a[..] * b[..]`.
pub(crate) fn is_contraction(stmts: &[DerivedStmt]) -> bool {
    let [s] = stmts else { return false };
    let ExprKind::Sum {
        op: ReduceOp::Sum,
        body,
        ..
    } = &s.value.kind
    else {
        return false;
    };
    let body = match &body.kind {
        ExprKind::Sum {
            op: ReduceOp::Sum,
            body,
            ..
        } => body,
        _ => body,
    };
    matches!(&body.kind, ExprKind::Binary(BinOp::Mul, a, b)
        if matches!(a.kind, ExprKind::Index { .. }) && matches!(b.kind, ExprKind::Index { .. }))
}

/// The names a statement's tensors reads name (`x` of `x[m, k]`).
pub(crate) fn tensors_read(e: &Expr, out: &mut BTreeSet<String>) {
    match &e.kind {
        ExprKind::Index { base, index } => {
            if let Some(n) = base.name() {
                out.insert(n.to_string());
            }
            index.iter().for_each(|x| tensors_read(x, out));
        }
        ExprKind::Neg(a) | ExprKind::Cast { arg: a, .. } => tensors_read(a, out),
        ExprKind::Binary(_, a, b) => {
            tensors_read(a, out);
            tensors_read(b, out);
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| tensors_read(&a.value, out)),
        ExprKind::Sum { body, .. } => tensors_read(body, out),
        _ => {}
    }
}

/// Every name used in a body (for fresh names).
pub(crate) fn body_names(body: &[Stmt], out: &mut BTreeSet<String>) {
    for st in body {
        match st {
            Stmt::Let { name: n, value, .. } => {
                out.insert(n.name.clone());
                collect_names(value, out);
            }
            Stmt::Assign { index, value, .. } => {
                index.iter().for_each(|x| collect_names(x, out));
                collect_names(value, out);
            }
            Stmt::Put { rank, index, value, .. } => {
                collect_names(rank, out);
                index.iter().for_each(|x| collect_names(x, out));
                collect_names(value, out);
            }
        }
    }
}
