//! A REPL session: the program text (the loaded file plus typed definitions), the settings,
//! the stage caches, and the commands.

use super::cache::{Cache, Checked, CompiledEntry, SimRun, Stage};
use super::commands;
use super::input;
use super::Names;
use hpmoe_dsl::check::Override;
use hpmoe_dsl::diag::{Diagnostic, RenderStyle};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::{Code, SourceMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// How a session prints.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Print how long each stage took.
    pub timings: bool,
    /// Echo each input, with a prompt, before its output (scripts).
    pub echo: bool,
    pub style: RenderStyle,
}

/// What to do after an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Quit,
}

/// What `:set` changes besides the text.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Settings {
    /// Param and device field overrides, by name, in the order they were set.
    pub overrides: Vec<(String, Override)>,
    pub device: Option<String>,
    pub routing: Option<String>,
    pub policy: Option<Policy>,
    pub taskflow: Option<String>,
    /// `--allow-path` directories: imports and routing files may also be read from them.
    pub allow_paths: Vec<std::path::PathBuf>,
}

/// The session.
pub(crate) struct Session {
    pub cfg: Config,
    pub out: Box<dyn Write>,
    pub err: Box<dyn Write>,
    /// The loaded file, as given.
    pub file: Option<PathBuf>,
    /// The session's text.
    pub buffer: Rc<str>,
    /// Definitions typed since the file was loaded.
    pub edits: usize,
    pub settings: Settings,
    /// The policy of the last `:run POLICY` (the one `:show`, `:explain`, `:trace` use).
    pub view_policy: Option<Policy>,
    pub cache: Cache,
    pub stages: Vec<Stage>,
    pub names: Arc<Mutex<Names>>,
    /// Whether the current input failed, and whether any did.
    pub failed_now: bool,
    pub failed: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("file", &self.file)
            .field("settings", &self.settings)
            .finish()
    }
}

/// A definition as it is added: `input`, or `input;` when the only thing missing is a final
/// `;` (`param tokens = 128` at the prompt).
pub(crate) fn prepared_definition(input: &str) -> std::borrow::Cow<'_, str> {
    let (_, first, _) = hpmoe_dsl::syntax::parse_text(input, hpmoe_dsl::FileId(0));
    match (first.is_empty(), input::with_final_semicolon(input)) {
        (false, Some(f)) => std::borrow::Cow::Owned(f),
        _ => std::borrow::Cow::Borrowed(input),
    }
}

/// A usage message for a command.
fn usage(c: &str) -> String {
    match commands::lookup(c) {
        Ok(info) => format!("usage: :{} {}", info.name, info.args),
        Err(e) => e,
    }
}

/// Splits `a b "c d"` into words (double quotes keep spaces).
pub(crate) fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for ch in s.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The first option of a command's words that is given twice: a `key=` (`limit=1 limit=2`)
/// or a flag (`all`, `bf16`). Which of the two was meant is not known, so neither is taken.
pub(crate) fn repeated_option(rest: &str) -> Option<String> {
    let mut seen = std::collections::BTreeSet::new();
    for w in words(rest) {
        let key = match w.split_once('=') {
            Some((k, _)) => format!("{k}="),
            None if matches!(w.as_str(), "all" | "bf16") => w,
            None => continue,
        };
        if !seen.insert(key.clone()) {
            return Some(key);
        }
    }
    None
}

/// A value as it was typed (`2 us`, not `"2 us"`).
pub(crate) fn value_text(v: &hpmoe_dsl::ir::Value) -> String {
    match v {
        hpmoe_dsl::ir::Value::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Parses a policy name, with a suggestion when it is not one.
pub(crate) fn parse_policy(name: &str) -> Result<Policy, String> {
    Policy::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Policy::all().iter().map(|p| p.name()).collect();
        match hpmoe_dsl::suggest::closest(name, names.iter().copied()) {
            Some(b) => format!("unknown policy `{name}`: did you mean `{b}`?"),
            None => format!("unknown policy `{name}`: the policies are {}", names.join(", ")),
        }
    })
}

impl Session {
    pub fn new(cfg: Config, out: Box<dyn Write>, err: Box<dyn Write>, names: Arc<Mutex<Names>>) -> Session {
        Session {
            cfg,
            out,
            err,
            file: None,
            buffer: Rc::from(""),
            edits: 0,
            settings: Settings::default(),
            view_policy: None,
            cache: Cache::default(),
            stages: Vec::new(),
            names,
            failed_now: false,
            failed: false,
        }
    }

    /// Prints a line of results.
    pub fn say(&mut self, s: &str) {
        let _ = writeln!(self.out, "{s}");
        let _ = self.out.flush();
    }

    /// Prints a block of results (ending with a newline or not).
    pub fn say_block(&mut self, s: &str) {
        let _ = self.out.write_all(s.as_bytes());
        if !s.ends_with('\n') {
            let _ = self.out.write_all(b"\n");
        }
        let _ = self.out.flush();
    }

    /// Prints an error and marks the input as failed.
    pub fn error(&mut self, msg: &str) {
        self.failed_now = true;
        let _ = writeln!(self.err, "error: {}", hpmoe_dsl::diag::shown(msg));
        let _ = self.err.flush();
    }

    pub fn note(&mut self, msg: &str) {
        let _ = writeln!(self.err, "note: {}", hpmoe_dsl::diag::shown(msg));
        let _ = self.err.flush();
    }

    /// The name and path the buffer is checked under: the loaded file's, else `<repl>`.
    pub fn source_name(&self) -> (String, Option<PathBuf>) {
        match &self.file {
            Some(f) => {
                let canon = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
                (f.display().to_string(), Some(canon))
            }
            None => ("<repl>".to_string(), None),
        }
    }

    /// Publishes the names of a checked program for completion and highlighting.
    pub fn update_names(&mut self, c: &Checked) {
        let Some(p) = c.program.as_deref() else { return };
        let Ok(mut n) = self.names.lock() else { return };
        n.params = p.params.iter().map(|(k, _)| k.clone()).collect();
        n.device_fields = hpmoe_dsl::ir::DEVICE_FIELDS
            .iter()
            .map(|f| f.name.to_string())
            .collect();
        n.device_fields.sort();
        n.ops = p.ops.iter().map(|o| o.name.clone()).collect();
        n.taskflows = p.taskflows.iter().map(|t| t.name.clone()).collect();
        n.routes = p.routes.iter().map(|r| r.name.clone()).collect();
        let mut calls: Vec<String> = p
            .taskflows
            .iter()
            .flat_map(|t| t.nodes.iter().map(|n| n.name.clone()))
            .collect();
        calls.sort();
        calls.dedup();
        n.calls = calls;
    }

    fn publish_settings(&self) {
        if let Ok(mut n) = self.names.lock() {
            let mut s: Vec<String> = self.settings.overrides.iter().map(|(k, _)| k.clone()).collect();
            for (name, on) in [
                ("device", self.settings.device.is_some()),
                ("routing", self.settings.routing.is_some()),
                ("policy", self.settings.policy.is_some()),
                ("taskflow", self.settings.taskflow.is_some()),
            ] {
                if on {
                    s.push(name.to_string());
                }
            }
            n.settings = s;
        }
    }

    /// Runs one input (a `:command` or definitions). Never panics on any input; errors are
    /// printed and remembered for the exit code.
    pub fn execute(&mut self, input: &str) -> Flow {
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Flow::Continue;
        }
        self.echo(input);
        self.failed_now = false;
        self.stages.clear();
        let flow = if let Some(cmd) = trimmed.strip_prefix(':') {
            self.command(cmd)
        } else {
            self.define(input);
            Flow::Continue
        };
        self.stages.clear();
        if self.failed_now {
            self.failed = true;
        }
        flow
    }

    /// With `--echo`, prints an input with its prompts.
    pub(crate) fn echo(&mut self, input: &str) {
        if self.cfg.echo {
            let mut lines = input.trim_end().lines();
            let mut text = format!("hpmoe> {}", lines.next().unwrap_or(""));
            for l in lines {
                text.push_str(&format!("\n  ...> {l}"));
            }
            self.say(&text);
        }
    }

    fn command(&mut self, cmd: &str) -> Flow {
        let (name, rest) = match cmd.find(char::is_whitespace) {
            Some(i) => (&cmd[..i], cmd[i..].trim()),
            None => (cmd, ""),
        };
        let info = match commands::lookup(name) {
            Ok(i) => i,
            Err(e) => {
                self.error(&e);
                return Flow::Continue;
            }
        };
        if matches!(info.name, "show" | "explain" | "trace" | "gantt" | "dump") {
            if let Some(opt) = repeated_option(rest) {
                self.error(&format!(
                    "`{opt}` is given twice: give each option of `:{}` once",
                    info.name
                ));
                self.failed_now = true;
                return Flow::Continue;
            }
        }
        if info.name == "quit" && !rest.is_empty() {
            self.error("`:quit` takes no arguments");
            self.failed_now = true;
            return Flow::Continue;
        }
        let res = match info.name {
            "load" => self.load(rest),
            "set" => self.set(rest),
            "unset" => self.unset(rest),
            "show" => self.show(rest),
            "run" => self.run(rest),
            "compare" => self.compare(rest),
            "explain" => self.explain(rest),
            "trace" => self.write_output(rest, true),
            "gantt" => self.write_output(rest, false),
            "dump" => self.dump(rest),
            "help" => {
                self.help(rest);
                Ok(())
            }
            "quit" => return Flow::Quit,
            _ => Ok(()),
        };
        if res.is_err() {
            self.failed_now = true;
        }
        Flow::Continue
    }

    fn help(&mut self, rest: &str) {
        let topic = rest.trim().trim_start_matches(':');
        if topic.is_empty() {
            self.say_block(&commands::overview());
            return;
        }
        match commands::lookup(topic) {
            Ok(c) => self.say_block(&commands::detail(c)),
            Err(e) => self.error(&e),
        }
    }

    // ------------------------------------------------------------------ :load

    /// Loads a file into the session (at start-up and for `:load`).
    pub fn load(&mut self, rest: &str) -> Result<(), ()> {
        let args = words(rest);
        let path = match (args.as_slice(), &self.file) {
            ([], Some(f)) => f.clone(),
            ([], None) => {
                self.error("no file is loaded; usage: :load FILE");
                return Err(());
            }
            ([one], _) => PathBuf::from(one),
            _ => {
                self.error(&usage("load"));
                return Err(());
            }
        };
        self.load_path(&path)
    }

    /// Loads a file: a new buffer, checked.
    pub fn load_path(&mut self, path: &Path) -> Result<(), ()> {
        let path = path.to_path_buf();
        let text = match hpmoe_dsl::check::read_source(&path) {
            Ok(t) => t,
            Err(e) => {
                let d = Diagnostic::error(Code::FileNotFound, format!("cannot read `{}`: {e}", path.display()))
                    .note(hpmoe_dsl::check::read_error_note(&e));
                self.diagnostics(&[d], hpmoe_dsl::diag::Dropped::NONE, &SourceMap::new());
                return Err(());
            }
        };
        let canon = |p: &Path| std::fs::canonicalize(p).ok();
        let same = self
            .file
            .as_deref()
            .and_then(canon)
            .is_some_and(|a| Some(a) == canon(&path));
        // Another file starts afresh; the first file keeps the command line's settings.
        if self.file.is_some() && !same {
            self.settings = Settings::default();
            self.publish_settings();
        }
        self.file = Some(path.clone());
        self.buffer = Rc::from(text.as_str());
        self.edits = 0;
        self.view_policy = None;
        let c = self.check();
        match c.program.as_deref() {
            Some(p) => {
                let line = summary(p);
                self.say(&format!("loaded {}: {line}", path.display()));
                if same && self.settings != Settings::default() {
                    let s = self.settings_text();
                    self.say(&format!("settings kept: {s}"));
                }
                self.print_stages();
                Ok(())
            }
            None => {
                self.diagnostics(&c.diags, c.dropped, &c.sources);
                self.say(&format!("loaded {} (with errors)", path.display()));
                Err(())
            }
        }
    }

    pub(crate) fn settings_text(&self) -> String {
        let s = &self.settings;
        let mut parts: Vec<String> = s
            .overrides
            .iter()
            .map(|(k, o)| format!("{k} = {}", value_text(&o.value)))
            .collect();
        if let Some(d) = &s.device {
            parts.push(format!("device = {d}"));
        }
        if let Some(r) = &s.routing {
            parts.push(format!("routing = {r}"));
        }
        if let Some(p) = s.policy {
            parts.push(format!("policy = {}", p.name()));
        }
        if let Some(t) = &s.taskflow {
            parts.push(format!("taskflow = {t}"));
        }
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    }

    // ------------------------------------------------------------------ :set / :unset

    fn set(&mut self, rest: &str) -> Result<(), ()> {
        if rest.trim().is_empty() {
            let s = self.settings_text();
            self.say(&format!("settings: {s}"));
            return Ok(());
        }
        let Some((name, value)) = rest.split_once('=') else {
            self.error(&format!(
                "`{}` is not of the form NAME = VALUE; {}",
                rest.trim(),
                usage("set")
            ));
            return Err(());
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() || value.is_empty() {
            self.error(&usage("set"));
            return Err(());
        }
        let mut next = self.settings.clone();
        match name {
            "policy" => {
                if value == "default" {
                    next.policy = None;
                } else {
                    match parse_policy(value) {
                        Ok(p) => next.policy = Some(p),
                        Err(e) => {
                            self.error(&e);
                            return Err(());
                        }
                    }
                }
                // The policy does not change the program: no check.
                self.settings = next;
                self.view_policy = None;
                self.publish_settings();
                self.say(&format!("policy = {value}"));
                return Ok(());
            }
            "taskflow" => {
                if let Some(p) = self.current_program() {
                    if p.taskflow(value).is_none() {
                        let names: Vec<&str> = p.taskflows.iter().map(|t| t.name.as_str()).collect();
                        let hint = match hpmoe_dsl::suggest::closest(value, names.iter().copied()) {
                            Some(b) => format!("did you mean `{b}`?"),
                            None => format!("the taskflows are: {}", names.join(", ")),
                        };
                        self.error(&format!("no taskflow `{value}`: {hint}"));
                        return Err(());
                    }
                }
                next.taskflow = Some(value.to_string());
                self.settings = next;
                self.publish_settings();
                self.say(&format!("taskflow = {value}"));
                return Ok(());
            }
            "device" => next.device = Some(value.to_string()),
            "routing" => next.routing = Some(value.to_string()),
            _ => {
                let o = match Override::parse(&format!("{name}={value}")) {
                    Ok(o) => o,
                    Err(e) => {
                        self.error(&format!("cannot set `{name}`: {e}"));
                        return Err(());
                    }
                };
                match next.overrides.iter_mut().find(|(k, _)| k == name) {
                    Some(slot) => slot.1 = o,
                    None => next.overrides.push((name.to_string(), o)),
                }
            }
        }
        self.apply(next, &format!("{name} = {value}"))
    }

    fn unset(&mut self, rest: &str) -> Result<(), ()> {
        let name = rest.trim();
        if name.is_empty() {
            self.error(&usage("unset"));
            return Err(());
        }
        let mut next = self.settings.clone();
        let had = match name {
            "device" => next.device.take().is_some(),
            "routing" => next.routing.take().is_some(),
            "policy" => next.policy.take().is_some(),
            "taskflow" => next.taskflow.take().is_some(),
            _ => {
                let before = next.overrides.len();
                next.overrides.retain(|(k, _)| k != name);
                next.overrides.len() != before
            }
        };
        if !had {
            self.error(&format!("`{name}` is not set (settings: {})", self.settings_text()));
            return Err(());
        }
        if matches!(name, "policy" | "taskflow") {
            self.settings = next;
            self.view_policy = None;
            self.publish_settings();
            self.say(&format!("{name}: unset"));
            return Ok(());
        }
        self.apply(next, &format!("{name}: unset"))
    }

    /// Applies new settings and checks the program again. A change that breaks a program that
    /// checked is rolled back.
    fn apply(&mut self, next: Settings, what: &str) -> Result<(), ()> {
        if self.buffer.trim().is_empty() && self.file.is_none() {
            self.settings = next;
            self.publish_settings();
            self.say(what);
            return Ok(());
        }
        let before_ok = self.check().program.is_some();
        self.stages.clear();
        let old = std::mem::replace(&mut self.settings, next);
        let c = self.check();
        if c.program.is_none() {
            self.diagnostics(&c.diags, c.dropped, &c.sources);
            if before_ok {
                self.settings = old;
                self.note("the setting was not applied");
            } else {
                self.publish_settings();
                self.note("the setting is kept; the program still has errors");
            }
            return Err(());
        }
        self.publish_settings();
        self.say(what);
        self.print_stages();
        Ok(())
    }

    /// The program as it checks now, if it does (cached; no output).
    pub fn current_program(&mut self) -> Option<Rc<hpmoe_dsl::driver::Checked>> {
        if self.buffer.trim().is_empty() && self.file.is_none() {
            return None;
        }
        let saved = std::mem::take(&mut self.stages);
        let p = self.check().program.clone();
        self.stages = saved;
        p
    }

    // ------------------------------------------------------------------ definitions

    fn define(&mut self, input: &str) {
        let fixed = prepared_definition(input);
        let input = fixed.as_ref();
        let mut sources = SourceMap::new();
        let file = sources.add("<input>", None, input.to_string());
        let (_, diags, _) = hpmoe_dsl::syntax::parse_text(input, file);
        if !diags.is_empty() {
            let ds: Vec<Diagnostic> = diags;
            self.diagnostics(&ds, hpmoe_dsl::diag::Dropped::NONE, &sources);
            if !self.failed_now {
                self.failed_now = true;
            }
            let starts_item = input
                .split_whitespace()
                .next()
                .is_some_and(|w| hpmoe_dsl::syntax::parser::ITEM_KEYWORDS.contains(&w) || w.starts_with("///"));
            if !starts_item {
                self.note("type a definition (param, op, comm, taskflow, route, schedule, device, import) or a :command; :help lists the commands");
            }
            return;
        }
        let edit = input::add_items(&self.buffer, input);
        if edit.actions.is_empty() {
            return;
        }
        let had_program = !(self.buffer.trim().is_empty() && self.file.is_none());
        let before = had_program.then(|| self.check());
        let before_ok = before.as_ref().is_some_and(|c| c.program.is_some());
        self.stages.clear();
        let old = std::mem::replace(&mut self.buffer, Rc::from(edit.text.as_str()));
        let c = self.check_showing(false);
        // Only what this definition brought is shown (and, with errors, counts): the whole
        // program's warnings or errors each time would grow with every definition.
        let new: Vec<Diagnostic> = match &before {
            Some(b) if !c.diags.is_empty() => {
                let seen: std::collections::HashSet<DiagKey> = b.diags.iter().map(diag_key).collect();
                c.diags
                    .iter()
                    .filter(|d| !seen.contains(&diag_key(d)))
                    .cloned()
                    .collect()
            }
            _ => c.diags.clone(),
        };
        if c.program.is_none() {
            let more_dropped = before.as_ref().is_some_and(|b| c.dropped.errors > b.dropped.errors);
            self.diagnostics(if before_ok { &c.diags } else { &new }, c.dropped, &c.sources);
            // A definition with errors of its own is not added, so that a session (or a
            // script) full of mistakes does not grow with them.
            if before_ok || more_dropped || new.iter().any(|d| d.is_error()) {
                self.buffer = old;
                self.note("the definition was not added; the session is unchanged");
                return;
            }
            self.edits += 1;
            for a in &edit.actions {
                self.say(a);
            }
            let left = c.diags.iter().filter(|d| d.is_error()).count() + c.dropped.errors;
            let s = if left == 1 { "" } else { "s" };
            self.note(&format!(
                "the program still has {left} error{s} from before this definition (`:run` shows them)"
            ));
            return;
        }
        self.diagnostics(&new, c.dropped, &c.sources);
        self.defined(&edit.actions, &edit.params);
        self.print_stages();
    }

    /// What a definition that was added says: its actions, and a note for each param it
    /// defines that a `:set` overrides.
    pub(crate) fn defined(&mut self, actions: &[String], params: &[String]) {
        self.edits += 1;
        for a in actions {
            self.say(a);
        }
        for p in params {
            if let Some((_, o)) = self.settings.overrides.iter().find(|(k, _)| k == p) {
                let v = value_text(&o.value);
                self.note(&format!(
                    "`{p}` is set to {v} with :set, which wins over the definition; `:unset {p}` to use it"
                ));
            }
        }
    }

    // ------------------------------------------------------------------ views

    /// The policy spec for a taskflow: `explicit`, else the session's policy, else the
    /// program's schedule, else interleaved. Options written in the program apply when it
    /// selects the same policy.
    pub fn spec_for(&self, p: &hpmoe_dsl::driver::Checked, tf: &str, explicit: Option<Policy>) -> PolicySpec {
        p.select_policy(tf, explicit.or(self.settings.policy))
    }

    /// The taskflows to run: the one set with `:set taskflow`, else all.
    pub fn taskflows<'p>(&mut self, p: &'p Program) -> Result<Vec<&'p Taskflow>, ()> {
        if let Some(name) = self.settings.taskflow.clone() {
            return match p.taskflow(&name) {
                Some(t) => Ok(vec![t]),
                None => {
                    self.error(&format!("no taskflow `{name}` (`:unset taskflow` to run them all)"));
                    Err(())
                }
            };
        }
        if p.taskflows.is_empty() {
            self.error("the program has no taskflow to run");
            return Err(());
        }
        Ok(p.taskflows.iter().collect())
    }

    /// The taskflow that views (`:show tasks`, `:explain`, ...) use: the chosen one, else the
    /// first.
    pub fn view_taskflow(&mut self, p: &Program) -> Result<usize, ()> {
        let name = self.settings.taskflow.clone();
        let found = match &name {
            Some(n) => p.taskflows.iter().position(|t| &t.name == n),
            None => (!p.taskflows.is_empty()).then_some(0),
        };
        match found {
            Some(i) => Ok(i),
            None => {
                match name {
                    Some(n) => self.error(&format!("no taskflow `{n}`")),
                    None => self.error("the program has no taskflow"),
                }
                Err(())
            }
        }
    }

    /// Everything a view needs: the program, its taskflow, the compiled schedule and (when
    /// asked) the simulation, for the last run's policy.
    pub fn view(&mut self, simulate: bool, record_bandwidth: bool) -> Result<View, ()> {
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        let tf = self.view_taskflow(&p)?;
        let spec = self.spec_for(&p, &p.taskflows[tf].name, self.view_policy);
        let entry = self.compiled(&c, &p.taskflows[tf], &spec)?;
        let Ok(compiled) = entry.result.as_ref().map(Rc::clone) else {
            return Err(());
        };
        let sim = if simulate {
            Some(self.simulated(&c, &p.taskflows[tf], &entry, record_bandwidth)?)
        } else {
            None
        };
        Ok(View {
            checked: c,
            program: p,
            tf,
            compiled,
            spec: entry.spec.clone(),
            entry,
            sim,
        })
    }

    // ------------------------------------------------------------------ :run / :compare

    fn run(&mut self, rest: &str) -> Result<(), ()> {
        let args = words(rest);
        let explicit = match args.as_slice() {
            [] => None,
            [p] => match parse_policy(p) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.error(&e);
                    return Err(());
                }
            },
            _ => {
                self.error(&usage("run"));
                return Err(());
            }
        };
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        let tfs = self.taskflows(&p)?;
        let mut first = true;
        for tf in tfs {
            let spec = self.spec_for(&p, &tf.name, explicit);
            let comp = self.compiled(&c, tf, &spec)?;
            let sim = self.simulated(&c, tf, &comp, false)?;
            if !first {
                self.say("");
            }
            first = false;
            let text = sim.report.human();
            self.say_block(&text);
        }
        self.view_policy = explicit;
        self.print_stages();
        Ok(())
    }

    fn compare(&mut self, rest: &str) -> Result<(), ()> {
        let args = words(rest);
        let (a, b) = match args.as_slice() {
            [a, b] => match (parse_policy(a), parse_policy(b)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    self.error(&e);
                    return Err(());
                }
            },
            _ => {
                self.error(&usage("compare"));
                return Err(());
            }
        };
        if a == b {
            self.error(&format!(
                "`:compare {0} {0}` compares a policy with itself: name two different policies",
                a.name()
            ));
            return Err(());
        }
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        let tfs = self.taskflows(&p)?;
        let mut first = true;
        for tf in tfs {
            let mut runs = Vec::new();
            for pol in [a, b] {
                let spec = self.spec_for(&p, &tf.name, Some(pol));
                let comp = self.compiled(&c, tf, &spec)?;
                runs.push(self.simulated(&c, tf, &comp, false)?);
            }
            if !first {
                self.say("");
            }
            first = false;
            let text = compare_table(&tf.name, &runs[0].report, &runs[1].report);
            self.say_block(&text);
        }
        self.print_stages();
        Ok(())
    }

    // ------------------------------------------------------------------ :trace / :gantt / :dump

    fn write_output(&mut self, rest: &str, trace: bool) -> Result<(), ()> {
        let cmd = if trace { "trace" } else { "gantt" };
        let args = words(rest);
        let mut file: Option<PathBuf> = None;
        let mut filter = hpmoe_sim::trace::Filter::default();
        for a in &args {
            if let Some(v) = a.strip_prefix("ranks=") {
                match hpmoe_sim::trace::Filter::parse_ranks(v) {
                    Ok(r) => filter.ranks = Some(r),
                    Err(e) => {
                        self.error(&format!("ranks={v}: {e}"));
                        return Err(());
                    }
                }
            } else if let Some(v) = a.strip_prefix("window=") {
                match hpmoe_sim::trace::Filter::parse_window(v) {
                    Ok(w) => filter.window = Some(w),
                    Err(e) => {
                        self.error(&format!("window={v}: {e}"));
                        return Err(());
                    }
                }
            } else if file.is_none() {
                file = Some(PathBuf::from(a));
            } else {
                self.error(&usage(cmd));
                return Err(());
            }
        }
        let Some(path) = file else {
            self.error(&usage(cmd));
            return Err(());
        };
        // Before any work: a FIFO there would block the write for ever, a directory or a
        // missing one fail it after the run.
        if let Err(e) = crate::cli::paths::output_file(&format!(":{cmd}"), &path) {
            self.error(&e);
            return Err(());
        }
        if let Some(program) = &self.file {
            if let Err(e) = crate::cli::paths::distinct_outputs(program, &[(&format!(":{cmd}"), &path)]) {
                self.error(&e);
                return Err(());
            }
        }
        let c = self.program()?;
        if let Some(p) = &c.program {
            let read = crate::cli::paths::files_read(&c.sources, p.program());
            if let Err(e) = crate::cli::paths::outputs_not_read(&read, &[(&format!(":{cmd}"), &path)]) {
                self.error(&e);
                return Err(());
            }
        }
        let v = self.view(true, trace)?;
        let g = &v.compiled().graph;
        if let Some(max) = filter.ranks.as_ref().and_then(|r| r.last()) {
            if *max >= g.ranks {
                self.error(&format!(
                    "ranks= names rank {max}, but the device has {} ranks",
                    g.ranks
                ));
                return Err(());
            }
        }
        if !trace && filter.ranks.is_none() {
            filter.ranks = Some(vec![0]);
        }
        let Some(sim) = v.sim.as_ref() else { return Err(()) };
        let comp = v.compiled();
        let run = hpmoe_sim::trace::Run {
            program: &v.program,
            tf: v.taskflow(),
            graph: &comp.graph,
            schedule: &comp.schedule,
            workload: &sim.sim.workload,
            result: &sim.sim.result,
        };
        let res = hpmoe_dsl::outfile::create(&path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            if trace {
                hpmoe_sim::trace::write(&mut w, &run, &filter)?;
            } else {
                hpmoe_sim::gantt::write(&mut w, &run, &filter)?;
            }
            w.flush()
        });
        if let Err(e) = res {
            self.error(&format!("cannot write `{}`: {e}", path.display()));
            return Err(());
        }
        let ranks = match &filter.ranks {
            Some(r) => format!(
                "ranks {}",
                r.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
            ),
            None => "all ranks".to_string(),
        };
        let what = if trace { "trace" } else { "chart" };
        let msg = format!(
            "wrote {what} {} ({} under {}, {ranks})",
            path.display(),
            v.taskflow().name,
            v.spec().policy.name()
        );
        self.say(&msg);
        Ok(())
    }

    /// `:dump` of a program whose routers take their logits from a taskflow: the routing is
    /// made from the logits its numerics compute (as `hpmoe run --numerics` does), the
    /// taskflow compiled again on it, and its tasks run in the schedule's order.
    fn dump_gated(&mut self, v: &View, opts: &hpmoe_sim::numerics::NumericsOptions) -> Result<(), ()> {
        let t0 = std::time::Instant::now();
        let rerouted = match hpmoe_sim::numerics::gates::route_by_gates(&v.program, Some(v.spec().policy), opts) {
            Ok(Some((q, gates))) => {
                for g in &gates {
                    self.say(&format!(
                        "routing {}: experts chosen from `{}.{}` as the program computes it",
                        g.routing, g.taskflow, g.tensor
                    ));
                }
                q
            }
            Ok(None) => (*v.program).clone(),
            Err(ds) => {
                let sources = Rc::clone(&v.checked.sources);
                self.diagnostics(&ds, hpmoe_dsl::diag::Dropped::NONE, &sources);
                return Err(());
            }
        };
        let tf = &rerouted.taskflows[v.tf];
        let comp = match rerouted.compile(tf, v.spec(), &hpmoe_dsl::driver::CompileOptions::default()) {
            Ok(c) => c,
            Err(ds) => {
                let sources = Rc::clone(&v.checked.sources);
                self.diagnostics(&ds, hpmoe_dsl::diag::Dropped::NONE, &sources);
                return Err(());
            }
        };
        let order = hpmoe_sim::numerics::schedule_order(&comp.graph, &comp.schedule);
        let res = hpmoe_sim::numerics::run(&rerouted, tf, &comp.graph, &comp.schedule, &order, opts);
        self.numerics_result(v, t0, res)
    }

    /// Reports a `:dump` run: its stage time, the numbers, races, and whether they passed.
    fn numerics_result(
        &mut self,
        v: &View,
        t0: std::time::Instant,
        res: Result<hpmoe_sim::numerics::NumericsReport, hpmoe_dsl::Diagnostic>,
    ) -> Result<(), ()> {
        self.stages.push(Stage {
            name: "numerics".to_string(),
            took: Some(t0.elapsed()),
        });
        let sources = Rc::clone(&v.checked.sources);
        match res {
            Ok(r) => {
                self.say(&format!(
                    "{} under {}: {} tasks",
                    v.taskflow().name,
                    v.spec().policy.name(),
                    r.tasks
                ));
                self.say_block(&r.text());
                if !r.races.is_empty() {
                    self.diagnostics(&r.races, hpmoe_dsl::diag::Dropped::NONE, &sources);
                }
                self.print_stages();
                if r.passed() {
                    Ok(())
                } else {
                    self.error("the numbers differ from the references (above)");
                    Err(())
                }
            }
            Err(d) => {
                self.diagnostics(&[d], hpmoe_dsl::diag::Dropped::NONE, &sources);
                Err(())
            }
        }
    }

    fn dump(&mut self, rest: &str) -> Result<(), ()> {
        let mut opts = hpmoe_sim::numerics::NumericsOptions::default();
        for a in words(rest) {
            if let Some(v) = a.strip_prefix("seed=") {
                match v.parse::<u64>() {
                    Ok(n) => opts.seed = n,
                    Err(_) => {
                        self.error(&format!("seed={v}: `{v}` is not a number"));
                        return Err(());
                    }
                }
            } else if a == "bf16" {
                opts.bf16_storage = true;
            } else if opts.dump.is_none() {
                opts.dump = Some(PathBuf::from(a));
            } else {
                self.error(&usage("dump"));
                return Err(());
            }
        }
        let Some(dir) = opts.dump.clone() else {
            self.error(&usage("dump"));
            return Err(());
        };
        // The tasks run in the simulated order; a configuration too large for numerics is
        // refused by `numerics::run` before it runs anything, so it is not simulated first.
        let v = self.view(false, false)?;
        // The dump writes `.npy` files there: none the program reads may be replaced.
        let read = crate::cli::paths::files_read(&v.checked.sources, v.program.program());
        if let Err(e) = crate::cli::paths::dump_not_over_inputs(&dir, &read) {
            self.error(&e.replacen("--dump", ":dump", 1));
            return Err(());
        }
        if !v.program.gated_routes().is_empty() {
            return self.dump_gated(&v, &opts);
        }
        let comp = v.compiled();
        let order = if hpmoe_sim::numerics::check_size(v.taskflow(), &comp.graph, &opts).is_err() {
            hpmoe_sim::numerics::schedule_order(&comp.graph, &comp.schedule)
        } else {
            let checked = Rc::clone(&v.checked);
            let program = Rc::clone(&v.program);
            let sim = self.simulated(&checked, &program.taskflows[v.tf], &v.entry, false)?;
            sim.start_order()
        };
        let t0 = std::time::Instant::now();
        let res = hpmoe_sim::numerics::run(&v.program, v.taskflow(), &comp.graph, &comp.schedule, &order, &opts);
        self.numerics_result(&v, t0, res)
    }
}

/// What a view command works on.
#[derive(Debug)]
pub(crate) struct View {
    pub checked: Rc<Checked>,
    pub program: Rc<hpmoe_dsl::driver::Checked>,
    pub tf: usize,
    pub compiled: Rc<hpmoe_dsl::driver::Compiled>,
    pub spec: PolicySpec,
    pub entry: Rc<CompiledEntry>,
    pub sim: Option<Rc<SimRun>>,
}

impl View {
    pub fn taskflow(&self) -> &Taskflow {
        &self.program.taskflows[self.tf]
    }
    pub fn compiled(&self) -> &hpmoe_dsl::driver::Compiled {
        &self.compiled
    }
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }
}

/// `1 taskflow (moe_ffn), 5 op calls, 1 routing, device ascend_a3 with 8 ranks`.
pub(crate) fn summary(p: &Program) -> String {
    let nodes: usize = p.taskflows.iter().map(|t| t.nodes.len()).sum();
    let names: Vec<&str> = p.taskflows.iter().map(|t| t.name.as_str()).collect();
    let plural = |n: usize, w: &str| {
        if n == 1 {
            format!("{n} {w}")
        } else {
            format!("{n} {w}s")
        }
    };
    format!(
        "{} ({}), {}, {}, device {} with {} ranks",
        plural(p.taskflows.len(), "taskflow"),
        names.join(", "),
        plural(nodes, "op call"),
        plural(p.routes.len(), "routing"),
        p.device.profile,
        p.device.ranks()
    )
}

/// Two reports side by side and the speedup of the second over the first.
fn compare_table(tf: &str, a: &hpmoe_sim::report::Report, b: &hpmoe_sim::report::Report) -> String {
    let mut s = format!("{tf}: {} vs {}\n", a.policy, b.policy);
    let w = a.policy.len().max(b.policy.len()).max(12);
    s.push_str(&format!("  {:<28} {:>w$} {:>w$}\n", "", a.policy, b.policy));
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    let us = |x: f64| format!("{:.1}", x * 1e6);
    let rows: Vec<(&str, String, String)> = vec![
        ("latency (us)", us(a.latency), us(b.latency)),
        ("lower bound (us)", us(a.bound), us(b.bound)),
        ("efficiency", pct(a.efficiency), pct(b.efficiency)),
        ("AIC busy", pct(a.aic_busy), pct(b.aic_busy)),
        ("AIV busy", pct(a.aiv_busy), pct(b.aiv_busy)),
        ("links busy", pct(a.link_busy), pct(b.link_busy)),
        ("exposed comm, mean (us)", us(a.exposed_mean()), us(b.exposed_mean())),
        ("L2 hit rate", pct(a.l2_hit_rate()), pct(b.l2_hit_rate())),
        ("tasks", a.tasks.to_string(), b.tasks.to_string()),
    ];
    for (name, x, y) in rows {
        s.push_str(&format!("  {name:<28} {x:>w$} {y:>w$}\n"));
    }
    s.push_str(&hpmoe_sim::report::Comparison::new(a, b).human());
    s
}

/// What tells one diagnostic from another across two checks of a session that grew at its
/// end: its code, message and where its primary label points (a redefinition in place moves
/// what follows it, whose diagnostics are then shown once more).
pub(crate) type DiagKey = (Code, String, Option<(u32, u32, u32)>);

pub(crate) fn diag_key(d: &Diagnostic) -> DiagKey {
    let at = d
        .labels
        .iter()
        .find(|l| l.primary)
        .map(|l| (l.span.file.0, l.span.lo, l.span.hi));
    (d.code, d.message.clone(), at)
}
