//! Concrete bodies: in, an op's symbolic body and the shape symbols bound by a call; out,
//! the `ConcreteBody` with index ranges, offsets and executable expressions (narrowed so
//! every index stays inside its dimension).

use super::*;

impl Checker<'_> {
    /// Makes a body concrete for a call: offsets evaluated, variable ranges inferred, output
    /// coverage checked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn concretize(
        &mut self,
        sig: &OpSig,
        binds: &[Option<Bound>],
        routes: &[Option<RouteId>],
        ins: &[(DType, Vec<Dim>)],
        out: &[Dim],
        call: Span,
    ) -> Option<ConcreteBody> {
        let nv = sig.body.vars.len();
        let mut ranges = vec![RangeDraft::Unknown; nv];
        let mut ok = true;
        let eval_off = |ck: &mut Self, s: &Sym| -> Option<i64> {
            match ck.eval_sym(s, binds, routes, call) {
                Ok(Some(Dim::Fixed(n))) => Some(n as i64),
                Ok(Some(Dim::Recv(_))) => {
                    ck.err(
                        Diagnostic::error(Code::BadIndex, "a ragged dimension cannot be an index offset")
                            .primary(call, "in this call"),
                    );
                    None
                }
                _ => None,
            }
        };
        // Convert indices and collect range constraints.
        // The use that last narrowed each variable's range (to explain coverage gaps).
        let mut narrowed: Vec<Option<Span>> = vec![None; nv];
        let mut constrain =
            |ck: &mut Self, ranges: &mut Vec<RangeDraft>, var: usize, r: RangeDraft, span: Span, what: &str| -> bool {
                let cur = ranges[var];
                let new = match (cur, r) {
                    (RangeDraft::Unknown, x) => x,
                    (x, RangeDraft::Unknown) => x,
                    (RangeDraft::Fixed(a, b), RangeDraft::Fixed(c, d)) => RangeDraft::Fixed(a.max(c), b.min(d)),
                    (RangeDraft::Recv(a), RangeDraft::Recv(b)) if a == b => RangeDraft::Recv(a),
                    (x, y) => {
                        let show = |ck: &Self, r: RangeDraft| match r {
                            RangeDraft::Fixed(a, b) => format!("{a}..{b}"),
                            RangeDraft::Recv(id) => {
                                format!("the rows of `{}.recv`", ck.routes[id.0 as usize].spec.name)
                            }
                            RangeDraft::Unknown => "?".into(),
                        };
                        let (sx, sy) = (show(ck, x), show(ck, y));
                        ck.err(
                            Diagnostic::error(
                                Code::ShapeMismatch,
                                format!(
                                    "index `{}` ranges over {sx} in one place and {sy} in another",
                                    sig.body.vars[var].name
                                ),
                            )
                            .primary(span, what.to_string())
                            .secondary(call, "in this call"),
                        );
                        return false;
                    }
                };
                if let RangeDraft::Fixed(a, b) = new {
                    if a >= b {
                        ck.err(
                            Diagnostic::error(
                                Code::IndexOutOfRange,
                                format!(
                                    "index `{}` has no valid value: its uses allow {a}..{b}",
                                    sig.body.vars[var].name
                                ),
                            )
                            .primary(span, "this use leaves no valid index")
                            .secondary(call, "in this call"),
                        );
                        return false;
                    }
                }
                if let (RangeDraft::Fixed(a, b), RangeDraft::Fixed(c, d)) = (cur, new) {
                    if c > a || d < b {
                        narrowed[var] = Some(span);
                    }
                }
                ranges[var] = new;
                true
            };
        let mut conv =
            |ck: &mut Self, ranges: &mut Vec<RangeDraft>, ix: &SymIndex, dim: Option<Dim>| -> Option<Index> {
                match ix {
                    SymIndex::Affine {
                        var,
                        coef,
                        offset,
                        span,
                    } => {
                        let off = eval_off(ck, offset)?;
                        match dim {
                            Some(Dim::Fixed(n)) => {
                                // Exact in 128 bits: `n`, `off` and `coef` are 64-bit values.
                                let (n, o, c) = (i128::from(n), i128::from(off), i128::from(*coef));
                                let bounds = if c > 0 {
                                    Some((div_ceil(-o, c), div_floor(n - 1 - o, c) + 1))
                                } else if c < 0 {
                                    Some((div_ceil(n - 1 - o, c), div_floor(-o, c) + 1))
                                } else {
                                    None
                                };
                                let Some((lo, hi)) = bounds
                                    .and_then(|(lo, hi)| Some((i64::try_from(lo).ok()?, i64::try_from(hi).ok()?)))
                                else {
                                    ck.overflow(*span);
                                    return None;
                                };
                                if !constrain(
                                    ck,
                                    ranges,
                                    *var,
                                    RangeDraft::Fixed(lo, hi),
                                    *span,
                                    "indexes a dimension of this size",
                                ) {
                                    return None;
                                }
                            }
                            Some(Dim::Recv(r)) => {
                                if *coef != 1 || off != 0 {
                                    ck.err(
                                        Diagnostic::error(
                                            Code::IndexOutOfRange,
                                            "rows of a receive window can only be indexed by a plain variable",
                                        )
                                        .primary(*span, "an offset or a factor on a ragged dimension")
                                        .secondary(call, "in this call"),
                                    );
                                    return None;
                                }
                                if !constrain(ck, ranges, *var, RangeDraft::Recv(r), *span, "indexes received rows") {
                                    return None;
                                }
                            }
                            None => {}
                        }
                        Some(Index::Affine {
                            var: *var,
                            coef: *coef,
                            offset: off,
                        })
                    }
                    SymIndex::Const(s, span) => {
                        let c = eval_off(ck, s)?;
                        match dim {
                            Some(Dim::Fixed(n)) if c < 0 || c >= n as i64 => {
                                ck.err(
                                    Diagnostic::error(Code::IndexOutOfRange, format!("index {c} is outside 0..{n}"))
                                        .primary(*span, "out of range")
                                        .secondary(call, "in this call"),
                                );
                                return None;
                            }
                            Some(Dim::Recv(_)) => {
                                ck.err(
                                    Diagnostic::error(Code::IndexOutOfRange, "a constant index into received rows")
                                        .primary(*span, "the number of rows differs per rank"),
                                );
                                return None;
                            }
                            _ => {}
                        }
                        Some(Index::Const(c))
                    }
                    // The group is the local expert of a received row (checked after conversion).
                    SymIndex::Group(v, _) => Some(Index::Group(*v)),
                    SymIndex::Route {
                        param,
                        func,
                        args,
                        span,
                    } => {
                        let id = routes.get(*param).copied().flatten()?;
                        let st = ck.routes[id.0 as usize].spec.clone();
                        if func.arity() == 2 {
                            let owner = ck.token_route(id);
                            let tokens = match st.kind {
                                // A fan-out's tokens are the rows of the rank window it fans out.
                                crate::ir::RouteKind::Fanout { of } => RangeDraft::Recv(of),
                                _ if ck.routes[owner.0 as usize].tokens_bound.is_some() => {
                                    RangeDraft::Fixed(0, ck.routes[owner.0 as usize].spec.tokens as i64)
                                }
                                _ => RangeDraft::Fixed(0, i64::MAX),
                            };
                            if !constrain(ck, ranges, args[0], tokens, *span, "a token of the routing") {
                                return None;
                            }
                            if !constrain(
                                ck,
                                ranges,
                                args[1],
                                RangeDraft::Fixed(0, st.topk as i64),
                                *span,
                                "a choice of the routing",
                            ) {
                                return None;
                            }
                        } else if !constrain(
                            ck,
                            ranges,
                            args[0],
                            RangeDraft::Recv(id),
                            *span,
                            "a received row of the routing",
                        ) {
                            return None;
                        }
                        Some(Index::Route {
                            route: id,
                            func: *func,
                            args: args.clone(),
                        })
                    }
                }
            };
        // Group indices constrain the group variable's dimension and need grouped rows.
        let mut stmts = Vec::new();
        for st in &sig.body.stmts {
            let target = match &st.target {
                SymTarget::Out(ix) => {
                    let mut v = Vec::new();
                    for (k, i) in ix.iter().enumerate() {
                        match conv(self, &mut ranges, i, out.get(k).copied()) {
                            Some(x) => v.push(x),
                            None => ok = false,
                        }
                    }
                    Target::Out(v)
                }
                SymTarget::Put { rank, index } => {
                    let rk = conv(self, &mut ranges, rank, None);
                    let mut v = Vec::new();
                    for (k, i) in index.iter().enumerate() {
                        match conv(self, &mut ranges, i, out.get(k).copied()) {
                            Some(x) => v.push(x),
                            None => ok = false,
                        }
                    }
                    match rk {
                        Some(r) => Target::Put { rank: r, index: v },
                        None => {
                            ok = false;
                            continue;
                        }
                    }
                }
            };
            let value = self.concrete_expr(&st.value, ins, routes, &mut ranges, &mut conv, &mut ok, call);
            if let Some(value) = value {
                stmts.push(BodyStmt {
                    target,
                    accumulate: st.accumulate,
                    value,
                    vars: st.vars.clone(),
                });
            } else {
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        // Group-index checks.
        let mut group_dims: Vec<(usize, Dim, Span)> = Vec::new();
        collect_group_uses(sig, ins, out, &mut group_dims);
        for (v, dim, span) in group_dims {
            let RangeDraft::Recv(route) = ranges[v] else {
                // The rows come from an argument: point at the call, not into the op.
                let var = &sig.body.vars[v];
                let what = match var.group_of {
                    Some(g) => format!("sum({} in group({}))", var.name, sig.body.vars[g].name),
                    None => format!("group({})", var.name),
                };
                self.err(
                    Diagnostic::error(
                        Code::NotGrouped,
                        format!("`{}` needs rows grouped by expert for `{what}`", sig.name),
                    )
                    .primary(call, "these rows do not come from a receive window")
                    .secondary(span, "the rows' expert is read here")
                    .note("rows are grouped when their dimension is a routing's `r.recv`"),
                );
                return None;
            };
            let local = self.routes[route.0 as usize].spec.local_experts();
            if dim != Dim::Fixed(local) {
                let got = self.show_dim(dim);
                let rn = self.routes[route.0 as usize].spec.name.clone();
                self.err(
                    Diagnostic::error(Code::ShapeMismatch, format!("`group(...)` indexes a dimension of size {got}, but routing `{rn}` has {local} local experts"))
                        .primary(call, format!("expected {local} groups (experts / ranks)"))
                        .secondary(span, "the group index"),
                );
                return None;
            }
        }
        // Reduction variables bound to a group.
        let mut vars = Vec::new();
        for (i, v) in sig.body.vars.iter().enumerate() {
            let range = match (v.group_of, ranges[i]) {
                (Some(g), RangeDraft::Recv(route)) => VarRange::GroupRows { route, group: g },
                (Some(_), _) => {
                    self.err(
                        Diagnostic::error(
                            Code::NotGrouped,
                            format!(
                                "`{}` ranges over the rows of a group, but it does not index received rows",
                                v.name
                            ),
                        )
                        .primary(v.span, "bound here")
                        .secondary(call, "in this call"),
                    );
                    return None;
                }
                (None, RangeDraft::Fixed(lo, hi)) => VarRange::Fixed { lo, hi },
                (None, RangeDraft::Recv(r)) => VarRange::Recv(r),
                (None, RangeDraft::Unknown) => {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!("the range of index `{}` cannot be determined", v.name),
                        )
                        .primary(v.span, "it indexes no tensor dimension")
                        .secondary(call, "in this call")
                        .help("use the variable to index a tensor, or remove it"),
                    );
                    return None;
                }
            };
            if let VarRange::Fixed { hi, .. } = range {
                if hi == i64::MAX {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!("the range of `{}` needs the routing's token count", v.name),
                        )
                        .primary(v.span, "ranges over the routing's tokens")
                        .secondary(call, "no tensor in this call gives the number of tokens"),
                    );
                    return None;
                }
            }
            vars.push(BodyVar {
                name: v.name.clone(),
                kind: v.kind,
                range,
            });
        }
        let body = ConcreteBody {
            vars,
            stmts,
            contraction: sig.contraction.as_ref().map(|(l, r, red)| Contraction {
                lhs: *l,
                rhs: *r,
                reduce: red.clone(),
            }),
        };
        if !sig.is_comm && !self.check_coverage(sig, &body, out, call, &narrowed) {
            return None;
        }
        if sig.is_comm && !self.check_comm_coverage(sig, &body, out, call) {
            return None;
        }
        Some(body)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn concrete_expr(
        &mut self,
        e: &SymScalar,
        ins: &[(DType, Vec<Dim>)],
        routes: &[Option<RouteId>],
        ranges: &mut Vec<RangeDraft>,
        conv: &mut impl FnMut(&mut Self, &mut Vec<RangeDraft>, &SymIndex, Option<Dim>) -> Option<Index>,
        ok: &mut bool,
        call: Span,
    ) -> Option<SExpr> {
        Some(match e {
            SymScalar::Const(c) => SExpr::Const(*c),
            SymScalar::Var(v) => SExpr::Var(*v),
            SymScalar::Sym(s) => match self.eval_sym(s, &[], routes, call) {
                Ok(Some(Dim::Fixed(n))) => SExpr::Const(n as i64 as f64),
                _ => {
                    // Shape symbols need the bindings; evaluate through a constant index.
                    match conv(self, ranges, &SymIndex::Const(s.clone(), call), None)? {
                        Index::Const(c) => SExpr::Const(c as f64),
                        _ => return None,
                    }
                }
            },
            SymScalar::Route { param, func, args } => {
                let id = routes.get(*param).copied().flatten()?;
                let ix = SymIndex::Route {
                    param: *param,
                    func: *func,
                    args: args.clone(),
                    span: call,
                };
                conv(self, ranges, &ix, None)?;
                SExpr::Route {
                    route: id,
                    func: *func,
                    args: args.clone(),
                }
            }
            SymScalar::Read { input, index, .. } => {
                let shape = &ins.get(*input)?.1;
                let mut v = Vec::new();
                for (k, ix) in index.iter().enumerate() {
                    match conv(self, ranges, ix, shape.get(k).copied()) {
                        Some(x) => v.push(x),
                        None => *ok = false,
                    }
                }
                if v.len() != index.len() {
                    return None;
                }
                SExpr::Read {
                    input: *input,
                    index: v,
                }
            }
            SymScalar::Neg(a) => SExpr::Neg(Box::new(self.concrete_expr(a, ins, routes, ranges, conv, ok, call)?)),
            SymScalar::Bin(op, a, b) => {
                let x = self.concrete_expr(a, ins, routes, ranges, conv, ok, call);
                let y = self.concrete_expr(b, ins, routes, ranges, conv, ok, call);
                SExpr::Bin(*op, Box::new(x?), Box::new(y?))
            }
            SymScalar::Call(f, args) => {
                let mut xs = Vec::new();
                for a in args {
                    xs.push(self.concrete_expr(a, ins, routes, ranges, conv, ok, call)?);
                }
                SExpr::Call(*f, xs)
            }
            SymScalar::Cast(to, a) => {
                let d = match to {
                    CastTo::Dtype(d) => *d,
                    CastTo::InputDtype(i) => ins.get(*i)?.0,
                };
                SExpr::Cast(d, Box::new(self.concrete_expr(a, ins, routes, ranges, conv, ok, call)?))
            }
            SymScalar::Sum { op, vars, body } => SExpr::Sum {
                op: *op,
                vars: vars.clone(),
                body: Box::new(self.concrete_expr(body, ins, routes, ranges, conv, ok, call)?),
            },
        })
    }
}

/// `a / b` rounded down; `b` is not zero and the operands are 64-bit values widened, so
/// nothing overflows.
pub(super) fn div_floor(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// `a / b` rounded up (see [`div_floor`]).
pub(super) fn div_ceil(a: i128, b: i128) -> i128 {
    -div_floor(-a, b)
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
            SymScalar::Neg(a) | SymScalar::Cast(_, a) => walk(a, ins, acc),
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
