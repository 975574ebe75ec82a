//! Output coverage: in, a concrete body and the output's shape; out, a diagnostic when its
//! statements do not write every output element exactly once.

use super::*;

impl Checker<'_> {
    /// The statements of a compute op must write every output element exactly once.
    pub(super) fn check_coverage(
        &mut self,
        sig: &OpSig,
        body: &ConcreteBody,
        out: &[Dim],
        call: Span,
        narrowed: &[Option<Span>],
    ) -> bool {
        // Each statement writes a box: per dimension an interval (ragged: the whole window).
        let mut boxes: Vec<(Vec<(i64, i64)>, Span)> = Vec::new();
        for (st, sst) in body.stmts.iter().zip(&sig.body.stmts) {
            let Target::Out(ix) = &st.target else { continue };
            let mut b = Vec::new();
            for (k, i) in ix.iter().enumerate() {
                let iv = match (i, out.get(k)) {
                    (Index::Affine { var, coef: 1, offset }, Some(Dim::Fixed(_))) => match body.vars[*var].range {
                        VarRange::Fixed { lo, hi } => (lo.saturating_add(*offset), hi.saturating_add(*offset)),
                        _ => (0, 1),
                    },
                    (_, Some(Dim::Recv(_))) => (0, 1),
                    _ => (0, 0),
                };
                b.push(iv);
            }
            boxes.push((b, sst.span));
        }
        let full: Vec<(i64, i64)> = out
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => (0, *n as i64),
                Dim::Recv(_) => (0, 1),
            })
            .collect();
        let vol = |b: &[(i64, i64)]| {
            b.iter().fold(1i128, |a, (lo, hi)| {
                a.saturating_mul((i128::from(*hi) - i128::from(*lo)).max(0))
            })
        };
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                let overlap = boxes[i]
                    .0
                    .iter()
                    .zip(&boxes[j].0)
                    .all(|(a, b)| a.0.max(b.0) < a.1.min(b.1));
                if overlap {
                    self.err(
                        Diagnostic::error(
                            Code::BodyCoverage,
                            format!("two statements of `{}` write the same elements of `out`", sig.name),
                        )
                        .primary(boxes[j].1, "writes again")
                        .secondary(boxes[i].1, "already written here")
                        .secondary(call, "in this call"),
                    );
                    return false;
                }
            }
        }
        let total: i128 = boxes.iter().map(|(b, _)| vol(b)).sum();
        let want = vol(&full);
        if total != want {
            // Name one uncovered dimension range for the message.
            let mut detail = String::new();
            for (k, (lo, hi)) in full.iter().enumerate() {
                let covered: Vec<(i64, i64)> = boxes.iter().map(|(b, _)| b[k]).collect();
                let mut gaps = Vec::new();
                let mut sorted = covered.clone();
                sorted.sort();
                let mut at = *lo;
                for (a, b) in sorted {
                    if a > at {
                        gaps.push((at, a));
                    }
                    at = at.max(b);
                }
                if at < *hi {
                    gaps.push((at, *hi));
                }
                if let Some((a, b)) = gaps.first() {
                    detail = format!("; for example, indices {a}..{b} of dimension {k} are never written");
                    break;
                }
            }
            let mut d = Diagnostic::error(Code::BodyCoverage, format!("the body of `{}` writes {total} of the {want} elements of `out`{detail}", sig.name))
                .primary(sig.body_span, "does not cover the output")
                .secondary(call, "in this call")
                .help("each element of `out` must be written exactly once: add statements for the rest, or fix the output type");
            // An output index whose range a read with an offset shortened.
            for (v, var) in body.vars.iter().enumerate() {
                if let (VarKind::Out, Some(sp), VarRange::Fixed { lo, hi }) =
                    (var.kind, narrowed.get(v).copied().flatten(), var.range)
                {
                    d = d.secondary(sp, format!("this index keeps `{}` in {lo}..{hi}", var.name));
                }
            }
            self.err(d);
            return false;
        }
        true
    }
}

/// An index of a tensor read as it is written: equal keys read the same region.
#[derive(PartialEq)]
pub(super) enum IndexKey<'a> {
    Affine(i64, &'a str, i64),
    Const(i64),
    Group(&'a str),
    Route(crate::ir::body::RouteFn, Vec<crate::ir::body::VarId>),
}

pub(super) fn index_key<'a>(body: &'a ConcreteBody, ix: &[Index]) -> Vec<IndexKey<'a>> {
    ix.iter()
        .map(|i| match i {
            Index::Affine { var, coef, offset } => IndexKey::Affine(*coef, body.vars[*var].name.as_str(), *offset),
            Index::Const(c) => IndexKey::Const(*c),
            Index::Group(v) => IndexKey::Group(body.vars[*v].name.as_str()),
            Index::Route { func, args, .. } => IndexKey::Route(*func, args.clone()),
        })
        .collect()
}

/// One put of a comm op as a box over the output: per dimension an interval, and why a
/// dimension is written only in part.
struct PutBox {
    iv: Vec<(i64, i64)>,
    partial: Option<String>,
    accumulate: bool,
    span: Span,
}

impl Checker<'_> {
    /// The puts of a comm op must write every element of its output, and `=` puts each
    /// element once (`+=` puts may meet: they add). A receive-window row is written through
    /// `r.slot(t, j)` over all tokens and choices; a token row through `r.src_token(m)` over
    /// the received rows; other dimensions by plain variables, as in compute ops. Puts whose
    /// indices take another form are not judged here.
    pub(super) fn check_comm_coverage(&mut self, sig: &OpSig, body: &ConcreteBody, out: &[Dim], call: Span) -> bool {
        let full_var = |v: usize, n: u64| matches!(body.vars.get(v).map(|x| x.range), Some(VarRange::Fixed { lo: 0, hi }) if u64::try_from(hi) == Ok(n));
        let mut boxes: Vec<PutBox> = Vec::new();
        for (st, sst) in body.stmts.iter().zip(&sig.body.stmts) {
            let Target::Put { index, .. } = &st.target else {
                continue;
            };
            if index.len() != out.len() {
                return true;
            }
            let mut iv = Vec::with_capacity(out.len());
            let mut partial = None;
            for (k, (i, d)) in index.iter().zip(out).enumerate() {
                let x = match (i, d) {
                    (Index::Affine { var, coef: 1, offset }, Dim::Fixed(_)) => match body.vars[*var].range {
                        VarRange::Fixed { lo, hi } => (lo.saturating_add(*offset), hi.saturating_add(*offset)),
                        _ => return true,
                    },
                    (
                        Index::Route {
                            route,
                            func: crate::ir::body::RouteFn::Slot,
                            args,
                        },
                        Dim::Recv(_),
                    ) if args.len() == 2 => {
                        let spec = &self.routes[route.0 as usize].spec;
                        // A fanout's tokens are the rows of the window it fans out.
                        let all_tokens = match spec.kind {
                            crate::ir::RouteKind::Fanout { of } => {
                                matches!(body.vars.get(args[0]).map(|x| x.range), Some(VarRange::Recv(r)) if r == of)
                            }
                            _ => full_var(args[0], spec.tokens),
                        };
                        if args[0] == args[1] || !all_tokens || !full_var(args[1], spec.topk) {
                            let show = |v: usize| match body.vars[v].range {
                                VarRange::Fixed { lo, hi } => format!("`{}` in {lo}..{hi}", body.vars[v].name),
                                _ => format!("`{}`", body.vars[v].name),
                            };
                            let tokens = match spec.kind {
                                crate::ir::RouteKind::Fanout { of } => {
                                    format!("{}.recv", self.routes[of.0 as usize].spec.name)
                                }
                                _ => format!("0..{}", spec.tokens),
                            };
                            partial.get_or_insert(format!(
                                "dimension {k} is written through `{}.slot` for {} and {} only, not every token ({tokens}) and choice (0..{})",
                                spec.name,
                                show(args[0]),
                                show(args[1]),
                                spec.topk
                            ));
                        }
                        (0, 1)
                    }
                    (
                        Index::Route {
                            func: crate::ir::body::RouteFn::SrcToken,
                            args,
                            ..
                        },
                        Dim::Fixed(n),
                    ) if args.len() == 1 => match body.vars[args[0]].range {
                        VarRange::Recv(_) => (0, i64::try_from(*n).unwrap_or(i64::MAX)),
                        _ => return true,
                    },
                    _ => return true,
                };
                iv.push(x);
            }
            boxes.push(PutBox {
                iv,
                partial,
                accumulate: st.accumulate,
                span: sst.span,
            });
        }
        if boxes.is_empty() {
            return true;
        }
        let meet = |a: &PutBox, b: &PutBox| a.iv.iter().zip(&b.iv).all(|(x, y)| x.0.max(y.0) < x.1.min(y.1));
        // `+=` puts over the same box add into it: count such a box once.
        let mut kept: Vec<&PutBox> = Vec::new();
        let mut adds_overlap = false;
        for b in &boxes {
            if let Some(prev) = kept.iter().find(|p| meet(p, b)) {
                if !(prev.accumulate && b.accumulate) {
                    self.err(
                        Diagnostic::error(
                            Code::BodyCoverage,
                            format!("two puts of `{}` write the same elements of `out`", sig.name),
                        )
                        .primary(b.span, "writes again")
                        .secondary(prev.span, "already written here")
                        .secondary(call, "in this call")
                        .help("each element of a comm op's output is written by one `=` put; use `+=` in both to add"),
                    );
                    return false;
                }
                if prev.iv != b.iv {
                    adds_overlap = true;
                }
                continue;
            }
            kept.push(b);
        }
        if let Some(b) = boxes.iter().find(|b| b.partial.is_some()) {
            self.err(
                Diagnostic::error(
                    Code::BodyCoverage,
                    format!("the puts of `{}` leave part of `out` unwritten", sig.name),
                )
                .primary(b.span, b.partial.clone().unwrap_or_default())
                .secondary(call, "in this call")
                .help("send every token's every choice, or fix the output type"),
            );
            return false;
        }
        if adds_overlap {
            // Partly overlapping `+=` boxes: their union is not a sum of volumes.
            return true;
        }
        let vol = |b: &[(i64, i64)]| {
            b.iter().fold(1i128, |a, (lo, hi)| {
                a.saturating_mul((i128::from(*hi) - i128::from(*lo)).max(0))
            })
        };
        let full: Vec<(i64, i64)> = out
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => (0, i64::try_from(*n).unwrap_or(i64::MAX)),
                Dim::Recv(_) => (0, 1),
            })
            .collect();
        let total: i128 = kept.iter().map(|b| vol(&b.iv)).sum();
        let want = vol(&full);
        if total != want {
            let mut detail = String::new();
            for (k, (lo, hi)) in full.iter().enumerate() {
                let mut sorted: Vec<(i64, i64)> = kept.iter().map(|b| b.iv[k]).collect();
                sorted.sort();
                let mut at = *lo;
                let mut gap = None;
                for (a, b) in sorted {
                    if a > at {
                        gap = Some((at, a));
                        break;
                    }
                    at = at.max(b);
                }
                if gap.is_none() && at < *hi {
                    gap = Some((at, *hi));
                }
                if let Some((a, b)) = gap {
                    detail = format!("; for example, indices {a}..{b} of dimension {k} are never written");
                    break;
                }
            }
            self.err(
                Diagnostic::error(
                    Code::BodyCoverage,
                    format!("the puts of `{}` write {total} of the {want} elements of `out` (a receive-window row counted once){detail}", sig.name),
                )
                .primary(sig.body_span, "does not cover the output")
                .secondary(call, "in this call")
                .help("each element of `out` must be written: add puts for the rest, or fix the output type"),
            );
            return false;
        }
        true
    }
}
