//! The search behind `hpmoe tune`: a program's tunable choices, the candidates of a seeded
//! search over them, and the simulator as the cost model.
//!
//! **The search space** of one taskflow, built from the checked program and the root file's
//! syntax tree. Per op call written as a statement of the taskflow (a nested call keeps its
//! tiles):
//!
//! - its tile sizes: per index variable, the current size `s` and `s * 2^j` for `j` in
//!   `-2..=2` (only exact halvings), within `1..=extent` (a size above the extent is the
//!   extent; a ragged received dimension is bounded by the next power of two above its mean
//!   rows per local expert); the cartesian product of the variables, keeping only the tiles
//!   the checker accepts (buffer fit, E0701/E0702);
//! - `order(ratr)` or not, on a communication call;
//! - its `priority(N)`, in {current, 0, 1, 2}, under `interleaved` (the one list scheduler
//!   with a ready set to order).
//!
//! And every option of the selected policy ([`hpmoe_dsl::policy::options_of`], read from the
//! `OPTIONS` table) but the model switches in [`NOT_SEARCHED`], over values from its type: both
//! booleans, every name of a choice, `{0.25, 0.5, 0.75, 1}` within a float's range, the
//! minimum and the powers of two from 4 below the rank's vector-core count for an integer
//! (the integer option counts vector cores). The first value of every coordinate is the
//! program's own.
//!
//! **Candidates** (`candidates`): number 0 is the program's own configuration; then, in turn,
//! one move of a single coordinate (all of them, in an order shuffled by the seed) and a
//! random move of two or three coordinates at once (SplitMix64 from the seed); duplicates
//! are skipped. The list depends only on the program, the settings and the seed, and a larger
//! budget extends it (a budget of N evaluates its first N). Results are ranked by (latency,
//! candidate number), so the outcome does not depend on the number of threads, and the best
//! is never worse than the program's own configuration (which is always evaluated).
//!
//! **A candidate is evaluated** as `hpmoe run` would run the file written for it: its source
//! (the root file's tree with the candidate's annotations and schedule options, printed by
//! the canonical formatter, comments kept) is checked, compiled and simulated. The best
//! candidate's text is exactly the text that was evaluated.

use crate::shard::{self, Shard};
use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{Checked, CompileOptions};
use hpmoe_dsl::ir::{Program, Taskflow, Value, VarRange};
use hpmoe_dsl::policy::{OptionType, Policy};
use hpmoe_dsl::syntax::ast::{self, Annot, Expr, ExprKind, Field, FlowStmtKind, Ident, ItemKind};
use hpmoe_dsl::syntax::lexer::Comment;
use hpmoe_dsl::syntax::token::{FileId, Span};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::sim::SimOptions;
use rayon::prelude::*;
use serde_json::{json, Value as J};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The most memory the list of candidates of a search may take ([`Tuner::check_budget`]).
pub const CANDIDATE_MEMORY: u128 = 1 << 30;

/// The bytes a candidate of `coords` coordinates takes in the list and the set of seen ones.
fn candidate_bytes(coords: usize) -> u128 {
    2 * (2 * coords as u128 + 24 + 16) + 32
}

/// Policy options that switch a part of the device model on or off rather than choose how to
/// schedule (leaving out kernel launches is not a schedule): never searched.
pub const NOT_SEARCHED: &[&str] = &["launch_overhead"];

/// What a coordinate of the search sets.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The tile sizes of the call written as statement `stmt` of the taskflow.
    Tile { stmt: usize, call: String },
    /// `order(ratr)` on a communication call.
    Order { stmt: usize, call: String },
    /// `priority(N)` of a call.
    Priority { stmt: usize, call: String },
    /// A policy option.
    Option { name: &'static str },
}

/// One value of a coordinate.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// Tile size per index variable (every variable of the call, in its order).
    Tile(Vec<(String, u64)>),
    Order(bool),
    Priority(i64),
    Option(Value),
}

/// A coordinate: what it sets and its values, the program's own first.
#[derive(Clone, Debug)]
pub struct Coord {
    pub target: Target,
    pub values: Vec<Choice>,
}

/// What a search needs besides the program: the settings its parts must agree on.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub set: Vec<String>,
    pub device: Option<String>,
    pub routing: Option<String>,
    pub allow_path: Vec<PathBuf>,
    pub taskflow: Option<String>,
    pub seed: u64,
    pub max_tasks: u64,
}

impl Settings {
    pub fn check_options(&self) -> Result<Options, String> {
        let overrides = self
            .set
            .iter()
            .map(|s| hpmoe_dsl::check::Override::parse(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--set {e}"))?;
        Ok(Options {
            overrides,
            device: self.device.clone(),
            routing: self.routing.clone(),
            allow_paths: self.allow_path.clone(),
        })
    }

    pub fn to_json(&self) -> J {
        json!({
            "set": self.set,
            "device": self.device,
            "routing": self.routing,
            "allow_path": self.allow_path.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "taskflow": self.taskflow,
            "seed": self.seed,
            "max_tasks": self.max_tasks,
        })
    }

    pub fn from_json(v: &J) -> Result<Settings, String> {
        let strings = |k: &str| -> Result<Vec<String>, String> {
            v[k].as_array()
                .ok_or(format!("settings.{k} is not a list"))?
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or(format!("settings.{k} holds a non-string"))
                })
                .collect()
        };
        Ok(Settings {
            set: strings("set")?,
            device: v["device"].as_str().map(str::to_string),
            routing: v["routing"].as_str().map(str::to_string),
            allow_path: strings("allow_path")?.into_iter().map(PathBuf::from).collect(),
            taskflow: v["taskflow"].as_str().map(str::to_string),
            seed: v["seed"].as_u64().ok_or("settings.seed is missing")?,
            max_tasks: v["max_tasks"].as_u64().ok_or("settings.max_tasks is missing")?,
        })
    }
}

/// A failure to set up a search: diagnostics already rendered (exit 1) or a message.
#[derive(Debug)]
pub enum SetupError {
    /// The program does not check; the diagnostics and their sources.
    Check(hpmoe_dsl::diag::Diagnostics, SourceMap),
    Message(String),
}

/// A program ready to be searched.
pub struct Tuner {
    /// The file as given (shown in outputs).
    pub file: PathBuf,
    name: String,
    dir: Option<PathBuf>,
    pub source: String,
    ast: ast::File,
    comments: Vec<Comment>,
    opts: Options,
    pub settings: Settings,
    pub taskflow: String,
    pub policy: Policy,
    pub coords: Vec<Coord>,
    /// The forward of the tuned taskflow when it is derived by `grad`: the search ran on the
    /// program with its `grad` declarations written out, and so does the written file.
    pub expanded_from: Option<String>,
    /// The files the program read besides its own (imports, routing `.npy` files): the best
    /// configuration is never written over one of them.
    pub read: Vec<PathBuf>,
}

/// One evaluated candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub index: usize,
    /// The latency in microseconds, or the first diagnostic.
    pub latency_us: Result<f64, String>,
}

fn first_message(ds: &[hpmoe_dsl::diag::Diagnostic]) -> String {
    match ds.first() {
        Some(d) => format!("{}: {}", d.code, d.message),
        None => "failed without a diagnostic".to_string(),
    }
}

fn ident(name: &str, span: Span) -> Ident {
    Ident {
        name: name.to_string(),
        span,
    }
}

fn int_expr(i: i64, span: Span) -> Expr {
    let lit = Expr {
        kind: ExprKind::Int(i.unsigned_abs()),
        span,
    };
    if i < 0 {
        Expr {
            kind: ExprKind::Neg(Box::new(lit)),
            span,
        }
    } else {
        lit
    }
}

fn value_expr(v: &Value, span: Span) -> Expr {
    let kind = match v {
        Value::Int(i) => return int_expr(*i, span),
        Value::Float(f) => ExprKind::Float(*f),
        Value::Bool(b) => ExprKind::Name(if *b { "true" } else { "false" }.into()),
        Value::Str(s) => ExprKind::Str(s.as_str().into()),
        Value::Name(n) => ExprKind::Name(n.as_str().into()),
    };
    Expr { kind, span }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => format!("{s:?}"),
        Value::Name(n) => n.clone(),
    }
}

/// SplitMix64: a small, fixed generator (the same one the routings use).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The sizes a tile variable is searched over: the current one first.
fn tile_sizes(current: u64, extent: Option<u64>, ragged_cap: u64) -> Vec<u64> {
    let mut out = vec![current];
    let cap = match extent {
        Some(e) => e.max(1),
        None => ragged_cap.max(current),
    };
    if current == u64::MAX || cap <= 1 {
        return out;
    }
    for j in -2i32..=2 {
        let v = if j < 0 {
            let d = 1u64 << (-j);
            if !current.is_multiple_of(d) {
                continue;
            }
            current / d
        } else {
            current.saturating_mul(1 << j)
        };
        let v = v.clamp(1, cap);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

fn option_values(ty: &OptionType, current: &Value, aiv_cores: u32) -> Vec<Value> {
    let mut out = vec![current.clone()];
    let mut push = |v: Value| {
        if !out.contains(&v) {
            out.push(v);
        }
    };
    match ty {
        OptionType::Bool => {
            push(Value::Bool(false));
            push(Value::Bool(true));
        }
        OptionType::OneOf(names) => {
            for n in names.iter() {
                push(Value::Name(n.to_string()));
            }
        }
        OptionType::Float { .. } => {
            for f in [0.25, 0.5, 0.75, 1.0] {
                let v = Value::Float(f);
                if ty.check_range(&v).is_ok() {
                    push(v);
                }
            }
        }
        OptionType::Int { min, max } => {
            push(Value::Int(*min));
            let mut p: i64 = 4;
            while p < i64::from(aiv_cores) && p <= *max {
                if p >= *min {
                    push(Value::Int(p));
                }
                p *= 2;
            }
        }
    }
    out
}

impl Tuner {
    /// Reads and checks the program and builds its search space (checking every candidate
    /// tile of every call, on `pool`).
    pub fn new(file: &Path, settings: Settings, pool: &rayon::ThreadPool) -> Result<Tuner, SetupError> {
        let mut source = hpmoe_dsl::check::read_source(file)
            .map_err(|e| SetupError::Message(format!("cannot read `{}`: {e}", file.display())))?;
        let opts = settings.check_options().map_err(SetupError::Message)?;
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| file.display().to_string());
        let dir = file.parent().map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d.to_path_buf()
            }
        });
        let mut sources = SourceMap::new();
        let outcome = hpmoe_dsl::driver::check_text(&name, &source, dir.as_deref(), &opts, &mut sources);
        let Some(mut p) = outcome.checked else {
            return Err(SetupError::Check(outcome.diagnostics, sources));
        };
        let read = crate::cli::paths::files_read(&sources, p.program());
        // A backward derived by `grad` has no calls of its own in the file: the search runs
        // on the program with its `grad` declarations written out as source (what
        // `hpmoe fmt --expand-grad` writes), whose calls are the derived ones.
        let mut expanded_from = None;
        if let Some(g) = settings
            .taskflow
            .as_ref()
            .and_then(|n| p.grads.iter().find(|g| &g.taskflow == n))
        {
            let forward = g.forward.clone();
            let text = hpmoe_dsl::driver::expand_grads(&p, &source).map_err(|ds| {
                SetupError::Message(format!("cannot write the derived backward out: {}", first_message(&ds)))
            })?;
            let mut sources = SourceMap::new();
            let outcome = hpmoe_dsl::driver::check_text(&name, &text, dir.as_deref(), &opts, &mut sources);
            let Some(q) = outcome.checked else {
                return Err(SetupError::Check(outcome.diagnostics, sources));
            };
            (p, source, expanded_from) = (q, text, Some(forward));
        }
        let tf = match &settings.taskflow {
            Some(n) => p
                .select_taskflow(n)
                .map_err(|d| SetupError::Message(first_message(&[d])))?,
            None => p
                .taskflows
                .first()
                .ok_or_else(|| SetupError::Message("the program has no taskflow to tune".into()))?,
        };
        let (ast, _, comments) = hpmoe_dsl::syntax::parse_text(&source, FileId(0));
        let mut t = Tuner {
            file: file.to_path_buf(),
            name,
            dir,
            source,
            ast,
            comments,
            opts,
            taskflow: tf.name.clone(),
            policy: p.select_policy(&tf.name, None).policy,
            expanded_from,
            read,
            settings,
            coords: Vec::new(),
        };
        t.coords = t.space(&p, tf, pool)?;
        Ok(t)
    }

    fn ast_taskflow(&self) -> Option<&ast::Taskflow> {
        self.ast.items.iter().find_map(|it| match &it.kind {
            ItemKind::Taskflow(t) if t.name.name == self.taskflow => Some(&**t),
            _ => None,
        })
    }

    fn space(&self, p: &Checked, tf: &Taskflow, pool: &rayon::ThreadPool) -> Result<Vec<Coord>, SetupError> {
        let program: &Program = p;
        let Some(atf) = self.ast_taskflow() else {
            return Err(SetupError::Message(format!(
                "taskflow `{}` is not defined in `{}` itself; tune the file that defines it",
                self.taskflow,
                self.file.display()
            )));
        };
        let mut coords = Vec::new();
        let mut tile_coords: Vec<(usize, Coord)> = Vec::new();
        for (si, st) in atf.body.iter().enumerate() {
            let value = match &st.kind {
                FlowStmtKind::Let { value, .. } | FlowStmtKind::Return { value } => value,
            };
            if !matches!(value.kind, ExprKind::Call { .. }) {
                continue;
            }
            let Some(node) = tf
                .nodes
                .iter()
                .find(|n| n.span.file == tf.span.file && n.span.lo == value.span.lo && n.span.hi == value.span.hi)
            else {
                continue;
            };
            let call = node.name.clone();
            let op = program.op(node.op);
            // Tiles.
            let mut per_var: Vec<Vec<u64>> = Vec::new();
            for (var, size) in &node.tile {
                let mut extent = None;
                let mut ragged = None;
                for v in node.body.vars.iter().filter(|v| &v.name == var) {
                    match v.range {
                        VarRange::Fixed { lo, hi } => {
                            let e = u64::try_from(i128::from(hi) - i128::from(lo)).unwrap_or(0);
                            extent = Some(extent.map_or(e, |x: u64| x.max(e)));
                        }
                        VarRange::Recv(r) | VarRange::GroupRows { route: r, .. } => ragged = Some(r),
                    }
                }
                let cap = ragged.map_or(1, |r| {
                    let rs = program.route(r);
                    let rows = rs
                        .ranks
                        .saturating_mul(rs.tokens)
                        .saturating_mul(rs.topk)
                        .div_ceil(rs.experts.max(1));
                    rows.max(1).next_power_of_two()
                });
                per_var.push(tile_sizes(*size, if ragged.is_some() { None } else { extent }, cap));
            }
            let mut combos: Vec<Vec<u64>> = vec![Vec::new()];
            for vals in &per_var {
                combos = combos
                    .into_iter()
                    .flat_map(|c| {
                        vals.iter().map(move |v| {
                            let mut c = c.clone();
                            c.push(*v);
                            c
                        })
                    })
                    .collect();
            }
            if combos.len() > 1 {
                let names: Vec<String> = node.tile.iter().map(|(n, _)| n.clone()).collect();
                let values: Vec<Choice> = combos
                    .into_iter()
                    .map(|c| Choice::Tile(names.iter().cloned().zip(c).collect()))
                    .collect();
                tile_coords.push((
                    si,
                    Coord {
                        target: Target::Tile {
                            stmt: si,
                            call: call.clone(),
                        },
                        values,
                    },
                ));
            }
            if op.is_comm {
                let cur = node.order.iter().any(|o| o == "ratr");
                coords.push(Coord {
                    target: Target::Order {
                        stmt: si,
                        call: call.clone(),
                    },
                    values: vec![Choice::Order(cur), Choice::Order(!cur)],
                });
            }
            if self.policy == Policy::Interleaved {
                let mut vals = vec![node.priority];
                for v in [0, 1, 2] {
                    if !vals.contains(&v) {
                        vals.push(v);
                    }
                }
                coords.push(Coord {
                    target: Target::Priority { stmt: si, call },
                    values: vals.into_iter().map(Choice::Priority).collect(),
                });
            }
        }
        // Keep only the tiles the checker accepts (the program's own always does).
        for (_, c) in &mut tile_coords {
            let ok: Vec<bool> = pool.install(|| {
                c.values
                    .par_iter()
                    .enumerate()
                    .map(|(k, v)| {
                        k == 0 || {
                            let text = self.text_with(&[(&*c, v)]);
                            self.check(&text).is_ok()
                        }
                    })
                    .collect()
            });
            let mut keep = ok.iter();
            c.values.retain(|_| *keep.next().unwrap_or(&false));
        }
        let mut all: Vec<Coord> = tile_coords
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| c.values.len() > 1)
            .collect();
        all.extend(coords);
        // Policy options.
        let sc = program
            .schedule_for(&tf.name)
            .filter(|s| s.policy == self.policy.name());
        let decl = program.policy_decl(self.policy.name());
        for def in hpmoe_dsl::policy::options_of(self.policy) {
            if NOT_SEARCHED.contains(&def.name) {
                continue;
            }
            let cur = sc
                .and_then(|s| s.options.get(def.name).cloned())
                .or_else(|| decl.and_then(|d| d.defaults.iter().find(|(n, _)| n == def.name).map(|(_, v)| v.clone())));
            let Some(cur) = cur else { continue };
            let vals = option_values(&def.ty, &cur, program.device.aiv_cores());
            if vals.len() > 1 {
                all.push(Coord {
                    target: Target::Option { name: def.name },
                    values: vals.into_iter().map(Choice::Option).collect(),
                });
            }
        }
        Ok(all)
    }

    /// Checks a candidate's text.
    fn check(&self, text: &str) -> Result<Checked, String> {
        let mut sources = SourceMap::new();
        let outcome = hpmoe_dsl::driver::check_text(&self.name, text, self.dir.as_deref(), &self.opts, &mut sources);
        outcome
            .checked
            .ok_or_else(|| first_message(outcome.diagnostics.as_slice()))
    }

    /// The source of a candidate (choice indices, one per coordinate).
    pub fn text(&self, cand: &[u16]) -> String {
        let changes: Vec<(&Coord, &Choice)> = self
            .coords
            .iter()
            .zip(cand)
            .filter(|(_, &k)| k != 0)
            .map(|(c, &k)| (c, &c.values[usize::from(k)]))
            .collect();
        self.text_with(&changes)
    }

    /// The root file with `changes` (a coordinate and its new value) applied, formatted; the
    /// text changes only where a value differs from the coordinate's first (the program's).
    fn text_with(&self, changes: &[(&Coord, &Choice)]) -> String {
        let mut file = self.ast.clone();
        let tf_name = self.taskflow.clone();
        let mut options: Vec<(&'static str, Value)> = Vec::new();
        if let Some(atf) = file.items.iter_mut().find_map(|it| match &mut it.kind {
            ItemKind::Taskflow(t) if t.name.name == tf_name => Some(t),
            _ => None,
        }) {
            for (coord, choice) in changes {
                match (&coord.target, choice) {
                    (Target::Tile { stmt, .. }, Choice::Tile(sizes)) => {
                        if let (Some(st), Some(Choice::Tile(cur))) = (atf.body.get_mut(*stmt), coord.values.first()) {
                            set_tiles(st, sizes, cur);
                        }
                    }
                    (Target::Order { stmt, .. }, Choice::Order(on)) => {
                        if let Some(st) = atf.body.get_mut(*stmt) {
                            set_order(st, *on);
                        }
                    }
                    (Target::Priority { stmt, .. }, Choice::Priority(p)) => {
                        if let Some(st) = atf.body.get_mut(*stmt) {
                            set_priority(st, *p);
                        }
                    }
                    (Target::Option { name }, Choice::Option(v)) => options.push((name, v.clone())),
                    _ => {}
                }
            }
        }
        if !options.is_empty() {
            set_options(&mut file, &tf_name, self.policy, &options, self.source.len());
        }
        hpmoe_dsl::syntax::fmt::format_file(&file, &self.comments, &self.source)
    }

    /// Checks, compiles and simulates a candidate's text.
    pub fn evaluate_text(&self, text: &str) -> Result<f64, String> {
        let p = self.check(text)?;
        let tf = p.select_taskflow(&self.taskflow).map_err(|d| first_message(&[d]))?;
        let spec = p.select_policy(&tf.name, None);
        let opts = CompileOptions {
            max_tasks: self.settings.max_tasks,
            verify: true,
        };
        let ran = hpmoe_sim::pipeline::run(
            &p,
            tf,
            &spec,
            &opts,
            SimOptions::default(),
            &mut hpmoe_dsl::timing::Clock::new(),
        )
        .map_err(|ds| first_message(&ds))?;
        Ok(ran.report.latency * 1e6)
    }

    /// How many distinct candidates the search space holds (saturating).
    pub fn space_size(&self) -> u128 {
        self.coords
            .iter()
            .fold(1u128, |n, c| n.saturating_mul(c.values.len().max(1) as u128))
    }

    /// Refuses, before any is listed, a budget whose list of candidates would take more than
    /// [`CANDIDATE_MEMORY`]: each candidate is a value per coordinate, held twice (the list
    /// and the set that skips duplicates), and a search lists `min(budget, space size)` of
    /// them.
    pub fn check_budget(&self, budget: usize) -> Result<(), String> {
        let listed = (budget as u128).min(self.space_size());
        let per = candidate_bytes(self.coords.len());
        if listed.saturating_mul(per) <= CANDIDATE_MEMORY {
            return Ok(());
        }
        let most = CANDIDATE_MEMORY / per;
        Err(format!(
            "a budget of {budget} candidates of {} coordinates would list {listed} of them, {} MiB, over the {} MiB a \
             search may hold; give --budget {most} or less",
            self.coords.len(),
            listed.saturating_mul(per) >> 20,
            CANDIDATE_MEMORY >> 20
        ))
    }

    /// The candidates of the search, `limit` at most (see the module doc).
    pub fn candidates(&self, limit: usize) -> Vec<Vec<u16>> {
        let n = self.coords.len();
        let zero = vec![0u16; n];
        let mut out = vec![zero.clone()];
        let mut seen: BTreeSet<Vec<u16>> = BTreeSet::new();
        seen.insert(zero.clone());
        let mut rng = Rng(self.settings.seed ^ 0x7475_6e65);
        let mut moves: Vec<(usize, u16)> = Vec::new();
        for (c, coord) in self.coords.iter().enumerate() {
            for k in 1..coord.values.len() {
                moves.push((c, k as u16));
            }
        }
        for i in (1..moves.len()).rev() {
            let j = rng.below(i + 1);
            moves.swap(i, j);
        }
        let varied: Vec<usize> = (0..n).filter(|&c| self.coords[c].values.len() > 1).collect();
        let mut next_move = 0;
        let mut misses = 0usize;
        let mut turn = 0u64;
        while out.len() < limit && !varied.is_empty() {
            let cand = if turn.is_multiple_of(2) && next_move < moves.len() {
                let (c, k) = moves[next_move];
                next_move += 1;
                let mut v = zero.clone();
                v[c] = k;
                v
            } else {
                let mut v = zero.clone();
                let k = (2 + rng.below(2)).min(varied.len());
                for _ in 0..k {
                    let c = varied[rng.below(varied.len())];
                    v[c] = 1 + rng.below(self.coords[c].values.len() - 1) as u16;
                }
                v
            };
            turn += 1;
            if seen.insert(cand.clone()) {
                out.push(cand);
                misses = 0;
            } else {
                misses += 1;
                // The space is (nearly) exhausted.
                if misses > 256 && next_move >= moves.len() {
                    break;
                }
            }
        }
        out
    }

    /// What a candidate changes, `call: annotation` and `option: value`, `; `-separated.
    pub fn describe(&self, cand: &[u16]) -> String {
        let mut parts = Vec::new();
        for (c, &k) in self.coords.iter().zip(cand) {
            if k == 0 {
                continue;
            }
            let v = &c.values[usize::from(k)];
            parts.push(match (&c.target, v) {
                (Target::Tile { call, .. }, Choice::Tile(t)) => {
                    let cur = match c.values.first() {
                        Some(Choice::Tile(x)) => x.clone(),
                        _ => Vec::new(),
                    };
                    let changed: Vec<String> = t
                        .iter()
                        .zip(&cur)
                        .filter(|(a, b)| a.1 != b.1)
                        .map(|((n, s), _)| format!("{n}: {s}"))
                        .collect();
                    format!("{call}: tile({})", changed.join(", "))
                }
                (Target::Order { call, .. }, Choice::Order(true)) => format!("{call}: order(ratr)"),
                (Target::Order { call, .. }, Choice::Order(false)) => format!("{call}: no order(ratr)"),
                (Target::Priority { call, .. }, Choice::Priority(p)) => format!("{call}: priority({p})"),
                (Target::Option { name }, Choice::Option(v)) => format!("{name}: {}", value_text(v)),
                _ => String::new(),
            });
        }
        if parts.is_empty() {
            "the file's own configuration".to_string()
        } else {
            parts.join("; ")
        }
    }

    /// The search space as JSON (for outputs).
    pub fn space_json(&self) -> J {
        J::Array(
            self.coords
                .iter()
                .map(|c| {
                    let (what, call) = match &c.target {
                        Target::Tile { call, .. } => ("tile", Some(call.clone())),
                        Target::Order { call, .. } => ("order", Some(call.clone())),
                        Target::Priority { call, .. } => ("priority", Some(call.clone())),
                        Target::Option { name } => ("option", Some(name.to_string())),
                    };
                    json!({"kind": what, "name": call, "values": c.values.len()})
                })
                .collect(),
        )
    }

    /// The fingerprint parts must share: the program text, the settings and the budget (not
    /// the path the file was named by).
    pub fn fingerprint(&self, budget: usize) -> String {
        let s = self.part_settings(budget).to_string();
        shard::fingerprint(&[self.source.as_bytes(), s.as_bytes()])
    }

    pub fn part_settings(&self, budget: usize) -> J {
        let mut s = self.settings.to_json();
        if let J::Object(m) = &mut s {
            m.insert("budget".into(), J::from(budget));
        }
        s
    }
}

fn set_tiles(st: &mut ast::FlowStmt, sizes: &[(String, u64)], current: &[(String, u64)]) {
    let span = st.span;
    let idx = match st.annots.iter().position(|a| matches!(a, Annot::Tile { .. })) {
        Some(i) => i,
        None => {
            st.annots.insert(
                0,
                Annot::Tile {
                    fields: Vec::new(),
                    span,
                },
            );
            0
        }
    };
    if let Annot::Tile { fields, .. } = &mut st.annots[idx] {
        for (name, size) in sizes {
            let cur = current.iter().find(|(n, _)| n == name).map(|(_, s)| *s);
            if cur == Some(*size) {
                continue;
            }
            let value = int_expr(i64::try_from(*size).unwrap_or(i64::MAX), span);
            match fields.iter_mut().find(|f| f.name.name == *name) {
                Some(f) => {
                    f.value = Expr {
                        span: f.value.span,
                        ..value
                    }
                }
                None => fields.push(Field {
                    docs: Vec::new(),
                    name: ident(name, span),
                    value,
                    unit: None,
                    span,
                }),
            }
        }
    }
}

fn set_order(st: &mut ast::FlowStmt, on: bool) {
    let span = st.span;
    if on {
        match st.annots.iter_mut().find(|a| matches!(a, Annot::Order { .. })) {
            Some(Annot::Order { hints, .. }) => {
                if !hints.iter().any(|h| h.is("ratr")) {
                    hints.push(ident("ratr", span));
                }
            }
            _ => st.annots.push(Annot::Order {
                hints: vec![ident("ratr", span)],
                span,
            }),
        }
    } else {
        for a in &mut st.annots {
            if let Annot::Order { hints, .. } = a {
                hints.retain(|h| !h.is("ratr"));
            }
        }
        st.annots
            .retain(|a| !matches!(a, Annot::Order { hints, .. } if hints.is_empty()));
    }
}

fn set_priority(st: &mut ast::FlowStmt, p: i64) {
    let span = st.span;
    st.annots.retain(|a| !matches!(a, Annot::Priority { .. }));
    if p != 0 {
        st.annots.push(Annot::Priority {
            value: int_expr(p, span),
            span,
        });
    }
}

/// Sets policy options of the taskflow's schedule: in its own `schedule NAME = ...` item, or
/// in a new one at the end of the file (a schedule for every taskflow stays as it is for the
/// others).
fn set_options(file: &mut ast::File, tf: &str, policy: Policy, options: &[(&'static str, Value)], end: usize) {
    let own = file.items.iter_mut().find_map(|it| match &mut it.kind {
        ItemKind::Schedule(s) if s.taskflow.as_ref().is_some_and(|t| t.name == tf) => Some(s),
        _ => None,
    });
    let sched = match own {
        Some(s) => s,
        None => {
            // A new item carries over the options of a schedule for every taskflow.
            let base: Vec<Field> = file
                .items
                .iter()
                .find_map(|it| match &it.kind {
                    ItemKind::Schedule(s) if s.taskflow.is_none() && s.policy.name == policy.name() => {
                        Some(s.options.clone())
                    }
                    _ => None,
                })
                .unwrap_or_default();
            let end = u32::try_from(end).unwrap_or(u32::MAX);
            let span = Span::new(FileId(0), end, end);
            let opts: Vec<Field> = base.into_iter().map(|f| Field { span, ..f }).collect();
            file.items.push(ast::Item {
                docs: Vec::new(),
                kind: ItemKind::Schedule(Box::new(ast::ScheduleDecl {
                    taskflow: Some(ident(tf, span)),
                    policy: ident(policy.name(), span),
                    options: opts,
                })),
                span,
            });
            match file.items.last_mut().map(|i| &mut i.kind) {
                Some(ItemKind::Schedule(s)) => s,
                _ => return,
            }
        }
    };
    for (name, v) in options {
        match sched.options.iter_mut().find(|f| f.name.name == *name) {
            Some(f) => f.value = value_expr(v, f.value.span),
            None => {
                let span = sched.options.last().map_or(sched.policy.span, |f| f.span);
                let at = Span::new(span.file, span.hi, span.hi);
                sched.options.push(Field {
                    docs: Vec::new(),
                    name: ident(name, at),
                    value: value_expr(v, at),
                    unit: None,
                    span: at,
                });
            }
        }
    }
}

/// Evaluates the candidates with the given indices on `pool` in batches of `batch`, calling
/// `tick` after each; stops between batches once `deadline` has passed. Outcomes in index
/// order.
pub fn evaluate(
    t: &Tuner,
    cands: &[Vec<u16>],
    indices: &[usize],
    pool: &rayon::ThreadPool,
    batch: usize,
    deadline: Option<std::time::Instant>,
    tick: &(dyn Fn() + Sync),
) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(indices.len());
    for chunk in indices.chunks(batch.max(1)) {
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        let res: Vec<Outcome> = pool.install(|| {
            chunk
                .par_iter()
                .map(|&i| {
                    let text = t.text(&cands[i]);
                    let o = Outcome {
                        index: i,
                        latency_us: t.evaluate_text(&text),
                    };
                    tick();
                    o
                })
                .collect()
        });
        out.extend(res);
    }
    out
}

/// The evaluated candidates that ran, best first: by (latency, candidate number).
pub fn ranking(outcomes: &[Outcome]) -> Vec<(usize, f64)> {
    let mut ok: Vec<(usize, f64)> = outcomes
        .iter()
        .filter_map(|o| o.latency_us.as_ref().ok().map(|l| (o.index, *l)))
        .collect();
    ok.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    ok
}

/// A shard's part file: the header and the outcome of every candidate it evaluated.
pub fn part(t: &Tuner, budget: usize, candidates: usize, s: Shard, outcomes: &[Outcome]) -> J {
    let mut doc = shard::header("tune", s, &t.fingerprint(budget), t.part_settings(budget));
    if let J::Object(m) = &mut doc {
        m.insert("candidates".into(), J::from(candidates));
        m.insert(
            "results".into(),
            J::Array(
                outcomes
                    .iter()
                    .map(|o| match &o.latency_us {
                        Ok(l) => json!({"index": o.index, "latency_us": shard::num(*l)}),
                        Err(e) => json!({"index": o.index, "error": e}),
                    })
                    .collect(),
            ),
        );
    }
    doc
}

/// The outcomes of checked part files, in candidate order; every candidate below the count
/// the parts agree on must be present once.
pub fn merge(parts: &[J]) -> Result<(usize, usize, Vec<Outcome>), String> {
    let first = parts.first().ok_or("no part files")?;
    let n = first["candidates"].as_u64().ok_or("a part without a candidate count")? as usize;
    let budget = first["settings"]["budget"].as_u64().ok_or("a part without a budget")? as usize;
    // Every candidate is one result of one part: the count is checked against the results
    // the files hold before anything of that size is allocated.
    let given: usize = parts.iter().map(|p| p["results"].as_array().map_or(0, Vec::len)).sum();
    if given != n {
        return Err(format!("the parts hold {given} results for {n} candidates"));
    }
    let mut got: Vec<Option<Outcome>> = vec![None; n];
    for p in parts {
        if p["candidates"].as_u64() != Some(n as u64) {
            return Err("the parts list different numbers of candidates".into());
        }
        let s = Shard {
            index: p["shard"].as_u64().unwrap_or(0) as usize,
            count: p["shards"].as_u64().unwrap_or(1) as usize,
        };
        for r in p["results"].as_array().ok_or("a part without results")? {
            let i = r["index"].as_u64().ok_or("a result without an index")? as usize;
            if i >= n || !s.owns(i) || got[i].is_some() {
                return Err(format!(
                    "shard {} of {} holds candidate {i}, which is not its own",
                    s.index, s.count
                ));
            }
            let latency_us = match r.get("latency_us") {
                Some(v) => Ok(shard::read_measure(v, "a latency").map_err(|e| format!("candidate {i}: {e}"))?),
                // Shown to people as it is: its control characters escaped.
                None => Err(hpmoe_dsl::diag::shown(r["error"].as_str().ok_or(format!(
                    "candidate {i}: a result with neither a latency nor an error"
                ))?)),
            };
            got[i] = Some(Outcome { index: i, latency_us });
        }
    }
    let missing = got.iter().filter(|g| g.is_none()).count();
    if missing > 0 {
        return Err(format!("the parts lack {missing} of the {n} candidates"));
    }
    Ok((budget, n, got.into_iter().flatten().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_sizes_double_and_halve_within_the_extent() {
        assert_eq!(tile_sizes(128, Some(7168), 1), [128, 32, 64, 256, 512]);
        assert_eq!(tile_sizes(2048, Some(2048), 1), [2048, 512, 1024]);
        assert_eq!(tile_sizes(1, Some(32), 1), [1, 2, 4]);
        // Only exact halvings.
        assert_eq!(tile_sizes(6, Some(100), 1), [6, 3, 12, 24]);
        // A ragged dimension: up to its cap.
        assert_eq!(tile_sizes(128, None, 256), [128, 32, 64, 256]);
        // Untiled ragged rows stay untiled.
        assert_eq!(tile_sizes(u64::MAX, None, 256), [u64::MAX]);
    }

    #[test]
    fn option_values_follow_their_types() {
        let b = option_values(&OptionType::Bool, &Value::Bool(true), 48);
        assert_eq!(b, [Value::Bool(true), Value::Bool(false)]);
        let f = option_values(
            &OptionType::Float {
                min: 0.0,
                max: 1.0,
                min_open: true,
            },
            &Value::Float(0.5),
            48,
        );
        assert_eq!(f, [0.5, 0.25, 0.75, 1.0].map(Value::Float));
        let i = option_values(&OptionType::Int { min: 0, max: 1 << 20 }, &Value::Int(0), 48);
        assert_eq!(i, [0, 4, 8, 16, 32].map(Value::Int));
        let o = option_values(&OptionType::OneOf(&["a", "b"]), &Value::Name("b".into()), 48);
        assert_eq!(o, [Value::Name("b".into()), Value::Name("a".into())]);
    }
}
