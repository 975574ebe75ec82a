//! The ready list of the list scheduler: a set of integers below a bound, popped smallest
//! first.
//!
//! In: the positions (`0..n`) of ready tasks in priority order. Out: the smallest one on
//! each pop. A bit per position and a summary bit per 64-bit word, level above level, so
//! an insert and a pop touch one word per level (`log64 n` words: 3 for a graph of 262144
//! tasks), where a binary heap of millions of ready tasks walks twenty levels of scattered
//! entries. Written here rather than taken from a crate: the bit-set crates iterate a set
//! but do not pop its least element.

/// A set of `u32` below the bound given at creation, smallest first.
#[derive(Clone, Debug)]
pub struct MinSet {
    /// `levels[0]`: one bit per position; `levels[k + 1]`: one bit per non-empty word of
    /// `levels[k]`. The last level is a single word.
    levels: Vec<Vec<u64>>,
}

impl MinSet {
    /// An empty set of positions `0..n`.
    pub fn new(n: usize) -> MinSet {
        let mut levels = Vec::new();
        let mut words = n.div_ceil(64).max(1);
        loop {
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            words = words.div_ceil(64);
        }
        MinSet { levels }
    }

    /// Adds `x` (below the bound); nothing if it is already in.
    pub fn insert(&mut self, x: u32) {
        let mut i = x as usize;
        // Up until a word that already had a bit set (its summary bit is set too).
        for level in &mut self.levels {
            let w = &mut level[i / 64];
            let was = *w;
            *w |= 1u64 << (i % 64);
            if was != 0 {
                break;
            }
            i /= 64;
        }
    }

    /// Removes and returns the smallest element.
    pub fn pop(&mut self) -> Option<u32> {
        let top = self.levels.len() - 1;
        if self.levels[top][0] == 0 {
            return None;
        }
        // Down from the summary: the first set bit of each level's word.
        let mut i = 0usize;
        for k in (0..=top).rev() {
            let w = self.levels[k][i];
            i = i * 64 + w.trailing_zeros() as usize;
        }
        let x = i;
        // Up: clear the bit, and each summary bit whose word emptied.
        for level in &mut self.levels {
            let w = &mut level[i / 64];
            *w &= !(1u64 << (i % 64));
            if *w != 0 {
                break;
            }
            i /= 64;
        }
        Some(x as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::MinSet;
    use std::collections::BTreeSet;

    proptest::proptest! {
        /// Any sequence of inserts and pops gives what a sorted set gives.
        #[test]
        fn pops_as_a_sorted_set(n in 1usize..300_000, ops in proptest::collection::vec((0u32..u32::MAX, proptest::bool::ANY), 0..400)) {
            let mut s = MinSet::new(n);
            let mut t = BTreeSet::new();
            for (x, push) in ops {
                if push {
                    let x = x % n as u32;
                    s.insert(x);
                    t.insert(x);
                } else {
                    proptest::prop_assert_eq!(s.pop(), t.pop_first());
                }
            }
            while let Some(x) = t.pop_first() {
                proptest::prop_assert_eq!(s.pop(), Some(x));
            }
            proptest::prop_assert_eq!(s.pop(), None);
        }
    }

    #[test]
    fn the_ends_of_a_large_bound() {
        let n = 64 * 64 * 64 + 5;
        let mut s = MinSet::new(n);
        for x in [n as u32 - 1, 0, 4096, 4095, 262_144] {
            s.insert(x);
        }
        let got: Vec<u32> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(got, vec![0, 4095, 4096, 262_144, n as u32 - 1]);
    }
}
