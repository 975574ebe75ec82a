//! Solving linear dimensions: in, a signature dimension such as `2 * N` with one unbound
//! shape symbol and the argument's concrete size; out, the symbol's value (or a diagnostic
//! when no whole, positive value fits).

use super::*;

impl Checker<'_> {
    /// Solves `sym = actual` for its single unbound symbol when `sym` is linear in it.
    pub(super) fn solve_linear(
        &mut self,
        s: &Sym,
        actual: Dim,
        binds: &[Option<Bound>],
        routes: &[Option<RouteId>],
        span: Span,
    ) -> Option<(usize, u64)> {
        let Dim::Fixed(target) = actual else { return None };
        let mut vs = Vec::new();
        s.vars(&mut vs);
        vs.retain(|v| binds[*v].is_none());
        vs.dedup();
        if vs.len() != 1 {
            return None;
        }
        let v = vs[0];
        let mut tmp = binds.to_vec();
        let at = |tmp: &mut Vec<Option<Bound>>, x: u64, ck: &mut Self| -> Option<i64> {
            tmp[v] = Some(Bound {
                dim: Dim::Fixed(x),
                span,
                from: (0, 0),
            });
            // Evaluate silently: errors here mean "not linear".
            let before = ck.diags.len();
            let r = ck.eval_sym(s, tmp, routes, span);
            let ok = ck.diags.len() == before;
            if !ok {
                ck.diags = {
                    let mut d = std::mem::take(&mut ck.diags).into_vec();
                    d.truncate(before);
                    let mut nd = crate::diag::Diagnostics::new();
                    nd.extend(d);
                    nd
                };
                return None;
            }
            match r {
                Ok(Some(Dim::Fixed(n))) => Some(n as i64),
                _ => None,
            }
        };
        let f1 = at(&mut tmp, 1, self)?;
        let f2 = at(&mut tmp, 2, self)?;
        let a = f2.checked_sub(f1)?;
        let b = f1.checked_sub(a)?;
        if a == 0 {
            return None;
        }
        let num = (target as i64).checked_sub(b)?;
        if num.checked_rem(a)? != 0 || num.checked_div(a)? < 1 {
            return None;
        }
        let x = num.checked_div(a)? as u64;
        let check = at(&mut tmp, x, self)?;
        (check == target as i64).then_some((v, x))
    }
}
