//! Parameter sweeps (`hpmoe sweep`): a program, axes of values and policies in; one row per
//! grid point (configuration × policy) out, as CSV, JSON and SVG charts.
//!
//! Each point checks, lowers, verifies, schedules and simulates the program on its own
//! (points run in parallel; one simulation stays single-threaded and deterministic). Rows
//! come back in grid order whatever order they finished in, so the outputs are
//! byte-identical for any thread count. A failing point carries its first diagnostic and the
//! sweep goes on.
//!
//! Grid order: configurations in row-major order of the axes (the first `--vary` slowest),
//! then the policies in the order given.

pub mod svg;

use crate::shard::{self, Shard};
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{Checked, CompileOptions};
use hpmoe_dsl::ir::Value;
use hpmoe_dsl::schedule::Policy;
use hpmoe_dsl::SourceMap;
use hpmoe_sim::report::Report;
use hpmoe_sim::sim::{self, SimError, SimOptions};
use rayon::prelude::*;
use serde_json::{json, Value as J};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// The policy options a `schedule.OPTION` axis may vary: every option the scheduler gives a
/// meaning to ([`hpmoe_dsl::policy::OPTIONS`]).
pub fn schedule_options() -> Vec<&'static str> {
    hpmoe_dsl::policy::OPTIONS.iter().map(|o| o.name).collect()
}

/// Checks that some swept policy takes each `schedule.OPTION` axis. A policy that does not
/// take an option runs as it is at every value of that axis (so a baseline such as
/// `kernel_by_kernel` stays the same baseline across the axis).
pub fn check_schedule_axes(axes: &[Axis], policies: &[Policy]) -> Result<(), String> {
    for a in axes {
        let AxisKind::Schedule(opt) = &a.kind else {
            continue;
        };
        let Some(def) = hpmoe_dsl::policy::option(opt) else {
            continue;
        };
        if !policies.iter().any(|p| def.under.contains(p)) {
            let with: Vec<&str> = def.under.iter().map(|p| p.name()).collect();
            let swept: Vec<&str> = policies.iter().map(|p| p.name()).collect();
            return Err(format!(
                "schedule option `{opt}` has no effect under {}; it is an option of {} (choose one with --policy)",
                swept.join(", "),
                with.join(", ")
            ));
        }
    }
    Ok(())
}

/// The most points a sweep may have (configurations times policies): the grid is listed
/// before any point runs, so its size is bounded first.
pub const MAX_POINTS: u64 = 1 << 20;

/// The number of points of the grid, or the refusal of a grid past [`MAX_POINTS`] with its
/// factors.
pub fn grid_size(axes: &[Axis], policies: usize) -> Result<u64, String> {
    let points = axes
        .iter()
        .map(|a| a.values.len() as u64)
        .chain([policies as u64])
        .try_fold(1u64, |n, k| n.checked_mul(k).filter(|&n| n <= MAX_POINTS));
    points.ok_or_else(|| {
        let factors: Vec<String> = axes
            .iter()
            .map(|a| format!("{} values of `{}`", a.values.len(), a.name))
            .chain([format!("{policies} policies")])
            .collect();
        format!(
            "the grid has more than {MAX_POINTS} points ({}); vary fewer values",
            factors.join(" x ")
        )
    })
}

/// What an axis changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisKind {
    /// A param or a device field (`tokens`, `device.link_efficiency`): an override like `--set`.
    Set,
    /// The routing (`--routing`): `KIND(ARGS)` or `NAME=KIND(ARGS)`.
    Routing,
    /// The device profile (`--device`).
    Device,
    /// A policy option (`schedule.interleave_backward`), applied to every policy.
    Schedule(String),
}

/// One `--vary NAME=V1,V2,...`.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub name: String,
    pub kind: AxisKind,
    pub values: Vec<String>,
}

/// Splits a value list: at `;` when there is one, else at commas outside parentheses (so
/// `balanced(),hotspot(max_over_mean: 2, seed: 1)` is two values).
pub fn split_values(s: &str) -> Vec<String> {
    let parts: Vec<String> = if s.contains(';') {
        s.split(';').map(str::to_string).collect()
    } else {
        let mut out = Vec::new();
        let mut depth = 0i32;
        let mut cur = String::new();
        for ch in s.chars() {
            match ch {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
            if ch == ',' && depth <= 0 {
                out.push(std::mem::take(&mut cur));
            } else {
                cur.push(ch);
            }
        }
        out.push(cur);
        out
    };
    parts.into_iter().map(|p| p.trim().to_string()).collect()
}

impl Axis {
    /// Parses `NAME=V1,V2,...` (see [`split_values`]).
    pub fn parse(spec: &str) -> Result<Axis, String> {
        let (name, values) = spec
            .split_once('=')
            .ok_or_else(|| format!("`{spec}` is not of the form NAME=V1,V2,..."))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("`{spec}` has no name before `=`"));
        }
        let values = split_values(values);
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("`{spec}` has an empty value"));
        }
        let kind = match name {
            "routing" => AxisKind::Routing,
            "device" => AxisKind::Device,
            _ => match name.strip_prefix("schedule.") {
                Some(opt) => {
                    if hpmoe_dsl::policy::option(opt).is_none() {
                        return Err(format!(
                            "unknown schedule option `{opt}`; the options are: {}",
                            schedule_options().join(", ")
                        ));
                    }
                    AxisKind::Schedule(opt.to_string())
                }
                None => {
                    // Every value must parse, so a bad one fails before any point runs.
                    for v in &values {
                        Override::parse(&format!("{name}={v}"))?;
                    }
                    AxisKind::Set
                }
            },
        };
        let mut seen = std::collections::BTreeSet::new();
        for v in &values {
            if !seen.insert(v.as_str()) {
                return Err(format!("`{name}` lists `{v}` twice"));
            }
        }
        Ok(Axis {
            name: name.to_string(),
            kind,
            values,
        })
    }
}

/// The metrics of one simulated point (times in microseconds, shares in 0..1).
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    pub latency_us: f64,
    pub lower_bound_us: f64,
    pub bound_kind: String,
    pub efficiency: f64,
    pub aic_busy: f64,
    pub aiv_busy: f64,
    pub cube_mac_utilisation: f64,
    pub link_busy: f64,
    pub comm_active_us: f64,
    pub exposed_comm_us: f64,
    pub exposed_share: f64,
    pub exposed_fraction: f64,
    pub vector_only_share: f64,
    pub l2_hit_rate: f64,
    pub tasks: usize,
    /// When the link rates began to be re-shared at intervals, in us (`None`: solved at every
    /// instant; see the report's `link_pacing`).
    pub link_paced_from_us: Option<f64>,
    /// Per op call: (call, op, active time in us).
    pub phases: Vec<(String, String, f64)>,
}

impl Metrics {
    pub fn from_report(r: &Report) -> Metrics {
        let us = 1e6;
        let comm = r.comm_mean();
        let exposed = r.exposed_mean();
        let share = |x: f64| if r.latency > 0.0 { x / r.latency } else { 0.0 };
        Metrics {
            latency_us: r.latency * us,
            lower_bound_us: r.bound * us,
            bound_kind: r.bound_kind.to_string(),
            efficiency: r.efficiency,
            aic_busy: r.aic_busy,
            aiv_busy: r.aiv_busy,
            cube_mac_utilisation: r.cube_mac_utilisation,
            link_busy: r.link_busy,
            comm_active_us: comm * us,
            exposed_comm_us: exposed * us,
            exposed_share: share(exposed),
            exposed_fraction: if comm > 0.0 { exposed / comm } else { 0.0 },
            vector_only_share: share(r.vector_only_mean()),
            l2_hit_rate: r.l2_hit_rate(),
            tasks: r.tasks,
            link_paced_from_us: r.link_pacing.map(|p| p.from * us),
            phases: r
                .phases
                .iter()
                .map(|p| (p.call.clone(), p.op.clone(), p.active * us))
                .collect(),
        }
    }
}

/// One grid point's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The point's position in the grid.
    pub index: usize,
    /// The configuration's position (rows of the same configuration share it).
    pub config: usize,
    /// The axis values, in axis order.
    pub values: Vec<String>,
    pub policy: String,
    /// The taskflow simulated (empty when the point failed before choosing one).
    pub taskflow: String,
    /// The metrics, or the first diagnostic (`E0xxx: message`).
    pub outcome: Result<Metrics, String>,
    /// The speedup over `kernel_by_kernel` in the same configuration, when it ran.
    pub speedup: Option<f64>,
}

impl Row {
    /// `name=value, ...` of the configuration (`base` when nothing varies).
    pub fn label(&self, axes: &[Axis]) -> String {
        config_label(axes, &self.values)
    }
}

/// `name=value, ...`, or `base` when there are no axes.
pub fn config_label(axes: &[Axis], values: &[String]) -> String {
    if axes.is_empty() {
        return "base".to_string();
    }
    axes.iter()
        .zip(values)
        .map(|(a, v)| format!("{}={v}", a.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sweep: the program, what stays fixed, the axes and the policies.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub file: PathBuf,
    /// `--set` overrides applied to every point (before the axes).
    pub set: Vec<String>,
    pub device: Option<String>,
    pub routing: Option<String>,
    pub axes: Vec<Axis>,
    pub policies: Vec<Policy>,
    pub taskflow: Option<String>,
    pub max_tasks: u64,
}

fn first_message(ds: &[hpmoe_dsl::diag::Diagnostic]) -> String {
    match ds.first() {
        Some(d) => format!("{}: {}", d.code, d.message),
        None => "failed without a diagnostic".to_string(),
    }
}

fn option_value(opt: &str, v: &str) -> Value {
    let float =
        hpmoe_dsl::policy::option(opt).is_some_and(|o| matches!(o.ty, hpmoe_dsl::policy::OptionType::Float { .. }));
    match v {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ if float => v.parse::<f64>().map(Value::Float).unwrap_or(Value::Name(v.to_string())),
        _ => match v.parse::<i64>() {
            Ok(i) => Value::Int(i),
            Err(_) => Value::Name(v.to_string()),
        },
    }
}

impl Sweep {
    /// The configurations: per configuration, the index of its value on each axis.
    pub fn configs(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new()];
        for a in &self.axes {
            let mut next = Vec::with_capacity(out.len() * a.values.len());
            for prefix in &out {
                for i in 0..a.values.len() {
                    let mut c = prefix.clone();
                    c.push(i);
                    next.push(c);
                }
            }
            out = next;
        }
        out
    }

    /// How many points the grid has.
    pub fn points(&self) -> usize {
        self.configs().len() * self.policies.len()
    }

    fn values(&self, config: &[usize]) -> Vec<String> {
        self.axes
            .iter()
            .zip(config)
            .map(|(a, &i)| a.values[i].clone())
            .collect()
    }

    /// Checks the program once per axis value (that value alone on top of the fixed
    /// settings) and refuses overrides that cannot be applied at all (an unknown param or
    /// device field, a value of the wrong kind, a routing the program does not have): these
    /// are usage errors, found before any point runs. Other failures stay per point.
    pub fn preflight(&self) -> Result<(), String> {
        let probes = self
            .axes
            .iter()
            .filter(|a| !matches!(a.kind, AxisKind::Schedule(_)))
            .flat_map(|a| a.values.iter().map(move |v| (a, v)));
        for (a, v) in probes {
            let (opts, _) = self.options(&[(a, v)]).map_err(|e| format!("--vary {}: {e}", a.name))?;
            let mut sources = SourceMap::new();
            let outcome = hpmoe_dsl::driver::check_path(&self.file, &opts, &mut sources);
            let bad = outcome.diagnostics.as_slice().iter().find(|d| {
                use hpmoe_dsl::diag::Code;
                matches!(
                    d.code,
                    Code::BadOverride | Code::UnknownProfileField | Code::UnitMismatch
                ) || d.message.starts_with("`--")
            });
            if let Some(d) = bad {
                // The checker quotes the override as `--set NAME=V`; the user wrote `--vary`,
                // which this message names already.
                let message = d
                    .message
                    .strip_prefix("`--")
                    .and_then(|m| m.split_once("`: "))
                    .map_or(d.message.as_str(), |(_, rest)| rest);
                return Err(format!("--vary {}={v}: {}: {message}", a.name, d.code));
            }
        }
        Ok(())
    }

    /// The check options and policy options of the fixed settings with `picks` (axis, value)
    /// applied on top; an override that does not parse is the error.
    fn options(&self, picks: &[(&Axis, &String)]) -> Result<(Options, BTreeMap<String, Value>), String> {
        let mut set = self.set.clone();
        let mut device = self.device.clone();
        let mut routing = self.routing.clone();
        let mut sched: BTreeMap<String, Value> = BTreeMap::new();
        for &(a, v) in picks {
            match &a.kind {
                AxisKind::Set => set.push(format!("{}={v}", a.name)),
                AxisKind::Routing => routing = Some(v.clone()),
                AxisKind::Device => device = Some(v.clone()),
                AxisKind::Schedule(opt) => {
                    sched.insert(opt.clone(), option_value(opt, v));
                }
            }
        }
        let overrides = set.iter().map(|s| Override::parse(s)).collect::<Result<Vec<_>, _>>()?;
        let opts = Options {
            overrides,
            device,
            routing,
            ..Options::default()
        };
        Ok((opts, sched))
    }

    /// Checks, compiles and simulates one configuration under one policy. Points side by
    /// side share the memory budget ([`Admission`]): a point whose estimate does not fit
    /// beside those running lets go of its checked program, waits, and checks it again.
    fn simulate(&self, values: &[String], policy: Policy) -> (String, Result<Metrics, String>) {
        let picks: Vec<(&Axis, &String)> = self.axes.iter().zip(values).collect();
        let (opts, sched) = match self.options(&picks) {
            Ok(x) => x,
            Err(e) => return (String::new(), Err(format!("--set {e}"))),
        };
        let mut admitted: Option<Admitted> = None;
        let mut pending: Option<u64> = None;
        loop {
            if let Some(need) = pending.take() {
                crate::return_freed_memory();
                admitted = Some(ADMISSION.admit(need));
            }
            let mut sources = SourceMap::new();
            let outcome = hpmoe_dsl::driver::check_path(&self.file, &opts, &mut sources);
            let Some(p) = outcome.checked else {
                return (String::new(), Err(first_message(outcome.diagnostics.as_slice())));
            };
            let tf = match &self.taskflow {
                Some(name) => match p.taskflow(name) {
                    Some(t) => t,
                    None => return (String::new(), Err(format!("no taskflow `{name}`"))),
                },
                None => match p.taskflows.first() {
                    Some(t) => t,
                    None => return (String::new(), Err("the program has no taskflow to run".to_string())),
                },
            };
            let name = tf.name.clone();
            match self.simulate_taskflow(&p, tf, policy, &sched, &mut admitted) {
                Attempt::Done(r) => return (name, r),
                Attempt::Wait(need) => pending = Some(need),
            }
        }
    }

    fn simulate_taskflow(
        &self,
        p: &Checked,
        tf: &hpmoe_dsl::ir::Taskflow,
        policy: Policy,
        sched: &BTreeMap<String, Value>,
        admitted: &mut Option<Admitted>,
    ) -> Attempt {
        // As `hpmoe run --policy`: the program's options apply when it selects this policy.
        let mut spec = p.select_policy(&tf.name, Some(policy));
        // Options this policy does not take leave it as it is (see `check_schedule_axes`).
        let taken: BTreeMap<String, Value> = sched
            .iter()
            .filter(|(k, _)| hpmoe_dsl::policy::option(k).is_some_and(|o| o.under.contains(&policy)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Err(e) = spec.apply(p, &taken) {
            return Attempt::Done(Err(e));
        }
        let opts = CompileOptions {
            max_tasks: self.max_tasks,
            verify: true,
        };
        if admitted.is_none() {
            let need = hpmoe_sim::pipeline::run_memory(p, tf, &spec, &opts)
                .map_or(0, |m| hpmoe_sim::pipeline::RunMemory::together(&[m]));
            match ADMISSION.try_admit(need) {
                Some(a) => *admitted = Some(a),
                None => return Attempt::Wait(need),
            }
        }
        Attempt::Done(self.compile_and_simulate(p, tf, &spec, &opts))
    }

    fn compile_and_simulate(
        &self,
        p: &Checked,
        tf: &hpmoe_dsl::ir::Taskflow,
        spec: &hpmoe_dsl::schedule::PolicySpec,
        opts: &CompileOptions,
    ) -> Result<Metrics, String> {
        let c = hpmoe_sim::pipeline::compile(p, tf, spec, opts, &mut hpmoe_dsl::timing::Clock::new())
            .map_err(|ds| first_message(&ds))?;
        let simd = match sim::simulate_compiled(p, tf, &c, SimOptions::default()) {
            Ok(x) => x,
            Err(SimError::Model(msg)) => return Err(msg),
            Err(SimError::Stall(st)) => {
                let d = sim::stall_diagnostic(p, tf, &c.graph, &c.schedule, &st);
                return Err(first_message(&[d]));
            }
        };
        let report = Report::new(p, tf, &c.graph, &c.schedule, &simd.workload, &simd.model, &simd.result);
        Ok(Metrics::from_report(&report))
    }

    /// Runs one point of the grid.
    pub fn run_point(&self, index: usize, configs: &[Vec<usize>]) -> Row {
        let np = self.policies.len();
        let config = index / np;
        let policy = self.policies[index % np];
        let values = self.values(&configs[config]);
        let (taskflow, outcome) = self.simulate(&values, policy);
        // What this point freed goes back to the system, not to this worker's heap alone.
        crate::return_freed_memory();
        Row {
            index,
            config,
            values,
            policy: policy.name().to_string(),
            taskflow,
            outcome,
            speedup: None,
        }
    }

    /// Runs the whole grid on `threads` threads (0: one per CPU), calling `tick` after each
    /// point; rows in grid order, speedups over `kernel_by_kernel` filled in.
    /// With a shard, only the points it owns ([`Shard::owns`]).
    pub fn run_shard(
        &self,
        shard: Option<Shard>,
        threads: usize,
        tick: &(dyn Fn() + Sync),
    ) -> Result<Vec<Row>, String> {
        let configs = self.configs();
        let n = configs.len() * self.policies.len();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| format!("cannot start the worker threads: {e}"))?;
        let owned: Vec<usize> = (0..n).filter(|&i| shard.is_none_or(|s| s.owns(i))).collect();
        let mut rows: Vec<Row> = pool.install(|| {
            owned
                .into_par_iter()
                .map(|i| {
                    let r = self.run_point(i, &configs);
                    tick();
                    r
                })
                .collect()
        });
        fill_speedups(&mut rows);
        Ok(rows)
    }
}

/// The outcome of one attempt at a point: its result, or the memory it must wait for.
enum Attempt {
    Done(Result<Metrics, String>),
    Wait(u64),
}

/// The memory of the points running side by side, held to
/// [`hpmoe_dsl::lower::MAX_MEMORY`] together: a point is admitted when its estimate fits
/// beside those running, or when none is running (its lowering then holds it to the budget
/// alone). The order points are admitted in changes no result.
struct Admission {
    used: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
}

static ADMISSION: Admission = Admission {
    used: std::sync::Mutex::new(0),
    freed: std::sync::Condvar::new(),
};

/// Memory admitted, given back when dropped.
struct Admitted(u64);

impl Admission {
    fn fits(used: u64, bytes: u64) -> bool {
        used == 0 || used.saturating_add(bytes) <= hpmoe_dsl::lower::MAX_MEMORY
    }

    /// Holds `bytes` if they fit beside the points running now.
    fn try_admit(&'static self, bytes: u64) -> Option<Admitted> {
        let bytes = bytes.min(hpmoe_dsl::lower::MAX_MEMORY);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        Self::fits(*used, bytes).then(|| {
            *used += bytes;
            Admitted(bytes)
        })
    }

    /// Waits until `bytes` fit beside the points running, then holds them.
    fn admit(&'static self, bytes: u64) -> Admitted {
        let bytes = bytes.min(hpmoe_dsl::lower::MAX_MEMORY);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while !Self::fits(*used, bytes) {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += bytes;
        Admitted(bytes)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut used = ADMISSION.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(self.0);
        ADMISSION.freed.notify_all();
    }
}

/// Sets each row's speedup over the `kernel_by_kernel` row of its configuration.
pub fn fill_speedups(rows: &mut [Row]) {
    let base: BTreeMap<usize, f64> = rows
        .iter()
        .filter(|r| r.policy == Policy::KernelByKernel.name())
        .filter_map(|r| r.outcome.as_ref().ok().map(|m| (r.config, m.latency_us)))
        .collect();
    for r in rows.iter_mut() {
        r.speedup = match (&r.outcome, base.get(&r.config)) {
            (Ok(m), Some(&b)) if m.latency_us > 0.0 => Some(b / m.latency_us),
            _ => None,
        };
    }
}

/// The op calls of all rows, in order of first appearance.
pub fn phase_names(rows: &[Row]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        if let Ok(m) = &r.outcome {
            for (call, _, _) in &m.phases {
                if !out.contains(call) {
                    out.push(call.clone());
                }
            }
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV: a header, then one row per point. Numbers are printed exactly (shortest form
/// that reads back to the same double); failed points leave the metrics empty.
pub fn csv(axes: &[Axis], rows: &[Row]) -> String {
    let phases = phase_names(rows);
    let mut head: Vec<String> = vec!["index".into()];
    head.extend(axes.iter().map(|a| a.name.clone()));
    for h in [
        "policy",
        "taskflow",
        "ok",
        "error",
        "latency_us",
        "speedup_vs_kernel_by_kernel",
        "lower_bound_us",
        "bound_kind",
        "efficiency",
        "aic_busy",
        "aiv_busy",
        "cube_mac_utilisation",
        "link_busy",
        "comm_active_us",
        "exposed_comm_us",
        "exposed_share",
        "exposed_fraction",
        "vector_only_share",
        "l2_hit_rate",
        "tasks",
        "link_paced_from_us",
    ] {
        head.push(h.into());
    }
    head.extend(phases.iter().map(|p| format!("phase_{p}_active_us")));
    let mut o = String::new();
    let _ = writeln!(o, "{}", head.iter().map(|h| csv_field(h)).collect::<Vec<_>>().join(","));
    for r in rows {
        let mut f: Vec<String> = vec![r.index.to_string()];
        f.extend(r.values.iter().cloned());
        f.push(r.policy.clone());
        f.push(r.taskflow.clone());
        match &r.outcome {
            Ok(m) => {
                f.push("true".into());
                f.push(String::new());
                f.push(m.latency_us.to_string());
                f.push(r.speedup.map(|s| s.to_string()).unwrap_or_default());
                f.push(m.lower_bound_us.to_string());
                f.push(m.bound_kind.clone());
                for x in [
                    m.efficiency,
                    m.aic_busy,
                    m.aiv_busy,
                    m.cube_mac_utilisation,
                    m.link_busy,
                    m.comm_active_us,
                    m.exposed_comm_us,
                    m.exposed_share,
                    m.exposed_fraction,
                    m.vector_only_share,
                    m.l2_hit_rate,
                ] {
                    f.push(x.to_string());
                }
                f.push(m.tasks.to_string());
                f.push(m.link_paced_from_us.map(|x| x.to_string()).unwrap_or_default());
                for p in &phases {
                    f.push(
                        m.phases
                            .iter()
                            .find(|(c, _, _)| c == p)
                            .map(|(_, _, a)| a.to_string())
                            .unwrap_or_default(),
                    );
                }
            }
            Err(e) => {
                f.push("false".into());
                f.push(e.clone());
                f.extend(std::iter::repeat_n(String::new(), 17 + phases.len()));
            }
        }
        let _ = writeln!(o, "{}", f.iter().map(|x| csv_field(x)).collect::<Vec<_>>().join(","));
    }
    o
}

/// The JSON form: the file, the axes, the policies and one object per point.
pub fn json(sweep: &Sweep, rows: &[Row]) -> J {
    let points: Vec<J> = rows
        .iter()
        .map(|r| {
            let values: serde_json::Map<String, J> = sweep
                .axes
                .iter()
                .zip(&r.values)
                .map(|(a, v)| (a.name.clone(), J::String(v.clone())))
                .collect();
            let mut o = json!({
                "index": r.index,
                "config": r.config,
                "label": r.label(&sweep.axes),
                "values": values,
                "policy": r.policy,
                "taskflow": r.taskflow,
                "ok": r.outcome.is_ok(),
            });
            match &r.outcome {
                Ok(m) => {
                    let extra = json!({
                        "latency_us": m.latency_us,
                        "speedup_vs_kernel_by_kernel": r.speedup,
                        "lower_bound_us": m.lower_bound_us,
                        "bound_kind": m.bound_kind,
                        "efficiency": m.efficiency,
                        "engines": {
                            "aic_busy": m.aic_busy,
                            "aiv_busy": m.aiv_busy,
                            "cube_mac_utilisation": m.cube_mac_utilisation,
                            "link_busy": m.link_busy,
                        },
                        "communication": {
                            "active_us": m.comm_active_us,
                            "exposed_us": m.exposed_comm_us,
                            "exposed_share": m.exposed_share,
                            "exposed_fraction": m.exposed_fraction,
                            "vector_only_share": m.vector_only_share,
                        },
                        "l2_hit_rate": m.l2_hit_rate,
                        "tasks": m.tasks,
                        "link_paced_from_us": m.link_paced_from_us,
                        "phases": m.phases.iter().map(|(c, op, a)| json!({"call": c, "op": op, "active_us": a})).collect::<Vec<_>>(),
                    });
                    if let (J::Object(o), J::Object(e)) = (&mut o, extra) {
                        o.extend(e);
                    }
                }
                Err(e) => {
                    if let J::Object(o) = &mut o {
                        o.insert("error".into(), J::String(e.clone()));
                    }
                }
            }
            o
        })
        .collect();
    json!({
        "file": sweep.file.display().to_string(),
        "set": sweep.set,
        "axes": sweep.axes.iter().map(|a| json!({"name": a.name, "values": a.values})).collect::<Vec<_>>(),
        "policies": sweep.policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "failed": rows.iter().filter(|r| r.outcome.is_err()).count(),
        "points": points,
    })
}

/// What a sweep's part files must agree on: everything that decides the grid and its points.
pub fn settings(sweep: &Sweep) -> J {
    json!({
        "file": sweep.file.display().to_string(),
        "set": sweep.set,
        "device": sweep.device,
        "routing": sweep.routing,
        "axes": sweep.axes.iter().map(|a| json!({"name": a.name, "values": a.values})).collect::<Vec<_>>(),
        "policies": sweep.policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "taskflow": sweep.taskflow,
        "max_tasks": sweep.max_tasks,
        "points": sweep.points(),
    })
}

fn metrics_part(m: &Metrics) -> J {
    let n = shard::num;
    json!({
        "latency_us": n(m.latency_us),
        "lower_bound_us": n(m.lower_bound_us),
        "bound_kind": m.bound_kind,
        "efficiency": n(m.efficiency),
        "aic_busy": n(m.aic_busy),
        "aiv_busy": n(m.aiv_busy),
        "cube_mac_utilisation": n(m.cube_mac_utilisation),
        "link_busy": n(m.link_busy),
        "comm_active_us": n(m.comm_active_us),
        "exposed_comm_us": n(m.exposed_comm_us),
        "exposed_share": n(m.exposed_share),
        "exposed_fraction": n(m.exposed_fraction),
        "vector_only_share": n(m.vector_only_share),
        "l2_hit_rate": n(m.l2_hit_rate),
        "tasks": m.tasks,
        "link_paced_from_us": m.link_paced_from_us.map(n),
        "phases": m.phases.iter().map(|(c, op, a)| json!([c, op, n(*a)])).collect::<Vec<_>>(),
    })
}

fn metrics_from_part(v: &J) -> Result<Metrics, String> {
    let f = |k: &str| shard::read_measure(&v[k], k);
    let phases = v["phases"]
        .as_array()
        .ok_or("no phases")?
        .iter()
        .map(|p| {
            Ok((
                p[0].as_str().ok_or("a phase without a call")?.to_string(),
                p[1].as_str().ok_or("a phase without an op")?.to_string(),
                shard::read_measure(&p[2], "a phase's active time")?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Metrics {
        latency_us: f("latency_us")?,
        lower_bound_us: f("lower_bound_us")?,
        bound_kind: v["bound_kind"].as_str().ok_or("no bound_kind")?.to_string(),
        efficiency: f("efficiency")?,
        aic_busy: f("aic_busy")?,
        aiv_busy: f("aiv_busy")?,
        cube_mac_utilisation: f("cube_mac_utilisation")?,
        link_busy: f("link_busy")?,
        comm_active_us: f("comm_active_us")?,
        exposed_comm_us: f("exposed_comm_us")?,
        exposed_share: f("exposed_share")?,
        exposed_fraction: f("exposed_fraction")?,
        vector_only_share: f("vector_only_share")?,
        l2_hit_rate: f("l2_hit_rate")?,
        tasks: v["tasks"].as_u64().ok_or("no task count")? as usize,
        link_paced_from_us: match v.get("link_paced_from_us") {
            None | Some(J::Null) => None,
            Some(x) => Some(shard::read_measure(x, "link_paced_from_us")?),
        },
        phases,
    })
}

/// A shard's part file: the header (`fingerprint` of the program text and the settings) and
/// its rows, without speedups (the merge computes them across shards).
pub fn part(sweep: &Sweep, source: &str, shard: Shard, rows: &[Row]) -> J {
    let settings = settings(sweep);
    let fp = shard::fingerprint(&[source.as_bytes(), settings.to_string().as_bytes()]);
    let mut doc = shard::header("sweep", shard, &fp, settings);
    let rows: Vec<J> = rows
        .iter()
        .map(|r| {
            let mut o = json!({
                "index": r.index,
                "config": r.config,
                "values": r.values,
                "policy": r.policy,
                "taskflow": r.taskflow,
            });
            if let J::Object(m) = &mut o {
                match &r.outcome {
                    Ok(x) => m.insert("metrics".into(), metrics_part(x)),
                    Err(e) => m.insert("error".into(), J::String(e.clone())),
                };
            }
            o
        })
        .collect();
    if let J::Object(m) = &mut doc {
        m.insert("rows".into(), J::Array(rows));
    }
    doc
}

/// Joins checked part files (`shard::read_parts`) into the sweep they came from and its
/// rows in grid order, speedups filled in.
pub fn merge(parts: &[J]) -> Result<(Sweep, Vec<Row>), String> {
    let s = &parts.first().ok_or("no part files")?["settings"];
    let strings = |v: &J, what: &str| -> Result<Vec<String>, String> {
        v.as_array()
            .ok_or(format!("{what} is not a list"))?
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or(format!("{what} holds a non-string"))
            })
            .collect()
    };
    let mut axes = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for a in s["axes"].as_array().ok_or("no axes")? {
        let name = a["name"].as_str().ok_or("an axis without a name")?;
        let values = strings(&a["values"], "an axis's values")?;
        // Parsed as `--vary` is (every value checked, none twice), and read back as written.
        // (Joined at `;`, which splits without regard to commas: a value holding a comma
        // outside parentheses came from a list split at `;`.)
        let axis = Axis::parse(&format!("{name}={}", values.join(";")))?;
        if axis.values != values {
            return Err(format!(
                "the values of the axis `{name}` are not as a sweep writes them"
            ));
        }
        // (A set: a forged file may list a million axes.)
        if !names.insert(axis.name.clone()) {
            return Err(format!("the axis `{}` is given twice", axis.name));
        }
        axes.push(axis);
    }
    let mut policies = Vec::new();
    for p in strings(&s["policies"], "the policies")? {
        let policy = Policy::parse(&p).ok_or(format!("unknown policy `{p}`"))?;
        if policies.contains(&policy) {
            return Err(format!("the policy `{p}` is given twice"));
        }
        policies.push(policy);
    }
    // The grid is listed below: its size is bounded first, as a sweep's own grid is.
    grid_size(&axes, policies.len())?;
    check_schedule_axes(&axes, &policies)?;
    let sweep = Sweep {
        file: PathBuf::from(s["file"].as_str().ok_or("no file")?),
        set: strings(&s["set"], "the overrides")?,
        device: s["device"].as_str().map(str::to_string),
        routing: s["routing"].as_str().map(str::to_string),
        axes,
        policies,
        taskflow: s["taskflow"].as_str().map(str::to_string),
        max_tasks: s["max_tasks"].as_u64().ok_or("no max_tasks")?,
    };
    let n = sweep.points();
    let given: usize = parts.iter().map(|p| p["rows"].as_array().map_or(0, Vec::len)).sum();
    if given != n {
        return Err(format!("the parts hold {given} rows for the {n} points of the grid"));
    }
    let mut rows: Vec<Option<Row>> = vec![None; n];
    let configs = sweep.configs();
    let np = sweep.policies.len();
    for p in parts {
        for r in p["rows"].as_array().ok_or("a part without rows")? {
            let index = r["index"].as_u64().ok_or("a row without an index")? as usize;
            let shard = Shard {
                index: p["shard"].as_u64().unwrap_or(0) as usize,
                count: p["shards"].as_u64().unwrap_or(1) as usize,
            };
            if index >= n || !shard.owns(index) || rows[index].is_some() {
                return Err(format!(
                    "shard {} of {} holds point {index}, which is not its own",
                    shard.index, shard.count
                ));
            }
            let outcome = match r.get("metrics") {
                Some(m) => Ok(metrics_from_part(m).map_err(|e| format!("point {index}: {e}"))?),
                // Shown to people as it is: its control characters escaped.
                None => {
                    Err(hpmoe_dsl::diag::shown(r["error"].as_str().ok_or(format!(
                        "point {index}: a row with neither metrics nor an error"
                    ))?))
                }
            };
            // What the point's index means in the grid: its configuration, values and policy.
            let config = index / np;
            let values = sweep.values(&configs[config]);
            let policy = sweep.policies[index % np].name().to_string();
            if r["config"].as_u64() != Some(config as u64) {
                return Err(format!(
                    "point {index}: its configuration is not {config}, that of its index"
                ));
            }
            if strings(&r["values"], "a row's values")? != values {
                return Err(format!(
                    "point {index}: its values are not those of configuration {config} ({})",
                    values.join(", ")
                ));
            }
            if r["policy"].as_str() != Some(policy.as_str()) {
                return Err(format!(
                    "point {index}: its policy is not `{policy}`, that of its index"
                ));
            }
            rows[index] = Some(Row {
                index,
                config,
                values,
                policy,
                taskflow: r["taskflow"]
                    .as_str()
                    .ok_or(format!("point {index}: a row without a taskflow name"))?
                    .to_string(),
                outcome,
                speedup: None,
            });
        }
    }
    let missing = rows.iter().filter(|r| r.is_none()).count();
    if missing > 0 {
        return Err(format!("the parts lack {missing} of the {n} points"));
    }
    let mut rows: Vec<Row> = rows.into_iter().flatten().collect();
    fill_speedups(&mut rows);
    Ok((sweep, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_values() {
        assert_eq!(split_values("4, 8,16"), ["4", "8", "16"]);
        assert_eq!(
            split_values("balanced(),hotspot(max_over_mean: 2, seed: 1)"),
            ["balanced()", "hotspot(max_over_mean: 2, seed: 1)"]
        );
        assert_eq!(
            split_values("zipf(s: 0.5);zipf(s: 1.2)"),
            ["zipf(s: 0.5)", "zipf(s: 1.2)"]
        );
    }

    #[test]
    fn parses_axes() {
        let a = Axis::parse("schedule.interleave_backward=true,false").unwrap();
        assert_eq!(a.kind, AxisKind::Schedule("interleave_backward".into()));
        assert!(Axis::parse("schedule.bogus=1").is_err());
        assert!(Axis::parse("ranks=4,,8").is_err());
        assert!(Axis::parse("ranks=4,4").is_err());
        assert_eq!(Axis::parse("routing=r=zipf(s: 1)").unwrap().values, ["r=zipf(s: 1)"]);
        assert!(Axis::parse("noequals").is_err());
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }
}
