//! Numerics: a scheduled taskflow in; its real numbers out, proven equal to references.
//!
//! - [`exec::execute_tiled`] runs every task's arithmetic in f32, in the schedule's start
//!   order, on per-rank memories (puts write into peers' windows; optional bf16 rounding of
//!   stores), with a dynamic race check: every element a body reads is recorded while it is
//!   evaluated, and a read of an element whose last write is not ordered before the reader
//!   (through dependencies, counters and queue order) is reported with both tasks. The check
//!   follows the reads, not the regions the lowering declares, so it also catches a wrong
//!   region.
//! - [`exec::execute_dense`] evaluates each op call over its whole index space in f64: no
//!   tiles, no schedule, no concurrency.
//! - [`moe_ref`] computes the MoE-FFN forward and backward per token, directly from the
//!   layer's definition.
//!
//! Every output is compared with both references (max absolute error, relative L2 error)
//! against a documented tolerance.

pub mod eval;
pub mod exec;
pub mod gates;
pub mod inputs;
pub mod moe_ref;
pub mod store;

use hpmoe_dsl::diag::{Code, Diagnostic};
use hpmoe_dsl::ir::{DType, Program, Taskflow, TensorId};
use hpmoe_dsl::lower::{RouteLayout, TaskGraph};
use hpmoe_dsl::schedule::Schedule;
use std::path::PathBuf;
use store::TensorStore;

/// Relative L2 error allowed between the f32 executor and the f64 references.
pub const TOLERANCE_F32: f64 = 1e-4;
/// ... when stores are rounded to bf16 (8 significant bits; errors add up over a layer).
pub const TOLERANCE_BF16: f64 = 3e-2;
/// Between the two f64 references (they sum in different orders).
pub const TOLERANCE_REFERENCES: f64 = 1e-9;
/// The tolerance a taskflow's quantised tensors of dtype `d` allow: half a quantisation step
/// relative to the largest value of a row (`i8`/`u8`: 1/254) or to the value
/// (`fp8e4m3`: 2^-4, `fp8e5m2`: 2^-3); 0 for other dtypes. Both executors quantise the
/// same way, but the f32 and f64 values of `x / s` can fall on either side of a rounding
/// boundary, and such an element then differs by one step; the comparison uses the largest
/// of this and the f32/bf16 tolerance.
pub fn quant_tolerance(d: DType) -> f64 {
    match d {
        DType::I8 | DType::U8 => 1.0 / 254.0,
        DType::Fp8E4M3 => 0.0625,
        DType::Fp8E5M2 => 0.125,
        DType::Bf16 | DType::F16 | DType::F32 | DType::I32 => 0.0,
    }
}

/// The default memory limit of a numerics run.
pub const DEFAULT_MEMORY_LIMIT: u64 = 2 << 30;

/// The default limit on the operations a numerics run evaluates ([`work`]): each of the
/// tiled run and the dense reference evaluates about this many, at some 100 M a second.
pub const DEFAULT_WORK_LIMIT: u64 = 500_000_000;

/// Bytes a numerics run holds per tensor element (on every rank): the f64 reference, the
/// f32 executor's value and last writer, the per-token reference's f64 and the mark of the
/// read log's round.
pub const BYTES_PER_ELEMENT: u128 = 8 + 4 + 4 + 8 + 4;

#[derive(Clone, Debug)]
pub struct NumericsOptions {
    pub seed: u64,
    pub bf16_storage: bool,
    /// Bytes the run may allocate for tensors.
    pub memory_limit: u64,
    /// Operations the run may evaluate ([`work`]).
    pub work_limit: u64,
    /// `NAME=FILE.npy` inputs.
    pub inputs: Vec<(String, PathBuf)>,
    /// Write inputs, routings and outputs as `.npy` files here.
    pub dump: Option<PathBuf>,
}

impl Default for NumericsOptions {
    fn default() -> Self {
        NumericsOptions {
            seed: 0,
            bf16_storage: false,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            work_limit: DEFAULT_WORK_LIMIT,
            inputs: Vec::new(),
            dump: None,
        }
    }
}

/// One comparison of an output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Check {
    pub output: String,
    /// `schedule` (the tiled f32 run) or `dense` (the f64 op-by-op run).
    pub computed: &'static str,
    /// `dense` or `per-token` (the MoE-FFN reference).
    pub reference: &'static str,
    pub max_abs: f64,
    pub rel_l2: f64,
    pub tolerance: f64,
    pub ok: bool,
}

/// A taskflow's tensors after its numerics run, by name: the values the tiled f32 run
/// left in its memories (inputs as given, every `let` and every output).
#[derive(Clone, Debug, Default)]
pub struct Memories {
    pub taskflow: String,
    pub tensors: Vec<(String, TensorStore<f64>)>,
}

impl Memories {
    pub fn get(&self, name: &str) -> Option<&TensorStore<f64>> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }
}

/// The result of a numerics run.
#[derive(Clone, Debug)]
pub struct NumericsReport {
    pub checks: Vec<Check>,
    /// Inputs taken from a forward's memories (saved activations), and that forward.
    pub saved_from: Option<(String, Vec<String>)>,
    /// Races found while executing, as diagnostics.
    pub races: Vec<Diagnostic>,
    pub tasks: usize,
    pub dumped: Vec<PathBuf>,
}

impl NumericsReport {
    pub fn passed(&self) -> bool {
        self.races.is_empty() && self.checks.iter().all(|c| c.ok)
    }

    pub fn text(&self) -> String {
        let mut s = String::from("numerics (every task executed in f32 in schedule order)\n");
        if let Some((f, names)) = &self.saved_from {
            s.push_str(&format!(
                "  inputs from the forward `{f}`'s memories: {}\n",
                names.join(", ")
            ));
        }
        s.push_str(&format!(
            "  {:<10} {:<9} {:<10} {:>12} {:>12} {:>10}  \n",
            "output", "computed", "reference", "max |err|", "rel L2", "tolerance"
        ));
        for c in &self.checks {
            s.push_str(&format!(
                "  {:<10} {:<9} {:<10} {:>12.3e} {:>12.3e} {:>10.0e}  {}\n",
                c.output,
                c.computed,
                c.reference,
                c.max_abs,
                c.rel_l2,
                c.tolerance,
                if c.ok { "ok" } else { "FAIL" }
            ));
        }
        if !self.races.is_empty() {
            s.push_str(&format!("  {} race(s) found\n", self.races.len()));
        }
        for p in &self.dumped {
            s.push_str(&format!("  wrote {}\n", p.display()));
        }
        s
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed(),
            "checks": self.checks,
            "saved_from": self.saved_from.as_ref().map(|(f, n)| serde_json::json!({"forward": f, "inputs": n})),
            "races": self.races.iter().map(|d| d.message.clone()).collect::<Vec<_>>(),
            "dumped": self.dumped.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })
    }
}

fn compare(
    output: &str,
    computed: &'static str,
    reference: &'static str,
    a: &TensorStore<f64>,
    b: &TensorStore<f64>,
    tol: f64,
) -> Check {
    let (mut max_abs, mut num, mut den) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.data.iter().flatten().zip(b.data.iter().flatten()) {
        let d = (x - y).abs();
        max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d });
        num += d * d;
        den += y * y;
    }
    let rel_l2 = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    let rel_l2 = if rel_l2.is_nan() { f64::INFINITY } else { rel_l2 };
    Check {
        output: output.to_string(),
        computed,
        reference,
        max_abs,
        rel_l2,
        tolerance: tol,
        ok: rel_l2 <= tol,
    }
}

fn widen(s: &TensorStore<f32>) -> TensorStore<f64> {
    TensorStore {
        shape: s.shape.clone(),
        data: s.data.iter().map(|d| d.iter().map(|&x| x as f64).collect()).collect(),
        writer: Vec::new(),
    }
}

/// A start order that respects the schedule: an abstract run of the queues.
pub fn schedule_order(g: &TaskGraph, s: &Schedule) -> Vec<u32> {
    let mut count = vec![0u32; s.threshold.len()];
    let mut head = vec![0usize; s.queues.len()];
    let mut order = Vec::with_capacity(g.len());
    loop {
        let mut progressed = false;
        for c in 0..s.queues.len() {
            while let Some(&t) = s.queues.row(c).get(head[c]) {
                let ready = s
                    .waits
                    .row(t as usize)
                    .iter()
                    .all(|&k| count[k as usize] >= s.threshold[k as usize]);
                if !ready {
                    break;
                }
                order.push(t);
                head[c] += 1;
                for k in s.signals(t as usize) {
                    count[k as usize] += 1;
                }
                progressed = true;
            }
        }
        if !progressed {
            return order;
        }
    }
}

/// The memory a numerics run of `tf` needs: [`BYTES_PER_ELEMENT`] per element of every
/// tensor on every rank, and an f64 copy of the largest output to compare it.
pub fn memory_need(tf: &Taskflow, g: &TaskGraph) -> u128 {
    memory_need_in(tf, &g.layouts, g.ranks)
}

/// [`memory_need`] from the routing layouts and the ranks (before the taskflow is lowered).
pub fn memory_need_in(tf: &Taskflow, layouts: &[Option<RouteLayout>], ranks: u32) -> u128 {
    let largest_output = tf
        .outputs
        .iter()
        .map(|(_, t)| store::tensor_elements(tf, layouts, ranks, *t))
        .max()
        .unwrap_or(0);
    store::total_elements_in(tf, layouts, ranks)
        .saturating_mul(BYTES_PER_ELEMENT)
        .saturating_add(largest_output.saturating_mul(8))
}

/// The operations one evaluation of every op call of `tf` over its whole index space takes
/// (what the dense reference evaluates, and the tiled run again): per call, rank and
/// statement, its points times the nodes of its expression (a scalar function two), a
/// reduction's body counted once per term (the rows of a group taken as the mean over the
/// groups).
pub fn work(tf: &Taskflow, g: &TaskGraph) -> u128 {
    work_in(tf, &g.layouts, g.ranks)
}

/// [`work`] from the routings' layouts and the rank count, before the taskflow is lowered.
pub fn work_in(tf: &Taskflow, layouts: &[Option<RouteLayout>], ranks: u32) -> u128 {
    use hpmoe_dsl::ir::{BodyVar, SExpr, VarRange};
    fn range(layouts: &[Option<RouteLayout>], r: &VarRange, rank: usize) -> u128 {
        let layout = |id: hpmoe_dsl::ir::RouteId| layouts.get(id.0 as usize).and_then(|l| l.as_ref());
        match *r {
            VarRange::Fixed { lo, hi } => hi.saturating_sub(lo).max(0) as u128,
            VarRange::Recv(id) => layout(id).map_or(0, |l| l.rows(rank) as u128),
            VarRange::GroupRows { route, .. } => layout(route).map_or(0, |l| {
                let groups = l.group_off.get(rank).map_or(0, |o| o.len().saturating_sub(1)).max(1);
                (l.rows(rank) as u128).div_ceil(groups as u128)
            }),
        }
    }
    fn cost(e: &SExpr, vars: &[BodyVar], layouts: &[Option<RouteLayout>], rank: usize) -> u128 {
        let c = |a: &SExpr| cost(a, vars, layouts, rank);
        match e {
            SExpr::Const(_) | SExpr::Var(_) | SExpr::Route { .. } | SExpr::Read { .. } => 1,
            SExpr::Neg(a) | SExpr::Cast(_, a) => c(a).saturating_add(1),
            SExpr::Bin(_, a, b) => c(a).saturating_add(c(b)).saturating_add(1),
            // A scalar function (an `exp`, an `erf`) costs about two other nodes.
            SExpr::Call(_, args) => args.iter().fold(2u128, |n, a| n.saturating_add(c(a))),
            SExpr::Sum { vars: rv, body, .. } => rv
                .iter()
                .fold(c(body), |n, &v| n.saturating_mul(range(layouts, &vars[v].range, rank)))
                .saturating_add(1),
        }
    }
    /// Whether a reduction of `e` runs over rows that differ per rank.
    fn per_rank(e: &SExpr, vars: &[BodyVar]) -> bool {
        match e {
            SExpr::Const(_) | SExpr::Var(_) | SExpr::Route { .. } | SExpr::Read { .. } => false,
            SExpr::Neg(a) | SExpr::Cast(_, a) => per_rank(a, vars),
            SExpr::Bin(_, a, b) => per_rank(a, vars) || per_rank(b, vars),
            SExpr::Call(_, args) => args.iter().any(|a| per_rank(a, vars)),
            SExpr::Sum { vars: rv, body, .. } => {
                rv.iter().any(|&v| !matches!(vars[v].range, VarRange::Fixed { .. })) || per_rank(body, vars)
            }
        }
    }
    let mut total = 0u128;
    for node in &tf.nodes {
        let vars = &node.body.vars;
        for st in &node.body.stmts {
            // An expression's cost is walked once, or once per rank when its reductions'
            // ranges differ per rank.
            let same = (!per_rank(&st.value, vars)).then(|| cost(&st.value, vars, layouts, 0));
            for rank in 0..ranks as usize {
                let points = st
                    .vars
                    .iter()
                    .fold(1u128, |n, &v| n.saturating_mul(range(layouts, &vars[v].range, rank)));
                if points == 0 {
                    continue;
                }
                let c = same.unwrap_or_else(|| cost(&st.value, vars, layouts, rank));
                total = total.saturating_add(points.saturating_mul(c));
            }
        }
    }
    total
}

/// The most operations the numerics of one run may evaluate over all its taskflows, in
/// each of the tiled runs and the dense references: each taskflow is held to
/// [`NumericsOptions::work_limit`], and all of them together to twice that.
pub fn total_work_limit(opts: &NumericsOptions) -> u128 {
    u128::from(opts.work_limit).saturating_mul(2)
}

/// Refuses numerics of several taskflows (`(taskflow, its work)`, see [`work_in`]) that
/// together would evaluate more than [`total_work_limit`], before any starts.
pub fn check_total_work(works: &[(&Taskflow, u128)], opts: &NumericsOptions) -> Result<(), Diagnostic> {
    let total = works.iter().fold(0u128, |n, (_, w)| n.saturating_add(*w));
    let limit = total_work_limit(opts);
    if total <= limit {
        return Ok(());
    }
    let Some((largest, w)) = works.iter().max_by_key(|(_, w)| *w) else {
        return Ok(());
    };
    Err(Diagnostic::error(
        Code::LimitExceeded,
        format!(
            "numerics of {} taskflows would evaluate {total} operations together in each of their tiled runs and dense \
             references, more than the limit of {limit} for one run (`{}` alone {w})",
            works.len(),
            largest.name
        ),
    )
    .primary(largest.span, "the largest")
    .help("run numerics of one taskflow at a time (`--taskflow NAME`), or on a smaller configuration"))
}

/// Refuses a numerics run of `tf` that would need more memory or evaluate more operations
/// than `opts` allow, before anything is allocated.
pub fn check_size(tf: &Taskflow, g: &TaskGraph, opts: &NumericsOptions) -> Result<(), Diagnostic> {
    let need = memory_need(tf, g);
    if need > opts.memory_limit as u128 {
        return Err(Diagnostic::error(
            Code::LimitExceeded,
            format!(
                "numerics of `{}` would need {:.1} MiB for {} tensor elements, more than the limit of {:.1} MiB",
                tf.name,
                need as f64 / 1048576.0,
                store::total_elements(tf, g),
                opts.memory_limit as f64 / 1048576.0
            ),
        )
        .primary(tf.span, "this taskflow")
        .help("run numerics on a smaller configuration, e.g. `--set tokens=64 --set hidden=128`"));
    }
    let ops = work(tf, g);
    if ops > opts.work_limit as u128 {
        return Err(Diagnostic::error(
            Code::LimitExceeded,
            format!(
                "numerics of `{}` would evaluate {ops} operations in each of its tiled run and dense reference (every op call's body at every point), more than the limit of {}",
                tf.name, opts.work_limit
            ),
        )
        .primary(tf.span, "this taskflow")
        .help("run numerics on a smaller configuration, e.g. `--set tokens=64 --set hidden=128`"));
    }
    Ok(())
}

/// The prefix of routing `k`'s files in a dump: `route` when the program has one routing,
/// else `route_NAME`.
fn route_prefix(program: &Program, k: usize) -> String {
    if program.routes.len() == 1 {
        "route".to_string()
    } else {
        format!("route_{}", program.routes[k].name)
    }
}

/// The files a dump of `tf` may write into its directory, each with what it holds: every
/// input and output by name, then every routing's ids, kept rows, weights and window rows.
pub fn dump_files(program: &Program, tf: &Taskflow) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = Vec::new();
    for &i in &tf.inputs {
        let n = &tf.tensor(i).name;
        files.push((format!("{n}.npy"), format!("input `{n}`")));
    }
    for (n, t) in &tf.outputs {
        if !(tf.inputs.contains(t) && tf.tensor(*t).name == *n) {
            files.push((format!("{n}.npy"), format!("output `{n}`")));
        }
    }
    for k in 0..program.routes.len() {
        let prefix = route_prefix(program, k);
        for part in ["ids", "kept", "weights", "window_rows"] {
            files.push((
                format!("{prefix}_{part}.npy"),
                format!("the {} of routing `{}`", part.replace('_', " "), program.routes[k].name),
            ));
        }
    }
    files
}

/// Refuses a dump of `tf` in which two things would be written to one file (a tensor named
/// like a routing's file): the second would replace the first without a word.
pub fn check_dump(program: &Program, tf: &Taskflow) -> Result<(), String> {
    let mut seen: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for (file, what) in dump_files(program, tf) {
        if let Some(first) = seen.get(&file) {
            return Err(format!(
                "a dump of `{}` would write {first} and {what} to the same file `{file}`; rename one of them",
                tf.name
            ));
        }
        seen.insert(file, what);
    }
    Ok(())
}

/// Runs the numerics of a scheduled taskflow. `order` is the start order of the tasks (from
/// the timing simulation, or [`schedule_order`]). Inputs are seeded random values, or the
/// `.npy` files of `opts.inputs`.
pub fn run(
    program: &Program,
    tf: &Taskflow,
    g: &TaskGraph,
    s: &Schedule,
    order: &[u32],
    opts: &NumericsOptions,
) -> Result<NumericsReport, Diagnostic> {
    run_bound(program, tf, g, s, order, opts, None, false).map(|(r, _)| r)
}

/// [`run`] for one taskflow of a layer: inputs of `tf` named in `saved` (the forward's
/// [`Memories`], when `tf` is a backward) take those values, unless `opts.inputs` gives a
/// file for them; with `keep`, the taskflow's own memories are returned too, to feed its
/// backward.
#[allow(clippy::too_many_arguments)]
pub fn run_bound(
    program: &Program,
    tf: &Taskflow,
    g: &TaskGraph,
    s: &Schedule,
    order: &[u32],
    opts: &NumericsOptions,
    saved: Option<&Memories>,
    keep: bool,
) -> Result<(NumericsReport, Option<Memories>), Diagnostic> {
    check_size(tf, g, opts)?;
    if opts.dump.is_some() {
        check_dump(program, tf)
            .map_err(|m| Diagnostic::error(Code::DuplicateDefinition, m).primary(tf.span, "this taskflow"))?;
    }
    if order.len() != g.len() {
        return Err(Diagnostic::error(
            Code::Deadlock,
            format!(
                "the schedule of `{}` cannot run to completion ({} of {} tasks start)",
                tf.name,
                order.len(),
                g.len()
            ),
        ));
    }
    let routes: Vec<Option<eval::RouteIndex>> = g
        .layouts
        .iter()
        .map(|l| l.as_ref().map(eval::RouteIndex::new))
        .collect();
    // Inputs.
    // The stores are most of the memory `check_size` estimated; under an address-space limit
    // that leaves less, their allocation fails with a diagnostic rather than an abort.
    let out_of_memory = |(name, bytes): (String, u128)| {
        Diagnostic::error(
            Code::LimitExceeded,
            format!(
                "numerics of `{}`: no memory left for the {:.1} MiB of tensor `{name}` (the run needs {:.1} MiB in all)",
                tf.name,
                bytes as f64 / 1048576.0,
                memory_need(tf, g) as f64 / 1048576.0
            ),
        )
        .primary(tf.span, "this taskflow")
        .help("run numerics on a smaller configuration, e.g. `--set tokens=64 --set hidden=128`")
    };
    let mut reference: Vec<TensorStore<f64>> = store::try_allocate(tf, g, false).map_err(out_of_memory)?;
    let mut from_forward = Vec::new();
    for &i in &tf.inputs {
        let name = &tf.tensor(i).name;
        match (
            opts.inputs.iter().find(|(n, _)| n == name),
            saved.and_then(|m| m.get(name)),
        ) {
            (Some((_, path)), _) => inputs::load(tf, i, &mut reference[i.0 as usize], path).map_err(|e| {
                Diagnostic::error(Code::FileNotFound, format!("input `{name}`: {e}"))
                    .primary(tf.tensor(i).span, "this input")
            })?,
            (None, Some(src)) => {
                let dst = &mut reference[i.0 as usize];
                if src.shape != dst.shape {
                    let f = saved.map_or("", |m| m.taskflow.as_str());
                    return Err(Diagnostic::error(
                        Code::SavedMismatch,
                        format!(
                            "`{name}` of `{}` has per-rank shapes {:?}, but the forward `{f}` saved it with {:?}",
                            tf.name, dst.shape, src.shape
                        ),
                    )
                    .primary(tf.tensor(i).span, "this saved activation")
                    .help("run the forward and the backward under the same policy: their receive windows (static capacity or not) must be the same"));
                }
                dst.data.clone_from(&src.data);
                from_forward.push(name.clone());
            }
            (None, None) => inputs::random_fill(tf, i, &mut reference[i.0 as usize], opts.seed),
        }
    }
    for (n, _) in &opts.inputs {
        if !tf.inputs.iter().any(|&i| tf.tensor(i).name == *n) {
            let names: Vec<&str> = tf.inputs.iter().map(|&i| tf.tensor(i).name.as_str()).collect();
            return Err(Diagnostic::error(
                Code::UnknownName,
                format!("`--input {n}=...`: `{}` has no input `{n}`", tf.name),
            )
            .help(format!("the inputs are: {}", names.join(", "))));
        }
    }
    let bf16 = |t: TensorId| opts.bf16_storage && tf.tensor(t).dtype == DType::Bf16;
    let mut device: Vec<TensorStore<f32>> = store::try_allocate(tf, g, true).map_err(out_of_memory)?;
    for &i in &tf.inputs {
        let src = &reference[i.0 as usize];
        let dst = &mut device[i.0 as usize];
        for (d, s) in dst.data.iter_mut().zip(&src.data) {
            for (x, y) in d.iter_mut().zip(s) {
                *x = if bf16(i) {
                    store::round_bf16(*y as f32)
                } else {
                    *y as f32
                };
            }
        }
    }
    // With bf16 storage the references start from the same rounded inputs.
    if opts.bf16_storage {
        for &i in &tf.inputs {
            for (d, s) in reference[i.0 as usize].data.iter_mut().zip(&device[i.0 as usize].data) {
                for (x, y) in d.iter_mut().zip(s) {
                    *x = *y as f64;
                }
            }
        }
    }
    let per_token =
        moe_ref::forward(program, tf, g, &reference).or_else(|| moe_ref::backward(program, tf, g, &reference));
    let races = exec::execute_tiled(
        tf,
        g,
        s,
        order,
        &mut device,
        &routes,
        exec::ExecOptions {
            bf16_storage: opts.bf16_storage,
        },
    );
    exec::execute_dense(tf, g, &mut reference, &routes);
    let tol = if opts.bf16_storage {
        TOLERANCE_BF16
    } else {
        TOLERANCE_F32
    };
    let tol = tf.tensors.iter().map(|t| quant_tolerance(t.dtype)).fold(tol, f64::max);
    let mut checks = Vec::new();
    for (name, t) in &tf.outputs {
        let got = widen(&device[t.0 as usize]);
        checks.push(compare(name, "schedule", "dense", &got, &reference[t.0 as usize], tol));
        if let Some(pt) = per_token.as_ref().and_then(|v| v.iter().find(|(id, _)| id == t)) {
            checks.push(compare(name, "schedule", "per-token", &got, &pt.1, tol));
            checks.push(compare(
                name,
                "dense",
                "per-token",
                &reference[t.0 as usize],
                &pt.1,
                TOLERANCE_REFERENCES,
            ));
        }
    }
    let race_diags = races
        .iter()
        .map(|r| {
            let reader = hpmoe_dsl::verify::describe(program, tf, g, r.reader as usize);
            let node = &tf.nodes[g.node[r.reader as usize] as usize];
            let at: Vec<String> = r.at.iter().map(|x| x.to_string()).collect();
            let what = format!("`{}`[{}] on rank {}", tf.tensor(r.tensor).name, at.join(", "), r.rank);
            let mut d = match r.writer {
                Some(w) => Diagnostic::error(
                    Code::Race,
                    format!(
                        "race: {reader} read {what}, last written by {}, which is not ordered before it",
                        hpmoe_dsl::verify::describe(program, tf, g, w as usize)
                    ),
                )
                .secondary(tf.nodes[g.node[w as usize] as usize].span, "the writer"),
                None => Diagnostic::error(Code::Race, format!("race: {reader} read {what} before any write to it")),
            };
            d = d.primary(node.span, "the reader");
            d
        })
        .collect();
    let mut dumped = Vec::new();
    if let Some(dir) = &opts.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| Diagnostic::error(Code::FileNotFound, format!("cannot create `{}`: {e}", dir.display())))?;
        let mut write = |name: &str, st: &TensorStore<f64>| -> Result<(), Diagnostic> {
            let p = dir.join(format!("{name}.npy"));
            inputs::dump(st, &p)
                .map_err(|e| Diagnostic::error(Code::FileNotFound, format!("cannot write `{}`: {e}", p.display())))?;
            dumped.push(p);
            Ok(())
        };
        for &i in &tf.inputs {
            write(&tf.tensor(i).name, &reference[i.0 as usize])?;
        }
        for (name, t) in &tf.outputs {
            // An output that is an input of the same name was written as that input.
            if tf.inputs.contains(t) && tf.tensor(*t).name == *name {
                continue;
            }
            write(name, &widen(&device[t.0 as usize]))?;
        }
        for k in 0..program.routes.len() {
            if g.layouts.get(k).is_some_and(|l| l.is_some()) {
                let prefix = route_prefix(program, k);
                inputs::dump_routing(g, k, dir, &prefix)
                    .map_err(|e| Diagnostic::error(Code::FileNotFound, format!("cannot write routing files: {e}")))?;
                dumped.push(dir.join(format!("{prefix}_ids.npy")));
                if g.layouts[k].as_ref().is_some_and(|l| l.routing.dropped() > 0) {
                    dumped.push(dir.join(format!("{prefix}_kept.npy")));
                }
                dumped.push(dir.join(format!("{prefix}_weights.npy")));
                dumped.push(dir.join(format!("{prefix}_window_rows.npy")));
            }
        }
    }
    let memories = keep.then(|| {
        let mut tensors: Vec<(String, TensorStore<f64>)> = Vec::new();
        for (name, t) in &tf.outputs {
            tensors.push((name.clone(), widen(&device[t.0 as usize])));
        }
        for (k, t) in tf.tensors.iter().enumerate() {
            if !t.name.is_empty() && !tensors.iter().any(|(n, _)| *n == t.name) {
                tensors.push((t.name.clone(), widen(&device[k])));
            }
        }
        Memories {
            taskflow: tf.name.clone(),
            tensors,
        }
    });
    let saved_from =
        (!from_forward.is_empty()).then(|| (saved.map_or(String::new(), |m| m.taskflow.clone()), from_forward));
    Ok((
        NumericsReport {
            checks,
            saved_from,
            races: race_diags,
            tasks: g.len(),
            dumped,
        },
        memories,
    ))
}
