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
