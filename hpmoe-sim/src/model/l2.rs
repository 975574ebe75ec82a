//! L2 residency: the blocks every die's L2 holds, replaced by CLOCK (second chance), the
//! usual approximation of least-recently-used.
//!
//! In: the blocks of the workload (an id, the die holding it, its size) and, while the
//! simulation runs, reads and writes of blocks. Out: for a read, hit or miss; for every
//! access, the dirty bytes it evicted (which must be written back to HBM).
//!
//! A block is what one task wrote on one rank (its output tile, or the rows its puts landed
//! there), or a region of a taskflow input. A written block enters dirty; a read that misses
//! brings the block in clean; both enter marked as referenced, and a hit marks the block
//! again. Blocks of a die sit in a ring in order of entry; when a die holds more than
//! `l2_size` bytes, the oldest block leaves unless it is marked, in which case it loses the
//! mark and goes round again (so a block used again soon stays, and one untouched while a
//! larger working set went through leaves). A dirty block that leaves costs a write-back. A
//! block larger than the whole L2 never stays (it streams through; written, it goes straight
//! back to HBM). Residency is all-or-nothing per block. (On the DeepSeek-V3 examples this
//! gives the same hit rate as an exact LRU list, at a fraction of the cost per hit.)
//!
//! Cost: a hit is one byte read and one written; entries and evictions are amortised O(1).

use super::Fifo;

/// Residency states (bit flags).
const RESIDENT: u8 = 1;
const DIRTY: u8 = 2;
const REFERENCED: u8 = 4;

/// How far ahead of the ring's head [`L2::insert`] fetches a block's state.
const LOOK_AHEAD: usize = 4;

#[derive(Clone, Debug)]
pub struct L2<'a> {
    capacity: f64,
    /// Per die: bytes held, and the ring of resident blocks (oldest first), each with its
    /// size (read there when it leaves, beside the ring's next entries rather than from the
    /// sizes of all blocks).
    used: Vec<f64>,
    ring: Vec<Fifo<(u32, f64)>>,
    /// Per block (the sizes and dies borrowed from the workload).
    state: Vec<u8>,
    size: &'a [f64],
    die: &'a [u32],
}

impl<'a> L2<'a> {
    /// `die[b]` and `size[b]` (bytes) of every block; `capacity` bytes per die.
    pub fn new(dies: usize, capacity: f64, die: &'a [u32], size: &'a [f64]) -> L2<'a> {
        L2 {
            capacity,
            used: vec![0.0; dies],
            ring: vec![Fifo::default(); dies],
            state: vec![0; die.len()],
            size,
            die,
        }
    }

    pub fn is_resident(&self, b: u32) -> bool {
        self.state[b as usize] & RESIDENT != 0
    }

    /// Fetches the state of block `b` into the processor's caches ahead of a read of it.
    #[inline]
    pub fn prefetch(&self, b: u32) {
        if let (Some(st), Some(size)) = (self.state.get(b as usize), self.size.get(b as usize)) {
            super::prefetch(st);
            super::prefetch(size);
        }
    }

    /// Bytes held by a die.
    pub fn used(&self, die: usize) -> f64 {
        self.used[die]
    }

    /// Reads block `b`: returns whether it hit; a miss brings the block in. Dirty bytes
    /// evicted are added to `writeback`.
    #[inline]
    pub fn read(&mut self, b: u32, writeback: &mut f64) -> bool {
        let st = &mut self.state[b as usize];
        if *st & RESIDENT != 0 {
            *st |= REFERENCED;
            true
        } else {
            self.insert(b, RESIDENT, writeback);
            false
        }
    }

    /// Reads the blocks `first..first + count`: returns the bytes of those that hit and of
    /// all of them (their sizes).
    #[inline]
    pub fn read_run(&mut self, first: u32, count: u32, writeback: &mut f64) -> (f64, f64) {
        let (mut hit, mut all) = (0.0, 0.0);
        for b in first..first + count {
            let size = self.size[b as usize];
            all += size;
            if self.read(b, writeback) {
                hit += size;
            }
        }
        (hit, all)
    }

    /// Writes block `b` (whole): it becomes dirty (and referenced if it was resident).
    /// Dirty bytes evicted (or the block itself when it cannot stay) go to `writeback`.
    #[inline]
    pub fn write(&mut self, b: u32, writeback: &mut f64) {
        let st = &mut self.state[b as usize];
        if *st & RESIDENT != 0 {
            *st |= DIRTY | REFERENCED;
        } else {
            self.insert(b, RESIDENT | DIRTY, writeback);
        }
    }

    fn insert(&mut self, b: u32, state: u8, writeback: &mut f64) {
        let L2 {
            capacity,
            used,
            ring,
            state: st,
            size,
            die,
        } = self;
        let bs = size[b as usize];
        if bs > *capacity {
            // Streams through: nothing stays; a write goes back to HBM at once.
            if state & DIRTY != 0 {
                *writeback += bs;
            }
            return;
        }
        let d = die[b as usize] as usize;
        let ring = &mut ring[d];
        let mut held = used[d] + bs;
        st[b as usize] = state | REFERENCED;
        ring.push((b, bs));
        // Every other block loses its mark on its first turn and leaves on its second, and
        // the new block fits alone: the loop ends.
        while held > *capacity {
            let Some((v, vs)) = ring.pop() else { break };
            // The blocks of a die's ring entered long ago, their states cold by now: the
            // state of one a few places on is fetched while this one is looked at.
            if let Some(&(ahead, _)) = ring.get(LOOK_AHEAD) {
                if let Some(sa) = st.get(ahead as usize) {
                    super::prefetch(sa);
                }
            }
            let vu = v as usize;
            let sv = st[vu];
            if v == b {
                ring.push((v, vs));
                continue;
            }
            if sv & REFERENCED != 0 {
                st[vu] = sv & !REFERENCED;
                ring.push((v, vs));
                continue;
            }
            if sv & DIRTY != 0 {
                *writeback += vs;
            }
            st[vu] = 0;
            held -= vs;
        }
        used[d] = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_used_again_stays_and_an_untouched_one_leaves() {
        // Blocks of 30 bytes on one die of 100 bytes.
        let mut l2 = L2::new(1, 100.0, &[0; 5], &[30.0; 5]);
        let mut wb = 0.0;
        l2.write(0, &mut wb);
        assert!(!l2.read(1, &mut wb));
        assert!(!l2.read(2, &mut wb));
        assert!(!l2.read(3, &mut wb)); // full: the oldest (0, dirty) leaves
        assert!(!l2.is_resident(0));
        assert_eq!(wb, 30.0);
        assert!(l2.read(1, &mut wb)); // 1 is used again
        assert!(!l2.read(4, &mut wb)); // 2 (untouched since its turn) leaves, 1 stays
        assert!(l2.is_resident(1) && !l2.is_resident(2) && l2.is_resident(3) && l2.is_resident(4));
        assert_eq!(wb, 30.0);
        assert_eq!(l2.used(0), 90.0);
    }

    #[test]
    fn a_large_unrelated_working_set_evicts() {
        let mut l2 = L2::new(1, 100.0, &[0; 25], &[10.0; 25]);
        let mut wb = 0.0;
        l2.write(0, &mut wb);
        assert!(l2.read(0, &mut wb));
        for b in 1..25 {
            assert!(!l2.read(b, &mut wb));
        }
        // Referenced once, it went round once; the unrelated working set (240 bytes) then
        // pushed it out.
        assert!(!l2.is_resident(0));
        assert_eq!(wb, 10.0);
    }

    #[test]
    fn oversized_blocks_stream_through() {
        let mut l2 = L2::new(1, 10.0, &[0], &[20.0]);
        let mut wb = 0.0;
        l2.write(0, &mut wb);
        assert_eq!(wb, 20.0);
        assert!(!l2.read(0, &mut wb));
        assert!(!l2.is_resident(0));
    }
}
