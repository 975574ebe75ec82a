//! Taskflow inputs for numerics: seeded random values, or arrays from `.npy` files (with a
//! leading rank axis), and `.npy` dumps of inputs, routings and results.

use super::store::TensorStore;
use hpmoe_dsl::ir::{DType, Dim, Taskflow, TensorId};
use hpmoe_dsl::lower::TaskGraph;
use hpmoe_dsl::npy::{self, NpyType};
use hpmoe_dsl::route::Rng;
use std::path::Path;

/// A stable 64-bit hash of a name (FNV-1a), to seed each input independently.
fn name_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The scale of random values: weights (3-D inputs `[experts, K, N]`) are scaled by
/// `1/sqrt(K)` so that products keep unit magnitude.
fn scale(tf: &Taskflow, t: TensorId) -> f64 {
    let s = &tf.tensor(t).shape;
    match (s.len(), s.get(1)) {
        (3, Some(Dim::Fixed(k))) => 1.0 / (*k as f64).sqrt(),
        _ => 1.0,
    }
}

/// Fills input `t` with seeded uniform values in `[-scale, scale)`. A tensor of a 1-byte
/// dtype (a quantised payload) is filled over its whole range instead: `cast(u * max)` for
/// `u` uniform in `[-1, 1)` (`[0, 1)` for `u8`), so that its values use every step.
pub fn random_fill(tf: &Taskflow, t: TensorId, store: &mut TensorStore<f64>, seed: u64) {
    let sc = scale(tf, t);
    let tensor = tf.tensor(t);
    let name = &tensor.name;
    let d = tensor.dtype;
    for (r, data) in store.data.iter_mut().enumerate() {
        let mut rng = Rng::new(seed ^ name_hash(name) ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for x in data.iter_mut() {
            let u = rng.unit();
            *x = match d {
                DType::U8 => d.cast(u * d.max_value()),
                _ if d.rounds_on_store() => d.cast((u * 2.0 - 1.0) * d.max_value()),
                _ => (u * 2.0 - 1.0) * sc,
            };
        }
    }
}

/// The dump shape of a tensor: `[ranks, dims...]`, ragged rows padded to the largest rank.
pub fn dump_shape<T>(store: &TensorStore<T>) -> Vec<usize> {
    let ranks = store.shape.len();
    let nd = store.shape.first().map_or(0, |s| s.len());
    let mut shape = vec![ranks];
    for k in 0..nd {
        shape.push(store.shape.iter().map(|s| s[k]).max().unwrap_or(0));
    }
    shape
}

/// Fills an input from a `.npy` file of shape `[ranks, dims...]` (ragged rows padded).
pub fn load(tf: &Taskflow, t: TensorId, store: &mut TensorStore<f64>, path: &Path) -> Result<(), String> {
    let want = dump_shape(store);
    let a = npy::read_checked(path, |h| {
        if h.shape == want {
            return Ok(());
        }
        Err(format!(
            "has shape {:?}, but input `{}` needs {:?} ([ranks, ...], ragged rows padded to the largest rank)",
            h.shape,
            tf.tensor(t).name,
            want
        ))
    })
    .map_err(|e| format!("`{}`: {e}", path.display()))?;
    if let Some(bad) = a.data.iter().position(|x| !x.is_finite()) {
        return Err(format!("`{}`: element {bad} is not finite", path.display()));
    }
    // The numerics hold values as f32; a float tensor holds only what its dtype can (a
    // 1-byte dtype rounds, as a store does, below).
    let d = tf.tensor(t).dtype;
    let overflows = |x: f64| !(x as f32).is_finite() || (!d.rounds_on_store() && !d.cast(x).is_finite());
    if let Some(bad) = a.data.iter().position(|&x| overflows(x)) {
        return Err(format!(
            "`{}`: element {bad} is {:e}, beyond the largest {} value",
            path.display(),
            a.data[bad],
            d.name()
        ));
    }
    let row_len: usize = want[2..].iter().product();
    let max_rows = want.get(1).copied().unwrap_or(1);
    for (r, data) in store.data.iter_mut().enumerate() {
        let rows = store.shape[r].first().copied().unwrap_or(1);
        let base = r * max_rows * row_len;
        let n = if store.shape[r].is_empty() { 1 } else { rows * row_len };
        data[..n].copy_from_slice(&a.data[base..base + n]);
    }
    // A 1-byte dtype holds only its values: a loaded value rounds as a store does.
    if d.rounds_on_store() {
        for x in store.data.iter_mut().flatten() {
            *x = d.cast(*x);
        }
    }
    Ok(())
}

/// Writes a tensor as `[ranks, dims...]` float32 (ragged rows padded with zeros).
pub fn dump<T: Copy + Into<f64>>(store: &TensorStore<T>, path: &Path) -> std::io::Result<()> {
    let shape = dump_shape(store);
    let row_len: usize = shape[2..].iter().product();
    let max_rows = shape.get(1).copied().unwrap_or(1);
    let mut out = vec![0.0f64; shape.iter().product()];
    for (r, data) in store.data.iter().enumerate() {
        let base = r * max_rows * row_len;
        for (i, &x) in data.iter().enumerate() {
            out[base + i] = x.into();
        }
    }
    npy::write(path, NpyType::F32, &shape, &out)
}

/// Writes a routing's expert ids `[ranks, tokens, topk]` (int32), gate weights (float32),
/// window rows (int32: the row of the destination rank's receive window that token t's
/// choice j lands in, -1 for a dropped row; docs/FORMATS.md "Receive windows") and, for a
/// routing that dropped rows, which rows it kept (int32 1 or 0, `_kept.npy`).
pub fn dump_routing(g: &TaskGraph, route: usize, dir: &Path, prefix: &str) -> std::io::Result<()> {
    let Some(l) = g.layouts.get(route).and_then(|l| l.as_ref()) else {
        return Ok(());
    };
    let r = &l.routing;
    let shape = [r.ranks, r.tokens, r.topk];
    let ids: Vec<f64> = r.expert.iter().map(|&e| e as f64).collect();
    let w: Vec<f64> = r.weight.iter().map(|&x| x as f64).collect();
    let mut rows = vec![-1.0f64; r.ranks * r.tokens * r.topk];
    for (s, list) in l.send.iter().enumerate() {
        for e in list {
            rows[(s * r.tokens + e.token as usize) * r.topk + e.choice as usize] = e.slot as f64;
        }
    }
    npy::write(&dir.join(format!("{prefix}_ids.npy")), NpyType::I32, &shape, &ids)?;
    if r.dropped() > 0 {
        let kept: Vec<f64> = r.kept.iter().map(|&k| f64::from(u8::from(k))).collect();
        npy::write(&dir.join(format!("{prefix}_kept.npy")), NpyType::I32, &shape, &kept)?;
    }
    npy::write(&dir.join(format!("{prefix}_weights.npy")), NpyType::F32, &shape, &w)?;
    npy::write(
        &dir.join(format!("{prefix}_window_rows.npy")),
        NpyType::I32,
        &shape,
        &rows,
    )
}
