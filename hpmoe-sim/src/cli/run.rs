//! `hpmoe run`: a program in; per taskflow and policy, the program is lowered, verified,
//! scheduled and simulated, and a report (tables or JSON), optionally a comparison of two
//! policies, a Chrome trace and a Gantt chart come out.

use super::lower::policy_for;
use super::{checked, style, Format, ProgramArgs};
use crate::report::{Comparison, Report};
use crate::sim::{self, SimError, SimOptions};
use crate::trace::{self, Filter, Run};
use hpmoe_dsl::diag::{self, Diagnostic};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::schedule;
use hpmoe_dsl::{Code, SourceMap};
use std::path::{Path, PathBuf};

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
    pub numerics: Option<crate::numerics::NumericsOptions>,
}

fn print_diags(ds: &[Diagnostic], sources: &SourceMap, format: Format) {
    match format {
        Format::Human => eprint!("{}", diag::render_all(ds, 0, sources, style())),
        Format::Json => {
            let list: Vec<_> = ds.iter().map(|d| diag::to_json(d, sources)).collect();
            println!("{}", serde_json::json!({ "ok": false, "diagnostics": list }));
        }
    }
}

fn usage(msg: String) -> i32 {
    eprintln!("error: {msg}");
    2
}

/// The taskflows to run: `--taskflow`, else all.
fn selected<'p>(p: &'p Program, name: Option<&str>) -> Result<Vec<&'p Taskflow>, Diagnostic> {
    let Some(name) = name else {
        return Ok(p.taskflows.iter().collect());
    };
    match p.taskflow(name) {
        Some(t) => Ok(vec![t]),
        None => {
            let names: Vec<&str> = p.taskflows.iter().map(|t| t.name.as_str()).collect();
            let d = Diagnostic::error(Code::NoTaskflow, format!("no taskflow `{name}`"));
            Err(match hpmoe_dsl::suggest::closest(name, names.iter().copied()) {
                Some(b) => d.help(format!("did you mean `{b}`?")),
                None => d.help(format!("the taskflows are: {}", names.join(", "))),
            })
        }
    }
}

/// One simulated policy.
struct Done {
    report: Report,
    numerics: Option<crate::numerics::NumericsReport>,
}

/// Lowers, schedules and simulates a taskflow under a policy; writes the trace and chart if
/// asked. Errors carry the exit code.
fn one(
    p: &Program,
    tf: &Taskflow,
    policy: Option<&str>,
    o: &RunCli,
    sources: &SourceMap,
    outputs: Option<&Filter>,
) -> Result<Done, i32> {
    let spec = policy_for(p, &tf.name, policy).map_err(|d| {
        print_diags(&[d], sources, o.format);
        2
    })?;
    let layouts = hpmoe_dsl::lower::layouts(p, spec.static_capacity, o.file.parent()).map_err(|d| {
        print_diags(&[d], sources, o.format);
        1
    })?;
    let c = schedule::compile(p, tf, &spec, layouts, o.max_tasks, o.verify).map_err(|ds| {
        print_diags(&ds, sources, o.format);
        1
    })?;
    let opts = SimOptions {
        record_bandwidth: outputs.is_some() && o.trace.is_some(),
    };
    let simd = match sim::simulate_compiled(p, tf, &c, opts) {
        Ok(x) => x,
        Err(SimError::Model(msg)) => {
            print_diags(&[Diagnostic::error(Code::BadOverride, msg)], sources, o.format);
            return Err(1);
        }
        Err(SimError::Stall(st)) => {
            let d = sim::stall_diagnostic(p, tf, &c.graph, &c.schedule, &st);
            print_diags(&[d], sources, o.format);
            return Err(1);
        }
    };
    let report = Report::new(p, tf, &c.graph, &c.schedule, &simd.workload, &simd.model, &simd.result);
    // Numerics run the tasks in the order the simulation started them.
    let numerics = match (
        &o.numerics,
        outputs.is_some() || o.compare.is_none() || policy == o.policy,
    ) {
        (Some(nopts), true) => {
            let mut order: Vec<u32> = (0..c.graph.len() as u32).collect();
            order.sort_by(|&a, &b| {
                simd.result.start[a as usize]
                    .total_cmp(&simd.result.start[b as usize])
                    .then(a.cmp(&b))
            });
            match crate::numerics::run(p, tf, &c.graph, &c.schedule, &order, nopts) {
                Ok(r) => Some(r),
                Err(d) => {
                    print_diags(&[d], sources, o.format);
                    return Err(1);
                }
            }
        }
        _ => None,
    };
    if let Some(filter) = outputs {
        let run = Run {
            program: p,
            tf,
            graph: &c.graph,
            schedule: &c.schedule,
            workload: &simd.workload,
            result: &simd.result,
        };
        let write = |path: &Path, f: &dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>| -> Result<(), i32> {
            let res = std::fs::File::create(path).and_then(|file| {
                let mut w = std::io::BufWriter::new(file);
                f(&mut w)?;
                std::io::Write::flush(&mut w)
            });
            res.map_err(|e| {
                eprintln!("error: cannot write `{}`: {e}", path.display());
                1
            })
        };
        if let Some(path) = o.trace {
            write(path, &|w| trace::write(w, &run, filter))?;
        }
        if let Some(path) = o.gantt {
            let mut gf = filter.clone();
            if gf.ranks.is_none() {
                gf.ranks = Some(vec![0]);
                if o.format == Format::Human && c.graph.ranks > 1 {
                    eprintln!("note: the chart shows rank 0; choose ranks with --trace-ranks");
                }
            }
            write(path, &|w| crate::gantt::write(w, &run, &gf))?;
        }
    }
    Ok(Done { report, numerics })
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
    let (p, sources) = match checked(o.file, o.prog, o.format) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if let Some(max) = filter.ranks.as_ref().and_then(|v| v.last()) {
        if *max as u64 >= p.device.ranks() {
            return usage(format!(
                "--trace-ranks names rank {max}, but the device has {} ranks",
                p.device.ranks()
            ));
        }
    }
    let tfs = match selected(&p, o.taskflow) {
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
    let wants_outputs = o.trace.is_some() || o.gantt.is_some();
    if wants_outputs && tfs.len() > 1 && o.format == Format::Human {
        eprintln!(
            "note: the trace and chart show taskflow `{}`; choose one with --taskflow",
            tfs[0].name
        );
    }
    let mut runs: Vec<Report> = Vec::new();
    let mut comparisons: Vec<Comparison> = Vec::new();
    let mut num_reports: Vec<(String, crate::numerics::NumericsReport)> = Vec::new();
    for (i, tf) in tfs.iter().enumerate() {
        let outputs = (wants_outputs && i == 0).then_some(&filter);
        let main = match one(&p, tf, o.policy, o, &sources, outputs) {
            Ok(d) => {
                if let Some(n) = d.numerics {
                    num_reports.push((tf.name.clone(), n));
                }
                d.report
            }
            Err(code) => return code,
        };
        if let Some(other) = o.compare {
            let second = match one(&p, tf, Some(other), o, &sources, None) {
                Ok(d) => d.report,
                Err(code) => return code,
            };
            // The speedup of the main policy over the compared one.
            comparisons.push(Comparison::new(&second, &main));
            runs.push(main);
            runs.push(second);
        } else {
            runs.push(main);
        }
    }
    match o.format {
        Format::Human => {
            if let Ok(m) = crate::model::DeviceModel::new(&p.device) {
                print!("{}", m.describe());
            }
            for r in &runs {
                println!();
                print!("{}", r.human());
            }
            if !comparisons.is_empty() {
                println!();
                for c in &comparisons {
                    print!("{}", c.human());
                }
            }
            for (name, n) in &num_reports {
                println!();
                println!("taskflow {name}:");
                print!("{}", n.text());
            }
            for (_, n) in &num_reports {
                if !n.races.is_empty() {
                    eprint!("{}", diag::render_all(&n.races, 0, &sources, style()));
                }
            }
        }
        Format::Json => {
            let j = serde_json::json!({
                "ok": true,
                "runs": runs.iter().map(|r| r.json()).collect::<Vec<_>>(),
                "comparisons": comparisons.iter().map(|c| c.json()).collect::<Vec<_>>(),
                "numerics": num_reports.iter().map(|(n, r)| serde_json::json!({"taskflow": n, "result": r.json()})).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
        }
    }
    if num_reports.iter().any(|(_, n)| !n.passed()) {
        return 1;
    }
    0
}
