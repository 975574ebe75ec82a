//! The stage caches of a session. Each stage's result is kept under the key of what it
//! depends on, so a re-run after a change redoes only the stages the change affects:
//!
//! - check: (buffer text, param/device overrides, device profile, routing) → program (or its
//!   diagnostics). A program equal to one already checked keeps that one's id, so a setting
//!   changed and changed back finds everything after it cached;
//! - routing: (routings of the program, static capacity) → the materialised layouts;
//! - compile (lower, verify, schedule, verify): (program id, taskflow, policy spec);
//! - simulate (workload, simulation, report): (compiled id, bandwidth recording).
//!
//! Every cache is a short most-recently-used list.

use super::session::Session;
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::diag::{self, Diagnostic};
use hpmoe_dsl::driver::{CompileOptions, Compiled};
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::lower::Layouts;
use hpmoe_dsl::schedule::{self, PolicySpec};
use hpmoe_dsl::{Code, SourceMap};
use hpmoe_sim::report::Report;
use hpmoe_sim::sim::{self, SimError, SimOptions, Simulated};
use std::cell::OnceCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

const CHECKS: usize = 8;
const COMPILED: usize = 6;
const SIMS: usize = 4;

/// What a check depends on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CheckKey {
    pub text: Rc<str>,
    pub overrides: Vec<Override>,
    pub device: Option<String>,
    pub routing: Option<String>,
    pub allow_paths: Vec<std::path::PathBuf>,
}

/// A checked buffer.
#[derive(Debug)]
pub(crate) struct Checked {
    pub id: u64,
    pub key: CheckKey,
    pub program: Option<Rc<hpmoe_dsl::driver::Checked>>,
    pub sources: Rc<SourceMap>,
    /// Errors and warnings, sorted.
    pub diags: Vec<Diagnostic>,
    pub dropped: diag::Dropped,
}

/// A compiled taskflow under a policy.
#[derive(Debug)]
pub(crate) struct CompiledEntry {
    pub id: u64,
    prog: u64,
    taskflow: String,
    pub spec: PolicySpec,
    pub result: Result<Rc<Compiled>, Vec<Diagnostic>>,
}

/// A simulated schedule with its report and what `:explain` needs, computed once.
#[derive(Debug)]
pub(crate) struct SimRun {
    pub sim: Simulated,
    pub report: Report,
    /// Per counter: the tasks that signal it.
    signallers: OnceCell<schedule::SignallerIndex>,
    /// Per task: its position in its core's queue.
    positions: OnceCell<Vec<u32>>,
}

impl SimRun {
    pub fn signallers(&self, s: &schedule::Schedule) -> &schedule::SignallerIndex {
        self.signallers.get_or_init(|| s.signaller_index())
    }
    pub fn positions(&self, s: &schedule::Schedule) -> &[u32] {
        self.positions
            .get_or_init(|| sim::queue_positions(s, self.sim.result.start.len()))
    }
    /// Tasks in the order they started (ties by id).
    pub fn start_order(&self) -> Vec<u32> {
        let st = &self.sim.result.start;
        let mut order: Vec<u32> = (0..st.len() as u32).collect();
        order.sort_by(|&a, &b| st[a as usize].total_cmp(&st[b as usize]).then(a.cmp(&b)));
        order
    }
}

#[derive(Debug)]
struct SimEntry {
    compiled: u64,
    record_bandwidth: bool,
    result: Result<Rc<SimRun>, SimError>,
}

/// The caches of a session.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    next_id: u64,
    checks: Vec<Rc<Checked>>,
    compiled: Vec<Rc<CompiledEntry>>,
    sims: Vec<Rc<SimEntry>>,
}

/// Finds an entry, moving it to the front.
fn lookup<T>(v: &mut Vec<Rc<T>>, pred: impl Fn(&T) -> bool) -> Option<Rc<T>> {
    let i = v.iter().position(|x| pred(x))?;
    let x = v.remove(i);
    v.insert(0, Rc::clone(&x));
    Some(x)
}

fn insert<T>(v: &mut Vec<Rc<T>>, x: Rc<T>, cap: usize) {
    v.insert(0, x);
    v.truncate(cap);
}

impl Cache {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
    /// How many checks are cached.
    #[cfg(test)]
    pub fn checks(&self) -> usize {
        self.checks.len()
    }
    pub fn clear(&mut self) {
        self.checks.clear();
        self.compiled.clear();
        self.sims.clear();
    }
}

/// One stage of a command: its name and how long it took (`None`: cached).
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    pub name: String,
    pub took: Option<Duration>,
}

impl Session {
    pub(crate) fn stage(&mut self, name: impl Into<String>, took: Option<Duration>) {
        self.stages.push(Stage {
            name: name.into(),
            took,
        });
    }

    /// What a check of the buffer under the current settings depends on.
    fn check_key(&self) -> CheckKey {
        CheckKey {
            text: Rc::clone(&self.buffer),
            overrides: self.settings.overrides.iter().map(|(_, o)| o.clone()).collect(),
            device: self.settings.device.clone(),
            routing: self.settings.routing.clone(),
            allow_paths: self.settings.allow_paths.clone(),
        }
    }

    /// The cached check of the buffer under the current settings, if there is one (the
    /// caches unchanged).
    pub(crate) fn cached_check(&self) -> Option<Rc<Checked>> {
        let key = self.check_key();
        self.cache.checks.iter().find(|c| c.key == key).cloned()
    }

    /// Checks the buffer under the current settings (cached).
    pub(crate) fn check(&mut self) -> Rc<Checked> {
        self.check_showing(true)
    }

    /// [`Self::check`]; with `warnings` false a fresh check prints nothing (the caller shows
    /// what it wants of them).
    pub(crate) fn check_showing(&mut self, warnings: bool) -> Rc<Checked> {
        let key = self.check_key();
        if let Some(c) = lookup(&mut self.cache.checks, |c| c.key == key) {
            self.stage("check", None);
            self.update_names(&c);
            return c;
        }
        let t0 = Instant::now();
        let c = self.fresh_check(key);
        self.stage("check", Some(t0.elapsed()));
        self.keep_check(&c);
        // Warnings are shown when the check runs, not on every use of a cached one.
        if warnings && c.program.is_some() && !c.diags.is_empty() {
            self.diagnostics(&c.diags, c.dropped, &c.sources);
        }
        self.update_names(&c);
        c
    }

    /// Checks the buffer under the current settings, neither looking in the cache nor
    /// adding to it, nor printing anything.
    pub(crate) fn check_uncached(&mut self) -> Rc<Checked> {
        let key = self.check_key();
        self.fresh_check(key)
    }

    /// Adds a check to the cache.
    pub(crate) fn keep_check(&mut self, c: &Rc<Checked>) {
        insert(&mut self.cache.checks, Rc::clone(c), CHECKS);
    }

    fn fresh_check(&mut self, key: CheckKey) -> Rc<Checked> {
        let opts = Options {
            overrides: key.overrides.clone(),
            device: key.device.clone(),
            routing: key.routing.clone(),
            allow_paths: key.allow_paths.clone(),
        };
        let mut sources = SourceMap::new();
        let (name, path) = self.source_name();
        let file = sources.add(name, path, Rc::clone(&key.text).to_string());
        let outcome = hpmoe_dsl::driver::check_file(file, &opts, &mut sources);
        let dropped = outcome.diagnostics.dropped();
        let diags = outcome.diagnostics.into_vec();
        let program = outcome.checked;
        // A program equal to one checked before (a setting changed back, an unused item
        // added at the end) keeps its id, so what was compiled from it is found again.
        let same = program.as_ref().and_then(|p| {
            self.cache
                .checks
                .iter()
                .find(|c| c.program.as_deref().map(|q| q.program()) == Some(p.program()))
                .map(|c| c.id)
        });
        let id = same.unwrap_or_else(|| self.cache.id());
        Rc::new(Checked {
            id,
            key,
            program: program.map(Rc::new),
            sources: Rc::new(sources),
            diags,
            dropped,
        })
    }

    /// The checked program, or its errors printed.
    pub(crate) fn program(&mut self) -> Result<Rc<Checked>, ()> {
        if self.buffer.trim().is_empty() && self.file.is_none() {
            self.error("no program: load one with `:load FILE` or type its definitions");
            return Err(());
        }
        let c = self.check();
        if c.program.is_none() {
            self.diagnostics(&c.diags, c.dropped, &c.sources);
            return Err(());
        }
        Ok(c)
    }

    /// The routings materialised for a policy's capacity mode (computed once per program,
    /// shared with an earlier program of the same routings).
    fn layouts(&mut self, c: &Checked, static_capacity: bool) -> Result<Layouts, ()> {
        let Some(p) = c.program.as_deref() else { return Err(()) };
        if !p.has_layouts(static_capacity) {
            // Another program of the session may have materialised the same routings since.
            for prev in self.cache.checks.iter().filter_map(|c| c.program.as_deref()) {
                p.share_layouts(prev);
            }
        }
        let result = if p.has_layouts(static_capacity) {
            self.stage("routing", None);
            p.layouts(static_capacity)
        } else {
            let t0 = Instant::now();
            let result = p.layouts(static_capacity);
            self.stage("routing", Some(t0.elapsed()));
            result
        };
        match result {
            Ok(l) => Ok(l),
            Err(d) => {
                let d = d.clone();
                self.diagnostics(&[d], diag::Dropped::NONE, &c.sources);
                Err(())
            }
        }
    }

    /// Lowers, verifies and schedules a taskflow under a policy (cached).
    pub(crate) fn compiled(&mut self, c: &Checked, tf: &Taskflow, spec: &PolicySpec) -> Result<Rc<CompiledEntry>, ()> {
        let Some(p) = c.program.clone() else { return Err(()) };
        let label = format!("compile {}", spec.policy.name());
        let hit = lookup(&mut self.cache.compiled, |e| {
            e.prog == c.id && e.taskflow == tf.name && e.spec == *spec
        });
        let e = match hit {
            Some(e) => {
                self.stage(label, None);
                e
            }
            None => {
                self.layouts(c, spec.static_capacity)?;
                let t0 = Instant::now();
                let result = hpmoe_sim::pipeline::compile(
                    &p,
                    tf,
                    spec,
                    &CompileOptions::default(),
                    &mut hpmoe_dsl::timing::Clock::new(),
                )
                .map(Rc::new);
                let id = self.cache.id();
                let e = Rc::new(CompiledEntry {
                    id,
                    prog: c.id,
                    taskflow: tf.name.clone(),
                    spec: spec.clone(),
                    result,
                });
                self.stage(label, Some(t0.elapsed()));
                insert(&mut self.cache.compiled, Rc::clone(&e), COMPILED);
                e
            }
        };
        if let Err(ds) = &e.result {
            let ds = ds.clone();
            self.diagnostics(&ds, diag::Dropped::NONE, &c.sources);
            return Err(());
        }
        Ok(e)
    }

    /// Simulates a compiled taskflow and builds its report (cached). A run recorded with
    /// bandwidth samples serves a request without them.
    pub(crate) fn simulated(
        &mut self,
        c: &Checked,
        tf: &Taskflow,
        e: &CompiledEntry,
        record_bandwidth: bool,
    ) -> Result<Rc<SimRun>, ()> {
        let (Some(p), Ok(comp)) = (c.program.clone(), e.result.as_ref()) else {
            return Err(());
        };
        let label = format!("simulate {}", e.spec.policy.name());
        let hit = lookup(&mut self.cache.sims, |s| {
            s.compiled == e.id && (s.record_bandwidth || !record_bandwidth)
        });
        let s = match hit {
            Some(s) => {
                self.stage(label, None);
                s
            }
            None => {
                let t0 = Instant::now();
                let result = sim::simulate_compiled(
                    &p,
                    tf,
                    comp,
                    SimOptions {
                        record_bandwidth,
                        ..SimOptions::default()
                    },
                )
                .map(|sim| {
                    let report = Report::new(
                        &p,
                        tf,
                        &comp.graph,
                        &comp.schedule,
                        &sim.workload,
                        &sim.model,
                        &sim.result,
                    );
                    Rc::new(SimRun {
                        sim,
                        report,
                        signallers: OnceCell::new(),
                        positions: OnceCell::new(),
                    })
                });
                let s = Rc::new(SimEntry {
                    compiled: e.id,
                    record_bandwidth,
                    result,
                });
                self.stage(label, Some(t0.elapsed()));
                insert(&mut self.cache.sims, Rc::clone(&s), SIMS);
                s
            }
        };
        match &s.result {
            Ok(r) => Ok(Rc::clone(r)),
            Err(SimError::Model(msg)) => {
                let d = Diagnostic::error(Code::BadOverride, msg.clone());
                self.diagnostics(&[d], diag::Dropped::NONE, &c.sources);
                Err(())
            }
            Err(SimError::Stall(st)) => {
                let d = sim::stall_diagnostic(&p, tf, &comp.graph, &comp.schedule, st);
                self.diagnostics(&[d], diag::Dropped::NONE, &c.sources);
                Err(())
            }
        }
    }

    /// Prints diagnostics as the CLI does; errors among them mark the command as failed.
    pub(crate) fn diagnostics(&mut self, ds: &[Diagnostic], dropped: diag::Dropped, sources: &SourceMap) {
        if ds.is_empty() {
            return;
        }
        if ds.iter().any(|d| d.is_error()) {
            self.failed_now = true;
        }
        // Overrides come from `:set` here: say so in the REPL's syntax, not the CLI's.
        let ds: Vec<Diagnostic> = ds.iter().map(repl_wording).collect();
        let renamed = repl_source_names(sources);
        let text = diag::render_all(&ds, dropped, renamed.as_ref().unwrap_or(sources), self.cfg.style);
        let _ = self.err.write_all(text.as_bytes());
        let _ = self.err.flush();
    }

    /// The stages of the last command: `stages: check 1.2 ms, compile interleaved (cached)`.
    pub(crate) fn print_stages(&mut self) {
        if self.stages.is_empty() {
            return;
        }
        let parts: Vec<String> = std::mem::take(&mut self.stages)
            .into_iter()
            .map(|s| match s.took {
                None => format!("{} (cached)", s.name),
                Some(d) if self.cfg.timings => format!("{} {}", s.name, fmt_duration(d)),
                Some(_) => s.name,
            })
            .collect();
        self.say(&format!("stages: {}", parts.join(", ")));
    }
}

fn fmt_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else {
        format!("{ms:.1} ms")
    }
}

/// A diagnostic about an override, reworded from the CLI's `--set NAME=VALUE` to the REPL's
/// `:set NAME = VALUE` (and `--routing`/`--device` to `:set routing = ...`/`:set device = ...`).
fn repl_wording(d: &Diagnostic) -> Diagnostic {
    let mut d = d.clone();
    d.message = reword(&d.message);
    d.help = d.help.as_deref().map(reword);
    d.notes = d.notes.iter().map(|n| reword(n)).collect();
    d
}

/// The sources with the files the checker makes from CLI options (`<--routing>`) named after
/// the REPL command that set them; `None` when there is none.
fn repl_source_names(sources: &SourceMap) -> Option<SourceMap> {
    let ids: Vec<_> = sources
        .files()
        .filter(|(_, f)| f.path.is_none() && f.name.starts_with("<--"))
        .map(|(id, f)| (id, f.name.clone()))
        .collect();
    if ids.is_empty() {
        return None;
    }
    let mut s = sources.clone();
    for (id, name) in ids {
        let opt = name.trim_start_matches("<--").trim_end_matches('>');
        s.rename(id, format!("<:set {opt}>"));
    }
    Some(s)
}

fn reword(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("`--") {
        out.push_str(&rest[..at]);
        let inner = &rest[at + 1..];
        let Some(close) = inner.find('`') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let quoted = &inner[..close];
        // One quoted run may hold several options (`--set a=1 --set b=2`): each becomes
        // its own command, and the run is reworded only when every part is an override.
        let parts: Option<Vec<String>> = quoted
            .split(" --")
            .map(|p| reword_option(p.trim_start_matches("--")))
            .collect();
        match parts {
            Some(cmds) => {
                let cmds: Vec<String> = cmds.iter().map(|c| format!("`{c}`")).collect();
                out.push_str(&cmds.join(" and "));
            }
            None => {
                out.push('`');
                out.push_str(quoted);
                out.push('`');
            }
        }
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    out
}

/// One CLI override (`set k=v`, `device d`, ...) as the REPL command that does the same.
fn reword_option(cli: &str) -> Option<String> {
    match cli.split_once(' ') {
        Some(("set", kv)) => Some(match kv.split_once('=') {
            Some((k, v)) => format!(":set {k} = {v}"),
            None => format!(":set {kv}"),
        }),
        Some((opt @ ("routing" | "device" | "policy"), v)) => Some(format!(":set {opt} = {v}")),
        _ => None,
    }
}

#[cfg(test)]
mod wording_tests {
    use super::reword;

    #[test]
    fn cli_overrides_read_as_repl_commands() {
        assert_eq!(
            reword("`--set tokens=abc`: a param takes a number"),
            "`:set tokens = abc`: a param takes a number"
        );
        assert_eq!(
            reword("`--routing zipf(s: 1)`: the program has no routing"),
            "`:set routing = zipf(s: 1)`: the program has no routing"
        );
        assert_eq!(
            reword("`--device foo`: no such device profile"),
            "`:set device = foo`: no such device profile"
        );
        assert_eq!(reword("no override here `x`"), "no override here `x`");
        assert_eq!(reword("unclosed `--set a=1"), "unclosed `--set a=1");
        assert_eq!(
            reword("e.g. `--set tokens=64 --set hidden=128`"),
            "e.g. `:set tokens = 64` and `:set hidden = 128`"
        );
        assert_eq!(reword("`--set a=1 --trace x`"), "`--set a=1 --trace x`");
    }
}
