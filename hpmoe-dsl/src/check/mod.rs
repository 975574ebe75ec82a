//! The checker: parsed sources in, a checked [`ir::Program`] (the typed op graph) out, or
//! every error found.
//!
//! Stages, in order: loading (imports, cycles) in [`load`]; scopes and name resolution;
//! constants and parameter overrides in [`consts`]; the device in [`device`]; routings in
//! [`routes`]; op definitions and their bodies in [`ops`]; taskflows (calls, unification of
//! dtypes and symbolic shapes, engines, tiles and buffer fit) in [`flow`]; schedules.

mod consts;
mod device;
mod flow;
mod gates;
mod grad;
mod load;
pub use load::{read_source, MAX_SOURCE_BYTES};
mod ops;
mod policy;
mod routes;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::ir::{self, Value};
use crate::source::SourceMap;
use crate::syntax::ast::{self, ItemKind};
use crate::syntax::token::{FileId, Span};

use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// A `--set NAME=VALUE` override.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// A param name, or `device.FIELD`.
    pub name: String,
    pub value: Value,
}

impl Override {
    /// Parses `NAME=VALUE` (VALUE an integer, a float, `true`/`false`, or a name; a device
    /// value may carry a unit: `device.hbm_bandwidth=1.2TB/s` or `1.2 TB/s`).
    pub fn parse(s: &str) -> Result<Override, String> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}` is not of the form NAME=VALUE"))?;
        let name = name.trim();
        let value = value.trim();
        if name.is_empty() {
            return Err(format!("`{s}` has no name before `=`"));
        }
        let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
        if digits.chars().any(|c| c.is_ascii_digit()) && digits.chars().all(|c| c.is_ascii_digit() || c == '_') {
            let clean: String = value.chars().filter(|&c| c != '_').collect();
            if clean.parse::<i64>().is_err() {
                return Err(format!("`{value}`: the integer is too large (at most {})", i64::MAX));
            }
        }
        Ok(Override {
            name: name.to_string(),
            value: parse_value(value).ok_or_else(|| format!("`{value}` is not a number, `true`/`false` or a name"))?,
        })
    }
}

fn parse_value(v: &str) -> Option<Value> {
    let clean: String = v.chars().filter(|&c| c != '_').collect();
    if let Ok(i) = clean.parse::<i64>() {
        return Some(Value::Int(i));
    }
    if let Ok(f) = clean.parse::<f64>() {
        if f.is_finite() {
            return Some(Value::Float(f));
        }
        return None;
    }
    match v {
        "true" => return Some(Value::Bool(true)),
        "false" => return Some(Value::Bool(false)),
        _ => {}
    }
    // A number followed by a unit: keep it as a string for the device to parse.
    let first = v.chars().next()?;
    if first.is_ascii_digit() || first == '.' {
        return Some(Value::Str(v.to_string()));
    }
    if v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some(Value::Name(v.to_string()));
    }
    None
}

/// What the checker is given besides the sources.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub overrides: Vec<Override>,
    /// `--device NAME`: use this profile (from the program's scope or `std::device`) in place
    /// of the declared one; the declared overrides still apply.
    pub device: Option<String>,
    /// `--routing [NAME=]KIND(args)`: replace the kind and arguments of a routing (the only
    /// one, or the named one); arguments not given keep their declared values.
    pub routing: Option<String>,
    /// `--allow-path DIR`: directories besides the root file's own directory tree from which
    /// imports and `file(...)` routings may be read.
    pub allow_paths: Vec<PathBuf>,
}

/// The result of checking: the program (when there was no error) and every diagnostic
/// (errors and warnings), sorted by position.
#[derive(Debug)]
pub struct Outcome {
    pub program: Option<ir::Program>,
    pub diagnostics: Diagnostics,
}

/// The note for a file that cannot be read: an encoding error is not a wrong path.
pub fn read_error_note(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::InvalidData => "sources are UTF-8 text; re-save the file as UTF-8",
        _ => "check the path",
    }
}

/// Checks a file on disk and everything it imports.
pub fn check_path(path: &Path, opts: &Options, sources: &mut SourceMap) -> Outcome {
    let text = match load::read_source(path) {
        Ok(t) => t,
        Err(e) => {
            let mut ds = Diagnostics::new();
            ds.push(
                Diagnostic::error(Code::FileNotFound, format!("cannot read `{}`: {e}", path.display()))
                    .note(read_error_note(&e)),
            );
            return Outcome {
                program: None,
                diagnostics: ds,
            };
        }
    };
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let file = sources.add(path.display().to_string(), Some(canon), text);
    check_file(file, opts, sources)
}

/// Checks a text (a REPL buffer, a macro invocation, a test) given a display name. Imports of
/// files are relative to `dir`.
pub fn check_text(name: &str, text: &str, dir: Option<&Path>, opts: &Options, sources: &mut SourceMap) -> Outcome {
    let path = dir.map(|d| d.join(name));
    let file = sources.add(name, path, text);
    check_file(file, opts, sources)
}

/// Whether a check frees its syntax trees and tables when it ends; see
/// [`keep_trees_until_exit`].
static FREE_AT_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// For a process that exits soon after checking (the `hpmoe check` command): from now on a
/// check leaves its syntax trees and tables allocated instead of freeing them node by node,
/// and the operating system reclaims them at exit. On a large program the freeing is a
/// noticeable part of the run. Callers that check again and again (the REPL, the language
/// server, tests) keep the default, which frees everything.
pub fn keep_trees_until_exit() {
    FREE_AT_END.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Ends a check: frees the checker, or deliberately leaks it (see [`keep_trees_until_exit`]).
fn finish(ck: Checker<'_>) {
    if FREE_AT_END.load(std::sync::atomic::Ordering::Relaxed) {
        drop(ck);
    } else {
        std::mem::forget(ck);
    }
}

/// Checks an already-added source.
pub fn check_file(file: FileId, opts: &Options, sources: &mut SourceMap) -> Outcome {
    let mut ck = Checker::new(sources, opts);
    let program = ck.run(file);
    let outcome = ck.outcome(program);
    finish(ck);
    outcome
}

impl Checker<'_> {
    /// The sorted, de-duplicated diagnostics and the program (when there was no error).
    fn outcome(&mut self, program: Option<ir::Program>) -> Outcome {
        let mut diagnostics = std::mem::take(&mut self.diags);
        diagnostics.sort();
        // A `let` of an op body is checked where it is used: report each problem once.
        diagnostics.dedup();
        let program = if diagnostics.has_errors() { None } else { program };
        Outcome { program, diagnostics }
    }
}

/// Concrete bodies already computed, by (op, argument dtypes and shapes, routing arguments).
pub(crate) type BodyCache = rustc_hash::FxHashMap<
    (ir::OpId, Vec<(ir::DType, Vec<ir::Dim>)>, Vec<Option<ir::RouteId>>),
    std::sync::Arc<ir::ConcreteBody>,
>;

/// Tiles that fit their engine's buffers.
pub(crate) type FitCache = rustc_hash::FxHashSet<(
    ir::OpId,
    Vec<(ir::DType, Vec<ir::Dim>)>,
    Vec<Option<ir::RouteId>>,
    Vec<(String, u64)>,
    ir::Engine,
)>;

/// A module's names: short names are stored inline in the table ([`ScopeKey`]), so building
/// it allocates nothing per name and a lookup compares without following a pointer.
pub(crate) type Scope = FxHashMap<ScopeKey, (ItemRef, Span)>;

/// A name in a [`Scope`].
pub(crate) type ScopeKey = compact_str::CompactString;

/// Index of a loaded module.
pub(crate) type ModId = usize;

/// An item of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ItemRef {
    pub module: ModId,
    pub item: usize,
}

#[derive(Debug)]
pub(crate) struct Module {
    pub file: FileId,
    pub ast: Rc<ast::File>,
    /// `Some("moe")` for `std::moe`.
    pub std_name: Option<String>,
    pub path: Option<PathBuf>,
    /// The file's identity (device and inode) where the platform has one: a file reached
    /// through several names (hard links) is loaded once.
    pub ident: Option<(u64, u64)>,
    /// Name → item, with the span where the name was bound (definition or import). Hashed
    /// for lookups; whoever lists the names sorts them.
    pub scope: Scope,
    /// Names whose import failed (already reported): uses stay silent.
    pub poisoned: std::collections::BTreeSet<String>,
}

#[derive(Clone, Debug)]
pub(crate) enum ParamState {
    InProgress,
    Done(Option<Value>),
}

/// A value per item of every module, stored densely by module and item index: a lookup is
/// two indexings, with no hashing, and the items of a file met in order are neighbours in
/// memory.
#[derive(Debug)]
pub(crate) struct ItemTable<T> {
    modules: Vec<Vec<Option<T>>>,
}

impl<T> Default for ItemTable<T> {
    fn default() -> Self {
        ItemTable { modules: Vec::new() }
    }
}

impl<T> ItemTable<T> {
    pub fn get(&self, r: &ItemRef) -> Option<&T> {
        self.modules.get(r.module)?.get(r.item)?.as_ref()
    }

    pub fn contains_key(&self, r: &ItemRef) -> bool {
        self.get(r).is_some()
    }

    /// Sets the value of an item (the table grows to hold it).
    pub fn insert(&mut self, r: ItemRef, v: T) {
        if self.modules.len() <= r.module {
            self.modules.resize_with(r.module + 1, Vec::new);
        }
        let items = &mut self.modules[r.module];
        if items.len() <= r.item {
            items.resize_with(r.item + 1, || None);
        }
        items[r.item] = Some(v);
    }

    /// Makes room for the first `items` items of module `m` at once.
    pub fn reserve_module(&mut self, m: ModId, items: usize) {
        if self.modules.len() <= m {
            self.modules.resize_with(m + 1, Vec::new);
        }
        let v = &mut self.modules[m];
        if v.len() < items {
            v.resize_with(items, || None);
        }
    }
}

/// The checker's state for one program.
pub(crate) struct Checker<'a> {
    pub sources: &'a mut SourceMap,
    pub opts: &'a Options,
    pub diags: Diagnostics,
    pub modules: Vec<Module>,
    pub root: ModId,
    pub params: ItemTable<ParamState>,
    pub device: Option<ir::Device>,
    pub routes: Vec<routes::RouteState>,
    pub route_of: FxHashMap<ItemRef, Option<ir::RouteId>>,
    /// The routings being checked, innermost last (a derived routing checks its parent).
    pub routes_in_progress: Vec<ItemRef>,
    /// What each `grad` derived keeps and recomputes.
    pub grads: Vec<ir::GradInfo>,
    /// Per name of a derived op, the first suffix (1: none) not yet taken in the root's scope:
    /// the names below it are all taken, and the scope only grows, so each `grad` looks for a
    /// free name from there, not from the start.
    pub derived_name_from: FxHashMap<String, u32>,
    pub ops: Vec<ir::OpDef>,
    pub op_sigs: FxHashMap<ItemRef, Option<Rc<ops::OpSig>>>,
    /// Concrete bodies by (op, argument dtypes and shapes, routings).
    pub bodies: BodyCache,
    /// Tiles already found to fit, by (op, argument types, routings, tile, engine).
    pub fits: FitCache,
    pub taskflows: Vec<ir::Taskflow>,
    pub schedules: Vec<ir::ScheduleSpec>,
    /// The `policy` declarations that passed their checks (a schedule matches its options
    /// only against one of them).
    pub valid_policies: Vec<ItemRef>,
    /// Statements of the op bodies analysed so far, held against [`ops::MAX_BODY_STATEMENTS`].
    pub body_statements: usize,
    /// Set once every loaded module's scope is built; modules loaded later build their own.
    pub scopes_built: bool,
}

impl std::fmt::Debug for Checker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker").field("modules", &self.modules.len()).finish()
    }
}

impl<'a> Checker<'a> {
    fn new(sources: &'a mut SourceMap, opts: &'a Options) -> Self {
        crate::suggest::reset_budget();
        Checker {
            sources,
            opts,
            diags: Diagnostics::new(),
            modules: Vec::new(),
            root: 0,
            params: ItemTable::default(),
            device: None,
            routes: Vec::new(),
            route_of: FxHashMap::default(),
            routes_in_progress: Vec::new(),
            grads: Vec::new(),
            derived_name_from: FxHashMap::default(),
            ops: Vec::new(),
            op_sigs: FxHashMap::default(),
            bodies: Default::default(),
            fits: Default::default(),
            taskflows: Vec::new(),
            schedules: Vec::new(),
            valid_policies: Vec::new(),
            body_statements: 0,
            scopes_built: false,
        }
    }

    pub fn err(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// Whether a tensor type has at most [`crate::lower::MAX_DIMS`] dimensions (the regions
    /// of lowering and verification hold that many bounds); reports it otherwise.
    pub fn dims_fit(&mut self, t: &ast::TensorType) -> bool {
        let max = crate::lower::MAX_DIMS;
        if t.dims.len() <= max {
            return true;
        }
        self.err(
            Diagnostic::error(
                Code::LimitExceeded,
                format!("a tensor of {} dimensions; tensors have at most {max}", t.dims.len()),
            )
            .primary(t.span, format!("{} dimensions", t.dims.len()))
            .help("merge dimensions that are indexed together into one"),
        );
        false
    }

    pub fn item(&self, r: ItemRef) -> &ast::Item {
        &self.modules[r.module].ast.items[r.item]
    }

    /// A shared handle to an item's file, so the item can be read while the checker changes.
    pub fn file_of(&self, r: ItemRef) -> Rc<ast::File> {
        Rc::clone(&self.modules[r.module].ast)
    }

    /// Looks a name up in a module's scope.
    pub fn lookup(&self, m: ModId, name: &str) -> Option<ItemRef> {
        self.modules[m].scope.get(name).map(|(r, _)| *r)
    }

    /// Names in scope of a module that satisfy `pred`, for suggestions (sorted).
    pub fn names_where(&self, m: ModId, pred: impl Fn(&ItemKind) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self.modules[m]
            .scope
            .iter()
            .filter(|(_, (r, _))| pred(&self.item(*r).kind))
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort_unstable();
        names
    }

    /// Every name in scope of a module, sorted.
    pub fn scope_names(&self, m: ModId) -> Vec<String> {
        let mut names: Vec<String> = self.modules[m].scope.keys().map(|k| k.to_string()).collect();
        names.sort_unstable();
        names
    }

    fn run(&mut self, file: FileId) -> Option<ir::Program> {
        self.root = self.load_root(file)?;
        self.run_loaded()
    }

    /// Everything after loading: scopes, params, device, ops, routes, taskflows, schedules.
    fn run_loaded(&mut self) -> Option<ir::Program> {
        for m in 0..self.modules.len() {
            self.build_scope(m);
        }
        self.scopes_built = true;
        self.apply_param_overrides();
        let root = self.root;
        // Params of the root, in order (errors in each are reported once).
        let params: Vec<usize> = (self.modules[root].ast.items.iter().enumerate())
            .filter_map(|(i, item)| matches!(item.kind, ItemKind::Param(_)).then_some(i))
            .collect();
        self.params.reserve_module(root, self.modules[root].ast.items.len());
        let mut param_values = Vec::with_capacity(params.len());
        for (k, &i) in params.iter().enumerate() {
            if k % consts::WARM_PARAMS == 0 {
                self.warm_param_names(root, &params[k..params.len().min(k + consts::WARM_PARAMS)]);
            }
            let r = ItemRef { module: root, item: i };
            if let Some(v) = self.param_value(r) {
                let ItemKind::Param(p) = &self.item(r).kind else {
                    continue;
                };
                param_values.push((p.name.name.clone(), v));
            }
        }
        self.check_device();
        // Every op, route and taskflow of non-std modules; std items when used.
        for m in 0..self.modules.len() {
            if self.modules[m].std_name.is_some() && m != root {
                continue;
            }
            for i in 0..self.modules[m].ast.items.len() {
                let r = ItemRef { module: m, item: i };
                match &self.item(r).kind {
                    ItemKind::Route(_) => {
                        self.route_id(r);
                    }
                    ItemKind::Op(_) => {
                        self.op_sig(r);
                    }
                    ItemKind::Profile(_) if m == root => self.check_profile_item(r),
                    ItemKind::Signature(_) if m == root => self.check_signature_item(r),
                    _ => {}
                }
            }
        }
        for i in 0..self.modules[root].ast.items.len() {
            let r = ItemRef { module: root, item: i };
            if let ItemKind::Taskflow(_) = &self.item(r).kind {
                self.check_taskflow(r);
            }
        }
        self.expand_grads();
        self.check_layer_pairs();
        self.resolve_gates();
        let policies = self.check_policies();
        self.check_schedules();
        self.check_order_effects(&policies);
        self.finish_routes();
        self.check_hbm_fit();
        let device = self.device.clone()?;
        Some(ir::Program {
            params: param_values,
            device,
            routes: self.routes.iter().map(|r| r.spec.clone()).collect(),
            ops: std::mem::take(&mut self.ops),
            taskflows: std::mem::take(&mut self.taskflows),
            schedules: std::mem::take(&mut self.schedules),
            policies,
            grads: std::mem::take(&mut self.grads),
        })
    }
}

/// Checks a source the caller has already parsed: the `taskflow!` macro, whose spans are
/// token indices into its own table. `file` must be registered in `sources`: its path, if
/// any, is what file imports are relative to (imports of std modules need none), and its
/// text is only read to find the names of items that failed to parse, so that their uses
/// stay silent as in a file. `parse_diags` are the lexical and syntax errors of `ast`.
///
/// The stages are those of [`check_file`]: the root's imports are loaded as a parsed file's
/// are (files through the same loader, so their own imports, cycles and errors behave the
/// same), then the checks of `Checker::run` follow in the same order. The macro crate's
/// tests keep this and [`check_text`] in agreement on the examples and the conformance
/// corpus.
pub fn check_parsed(
    file: FileId,
    ast: ast::File,
    parse_diags: Vec<Diagnostic>,
    opts: &Options,
    sources: &mut SourceMap,
) -> Outcome {
    let mut ck = Checker::new(sources, opts);
    ck.root = ck.load_root_parsed(file, ast, parse_diags);
    let program = ck.run_loaded();
    let outcome = ck.outcome(program);
    finish(ck);
    outcome
}
