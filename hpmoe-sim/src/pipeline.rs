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
//!
//! A candidate is simulated only as far as it can still win: the simulation stops at the
//! first event past the best latency so far, or as soon as a task starts whose queue still
//! needs, at the least, more than what is left ([`crate::report::bounds_and_chains`]). The
//! kept schedule's own simulation ran to its end, and [`run`] reports it as it is (with its
//! workload) instead of preparing and simulating the same schedule again, unless a trace
//! asks for bandwidth samples; its time is then part of `candidates`.

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
    let (c, kept) = self::compile_kept(checked, tf, spec, compile, clock, sim_opts.progress.as_ref(), keep)?;
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
    compile_kept(checked, tf, spec, opts, clock, progress, false).map(|(c, _)| c)
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
    progress: Option<&Progress>,
    keep: bool,
) -> Result<(Compiled, Option<Kept>), Vec<Diagnostic>> {
    let mut c = checked.compile_timed(tf, spec, opts, clock)?;
    let all = c.graph.len() <= CANDIDATE_MAX_TASKS;
    let mut ch = Choice { progress, kept: None };
    if let Some((_, best, seen)) = choose_observed(checked.program(), tf, &mut c, opts.verify, &mut ch) {
        if !keep {
            ch.kept = None;
        }
        if all {
            other_tilings(checked, tf, &mut c, opts, best, &seen, &mut ch);
        }
        clock.lap("candidates");
    }
    if let Some(p) = progress {
        p.candidate(0);
    }
    let kept = match ch.kept {
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

/// The state of a choice among candidates: who hears of each simulation, and the best
/// simulation so far.
#[derive(Default)]
struct Choice<'p> {
    progress: Option<&'p Progress>,
    kept: Option<Best>,
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
        let mut w = Workload::new(program, tf, &other.graph, &other.schedule, &model);
        let mut du = None;
        // The schedule that won, whether the workload is scheduled as it, and its simulation
        // when it can stand for the schedule as relabelled (the same kernel launches).
        let mut won = None;
        let mut won_run = None;
        let mut at_won = false;
        if let Some(r) = latency_of(&w, &other, &other.schedule, &model, best, ch.progress, &mut du) {
            if r.makespan < best {
                best = r.makespan;
                let mut s = other.schedule.clone();
                s.origin = if static_capacity {
                    "expert-level tiling and order (static capacity)"
                } else {
                    "expert-level tiling and order"
                };
                won_run = (s.policy.launch_overhead == spec.launch_overhead).then_some(r);
                won = Some(s);
                at_won = true;
            }
        }
        // The policy's own list scheduler on the expert-level tiling.
        let mut list_spec = spec.clone();
        list_spec.candidates = false;
        list_spec.static_capacity = static_capacity;
        let list = hpmoe_dsl::schedule::schedule(program, tf, &other.graph, &list_spec);
        if !opts.verify || hpmoe_dsl::verify::verify_schedule(program, tf, &other.graph, &list).is_empty() {
            if let Some(p) = ch.progress {
                p.candidate(p.candidates() + 1);
            }
            w.reschedule(&other.graph, &list, &model);
            at_won = false;
            if let Some(r) = latency_of(&w, &other, &list, &model, best, ch.progress, &mut du) {
                if r.makespan < best {
                    best = r.makespan;
                    won_run = Some(r);
                    at_won = true;
                    let mut list = list;
                    list.origin = if static_capacity {
                        "list on expert-level tiling (static capacity)"
                    } else {
                        "list on expert-level tiling"
                    };
                    won = Some(list);
                }
            }
        }
        if let Some(mut s) = won {
            s.policy = PolicySpec {
                static_capacity,
                ..spec.clone()
            };
            s.estimate = 0.0;
            other.schedule = s;
            *c = other;
            ch.kept = won_run.map(|result| Best {
                workload: Some(w),
                result,
                at_best: at_won,
            });
        }
    }
}

/// The simulation of the workload `w` under schedule `s` of `c`'s graph if its latency is strictly
/// below `best`, else `None` (also when it stalls): without simulating when the schedule's
/// lower bound ([`crate::report::bounds`], and for a schedule with kernel barriers
/// [`crate::report::kernel_bound`]) shows it cannot be (the bound relaxed by a
/// relative `1e-9` against rounding, so a schedule is skipped only when it is slower by more
/// than that), and with the simulation stopped once it passes `best`
/// ([`sim::simulate_below_chained`], also as soon as a task's start and the least time
/// its queue still needs reach `best`). `progress` hears of the simulation.
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
    progress: Option<&Progress>,
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
    let opts = SimOptions {
        progress: progress.cloned(),
        ..SimOptions::default()
    };
    sim::simulate_below_chained(w, s, model, opts, best, &chains)
}

/// Replaces `c.schedule` by the fastest of the candidates of its policy (none unless the
/// policy is `interleaved` with `candidates`); returns how many candidates were tried
/// (simulated, or skipped by their lower bound) and the latency of the schedule kept.
pub fn choose(program: &Program, tf: &Taskflow, c: &mut Compiled, verify: bool) -> (usize, f64) {
    choose_observed(program, tf, c, verify, &mut Choice::default())
        .map_or((0, f64::INFINITY), |(tried, best, _)| (tried, best))
}

/// The largest graph whose candidate schedules are all compared: each candidate is one more
/// simulation of the whole graph, so above this size `interleaved` compares only its own
/// schedule and the expert-level order (a run stays within minutes instead of hours).
pub const CANDIDATE_MAX_TASKS: usize = 1 << 21;

/// The choice on a graph above [`CANDIDATE_MAX_TASKS`]: the expert-level order of the same
/// graph (the candidate that wins most often) is simulated, then the policy's own schedule,
/// stopped once it passes it; the faster is kept, its origin saying that only two were
/// compared.
fn two_candidates(
    program: &Program,
    tf: &Taskflow,
    c: &mut Compiled,
    spec: &PolicySpec,
    model: &DeviceModel,
    verify: bool,
    ch: &mut Choice,
) -> f64 {
    c.schedule.origin = "policy (of two candidates: above 2097152 tasks)";
    let Some((mut other, _)) = hpmoe_dsl::schedule::candidate(program, tf, &c.graph, spec, 2) else {
        return f64::INFINITY;
    };
    if verify && !hpmoe_dsl::verify::verify_schedule(program, tf, &c.graph, &other).is_empty() {
        return f64::INFINITY;
    }
    if let Some(p) = ch.progress {
        p.candidate(1);
    }
    let mut w = Workload::new(program, tf, &c.graph, &other, model);
    // One bound is computed here: its durations are not kept through the simulation.
    let Some(first) = latency_of(&w, c, &other, model, f64::INFINITY, ch.progress, &mut None) else {
        return f64::INFINITY;
    };
    if let Some(p) = ch.progress {
        p.candidate(2);
    }
    w.reschedule(&c.graph, &c.schedule, model);
    // The workload stays scheduled as the policy's own schedule, whichever wins.
    let (result, at_best) = match latency_of(&w, c, &c.schedule, model, first.makespan, ch.progress, &mut None) {
        Some(own) => (own, true),
        None => {
            other.origin = "expert-level order (of two candidates: above 2097152 tasks)";
            c.schedule = other;
            (first, false)
        }
    };
    let best = result.makespan;
    ch.kept = Some(Best {
        workload: Some(w),
        result,
        at_best,
    });
    best
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
    if c.graph.len() > CANDIDATE_MAX_TASKS {
        let best = two_candidates(program, tf, c, &spec, &model, verify, ch);
        return Some((1, best, Vec::new()));
    }
    if let Some(p) = ch.progress {
        p.candidate(1);
    }
    // One workload for every schedule of the graph: the region work is done once.
    let mut w = Workload::new(program, tf, &c.graph, &c.schedule, &model);
    let mut du = None;
    let mut run = latency_of(&w, c, &c.schedule, &model, f64::INFINITY, ch.progress, &mut du);
    let mut best = run.as_ref().map_or(f64::INFINITY, |r| r.makespan);
    let mut at_best = true;
    let mut tried = 0;
    // A candidate that builds the same queues as one simulated before would run the same.
    let mut seen = vec![c.schedule.fingerprint()];
    for k in 0..CANDIDATES {
        let Some((s, _)) = hpmoe_dsl::schedule::candidate(program, tf, &c.graph, &spec, k) else {
            continue;
        };
        let print = s.fingerprint();
        if seen.contains(&print) {
            continue;
        }
        seen.push(print);
        if verify && !hpmoe_dsl::verify::verify_schedule(program, tf, &c.graph, &s).is_empty() {
            continue;
        }
        tried += 1;
        if let Some(p) = ch.progress {
            p.candidate(tried + 1);
        }
        w.reschedule(&c.graph, &s, &model);
        at_best = false;
        if let Some(r) = latency_of(&w, c, &s, &model, best, ch.progress, &mut du) {
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
    Some((tried, best, seen))
}
