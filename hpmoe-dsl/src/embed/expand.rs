//! The expansion of `taskflow! { ... }` and `taskflow_file!("path.hpm")` (feature
//! `proc-macro2`): tokens in, Rust items out.
//!
//! `taskflow!`: the tokens are converted ([`ProcTokens`], token-index spans), parsed, checked
//! with the embedded stdlib ([`check_parsed`]) and, when the check passes, every taskflow is
//! lowered, verified and scheduled with its declared policy (or `interleaved`) as long as the
//! program is small enough ([`MAX_COMPILE_TIME_TASKS`]; larger ones are only checked). Every
//! diagnostic becomes a `compile_error!` whose span runs from the first to the last token of
//! its primary label; warnings become deprecation warnings at their first token. The output
//! is the typed handle of every taskflow (see `docs/MACRO.md`), also when there are errors
//! (built from what parsed), so that the user sees our errors and not a cascade of unknown
//! types.

use crate::check::Options;
use crate::diag::{Diagnostic, Label};
use crate::driver::{check_parsed, check_text, Checked, CompileOptions};
use crate::ir::{self, DType, Program, Value};
use crate::source::SourceMap;
use crate::syntax::ast::{self, ExprKind, ItemKind, ParamType, TaskflowRet, TensorType};
use crate::syntax::fmt::expr_text;
use crate::syntax::parser::Parser;
use crate::syntax::proc::{rust_string_value, ProcTokens, SpanPair};
use crate::syntax::token::FileId;
use crate::Code;
use proc_macro2::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span as PSpan, TokenStream, TokenTree};
use quote::{format_ident, quote};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Programs that lower to more tasks than this are only checked at compile time.
pub const MAX_COMPILE_TIME_TASKS: u64 = 2_000_000;

/// Programs whose routings have more entries (ranks × tokens × top-k, summed) than this are
/// only checked at compile time: generating the routings would already be slow.
const MAX_COMPILE_TIME_ROUTE_ENTRIES: u64 = 1 << 24;

/// The name of a `taskflow!` program in diagnostics.
const MACRO_SOURCE_NAME: &str = "<taskflow!>";

/// How to expand.
#[derive(Clone, Debug)]
pub struct ExpandOptions {
    /// The directory file imports, file routings and `taskflow_file!` paths are relative to
    /// (by default the `CARGO_MANIFEST_DIR` of the crate being compiled).
    pub dir: Option<PathBuf>,
    /// Lower, verify and schedule at compile time only up to this many tasks per taskflow
    /// (0: never).
    pub max_tasks: u64,
}

impl Default for ExpandOptions {
    /// `CARGO_MANIFEST_DIR`, and the task limit from `HPMOE_MACRO_MAX_TASKS` when it is set
    /// to a number (0: check only), else [`MAX_COMPILE_TIME_TASKS`].
    fn default() -> Self {
        ExpandOptions::from_env().unwrap_or_else(|_| ExpandOptions {
            dir: std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
            max_tasks: MAX_COMPILE_TIME_TASKS,
        })
    }
}

impl ExpandOptions {
    /// The options of the build's environment: `CARGO_MANIFEST_DIR`, and
    /// `HPMOE_MACRO_MAX_TASKS` (see [`max_tasks_from`]); `Err` with the message when that
    /// variable is set to something else than a number of tasks.
    pub fn from_env() -> Result<ExpandOptions, String> {
        Ok(ExpandOptions {
            dir: std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
            max_tasks: max_tasks_from(std::env::var_os("HPMOE_MACRO_MAX_TASKS").as_deref())?,
        })
    }
}

/// The compile-time task limit given by the value of `HPMOE_MACRO_MAX_TASKS`: unset,
/// [`MAX_COMPILE_TIME_TASKS`]; a whole number (0: check only); anything else (not text, not
/// a number, negative, past 64 bits) is refused, never taken for the default.
pub fn max_tasks_from(value: Option<&std::ffi::OsStr>) -> Result<u64, String> {
    let Some(v) = value else {
        return Ok(MAX_COMPILE_TIME_TASKS);
    };
    let shown = v.to_string_lossy();
    v.to_str()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            format!(
                "HPMOE_MACRO_MAX_TASKS is `{shown}`, not a number of tasks: set it to a whole number (0 only checks the program) or unset it (the limit is then {MAX_COMPILE_TIME_TASKS})"
            )
        })
}

/// Expands `taskflow! { ... }` with the options of the build's environment (a malformed
/// `HPMOE_MACRO_MAX_TASKS` is a compile error, and the program is then only checked).
pub fn expand(input: TokenStream) -> TokenStream {
    with_env_options(|o| expand_with(input, o))
}

/// Expands `taskflow_file!("path.hpm")` with the options of the build's environment.
pub fn expand_file(input: TokenStream) -> TokenStream {
    with_env_options(|o| expand_file_with(input, o))
}

fn with_env_options(f: impl FnOnce(&ExpandOptions) -> TokenStream) -> TokenStream {
    match ExpandOptions::from_env() {
        Ok(o) => f(&o),
        Err(msg) => {
            let mut out = compile_error(PSpan::call_site(), PSpan::call_site(), &msg);
            out.extend(f(&ExpandOptions {
                dir: std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
                max_tasks: 0,
            }));
            out
        }
    }
}

/// Expands `taskflow! { ... }`.
pub fn expand_with(input: TokenStream, opts: &ExpandOptions) -> TokenStream {
    let mut sources = SourceMap::new();
    let file = FileId(sources.files().count() as u32);
    let mut toks = ProcTokens::new(input, file);
    let raw_text = toks.text();
    let added = sources.add(
        MACRO_SOURCE_NAME,
        opts.dir.as_ref().map(|d| d.join(MACRO_SOURCE_NAME)),
        raw_text.as_str(),
    );
    debug_assert_eq!(added, file);
    let (ast, mut diags) = {
        let mut p = Parser::new(&mut toks);
        let f = p.file();
        (f, p.diags)
    };
    let mut all = std::mem::take(&mut toks.diags);
    all.append(&mut diags);
    let outcome = check_parsed(file, ast.clone(), all, &Options::default(), &mut sources);
    let map = SpanMap::Tokens(&toks);
    let mut out = TokenStream::new();
    let mut failed = outcome.diagnostics.has_errors();
    for d in outcome.diagnostics.as_slice() {
        out.extend(emit(d, &map, &sources));
    }
    if let Some(left_out) = outcome.diagnostics.dropped().describe() {
        let msg = format!("{left_out} not shown");
        out.extend(compile_error(PSpan::call_site(), PSpan::call_site(), &msg));
    }
    // Rebuild when an imported file changes.
    for (id, f) in sources.files() {
        if let (true, Some(p)) = (id != file, &f.path) {
            let p = p.display().to_string();
            out.extend(quote! { const _: &str = ::core::include_str!(#p); });
        }
    }
    let dir = opts.dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default();
    let checked = outcome.checked.filter(|_| !failed);
    if let Some(c) = &checked {
        for d in compile_all_guarded(c, opts.max_tasks) {
            failed |= d.is_error();
            out.extend(emit(&d, &map, &sources));
        }
    }
    let program = checked.map(Checked::into_program);
    let text = if failed { raw_text } else { canonical_text(raw_text) };
    let source = SourceTokens {
        name: MACRO_SOURCE_NAME.to_string(),
        text: quote!(#text),
        dir,
    };
    out.extend(handles(&ast, program.as_ref(), &source, &map));
    out
}

/// Expands `taskflow_file!("path.hpm")`: checks the file (relative to the crate's
/// directory) at compile time, embeds it with `include_str!` (so the crate is rebuilt when it
/// changes) and emits the handles of its taskflows. Diagnostics are shown at the path literal,
/// each with its snippet of the file.
pub fn expand_file_with(input: TokenStream, opts: &ExpandOptions) -> TokenStream {
    let trees: Vec<TokenTree> = input.into_iter().collect();
    let lit = match trees.as_slice() {
        [TokenTree::Literal(l)] | [TokenTree::Literal(l), TokenTree::Punct(_)] => Some(l.clone()),
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::None => {
            g.stream()
                .into_iter()
                .find_map(|t| if let TokenTree::Literal(l) = t { Some(l) } else { None })
        }
        _ => None,
    };
    let Some((lit, rel)) = lit.and_then(|l| rust_string_value(&l.to_string()).map(|s| (l, s))) else {
        let span = trees.first().map_or(PSpan::call_site(), |t| t.span());
        return compile_error(
            span,
            span,
            "expected the path of a `.hpm` file as a string literal, as in `taskflow_file!(\"flows/moe.hpm\")`",
        );
    };
    let at = lit.span();
    let dir = opts.dir.clone().unwrap_or_default();
    let abs = dir.join(&rel);
    // As a source file is read (a regular file within the size limit): a FIFO given here
    // would block the compiler, a huge file fill its memory.
    let text = match crate::check::read_source(&abs) {
        Ok(t) => t,
        Err(e) => return compile_error(at, at, &format!("E1001: cannot read `{}`: {e}", abs.display())),
    };
    let mut sources = SourceMap::new();
    let outcome = check_text(&rel, &text, Some(&dir), &Options::default(), &mut sources);
    let map = SpanMap::Fixed(at);
    let mut out = TokenStream::new();
    let abs_text = abs.display().to_string();
    let failed = outcome.diagnostics.has_errors();
    for d in outcome.diagnostics.as_slice() {
        out.extend(emit(d, &map, &sources));
    }
    for (_, f) in sources.files() {
        if let Some(p) = &f.path {
            let p = p.display().to_string();
            if p != abs_text {
                out.extend(quote! { const _: &str = ::core::include_str!(#p); });
            }
        }
    }
    let checked = outcome.checked.filter(|_| !failed);
    if let Some(c) = &checked {
        for d in compile_all_guarded(c, opts.max_tasks) {
            out.extend(emit(&d, &map, &sources));
        }
    }
    let program = checked.map(Checked::into_program);

    let (ast, _, _) = crate::syntax::parse_text(&text, FileId(0));
    let source = SourceTokens {
        name: rel.clone(),
        text: quote!(::core::include_str!(#abs_text)),
        dir: dir.display().to_string(),
    };
    out.extend(handles(&ast, program.as_ref(), &source, &map));
    out
}

// ---------------------------------------------------------------------- compile time work

/// [`compile_all`], turning a panic of a later stage (a bug: a checked program must lower)
/// into a warning, so that the crate still builds; the program was checked.
fn compile_all_guarded(checked: &Checked, max_tasks: u64) -> Vec<Diagnostic> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compile_all(checked, max_tasks))) {
        Ok(ds) => ds,
        Err(e) => {
            let what = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            vec![Diagnostic::warning(
                Code::LimitExceeded,
                format!("internal error while lowering at compile time (skipped; please report it): {what}"),
            )]
        }
    }
}

/// Lowers, verifies and schedules every taskflow of a checked program with its declared
/// policy, within the compile-time limits. Returns the diagnostics.
fn compile_all(checked: &Checked, max_tasks: u64) -> Vec<Diagnostic> {
    if max_tasks == 0 {
        return Vec::new();
    }
    let program = checked.program();
    let entries = program
        .routes
        .iter()
        .map(|r| r.ranks.saturating_mul(r.tokens).saturating_mul(r.topk))
        .fold(0u64, u64::saturating_add);
    if entries > MAX_COMPILE_TIME_ROUTE_ENTRIES {
        return Vec::new();
    }
    let mut out = Vec::new();
    let opts = CompileOptions {
        max_tasks,
        verify: true,
    };
    for tf in &program.taskflows {
        let spec = checked.select_policy(&tf.name, None);
        if let Err(d) = checked.layouts(spec.static_capacity) {
            out.push(d);
            return out;
        }
        match checked.compile(tf, &spec, &opts) {
            Ok(_) => {}
            // Too large to lower while compiling: checked only.
            Err(ds) if ds.iter().any(|d| d.code == Code::LimitExceeded) => {}
            Err(ds) => out.extend(collapse(ds)),
        }
    }
    out
}

/// The verifier reports each kind of problem for up to a few tasks, then a count: at compile
/// time, one error per kind and call is enough (the others go into a note), since they all
/// point at the same tokens.
fn collapse(ds: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut out: Vec<(Diagnostic, usize)> = Vec::new();
    let mut totals: Vec<(crate::Code, String)> = Vec::new();
    for d in ds {
        if d.labels.is_empty() && out.iter().any(|(k, _)| k.code == d.code) {
            // `... N more <kind> in <taskflow>`.
            totals.push((d.code, d.message.trim_start_matches("... ").to_string()));
            continue;
        }
        if let Some((_, n)) = out
            .iter_mut()
            .find(|(k, _)| !d.labels.is_empty() && k.code == d.code && k.span() == d.span())
        {
            *n += 1;
            continue;
        }
        out.push((d, 0));
    }
    out.into_iter()
        .map(|(d, n)| {
            let total = totals.iter().find(|(c, _)| *c == d.code).map(|(_, m)| m.clone());
            match (n, total) {
                (n, Some(m)) => {
                    // `123 more write conflicts in `f``: add the ones folded here.
                    let (count, rest) = m.split_once(' ').unwrap_or(("", &m));
                    match count.parse::<usize>() {
                        Ok(c) => d.note(format!("and {} {rest}", c + n)),
                        Err(_) => d.note(format!("and {m}")),
                    }
                }
                (0, None) => d,
                (n, None) => d.note(format!("and {n} more like it at the same call (other tiles or ranks)")),
            }
        })
        .collect()
}

/// The canonical form of the program text, when the formatter gives one that parses
/// cleanly; else the text as printed from the tokens (which lexes to the same tokens).
fn canonical_text(raw: String) -> String {
    match crate::syntax::fmt::format_source(&raw) {
        Ok(f) if crate::syntax::parse_text(&f, FileId(0)).1.is_empty() => f,
        _ => raw,
    }
}

// ---------------------------------------------------------------------- diagnostics

/// Where the spans of the program's own file go.
enum SpanMap<'a> {
    /// `taskflow!`: token indices of file 0.
    Tokens(&'a ProcTokens),
    /// `taskflow_file!`: everything at the path literal.
    Fixed(PSpan),
}

impl SpanMap<'_> {
    /// The `proc_macro2` range of a span of the program's own file.
    fn range(&self, span: crate::Span) -> Option<SpanPair> {
        match self {
            SpanMap::Tokens(t) if span.file == t.file() => Some(t.range(span)),
            SpanMap::Tokens(_) => None,
            SpanMap::Fixed(s) => Some((*s, *s)),
        }
    }
}

/// `::core::compile_error! { "msg" }` spanning `start..end`: the path carries the first span
/// and the braces the last, so the compiler underlines everything in between.
pub(crate) fn compile_error(start: PSpan, end: PSpan, msg: &str) -> TokenStream {
    let punct = |c: char, spacing: Spacing| {
        let mut p = Punct::new(c, spacing);
        p.set_span(start);
        TokenTree::Punct(p)
    };
    let mut lit = Literal::string(msg);
    lit.set_span(end);
    let mut group = Group::new(Delimiter::Brace, TokenStream::from(TokenTree::Literal(lit)));
    group.set_span(end);
    TokenStream::from_iter([
        punct(':', Spacing::Joint),
        punct(':', Spacing::Alone),
        TokenTree::Ident(Ident::new("core", start)),
        punct(':', Spacing::Joint),
        punct(':', Spacing::Alone),
        TokenTree::Ident(Ident::new("compile_error", start)),
        punct('!', Spacing::Alone),
        TokenTree::Group(group),
    ])
}

/// A warning at `at`: the use of a deprecated constant whose note is the message.
fn compile_warning(at: PSpan, msg: &str) -> TokenStream {
    let used = Ident::new("hpmoe_warning", at);
    quote! {
        const _: () = {
            #[deprecated(note = #msg)]
            #[allow(non_upper_case_globals)]
            const hpmoe_warning: () = ();
            #[allow(clippy::let_unit_value)]
            let _ = #used;
        };
    }
}

/// One diagnostic as a `compile_error!` (or a warning) at its primary label, or at the first
/// label in the invocation, or (for `taskflow_file!`, or a problem in an imported file) at the
/// invocation.
fn emit(d: &Diagnostic, map: &SpanMap, sources: &SourceMap) -> TokenStream {
    let here = match map {
        SpanMap::Tokens(_) => d
            .labels
            .iter()
            .filter(|l| map.range(l.span).is_some())
            .min_by_key(|l| !l.primary),
        SpanMap::Fixed(_) => None,
    };
    let (start, end) = match map {
        SpanMap::Fixed(s) => (*s, *s),
        SpanMap::Tokens(_) => here
            .and_then(|l| map.range(l.span))
            .unwrap_or((PSpan::call_site(), PSpan::call_site())),
    };
    let msg = message(d, here, map, sources);
    if d.is_error() {
        compile_error(start, end, &msg)
    } else {
        compile_warning(start, &msg)
    }
}

/// `CODE: message`, the label shown at the tokens, the other labels with their positions (and
/// the source line, for those the compiler cannot show), help and notes.
fn message(d: &Diagnostic, here: Option<&Label>, map: &SpanMap, sources: &SourceMap) -> String {
    let mut s = format!("{}: {}", d.code, d.message);
    if let Some(l) = here {
        if !l.message.is_empty() {
            s.push_str(&format!("\n  here: {}", l.message));
        }
    }
    for l in &d.labels {
        if Some(l) == here {
            continue;
        }
        match (map, map.range(l.span)) {
            (SpanMap::Tokens(_), Some((p, _))) => {
                let lc = p.start();
                if lc.line > 0 {
                    s.push_str(&format!(
                        "\n  at line {}, column {}: {}",
                        lc.line,
                        lc.column + 1,
                        l.message
                    ));
                } else {
                    s.push_str(&format!("\n  also: {}", l.message));
                }
            }
            _ => match (sources.get(l.span.file), sources.line_col(l.span)) {
                (Some(f), Some((line, col))) => {
                    s.push_str(&format!("\n  at {}:{line}:{col}: {}", f.name, l.message));
                    if let Some(text) = f.text.lines().nth(line - 1) {
                        s.push_str(&format!("\n   | {}", text.trim_end()));
                    }
                }
                _ => s.push_str(&format!("\n  also: {}", l.message)),
            },
        }
    }
    if let Some(h) = &d.help {
        s.push_str(&format!("\n  help: {h}"));
    }
    for n in &d.notes {
        s.push_str(&format!("\n  note: {n}"));
    }
    s
}

// ---------------------------------------------------------------------- handles

/// The program text of the handles: tokens of a `&'static str` expression.
struct SourceTokens {
    name: String,
    text: TokenStream,
    dir: String,
}

struct TensorDesc {
    name: String,
    dtype: DType,
    shape: Vec<DimDesc>,
    written: String,
}

/// A dimension at expansion time (printed as an [`super::Dim`]).
#[derive(Clone, Debug)]
enum DimDesc {
    Fixed(u64),
    Recv(String, u64),
}

struct ParamDesc {
    name: String,
    default: super::ParamValue,
    docs: Vec<String>,
    span: SpanPair,
}

/// The handles of every taskflow of the file: typed from the checked program when there is
/// one, else placeholders with the same names built from the AST.
fn handles(ast: &ast::File, program: Option<&Program>, source: &SourceTokens, map: &SpanMap) -> TokenStream {
    let call = (PSpan::call_site(), PSpan::call_site());
    let mut params = Vec::new();
    for item in &ast.items {
        let ItemKind::Param(p) = &item.kind else { continue };
        // A param defined twice is an error already: one setter.
        if params.iter().any(|q: &ParamDesc| q.name == p.name.name) {
            continue;
        }
        let default = match program.and_then(|pr| pr.params.iter().find(|(n, _)| *n == p.name.name)) {
            Some((_, Value::Int(i))) => super::ParamValue::Int(*i),
            Some((_, Value::Float(f))) => super::ParamValue::Float(*f),
            Some((_, Value::Bool(b))) => super::ParamValue::Bool(*b),
            Some(_) => continue,
            None if program.is_some() => continue,
            None => match p.value.kind {
                ExprKind::Float(_) => super::ParamValue::Float(0.0),
                _ => super::ParamValue::Int(0),
            },
        };
        params.push(ParamDesc {
            name: p.name.name.clone(),
            default,
            docs: item.docs.clone(),
            span: map.range(p.name.span).unwrap_or(call),
        });
    }
    let mut out = TokenStream::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for item in &ast.items {
        let (name, t) = match &item.kind {
            ItemKind::Taskflow(t) => (&t.name, Some(t)),
            ItemKind::Grad(g) => (&g.name, None),
            _ => continue,
        };
        let span = map.range(name.span).unwrap_or(call);
        let camel = camel_case(&name.name);
        let type_names = [camel.clone(), format!("{camel}Inputs"), format!("{camel}Outputs")];
        if let Some(other) = type_names.iter().find_map(|n| seen.get(n)) {
            let msg = format!(
                "the handle of taskflow `{}` would be named like that of `{other}` (`{camel}`)\n  help: rename one of the taskflows",
                name.name
            );
            out.extend(compile_error(span.0, span.1, &msg));
            continue;
        }
        for n in type_names {
            seen.insert(n, name.name.clone());
        }
        let checked = program.and_then(|p| p.taskflow(&name.name));
        let (inputs, outputs) = match t {
            Some(t) => written_descs(t, checked, program),
            // A derived backward has no written signature: its types are the checked ones
            // (none when the program has errors, which are reported).
            None => match (checked, program) {
                (Some(tf), Some(p)) => derived_descs(tf, p),
                _ => (Vec::new(), Vec::new()),
            },
        };
        out.extend(handle(
            &name.name, &camel, span, &item.docs, &params, &inputs, &outputs, source,
        ));
    }
    out
}

/// The inputs and outputs of a written taskflow: their written types, typed from the checked
/// taskflow when there is one.
fn written_descs(
    t: &ast::Taskflow,
    checked: Option<&ir::Taskflow>,
    program: Option<&Program>,
) -> (Vec<TensorDesc>, Vec<TensorDesc>) {
    let written = |tt: &TensorType| {
        let dims: Vec<String> = tt.dims.iter().map(expr_text).collect();
        format!("{}[{}]", tt.dtype.name, dims.join(", "))
    };
    let mut inputs = Vec::new();
    for p in &t.params {
        let ParamType::Tensor(tt) = &p.ty else { continue };
        // An input defined twice is an error already: one field.
        if inputs.iter().any(|i: &TensorDesc| i.name == p.name.name) {
            continue;
        }
        inputs.push(tensor_desc(&p.name.name, false, tt, written(tt), checked, program));
    }
    let mut outputs = Vec::new();
    match &t.ret {
        TaskflowRet::Single(tt) => outputs.push(tensor_desc("out", true, tt, written(tt), checked, program)),
        TaskflowRet::Named(list) => {
            for (n, tt) in list {
                if outputs.iter().any(|o: &TensorDesc| o.name == n.name) {
                    continue;
                }
                outputs.push(tensor_desc(&n.name, true, tt, written(tt), checked, program));
            }
        }
    }
    (inputs, outputs)
}

/// The inputs and outputs of a taskflow derived by `grad`, from its checked types (a
/// receive window written `ROUTE.recv`).
fn derived_descs(tf: &ir::Taskflow, p: &Program) -> (Vec<TensorDesc>, Vec<TensorDesc>) {
    let desc = |name: &str, id: ir::TensorId| {
        let t = tf.tensor(id);
        let shape = ir_shape(t, p);
        let dims: Vec<String> = shape
            .iter()
            .map(|d| match d {
                DimDesc::Fixed(n) => n.to_string(),
                DimDesc::Recv(r, _) => format!("{r}.recv"),
            })
            .collect();
        TensorDesc {
            name: name.to_string(),
            dtype: t.dtype,
            shape,
            written: format!("{}[{}]", t.dtype.name(), dims.join(", ")),
        }
    };
    let inputs = tf.inputs.iter().map(|&id| desc(&tf.tensor(id).name, id)).collect();
    let outputs = tf.outputs.iter().map(|(n, id)| desc(n, *id)).collect();
    (inputs, outputs)
}

/// A checked tensor's shape: fixed sizes, and receive windows with their capacity.
fn ir_shape(t: &ir::Tensor, p: &Program) -> Vec<DimDesc> {
    t.shape
        .iter()
        .map(|d| match d {
            ir::Dim::Fixed(n) => DimDesc::Fixed(*n),
            ir::Dim::Recv(r) => {
                let spec = p.route(*r);
                DimDesc::Recv(spec.name.clone(), spec.capacity)
            }
        })
        .collect()
}

fn tensor_desc(
    name: &str,
    output: bool,
    tt: &TensorType,
    written: String,
    checked: Option<&ir::Taskflow>,
    program: Option<&Program>,
) -> TensorDesc {
    // Inputs by tensor name, outputs by output name.
    let found = checked.and_then(|tf| {
        if output {
            tf.outputs.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
        } else {
            tf.inputs.iter().copied().find(|id| tf.tensor(*id).name == name)
        }
    });
    match (found, checked, program) {
        (Some(id), Some(tf), Some(p)) => {
            let t = tf.tensor(id);
            TensorDesc {
                name: name.to_string(),
                dtype: t.dtype,
                shape: ir_shape(t, p),
                written,
            }
        }
        _ => TensorDesc {
            name: name.to_string(),
            dtype: DType::parse(&tt.dtype.name).unwrap_or(DType::Bf16),
            shape: Vec::new(),
            written,
        },
    }
}

fn dtype_tokens(d: DType) -> TokenStream {
    match d {
        DType::Bf16 => quote!(::hpmoe_dsl::ir::DType::Bf16),
        DType::F16 => quote!(::hpmoe_dsl::ir::DType::F16),
        DType::F32 => quote!(::hpmoe_dsl::ir::DType::F32),
        DType::I32 => quote!(::hpmoe_dsl::ir::DType::I32),
        DType::I8 => quote!(::hpmoe_dsl::ir::DType::I8),
        DType::U8 => quote!(::hpmoe_dsl::ir::DType::U8),
        DType::Fp8E4M3 => quote!(::hpmoe_dsl::ir::DType::Fp8E4M3),
        DType::Fp8E5M2 => quote!(::hpmoe_dsl::ir::DType::Fp8E5M2),
    }
}

fn dim_tokens(d: &DimDesc) -> TokenStream {
    match d {
        DimDesc::Fixed(n) => quote!(::hpmoe_dsl::embed::Dim::Fixed(#n)),
        DimDesc::Recv(route, capacity) => quote!(::hpmoe_dsl::embed::Dim::Recv { route: #route, capacity: #capacity }),
    }
}

fn shape_text(shape: &[DimDesc]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| match d {
            DimDesc::Fixed(n) => n.to_string(),
            DimDesc::Recv(r, c) => format!("{r}.recv (<= {c})"),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// Methods of the handle that a param setter must not shadow.
const RESERVED_METHODS: &[&str] = &["new", "set", "overrides", "program", "compile"];

#[allow(clippy::too_many_arguments)]
fn handle(
    name: &str,
    camel: &str,
    span: SpanPair,
    docs: &[String],
    params: &[ParamDesc],
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    source: &SourceTokens,
) -> TokenStream {
    let ty = Ident::new(camel, span.0);
    let inputs_ty = format_ident!("{}Inputs", camel, span = span.0);
    let outputs_ty = format_ident!("{}Outputs", camel, span = span.0);
    let mut doc = String::new();
    for d in docs {
        doc.push_str(d);
        doc.push('\n');
    }
    if !docs.is_empty() {
        doc.push('\n');
    }
    let sig_in: Vec<String> = inputs.iter().map(|t| format!("`{}: {}`", t.name, t.written)).collect();
    let sig_out: Vec<String> = outputs.iter().map(|t| format!("`{}: {}`", t.name, t.written)).collect();
    doc.push_str(&format!(
        "The typed handle of taskflow `{name}` (generated by `taskflow!`; the program was checked, lowered, verified \
         and scheduled at compile time).\n\nInputs: {}. Outputs: {}.\n\nSet params with the builder methods, then \
         [`program`](Self::program) or [`compile`](Self::compile).",
        sig_in.join(", "),
        sig_out.join(", ")
    ));
    let (src_name, src_text, src_dir) = (&source.name, &source.text, &source.dir);
    let param_sigs = params.iter().map(|p| {
        let n = &p.name;
        let v = match p.default {
            super::ParamValue::Int(i) => quote!(::hpmoe_dsl::embed::ParamValue::Int(#i)),
            super::ParamValue::Float(f) => quote!(::hpmoe_dsl::embed::ParamValue::Float(#f)),
            super::ParamValue::Bool(b) => quote!(::hpmoe_dsl::embed::ParamValue::Bool(#b)),
        };
        quote!(::hpmoe_dsl::embed::ParamSig { name: #n, default: #v })
    });
    let setters = params.iter().map(|p| {
        let n = &p.name;
        let method = if RESERVED_METHODS.contains(&n.as_str()) {
            rust_ident(&format!("set_{n}"), p.span.0)
        } else {
            rust_ident(n, p.span.0)
        };
        let (arg, value, default) = match p.default {
            super::ParamValue::Int(i) => (quote!(i64), quote!(::hpmoe_dsl::ir::Value::Int(value)), i.to_string()),
            super::ParamValue::Float(f) => (
                quote!(f64),
                quote!(::hpmoe_dsl::ir::Value::Float(value)),
                format!("{f:?}"),
            ),
            super::ParamValue::Bool(b) => (quote!(bool), quote!(::hpmoe_dsl::ir::Value::Bool(value)), b.to_string()),
        };
        let mut doc = String::new();
        for d in &p.docs {
            doc.push_str(d);
            doc.push('\n');
        }
        if !p.docs.is_empty() {
            doc.push('\n');
        }
        doc.push_str(&format!("Sets param `{n}` (default `{default}`)."));
        quote! {
            #[doc = #doc]
            #[must_use]
            pub fn #method(mut self, value: #arg) -> Self {
                ::hpmoe_dsl::embed::set_override(&mut self.overrides, #n, #value);
                self
            }
        }
    });
    let fields = |list: &[TensorDesc]| -> (Vec<TokenStream>, Vec<TokenStream>) {
        let mut decls = Vec::new();
        let mut values = Vec::new();
        for t in list {
            let f = rust_ident(&t.name, span.0);
            let doc = format!(
                "`{}: {}`; `{}` at the default params.",
                t.name,
                t.written,
                shape_text(&t.shape)
            );
            decls.push(quote! { #[doc = #doc] pub #f: ::hpmoe_dsl::embed::TensorSig });
            let (n, w) = (&t.name, &t.written);
            let dt = dtype_tokens(t.dtype);
            let dims = t.shape.iter().map(dim_tokens);
            values.push(quote! {
                #f: ::hpmoe_dsl::embed::TensorSig { name: #n, dtype: #dt, shape: &[#(#dims),*], written: #w }
            });
        }
        (decls, values)
    };
    let (in_decls, in_values) = fields(inputs);
    let (out_decls, out_values) = fields(outputs);
    let in_doc = format!("The inputs of taskflow `{name}`, in order.");
    let out_doc = format!("The outputs of taskflow `{name}`, in order.");
    quote! {
        #[doc = #doc]
        #[derive(Clone, Debug, Default, PartialEq)]
        #[allow(dead_code)]
        pub struct #ty {
            overrides: ::std::vec::Vec<::hpmoe_dsl::check::Override>,
        }

        #[doc = #in_doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(dead_code)]
        pub struct #inputs_ty {
            #(#in_decls,)*
        }

        #[doc = #out_doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(dead_code)]
        pub struct #outputs_ty {
            #(#out_decls,)*
        }

        #[allow(dead_code, clippy::all)]
        impl #ty {
            /// The taskflow's name in the program.
            pub const NAME: &'static str = #name;
            /// The program (checked at compile time), re-checked at run time with the overrides.
            pub const SOURCE: ::hpmoe_dsl::embed::Source = ::hpmoe_dsl::embed::Source {
                name: #src_name,
                text: #src_text,
                dir: #src_dir,
            };
            /// The program's params with their default values, in definition order.
            pub const PARAMS: &'static [::hpmoe_dsl::embed::ParamSig] = &[#(#param_sigs),*];
            /// The inputs: names, dtypes and shapes at the default params.
            pub const INPUTS: #inputs_ty = #inputs_ty { #(#in_values,)* };
            /// The outputs: names, dtypes and shapes at the default params.
            pub const OUTPUTS: #outputs_ty = #outputs_ty { #(#out_values,)* };

            /// A handle with every param at its default.
            pub fn new() -> Self {
                Self { overrides: ::std::vec::Vec::new() }
            }

            #(#setters)*

            /// Overrides a param or a device field (`device.hbm_bandwidth`) by name; checked
            /// by [`program`](Self::program).
            #[must_use]
            pub fn set(mut self, name: &str, value: ::hpmoe_dsl::ir::Value) -> Self {
                ::hpmoe_dsl::embed::set_override(&mut self.overrides, name, value);
                self
            }

            /// The overrides set so far.
            pub fn overrides(&self) -> &[::hpmoe_dsl::check::Override] {
                &self.overrides
            }

            /// The checked program with the overrides.
            pub fn program(&self) -> ::std::result::Result<::hpmoe_dsl::ir::Program, ::hpmoe_dsl::embed::Error> {
                Self::SOURCE.program(&self.overrides)
            }

            /// Checks with the overrides, then lowers, verifies and schedules this taskflow with
            /// `policy` (default: the program's `schedule` for it, else `interleaved`).
            pub fn compile(
                &self,
                policy: ::std::option::Option<::hpmoe_dsl::schedule::Policy>,
            ) -> ::std::result::Result<::hpmoe_dsl::embed::CompiledTaskflow, ::hpmoe_dsl::embed::Error> {
                Self::SOURCE.compile(Self::NAME, &self.overrides, policy)
            }
        }
    }
}

/// `moe_ffn` → `MoeFfn`.
fn camel_case(name: &str) -> String {
    let mut s = String::new();
    for part in name.split('_').filter(|p| !p.is_empty()) {
        let mut cs = part.chars();
        if let Some(c) = cs.next() {
            s.extend(c.to_uppercase());
            s.push_str(cs.as_str());
        }
    }
    // A Rust identifier must start with a letter or `_` (the language's names are ASCII).
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) || !s.chars().all(|c| c.is_ascii_alphanumeric()) {
        s.retain(|c| c.is_ascii_alphanumeric());
        s.insert_str(0, "Taskflow");
    }
    s
}

/// Rust keywords: a name of the language that is one becomes a raw identifier (or gets a
/// trailing `_` where Rust has no raw form).
const KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if", "impl", "in", "let",
    "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct", "trait", "true", "type",
    "unsafe", "use", "where", "while", "async", "await", "dyn", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
];

fn rust_ident(name: &str, span: PSpan) -> Ident {
    match name {
        "self" | "Self" | "super" | "crate" | "_" => Ident::new(&format!("{name}_"), span),
        n if KEYWORDS.contains(&n) => Ident::new_raw(n, span),
        n => Ident::new(n, span),
    }
}
