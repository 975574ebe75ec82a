//! A map from regions to small values that stores single rows densely.
//!
//! In: regions (a tensor, a rank, bounds per dimension) and values. Out: the value stored for
//! a region. A gather reads its rows one by one, so preparing a workload looks up one region
//! per routed row: millions of them for a large dispatch. Hashed as whole regions (112 bytes
//! each, plus the table's slack) they cost about 200 bytes a row. Here a region one row high
//! (dimension 0) is keyed by its other bounds, one hashed entry for all the rows of that
//! column slab, and its row indexes a vector: a few bytes a row. A vector grows only while
//! it stays dense (its length at most [`DENSE_SLACK`] times its filled rows, plus
//! [`DENSE_FLOOR`]); rows that would make it sparse, and every other region, go to an
//! ordinary hash map. Nothing iterates the map, so its layout cannot change any result.

use hpmoe_dsl::lower::Region;
use rustc_hash::FxHashMap;

/// How many times its filled rows a row vector may be long (beyond [`DENSE_FLOOR`]).
const DENSE_SLACK: usize = 8;
/// Rows a row vector may always hold, filled or not.
const DENSE_FLOOR: usize = 4096;

/// Regions to values of type `V`; `none` marks a row with no value.
pub struct RegionMap<V: Copy + PartialEq> {
    none: V,
    /// Per column slab (the region with its row bounds zeroed): the value of each row and
    /// how many rows have one.
    rows: FxHashMap<Region, (Vec<V>, usize)>,
    other: FxHashMap<Region, V>,
}

/// The row of a one-row region and its column slab, or `None` for any other region.
fn split(r: &Region) -> Option<(usize, Region)> {
    if r.ndim == 0 || r.hi[0] != r.lo[0].checked_add(1)? {
        return None;
    }
    let row = usize::try_from(r.lo[0]).ok()?;
    let mut slab = *r;
    slab.lo[0] = 0;
    slab.hi[0] = 0;
    Some((row, slab))
}

impl<V: Copy + PartialEq> RegionMap<V> {
    /// An empty map; `none` is a value never stored.
    pub fn new(none: V) -> Self {
        RegionMap {
            none,
            rows: FxHashMap::default(),
            other: FxHashMap::default(),
        }
    }

    /// Forgets every region.
    pub fn clear(&mut self) {
        self.rows.clear();
        self.other.clear();
    }

    /// The value stored for `r`.
    pub fn get(&self, r: &Region) -> Option<V> {
        if let Some((row, slab)) = split(r) {
            if let Some(&v) = self.rows.get(&slab).and_then(|(v, _)| v.get(row)) {
                if v != self.none {
                    return Some(v);
                }
            }
        }
        self.other.get(r).copied()
    }

    /// Stores `v` for `r`, which has no value yet ([`RegionMap::get`] gave `None`).
    pub fn insert(&mut self, r: Region, v: V) {
        debug_assert!(v != self.none);
        if let Some((row, slab)) = split(&r) {
            let (vals, filled) = self.rows.entry(slab).or_default();
            let dense = row < vals.len() || row < (*filled + 1).saturating_mul(DENSE_SLACK).saturating_add(DENSE_FLOOR);
            if dense {
                if row >= vals.len() {
                    vals.resize(row + 1, self.none);
                }
                vals[row] = v;
                *filled += 1;
                return;
            }
        }
        self.other.insert(r, v);
    }

    /// The value stored for `r`, storing `make()` first if there is none.
    pub fn get_or_insert_with(&mut self, r: &Region, make: impl FnOnce() -> V) -> V {
        match self.get(r) {
            Some(v) => v,
            None => {
                let v = make();
                self.insert(*r, v);
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpmoe_dsl::ir::TensorId;
    use hpmoe_dsl::lower::regions::MAX_DIMS;

    fn region(t: u32, rank: u32, bounds: &[(i64, i64)]) -> Region {
        let mut r = Region {
            tensor: TensorId(t),
            rank,
            ndim: bounds.len() as u8,
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
            accumulate: false,
        };
        for (d, &(lo, hi)) in bounds.iter().enumerate() {
            r.lo[d] = lo;
            r.hi[d] = hi;
        }
        r
    }

    /// Against a plain hash map, on rows dense and sparse, several slabs, ranks and tensors,
    /// and regions of other shapes.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut m = RegionMap::new(u32::MAX);
        let mut plain: FxHashMap<Region, u32> = FxHashMap::default();
        let mut next = 0u32;
        let mut probe = |r: Region, m: &mut RegionMap<u32>| {
            let want = plain.get(&r).copied();
            assert_eq!(m.get(&r), want, "{r:?}");
            let got = m.get_or_insert_with(&r, || {
                next += 1;
                next
            });
            let want = *plain.entry(r).or_insert(got);
            assert_eq!(got, want);
        };
        for i in 0..20_000i64 {
            // Dense rows of two column slabs, read out of order and twice.
            let row = (i * 7919) % 10_000;
            probe(region(1, 0, &[(row, row + 1), (0, 64)]), &mut m);
            probe(region(1, 0, &[(row, row + 1), (64, 128)]), &mut m);
            // Sparse rows far apart: they must not grow a vector to their index.
            let far = i * 1_000_003;
            probe(region(2, 1, &[(far, far + 1), (0, 8)]), &mut m);
            // Other shapes: several rows, no dimension, a negative row.
            probe(region(3, 0, &[(i, i + 2), (0, 8)]), &mut m);
            probe(region(4, (i % 3) as u32, &[]), &mut m);
            probe(region(5, 0, &[(-i - 1, -i), (0, 8)]), &mut m);
        }
        // The far rows stayed out of the dense vectors.
        let longest = m.rows.values().map(|(v, _)| v.len()).max().unwrap();
        assert!(longest <= 10_000 * DENSE_SLACK + DENSE_FLOOR, "{longest}");
        m.clear();
        assert_eq!(m.get(&region(1, 0, &[(5, 6), (0, 64)])), None);
    }
}
