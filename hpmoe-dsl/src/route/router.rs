//! The `router` routing: the gating of an MoE layer, computed the way DeepSeek-V3 and
//! Mixtral compute it, per token and in f64:
//!
//! 1. logits `z[e]` over the experts, from a float32 `.npy` file `[ranks, tokens, experts]`,
//!    or drawn from the seed: `z[e] = N(0, 1) - skew * ln(e + 1)`;
//! 2. scores `p = softmax(z)` or `p[e] = sigmoid(z[e])`;
//! 3. selection scores `q = p + bias` (bias only chooses, it never weights);
//! 4. with `n_group > 1`, the experts form `n_group` equal groups of consecutive ids; a group
//!    scores the sum of its two highest `q` (its one `q` when a group holds one expert), and
//!    only the experts of the `topk_group` best groups stay candidates;
//! 5. the `topk` candidates of highest `q` are the choices, in that order;
//! 6. the weights are their `p`, divided by their sum when `normalize`, times `scale`.
//!
//! Ties (equal scores) go to the lower expert or group id.

use super::{Rng, Routing};
use crate::ir::{RouterSpec, ScoreFn};

/// The largest number of logits a router reads or draws.
pub const MAX_LOGITS: u64 = 1 << 28;

/// One token's routing: the chosen experts in order and their weights.
pub fn route_token(
    logits: &[f64],
    bias: Option<&[f64]>,
    spec: &RouterSpec,
    topk: usize,
    experts_out: &mut [u32],
    weights_out: &mut [f32],
) {
    let n = logits.len();
    let p: Vec<f64> = match spec.score {
        ScoreFn::Softmax => {
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let ex: Vec<f64> = logits.iter().map(|&z| (z - m).exp()).collect();
            let s: f64 = ex.iter().sum();
            ex.iter().map(|&x| x / s).collect()
        }
        ScoreFn::Sigmoid => logits.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect(),
    };
    let q: Vec<f64> = match bias {
        Some(b) => p.iter().zip(b).map(|(x, y)| x + y).collect(),
        None => p.clone(),
    };
    // Higher score first, then the lower id.
    let better = |a: usize, b: usize, s: &[f64]| s[b].total_cmp(&s[a]).then(a.cmp(&b));
    let mut candidate = vec![true; n];
    let groups = spec.n_group.max(1) as usize;
    if groups > 1 {
        let size = n / groups;
        let mut gscore = vec![0.0; groups];
        for (g, gs) in gscore.iter_mut().enumerate() {
            let mut ids: Vec<usize> = (g * size..(g + 1) * size).collect();
            ids.sort_by(|&a, &b| better(a, b, &q));
            *gs = ids.iter().take(2).map(|&e| q[e]).sum();
        }
        let mut order: Vec<usize> = (0..groups).collect();
        order.sort_by(|&a, &b| better(a, b, &gscore));
        let keep = &order[..(spec.topk_group as usize).min(groups)];
        for (e, c) in candidate.iter_mut().enumerate() {
            *c = keep.contains(&(e / size));
        }
    }
    let mut ids: Vec<usize> = (0..n).filter(|&e| candidate[e]).collect();
    ids.sort_by(|&a, &b| better(a, b, &q));
    let chosen = &ids[..topk];
    let sum: f64 = chosen.iter().map(|&e| p[e]).sum();
    for (j, &e) in chosen.iter().enumerate() {
        experts_out[j] = e as u32;
        let w = if spec.normalize && sum > 0.0 { p[e] / sum } else { p[e] };
        weights_out[j] = (w * spec.scale) as f32;
    }
}

/// A standard normal deviate (Box-Muller on two uniforms of the SplitMix64 stream).
fn normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - rng.unit();
    let u2 = rng.unit();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Reads a float `.npy` file of `want` shape.
fn read_floats(shown: &str, path: &std::path::Path, want: &[usize]) -> Result<Vec<f64>, String> {
    let a = crate::npy::read_checked(path, |h| {
        if h.shape == want {
            return Ok(());
        }
        Err(format!("has shape {:?}, expected {:?}", h.shape, want))
    })
    .map_err(|e| format!("`{shown}`: {e}"))?;
    if !matches!(a.dtype, crate::npy::NpyType::F32 | crate::npy::NpyType::F64) {
        return Err(format!(
            "`{shown}` holds {} values; router logits and bias must be float32",
            a.dtype.name()
        ));
    }
    // Float32 values: a float64 beyond float32's range would be infinite on the device.
    if let Some((i, v)) = a.data.iter().enumerate().find(|(_, v)| !(**v as f32).is_finite()) {
        return Err(format!(
            "`{shown}`: entry {i} is {v:e}; values must be finite as float32"
        ));
    }
    Ok(a.data)
}

/// The logits of a router: read from its file, or drawn from its seed.
pub fn logits(r: &Routing, spec: &RouterSpec) -> Result<Vec<f64>, String> {
    let want = [r.ranks, r.tokens, r.experts];
    let n = want.iter().try_fold(1u64, |a, &b| a.checked_mul(b as u64));
    if n.is_none_or(|n| n > MAX_LOGITS) {
        return Err(format!(
            "{} ranks x {} tokens x {} experts is more than the {MAX_LOGITS} router logits allowed",
            r.ranks, r.tokens, r.experts
        ));
    }
    if let Some(z) = &spec.gate_logits {
        if z.len() as u64 != n.unwrap_or(0) {
            return Err(format!(
                "the gate gives {} logits; [{} ranks, {} tokens, {} experts] need {}",
                z.len(),
                r.ranks,
                r.tokens,
                r.experts,
                n.unwrap_or(0)
            ));
        }
        return Ok(z.to_vec());
    }
    if let (Some(shown), Some(path)) = (&spec.logits, &spec.resolved_logits) {
        return read_floats(shown, path, &want);
    }
    let mut rng = Rng::new(spec.seed ^ 0x3C6E_F372_FE94_F82B);
    let mut out = Vec::with_capacity(r.ranks * r.tokens * r.experts);
    for _ in 0..r.ranks * r.tokens {
        for e in 0..r.experts {
            out.push(normal(&mut rng) - spec.skew * ((e + 1) as f64).ln());
        }
    }
    Ok(out)
}

/// Fills the choices and weights of a routing from its router.
pub fn fill(r: &mut Routing, spec: &RouterSpec) -> Result<(), String> {
    let z = logits(r, spec)?;
    let bias = match (&spec.bias, &spec.resolved_bias) {
        (Some(shown), Some(path)) => Some(read_floats(shown, path, &[r.experts])?),
        _ => None,
    };
    let (n, k) = (r.experts, r.topk);
    for tok in 0..r.ranks * r.tokens {
        route_token(
            &z[tok * n..(tok + 1) * n],
            bias.as_deref(),
            spec,
            k,
            &mut r.expert[tok * k..(tok + 1) * k],
            &mut r.weight[tok * k..(tok + 1) * k],
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(score: ScoreFn, normalize: bool, n_group: u64, topk_group: u64) -> RouterSpec {
        RouterSpec {
            score,
            normalize,
            scale: 1.0,
            n_group,
            topk_group,
            skew: 0.0,
            seed: 0,
            logits: None,
            bias: None,
            resolved_logits: None,
            resolved_bias: None,
            gate: None,
            gate_logits: None,
        }
    }

    #[test]
    fn softmax_top2_by_hand() {
        // softmax of [0, ln 2, ln 3, ln 4] is [1, 2, 3, 4] / 10: top-2 is experts 3 then 2,
        // normalised weights 4/7 and 3/7.
        let z = [0.0, 2f64.ln(), 3f64.ln(), 4f64.ln()];
        let (mut e, mut w) = ([0u32; 2], [0f32; 2]);
        route_token(&z, None, &spec(ScoreFn::Softmax, true, 1, 1), 2, &mut e, &mut w);
        assert_eq!(e, [3, 2]);
        assert!((w[0] - 4.0 / 7.0).abs() < 1e-6 && (w[1] - 3.0 / 7.0).abs() < 1e-6);
        route_token(&z, None, &spec(ScoreFn::Softmax, false, 1, 1), 2, &mut e, &mut w);
        assert!((w[0] - 0.4).abs() < 1e-6 && (w[1] - 0.3).abs() < 1e-6);
    }

    #[test]
    fn groups_limit_the_choice_and_bias_only_selects() {
        // Sigmoid of 0 is 1/2. Groups {0,1} {2,3} {4,5}; the bias lifts group {4,5} (sum of
        // its two: 0.5 + 0.5 + 2 * 0.3) over group {0,1}, whose expert 0 has the top score.
        let z = [3.0, -9.0, -9.0, -9.0, 0.0, 0.0];
        let b = [0.0, 0.0, 0.0, 0.0, 0.3, 0.3];
        let (mut e, mut w) = ([0u32; 2], [0f32; 2]);
        route_token(&z, Some(&b), &spec(ScoreFn::Sigmoid, false, 3, 1), 2, &mut e, &mut w);
        assert_eq!(e, [4, 5]);
        // Weights are the sigmoid scores, not score + bias.
        assert!((w[0] - 0.5).abs() < 1e-7 && (w[1] - 0.5).abs() < 1e-7);
        // Without groups expert 0 (sigmoid(3) = 0.9526) comes first.
        route_token(&z, Some(&b), &spec(ScoreFn::Sigmoid, false, 1, 1), 2, &mut e, &mut w);
        assert_eq!(e, [0, 4]);
        assert!((w[0] as f64 - 1.0 / (1.0 + (-3f64).exp())).abs() < 1e-7);
    }
}
