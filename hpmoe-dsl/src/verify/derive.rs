//! The regions a task reads and writes, derived for verification from the checked op body.
//!
//! In: a task of a [`TaskGraph`] (its call, rank and tile chunks), the call's analysed body
//! ([`ConcreteBody`]: variables, statements, index maps) and the routing layouts. Out: the
//! task's read and write boxes ([`Region`]s), in statement order.
//!
//! This is the verifier's own reading of the language, written apart from the lowering's
//! (`lower::regions`), so that a mistake there shows up as a disagreement here:
//! 1. every body variable takes one interval of values in a tile: a tiled variable its
//!    chunk (clipped to its declared range), any other variable its whole declared range
//!    (received rows: the rank's window; grouped rows: the rows of its group's experts); the
//!    token and choice variables of a sending put take the (token, choice) rows the chunk
//!    sends, read from the layout's send list;
//! 2. a statement is evaluated in a tile when all its variables have values there (and a
//!    sending tile sends at least one row);
//! 3. every tensor access reads, per dimension, the image of its index map over those
//!    intervals: an affine map's values at the two ends, a constant itself, `group(m)` the
//!    experts of the first and the last row, a routed index (data dependent) the whole
//!    dimension;
//! 4. `out[...]` writes the image of its indices; a sending put writes, on the destination
//!    rank of the chunk's expert, the window rows the chunk owns (the slots of the rows it
//!    sends; in a static window its whole share of the (expert, source) segment, padding
//!    included); a receiving put writes, row by row, the source row named by evaluating its
//!    routed indices (`r.src_rank(m)`, `r.src_token(m)`) at that row.

use crate::ir::{ConcreteBody, Dim, Index, RouteFn, RouteId, Target, Taskflow, Tensor, TensorId, VarKind, VarRange};
use crate::lower::{Chunk, DimKind, Region, RouteLayout, TaskGraph, MAX_DIMS, NO_SOURCE};

/// What one body variable ranges over in a call's tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The chunk of task dimension `dim`, clipped to the variable's fixed range if it has one.
    Tiled { dim: usize, clip: Option<(i64, i64)> },
    /// The token (`choice == false`) or choice variable of the sending dimension.
    Sent { choice: bool },
    /// Its declared range.
    Whole,
}

/// The roles of one call's variables and its statements' tensor accesses (computed once per
/// call).
#[derive(Debug)]
struct Call {
    node: u32,
    roles: Vec<Role>,
    /// The variables in the order their values are set: grouped rows after every other.
    order: Vec<usize>,
    /// Per statement: the tensors its value reads and their index maps, in evaluation order.
    reads: Vec<Vec<(TensorId, Vec<Index>)>>,
    /// The task dimension that is a sending put.
    send_dim: Option<usize>,
    /// The routing whose grouped rows `group(m)` refers to.
    group_route: Option<RouteId>,
}

fn call_of(tf: &Taskflow, g: &TaskGraph, node: u32) -> Call {
    let body = &tf.nodes[node as usize].body;
    let dims = &g.nodes[node as usize].dims;
    let roles: Vec<Role> = body
        .vars
        .iter()
        .map(|var| {
            let tiled = dims.iter().position(|d| d.name == var.name);
            match tiled {
                Some(d) if var.kind != VarKind::Reduce => match (&dims[d].kind, var.range) {
                    (DimKind::Send { .. }, _) => Role::Sent { choice: false },
                    (DimKind::Range { .. }, VarRange::Fixed { lo, hi }) => Role::Tiled {
                        dim: d,
                        clip: Some((lo, hi)),
                    },
                    _ => Role::Tiled { dim: d, clip: None },
                },
                _ => {
                    let is_choice = matches!(var.range, VarRange::Fixed { .. })
                        && dims
                            .iter()
                            .any(|d| matches!(&d.kind, DimKind::Send { choice, .. } if *choice == var.name));
                    if is_choice {
                        Role::Sent { choice: true }
                    } else {
                        Role::Whole
                    }
                }
            }
        })
        .collect();
    // Grouped rows depend on their group variable: every other variable first.
    let grouped = |v: usize| matches!(body.vars[v].range, VarRange::GroupRows { .. }) && roles[v] == Role::Whole;
    let order = (0..body.vars.len())
        .filter(|&v| !grouped(v))
        .chain((0..body.vars.len()).filter(|&v| grouped(v)))
        .collect();
    let inputs = &tf.nodes[node as usize].inputs;
    let reads = body
        .stmts
        .iter()
        .map(|st| {
            let mut v = Vec::new();
            st.value.for_each_read(&mut |input, ix| {
                if let Some(&tid) = inputs.get(input) {
                    v.push((tid, ix.to_vec()));
                }
            });
            v
        })
        .collect();
    Call {
        node,
        order,
        reads,
        roles,
        send_dim: dims.iter().position(|d| matches!(d.kind, DimKind::Send { .. })),
        group_route: body.vars.iter().find_map(|v| match v.range {
            VarRange::Recv(r) | VarRange::GroupRows { route: r, .. } => Some(r),
            VarRange::Fixed { .. } => None,
        }),
    }
}

fn layout_of(g: &TaskGraph, r: RouteId) -> Option<&RouteLayout> {
    g.layouts.get(r.0 as usize).and_then(|l| l.as_ref())
}

/// The local expert whose rows of `rank`'s window contain `row`.
fn expert_of_row(l: &RouteLayout, rank: usize, row: i64) -> i64 {
    let starts = match l.group_off.get(rank) {
        Some(s) => s,
        None => return 0,
    };
    // The offsets ascend: bisect (a linear scan is quadratic over many local experts).
    starts.partition_point(|&o| i64::from(o) <= row).saturating_sub(1) as i64
}

/// Whether an index of a receiving put takes its value from the row `m` itself (its source
/// token or rank, or an affine map of `m`), rather than from the tile.
fn by_row(i: &Index, m: usize) -> bool {
    match i {
        Index::Route {
            func: RouteFn::SrcToken | RouteFn::SrcRank,
            args,
            ..
        } => args.first() == Some(&m),
        Index::Affine { var, .. } => *var == m,
        _ => false,
    }
}

/// How many writes the tasks of call `node` make on each rank, when it puts received rows
/// back to their sources (one write per row: on rank `q`, the rows `q` sent), for sizing the
/// index of writes; `None` for any other call (about one write per task, on its own rank).
/// Several such puts in one body count their rows once (the most of any): a put that is
/// never evaluated writes nothing, so the hint never reserves more than one routing's rows
/// per rank; more writes grow the index as they come.
pub fn put_back_writes(tf: &Taskflow, g: &TaskGraph, node: usize) -> Option<Vec<usize>> {
    let body = &tf.nodes.get(node)?.body;
    let mut per_rank: Option<Vec<usize>> = None;
    for st in &body.stmts {
        if let Target::Put {
            rank:
                Index::Route {
                    route,
                    func: RouteFn::SrcRank,
                    ..
                },
            ..
        } = &st.target
        {
            let l = layout_of(g, *route)?;
            let v = per_rank.get_or_insert_with(|| vec![0; l.send.len()]);
            for (n, sent) in v.iter_mut().zip(&l.send) {
                *n = (*n).max(sent.len());
            }
        }
    }
    per_rank
}

/// Reusable state of the derivation.
#[derive(Debug, Default)]
pub struct Deriver {
    call: Option<Call>,
    chunks: Vec<Chunk>,
    /// Per body variable: the values `lo..hi` it takes in the tile.
    span: Vec<(i64, i64)>,
    /// A sending tile: the (token, choice, destination slot) rows it sends.
    sent: Vec<(i64, i64, i64)>,
    /// A sending tile: the destination rank and the window rows it owns there.
    owned: Option<(u32, i64, i64)>,
    /// What the last derived task reads, without repeats, in order of first access.
    pub reads: Vec<Region>,
    /// What the last derived task writes, in statement order.
    pub writes: Vec<Region>,
}

impl Deriver {
    /// Derives the regions of task `t` into `self.reads` and `self.writes`.
    pub fn derive(&mut self, tf: &Taskflow, g: &TaskGraph, t: usize) {
        self.reads.clear();
        self.writes.clear();
        let node = g.node[t];
        if self.call.as_ref().is_none_or(|c| c.node != node) {
            self.call = Some(call_of(tf, g, node));
        }
        let Some(call) = self.call.take() else { return };
        self.tile_values(tf, g, t, &call);
        self.accesses(tf, g, t, &call);
        self.call = Some(call);
    }

    /// Step 1: the values of every variable in the tile.
    fn tile_values(&mut self, tf: &Taskflow, g: &TaskGraph, t: usize, call: &Call) {
        let rank = g.rank[t] as usize;
        let body = &tf.nodes[call.node as usize].body;
        g.chunks_into(t, &mut self.chunks);
        self.sent.clear();
        self.owned = None;
        if let Some(d) = call.send_dim {
            self.sending_rows(g, rank, call, d);
        }
        let (tok, cho) = self.sent.iter().fold((None, None), |(a, b), &(tk, ch, _)| {
            let widen =
                |x: Option<(i64, i64)>, v: i64| Some(x.map_or((v, v + 1), |(lo, hi)| (lo.min(v), hi.max(v + 1))));
            (widen(a, tk), widen(b, ch))
        });
        self.span.clear();
        self.span.resize(body.vars.len(), (0, 0));
        for &v in &call.order {
            let Some(var) = body.vars.get(v) else { continue };
            self.span[v] = match call.roles[v] {
                Role::Tiled { dim, clip } => match self.chunks.get(dim) {
                    Some(c) => match clip {
                        Some((lo, hi)) => (c.lo.max(lo), c.hi.min(hi)),
                        None => (c.lo, c.hi),
                    },
                    None => (0, 0),
                },
                Role::Sent { choice } => (if choice { cho } else { tok }).unwrap_or((0, 0)),
                Role::Whole => match var.range {
                    VarRange::Fixed { lo, hi } => (lo, hi),
                    VarRange::Recv(r) => (0, layout_of(g, r).map_or(0, |l| i64::from(l.rows(rank)))),
                    VarRange::GroupRows { route, group } => {
                        let (first, end) = self.span.get(group).copied().unwrap_or((0, 0));
                        match layout_of(g, route).and_then(|l| l.group_off.get(rank)) {
                            Some(starts) if end > first => {
                                let at = |e: i64| usize::try_from(e).ok().and_then(|e| starts.get(e)).copied();
                                (i64::from(at(first).unwrap_or(0)), i64::from(at(end).unwrap_or(0)))
                            }
                            _ => (0, 0),
                        }
                    }
                },
            };
        }
    }

    /// The rows a sending chunk sends and the window rows it owns.
    fn sending_rows(&mut self, g: &TaskGraph, rank: usize, call: &Call, d: usize) {
        let DimKind::Send { route, .. } = &g.nodes[call.node as usize].dims[d].kind else {
            return;
        };
        let (Some(l), Some(c)) = (layout_of(g, *route), self.chunks.get(d).copied()) else {
            return;
        };
        let e = c.group as usize;
        let (Some(list), Some(by_expert)) = (l.send.get(rank), l.send_off.get(rank)) else {
            return;
        };
        let (Some(&first), Some(&end)) = (by_expert.get(e), by_expert.get(e + 1)) else {
            return;
        };
        let (first, end) = (i64::from(first), i64::from(end));
        // Exact windows chunk the rank's send list; static ones the positions of the
        // (expert, source) segment, whose rows past the expert's count are padding.
        let (a, b) = if l.static_capacity {
            let count = end - first;
            (first + c.lo.clamp(0, count), first + c.hi.clamp(0, count))
        } else {
            (c.lo.clamp(first, end), c.hi.clamp(first, end))
        };
        if let Some(rows) = list.get(a.max(0) as usize..b.max(a).max(0) as usize) {
            self.sent.extend(
                rows.iter()
                    .map(|s| (i64::from(s.token), i64::from(s.choice), i64::from(s.slot))),
            );
        }
        let local = l.local_experts().max(1);
        let dest = (e / local) as u32;
        let owned = if l.static_capacity {
            let segment = l
                .group_off
                .get(dest as usize)
                .and_then(|s| s.get(e % local))
                .map_or(0, |&o| i64::from(o))
                + rank as i64 * i64::from(l.segment_capacity());
            (segment + c.lo, segment + c.hi)
        } else {
            let lo = self.sent.iter().map(|s| s.2).min();
            let hi = self.sent.iter().map(|s| s.2 + 1).max();
            (lo.unwrap_or(0), hi.unwrap_or(0))
        };
        self.owned = Some((dest, owned.0, owned.1));
    }

    /// The values an index takes over the tile, in dimension `k` of `tensor` on `rank`.
    fn image(&self, g: &TaskGraph, call: &Call, ix: &Index, tensor: &Tensor, k: usize, rank: usize) -> (i64, i64) {
        let span = |v: usize| self.span.get(v).copied().filter(|(lo, hi)| hi > lo);
        match ix {
            Index::Affine { var, coef, offset } => match span(*var) {
                Some((lo, hi)) => {
                    let (a, b) = (coef * lo + offset, coef * (hi - 1) + offset);
                    (a.min(b), a.max(b) + 1)
                }
                None => (0, 0),
            },
            Index::Const(c) => (*c, c + 1),
            Index::Group(v) => match span(*v) {
                Some((lo, hi)) => {
                    let group = |row: i64| match call.group_route.and_then(|r| layout_of(g, r)) {
                        Some(l) => expert_of_row(l, rank, row),
                        None => 0,
                    };
                    (group(lo), group(hi - 1) + 1)
                }
                None => (0, 0),
            },
            Index::Route { .. } => match tensor.shape.get(k) {
                Some(Dim::Fixed(n)) => (0, *n as i64),
                Some(Dim::Recv(r)) => (0, layout_of(g, *r).map_or(0, |l| i64::from(l.rows(rank)))),
                None => (0, 0),
            },
        }
    }

    /// Steps 2 to 4: the reads and writes of every statement.
    fn accesses(&mut self, tf: &Taskflow, g: &TaskGraph, t: usize, call: &Call) {
        let rank = g.rank[t] as usize;
        let node = &tf.nodes[call.node as usize];
        let body: &ConcreteBody = &node.body;
        let out = tf.tensor(node.output);
        let sending = call.send_dim.is_some();
        let mut reads = std::mem::take(&mut self.reads);
        let mut writes = std::mem::take(&mut self.writes);
        let blank = |tensor, rank: usize, ndim: usize, accumulate| Region {
            tensor,
            rank: rank as u32,
            ndim: ndim.min(MAX_DIMS) as u8,
            lo: [0; MAX_DIMS],
            hi: [0; MAX_DIMS],
            accumulate,
        };
        for (si, st) in body.stmts.iter().enumerate() {
            let evaluated = st.vars.iter().all(|&v| {
                matches!(call.roles.get(v), Some(Role::Sent { .. })) || self.span.get(v).is_some_and(|(lo, hi)| hi > lo)
            }) && (!sending || !self.sent.is_empty());
            if evaluated {
                for (tid, ix) in call.reads.get(si).into_iter().flatten() {
                    let tensor = tf.tensor(*tid);
                    let mut r = blank(*tid, rank, ix.len(), false);
                    for (k, i) in ix.iter().enumerate().take(MAX_DIMS) {
                        (r.lo[k], r.hi[k]) = self.image(g, call, i, tensor, k, rank);
                    }
                    if !r.is_empty() && !reads.contains(&r) {
                        reads.push(r);
                    }
                }
            }
            let owns_rows = self.owned.is_some_and(|(_, lo, hi)| hi > lo);
            if !evaluated && !owns_rows {
                continue;
            }
            match &st.target {
                Target::Out(ix) => {
                    let mut w = blank(node.output, rank, out.shape.len(), st.accumulate);
                    for (k, i) in ix.iter().enumerate().take(MAX_DIMS) {
                        (w.lo[k], w.hi[k]) = self.image(g, call, i, out, k, rank);
                    }
                    if !w.is_empty() {
                        writes.push(w);
                    }
                }
                Target::Put { rank: to, index } => {
                    let row_dim = index.iter().position(|i| matches!(i, Index::Route { .. }));
                    if let Some((dest, lo, hi)) = self.owned {
                        let mut w = blank(node.output, dest as usize, out.shape.len(), st.accumulate);
                        for (k, i) in index.iter().enumerate().take(MAX_DIMS) {
                            (w.lo[k], w.hi[k]) = if Some(k) == row_dim {
                                (lo, hi)
                            } else {
                                self.image(g, call, i, out, k, dest as usize)
                            };
                        }
                        if !w.is_empty() {
                            writes.push(w);
                        }
                    } else if let Index::Route {
                        route,
                        func: RouteFn::SrcRank,
                        args,
                    } = to
                    {
                        // Row by row: each received row goes back to where it came from.
                        let (Some(l), Some(&m)) = (layout_of(g, *route), args.first()) else {
                            continue;
                        };
                        let (first, end) = self.span.get(m).copied().unwrap_or((0, 0));
                        let Some(rows) = l.recv.get(rank) else { continue };
                        // The dimensions that do not depend on the row, per source rank: the
                        // last rank's box is reused while the source stays the same.
                        let mut fixed: Option<(u32, Region)> = None;
                        for row in first.max(0)..end {
                            let Some(src) = rows.get(row as usize).filter(|e| e.src_rank != NO_SOURCE) else {
                                continue;
                            };
                            let mut w = match fixed {
                                Some((r, w)) if r == src.src_rank => w,
                                _ => {
                                    let mut w =
                                        blank(node.output, src.src_rank as usize, out.shape.len(), st.accumulate);
                                    for (k, i) in index.iter().enumerate().take(MAX_DIMS) {
                                        if !by_row(i, m) {
                                            (w.lo[k], w.hi[k]) = self.image(g, call, i, out, k, src.src_rank as usize);
                                        }
                                    }
                                    fixed = Some((src.src_rank, w));
                                    w
                                }
                            };
                            for (k, i) in index.iter().enumerate().take(MAX_DIMS) {
                                match i {
                                    Index::Route {
                                        func: RouteFn::SrcToken,
                                        args,
                                        ..
                                    } if args.first() == Some(&m) => {
                                        (w.lo[k], w.hi[k]) = (i64::from(src.src_token), i64::from(src.src_token) + 1);
                                    }
                                    Index::Route {
                                        func: RouteFn::SrcRank,
                                        args,
                                        ..
                                    } if args.first() == Some(&m) => {
                                        (w.lo[k], w.hi[k]) = (i64::from(src.src_rank), i64::from(src.src_rank) + 1);
                                    }
                                    Index::Affine { var, coef, offset } if *var == m => {
                                        (w.lo[k], w.hi[k]) = (coef * row + offset, coef * row + offset + 1);
                                    }
                                    _ => {}
                                }
                            }
                            if !w.is_empty() {
                                writes.push(w);
                            }
                        }
                    }
                }
            }
        }
        self.reads = reads;
        self.writes = writes;
    }
}
