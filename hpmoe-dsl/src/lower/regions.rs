//! The regions a task reads and writes, its cost, and the index of writers through which
//! dependencies are found.
//!
//! In: a task of a [`TaskGraph`] (its call, rank and tile) and the checked taskflow. Out:
//! [`TileRanges`] (the values of the body's variables in the tile), [`Access`] (regions read
//! and written, cost), computed into reused [`Scratch`] buffers without allocating per task.
//! What every tile of a call shares — where each body variable's values come from (a chunk
//! of a task dimension, a fixed range, the window, the rows sent) and each statement's tensor
//! accesses — is read from the body once per call (`CallPlan`); a tile then only fills in
//! its chunks, advanced from the previous tile's when tiles come in order.
//! [`WriterIndex`] keeps, per tensor and rank, flat write records (bounds and task) and
//! answers which writes overlap a region; a list is sorted by (first-dimension start, task)
//! on its first query, and not at all when its records arrived in that order; a run of at
//! least [`RUN_MIN`] records with one first-dimension start (a row of many column tiles) is
//! also kept by second-dimension start, searched instead of scanned, and its overlapping
//! records visited in the list's order.

use super::{Chunk, DimKind, TaskGraph, NO_SOURCE};
use crate::ir::{ConcreteBody, Index, Program, SExpr, Target, Taskflow, TensorId, VarKind, VarRange};

/// Tensors have at most this many dimensions (the checker enforces it).
pub const MAX_DIMS: usize = 6;

/// A box of a tensor on a rank. Two regions are equal when they agree on the tensor, rank,
/// dimension count, accumulation and the bounds of their `ndim` dimensions (the bounds past
/// `ndim` mean nothing and are neither compared nor hashed).
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub tensor: TensorId,
    pub rank: u32,
    pub ndim: u8,
    pub lo: [i64; MAX_DIMS],
    pub hi: [i64; MAX_DIMS],
    /// A `+=` write (accumulations commute; they do not race with each other).
    pub accumulate: bool,
}

impl PartialEq for Region {
    fn eq(&self, o: &Region) -> bool {
        self.tensor == o.tensor
            && self.rank == o.rank
            && self.ndim == o.ndim
            && self.accumulate == o.accumulate
            && (0..self.dims()).all(|d| self.lo[d] == o.lo[d] && self.hi[d] == o.hi[d])
    }
}

impl Eq for Region {}

impl std::hash::Hash for Region {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.tensor.hash(h);
        h.write_u32(self.rank);
        h.write_u8(self.ndim);
        h.write_u8(self.accumulate as u8);
        for d in 0..self.dims() {
            h.write_i64(self.lo[d]);
            h.write_i64(self.hi[d]);
        }
    }
}

impl Region {
    /// The number of dimensions whose bounds count (`ndim`, never past the arrays).
    fn dims(&self) -> usize {
        (self.ndim as usize).min(MAX_DIMS)
    }

    /// All of a rank's share of a tensor of fixed shape (`shape.len() <= MAX_DIMS`).
    pub fn whole(tensor: TensorId, rank: u32, shape: &[u64]) -> Region {
        let mut r = Region {
            tensor,
            rank,
            ndim: shape.len().min(MAX_DIMS) as u8,
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
            accumulate: false,
        };
        for (h, &n) in r.hi.iter_mut().zip(shape) {
            *h = i64::try_from(n).unwrap_or(i64::MAX);
        }
        r
    }
    pub fn volume(&self) -> u64 {
        (0..self.dims())
            .map(|d| (self.hi[d] - self.lo[d]).max(0) as u64)
            .product()
    }
    pub fn is_empty(&self) -> bool {
        (0..self.dims()).any(|d| self.hi[d] <= self.lo[d])
    }
    pub fn overlaps(&self, o: &Region) -> bool {
        self.tensor == o.tensor
            && self.rank == o.rank
            && (0..self.dims()).all(|d| self.lo[d] < o.hi[d] && o.lo[d] < self.hi[d])
    }
    /// `[a..b, c..d]`.
    pub fn text(&self) -> String {
        let parts: Vec<String> = (0..self.dims())
            .map(|d| format!("{}..{}", self.lo[d], self.hi[d]))
            .collect();
        format!("[{}]", parts.join(", "))
    }
}

/// What one task touches, and its cost.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub reads: Vec<Region>,
    pub writes: Vec<Region>,
    pub flops: f64,
    pub bytes_in: f64,
    pub bytes_out: f64,
    pub remote: f64,
    /// Destination rank of every remote byte when there is a single one.
    pub dest: Option<u32>,
}

/// Reusable buffers.
#[derive(Debug, Default)]
pub struct Scratch {
    access: Access,
    ranges: TileRanges,
    reads_here: Vec<Region>,
}

fn range_of(vr: &[(i64, i64)], v: usize) -> (i64, i64) {
    vr.get(v).copied().unwrap_or((0, 0))
}

/// The interval an index takes over the variables' ranges.
#[inline]
fn index_range(ix: &Index, vr: &[(i64, i64)], group_of: &impl Fn(i64) -> i64, dim_size: i64) -> (i64, i64) {
    match ix {
        Index::Affine { var, coef, offset } => {
            let (lo, hi) = range_of(vr, *var);
            if hi <= lo {
                return (0, 0);
            }
            let a = coef * lo + offset;
            let b = coef * (hi - 1) + offset;
            (a.min(b), a.max(b) + 1)
        }
        Index::Const(c) => (*c, c + 1),
        Index::Group(v) => {
            let (lo, hi) = range_of(vr, *v);
            if hi <= lo {
                return (0, 0);
            }
            (group_of(lo), group_of(hi - 1) + 1)
        }
        // Conservative: the whole dimension.
        Index::Route { .. } => (0, dim_size),
    }
}

/// Operations per evaluation of an expression, with reductions' trip counts.
fn ops(e: &SExpr, vr: &[(i64, i64)]) -> f64 {
    match e {
        SExpr::Const(_) | SExpr::Read { .. } | SExpr::Var(_) | SExpr::Route { .. } => 0.0,
        SExpr::Neg(a) => 1.0 + ops(a, vr),
        SExpr::Bin(_, a, b) => 1.0 + ops(a, vr) + ops(b, vr),
        SExpr::Call(f, args) => f.ops() as f64 + args.iter().map(|a| ops(a, vr)).sum::<f64>(),
        SExpr::Cast(_, a) => 1.0 + ops(a, vr),
        SExpr::Sum { vars, body, .. } => {
            let trips: f64 = vars
                .iter()
                .map(|v| (range_of(vr, *v).1 - range_of(vr, *v).0).max(0) as f64)
                .product();
            trips * (1.0 + ops(body, vr))
        }
    }
}

/// The variables whose ranges [`ops`] reads (those of every reduction), in order.
fn sum_vars(e: &SExpr, out: &mut Vec<usize>) {
    match e {
        SExpr::Const(_) | SExpr::Read { .. } | SExpr::Var(_) | SExpr::Route { .. } => {}
        SExpr::Neg(a) | SExpr::Cast(_, a) => sum_vars(a, out),
        SExpr::Bin(_, a, b) => {
            sum_vars(a, out);
            sum_vars(b, out);
        }
        SExpr::Call(_, args) => args.iter().for_each(|a| sum_vars(a, out)),
        SExpr::Sum { vars, body, .. } => {
            out.extend(vars.iter().copied());
            sum_vars(body, out);
        }
    }
}

/// Where one body variable's values in a tile come from (the same in every tile of a call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VarSource {
    /// The chunk of task dimension `dim`, clipped to `clip` when the variable has a fixed
    /// range.
    Chunk { dim: usize, clip: Option<(i64, i64)> },
    /// The token of the sending dimension `dim` (set from the rows sent).
    Send { dim: usize },
    /// No values of their own (the choice of a sending dimension, set from the rows sent).
    Empty,
    /// Its fixed range.
    Fixed(i64, i64),
    /// The rows of the rank's receive window.
    Recv(crate::ir::RouteId),
    /// The rows of the experts another variable (`group`, set before) takes.
    GroupRows { route: crate::ir::RouteId, group: usize },
}

/// The size a routed index ranges over in one dimension of a tensor read.
#[derive(Clone, Copy, Debug)]
enum RoutedSize {
    /// Not a routed index (the size is not used).
    None,
    Fixed(i64),
    /// The rows of a receive window on the task's rank.
    Recv(crate::ir::RouteId),
}

/// One tensor access of a statement's value.
#[derive(Clone, Debug)]
struct ReadPlan {
    tensor: TensorId,
    index: Vec<Index>,
    sizes: Vec<RoutedSize>,
}

/// One statement of a call, read once from its body.
#[derive(Clone, Debug)]
struct StmtPlan {
    /// The variables whose extents multiply into the points computed (not a sending put's).
    point_vars: Vec<usize>,
    /// The tensor accesses of the value, in evaluation order.
    reads: Vec<ReadPlan>,
    /// The variables the operation count depends on, and the count last computed with the
    /// ranges they had then.
    sum_vars: Vec<usize>,
    ops_at: Option<(Vec<(i64, i64)>, f64)>,
}

/// What every tile of one call shares: where its variables' values come from and its
/// statements' accesses, read once from the body and the task dimensions.
#[derive(Clone, Debug)]
struct CallPlan {
    /// The call (its graph's identity, its index, its dimension and variable counts): a plan
    /// serves that call only.
    graph: u64,
    node: usize,
    dims: usize,
    vars: usize,
    sources: Vec<VarSource>,
    /// Variables named as the sending dimension's token, and (the others) as its choice.
    token_vars: Vec<usize>,
    choice_vars: Vec<usize>,
    /// The routing whose grouped rows `group(m)` refers to.
    group_route: Option<crate::ir::RouteId>,
    stmts: Vec<StmtPlan>,
}

impl CallPlan {
    fn new(tf: &Taskflow, g: &TaskGraph, ni: usize) -> CallPlan {
        let nt = &g.nodes[ni];
        let node = &tf.nodes[ni];
        let body: &ConcreteBody = &node.body;
        let mut sources = Vec::with_capacity(body.vars.len());
        let mut send = None;
        for var in &body.vars {
            let dim = nt.dims.iter().position(|d| d.name == var.name);
            let src = match (dim, var.range) {
                (Some(d), _) if !matches!(var.kind, VarKind::Reduce) => match (&nt.dims[d].kind, var.range) {
                    (DimKind::Range { .. }, VarRange::Fixed { lo, hi }) => VarSource::Chunk {
                        dim: d,
                        clip: Some((lo, hi)),
                    },
                    (DimKind::Range { .. }, _) | (DimKind::Recv(_), _) => VarSource::Chunk { dim: d, clip: None },
                    (DimKind::Send { .. }, _) => {
                        send = Some(d);
                        VarSource::Send { dim: d }
                    }
                },
                _ => match var.range {
                    VarRange::Fixed { lo, hi } => {
                        // The choice variable of a send dimension.
                        let is_choice = nt
                            .dims
                            .iter()
                            .any(|d| matches!(&d.kind, DimKind::Send { choice, .. } if *choice == var.name));
                        if is_choice {
                            VarSource::Empty
                        } else {
                            VarSource::Fixed(lo, hi)
                        }
                    }
                    VarRange::Recv(r) => VarSource::Recv(r),
                    VarRange::GroupRows { route, group } => VarSource::GroupRows { route, group },
                },
            };
            sources.push(src);
        }
        let (mut token_vars, mut choice_vars) = (Vec::new(), Vec::new());
        let mut send_var = vec![false; body.vars.len()];
        if let Some(DimKind::Send { token, choice, .. }) = send.and_then(|d| nt.dims.get(d)).map(|d| &d.kind) {
            for (v, var) in body.vars.iter().enumerate() {
                if var.name == *token {
                    token_vars.push(v);
                } else if var.name == *choice {
                    choice_vars.push(v);
                }
                send_var[v] = var.name == *token || var.name == *choice;
            }
        }
        let stmts = body
            .stmts
            .iter()
            .map(|st| {
                let mut reads = Vec::new();
                st.value.for_each_read(&mut |input, ix| {
                    let Some(&tid) = node.inputs.get(input) else { return };
                    let tensor = tf.tensor(tid);
                    let sizes = ix
                        .iter()
                        .enumerate()
                        .map(|(k, i)| match (i, tensor.shape.get(k)) {
                            (Index::Route { .. }, Some(crate::ir::Dim::Fixed(n))) => RoutedSize::Fixed(*n as i64),
                            (Index::Route { .. }, Some(crate::ir::Dim::Recv(rid))) => RoutedSize::Recv(*rid),
                            _ => RoutedSize::None,
                        })
                        .collect();
                    reads.push(ReadPlan {
                        tensor: tid,
                        index: ix.to_vec(),
                        sizes,
                    });
                });
                let mut sv = Vec::new();
                sum_vars(&st.value, &mut sv);
                StmtPlan {
                    point_vars: st
                        .vars
                        .iter()
                        .copied()
                        .filter(|&v| !(send.is_some() && send_var.get(v).copied().unwrap_or(false)))
                        .collect(),
                    reads,
                    sum_vars: sv,
                    ops_at: None,
                }
            })
            .collect();
        CallPlan {
            node: ni,
            graph: g.uid,
            dims: nt.dims.len(),
            vars: body.vars.len(),
            sources,
            token_vars,
            choice_vars,
            group_route: body.vars.iter().find_map(|v| match v.range {
                VarRange::Recv(r) | VarRange::GroupRows { route: r, .. } => Some(r),
                _ => None,
            }),
            stmts,
        }
    }

    fn serves(&self, tf: &Taskflow, g: &TaskGraph, ni: usize) -> bool {
        self.graph == g.uid
            && self.node == ni
            && tf.nodes.get(ni).is_some_and(|n| n.body.vars.len() == self.vars)
            && g.nodes.get(ni).is_some_and(|nt| nt.dims.len() == self.dims)
    }
}

/// The values every index variable of a task's body takes in its tile, and for a sending
/// put the (token, choice, slot) entries it sends and its destination slots.
#[derive(Clone, Debug, Default)]
pub struct TileRanges {
    /// Per body variable: `lo..hi`.
    pub vr: Vec<(i64, i64)>,
    /// Sending puts: the rows sent, as (token, choice, destination slot).
    pub entries: Vec<(u32, u32, u32)>,
    /// Sending puts: the destination rank and the window rows the tile owns there.
    pub dest_slots: Option<(u32, i64, i64)>,
    /// The task dimension that is a sending put, if any.
    pub send_dim: Option<usize>,
    /// The task's chunks (a reused buffer).
    chunks: Vec<Chunk>,
    /// The chunks' positions in their dimensions, and the tile they are of (its graph's
    /// identity, its call, its rank and its index there).
    digits: Vec<usize>,
    chunks_of: Option<(u64, usize, usize, u32)>,
    /// The plans of the calls met so far, by call.
    plans: Vec<Option<Box<CallPlan>>>,
}

/// Computes [`TileRanges`] for task `t`.
pub fn tile_ranges(tf: &Taskflow, g: &TaskGraph, t: usize, out: &mut TileRanges) {
    let ni = g.node[t] as usize;
    let rank = g.rank[t] as usize;
    if out.plans.len() <= ni {
        out.plans.resize_with(ni + 1, || None);
    }
    let plan = match out.plans[ni].take() {
        Some(p) if p.serves(tf, g, ni) => p,
        _ => Box::new(CallPlan::new(tf, g, ni)),
    };
    let mut chunks = std::mem::take(&mut out.chunks);
    next_chunks(g, t, &mut chunks, &mut out.digits, &mut out.chunks_of);
    tile_ranges_of(g, &plan, rank, &chunks, out);
    out.chunks = chunks;
    out.plans[ni] = Some(plan);
}

/// The chunks of task `t`'s tile (as [`TaskGraph::chunks_into`]): when the previous call was
/// for the previous tile of the same call and rank, by advancing the last dimension's chunk
/// (and carrying), without dividing.
fn next_chunks(
    g: &TaskGraph,
    t: usize,
    chunks: &mut Vec<Chunk>,
    digits: &mut Vec<usize>,
    of: &mut Option<(u64, usize, usize, u32)>,
) {
    let (ni, rank, tile) = (g.node[t] as usize, g.rank[t] as usize, g.tile[t]);
    let rt = &g.nodes[ni].per_rank[rank];
    let follows = matches!(*of, Some((u, n, r, i)) if (u, n, r) == (g.uid, ni, rank) && i.checked_add(1) == Some(tile));
    *of = Some((g.uid, ni, rank, tile));
    if follows && digits.len() == rt.chunks.len() && chunks.len() == rt.chunks.len() {
        for d in (0..rt.chunks.len()).rev() {
            digits[d] += 1;
            if let Some(&c) = rt.chunks[d].get(digits[d]) {
                chunks[d] = c;
                return;
            }
            digits[d] = 0;
            if let Some(&c) = rt.chunks[d].first() {
                chunks[d] = c;
            }
        }
        return;
    }
    g.chunks_into(t, chunks);
    digits.clear();
    digits.resize(rt.chunks.len(), 0);
    let mut rem = tile as usize;
    for d in (0..rt.chunks.len()).rev() {
        let k = rt.chunks[d].len().max(1);
        digits[d] = rem % k;
        rem /= k;
    }
}

fn tile_ranges_of(g: &TaskGraph, plan: &CallPlan, rank: usize, chunks: &[Chunk], out: &mut TileRanges) {
    out.vr.clear();
    out.vr.resize(plan.sources.len(), (0, 0));
    out.entries.clear();
    out.dest_slots = None;
    out.send_dim = None;
    let s = out;
    let mut send: Option<(usize, Chunk)> = None;
    let layout_of = |r: crate::ir::RouteId| g.layouts.get(r.0 as usize).and_then(|l| l.as_ref());
    for v in 0..plan.sources.len() {
        let r = match plan.sources[v] {
            VarSource::Chunk { dim, clip } => match (chunks.get(dim), clip) {
                (Some(c), Some((lo, hi))) => (c.lo.max(lo), c.hi.min(hi)),
                (Some(c), None) => (c.lo, c.hi),
                (None, _) => (0, 0),
            },
            VarSource::Send { dim } => {
                if let Some(&c) = chunks.get(dim) {
                    send = Some((dim, c));
                }
                (0, 0)
            }
            VarSource::Empty => (0, 0),
            VarSource::Fixed(lo, hi) => (lo, hi),
            VarSource::Recv(r) => match layout_of(r) {
                Some(l) => (0, l.rows(rank) as i64),
                None => (0, 0),
            },
            VarSource::GroupRows { route, group } => {
                let (glo, ghi) = s.vr.get(group).copied().unwrap_or((0, 0));
                match layout_of(route) {
                    Some(l) if ghi > glo => {
                        let off = &l.group_off[rank];
                        let a = off.get(glo as usize).copied().unwrap_or(0) as i64;
                        let b = off.get(ghi as usize).copied().unwrap_or(0) as i64;
                        (a, b)
                    }
                    _ => (0, 0),
                }
            }
        };
        s.vr[v] = r;
    }
    let Some((d, c)) = send else { return };
    s.send_dim = Some(d);
    let Some(DimKind::Send { route, .. }) = g.nodes[plan.node].dims.get(d).map(|x| &x.kind) else {
        return;
    };
    let Some(l) = layout_of(*route) else {
        return;
    };
    let e = c.group as usize;
    let off = &l.send_off[rank];
    let (first, last) = if l.static_capacity {
        let cnt = (off[e + 1] - off[e]) as i64;
        (off[e] as i64 + c.lo.min(cnt), off[e] as i64 + c.hi.min(cnt))
    } else {
        (c.lo, c.hi)
    };
    let (mut tlo, mut thi, mut jlo, mut jhi) = (i64::MAX, i64::MIN, i64::MAX, i64::MIN);
    for ent in &l.send[rank][first as usize..last as usize] {
        s.entries.push((ent.token, ent.choice, ent.slot));
        tlo = tlo.min(ent.token as i64);
        thi = thi.max(ent.token as i64 + 1);
        jlo = jlo.min(ent.choice as i64);
        jhi = jhi.max(ent.choice as i64 + 1);
    }
    let d_rank = l.rank_of_expert(e) as u32;
    let el = e % l.local_experts();
    let slots = if l.static_capacity {
        let seg = l.group_off[d_rank as usize][el] as i64 + rank as i64 * l.segment_capacity() as i64;
        (seg + c.lo, seg + c.hi)
    } else if let (Some(f), Some(la)) = (s.entries.first(), s.entries.last()) {
        (f.2 as i64, la.2 as i64 + 1)
    } else {
        (0, 0)
    };
    s.dest_slots = Some((d_rank, slots.0, slots.1));
    for &v in &plan.token_vars {
        s.vr[v] = if thi > tlo { (tlo, thi) } else { (0, 0) };
    }
    for &v in &plan.choice_vars {
        s.vr[v] = if jhi > jlo { (jlo, jhi) } else { (0, 0) };
    }
}

/// Computes what task `t` reads and writes, and its cost.
pub fn tile_access<'a>(program: &Program, tf: &Taskflow, g: &TaskGraph, t: usize, s: &'a mut Scratch) -> &'a Access {
    let a = &mut s.access;
    a.reads.clear();
    a.writes.clear();
    a.flops = 0.0;
    a.bytes_in = 0.0;
    a.bytes_out = 0.0;
    a.remote = 0.0;
    a.dest = None;
    let mut multi_dest = false;
    let ni = g.node[t] as usize;
    let rank = g.rank[t] as usize;
    let node = &tf.nodes[ni];
    let body: &ConcreteBody = &node.body;
    let out = tf.tensor(node.output);
    let out_size = out.dtype.size() as f64;
    tile_ranges(tf, g, t, &mut s.ranges);
    let Some(mut plan) = s.ranges.plans.get_mut(ni).and_then(Option::take) else {
        return &s.access;
    };
    let send: Option<usize> = s.ranges.send_dim;
    let dest_slots = s.ranges.dest_slots;
    // `group(m)` is the local expert of a received row: the routing of the rows' range.
    let group_route = plan.group_route;
    let layout_of = |r: crate::ir::RouteId| g.layouts.get(r.0 as usize).and_then(|l| l.as_ref());
    let group_of = |row: i64| -> i64 {
        match group_route.and_then(layout_of) {
            Some(l) => l.group_of_row(rank, row.max(0) as u32) as i64,
            None => 0,
        }
    };
    for (st, sp) in body.stmts.iter().zip(plan.stmts.iter_mut()) {
        // Points the statement computes.
        let vr = &s.ranges.vr;
        let mut points: f64 = sp
            .point_vars
            .iter()
            .map(|&v| (vr[v].1 - vr[v].0).max(0) as f64)
            .product();
        if send.is_some() {
            points *= s.ranges.entries.len() as f64;
        }
        // Reads (none when no point is computed).
        let reads_here = &mut s.reads_here;
        reads_here.clear();
        if points > 0.0 {
            for rp in &sp.reads {
                let mut r = Region {
                    tensor: rp.tensor,
                    rank: rank as u32,
                    ndim: rp.index.len().min(MAX_DIMS) as u8,
                    lo: [0; MAX_DIMS],
                    hi: [0; MAX_DIMS],
                    accumulate: false,
                };
                for (k, (i, size)) in rp.index.iter().zip(&rp.sizes).enumerate().take(MAX_DIMS) {
                    // The dimension's size only bounds a routed index.
                    let size = match *size {
                        RoutedSize::None => 0,
                        RoutedSize::Fixed(n) => n,
                        RoutedSize::Recv(rid) => layout_of(rid).map_or(0, |l| l.rows(rank) as i64),
                    };
                    let (lo, hi) = index_range(i, vr, &group_of, size);
                    r.lo[k] = lo;
                    r.hi[k] = hi;
                }
                if !r.is_empty() {
                    reads_here.push(r);
                }
            }
        }
        for &r in reads_here.iter() {
            if !a.reads.contains(&r) {
                let size = tf.tensor(r.tensor).dtype.size() as f64;
                // A sending put reads the rows it sends, not their bounding box (the box stays
                // the region, conservatively, for dependencies).
                let volume = if send.is_some() && r.ndim > 0 {
                    let row: u64 = (1..r.ndim as usize)
                        .map(|d| (r.hi[d] - r.lo[d]).max(0) as u64)
                        .product();
                    (s.ranges.entries.len() as u64 * row).min(r.volume())
                } else {
                    r.volume()
                };
                a.bytes_in += volume as f64 * size;
                a.reads.push(r);
            }
        }
        // A sending chunk of a static window owns its padding slots even when it sends no
        // row: it still writes (nothing) there and signals, as on the device.
        let owns_padding = dest_slots.is_some_and(|(_, lo, hi)| hi > lo);
        if points <= 0.0 && !owns_padding {
            continue;
        }
        // The operation count depends only on the reductions' ranges: reuse it while they
        // stay the same.
        let op_count = match &sp.ops_at {
            Some((at, n))
                if at.len() == sp.sum_vars.len() && sp.sum_vars.iter().zip(at).all(|(&v, x)| range_of(vr, v) == *x) =>
            {
                *n
            }
            _ => {
                let n = ops(&st.value, vr);
                sp.ops_at = Some((sp.sum_vars.iter().map(|&v| range_of(vr, v)).collect(), n));
                n
            }
        };
        a.flops += points * op_count;
        // Writes.
        let out_dims = out.shape.len().min(MAX_DIMS);
        let mk = |rank: u32| Region {
            tensor: node.output,
            rank,
            ndim: out_dims as u8,
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
            accumulate: st.accumulate,
        };
        match &st.target {
            Target::Out(ix) => {
                let mut w = mk(rank as u32);
                for (k, i) in ix.iter().enumerate().take(MAX_DIMS) {
                    let (lo, hi) = index_range(i, &s.ranges.vr, &group_of, 0);
                    w.lo[k] = lo;
                    w.hi[k] = hi;
                }
                a.bytes_out += w.volume() as f64 * out_size;
                a.writes.push(w);
            }
            Target::Put { rank: rk, index } => {
                // Non-row dimensions of the destination.
                let mut rest = mk(0);
                for (k, i) in index.iter().enumerate().take(MAX_DIMS) {
                    if !matches!(i, Index::Route { .. }) {
                        let (lo, hi) = index_range(i, &s.ranges.vr, &group_of, 0);
                        rest.lo[k] = lo;
                        rest.hi[k] = hi;
                    }
                }
                let row_dim = index.iter().position(|i| matches!(i, Index::Route { .. })).unwrap_or(0);
                let row_bytes = {
                    let mut r = rest;
                    r.lo[row_dim] = 0;
                    r.hi[row_dim] = 1;
                    r.volume() as f64 * out_size
                };
                let mut note_dest = |d: u32, bytes: f64, a: &mut Access| {
                    if d as usize != rank {
                        a.remote += bytes;
                        match a.dest {
                            None if !multi_dest => a.dest = Some(d),
                            Some(x) if x != d => {
                                a.dest = None;
                                multi_dest = true;
                            }
                            _ => {}
                        }
                    } else {
                        a.bytes_out += bytes;
                    }
                };
                if let Some((d, lo, hi)) = dest_slots {
                    let mut w = rest;
                    w.rank = d;
                    w.lo[row_dim] = lo;
                    w.hi[row_dim] = hi;
                    note_dest(d, s.ranges.entries.len() as f64 * row_bytes, a);
                    if !w.is_empty() {
                        a.writes.push(w);
                    }
                } else if let Index::Route { route, args, .. } = rk {
                    // A receiving-side put: each row goes back to its source.
                    let Some(l) = layout_of(*route) else { continue };
                    let (mlo, mhi) = range_of(&s.ranges.vr, args[0]);
                    for m in mlo.max(0)..mhi {
                        let Some(e) = l.recv[rank].get(m as usize) else {
                            continue;
                        };
                        if e.src_rank == NO_SOURCE {
                            continue;
                        }
                        let mut w = rest;
                        w.rank = e.src_rank;
                        w.lo[row_dim] = e.src_token as i64;
                        w.hi[row_dim] = e.src_token as i64 + 1;
                        note_dest(e.src_rank, row_bytes, a);
                        a.writes.push(w);
                    }
                }
            }
        }
    }
    if let Some(p) = s.ranges.plans.get_mut(ni) {
        *p = Some(plan);
    }
    let _ = program;
    #[cfg(feature = "fault-injection")]
    fault::apply(t, &mut s.access);
    &s.access
}

/// Deliberate corruptions of the regions [`tile_access`] derives, for mutation tests of the
/// checks that must not trust them (built only with the `fault-injection` feature).
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub mod fault {
    use super::Access;
    use std::cell::Cell;

    /// One corruption of one task's regions.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Fault {
        /// Task `task`'s first read keeps only its first element.
        ShrinkRead { task: u32 },
        /// Task `task`'s writes move by `by` along their first dimension.
        ShiftWrite { task: u32, by: i64 },
        /// Task `task` reads nothing.
        DropReads { task: u32 },
    }

    thread_local! {
        static FAULT: Cell<Option<Fault>> = const { Cell::new(None) };
    }

    /// Sets (or with `None` clears) the fault of this thread's lowerings (the threads a
    /// lowering works on take the fault of the thread that started it).
    pub fn inject(f: Option<Fault>) {
        FAULT.with(|c| c.set(f));
    }

    /// This thread's fault.
    pub fn current() -> Option<Fault> {
        FAULT.with(Cell::get)
    }

    pub(super) fn apply(t: usize, a: &mut Access) {
        match FAULT.with(Cell::get) {
            Some(Fault::ShrinkRead { task }) if task as usize == t => {
                if let Some(r) = a.reads.first_mut() {
                    for d in 0..r.ndim as usize {
                        r.hi[d] = r.lo[d] + 1;
                    }
                }
            }
            Some(Fault::ShiftWrite { task, by }) if task as usize == t => {
                for w in &mut a.writes {
                    w.lo[0] += by;
                    w.hi[0] += by;
                }
            }
            Some(Fault::DropReads { task }) if task as usize == t => a.reads.clear(),
            _ => {}
        }
    }
}

/// The writers of every tensor on every rank, for finding the producers of a read.
#[derive(Debug)]
pub struct WriterIndex {
    ndim: Vec<usize>,
    ranks: usize,
    /// `[tensor * ranks + rank]`: the writes of a tensor on a rank.
    lists: Vec<Writes>,
    /// The lists added to since [`WriterIndex::sort_all`] last ran (each once): a graph of
    /// many calls sorts, after each call, only what the call wrote.
    added: Vec<u32>,
}

/// Write records made apart from the index (by one of several threads), to be added to it
/// later with [`WriterIndex::append`]: one run of records per tensor and rank, in the order
/// the writes came.
#[derive(Debug, Default)]
pub struct RecordRuns {
    runs: Vec<Run>,
    /// The run written last (writes of a task segment mostly go to one tensor and rank).
    last: usize,
    /// Room for this many writes is made in the first run.
    room: usize,
}

#[derive(Debug)]
struct Run {
    tensor: u32,
    rank: u32,
    records: Vec<i64>,
    max_len: i64,
}

impl RecordRuns {
    /// Runs whose first makes room for `writes` writes at once.
    pub fn with_room(writes: usize) -> Self {
        RecordRuns {
            room: writes,
            ..RecordRuns::default()
        }
    }

    /// Records write `w` of `task`, in the layout of `index`'s lists (writes of tensors or
    /// ranks it does not have are dropped, as [`WriterIndex::add`] drops them).
    pub fn push(&mut self, index: &WriterIndex, w: &Region, task: u32) {
        let (ti, r) = (w.tensor.0, w.rank);
        let Some(&nd) = index.ndim.get(ti as usize) else { return };
        if r as usize >= index.ranks {
            return;
        }
        let at = match self.runs.get(self.last) {
            Some(run) if run.tensor == ti && run.rank == r => self.last,
            _ => match self.runs.iter().position(|run| run.tensor == ti && run.rank == r) {
                Some(i) => i,
                None => {
                    let room = if self.runs.is_empty() {
                        self.room * (2 * nd + 1)
                    } else {
                        0
                    };
                    self.runs.push(Run {
                        tensor: ti,
                        rank: r,
                        records: Vec::with_capacity(room),
                        max_len: 0,
                    });
                    self.runs.len() - 1
                }
            },
        };
        self.last = at;
        let run = &mut self.runs[at];
        for d in 0..nd {
            run.records.extend_from_slice(&[w.lo[d], w.hi[d]]);
        }
        run.records.push(task as i64 | (i64::from(w.accumulate) << 32));
        run.max_len = run.max_len.max(w.hi[0] - w.lo[0]);
    }
}

/// The writes of one tensor on one rank.
#[derive(Debug, Default)]
struct Writes {
    /// Flat records of (`ndim` (lo, hi) pairs, task id with the accumulation flag above it),
    /// in insertion order.
    records: Vec<i64>,
    /// The order of the records by (lo of dimension 0, task); built on the first query after
    /// records were added.
    sorted: Option<Order>,
    /// The longest extent of a record in dimension 0.
    max_len: i64,
    /// Whether it is in [`WriterIndex::added`].
    added: bool,
    /// The long runs of one `lo` in dimension 0 of the sorted order, searched by dimension
    /// 1 (built with the order).
    runs: Runs,
}

/// Runs of at least [`RUN_MIN`] records, in the sorted order, with one `lo` in dimension 0
/// (a tiling of one row by many columns): a read of a few columns finds its writers by a
/// search of the run by dimension 1 instead of a scan of the row, which with a row of
/// thousands of single-column tiles was thousands of records a read.
#[derive(Debug, Default)]
struct Runs {
    /// Per run: its first sorted position and its end.
    spans: Vec<(u32, u32)>,
    /// Per run: where its records start in `by_lo1`, and its longest extent in dimension 1.
    at: Vec<(u32, i64)>,
    /// Each run's records by (lo of dimension 1, sorted position).
    by_lo1: Vec<(i64, u32)>,
}

/// The shortest run of one `lo` in dimension 0 that is searched by dimension 1.
const RUN_MIN: usize = 32;

/// The records of one tensor on one rank by position.
#[derive(Debug)]
enum Order {
    /// Insertion order is already sorted.
    Inserted,
    /// Record offsets, sorted.
    Offsets(Vec<u32>),
}

/// The long runs of one `lo` in dimension 0 of `n` records of stride `st` in `order` (none
/// for records of fewer than two dimensions).
fn runs_of(list: &[i64], st: usize, n: usize, order: &Order) -> Runs {
    let mut runs = Runs::default();
    if st < 5 || n < RUN_MIN {
        return runs;
    }
    let off = |k: usize| match order {
        Order::Offsets(o) => o[k] as usize,
        Order::Inserted => k * st,
    };
    let mut k = 0;
    while k < n {
        let lo0 = list[off(k)];
        let mut end = k + 1;
        while end < n && list[off(end)] == lo0 {
            end += 1;
        }
        if end - k >= RUN_MIN {
            let at = runs.by_lo1.len();
            let mut len1 = 0i64;
            for pos in k..end {
                let o = off(pos);
                runs.by_lo1.push((list[o + 2], pos as u32));
                len1 = len1.max(list[o + 3].saturating_sub(list[o + 2]));
            }
            runs.by_lo1[at..].sort_unstable();
            runs.spans.push((k as u32, end as u32));
            runs.at.push((at as u32, len1));
        }
        k = end;
    }
    runs
}

/// Whether no two of these records (`nd` intervals and a task field each) overlap, proven
/// cheaply for grid-like tilings: when, in every dimension, the distinct intervals are
/// pairwise disjoint, two records overlap only if all their intervals are equal, which
/// sorting finds. `false` means "maybe": the caller then compares the pairs one by one.
fn surely_disjoint(list: &[i64], nd: usize) -> bool {
    let st = 2 * nd + 1;
    let n = list.len() / st;
    if n < 64 {
        // Few records: the pairwise sweep is as cheap.
        return false;
    }
    let mut iv: Vec<(i64, i64)> = Vec::with_capacity(n);
    for d in 0..nd {
        iv.clear();
        // Repeats in a row (the tiles along another dimension) are left out before sorting.
        for rec in list.chunks_exact(st) {
            let x = (rec[2 * d], rec[2 * d + 1]);
            if iv.last() != Some(&x) {
                iv.push(x);
            }
        }
        iv.sort_unstable();
        iv.dedup();
        if iv.windows(2).any(|w| w[0].1 > w[1].0) || iv.iter().any(|&(lo, hi)| lo >= hi) {
            return false;
        }
    }
    // No two records with the same box.
    let mut boxes: rustc_hash::FxHashSet<&[i64]> = Default::default();
    boxes.reserve(n);
    list.chunks_exact(st).all(|rec| boxes.insert(&rec[..2 * nd]))
}

impl WriterIndex {
    pub fn new(tf: &Taskflow, ranks: usize) -> Self {
        let nt = tf.tensors.len();
        WriterIndex {
            ndim: tf.tensors.iter().map(|t| t.shape.len().min(MAX_DIMS)).collect(),
            ranks,
            lists: (0..nt * ranks).map(|_| Writes::default()).collect(),
            added: Vec::new(),
        }
    }

    /// Lists list `i` (in range) among those added to.
    fn mark_added(&mut self, i: usize) {
        if !self.lists[i].added {
            self.lists[i].added = true;
            self.added.push(i as u32);
        }
    }

    /// The writes of tensor `ti` on rank `r` (both in range).
    fn list(&self, ti: usize, r: usize) -> Option<&Writes> {
        if r >= self.ranks {
            return None;
        }
        self.lists.get(ti * self.ranks + r)
    }

    fn list_mut(&mut self, ti: usize, r: usize) -> Option<&mut Writes> {
        if r >= self.ranks {
            return None;
        }
        self.lists.get_mut(ti * self.ranks + r)
    }

    fn stride(&self, ti: usize) -> usize {
        2 * self.ndim[ti] + 1
    }

    /// Reserves room for `n` more records of a tensor on a rank.
    pub fn reserve(&mut self, tensor: TensorId, rank: u32, n: usize) {
        let (ti, r) = (tensor.0 as usize, rank as usize);
        if ti < self.ndim.len() {
            let st = self.stride(ti);
            if let Some(l) = self.list_mut(ti, r) {
                l.records.reserve(n * st);
            }
        }
    }

    /// Adds the records a segment of tasks made (see [`RecordRuns`]), list by list, as if
    /// each write had been added in turn with [`WriterIndex::add`]. A list that had no
    /// record takes over the run's memory.
    pub fn append(&mut self, runs: RecordRuns) {
        for run in runs.runs {
            let Some(l) = self.list_mut(run.tensor as usize, run.rank as usize) else {
                continue;
            };
            if run.records.is_empty() {
                continue;
            }
            if l.records.is_empty() {
                l.records = run.records;
            } else {
                l.records.extend_from_slice(&run.records);
            }
            l.sorted = None;
            l.max_len = l.max_len.max(run.max_len);
            self.mark_added(run.tensor as usize * self.ranks + run.rank as usize);
        }
    }

    pub fn add(&mut self, w: &Region, task: u32) {
        let (ti, r) = (w.tensor.0 as usize, w.rank as usize);
        let Some(&nd) = self.ndim.get(ti) else { return };
        let Some(l) = self.list_mut(ti, r) else { return };
        for d in 0..nd {
            l.records.push(w.lo[d]);
            l.records.push(w.hi[d]);
        }
        // The task id, with the accumulation flag above it.
        l.records.push(task as i64 | (i64::from(w.accumulate) << 32));
        if l.sorted.is_some() {
            l.sorted = None;
        }
        let len = w.hi[0] - w.lo[0];
        if len > l.max_len {
            l.max_len = len;
        }
        self.mark_added(ti * self.ranks + r);
    }

    /// Sorts the records of a tensor on a rank, unless they are sorted.
    fn sort(&mut self, ti: usize, r: usize) {
        let st = self.stride(ti);
        let Some(l) = self.list_mut(ti, r) else { return };
        if l.sorted.is_some() {
            return;
        }
        let list = &l.records;
        let n = list.len() / st;
        // By (lo of dimension 0, task with its flag, insertion): one packed key, unique, so
        // an unstable sort gives the stable order. Below the biased `lo`: the flag and the
        // task (the order of the stored `task | flag << 32`), then the record number
        // (below 2^31: offsets are `u32` and records at least 3 wide).
        let key = |i: usize| -> u128 {
            let o = i * st;
            let lo = (list[o] as u64) ^ (1 << 63);
            let field = list[o + st - 1] as u64;
            let (task, acc) = (field & 0xffff_ffff, (field >> 32) & 1);
            (u128::from(lo) << 64) | u128::from(acc << 63 | task << 31 | (i as u64 & 0x7fff_ffff))
        };
        let order = if (1..n).all(|i| key(i - 1) < key(i)) {
            Order::Inserted
        } else {
            let mut keys: Vec<u128> = (0..n).map(key).collect();
            keys.sort_unstable();
            Order::Offsets(
                keys.iter()
                    .map(|k| ((*k as u64 & 0x7fff_ffff) as usize * st) as u32)
                    .collect(),
            )
        };
        l.runs = runs_of(list, st, n, &order);
        l.sorted = Some(order);
    }

    /// Calls `f` with the offset of every record of `rd`'s tensor and rank that may overlap
    /// `rd` (those whose dimension 0 can reach `rd.lo[0]`, up to `rd.hi[0]`), in order.
    fn scan(&mut self, rd: &Region, f: &mut impl FnMut(&[i64], usize)) {
        let (ti, r) = (rd.tensor.0 as usize, rd.rank as usize);
        if ti >= self.ndim.len() || r >= self.ranks {
            return;
        }
        self.sort(ti, r);
        self.scan_sorted(rd, f);
    }

    /// Sorts every list that records were added to since it was last sorted, so that
    /// [`WriterIndex::writers`] finds its records by position.
    pub fn sort_all(&mut self) {
        let added = std::mem::take(&mut self.added);
        for &i in &added {
            let i = i as usize;
            self.lists[i].added = false;
            self.sort(i / self.ranks, i % self.ranks);
        }
        self.added = added;
        self.added.clear();
    }

    /// Calls `f` with every task whose write overlaps `rd`. The index is only read (so it
    /// can be shared): a list added to since [`WriterIndex::sort_all`] is read record by
    /// record.
    pub fn writers(&self, rd: &Region, f: &mut impl FnMut(u32)) {
        self.scan_sorted(rd, &mut |rec, nd| f(rec[2 * nd] as u32));
    }

    /// [`WriterIndex::scan`] over the list as it is.
    fn scan_sorted(&self, rd: &Region, f: &mut impl FnMut(&[i64], usize)) {
        let (ti, r) = (rd.tensor.0 as usize, rd.rank as usize);
        if ti >= self.ndim.len() || r >= self.ranks {
            return;
        }
        let nd = self.ndim[ti];
        let st = self.stride(ti);
        let Some(l) = self.list(ti, r) else { return };
        let list = &l.records;
        let n = list.len() / st;
        let from = rd.lo[0].saturating_sub(l.max_len);
        let sorted = l.sorted.is_some();
        // Visits the record at `o`; `false` once it lies wholly past `rd` in dimension 0
        // (in sorted order, every later one does too).
        let mut visit = |o: usize| -> bool {
            let rec = &list[o..o + st];
            if sorted && rec[0] >= rd.hi[0] {
                return false;
            }
            if (0..nd).all(|d| rec[2 * d] < rd.hi[d] && rd.lo[d] < rec[2 * d + 1]) {
                f(rec, nd);
            }
            true
        };
        // Records whose lo0 <= lo - max_len end before `lo`: skip them.
        match &l.sorted {
            Some(order) if !l.runs.spans.is_empty() => {
                // By sorted position; a long run of one lo0 is searched by dimension 1 and
                // its overlapping records visited in their order.
                let off = |k: usize| match order {
                    Order::Offsets(o) => o[k] as usize,
                    Order::Inserted => k * st,
                };
                let mut lo = 0;
                let mut hi = n;
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if list[off(mid)] <= from {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                let runs = &l.runs;
                let mut ri = runs.spans.partition_point(|&(first, _)| (first as usize) < lo);
                let mut k = lo;
                let mut hits: Vec<u32> = Vec::new();
                while k < n {
                    if let Some(&(first, end)) = runs.spans.get(ri).filter(|&&(first, _)| first as usize == k) {
                        if list[off(k)] >= rd.hi[0] {
                            break;
                        }
                        let (at, len1) = runs.at[ri];
                        let recs = &runs.by_lo1[at as usize..at as usize + (end - first) as usize];
                        let from1 = rd.lo[1].saturating_sub(len1);
                        let a = recs.partition_point(|&(lo1, _)| lo1 <= from1);
                        let b = recs.partition_point(|&(lo1, _)| lo1 < rd.hi[1]);
                        hits.clear();
                        hits.extend(recs[a..b.max(a)].iter().map(|&(_, pos)| pos));
                        hits.sort_unstable();
                        for &pos in &hits {
                            visit(off(pos as usize));
                        }
                        k = end as usize;
                        ri += 1;
                        continue;
                    }
                    if !visit(off(k)) {
                        break;
                    }
                    k += 1;
                }
            }
            Some(Order::Offsets(order)) => {
                let i = order.partition_point(|&o| list[o as usize] <= from);
                for &o in &order[i..] {
                    if !visit(o as usize) {
                        break;
                    }
                }
            }
            None => {
                // Not sorted: every record.
                for i in 0..n {
                    visit(i * st);
                }
            }
            Some(Order::Inserted) => {
                let mut lo = 0;
                let mut hi = n;
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if list[mid * st] <= from {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                for i in lo..n {
                    if !visit(i * st) {
                        break;
                    }
                }
            }
        }
    }

    /// Calls `f` with every write record overlapping `rd`: the writing task and the record's
    /// bounds (`lo, hi` of each of the tensor's dimensions).
    pub fn records_over(&mut self, rd: &Region, f: &mut impl FnMut(u32, &[i64])) {
        self.scan(rd, &mut |rec, nd| f(rec[2 * nd] as u32, &rec[..2 * nd]));
    }

    /// Calls `f` with every write record overlapping `rd`: the writing task and its region.
    pub fn writes_over(&mut self, rd: &Region, f: &mut impl FnMut(u32, Region)) {
        self.scan(rd, &mut |rec, nd| {
            let mut reg = *rd;
            for d in 0..nd {
                reg.lo[d] = rec[2 * d];
                reg.hi[d] = rec[2 * d + 1];
            }
            reg.accumulate = (rec[2 * nd] >> 32) & 1 == 1;
            f(rec[2 * nd] as u32, reg);
        });
    }

    /// Calls `f(first, second)` for every pair of overlapping records of a tensor on a rank
    /// from different tasks and not both accumulations: `(region, task)` each, the first
    /// before the second by position (pairs by the first's position, then the second's).
    pub fn overlapping_pairs(&mut self, tensor: TensorId, rank: u32, f: &mut impl FnMut((Region, u32), (Region, u32))) {
        let (ti, r) = (tensor.0 as usize, rank as usize);
        if ti >= self.ndim.len() || r >= self.ranks {
            return;
        }
        let nd = self.ndim[ti];
        let st = self.stride(ti);
        let acc = |field: i64| (field >> 32) & 1 == 1;
        let Some(l) = self.list(ti, r) else { return };
        // Accumulations never conflict with each other; records without dimensions never
        // overlap.
        if nd == 0 || l.records.chunks_exact(st).all(|rec| acc(rec[st - 1])) {
            return;
        }
        if surely_disjoint(&l.records, nd) {
            return;
        }
        self.sort(ti, r);
        let Some(l) = self.list(ti, r) else { return };
        let list = &l.records;
        // The records in sorted order, contiguous.
        let gathered: Vec<i64>;
        let recs: &[i64] = match &l.sorted {
            Some(Order::Offsets(order)) => {
                gathered = order
                    .iter()
                    .flat_map(|&o| list[o as usize..o as usize + st].iter().copied())
                    .collect();
                &gathered
            }
            _ => list,
        };
        let region = |rec: &[i64]| {
            let mut reg = Region {
                tensor,
                rank,
                ndim: nd as u8,
                lo: [0; MAX_DIMS],
                hi: [0; MAX_DIMS],
                accumulate: acc(rec[st - 1]),
            };
            for d in 0..nd {
                reg.lo[d] = rec[2 * d];
                reg.hi[d] = rec[2 * d + 1];
            }
            (reg, rec[st - 1] as u32)
        };
        for (i, a) in recs.chunks_exact(st).enumerate() {
            let (ta, acc_a) = (a[st - 1] as u32, acc(a[st - 1]));
            for b in recs[(i + 1) * st..].chunks_exact(st) {
                if b[0] >= a[1] {
                    break;
                }
                if b[st - 1] as u32 == ta || (acc_a && acc(b[st - 1])) {
                    continue;
                }
                // Overlap (the same tensor and rank; dimension 0 may still be empty).
                if (0..nd).all(|d| a[2 * d] < b[2 * d + 1] && b[2 * d] < a[2 * d + 1]) {
                    f(region(a), region(b));
                }
            }
        }
    }

    /// Every record of a tensor on a rank: `(region, task)`, sorted by position.
    pub fn records(&mut self, tensor: TensorId, rank: u32) -> Vec<(Region, u32)> {
        let (ti, r) = (tensor.0 as usize, rank as usize);
        if ti >= self.ndim.len() || r >= self.ranks {
            return Vec::new();
        }
        self.sort(ti, r);
        let nd = self.ndim[ti];
        let st = self.stride(ti);
        let Some(l) = self.list(ti, r) else { return Vec::new() };
        let list = &l.records;
        let record = |o: usize| {
            let mut reg = Region {
                tensor,
                rank,
                ndim: nd as u8,
                lo: [0; MAX_DIMS],
                hi: [0; MAX_DIMS],
                accumulate: false,
            };
            for d in 0..nd {
                reg.lo[d] = list[o + 2 * d];
                reg.hi[d] = list[o + 2 * d + 1];
            }
            reg.accumulate = (list[o + 2 * nd] >> 32) & 1 == 1;
            (reg, list[o + 2 * nd] as u32)
        };
        match &l.sorted {
            Some(Order::Offsets(order)) => order.iter().map(|&o| record(o as usize)).collect(),
            _ => (0..list.len() / st).map(|i| record(i * st)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::surely_disjoint;
    use super::{Region, WriterIndex, Writes, MAX_DIMS};
    use crate::ir::TensorId;
    use proptest::prelude::*;

    fn region(lo: [i64; 2], hi: [i64; 2], accumulate: bool) -> Region {
        let mut r = Region {
            tensor: TensorId(0),
            rank: 0,
            ndim: 2,
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
            accumulate,
        };
        r.lo[..2].copy_from_slice(&lo);
        r.hi[..2].copy_from_slice(&hi);
        r
    }

    proptest! {
        /// The writers of a read are every record that overlaps it, in the order of (lo of
        /// dimension 0, accumulation, task, insertion), whether or not a long run of one row is
        /// searched by column: rows of few distinct starts, so that runs are long.
        #[test]
        fn writers_are_the_overlapping_records_in_order(
            recs in proptest::collection::vec((0i64..4, 1i64..3, 0i64..300, 1i64..6, 0u32..500, any::<bool>()), 0..400),
            reads in proptest::collection::vec((0i64..6, 1i64..4, -5i64..310, 1i64..20), 1..40),
        ) {
            let mut index = WriterIndex { ndim: vec![2], ranks: 1, lists: vec![Writes::default()], added: Vec::new() };
            for &(r0, l0, c0, l1, task, acc) in &recs {
                index.add(&region([r0, c0], [r0 + l0, c0 + l1], acc), task);
            }
            index.sort_all();
            for &(r0, l0, c0, l1) in &reads {
                let rd = region([r0, c0], [r0 + l0, c0 + l1], false);
                let mut got = Vec::new();
                index.writers(&rd, &mut |t| got.push(t));
                let mut want: Vec<(i64, bool, u32, usize)> = recs
                    .iter()
                    .enumerate()
                    .filter(|(_, &(a0, m0, a1, m1, _, _))| a0 < rd.hi[0] && rd.lo[0] < a0 + m0 && a1 < rd.hi[1] && rd.lo[1] < a1 + m1)
                    .map(|(i, &(a0, _, _, _, task, acc))| (a0, acc, task, i))
                    .collect();
                want.sort_unstable();
                let want: Vec<u32> = want.iter().map(|w| w.2).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Records of a 2-D grid of `rows x cols` tiles of 4 x 8 elements, task ids in order.
    fn grid(rows: i64, cols: i64) -> Vec<i64> {
        let mut v = Vec::new();
        for i in 0..rows {
            for j in 0..cols {
                v.extend([4 * i, 4 * i + 4, 8 * j, 8 * j + 8, i * cols + j]);
            }
        }
        v
    }

    #[test]
    fn a_regular_grid_is_proven_disjoint() {
        assert!(surely_disjoint(&grid(16, 16), 2));
    }

    #[test]
    fn any_overlap_or_irregular_tiling_is_left_to_the_pairwise_check() {
        // A duplicated tile.
        let mut dup = grid(16, 16);
        dup.extend([0, 4, 0, 8, 999]);
        assert!(!surely_disjoint(&dup, 2));
        // A shifted tile: intervals that overlap without being equal.
        let mut shifted = grid(16, 16);
        shifted.extend([2, 6, 64, 72, 999]);
        assert!(!surely_disjoint(&shifted, 2));
        // An empty interval.
        let mut empty = grid(16, 16);
        empty.extend([100, 100, 0, 8, 999]);
        assert!(!surely_disjoint(&empty, 2));
        // Too few records to bother.
        assert!(!surely_disjoint(&grid(2, 2), 2));
    }
}
