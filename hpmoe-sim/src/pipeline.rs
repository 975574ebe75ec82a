//! The simulator's half of the driver: the stages after compilation, in order.
//!
//! In: a checked program ([`hpmoe_dsl::driver::Checked`]), one of its taskflows and a
//! policy. Out: a [`Ran`]: the compiled taskflow (lowered, verified, scheduled, by
//! [`Checked::compile_timed`]), its simulation ([`Simulated`]: the device model, the
//! prepared workload and the timeline) and its [`Report`]; or every diagnostic of the first
//! stage that failed (a model the simulator cannot run is E1106, a stalled schedule E1305).
//!
//! Stages, each timed on the caller's clock: `lower`, `verify graph`, `schedule`,
//! `verify schedule` (the compiler driver), then `prepare` (device model and workload),
//! `simulate` and `report`. The command line, the REPL and the sweep compile through
//! [`compile`] (the compiler driver, then the choice among candidate schedules below) and run
//! a taskflow through here or through [`crate::sim::simulate_compiled`] (prepare + simulate
//! of a taskflow they compiled and cached themselves).
//!
//! Candidate schedules: the `interleaved` policy with `candidates: true` (its default) is
//! compiled as usual, then every candidate of its task graph
//! ([`hpmoe_dsl::schedule::candidate`]: the list schedules with the other priorities, the
//! expert-level order with all and half of the vector cores, the kernel-by-kernel order
//! without and with its barriers) is verified (unless verification is off), simulated, and
//! kept if its latency is strictly lower than the best so far (the policy's own schedule
//! first; ties keep the earlier); a candidate whose lower bound ([`crate::report::bounds`])
//! is not below the best so far cannot be kept and is not simulated. Last come the taskflow lowered and scheduled as
//! `expert_level` does it (its cube tiling of the GMMs and its order; with the program's
//! capacity mode for that policy, then the other), which replace graph and schedule when
//! faster: `interleaved` is then never slower than `expert_level` or `kernel_by_kernel`. The choice is deterministic (the simulator is), and the
//! result is never slower than any candidate; the report names it (`schedule` option).
//! Above [`CANDIDATE_MAX_TASKS`] tasks, or [`CANDIDATE_MAX_PAIRS`] pairs of ranks with
//! traffic, only the expert-level order and the policy's own schedule are compared (the
//! origin says so and why).
//!
//! A candidate is simulated only as far as it can still win: the simulation stops at the
//! first event past the best latency so far, or as soon as a task starts whose queue still
//! needs, at the least, more than what is left ([`crate::report::bounds_and_chains`]). The
//! kept schedule's own simulation ran to its end, and [`run`] reports it as it is (with its
//! workload) instead of preparing and simulating the same schedule again, unless a trace
//! asks for bandwidth samples; its time is then part of `candidates`.
//!
//! Two at once: with [`SimOptions::side_by_side`] (a job of `hpmoe run` running alone on a
//! machine of several CPUs), the candidates of one graph are simulated by two threads, the
//! second on a copy of the workload, each taking the next candidate when it is done
//! ([`race`]), when the graph, its layouts, its candidates' schedules, both workloads and both
//! simulations' states fit [`hpmoe_dsl::lower::MAX_MEMORY`] with a quarter to spare (and, under
//! a limit on the address space, the copy and a fresh allocator arena fit half of what is
//! left). Each ended simulation's latency
//! is the other's new limit ([`sim::Race`]). The schedule kept, its simulation and the report
//! are the same to the bit as one candidate after the other; only how far a losing candidate
//! is simulated depends on the threads' timing. Two at once holds every candidate schedule
//! of the graph (counted against the memory too); one at a time, each is made when its turn
//! comes, as it always was. Each expert-level tiling's two schedules race the same way against
//! the best latency so far, on one thread.

use crate::model::DeviceModel;
use crate::report::Report;
use crate::sim::{self, Progress, SimOptions, Simulated, Workload};
use hpmoe_dsl::driver::{Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Program;
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::schedule::{PolicySpec, Schedule, CANDIDATES};
use hpmoe_dsl::timing::Clock;
use hpmoe_dsl::{Code, Diagnostic};

/// A taskflow compiled, simulated and reported.
#[derive(Clone, Debug)]
pub struct Ran {
    pub compiled: Compiled,
    pub simulated: Simulated,
    pub report: Report,
}

/// Compiles, prepares, simulates and reports a taskflow of `checked` under `spec`.
pub fn run(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    compile: &CompileOptions,
    sim_opts: SimOptions,
    clock: &mut Clock,
) -> Result<Ran, Vec<Diagnostic>> {
    run_with(checked, tf, spec, compile, sim_opts, true, clock)
}

/// [`run`]; with `reuse` false, the schedule kept among candidates is prepared and
/// simulated again (the same result, timed as its own `prepare` and `simulate`).
pub fn run_with(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    compile: &CompileOptions,
    sim_opts: SimOptions,
    reuse: bool,
    clock: &mut Clock,
) -> Result<Ran, Vec<Diagnostic>> {
    let program = checked.program();
    // A trace needs the bandwidth samples, which the candidates' simulations do not record.
    let keep = reuse && !sim_opts.record_bandwidth;
    let mut ch = Choice::new(sim_opts.progress.as_ref(), sim_opts.side_by_side);
    ch.link_budget = sim_opts.link_budget;
    let (c, kept) = self::compile_kept(checked, tf, spec, compile, clock, &mut ch, keep)?;
    let model = DeviceModel::new(&program.device).map_err(|msg| vec![Diagnostic::error(Code::BadOverride, msg)])?;
    let (workload, result) = match kept {
        Some(Kept {
            workload: Some(w),
            result,
        }) => (w, result),
        Some(Kept { workload: None, result }) => {
            let workload = Workload::new(program, tf, &c.graph, &c.schedule, &model);
            clock.lap("prepare");
            (workload, result)
        }
        None => {
            let workload = Workload::new(program, tf, &c.graph, &c.schedule, &model);
            clock.lap("prepare");
            let result = sim::simulate(&workload, &c.schedule, &model, sim_opts)
                .map_err(|st| vec![sim::stall_diagnostic(program, tf, &c.graph, &c.schedule, &st)])?;
            clock.lap("simulate");
            (workload, result)
        }
    };
    let report = Report::new(program, tf, &c.graph, &c.schedule, &workload, &model, &result);
    clock.lap("report");
    Ok(Ran {
        compiled: c,
        simulated: Simulated {
            model,
            workload,
            result,
        },
        report,
    })
}

/// Compiles a taskflow ([`Checked::compile_timed`]), then, for `interleaved` with
/// `candidates`, keeps the fastest of its candidate schedules (see the module doc; timed as
/// `candidates`).
pub fn compile(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    opts: &CompileOptions,
    clock: &mut Clock,
) -> Result<Compiled, Vec<Diagnostic>> {
    compile_observed(checked, tf, spec, opts, clock, None)
}

/// [`compile`]; `progress` hears of each candidate's simulation ([`Progress::candidate`]
/// numbers them from 1, and is 0 again when the choice is made).
pub fn compile_observed(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    opts: &CompileOptions,
    clock: &mut Clock,
    progress: Option<&Progress>,
) -> Result<Compiled, Vec<Diagnostic>> {
    let mut ch = Choice::new(progress, false);
    compile_kept(checked, tf, spec, opts, clock, &mut ch, false).map(|(c, _)| c)
}

/// A simulation of the schedule kept by the choice among candidates, with its workload
/// unless it was dropped to make room for another graph's: what [`Workload::new`] and
/// [`sim::simulate`] (without bandwidth samples) give for the compiled graph and schedule,
/// so a run need not simulate it again.
struct Kept {
    workload: Option<Workload>,
    result: sim::SimResult,
}

/// [`compile_observed`]; with `keep`, also the simulation of the schedule chosen when the
/// choice simulated it to its end (the candidates' workload is then left scheduled as the
/// chosen schedule).
fn compile_kept(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    opts: &CompileOptions,
    clock: &mut Clock,
    ch: &mut Choice,
    keep: bool,
) -> Result<(Compiled, Option<Kept>), Vec<Diagnostic>> {
    let mut c = checked.compile_timed(tf, spec, opts, clock)?;
    if let Some((_, best, seen)) = choose_observed(checked.program(), tf, &mut c, opts.verify, ch) {
        if !keep {
            ch.kept = None;
        }
        // (Empty when only two candidates were compared.)
        if !seen.is_empty() {
            other_tilings(checked, tf, &mut c, opts, best, &seen, ch);
        }
        clock.lap("candidates");
    }
    if let Some(p) = ch.progress {
        p.candidate(0);
    }
    let kept = match ch.kept.take() {
        Some(mut k) if keep => {
            if let (false, Some(w)) = (k.at_best, k.workload.as_mut()) {
                let model = DeviceModel::new(&checked.program().device)
                    .map_err(|msg| vec![Diagnostic::error(Code::BadOverride, msg)])?;
                w.reschedule(&c.graph, &c.schedule, &model);
            }
            Some(Kept {
                workload: k.workload,
                result: k.result,
            })
        }
        _ => None,
    };
    Ok((c, kept))
}

/// The state of a choice among candidates: who hears of each simulation, the best
/// simulation so far, whether two candidates may be simulated at once (when memory allows),
/// and the largest graph whose candidates are all compared (in tasks, and in pairs of ranks
/// with traffic).
struct Choice<'p> {
    progress: Option<&'p Progress>,
    kept: Option<Best>,
    side_by_side: bool,
    /// The simulations' budget of exact link solves ([`SimOptions::link_budget`]).
    link_budget: sim::LinkBudget,
    compared: usize,
    compared_pairs: usize,
}

impl<'p> Choice<'p> {
    fn new(progress: Option<&'p Progress>, side_by_side: bool) -> Choice<'p> {
        Choice {
            progress,
            kept: None,
            side_by_side,
            link_budget: sim::LinkBudget::default(),
            compared: CANDIDATE_MAX_TASKS,
            compared_pairs: CANDIDATE_MAX_PAIRS,
        }
    }
}

/// The simulation of the best schedule so far among candidates and the workload the
/// candidates of its graph are simulated on, scheduled as the best (`at_best`) or as a
/// candidate simulated after it (`None` once dropped, so that two graphs' workloads are
/// never held at once).
struct Best {
    workload: Option<Workload>,
    result: sim::SimResult,
    at_best: bool,
}

/// The memory one run of a taskflow is expected to need at its peak, from the lowering's
/// estimates ([`hpmoe_dsl::lower::MemoryEstimate`]): graphs held at once, and the routing
/// layouts of each capacity mode (shared by every run of one program in that mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunMemory {
    pub graphs: u64,
    /// Per capacity mode (dynamic, static): its layouts' bytes if the run uses them, else 0.
    pub layouts: [u64; 2],
}

impl RunMemory {
    /// Several runs side by side: their graphs add up, the layouts of a mode count once.
    pub fn together(runs: &[RunMemory]) -> u64 {
        let graphs = runs.iter().fold(0u64, |a, r| a.saturating_add(r.graphs));
        (0..2).fold(graphs, |a, m| {
            a.saturating_add(runs.iter().map(|r| r.layouts[m]).max().unwrap_or(0))
        })
    }
}

/// What [`run`] of `tf` under `spec` is expected to hold at its peak: its own graph and, for
/// `interleaved` choosing among candidates on a graph small enough to compare them all, the
/// largest expert-level tiling it compiles beside it (see [`other_tilings`]). `None` when
/// the taskflow would be refused (its run says why).
pub fn run_memory(checked: &Checked, tf: &Taskflow, spec: &PolicySpec, opts: &CompileOptions) -> Option<RunMemory> {
    let own = checked.memory_estimate(tf, spec, opts).ok()?;
    let mut m = RunMemory {
        graphs: own.graph,
        layouts: [0; 2],
    };
    m.layouts[usize::from(spec.static_capacity)] = own.layouts;
    // Other tilings are compiled only for graphs whose candidates are all compared. The
    // estimate is at least the graph's size, so a graph estimated at most that large is one;
    // a larger estimate does not size (and materialise the layouts of) tilings that will
    // never be compiled, at the price of missing them for a graph whose estimate passes the
    // limit only by a call's excess of chunks over tasks.
    let compared = own.tasks <= CANDIDATE_MAX_TASKS as u64;
    if spec.policy == hpmoe_dsl::policy::Policy::Interleaved && spec.candidates && compared {
        for (el, e) in expert_level_estimates(checked, tf, opts) {
            m.layouts[usize::from(el.static_capacity)] = e.layouts;
            // A tiling lowered beside the policy's own graph (one at a time).
            let beside = e.graph.min(hpmoe_dsl::lower::MAX_MEMORY);
            m.graphs = m.graphs.max(own.graph.saturating_add(beside));
        }
    }
    Some(m)
}

/// The expert-level policy of `tf` in both capacity modes (the program's first) with the
/// memory estimate of each that can be lowered.
fn expert_level_estimates(
    checked: &Checked,
    tf: &Taskflow,
    opts: &CompileOptions,
) -> Vec<(PolicySpec, hpmoe_dsl::lower::MemoryEstimate)> {
    let declared = checked.select_policy(&tf.name, Some(hpmoe_dsl::policy::Policy::ExpertLevel));
    [declared.static_capacity, !declared.static_capacity]
        .into_iter()
        .filter_map(|static_capacity| {
            let mut el = declared.clone();
            el.static_capacity = static_capacity;
            let e = checked.memory_estimate(tf, &el, opts).ok()?;
            Some((el, e))
        })
        .collect()
}

/// The last candidates: the taskflow compiled as `expert_level` compiles it (its GMM tiling
/// for the cube cores), in that policy's order and in the order of the policy's own list
/// scheduler, with the capacity mode the program gives `expert_level` and with the other;
/// one that is faster replaces `c` (graph and schedule), its schedule relabelled
/// `interleaved` (with the capacity it used). `best`: the latency of `c`.
fn other_tilings(
    checked: &Checked,
    tf: &Taskflow,
    c: &mut Compiled,
    opts: &CompileOptions,
    mut best: f64,
    seen: &[u64],
    ch: &mut Choice,
) {
    let program = checked.program();
    let spec = c.schedule.policy.clone();
    let Ok(model) = DeviceModel::new(&program.device) else {
        return;
    };
    // The policy's own graph stays held while another tiling is compiled beside it.
    let Ok(own) = checked.memory_estimate(tf, &spec, opts) else {
        return;
    };
    for (el, e) in expert_level_estimates(checked, tf, opts) {
        let static_capacity = el.static_capacity;
        let layouts = if static_capacity == spec.static_capacity {
            0
        } else {
            e.layouts
        };
        if own.total().saturating_add(e.graph).saturating_add(layouts) > hpmoe_dsl::lower::MAX_MEMORY {
            continue;
        }
        let Ok(mut other) = checked.compile(tf, &el, opts) else {
            continue;
        };
        // The same tasks in queues simulated among the candidates before: nothing new.
        if other.graph.same_tasks(&c.graph)
            && other.schedule.policy.launch_overhead == spec.launch_overhead
            && seen.contains(&other.schedule.fingerprint())
        {
            continue;
        }
        if let Some(p) = ch.progress {
            p.candidate(p.candidates() + 1);
        }
        if let Some(k) = ch.kept.as_mut() {
            k.workload = None;
        }
        let w = Workload::new(program, tf, &other.graph, &other.schedule, &model);
        // The expert-level order, then the policy's own list scheduler on the expert-level
        // tiling.
        let mut list_spec = spec.clone();
        list_spec.candidates = false;
        list_spec.static_capacity = static_capacity;
        let list = hpmoe_dsl::schedule::schedule(program, tf, &other.graph, &list_spec);
        let verified = !opts.verify || hpmoe_dsl::verify::verify_schedule(program, tf, &other.graph, &list).is_empty();
        let items: &[&Schedule] = if verified {
            &[&other.schedule, &list]
        } else {
            &[&other.schedule]
        };
        let du = crate::report::durations(&w, &model, &other.graph.rank);
        let how = How {
            progress: ch.progress,
            link_budget: ch.link_budget,
            numbered: ch.progress.map_or(0, |p| p.candidates().saturating_sub(1)),
            du: Some(&du),
            // One thread: the policy's own graph stays held beside this one, so there is
            // seldom room for a second workload, and two threads measured no faster here.
            two: false,
            limit: best,
        };
        let mut raced = race(&other.graph, items, w, &model, how);
        drop(du);
        // Only a schedule strictly faster than the best so far replaces it.
        let Some((i, result)) = raced.winner().filter(|(_, r)| r.makespan < best) else {
            continue;
        };
        best = result.makespan;
        if i > 0 {
            other.schedule = list;
        }
        let s = &mut other.schedule;
        // Its simulation stands for the schedule as relabelled when it has the same kernel
        // launches.
        let same_launches = s.policy.launch_overhead == spec.launch_overhead;
        s.origin = match (i, static_capacity) {
            (0, true) => "expert-level tiling and order (static capacity)",
            (0, false) => "expert-level tiling and order",
            (_, true) => "list on expert-level tiling (static capacity)",
            (_, false) => "list on expert-level tiling",
        };
        s.policy = PolicySpec {
            static_capacity,
            ..spec.clone()
        };
        s.estimate = 0.0;
        *c = other;
        ch.kept = same_launches.then(|| Best {
            at_best: raced.at == Some(i),
            workload: Some(raced.workload),
            result,
        });
    }
}

/// The simulation of the workload `w` under schedule `s` of `c`'s graph if its latency is strictly
/// below `best`, else `None` (also when it stalls): without simulating when the schedule's
/// lower bound ([`crate::report::bounds`], and for a schedule with kernel barriers
/// [`crate::report::kernel_bound`]) shows it cannot be (the bound relaxed by a
/// relative `1e-9` against rounding, so a schedule is skipped only when it is slower by more
/// than that), and with the simulation stopped once it passes `best`
/// ([`sim::simulate_below_chained`], also as soon as a task's start and the least time
/// its queue still needs reach `best`), with `opts` (who hears of it, the link budget).
///
/// `du`: the durations of `w`'s tasks ([`crate::report::durations`]), computed at the first
/// bound and kept for the next schedules of the same workload (they do not depend on the
/// schedule); the caller empties it for a new workload.
fn latency_of(
    w: &Workload,
    c: &Compiled,
    s: &Schedule,
    model: &DeviceModel,
    best: f64,
    opts: SimOptions,
    du: &mut Option<crate::report::Durations>,
) -> Option<sim::SimResult> {
    let mut chains = Vec::new();
    if best.is_finite() {
        let rank = &c.graph.rank;
        let du = du.get_or_insert_with(|| crate::report::durations(w, model, rank));
        let (b, ch) = crate::report::bounds_and_chains_with(w, s, model, rank, true, du);
        let lb = b.max().0.max(crate::report::kernel_bound_with(w, s, model, rank, du));
        if lb * (1.0 - 1e-9) >= best {
            return None;
        }
        chains = ch;
    }
    sim::simulate_below_chained(w, s, model, opts, best, &chains)
}

/// Replaces `c.schedule` by the fastest of the candidates of its policy (none unless the
/// policy is `interleaved` with `candidates`); returns how many candidates were tried
/// (simulated, or skipped by their lower bound) and the latency of the schedule kept.
pub fn choose(program: &Program, tf: &Taskflow, c: &mut Compiled, verify: bool) -> (usize, f64) {
    choose_observed(program, tf, c, verify, &mut Choice::new(None, false))
        .map_or((0, f64::INFINITY), |(tried, best, _)| (tried, best))
}

/// The largest graph whose candidate schedules are all compared: each candidate is one more
/// simulation of the whole graph, so above this size `interleaved` compares only its own
/// schedule and the expert-level order (a run stays within minutes instead of hours).
pub const CANDIDATE_MAX_TASKS: usize = 1 << 21;

/// The most pairs of ranks with traffic between them (pairs of the link model) for which
/// the candidate schedules are all compared: the link model's solves grow with the pairs
/// active at once, so a graph of thousands of ranks each putting to hundreds of others
/// costs many times a graph of as many tasks on fewer ranks; above this, as above
/// [`CANDIDATE_MAX_TASKS`], only two candidates are compared. (The DeepSeek-V3 layer at
/// EP256 has 65280 such pairs.)
pub const CANDIDATE_MAX_PAIRS: usize = 1 << 17;

/// Why only two candidates are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Above {
    Tasks,
    Pairs,
}

impl Above {
    /// The origins of the two schedules compared: the policy's own, the expert-level order.
    fn origins(self) -> (&'static str, &'static str) {
        match self {
            Above::Tasks => (
                "policy (of two candidates: above 2097152 tasks)",
                "expert-level order (of two candidates: above 2097152 tasks)",
            ),
            Above::Pairs => (
                "policy (of two candidates: above 131072 pairs of ranks with traffic)",
                "expert-level order (of two candidates: above 131072 pairs of ranks with traffic)",
            ),
        }
    }
}

/// The choice on a graph above [`CANDIDATE_MAX_TASKS`] or [`CANDIDATE_MAX_PAIRS`]: the
/// expert-level order of the same graph (the candidate that wins most often) is simulated,
/// then the policy's own schedule, stopped once it passes it; the faster is kept, its origin
/// saying that only two were compared. `w`: the graph's workload if one was prepared
/// (under any schedule: it is rescheduled), else one is prepared for the expert-level order
/// (which holds less at its peak than rescheduling one).
#[allow(clippy::too_many_arguments)]
fn two_candidates(
    program: &Program,
    tf: &Taskflow,
    c: &mut Compiled,
    spec: &PolicySpec,
    model: &DeviceModel,
    verify: bool,
    ch: &mut Choice,
    w: Option<Workload>,
    why: Above,
) -> f64 {
    let (own_origin, other_origin) = why.origins();
    c.schedule.origin = own_origin;
    let Some((other, _)) = hpmoe_dsl::schedule::candidate(program, tf, &c.graph, spec, 2) else {
        return f64::INFINITY;
    };
    if verify && !hpmoe_dsl::verify::verify_schedule(program, tf, &c.graph, &other).is_empty() {
        return f64::INFINITY;
    }
    let w = match w {
        Some(mut w) => {
            w.reschedule(&c.graph, &other, model);
            w
        }
        None => Workload::new(program, tf, &c.graph, &other, model),
    };
    // The bound of the second is computed alone: its durations are not kept through the
    // simulations.
    let two = ch.side_by_side && room_for_two(&c.graph, &w, 0);
    let how = How {
        progress: ch.progress,
        link_budget: ch.link_budget,
        numbered: 0,
        du: None,
        two,
        limit: f64::INFINITY,
    };
    let mut raced = race(&c.graph, &[&other, &c.schedule], w, model, how);
    // The expert-level order stalled: as when it runs first, nothing is kept.
    if matches!(raced.outcomes[0], Outcome::Stalled) {
        return f64::INFINITY;
    }
    let Some((won, result)) = raced.winner() else {
        return f64::INFINITY;
    };
    let mut other = other;
    if won == 0 {
        other.origin = other_origin;
        c.schedule = other;
    }
    let best = result.makespan;
    ch.kept = Some(Best {
        at_best: raced.at == Some(won),
        workload: Some(raced.workload),
        result,
    });
    best
}

/// Whether two simulations of `w` fit at once within [`hpmoe_dsl::lower::MAX_MEMORY`]: the
/// graph, its routing layouts, what else is held (`beside`), the workload and its copy, and
/// each simulation's state, with a quarter more for the allocator and the transient buffers
/// of the copy's schedule; and, when the process's address space is limited, the copy, the
/// second state and a fresh allocator arena (1 GiB) within half of what is left to map.
fn room_for_two(g: &hpmoe_dsl::lower::TaskGraph, w: &Workload, beside: u64) -> bool {
    let layouts: usize = g.layouts.iter().flatten().map(|l| l.resident_bytes()).sum();
    let held = ((g.resident_bytes() + layouts) as u64).saturating_add(beside);
    let two = 2 * (w.heap_bytes() + sim::state_bytes(w));
    // Under a limit on the address space, the copy and the second state are also mapped
    // beside what is mapped now, with room for the allocator to reserve a fresh arena.
    let extra = w.heap_bytes() + sim::state_bytes(w);
    let mappable = hpmoe_dsl::timing::address_space_left().is_none_or(|left| left / 2 >= extra.saturating_add(1 << 30));
    mappable && held.saturating_add(two).saturating_mul(5) / 4 <= hpmoe_dsl::lower::MAX_MEMORY
}

/// How one candidate of a race ended.
enum Outcome {
    /// Simulated to its end.
    Ended(Box<sim::SimResult>),
    /// It stalled.
    Stalled,
    /// Not simulated to its end: its lower bound or its clock passed a latency reached by
    /// another, so it is strictly slower than that one.
    Lost,
}

/// The candidates of a race, what became of each, and the workload kept: scheduled as the
/// candidate `at` (the last one simulated on it).
struct Raced {
    outcomes: Vec<Outcome>,
    workload: Workload,
    at: Option<usize>,
}

/// The fastest candidate that ended, the first of those as fast.
fn fastest(outcomes: &[Outcome]) -> Option<usize> {
    let mut won: Option<(usize, f64)> = None;
    for (i, o) in outcomes.iter().enumerate() {
        if let Outcome::Ended(r) = o {
            if won.is_none_or(|(_, best)| r.makespan < best) {
                won = Some((i, r.makespan));
            }
        }
    }
    won.map(|(i, _)| i)
}

impl Raced {
    /// The fastest candidate, the first of those as fast, and its simulation.
    fn winner(&mut self) -> Option<(usize, sim::SimResult)> {
        let i = fastest(&self.outcomes)?;
        match std::mem::replace(&mut self.outcomes[i], Outcome::Lost) {
            Outcome::Ended(r) => Some((i, *r)),
            _ => None,
        }
    }
}

/// Simulates the candidate schedules `items` of graph `g` on `w` (scheduled as `items[0]`),
/// in order; with `how.two`, on a copy of `w` too, on a second thread, each thread taking
/// the next candidate when it is done. The choice is that of one after the other: the
/// fastest, the first of those as fast. A candidate is simulated only as far as it can still
/// win: skipped when its lower bound ([`crate::report::bounds`], and for a schedule with
/// kernel barriers [`crate::report::kernel_bound`], relaxed by a relative `1e-9` against
/// rounding) is above the best latency so far (`how.limit` at first), and stopped once its
/// clock passes that latency, or as soon as a task starts whose queue still needs, at the
/// least, more than what is left ([`crate::report::bounds_and_chains`]); each ended
/// simulation's latency is the others' new limit ([`sim::Race`]). Only when a candidate
/// stops, never what an ended one gives, depends on the threads' timing. `how.progress`
/// hears of each candidate (numbered from `how.numbered + 1`) and of the simulations on `w`.
fn race(g: &hpmoe_dsl::lower::TaskGraph, items: &[&Schedule], w: Workload, model: &DeviceModel, how: How) -> Raced {
    let How {
        progress,
        link_budget,
        numbered,
        du,
        two,
        limit,
    } = how;
    let best = sim::Race::new();
    if limit.is_finite() {
        best.offer(limit);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes: std::sync::Mutex<Vec<Option<Outcome>>> =
        std::sync::Mutex::new(std::iter::repeat_with(|| None).take(items.len()).collect());
    // The second thread makes its own copy of the workload while this one simulates the
    // first candidate on the shared one (the copy costs as long as a fresh allocation takes
    // to fill); this one changes the workload only once the copy is made.
    let (copied, copy_made) = std::sync::mpsc::channel::<()>();
    let worker = |mut w: std::sync::Arc<Workload>,
                  mut at: Option<usize>,
                  progress: Option<&Progress>,
                  copy: Option<std::sync::mpsc::Sender<()>>,
                  copy_made: Option<std::sync::mpsc::Receiver<()>>| {
        if let Some(done) = copy {
            w = std::sync::Arc::new(Workload::clone(&w));
            let _ = done.send(());
        }
        let mut waited = false;
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&s) = items.get(i) else { break };
            if let Some(p) = progress {
                p.candidate(numbered + i + 1);
            }
            if at != Some(i) {
                if let (false, Some(made)) = (waited, &copy_made) {
                    // (An error: the other thread never ran, and holds nothing.)
                    let _ = made.recv();
                    waited = true;
                }
                std::sync::Arc::make_mut(&mut w).reschedule(g, s, model);
                at = Some(i);
            }
            let o = race_one(&w, g, s, model, &best, sim_options(progress, link_budget), du);
            if let Ok(mut all) = outcomes.lock() {
                all[i] = Some(o);
            }
        }
        (w, at)
    };
    let unwrap = |w: std::sync::Arc<Workload>| std::sync::Arc::try_unwrap(w).unwrap_or_else(|w| Workload::clone(&w));
    let w = std::sync::Arc::new(w);
    let (mine, theirs) = if two && items.len() > 1 {
        std::thread::scope(|scope| {
            let shared = std::sync::Arc::clone(&w);
            let handle = std::thread::Builder::new()
                .spawn_scoped(scope, || worker(shared, Some(0), None, Some(copied), None))
                .ok();
            let mine = worker(w, Some(0), progress, None, Some(copy_made));
            let theirs = match handle.map(|h| h.join()) {
                Some(Ok(t)) => Some(t),
                Some(Err(panic)) => std::panic::resume_unwind(panic),
                // Without a second thread, this one simulated every candidate.
                None => None,
            };
            (mine, theirs)
        })
    } else {
        drop((copied, copy_made));
        (worker(w, Some(0), progress, None, None), None)
    };
    let mine = (unwrap(mine.0), mine.1);
    let theirs = theirs.map(|(w, at)| (unwrap(w), at));
    let outcomes: Vec<Outcome> = outcomes
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|o| o.unwrap_or(Outcome::Lost))
        .collect();
    let mut raced = Raced {
        outcomes,
        workload: mine.0,
        at: mine.1,
    };
    // The workload kept is the one scheduled as the winner, if either is.
    let won = fastest(&raced.outcomes);
    if let Some((tw, tat)) = theirs {
        if won.is_some() && tat == won && raced.at != won {
            raced.workload = tw;
            raced.at = tat;
        }
    }
    raced
}

/// How a [`race`] runs: who hears of it and the number of the candidate before its first,
/// the durations of the workload's tasks for the bounds (computed for each bound when
/// `None`), whether on two threads, and a latency from before to beat (infinite when none: a
/// candidate no faster than it is not simulated to its end).
struct How<'a> {
    progress: Option<&'a Progress>,
    link_budget: sim::LinkBudget,
    numbered: usize,
    du: Option<&'a crate::report::Durations>,
    two: bool,
    limit: f64,
}

/// The options of a candidate's simulation: who hears of it, and its link solves' budget.
fn sim_options(progress: Option<&Progress>, link_budget: sim::LinkBudget) -> SimOptions {
    SimOptions {
        progress: progress.cloned(),
        link_budget,
        ..SimOptions::default()
    }
}

/// One candidate of a [`race`], on `w` scheduled as `s`, against the best latency so far.
fn race_one(
    w: &Workload,
    g: &hpmoe_dsl::lower::TaskGraph,
    s: &Schedule,
    model: &DeviceModel,
    best: &sim::Race,
    opts: SimOptions,
    du: Option<&crate::report::Durations>,
) -> Outcome {
    let limit = best.best();
    let mut chains = Vec::new();
    if limit.is_finite() {
        let fresh;
        let du = match du {
            Some(du) => du,
            None => {
                fresh = crate::report::durations(w, model, &g.rank);
                &fresh
            }
        };
        let (b, ch) = crate::report::bounds_and_chains_with(w, s, model, &g.rank, true, du);
        let lb = b
            .max()
            .0
            .max(crate::report::kernel_bound_with(w, s, model, &g.rank, du));
        if lb * (1.0 - 1e-9) >= limit {
            return Outcome::Lost;
        }
        chains = ch;
    }
    match sim::simulate_racing(w, s, model, opts, limit, &chains, best) {
        Ok(Some(r)) => Outcome::Ended(Box::new(r)),
        Ok(None) => Outcome::Lost,
        Err(_) => Outcome::Stalled,
    }
}

/// [`choose`]; `progress` hears of each candidate's simulation. `None` when the policy has
/// no candidates; else also the fingerprints of the schedules simulated.
fn choose_observed(
    program: &Program,
    tf: &Taskflow,
    c: &mut Compiled,
    verify: bool,
    ch: &mut Choice,
) -> Option<(usize, f64, Vec<u64>)> {
    let spec = c.schedule.policy.clone();
    if spec.policy != hpmoe_dsl::policy::Policy::Interleaved || !spec.candidates {
        return None;
    }
    let model = DeviceModel::new(&program.device).ok()?;
    if c.graph.len() > ch.compared {
        let best = two_candidates(program, tf, c, &spec, &model, verify, ch, None, Above::Tasks);
        return Some((1, best, Vec::new()));
    }
    // One workload for every schedule of the graph: the region work is done once.
    let w = Workload::new(program, tf, &c.graph, &c.schedule, &model);
    if w.pairs.len() > ch.compared_pairs {
        let best = two_candidates(program, tf, c, &spec, &model, verify, ch, Some(w), Above::Pairs);
        return Some((1, best, Vec::new()));
    }
    if let Some(p) = ch.progress {
        p.candidate(1);
    }
    // Two at once holds every candidate's schedule (about the size of the policy's own).
    let schedules = (c.schedule.resident_bytes() as u64).saturating_mul(CANDIDATES as u64);
    if !(ch.side_by_side && room_for_two(&c.graph, &w, schedules)) {
        return Some(one_by_one(program, tf, c, verify, ch, w, &model, &spec));
    }
    // The policy's own schedule first, then every other candidate that builds queues of its
    // own (one that builds the same queues as another would run the same) and verifies.
    let mut others = Vec::new();
    let mut seen = vec![c.schedule.fingerprint()];
    for k in 0..CANDIDATES {
        if let Some(s) = new_candidate(program, tf, &c.graph, &spec, k, verify, &mut seen) {
            others.push(s);
        }
    }
    let tried = others.len();
    let items: Vec<&Schedule> = std::iter::once(&c.schedule).chain(&others).collect();
    let du = (tried > 0).then(|| crate::report::durations(&w, &model, &c.graph.rank));
    let how = How {
        progress: ch.progress,
        link_budget: ch.link_budget,
        numbered: 0,
        du: du.as_ref(),
        two: true,
        limit: f64::INFINITY,
    };
    let mut raced = race(&c.graph, &items, w, &model, how);
    drop((du, items));
    let won = raced.winner();
    let best = won.as_ref().map_or(f64::INFINITY, |(_, r)| r.makespan);
    if let Some((i, _)) = &won {
        if *i > 0 {
            c.schedule = others.swap_remove(*i - 1);
        }
    }
    ch.kept = won.map(|(i, result)| Best {
        at_best: raced.at == Some(i),
        workload: Some(raced.workload),
        result,
    });
    Some((tried, best, seen))
}

/// Candidate `k` of graph `g` under `spec` if it builds queues no schedule in `seen` built
/// (its fingerprint then joins them: one with the same queues would run the same) and,
/// with `verify`, verifies.
fn new_candidate(
    program: &Program,
    tf: &Taskflow,
    g: &hpmoe_dsl::lower::TaskGraph,
    spec: &PolicySpec,
    k: usize,
    verify: bool,
    seen: &mut Vec<u64>,
) -> Option<Schedule> {
    let (s, _) = hpmoe_dsl::schedule::candidate(program, tf, g, spec, k)?;
    let print = s.fingerprint();
    if seen.contains(&print) {
        return None;
    }
    seen.push(print);
    let ok = !verify || hpmoe_dsl::verify::verify_schedule(program, tf, g, &s).is_empty();
    ok.then_some(s)
}

/// [`choose_observed`] on one thread, one candidate after the other, each made when its turn
/// comes (so that only one is held besides the policy's own), `w` prepared for the policy's
/// schedule.
#[allow(clippy::too_many_arguments)]
fn one_by_one(
    program: &Program,
    tf: &Taskflow,
    c: &mut Compiled,
    verify: bool,
    ch: &mut Choice,
    w: Workload,
    model: &DeviceModel,
    spec: &PolicySpec,
) -> (usize, f64, Vec<u64>) {
    let mut w = w;
    let mut du = None;
    let mut run = latency_of(
        &w,
        c,
        &c.schedule,
        model,
        f64::INFINITY,
        sim_options(ch.progress, ch.link_budget),
        &mut du,
    );
    let mut best = run.as_ref().map_or(f64::INFINITY, |r| r.makespan);
    let mut at_best = true;
    let mut tried = 0;
    // A candidate that builds the same queues as one simulated before would run the same.
    let mut seen = vec![c.schedule.fingerprint()];
    for k in 0..CANDIDATES {
        let Some(s) = new_candidate(program, tf, &c.graph, spec, k, verify, &mut seen) else {
            continue;
        };
        tried += 1;
        if let Some(p) = ch.progress {
            p.candidate(tried + 1);
        }
        w.reschedule(&c.graph, &s, model);
        at_best = false;
        if let Some(r) = latency_of(
            &w,
            c,
            &s,
            model,
            best,
            sim_options(ch.progress, ch.link_budget),
            &mut du,
        ) {
            if r.makespan < best {
                best = r.makespan;
                c.schedule = s;
                run = Some(r);
                at_best = true;
            }
        }
    }
    ch.kept = run.map(|result| Best {
        workload: Some(w),
        result,
        at_best,
    });
    (tried, best, seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpmoe_dsl::check::{Options, Override};
    use hpmoe_dsl::policy::Policy;

    fn checked(file: &str, overrides: &[&str], routing: Option<&str>) -> Checked {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples")
            .join(file);
        let opts = Options {
            overrides: overrides
                .iter()
                .map(|o| Override::parse(o).expect("an override"))
                .collect(),
            routing: routing.map(str::to_string),
            ..Options::default()
        };
        let out = hpmoe_dsl::driver::check_path(&path, &opts, &mut hpmoe_dsl::SourceMap::new());
        out.checked
            .unwrap_or_else(|| panic!("{file} does not check: {:?}", out.diagnostics))
    }

    /// The choice among candidates of the first taskflow under `interleaved`, comparing every
    /// candidate of graphs up to `compared` tasks (the choice of two above), the candidates
    /// simulated two at once or not: the compiled taskflow and the simulation kept.
    fn choice(p: &Checked, compared: usize, side_by_side: bool) -> (Compiled, Kept) {
        let tf = &p.taskflows[0];
        let spec = p.select_policy(&tf.name, Some(Policy::Interleaved));
        let mut ch = Choice::new(None, side_by_side);
        ch.compared = compared;
        let mut clock = Clock::new();
        let (c, kept) = compile_kept(p, tf, &spec, &CompileOptions::default(), &mut clock, &mut ch, true)
            .unwrap_or_else(|ds| panic!("does not compile: {ds:?}"));
        (c, kept.expect("a simulation of the schedule kept"))
    }

    /// Above `CANDIDATE_MAX_PAIRS` pairs of ranks with traffic `interleaved` compares the
    /// expert-level order and its own schedule only, says why, and keeps the faster of the
    /// two (the expert-level order on a tie), each prepared and simulated alone here.
    #[test]
    fn a_graph_of_many_rank_pairs_compares_two_schedules() {
        let p = checked("deepseek_v3_ep8_fwd.hpm", &["tokens=256"], None);
        let tf = &p.taskflows[0];
        let model = DeviceModel::new(&p.device).expect("a model");
        let spec = p.select_policy(&tf.name, Some(Policy::Interleaved));
        let mut ch = Choice::new(None, false);
        ch.compared_pairs = 0;
        let (c, kept) = compile_kept(
            &p,
            tf,
            &spec,
            &CompileOptions::default(),
            &mut Clock::new(),
            &mut ch,
            true,
        )
        .unwrap_or_else(|ds| panic!("does not compile: {ds:?}"));
        let kept = kept.expect("a simulation of the schedule kept");
        assert!(
            c.schedule
                .origin
                .ends_with("(of two candidates: above 131072 pairs of ranks with traffic)"),
            "{}",
            c.schedule.origin
        );
        assert_eq!(CANDIDATE_MAX_PAIRS, 131072, "the origin and the docs quote this number");
        let own = p.compile(tf, &spec, &CompileOptions::default()).expect("compiles");
        let (other, _) =
            hpmoe_dsl::schedule::candidate(p.program(), tf, &own.graph, &spec, 2).expect("the expert-level order");
        let alone = |s: &Schedule| {
            let w = Workload::new(&p, tf, &own.graph, s, &model);
            sim::simulate(&w, s, &model, SimOptions::default()).expect("no stall")
        };
        let (a, b) = (alone(&other), alone(&own.schedule));
        let (best, print) = if a.makespan <= b.makespan {
            (a, other.fingerprint())
        } else {
            (b, own.schedule.fingerprint())
        };
        assert_eq!(c.schedule.fingerprint(), print);
        assert_eq!(kept.result.makespan.to_bits(), best.makespan.to_bits());
        assert_eq!(kept.result.end, best.end);
    }

    #[test]
    fn candidates_simulated_two_at_once_are_chosen_as_one_after_the_other() {
        let mut origins = Vec::new();
        for (file, overrides, routing) in [
            ("deepseek_v3_ep4_fwd.hpm", &["tokens=512"][..], None),
            ("deepseek_v3_ep4_bwd.hpm", &["tokens=512"][..], Some("zipf(s: 1.2)")),
            (
                "qwen_moe_ep8_fwd.hpm",
                &["tokens=256"][..],
                Some("hotspot(max_over_mean: 1.5)"),
            ),
            ("deepseek_v3_ep8_bwd.hpm", &["tokens=256"][..], None),
        ] {
            let p = checked(file, overrides, routing);
            let model = DeviceModel::new(&p.device).expect("a model");
            // Every candidate compared, then the choice of two (every graph above the limit).
            for compared in [usize::MAX, 0] {
                let (a, ka) = choice(&p, compared, false);
                let (b, kb) = choice(&p, compared, true);
                let what = format!("{file} (compared up to {compared} tasks)");
                assert_eq!(a.schedule.fingerprint(), b.schedule.fingerprint(), "{what}");
                assert_eq!(a.schedule.origin, b.schedule.origin, "{what}");
                assert_eq!(ka.result.makespan.to_bits(), kb.result.makespan.to_bits(), "{what}");
                assert_eq!(ka.result.end, kb.result.end, "{what}");
                assert_eq!(ka.result.start, kb.result.start, "{what}");
                // The workload kept (none when another tiling's took its place) is the schedule
                // kept's: simulated again, the same result.
                assert_eq!(ka.workload.is_some(), kb.workload.is_some(), "{what}");
                let w = kb
                    .workload
                    .unwrap_or_else(|| Workload::new(&p, &p.taskflows[0], &b.graph, &b.schedule, &model));
                if let Some(wa) = &ka.workload {
                    assert_eq!(wa.plan.pos, w.plan.pos, "{what}");
                }
                let again = sim::simulate(&w, &b.schedule, &model, SimOptions::default()).expect("no stall");
                assert_eq!(again.end, kb.result.end, "{what}");
                origins.push(b.schedule.origin);
            }
        }
        // Both ends of the choice of two were taken: the policy's schedule and the other.
        assert!(origins.iter().any(|o| o.starts_with("policy (of two")), "{origins:?}");
        assert!(
            origins.iter().any(|o| o.starts_with("expert-level order (of two")),
            "{origins:?}"
        );
    }

    #[test]
    fn the_choice_is_the_fastest_candidate_simulated_to_its_end() {
        for (file, overrides, routing) in [
            ("deepseek_v3_ep4_fwd.hpm", &["tokens=512"][..], Some("zipf(s: 0.8)")),
            ("qwen_moe_ep8_bwd.hpm", &["tokens=256"][..], None),
        ] {
            let p = checked(file, overrides, routing);
            let tf = &p.taskflows[0];
            let spec = p.select_policy(&tf.name, Some(Policy::Interleaved));
            let c = p.compile(tf, &spec, &CompileOptions::default()).expect("compiles");
            let model = DeviceModel::new(&p.device).expect("a model");
            // Every candidate with queues of its own, simulated to its end: the first fastest.
            let mut all = vec![c.schedule.clone()];
            for k in 0..CANDIDATES {
                if let Some((s, _)) = hpmoe_dsl::schedule::candidate(&p, tf, &c.graph, &spec, k) {
                    if all.iter().all(|a| a.fingerprint() != s.fingerprint()) {
                        all.push(s);
                    }
                }
            }
            let latency = |s: &Schedule| {
                let w = Workload::new(&p, tf, &c.graph, s, &model);
                sim::simulate(&w, s, &model, SimOptions::default()).map_or(f64::INFINITY, |r| r.makespan)
            };
            let latencies: Vec<f64> = all.iter().map(latency).collect();
            let first = (0..all.len()).fold(0, |b, i| if latencies[i] < latencies[b] { i } else { b });
            for side_by_side in [false, true] {
                let mut chosen = c.clone();
                let mut ch = Choice::new(None, side_by_side);
                let (tried, best, _) = choose_observed(&p, tf, &mut chosen, true, &mut ch).expect("candidates");
                assert_eq!(tried, all.len() - 1, "{file}");
                assert_eq!(best.to_bits(), latencies[first].to_bits(), "{file}: {latencies:?}");
                assert_eq!(
                    chosen.schedule.fingerprint(),
                    all[first].fingerprint(),
                    "{file}: {latencies:?}"
                );
            }
        }
    }
}
