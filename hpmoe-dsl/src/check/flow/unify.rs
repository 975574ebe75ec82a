//! Unification at a call: the op's dtype generics and symbolic shapes bound to the
//! arguments (solving linear dimensions through [`super::linear`]), symbolic integers
//! evaluated, the body made concrete and its output coverage checked.
//!
//! In: a call's op signature, its arguments' dtypes and shapes and its routings. Out: the
//! output tensor added to the taskflow under construction, or diagnostics.

use super::*;

impl Checker<'_> {
    /// Evaluates a symbolic integer. `Ok(None)`: depends on an unbound symbol.
    pub(super) fn eval_sym(
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
                let owner = &self.routes[self.token_route(id).0 as usize];
                Ok(match d {
                    RouteDim::Recv => Some(Dim::Recv(id)),
                    // A fan-out's tokens are the rows of the rank window it fans out.
                    RouteDim::Tokens => match st.spec.kind {
                        crate::ir::RouteKind::Fanout { of } => Some(Dim::Recv(of)),
                        _ => owner.tokens_bound.map(|_| Dim::Fixed(owner.spec.tokens)),
                    },
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
    pub(super) fn int_dim(&mut self, v: i64, _span: Span) -> Result<Option<Dim>, ()> {
        Ok(Some(Dim::Fixed(v as u64)))
    }

    pub(super) fn fixed_of(&mut self, d: Dim, span: Span) -> Result<i64, ()> {
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
    pub(super) fn instantiate(
        &mut self,
        fl: &mut TaskflowDraft,
        sig: &Rc<OpSig>,
        vals: &[CallArg],
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
                (CheckedParam::Route { .. }, CallArg::Route(id)) => routes[i] = Some(*id),
                (CheckedParam::Tensor { name: pn, ty, .. }, CallArg::Tensor(t)) => {
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
                (CheckedParam::Route { name: pn, .. }, CallArg::Tensor(t)) => {
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
                (CheckedParam::Tensor { name: pn, .. }, CallArg::Route(r)) => {
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
            if let (CheckedParam::Tensor { ty, .. }, CallArg::Tensor(t)) = (p, v) {
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
                            let expected = self.show_dim(d);
                            // A dimension written as a constant (a number, or a param of the
                            // program folded to its value) is stated once, not as `4 = 4`.
                            let says = if shown == expected {
                                format!("the signature fixes it to {expected}")
                            } else {
                                format!("the signature says {shown} = {expected}")
                            };
                            let mut diag = Diagnostic::error(
                                Code::ShapeMismatch,
                                format!(
                                    "shape mismatch in `{}`: {} is {}, but {says}",
                                    sig.name,
                                    describe(c.desc),
                                    self.show_dim(c.actual),
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
                                        let id = self.token_route(id);
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
                                self.bind_tokens(id, n, c.span);
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
                CallArg::Tensor(t) => Some(*t),
                CallArg::Route(_) => None,
            })
            .collect();
        let route_ids: Vec<RouteId> = routes.iter().flatten().copied().collect();
        for &t in &inputs {
            fl.mark_tensor_used(t);
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
                    let mut named: rustc_hash::FxHashMap<&str, crate::syntax::token::Span> =
                        rustc_hash::FxHashMap::default();
                    for h in hints {
                        if let Some(prev) = named.insert(&h.name, h.span) {
                            self.err(
                                Diagnostic::error(
                                    Code::DuplicateArgument,
                                    format!("ordering hint `{}` is given twice", h.name),
                                )
                                .primary(h.span, "again here")
                                .secondary(prev, "first here"),
                            );
                            ok = false;
                            continue;
                        }
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
