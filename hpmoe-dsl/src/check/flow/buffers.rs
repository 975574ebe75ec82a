//! Buffer fit: in, an op call's analysed body, tile sizes and argument types; out, a
//! diagnostic when one tile's operands (double-buffered) exceed the Unified Buffer of an AIV
//! core or the L0A/L0B/L0C/L1 buffers of an AIC core.

use super::coverage::{index_key, IndexKey};
use super::*;

impl Checker<'_> {
    /// Checks that a tile fits the engine's buffers (double-buffered).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_buffers(
        &mut self,
        sig: &OpSig,
        body: &ConcreteBody,
        tile: &[(String, u64)],
        ins: &[(DType, Vec<Dim>)],
        out_dtype: DType,
        engine: Engine,
        call: Span,
        tile_span: Span,
    ) -> bool {
        let Some(dev) = self.device.as_ref() else { return true };
        let (l0a, l0b, l0c, l1, ub) = (
            dev.l0a_size(),
            dev.l0b_size(),
            dev.l0c_size(),
            dev.l1_size(),
            dev.ub_size(),
        );
        if sig.is_comm {
            // Puts stream through the UB in `put_chunk_bytes` chunks: any tile fits.
            return true;
        }
        let tile_of = |name: &str| tile.iter().find(|(n, _)| n == name).map_or(1, |(_, s)| *s);
        let ext = |v: usize, row: Option<usize>| -> u64 {
            if Some(v) == row {
                return 1;
            }
            let t = tile_of(&body.vars[v].name);
            match body.vars[v].range {
                VarRange::Fixed { lo, hi } => t.min(u64::try_from(i128::from(hi) - i128::from(lo)).unwrap_or(0).max(1)),
                // Untiled received rows (their number is known only after routing) are
                // streamed one row at a time.
                _ if t == u64::MAX => 1,
                _ => t,
            }
        };
        let region = |ix: &[Index], row: Option<usize>| -> u128 {
            ix.iter()
                .map(|i| match i {
                    Index::Affine { var, coef, .. } => (coef.unsigned_abs() as u128)
                        .saturating_mul(ext(*var, row) as u128 - 1)
                        .saturating_add(1),
                    _ => 1,
                })
                .fold(1u128, u128::saturating_mul)
        };
        // Only a diagnostic shows the tile.
        let tile_text = || {
            tile.iter()
                .map(|(n, s)| {
                    if *s == u64::MAX {
                        format!("{n}: all")
                    } else {
                        format!("{n}: {s}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (engine, &body.contraction) {
            (Engine::Aic, Some(c)) => {
                let mut lhs = 0u128;
                let mut rhs = 0u128;
                let mut outb = 0u128;
                for st in &body.stmts {
                    st.value.for_each_read(&mut |input, ix| {
                        let b = region(ix, None).saturating_mul(ins.get(input).map_or(2, |x| x.0.size()) as u128);
                        if input == c.lhs && lhs == 0 {
                            lhs = b;
                        } else {
                            rhs = rhs.max(b);
                        }
                    });
                    if let Target::Out(ix) = &st.target {
                        outb = region(ix, None).saturating_mul(4);
                    }
                }
                let checks = [
                    (
                        "L0A",
                        lhs.saturating_mul(2),
                        l0a,
                        "the left operand's k-step, double-buffered",
                    ),
                    (
                        "L0B",
                        rhs.saturating_mul(2),
                        l0b,
                        "the right operand's k-step, double-buffered",
                    ),
                    ("L0C", outb, l0c, "the f32 accumulator of the output tile"),
                    (
                        "L1",
                        lhs.saturating_add(rhs).saturating_mul(2),
                        l1,
                        "both operand panels, double-buffered",
                    ),
                ];
                for (buf, need, cap, what) in checks {
                    if need as f64 > cap {
                        self.err(
                            Diagnostic::error(
                                Code::TileExceedsL0,
                                format!(
                                    "the tile ({}) of `{}` needs {} of {buf}, which holds {}",
                                    tile_text(),
                                    sig.name,
                                    kib(need as f64),
                                    kib(cap)
                                ),
                            )
                            .primary(tile_span, format!("{buf} overflows"))
                            .secondary(call, "in this call")
                            .note(format!("{buf} holds {what}"))
                            .help("use smaller `m`, `n` or `k` tiles (e.g. `tile(m: 128, n: 256, k: 64)` for bf16)"),
                        );
                        return false;
                    }
                }
                true
            }
            _ => {
                // The vector core streams its tile through the UB by rows of the first output
                // dimension: one row of every operand, double-buffered, must fit. A region read
                // several times (by one or several statements) is loaded once.
                let row_name = body.stmts.iter().find_map(|st| match &st.target {
                    Target::Out(ix) => ix.first().and_then(|i| match i {
                        Index::Affine { var, .. } => Some(body.vars[*var].name.clone()),
                        _ => None,
                    }),
                    _ => None,
                });
                // Reads of the same input at indices that are written the same (variables
                // by name) load the same region.
                let key = |ix: &[Index]| index_key(body, ix);
                let mut seen: Vec<(usize, Vec<IndexKey<'_>>)> = Vec::new();
                let mut per_row = 0u128;
                for st in &body.stmts {
                    let row = st
                        .vars
                        .iter()
                        .copied()
                        .find(|&v| Some(&body.vars[v].name) == row_name.as_ref());
                    st.value.for_each_read(&mut |input, ix| {
                        let k = (input, key(ix));
                        if !seen.contains(&k) {
                            seen.push(k);
                            per_row = per_row.saturating_add(
                                region(ix, row).saturating_mul(ins.get(input).map_or(2, |x| x.0.size()) as u128),
                            );
                        }
                    });
                    if let Target::Out(ix) = &st.target {
                        per_row = per_row.saturating_add(region(ix, row).saturating_mul(out_dtype.size() as u128));
                    }
                }
                let row = body.vars.iter().position(|v| Some(&v.name) == row_name.as_ref());
                let need = per_row.saturating_mul(2);
                let cap = ub;
                if need as f64 > cap {
                    let rn = row.map_or("the first index".to_string(), |r| format!("`{}`", body.vars[r].name));
                    self.err(
                        Diagnostic::error(
                            Code::TileExceedsUb,
                            format!("one row of the tile ({}) of `{}` needs {} of Unified Buffer, which holds {}", tile_text(), sig.name, kib(need as f64), kib(cap)),
                        )
                        .primary(tile_span, "does not fit in the Unified Buffer")
                        .secondary(call, "in this call")
                        .note(format!("a vector core streams a tile row by row ({rn}); a row of every input and of the output, double-buffered, must fit"))
                        .help("tile the inner dimensions smaller"),
                    );
                    return false;
                }
                true
            }
        }
    }
}

fn kib(bytes: f64) -> String {
    if bytes >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", bytes / 1048576.0)
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}
