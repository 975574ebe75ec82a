//! Tile lowering: a checked taskflow, its routings and the device in; the task graph out.
//!
//! Every op call becomes one task per tile per rank. A tile is a box of the call's task
//! dimensions (the index variables of its output, or of its puts), chunked by the call's tile
//! sizes; rows of a receive window are chunked per local expert, so ragged per-expert row
//! counts are exact (or padded to the static worst case when a policy asks for it, in which
//! case empty tiles still exist and signal). Each task knows the regions it reads and writes
//! ([`TaskGraph::regions`]) and its cost. Dependencies come from the regions through an index
//! of the writers of every tensor some call reads, on every rank (never by comparing all
//! pairs), and are stored as CSR arrays of `u32` task ids; per-task fields are
//! struct-of-arrays. Tasks are numbered call by call, so producers precede consumers.
//!
//! The tiles of a call on each rank are worked out on the threads of the current rayon
//! pool (a call reads only what earlier calls wrote), then joined in task order on one
//! thread: the graph is the same whatever the threads.

pub mod layout;
pub mod regions;

pub use layout::{RecvEntry, RecvRows, RouteLayout, SendEntry, SourceSegment, NO_SOURCE};
pub use regions::{Access, Region, MAX_DIMS};

use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Dim, Engine, Program, RouteId, Target, Taskflow, VarKind, VarRange};
use crate::route::Routing;

/// The default task limit: a compiled and simulated taskflow of this many tasks stays within
/// a 4 GiB address space (the graph, its verification and its schedule cost a few hundred
/// bytes per task together). `--max-tasks N` raises it.
pub const DEFAULT_MAX_TASKS: u64 = 4_000_000;

/// The memory a compiled and simulated taskflow may need, in bytes: the estimate made from
/// the tilings before lowering (tasks, chunks, routing layouts) and the dependency edges
/// counted while lowering are held to it, whatever `--max-tasks` allows, so a graph that
/// would not fit in a 4 GiB address space is refused with its numbers instead of aborting.
pub const MAX_MEMORY: u64 = 3 << 30;

/// Bytes one task costs through the pipeline: its graph arrays (rank, node, tile, four costs,
/// counter: 32 bytes), the reverse edges and counter tables, verification, the schedule's
/// queues and the simulator's per-task state. An estimate, not a bound: `hpmoe run` of two
/// elementwise calls lowered to 1,048,576 tasks held 0.74 GiB (peak RSS) before the
/// schedule's candidates were done, about 700 bytes a task; [`DEFAULT_MAX_TASKS`] tasks at
/// this rate stay under [`MAX_MEMORY`].
pub const BYTES_PER_TASK: u64 = 700;

/// Bytes one dependency edge costs: its entry in the counter table and in the reverse
/// (signal) table, and the simulator's copy.
pub const BYTES_PER_EDGE: u64 = 12;

/// Bytes one row put back to its source rank costs beyond its routing layout: such a put
/// writes row by row, so verification indexes one write record per row (40 bytes) and may
/// sort a copy of them to find overlapping writes. `hpmoe run` of a taskflow that dispatches
/// and combines 4 M tokens per rank on 4 ranks (top-2, 64 columns: 32 M rows put back, 0.5 M
/// tasks) held 2.37 GiB at its peak, 0.95 GiB of it the routing layouts: about 36 bytes a row
/// beyond the tasks and layouts, with a margin here.
pub const BYTES_PER_PUT_BACK_ROW: u64 = 48;

/// Bytes one op call costs through the pipeline beyond its tasks, whatever its size: its
/// checked body, its tiling, its schedule and simulation records and its row of the report.
/// From `hpmoe run` of chains of small elementwise calls (one task per call and rank,
/// `docs/scripts/calls.py`): 50 K and 100 K calls on 1, 2, 4 and 8 ranks held about 2.75 KB
/// more a call (1 KB of it the checked program's), plus 1.3 KB more a call and rank, which
/// the tasks' estimate already counts (such a call's two dimensions count as two tasks); with
/// a margin here. A graph of many small calls holds several times [`BYTES_PER_TASK`] a task.
pub const BYTES_PER_CALL: u64 = 3072;

/// How tiles are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retile {
    /// The call's `tile(...)` sizes (and the op's defaults).
    Annotated,
    /// The reference runtime's split: communication and vector ops in 128-row tiles, each
    /// GMM split into one task per cube core per expert (the expert's rows, a slice of the
    /// output columns).
    ExpertLevel { aic_cores: u32 },
}

/// Which communication calls that send received rows back (`put out @ r.src_rank(m)`) have
/// their row chunks split where the source rank changes, so that each tile goes to one
/// destination (what rank-aware order and a pairwise exchange need).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestTiles {
    /// None: a chunk may span several source ranks of its expert.
    None,
    /// The calls annotated `order(ratr)`.
    Ordered,
    /// Every such call (a collective run step by step).
    All,
}

#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Pad every (expert, source rank) window segment to the worst case (`tokens` rows).
    pub static_capacity: bool,
    pub retile: Retile,
    pub max_tasks: u64,
    pub dest_tiles: DestTiles,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            static_capacity: false,
            retile: Retile::Annotated,
            max_tasks: DEFAULT_MAX_TASKS,
            dest_tiles: DestTiles::None,
        }
    }
}

/// What a task dimension ranges over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimKind {
    /// A fixed range of values.
    Range { lo: i64, hi: i64 },
    /// Rows of a routing's receive window, chunked per local expert.
    Recv(RouteId),
    /// The (token, choice) pairs a rank sends through a routing, chunked per destination
    /// expert; covers two variables.
    Send {
        route: RouteId,
        token: String,
        choice: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileDim {
    /// The index variable's name (for `Send`, the token variable's).
    pub name: String,
    pub kind: DimKind,
    pub tile: u64,
    /// When non-zero: split a fixed range into this many near-equal chunks aligned to 16
    /// (one per cube core), instead of chunks of `tile`.
    pub parts: u32,
    /// For `Recv`: chunks also end where the rows' source rank changes (see [`DestTiles`]).
    pub by_source: bool,
}

/// One chunk of a task dimension: `lo..hi` values (for `Send`, positions in the rank's send
/// list, or in the static layout positions in the (expert, source) segment); `group` is the
/// local expert (`Recv`) or the destination expert (`Send`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub lo: i64,
    pub hi: i64,
    pub group: u32,
}

/// The tiles of one op call on one rank: the cartesian product of the chunks of its dims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankTiles {
    pub chunks: Vec<Vec<Chunk>>,
    pub count: u32,
}

/// The tiling of one op call.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTiles {
    pub dims: Vec<TileDim>,
    pub per_rank: Vec<RankTiles>,
    /// The first task id of each rank's tiles (tasks of a node are contiguous per rank).
    pub base: Vec<u32>,
}

/// Compressed sparse rows of task ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Csr {
    pub off: Vec<u32>,
    pub idx: Vec<u32>,
}

impl Csr {
    pub fn row(&self, i: usize) -> &[u32] {
        &self.idx[self.off[i] as usize..self.off[i + 1] as usize]
    }
    pub fn len(&self) -> usize {
        self.off.len().saturating_sub(1)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Appends a row; returns its index.
    pub fn push_row(&mut self, row: &[u32]) -> u32 {
        if self.off.is_empty() {
            self.off.push(0);
        }
        self.idx.extend_from_slice(row);
        self.off.push(self.idx.len() as u32);
        (self.off.len() - 2) as u32
    }
    /// Builds the CSR from (row, value) pairs.
    pub fn from_pairs(rows: usize, pairs: &[(u32, u32)]) -> Csr {
        let mut off = vec![0u32; rows + 1];
        for &(r, _) in pairs {
            off[r as usize + 1] += 1;
        }
        for i in 0..rows {
            off[i + 1] += off[i];
        }
        let mut fill = off.clone();
        let mut idx = vec![0u32; pairs.len()];
        for &(r, v) in pairs {
            idx[fill[r as usize] as usize] = v;
            fill[r as usize] += 1;
        }
        Csr { off, idx }
    }
    /// The transpose, with `n` rows (values must be below `n`).
    pub fn transpose_into(&self, n: usize) -> Csr {
        let rows = self.len();
        let mut off = vec![0u32; n + 1];
        for &v in &self.idx {
            off[v as usize + 1] += 1;
        }
        for i in 0..n {
            off[i + 1] += off[i];
        }
        let mut fill = off.clone();
        let mut idx = vec![0u32; self.idx.len()];
        for r in 0..rows {
            for &v in self.row(r) {
                idx[fill[v as usize] as usize] = r as u32;
                fill[v as usize] += 1;
            }
        }
        Csr { off, idx }
    }
}

/// The lowered taskflow: tasks (struct of arrays), their tiles, costs and dependencies.
#[derive(Clone, Debug)]
pub struct TaskGraph {
    pub taskflow: String,
    pub ranks: u32,
    pub layouts: Layouts,
    pub nodes: Vec<NodeTiles>,
    /// Per task.
    pub rank: Vec<u32>,
    pub node: Vec<u32>,
    pub tile: Vec<u32>,
    /// Arithmetic operations (cube FLOPs or vector element operations).
    pub flops: Vec<f32>,
    /// Bytes read from memory.
    pub bytes_in: Vec<f32>,
    /// Bytes written to local memory.
    pub bytes_out: Vec<f32>,
    /// Bytes put into other ranks' windows.
    pub remote: Vec<f32>,
    /// Dependencies through counters, as on the device: task `t` waits on counter
    /// `wait[t]` (or on nothing: [`NO_COUNTER`]) until every producer in
    /// `counters.row(wait[t])` has signalled it. Consumers with the same producers share a
    /// counter, so a fan-in of N feeding M consumers costs N + M entries, not N x M.
    pub wait: Vec<u32>,
    pub counters: Csr,
    /// The rank whose symmetric memory holds each counter (its waiters' rank).
    pub counter_rank: Vec<u32>,
    /// The counters each task signals when it finishes (the transpose of `counters`).
    pub signals: Csr,
    /// The tasks waiting on each counter.
    pub waiters: Csr,
    /// An identity unique in the process (a clone keeps it: its tasks are the same), for the
    /// caches of region work that are valid for one graph only.
    pub(crate) uid: u64,
}

/// The next [`TaskGraph::uid`].
fn next_graph_uid() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Routing layouts by `RouteId` (shared: lowering under several policies reuses them).
pub type Layouts = std::sync::Arc<Vec<Option<RouteLayout>>>;

/// A task that waits on nothing.
pub const NO_COUNTER: u32 = u32::MAX;

impl TaskGraph {
    /// Whether `other` has the same tasks, costs and dependencies over the same routing
    /// layouts (the same shared layouts, not equal copies): a schedule runs on both alike.
    pub fn same_tasks(&self, other: &TaskGraph) -> bool {
        let bits =
            |v: &[f32], w: &[f32]| v.len() == w.len() && v.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
        std::sync::Arc::ptr_eq(&self.layouts, &other.layouts)
            && self.ranks == other.ranks
            && self.nodes == other.nodes
            && self.rank == other.rank
            && self.node == other.node
            && self.tile == other.tile
            && bits(&self.flops, &other.flops)
            && bits(&self.bytes_in, &other.bytes_in)
            && bits(&self.bytes_out, &other.bytes_out)
            && bits(&self.remote, &other.remote)
            && self.wait == other.wait
            && self.counters == other.counters
            && self.counter_rank == other.counter_rank
    }
    pub fn len(&self) -> usize {
        self.rank.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rank.is_empty()
    }
    /// Logical dependency edges (producer, consumer).
    pub fn edges(&self) -> u64 {
        self.wait
            .iter()
            .filter(|&&c| c != NO_COUNTER)
            .map(|&c| self.counters.row(c as usize).len() as u64)
            .sum()
    }
    /// The tasks `t` waits for.
    pub fn preds(&self, t: usize) -> &[u32] {
        match self.wait[t] {
            NO_COUNTER => &[],
            c => self.counters.row(c as usize),
        }
    }
    /// Rebuilds `signals` and `waiters` from `wait` and `counters` (after editing them).
    pub fn rebuild_reverse(&mut self) {
        self.signals = self.counters.transpose_into(self.len());
        let pairs: Vec<(u32, u32)> = self
            .wait
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != NO_COUNTER)
            .map(|(t, &c)| (c, t as u32))
            .collect();
        self.waiters = Csr::from_pairs(self.counters.len(), &pairs);
    }
    pub fn engine(&self, tf: &Taskflow, t: usize) -> Engine {
        tf.nodes[self.node[t] as usize].engine
    }
    /// The chunk of every dimension of a task's tile.
    pub fn chunks(&self, t: usize) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.chunks_into(t, &mut out);
        out
    }
    /// [`TaskGraph::chunks`] into a reused buffer.
    pub fn chunks_into(&self, t: usize, out: &mut Vec<Chunk>) {
        let n = &self.nodes[self.node[t] as usize];
        let rt = &n.per_rank[self.rank[t] as usize];
        let mut rem = self.tile[t] as usize;
        out.clear();
        out.resize(rt.chunks.len(), Chunk { lo: 0, hi: 0, group: 0 });
        for d in (0..rt.chunks.len()).rev() {
            let k = rt.chunks[d].len();
            out[d] = rt.chunks[d][rem % k];
            rem /= k;
        }
    }
    /// Memory the graph holds (task arrays, edges, tilings), in bytes.
    pub fn resident_bytes(&self) -> usize {
        let per_task = 4 * 3 + 4 * 4;
        let tiles: usize = self
            .nodes
            .iter()
            .flat_map(|n| n.per_rank.iter())
            .map(|r| {
                r.chunks
                    .iter()
                    .map(|c| c.len() * std::mem::size_of::<Chunk>())
                    .sum::<usize>()
            })
            .sum();
        self.len() * (per_task + 4)
            + (self.counters.off.len() + self.signals.off.len() + self.waiters.off.len()) * 4
            + (self.counters.idx.len() + self.signals.idx.len() + self.waiters.idx.len()) * 4
            + tiles
    }
}

/// Materialises the routings a taskflow uses.
pub fn layouts(program: &Program, static_capacity: bool) -> Result<Layouts, Diagnostic> {
    let mut out: Vec<Option<RouteLayout>> = Vec::new();
    for spec in &program.routes {
        // A view is made from the routing it views, with an exact window under every
        // policy (its rows are the routing's own, never padded).
        if let Some(of) = spec.kind.derived_from() {
            let made = match (&spec.kind, out.get(of.0 as usize).and_then(|l| l.as_ref())) {
                (_, None) => None,
                (ir::RouteKind::ByRank { .. }, Some(p)) => Some(p.routing.by_rank()),
                (_, Some(p)) => {
                    let base = program.routes[of.0 as usize]
                        .kind
                        .derived_from()
                        .and_then(|b| out.get(b.0 as usize).and_then(|l| l.as_ref()));
                    base.map(|b| p.checked_fanout(spec, &b.routing))
                        .transpose()
                        .map_err(|e| {
                            Diagnostic::error(Code::LimitExceeded, format!("routing `{}`: {e}", spec.name))
                                .primary(spec.span, "too large to materialise")
                                .help("use fewer tokens, ranks or experts")
                        })?
                }
            };
            out.push(made.map(|r| RouteLayout::new(r, false)));
            continue;
        }
        if spec.tokens == 0 {
            out.push(None);
            continue;
        }
        // A static layout pads every segment: sized before the routing is generated.
        layout::check_size(spec.ranks, spec.tokens, spec.topk, spec.experts, static_capacity).map_err(|e| {
            Diagnostic::error(Code::LimitExceeded, format!("routing `{}`: {e}", spec.name))
                .primary(spec.span, "too large to materialise")
                .help("use fewer tokens, ranks or experts, or exact capacity")
        })?;
        let r = Routing::generate(spec).map_err(|e| {
            Diagnostic::error(Code::BadRouting, format!("routing `{}`: {e}", spec.name))
                .primary(spec.span, "cannot be generated")
        })?;
        out.push(Some(RouteLayout::new(r, static_capacity)));
    }
    Ok(std::sync::Arc::new(out))
}

/// The task dimensions of a call: the free variables of its statements by name, in order of
/// first appearance; the (token, choice) pair of a sending put forms one `Send` dimension.
fn task_dims(node: &ir::Node, opts: &LowerOptions, tf: &Taskflow) -> Vec<TileDim> {
    let retile = opts.retile;
    let body = &node.body;
    let mut dims: Vec<TileDim> = Vec::new();
    let tile_of = |name: &str| node.tile.iter().find(|(n, _)| n == name).map_or(u64::MAX, |(_, s)| *s);
    for st in &body.stmts {
        if let Target::Put {
            rank:
                ir::Index::Route {
                    route,
                    func: ir::RouteFn::Rank,
                    args,
                },
            ..
        } = &st.target
        {
            let (t, j) = (&body.vars[args[0]].name, &body.vars[args[1]].name);
            if !dims.iter().any(|d| d.name == *t) {
                dims.push(TileDim {
                    name: t.clone(),
                    kind: DimKind::Send {
                        route: *route,
                        token: t.clone(),
                        choice: j.clone(),
                    },
                    tile: tile_of(t),
                    parts: 0,
                    by_source: false,
                });
            }
        }
        for &v in &st.vars {
            let var = &body.vars[v];
            if matches!(var.kind, VarKind::Reduce) {
                continue;
            }
            if dims
                .iter()
                .any(|d| d.name == var.name || matches!(&d.kind, DimKind::Send { choice, .. } if *choice == var.name))
            {
                if let Some(d) = dims.iter_mut().find(|d| d.name == var.name) {
                    if let (DimKind::Range { lo, hi }, VarRange::Fixed { lo: a, hi: b }) = (&mut d.kind, var.range) {
                        *lo = (*lo).min(a);
                        *hi = (*hi).max(b);
                    }
                }
                continue;
            }
            let kind = match var.range {
                VarRange::Fixed { lo, hi } => DimKind::Range { lo, hi },
                VarRange::Recv(r) => DimKind::Recv(r),
                VarRange::GroupRows { route, .. } => DimKind::Recv(route),
            };
            dims.push(TileDim {
                name: var.name.clone(),
                kind,
                tile: tile_of(&var.name),
                parts: 0,
                by_source: false,
            });
        }
    }
    if let Retile::ExpertLevel { aic_cores } = retile {
        let op_is_comm = tf.tensor(node.output).home == ir::Home::Window;
        if op_is_comm {
            for d in &mut dims {
                if matches!(d.kind, DimKind::Send { .. } | DimKind::Recv(_)) {
                    d.tile = 128;
                } else {
                    d.tile = u64::MAX;
                }
            }
        } else if node.engine == Engine::Aic {
            // One task per cube core per expert: the expert's rows, a slice of the widest
            // column dimension (aligned to 16, the cube's granularity).
            let widest = dims
                .iter()
                .enumerate()
                .filter_map(|(i, d)| match d.kind {
                    DimKind::Range { lo, hi } if i > 0 => Some((i, hi - lo)),
                    _ => None,
                })
                .max_by_key(|&(i, w)| (w, std::cmp::Reverse(i)));
            // A leading dimension over experts (the `g` of `out[g, ..] = sum(m in group(g))`)
            // is cut one expert per task; a dense product (a shared expert) is one "expert".
            let by_expert = |name: &str| {
                body.vars
                    .iter()
                    .any(|v| matches!(v.range, VarRange::GroupRows { group, .. } if body.vars[group].name == name))
            };
            for (i, d) in dims.iter_mut().enumerate() {
                d.tile = u64::MAX;
                if widest.is_some_and(|(w, _)| w == i) {
                    d.parts = aic_cores.max(1);
                } else if i == 0 && matches!(d.kind, DimKind::Range { .. }) && by_expert(&d.name) {
                    d.tile = 1;
                }
            }
        } else {
            for (i, d) in dims.iter_mut().enumerate() {
                d.tile = if i == 0 { 128 } else { u64::MAX };
            }
        }
    }
    let split = match opts.dest_tiles {
        DestTiles::None => false,
        DestTiles::Ordered => node.order.iter().any(|o| o == "ratr"),
        DestTiles::All => true,
    };
    if split && puts_to_sources(node) {
        for d in &mut dims {
            if matches!(d.kind, DimKind::Recv(_)) {
                d.by_source = true;
            }
        }
    }
    // Kept with the graph, one list per call: no spare room.
    dims.shrink_to_fit();
    dims
}

/// Whether a call sends received rows back to their source ranks (`put out @ r.src_rank(m)`).
pub fn puts_to_sources(node: &ir::Node) -> bool {
    node.body.stmts.iter().any(|st| {
        matches!(
            &st.target,
            Target::Put {
                rank: ir::Index::Route {
                    func: ir::RouteFn::SrcRank,
                    ..
                },
                ..
            }
        )
    })
}

/// How many chunks [`dim_chunks`] makes of one dimension on one rank (at most: a split into
/// parts may merge empty ones), computed without making them.
fn dim_chunk_count(d: &TileDim, rank: usize, layouts: &[Option<RouteLayout>]) -> u64 {
    let t = u128::from(d.tile.max(1));
    let split = |lo: i64, hi: i64| -> u64 {
        let n = (i128::from(hi) - i128::from(lo)).max(0) as u128;
        u64::try_from(n.div_ceil(t)).unwrap_or(u64::MAX)
    };
    match &d.kind {
        DimKind::Range { lo, hi } if d.parts > 0 => {
            let units = ((i128::from(*hi) - i128::from(*lo)).max(0) as u128).div_ceil(16);
            u128::from(d.parts).min(units.max(1)) as u64
        }
        DimKind::Range { lo, hi } => split(*lo, *hi),
        DimKind::Recv(r) if d.by_source => layouts.get(r.0 as usize).and_then(|x| x.as_ref()).map_or(0, |l| {
            (0..l.group_off[rank].len().saturating_sub(1)).fold(0u64, |a, g| {
                l.source_segments(rank, g)
                    .iter()
                    .fold(a, |a, s| a.saturating_add(split(i64::from(s.lo), i64::from(s.hi))))
            })
        }),
        DimKind::Recv(r) => layouts.get(r.0 as usize).and_then(|x| x.as_ref()).map_or(0, |l| {
            l.group_off[rank]
                .windows(2)
                .fold(0u64, |a, w| a.saturating_add(split(w[0] as i64, w[1] as i64)))
        }),
        DimKind::Send { route, .. } => layouts.get(route.0 as usize).and_then(|x| x.as_ref()).map_or(0, |l| {
            l.send_off[rank].windows(2).fold(0u64, |a, w| {
                a.saturating_add(if l.static_capacity {
                    split(0, l.segment_capacity() as i64)
                } else {
                    split(w[0] as i64, w[1] as i64)
                })
            })
        }),
    }
}

/// The chunks of one dimension on one rank.
fn dim_chunks(d: &TileDim, rank: usize, layouts: &[Option<RouteLayout>]) -> Vec<Chunk> {
    let t = d.tile.max(1);
    let split = |lo: i64, hi: i64, group: u32, out: &mut Vec<Chunk>| {
        let mut a = lo;
        while a < hi {
            let b = if t >= (hi - a) as u64 { hi } else { a + t as i64 };
            out.push(Chunk { lo: a, hi: b, group });
            a = b;
        }
    };
    let mut out = Vec::new();
    match &d.kind {
        DimKind::Range { lo, hi } if d.parts > 0 => {
            let units = ((hi - lo) + 15) / 16;
            let k = (d.parts as i64).min(units.max(1));
            let mut prev = *lo;
            for i in 1..=k {
                let b = if i == k {
                    *hi
                } else {
                    (lo + (units * i / k) * 16).min(*hi)
                };
                if b > prev {
                    out.push(Chunk {
                        lo: prev,
                        hi: b,
                        group: 0,
                    });
                    prev = b;
                }
            }
        }
        DimKind::Range { lo, hi } => split(*lo, *hi, 0, &mut out),
        DimKind::Recv(r) => {
            if let Some(l) = layouts.get(r.0 as usize).and_then(|x| x.as_ref()) {
                let off = &l.group_off[rank];
                for g in 0..off.len() - 1 {
                    if d.by_source {
                        for s in l.source_segments(rank, g) {
                            split(i64::from(s.lo), i64::from(s.hi), g as u32, &mut out);
                        }
                    } else {
                        split(off[g] as i64, off[g + 1] as i64, g as u32, &mut out);
                    }
                }
            }
        }
        DimKind::Send { route, .. } => {
            if let Some(l) = layouts.get(route.0 as usize).and_then(|x| x.as_ref()) {
                let off = &l.send_off[rank];
                for e in 0..off.len() - 1 {
                    if l.static_capacity {
                        // Positions 0..tokens of the (expert, source) segment, padding included.
                        split(0, l.segment_capacity() as i64, e as u32, &mut out);
                    } else {
                        split(off[e] as i64, off[e + 1] as i64, e as u32, &mut out);
                    }
                }
            }
        }
    }
    // Kept with the graph, one list per dimension of each call on each rank: no spare room
    // (a list of one chunk would hold four).
    out.shrink_to_fit();
    out
}

/// The memory a taskflow's compilation and simulation is expected to need, estimated from
/// its tilings and routings before anything large is allocated (see [`MAX_MEMORY`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The tasks estimated: at least the tasks lowered (a call's chunk count where that is
    /// larger).
    pub tasks: u64,
    /// Tasks (at [`BYTES_PER_TASK`]), calls (at [`BYTES_PER_CALL`]), chunks, and the rows put
    /// back to their sources (at [`BYTES_PER_PUT_BACK_ROW`]): what each compiled graph holds
    /// on its own.
    pub graph: u64,
    /// The routing layouts, which every graph of one capacity mode shares.
    pub layouts: u64,
}

impl MemoryEstimate {
    /// Both parts.
    pub fn total(&self) -> u64 {
        self.graph.saturating_add(self.layouts)
    }
}

/// The tilings of a taskflow's calls and their memory estimate; the task limit (E-code
/// `LimitExceeded`) checked first.
struct Plan {
    tilings: Vec<Vec<TileDim>>,
    memory: MemoryEstimate,
}

/// Tiles every call on every rank and estimates the tasks and memory, without making chunks.
fn plan(
    program: &Program,
    tf: &Taskflow,
    layouts: &[Option<RouteLayout>],
    opts: &LowerOptions,
) -> Result<Plan, Diagnostic> {
    let ranks = program.device.ranks() as usize;
    // Tasks and chunks are counted for every call and rank before any chunk is made, so a
    // program over the limit is refused with the whole estimate and allocates nothing large.
    let mut tilings = Vec::with_capacity(tf.nodes.len());
    let mut estimate: u64 = 0;
    let mut chunk_total: u64 = 0;
    let mut first_over: Option<(&ir::Node, u64)> = None;
    for node in &tf.nodes {
        let dims = task_dims(node, opts, tf);
        let mut node_est: u64 = 0;
        for r in 0..ranks {
            let mut tasks = 1u64;
            let mut chunks = 0u64;
            for d in &dims {
                let c = dim_chunk_count(d, r, layouts);
                tasks = tasks.saturating_mul(c);
                chunks = chunks.saturating_add(c);
            }
            // A chunk costs about as much as a task: both count against the limit.
            node_est = node_est.saturating_add(tasks.max(chunks));
            chunk_total = chunk_total.saturating_add(chunks);
        }
        estimate = estimate.saturating_add(node_est);
        // Task ids are 32-bit: no limit goes past them.
        if estimate > opts.max_tasks.min(u64::from(u32::MAX)) && first_over.is_none() {
            first_over = Some((node, node_est));
        }
        tilings.push(dims);
    }
    if let Some((node, node_est)) = first_over {
        let op = &program.op(node.op).name;
        let shown = |n: u64| {
            if n == u64::MAX {
                "more than 2^64".to_string()
            } else {
                n.to_string()
            }
        };
        return Err(Diagnostic::error(
            Code::LimitExceeded,
            format!(
                "`{}` would lower to {} tasks, more than {} tasks (the limit)",
                tf.name,
                shown(estimate),
                opts.max_tasks.min(u64::from(u32::MAX))
            ),
        )
        .primary(node.span, format!("{} tasks from this call ({op})", shown(node_est)))
        .help("use larger tiles, fewer ranks, or raise the limit with `--max-tasks N`"));
    }
    // Memory, from the same estimate: tasks, chunks and the routing layouts already built.
    let layout_bytes: u64 = layouts.iter().flatten().map(|l| l.resident_bytes() as u64).sum();
    let chunk_bytes = chunk_total.saturating_mul(std::mem::size_of::<Chunk>() as u64);
    let put_back: u64 = tf.nodes.iter().map(|node| put_back_rows(node, layouts)).sum();
    let calls = tf.nodes.len() as u64;
    let call_bytes = calls.saturating_mul(BYTES_PER_CALL);
    let memory = MemoryEstimate {
        tasks: estimate,
        graph: estimate
            .saturating_mul(BYTES_PER_TASK)
            .saturating_add(call_bytes)
            .saturating_add(chunk_bytes)
            .saturating_add(put_back.saturating_mul(BYTES_PER_PUT_BACK_ROW)),
        layouts: layout_bytes,
    };
    let need = memory.total();
    if need > MAX_MEMORY {
        return Err(memory_exceeded(tf, estimate, None, need, put_back));
    }
    Ok(Plan { tilings, memory })
}

/// The rows a call puts back to their source ranks (`put out @ r.src_rank(m)`), over all
/// ranks: each is one write of its own. Several such puts in one body count the most rows of
/// any (a put that is never evaluated writes nothing).
fn put_back_rows(node: &ir::Node, layouts: &[Option<RouteLayout>]) -> u64 {
    node.body
        .stmts
        .iter()
        .filter_map(|st| match &st.target {
            Target::Put {
                rank:
                    ir::Index::Route {
                        route,
                        func: ir::RouteFn::SrcRank,
                        ..
                    },
                ..
            } => layouts.get(route.0 as usize)?.as_ref(),
            _ => None,
        })
        .map(|l| l.send.iter().map(|s| s.len() as u64).sum::<u64>())
        .max()
        .unwrap_or(0)
}

/// The memory `tf` is expected to need when lowered with `opts` (the estimate [`lower`]
/// holds to [`MAX_MEMORY`]), or the diagnostic [`lower`] would give for it.
pub fn memory_estimate(
    program: &Program,
    tf: &Taskflow,
    layouts: &[Option<RouteLayout>],
    opts: &LowerOptions,
) -> Result<MemoryEstimate, Diagnostic> {
    plan(program, tf, layouts, opts).map(|p| p.memory)
}

/// Lowers one taskflow.
pub fn lower(program: &Program, tf: &Taskflow, layouts: Layouts, opts: &LowerOptions) -> Result<TaskGraph, Diagnostic> {
    let ranks = program.device.ranks() as usize;
    let Plan { tilings, memory } = plan(program, tf, &layouts, opts)?;
    let need = memory.total();
    // Tilings, and the task count before anything large is allocated.
    let mut nodes = Vec::with_capacity(tf.nodes.len());
    let mut total: u64 = 0;
    // What is left for the dependency edges, counted as they are made.
    let edge_budget = (MAX_MEMORY - need) / BYTES_PER_EDGE;
    for (node, dims) in tf.nodes.iter().zip(tilings) {
        crate::cancel::check();
        let mut per_rank = Vec::with_capacity(ranks);
        let mut base = Vec::with_capacity(ranks);
        let mut node_total: u64 = 0;
        for r in 0..ranks {
            let chunks: Vec<Vec<Chunk>> = dims.iter().map(|d| dim_chunks(d, r, &layouts)).collect();
            let count = chunks
                .iter()
                .try_fold(1u64, |a, c| a.checked_mul(c.len() as u64))
                .unwrap_or(u64::MAX);
            node_total = node_total.saturating_add(count);
            if total.saturating_add(node_total) > opts.max_tasks {
                let op = &program.op(node.op).name;
                return Err(Diagnostic::error(
                    Code::LimitExceeded,
                    format!(
                        "`{}` ({op}) would lower to more than {} tasks",
                        node.name, opts.max_tasks
                    ),
                )
                .primary(node.span, format!("at least {} tasks from this call", node_total))
                .help("use larger tiles, fewer ranks, or raise the limit with `--max-tasks N`"));
            }
            base.push((total + node_total - count) as u32);
            per_rank.push(RankTiles {
                chunks,
                count: count as u32,
            });
        }
        total += node_total;
        nodes.push(NodeTiles { dims, per_rank, base });
    }
    let n = total as usize;
    let mut g = TaskGraph {
        uid: next_graph_uid(),
        taskflow: tf.name.clone(),
        ranks: ranks as u32,
        layouts,
        nodes,
        rank: Vec::with_capacity(n),
        node: Vec::with_capacity(n),
        tile: Vec::with_capacity(n),
        flops: Vec::new(),
        bytes_in: Vec::new(),
        bytes_out: Vec::new(),
        remote: Vec::new(),
        wait: Vec::with_capacity(n),
        counters: Csr::default(),
        counter_rank: Vec::new(),
        signals: Csr::default(),
        waiters: Csr::default(),
    };
    for (ni, nt) in g.nodes.iter().enumerate() {
        for (r, rt) in nt.per_rank.iter().enumerate() {
            for i in 0..rt.count {
                g.rank.push(r as u32);
                g.node.push(ni as u32);
                g.tile.push(i);
            }
        }
    }
    // Costs and dependencies from the regions.
    let mut index = regions::WriterIndex::new(tf, ranks);
    let mut interner = CounterInterner::default();
    // Only writes of tensors some call reads are ever looked up: index those alone.
    let mut is_read = tf.tensors_read();
    // A call routing through a router the taskflow gates waits for the whole gate tensor on
    // its rank: the routing exists only once the logits do.
    let gates: Vec<Vec<(crate::ir::TensorId, [u64; 2])>> =
        (0..tf.nodes.len()).map(|ni| program.gate_reads(tf, ni)).collect();
    for &(z, _) in gates.iter().flatten() {
        if let Some(x) = is_read.get_mut(z.0 as usize) {
            *x = true;
        }
    }
    let cx = SegmentCx {
        program,
        tf,
        is_read: &is_read,
        gates: &gates,
    };
    // A deliberate corruption of the regions is the starting thread's, whichever thread
    // works a task out.
    #[cfg(feature = "fault-injection")]
    let fault = regions::fault::current();
    // One worker per thread of the pool the segments run on, each on cache lines of its own.
    let workers: Vec<Padded<std::sync::Mutex<Worker>>> = (0..rayon::current_num_threads().max(1))
        .map(|_| Padded(std::sync::Mutex::new(Worker::default())))
        .collect();
    // The costs are written in place by the threads, each into its own tasks' entries.
    let mut costs: [Vec<f32>; 4] = std::array::from_fn(|_| vec![0.0; n]);
    // Call by call: the tiles of a call on each rank are worked out side by side (their
    // regions, costs and producers read only the writes of earlier calls), then joined in
    // task order: counters interned, writes indexed.
    for ni in 0..tf.nodes.len() {
        crate::cancel::check();
        index.sort_all();
        // Each rank's tiles, in pieces small enough that the threads share the call's work
        // evenly (about eight pieces a thread), but not smaller than `SEGMENT_TASKS` (a
        // piece remembers its producers anew).
        let node_tasks: u64 = g.nodes[ni].per_rank.iter().map(|rt| u64::from(rt.count)).sum();
        let piece =
            (node_tasks / (8 * workers.len() as u64)).clamp(u64::from(SEGMENT_TASKS), u64::from(u32::MAX)) as u32;
        let segments: Vec<(u32, u32)> = (g.nodes[ni].per_rank.iter().enumerate())
            .flat_map(|(r, rt)| {
                let base = g.nodes[ni].base[r];
                (0..rt.count)
                    .step_by(piece as usize)
                    .map(move |i| (base + i, (rt.count - i).min(piece)))
            })
            .collect();
        let outs: Vec<Segment> = {
            use rayon::prelude::*;
            let (g, index) = (&g, &index);
            // Each segment's entries of the four cost arrays (segments are consecutive).
            let mut places: Vec<[&mut [f32]; 4]> = Vec::with_capacity(segments.len());
            let from = segments.first().map_or(0, |s| s.0 as usize);
            let mut rest: [&mut [f32]; 4] = costs.each_mut().map(|c| &mut c[from..]);
            for &(_, count) in &segments {
                let mut here: [&mut [f32]; 4] = Default::default();
                for (h, r) in here.iter_mut().zip(rest.iter_mut()) {
                    (*h, *r) = std::mem::take(r).split_at_mut(count as usize);
                }
                places.push(here);
            }
            let work = |(&(first, count), place): (&(u32, u32), [&mut [f32]; 4])| {
                // This thread's worker (its scratch space keeps each call's plan).
                let i = rayon::current_thread_index().unwrap_or(0) % workers.len();
                let mut w = workers[i].0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                #[cfg(feature = "fault-injection")]
                let before = regions::fault::current();
                #[cfg(feature = "fault-injection")]
                regions::fault::inject(fault);
                let out = w.segment(&cx, g, index, first, count, place);
                #[cfg(feature = "fault-injection")]
                regions::fault::inject(before);
                out
            };
            // A call of a few tiles is worked out on this thread: waking the pool's threads
            // for it cost more than its work (a graph of many small calls spent most of its
            // lowering in the threads' hand-offs).
            if node_tasks < 2 * u64::from(SEGMENT_TASKS) {
                segments.iter().zip(places).map(work).collect()
            } else {
                segments.par_iter().zip(places).map(work).collect()
            }
        };
        for (&(first, _), out) in segments.iter().zip(outs) {
            let rank = g.rank[first as usize];
            let mut global: Vec<u32> = vec![NO_COUNTER; out.sets.len()];
            let mut seen = vec![false; out.sets.len()];
            for (i, &set) in out.set.iter().enumerate() {
                let t = first as usize + i;
                let s = set as usize;
                let edges = out.sets.row(s).len();
                if (interner.idx.len() + edges) as u64 > edge_budget {
                    let edges = (interner.idx.len() + edges) as u64;
                    return Err(memory_exceeded(tf, total, Some((edges, t as u64)), MAX_MEMORY + 1, 0));
                }
                // A set's first task interns its producers; the call's later tasks with the
                // same set share the counter.
                if !seen[s] {
                    seen[s] = true;
                    let preds = out.sets.row(s);
                    global[s] = if preds.is_empty() {
                        NO_COUNTER
                    } else {
                        interner.intern(rank, preds)
                    };
                }
                g.wait.push(global[s]);
            }
            // Writes are visible to later calls; tasks of one call never read its own output
            // and calls are in topological order, so adding them after the call is the same.
            index.append(out.writes);
        }
    }
    [g.flops, g.bytes_in, g.bytes_out, g.remote] = costs;
    (g.counters, g.counter_rank) = interner.finish();
    g.rebuild_reverse();
    Ok(g)
}

/// The refusal of a taskflow whose graph would not fit [`MAX_MEMORY`]: with the task count,
/// the edges made so far (when lowering had started) and the estimate.
fn memory_exceeded(tf: &Taskflow, tasks: u64, edges: Option<(u64, u64)>, need: u64, put_back: u64) -> Diagnostic {
    let mib = |b: u64| b.div_ceil(1 << 20);
    let rows = if put_back > 0 {
        format!(", {put_back} rows put back to their sources at {BYTES_PER_PUT_BACK_ROW} bytes")
    } else {
        String::new()
    };
    let calls = tf.nodes.len();
    let message = match edges {
        None => format!(
            "`{}` would need about {} MiB to compile and simulate ({tasks} tasks at {BYTES_PER_TASK} bytes, {calls} calls at {BYTES_PER_CALL} bytes{rows}, tilings and routings), more than the {} MiB allowed",
            tf.name,
            mib(need),
            mib(MAX_MEMORY)
        ),
        Some((e, at)) => format!(
            "`{}` has {e} dependency edges after {at} of its {tasks} tasks: with them the graph would need more than the {} MiB allowed",
            tf.name,
            mib(MAX_MEMORY)
        ),
    };
    Diagnostic::error(Code::LimitExceeded, message)
        .primary(tf.span, "this taskflow")
        .help("use larger tiles, fewer ranks, fewer tokens or fewer calls")
}

/// What every call's tiles share while they are worked out.
struct SegmentCx<'a> {
    program: &'a Program,
    tf: &'a Taskflow,
    /// Whether some call reads a tensor (only those writes are indexed).
    is_read: &'a [bool],
    /// Per call, the gate tensors (and shapes) it waits for whole.
    gates: &'a [Vec<(crate::ir::TensorId, [u64; 2])>],
}

/// The tiles of one call on one rank, worked out.
#[derive(Default)]
struct Segment {
    /// Per task: its set of producers in `sets`.
    set: Vec<u32>,
    /// The distinct sets of writer lists the tasks read, in order of first use, each as its
    /// producers (sorted, without repeats; empty for none).
    sets: Csr,
    /// The writes to index, in task order.
    writes: regions::RecordRuns,
}

/// The fewest tasks of one call and rank worked out at once by one thread (unless the rank
/// has fewer).
const SEGMENT_TASKS: u32 = 1024;

/// A value alone on its cache lines (two threads writing next to each other slow both).
#[repr(align(128))]
struct Padded<T>(T);

/// One thread's scratch space for working out segments.
#[derive(Default)]
struct Worker {
    acc: regions::Scratch,
    deps: DepMemo,
    gate_regions: Vec<Region>,
}

impl Worker {
    /// Works out tasks `first..first + count` (one call on one rank) against the writes of
    /// the calls before; their costs go to `costs` (flops, bytes in, bytes out, remote
    /// bytes; `count` entries each).
    fn segment(
        &mut self,
        cx: &SegmentCx<'_>,
        g: &TaskGraph,
        index: &regions::WriterIndex,
        first: u32,
        count: u32,
        costs: [&mut [f32]; 4],
    ) -> Segment {
        let mut out = Segment {
            set: Vec::with_capacity(count as usize),
            // About one write per task, mostly on the task's rank.
            writes: regions::RecordRuns::with_room(count as usize),
            ..Segment::default()
        };
        // The memo's sets are this segment's: it starts anew, even for the same call and rank.
        let deps = &mut self.deps;
        deps.reset();
        let [flops, bytes_in, bytes_out, remote] = costs;
        for (i, t) in (first as usize..(first + count) as usize).enumerate() {
            let access = regions::tile_access(cx.program, cx.tf, g, t, &mut self.acc);
            flops[i] = access.flops as f32;
            bytes_in[i] = access.bytes_in as f32;
            bytes_out[i] = access.bytes_out as f32;
            remote[i] = access.remote as f32;
            self.gate_regions.clear();
            self.gate_regions.extend(
                cx.gates[g.node[t] as usize]
                    .iter()
                    .map(|&(z, shape)| Region::whole(z, g.rank[t], &shape)),
            );
            deps.keys.clear();
            for rd in access.reads.iter().chain(&self.gate_regions) {
                if cx.tf.tensor(rd.tensor).producer.is_none() {
                    continue;
                }
                let list = deps.writers_of(rd, index);
                deps.keys.push(list);
            }
            // The producers are the union of the read regions' writer lists: the same lists
            // give the same set.
            deps.keys.sort_unstable();
            deps.keys.dedup();
            let set = match deps.known() {
                Some(set) => set,
                None => {
                    let set = out.sets.push_row(deps.union());
                    deps.remember(set);
                    set
                }
            };
            out.set.push(set);
            for w in &access.writes {
                if cx.is_read.get(w.tensor.0 as usize) == Some(&true) {
                    out.writes.push(index, w, t as u32);
                }
            }
        }
        out
    }
}

/// The producers of the tasks of one call on one rank, remembered across its tiles: the
/// writers of every region read (sorted, without repeats, one list per distinct content) and
/// the counter of every set of such lists.
#[derive(Default)]
struct DepMemo {
    /// Read region (without its accumulation flag) -> writer list.
    by_region: rustc_hash::FxHashMap<Region, u32>,
    /// The region looked up last, and its list.
    last_region: Option<(Region, u32)>,
    /// Writer list `i` is `arena[off[i]..off[i + 1]]`.
    off: Vec<u32>,
    arena: Vec<u32>,
    /// Writer lists by the hash of their content.
    by_content: rustc_hash::FxHashMap<u64, Vec<u32>>,
    /// The current task's writer lists, sorted, without repeats.
    keys: Vec<u32>,
    /// The segment's set (see [`Segment::sets`]) by set of writer lists.
    by_keys: rustc_hash::FxHashMap<Vec<u32>, u32>,
    /// The set of writer lists looked up or remembered last, and its set.
    last_keys: Vec<u32>,
    last_set: Option<u32>,
    /// Union of several lists.
    preds: Vec<u32>,
}

impl DepMemo {
    /// Forgets everything remembered (a new segment's tiles follow).
    fn reset(&mut self) {
        self.by_region.clear();
        self.last_region = None;
        self.off.clear();
        self.off.push(0);
        self.arena.clear();
        self.by_content.clear();
        self.by_keys.clear();
        self.last_keys.clear();
        self.last_set = None;
    }

    fn list(&self, i: u32) -> &[u32] {
        let i = i as usize;
        match (self.off.get(i), self.off.get(i + 1)) {
            (Some(&a), Some(&b)) => self.arena.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The writer list of region `rd`.
    fn writers_of(&mut self, rd: &Region, index: &regions::WriterIndex) -> u32 {
        use std::hash::{Hash, Hasher};
        let mut probe = *rd;
        probe.accumulate = false;
        // Consecutive tiles often read the same region (tiles of other columns).
        if let Some((r, l)) = &self.last_region {
            if *r == probe {
                return *l;
            }
        }
        if let Some(&l) = self.by_region.get(&probe) {
            self.last_region = Some((probe, l));
            return l;
        }
        let a = self.arena.len();
        index.writers(rd, &mut |w| self.arena.push(w));
        self.arena[a..].sort_unstable();
        let mut end = a;
        for i in a..self.arena.len() {
            if end == a || self.arena[i] != self.arena[end - 1] {
                self.arena[end] = self.arena[i];
                end += 1;
            }
        }
        self.arena.truncate(end);
        let mut h = rustc_hash::FxHasher::default();
        self.arena[a..].hash(&mut h);
        let key = h.finish();
        let same = self
            .by_content
            .get(&key)
            .and_then(|ids| ids.iter().copied().find(|&id| self.list(id) == &self.arena[a..]));
        let l = match same {
            Some(id) => {
                self.arena.truncate(a);
                id
            }
            None => {
                let id = (self.off.len() - 1) as u32;
                self.off.push(self.arena.len() as u32);
                self.by_content.entry(key).or_default().push(id);
                id
            }
        };
        self.by_region.insert(probe, l);
        self.last_region = Some((probe, l));
        l
    }

    /// The set of the current task's lists, if a task had them.
    fn known(&mut self) -> Option<u32> {
        if self.last_set.is_some() && self.last_keys == self.keys {
            return self.last_set;
        }
        let c = self.by_keys.get(self.keys.as_slice()).copied()?;
        self.last_keys.clone_from(&self.keys);
        self.last_set = Some(c);
        Some(c)
    }

    /// The union of the current task's lists: its producers, sorted, without repeats.
    fn union(&mut self) -> &[u32] {
        if let [one] = self.keys[..] {
            return self.list(one);
        }
        let mut preds = std::mem::take(&mut self.preds);
        preds.clear();
        for &k in &self.keys {
            preds.extend_from_slice(self.list(k));
        }
        preds.sort_unstable();
        preds.dedup();
        self.preds = preds;
        &self.preds
    }

    /// Remembers the set of the current task's lists.
    fn remember(&mut self, set: u32) {
        self.by_keys.insert(self.keys.clone(), set);
        self.last_keys.clone_from(&self.keys);
        self.last_set = Some(set);
    }
}

/// Shares one counter among consumers with the same producers.
#[derive(Default)]
struct CounterInterner {
    by_hash: rustc_hash::FxHashMap<u64, Vec<u32>>,
    rank: Vec<u32>,
    off: Vec<u32>,
    idx: Vec<u32>,
    /// The counter interned last.
    last: Option<u32>,
}

impl CounterInterner {
    fn intern(&mut self, rank: u32, preds: &[u32]) -> u32 {
        use std::hash::{Hash, Hasher};
        // Consecutive tasks often share their producers.
        if let Some(c) = self.last {
            let (a, b) = (self.off[c as usize] as usize, self.off[c as usize + 1] as usize);
            if self.rank[c as usize] == rank && self.idx[a..b] == *preds {
                return c;
            }
        }
        let mut h = rustc_hash::FxHasher::default();
        rank.hash(&mut h);
        preds.hash(&mut h);
        let key = h.finish();
        if self.off.is_empty() {
            self.off.push(0);
        }
        if let Some(ids) = self.by_hash.get(&key) {
            for &c in ids {
                let (a, b) = (self.off[c as usize] as usize, self.off[c as usize + 1] as usize);
                if self.rank[c as usize] == rank && self.idx[a..b] == *preds {
                    self.last = Some(c);
                    return c;
                }
            }
        }
        let c = (self.off.len() - 1) as u32;
        self.rank.push(rank);
        self.idx.extend_from_slice(preds);
        self.off.push(self.idx.len() as u32);
        self.by_hash.entry(key).or_default().push(c);
        self.last = Some(c);
        c
    }
    fn finish(mut self) -> (Csr, Vec<u32>) {
        if self.off.is_empty() {
            self.off.push(0);
        }
        (
            Csr {
                off: self.off,
                idx: self.idx,
            },
            self.rank,
        )
    }
}

/// Tasks per (op call), for summaries: `(node name, op name, engine, count)`.
pub fn counts_per_node(program: &Program, tf: &Taskflow, g: &TaskGraph) -> Vec<(String, String, Engine, u64)> {
    tf.nodes
        .iter()
        .zip(&g.nodes)
        .map(|(n, nt)| {
            (
                n.name.clone(),
                program.op(n.op).name.clone(),
                n.engine,
                nt.per_rank.iter().map(|r| r.count as u64).sum(),
            )
        })
        .collect()
}

/// Whether a dimension is ragged (for dumps).
pub fn is_ragged(d: &Dim) -> bool {
    matches!(d, Dim::Recv(_))
}
