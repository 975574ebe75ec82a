//! Op definitions: signatures (dtype generics, symbolic shapes, routing parameters) and
//! bodies, analysed into a symbolic form ([`SymBody`]) that each call makes concrete.

use super::consts::BareNames;
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{DType, Engine, Func, OpId, RouteFn, VarKind};
use crate::syntax::ast::{self, BinOp, Binder, Expr, ExprKind, Ident, ItemKind, OpKind, ParamType, ReduceOp, Stmt};
use crate::syntax::token::Span;
use std::rc::Rc;

/// A dimension of a routing, usable in shapes as `r.recv` and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouteDim {
    Recv,
    Tokens,
    Topk,
    Experts,
    LocalExperts,
    Ranks,
}

pub(crate) const ROUTE_DIMS: &[(&str, RouteDim)] = &[
    ("recv", RouteDim::Recv),
    ("tokens", RouteDim::Tokens),
    ("topk", RouteDim::Topk),
    ("experts", RouteDim::Experts),
    ("local_experts", RouteDim::LocalExperts),
    ("ranks", RouteDim::Ranks),
];

/// A symbolic integer: a dimension or an offset of an op signature or body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Sym {
    Int(i64),
    /// A shape symbol of the op (`M`, `N`).
    Var(usize),
    /// A dimension of the op's `param`-th (routing) parameter.
    Route(usize, RouteDim),
    Neg(Box<Sym>),
    Bin(BinOp, Box<Sym>, Box<Sym>),
    /// `min`, `max`, `ceil_div`, `floor_div`.
    Call(String, Box<Sym>, Box<Sym>),
}

impl Sym {
    pub fn vars(&self, out: &mut Vec<usize>) {
        match self {
            Sym::Var(v) => out.push(*v),
            Sym::Neg(a) => a.vars(out),
            Sym::Bin(_, a, b) | Sym::Call(_, a, b) => {
                a.vars(out);
                b.vars(out);
            }
            Sym::Int(_) | Sym::Route(..) => {}
        }
    }
    pub fn show(&self, syms: &[String], params: &[CheckedParam]) -> String {
        let mut out = String::new();
        self.show_into(&mut out, syms, params);
        out
    }
    /// Appends the text of [`Sym::show`] to `out`.
    pub fn show_into(&self, out: &mut String, syms: &[String], params: &[CheckedParam]) {
        match self {
            Sym::Int(i) => {
                use std::fmt::Write;
                let _ = write!(out, "{i}");
            }
            Sym::Var(v) => {
                if let Some(n) = syms.get(*v) {
                    out.push_str(n);
                }
            }
            Sym::Route(p, d) => {
                out.push_str(params.get(*p).map_or("r", |p| p.name()));
                out.push('.');
                out.push_str(ROUTE_DIMS.iter().find(|(_, x)| x == d).map_or("?", |(n, _)| n));
            }
            Sym::Neg(a) => {
                out.push('-');
                a.show_into(out, syms, params);
            }
            Sym::Bin(op, a, b) => {
                a.show_into(out, syms, params);
                out.push(' ');
                out.push_str(op.as_str());
                out.push(' ');
                b.show_into(out, syms, params);
            }
            Sym::Call(f, a, b) => {
                out.push_str(f);
                out.push('(');
                a.show_into(out, syms, params);
                out.push_str(", ");
                b.show_into(out, syms, params);
                out.push(')');
            }
        }
    }
}

/// The dtype of a signature's tensor: a generic parameter (by index) or a concrete dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum SigDtype {
    Generic(usize),
    Concrete(DType),
}

/// A tensor type of an op signature: dtype and symbolic dimensions.
#[derive(Clone, Debug)]
pub(crate) struct OpTensorType {
    pub dtype: SigDtype,
    pub dims: Vec<Sym>,
    pub dim_spans: Vec<Span>,
    pub span: Span,
}

/// A checked parameter of an op signature: a tensor (with its input index) or a routing.
#[derive(Clone, Debug)]
pub(crate) enum CheckedParam {
    Tensor {
        name: String,
        ty: OpTensorType,
        input: usize,
    },
    Route {
        name: String,
    },
}

impl CheckedParam {
    pub fn name(&self) -> &str {
        match self {
            CheckedParam::Tensor { name, .. } | CheckedParam::Route { name, .. } => name,
        }
    }
}

/// A symbolic index.
#[derive(Clone, Debug)]
pub(crate) enum SymIndex {
    Affine {
        var: usize,
        coef: i64,
        offset: Sym,
        span: Span,
    },
    Const(Sym, Span),
    Group(usize, Span),
    Route {
        param: usize,
        func: RouteFn,
        args: Vec<usize>,
        span: Span,
    },
}

/// A symbolic scalar expression.
#[derive(Clone, Debug)]
pub(crate) enum SymScalar {
    Const(f64),
    Read {
        input: usize,
        index: Vec<SymIndex>,
    },
    Var(usize),
    Sym(Sym),
    Route {
        param: usize,
        func: RouteFn,
        args: Vec<usize>,
    },
    Neg(Box<SymScalar>),
    Bin(BinOp, Box<SymScalar>, Box<SymScalar>),
    Call(Func, Vec<SymScalar>),
    Cast(CastTo, Box<SymScalar>),
    Sum {
        op: ReduceOp,
        vars: Vec<usize>,
        body: Box<SymScalar>,
    },
}

/// The dtype of a `cast<D>(..)`: a concrete dtype, or a generic parameter, known at a call
/// as the dtype of an input that has it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CastTo {
    Dtype(DType),
    InputDtype(usize),
}

/// What a body statement writes: an output element or a remote put.
#[derive(Clone, Debug)]
pub(crate) enum SymTarget {
    Out(Vec<SymIndex>),
    Put { rank: SymIndex, index: Vec<SymIndex> },
}

#[derive(Clone, Debug)]
pub(crate) struct SymVar {
    pub name: String,
    pub kind: VarKind,
    /// For `sum(m in group(g))`: the variable `g`.
    pub group_of: Option<usize>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub(crate) struct SymStmt {
    pub target: SymTarget,
    pub accumulate: bool,
    pub value: SymScalar,
    pub vars: Vec<usize>,
    pub span: Span,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct SymBody {
    pub vars: Vec<SymVar>,
    pub stmts: Vec<SymStmt>,
}

/// A checked op definition.
#[derive(Clone, Debug)]
pub(crate) struct OpSig {
    pub id: OpId,
    pub name: String,
    pub is_comm: bool,
    pub engine: Engine,
    pub generics: Vec<String>,
    pub params: Vec<CheckedParam>,
    pub ret: OpTensorType,
    pub syms: Vec<String>,
    pub body: SymBody,
    pub tile: Vec<(String, u64, Span)>,
    /// `(lhs input, rhs input, reduction vars)` when the body is `sum(k) a * b`.
    pub contraction: Option<(usize, usize, Vec<usize>)>,
    pub name_span: Span,
    pub body_span: Span,
}

impl OpSig {
    /// `op NAME<T>(x: T[M, K], ...) -> T[M, N] on ENGINE`, written into one buffer.
    pub fn signature_text(&self) -> String {
        let ty = |out: &mut String, t: &OpTensorType| {
            match &t.dtype {
                SigDtype::Generic(i) => out.push_str(self.generics.get(*i).map_or("", |g| g.as_str())),
                SigDtype::Concrete(d) => out.push_str(d.name()),
            }
            out.push('[');
            for (k, d) in t.dims.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                d.show_into(out, &self.syms, &self.params);
            }
            out.push(']');
        };
        let mut out = String::with_capacity(96);
        out.push_str(if self.is_comm { "comm " } else { "op " });
        out.push_str(&self.name);
        if !self.generics.is_empty() {
            out.push('<');
            out.push_str(&self.generics.join(", "));
            out.push('>');
        }
        out.push('(');
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            match p {
                CheckedParam::Tensor { name, ty: t, .. } => {
                    out.push_str(name);
                    out.push_str(": ");
                    ty(&mut out, t);
                }
                CheckedParam::Route { name, .. } => {
                    out.push_str(name);
                    out.push_str(": route");
                }
            }
        }
        out.push_str(") -> ");
        ty(&mut out, &self.ret);
        out.push_str(" on ");
        out.push_str(self.engine.name());
        out
    }
}

/// The names of an op's signature, by name: the first dtype parameter, tensor parameter,
/// routing parameter and shape symbol of each name, and the first tensor input of each dtype
/// parameter. A parameter is entered once it has its name (a tensor parameter once its type
/// is built), as the lists are.
#[derive(Default)]
struct SigIndex {
    generics: rustc_hash::FxHashMap<String, usize>,
    tensors: rustc_hash::FxHashMap<String, usize>,
    routes: rustc_hash::FxHashMap<String, usize>,
    syms: rustc_hash::FxHashMap<String, usize>,
    generic_inputs: rustc_hash::FxHashMap<usize, usize>,
}

/// The most variables one reduction binds (`sum(k, j)`): tensors have at most 6 dimensions,
/// and a bound keeps the variables in scope of a statement few, since each name is looked up
/// among them.
const MAX_REDUCTION_VARS: usize = 16;

/// Names with a fixed meaning inside op bodies.
const RESERVED: &[&str] = &["out", "sum", "group", "put", "let", "on", "tile", "in"];

/// State while building one op's signature and body.
struct Ctx {
    item: ItemRef,
    is_comm: bool,
    generics: Vec<String>,
    params: Vec<CheckedParam>,
    syms: Vec<String>,
    /// The lists above by name (the first entry of each name): a signature of many dtype
    /// parameters, parameters or shape symbols, and a body of many reads, are checked
    /// without a scan of a list per name.
    index: SigIndex,
    /// Whether new shape symbols may be created (only in the signature).
    sig_mode: bool,
    vars: Vec<SymVar>,
    /// Variables in scope (innermost last); they shadow `let`s.
    scope: Vec<(String, usize)>,
    /// The body's `let`s in order (a name given twice, an error, is kept twice).
    lets: Vec<(String, Rc<Expr>)>,
    /// Per `let` name, its positions in `lets`: names are looked up without a scan of every
    /// `let`, so a body of many statements and many `let`s is checked in linear time.
    let_pos: rustc_hash::FxHashMap<String, Vec<usize>>,
    /// How many of `lets` are in scope: all of them, except while a `let`'s value is
    /// inlined (those before it).
    lets_visible: usize,
    ret_rank: usize,
    failed: bool,
    /// The depth of the scalar expression being built and the nodes it has so far, `let`s
    /// inlined (bounded: [`MAX_INLINED_DEPTH`], [`MAX_INLINED_NODES`]).
    scalar_depth: u32,
    scalar_nodes: u32,
    /// Whether the statement being built went past a bound (reported once).
    scalar_too_large: bool,
}

/// The depth of a statement's value once its `let`s are inlined: twice the parser's bound on
/// one expression, so that a few lets may build on each other, and far below what the
/// recursive passes over a body (costs, numerics, printing) can take.
const MAX_INLINED_DEPTH: u32 = 2 * crate::syntax::parser::MAX_DEPTH;
/// The nodes of a statement's value once its `let`s are inlined: a `let` used twice doubles
/// its nodes, so a chain of them would otherwise grow exponentially.
const MAX_INLINED_NODES: u32 = 1 << 16;

/// What a name of a body is: a variable, or the `let` at a position of `Ctx::lets`.
#[derive(Clone, Copy, Debug)]
enum Local {
    Var(usize),
    Let(usize),
}

impl Ctx {
    /// The position of the dtype parameter of this name.
    fn generic(&self, name: &str) -> Option<usize> {
        self.index.generics.get(name).copied()
    }

    /// Whether a parameter (tensor or routing) has this name.
    fn is_param(&self, name: &str) -> bool {
        self.index.tensors.contains_key(name) || self.index.routes.contains_key(name)
    }

    /// The shape symbol of this name.
    fn sym_of(&self, name: &str) -> Option<usize> {
        self.index.syms.get(name).copied()
    }

    fn push_generic(&mut self, name: &str) {
        self.index
            .generics
            .entry(name.to_string())
            .or_insert(self.generics.len());
        self.generics.push(name.to_string());
    }

    fn push_sym(&mut self, name: &str) -> usize {
        self.index.syms.entry(name.to_string()).or_insert(self.syms.len());
        self.syms.push(name.to_string());
        self.syms.len() - 1
    }

    /// Sets parameter `i` (a placeholder until then) and enters its name.
    fn set_param(&mut self, i: usize, p: CheckedParam) {
        match &p {
            CheckedParam::Tensor { name, ty, input } => {
                self.index.tensors.entry(name.clone()).or_insert(i);
                if let SigDtype::Generic(g) = ty.dtype {
                    self.index.generic_inputs.entry(g).or_insert(*input);
                }
            }
            CheckedParam::Route { name } => {
                self.index.routes.entry(name.clone()).or_insert(i);
            }
        }
        if i == self.params.len() {
            self.params.push(p);
        } else {
            self.params[i] = p;
        }
    }

    /// The variable or visible `let` a name means (a variable shadows a `let`; of two `let`s
    /// of one name, the later).
    fn local(&self, name: &str) -> Option<Local> {
        if let Some((_, v)) = self.scope.iter().rev().find(|(n, _)| n == name) {
            return Some(Local::Var(*v));
        }
        self.visible_let(name).map(Local::Let)
    }

    /// The position of the last visible `let` of this name.
    fn visible_let(&self, name: &str) -> Option<usize> {
        let ps = self.let_pos.get(name)?;
        ps.iter().rev().copied().find(|&p| p < self.lets_visible)
    }

    /// The names in scope: the visible `let`s, then the variables.
    fn scope_names(&self) -> Vec<String> {
        self.lets[..self.lets_visible]
            .iter()
            .map(|(n, _)| n.clone())
            .chain(self.scope.iter().map(|(n, _)| n.clone()))
            .collect()
    }
}

/// The most statements (`let`s, writes and puts) all op bodies of a program may hold together.
pub const MAX_BODY_STATEMENTS: usize = 1 << 18;

impl Checker<'_> {
    /// The checked signature of an op item (checked once).
    pub(crate) fn op_sig(&mut self, r: ItemRef) -> Option<Rc<OpSig>> {
        if let Some(s) = self.op_sigs.get(&r) {
            return s.clone();
        }
        // Insert a failure first so a (malformed) recursion cannot loop.
        self.op_sigs.insert(r, None);
        let sig = self.check_op(r).map(Rc::new);
        self.op_sigs.insert(r, sig.clone());
        sig
    }

    fn check_op(&mut self, r: ItemRef) -> Option<OpSig> {
        let file = self.file_of(r);
        let item = &file.items[r.item];
        let ItemKind::Op(def) = &item.kind else { return None };
        let mut cx = Ctx {
            item: r,
            is_comm: def.kind == OpKind::Comm,
            generics: Vec::new(),
            params: Vec::with_capacity(def.params.len()),
            syms: Vec::new(),
            index: SigIndex::default(),
            sig_mode: true,
            vars: Vec::new(),
            scope: Vec::new(),
            lets: Vec::new(),
            let_pos: rustc_hash::FxHashMap::default(),
            lets_visible: 0,
            ret_rank: def.ret.dims.len(),
            failed: false,
            scalar_depth: 0,
            scalar_nodes: 0,
            scalar_too_large: false,
        };
        for g in &def.generics {
            if DType::parse(&g.name).is_some() || cx.generic(&g.name).is_some() {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateDefinition,
                        format!("dtype parameter `{}` clashes with a dtype or another parameter", g.name),
                    )
                    .primary(g.span, "rename it"),
                );
                cx.failed = true;
            }
            cx.push_generic(&g.name);
        }
        // Parameters.
        let mut seen: rustc_hash::FxHashMap<&str, Span> = rustc_hash::FxHashMap::default();
        for p in &def.params {
            if RESERVED.contains(&p.name.name.as_str()) {
                self.err(
                    Diagnostic::error(
                        Code::ReservedName,
                        format!("`{}` is reserved and cannot name a parameter", p.name.name),
                    )
                    .primary(p.name.span, "reserved"),
                );
                cx.failed = true;
            }
            // (Tensor parameters are placeholders without a name until their types are built,
            // so duplicates are found by the names as written. Every parameter keeps its slot.)
            if let Some(prev) = seen.get(p.name.name.as_str()) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateDefinition,
                        format!("parameter `{}` is declared twice", p.name.name),
                    )
                    .primary(p.name.span, "again here")
                    .secondary(*prev, "first here"),
                );
                cx.failed = true;
            } else {
                seen.insert(&p.name.name, p.name.span);
            }
            match &p.ty {
                ParamType::Route(_) => {
                    let i = cx.params.len();
                    cx.set_param(
                        i,
                        CheckedParam::Route {
                            name: p.name.name.clone(),
                        },
                    )
                }
                // A placeholder until the tensor types are built below: their dims may refer to
                // routing params declared anywhere in the list.
                ParamType::Tensor(_) => cx.params.push(CheckedParam::Route { name: String::new() }),
            }
        }
        // Now build tensor types (routing params are all known).
        let mut input_i = 0;
        for (i, p) in def.params.iter().enumerate() {
            if let ParamType::Tensor(t) = &p.ty {
                let ty = self.tsig(&mut cx, t);
                let param = CheckedParam::Tensor {
                    name: p.name.name.clone(),
                    ty: ty.unwrap_or(OpTensorType {
                        dtype: SigDtype::Concrete(DType::F32),
                        dims: Vec::new(),
                        dim_spans: Vec::new(),
                        span: t.span,
                    }),
                    input: input_i,
                };
                cx.set_param(i, param);
                input_i += 1;
            }
        }
        // A parameter whose type failed has no dimensions: checking the result and the body
        // against it would only report follow-on errors.
        let params_ok = !cx.failed;
        let ret = self.tsig(&mut cx, &def.ret);
        cx.sig_mode = false;
        // Every symbol of the result must be bound by a parameter.
        if let (Some(ret), true) = (&ret, params_ok) {
            let mut bound = Vec::new();
            for p in &cx.params {
                if let CheckedParam::Tensor { ty, .. } = p {
                    for d in &ty.dims {
                        d.vars(&mut bound);
                    }
                }
            }
            for (d, sp) in ret.dims.iter().zip(&ret.dim_spans) {
                let mut vs = Vec::new();
                d.vars(&mut vs);
                for v in vs {
                    if !bound.contains(&v) {
                        self.err(
                            Diagnostic::error(
                                Code::UnboundShapeSymbol,
                                format!("`{}` in the result type is not bound by any parameter", cx.syms[v]),
                            )
                            .primary(*sp, "no input determines this dimension")
                            .help("use the symbol in a parameter's type, or a param or routing dimension"),
                        );
                        cx.failed = true;
                    }
                }
            }
            if let SigDtype::Generic(g) = ret.dtype {
                let used = cx
                    .params
                    .iter()
                    .any(|p| matches!(p, CheckedParam::Tensor { ty, .. } if ty.dtype == SigDtype::Generic(g)));
                if !used {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!("dtype `{}` of the result is not bound by any parameter", cx.generics[g]),
                        )
                        .primary(ret.span, "no input has this dtype"),
                    );
                    cx.failed = true;
                }
            }
        }
        // Engine.
        let engine = if cx.is_comm {
            if let Some(e) = &def.engine {
                if e.name != "aiv" {
                    self.err(
                        Diagnostic::error(
                            Code::WrongEngine,
                            format!("communication runs on the vector cores, not `{}`", e.name),
                        )
                        .primary(e.span, "comm ops run on aiv")
                        .help("remove `on ...` or write `on aiv`"),
                    );
                    cx.failed = true;
                }
            }
            Engine::Aiv
        } else {
            match def.engine.as_ref().and_then(|e| Engine::parse(&e.name)) {
                Some(e) => e,
                None => {
                    let e = def.engine.as_ref()?;
                    let mut d = Diagnostic::error(Code::UnknownEngine, format!("unknown engine `{}`", e.name))
                        .primary(e.span, "expected `aic` or `aiv`");
                    if let Some(b) = crate::suggest::closest(&e.name, ["aic", "aiv"].into_iter()) {
                        d = d.help(format!("did you mean `{b}`?"));
                    }
                    self.err(d);
                    cx.failed = true;
                    Engine::Aiv
                }
            }
        };
        // Body.
        if !params_ok {
            return None;
        }
        // Each statement's analysis takes memory that lives as long as the program: the
        // statements of all bodies together are bounded before any is analysed.
        let before = self.body_statements;
        self.body_statements = before.saturating_add(def.body.len());
        if self.body_statements > MAX_BODY_STATEMENTS {
            if before <= MAX_BODY_STATEMENTS {
                self.err(
                    Diagnostic::error(
                        Code::LimitExceeded,
                        format!(
                            "the op bodies have more than {MAX_BODY_STATEMENTS} statements together ({} up to `{}`)",
                            self.body_statements, def.name.name
                        ),
                    )
                    .primary(def.body_span, "this body passes the limit")
                    .help("an op body describes one tile's work: a few statements, with `sum` for reductions"),
                );
            }
            return None;
        }
        let body = self.build_body(&mut cx, &def.body, def.body_span);
        let contraction = contraction_of(&body);
        if !cx.is_comm && engine == Engine::Aic && contraction.is_none() && !cx.failed {
            self.err(
                Diagnostic::error(
                    Code::WrongEngine,
                    format!(
                        "op `{}` is not a contraction, so it cannot run on the cube cores",
                        def.name.name
                    ),
                )
                .primary(
                    def.engine.as_ref().map_or(def.name.span, |e| e.span),
                    "`aic` runs only `out[..] = sum(k) a[..] * b[..]`",
                )
                .help("run it `on aiv`"),
            );
            cx.failed = true;
        }
        // Default tiles.
        let mut tile = Vec::new();
        let mut tile_keys: rustc_hash::FxHashMap<&str, Span> = rustc_hash::FxHashMap::default();
        for f in &def.tile {
            if let Some(prev) = tile_keys.insert(&f.name.name, f.span) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateArgument,
                        format!("tile key `{}` is given twice", f.name.name),
                    )
                    .primary(f.span, "again here")
                    .secondary(prev, "first here"),
                );
                cx.failed = true;
                continue;
            }
            let Some(v) = self.eval_const(r.module, &f.value, BareNames::Reject) else {
                cx.failed = true;
                continue;
            };
            let Some(n) = self.expect_int(v, f.value.span, "an integer tile size") else {
                cx.failed = true;
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
                cx.failed = true;
                continue;
            }
            if !body.vars.iter().any(|v| v.name == f.name.name) {
                let names = var_names(&body);
                let mut d = Diagnostic::error(
                    Code::BadTile,
                    format!("`{}` is not an index variable of `{}`", f.name.name, def.name.name),
                )
                .primary(f.name.span, "unknown tile key");
                d = match crate::suggest::closest(&f.name.name, names.iter().map(|s| s.as_str())) {
                    Some(b) => d.help(format!(
                        "did you mean `{b}`? the index variables are: {}",
                        names.join(", ")
                    )),
                    None => d.help(format!("the index variables are: {}", names.join(", "))),
                };
                self.err(d);
                cx.failed = true;
                continue;
            }
            tile.push((f.name.name.clone(), n as u64, f.span));
        }
        if cx.failed {
            return None;
        }
        let ret = ret?;
        let id = OpId(self.ops.len() as u32);
        // Signatures live as long as the check: they keep no room for elements never added.
        let (mut generics, mut syms, mut body, mut tile) = (cx.generics, cx.syms, body, tile);
        generics.shrink_to_fit();
        syms.shrink_to_fit();
        body.vars.shrink_to_fit();
        body.stmts.shrink_to_fit();
        tile.shrink_to_fit();
        let sig = OpSig {
            id,
            name: def.name.name.clone(),
            is_comm: cx.is_comm,
            engine,
            generics,
            params: cx.params,
            ret,
            syms,
            body,
            tile,
            contraction,
            name_span: def.name.span,
            body_span: def.body_span,
        };
        self.ops.push(crate::ir::OpDef {
            name: sig.name.clone(),
            is_comm: sig.is_comm,
            engine,
            docs: item.docs.clone(),
            signature: sig.signature_text(),
            span: item.span,
        });
        Some(sig)
    }

    fn tsig(&mut self, cx: &mut Ctx, t: &ast::TensorType) -> Option<OpTensorType> {
        let dtype = if let Some(g) = cx.generic(&t.dtype.name) {
            SigDtype::Generic(g)
        } else if let Some(d) = DType::parse(&t.dtype.name) {
            SigDtype::Concrete(d)
        } else {
            self.err(unknown_dtype(&t.dtype, &cx.generics));
            cx.failed = true;
            return None;
        };
        if !self.dims_fit(t) {
            cx.failed = true;
            return None;
        }
        let mut dims = Vec::with_capacity(t.dims.len());
        let mut dim_spans = Vec::with_capacity(t.dims.len());
        for d in &t.dims {
            match self.sym(cx, d) {
                Some(s) => dims.push(s),
                None => {
                    cx.failed = true;
                    return None;
                }
            }
            dim_spans.push(d.span);
        }
        Some(OpTensorType {
            dtype,
            dims,
            dim_spans,
            span: t.span,
        })
    }

    /// A symbolic integer from an expression of a signature or an index offset.
    fn sym(&mut self, cx: &mut Ctx, e: &Expr) -> Option<Sym> {
        match &e.kind {
            // Already reported where it was parsed.
            ExprKind::Error => None,
            ExprKind::Int(v) => match i64::try_from(*v) {
                Ok(i) => Some(Sym::Int(i)),
                Err(_) => {
                    self.overflow(e.span);
                    None
                }
            },
            ExprKind::Name(n) => {
                if let Some(i) = cx.sym_of(n) {
                    return Some(Sym::Var(i));
                }
                if let Some(r) = self.lookup(cx.item.module, n) {
                    if matches!(self.item(r).kind, ItemKind::Param(_)) {
                        let v = self.param_value(r)?;
                        return self.expect_int(v, e.span, "an integer").map(Sym::Int);
                    }
                }
                if cx.is_param(n) || cx.generic(n).is_some() {
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{n}` is not a dimension"))
                            .primary(e.span, "expected a shape symbol, a param or a routing dimension"),
                    );
                    return None;
                }
                if cx.sig_mode {
                    return Some(Sym::Var(cx.push_sym(n)));
                }
                let mut cands = cx.syms.clone();
                cands.extend(cx.scope_names());
                self.unknown_name_among(cx.item.module, n, e.span, "name", &cands);
                None
            }
            ExprKind::Field { base, field } => {
                let rn = base.name().unwrap_or("");
                let Some(pi) = cx.index.routes.get(rn).copied() else {
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{rn}` is not a routing parameter of this op"))
                            .primary(base.span, "expected a parameter declared `r: route`"),
                    );
                    return None;
                };
                match ROUTE_DIMS.iter().find(|(n, _)| *n == field.name) {
                    Some((_, d)) => Some(Sym::Route(pi, *d)),
                    None => {
                        let mut d = Diagnostic::error(
                            Code::UnknownName,
                            format!("a routing has no dimension `{}`", field.name),
                        )
                        .primary(field.span, "unknown");
                        d = match crate::suggest::closest(&field.name, ROUTE_DIMS.iter().map(|(n, _)| *n)) {
                            Some(b) => d.help(format!("did you mean `{b}`?")),
                            None => d.help(format!(
                                "the dimensions are: {}",
                                ROUTE_DIMS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                            )),
                        };
                        self.err(d);
                        None
                    }
                }
            }
            ExprKind::Neg(a) => Some(Sym::Neg(Box::new(self.sym(cx, a)?))),
            ExprKind::Binary(op, a, b) => {
                let x = self.sym(cx, a);
                let y = self.sym(cx, b);
                Some(Sym::Bin(*op, Box::new(x?), Box::new(y?)))
            }
            ExprKind::Call { callee, args }
                if matches!(callee.name(), Some("min" | "max" | "ceil_div" | "floor_div")) && args.len() == 2 =>
            {
                let x = self.sym(cx, &args[0].value);
                let y = self.sym(cx, &args[1].value);
                Some(Sym::Call(
                    callee.name().unwrap_or("").to_string(),
                    Box::new(x?),
                    Box::new(y?),
                ))
            }
            _ => {
                self.err(Diagnostic::error(Code::BadIndex, "not a dimension expression").primary(
                    e.span,
                    "expected an integer expression over shape symbols, params and routing dimensions",
                ));
                None
            }
        }
    }

    fn build_body(&mut self, cx: &mut Ctx, stmts: &[Stmt], body_span: Span) -> SymBody {
        let mut body = SymBody::default();
        let mut any_write = false;
        for st in stmts {
            match st {
                Stmt::Let { name, value, .. } => {
                    if RESERVED.contains(&name.name.as_str()) {
                        self.err(
                            Diagnostic::error(Code::ReservedName, format!("`{}` is reserved", name.name))
                                .primary(name.span, "reserved"),
                        );
                        cx.failed = true;
                        // Kept in scope so that its uses are not reported again.
                    } else if let Some(what) = self.let_clash(cx, &name.name) {
                        // A `let` named like another name of the body would make its uses
                        // ambiguous (the index variable, the tensor or the earlier `let` wins
                        // silently): every name in a body means one thing.
                        self.err(
                            Diagnostic::error(Code::DuplicateDefinition, format!("`let {}` shadows {what}", name.name))
                                .primary(name.span, "choose a new name"),
                        );
                        cx.failed = true;
                    }
                    cx.let_pos.entry(name.name.clone()).or_default().push(cx.lets.len());
                    cx.lets.push((name.name.clone(), Rc::new(value.clone())));
                    cx.lets_visible = cx.lets.len();
                }
                Stmt::Assign {
                    target,
                    index,
                    accumulate,
                    value,
                    span,
                } => {
                    any_write = true;
                    if cx.is_comm {
                        self.err(
                            Diagnostic::error(Code::BadComm, "a comm op writes with `put`")
                                .primary(*span, "not a put")
                                .help("write `put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h];`"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    if target.name != "out" {
                        self.err(
                            Diagnostic::error(
                                Code::UnknownName,
                                format!("an op body writes `out`, not `{}`", target.name),
                            )
                            .primary(target.span, "write `out[...] = ...`"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    cx.scope.clear();
                    let first_var = cx.vars.len();
                    if index.len() != cx.ret_rank {
                        self.err(
                            Diagnostic::error(
                                Code::RankMismatch,
                                format!("`out` has {} dimensions, indexed with {}", cx.ret_rank, index.len()),
                            )
                            .primary(*span, "wrong number of indices"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    let mut lhs = Vec::with_capacity(index.len());
                    for ix in index {
                        match self.lhs_index(cx, ix) {
                            Some(i) => lhs.push(i),
                            None => cx.failed = true,
                        }
                    }
                    if lhs.len() != index.len() {
                        // The value's index variables were not introduced: checking it would
                        // only report them as unknown.
                        continue;
                    }
                    let v = self.statement_value(cx, value);
                    let vars: Vec<usize> = (first_var..cx.vars.len())
                        .filter(|&v| cx.vars[v].kind == VarKind::Out)
                        .collect();
                    if let (Some(v), true) = (v, lhs.len() == index.len()) {
                        body.stmts.push(SymStmt {
                            target: SymTarget::Out(lhs),
                            accumulate: *accumulate,
                            value: v,
                            vars,
                            span: *span,
                        });
                    } else {
                        cx.failed = true;
                    }
                }
                Stmt::Put {
                    target,
                    rank,
                    index,
                    accumulate,
                    value,
                    span,
                } => {
                    any_write = true;
                    if !cx.is_comm {
                        self.err(
                            Diagnostic::error(Code::BadComm, "`put` is only allowed in a `comm` op")
                                .primary(*span, "communication in a compute op")
                                .help("declare the op with `comm` instead of `op`"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    if target.name != "out" {
                        self.err(
                            Diagnostic::error(
                                Code::UnknownName,
                                format!("a comm op puts into `out`, not `{}`", target.name),
                            )
                            .primary(target.span, "write `put out @ ...`"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    cx.scope.clear();
                    let first_var = cx.vars.len();
                    let rank_ix = self.index(cx, rank);
                    if let Some(SymIndex::Route { func, .. }) = &rank_ix {
                        if !matches!(func, RouteFn::Rank | RouteFn::SrcRank) {
                            self.err(
                                Diagnostic::error(Code::BadComm, format!("`r.{}` is not a rank", func.name()))
                                    .primary(rank.span, "the destination must be `r.rank(t, j)` or `r.src_rank(m)`"),
                            );
                            cx.failed = true;
                        }
                    } else if rank_ix.is_some() {
                        self.err(
                            Diagnostic::error(Code::BadComm, "the destination rank of a put comes from the routing")
                                .primary(rank.span, "expected `r.rank(t, j)` or `r.src_rank(m)`"),
                        );
                        cx.failed = true;
                    }
                    if index.len() != cx.ret_rank {
                        self.err(
                            Diagnostic::error(
                                Code::RankMismatch,
                                format!("`out` has {} dimensions, indexed with {}", cx.ret_rank, index.len()),
                            )
                            .primary(*span, "wrong number of indices"),
                        );
                        cx.failed = true;
                        continue;
                    }
                    let mut ixs = Vec::with_capacity(index.len());
                    for ix in index {
                        match self.index(cx, ix) {
                            Some(i) => ixs.push(i),
                            None => cx.failed = true,
                        }
                    }
                    let v = self.statement_value(cx, value);
                    let vars: Vec<usize> = (first_var..cx.vars.len())
                        .filter(|&v| cx.vars[v].kind == VarKind::Iter)
                        .collect();
                    if let (Some(v), Some(rk), true) = (v, rank_ix, ixs.len() == index.len()) {
                        body.stmts.push(SymStmt {
                            target: SymTarget::Put { rank: rk, index: ixs },
                            accumulate: *accumulate,
                            value: v,
                            vars,
                            span: *span,
                        });
                    } else {
                        cx.failed = true;
                    }
                }
            }
        }
        if !any_write && !cx.failed {
            self.err(
                Diagnostic::error(Code::BodyCoverage, "the op body never writes `out`")
                    .primary(body_span, "empty body")
                    .help("add `out[i, j] = ...;`"),
            );
            cx.failed = true;
        }
        body.vars = std::mem::take(&mut cx.vars);
        body
    }

    fn new_var(&mut self, cx: &mut Ctx, name: &str, kind: VarKind, span: Span) -> usize {
        cx.vars.push(SymVar {
            name: name.to_string(),
            kind,
            group_of: None,
            span,
        });
        let id = cx.vars.len() - 1;
        cx.scope.push((name.to_string(), id));
        id
    }

    fn lookup_var(cx: &Ctx, name: &str) -> Option<usize> {
        cx.scope.iter().rev().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// What a `let` named `name` would shadow: an earlier `let`, a parameter of the op, a
    /// shape symbol, the dtype parameter or a `param` of the program.
    fn let_clash(&self, cx: &Ctx, name: &str) -> Option<&'static str> {
        if cx.let_pos.contains_key(name) {
            Some("an earlier `let` of this body")
        } else if cx.is_param(name) {
            Some("a parameter of this op")
        } else if cx.sym_of(name).is_some() {
            Some("a shape symbol of the signature")
        } else if cx.generic(name).is_some() {
            Some("a dtype parameter of this op")
        } else if self.is_const_name(cx, name) {
            Some("a `param` of the program")
        } else {
            None
        }
    }

    /// Whether a name denotes a constant (a shape symbol or a param), not a variable.
    fn is_const_name(&self, cx: &Ctx, name: &str) -> bool {
        cx.sym_of(name).is_some()
            || self
                .lookup(cx.item.module, name)
                .is_some_and(|r| matches!(self.item(r).kind, ItemKind::Param(_)))
    }

    /// An index of `out` on the left of `=`: a new variable, optionally with an offset.
    fn lhs_index(&mut self, cx: &mut Ctx, e: &Expr) -> Option<SymIndex> {
        let (name, nspan, offset) = match &e.kind {
            ExprKind::Error => return None,
            ExprKind::Name(n) => (n.to_string(), e.span, Sym::Int(0)),
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b)
                if a.name().is_some_and(|n| !self.is_const_name(cx, n)) =>
            {
                let off = self.sym(cx, b)?;
                let off = if *op == BinOp::Sub {
                    Sym::Neg(Box::new(off))
                } else {
                    off
                };
                (a.name().unwrap_or_default().to_string(), a.span, off)
            }
            ExprKind::Binary(BinOp::Add, a, b) if b.name().is_some_and(|n| !self.is_const_name(cx, n)) => {
                let off = self.sym(cx, a)?;
                (b.name().unwrap_or_default().to_string(), b.span, off)
            }
            _ => {
                self.err(
                    Diagnostic::error(
                        Code::BadIndex,
                        "an output index must be an index variable, optionally plus a constant",
                    )
                    .primary(e.span, "expected `i` or `i + C`"),
                );
                return None;
            }
        };
        let is_let = cx.visible_let(&name).is_some();
        if self.is_const_name(cx, &name) || RESERVED.contains(&name.as_str()) || cx.is_param(&name) || is_let {
            let what = if is_let {
                "a `let` of this body"
            } else if cx.sym_of(&name).is_some() {
                "a shape symbol of the signature"
            } else if cx.is_param(&name) {
                "a parameter of this op"
            } else if RESERVED.contains(&name.as_str()) {
                "a reserved name"
            } else {
                "a `param` of the program"
            };
            self.err(
                Diagnostic::error(Code::BadIndex, format!("`{name}` is not a fresh index variable"))
                    .primary(nspan, format!("`{name}` is {what}"))
                    .help("name output indices with new lowercase names, e.g. `out[m, n]`"),
            );
            return None;
        }
        if Self::lookup_var(cx, &name).is_some() {
            self.err(
                Diagnostic::error(
                    Code::DuplicateDefinition,
                    format!("index variable `{name}` is used twice in `out[...]`"),
                )
                .primary(nspan, "each output dimension needs its own variable"),
            );
            return None;
        }
        let var = self.new_var(cx, &name, VarKind::Out, nspan);
        Some(SymIndex::Affine {
            var,
            coef: 1,
            offset,
            span: e.span,
        })
    }

    /// Resolves or (in comm statements) introduces a variable used in an index or value.
    fn var_use(&mut self, cx: &mut Ctx, name: &str, span: Span) -> Option<usize> {
        if let Some(v) = Self::lookup_var(cx, name) {
            return Some(v);
        }
        if cx.is_comm && !self.is_const_name(cx, name) && !cx.is_param(name) && !RESERVED.contains(&name) {
            return Some(self.new_var(cx, name, VarKind::Iter, span));
        }
        None
    }

    /// A tensor index on the right-hand side or in a put.
    fn index(&mut self, cx: &mut Ctx, e: &Expr) -> Option<SymIndex> {
        let bad = |ck: &mut Self| {
            ck.err(
                Diagnostic::error(Code::BadIndex, "not an affine index")
                    .primary(
                        e.span,
                        "expected `i`, `i + c`, `a * i + c`, a constant, `group(m)` or a routing function",
                    )
                    .note("an index is affine in one index variable"),
            );
            None
        };
        match &e.kind {
            ExprKind::Error => None,
            ExprKind::Name(n) => {
                if let Some(v) = self.var_use(cx, n, e.span) {
                    return Some(SymIndex::Affine {
                        var: v,
                        coef: 1,
                        offset: Sym::Int(0),
                        span: e.span,
                    });
                }
                if self.is_const_name(cx, n) {
                    return Some(SymIndex::Const(self.sym(cx, e)?, e.span));
                }
                let cands: Vec<String> = cx.scope_names();
                self.unknown_name_among(cx.item.module, n, e.span, "index variable", &cands);
                None
            }
            ExprKind::Int(_) => Some(SymIndex::Const(self.sym(cx, e)?, e.span)),
            ExprKind::Binary(op, a, b) => {
                let la = self.index(cx, a)?;
                let lb = self.index(cx, b)?;
                match (op, la, lb) {
                    (BinOp::Add, SymIndex::Affine { var, coef, offset, .. }, SymIndex::Const(c, _))
                    | (BinOp::Add, SymIndex::Const(c, _), SymIndex::Affine { var, coef, offset, .. }) => {
                        Some(SymIndex::Affine {
                            var,
                            coef,
                            offset: Sym::Bin(BinOp::Add, Box::new(offset), Box::new(c)),
                            span: e.span,
                        })
                    }
                    (BinOp::Sub, SymIndex::Affine { var, coef, offset, .. }, SymIndex::Const(c, _)) => {
                        Some(SymIndex::Affine {
                            var,
                            coef,
                            offset: Sym::Bin(BinOp::Sub, Box::new(offset), Box::new(c)),
                            span: e.span,
                        })
                    }
                    (BinOp::Mul, SymIndex::Const(Sym::Int(k), _), SymIndex::Affine { var, coef, offset, .. })
                    | (BinOp::Mul, SymIndex::Affine { var, coef, offset, .. }, SymIndex::Const(Sym::Int(k), _)) => {
                        let Some(c2) = coef.checked_mul(k) else {
                            self.overflow(e.span);
                            return None;
                        };
                        if c2 == 0 {
                            self.err(
                                Diagnostic::error(Code::BadIndex, "an index variable multiplied by zero")
                                    .primary(e.span, "this index does not depend on its variable")
                                    .help("write the constant index itself, or a non-zero coefficient"),
                            );
                            return None;
                        }
                        Some(SymIndex::Affine {
                            var,
                            coef: c2,
                            offset: Sym::Bin(BinOp::Mul, Box::new(offset), Box::new(Sym::Int(k))),
                            span: e.span,
                        })
                    }
                    // `c - i`: a reversed index.
                    (BinOp::Sub, SymIndex::Const(c, _), SymIndex::Affine { var, coef, offset, .. }) => {
                        let Some(neg) = coef.checked_neg() else {
                            self.overflow(e.span);
                            return None;
                        };
                        Some(SymIndex::Affine {
                            var,
                            coef: neg,
                            offset: Sym::Bin(BinOp::Sub, Box::new(c), Box::new(offset)),
                            span: e.span,
                        })
                    }
                    (_, SymIndex::Const(x, _), SymIndex::Const(y, _)) => {
                        Some(SymIndex::Const(Sym::Bin(*op, Box::new(x), Box::new(y)), e.span))
                    }
                    _ => bad(self),
                }
            }
            ExprKind::Neg(a) => match self.index(cx, a)? {
                SymIndex::Const(Sym::Int(k), _) => match k.checked_neg() {
                    Some(n) => Some(SymIndex::Const(Sym::Int(n), e.span)),
                    None => {
                        self.overflow(e.span);
                        None
                    }
                },
                SymIndex::Const(c, _) => Some(SymIndex::Const(Sym::Neg(Box::new(c)), e.span)),
                SymIndex::Affine { var, coef, offset, .. } => match coef.checked_neg() {
                    Some(neg) => Some(SymIndex::Affine {
                        var,
                        coef: neg,
                        offset: Sym::Neg(Box::new(offset)),
                        span: e.span,
                    }),
                    None => {
                        self.overflow(e.span);
                        None
                    }
                },
                _ => bad(self),
            },
            ExprKind::Call { callee, args } => {
                if callee.name() == Some("group") {
                    if args.len() != 1 {
                        self.err(
                            Diagnostic::error(
                                Code::WrongArgCount,
                                format!("`group` takes 1 argument, got {}", args.len()),
                            )
                            .primary(e.span, "here"),
                        );
                        return None;
                    }
                    let Some(vn) = args[0].value.name() else {
                        return bad(self);
                    };
                    let Some(v) = self.var_use(cx, vn, args[0].value.span) else {
                        let cands: Vec<String> = cx.scope_names();
                        self.unknown_name_among(cx.item.module, vn, args[0].value.span, "index variable", &cands);
                        return None;
                    };
                    return Some(SymIndex::Group(v, e.span));
                }
                if let ExprKind::Field { .. } = &callee.kind {
                    let (param, func, args) = self.route_call(cx, e)?;
                    return Some(SymIndex::Route {
                        param,
                        func,
                        args,
                        span: e.span,
                    });
                }
                bad(self)
            }
            _ => bad(self),
        }
    }

    /// `r.func(vars)` → (routing param, function, variables).
    fn route_call(&mut self, cx: &mut Ctx, e: &Expr) -> Option<(usize, RouteFn, Vec<usize>)> {
        let ExprKind::Call { callee, args } = &e.kind else {
            return None;
        };
        let ExprKind::Field { base, field } = &callee.kind else {
            return None;
        };
        let rn = base.name().unwrap_or("");
        let Some(param) = cx.index.routes.get(rn).copied() else {
            self.err(
                Diagnostic::error(Code::WrongKind, format!("`{rn}` is not a routing parameter of this op"))
                    .primary(base.span, "expected a parameter declared `r: route`"),
            );
            return None;
        };
        let Some(func) = RouteFn::parse(&field.name) else {
            let names: Vec<&str> = RouteFn::all().iter().map(|f| f.name()).collect();
            let mut d = Diagnostic::error(Code::UnknownName, format!("a routing has no function `{}`", field.name))
                .primary(field.span, "unknown");
            d = match crate::suggest::closest(&field.name, names.iter().copied()) {
                Some(b) => d.help(format!("did you mean `{b}`?")),
                None => d.help(format!("the routing functions are: {}", names.join(", "))),
            };
            self.err(d);
            return None;
        };
        if !cx.is_comm {
            self.err(
                Diagnostic::error(
                    Code::BadComm,
                    format!("`{rn}.{}` is only available in `comm` ops", field.name),
                )
                .primary(e.span, "routing functions describe communication"),
            );
            return None;
        }
        if args.len() != func.arity() {
            self.err(
                Diagnostic::error(
                    Code::WrongArgCount,
                    format!(
                        "`{rn}.{}` takes {} argument(s), got {}",
                        field.name,
                        func.arity(),
                        args.len()
                    ),
                )
                .primary(e.span, "wrong number of arguments")
                .help(if func.arity() == 2 {
                    "sending side: `r.rank(t, j)` with a token and a choice"
                } else {
                    "receiving side: `r.src_rank(m)` with a received row"
                }),
            );
            return None;
        }
        let mut vars = Vec::with_capacity(args.len());
        for a in args {
            let Some(n) = a.value.name() else {
                self.err(
                    Diagnostic::error(Code::BadIndex, "routing functions take index variables")
                        .primary(a.value.span, "expected a variable"),
                );
                return None;
            };
            match self.var_use(cx, n, a.value.span) {
                Some(v) => vars.push(v),
                None => {
                    self.err(
                        Diagnostic::error(Code::BadIndex, format!("`{n}` is not an index variable"))
                            .primary(a.value.span, "expected a variable"),
                    );
                    return None;
                }
            }
        }
        Some((param, func, vars))
    }

    /// The scalar value of a statement, its `let`s inlined, within the bounds on its depth
    /// and size.
    fn statement_value(&mut self, cx: &mut Ctx, e: &Expr) -> Option<SymScalar> {
        cx.scalar_depth = 0;
        cx.scalar_nodes = 0;
        cx.scalar_too_large = false;
        self.scalar(cx, e)
    }

    /// A scalar expression of a body, counted against the bounds of its statement.
    fn scalar(&mut self, cx: &mut Ctx, e: &Expr) -> Option<SymScalar> {
        if cx.scalar_too_large {
            return None;
        }
        cx.scalar_nodes += 1;
        if cx.scalar_depth >= MAX_INLINED_DEPTH || cx.scalar_nodes > MAX_INLINED_NODES {
            cx.scalar_too_large = true;
            cx.failed = true;
            let what = if cx.scalar_depth >= MAX_INLINED_DEPTH {
                format!("nested deeper than {MAX_INLINED_DEPTH} levels")
            } else {
                format!("more than {MAX_INLINED_NODES} terms")
            };
            self.err(
                Diagnostic::error(
                    Code::NestingTooDeep,
                    format!("this value, with its `let`s substituted, is {what}"),
                )
                .primary(e.span, "the bound is reached here")
                .help("each use of a `let` repeats its expression: use fewer, shorter `let` chains"),
            );
            return None;
        }
        // A name adds no level: it is a leaf or stands for its `let`'s expression.
        let level = u32::from(!matches!(e.kind, ExprKind::Name(_)));
        cx.scalar_depth += level;
        let r = self.scalar_expr(cx, e);
        cx.scalar_depth -= level;
        r
    }

    /// A scalar expression of a body.
    fn scalar_expr(&mut self, cx: &mut Ctx, e: &Expr) -> Option<SymScalar> {
        match &e.kind {
            ExprKind::Int(v) => Some(SymScalar::Const(*v as f64)),
            ExprKind::Float(f) => Some(SymScalar::Const(*f)),
            ExprKind::Name(n) => {
                if let Some(l) = cx.local(n) {
                    return match l {
                        Local::Var(v) => Some(SymScalar::Var(v)),
                        Local::Let(pos) => {
                            // Inline the let in the current scope; lets see only earlier lets
                            // and the statement's index variables (not the reduction variables
                            // of the `sum` it is used in).
                            let expr = Rc::clone(&cx.lets[pos].1);
                            let index_vars: Vec<(String, usize)> = cx
                                .scope
                                .iter()
                                .filter(|(_, v)| cx.vars[*v].kind != VarKind::Reduce)
                                .cloned()
                                .collect();
                            let saved = std::mem::replace(&mut cx.scope, index_vars);
                            let visible = std::mem::replace(&mut cx.lets_visible, pos);
                            let r = self.scalar(cx, &expr);
                            cx.scope = saved;
                            cx.lets_visible = visible;
                            r
                        }
                    };
                }
                if cx.is_param(n) {
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{n}` is a tensor or routing; index it"))
                            .primary(e.span, "expected a scalar")
                            .help(format!("write `{n}[i, j]`")),
                    );
                    return None;
                }
                if self.is_const_name(cx, n) {
                    return Some(SymScalar::Sym(self.sym(cx, e)?));
                }
                if let Some(v) = self.var_use(cx, n, e.span) {
                    return Some(SymScalar::Var(v));
                }
                let cands: Vec<String> = cx
                    .scope
                    .iter()
                    .map(|(n, _)| n.clone())
                    .chain(cx.params.iter().map(|p| p.name().to_string()))
                    .collect();
                self.unknown_name_among(cx.item.module, n, e.span, "name", &cands);
                None
            }
            ExprKind::Str(_) | ExprKind::Tuple(_) => {
                self.err(
                    Diagnostic::error(Code::TypeMismatch, "not a scalar expression")
                        .primary(e.span, "expected a number, a tensor element or a function"),
                );
                None
            }
            ExprKind::Neg(a) => Some(SymScalar::Neg(Box::new(self.scalar(cx, a)?))),
            ExprKind::Binary(op, a, b) => {
                let x = self.scalar(cx, a);
                let y = self.scalar(cx, b);
                Some(SymScalar::Bin(*op, Box::new(x?), Box::new(y?)))
            }
            ExprKind::Index { base, index } => {
                let Some(tn) = base.name() else {
                    self.err(
                        Diagnostic::error(Code::BadIndex, "only tensor parameters can be indexed")
                            .primary(base.span, "expected a tensor name"),
                    );
                    return None;
                };
                let Some((input, rank)) = cx.index.tensors.get(tn).and_then(|&i| match &cx.params[i] {
                    CheckedParam::Tensor { ty, input, .. } => Some((*input, ty.dims.len())),
                    CheckedParam::Route { .. } => None,
                }) else {
                    if tn == "out" {
                        self.err(
                            Diagnostic::error(Code::BadIndex, "`out` cannot be read in its own definition")
                                .primary(base.span, "reads of the output are not allowed"),
                        );
                        return None;
                    }
                    let mut d = Diagnostic::error(Code::UnknownName, format!("unknown tensor `{tn}`"))
                        .primary(base.span, "not a parameter of this op");
                    if let Some(b) = crate::suggest::closest(tn, cx.params.iter().map(|p| p.name())) {
                        d = d.help(format!("did you mean `{b}`?"));
                    }
                    self.err(d);
                    return None;
                };
                if index.len() != rank {
                    self.err(
                        Diagnostic::error(
                            Code::RankMismatch,
                            format!("`{tn}` has {rank} dimension(s), indexed with {}", index.len()),
                        )
                        .primary(e.span, "wrong number of indices"),
                    );
                    return None;
                }
                let mut ixs = Vec::with_capacity(index.len());
                let mut ok = true;
                for ix in index {
                    match self.index(cx, ix) {
                        Some(i) => ixs.push(i),
                        None => ok = false,
                    }
                }
                ok.then_some(SymScalar::Read { input, index: ixs })
            }
            ExprKind::Call { callee, args } => {
                if let ExprKind::Field { .. } = &callee.kind {
                    let (param, func, vars) = self.route_call(cx, e)?;
                    if !matches!(func, RouteFn::Weight | RouteFn::SrcWeight) {
                        self.err(
                            Diagnostic::error(Code::BadComm, format!("`r.{}` is an index, not a value", func.name()))
                                .primary(e.span, "use it inside `[...]`")
                                .help("the routing values are `r.weight(t, j)` and `r.src_weight(m)`"),
                        );
                        return None;
                    }
                    return Some(SymScalar::Route {
                        param,
                        func,
                        args: vars,
                    });
                }
                let fname = callee.name().unwrap_or("");
                let Some(f) = Func::parse(fname) else {
                    let names: Vec<&str> = Func::all().iter().map(|f| f.name()).collect();
                    let mut d = Diagnostic::error(Code::UnknownName, format!("unknown function `{fname}`"))
                        .primary(callee.span, "not a scalar function");
                    d = match crate::suggest::closest(fname, names.iter().copied()) {
                        Some(b) => d.help(format!("did you mean `{b}`?")),
                        None => d.help(format!("the functions are: {}", names.join(", "))),
                    };
                    self.err(d);
                    return None;
                };
                if args.len() != f.arity() {
                    self.err(
                        Diagnostic::error(
                            Code::WrongArgCount,
                            format!("`{fname}` takes {} argument(s), got {}", f.arity(), args.len()),
                        )
                        .primary(e.span, "wrong number of arguments"),
                    );
                    return None;
                }
                let mut xs = Vec::with_capacity(args.len());
                for a in args {
                    xs.push(self.scalar(cx, &a.value));
                }
                Some(SymScalar::Call(f, xs.into_iter().collect::<Option<Vec<_>>>()?))
            }
            ExprKind::Cast { dtype, arg } => {
                let to = if let Some(g) = cx.generic(&dtype.name) {
                    let input = cx.index.generic_inputs.get(&g).copied();
                    match input {
                        Some(i) => CastTo::InputDtype(i),
                        None => {
                            self.err(
                                Diagnostic::error(
                                    Code::UnboundShapeSymbol,
                                    format!("dtype `{}` of the cast is not bound by any parameter", dtype.name),
                                )
                                .primary(dtype.span, "no input has this dtype"),
                            );
                            return None;
                        }
                    }
                } else if let Some(d) = DType::parse(&dtype.name) {
                    CastTo::Dtype(d)
                } else {
                    self.err(unknown_dtype(dtype, &cx.generics));
                    return None;
                };
                Some(SymScalar::Cast(to, Box::new(self.scalar(cx, arg)?)))
            }
            ExprKind::Sum { op, binders, body } => {
                if binders.len() > MAX_REDUCTION_VARS {
                    self.err(
                        Diagnostic::error(
                            Code::LimitExceeded,
                            format!(
                                "a reduction over {} variables; one binds at most {MAX_REDUCTION_VARS}",
                                binders.len()
                            ),
                        )
                        .primary(e.span, "too many variables")
                        .help("reduce over the variables that index the tensors read"),
                    );
                    return None;
                }
                let mark = cx.scope.len();
                let mut vars = Vec::with_capacity(binders.len());
                for b in binders {
                    let v = b.var();
                    if cx.local(&v.name).is_some() || self.is_const_name(cx, &v.name) || cx.is_param(&v.name) {
                        self.err(
                            Diagnostic::error(
                                Code::DuplicateDefinition,
                                format!("reduction variable `{}` shadows another name", v.name),
                            )
                            .primary(v.span, "choose a new name"),
                        );
                        cx.scope.truncate(mark);
                        return None;
                    }
                    let id = self.new_var(cx, &v.name, VarKind::Reduce, v.span);
                    if let Binder::InGroup { group, .. } = b {
                        match Self::lookup_var(cx, &group.name) {
                            Some(g) if g != id => cx.vars[id].group_of = Some(g),
                            _ => {
                                self.err(
                                    Diagnostic::error(
                                        Code::UnknownName,
                                        format!("`{}` is not an index variable", group.name),
                                    )
                                    .primary(group.span, "expected an output index variable"),
                                );
                                cx.scope.truncate(mark);
                                return None;
                            }
                        }
                    }
                    vars.push(id);
                }
                let inner = self.scalar(cx, body);
                cx.scope.truncate(mark);
                Some(SymScalar::Sum {
                    op: *op,
                    vars,
                    body: Box::new(inner?),
                })
            }
            ExprKind::Field { .. } => {
                self.err(
                    Diagnostic::error(Code::TypeMismatch, "a routing dimension is not a scalar value here")
                        .primary(e.span, "expected a scalar")
                        .help("routing values are `r.weight(t, j)` and `r.src_weight(m)`"),
                );
                None
            }
            ExprKind::Error => None,
        }
    }
}

fn var_names(b: &SymBody) -> Vec<String> {
    let mut v: Vec<String> = b.vars.iter().map(|x| x.name.clone()).collect();
    v.sort();
    v.dedup();
    v
}

fn contraction_of(b: &SymBody) -> Option<(usize, usize, Vec<usize>)> {
    if b.stmts.len() != 1 {
        return None;
    }
    let st = &b.stmts[0];
    if !matches!(st.target, SymTarget::Out(_)) {
        return None;
    }
    let SymScalar::Sum {
        op: ReduceOp::Sum,
        vars,
        body,
    } = &st.value
    else {
        return None;
    };
    let SymScalar::Bin(BinOp::Mul, a, c) = &**body else {
        return None;
    };
    match (&**a, &**c) {
        (SymScalar::Read { input: x, .. }, SymScalar::Read { input: y, .. }) => Some((*x, *y, vars.clone())),
        _ => None,
    }
}

/// E0402 for a name that is neither a dtype nor one of the op's generic parameters.
pub(crate) fn unknown_dtype(name: &Ident, generics: &[String]) -> Diagnostic {
    let mut cands: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    cands.extend(generics.iter().map(|s| s.as_str()));
    let d = Diagnostic::error(Code::UnknownDtype, format!("unknown dtype `{}`", name.name))
        .primary(name.span, "not a dtype");
    match crate::suggest::closest(&name.name, cands.iter().copied()) {
        Some(b) => d.help(format!("did you mean `{b}`?")),
        None => d.help(format!(
            "dtypes are {}, or a generic parameter declared as `op name<T>(...)`",
            DType::names()
        )),
    }
}
