//! The abstract syntax tree. Every node carries the [`Span`] of its source text. The tree is
//! what was written: names are not resolved and expressions are not evaluated (see `check`).

use super::token::Span;
pub use thin_vec::ThinVec;

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

impl Ident {
    pub fn is(&self, s: &str) -> bool {
        self.name == s
    }
}

/// A parsed source.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct File {
    /// `//!` lines at the top.
    pub docs: Vec<String>,
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// `///` lines before the item.
    pub docs: Vec<String>,
    pub kind: ItemKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemKind {
    Import(Import),
    Param(Param),
    Device(DeviceDecl),
    // The kinds larger than a param are boxed, so that an item (most are params) stays small.
    Route(Box<RouteDecl>),
    Op(Box<OpDef>),
    Taskflow(Box<Taskflow>),
    /// `taskflow NAME = grad(FORWARD, wrt: [..], save: [..]);`: a derived backward.
    Grad(Box<GradDecl>),
    Schedule(Box<ScheduleDecl>),
    Profile(Box<Profile>),
    /// `routing NAME(params);` or `policy NAME(params);`: the signature of a builtin.
    Signature(Signature),
}

impl ItemKind {
    /// The name the item defines, if any.
    pub fn name(&self) -> Option<&Ident> {
        match self {
            ItemKind::Import(_) | ItemKind::Device(_) => None,
            ItemKind::Param(p) => Some(&p.name),
            ItemKind::Route(r) => Some(&r.name),
            ItemKind::Op(o) => Some(&o.name),
            ItemKind::Taskflow(t) => Some(&t.name),
            ItemKind::Grad(g) => Some(&g.name),
            ItemKind::Schedule(s) => s.taskflow.as_ref(),
            ItemKind::Profile(p) => Some(&p.name),
            ItemKind::Signature(s) => Some(&s.name),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImportSource {
    /// `std::moe` (the path without the imported names).
    Std(Vec<Ident>),
    /// `"path/to/file.hpm"`.
    File(String, Span),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ImportNames {
    /// `::*`, or a file import without names.
    All(Span),
    /// `::{a, b}` or `::a`.
    List(Vec<Ident>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    pub source: ImportSource,
    pub names: ImportNames,
}

/// `param NAME = EXPR;`
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub value: Expr,
}

/// A `name: value unit` pair in a device, profile, schedule or tile list.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub docs: Vec<String>,
    pub name: Ident,
    pub value: Expr,
    pub unit: Option<Unit>,
    pub span: Span,
}

/// A unit such as `MHz`, `GB/s` or `B/cycle`.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub num: Ident,
    pub den: Option<Ident>,
    pub span: Span,
}

impl Unit {
    pub fn text(&self) -> String {
        match &self.den {
            Some(d) => format!("{}/{}", self.num.name, d.name),
            None => self.num.name.clone(),
        }
    }
}

/// `device = PROFILE { field: value, ... };`
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceDecl {
    pub profile: Ident,
    pub fields: Vec<Field>,
}

/// `route NAME = KIND(args);`
#[derive(Clone, Debug, PartialEq)]
pub struct RouteDecl {
    pub name: Ident,
    pub kind: Ident,
    pub args: Vec<Arg>,
    pub args_span: Span,
}

/// A call argument, optionally named (`experts: 64`).
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

/// `schedule [NAME] = POLICY { options };`
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleDecl {
    /// The taskflow it applies to; `None` for every taskflow.
    pub taskflow: Option<Ident>,
    pub policy: Ident,
    pub options: Vec<Field>,
}

/// `profile NAME [: BASE] { field: value unit, ... }`
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub name: Ident,
    pub base: Option<Ident>,
    pub fields: Vec<Field>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureKind {
    Routing,
    Policy,
}

/// `routing NAME(p: type [= default], ...);`
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub kind: SignatureKind,
    pub name: Ident,
    pub params: Vec<SigParam>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SigParam {
    pub name: Ident,
    /// `int`, `float`, `bool`, `str`, or a list of allowed names (`critical_path | fifo`).
    pub ty: Vec<Ident>,
    pub default: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `op`: computation on one engine.
    Compute,
    /// `comm`: one-sided communication through a routing.
    Comm,
}

/// `op NAME<T>(params) -> TYPE on ENGINE [tile(...)] { body }` or
/// `comm NAME<T>(params) -> TYPE [tile(...)] { puts }`.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDef {
    pub kind: OpKind,
    pub name: Ident,
    pub generics: Vec<Ident>,
    pub params: Vec<OpParam>,
    pub ret: TensorType,
    pub engine: Option<Ident>,
    /// Default tile sizes, overridable at each call.
    pub tile: Vec<Field>,
    pub body: Vec<Stmt>,
    pub body_span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpParam {
    pub name: Ident,
    pub ty: ParamType,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    Tensor(TensorType),
    /// `route`: a routing handle.
    Route(Span),
}

/// `DTYPE[dim, ...]`
#[derive(Clone, Debug, PartialEq)]
pub struct TensorType {
    pub dtype: Ident,
    pub dims: Vec<Expr>,
    pub span: Span,
}

/// A statement of an op body.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `let NAME = EXPR;` (a scalar temporary).
    Let { name: Ident, value: Expr, span: Span },
    /// `out[i, j] = EXPR;` or `+=`.
    Assign {
        target: Ident,
        index: Vec<Expr>,
        accumulate: bool,
        value: Expr,
        span: Span,
    },
    /// `put out @ RANK [i, j] = EXPR;` or `+=`.
    Put {
        target: Ident,
        rank: Expr,
        index: Vec<Expr>,
        accumulate: bool,
        value: Expr,
        span: Span,
    },
}

impl Stmt {
    pub fn span(&self) -> Span {
        match self {
            Stmt::Let { span, .. } | Stmt::Assign { span, .. } | Stmt::Put { span, .. } => *span,
        }
    }
}

/// `taskflow NAME(inputs) -> RESULT { statements }`
#[derive(Clone, Debug, PartialEq)]
pub struct Taskflow {
    pub name: Ident,
    pub params: Vec<OpParam>,
    pub ret: TaskflowRet,
    pub body: Vec<FlowStmt>,
    pub body_span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TaskflowRet {
    /// `-> bf16[tokens, hidden]`: one output named `out`.
    Single(TensorType),
    /// `-> (dx: bf16[..], dw: bf16[..])`.
    Named(Vec<(Ident, TensorType)>),
}

/// `taskflow NAME = grad(FORWARD, wrt: [a, b], save: [c]);`: the backward of taskflow
/// `FORWARD`, derived by the checker (the gradients of the inputs `wrt`, keeping the
/// forward's tensors `save` and recomputing the others it needs).
#[derive(Clone, Debug, PartialEq)]
pub struct GradDecl {
    pub name: Ident,
    pub forward: Ident,
    pub wrt: Vec<Ident>,
    pub save: Vec<Ident>,
    /// Tensors of an integer or quantised dtype whose rounding the backward passes straight
    /// through (a straight-through estimator): the cast that computes each is differentiated
    /// as the identity; for an input, the gradient is with respect to its values.
    pub straight_through: Vec<Ident>,
    /// Tensors the backward treats as constants (no gradient flows through them).
    pub detach: Vec<Ident>,
    /// The span of `grad(...)`.
    pub call_span: Span,
}

/// A statement of a taskflow.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowStmt {
    pub kind: FlowStmtKind,
    pub annots: Vec<Annot>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FlowStmtKind {
    /// `let NAME = EXPR`
    Let { name: Ident, value: Expr },
    /// `return EXPR` (an expression or a tuple of names).
    Return { value: Expr },
}

/// Per-call annotations: `tile(m: 128)`, `on aiv`, `order(ratr)`, `priority(2)`.
#[derive(Clone, Debug, PartialEq)]
pub enum Annot {
    Tile { fields: Vec<Field>, span: Span },
    On { engine: Ident, span: Span },
    Order { hints: Vec<Ident>, span: Span },
    Priority { value: Expr, span: Span },
}

impl Annot {
    pub fn span(&self) -> Span {
        match self {
            Annot::Tile { span, .. }
            | Annot::On { span, .. }
            | Annot::Order { span, .. }
            | Annot::Priority { span, .. } => *span,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl BinOp {
    pub fn as_str(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
        }
    }
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 2,
        }
    }
}

/// The operator of a reduction: `sum(k) ...` or `max(k) ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// The sum of the terms (zero over an empty range).
    Sum,
    /// The largest term (minus infinity over an empty range; a NaN term makes it NaN).
    Max,
}

impl ReduceOp {
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

/// How a reduction variable ranges.
#[derive(Clone, Debug, PartialEq)]
pub enum Binder {
    /// `k`: over the whole dimension it indexes.
    Full(Ident),
    /// `m in group(g)`: over the rows of group `g`.
    InGroup { var: Ident, group: Ident },
}

impl Binder {
    pub fn var(&self) -> &Ident {
        match self {
            Binder::Full(v) | Binder::InGroup { var: v, .. } => v,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    // Every variant holds at most two words, so that a node is 40 bytes (kind and span): the
    // names are boxed strings (no capacity) and the lists are thin vectors (one pointer).
    Int(u64),
    Float(f64),
    Str(Box<str>),
    Name(Box<str>),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `f(a, b: c)`
    Call {
        callee: Box<Expr>,
        args: ThinVec<Arg>,
    },
    /// `x[i, j]`
    Index {
        base: Box<Expr>,
        index: ThinVec<Expr>,
    },
    /// `r.rank`
    Field {
        base: Box<Expr>,
        field: Box<Ident>,
    },
    /// `(a, b, c)`
    Tuple(ThinVec<Expr>),
    /// `sum(k) body` or `max(k) body`
    Sum {
        op: ReduceOp,
        binders: ThinVec<Binder>,
        body: Box<Expr>,
    },
    /// `cast<i8>(x)`: the value converted to a dtype (a concrete one or a generic parameter).
    Cast {
        dtype: Box<Ident>,
        arg: Box<Expr>,
    },
    /// Placeholder after a syntax error (already reported).
    Error,
}

impl Expr {
    /// Calls `f` with every name the expression uses as a value (a name, or one inside a
    /// negation, an arithmetic operation or a call's arguments), left to right: the names a
    /// constant or a shape expression depends on. Recursive: the parser bounds the depth of
    /// every expression.
    pub fn for_each_value_name<'a>(&'a self, f: &mut impl FnMut(&'a str)) {
        match &self.kind {
            ExprKind::Name(n) => f(n),
            ExprKind::Neg(inner) => inner.for_each_value_name(f),
            ExprKind::Binary(_, a, b) => {
                a.for_each_value_name(f);
                b.for_each_value_name(f);
            }
            ExprKind::Call { args, .. } => args.iter().for_each(|a| a.value.for_each_value_name(f)),
            _ => {}
        }
    }

    pub fn name(&self) -> Option<&str> {
        match &self.kind {
            ExprKind::Name(n) => Some(n),
            _ => None,
        }
    }
}

/// Sets every span in the tree to `Span::default()`, so that two parses of different texts
/// (e.g. a file and its formatted form) compare equal when their trees are.
pub fn erase_spans(file: &mut File) {
    fn ident(i: &mut Ident) {
        i.span = Span::default();
    }
    fn expr(e: &mut Expr) {
        e.span = Span::default();
        match &mut e.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Str(_) | ExprKind::Name(_) | ExprKind::Error => {}
            ExprKind::Neg(x) => expr(x),
            ExprKind::Binary(_, l, r) => {
                expr(l);
                expr(r);
            }
            ExprKind::Call { callee, args: a } => {
                expr(callee);
                args(a);
            }
            ExprKind::Index { base, index } => {
                expr(base);
                index.iter_mut().for_each(expr);
            }
            ExprKind::Field { base, field } => {
                expr(base);
                ident(field);
            }
            ExprKind::Tuple(items) => items.iter_mut().for_each(expr),
            ExprKind::Cast { dtype, arg } => {
                ident(dtype);
                expr(arg);
            }
            ExprKind::Sum { binders, body, .. } => {
                for b in binders {
                    match b {
                        Binder::Full(v) => ident(v),
                        Binder::InGroup { var, group } => {
                            ident(var);
                            ident(group);
                        }
                    }
                }
                expr(body);
            }
        }
    }
    fn args(a: &mut [Arg]) {
        for a in a {
            if let Some(n) = &mut a.name {
                ident(n);
            }
            expr(&mut a.value);
        }
    }
    fn fields(fs: &mut [Field]) {
        for f in fs {
            ident(&mut f.name);
            expr(&mut f.value);
            if let Some(u) = &mut f.unit {
                ident(&mut u.num);
                if let Some(d) = &mut u.den {
                    ident(d);
                }
                u.span = Span::default();
            }
            f.span = Span::default();
        }
    }
    fn tensor(t: &mut TensorType) {
        ident(&mut t.dtype);
        t.dims.iter_mut().for_each(expr);
        t.span = Span::default();
    }
    fn op_params(ps: &mut [OpParam]) {
        for p in ps {
            ident(&mut p.name);
            match &mut p.ty {
                ParamType::Tensor(t) => tensor(t),
                ParamType::Route(s) => *s = Span::default(),
            }
            p.span = Span::default();
        }
    }
    for item in &mut file.items {
        item.span = Span::default();
        match &mut item.kind {
            ItemKind::Import(im) => {
                match &mut im.source {
                    ImportSource::Std(path) => path.iter_mut().for_each(ident),
                    ImportSource::File(_, s) => *s = Span::default(),
                }
                match &mut im.names {
                    ImportNames::All(s) => *s = Span::default(),
                    ImportNames::List(names) => names.iter_mut().for_each(ident),
                }
            }
            ItemKind::Param(p) => {
                ident(&mut p.name);
                expr(&mut p.value);
            }
            ItemKind::Device(d) => {
                ident(&mut d.profile);
                fields(&mut d.fields);
            }
            ItemKind::Route(r) => {
                ident(&mut r.name);
                ident(&mut r.kind);
                args(&mut r.args);
                r.args_span = Span::default();
            }
            ItemKind::Op(o) => {
                ident(&mut o.name);
                o.generics.iter_mut().for_each(ident);
                op_params(&mut o.params);
                tensor(&mut o.ret);
                if let Some(e) = &mut o.engine {
                    ident(e);
                }
                fields(&mut o.tile);
                for s in &mut o.body {
                    match s {
                        Stmt::Let { name, value, span } => {
                            ident(name);
                            expr(value);
                            *span = Span::default();
                        }
                        Stmt::Assign {
                            target,
                            index,
                            value,
                            span,
                            ..
                        } => {
                            ident(target);
                            index.iter_mut().for_each(expr);
                            expr(value);
                            *span = Span::default();
                        }
                        Stmt::Put {
                            target,
                            rank,
                            index,
                            value,
                            span,
                            ..
                        } => {
                            ident(target);
                            expr(rank);
                            index.iter_mut().for_each(expr);
                            expr(value);
                            *span = Span::default();
                        }
                    }
                }
                o.body_span = Span::default();
            }
            ItemKind::Taskflow(t) => {
                ident(&mut t.name);
                op_params(&mut t.params);
                match &mut t.ret {
                    TaskflowRet::Single(ty) => tensor(ty),
                    TaskflowRet::Named(outs) => {
                        for (n, ty) in outs {
                            ident(n);
                            tensor(ty);
                        }
                    }
                }
                for s in &mut t.body {
                    match &mut s.kind {
                        FlowStmtKind::Let { name, value } => {
                            ident(name);
                            expr(value);
                        }
                        FlowStmtKind::Return { value } => expr(value),
                    }
                    for a in &mut s.annots {
                        match a {
                            Annot::Tile { fields: fs, span } => {
                                fields(fs);
                                *span = Span::default();
                            }
                            Annot::On { engine, span } => {
                                ident(engine);
                                *span = Span::default();
                            }
                            Annot::Order { hints, span } => {
                                hints.iter_mut().for_each(ident);
                                *span = Span::default();
                            }
                            Annot::Priority { value, span } => {
                                expr(value);
                                *span = Span::default();
                            }
                        }
                    }
                    s.span = Span::default();
                }
                t.body_span = Span::default();
            }
            ItemKind::Grad(g) => {
                ident(&mut g.name);
                ident(&mut g.forward);
                g.wrt.iter_mut().for_each(ident);
                g.save.iter_mut().for_each(ident);
                g.straight_through.iter_mut().for_each(ident);
                g.detach.iter_mut().for_each(ident);
                g.call_span = Span::default();
            }
            ItemKind::Schedule(s) => {
                if let Some(t) = &mut s.taskflow {
                    ident(t);
                }
                ident(&mut s.policy);
                fields(&mut s.options);
            }
            ItemKind::Profile(p) => {
                ident(&mut p.name);
                if let Some(b) = &mut p.base {
                    ident(b);
                }
                fields(&mut p.fields);
            }
            ItemKind::Signature(s) => {
                ident(&mut s.name);
                for p in &mut s.params {
                    ident(&mut p.name);
                    p.ty.iter_mut().for_each(ident);
                    if let Some(d) = &mut p.default {
                        expr(d);
                    }
                    p.span = Span::default();
                }
            }
        }
    }
}

// An expression node is 40 bytes: the syntax tree of a large program is mostly expressions.
const _: () = assert!(std::mem::size_of::<Expr>() <= 40);
