//! Routings: a [`RouteSpec`] in, the expert choices and gate weights of every token on every
//! rank out, with the receive counts derived from them. Deterministic: a seeded SplitMix64
//! generator, the same on every platform. A capacity-limited routing (`drop: true`) then
//! drops the rows beyond each expert's capacity ([`Routing::apply_drops`]).

use crate::ir::{DropOrder, DropSpec, RouteKind, RouteSpec};
use std::path::Path;

pub mod router;

/// The largest number of (rank, token, choice) entries a routing may have.
pub const MAX_ENTRIES: u64 = 1 << 28;

/// A materialised routing.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub ranks: usize,
    pub tokens: usize,
    pub topk: usize,
    pub experts: usize,
    /// Expert ids, `[rank][token][choice]` flattened.
    pub expert: Vec<u32>,
    /// Gate weights, same layout; positive and summing to 1 per token (a router's weights
    /// follow its `normalize` and `scale`; a dropped choice has weight 0).
    pub weight: Vec<f32>,
    /// Whether each (rank, token, choice) is sent; false only for rows a capacity-limited
    /// routing dropped.
    pub kept: Vec<bool>,
}

/// SplitMix64: small, fast, and fixed forever so routings never change between versions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `(min, max, mean)` of a list of counts (rows per rank or per expert).
pub fn count_stats(counts: &[u64]) -> (u64, u64, f64) {
    let max = counts.iter().copied().max().unwrap_or(0);
    let min = counts.iter().copied().min().unwrap_or(0);
    let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
    (min, max, mean)
}

/// The largest `max_over_mean` a hotspot routing can reach.
pub fn hotspot_max(experts: u64, topk: u64, ranks: u64) -> f64 {
    let local = experts / ranks.max(1);
    (topk.min(local) * ranks) as f64 / topk as f64
}

impl Routing {
    pub(crate) fn idx(&self, rank: usize, token: usize, j: usize) -> usize {
        (rank * self.tokens + token) * self.topk + j
    }

    /// The expert of token `t` of rank `s`, choice `j`.
    pub fn expert_of(&self, s: usize, t: usize, j: usize) -> usize {
        self.expert[self.idx(s, t, j)] as usize
    }

    /// Whether choice `j` of token `t` of rank `s` is sent (not dropped).
    pub fn is_kept(&self, s: usize, t: usize, j: usize) -> bool {
        self.kept[self.idx(s, t, j)]
    }

    /// The number of dropped (rank, token, choice) rows.
    pub fn dropped(&self) -> usize {
        self.kept.iter().filter(|k| !**k).count()
    }

    pub fn local_experts(&self) -> usize {
        self.experts / self.ranks
    }

    /// Rows each rank receives (one per kept (token, choice) routed to one of its experts).
    pub fn recv_counts(&self) -> Vec<u64> {
        let local = self.local_experts();
        let mut c = vec![0u64; self.ranks];
        for (&e, &k) in self.expert.iter().zip(&self.kept) {
            if k {
                c[e as usize / local] += 1;
            }
        }
        c
    }

    /// Rows each expert receives (kept ones).
    pub fn expert_counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.experts];
        for (&e, &k) in self.expert.iter().zip(&self.kept) {
            if k {
                c[e as usize] += 1;
            }
        }
        c
    }

    /// Drops the rows beyond each expert's capacity `ceil(c * ranks * tokens * topk /
    /// experts)`. The rows routed to an expert are ranked by `order`: `token` keeps them in
    /// window order (source rank, then token, then choice); `score` keeps the highest gate
    /// weights first, ties in window order. A dropped choice gets weight 0; with
    /// `renormalize`, a token's kept weights are rescaled to sum to what all its weights
    /// summed to (a token with every choice dropped keeps none).
    pub fn apply_drops(&mut self, d: &DropSpec) {
        let cap = d.expert_capacity(
            self.ranks as u64,
            self.tokens as u64,
            self.topk as u64,
            self.experts as u64,
        );
        // Entries per expert in window order (the flat index is (rank, token, choice) order).
        let mut by_expert: Vec<Vec<u32>> = vec![Vec::new(); self.experts];
        for (i, &e) in self.expert.iter().enumerate() {
            by_expert[e as usize].push(i as u32);
        }
        for list in &mut by_expert {
            if list.len() as u64 <= cap {
                continue;
            }
            if d.order == DropOrder::Score {
                // Stable: equal weights stay in window order.
                list.sort_by(|a, b| self.weight[*b as usize].total_cmp(&self.weight[*a as usize]));
            }
            for &i in &list[cap as usize..] {
                self.kept[i as usize] = false;
            }
        }
        for tok in 0..self.ranks * self.tokens {
            let base = tok * self.topk;
            let all: f64 = self.weight[base..base + self.topk].iter().map(|&w| w as f64).sum();
            let kept: f64 = (0..self.topk)
                .filter(|&j| self.kept[base + j])
                .map(|j| self.weight[base + j] as f64)
                .sum();
            for j in 0..self.topk {
                let i = base + j;
                if !self.kept[i] {
                    self.weight[i] = 0.0;
                } else if d.renormalize && kept > 0.0 {
                    self.weight[i] = (self.weight[i] as f64 * all / kept) as f32;
                }
            }
        }
    }

    /// Generates the routing of a spec (`file(...)` paths were resolved by the checker).
    pub fn generate(spec: &RouteSpec) -> Result<Routing, String> {
        let ranks = spec.ranks as usize;
        let tokens = spec.tokens as usize;
        let topk = spec.topk as usize;
        let experts = spec.experts as usize;
        if ranks == 0 || topk == 0 || experts == 0 || topk > experts || !experts.is_multiple_of(ranks) {
            return Err("invalid routing sizes".into());
        }
        let entries = spec
            .ranks
            .checked_mul(spec.tokens)
            .and_then(|x| x.checked_mul(spec.topk));
        if entries.is_none_or(|n| n > MAX_ENTRIES) {
            return Err(format!(
                "{} ranks x {} tokens x {} choices is more than the {} routing entries allowed",
                spec.ranks, spec.tokens, spec.topk, MAX_ENTRIES
            ));
        }
        // Sized before anything is allocated: the per-expert tables and the windows too.
        crate::lower::layout::check_size(spec.ranks, spec.tokens, spec.topk, spec.experts, false)?;
        let n = ranks * tokens * topk;
        let mut r = Routing {
            ranks,
            tokens,
            topk,
            experts,
            expert: vec![0; n],
            weight: vec![0.0; n],
            kept: vec![true; n],
        };
        let seed = match &spec.kind {
            RouteKind::Balanced => 0,
            RouteKind::Uniform { seed } | RouteKind::Zipf { seed, .. } | RouteKind::Hotspot { seed, .. } => *seed,
            RouteKind::File { .. } | RouteKind::Router(_) => 0,
            RouteKind::ByRank { .. } | RouteKind::Fanout { .. } => {
                return Err("a derived routing is made from the routing it views".into());
            }
        };
        match &spec.kind {
            RouteKind::Balanced => r.fill_balanced(|_, _| true),
            RouteKind::Uniform { seed } => {
                let mut rng = Rng::new(*seed);
                let w = vec![1.0; experts];
                r.fill_weighted(&mut rng, &w);
            }
            RouteKind::Zipf { s, seed } => {
                let mut rng = Rng::new(*seed);
                let w: Vec<f64> = (0..experts).map(|i| 1.0 / ((i + 1) as f64).powf(*s)).collect();
                r.fill_weighted(&mut rng, &w);
            }
            RouteKind::Hotspot { max_over_mean, seed } => {
                let fmax = hotspot_max(spec.experts, spec.topk, spec.ranks);
                let p = if fmax > 1.0 {
                    ((max_over_mean - 1.0) / (fmax - 1.0)).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let hot_per_rank = (p * tokens as f64).round() as usize;
                let mut rng = Rng::new(*seed);
                // Choose the hot tokens of each rank by a seeded shuffle.
                let mut hot = vec![false; ranks * tokens];
                let mut perm: Vec<usize> = (0..tokens).collect();
                for s in 0..ranks {
                    for i in (1..tokens).rev() {
                        let j = rng.below(i as u64 + 1) as usize;
                        perm.swap(i, j);
                    }
                    for &t in &perm[..hot_per_rank] {
                        hot[s * tokens + t] = true;
                    }
                }
                r.fill_balanced(|s, t| !hot[s * tokens + t]);
                for s in 0..ranks {
                    for t in 0..tokens {
                        if hot[s * tokens + t] {
                            for j in 0..topk {
                                let i = r.idx(s, t, j);
                                r.expert[i] = j as u32;
                            }
                        }
                    }
                }
            }
            RouteKind::File {
                path,
                weights,
                resolved,
                resolved_weights,
            } => {
                r.fill_file(path, resolved, weights.as_deref().zip(resolved_weights.as_deref()))?;
            }
            RouteKind::Router(rs) => router::fill(&mut r, rs)?,
            RouteKind::ByRank { .. } | RouteKind::Fanout { .. } => {
                return Err("a derived routing is made from the routing it views".into());
            }
        }
        let own_weights = matches!(
            &spec.kind,
            RouteKind::File { weights: Some(_), .. } | RouteKind::Router(_)
        );
        if !own_weights {
            r.fill_gate_weights(seed);
        }
        if let Some(d) = &spec.drop {
            r.apply_drops(d);
        }
        Ok(r)
    }

    /// `by_rank(self)`: every token goes once to each rank holding one of its kept experts.
    /// One "expert" per rank; choice j is kept when it is the first kept choice of its token
    /// on its rank; a kept choice weighs 1 (the gate weights are applied on the rank).
    pub fn by_rank(&self) -> Routing {
        let local = self.local_experts().max(1);
        let n = self.expert.len();
        let mut r = Routing {
            ranks: self.ranks,
            tokens: self.tokens,
            topk: self.topk,
            experts: self.ranks,
            expert: vec![0; n],
            weight: vec![0.0; n],
            kept: vec![false; n],
        };
        for i in (0..n).step_by(self.topk.max(1)) {
            for j in 0..self.topk {
                let d = self.expert[i + j] as usize / local;
                r.expert[i + j] = d as u32;
                let first = (0..j).all(|k| !(self.kept[i + k] && self.expert[i + k] as usize / local == d));
                if self.kept[i + j] && first {
                    r.kept[i + j] = true;
                    r.weight[i + j] = 1.0;
                }
            }
        }
        r
    }

    /// Balanced choices for the tokens where `pick` holds: token g = s * tokens + t (counted
    /// over all ranks) picks experts (g * topk + j) mod experts.
    fn fill_balanced(&mut self, pick: impl Fn(usize, usize) -> bool) {
        let mut g = 0usize;
        for s in 0..self.ranks {
            for t in 0..self.tokens {
                if !pick(s, t) {
                    continue;
                }
                for j in 0..self.topk {
                    let i = self.idx(s, t, j);
                    self.expert[i] = ((g * self.topk + j) % self.experts) as u32;
                }
                g += 1;
            }
        }
    }

    /// `topk` distinct experts per token, drawn by weight without replacement.
    fn fill_weighted(&mut self, rng: &mut Rng, w: &[f64]) {
        let mut cum = Vec::with_capacity(w.len());
        let mut acc = 0.0;
        for &x in w {
            acc += x;
            cum.push(acc);
        }
        let total = acc;
        // The fallback order: by weight, heaviest first (ties: the lower id).
        let mut order: Vec<u32> = (0..w.len() as u32).collect();
        order.sort_by(|&a, &b| w[b as usize].total_cmp(&w[a as usize]).then(a.cmp(&b)));
        // Which experts the current token has chosen: a flag per expert, so a token costs
        // its choices, not choices x choices (top-k may be in the thousands).
        let mut taken = vec![false; w.len()];
        let mut chosen = Vec::with_capacity(self.topk);
        for s in 0..self.ranks {
            for t in 0..self.tokens {
                for &e in &chosen {
                    taken[e] = false;
                }
                chosen.clear();
                // The fallback's position in `order`: it only moves forward within a token.
                let mut cursor = 0usize;
                for _ in 0..self.topk {
                    let mut pickd = None;
                    for _ in 0..64 {
                        let u = rng.unit() * total;
                        let e = cum.partition_point(|&c| c <= u).min(w.len() - 1);
                        if !taken[e] {
                            pickd = Some(e);
                            break;
                        }
                    }
                    // Fallback after many collisions: the heaviest expert not yet chosen.
                    let e = pickd.unwrap_or_else(|| {
                        while cursor < order.len() && taken[order[cursor] as usize] {
                            cursor += 1;
                        }
                        order.get(cursor).map_or(0, |&e| e as usize)
                    });
                    taken[e] = true;
                    chosen.push(e);
                }
                for (j, &e) in chosen.iter().enumerate() {
                    let i = self.idx(s, t, j);
                    self.expert[i] = e as u32;
                }
            }
        }
    }

    fn fill_gate_weights(&mut self, seed: u64) {
        let mut rng = Rng::new(seed ^ 0x6A09_E667_F3BC_C908);
        for tok in 0..self.ranks * self.tokens {
            let base = tok * self.topk;
            let mut sum = 0.0;
            for j in 0..self.topk {
                let u = 0.1 + 0.9 * rng.unit();
                self.weight[base + j] = u as f32;
                sum += u;
            }
            for j in 0..self.topk {
                self.weight[base + j] = (self.weight[base + j] as f64 / sum) as f32;
            }
        }
    }

    /// Fills the choices from `resolved` (shown as `path`) and the weights from the second
    /// file of `weights` (shown as the first).
    fn fill_file(&mut self, path: &str, resolved: &Path, weights: Option<(&str, &Path)>) -> Result<(), String> {
        let want = vec![self.ranks, self.tokens, self.topk];
        // The header is checked before the data is read.
        let a = crate::npy::read_checked(resolved, |h| {
            if h.shape.len() != 3 || h.shape[0] != self.ranks || h.shape[1] != self.tokens {
                return Err(format!(
                    "has shape {:?}, expected [ranks, tokens, topk] = {:?}",
                    h.shape, want
                ));
            }
            if h.shape[2] != self.topk {
                return Err(format!(
                    "has {} choices per token, the routing says topk = {}",
                    h.shape[2], self.topk
                ));
            }
            if !matches!(h.dtype, crate::npy::NpyType::I32 | crate::npy::NpyType::I64) {
                return Err(format!("holds {} values; expert ids must be int32", h.dtype.name()));
            }
            Ok(())
        })
        .map_err(|e| format!("`{path}`: {e}"))?;
        for (i, &v) in a.data.iter().enumerate() {
            if v < 0.0 || v >= self.experts as f64 {
                return Err(format!(
                    "`{path}`: entry {i} is expert {v}, outside 0..{}",
                    self.experts
                ));
            }
            self.expert[i] = v as u32;
        }
        for tok in 0..self.ranks * self.tokens {
            let c = &self.expert[tok * self.topk..(tok + 1) * self.topk];
            for j in 0..c.len() {
                if c[..j].contains(&c[j]) {
                    return Err(format!(
                        "`{path}`: token {} of rank {} chooses expert {} twice",
                        tok % self.tokens,
                        tok / self.tokens,
                        c[j]
                    ));
                }
            }
        }
        if let Some((wp, p)) = weights {
            let w = crate::npy::read_checked(p, |h| {
                if h.shape == want {
                    return Ok(());
                }
                Err(format!("has shape {:?}, expected {:?}", h.shape, want))
            })
            .map_err(|e| format!("`{wp}`: {e}"))?;
            for (i, &v) in w.data.iter().enumerate() {
                // Held as f32: a weight beyond its range would be infinite.
                if !(v >= 0.0 && (v as f32).is_finite()) {
                    return Err(format!(
                        "`{wp}`: weight {i} is {v}; weights must be non-negative and finite as float32"
                    ));
                }
                self.weight[i] = v as f32;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: RouteKind, ranks: u64, tokens: u64, experts: u64, topk: u64) -> RouteSpec {
        RouteSpec {
            name: "r".into(),
            kind,
            experts,
            topk,
            ranks,
            tokens,
            capacity: 0,
            drop: None,
            capacity_factor: 0.0,
            span: Default::default(),
        }
    }

    #[test]
    fn balanced_is_balanced() {
        let r = Routing::generate(&spec(RouteKind::Balanced, 4, 64, 16, 4)).unwrap();
        assert!(r.expert_counts().iter().all(|&c| c == 4 * 64 * 4 / 16));
        assert!(r.recv_counts().iter().all(|&c| c == 64 * 4));
    }

    #[test]
    fn choices_distinct_and_weights_normalised() {
        for kind in [
            RouteKind::Uniform { seed: 3 },
            RouteKind::Zipf { s: 1.2, seed: 3 },
            RouteKind::Hotspot {
                max_over_mean: 2.0,
                seed: 3,
            },
        ] {
            let r = Routing::generate(&spec(kind, 4, 50, 16, 4)).unwrap();
            for tok in 0..4 * 50 {
                let c = &r.expert[tok * 4..tok * 4 + 4];
                for j in 0..4 {
                    assert!(!c[..j].contains(&c[j]));
                }
                let s: f32 = r.weight[tok * 4..tok * 4 + 4].iter().sum();
                assert!((s - 1.0).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn hotspot_reaches_its_factor() {
        let r = Routing::generate(&spec(
            RouteKind::Hotspot {
                max_over_mean: 2.5,
                seed: 1,
            },
            8,
            1000,
            64,
            8,
        ))
        .unwrap();
        let c = r.recv_counts();
        let mean = c.iter().sum::<u64>() as f64 / c.len() as f64;
        let max = *c.iter().max().unwrap() as f64;
        assert!((max / mean - 2.5).abs() < 0.05, "got {}", max / mean);
    }

    #[test]
    fn deterministic() {
        let a = Routing::generate(&spec(RouteKind::Zipf { s: 1.0, seed: 7 }, 2, 100, 8, 2)).unwrap();
        let b = Routing::generate(&spec(RouteKind::Zipf { s: 1.0, seed: 7 }, 2, 100, 8, 2)).unwrap();
        assert_eq!(a, b);
    }
}
