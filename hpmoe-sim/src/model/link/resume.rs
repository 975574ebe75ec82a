//! Resuming a solve of all active pairs from a point of the previous one.
//!
//! In: the previous solve's points (its state between two pops, [`Checkpoint`]) and what
//! changed since (pairs started or finished, the resources on their paths). Out: the last
//! point up to which the new solve pops what the previous one popped, and the solve's state
//! there, so that [`Links::reshare`] goes on from it.
//!
//! Why it is exact: the progressive filling pops heap entries in a fixed order, each entry
//! freezing its pairs at its level. Before the first pop that involves something changed
//! (the own cap of a changed pair, a resource on its path), every pop is the same entry at
//! the same level freezing the same pairs, and each resource's remaining capacity is the
//! same sequence of floating-point operations; only a changed resource's count of unfrozen
//! flows differs, by the flows started or finished on it. So the new solve's state at a
//! point before that pop is the saved state with those counts moved, and going on from
//! there gives every rate the full solve gives, to the bit.
//!
//! The first such pop is bounded from below with the previous solve's entries. Before it,
//! an entry present all along pops at the first pop of a larger key, and the points keep
//! the largest key popped so far, so a key gives the last point it cannot precede:
//! - a changed pair froze in the previous solve at the entry it keeps (its own cap or a
//!   resource on its path); its new own cap pops after the first larger key;
//! - a changed resource's level, replayed over its unchanged users' freezes in the order of
//!   their entries (the changed ones stay unfrozen), stays between two of them and rises
//!   (`max(rem / w, level of its last loss)`); it pops once that level is below the next
//!   freeze's, so at no less than that level (less a margin for rounding).
//!
//! A changed resource's pop in the previous solve needs no bound of its own: it froze every
//! user still unfrozen, so a changed pair that was a user then froze no later; and when none
//! was (only new pairs on it), its level is now lower all along and it pops no later. The
//! solve resumes from the last point before every bound (a test compares every rate, event
//! and finish with solving from the start).
//!
//! Cost: a point saves every resource of the solve (`O(R)`), about [`POINTS`] points a solve
//! (spaced by freezes); the bounds replay each changed resource's users (`O(U log U)`). In an
//! all-to-all a resumed solve skips about half of the freezes of one from the start.

use super::ownlist::Entry as OwnEntry;
use super::{Key, Links};

/// About how many points a solve saves. More points resume closer to the first changed pop
/// but each saves every resource: on an all-to-all of 128 ranks, 16 points a solve ran 2%
/// more instructions than 8 (fewer freezes, more saves), and 4 points 1.5% more.
const POINTS: usize = 8;

/// A point between two pops of the last solve.
#[derive(Clone, Copy, Debug)]
pub(super) struct Checkpoint {
    /// The last own cap consumed before it (`None`: none), and the pairs frozen (the length
    /// of the freeze log) before it.
    pub(super) own: Option<OwnEntry>,
    pub(super) frozen: u32,
    /// Where its resources' states start in the saved states, and how many (the first
    /// `nres` of the solve's resources; the others were at their starting point).
    pub(super) saved: u32,
    pub(super) nres: u32,
    /// The largest entry popped before the next point (or the solve's end), this point's
    /// pops and all before; `(0, 0, 0)` before any pop (which bounds as conservatively).
    pub(super) top: Key,
}

/// A resource at a point: its remaining capacity, its frozen flows and the level at which
/// it last lost shares.
#[derive(Clone, Copy, Debug)]
pub(super) struct Saved {
    rem: f64,
    fw: f64,
    last: f64,
}

/// Where a resumed solve goes on: the last own cap consumed, pairs frozen.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Resumed {
    pub(super) own: Option<OwnEntry>,
    pub(super) frozen: usize,
    /// The largest entry popped before it.
    pub(super) top: Key,
}

/// Relative and absolute (per unit of capacity) margins for rounding in a resource's level.
const REL: f64 = 1e-9;
const ABS: f64 = 1e-8;

impl Links {
    /// Drops the last solve's points: the next solve starts from the beginning.
    pub(super) fn forget_solve(&mut self) {
        self.ck.clear();
        self.saved.clear();
        self.flog.clear();
        self.pend_pairs.clear();
        self.pend_res.clear();
    }

    /// A solve of all `pairs` active pairs over `comp_res` starts from the beginning: its
    /// first point is the starting state.
    pub(super) fn begin_solve(&mut self, pairs: usize, comp_res: &[u32]) {
        for (i, &r) in comp_res.iter().enumerate() {
            self.slot[r as usize] = i as u32;
        }
        self.ck_step = ((pairs / POINTS) as u32).max(self.ck_min);
        self.ck_pairs = pairs;
        self.ck.push(Checkpoint {
            own: None,
            frozen: 0,
            saved: self.saved.len() as u32,
            nres: 0,
            top: (0, 0, 0),
        });
    }

    /// Saves a point here (`own` the last own cap consumed), `top` the largest entry popped
    /// so far.
    pub(super) fn checkpoint(&mut self, own: Option<OwnEntry>, top: Key, comp_res: &[u32]) {
        if let Some(c) = self.ck.last_mut() {
            c.top = top;
        }
        let at = self.saved.len();
        for &r in comp_res {
            let r = r as usize;
            let f = &self.res[r];
            self.saved.push(Saved {
                rem: f.rem,
                fw: self.res_n[r] - f.w,
                last: f.last,
            });
        }
        self.ck.push(Checkpoint {
            own,
            frozen: self.flog.len() as u32,
            saved: at as u32,
            nres: comp_res.len() as u32,
            top,
        });
    }

    /// A lower bound of the level at which changed resource `r` pops first in the new
    /// solve, as long as it pops what the last one did (infinite when it does not pop); `None`
    /// when a user's freeze in the last solve is not known. Its unchanged users (no mark `ep`)
    /// freeze at the entries that froze them last; the changed ones stay unfrozen. Between
    /// two of its users' freezes its level stays; it pops before the next freeze when its
    /// level is below that freeze's.
    fn first_level(&mut self, r: usize, ep: u32) -> Option<f64> {
        let mut v = std::mem::take(&mut self.scratch);
        v.clear();
        let mut ok = true;
        for &q in &self.users[r] {
            if self.mark[q as usize] == ep {
                continue;
            }
            let h = &self.hot[q as usize];
            if self.frozen[q as usize] != self.solve_ep {
                ok = false;
                break;
            }
            v.push((h.key, 0, h.n));
        }
        let mut first = f64::INFINITY;
        if ok {
            v.sort_unstable();
            let margin = |level: f64, cap: f64| level - REL * level.abs() - ABS * cap;
            let cap = self.cap[r];
            let (mut rem, mut w, mut last) = (cap, self.res_n[r], 0.0f64);
            let mut prev = None;
            let mut popped = false;
            for &(k, _, n) in &v {
                if w <= 0.5 {
                    break;
                }
                let level = f64::from_bits(k.0);
                // A pop freezes all its pairs before the heap is looked at again.
                if prev != Some(k) {
                    let mine = margin((rem / w).max(last), cap);
                    if mine <= level {
                        first = mine;
                        popped = true;
                        break;
                    }
                }
                prev = Some(k);
                rem -= f64::from(n) * level;
                w -= f64::from(n);
                last = level;
            }
            if !popped && w > 0.5 {
                first = margin((rem / w).max(last), cap);
            }
        }
        self.scratch = v;
        ok.then_some(first)
    }

    /// The point the next solve of all active pairs resumes from (0: the beginning), given
    /// what changed since the last one (see the module's doc).
    pub(super) fn resume_point(&mut self) -> usize {
        // Points far more than planned (the active pairs more than doubled since the solve
        // that spaced them): start again, which spaces them anew.
        let planned = self.ck_pairs.max(1);
        if !self.resume || self.ck.len() > 2 * POINTS + 2 || self.own_all.len() > 2 * planned {
            return 0;
        }
        // The first stretch that popped an entry above `k` (`strict`) or at least `k`: an
        // entry of key `k` present all along pops there or later, as nothing before it
        // differs; a popped entry of key `k` popped there or later.
        let after = |ck: &[Checkpoint], k: Key, strict: bool| {
            ck.partition_point(|c| if strict { c.top <= k } else { c.top < k })
        };
        let mut best = self.ck.len() - 1;
        for k in 0..self.pend_pairs.len() {
            let (p, old) = self.pend_pairs[k];
            if let Some(old) = old {
                best = best.min(after(&self.ck, old, false));
            }
            let h = &self.hot[p as usize];
            if h.n > 0 {
                let own = (self.own_level(p as usize).to_bits(), 1, p);
                best = best.min(after(&self.ck, own, true));
            }
            if best == 0 {
                return 0;
            }
        }
        self.pend_res.sort_unstable();
        self.pend_res.dedup();
        let ep = self.next_epoch();
        if self.ck.is_empty() {
            return 0;
        }
        for k in 0..self.pend_pairs.len() {
            let p = self.pend_pairs[k].0 as usize;
            self.mark[p] = ep;
        }
        for k in 0..self.pend_res.len() {
            let r = self.pend_res[k] as usize;
            match self.first_level(r, ep) {
                Some(level) => best = best.min(after(&self.ck, (level.max(0.0).to_bits(), 0, 0), true)),
                None => return 0,
            }
            if best == 0 {
                return 0;
            }
        }
        best
    }

    /// Sets the solve's state to point `at` of the last one, with the flow counts of now:
    /// the pairs frozen after it thawed, the resources' states restored (and the resources
    /// that became active added to `comp_res`), the heap rebuilt.
    pub(super) fn restore(&mut self, at: usize, comp_res: &mut Vec<u32>) -> Resumed {
        let c = self.ck[at];
        for k in c.frozen as usize..self.flog.len() {
            self.frozen[self.flog[k] as usize] = 0;
        }
        self.flog.truncate(c.frozen as usize);
        self.ck.truncate(at + 1);
        self.saved.truncate((c.saved + c.nres) as usize);
        for k in 0..self.pend_res.len() {
            let r = self.pend_res[k] as usize;
            let i = self.slot[r] as usize;
            let listed = comp_res.get(i) == Some(&(r as u32));
            if !listed && self.res_n[r] > 0.5 {
                self.slot[r] = comp_res.len() as u32;
                comp_res.push(r as u32);
            }
        }
        self.heap.clear();
        for (i, &r) in comp_res.iter().enumerate() {
            let r = r as usize;
            let (rem, fw, last) = if i < c.nres as usize {
                let v = self.saved[c.saved as usize + i];
                (v.rem, v.fw, v.last)
            } else {
                (self.cap[r], 0.0, 0.0)
            };
            let w = self.res_n[r] - fw;
            let f = &mut self.res[r];
            f.rem = rem;
            f.last = last;
            f.touched = false;
            if w > 0.5 {
                f.w = w;
                f.key = (rem / w).max(last).to_bits();
                self.heap.set((f.key, r as u32));
            } else {
                f.w = 0.0;
            }
        }
        self.pend_pairs.clear();
        self.pend_res.clear();
        self.stats.resumed += 1;
        self.stats.kept += u64::from(c.frozen);
        Resumed {
            own: c.own,
            frozen: c.frozen as usize,
            top: if at > 0 { self.ck[at - 1].top } else { (0, 0, 0) },
        }
    }
}
