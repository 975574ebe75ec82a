//! The compiler driver: the one owner of the order of the stages and of their results.
//!
//! In: a program (a file on disk, a text, or a source the `taskflow!` macro parsed) and the
//! check options (`--set` overrides, `--device`, `--routing`). Out, stage by stage, values
//! that only this module builds:
//!
//! 1. [`Checked`] ([`check_path`], [`check_text`], [`check_file`], [`check_parsed`]): the
//!    checked program. Loading resolves every path once, relative to the file that names it
//!    (imports, `file(...)` routings), so no later stage needs a base directory.
//! 2. Routings and receive-window layouts ([`Checked::layouts`]): materialised once per
//!    capacity mode (exact or static worst case) and shared by every taskflow and policy.
//! 3. The policy of a taskflow ([`Checked::policy`], [`Checked::select_policy`]): one
//!    resolution of `--policy`, the program's `schedule` and the stdlib's defaults.
//! 4. [`Compiled`] ([`Checked::compile`]): the taskflow lowered, its task graph verified,
//!    scheduled, and the schedule verified.
//!
//! The simulator's stages (prepare, simulate, report) continue from a [`Compiled`] in
//! `hpmoe_sim::pipeline`. Every front end goes through here: the command line, the REPL,
//! the sweep, the scale study, the macro's compile-time path and the Rust API. The stage
//! functions themselves (`lower::lower`, `verify::*`, `schedule::schedule`) stay public for
//! tests and benchmarks that inject faults between stages.

use crate::check::{self, Options};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::ir::{Program, Taskflow};
use crate::lower::{Layouts, TaskGraph};
use crate::policy::{Policy, PolicySpec};
use crate::schedule::Schedule;
use crate::source::SourceMap;
use crate::syntax::ast;
use crate::syntax::token::FileId;
use crate::timing::Clock;
use std::path::Path;
use std::sync::OnceLock;

/// A checked program, with its routings materialised on demand.
#[derive(Clone, Debug)]
pub struct Checked {
    program: Program,
    /// Layouts by capacity mode: `[exact, static]`.
    layouts: [OnceLock<Result<Layouts, Diagnostic>>; 2],
}

/// The result of checking: the program when there was no error, and every diagnostic
/// (errors and warnings) sorted by position.
#[derive(Debug)]
pub struct Checking {
    pub checked: Option<Checked>,
    pub diagnostics: Diagnostics,
}

impl From<check::Outcome> for Checking {
    fn from(o: check::Outcome) -> Checking {
        Checking {
            checked: o.program.map(Checked::new),
            diagnostics: o.diagnostics,
        }
    }
}

/// Checks a file on disk and everything it imports.
pub fn check_path(path: &Path, opts: &Options, sources: &mut SourceMap) -> Checking {
    check::check_path(path, opts, sources).into()
}

/// See [`check::keep_trees_until_exit`].
pub fn keep_trees_until_exit() {
    check::keep_trees_until_exit();
}

/// Checks a text given a display name; file imports are relative to `dir`.
pub fn check_text(name: &str, text: &str, dir: Option<&Path>, opts: &Options, sources: &mut SourceMap) -> Checking {
    check::check_text(name, text, dir, opts, sources).into()
}

/// Checks a source already added to `sources`.
pub fn check_file(file: FileId, opts: &Options, sources: &mut SourceMap) -> Checking {
    check::check_file(file, opts, sources).into()
}

/// Checks a source the caller parsed (the `taskflow!` macro); see [`check::check_parsed`].
pub fn check_parsed(
    file: FileId,
    ast: ast::File,
    parse_diags: Vec<Diagnostic>,
    opts: &Options,
    sources: &mut SourceMap,
) -> Checking {
    check::check_parsed(file, ast, parse_diags, opts, sources).into()
}

/// The root file's text with each `grad` declaration replaced by the items it derives, in
/// canonical layout: the source `hpmoe fmt --expand-grad` writes. `text` is the root file's
/// text that `checked` was checked from. The derived taskflow takes the declaration's place
/// (after its doc comments, and before a comment that ends its line); its ops follow the
/// line the declaration ends on. A comment inside a `grad` declaration is kept, on its own
/// line before the derived taskflow. The derived items are written with the sizes the
/// program was checked at (its params' values and overrides).
pub fn expand_grads(checked: &Checked, text: &str) -> Result<String, Vec<Diagnostic>> {
    let comments = crate::syntax::lexer::comments(text, FileId(0));
    // (start, end, replacement) on the original text, applied from the last start back.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut grads: Vec<&crate::ir::GradInfo> = checked.grads.iter().collect();
    grads.sort_by_key(|g| g.span.lo);
    for g in grads {
        let (lo, hi) = (g.span.lo as usize, g.span.hi as usize);
        if lo > hi || hi > text.len() || !text.is_char_boundary(lo) || !text.is_char_boundary(hi) {
            return Err(vec![Diagnostic::error(
                Code::BadGrad,
                format!("the `grad` declaration of `{}` is not in this text", g.taskflow),
            )]);
        }
        let mut with = String::new();
        for c in comments
            .iter()
            .filter(|c| c.span.lo as usize >= lo && (c.span.hi as usize) <= hi)
        {
            with.push_str(&c.text);
            with.push('\n');
        }
        with.push_str(g.taskflow_source.trim_end());
        edits.push((lo, hi, with));
        let eol = text[hi..].find('\n').map_or(text.len(), |k| hi + k + 1);
        let mut ops = String::from("\n");
        ops.push_str(&g.ops_source);
        edits.push((eol, eol, ops));
    }
    // Insertions at one place keep the order of their declarations.
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut out = text.to_string();
    let mut k = 0;
    while k < edits.len() {
        let mut j = k;
        while j + 1 < edits.len() && edits[j + 1].0 == edits[k].0 {
            j += 1;
        }
        // edits[k..=j] start at one place, in source order: the last applied first ends
        // up after the others.
        for e in edits[k..=j].iter().rev() {
            out.replace_range(e.0..e.1, &e.2);
        }
        k = j + 1;
    }
    crate::syntax::fmt::format_source(&out)
}

/// What compiling a taskflow is allowed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Refuse a graph of more tasks than this.
    pub max_tasks: u64,
    /// Verify the task graph and the schedule.
    pub verify: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            max_tasks: crate::lower::DEFAULT_MAX_TASKS,
            verify: true,
        }
    }
}

/// A lowered, verified and scheduled taskflow. Only [`Checked::compile`] builds one (it is
/// `non_exhaustive`, so no other crate can).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Compiled {
    pub graph: TaskGraph,
    pub schedule: Schedule,
}

/// Read access to the checked program (the program cannot be changed through it).
impl std::ops::Deref for Checked {
    type Target = Program;
    fn deref(&self) -> &Program {
        &self.program
    }
}

impl Checked {
    fn new(program: Program) -> Checked {
        Checked {
            program,
            layouts: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The checked program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The checked program, by value.
    pub fn into_program(self) -> Program {
        self.program
    }

    /// A taskflow by name; the error suggests a close name or lists them.
    pub fn select_taskflow(&self, name: &str) -> Result<&Taskflow, Diagnostic> {
        if let Some(t) = self.program.taskflow(name) {
            return Ok(t);
        }
        let names: Vec<&str> = self.program.taskflows.iter().map(|t| t.name.as_str()).collect();
        let d = Diagnostic::error(Code::NoTaskflow, format!("no taskflow `{name}`"));
        Err(match crate::suggest::closest(name, names.iter().copied()) {
            Some(b) => d.help(format!("did you mean `{b}`?")),
            None => d.help(format!("the taskflows are: {}", names.join(", "))),
        })
    }

    /// The named taskflow, or every taskflow in program order.
    pub fn select_taskflows(&self, name: Option<&str>) -> Result<Vec<&Taskflow>, Diagnostic> {
        match name {
            Some(n) => self.select_taskflow(n).map(|t| vec![t]),
            None => Ok(self.program.taskflows.iter().collect()),
        }
    }

    /// The policy of a taskflow when a front end names one (`--policy NAME`, `:run NAME`):
    /// the program's options apply when it selects the same policy, otherwise the stdlib's
    /// defaults; with no name, the program's selection, else `interleaved`.
    pub fn policy(&self, taskflow: &str, requested: Option<&str>) -> Result<PolicySpec, Diagnostic> {
        let policy = match requested {
            None => None,
            Some(name) => Some(parse_policy(name)?),
        };
        Ok(self.select_policy(taskflow, policy))
    }

    /// [`Checked::policy`] with an already parsed policy.
    pub fn select_policy(&self, taskflow: &str, policy: Option<Policy>) -> PolicySpec {
        PolicySpec::select(&self.program, taskflow, policy)
    }

    /// The program with the logits of its gated routers (`router(..., gate: tf.z)`) set to
    /// values a run computed: per routing, [ranks, tokens, experts] row-major. The
    /// routings, their receive-window capacities and those of their views follow the new
    /// logits; a routing with a capacity factor that they overflow is E0903.
    pub fn with_gate_logits(&self, logits: Vec<(crate::ir::RouteId, Vec<f64>)>) -> Result<Checked, Diagnostic> {
        use crate::ir::RouteKind;
        let mut program = self.program.clone();
        let mut changed = vec![false; program.routes.len()];
        for (id, z) in logits {
            let Some(spec) = program.routes.get_mut(id.0 as usize) else {
                continue;
            };
            let name = spec.name.clone();
            let RouteKind::Router(r) = &mut spec.kind else {
                return Err(Diagnostic::error(
                    Code::BadGate,
                    format!("routing `{name}` is not a router"),
                ));
            };
            r.gate_logits = Some(std::sync::Arc::new(z));
            changed[id.0 as usize] = true;
        }
        let mut made: Vec<Option<crate::route::Routing>> = vec![None; program.routes.len()];
        for i in 0..program.routes.len() {
            let spec = program.routes[i].clone();
            let fail = |e: String| {
                Diagnostic::error(Code::BadRouting, format!("routing `{}`: {e}", spec.name))
                    .primary(spec.span, "cannot be made from the gate's logits")
            };
            let routing = match spec.kind.derived_from() {
                None if changed[i] => {
                    let r = crate::route::Routing::generate(&spec).map_err(fail)?;
                    let counts = r.recv_counts();
                    program.routes[i].capacity = spec.window_capacity(&counts).map_err(|(rank, got, c)| {
                        Diagnostic::error(
                            Code::RecvOverflow,
                            format!(
                                "routing `{}` sends {got} rows to rank {rank} by the logits the program computed, but its receive window holds {c}",
                                spec.name
                            ),
                        )
                        .primary(spec.span, format!("capacity {c} rows per rank"))
                        .help("raise `capacity_factor`, use 0 to size the window exactly, or drop with `drop: true`")
                    })?;
                    r
                }
                None => continue,
                Some(of) => {
                    let Some(parent) = made[of.0 as usize].as_ref() else {
                        continue;
                    };
                    let r = match spec.kind {
                        RouteKind::ByRank { .. } => parent.by_rank(),
                        _ => {
                            let base = program.base_route(of);
                            let Some(base) = made[base.0 as usize].as_ref() else {
                                continue;
                            };
                            crate::lower::layout::RouteLayout::new(parent.clone(), false)
                                .checked_fanout(&spec, base)
                                .map_err(fail)?
                        }
                    };
                    let rs = &mut program.routes[i];
                    rs.capacity = r.recv_counts().into_iter().max().unwrap_or(0);
                    rs.tokens = r.tokens as u64;
                    r
                }
            };
            made[i] = Some(routing);
        }
        Ok(Checked::new(program))
    }

    /// The routings and their receive-window layouts for a capacity mode (computed once).
    pub fn layouts(&self, static_capacity: bool) -> Result<Layouts, Diagnostic> {
        self.layouts[usize::from(static_capacity)]
            .get_or_init(|| crate::lower::layouts(&self.program, static_capacity))
            .clone()
    }

    /// Whether the layouts of a capacity mode are already materialised.
    pub fn has_layouts(&self, static_capacity: bool) -> bool {
        self.layouts[usize::from(static_capacity)].get().is_some()
    }

    /// Takes over the layouts `other` has materialised, when both programs have the same
    /// routings (a session re-checking a program whose routings did not change).
    pub fn share_layouts(&self, other: &Checked) {
        if self.program.routes != other.program.routes {
            return;
        }
        for (mine, theirs) in self.layouts.iter().zip(&other.layouts) {
            if let Some(l) = theirs.get() {
                let _ = mine.set(l.clone());
            }
        }
    }

    /// The memory compiling and simulating `tf` under `spec` is expected to need
    /// ([`crate::lower::memory_estimate`]), or the diagnostic its lowering would give.
    pub fn memory_estimate(
        &self,
        tf: &Taskflow,
        spec: &PolicySpec,
        opts: &CompileOptions,
    ) -> Result<crate::lower::MemoryEstimate, Diagnostic> {
        let layouts = self.layouts(spec.static_capacity)?;
        let lower_opts = spec.lower_options(&self.program, opts.max_tasks);
        crate::lower::memory_estimate(&self.program, tf, &layouts, &lower_opts)
    }

    /// Lowers a taskflow of this program for a policy, verifies the task graph, schedules it
    /// and verifies the schedule.
    pub fn compile(
        &self,
        tf: &Taskflow,
        spec: &PolicySpec,
        opts: &CompileOptions,
    ) -> Result<Compiled, Vec<Diagnostic>> {
        self.compile_timed(tf, spec, opts, &mut Clock::new())
    }

    /// [`Checked::compile`], timing its stages on `clock`: `lower`, `verify graph`,
    /// `schedule` and `verify schedule`.
    pub fn compile_timed(
        &self,
        tf: &Taskflow,
        spec: &PolicySpec,
        opts: &CompileOptions,
        clock: &mut Clock,
    ) -> Result<Compiled, Vec<Diagnostic>> {
        let program = &self.program;
        let layouts = self.layouts(spec.static_capacity).map_err(|d| vec![d])?;
        let lower_opts = spec.lower_options(program, opts.max_tasks);
        let graph = crate::lower::lower(program, tf, layouts, &lower_opts).map_err(|d| vec![d])?;
        clock.lap("lower");
        if opts.verify {
            let ds = crate::verify::verify_graph(program, tf, &graph);
            if !ds.is_empty() {
                return Err(ds);
            }
            clock.lap("verify graph");
        }
        let schedule = crate::schedule::schedule(program, tf, &graph, spec);
        clock.lap("schedule");
        if opts.verify {
            let ds = crate::verify::verify_schedule(program, tf, &graph, &schedule);
            if !ds.is_empty() {
                return Err(ds);
            }
            clock.lap("verify schedule");
        }
        Ok(Compiled { graph, schedule })
    }
}

/// A policy by name; the error suggests a close name or lists them.
pub fn parse_policy(name: &str) -> Result<Policy, Diagnostic> {
    if let Some(p) = Policy::parse(name) {
        return Ok(p);
    }
    let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
    let d = Diagnostic::error(Code::UnknownPolicy, format!("unknown policy `{name}`"));
    Err(match crate::suggest::closest(name, names.iter().copied()) {
        Some(b) => d.help(format!("did you mean `{b}`?")),
        None => d.help(format!("the policies are: {}", names.join(", "))),
    })
}
