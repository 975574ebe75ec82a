//! The executors: the tiled one runs every task's arithmetic in f32 in schedule order on
//! per-rank memories, with puts writing into peers' windows and a dynamic race check on the
//! elements each statement actually read (before its own writes are applied); the
//! dense one evaluates every op call over its whole index space in f64, with no tiles, no
//! schedule and no concurrency, as a reference.

use super::eval::{eval, index, Env, Num, ReadLog, RouteIndex};
use super::store::{round_bf16, TensorStore, NO_WRITER};
use hpmoe_dsl::ir::{BodyStmt, Index, RouteFn, Target, Taskflow, TensorId, VarRange};
use hpmoe_dsl::lower::regions::{tile_ranges, TileRanges};
use hpmoe_dsl::lower::TaskGraph;
use hpmoe_dsl::schedule::Schedule;

/// A read whose data no write ordered before it produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Race {
    pub reader: u32,
    /// The last writer (not ordered before the reader), or `None` when nothing wrote yet.
    pub writer: Option<u32>,
    pub tensor: TensorId,
    pub rank: u32,
    pub at: Vec<i64>,
}

/// Iterates the points of a statement: `dims` are (variable, lo, hi); `sparse` are (token
/// variable, choice variable, entries) for a sending put.
/// The (token variable, choice variable, entries) of a sending put.
type Sparse<'a> = Option<(usize, usize, &'a [(u32, u32, u32)])>;

fn for_points<T: Num>(
    env: &mut Env<T>,
    dims: &[(usize, i64, i64)],
    sparse: Sparse<'_>,
    f: &mut impl FnMut(&mut Env<T>),
) {
    if dims.iter().any(|&(_, lo, hi)| hi <= lo) {
        return;
    }
    let mut inner = |env: &mut Env<T>| {
        for &(v, lo, _) in dims {
            env.vars[v] = lo;
        }
        loop {
            f(env);
            // Odometer over the dense dimensions.
            let mut k = dims.len();
            loop {
                if k == 0 {
                    return;
                }
                k -= 1;
                let (v, lo, hi) = dims[k];
                env.vars[v] += 1;
                if env.vars[v] < hi {
                    break;
                }
                env.vars[v] = lo;
            }
        }
    };
    match sparse {
        Some((tv, jv, entries)) => {
            for &(t, j, _) in entries {
                env.vars[tv] = t as i64;
                env.vars[jv] = j as i64;
                inner(env);
            }
        }
        None => inner(env),
    }
}

/// Where a statement writes at the current point: the rank, with the index in `ix`, or
/// `None` (padding).
fn target<T>(env: &Env<T>, st: &BodyStmt, ix: &mut Vec<i64>) -> Option<usize> {
    ix.clear();
    let (rank, idx) = match &st.target {
        Target::Out(idx) => (env.rank, idx),
        Target::Put { rank, index: idx } => (index(env, rank)? as usize, idx),
    };
    for i in idx {
        ix.push(index(env, i)?);
    }
    Some(rank)
}

/// The sending put's (token, choice) variables, if the statement is one.
fn send_vars(st: &BodyStmt) -> Option<(usize, usize)> {
    match &st.target {
        Target::Put {
            rank:
                Index::Route {
                    func: RouteFn::Rank,
                    args,
                    ..
                },
            ..
        } => Some((args[0], args[1])),
        _ => None,
    }
}

/// Evaluates a statement at every point of `dims` (and `sparse`) on `rank` and stores each
/// value into `out` (the call's output, taken out of `stores`) as it is computed, through
/// `store(out, rank, offset, value)`. A call's output is a tensor of its own, never one of
/// its inputs, so no evaluation reads what the statement writes, and the values need not
/// be held until the statement is done (for a dense call that would be a record per
/// element of its output).
#[allow(clippy::too_many_arguments)]
fn statement_writes<T: Num>(
    g: &TaskGraph,
    node: &hpmoe_dsl::ir::Node,
    st: &BodyStmt,
    stores: &[TensorStore<T>],
    out: &mut TensorStore<T>,
    routes: &[Option<RouteIndex>],
    rank: usize,
    dims: &[(usize, i64, i64)],
    sparse: Sparse<'_>,
    log: Option<&mut ReadLog>,
    store: &mut impl FnMut(&mut TensorStore<T>, usize, usize, T),
) {
    let mut env = Env {
        g,
        body: &node.body,
        inputs: &node.inputs,
        stores,
        routes,
        rank,
        vars: vec![0; node.body.vars.len()],
        ix: Vec::new(),
        out_of_range: false,
        log,
    };
    let mut ix = Vec::new();
    for_points(&mut env, dims, sparse, &mut |env| {
        let v: T = eval(env, &st.value);
        if let Some(r) = target(env, st, &mut ix) {
            if let Some(o) = out.offset(r, &ix) {
                store(out, r, o, v);
            }
        }
    });
}

/// Settings of the tiled executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecOptions {
    /// Round every store of a bf16 tensor to bf16.
    pub bf16_storage: bool,
}

/// Ordering facts for the race check.
struct Order<'a> {
    g: &'a TaskGraph,
    s: &'a Schedule,
    pos: Vec<u32>,
    signallers: Vec<Vec<u32>>,
    seen: Vec<u32>,
    stamp: u32,
}

impl Order<'_> {
    /// Whether `w` is ordered before `t` by dependencies, counters or queue order.
    fn before(&mut self, w: u32, t: u32) -> bool {
        if self.g.preds(t as usize).binary_search(&w).is_ok() {
            return true;
        }
        let (cw, ct) = (self.s.core[w as usize], self.s.core[t as usize]);
        if cw == ct && self.pos[w as usize] < self.pos[t as usize] {
            return true;
        }
        self.stamp = self.stamp.wrapping_add(1);
        let mut stack = vec![t];
        let mut visited = 0usize;
        while let Some(x) = stack.pop() {
            let xu = x as usize;
            let queue_prev = {
                let c = self.s.core[xu] as usize;
                let p = self.pos[xu] as usize;
                (p > 0).then(|| self.s.queues.row(c)[p - 1])
            };
            let preds = self
                .s
                .waits
                .row(xu)
                .iter()
                .flat_map(|&c| self.signallers[c as usize].iter().copied());
            for p in preds.chain(queue_prev) {
                if p == w {
                    return true;
                }
                if self.seen[p as usize] != self.stamp {
                    self.seen[p as usize] = self.stamp;
                    visited += 1;
                    if visited > 1 << 20 {
                        return false;
                    }
                    stack.push(p);
                }
            }
        }
        false
    }
}

/// Checks the elements recorded in `log` (read by task `t` on `rank`) against their last
/// writers: each must have been written, by a task ordered before `t`. Reports the first bad
/// element of each tensor in row-major order.
fn check_reads<T: Copy + Default>(
    log: &mut ReadLog,
    stores: &[TensorStore<T>],
    rank: usize,
    t: u32,
    ord: &mut Order<'_>,
    races: &mut Vec<Race>,
) {
    log.read.sort_unstable_by_key(|&(tid, o)| (tid.0, o));
    let mut checked: Vec<u32> = Vec::new();
    let mut reported: Option<TensorId> = None;
    for &(tid, o) in &log.read {
        if reported == Some(tid) {
            continue;
        }
        let st = &stores[tid.0 as usize];
        let Some(&w) = st.writer.get(rank).and_then(|ws| ws.get(o)) else {
            continue;
        };
        let bad = if w == NO_WRITER {
            true
        } else if checked.contains(&w) {
            false
        } else {
            let ok = ord.before(w, t);
            if ok {
                checked.push(w);
            }
            !ok
        };
        if bad {
            reported = Some(tid);
            if races.len() < 64 {
                races.push(Race {
                    reader: t,
                    writer: (w != NO_WRITER).then_some(w),
                    tensor: tid,
                    rank: rank as u32,
                    at: unravel(&st.shape[rank], o),
                });
            }
        }
    }
}

/// The index of element `o` of a row-major array of `shape`.
fn unravel(shape: &[usize], mut o: usize) -> Vec<i64> {
    let mut at = vec![0i64; shape.len()];
    for k in (0..shape.len()).rev() {
        let n = shape[k].max(1);
        at[k] = (o % n) as i64;
        o /= n;
    }
    at
}

/// Runs every task in `order` (a start order of the schedule) on `stores` (inputs filled).
#[allow(clippy::too_many_arguments)]
pub fn execute_tiled(
    tf: &Taskflow,
    g: &TaskGraph,
    s: &Schedule,
    order: &[u32],
    stores: &mut [TensorStore<f32>],
    routes: &[Option<RouteIndex>],
    opts: ExecOptions,
) -> Vec<Race> {
    let n = g.len();
    let mut pos = vec![0u32; n];
    for c in 0..s.queues.len() {
        for (i, &t) in s.queues.row(c).iter().enumerate() {
            pos[t as usize] = i as u32;
        }
    }
    let mut signallers = vec![Vec::new(); s.threshold.len()];
    for t in 0..n {
        hpmoe_dsl::cancel::check_every(t);
        for c in s.signals(t) {
            signallers[c as usize].push(t as u32);
        }
    }
    let mut ord = Order {
        g,
        s,
        pos,
        signallers,
        seen: vec![0; n],
        stamp: 0,
    };
    let mut races = Vec::new();
    let mut ranges = TileRanges::default();
    // Reads are recorded for the tensors whose writers are tracked (the produced ones).
    let mut log = ReadLog::new(stores.iter().map(|s| !s.writer.is_empty()).collect());
    let bf16: Vec<bool> = tf
        .tensors
        .iter()
        .map(|t| opts.bf16_storage && t.dtype == hpmoe_dsl::ir::DType::Bf16)
        .collect();
    // Tensors of 1-byte dtypes hold only their values: every store rounds.
    let quant: Vec<Option<hpmoe_dsl::ir::DType>> = tf
        .tensors
        .iter()
        .map(|t| t.dtype.rounds_on_store().then_some(t.dtype))
        .collect();
    for &t in order {
        let tu = t as usize;
        let node = &tf.nodes[g.node[tu] as usize];
        let rank = g.rank[tu] as usize;
        tile_ranges(tf, g, tu, &mut ranges);
        let out = node.output.0 as usize;
        for st in &node.body.stmts {
            let sv = send_vars(st).filter(|_| ranges.send_dim.is_some());
            let dims: Vec<(usize, i64, i64)> = st
                .vars
                .iter()
                .filter(|&&v| sv.is_none_or(|(a, b)| v != a && v != b))
                .map(|&v| (v, ranges.vr[v].0, ranges.vr[v].1))
                .collect();
            let sparse = sv.map(|(a, b)| (a, b, &ranges.entries[..]));
            log.begin();
            // The output is taken out of `stores` while the statement writes it; no input is
            // the output (see `statement_writes`), so the reads see every other tensor.
            let mut out_store = std::mem::take(&mut stores[out]);
            statement_writes(
                g,
                node,
                st,
                stores,
                &mut out_store,
                routes,
                rank,
                &dims,
                sparse,
                Some(&mut log),
                &mut |store, r, o, v| {
                    let cur = store.data[r][o];
                    let mut x = if st.accumulate { cur + v } else { v };
                    if bf16[out] {
                        x = round_bf16(x);
                    }
                    if let Some(d) = quant[out] {
                        x = d.cast(x as f64) as f32;
                    }
                    store.data[r][o] = x;
                    if !store.writer.is_empty() {
                        store.writer[r][o] = t;
                    }
                },
            );
            stores[out] = out_store;
            // The race check: every element the statement read was last written by a task
            // ordered before this one.
            check_reads(&mut log, stores, rank, t, &mut ord, &mut races);
        }
        // A sending chunk owns its window rows, padding included.
        if let Some((d, lo, hi)) = ranges.dest_slots {
            let store = &mut stores[out];
            if !store.writer.is_empty() {
                let d = d as usize;
                let row: usize = store.shape[d].iter().skip(1).product();
                let lo = (lo.max(0) as usize * row).min(store.writer[d].len());
                let hi = (hi.max(0) as usize * row).min(store.writer[d].len());
                for w in &mut store.writer[d][lo..hi] {
                    if *w == NO_WRITER {
                        *w = t;
                    }
                }
            }
        }
    }
    races
}

/// Evaluates every op call of the taskflow over its whole index space, in f64.
pub fn execute_dense(tf: &Taskflow, g: &TaskGraph, stores: &mut [TensorStore<f64>], routes: &[Option<RouteIndex>]) {
    for node in &tf.nodes {
        let out = node.output.0 as usize;
        for rank in 0..g.ranks as usize {
            for st in &node.body.stmts {
                let dims: Vec<(usize, i64, i64)> = st
                    .vars
                    .iter()
                    .map(|&v| {
                        let (lo, hi) = match node.body.vars[v].range {
                            VarRange::Fixed { lo, hi } => (lo, hi),
                            VarRange::Recv(r) => (
                                0,
                                g.layouts
                                    .get(r.0 as usize)
                                    .and_then(|l| l.as_ref())
                                    .map_or(0, |l| l.rows(rank) as i64),
                            ),
                            VarRange::GroupRows { .. } => (0, 0),
                        };
                        (v, lo, hi)
                    })
                    .collect();
                let quant = tf.tensor(node.output).dtype;
                let quant = quant.rounds_on_store().then_some(quant);
                let mut out_store = std::mem::take(&mut stores[out]);
                statement_writes(
                    g,
                    node,
                    st,
                    stores,
                    &mut out_store,
                    routes,
                    rank,
                    &dims,
                    None,
                    None,
                    &mut |store, r, o, v| {
                        let x = if st.accumulate { store.data[r][o] + v } else { v };
                        store.data[r][o] = quant.map_or(x, |d| d.cast(x));
                    },
                );
                stores[out] = out_store;
            }
        }
    }
}
