//! Evaluation of analysed op bodies at one point (the executable form the checker built).

use super::store::TensorStore;
use hpmoe_dsl::ir::{ConcreteBody, Index, RouteFn, SExpr, TensorId, VarRange};
use hpmoe_dsl::lower::{RouteLayout, TaskGraph, NO_SOURCE};
use hpmoe_dsl::syntax::ast::{BinOp, ReduceOp};

/// The number type of an executor: f32 for the device, f64 for the reference.
pub trait Num: Copy + Default + std::fmt::Debug {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn neg(self) -> Self;
}

macro_rules! num {
    ($t:ty) => {
        impl Num for $t {
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn rem(self, o: Self) -> Self {
                self % o
            }
            fn neg(self) -> Self {
                -self
            }
        }
    };
}
num!(f32);
num!(f64);

/// Routing lookups for one routing: slots of (rank, token, choice).
#[derive(Clone, Debug)]
pub struct RouteIndex {
    /// `[rank][token * topk + choice]` → destination window row.
    pub slot: Vec<Vec<u32>>,
}

impl RouteIndex {
    pub fn new(l: &RouteLayout) -> RouteIndex {
        let topk = l.routing.topk;
        let slot = (0..l.ranks())
            .map(|s| {
                let mut v = vec![0u32; l.routing.tokens * topk];
                for e in &l.send[s] {
                    v[e.token as usize * topk + e.choice as usize] = e.slot;
                }
                v
            })
            .collect();
        RouteIndex { slot }
    }
}

/// What evaluation needs besides the point.
pub struct Env<'a, T> {
    pub g: &'a TaskGraph,
    pub body: &'a ConcreteBody,
    pub inputs: &'a [TensorId],
    pub stores: &'a [TensorStore<T>],
    pub routes: &'a [Option<RouteIndex>],
    pub rank: usize,
    /// Values of the body's variables at the point.
    pub vars: Vec<i64>,
    /// Scratch for indices.
    pub ix: Vec<i64>,
    /// Set when an index falls outside its tensor (reads 0).
    pub out_of_range: bool,
    /// Where the elements read are recorded, if anywhere.
    pub log: Option<&'a mut ReadLog>,
}

/// The elements an evaluation actually reads: per tensor chosen for recording, the offsets
/// of the elements read on the evaluating rank, each once per [`ReadLog::begin`].
#[derive(Debug, Default)]
pub struct ReadLog {
    /// Per tensor: whether its reads are recorded.
    track: Vec<bool>,
    /// Per tensor: the stamp of the round that last recorded each element.
    seen: Vec<Vec<u32>>,
    stamp: u32,
    /// `(tensor, offset)` of every element read this round, in order of first read.
    pub read: Vec<(TensorId, usize)>,
}

impl ReadLog {
    /// A log that records reads of the tensors for which `track` is true.
    pub fn new(track: Vec<bool>) -> ReadLog {
        ReadLog {
            seen: vec![Vec::new(); track.len()],
            track,
            stamp: 0,
            read: Vec::new(),
        }
    }

    /// Starts a new round: forgets what was read.
    pub fn begin(&mut self) {
        self.read.clear();
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // The stamps wrapped: old marks could alias the new round.
            self.seen.iter_mut().for_each(|s| s.fill(0));
            self.stamp = 1;
        }
    }

    /// Records a read of element `offset` of `tensor` (of `len` elements on this rank).
    pub fn record(&mut self, tensor: TensorId, offset: usize, len: usize) {
        let ti = tensor.0 as usize;
        if !self.track.get(ti).copied().unwrap_or(false) {
            return;
        }
        let seen = &mut self.seen[ti];
        if seen.len() < len {
            seen.resize(len, 0);
        }
        if seen[offset] != self.stamp {
            seen[offset] = self.stamp;
            self.read.push((tensor, offset));
        }
    }
}

fn layout(g: &TaskGraph, r: hpmoe_dsl::ir::RouteId) -> Option<&RouteLayout> {
    g.layouts.get(r.0 as usize).and_then(|l| l.as_ref())
}

impl<T> std::fmt::Debug for Env<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("rank", &self.rank)
            .field("vars", &self.vars)
            .finish()
    }
}

/// A routing function's value at the point (`None` for a padding row).
pub fn route_fn<T>(env: &Env<T>, route: hpmoe_dsl::ir::RouteId, func: RouteFn, args: &[usize]) -> Option<f64> {
    let l = layout(env.g, route)?;
    let r = env.rank;
    let a0 = *env.vars.get(*args.first()?)?;
    match func {
        RouteFn::Rank | RouteFn::Slot | RouteFn::Expert | RouteFn::Weight => {
            let t = a0 as usize;
            let j = *env.vars.get(*args.get(1)?)? as usize;
            let topk = l.routing.topk;
            if t >= l.routing.tokens || j >= topk || !l.routing.is_kept(r, t, j) {
                // Past the routing, or a dropped choice: nothing is sent.
                return None;
            }
            let e = l.routing.expert_of(r, t, j);
            Some(match func {
                RouteFn::Rank => l.rank_of_expert(e) as f64,
                RouteFn::Expert => e as f64,
                RouteFn::Slot => env.routes.get(route.0 as usize)?.as_ref()?.slot[r][t * topk + j] as f64,
                _ => l.routing.weight[(r * l.routing.tokens + t) * topk + j] as f64,
            })
        }
        RouteFn::SrcRank | RouteFn::SrcToken | RouteFn::SrcWeight => {
            let ent = l.recv.get(r)?.get(a0 as usize)?;
            if ent.src_rank == NO_SOURCE {
                return None;
            }
            Some(match func {
                RouteFn::SrcRank => ent.src_rank as f64,
                RouteFn::SrcToken => ent.src_token as f64,
                _ => {
                    let (s, t, j) = (ent.src_rank as usize, ent.src_token as usize, ent.src_choice as usize);
                    l.routing.weight[(s * l.routing.tokens + t) * l.routing.topk + j] as f64
                }
            })
        }
    }
}

/// An index's value at the point.
pub fn index<T>(env: &Env<T>, ix: &Index) -> Option<i64> {
    match ix {
        Index::Affine { var, coef, offset } => Some(coef * env.vars[*var] + offset),
        Index::Const(c) => Some(*c),
        Index::Group(v) => {
            let route = env.body.vars.iter().find_map(|x| match x.range {
                VarRange::Recv(r) | VarRange::GroupRows { route: r, .. } => Some(r),
                _ => None,
            })?;
            let l = layout(env.g, route)?;
            Some(l.group_of_row(env.rank, env.vars[*v].max(0) as u32) as i64)
        }
        Index::Route { route, func, args } => route_fn(env, *route, *func, args).map(|x| x as i64),
    }
}

/// Evaluates an expression at the point.
pub fn eval<T: Num>(env: &mut Env<T>, e: &SExpr) -> T {
    match e {
        SExpr::Const(c) => T::from_f64(*c),
        SExpr::Var(v) => T::from_f64(env.vars[*v] as f64),
        SExpr::Route { route, func, args } => T::from_f64(route_fn(env, *route, *func, args).unwrap_or(0.0)),
        SExpr::Read { input, index: ixs } => {
            let mut buf = std::mem::take(&mut env.ix);
            buf.clear();
            let mut ok = true;
            for i in ixs {
                match index(env, i) {
                    Some(x) => buf.push(x),
                    None => ok = false,
                }
            }
            let tid = env.inputs[*input];
            let store = &env.stores[tid.0 as usize];
            let v = if ok {
                match store.offset(env.rank, &buf) {
                    Some(o) => {
                        if let Some(log) = env.log.as_deref_mut() {
                            log.record(tid, o, store.data[env.rank].len());
                        }
                        store.data[env.rank][o]
                    }
                    None => {
                        env.out_of_range = true;
                        T::default()
                    }
                }
            } else {
                T::default()
            };
            env.ix = buf;
            v
        }
        SExpr::Neg(a) => eval(env, a).neg(),
        SExpr::Bin(op, a, b) => {
            let x = eval(env, a);
            let y = eval(env, b);
            match op {
                BinOp::Add => x.add(y),
                BinOp::Sub => x.sub(y),
                BinOp::Mul => x.mul(y),
                BinOp::Div => x.div(y),
                BinOp::Rem => x.rem(y),
            }
        }
        SExpr::Call(f, args) => {
            let mut a = [0.0; 3];
            for (slot, x) in a.iter_mut().zip(args) {
                *slot = eval(env, x).to_f64();
            }
            T::from_f64(f.apply(a))
        }
        SExpr::Cast(d, a) => {
            let x = eval(env, a).to_f64();
            T::from_f64(d.cast(x))
        }
        SExpr::Sum { op, vars, body } => {
            let mut acc = match op {
                ReduceOp::Sum => T::default(),
                ReduceOp::Max => T::from_f64(f64::NEG_INFINITY),
            };
            sum_loop(env, *op, vars, 0, body, &mut acc);
            acc
        }
    }
}

fn sum_loop<T: Num>(env: &mut Env<T>, op: ReduceOp, vars: &[usize], k: usize, body: &SExpr, acc: &mut T) {
    let Some(&v) = vars.get(k) else {
        let x = eval(env, body);
        *acc = match op {
            ReduceOp::Sum => acc.add(x),
            // A NaN term makes the maximum NaN (f64::max would ignore it).
            ReduceOp::Max => {
                let (a, b) = (acc.to_f64(), x.to_f64());
                if a.is_nan() || b.is_nan() {
                    T::from_f64(f64::NAN)
                } else if b > a {
                    x
                } else {
                    *acc
                }
            }
        };
        return;
    };
    let (lo, hi) = reduce_range(env, v);
    let saved = env.vars[v];
    for i in lo..hi {
        env.vars[v] = i;
        sum_loop(env, op, vars, k + 1, body, acc);
    }
    env.vars[v] = saved;
}

/// The values a reduction variable takes at the current point.
pub fn reduce_range<T>(env: &Env<T>, v: usize) -> (i64, i64) {
    match env.body.vars[v].range {
        VarRange::Fixed { lo, hi } => (lo, hi),
        VarRange::Recv(r) => (0, layout(env.g, r).map_or(0, |l| l.rows(env.rank) as i64)),
        VarRange::GroupRows { route, group } => match layout(env.g, route) {
            Some(l) => {
                let g = env.vars[group].max(0) as usize;
                let off = &l.group_off[env.rank];
                (
                    off.get(g).copied().unwrap_or(0) as i64,
                    off.get(g + 1).copied().unwrap_or(0) as i64,
                )
            }
            None => (0, 0),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::ReadLog;
    use hpmoe_dsl::ir::TensorId;

    #[test]
    fn the_read_log_keeps_each_tracked_element_once_per_round() {
        let mut log = ReadLog::new(vec![true, false]);
        log.begin();
        for o in [3, 1, 3, 0, 1] {
            log.record(TensorId(0), o, 4);
        }
        log.record(TensorId(1), 2, 4);
        assert_eq!(log.read, vec![(TensorId(0), 3), (TensorId(0), 1), (TensorId(0), 0)]);
        log.begin();
        log.record(TensorId(0), 3, 4);
        assert_eq!(log.read, vec![(TensorId(0), 3)], "a new round forgets the old reads");
    }
}
