//! The sorted list of the active pairs' own caps, kept between solves.
//!
//! In: a pair's own cap listed, moved or unlisted as its flows start and finish. Out: the
//! caps in order, walked from the start or from just after a given entry.
//!
//! A solve walks the list in order, so it is a list of sorted blocks (each at most
//! [`BLOCK`] × 2 entries): a walk reads consecutive memory, and a change moves the entries of
//! one block instead of the whole list (a single sorted vector moved every entry after the
//! change, which with hundreds of thousands of active pairs, thousands of ranks putting to
//! each other, was most of a simulation's time).

/// An entry: (own level bits, pair).
pub(super) type Entry = (u64, u32);

/// Entries per block after a split.
const BLOCK: usize = 512;

/// A place in the list: block and index in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Cursor {
    b: usize,
    i: usize,
}

#[derive(Clone, Debug, Default)]
pub(super) struct OwnList {
    /// Sorted, each non-empty, every entry of a block below every entry of the next.
    blocks: Vec<Vec<Entry>>,
    len: usize,
}

impl OwnList {
    /// A list of the entries of `v`, sorted.
    pub(super) fn from_sorted(v: Vec<Entry>) -> OwnList {
        debug_assert!(v.windows(2).all(|w| w[0] < w[1]));
        let len = v.len();
        OwnList {
            blocks: if v.is_empty() { Vec::new() } else { vec![v] },
            len,
        }
    }

    /// Empties the list, keeping the first block's memory (for [`OwnList::from_sorted`]).
    pub(super) fn take_first(&mut self) -> Vec<Entry> {
        self.len = 0;
        let mut v = if self.blocks.is_empty() {
            Vec::new()
        } else {
            self.blocks.swap_remove(0)
        };
        self.blocks.clear();
        v.clear();
        v
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes its blocks hold (their capacities).
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Vec<Entry>>()
            + self
                .blocks
                .iter()
                .map(|b| b.capacity() * std::mem::size_of::<Entry>())
                .sum::<usize>()
    }

    /// The block that holds `e` or would hold it: the first whose last entry is not below it
    /// (the last block when every entry is below it).
    fn block_of(&self, e: Entry) -> usize {
        let b = self.blocks.partition_point(|blk| blk.last().is_some_and(|&l| l < e));
        b.min(self.blocks.len().saturating_sub(1))
    }

    pub(super) fn insert(&mut self, e: Entry) {
        if self.blocks.is_empty() {
            self.blocks.push(vec![e]);
            self.len = 1;
            return;
        }
        let b = self.block_of(e);
        let blk = &mut self.blocks[b];
        if let Err(at) = blk.binary_search(&e) {
            blk.insert(at, e);
            self.len += 1;
            if blk.len() > 2 * BLOCK {
                let tail = blk.split_off(BLOCK);
                self.blocks.insert(b + 1, tail);
            }
        }
    }

    /// Removes `e`; false when it is not listed.
    pub(super) fn remove(&mut self, e: Entry) -> bool {
        if self.blocks.is_empty() {
            return false;
        }
        let b = self.block_of(e);
        let blk = &mut self.blocks[b];
        match blk.binary_search(&e) {
            Ok(at) => {
                blk.remove(at);
                self.len -= 1;
                if blk.is_empty() {
                    self.blocks.remove(b);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// The first entry.
    pub(super) fn start(&self) -> Cursor {
        Cursor::default()
    }

    /// The first entry above `e`.
    pub(super) fn after(&self, e: Entry) -> Cursor {
        if self.blocks.is_empty() {
            return Cursor::default();
        }
        let b = self.block_of(e);
        let i = self.blocks[b].partition_point(|&x| x <= e);
        self.normal(Cursor { b, i })
    }

    /// `c` moved past the end of its block to the next block's start.
    #[inline]
    fn normal(&self, mut c: Cursor) -> Cursor {
        while c.b < self.blocks.len() && c.i >= self.blocks[c.b].len() {
            c.b += 1;
            c.i = 0;
        }
        c
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        self.blocks.iter().flatten().copied()
    }

    /// A walk from `c`.
    pub(super) fn walk(&self, c: Cursor) -> Walk<'_> {
        Walk {
            blocks: &self.blocks,
            b: c.b,
            cur: self.blocks.get(c.b).map_or(&[], |v| &v[c.i.min(v.len())..]),
            i: 0,
        }
    }
}

/// A walk along the list that holds its block: a step reads the next entry of a slice (the
/// solve takes a step per own cap it pops).
pub(super) struct Walk<'a> {
    blocks: &'a [Vec<Entry>],
    b: usize,
    cur: &'a [Entry],
    i: usize,
}

impl Walk<'_> {
    /// The entry here (`None` at the end).
    #[inline]
    pub(super) fn peek(&self) -> Option<Entry> {
        self.cur.get(self.i).copied()
    }

    /// Steps past the entry here (there must be one).
    #[inline]
    pub(super) fn advance(&mut self) {
        self.i += 1;
        if self.i >= self.cur.len() {
            self.b += 1;
            self.i = 0;
            self.cur = self.blocks.get(self.b).map_or(&[], |v| v.as_slice());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a sorted vector: the same entries in the same order after any inserts and
        /// removes, and a walk from just after any entry gives the same tail.
        #[test]
        fn behaves_as_a_sorted_vector(ops in proptest::collection::vec((any::<bool>(), 0u64..3000, 0u32..4), 0..6000)) {
            let mut list = OwnList::default();
            let mut v: Vec<Entry> = Vec::new();
            for (add, level, pair) in ops {
                let e = (level, pair);
                if add {
                    list.insert(e);
                    if let Err(i) = v.binary_search(&e) {
                        v.insert(i, e);
                    }
                } else {
                    let had = v.binary_search(&e).map(|i| v.remove(i)).is_ok();
                    prop_assert_eq!(list.remove(e), had);
                }
            }
            prop_assert_eq!(list.len(), v.len());
            prop_assert_eq!(list.iter().collect::<Vec<_>>(), v.clone());
            let walk = |c: Cursor| {
                let mut out = Vec::new();
                let mut w = list.walk(c);
                while let Some(e) = w.peek() {
                    out.push(e);
                    w.advance();
                }
                out
            };
            prop_assert_eq!(walk(list.start()), v.clone());
            for k in (0..v.len()).step_by(97) {
                prop_assert_eq!(walk(list.after(v[k])), v[k + 1..].to_vec());
                // A key that may or may not be listed.
                let between = (v[k].0, v[k].1 + 1);
                let from = v.partition_point(|&x| x <= between);
                prop_assert_eq!(walk(list.after(between)), v[from..].to_vec());
            }
        }
    }
}
