//! Receive-window layouts: where every routed row lands. Per destination rank the window is
//! grouped by local expert; inside an expert, rows are ordered by (source rank, token,
//! choice). In the exact layout a group holds exactly the rows routed to it; in the static
//! layout (the reference runtime's worst-case capacity) every (expert, source rank) segment
//! reserves `tokens` rows, most of them padding. Rows a capacity-limited routing dropped are
//! neither sent nor received.

use crate::route::Routing;

/// No source: a padding row of a static window.
pub const NO_SOURCE: u32 = u32::MAX;

/// One row a rank sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendEntry {
    pub token: u32,
    pub choice: u32,
    /// Destination row in the destination rank's window.
    pub slot: u32,
}

/// One row a rank receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvEntry {
    pub src_rank: u32,
    pub src_token: u32,
    pub src_choice: u32,
}

/// The rows of one rank's receive window: where each comes from ([`RecvEntry`], with
/// `NO_SOURCE` in every field for padding). Stored with the source rank shifted by one so
/// that padding is all zeros: the window is allocated zeroed, and the pages of a large
/// static-capacity window that only padding occupies are never touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvRows(Vec<[u32; 3]>);

impl RecvRows {
    /// `rows` rows of padding.
    pub fn padding(rows: usize) -> RecvRows {
        RecvRows(vec![[0; 3]; rows])
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Row `row` (`None` past the window).
    pub fn get(&self, row: usize) -> Option<RecvEntry> {
        self.0.get(row).map(|&[r, token, choice]| match r {
            0 => RecvEntry {
                src_rank: NO_SOURCE,
                src_token: NO_SOURCE,
                src_choice: NO_SOURCE,
            },
            r => RecvEntry {
                src_rank: r - 1,
                src_token: token,
                src_choice: choice,
            },
        })
    }
    /// The source rank of row `row` (`NO_SOURCE` for padding); panics past the window.
    fn src_rank(&self, row: usize) -> u32 {
        self.0[row][0].wrapping_sub(1)
    }
    /// Sets row `row` (inside the window) to come from `e`.
    pub fn set(&mut self, row: usize, e: RecvEntry) {
        self.0[row] = [e.src_rank.wrapping_add(1), e.src_token, e.src_choice];
    }
    pub fn iter(&self) -> impl Iterator<Item = RecvEntry> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// Rows `lo..hi` of a window, all from source rank `src`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceSegment {
    pub lo: u32,
    pub hi: u32,
    pub src: u32,
}

/// The most bytes a routing and its window layout may take together (expert ids, gate
/// weights, send and receive lists, offsets): a routing past it is refused from its sizes,
/// before anything is allocated. A routing is materialised when checked and again when
/// lowered, so two of this size, plus a task graph, stay within a 4 GiB address space.
pub const MAX_LAYOUT_BYTES: u64 = 1 << 30;

/// Bytes a routing of these sizes and its window layout take, from the sizes alone (what
/// [`RouteLayout::new`] allocates), and the receive-window rows of the busiest rank; `None`
/// when either passes 64 bits.
pub fn footprint(ranks: u64, tokens: u64, topk: u64, experts: u64, static_capacity: bool) -> Option<(u64, u64)> {
    let entries = ranks.checked_mul(tokens)?.checked_mul(topk)?;
    let local = experts / ranks.max(1);
    let per_pair = ranks.checked_mul(experts)?;
    // Window rows of one rank: static, `tokens` per (local expert, source rank) segment;
    // exact, at most every routed row.
    let window = if static_capacity {
        local.checked_mul(ranks)?.checked_mul(tokens)?
    } else {
        entries
    };
    let all_windows = if static_capacity {
        window.checked_mul(ranks)?
    } else {
        entries
    };
    let entry = std::mem::size_of::<u32>() as u64 + std::mem::size_of::<f32>() as u64;
    let bytes = entries
        .checked_mul(entry + std::mem::size_of::<SendEntry>() as u64)?
        .checked_add(all_windows.checked_mul(std::mem::size_of::<RecvEntry>() as u64)?)?
        // count, seg and send_off: (source, expert) tables of u32.
        .checked_add(per_pair.checked_mul(3 * 4)?)?
        .checked_add(ranks.checked_mul(local + 1)?.checked_mul(4)?)?
        // Generation: per-expert weights, their running sums, fallback order and flags.
        .checked_add(experts.checked_mul(8 + 8 + 4 + 1)?)?;
    Some((bytes, window))
}

/// Refuses a routing whose layout would pass [`MAX_LAYOUT_BYTES`] or whose window rows do
/// not fit the 32-bit row ids; the message names the sizes and the estimate.
pub fn check_size(ranks: u64, tokens: u64, topk: u64, experts: u64, static_capacity: bool) -> Result<(), String> {
    let sizes = format!("{ranks} ranks x {tokens} tokens x top-{topk} over {experts} experts");
    let mode = if static_capacity { " with static capacity" } else { "" };
    match footprint(ranks, tokens, topk, experts, static_capacity) {
        None => Err(format!("{sizes}{mode} is past 2^64 bytes")),
        Some((_, window)) if window >= u64::from(u32::MAX) => Err(format!(
            "{sizes}{mode} gives a receive window of {window} rows per rank, more than the {} rows a window may have",
            u32::MAX - 1
        )),
        Some((bytes, _)) if bytes > MAX_LAYOUT_BYTES => Err(format!(
            "{sizes}{mode} needs about {} MiB for its routing and windows, more than the {} MiB allowed",
            bytes.div_ceil(1 << 20),
            MAX_LAYOUT_BYTES >> 20
        )),
        Some(_) => Ok(()),
    }
}

#[derive(Clone, Debug)]
pub struct RouteLayout {
    pub routing: Routing,
    pub static_capacity: bool,
    /// `[rank][local expert + 1]`: first window row of each local expert (exclusive end last).
    pub group_off: Vec<Vec<u32>>,
    /// `[rank][row]`: where each window row comes from.
    pub recv: Vec<RecvRows>,
    /// `[rank]`: rows sent, sorted by (destination expert, token, choice).
    pub send: Vec<Vec<SendEntry>>,
    /// `[rank][expert + 1]`: offsets into `send` by destination expert.
    pub send_off: Vec<Vec<u32>>,
}

impl RouteLayout {
    /// Bytes the layout and its routing hold.
    pub fn resident_bytes(&self) -> usize {
        let r = &self.routing;
        let rows = |v: &Vec<Vec<u32>>| v.iter().map(|x| x.len() * 4).sum::<usize>();
        r.expert.len() * 4
            + r.weight.len() * 4
            + rows(&self.group_off)
            + rows(&self.send_off)
            + self
                .recv
                .iter()
                .map(|x| x.len() * std::mem::size_of::<[u32; 3]>())
                .sum::<usize>()
            + self
                .send
                .iter()
                .map(|x| x.len() * std::mem::size_of::<SendEntry>())
                .sum::<usize>()
    }

    pub fn new(routing: Routing, static_capacity: bool) -> Self {
        let (ranks, tokens, topk, experts) = (routing.ranks, routing.tokens, routing.topk, routing.experts);
        let local = routing.local_experts();
        // count[(source, expert)]
        let mut count = vec![0u32; ranks * experts];
        for s in 0..ranks {
            for t in 0..tokens {
                for j in 0..topk {
                    if routing.is_kept(s, t, j) {
                        count[s * experts + routing.expert_of(s, t, j)] += 1;
                    }
                }
            }
        }
        // Segment start of (expert e, source s) in e's rank window.
        let mut seg = vec![0u32; ranks * experts];
        let mut group_off = vec![vec![0u32; local + 1]; ranks];
        for d in 0..ranks {
            let mut at = 0u32;
            for el in 0..local {
                let e = d * local + el;
                group_off[d][el] = at;
                for s in 0..ranks {
                    seg[s * experts + e] = at;
                    at += if static_capacity {
                        tokens as u32
                    } else {
                        count[s * experts + e]
                    };
                }
            }
            group_off[d][local] = at;
        }
        let mut recv: Vec<RecvRows> = (0..ranks)
            .map(|d| RecvRows::padding(group_off[d][local] as usize))
            .collect();
        let mut send = Vec::with_capacity(ranks);
        let mut send_off = Vec::with_capacity(ranks);
        for s in 0..ranks {
            // Bucket this rank's rows by destination expert, keeping token order.
            let mut off = vec![0u32; experts + 1];
            for e in 0..experts {
                off[e + 1] = off[e] + count[s * experts + e];
            }
            let mut fill = off.clone();
            let mut list = vec![
                SendEntry {
                    token: 0,
                    choice: 0,
                    slot: 0
                };
                off[experts] as usize
            ];
            for t in 0..tokens {
                for j in 0..topk {
                    if !routing.is_kept(s, t, j) {
                        continue;
                    }
                    let e = routing.expert_of(s, t, j);
                    let i = fill[e] as usize;
                    let slot = seg[s * experts + e] + (fill[e] - off[e]);
                    list[i] = SendEntry {
                        token: t as u32,
                        choice: j as u32,
                        slot,
                    };
                    fill[e] += 1;
                    let d = e / local;
                    recv[d].set(
                        slot as usize,
                        RecvEntry {
                            src_rank: s as u32,
                            src_token: t as u32,
                            src_choice: j as u32,
                        },
                    );
                }
            }
            send.push(list);
            send_off.push(off);
        }
        RouteLayout {
            routing,
            static_capacity,
            group_off,
            recv,
            send,
            send_off,
        }
    }

    pub fn ranks(&self) -> usize {
        self.routing.ranks
    }

    /// `fanout(rr)`, with `self` the (exact) layout of `rr = by_rank(r)` and `of` the routing
    /// `r`: on every rank, a "token" per row of `rr`'s window (rows past a rank's window, as
    /// many as the busiest rank has, are empty) whose choices are the experts of this rank
    /// that `r` chose for that row's (source rank, token) and kept, in `r`'s choice order,
    /// with `r`'s gate weights. A token has at most `min(topk, local experts)` of them: that
    /// is the fan-out's `topk`; unused choices name other local experts and are not kept.
    /// [`RouteLayout::fanout`] after checking that the view, `spec`, can be materialised
    /// (its tokens are this window's rows).
    pub fn checked_fanout(&self, spec: &crate::ir::RouteSpec, of: &Routing) -> Result<Routing, String> {
        let rows = (0..self.ranks()).map(|d| u64::from(self.rows(d))).max().unwrap_or(0);
        check_size(spec.ranks, rows, spec.topk, spec.experts, false)?;
        Ok(self.fanout(of))
    }

    pub fn fanout(&self, of: &Routing) -> Routing {
        let ranks = self.ranks();
        let tokens = (0..ranks).map(|d| self.rows(d) as usize).max().unwrap_or(0);
        let local = of.local_experts().max(1);
        let topk = of.topk.min(local).max(1);
        let n = ranks * tokens * topk;
        let mut r = Routing {
            ranks,
            tokens,
            topk,
            experts: of.experts,
            expert: vec![0; n],
            weight: vec![0.0; n],
            kept: vec![false; n],
        };
        for d in 0..ranks {
            for q in 0..tokens {
                let at = (d * tokens + q) * topk;
                let mut used = 0;
                if let Some(e) = self.recv[d].get(q).filter(|e| e.src_rank != NO_SOURCE) {
                    let (s, t) = (e.src_rank as usize, e.src_token as usize);
                    for j in 0..of.topk {
                        let i = of.idx(s, t, j);
                        if of.kept[i] && of.expert[i] as usize / local == d && used < topk {
                            r.expert[at + used] = of.expert[i];
                            r.weight[at + used] = of.weight[i];
                            r.kept[at + used] = true;
                            used += 1;
                        }
                    }
                }
                // The unused choices: the local experts not chosen, in order, not kept.
                let mut el = 0;
                for k in used..topk {
                    while (0..used).any(|u| r.expert[at + u] as usize == d * local + el) {
                        el += 1;
                    }
                    r.expert[at + k] = (d * local + el) as u32;
                    el += 1;
                }
            }
        }
        r
    }
    pub fn local_experts(&self) -> usize {
        self.routing.local_experts()
    }
    /// Window rows of a rank.
    pub fn rows(&self, rank: usize) -> u32 {
        *self.group_off[rank].last().unwrap_or(&0)
    }
    /// The local expert of a window row.
    pub fn group_of_row(&self, rank: usize, row: u32) -> usize {
        self.group_off[rank].partition_point(|&o| o <= row).saturating_sub(1)
    }
    /// The destination rank of an expert.
    pub fn rank_of_expert(&self, e: usize) -> usize {
        e / self.local_experts()
    }
    /// The (expert, source rank) segments of local expert `group`'s rows on `rank`, in row
    /// order, empty ones left out. In the static layout a segment is its reserved `tokens`
    /// rows, padding included.
    pub fn source_segments(&self, rank: usize, group: usize) -> Vec<SourceSegment> {
        let Some(off) = self.group_off.get(rank) else {
            return Vec::new();
        };
        let (Some(&lo), Some(&hi)) = (off.get(group), off.get(group + 1)) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if self.static_capacity {
            let cap = self.segment_capacity();
            if cap == 0 {
                return out;
            }
            let mut a = lo;
            let mut src = 0;
            while a < hi {
                let b = a.saturating_add(cap).min(hi);
                out.push(SourceSegment { lo: a, hi: b, src });
                a = b;
                src += 1;
            }
            return out;
        }
        let rows = &self.recv[rank];
        let mut a = lo;
        while a < hi {
            let src = rows.src_rank(a as usize);
            let mut b = a + 1;
            while b < hi && rows.src_rank(b as usize) == src {
                b += 1;
            }
            out.push(SourceSegment { lo: a, hi: b, src });
            a = b;
        }
        out
    }

    /// The source rank of window row `row` of `rank` (in the static layout, of the segment
    /// holding it, padding included); `None` past the window.
    pub fn source_of_row(&self, rank: usize, row: u32) -> Option<u32> {
        if row >= self.rows(rank) {
            return None;
        }
        if self.static_capacity {
            let g = self.group_of_row(rank, row);
            let cap = self.segment_capacity().max(1);
            return Some((row - self.group_off[rank][g]) / cap);
        }
        self.recv[rank].get(row as usize).map(|e| e.src_rank)
    }

    /// Capacity reserved per (expert, source) segment in the static layout.
    pub fn segment_capacity(&self) -> u32 {
        self.routing.tokens as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{RouteKind, RouteSpec};

    fn routing(kind: RouteKind) -> Routing {
        let spec = RouteSpec {
            name: "r".into(),
            kind,
            experts: 8,
            topk: 2,
            ranks: 4,
            tokens: 20,
            capacity: 0,
            drop: None,
            capacity_factor: 0.0,
            span: Default::default(),
        };
        Routing::generate(&spec).unwrap()
    }

    #[test]
    fn footprint_counts_what_the_layout_allocates() {
        // 2 ranks x 3 tokens x top-2 over 4 experts (2 local), by hand: 12 entries at 4 + 4
        // (id, weight) + 12 (send entry) = 240; 12 receive entries at 12 = 144; three
        // (source, expert) tables of 2 x 4 u32 = 96; group offsets 2 x 3 u32 = 24; per
        // expert 8 + 8 + 4 + 1 = 21, so 84. Total 588; the busiest window holds at most 12.
        assert_eq!(footprint(2, 3, 2, 4, false), Some((588, 12)));
        // Static: each rank's window pads 2 local experts x 2 sources x 3 tokens = 12 rows,
        // 24 receive entries in all: 288 instead of 144.
        assert_eq!(footprint(2, 3, 2, 4, true), Some((732, 12)));
        assert_eq!(footprint(u64::MAX, 2, 2, 4, false), None);
        // What a layout holds stays under the estimate.
        for static_capacity in [false, true] {
            let l = RouteLayout::new(routing(RouteKind::Zipf { s: 1.0, seed: 3 }), static_capacity);
            let (est, window) = footprint(4, 20, 2, 8, static_capacity).unwrap();
            assert!(l.resident_bytes() as u64 <= est);
            assert!((0..4).all(|r| u64::from(l.rows(r)) <= window));
        }
        // Refusals name the sizes: past 32-bit rows, and past the byte budget.
        let e = check_size(4, 1 << 31, 2, 8, false).unwrap_err();
        assert!(e.contains("17179869184 rows"), "{e}");
        let e = check_size(1, 1, 1, 100_000_000, false).unwrap_err();
        assert!(e.contains("MiB") && e.contains("1024 MiB allowed"), "{e}");
        assert!(check_size(256, 4096, 8, 256, false).is_ok());
    }

    #[test]
    fn exact_layout_is_a_bijection() {
        let l = RouteLayout::new(routing(RouteKind::Zipf { s: 1.0, seed: 3 }), false);
        let mut seen = 0;
        for s in 0..4 {
            for e in &l.send[s] {
                let d = l.rank_of_expert(l.routing.expert_of(s, e.token as usize, e.choice as usize));
                let r = l.recv[d].get(e.slot as usize).expect("a window row");
                assert_eq!((r.src_rank, r.src_token, r.src_choice), (s as u32, e.token, e.choice));
                seen += 1;
            }
        }
        assert_eq!(seen, 4 * 20 * 2);
        for d in 0..4 {
            assert!(l.recv[d].iter().all(|r| r.src_rank != NO_SOURCE));
            // Rows of a group belong to the group's expert.
            for (row, r) in l.recv[d].iter().enumerate() {
                let g = l.group_of_row(d, row as u32);
                let e = l
                    .routing
                    .expert_of(r.src_rank as usize, r.src_token as usize, r.src_choice as usize);
                assert_eq!(e, d * 2 + g);
            }
        }
    }

    #[test]
    fn static_layout_reserves_worst_case() {
        let l = RouteLayout::new(routing(RouteKind::Balanced), true);
        for d in 0..4 {
            assert_eq!(l.rows(d), 2 * 4 * 20);
        }
    }
}
