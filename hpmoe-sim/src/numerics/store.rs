//! Per-rank tensor storage for the numerics executors.

use hpmoe_dsl::ir::{Dim, Taskflow, TensorId};
use hpmoe_dsl::lower::{RouteLayout, TaskGraph};

/// A tensor on every rank: row-major values and, for produced tensors, the last task that
/// wrote each element (for the dynamic race check).
#[derive(Clone, Debug, Default)]
pub struct TensorStore<T> {
    /// Per rank: the concrete shape (ragged window rows resolved per rank).
    pub shape: Vec<Vec<usize>>,
    pub data: Vec<Vec<T>>,
    pub writer: Vec<Vec<u32>>,
}

/// No task wrote the element yet.
pub const NO_WRITER: u32 = u32::MAX;

impl<T: Copy + Default> TensorStore<T> {
    pub fn strides(&self, rank: usize) -> Vec<usize> {
        let s = &self.shape[rank];
        let mut st = vec![1usize; s.len()];
        for k in (0..s.len().saturating_sub(1)).rev() {
            st[k] = st[k + 1] * s[k + 1];
        }
        st
    }
    /// The linear index of `ix` on `rank`, if inside the shape.
    pub fn offset(&self, rank: usize, ix: &[i64]) -> Option<usize> {
        let s = self.shape.get(rank)?;
        if ix.len() != s.len() {
            return None;
        }
        let mut off = 0usize;
        for (k, &i) in ix.iter().enumerate() {
            if i < 0 || i as usize >= s[k] {
                return None;
            }
            off = off * s[k] + i as usize;
        }
        Some(off)
    }
}

/// The per-rank shape of a tensor.
pub fn rank_shape(tf: &Taskflow, g: &TaskGraph, t: TensorId, rank: usize) -> Vec<usize> {
    rank_shape_in(tf, &g.layouts, t, rank)
}

/// [`rank_shape`] from the routing layouts (before the taskflow is lowered).
pub fn rank_shape_in(tf: &Taskflow, layouts: &[Option<RouteLayout>], t: TensorId, rank: usize) -> Vec<usize> {
    tf.tensor(t)
        .shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n as usize,
            Dim::Recv(r) => layouts
                .get(r.0 as usize)
                .and_then(|l| l.as_ref())
                .map_or(0, |l| l.rows(rank) as usize),
        })
        .collect()
}

/// Elements of a tensor on every rank together.
pub fn tensor_elements(tf: &Taskflow, layouts: &[Option<RouteLayout>], ranks: u32, t: TensorId) -> u128 {
    (0..ranks as usize)
        .map(|r| {
            rank_shape_in(tf, layouts, t, r)
                .iter()
                .map(|&d| d as u128)
                .product::<u128>()
        })
        .sum::<u128>()
}

/// Elements of every tensor on every rank.
pub fn total_elements(tf: &Taskflow, g: &TaskGraph) -> u128 {
    total_elements_in(tf, &g.layouts, g.ranks)
}

/// [`total_elements`] from the routing layouts and the ranks.
pub fn total_elements_in(tf: &Taskflow, layouts: &[Option<RouteLayout>], ranks: u32) -> u128 {
    (0..tf.tensors.len())
        .map(|t| tensor_elements(tf, layouts, ranks, TensorId(t as u32)))
        .sum()
}

/// Allocates every tensor, zero-filled.
pub fn allocate<T: Copy + Default>(tf: &Taskflow, g: &TaskGraph, track_writers: bool) -> Vec<TensorStore<T>> {
    (0..tf.tensors.len())
        .map(|t| {
            let shape: Vec<Vec<usize>> = (0..g.ranks as usize)
                .map(|r| rank_shape(tf, g, TensorId(t as u32), r))
                .collect();
            let data = shape.iter().map(|s| vec![T::default(); s.iter().product()]).collect();
            let writer = if track_writers && tf.tensor(TensorId(t as u32)).producer.is_some() {
                shape.iter().map(|s| vec![NO_WRITER; s.iter().product()]).collect()
            } else {
                Vec::new()
            };
            TensorStore { shape, data, writer }
        })
        .collect()
}

/// A vector of `n` copies of `x`, or `Err` with the bytes it needed when the allocator has
/// no room for them (an address-space limit is reached), instead of an abort.
fn try_filled<X: Clone>(n: usize, x: X) -> Result<Vec<X>, u128> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| n as u128 * std::mem::size_of::<X>() as u128)?;
    v.resize(n, x);
    Ok(v)
}

/// [`allocate`], reporting the tensor (by name) and the bytes the allocator could not give
/// instead of aborting.
pub fn try_allocate<T: Copy + Default>(
    tf: &Taskflow,
    g: &TaskGraph,
    track_writers: bool,
) -> Result<Vec<TensorStore<T>>, (String, u128)> {
    (0..tf.tensors.len())
        .map(|t| {
            let id = TensorId(t as u32);
            let fail = |bytes| (tf.tensor(id).name.clone(), bytes);
            let shape: Vec<Vec<usize>> = (0..g.ranks as usize).map(|r| rank_shape(tf, g, id, r)).collect();
            let data = shape
                .iter()
                .map(|s| try_filled(s.iter().product(), T::default()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let writer = if track_writers && tf.tensor(id).producer.is_some() {
                shape
                    .iter()
                    .map(|s| try_filled(s.iter().product(), NO_WRITER))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(fail)?
            } else {
                Vec::new()
            };
            Ok(TensorStore { shape, data, writer })
        })
        .collect()
}

/// Rounds an f32 to the nearest bf16 (ties to even), as a device store does.
pub fn round_bf16(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> 16) & 1;
    let rounded = b.wrapping_add(0x7fff + lsb) & 0xffff_0000;
    f32::from_bits(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even.
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(round_bf16(1.5 + 1.0 / 512.0), 1.5);
        assert_eq!(round_bf16(-3.0 - 3.0 / 128.0), -3.0 - 1.0 / 32.0);
    }
}
