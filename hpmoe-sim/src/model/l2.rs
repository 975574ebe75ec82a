//! L2 residency: the blocks every die's L2 holds, least recently used first out.
//!
//! In: the blocks of the workload (an id, the die holding it, its size) and, while the
//! simulation runs, reads and writes of blocks. Out: for a read, hit or miss; for every
//! access, the dirty bytes it evicted (which must be written back to HBM).
//!
//! A block is what one task wrote on one rank (its output tile, or the rows its puts landed
//! there), or a region of a taskflow input. A written block enters as most recently used and
//! dirty; a read that misses brings the block in clean; a hit makes it most recently used.
//! When a die holds more than `l2_size` bytes, its least recently used blocks leave; dirty
//! ones cost a write-back. A block larger than the whole L2 never stays (it streams through;
//! written, it goes straight back to HBM). Residency is all-or-nothing per block.
//!
//! Cost: O(1) per access (intrusive doubly linked lists in flat arrays), amortised over
//! evictions.

const NONE: u32 = u32::MAX;

/// Residency states.
const ABSENT: u8 = 0;
const CLEAN: u8 = 1;
const DIRTY: u8 = 2;

#[derive(Clone, Debug)]
pub struct L2 {
    capacity: f64,
    /// Per die: bytes held, most and least recently used block.
    used: Vec<f64>,
    head: Vec<u32>,
    tail: Vec<u32>,
    /// Per block.
    prev: Vec<u32>,
    next: Vec<u32>,
    state: Vec<u8>,
    size: Vec<f64>,
    die: Vec<u32>,
}

impl L2 {
    /// `die[b]` and `size[b]` (bytes) of every block; `capacity` bytes per die.
    pub fn new(dies: usize, capacity: f64, die: Vec<u32>, size: Vec<f64>) -> L2 {
        let n = die.len();
        L2 {
            capacity,
            used: vec![0.0; dies],
            head: vec![NONE; dies],
            tail: vec![NONE; dies],
            prev: vec![NONE; n],
            next: vec![NONE; n],
            state: vec![ABSENT; n],
            size,
            die,
        }
    }

    pub fn is_resident(&self, b: u32) -> bool {
        self.state[b as usize] != ABSENT
    }

    /// Bytes held by a die.
    pub fn used(&self, die: usize) -> f64 {
        self.used[die]
    }

    /// Reads block `b`: returns whether it hit; a miss brings the block in. Dirty bytes
    /// evicted are added to `writeback`.
    pub fn read(&mut self, b: u32, writeback: &mut f64) -> bool {
        if self.state[b as usize] != ABSENT {
            self.touch(b);
            true
        } else {
            self.insert(b, CLEAN, writeback);
            false
        }
    }

    /// Writes block `b` (whole): it becomes most recently used and dirty. Dirty bytes evicted
    /// (or the block itself when it cannot stay) are added to `writeback`.
    pub fn write(&mut self, b: u32, writeback: &mut f64) {
        if self.state[b as usize] != ABSENT {
            self.state[b as usize] = DIRTY;
            self.touch(b);
        } else {
            self.insert(b, DIRTY, writeback);
        }
    }

    fn unlink(&mut self, b: u32) {
        let d = self.die[b as usize] as usize;
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.head[d] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail[d] = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NONE;
        self.next[b as usize] = NONE;
    }

    fn push_front(&mut self, b: u32) {
        let d = self.die[b as usize] as usize;
        let h = self.head[d];
        self.prev[b as usize] = NONE;
        self.next[b as usize] = h;
        if h == NONE {
            self.tail[d] = b;
        } else {
            self.prev[h as usize] = b;
        }
        self.head[d] = b;
    }

    fn touch(&mut self, b: u32) {
        let d = self.die[b as usize] as usize;
        if self.head[d] != b {
            self.unlink(b);
            self.push_front(b);
        }
    }

    fn insert(&mut self, b: u32, state: u8, writeback: &mut f64) {
        let size = self.size[b as usize];
        if size > self.capacity {
            // Streams through: nothing stays; a write goes back to HBM at once.
            if state == DIRTY {
                *writeback += size;
            }
            return;
        }
        let d = self.die[b as usize] as usize;
        self.state[b as usize] = state;
        self.push_front(b);
        self.used[d] += size;
        while self.used[d] > self.capacity {
            let victim = self.tail[d];
            if victim == NONE || victim == b {
                break;
            }
            self.unlink(victim);
            let v = victim as usize;
            if self.state[v] == DIRTY {
                *writeback += self.size[v];
            }
            self.state[v] = ABSENT;
            self.used[d] -= self.size[v];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_order_and_writeback() {
        // Three blocks of 40 bytes on one die of 100 bytes.
        let mut l2 = L2::new(1, 100.0, vec![0, 0, 0], vec![40.0, 40.0, 40.0]);
        let mut wb = 0.0;
        l2.write(0, &mut wb);
        assert!(!l2.read(1, &mut wb));
        assert!(l2.read(0, &mut wb)); // 0 is now the most recent
        assert!(!l2.read(2, &mut wb)); // evicts 1 (clean): no write-back
        assert_eq!(wb, 0.0);
        assert!(l2.is_resident(0) && !l2.is_resident(1) && l2.is_resident(2));
        assert!(!l2.read(1, &mut wb)); // evicts 0 (dirty)
        assert_eq!(wb, 40.0);
        assert_eq!(l2.used(0), 80.0);
    }

    #[test]
    fn oversized_blocks_stream_through() {
        let mut l2 = L2::new(1, 10.0, vec![0], vec![20.0]);
        let mut wb = 0.0;
        l2.write(0, &mut wb);
        assert_eq!(wb, 20.0);
        assert!(!l2.read(0, &mut wb));
        assert!(!l2.is_resident(0));
    }
}
