//! The timing executor: a deterministic discrete-event simulation of every rank at once.
//!
//! In: a [`Workload`] (prepared from a compiled taskflow by [`Workload::new`]), its
//! [`Schedule`] and the [`DeviceModel`]. Out: a [`SimResult`] (every task's start and end,
//! L2 hits, counter times, link and HBM totals, optionally bandwidth samples), or a [`Stall`]
//! naming which core waits on which counter and who should have signalled it, when the
//! schedule cannot make progress (possible only with `--no-verify`).
//!
//! Semantics:
//! - each core runs its queue in order; a task starts when its core is free and every
//!   counter it waits on reached its threshold (at the time the last signal arrived, plus the
//!   kernel launch for a kernel barrier of `kernel_by_kernel`); every core starts after one
//!   kernel launch;
//! - at its start a task reads its blocks through the L2 of its die (hits and misses) and
//!   writes its output block; then three parts run side by side: compute (`compute` seconds),
//!   memory (its misses through the die's shared HBM, then its hits and writes at the core's
//!   L2 rates) and, for a put, the link (after the first `put_chunk_bytes` are read into the
//!   UB): one flow per destination, in order, at most `core_puts_in_flight` of the task's at
//!   once and `die_puts_in_flight` of its die's (a task that finds its die's queues full waits
//!   in a first-in-first-out line of that die); a flow holds its slot from its issue until its
//!   last byte left: `put_overhead` (plus `peer_setup` for the op call's first put from its
//!   rank to that peer), then its bytes at the max-min fair rate of its path, each flow
//!   capped by the window of its messages (one row each; see [`crate::model::link`]); the task ends when all three are done, plus `task_overhead`;
//! - a finished task signals its counters: local ones after `event_latency`, remote ones
//!   after the longest path latency to the ranks it signals (a signal follows its data, which
//!   lands its path's latency after its flow ends, into the destination's L2).
//! - link rates are solved once per simulated instant that started or finished a flow (an
//!   event queued behind that instant's others), over the component of pairs the changes
//!   touch. When those solves would take more than their budget (many ranks putting to
//!   many others: each solve then walks thousands of pairs, at nearly every instant), they
//!   are paced instead: from then on the rates are re-shared at multiples of an interval
//!   (10 ns, doubling for each further budget of work spent), a flow that starts or ends in
//!   between moving at its pair's previous rate until the next; the result says so
//!   ([`LinkPacing`]). The budget is counted in solve work, so the same input is paced the
//!   same way on any machine ([`LinkBudget`]; [`LinkBudget::UNLIMITED`] never paces).
//!
//! Events are ordered by (time, insertion order): the same input gives the same output, bit
//! for bit. The loop allocates nothing per event (flat arrays and one 4-ary heap; stale
//! predictions of the HBM and link models are dropped by generation numbers).

mod rowmap;
pub mod workload;

pub use workload::Workload;

use crate::model::hbm::Hbm;
use crate::model::heap::{IndexedHeap, Slot};
use crate::model::l2::L2;
use crate::model::link::Links;
use crate::model::{prefetch, DeviceModel, Fifo};
use hpmoe_dsl::schedule::Schedule;
use workload::NONE;

/// What to record besides the timeline.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Bandwidth samples of every die's HBM and every rank's links (for traces).
    pub record_bandwidth: bool,
    /// Where the event loop publishes how many tasks have ended, for a progress display.
    pub progress: Option<Progress>,
    /// Whether the choice among candidate schedules that precedes a run
    /// ([`crate::pipeline::run`]) may simulate two candidates at once, on a second thread,
    /// when memory allows (the result is the same either way).
    pub side_by_side: bool,
    /// Deliver an every-rank barrier's signals to its counters one by one instead of counted
    /// per barrier (the result is the same either way; slower with many ranks).
    pub barriers_one_by_one: bool,
    /// When the link rates stop being solved at every instant ([`LinkBudget`]).
    pub link_budget: LinkBudget,
}

/// The budget of the link model's exact solves, in solve work (pair freezes plus resources
/// taken, [`SolveStats`]): counted, not timed, so the same input is paced the same way on
/// any machine.
///
/// A simulation solves the link rates at every instant. Each time its solve work grows by
/// `exact_min`, it projects the work of the whole run: the work so far, plus the work per
/// flow ended since the last measure times the flows not ended yet. Once that passes
/// `exact`, it re-shares the rates at multiples of `interval` (s) instead, the interval
/// doubling after every `interval_work` of paced solves.
///
/// [`SolveStats`]: crate::model::link::SolveStats
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkBudget {
    pub exact_min: u64,
    pub exact: u64,
    pub interval: f64,
    pub interval_work: u64,
}

impl LinkBudget {
    /// Exact solves whatever the work.
    pub const UNLIMITED: LinkBudget = LinkBudget {
        exact_min: u64::MAX,
        exact: u64::MAX,
        interval: 10e-9,
        interval_work: u64::MAX,
    };
}

impl Default for LinkBudget {
    /// A measure every second or so of solving (`exact_min`, on this machine kind), about
    /// thirty seconds projected for the whole run (`exact`: well above the largest bundled
    /// example, a DeepSeek-V3 layer on 256 ranks, whose projection stays under 0.6e9); then
    /// 10 ns, doubling for every further second of solves. Ten nanoseconds is a twentieth
    /// of the shortest path latency of any bundled fabric (0.2 us, between the two dies of
    /// a package), less than a message takes.
    fn default() -> LinkBudget {
        LinkBudget {
            exact_min: 30_000_000,
            exact: 1_000_000_000,
            interval: 10e-9,
            interval_work: 30_000_000,
        }
    }
}

/// How the link rates were re-shared when a simulation's exact solves would pass their
/// budget: from `from` (s) on, at most once per interval, which grew from `first` to `last`
/// (s). A flow that starts or ends between two solves moves at its pair's previous rate, a
/// new pair's at none, until the next one: each start or end reaches the rates at most an
/// interval late.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkPacing {
    pub from: f64,
    pub first: f64,
    pub last: f64,
    /// The solve work done exactly before pacing began, the whole run's projected from it,
    /// and the budget it passed ([`LinkBudget::exact`]).
    pub exact_work: u64,
    pub projected_work: u64,
    pub budget: u64,
}

/// How far a simulation is, shared with another thread: the tasks it simulates (set when it
/// begins), those ended so far (updated every few thousand events, and at the end), and
/// which candidate schedule it is, if any.
#[derive(Clone, Debug, Default)]
pub struct Progress(std::sync::Arc<[std::sync::atomic::AtomicU64; 3]>);

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }
    /// Tasks simulated so far and the tasks of the simulation (0 and 0 before it begins).
    pub fn tasks(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.0[0].load(Relaxed), self.0[1].load(Relaxed))
    }
    fn set(&self, done: usize) {
        self.0[0].store(done as u64, std::sync::atomic::Ordering::Relaxed);
    }
    /// Numbers the candidate schedule being simulated (0: the schedule that runs).
    pub fn candidate(&self, k: usize) {
        self.0[2].store(k as u64, std::sync::atomic::Ordering::Relaxed);
    }
    /// The candidate schedule being simulated (0: the schedule that runs).
    pub fn candidates(&self) -> usize {
        self.0[2].load(std::sync::atomic::Ordering::Relaxed) as usize
    }
    fn begin(&self, total: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.0[0].store(0, Relaxed);
        self.0[1].store(total as u64, Relaxed);
    }
}

/// A bandwidth sample: from `time` on, `rank`'s HBM throughput (`a`), or its link egress
/// (`a`) and ingress (`b`), in B/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub time: f64,
    pub rank: u32,
    pub a: f64,
    pub b: f64,
}

/// The outcome of a simulation (times in seconds).
#[derive(Clone, Debug)]
pub struct SimResult {
    /// Per task.
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    /// Bytes read from L2 and from HBM.
    pub hit: Vec<f32>,
    pub miss: Vec<f32>,
    /// Per counter: when it reached its threshold (including a launch delay);
    /// `f64::INFINITY` if it never did (a counter nobody waits on may stay short).
    pub counter_time: Vec<f64>,
    /// Per flow: when its last byte left.
    pub flow_end: Vec<f64>,
    /// Per rank: when its last task ended or the last remote data landed in it.
    pub rank_done: Vec<f64>,
    pub makespan: f64,
    /// Per rank: bytes sent and received by flows, bytes moved out as integrated by the fluid
    /// model, and the time egress and ingress carried data.
    pub sent: Vec<f64>,
    pub received: Vec<f64>,
    pub moved_out: Vec<f64>,
    pub busy_out: Vec<f64>,
    pub busy_in: Vec<f64>,
    /// Per rank (die): HBM bytes moved (misses and write-backs), of which by the makespan
    /// (write-backs may go on after it), write-back bytes, busy time.
    pub hbm_bytes: Vec<f64>,
    pub hbm_layer_bytes: Vec<f64>,
    pub hbm_writeback: Vec<f64>,
    pub hbm_busy: Vec<f64>,
    pub hbm_samples: Vec<Sample>,
    pub link_samples: Vec<Sample>,
    /// Events processed.
    pub events: u64,
    /// The link model's solves.
    pub link: crate::model::link::SolveStats,
    /// Whether and how the link rates were re-shared at intervals instead of at every instant.
    pub link_pacing: Option<LinkPacing>,
}

impl SimResult {
    fn empty() -> SimResult {
        SimResult {
            start: Vec::new(),
            end: Vec::new(),
            hit: Vec::new(),
            miss: Vec::new(),
            counter_time: Vec::new(),
            flow_end: Vec::new(),
            rank_done: Vec::new(),
            makespan: 0.0,
            sent: Vec::new(),
            received: Vec::new(),
            moved_out: Vec::new(),
            busy_out: Vec::new(),
            busy_in: Vec::new(),
            hbm_bytes: Vec::new(),
            hbm_layer_bytes: Vec::new(),
            hbm_writeback: Vec::new(),
            hbm_busy: Vec::new(),
            hbm_samples: Vec::new(),
            link_samples: Vec::new(),
            events: 0,
            link: Default::default(),
            link_pacing: None,
        }
    }
}

/// One core that cannot proceed.
#[derive(Clone, Debug, PartialEq)]
pub struct StallWait {
    pub core: u32,
    pub task: u32,
    pub counter: u32,
    pub arrived: u32,
    pub threshold: u32,
    /// Tasks that signal the counter but never ran (at most a few).
    pub missing: Vec<u32>,
}

/// A schedule that stopped making progress.
#[derive(Clone, Debug, PartialEq)]
pub struct Stall {
    pub time: f64,
    pub done: usize,
    pub total: usize,
    /// Cores waiting, with the first counter each waits on (at most a few).
    pub waits: Vec<StallWait>,
    /// Cores that still had tasks.
    pub blocked_cores: usize,
}

const KICK: u8 = 0;
const TASK_END: u8 = 1;
// Kinds fit in 3 bits.
const SIG_LOCAL: u8 = 2;
const SIG_REMOTE: u8 = 3;
const COUNTER_READY: u8 = 4;
const HBM: u8 = 5;
const FLOW_START: u8 = 6;
const FLOW_DONE: u8 = 7;

#[derive(Clone, Copy, Debug)]
struct Ev {
    time: u64,
    /// Insertion order above, kind in the low 3 bits.
    key: u64,
    id: u32,
    gen: u32,
}

impl Ev {
    fn kind(&self) -> u8 {
        (self.key & 7) as u8
    }
}

/// A min-heap of events on (time, insertion order), four children per node: half the depth
/// of a binary heap, and the four children of a node share a cache line or two. Keys are
/// unique (the insertion order is), so any correct heap pops the same sequence.
#[derive(Debug, Default)]
struct Heap4 {
    v: Vec<Ev>,
}

impl Heap4 {
    /// (time, insertion order) as one 128-bit key: one branch-free comparison.
    #[inline]
    fn less(a: &Ev, b: &Ev) -> bool {
        ((a.time as u128) << 64 | a.key as u128) < ((b.time as u128) << 64 | b.key as u128)
    }

    /// The place of the earlier of the events at `i` and `j`.
    #[inline]
    fn lesser(&self, i: usize, j: usize) -> usize {
        std::hint::select_unpredictable(Self::less(&self.v[j], &self.v[i]), j, i)
    }

    #[inline]
    fn peek(&self) -> Option<&Ev> {
        self.v.first()
    }

    #[inline]
    fn push(&mut self, ev: Ev) {
        let mut i = self.v.len();
        self.v.push(ev);
        while i > 0 {
            let p = (i - 1) / 4;
            if !Self::less(&ev, &self.v[p]) {
                break;
            }
            self.v[i] = self.v[p];
            i = p;
        }
        self.v[i] = ev;
    }

    #[inline]
    fn pop(&mut self) -> Option<Ev> {
        let last = self.v.pop()?;
        let n = self.v.len();
        if n == 0 {
            return Some(last);
        }
        let top = self.v[0];
        // Moves the hole at the root down to where `last` belongs.
        let mut i = 0;
        loop {
            let c = 4 * i + 1;
            if c >= n {
                break;
            }
            // The least child, chosen without branches: which child is least is as good
            // as random, and a mispredicted branch per comparison cost more than the pop's
            // memory traffic.
            let m = if c + 4 <= n {
                let a = self.lesser(c, c + 1);
                let b = self.lesser(c + 2, c + 3);
                self.lesser(a, b)
            } else {
                let mut m = c;
                for j in c + 1..n {
                    m = self.lesser(m, j);
                }
                m
            };
            if !Self::less(&self.v[m], &last) {
                break;
            }
            self.v[i] = self.v[m];
            i = m;
        }
        self.v[i] = last;
        Some(top)
    }
}

/// The pending finish events of the link model's pairs, at most one per pair: a 4-ary heap
/// with each pair's place in it. The link model gives a pair's every new finish event a new
/// generation, so the event it replaces would have done nothing when popped; in one heap of
/// all events such replaced events were most of the link model's events (five in six on an
/// all-to-all), and made the heap of every event several times deeper.
type PairHeap = IndexedHeap<Ev>;

/// A pair's finish event in [`PairHeap`]: its slot is its pair.
impl Slot for Ev {
    #[inline]
    fn slot(&self) -> usize {
        self.id as usize
    }
    #[inline]
    fn less(&self, other: &Self) -> bool {
        Heap4::less(self, other)
    }
}

/// Events in (time, insertion) order: a 4-ary heap, plus first-in-first-out queues for the
/// kinds whose delay is a constant (local and remote signals, kernel launches), whose times
/// therefore arrive in order, and the pairs' finish events ([`PairHeap`]); popping takes the
/// earliest of the heads, so the order is the one a single heap would give (less the
/// replaced finish events, which did nothing).
#[derive(Debug, Default)]
struct Queue {
    heap: Heap4,
    fifo: [Fifo<Ev>; 3],
    pairs: PairHeap,
    seq: u64,
}

impl Queue {
    #[inline]
    fn push(&mut self, time: f64, kind: u8, id: u32, gen: u32) {
        debug_assert!(time >= 0.0 && time.is_finite(), "event time {time}");
        self.seq += 1;
        let ev = Ev {
            time: time.to_bits(),
            key: self.seq << 3 | kind as u64,
            id,
            gen,
        };
        if kind == FLOW_DONE && id != NONE {
            self.pairs.set(ev);
            return;
        }
        let lane = match kind {
            SIG_LOCAL => 0,
            SIG_REMOTE => 1,
            COUNTER_READY => 2,
            _ => usize::MAX,
        };
        match self.fifo.get_mut(lane) {
            Some(q) if q.back().is_none_or(|b| b.time <= ev.time) => q.push(ev),
            _ => self.heap.push(ev),
        }
    }

    #[inline]
    fn pop(&mut self) -> Option<Ev> {
        let mut best: Option<(u64, u64, usize)> = self.heap.peek().map(|e| (e.time, e.key, 3));
        for (i, q) in self.fifo.iter().enumerate() {
            if let Some(e) = q.front() {
                if best.is_none_or(|(t, k, _)| (e.time, e.key) < (t, k)) {
                    best = Some((e.time, e.key, i));
                }
            }
        }
        if let Some(e) = self.pairs.peek() {
            if best.is_none_or(|(t, k, _)| (e.time, e.key) < (t, k)) {
                best = Some((e.time, e.key, 4));
            }
        }
        match best?.2 {
            3 => self.heap.pop(),
            4 => self.pairs.pop(),
            i => self.fifo[i].pop(),
        }
    }
}

/// A task while it runs (internal ids).
#[derive(Clone, Copy, Debug, Default)]
struct TaskState {
    /// The task's work is done no earlier than this.
    partial: f64,
    /// Seconds of L2 traffic after its HBM part.
    tail: f64,
    /// Its next flow to issue (from its first), flows in flight, flows not yet finished.
    flow_next: u32,
    flow_active: u32,
    flow_left: u32,
    /// Waiting in its die's line for a put slot.
    waiting: bool,
    /// Parts (HBM, link) still running.
    pend: u8,
}

/// What is measured of a task (internal ids; moved to task order at the end).
#[derive(Clone, Copy, Debug)]
struct Times {
    start: f64,
    end: f64,
    hit: f32,
    miss: f32,
}

/// A counter while the schedule runs.
#[derive(Clone, Copy, Debug, Default)]
struct Ctr {
    count: u32,
    threshold: u32,
    /// Its waiters in `plan.waiters.idx[waiters..waiters_end]`.
    waiters: u32,
    waiters_end: u32,
    delay: f64,
}

struct Sim<'a> {
    w: &'a Workload,
    /// Per internal task: the least time from its start to the end of the layer (empty: not
    /// known), and the limit past which the simulation gives up; set once a task's start
    /// shows the makespan reaches the limit.
    chains: &'a [f64],
    limit: f64,
    over: bool,
    /// The latency a simulation run beside this one reached, if any: past it, this one gives
    /// up.
    race: Option<&'a Race>,
    s: &'a Schedule,
    m: &'a DeviceModel,
    opts: SimOptions,
    now: f64,
    queue: Queue,
    events: u64,
    l2: L2<'a>,
    hbm: Hbm,
    links: Links,
    /// Per die: put slots free and tasks waiting for one; per contact, whether it was made.
    die_free: Vec<u32>,
    die_wait: Vec<Fifo<u32>>,
    contacted: Vec<bool>,
    reshare_pending: bool,
    /// The interval between two solves of the link rates (0: every instant), the solve work
    /// when it last changed (while 0: when it was last measured against the budget), the
    /// flows ended so far and at that measure.
    interval: f64,
    interval_work: u64,
    flows_ended: u64,
    check_flows: u64,
    wakes: Vec<(u32, f64, u32)>,
    pos: Vec<u32>,
    idle: Vec<bool>,
    ts: Vec<TaskState>,
    /// Per internal task: the counters it still waits on (dense: read at every release).
    unsat: Vec<u32>,
    times: Vec<Times>,
    ctr: Vec<Ctr>,
    fans: Fans,
    done: usize,
    finished: Vec<u32>,
    last_hbm: Vec<f64>,
    last_link: Vec<(f64, f64)>,
    r: SimResult,
}

/// The first multiple of `interval` at or after `now` (`now` itself when the interval is 0).
fn next_tick(now: f64, interval: f64) -> f64 {
    if interval <= 0.0 {
        return now;
    }
    let t = (now / interval).ceil() * interval;
    if t >= now {
        t
    } else {
        now
    }
}

/// Simulates a schedule.
pub fn simulate(w: &Workload, s: &Schedule, m: &DeviceModel, opts: SimOptions) -> Result<SimResult, Stall> {
    simulate_within(w, s, m, opts, f64::INFINITY, &[], None)
        .map(|r| r.expect("an unbounded simulation runs to its end"))
}

/// Bytes a simulation of `w` allocates besides the workload, at most: per task its state,
/// times, counters waited on and result; per flow its end; per counter its state and time;
/// and the link model's pairs and flows ([`Links::state_bytes`]).
pub fn state_bytes(w: &Workload) -> u64 {
    use std::mem::size_of;
    let per_task =
        size_of::<TaskState>() + size_of::<Times>() + size_of::<u32>() + 2 * size_of::<f64>() + 2 * size_of::<f32>();
    let per_counter = size_of::<Ctr>() + size_of::<f64>();
    // Per pair: its place in the heap of finish events, and that event.
    let per_pair = size_of::<u32>() + size_of::<Ev>();
    let own =
        (w.tasks() * per_task + w.flows() * size_of::<f64>() + w.delay.len() * per_counter + w.pairs.len() * per_pair)
            as u64;
    own.saturating_add(Links::state_bytes(w.pairs.len(), w.flows()))
}

/// The least latency among simulations run side by side, shared between their threads: each
/// offers its makespan when it ends and gives up once its clock passes the least offered.
#[derive(Debug, Default)]
pub struct Race(std::sync::atomic::AtomicU64);

impl Race {
    pub fn new() -> Race {
        Race(std::sync::atomic::AtomicU64::new(f64::INFINITY.to_bits()))
    }
    /// The least makespan offered so far (infinite when none).
    pub fn best(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
    /// Offers a makespan (non-negative: the bits of such floats order as their values).
    pub fn offer(&self, makespan: f64) {
        if makespan >= 0.0 {
            self.0
                .fetch_min(makespan.to_bits(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// [`simulate_below_chained`] beside other simulations sharing `race`: `Ok(None)` when it gave
/// up (its clock past `limit` or past a makespan another offered, or a task start whose
/// chain reaches `limit`: its makespan is then strictly later than that one), else the
/// result, the same as [`simulate`]'s, its makespan offered to the others. Whether it gives up
/// depends on timing, never what it returns when it does not.
pub fn simulate_racing(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    opts: SimOptions,
    limit: f64,
    chains: &[f64],
    race: &Race,
) -> Result<Option<SimResult>, Stall> {
    let r = simulate_within(w, s, m, opts, limit, chains, Some(race))?;
    if let Some(r) = &r {
        race.offer(r.makespan);
    }
    Ok(r)
}

/// The makespan of a schedule if it is below `limit` seconds, or `None` (the simulation
/// stops at the first event past `limit`, or at a stall): how candidate schedules are
/// compared without simulating the rest of one that has already lost.
pub fn makespan_below(w: &Workload, s: &Schedule, m: &DeviceModel, opts: SimOptions, limit: f64) -> Option<f64> {
    simulate_below(w, s, m, opts, limit).map(|r| r.makespan)
}

/// [`makespan_below`] with the whole result: the simulation of a schedule whose makespan is
/// below `limit`, equal to what [`simulate`] gives with the same options; `None` when the
/// makespan is not below `limit` (or the schedule stalls).
pub fn simulate_below(w: &Workload, s: &Schedule, m: &DeviceModel, opts: SimOptions, limit: f64) -> Option<SimResult> {
    simulate_below_chained(w, s, m, opts, limit, &[])
}

/// [`simulate_below`], also giving up as soon as a task starting at time `t` has a chain
/// `chains[i]` (per internal task, [`crate::report::bounds_and_chains`]: a lower bound on
/// the time from its start to the end of the layer) with `t + chains[i]` not below `limit`
/// (relaxed by a relative `1e-9` against rounding): the makespan is then not below `limit`
/// either, so the answer is the same, found sooner. `chains` empty: no such test.
pub fn simulate_below_chained(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    opts: SimOptions,
    limit: f64,
    chains: &[f64],
) -> Option<SimResult> {
    match simulate_within(w, s, m, opts, limit, chains, None) {
        Ok(Some(r)) if r.makespan < limit => Some(r),
        _ => None,
    }
}

/// [`simulate`], giving up (`Ok(None)`) at the first event later than `limit`, or (checked
/// every few thousand events) later than the best makespan offered to `race`.
fn simulate_within(
    w: &Workload,
    s: &Schedule,
    m: &DeviceModel,
    opts: SimOptions,
    limit: f64,
    chains: &[f64],
    race: Option<&Race>,
) -> Result<Option<SimResult>, Stall> {
    let n = w.tasks();
    if let Some(p) = &opts.progress {
        p.begin(n);
    }
    let ranks = w.ranks as usize;
    let counters = s.threshold.len();
    let cores = s.queues.len();
    let ts: Vec<TaskState> = vec![TaskState::default(); n];
    let unsat = w.plan.waits.clone();
    let pw = &w.plan.waiters;
    let ctr: Vec<Ctr> = (0..counters)
        .map(|k| Ctr {
            count: 0,
            threshold: s.threshold[k],
            waiters: pw.off[k],
            waiters_end: pw.off[k + 1],
            delay: w.delay[k],
        })
        .collect();
    let counter_time: Vec<f64> = s
        .threshold
        .iter()
        .map(|&th| if th == 0 { w.start_time } else { f64::INFINITY })
        .collect();
    let fans = if opts.barriers_one_by_one {
        Fans::default()
    } else {
        Fans::new(&w.plan.fanout, s, ranks)
    };
    let mut sim = Sim {
        w,
        chains: &[],
        limit: f64::INFINITY,
        race,
        over: false,
        s,
        m,
        opts,
        now: 0.0,
        queue: Queue {
            heap: Heap4 {
                v: Vec::with_capacity(cores * 2 + 16),
            },
            pairs: PairHeap::new(w.pairs.len()),
            ..Queue::default()
        },
        events: 0,
        l2: L2::new(ranks, m.l2_size, &w.block_rank, &w.block_size),
        hbm: Hbm::new(ranks, m.hbm_bandwidth, m.core_hbm),
        links: Links::new(&m.topology, &w.pairs),
        die_free: vec![m.topology.die_puts; ranks],
        die_wait: (0..ranks).map(|_| Fifo::default()).collect(),
        contacted: vec![false; w.contacts as usize],
        reshare_pending: false,
        interval: 0.0,
        interval_work: 0,
        flows_ended: 0,
        check_flows: 0,
        wakes: Vec::new(),
        pos: vec![0; cores],
        idle: vec![true; cores],
        ts,
        unsat,
        times: vec![
            Times {
                start: f64::NAN,
                end: f64::NAN,
                hit: 0.0,
                miss: 0.0,
            };
            n
        ],
        fans,
        ctr,
        done: 0,
        finished: Vec::new(),
        last_hbm: vec![0.0; ranks],
        last_link: vec![(0.0, 0.0); ranks],
        r: SimResult {
            counter_time,
            flow_end: vec![f64::NAN; w.flows()],
            rank_done: vec![w.start_time; ranks],
            ..SimResult::empty()
        },
    };
    sim.push(w.start_time, KICK, 0, 0);
    // Chains of another workload's tasks (or none) mean no such test.
    sim.chains = if chains.len() == w.plan.info.len() { chains } else { &[] };
    sim.limit = limit * (1.0 + 1e-9);
    let ended = sim.run(limit);
    if let Some(p) = &sim.opts.progress {
        p.set(sim.done);
    }
    if !ended {
        return Ok(None);
    }
    if sim.done < n {
        return Err(sim.stall());
    }
    // The per-task state is no longer needed: free it before the results are laid out.
    drop((std::mem::take(&mut sim.ts), std::mem::take(&mut sim.unsat)));
    let mut r = std::mem::replace(&mut sim.r, SimResult::empty());
    // In task order, gathered through each task's internal id (every array written once,
    // front to back).
    r.start = Vec::with_capacity(n);
    r.end = Vec::with_capacity(n);
    r.hit = Vec::with_capacity(n);
    r.miss = Vec::with_capacity(n);
    for &i in &w.plan.pos {
        let x = &sim.times[i as usize];
        r.start.push(x.start);
        r.end.push(x.end);
        r.hit.push(x.hit);
        r.miss.push(x.miss);
    }
    r.makespan = r.rank_done.iter().copied().fold(0.0, f64::max);
    r.sent = sim.links.sent().to_vec();
    r.received = sim.links.received().to_vec();
    r.moved_out = sim.links.moved_out().to_vec();
    r.busy_out = sim.links.busy_out().to_vec();
    r.busy_in = sim.links.busy_in().to_vec();
    r.hbm_bytes = (0..ranks).map(|d| sim.hbm.served(d)).collect();
    r.hbm_layer_bytes = (0..ranks)
        .map(|d| sim.hbm.served_by(d, r.makespan).unwrap_or(r.hbm_bytes[d]))
        .collect();
    r.hbm_writeback = (0..ranks).map(|d| sim.hbm.writeback_bytes(d)).collect();
    r.hbm_busy = (0..ranks).map(|d| sim.hbm.busy(d)).collect();
    r.events = sim.events;
    r.link = sim.links.stats();
    Ok(Some(r))
}

impl Sim<'_> {
    #[inline]
    fn push(&mut self, time: f64, kind: u8, id: u32, gen: u32) {
        self.queue.push(time, kind, id, gen);
    }

    /// Runs the event loop to its end (`true`) or to the first event later than `limit`
    /// while tasks are left, or to a task start whose chain reaches the limit (`false`).
    fn run(&mut self, limit: f64) -> bool {
        while let Some(ev) = self.queue.pop() {
            self.now = f64::from_bits(ev.time);
            // Past the limit with tasks left: the makespan is later still. (With every task
            // ended, later events are stale ones of the link model and change nothing.)
            if self.now > limit && self.done < self.ts.len() {
                return false;
            }
            self.events += 1;
            // Every 4096 events: a cancellation check point, and the progress published.
            if self.events.is_multiple_of(4096) {
                hpmoe_dsl::cancel::check();
                if self.race.is_some_and(|r| self.now > r.best()) && self.done < self.ts.len() {
                    return false;
                }
                if let Some(p) = &self.opts.progress {
                    p.set(self.done);
                }
            }
            match ev.kind() {
                KICK => {
                    for c in 0..self.s.queues.len() {
                        self.try_start(c);
                    }
                }
                TASK_END => self.task_end(ev.id as usize),
                SIG_LOCAL => self.deliver(ev.id as usize, true),
                SIG_REMOTE => self.deliver(ev.id as usize, false),
                COUNTER_READY => self.satisfy(ev.id as usize),
                HBM => {
                    let d = ev.id as usize;
                    let mut fin = std::mem::take(&mut self.finished);
                    fin.clear();
                    let mut wakes = std::mem::take(&mut self.wakes);
                    wakes.clear();
                    self.hbm.fire(d, ev.gen, self.now, &mut fin, &mut wakes);
                    self.hbm_wakes(&wakes, d);
                    self.wakes = wakes;
                    for &t in &fin {
                        let t = t as usize;
                        let at = self.now + self.ts[t].tail;
                        self.part_done(t, at);
                    }
                    self.finished = fin;
                }
                FLOW_START if ev.gen == 0 => self.issue(ev.id as usize),
                FLOW_START => self.flow_start(ev.id as usize),
                FLOW_DONE if ev.id == NONE => {
                    self.reshare_pending = false;
                    let mut wakes = std::mem::take(&mut self.wakes);
                    wakes.clear();
                    self.links.reshare(self.now, &mut wakes);
                    self.link_wakes(&wakes, None);
                    self.wakes = wakes;
                    self.pace_links();
                }
                FLOW_DONE => self.pair_event(ev.id, ev.gen),
                _ => {}
            }
            if self.over {
                return false;
            }
        }
        true
    }

    fn try_start(&mut self, c: usize) {
        if !self.idle[c] {
            return;
        }
        let plan = &self.w.plan;
        let (lo, hi) = (plan.queue_off[c] as usize, plan.queue_off[c + 1] as usize);
        // Internal ids are in queue order: position `p` holds task `p`.
        let i = lo + self.pos[c] as usize;
        if i < hi && self.unsat[i] == 0 {
            self.idle[c] = false;
            self.start_task(i);
        }
    }

    /// The core's next tasks start after task `i`, each from memory the event loop has not
    /// touched since the workload was prepared. Each start fetches ahead what later starts
    /// read, in stages, each from what an earlier start fetched: the description of the task
    /// three ahead, the first read run of the task two ahead, and for the next task the L2
    /// state of its first block and its own state.
    #[inline]
    fn fetch_ahead(&self, i: usize) {
        let plan = &self.w.plan;
        let first_run = |t: usize| {
            let info = plan.info.get(t)?;
            plan.runs.get(info.reads as usize..info.read_end as usize)?.first()
        };
        if let Some(later) = plan.info.get(i + 3) {
            prefetch(later);
        }
        if let Some(run) = first_run(i + 2) {
            prefetch(run);
        }
        if let Some(run) = first_run(i + 1) {
            self.l2.prefetch(run.first);
        }
        if let (Some(u), Some(x), Some(st)) = (self.unsat.get(i + 1), self.times.get(i + 1), self.ts.get(i + 1)) {
            prefetch(u);
            prefetch(x);
            prefetch(st);
        }
    }

    fn start_task(&mut self, i: usize) {
        let w = self.w;
        let m = self.m;
        let plan = &w.plan;
        let info = plan.info[i];
        let now = self.now;
        let class = info.class as usize;
        let die = info.rank as usize;
        self.times[i].start = now;
        self.fetch_ahead(i);
        if let Some(&c) = self.chains.get(i) {
            if now + c >= self.limit {
                self.over = true;
            }
        }
        let (mut hit, mut miss, mut wb) = (0.0f64, 0.0f64, 0.0f64);
        for run in &plan.runs[info.reads as usize..info.read_end as usize] {
            let (first, count, bytes) = (run.first, run.count, run.bytes);
            if count == 1 {
                if self.l2.read(first, &mut wb) {
                    hit += bytes;
                } else {
                    miss += bytes;
                }
            } else {
                let (hs, all) = self.l2.read_run(first, count, &mut wb);
                let h = if all > 0.0 { bytes * hs / all } else { 0.0 };
                hit += h;
                miss += bytes - h;
            }
        }
        if info.local_block != NONE {
            self.l2.write(info.local_block, &mut wb);
        }
        self.times[i].hit = hit as f32;
        self.times[i].miss = miss as f32;
        let l2_time = hit / m.core_l2_read[class] + info.local_out / m.core_l2_write[class];
        let mut pend = 0u8;
        let mut partial = now + info.compute;
        let job = if miss > 0.0 {
            self.ts[i].tail = l2_time;
            pend += 1;
            Some((class, i as u32, miss))
        } else {
            partial = partial.max(now + l2_time);
            None
        };
        if wb > 0.0 || job.is_some() {
            let mut wakes = std::mem::take(&mut self.wakes);
            wakes.clear();
            self.hbm.update(die, now, wb, job, &mut wakes);
            self.hbm_wakes(&wakes, die);
            self.wakes = wakes;
        }
        if info.flows < info.flow_end {
            // The first chunk is read into the UB before the link starts.
            let total = info.read_total;
            let fill = if total > 0.0 {
                total.min(m.put_chunk_bytes) * (miss / total / m.core_hbm[class] + hit / total / m.core_l2_read[class])
            } else {
                0.0
            };
            let st = &mut self.ts[i];
            st.flow_next = 0;
            st.flow_active = 0;
            st.flow_left = info.flow_end - info.flows;
            self.push(now + fill, FLOW_START, i as u32, 0);
            pend += 1;
        }
        self.ts[i].pend = pend;
        self.ts[i].partial = partial;
        if pend == 0 {
            self.push(partial + m.task_overhead, TASK_END, i as u32, 0);
        }
    }

    /// One part (HBM or link) of task `t` ended; the task's work is done no earlier than `at`.
    fn part_done(&mut self, i: usize, at: f64) {
        let st = &mut self.ts[i];
        if at > st.partial {
            st.partial = at;
        }
        st.pend -= 1;
        if st.pend == 0 {
            let end = st.partial + self.m.task_overhead;
            self.push(end, TASK_END, i as u32, 0);
        }
    }

    /// Schedules the HBM finish events `wakes` asked for; samples die `d`'s throughput.
    fn hbm_wakes(&mut self, wakes: &[(u32, f64, u32)], d: usize) {
        for &(die, t, gen) in wakes {
            self.push(t.max(self.now), HBM, die, gen);
        }
        if self.opts.record_bandwidth {
            let x = self.hbm.throughput(d);
            if x != self.last_hbm[d] {
                self.last_hbm[d] = x;
                self.r.hbm_samples.push(Sample {
                    time: self.now,
                    rank: d as u32,
                    a: x,
                    b: 0.0,
                });
            }
        }
    }

    /// Task `i` issues its next flows while its core and its die have put slots.
    fn issue(&mut self, i: usize) {
        let info = self.w.plan.info[i];
        let die = info.rank as usize;
        let topo = &self.m.topology;
        while self.ts[i].flow_active < topo.core_puts && info.flows + self.ts[i].flow_next < info.flow_end {
            if self.die_free[die] == 0 {
                if !self.ts[i].waiting {
                    self.ts[i].waiting = true;
                    self.die_wait[die].push(i as u32);
                }
                return;
            }
            self.die_free[die] -= 1;
            let f = info.flows + self.ts[i].flow_next;
            self.ts[i].flow_next += 1;
            self.ts[i].flow_active += 1;
            let contact = self.w.flow_contact[f as usize] as usize;
            let mut delay = topo.put_overhead;
            if !self.contacted[contact] {
                self.contacted[contact] = true;
                delay += topo.peer_setup;
            }
            self.push(self.now + delay, FLOW_START, f, 1);
        }
    }

    /// Flow `f`'s bytes start to move.
    fn flow_start(&mut self, f: usize) {
        let pair = self.w.flow_pair[f];
        self.links
            .start_capped(pair, f as u32, self.w.flow_bytes[f], self.w.flow_cap[f], self.now);
        self.want_reshare();
    }

    /// Queues one solve of the link rates behind this instant's other events, or, once the
    /// solves are paced, at the next multiple of the interval.
    fn want_reshare(&mut self) {
        if !self.reshare_pending && self.links.is_dirty() {
            self.reshare_pending = true;
            let at = next_tick(self.now, self.interval);
            self.push(at, FLOW_DONE, NONE, 0);
        }
    }

    /// After a solve: paces the next ones when the exact solves would pass their budget
    /// (projected from the work so far and the work per flow lately), and doubles the
    /// interval for every `interval_work` of paced solves ([`LinkBudget`]).
    fn pace_links(&mut self) {
        let b = self.opts.link_budget;
        let st = self.links.stats();
        let work = st.pairs + st.resources;
        if self.interval == 0.0 {
            // A measure every `exact_min` of work: the work still to come is projected at
            // the rate per flow ended since the last measure (it grows as more pairs are
            // active at once).
            if work < self.interval_work.saturating_add(b.exact_min) {
                return;
            }
            let (dw, df) = (work - self.interval_work, self.flows_ended - self.check_flows);
            let left = self.w.flows() as u64 - self.flows_ended;
            let projected = (u128::from(work) + u128::from(dw) * u128::from(left) / u128::from(df.max(1)))
                .min(u128::from(u64::MAX)) as u64;
            self.interval_work = work;
            self.check_flows = self.flows_ended;
            if projected <= b.exact {
                return;
            }
            self.interval = b.interval;
            self.r.link_pacing = Some(LinkPacing {
                from: self.now,
                first: b.interval,
                last: b.interval,
                exact_work: work,
                projected_work: projected,
                budget: b.exact,
            });
        } else if work - self.interval_work >= b.interval_work {
            self.interval *= 2.0;
            self.interval_work = work;
            if let Some(p) = &mut self.r.link_pacing {
                p.last = self.interval;
            }
        }
    }

    /// Schedules the link finish events `wakes` asked for; samples throughputs.
    fn link_wakes(&mut self, wakes: &[(u32, f64, u32)], pair: Option<u32>) {
        for &(p, t, gen) in wakes {
            self.push(t.max(self.now), FLOW_DONE, p, gen);
        }
        if self.opts.record_bandwidth {
            if let Some(pair) = pair {
                self.sample_link(self.links.src(pair) as usize);
                self.sample_link(self.links.dst(pair) as usize);
            }
            for &(p, _, _) in wakes {
                self.sample_link(self.links.src(p) as usize);
                self.sample_link(self.links.dst(p) as usize);
            }
        }
    }

    fn sample_link(&mut self, r: usize) {
        let x = self.links.throughput(r);
        if x != self.last_link[r] {
            self.last_link[r] = x;
            self.r.link_samples.push(Sample {
                time: self.now,
                rank: r as u32,
                a: x.0,
                b: x.1,
            });
        }
    }

    /// A pair's finish event: its delivered flows end.
    fn pair_event(&mut self, pair: u32, gen: u32) {
        let mut done = std::mem::take(&mut self.finished);
        done.clear();
        let mut wakes = std::mem::take(&mut self.wakes);
        wakes.clear();
        self.links
            .fire(pair, gen, self.now, &self.w.flow_bytes, &mut done, &mut wakes);
        self.link_wakes(&wakes, Some(pair));
        self.wakes = wakes;
        for &f in &done {
            self.flow_done(f);
        }
        self.finished = done;
        self.want_reshare();
    }

    fn flow_done(&mut self, f: u32) {
        let fu = f as usize;
        let w = self.w;
        let now = self.now;
        self.flows_ended += 1;
        self.r.flow_end[fu] = now;
        // The data lands in the destination's L2.
        let d = w.flow_dst[fu] as usize;
        let arrive = now + self.links.latency(w.flow_pair[fu]);
        if arrive > self.r.rank_done[d] {
            self.r.rank_done[d] = arrive;
        }
        let mut wb = 0.0;
        if w.flow_block[fu] != NONE {
            self.l2.write(w.flow_block[fu], &mut wb);
        }
        if wb > 0.0 {
            let mut wakes = std::mem::take(&mut self.wakes);
            wakes.clear();
            self.hbm.writeback(d, wb, now, &mut wakes);
            self.hbm_wakes(&wakes, d);
            self.wakes = wakes;
        }
        let i = w.plan.pos[w.flow_task[fu] as usize] as usize;
        let die = w.plan.info[i].rank as usize;
        self.ts[i].flow_active -= 1;
        self.ts[i].flow_left -= 1;
        self.die_free[die] += 1;
        // The die's slot goes to the first task waiting for one, then this task goes on.
        while self.die_free[die] > 0 {
            let Some(j) = self.die_wait[die].pop() else {
                break;
            };
            self.ts[j as usize].waiting = false;
            self.issue(j as usize);
        }
        if self.ts[i].flow_left == 0 {
            self.part_done(i, now);
        } else {
            self.issue(i);
        }
    }

    fn task_end(&mut self, i: usize) {
        let now = self.now;
        let info = self.w.plan.info[i];
        self.times[i].end = now;
        self.done += 1;
        let c = info.core as usize;
        self.idle[c] = true;
        self.pos[c] += 1;
        let r = info.rank as usize;
        if now > self.r.rank_done[r] {
            self.r.rank_done[r] = now;
        }
        if info.sigs < info.sig_split {
            self.push(now + self.m.event_latency, SIG_LOCAL, i as u32, 0);
        }
        if info.sig_split < info.sig_end || info.fanout != NONE {
            self.push(now + info.sig_latency, SIG_REMOTE, i as u32, 0);
        }
        self.try_start(c);
    }

    fn deliver(&mut self, i: usize, local: bool) {
        let w = self.w;
        let info = &w.plan.info[i];
        let (a, b) = if local {
            (info.sigs, info.sig_split)
        } else {
            (info.sig_split, info.sig_end)
        };
        for &k in &w.plan.sig[a as usize..b as usize] {
            self.bump(k as usize);
        }
        if !local && info.fanout != NONE {
            let f = info.fanout as usize;
            let rank = info.rank;
            if self.fans.counted(f) {
                // One signal to each counter of the range but the task's own rank's: the
                // group's count, then the counters that reach their threshold, in counter
                // order (as one by one).
                let mut reached = std::mem::take(&mut self.fans.reached);
                self.fans.deliver(f, rank, &self.ctr, self.s, &mut reached);
                for &k in &reached {
                    self.reach(k as usize);
                }
                reached.clear();
                self.fans.reached = reached;
            } else {
                let (first, ranks) = w.plan.fanout[f];
                for k in first..first + ranks {
                    if self.s.counter_rank[k as usize] != rank {
                        self.bump(k as usize);
                    }
                }
            }
        }
    }

    /// One signal arrives at counter `k`.
    fn bump(&mut self, k: usize) {
        let c = &mut self.ctr[k];
        c.count += 1;
        let (count, threshold) = (c.count, c.threshold);
        match self.fans.group_of(k) {
            None => {
                if count == threshold {
                    self.reach(k);
                }
            }
            Some(f) => {
                if self.fans.bumped(f, k, count, threshold, self.s) {
                    self.reach(k);
                }
            }
        }
    }

    /// Signals that counter `k` has all its signals.
    fn reach(&mut self, k: usize) {
        let delay = self.ctr[k].delay;
        if delay > 0.0 {
            self.push(self.now + delay, COUNTER_READY, k as u32, 0);
        } else {
            self.satisfy(k);
        }
    }

    /// The signals counter `k` has had.
    fn arrived(&self, k: usize) -> u32 {
        self.ctr[k].count + self.fans.group_of(k).map_or(0, |f| self.fans.extra(f, k, self.s))
    }

    fn satisfy(&mut self, k: usize) {
        self.r.counter_time[k] = self.now;
        let w = self.w;
        let c = self.ctr[k];
        for &i in &w.plan.waiters.idx[c.waiters as usize..c.waiters_end as usize] {
            let i = i as usize;
            self.unsat[i] -= 1;
            if self.unsat[i] == 0 {
                let core = w.plan.core[i];
                if core != NONE {
                    self.try_start(core as usize);
                }
            }
        }
    }

    fn stall(&self) -> Stall {
        const SHOWN: usize = 8;
        const MISSING: usize = 4;
        let s = self.s;
        let signallers = s.signaller_index();
        let mut waits = Vec::new();
        let mut blocked = 0;
        let plan = &self.w.plan;
        for c in 0..s.queues.len() {
            let (lo, hi) = (plan.queue_off[c] as usize, plan.queue_off[c + 1] as usize);
            let p = lo + self.pos[c] as usize;
            if p >= hi {
                continue;
            }
            blocked += 1;
            if waits.len() >= SHOWN || !self.idle[c] {
                continue;
            }
            let t = plan.info[plan.queue[p] as usize].task;
            if let Some(&k) = s
                .waits
                .row(t as usize)
                .iter()
                .find(|&&k| self.arrived(k as usize) < s.threshold[k as usize])
            {
                let missing: Vec<u32> = signallers
                    .row(s, k as usize)
                    .filter(|&x| self.times[plan.pos[x as usize] as usize].end.is_nan())
                    .take(MISSING)
                    .collect();
                waits.push(StallWait {
                    core: c as u32,
                    task: t,
                    counter: k,
                    arrived: self.arrived(k as usize),
                    threshold: s.threshold[k as usize],
                    missing,
                });
            }
        }
        Stall {
            time: self.now,
            done: self.done,
            total: self.w.tasks(),
            waits,
            blocked_cores: blocked,
        }
    }
}

/// The position of every task in its core's queue (for messages).
pub fn queue_positions(s: &Schedule, tasks: usize) -> Vec<u32> {
    let mut pos = vec![0u32; tasks];
    for c in 0..s.queues.len() {
        for (i, &t) in s.queues.row(c).iter().enumerate() {
            pos[t as usize] = i as u32;
        }
    }
    pos
}

/// Why a simulation could not produce a result.
#[derive(Clone, Debug)]
pub enum SimError {
    /// The device cannot be simulated (a field out of range).
    Model(String),
    /// The schedule stopped making progress.
    Stall(Stall),
}

/// A simulated schedule: the model, the workload and the result.
#[derive(Clone, Debug)]
pub struct Simulated {
    pub model: DeviceModel,
    pub workload: Workload,
    pub result: SimResult,
}

/// Prepares and simulates a compiled taskflow.
pub fn simulate_compiled(
    program: &hpmoe_dsl::ir::Program,
    tf: &hpmoe_dsl::ir::Taskflow,
    c: &hpmoe_dsl::driver::Compiled,
    opts: SimOptions,
) -> Result<Simulated, SimError> {
    let model = DeviceModel::new(&program.device).map_err(SimError::Model)?;
    let workload = Workload::new(program, tf, &c.graph, &c.schedule, &model);
    let result = simulate(&workload, &c.schedule, &model, opts).map_err(SimError::Stall)?;
    Ok(Simulated {
        model,
        workload,
        result,
    })
}

/// The wait-for report of a stalled schedule as a diagnostic (E1305).
pub fn stall_diagnostic(
    program: &hpmoe_dsl::ir::Program,
    tf: &hpmoe_dsl::ir::Taskflow,
    g: &hpmoe_dsl::lower::TaskGraph,
    s: &Schedule,
    st: &Stall,
) -> hpmoe_dsl::Diagnostic {
    use hpmoe_dsl::verify::describe;
    let pos = queue_positions(s, g.len());
    let where_ = |t: u32| {
        let c = s.core[t as usize];
        format!(
            "{} of rank {} at queue position {}",
            s.core_name(c),
            s.core_rank(c),
            pos[t as usize]
        )
    };
    let mut d = hpmoe_dsl::Diagnostic::error(
        hpmoe_dsl::Code::Deadlock,
        format!(
            "the schedule of `{}` stopped making progress at {:.3} us: {} of {} tasks ran; {} core(s) still have tasks",
            tf.name,
            st.time * 1e6,
            st.done,
            st.total,
            st.blocked_cores
        ),
    );
    if let Some(first) = st.waits.first() {
        d = d.primary(
            tf.nodes[g.node[first.task as usize] as usize].span,
            "a task of this call waits forever",
        );
    }
    for wt in &st.waits {
        let mut note = format!(
            "{} waits at {} on counter {} (rank {}): {} of {} signals arrived",
            where_(wt.task),
            describe(program, tf, g, wt.task as usize),
            wt.counter,
            s.counter_rank.get(wt.counter as usize).copied().unwrap_or(0),
            wt.arrived,
            wt.threshold
        );
        if wt.missing.is_empty() {
            note.push_str("; no task that has not run signals it (its threshold is too high)");
        } else {
            for &m in &wt.missing {
                let _ = std::fmt::Write::write_fmt(
                    &mut note,
                    format_args!(
                        "; it waits for {} queued on {}",
                        describe(program, tf, g, m as usize),
                        where_(m)
                    ),
                );
            }
        }
        d = d.note(note);
    }
    d.help("run without `--no-verify` to see which rule the schedule breaks")
}

/// The every-rank barriers' signals, counted per barrier: a task of such a kernel signals the
/// counter of every other rank, which one by one is ranks × tasks bumps (thousands of ranks,
/// millions of tasks). A counter of such a range has had its own signals (its rank's tasks,
/// listed) plus the range's remote signals less those from its own rank's tasks; the counters
/// not yet at their threshold wait in a heap by the range count at which they get there. Each
/// reaches its threshold at the same signal as one by one, and those reached by one task's
/// signals are taken in counter order, so the simulation is the same.
#[derive(Debug, Default)]
struct Fans {
    /// Per counter: its range (`NONE`: none, or counted one by one).
    group: Vec<u32>,
    /// Per range: counted per range (its counters belong to no other), its remote signals,
    /// per rank those sent from that rank's tasks, and its counters by the count they need.
    counted: Vec<bool>,
    sent: Vec<u32>,
    from_rank: Vec<Vec<u32>>,
    need: Vec<std::collections::BinaryHeap<std::cmp::Reverse<(i64, u32)>>>,
    /// Per counter: the count of its one live entry in `need` (the others are stale), never
    /// above the count it needs; `i64::MAX` for none.
    live: Vec<i64>,
    /// Per counter: reached its threshold.
    reached_at: Vec<bool>,
    /// The counters reached by one task's signals.
    reached: Vec<u32>,
}

impl Fans {
    fn new(fanout: &[(u32, u32)], s: &Schedule, ranks: usize) -> Fans {
        if fanout.is_empty() {
            return Fans::default();
        }
        let counters = s.threshold.len();
        let ranges: Vec<Option<std::ops::Range<u32>>> = fanout
            .iter()
            .map(|&(first, n)| Some(first..first.saturating_add(n)))
            .collect();
        let (kept, group) = hpmoe_dsl::schedule::disjoint_ranges(&ranges, counters);
        let counted: Vec<bool> = kept.iter().map(Option::is_some).collect();
        let mut need = vec![std::collections::BinaryHeap::new(); fanout.len()];
        let mut live = vec![i64::MAX; counters];
        let mut from_rank = vec![Vec::new(); fanout.len()];
        for (f, r) in kept.iter().enumerate() {
            let Some(r) = r else { continue };
            from_rank[f] = vec![0; ranks];
            for k in r.clone() {
                let th = s.threshold[k as usize];
                if th > 0 {
                    need[f].push(std::cmp::Reverse((i64::from(th), k)));
                    live[k as usize] = i64::from(th);
                }
            }
        }
        Fans {
            group,
            counted,
            sent: vec![0; fanout.len()],
            from_rank,
            need,
            live,
            reached_at: vec![false; counters],
            reached: Vec::new(),
        }
    }

    fn counted(&self, f: usize) -> bool {
        self.counted.get(f).copied().unwrap_or(false)
    }

    #[inline]
    fn group_of(&self, k: usize) -> Option<usize> {
        self.group.get(k).filter(|&&g| g != NONE).map(|&g| g as usize)
    }

    /// The remote signals of range `f` counter `k` has had.
    fn extra(&self, f: usize, k: usize, s: &Schedule) -> u32 {
        let q = s.counter_rank[k] as usize;
        self.sent[f] - self.from_rank[f].get(q).copied().unwrap_or(0)
    }

    /// The range count at which counter `k` of range `f` reaches `threshold` with `count`
    /// signals of its own.
    fn need_of(&self, f: usize, k: usize, count: u32, threshold: u32, s: &Schedule) -> i64 {
        let q = s.counter_rank[k] as usize;
        i64::from(threshold) - i64::from(count) + i64::from(self.from_rank[f].get(q).copied().unwrap_or(0))
    }

    /// Counter `k` of range `f` had a signal of its own (`count` in all): whether it reached
    /// its threshold with it; else it waits at its lower need.
    fn bumped(&mut self, f: usize, k: usize, count: u32, threshold: u32, s: &Schedule) -> bool {
        let arrived = count + self.extra(f, k, s);
        if arrived == threshold && !self.reached_at[k] {
            self.reached_at[k] = true;
            return true;
        }
        // Its need fell by one: listed again only when its live entry was at the old need (a
        // task's own signal and its signals to the other ranks' counters, which raise the
        // need of its rank's counter, mostly come in pairs).
        if arrived < threshold {
            let need = self.need_of(f, k, count, threshold, s);
            if self.live[k] > need {
                self.need[f].push(std::cmp::Reverse((need, k as u32)));
                self.live[k] = need;
            }
        }
        false
    }

    /// A task of `rank` signals every counter of range `f` but its rank's: the counters that
    /// reach their threshold, into `reached` in counter order.
    fn deliver(&mut self, f: usize, rank: u32, ctr: &[Ctr], s: &Schedule, reached: &mut Vec<u32>) {
        self.sent[f] += 1;
        if let Some(x) = self.from_rank[f].get_mut(rank as usize) {
            *x += 1;
        }
        let at = i64::from(self.sent[f]);
        while let Some(&std::cmp::Reverse((want, k))) = self.need[f].peek() {
            if want > at {
                break;
            }
            self.need[f].pop();
            let ku = k as usize;
            if self.reached_at[ku] || self.live[ku] != want {
                continue;
            }
            let c = &ctr[ku];
            if c.count + self.extra(f, ku, s) >= c.threshold {
                self.reached_at[ku] = true;
                reached.push(k);
            } else {
                let need = self.need_of(f, ku, c.count, c.threshold, s);
                self.need[f].push(std::cmp::Reverse((need, k)));
                self.live[ku] = need;
            }
        }
        reached.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The queue pops, in order, what one heap of every event pushed pops, less the
        /// pairs' finish events replaced by a later one of the same pair before they popped.
        #[test]
        fn the_queue_pops_as_one_heap_without_replaced_finish_events(
            ops in proptest::collection::vec((0u8..4, 0u32..6, 0u32..40), 0..300),
        ) {
            let mut q = Queue {
                pairs: PairHeap::new(6),
                ..Queue::default()
            };
            // The reference: every event by (time, insertion), and per pair the insertion
            // of its latest finish event (an earlier one is replaced).
            let mut all = std::collections::BTreeSet::new();
            let mut latest = [0u64; 6];
            let mut now = 0u32;
            for (op, id, dt) in ops {
                let t = f64::from(now + dt);
                match op {
                    0 => {
                        q.push(t, FLOW_DONE, id, 0);
                        latest[id as usize] = q.seq;
                        all.insert((t.to_bits(), q.seq, FLOW_DONE, id));
                    }
                    1 => {
                        q.push(t, TASK_END, id, 0);
                        all.insert((t.to_bits(), q.seq, TASK_END, id));
                    }
                    2 => {
                        q.push(t, SIG_LOCAL, id, 0);
                        all.insert((t.to_bits(), q.seq, SIG_LOCAL, id));
                    }
                    _ => {
                        // Pop what the reference pops first that was not replaced.
                        let want = loop {
                            let Some(e) = all.pop_first() else { break None };
                            if e.2 != FLOW_DONE || latest[e.3 as usize] == e.1 {
                                break Some(e);
                            }
                        };
                        let got = q.pop().map(|e| (e.time, e.key >> 3, e.kind(), e.id));
                        prop_assert_eq!(got, want);
                        if let Some(e) = got {
                            now = f64::from_bits(e.0) as u32;
                        }
                    }
                }
            }
        }
    }
}
