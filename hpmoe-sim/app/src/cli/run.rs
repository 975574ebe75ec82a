//! `hpmoe run`: a program in; per taskflow and policy, the program is lowered, verified,
//! scheduled and simulated, and a report (tables or JSON), optionally a comparison of two
//! policies, a Chrome trace and a Gantt chart come out.

use super::{checked, style, usage, Format, ProgramArgs};
use hpmoe_dsl::diag::{self, Diagnostic};
use hpmoe_dsl::driver::{Checked, CompileOptions};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::schedule;
use hpmoe_dsl::timing::Clock;
use hpmoe_dsl::{Code, SourceMap};
use hpmoe_sim::report::{Comparison, Report};
use hpmoe_sim::sim::SimOptions;
use hpmoe_sim::trace::{self, Filter, Run};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `hpmoe run`.
pub(crate) struct RunCli<'a> {
    pub file: &'a PathBuf,
    pub prog: &'a ProgramArgs,
    pub format: Format,
    pub policy: Option<&'a str>,
    pub compare: Option<&'a str>,
    pub taskflow: Option<&'a str>,
    pub max_tasks: u64,
    pub verify: bool,
    pub trace: Option<&'a Path>,
    pub gantt: Option<&'a Path>,
    pub trace_ranks: Option<&'a str>,
    pub trace_window: Option<&'a str>,
    /// Compute the real numbers too (`--numerics`, `--dump`, `--input`).
    pub numerics: Option<hpmoe_sim::numerics::NumericsOptions>,
    /// Measure every stage's wall-clock time and the peak memory (`--timings`).
    pub timings: bool,
    /// Simulate the schedule chosen among candidates again (`--resimulate`).
    pub resimulate: bool,
    /// Solve the link rates at every instant whatever the work (`--exact-links`).
    pub exact_links: bool,
    /// Runs at once (0: one per CPU).
    pub jobs: usize,
}

fn print_diags(ds: &[Diagnostic], sources: &SourceMap, format: Format) {
    match format {
        Format::Human => errout!(
            "{}",
            diag::render_all(ds, hpmoe_dsl::diag::Dropped::NONE, sources, style())
        ),
        Format::Json => {
            let list: Vec<_> = ds.iter().map(|d| diag::to_json(d, sources)).collect();
            outln!("{}", serde_json::json!({ "ok": false, "diagnostics": list }));
        }
    }
}

/// One simulated policy.
struct Done {
    report: Report,
    numerics: Option<hpmoe_sim::numerics::NumericsReport>,
    /// The memories of a forward whose backward runs too (to feed its saved activations).
    memories: Option<hpmoe_sim::numerics::Memories>,
    /// A backward whose numerics wait for its forward's memories: its compiled graph and
    /// the start order of its tasks.
    deferred: Option<(hpmoe_dsl::driver::Compiled, Vec<u32>)>,
    timing: RunTiming,
}

/// What the numerics of a job do within a layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A taskflow on its own (or a backward whose forward does not run).
    Alone,
    /// A forward whose backward runs under the same policy: its memories are kept.
    Forward,
    /// A backward whose forward runs under the same policy: numerics wait for its memories.
    Backward,
}

/// The stages of one run and the size of its graph.
struct RunTiming {
    taskflow: String,
    policy: String,
    tasks: usize,
    edges: u64,
    counter_entries: usize,
    graph_bytes: usize,
    /// The link model's solves in the reported simulation.
    link: hpmoe_sim::model::link::SolveStats,
    clock: Clock,
}

impl RunTiming {
    fn json(&self) -> serde_json::Value {
        let stages: serde_json::Map<String, serde_json::Value> = self
            .clock
            .laps()
            .iter()
            .map(|(n, d)| (n.to_string(), serde_json::json!(d.as_secs_f64())))
            .collect();
        serde_json::json!({
            "taskflow": self.taskflow,
            "policy": self.policy,
            "tasks": self.tasks,
            "edges": self.edges,
            "counter_entries": self.counter_entries,
            "graph_bytes": self.graph_bytes,
            "link_solves": {
                "solves": self.link.solves,
                "resumed": self.link.resumed,
                "freezes": self.link.pairs,
                "freezes_kept": self.link.kept,
                "scanned": self.link.scanned,
                "local": self.link.local,
            },
            "stages_s": stages,
            "total_s": self.clock.total().as_secs_f64(),
        })
    }
}

/// All timings of a `hpmoe run`.
struct Timings {
    check: Duration,
    /// Materialising the routings.
    layouts: Duration,
    /// Threads the runs were spread over (their stages overlap when more than one).
    threads: usize,
    runs: Vec<RunTiming>,
    total: Duration,
    peak_rss: Option<u64>,
}

impl Timings {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "check_s": self.check.as_secs_f64(),
            "layouts_s": self.layouts.as_secs_f64(),
            "threads": self.threads,
            "runs": self.runs.iter().map(RunTiming::json).collect::<Vec<_>>(),
            "total_s": self.total.as_secs_f64(),
            "peak_rss_bytes": self.peak_rss,
        })
    }

    fn human(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::from("timings (wall clock");
        if self.threads > 1 {
            let _ = write!(s, "; the runs shared {} threads, so their stages overlap", self.threads);
        }
        s.push_str("):\n");
        let _ = writeln!(s, "  {:<22} {:>10.3} s", "check", self.check.as_secs_f64());
        let _ = writeln!(s, "  {:<22} {:>10.3} s", "routings", self.layouts.as_secs_f64());
        for r in &self.runs {
            let _ = writeln!(
                s,
                "  {} under {}: {} tasks, {} edges in {} counter entries, graph {:.1} MiB",
                r.taskflow,
                r.policy,
                r.tasks,
                r.edges,
                r.counter_entries,
                r.graph_bytes as f64 / (1 << 20) as f64
            );
            for (n, d) in r.clock.laps() {
                let _ = writeln!(s, "    {n:<20} {:>10.3} s", d.as_secs_f64());
            }
            let l = &r.link;
            let _ = writeln!(
                s,
                "    link model: {} solves ({} resumed, {} pair freezes, {} more kept from the solve before, {} entries scanned), {} instants settled locally",
                l.solves, l.resumed, l.pairs, l.kept, l.scanned, l.local
            );
        }
        let _ = writeln!(s, "  {:<22} {:>10.3} s", "total", self.total.as_secs_f64());
        match self.peak_rss {
            Some(b) => {
                let _ = writeln!(s, "  {:<22} {:>10.2} GiB", "peak RSS", b as f64 / (1u64 << 30) as f64);
            }
            None => {
                let _ = writeln!(s, "  {:<22} {:>12}", "peak RSS", "unavailable");
            }
        }
        s
    }
}

/// A failed run: the diagnostics to print (already printed when empty) and the exit code.
struct Failure {
    diags: Vec<Diagnostic>,
    code: i32,
}

impl Failure {
    fn new(d: Diagnostic) -> Failure {
        Failure {
            diags: vec![d],
            code: 1,
        }
    }
}

/// One taskflow under one policy, ready to run.
struct Job<'p> {
    tf: &'p Taskflow,
    /// The policy asked for (`None`: the program's).
    policy: Option<&'p str>,
    spec: schedule::PolicySpec,
    /// Write the trace and chart of this job.
    outputs: bool,
    role: Role,
    /// The numerics options of this taskflow (its `--input` files).
    numerics: Option<hpmoe_sim::numerics::NumericsOptions>,
}

/// Where a dump of `tf` goes: `dir` itself, or `dir/TASKFLOW` when several taskflows
/// (`taskflows`) are dumped.
fn dump_dir(dir: &std::path::Path, tf: &Taskflow, taskflows: usize) -> std::path::PathBuf {
    if taskflows > 1 {
        dir.join(&tf.name)
    } else {
        dir.to_path_buf()
    }
}

/// How many of the runs `mems` may go side by side, at most `threads`: the most whose largest
/// estimates fit [`hpmoe_dsl::lower::MAX_MEMORY`] together (at least one).
fn side_by_side(mems: &[hpmoe_sim::pipeline::RunMemory], threads: usize) -> usize {
    let mut by_size = mems.to_vec();
    by_size.sort_by_key(|m| std::cmp::Reverse(m.graphs));
    let mut n = threads.min(by_size.len()).max(1);
    while n > 1 && hpmoe_sim::pipeline::RunMemory::together(&by_size[..n]) > hpmoe_dsl::lower::MAX_MEMORY {
        n -= 1;
    }
    n
}

/// Lowers, schedules and simulates a taskflow under a policy; writes the trace and chart if
/// asked. Prints nothing but notes of the trace and chart: failures are returned, so jobs can
/// run side by side and still report in order.
fn one(
    checked: &Checked,
    job: &Job,
    o: &RunCli,
    outputs: Option<&Filter>,
    progress: Option<&indicatif::MultiProgress>,
    side_by_side: bool,
) -> Result<Done, Failure> {
    let p: &Program = checked;
    let tf = job.tf;
    let policy = job.policy;
    let simulated = hpmoe_sim::sim::Progress::new();
    let bar = progress.map(|m| stage_bar(m, &format!("{} ({})", tf.name, job.spec.policy.name()), &simulated));
    let mut clock = match &bar {
        Some(b) => {
            let b = b.clone();
            let done = std::sync::Mutex::new(Vec::<&'static str>::new());
            Clock::observed(hpmoe_dsl::timing::LapObserver(std::sync::Arc::new(move |stage| {
                if let Ok(mut d) = done.lock() {
                    if !d.contains(&stage) {
                        d.push(stage);
                    }
                    b.set_message(format!("done: {}", d.join(", ")));
                }
            })))
        }
        None => Clock::new(),
    };
    let copts = CompileOptions {
        max_tasks: o.max_tasks,
        verify: o.verify,
    };
    let opts = SimOptions {
        record_bandwidth: outputs.is_some() && o.trace.is_some(),
        progress: bar.is_some().then_some(simulated),
        side_by_side,
        link_budget: if o.exact_links {
            hpmoe_sim::sim::LinkBudget::UNLIMITED
        } else {
            hpmoe_sim::sim::LinkBudget::default()
        },
        ..SimOptions::default()
    };
    let hpmoe_sim::pipeline::Ran {
        compiled: c,
        simulated: simd,
        report,
    } = hpmoe_sim::pipeline::run_with(checked, tf, &job.spec, &copts, opts, !o.resimulate, &mut clock)
        .map_err(|diags| Failure { diags, code: 1 })?;
    // Numerics run the tasks in the order the simulation started them.
    let mut memories = None;
    let mut deferred_order = None;
    let numerics = match (
        &job.numerics,
        outputs.is_some() || o.compare.is_none() || policy == o.policy,
    ) {
        (Some(nopts), true) => {
            let mut order: Vec<u32> = (0..c.graph.len() as u32).collect();
            order.sort_by(|&a, &b| {
                simd.result.start[a as usize]
                    .total_cmp(&simd.result.start[b as usize])
                    .then(a.cmp(&b))
            });
            if job.role == Role::Backward {
                deferred_order = Some(order);
                None
            } else {
                let keep = job.role == Role::Forward;
                let (r, m) = hpmoe_sim::numerics::run_bound(p, tf, &c.graph, &c.schedule, &order, nopts, None, keep)
                    .map_err(Failure::new)?;
                memories = m;
                Some(r)
            }
        }
        _ => None,
    };
    if numerics.is_some() {
        clock.lap("numerics");
    }
    if let Some(filter) = outputs {
        let run = Run {
            program: p,
            tf,
            graph: &c.graph,
            schedule: &c.schedule,
            workload: &simd.workload,
            result: &simd.result,
        };
        let write = |path: &Path, f: &dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>| -> Result<(), Failure> {
            let res = hpmoe_dsl::outfile::create(path).and_then(|file| {
                let mut w = std::io::BufWriter::new(file);
                f(&mut w)?;
                std::io::Write::flush(&mut w)
            });
            res.map_err(|e| {
                errln!("error: cannot write `{}`: {e}", path.display());
                Failure {
                    diags: Vec::new(),
                    code: 1,
                }
            })
        };
        if let Some((lo, _)) = filter.window {
            let end = simd.result.makespan;
            if lo > end {
                errln!(
                    "warning: --trace-window starts at {:.1} us, after the end of `{}` ({:.1} us): the trace and chart show no tasks",
                    lo * 1e6,
                    tf.name,
                    end * 1e6
                );
            }
        }
        if let Some(path) = o.trace {
            write(path, &|w| trace::write(w, &run, filter))?;
        }
        if let Some(path) = o.gantt {
            let mut gf = filter.clone();
            if gf.ranks.is_none() {
                gf.ranks = Some(vec![0]);
                if o.format == Format::Human && c.graph.ranks > 1 {
                    errln!("note: the chart shows rank 0; choose ranks with --trace-ranks");
                }
            }
            write(path, &|w| hpmoe_sim::gantt::write(w, &run, &gf))?;
        }
        clock.lap("trace and chart");
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let timing = RunTiming {
        taskflow: tf.name.clone(),
        policy: report.policy.clone(),
        tasks: c.graph.len(),
        edges: c.graph.edges(),
        counter_entries: c.graph.counters.idx.len(),
        graph_bytes: c.graph.resident_bytes(),
        link: simd.result.link,
        clock,
    };
    let deferred = deferred_order.map(|order| (c, order));
    Ok(Done {
        report,
        numerics,
        memories,
        deferred,
        timing,
    })
}

/// The `--input` files of one taskflow: `TF.ARG=FILE` for taskflow `TF`, `ARG=FILE` for
/// every taskflow with an input `ARG`.
/// An `--input` name that addresses no input of the taskflows run, as a usage message.
fn unknown_input(tfs: &[&Taskflow], inputs: &[(String, PathBuf)]) -> Option<String> {
    for (n, _) in inputs {
        if tfs
            .iter()
            .any(|tf| hpmoe_sim::numerics::gates::inputs_of(tf, &[(n.clone(), PathBuf::new())]).len() == 1)
        {
            continue;
        }
        let mut names = Vec::new();
        for tf in tfs {
            for &i in &tf.inputs {
                let a = &tf.tensor(i).name;
                names.push(if tfs.len() > 1 {
                    format!("{}.{a}", tf.name)
                } else {
                    a.clone()
                });
            }
        }
        let hint = match hpmoe_dsl::suggest::closest(n, names.iter().map(String::as_str)) {
            Some(b) => format!("did you mean `{b}`?"),
            None => format!("the inputs are: {}", names.join(", ")),
        };
        return Some(format!("--input `{n}` names no input of the taskflows run: {hint}"));
    }
    None
}

/// The forward and backward of one layer under one policy.
struct Layer {
    forward: String,
    backward: String,
    policy: String,
    forward_us: f64,
    backward_us: f64,
}

impl Layer {
    fn human(&self) -> String {
        format!(
            "layer {} + {} under {}: forward {:.3} us + backward {:.3} us = F+B {:.3} us\n",
            self.forward,
            self.backward,
            self.policy,
            self.forward_us,
            self.backward_us,
            self.forward_us + self.backward_us
        )
    }
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "forward": self.forward,
            "backward": self.backward,
            "policy": self.policy,
            "forward_us": self.forward_us,
            "backward_us": self.backward_us,
            "total_us": self.forward_us + self.backward_us,
        })
    }
}

pub(crate) fn run(o: &RunCli) -> i32 {
    // Usage errors first, before any work.
    let mut filter = Filter::default();
    if let Some(r) = o.trace_ranks {
        match Filter::parse_ranks(r) {
            Ok(v) => filter.ranks = Some(v),
            Err(e) => return usage(format!("--trace-ranks {e}")),
        }
    }
    if let Some(wd) = o.trace_window {
        match Filter::parse_window(wd) {
            Ok(v) => filter.window = Some(v),
            Err(e) => return usage(format!("--trace-window {e}")),
        }
    }
    for name in [o.policy, o.compare].into_iter().flatten() {
        if schedule::Policy::parse(name).is_none() {
            let names: Vec<&str> = schedule::Policy::all().iter().map(|p| p.name()).collect();
            let hint = match hpmoe_dsl::suggest::closest(name, names.iter().copied()) {
                Some(b) => format!("did you mean `{b}`?"),
                None => format!("the policies are: {}", names.join(", ")),
            };
            return usage(format!("unknown policy `{name}`: {hint}"));
        }
    }
    if let (Some(c), Some(p)) = (o.compare, o.policy) {
        if c == p {
            return usage(format!(
                "--compare `{c}` is the policy of --policy: compare two different policies"
            ));
        }
    }
    let files: Vec<(&str, &std::path::Path)> = [("--trace", o.trace), ("--gantt", o.gantt)]
        .into_iter()
        .filter_map(|(what, path)| Some((what, path?)))
        .collect();
    for &(what, path) in &files {
        if let Err(e) = super::paths::output_file(what, path) {
            return usage(e);
        }
    }
    if let Err(e) = super::paths::distinct_outputs(o.file, &files) {
        return usage(e);
    }
    if let Some(dir) = o.numerics.as_ref().and_then(|n| n.dump.as_deref()) {
        if let Err(e) = super::paths::output_dir("--dump", dir) {
            return usage(e);
        }
    }
    let started = Instant::now();
    let (p, sources, warnings) = match checked(o.file, o.prog, o.format) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // The program's other files are known once it is checked (before any work).
    let read = super::paths::files_read(&sources, p.program());
    if let Err(e) = super::paths::outputs_not_read(&read, &files) {
        return usage(e);
    }
    if let Some(n) = o.numerics.as_ref() {
        if let Some(dir) = n.dump.as_deref() {
            let mut read = read;
            read.extend(n.inputs.iter().map(|(_, f)| f.clone()));
            if let Err(e) = super::paths::dump_not_over_inputs(dir, &read) {
                return usage(e);
            }
        }
    }
    // Routings the program computes: with numerics, made from the logits it computes.
    let main_policy = o.policy.and_then(schedule::Policy::parse);
    let (p, gates) = match o
        .numerics
        .as_ref()
        .map(|n| hpmoe_sim::numerics::gates::route_by_gates(&p, main_policy, n))
    {
        Some(Ok(Some((q, g)))) => (q, g),
        Some(Err(ds)) => {
            print_diags(&ds, &sources, o.format);
            return 1;
        }
        _ => (p, Vec::new()),
    };
    let check_time = started.elapsed();
    if let Some(max) = filter.ranks.as_ref().and_then(|v| v.last()) {
        if *max as u64 >= u64::from(p.device.ranks()) {
            return usage(format!(
                "--trace-ranks names rank {max}, but the device has {} ranks",
                p.device.ranks()
            ));
        }
    }
    let tfs = match p.select_taskflows(o.taskflow) {
        Ok(t) => t,
        Err(d) => {
            print_diags(&[d], &sources, o.format);
            return 1;
        }
    };
    if tfs.is_empty() {
        print_diags(
            &[Diagnostic::error(
                Code::NoTaskflow,
                "the program has no taskflow to run",
            )],
            &sources,
            o.format,
        );
        return 1;
    }
    if let Some(msg) = o.numerics.as_ref().and_then(|n| unknown_input(&tfs, &n.inputs)) {
        return usage(msg);
    }
    // A dump of several taskflows puts each taskflow's files in a directory of its own
    // (their tensors and routings have the same names); nothing it writes may replace a file
    // the run reads or another file of the same dump.
    if let Some(n) = o.numerics.as_ref() {
        if let Some(dir) = n.dump.as_deref() {
            let mut read = super::paths::files_read(&sources, p.program());
            read.extend(n.inputs.iter().map(|(_, f)| f.clone()));
            for tf in &tfs {
                let sub = dump_dir(dir, tf, tfs.len());
                if let Err(e) = super::paths::output_dir("--dump", &sub) {
                    return usage(e);
                }
                if let Err(e) = super::paths::dump_not_over_inputs(&sub, &read) {
                    return usage(e);
                }
                if let Err(e) = hpmoe_sim::numerics::check_dump(&p, tf) {
                    return usage(format!("--dump `{}`: {e}", sub.display()));
                }
                let files = hpmoe_sim::numerics::dump_files(&p, tf);
                if let Err(e) = super::paths::files_in_dir("--dump", &sub, files.iter().map(|(f, _)| f.as_str())) {
                    return usage(e);
                }
            }
        }
    }
    let wants_outputs = o.trace.is_some() || o.gantt.is_some();
    if wants_outputs && tfs.len() > 1 && o.format == Format::Human {
        errln!(
            "note: the trace and chart show taskflow `{}`; choose one with --taskflow",
            tfs[0].name
        );
    }
    // The jobs: every taskflow under --policy, then under --compare. The routings depend
    // only on the program and the capacity mode, so jobs share their materialisation.
    let mut jobs: Vec<Job> = Vec::new();
    for (i, tf) in tfs.iter().enumerate() {
        let main = (o.policy, wants_outputs && i == 0);
        for (policy, outputs) in std::iter::once(main).chain(o.compare.map(|c| (Some(c), false))) {
            let spec = match p.policy(&tf.name, policy) {
                Ok(s) => s,
                Err(d) => {
                    print_diags(&[d], &sources, o.format);
                    return 2;
                }
            };
            if let Err(d) = p.layouts(spec.static_capacity) {
                print_diags(&[d], &sources, o.format);
                return 1;
            }
            let numerics = o.numerics.as_ref().map(|n| hpmoe_sim::numerics::NumericsOptions {
                inputs: hpmoe_sim::numerics::gates::inputs_of(tf, &n.inputs),
                dump: n.dump.as_deref().map(|d| dump_dir(d, tf, tfs.len())),
                ..n.clone()
            });
            jobs.push(Job {
                tf,
                policy,
                spec,
                outputs,
                role: Role::Alone,
                numerics,
            });
        }
    }
    // Layers: a backward and its forward, both run under the same policy.
    let mut layer_jobs: Vec<(usize, usize)> = Vec::new();
    for b in 0..jobs.len() {
        let Some(f) = p.forward_of(jobs[b].tf) else { continue };
        if let Some(fi) = jobs
            .iter()
            .position(|j| j.tf.name == f.name && j.policy == jobs[b].policy && j.spec == jobs[b].spec)
        {
            layer_jobs.push((fi, b));
        }
    }
    for &(f, b) in &layer_jobs {
        jobs[f].role = Role::Forward;
        jobs[b].role = Role::Backward;
    }
    // Limits before any work: a taskflow its lowering would refuse (too many tasks, too much
    // memory) is reported at once, not after the jobs before it have run.
    let copts = CompileOptions {
        max_tasks: o.max_tasks,
        verify: o.verify,
    };
    for job in &jobs {
        if let Err(d) = p.memory_estimate(job.tf, &job.spec, &copts) {
            print_diags(&[d], &sources, o.format);
            return 1;
        }
    }
    // The numerics of all the jobs that compute them, together (each is also held to its own
    // limit when it starts).
    if let Some(n) = o.numerics.as_ref() {
        let mut works = Vec::new();
        for job in jobs
            .iter()
            .filter(|j| j.outputs || o.compare.is_none() || j.policy == o.policy)
        {
            if let Ok(layouts) = p.layouts(job.spec.static_capacity) {
                works.push((job.tf, hpmoe_sim::numerics::work_in(job.tf, &layouts, p.device.ranks())));
            }
        }
        if let Err(d) = hpmoe_sim::numerics::check_total_work(&works, n) {
            print_diags(&[d], &sources, o.format);
            return 1;
        }
    }
    let setup = started.elapsed() - check_time;
    // Jobs run side by side (each holds its own graph); results are reported in job order,
    // and the first failure in that order is the one shown.
    let threads = match o.jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(jobs.len())
    .max(1);
    // Side by side, each job holds its own graphs (and its numerics' tensors): no more run
    // at once than their memory estimates allow together (decided before any starts, so the
    // output does not depend on it).
    let threads = if threads > 1 {
        let mems: Vec<hpmoe_sim::pipeline::RunMemory> = jobs
            .iter()
            .filter_map(|j| {
                let mut m = hpmoe_sim::pipeline::run_memory(&p, j.tf, &j.spec, &copts)?;
                if j.numerics.is_some() {
                    let layouts = p.layouts(j.spec.static_capacity).ok()?;
                    let need = hpmoe_sim::numerics::memory_need_in(j.tf, &layouts, p.device.ranks());
                    m.graphs = m.graphs.saturating_add(u64::try_from(need).unwrap_or(u64::MAX));
                }
                Some(m)
            })
            .collect();
        side_by_side(&mems, threads)
    } else {
        threads
    };
    // A progress display on a terminal (stage by stage, per job); nothing when piped.
    let progress = (std::io::stderr().is_terminal() && o.format == Format::Human)
        .then(|| indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr()));
    // Jobs one at a time leave the other CPUs to each job's choice among candidates.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let alone = threads <= 1 && cpus > 1;
    let run_job = |job: &Job| one(&p, job, o, job.outputs.then_some(&filter), progress.as_ref(), alone);
    let results: Vec<Result<Done, Failure>> = if threads <= 1 {
        jobs.iter().map(run_job).collect()
    } else {
        match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
            Ok(pool) => pool.install(|| {
                use rayon::prelude::*;
                jobs.par_iter().map(run_job).collect()
            }),
            Err(_) => jobs.iter().map(run_job).collect(),
        }
    };
    let mut runs: Vec<Report> = Vec::new();
    let mut comparisons: Vec<Comparison> = Vec::new();
    let mut num_reports: Vec<(String, hpmoe_sim::numerics::NumericsReport)> = Vec::new();
    let mut run_timings: Vec<RunTiming> = Vec::new();
    let mut dones: Vec<Done> = Vec::new();
    for res in results {
        match res {
            Ok(d) => dones.push(d),
            Err(f) => {
                if !f.diags.is_empty() {
                    print_diags(&f.diags, &sources, o.format);
                }
                return f.code;
            }
        }
    }
    // The backward of a layer runs its numerics on its forward's saved tensors.
    for &(f, b) in &layer_jobs {
        let Some((c, order)) = dones[b].deferred.take() else {
            continue;
        };
        let Some(nopts) = jobs[b].numerics.as_ref() else {
            continue;
        };
        let saved = dones[f].memories.take();
        let started = Instant::now();
        match hpmoe_sim::numerics::run_bound(
            &p,
            jobs[b].tf,
            &c.graph,
            &c.schedule,
            &order,
            nopts,
            saved.as_ref(),
            false,
        ) {
            Ok((r, _)) => dones[b].numerics = Some(r),
            Err(d) => {
                print_diags(&[d], &sources, o.format);
                return 1;
            }
        }
        dones[b].timing.clock.add("numerics", started.elapsed());
    }
    let layers: Vec<Layer> = layer_jobs
        .iter()
        .map(|&(f, b)| Layer {
            forward: jobs[f].tf.name.clone(),
            backward: jobs[b].tf.name.clone(),
            policy: dones[f].report.policy.clone(),
            forward_us: dones[f].report.latency * 1e6,
            backward_us: dones[b].report.latency * 1e6,
        })
        .collect();
    for (job, d) in jobs.iter().zip(dones) {
        if let Some(n) = d.numerics {
            num_reports.push((job.tf.name.clone(), n));
        }
        run_timings.push(d.timing);
        runs.push(d.report);
    }
    if o.compare.is_some() {
        // Runs come in pairs: the --policy run, then the compared one; the speedup is the
        // main policy's over the compared one.
        for pair in runs.chunks(2) {
            if let [main, second] = pair {
                comparisons.push(Comparison::new(second, main));
            }
        }
    }
    let timings = o.timings.then(|| Timings {
        check: check_time,
        layouts: setup,
        threads,
        runs: run_timings,
        total: started.elapsed(),
        peak_rss: hpmoe_dsl::timing::peak_rss_bytes(),
    });
    match o.format {
        Format::Human => {
            if let Ok(m) = hpmoe_sim::model::DeviceModel::new(&p.device) {
                out!("{}", m.describe());
            }
            for r in &runs {
                outln!();
                out!("{}", r.human());
            }
            if !layers.is_empty() {
                outln!();
                for l in &layers {
                    out!("{}", l.human());
                }
            }
            if !comparisons.is_empty() {
                outln!();
                for c in &comparisons {
                    out!("{}", c.human());
                }
            }
            if !gates.is_empty() {
                outln!();
                for g in &gates {
                    outln!(
                        "routing {}: experts chosen from `{}.{}` as the program computes it (numerics run of `{}`); every taskflow runs on this routing",
                        g.routing, g.taskflow, g.tensor, g.taskflow
                    );
                }
            }
            for (name, n) in &num_reports {
                outln!();
                outln!("taskflow {name}:");
                out!("{}", n.text());
            }
            for (_, n) in &num_reports {
                if !n.races.is_empty() {
                    errout!(
                        "{}",
                        diag::render_all(&n.races, hpmoe_dsl::diag::Dropped::NONE, &sources, style())
                    );
                }
            }
            // Timings vary from run to run: they go to stderr, so the report stays
            // reproducible.
            if let Some(t) = &timings {
                errout!("{}", t.human());
            }
        }
        Format::Json => {
            let mut j = serde_json::json!({
                "ok": true,
                "diagnostics": warnings.as_slice().iter().map(|d| hpmoe_dsl::diag::to_json(d, &sources)).collect::<Vec<_>>(),
                "runs": runs.iter().map(|r| r.json()).collect::<Vec<_>>(),
                "comparisons": comparisons.iter().map(|c| c.json()).collect::<Vec<_>>(),
                "layers": layers.iter().map(Layer::json).collect::<Vec<_>>(),
                "numerics": num_reports.iter().map(|(n, r)| serde_json::json!({"taskflow": n, "result": r.json()})).collect::<Vec<_>>(),
            });
            warnings.dropped().add_to_json(&mut j);
            if !gates.is_empty() {
                j["gates"] = serde_json::json!(gates);
            }
            if let Some(t) = &timings {
                j["timings"] = t.json();
            }
            outln!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
        }
    }
    let mut failed = false;
    for (name, n) in &num_reports {
        let bad: Vec<String> = n
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| {
                format!(
                    "`{}` ({} against {}: rel L2 {:.3e}, max |err| {:.3e}, tolerance {:e})",
                    c.output, c.computed, c.reference, c.rel_l2, c.max_abs, c.tolerance
                )
            })
            .collect();
        if !bad.is_empty() {
            errln!(
                "error: numerics of taskflow `{name}`: {} outside the tolerance",
                bad.join(", ")
            );
            if n.checks
                .iter()
                .any(|c| !c.ok && (!c.rel_l2.is_finite() || !c.max_abs.is_finite()))
            {
                errln!("  note: a value overflowed f32 (the numerics run in f32; a constant or a product beyond 3.4e38 is infinite)");
            }
        }
        if !n.races.is_empty() {
            errln!("error: numerics of taskflow `{name}`: {} race(s) found", n.races.len());
        }
        failed |= !n.passed();
    }
    if failed {
        return 1;
    }
    0
}

/// A spinner for one job: its name, the stages done, the tasks simulated once the
/// simulation has begun, and the time so far.
fn stage_bar(m: &indicatif::MultiProgress, name: &str, simulated: &hpmoe_sim::sim::Progress) -> indicatif::ProgressBar {
    let b = m.add(indicatif::ProgressBar::new_spinner());
    let simulated = simulated.clone();
    let tasks = move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let (done, total) = simulated.tasks();
        match simulated.candidates() {
            _ if total == 0 => {}
            0 => {
                let _ = write!(w, "; simulated {done} of {total} tasks");
            }
            k => {
                let _ = write!(w, "; candidate schedule {k}: simulated {done} of {total} tasks");
            }
        }
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {prefix}: {msg}{tasks} [{elapsed}]") {
        b.set_style(style.with_key("tasks", tasks));
    }
    b.set_prefix(name.to_string());
    b.set_message("lowering");
    b.enable_steady_tick(std::time::Duration::from_millis(200));
    b
}

#[cfg(test)]
mod tests {
    use super::side_by_side;
    use hpmoe_dsl::lower::MAX_MEMORY;
    use hpmoe_sim::pipeline::RunMemory;

    fn mem(graphs: u64, layouts: [u64; 2]) -> RunMemory {
        RunMemory { graphs, layouts }
    }

    #[test]
    fn jobs_run_side_by_side_only_when_their_estimates_fit_together() {
        let gib = 1u64 << 30;
        // Small runs: as many side by side as threads allow.
        assert_eq!(side_by_side(&[mem(gib / 4, [gib / 4, 0]); 4], 2), 2);
        assert_eq!(side_by_side(&[mem(gib / 4, [gib / 4, 0]); 4], 8), 4);
        // Two of 1.25 GiB with 1 GiB of shared layouts: 3.5 GiB together, one at a time.
        let big = mem(gib + gib / 4, [gib, 0]);
        assert_eq!(side_by_side(&[big, big], 2), 1);
        // The shared layouts count once: 1.25 + 0.5 + 1 GiB fits.
        assert_eq!(side_by_side(&[big, mem(gib / 2, [gib, 0])], 2), 2);
        // Layouts of both capacity modes both count: 1.25 + 0.5 + 1 + 1 GiB does not.
        assert_eq!(side_by_side(&[big, mem(gib / 2, [0, gib])], 2), 1);
        // The largest decide: three threads, but only two of the largest fit.
        let third = mem(MAX_MEMORY / 3, [0, 0]);
        assert_eq!(side_by_side(&[third, third, third, mem(1, [0, 0])], 3), 3);
        let over = mem(MAX_MEMORY / 3 + 1, [0, 0]);
        assert_eq!(side_by_side(&[over, over, over], 3), 2);
        // Nothing estimated (every run refused): one.
        assert_eq!(side_by_side(&[], 2), 1);
        assert_eq!(side_by_side(&[mem(MAX_MEMORY * 2, [0, 0])], 2), 1);
    }
}
