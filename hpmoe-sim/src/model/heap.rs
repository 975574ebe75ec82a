//! An indexed 4-ary min-heap: at most one entry per slot (a resource, a link pair), each
//! slot's place kept so that its entry is replaced, moved or removed in place.
//!
//! In: entries, each naming its slot and ordered by [`Slot::less`]. Out: the least entry;
//! the entry of a slot. Four children per node halve the depth of a binary heap, and the
//! four children of a node share a cache line or two.

/// No place: the slot has no entry.
const NONE: u32 = u32::MAX;

/// An entry of an [`IndexedHeap`].
pub trait Slot: Copy {
    /// The slot it belongs to (below the heap's number of slots).
    fn slot(&self) -> usize;
    /// Whether it comes before `other` (a strict total order on the entries held at once).
    fn less(&self, other: &Self) -> bool;
}

/// A (key, slot) pair, in the order of the tuple.
impl Slot for (u64, u32) {
    #[inline]
    fn slot(&self) -> usize {
        self.1 as usize
    }
    #[inline]
    fn less(&self, other: &Self) -> bool {
        self < other
    }
}

#[derive(Clone, Debug)]
pub struct IndexedHeap<T> {
    v: Vec<T>,
    /// Per slot: its entry's place in `v` (`NONE`: none).
    pos: Vec<u32>,
}

impl<T> Default for IndexedHeap<T> {
    /// A heap of no slots.
    fn default() -> IndexedHeap<T> {
        IndexedHeap {
            v: Vec::new(),
            pos: Vec::new(),
        }
    }
}

impl<T: Slot> IndexedHeap<T> {
    /// An empty heap of `slots` slots.
    pub fn new(slots: usize) -> IndexedHeap<T> {
        IndexedHeap {
            v: Vec::new(),
            pos: vec![NONE; slots],
        }
    }

    pub fn clear(&mut self) {
        for e in &self.v {
            self.pos[e.slot()] = NONE;
        }
        self.v.clear();
    }

    /// The least entry.
    #[inline]
    pub fn peek(&self) -> Option<&T> {
        self.v.first()
    }

    /// The entry of slot `s`.
    #[inline]
    pub fn get(&self, s: usize) -> Option<&T> {
        match self.pos[s] {
            NONE => None,
            i => self.v.get(i as usize),
        }
    }

    /// Makes `e` its slot's entry (inserted, or replacing the one there).
    #[inline]
    pub fn set(&mut self, e: T) {
        match self.pos[e.slot()] {
            NONE => {
                self.v.push(e);
                self.up(self.v.len() - 1, e);
            }
            i => {
                let i = i as usize;
                if e.less(&self.v[i]) {
                    self.up(i, e);
                } else {
                    self.down(i, e);
                }
            }
        }
    }

    /// Removes slot `s`'s entry, if any.
    pub fn remove(&mut self, s: usize) {
        let i = self.pos[s];
        if i == NONE {
            return;
        }
        let i = i as usize;
        self.pos[s] = NONE;
        let Some(last) = self.v.pop() else { return };
        if i < self.v.len() {
            if last.less(&self.v[i]) {
                self.up(i, last);
            } else {
                self.down(i, last);
            }
        }
    }

    /// Takes the least entry out.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        let top = *self.v.first()?;
        self.remove(top.slot());
        Some(top)
    }

    /// Puts `e` in the hole at `i`, moving it towards the root.
    fn up(&mut self, mut i: usize, e: T) {
        while i > 0 {
            let p = (i - 1) / 4;
            if !e.less(&self.v[p]) {
                break;
            }
            self.v[i] = self.v[p];
            self.pos[self.v[i].slot()] = i as u32;
            i = p;
        }
        self.v[i] = e;
        self.pos[e.slot()] = i as u32;
    }

    /// Puts `e` in the hole at `i`, moving it towards the leaves.
    fn down(&mut self, mut i: usize, e: T) {
        let n = self.v.len();
        loop {
            let c = 4 * i + 1;
            if c >= n {
                break;
            }
            let mut m = c;
            for j in c + 1..(c + 4).min(n) {
                if self.v[j].less(&self.v[m]) {
                    m = j;
                }
            }
            if !self.v[m].less(&e) {
                break;
            }
            self.v[i] = self.v[m];
            self.pos[self.v[i].slot()] = i as u32;
            i = m;
        }
        self.v[i] = e;
        self.pos[e.slot()] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a sorted set of (key, slot) with one key per slot: the same least entry
        /// after any sets, removes and pops, and each slot's entry.
        #[test]
        fn orders_as_a_sorted_set(ops in proptest::collection::vec((0u8..3, 0u32..12, 0u64..6), 0..300)) {
            let mut h = IndexedHeap::<(u64, u32)>::new(12);
            let mut set = std::collections::BTreeSet::new();
            let mut key = [None::<u64>; 12];
            for (op, s, k) in ops {
                match op {
                    0 => {
                        if let Some(old) = key[s as usize].replace(k) {
                            set.remove(&(old, s));
                        }
                        set.insert((k, s));
                        h.set((k, s));
                    }
                    1 => {
                        if let Some(old) = key[s as usize].take() {
                            set.remove(&(old, s));
                        }
                        h.remove(s as usize);
                    }
                    _ => {
                        let want = set.pop_first();
                        if let Some((_, s)) = want {
                            key[s as usize] = None;
                        }
                        prop_assert_eq!(h.pop(), want);
                    }
                }
                prop_assert_eq!(h.peek().copied(), set.first().copied());
                for s in 0..12u32 {
                    prop_assert_eq!(h.get(s as usize).map(|e| e.0), key[s as usize]);
                }
            }
            h.clear();
            prop_assert_eq!(h.peek(), None);
            prop_assert!((0..12).all(|s| h.get(s).is_none()));
        }
    }
}
