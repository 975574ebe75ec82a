//! The workload: a checked program, a lowered task graph, its schedule and the device model
//! in; per task, everything the event loop needs out, in flat arrays:
//!
//! - its engine class and compute seconds on an idle core;
//! - the L2 blocks it reads (with the bytes read from each) and writes: a block is what one
//!   task wrote on one rank, or a region of a taskflow input (found through the same index of
//!   writers the lowering uses, so a consumer knows which producer's output it reads);
//! - its flows: bytes put to each destination rank, in the order its rows go out;
//! - its lower-bound duration (every read hitting L2, no contention).
//!
//! Three refinements of the lowering's regions and costs, which are exact for dependencies
//! but coarse for bytes: a gather (a put over a routing's send list) reads only the rows it
//! sends, one L2 block per row, not the bounding box of their tokens; a `group(m)` index reads
//! the weights of the tile's own expert; and in a static-capacity window (the `expert_level`
//! policy) padding rows are neither read, computed nor written (the reference runtime knows
//! the real counts at run time; only the task, its overhead and its signal remain).

use super::rowmap::RegionMap;
use crate::model::{self, DeviceModel};
use hpmoe_dsl::ir::{DType, Dim, Index, Program, Taskflow};
use hpmoe_dsl::lower::regions::{tile_access, Scratch, WriterIndex};
use hpmoe_dsl::lower::{Csr, DimKind, Region, RouteLayout, TaskGraph};
use hpmoe_dsl::schedule::Schedule;
use rustc_hash::FxHashMap;

/// No block / no flow.
pub const NONE: u32 = u32::MAX;

/// A task as the event loop sees it: tasks are numbered in queue order (the tasks of a core
/// are consecutive), and what a start needs sits in one place.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskInfo {
    /// Compute seconds on an idle core.
    pub compute: f64,
    /// Bytes read (after the refinements above) and written locally.
    pub read_total: f64,
    pub local_out: f64,
    /// The task id (in the task graph).
    pub task: u32,
    pub core: u32,
    pub rank: u32,
    /// Its read runs `reads..read_end` (see [`Plan`]).
    pub reads: u32,
    pub read_end: u32,
    /// Its counters in [`Plan::sig`]: `sigs..sig_split` local, `sig_split..sig_end` remote.
    pub sigs: u32,
    pub sig_split: u32,
    pub sig_end: u32,
    /// Its remote kernel barriers, `first..first + ranks` but its own rank's (an index into
    /// [`Plan::fanout`]), or [`NONE`].
    pub fanout: u32,
    /// Its flows `flows..flow_end` (flow ids).
    pub flows: u32,
    pub flow_end: u32,
    /// Its local output block, or [`NONE`].
    pub local_block: u32,
    /// Delay of its remote signals: the longest path latency to a rank it signals.
    pub sig_latency: f64,
    pub class: u8,
}

/// Blocks `first..first + count` read for `bytes` in all (split over the blocks by size).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReadRun {
    pub first: u32,
    pub count: u32,
    pub bytes: f64,
}

/// The event loop's view of a workload.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Per internal task (queue order).
    pub info: Vec<TaskInfo>,
    /// Internal id of every task.
    pub pos: Vec<u32>,
    /// Per internal task: its core (as in `info`, dense for the release path).
    pub core: Vec<u32>,
    /// Per core: its queue as internal ids, `queue[queue_off[c]..queue_off[c + 1]]` (internal
    /// ids are given in queue order, so `queue[k] == k`: the event loop uses `k` directly).
    pub queue: Vec<u32>,
    pub queue_off: Vec<u32>,
    /// Read runs (in internal order), per internal task `info.reads..info.read_end`.
    pub runs: Vec<ReadRun>,
    /// Counters signalled, per internal task (local first).
    pub sig: Vec<u32>,
    /// Kernel barriers of every rank signalled by a whole kernel's tasks, as (first, ranks):
    /// a task signals those of other ranks through [`TaskInfo::fanout`] (its own rank's is
    /// in its local list).
    pub fanout: Vec<(u32, u32)>,
    /// Per counter: the internal ids waiting on it.
    pub waiters: Csr,
    /// Per internal task: the number of counters with a threshold it waits on.
    pub waits: Vec<u32>,
}

/// What the simulator needs, per task, per block, per flow and per counter. Arrays named
/// per task are indexed by task id; [`Workload::plan`] has the event loop's layout.
#[derive(Clone, Debug)]
pub struct Workload {
    pub ranks: u32,
    pub cores_per_rank: u32,
    pub aic_cores: u32,
    /// Per task.
    pub class: Vec<u8>,
    pub compute: Vec<f64>,
    /// Bytes read (after the refinements above) and written locally.
    pub read_total: Vec<f64>,
    pub local_out: Vec<f64>,
    /// Per task: its flows `flow_off[t]..flow_off[t + 1]`.
    pub flow_off: Vec<u32>,
    /// Per flow: destination, bytes, the block it lands as, its task.
    pub flow_dst: Vec<u32>,
    pub flow_bytes: Vec<f64>,
    pub flow_block: Vec<u32>,
    pub flow_task: Vec<u32>,
    /// Per flow: its (source, destination) pair, an index into `pairs`.
    pub flow_pair: Vec<u32>,
    pub pairs: Vec<(u32, u32)>,
    /// Per flow: its (pair, op call) contact, an index below `contacts`: the first put of a
    /// call from a rank to a peer pays `peer_setup`.
    pub flow_contact: Vec<u32>,
    pub contacts: u32,
    /// Per flow: its window cap ([`model::link::Topology::window_cap`], B/s; infinite for
    /// one message), from its message size (one row of its op's output, at most
    /// `put_chunk_bytes`).
    pub flow_cap: Vec<f64>,
    /// Per block: its rank, size and whether it is a region of a taskflow input. Block `t`
    /// (below the number of tasks) is task `t`'s local output (size 0 when it has none), so
    /// the outputs of a call's tiles are consecutive blocks.
    pub block_rank: Vec<u32>,
    pub block_size: Vec<f64>,
    pub block_input: Vec<bool>,
    /// Per op call: whether it communicates (its output is a receive window or it puts).
    pub node_comm: Vec<bool>,
    /// Per counter: extra delay once it reached its threshold (the kernel launch after a
    /// kernel barrier) and the tasks waiting on it.
    pub delay: Vec<f64>,
    pub waiters: Csr,
    /// When the first kernel's tasks may start.
    pub start_time: f64,
    /// Per task: the shortest duration it can have (all reads hitting L2, no contention).
    pub min_duration: Vec<f64>,
    pub plan: Plan,
}

/// Rows of a routing's window on `rank` in `lo..hi` that hold data (all of them unless the
/// window has static capacity, where each (expert, source) segment is padded).
fn real_rows(l: &RouteLayout, rank: usize, lo: i64, hi: i64) -> f64 {
    if hi <= lo {
        return 0.0;
    }
    if !l.static_capacity {
        return (hi - lo) as f64;
    }
    let off = &l.group_off[rank];
    let local = l.local_experts();
    let cap = l.segment_capacity() as i64;
    let mut real = 0i64;
    // The group offsets ascend: only the experts whose groups meet lo..hi are visited (found
    // by bisection), so a tile costs its own experts, not every local expert.
    let first = off[1..=local].partition_point(|&o| (o as i64) <= lo);
    let last = off[..local].partition_point(|&o| (o as i64) < hi);
    for el in first..last.max(first) {
        let (g0, g1) = (off[el] as i64, off[el + 1] as i64);
        if g1 <= lo || g0 >= hi {
            continue;
        }
        let e = rank * local + el;
        for s in 0..l.ranks() {
            let seg = g0 + s as i64 * cap;
            let cnt = (l.send_off[s][e + 1] - l.send_off[s][e]) as i64;
            let (a, b) = (seg.max(lo), (seg + cnt).min(hi));
            if b > a {
                real += b - a;
            }
        }
    }
    real as f64
}

/// For a task of a call that puts over a send list: the tokens whose rows it sends
/// (ascending: the send list is sorted by token within an expert).
fn send_rows(g: &TaskGraph, t: usize) -> Option<Vec<i64>> {
    let nt = &g.nodes[g.node[t] as usize];
    let d = nt.dims.iter().position(|d| matches!(d.kind, DimKind::Send { .. }))?;
    let DimKind::Send { route, .. } = nt.dims[d].kind else {
        return None;
    };
    let l = g.layouts.get(route.0 as usize)?.as_ref()?;
    let c = g.chunks(t)[d];
    let rank = g.rank[t] as usize;
    let off = &l.send_off[rank];
    let e = c.group as usize;
    let (first, last) = if l.static_capacity {
        let cnt = (off[e + 1] - off[e]) as i64;
        (off[e] as i64 + c.lo.min(cnt), off[e] as i64 + c.hi.min(cnt))
    } else {
        (c.lo, c.hi)
    };
    let list = l.send[rank].get(first.max(0) as usize..last.max(first).max(0) as usize)?;
    let mut tokens: Vec<i64> = list.iter().map(|e| e.token as i64).collect();
    tokens.sort_unstable();
    tokens.dedup();
    Some(tokens)
}

/// The layout of a tensor's ragged first dimension, if any.
fn recv_layout<'a>(tf: &Taskflow, g: &'a TaskGraph, r: &Region) -> Option<&'a RouteLayout> {
    match tf.tensor(r.tensor).shape.first() {
        Some(Dim::Recv(rid)) => g.layouts.get(rid.0 as usize)?.as_ref(),
        _ => None,
    }
}

/// Per routing with a static window: per rank, per local expert, the prefix sums of the rows
/// each source rank sends it (`[el * (ranks + 1) + s]`: the rows of sources `0..s`), so that
/// the data rows of a row range are found in O(1) per expert instead of O(ranks).
#[derive(Default)]
struct SegmentRows {
    prefix: Vec<Option<Vec<Vec<u32>>>>,
}

impl SegmentRows {
    fn new(layouts: &[Option<RouteLayout>]) -> SegmentRows {
        let prefix = layouts
            .iter()
            .map(|l| {
                let l = l.as_ref().filter(|l| l.static_capacity)?;
                let (ranks, local, cap) = (l.ranks(), l.local_experts(), l.segment_capacity());
                let mut out = Vec::with_capacity(ranks);
                for rank in 0..ranks {
                    let mut p = Vec::with_capacity(local * (ranks + 1));
                    for el in 0..local {
                        let e = rank * local + el;
                        let mut acc = 0u32;
                        p.push(0);
                        for s in 0..ranks {
                            let cnt = l.send_off[s][e + 1] - l.send_off[s][e];
                            // A segment never holds more than its capacity; if one did, the
                            // segments would overlap and the sums would not apply.
                            if cnt > cap {
                                return None;
                            }
                            acc += cnt;
                            p.push(acc);
                        }
                    }
                    out.push(p);
                }
                Some(out)
            })
            .collect();
        SegmentRows { prefix }
    }

    /// [`real_rows`], from the prefix sums when the routing has them.
    fn real_rows(&self, route: usize, l: &RouteLayout, rank: usize, lo: i64, hi: i64) -> f64 {
        let Some(p) = self
            .prefix
            .get(route)
            .and_then(|p| p.as_ref())
            .and_then(|p| p.get(rank))
        else {
            return real_rows(l, rank, lo, hi);
        };
        if hi <= lo {
            return 0.0;
        }
        let off = &l.group_off[rank];
        let local = l.local_experts();
        let ranks = l.ranks();
        let cap = l.segment_capacity() as i64;
        if cap == 0 {
            return 0.0;
        }
        let first = off[1..=local].partition_point(|&o| (o as i64) <= lo);
        let last = off[..local].partition_point(|&o| (o as i64) < hi);
        let mut real = 0i64;
        for el in first..last.max(first) {
            let (g0, g1) = (off[el] as i64, off[el + 1] as i64);
            if g1 <= lo || g0 >= hi {
                continue;
            }
            let pe = &p[el * (ranks + 1)..(el + 1) * (ranks + 1)];
            // Segment s holds rows g0 + s * cap .. + cnt(s); the range, relative to g0.
            let a = (lo - g0).max(0);
            let b = (hi - g0).min(ranks as i64 * cap);
            if b <= a {
                continue;
            }
            let part = |s: i64| {
                let cnt = i64::from(pe[s as usize + 1] - pe[s as usize]);
                ((s * cap + cnt).min(b) - (s * cap).max(a)).max(0)
            };
            let (sa, sb) = (a / cap, (b - 1) / cap);
            real += part(sa);
            if sb > sa {
                real += part(sb) + i64::from(pe[sb as usize] - pe[sa as usize + 1]);
            }
        }
        real as f64
    }
}

/// Bytes of a region with data: its volume, with the padding rows of a static window removed.
fn region_bytes(tf: &Taskflow, g: &TaskGraph, segs: &SegmentRows, r: &Region) -> (f64, f64) {
    let size = tf.tensor(r.tensor).dtype.size() as f64;
    let vol = r.volume() as f64;
    let rows = (r.hi[0] - r.lo[0]).max(0) as f64;
    match recv_layout(tf, g, r) {
        Some(l) if l.static_capacity && rows > 0.0 && r.ndim > 0 => {
            let route = match tf.tensor(r.tensor).shape.first() {
                Some(Dim::Recv(rid)) => rid.0 as usize,
                _ => usize::MAX,
            };
            let real = segs.real_rows(route, l, r.rank as usize, r.lo[0], r.hi[0]);
            (vol * size * real / rows, real / rows)
        }
        _ => (vol * size, 1.0),
    }
}

fn overlap(a: &Region, b: &Region) -> Region {
    let mut r = *a;
    for d in 0..a.ndim as usize {
        r.lo[d] = a.lo[d].max(b.lo[d]);
        r.hi[d] = a.hi[d].min(b.hi[d]).max(r.lo[d]);
    }
    r
}

/// A region's writers as [`Workload::new`] remembers them for the tiles of a call on a rank.
#[derive(Clone, Copy, PartialEq)]
struct Memo {
    /// The writers' blocks and bytes, sorted by block (stably).
    list: (u32, u32),
    /// The runs of consecutive blocks they make.
    runs: (u32, u32),
    /// Their bytes, summed in the order they were found.
    sum: f64,
}

impl Memo {
    const NONE: Memo = Memo {
        list: (u32::MAX, u32::MAX),
        runs: (u32::MAX, u32::MAX),
        sum: 0.0,
    };
}

/// A piece of a task's reads, with its lowest and highest block.
struct Piece {
    lo: u32,
    hi: u32,
    what: Read,
}

enum Read {
    /// A region's writers; with `scale = Some((bytes, covered))` when they covered the
    /// region's `bytes` more than once, so each of theirs counts `bytes / covered` of itself.
    Writers { memo: Memo, scale: Option<(f64, f64)> },
    /// An input block (the piece's block) and its bytes.
    Input(f64),
}

/// Whether every task's runs are made by merging its reads (tests compare it with joining
/// the pieces' runs).
fn merge_always() -> bool {
    #[cfg(test)]
    return tests::MERGE_ALWAYS.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// Appends the runs of consecutive blocks that `reads` (sorted by block) make: first block,
/// count, and bytes summed in order (a block read twice adds to its run's bytes).
fn push_runs(reads: &[(u32, f64)], out: &mut Vec<(u32, u32, f64)>) {
    let mut run: Option<(u32, u32, f64)> = None;
    for &(b, bytes) in reads {
        match &mut run {
            Some((first, count, sum)) if *first + *count == b => {
                *count += 1;
                *sum += bytes;
            }
            Some((first, count, sum)) if *first + *count - 1 == b => *sum += bytes,
            _ => {
                out.extend(run.take());
                run = Some((b, 1, bytes));
            }
        }
    }
    out.extend(run);
}

/// Bytes a vector holds on the heap.
fn heap<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * std::mem::size_of::<T>()) as u64
}

impl Plan {
    /// Bytes it holds on the heap.
    pub fn heap_bytes(&self) -> u64 {
        heap(&self.info)
            + heap(&self.pos)
            + heap(&self.core)
            + heap(&self.queue)
            + heap(&self.queue_off)
            + heap(&self.runs)
            + heap(&self.sig)
            + heap(&self.waiters.off)
            + heap(&self.waiters.idx)
            + heap(&self.waits)
    }
}

impl Workload {
    /// Bytes it holds on the heap: what a copy of it costs.
    pub fn heap_bytes(&self) -> u64 {
        heap(&self.class)
            + heap(&self.compute)
            + heap(&self.read_total)
            + heap(&self.local_out)
            + heap(&self.flow_off)
            + heap(&self.flow_dst)
            + heap(&self.flow_bytes)
            + heap(&self.flow_block)
            + heap(&self.flow_task)
            + heap(&self.flow_pair)
            + heap(&self.pairs)
            + heap(&self.flow_contact)
            + heap(&self.flow_cap)
            + heap(&self.block_rank)
            + heap(&self.block_size)
            + heap(&self.block_input)
            + heap(&self.node_comm)
            + heap(&self.delay)
            + heap(&self.waiters.off)
            + heap(&self.waiters.idx)
            + heap(&self.min_duration)
            + self.plan.heap_bytes()
    }

    /// Prepares a compiled taskflow for simulation.
    pub fn new(program: &Program, tf: &Taskflow, g: &TaskGraph, s: &Schedule, m: &DeviceModel) -> Workload {
        let n = g.len();
        let ranks = g.ranks as usize;
        let node_comm: Vec<bool> = tf
            .nodes
            .iter()
            .map(|nd| tf.tensor(nd.output).home == hpmoe_dsl::ir::Home::Window || program.op(nd.op).is_comm)
            .collect();
        let mut w = Workload {
            ranks: g.ranks,
            cores_per_rank: s.cores_per_rank(),
            aic_cores: s.aic_cores,
            class: Vec::with_capacity(n),
            compute: Vec::with_capacity(n),
            read_total: Vec::with_capacity(n),
            local_out: Vec::with_capacity(n),
            flow_off: Vec::with_capacity(n + 1),
            flow_dst: Vec::new(),
            flow_bytes: Vec::new(),
            flow_block: Vec::new(),
            flow_task: Vec::new(),
            flow_pair: Vec::new(),
            pairs: Vec::new(),
            flow_contact: Vec::new(),
            flow_cap: Vec::new(),
            contacts: 0,
            block_rank: g.rank.clone(),
            block_size: vec![0.0; n],
            block_input: vec![false; n],
            node_comm,
            delay: Vec::new(),
            waiters: Csr::default(),
            start_time: 0.0,
            min_duration: Vec::with_capacity(n),
            plan: Plan::default(),
        };
        w.flow_off.push(0);
        let segs = SegmentRows::new(&g.layouts);
        // Read runs by task id (moved to queue order at the end).
        let mut run_off: Vec<u32> = Vec::with_capacity(n + 1);
        run_off.push(0);
        let mut run_first: Vec<u32> = Vec::with_capacity(2 * n);
        let mut run_count: Vec<u32> = Vec::with_capacity(2 * n);
        let mut run_bytes: Vec<f64> = Vec::with_capacity(2 * n);
        let mut index = WriterIndex::new(tf, ranks);
        let mut scratch = Scratch::default();
        let mut inputs = RegionMap::new(NONE);
        // Per call: whether a call reads its output (only then are its writes indexed).
        let read_tensor = tf.tensors_read();
        let is_read: Vec<bool> = tf
            .nodes
            .iter()
            .map(|node| read_tensor.get(node.output.0 as usize) == Some(&true))
            .collect();
        // Per rank a task wrote on: its bytes (and region volume, for reads of it).
        let mut per_rank: Vec<(u32, f64)> = Vec::new();
        let mut reads: Vec<(u32, f64)> = Vec::new();
        // Regions read, with their bytes.
        let mut regions: Vec<(Region, f64)> = Vec::new();
        // Per region read by the current call on the current rank: its writers' blocks (in
        // `memo_arena`, sorted by block, stably), the sum of their bytes (in the order the
        // writers were found), and the runs of consecutive blocks they make (in
        // `memo_runs`: first block, count, bytes).
        let mut memo = RegionMap::new(Memo::NONE);
        let mut memo_arena: Vec<(u32, f64)> = Vec::new();
        let mut memo_runs: Vec<(u32, u32, f64)> = Vec::new();
        // The current task's reads as pieces: a region's writers (unscaled) or one input
        // block, each with its lowest and highest block.
        let mut pieces: Vec<Piece> = Vec::new();
        let mut task_runs: Vec<(u32, u32, f64)> = Vec::new();
        let mut by_lo: Vec<u32> = Vec::new();
        let mut memo_key = (u32::MAX, u32::MAX);
        // Per op call: reads indexed by `group(m)` whose rows `m` are a receive-window task
        // dimension: (tensor, dimension of the group index, task dimension of `m`). The
        // lowering's regions bound such an index conservatively; the tile's chunk knows its
        // expert exactly.
        let group_fix: Vec<Vec<(hpmoe_dsl::ir::TensorId, usize, usize)>> = tf
            .nodes
            .iter()
            .enumerate()
            .map(|(ni, node)| {
                let mut v = Vec::new();
                for st in &node.body.stmts {
                    st.value.for_each_read(&mut |input, ix| {
                        for (k, i) in ix.iter().enumerate() {
                            if let Index::Group(var) = i {
                                let name = &node.body.vars[*var].name;
                                if let Some(d) = g.nodes[ni]
                                    .dims
                                    .iter()
                                    .position(|d| d.name == *name && matches!(d.kind, DimKind::Recv(_)))
                                {
                                    let e = (node.inputs[input], k, d);
                                    if !v.contains(&e) {
                                        v.push(e);
                                    }
                                }
                            }
                        }
                    });
                }
                v
            })
            .collect();
        // Per op call: the element size the vector unit computes at (the widest dtype among
        // its inputs and output) and whether its cube contraction has two int8 operands.
        let elems: Vec<f64> = tf
            .nodes
            .iter()
            .map(|node| {
                node.inputs
                    .iter()
                    .map(|&i| tf.tensor(i).dtype.size())
                    .chain([tf.tensor(node.output).dtype.size()])
                    .max()
                    .unwrap_or(2) as f64
            })
            .collect();
        let int8: Vec<bool> = tf
            .nodes
            .iter()
            .map(|node| {
                let is_int8 = |input: usize| {
                    node.inputs
                        .get(input)
                        .is_some_and(|&i| matches!(tf.tensor(i).dtype, DType::I8 | DType::U8))
                };
                node.body
                    .contraction
                    .as_ref()
                    .is_some_and(|c| is_int8(c.lhs) && is_int8(c.rhs))
            })
            .collect();
        // Blocks that puts land as: allocated per call, per destination in window-row order,
        // so a consumer reading a range of a window reads consecutive blocks.
        let mut landed: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        let mut landed_node = u32::MAX;
        let mut pre_scratch = Scratch::default();
        let mut pre: Vec<(u32, i64, u32, f64)> = Vec::new();
        for t in 0..n {
            hpmoe_dsl::cancel::check_every(t);
            let rank = g.rank[t];
            let ni = g.node[t];
            if w.node_comm[ni as usize] && landed_node != ni {
                landed_node = ni;
                landed.clear();
                pre.clear();
                let nt = &g.nodes[ni as usize];
                let first = nt.base.first().copied().unwrap_or(0) as usize;
                let count: usize = nt.per_rank.iter().map(|r| r.count as usize).sum();
                for u in first..(first + count).min(n) {
                    let a = tile_access(program, tf, g, u, &mut pre_scratch);
                    let start = pre.len();
                    for wr in &a.writes {
                        if wr.rank == g.rank[u] {
                            continue;
                        }
                        let (bytes, _) = region_bytes(tf, g, &segs, wr);
                        match pre[start..].iter_mut().find(|e| e.0 == wr.rank) {
                            Some(e) => {
                                e.1 = e.1.min(wr.lo[0]);
                                e.3 += bytes;
                            }
                            None => pre.push((wr.rank, wr.lo[0], u as u32, bytes)),
                        }
                    }
                    let total: f64 = pre[start..].iter().map(|e| e.3).sum();
                    let scale = if total > 0.0 { a.remote / total } else { 0.0 };
                    for e in &mut pre[start..] {
                        e.3 *= scale;
                    }
                }
                pre.sort_by_key(|x| (x.0, x.1, x.2));
                for &(dst, _, u, bytes) in &pre {
                    if bytes > 0.0 {
                        w.block_rank.push(dst);
                        w.block_size.push(bytes);
                        w.block_input.push(false);
                        landed.insert((u, dst), (w.block_rank.len() - 1) as u32);
                    }
                }
            }
            let node = &tf.nodes[ni as usize];
            let class = model::class(node.engine);
            let a = tile_access(program, tf, g, t, &mut scratch);
            // Writes: the bytes on every rank.
            per_rank.clear();
            let mut frac_num = 0.0;
            let mut frac_den = 0.0;
            for wr in &a.writes {
                let (bytes, _) = region_bytes(tf, g, &segs, wr);
                match per_rank.iter_mut().find(|(r, _)| *r == wr.rank) {
                    Some(e) => e.1 += bytes,
                    None => per_rank.push((wr.rank, bytes)),
                }
            }
            // Remote bytes: the lowering's count (excludes padding slots of static windows).
            let remote_total: f64 = per_rank.iter().filter(|(r, _)| *r != rank).map(|(_, b)| b).sum();
            let remote_scale = if remote_total > 0.0 {
                a.remote / remote_total
            } else {
                0.0
            };
            let local_out = per_rank.iter().find(|(r, _)| *r == rank).map_or(0.0, |e| e.1);
            // Reads: the lowering's regions, with `group(m)` indices narrowed to the tile's
            // expert and gathers split into the rows they read.
            let send = send_rows(g, t);
            let fixes = &group_fix[g.node[t] as usize];
            let chunks = if fixes.is_empty() { Vec::new() } else { g.chunks(t) };
            regions.clear();
            for rd in &a.reads {
                let mut rd = *rd;
                rd.accumulate = false;
                for &(tensor, k, d) in fixes {
                    if rd.tensor == tensor && k < rd.ndim as usize {
                        rd.lo[k] = chunks[d].group as i64;
                        rd.hi[k] = rd.lo[k] + 1;
                    }
                }
                let (rd_bytes, frac) = region_bytes(tf, g, &segs, &rd);
                if recv_layout(tf, g, &rd).is_some() {
                    frac_num += frac * rd.volume() as f64;
                    frac_den += rd.volume() as f64;
                }
                match &send {
                    Some(tokens)
                        if rd.ndim > 0
                            && rd.lo[0] == tokens.first().copied().unwrap_or(0)
                            && rd.hi[0] == tokens.last().map_or(0, |x| x + 1)
                            && (rd.hi[0] - rd.lo[0]) as usize > tokens.len() =>
                    {
                        for &tok in tokens.iter() {
                            let mut row = rd;
                            row.lo[0] = tok;
                            row.hi[0] = tok + 1;
                            regions.push((row, region_bytes(tf, g, &segs, &row).0));
                        }
                    }
                    _ => regions.push((rd, rd_bytes)),
                }
            }
            reads.clear();
            let mut read_total = 0.0;
            for (probe, bytes) in regions.iter() {
                let bytes = *bytes;
                if bytes <= 0.0 {
                    continue;
                }
                read_total += bytes;
                let mut covered = 0.0;
                if tf.tensor(probe.tensor).producer.is_some() {
                    // The producers of a region repeat across the tiles of a call (and
                    // nothing a call reads is written while its tasks are prepared).
                    let key = (g.node[t], rank);
                    if key != memo_key {
                        memo.clear();
                        memo_arena.clear();
                        memo_runs.clear();
                        memo_key = key;
                    }
                    let m = match memo.get(probe) {
                        Some(r) => r,
                        None => {
                            let a0 = memo_arena.len();
                            let bs = &w.block_size;
                            let fo = &w.flow_off;
                            let (fd, fb) = (&w.flow_dst, &w.flow_block);
                            index.writes_over(probe, &mut |p, reg| {
                                let ov = overlap(probe, &reg);
                                let (b, _) = region_bytes(tf, g, &segs, &ov);
                                if b <= 0.0 {
                                    return;
                                }
                                let pu = p as usize;
                                let block = if g.rank[pu] == probe.rank {
                                    if bs[pu] > 0.0 {
                                        p
                                    } else {
                                        NONE
                                    }
                                } else {
                                    (fo[pu]..fo[pu + 1])
                                        .find(|&f| fd[f as usize] == probe.rank)
                                        .map_or(NONE, |f| fb[f as usize])
                                };
                                if block != NONE {
                                    memo_arena.push((block, b));
                                }
                            });
                            let a1 = memo_arena.len();
                            let sum = memo_arena[a0..a1].iter().fold(0.0, |s, e| s + e.1);
                            // Sorted stably here, the lists joined below need only merging
                            // into the same order.
                            memo_arena[a0..a1].sort_by_key(|e| e.0);
                            let r0 = memo_runs.len();
                            push_runs(&memo_arena[a0..a1], &mut memo_runs);
                            let m = Memo {
                                list: (a0 as u32, a1 as u32),
                                runs: (r0 as u32, memo_runs.len() as u32),
                                sum,
                            };
                            memo.insert(*probe, m);
                            m
                        }
                    };
                    covered = m.sum;
                    let list = &memo_arena[m.list.0 as usize..m.list.1 as usize];
                    if let (Some(lo), Some(hi)) = (list.first(), list.last()) {
                        pieces.push(Piece {
                            lo: lo.0,
                            hi: hi.0,
                            what: Read::Writers {
                                memo: m,
                                // Accumulated writes may cover a row several times: read it
                                // once.
                                scale: (covered > bytes).then_some((bytes, covered)),
                            },
                        });
                    }
                }
                if covered > bytes {
                    covered = bytes;
                }
                let rest = bytes - covered;
                if rest > bytes * 1e-9 {
                    let id = inputs.get_or_insert_with(probe, || {
                        w.block_rank.push(probe.rank);
                        w.block_size.push(rest);
                        w.block_input.push(true);
                        (w.block_rank.len() - 1) as u32
                    });
                    pieces.push(Piece {
                        lo: id,
                        hi: id,
                        what: Read::Input(rest),
                    });
                }
            }
            // Runs of consecutive blocks (a block read twice adds to its run's bytes). The
            // reads are sorted pieces (each region's writers, then its input block). When no
            // piece was scaled and no two overlap or touch, the sorted reads are the pieces
            // one after the other, and their runs each piece's own: those of a region's
            // writers were made once, when they were first looked up.
            by_lo.clear();
            by_lo.extend(0..pieces.len() as u32);
            by_lo.sort_unstable_by_key(|&i| pieces[i as usize].lo);
            let apart = !merge_always()
                && pieces
                    .iter()
                    .all(|p| !matches!(p.what, Read::Writers { scale: Some(_), .. }))
                && by_lo
                    .windows(2)
                    .all(|w| u64::from(pieces[w[0] as usize].hi) + 1 < u64::from(pieces[w[1] as usize].lo));
            if apart {
                #[cfg(test)]
                tests::JOINED.with(|c| c.set(c.get() + 1));
                for &i in &by_lo {
                    let p = &pieces[i as usize];
                    match p.what {
                        Read::Writers { memo: m, .. } => {
                            for &(first, count, sum) in &memo_runs[m.runs.0 as usize..m.runs.1 as usize] {
                                run_first.push(first);
                                run_count.push(count);
                                run_bytes.push(sum);
                            }
                        }
                        Read::Input(bytes) => {
                            run_first.push(p.lo);
                            run_count.push(1);
                            run_bytes.push(bytes);
                        }
                    }
                }
            } else {
                // The reads piece by piece, then a stable sort merges them into the order
                // of their blocks.
                reads.clear();
                for p in &pieces {
                    match p.what {
                        Read::Writers { memo: m, scale } => {
                            let start = reads.len();
                            reads.extend_from_slice(&memo_arena[m.list.0 as usize..m.list.1 as usize]);
                            if let Some((bytes, covered)) = scale {
                                for e in &mut reads[start..] {
                                    e.1 *= bytes / covered;
                                }
                            }
                        }
                        Read::Input(bytes) => reads.push((p.lo, bytes)),
                    }
                }
                reads.sort_by_key(|e| e.0);
                task_runs.clear();
                push_runs(&reads, &mut task_runs);
                for &(first, count, sum) in &task_runs {
                    run_first.push(first);
                    run_count.push(count);
                    run_bytes.push(sum);
                }
            }
            pieces.clear();
            run_off.push(run_first.len() as u32);
            // Blocks written: the local one (block `t`), then one per destination.
            w.block_size[t] = local_out;
            for &(r, b) in per_rank.iter() {
                if r == rank {
                    continue;
                }
                let bytes = b * remote_scale;
                if bytes <= 0.0 {
                    continue;
                }
                let block = match landed.get(&(t as u32, r)) {
                    Some(&b) => b,
                    None => {
                        w.block_rank.push(r);
                        w.block_size.push(bytes);
                        w.block_input.push(false);
                        (w.block_rank.len() - 1) as u32
                    }
                };
                w.flow_dst.push(r);
                w.flow_bytes.push(bytes);
                w.flow_block.push(block);
                w.flow_task.push(t as u32);
            }
            w.flow_off.push(w.flow_dst.len() as u32);
            // Compute: padding rows of a static window do not count.
            let frac = if frac_den > 0.0 { frac_num / frac_den } else { 1.0 };
            let compute = m.compute_seconds(class, g.flops[t] as f64 * frac, elems[ni as usize], int8[ni as usize]);
            w.class.push(class as u8);
            w.compute.push(compute);
            w.read_total.push(read_total);
            w.local_out.push(local_out);
            // Only writes of a tensor some call reads are ever looked up.
            if is_read[ni as usize] {
                for wr in &a.writes {
                    index.add(wr, t as u32);
                }
            }
        }

        // Pairs of ranks, in order of first use.
        let mut pair_of: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        for f in 0..w.flow_dst.len() {
            let key = (g.rank[w.flow_task[f] as usize], w.flow_dst[f]);
            let id = *pair_of.entry(key).or_insert_with(|| {
                w.pairs.push(key);
                (w.pairs.len() - 1) as u32
            });
            w.flow_pair.push(id);
        }
        let mut contact_of: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        for f in 0..w.flow_dst.len() {
            let key = (w.flow_pair[f], g.node[w.flow_task[f] as usize]);
            let next = contact_of.len() as u32;
            w.flow_contact.push(*contact_of.entry(key).or_insert(next));
        }
        w.contacts = contact_of.len() as u32;
        // Messages: one row of the op's output (the put's target) each, chunked.
        let row_bytes: Vec<f64> = tf
            .nodes
            .iter()
            .map(|nd| {
                let t = tf.tensor(nd.output);
                let mut elems = 1.0f64;
                for d in t.shape.iter().skip(1) {
                    match d.fixed() {
                        Some(k) => elems *= k as f64,
                        None => return m.put_chunk_bytes,
                    }
                }
                (elems * t.dtype.size() as f64).clamp(1.0, m.put_chunk_bytes.max(1.0))
            })
            .collect();
        for f in 0..w.flow_dst.len() {
            let msg = row_bytes[g.node[w.flow_task[f] as usize] as usize];
            let (src, dst) = w.pairs[w.flow_pair[f] as usize];
            w.flow_cap.push(m.topology.window_cap(src, dst, w.flow_bytes[f], msg));
        }
        // Lower-bound durations.
        for t in 0..n {
            let c = w.class[t] as usize;
            let mem = w.read_total[t] / m.best_read_rate(c) + w.local_out[t] / m.core_l2_write[c];
            let flows: f64 = w.flow_bytes[w.flow_off[t] as usize..w.flow_off[t + 1] as usize]
                .iter()
                .sum();
            let link = if flows > 0.0 {
                w.read_total[t].min(m.put_chunk_bytes) / m.best_read_rate(c) + flows / m.link_egress.min(m.link_ingress)
            } else {
                0.0
            };
            w.min_duration.push(m.task_overhead + w.compute[t].max(mem).max(link));
        }
        w.set_schedule(g, s, m, &run_off, (run_first, run_count, run_bytes));

        w
    }

    /// The workload of the same task graph under another schedule `s`, in place: what
    /// depends on the schedule (core counts, counters and their delays, the event loop's
    /// plan) is rebuilt; the per-task work, flows and blocks, which depend on the graph
    /// alone, are kept. Equal to [`Workload::new`] with `s`, without its region work.
    pub fn reschedule(&mut self, g: &TaskGraph, s: &Schedule, m: &DeviceModel) {
        // The read runs back in task order, from the plan's queue order.
        let n = self.plan.info.len();
        let mut run_off: Vec<u32> = Vec::with_capacity(n + 1);
        run_off.push(0);
        let mut runs = (
            Vec::with_capacity(self.plan.runs.len()),
            Vec::with_capacity(self.plan.runs.len()),
            Vec::with_capacity(self.plan.runs.len()),
        );
        for t in 0..n {
            let info = &self.plan.info[self.plan.pos[t] as usize];
            for r in &self.plan.runs[info.reads as usize..info.read_end as usize] {
                runs.0.push(r.first);
                runs.1.push(r.count);
                runs.2.push(r.bytes);
            }
            run_off.push(runs.0.len() as u32);
        }
        self.plan = Plan::default();
        self.set_schedule(g, s, m, &run_off, runs);
    }

    /// Sets what depends on the schedule: core counts, counters (kernel launches after
    /// barriers; waiters) and the plan.
    fn set_schedule(
        &mut self,
        g: &TaskGraph,
        s: &Schedule,
        m: &DeviceModel,
        run_off: &[u32],
        runs: (Vec<u32>, Vec<u32>, Vec<f64>),
    ) {
        self.cores_per_rank = s.cores_per_rank();
        self.aic_cores = s.aic_cores;
        let total = s.threshold.len();
        let gc = total - s.barriers as usize;
        let launch = if s.policy.launch_overhead { m.kernel_launch } else { 0.0 };
        self.start_time = launch;
        self.delay = (0..total).map(|c| if c >= gc { launch } else { 0.0 }).collect();
        self.waiters = s.waits.transpose_into(total);
        self.plan = self.build_plan(g, s, &m.topology, run_off, runs);
    }

    /// Renumbers the tasks in queue order and gathers what a task start needs.
    /// `runs`: the first block, count and bytes of every read run, in task order (freed once
    /// laid out in internal order, before the rest of the plan is allocated).
    fn build_plan(
        &self,
        g: &TaskGraph,
        s: &Schedule,
        topo: &model::link::Topology,
        run_off: &[u32],
        runs: (Vec<u32>, Vec<u32>, Vec<f64>),
    ) -> Plan {
        let n = g.len();
        let mut pos = vec![NONE; n];
        let mut order: Vec<u32> = Vec::with_capacity(n);
        for &t in &s.queues.idx {
            if (t as usize) < n && pos[t as usize] == NONE {
                pos[t as usize] = order.len() as u32;
                order.push(t);
            }
        }
        // Tasks on no queue (a broken schedule) never start; they still get an id.
        for t in 0..n {
            if pos[t] == NONE {
                pos[t] = order.len() as u32;
                order.push(t as u32);
            }
        }
        let mut plan_runs: Vec<ReadRun> = Vec::with_capacity(runs.0.len());
        for &t in &order {
            let t = t as usize;
            plan_runs.extend((run_off[t] as usize..run_off[t + 1] as usize).map(|k| ReadRun {
                first: runs.0[k],
                count: runs.1[k],
                bytes: runs.2[k],
            }));
        }
        drop(runs);
        // Queues as internal ids; a task queued twice (a broken schedule) runs once.
        let mut queue: Vec<u32> = Vec::with_capacity(n);
        let mut queue_off: Vec<u32> = Vec::with_capacity(s.queues.off.len());
        let mut seen = vec![false; n];
        queue_off.push(0);
        for c in 0..s.queues.len() {
            for &t in s.queues.row(c) {
                if let Some(x) = seen.get_mut(t as usize) {
                    if !*x {
                        *x = true;
                        queue.push(pos[t as usize]);
                    }
                }
            }
            queue_off.push(queue.len() as u32);
        }
        debug_assert!(queue.iter().enumerate().all(|(k, &i)| k == i as usize));
        let mut p = Plan {
            info: Vec::with_capacity(n),
            pos,
            core: Vec::with_capacity(n),
            queue,
            queue_off,
            runs: plan_runs,
            sig: Vec::with_capacity(s.signal_list.idx.len() + n),
            fanout: Vec::new(),
            waiters: Csr::default(),
            waits: Vec::with_capacity(n),
        };
        // A fanout's remote signals arrive together, after the longest latency to another
        // rank (as a task's listed remote signals do).
        let mut fanout_of_kernel: Vec<u32> = vec![NONE; s.fanout.len()];
        let mut far: Vec<f64> = Vec::new();
        for (k, f) in s.fanout.iter().enumerate() {
            if let Some(hpmoe_dsl::schedule::Fanout::EveryRank { first, ranks }) = *f {
                if ranks < 2 {
                    continue;
                }
                fanout_of_kernel[k] = p.fanout.len() as u32;
                p.fanout.push((first, ranks));
                if far.is_empty() {
                    far = (0..self.ranks)
                        .map(|a| {
                            (0..self.ranks)
                                .filter(|&b| b != a)
                                .map(|b| topo.latency(a, b))
                                .fold(0.0, f64::max)
                        })
                        .collect();
                }
            }
        }
        // Per kernel: whether its every-rank range holds rank `q`'s counter at `first + q`,
        // so that a task finds its own rank's counter there instead of by a scan of the range.
        let by_rank: Vec<bool> = s
            .fanout
            .iter()
            .map(|f| match *f {
                Some(hpmoe_dsl::schedule::Fanout::EveryRank { first, ranks }) => {
                    (0..ranks).all(|q| s.counter_rank.get(first.saturating_add(q) as usize) == Some(&q))
                }
                _ => false,
            })
            .collect();
        let mut next_run = 0u32;
        for &t in &order {
            let t = t as usize;
            let reads = next_run;
            next_run += run_off[t + 1] - run_off[t];
            let read_end = next_run;
            let sigs = p.sig.len() as u32;
            let rank = g.rank[t];
            let fanout = s
                .kernel
                .get(t)
                .and_then(|&k| fanout_of_kernel.get(k as usize))
                .copied()
                .unwrap_or(NONE);
            // The counters of its own rank that it signals: its list's, then its barrier's.
            p.sig.extend(
                s.signal_list
                    .row(t)
                    .iter()
                    .copied()
                    .filter(|&c| s.counter_rank[c as usize] == rank),
            );
            let barrier = s.fanout_of(t);
            let laid_out = s.kernel.get(t).is_some_and(|&k| by_rank.get(k as usize) == Some(&true));
            if laid_out {
                let own = barrier.start.saturating_add(rank);
                if barrier.contains(&own) {
                    p.sig.push(own);
                }
            } else {
                p.sig.extend(barrier.filter(|&c| s.counter_rank[c as usize] == rank));
            }
            let sig_split = p.sig.len() as u32;
            p.sig.extend(
                s.signal_list
                    .row(t)
                    .iter()
                    .copied()
                    .chain(if fanout == NONE { s.fanout_of(t) } else { 0..0 })
                    .filter(|&c| s.counter_rank[c as usize] != rank),
            );
            p.waits
                .push(s.waits.row(t).iter().filter(|&&c| s.threshold[c as usize] > 0).count() as u32);
            let core = s
                .core
                .get(t)
                .copied()
                .filter(|&c| (c as usize) < s.queues.len())
                .unwrap_or(NONE);
            p.core.push(core);
            p.info.push(TaskInfo {
                compute: self.compute[t],
                read_total: self.read_total[t],
                local_out: self.local_out[t],
                task: t as u32,
                core,
                rank,
                reads,
                read_end,
                sigs,
                sig_split,
                sig_end: p.sig.len() as u32,
                flows: self.flow_off[t],
                flow_end: self.flow_off[t + 1],
                local_block: if self.local_out[t] > 0.0 { t as u32 } else { NONE },
                fanout,
                sig_latency: p.sig[sig_split as usize..]
                    .iter()
                    .map(|&c| topo.latency(rank, s.counter_rank[c as usize]))
                    .chain((fanout != NONE).then(|| far.get(rank as usize).copied().unwrap_or(0.0)))
                    .fold(0.0, f64::max),
                class: self.class[t],
            });
        }
        let pairs: Vec<(u32, u32)> = (0..n)
            .flat_map(|t| s.waits.row(t).iter().map(move |&c| (c, t as u32)))
            .map(|(c, t)| (c, p.pos[t as usize]))
            .collect();
        p.waiters = Csr::from_pairs(s.threshold.len(), &pairs);
        p
    }

    pub fn tasks(&self) -> usize {
        self.class.len()
    }
    pub fn flows(&self) -> usize {
        self.flow_dst.len()
    }
    pub fn blocks(&self) -> usize {
        self.block_rank.len()
    }
    pub fn task_flows(&self, t: usize) -> std::ops::Range<usize> {
        self.flow_off[t] as usize..self.flow_off[t + 1] as usize
    }
    /// Bytes task `t` puts to other ranks.
    pub fn remote_bytes(&self, t: usize) -> f64 {
        self.flow_bytes[self.task_flows(t)].iter().sum()
    }
    /// Bytes of every taskflow-input block read on a rank (the HBM traffic no schedule avoids).
    pub fn compulsory_bytes(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.ranks as usize];
        for b in 0..self.blocks() {
            if self.block_input[b] {
                out[self.block_rank[b] as usize] += self.block_size[b];
            }
        }
        out
    }
    /// Memory the workload holds, in bytes.
    pub fn resident_bytes(&self) -> usize {
        let n = self.tasks();
        let p = &self.plan;
        n * (1 + 8 * 4 + 4)
            + self.flows() * 4
            + p.info.len() * std::mem::size_of::<TaskInfo>()
            + p.pos.len() * 4
            + p.queue.len() * 4
            + p.runs.len() * 16
            + p.sig.len() * 4
            + (p.waiters.idx.len() + self.waiters.idx.len()) * 8
            + self.flows() * 32
            + self.blocks() * 13
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpmoe_dsl::ir::{RouteKind, RouteSpec};
    use hpmoe_dsl::route::Routing;

    thread_local! {
        /// Makes every task's runs by merging its reads.
        pub(super) static MERGE_ALWAYS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// Tasks whose runs were joined from their pieces' runs.
        pub(super) static JOINED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A task's read runs joined from its pieces' runs (each region's writers, each input
    /// block) are those that merging all its reads gives, to the bit, under every policy,
    /// ragged and static windows, forward and backward, skewed routing.
    #[test]
    fn runs_joined_from_pieces_are_the_merged_runs() {
        let mut joined = 0;
        let examples: &[(&str, &[&str])] = &[
            ("deepseek_v3_ep8_fwd.hpm", &["ranks=8"]),
            ("deepseek_v3_ep8_bwd.hpm", &["ranks=16"]),
            ("qwen_moe_ep8_fwd.hpm", &[]),
            ("deepseek_v3_train_layer.hpm", &[]),
        ];
        crate::testing::each_compiled(examples, |file, p, tf, c, model, policy| {
            JOINED.with(|j| j.set(0));
            let fast = Workload::new(p, tf, &c.graph, &c.schedule, model);
            joined += JOINED.with(std::cell::Cell::get);
            MERGE_ALWAYS.with(|m| m.set(true));
            let merged = Workload::new(p, tf, &c.graph, &c.schedule, model);
            MERGE_ALWAYS.with(|m| m.set(false));
            let key = |w: &Workload| -> Vec<(u32, u32, u64)> {
                w.plan
                    .runs
                    .iter()
                    .map(|r| (r.first, r.count, r.bytes.to_bits()))
                    .collect()
            };
            assert_eq!(key(&fast), key(&merged), "{file} {} {policy:?}", tf.name);
            let ends =
                |w: &Workload| -> Vec<(u32, u32)> { w.plan.info.iter().map(|i| (i.reads, i.read_end)).collect() };
            assert_eq!(ends(&fast), ends(&merged), "{file} {} {policy:?}", tf.name);
        });
        // The joining is what most tasks take.
        assert!(joined > 1000, "{joined} tasks joined");
    }

    /// The prefix sums give the rows the segment-by-segment count gives, on every range of
    /// every rank of skewed static windows.
    #[test]
    fn segment_prefix_sums_count_the_rows_the_segments_hold() {
        for (ranks, experts, s) in [(4u64, 16u64, 1.2), (8, 8, 0.0), (2, 8, 2.0)] {
            let spec = RouteSpec {
                name: "r".into(),
                kind: RouteKind::Zipf { s, seed: 5 },
                experts,
                topk: 2,
                ranks,
                tokens: 12,
                capacity: 0,
                drop: None,
                capacity_factor: 0.0,
                span: Default::default(),
            };
            let l = RouteLayout::new(Routing::generate(&spec).unwrap(), true);
            let segs = SegmentRows::new(std::slice::from_ref(&Some(l.clone())));
            assert!(segs.prefix[0].is_some());
            for rank in 0..ranks as usize {
                let rows = i64::from(l.rows(rank));
                for lo in -1..=rows + 1 {
                    for hi in lo..=rows + 2 {
                        assert_eq!(
                            segs.real_rows(0, &l, rank, lo, hi),
                            real_rows(&l, rank, lo, hi),
                            "ranks {ranks} rank {rank} rows {lo}..{hi}"
                        );
                    }
                }
            }
        }
    }
}
