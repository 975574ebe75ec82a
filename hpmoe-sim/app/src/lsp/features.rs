//! The answers to requests: hover, definition, completion, formatting, semantic tokens.
//!
//! Each is a function of one document's text and its [`Analysis`]. Names are found by the
//! token under the cursor (the logos lexer of the compiler) and resolved as the checker does:
//! a taskflow's inputs and `let`s, an op's parameters, then the program's globals (the
//! document's own before those of its imports and the stdlib).

use super::analysis::{Analysis, Def, DefKind, Tok};
use super::files;
use hpmoe_dsl::ir::{self, DType, Dim, Program, Taskflow, DEVICE_FIELDS};
use hpmoe_dsl::policy::Policy;
use hpmoe_dsl::syntax::ast::{self, ItemKind};
use hpmoe_dsl::syntax::token::{Delim, Punct};
use hpmoe_dsl::Span;
use lsp_types as lsp;
use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::OnceLock;

/// The keywords of the language (the `kw_*` rules of the reference grammar).
pub const KEYWORDS: &[&str] = &[
    "import",
    "param",
    "device",
    "route",
    "op",
    "comm",
    "taskflow",
    "grad",
    "schedule",
    "profile",
    "routing",
    "policy",
    "on",
    "tile",
    "order",
    "priority",
    "let",
    "return",
    "put",
    "sum",
    "max",
    "cast",
    "in",
    "group",
    "wrt",
    "save",
    "straight_through",
    "detach",
];
const ENGINES: &[(&str, &str)] = &[("aic", "the cube cores (matrix units)"), ("aiv", "the vector cores")];

/// The most tasks a hover lowers a taskflow to (to count a call's tiles).
pub const HOVER_MAX_TASKS: u64 = 2_000_000;

/// The text of a token.
fn tok_text(text: &str, span: Span) -> &str {
    text.get(span.lo as usize..span.hi as usize).unwrap_or("")
}

/// The identifier token at a byte offset (one that contains it, or ends at it), with its
/// index among `toks` (found by a binary search: the tokens are in order and disjoint).
fn ident_at<'t>(toks: &[(Span, Tok)], text: &'t str, offset: usize) -> Option<(usize, &'t str, Span)> {
    let o = offset as u32;
    // The tokens that start at or before the offset; of those, only the last few can reach it.
    let end = toks.partition_point(|(s, _)| s.lo <= o);
    let mut first = end;
    while first > 0 && toks[first - 1].0.hi >= o {
        first -= 1;
    }
    let mut best = None;
    for (i, &(span, kind)) in toks.iter().enumerate().take(end).skip(first) {
        if kind == Tok::Ident {
            if span.lo <= o && o < span.hi {
                return Some((i, tok_text(text, span), span));
            }
            if span.hi == o {
                best = Some((i, tok_text(text, span), span));
            }
        }
    }
    best
}

fn is_punct(toks: &[(Span, Tok)], i: Option<usize>, p: Punct) -> bool {
    i.and_then(|i| toks.get(i)).is_some_and(|t| t.1 == Tok::Punct(p))
}

fn ident_text<'t>(toks: &[(Span, Tok)], text: &'t str, i: Option<usize>) -> Option<&'t str> {
    match toks.get(i?)? {
        &(span, Tok::Ident) => Some(tok_text(text, span)),
        _ => None,
    }
}

fn contains(span: Span, offset: u32) -> bool {
    span.lo <= offset && offset <= span.hi
}

/// The item of the document that holds an offset (the first, where two touch it; found by a
/// binary search: the items are in order).
fn item_at(file: &ast::File, offset: u32) -> Option<&ast::Item> {
    let i = file.items.partition_point(|it| it.span.hi < offset);
    file.items[i..]
        .iter()
        .take_while(|it| it.span.lo <= offset)
        .find(|it| contains(it.span, offset))
}

/// Where the name under the cursor is.
struct Cursor<'t> {
    name: &'t str,
    span: Span,
    /// A call: `(` follows.
    call: bool,
    /// After `.`: the name before the dot.
    field_of: Option<&'t str>,
    /// A field name: `:` follows.
    field_name: bool,
}

fn cursor<'t>(toks: &[(Span, Tok)], text: &'t str, offset: usize) -> Option<Cursor<'t>> {
    let (i, name, span) = ident_at(toks, text, offset)?;
    let call = toks.get(i + 1).is_some_and(|t| t.1 == Tok::Open(Delim::Paren));
    let field_of = if is_punct(toks, i.checked_sub(1), Punct::Dot) {
        ident_text(toks, text, i.checked_sub(2))
    } else {
        None
    };
    Some(Cursor {
        name,
        span,
        call,
        field_of,
        field_name: is_punct(toks, Some(i + 1), Punct::Colon),
    })
}

// ---------------------------------------------------------------- shapes and values

/// `[4096, recv(r) ≤ 12288]`.
fn shape_text(p: &Program, dims: &[Dim]) -> String {
    let ds: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Recv(r) => {
                let rs = p.route(*r);
                format!("{}.recv ≤ {}", rs.name, rs.capacity)
            }
        })
        .collect();
    format!("[{}]", ds.join(", "))
}

fn tensor_line(p: &Program, t: &ir::Tensor) -> String {
    format!("{}: {}{}", t.name, t.dtype.name(), shape_text(p, &t.shape))
}

fn home_text(t: &ir::Tensor) -> &'static str {
    match t.home {
        ir::Home::Input => "a taskflow input in each rank's HBM",
        ir::Home::Hbm => "an intermediate result in each rank's HBM",
        ir::Home::Window => "a receive window (symmetric memory) written by remote puts",
    }
}

/// Bytes per rank of a tensor of fixed shape.
fn tensor_bytes(t: &ir::Tensor) -> Option<u64> {
    t.shape
        .iter()
        .try_fold(t.dtype.size(), |acc, d| d.fixed().and_then(|n| acc.checked_mul(n)))
}

fn number(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn device_field(p: &Program, name: &str) -> Option<String> {
    let spec = DEVICE_FIELDS.iter().find(|f| f.name == name)?;
    let mut s = format!("```hpm\ndevice.{name}\n```\n{}", spec.doc.trim());
    if let Some(f) = p.device.fields().find(|f| f.spec.name == name) {
        let v = number(f.value / f.unit.factor);
        let unit = if matches!(f.unit.name, "count" | "ratio") {
            ""
        } else {
            f.unit.name
        };
        let _ = write!(
            s,
            "\n\nValue: `{v}{}{unit}` (device `{}`)",
            if unit.is_empty() { "" } else { " " },
            p.device.profile
        );
    }
    Some(s)
}

fn device_field_doc(name: &str) -> Option<String> {
    let spec = DEVICE_FIELDS.iter().find(|f| f.name == name)?;
    Some(format!(
        "```hpm\ndevice.{name}\n```\n{} ({})",
        spec.doc.trim(),
        spec.quantity.word()
    ))
}

// ---------------------------------------------------------------- hover

/// The tiles per rank of every call of a taskflow, under the program's policy (lowered once
/// per analysis).
fn tile_counts(a: &Analysis, tf: &Taskflow) -> Result<(String, Vec<Vec<u32>>), String> {
    if let Some(r) = a.tiles.borrow().get(&tf.name) {
        return r.clone();
    }
    let r = count_tiles(a, tf);
    a.tiles.borrow_mut().insert(tf.name.clone(), r.clone());
    r
}

fn count_tiles(a: &Analysis, tf: &Taskflow) -> Result<(String, Vec<Vec<u32>>), String> {
    let checked = a.checked.as_ref().ok_or("the program has errors")?;
    let spec = checked.select_policy(&tf.name, None);
    let layouts = checked.layouts(spec.static_capacity).map_err(|d| d.message)?;
    let opts = spec.lower_options(checked.program(), HOVER_MAX_TASKS);
    let g = hpmoe_dsl::lower::lower(checked.program(), tf, layouts, &opts).map_err(|d| d.message)?;
    Ok((
        spec.policy.name().to_string(),
        g.nodes
            .iter()
            .map(|n| n.per_rank.iter().map(|r| r.count).collect())
            .collect(),
    ))
}

fn per_rank_text(counts: &[u32]) -> String {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let (lo, hi) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    if lo == hi {
        return format!("{lo} on each of {} ranks ({total} in all)", counts.len());
    }
    let shown: Vec<String> = counts
        .iter()
        .take(8)
        .enumerate()
        .map(|(r, c)| format!("{r}: {c}"))
        .collect();
    let more = if counts.len() > 8 { ", ..." } else { "" };
    format!(
        "{lo} to {hi} per rank ({total} in all over {} ranks; {}{more})",
        counts.len(),
        shown.join(", ")
    )
}

fn call_hover(a: &Analysis, p: &Program, tf: &Taskflow, n: usize) -> String {
    let node = &tf.nodes[n];
    let op = p.op(node.op);
    let out = tf.tensor(node.output);
    let mut s = format!("```hpm\n{}\n```\n", op.signature);
    let _ = write!(
        s,
        "Call `{}` in `{}` on {}: `{}`",
        node.name,
        tf.name,
        node.engine.name(),
        tensor_line(p, out)
    );
    let ins: Vec<String> = node.inputs.iter().map(|&t| tensor_line(p, tf.tensor(t))).collect();
    if !ins.is_empty() {
        let _ = write!(s, "\n\nInputs: `{}`", ins.join("`, `"));
    }
    if !node.tile.is_empty() {
        let t: Vec<String> = node.tile.iter().map(|(v, n)| format!("{v}: {n}")).collect();
        let _ = write!(s, "\n\nTile: `{}`", t.join(", "));
    }
    match tile_counts(a, tf) {
        Ok((policy, counts)) => {
            if let Some(c) = counts.get(n) {
                let _ = write!(s, "\n\nTiles per rank ({policy}): {}", per_rank_text(c));
            }
        }
        Err(e) => {
            let _ = write!(s, "\n\nTiles per rank: not counted ({e})");
        }
    }
    if !op.docs.is_empty() {
        let _ = write!(s, "\n\n{}", op.docs.join("\n"));
    }
    s
}

fn def_hover(a: &Analysis, d: &Def) -> String {
    let text = a.source_text(d.item_span.file).unwrap_or("");
    let item = text.get(d.item_span.lo as usize..d.item_span.hi as usize).unwrap_or("");
    // The head of the item: up to its body's brace, or its whole first line.
    let head = match d.kind {
        DefKind::Op | DefKind::Comm | DefKind::Taskflow | DefKind::Profile => {
            item.split('{').next().unwrap_or(item).trim_end()
        }
        _ => item.lines().next().unwrap_or(item),
    };
    let head: String = head.chars().take(600).collect();
    let mut s = format!("```hpm\n{head}\n```");
    let p = a.checked.as_deref();
    match (d.kind, p) {
        (DefKind::Param, Some(p)) => {
            if let Some((_, v)) = p.params.iter().find(|(n, _)| *n == d.name) {
                let _ = write!(s, "\nValue: `{v}`");
            }
        }
        (DefKind::Route, Some(p)) => {
            if let Some(r) = p.routes.iter().find(|r| r.name == d.name) {
                let _ = write!(
                    s,
                    "\nRouting of {} tokens per rank to {} experts (top {}) over {} ranks; receive window of {} rows per rank",
                    r.tokens, r.experts, r.topk, r.ranks, r.capacity
                );
            }
        }
        (DefKind::Taskflow, Some(p)) => {
            if let Some(tf) = p.taskflow(&d.name) {
                let ins: Vec<String> = tf.inputs.iter().map(|&t| tensor_line(p, tf.tensor(t))).collect();
                let outs: Vec<String> = tf
                    .outputs
                    .iter()
                    .map(|(n, t)| {
                        let t = tf.tensor(*t);
                        format!("{n}: {}{}", t.dtype.name(), shape_text(p, &t.shape))
                    })
                    .collect();
                let _ = write!(
                    s,
                    "\n{} op calls. Inputs: `{}`. Outputs: `{}`",
                    tf.nodes.len(),
                    ins.join("`, `"),
                    outs.join("`, `")
                );
            }
        }
        (DefKind::Policy, Some(p)) => {
            if let Some(pd) = p.policy_decl(&d.name) {
                let o: Vec<String> = pd.defaults.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                let _ = write!(s, "\nDefaults: `{}`", o.join(", "));
            }
        }
        _ => {}
    }
    if let Some(f) = a.sources.get(d.item_span.file) {
        if d.item_span.file != a.root {
            let _ = write!(s, "\n\nFrom `{}`", f.name);
        }
    }
    if !d.docs.is_empty() {
        let _ = write!(s, "\n\n{}", d.docs.join("\n"));
    }
    s
}

/// The markdown shown for the name at `offset`, if any.
pub fn hover(a: &Analysis, text: &str, offset: usize) -> Option<(String, Span)> {
    let c = cursor(&a.lexed().toks, text, offset)?;
    let o = offset as u32;
    let p = a.checked.as_deref();
    let item = item_at(&a.ast, o);
    // `device.FIELD`, or a field of a device or profile declaration.
    let in_device = item.is_some_and(|it| matches!(it.kind, ItemKind::Device(_) | ItemKind::Profile(_)));
    if c.field_of == Some("device") || (in_device && c.field_name) {
        let s = match p {
            Some(p) => device_field(p, c.name),
            None => device_field_doc(c.name),
        };
        if let Some(s) = s {
            return Some((s, c.span));
        }
    }
    if let Some(d) = DType::parse(c.name) {
        return Some((
            format!("```hpm\n{}\n```\ndtype of {} byte(s) per element", d.name(), d.size()),
            c.span,
        ));
    }
    if let Some((e, doc)) = ENGINES.iter().find(|(e, _)| *e == c.name) {
        return Some((format!("```hpm\non {e}\n```\n{doc}"), c.span));
    }
    // Inside a taskflow: its calls and tensors.
    if let (
        Some(p),
        Some(ast::Item {
            kind: ItemKind::Taskflow(t),
            ..
        }),
    ) = (p, item)
    {
        if let Some(tf) = p.taskflow(&t.name.name) {
            if c.call {
                let best = tf
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.span.file == a.root && contains(n.span, o) && p.op(n.op).name == c.name)
                    .min_by_key(|(_, n)| n.span.len());
                if let Some((i, _)) = best {
                    return Some((call_hover(a, p, tf, i), c.span));
                }
            } else if let Some(tn) = tf.tensors.iter().find(|x| x.name == c.name) {
                let mut s = format!("```hpm\n{}\n```\n{}", tensor_line(p, tn), home_text(tn));
                if let Some(b) = tensor_bytes(tn) {
                    let _ = write!(s, "; {b} bytes per rank");
                }
                if let Some(n) = tn.producer {
                    let _ = write!(s, "\n\nProduced by `{}`", p.op(tf.node(n).op).name);
                }
                return Some((s, c.span));
            }
        }
    }
    if let Some(d) = a.def_named(c.name) {
        return Some((def_hover(a, d), c.span));
    }
    if let Some((m, d)) = stdlib_defs().iter().find(|(_, d)| d.name == c.name) {
        let mut s = format!("`{}` {} from `std::{m}`", d.name, d.kind.word());
        if !d.docs.is_empty() {
            let _ = write!(s, "\n\n{}", d.docs.join("\n"));
        }
        return Some((s, c.span));
    }
    None
}

// ---------------------------------------------------------------- definition

/// A local name of the item at `offset`: a taskflow's input, output or `let`, an op's
/// parameter, generic or `let`.
fn local_def(item: &ast::Item, name: &str) -> Option<Span> {
    match &item.kind {
        ItemKind::Taskflow(t) => {
            let lets = t.body.iter().filter_map(|s| match &s.kind {
                ast::FlowStmtKind::Let { name, .. } => Some(name),
                ast::FlowStmtKind::Return { .. } => None,
            });
            let outs: Vec<&ast::Ident> = match &t.ret {
                ast::TaskflowRet::Named(v) => v.iter().map(|(n, _)| n).collect(),
                ast::TaskflowRet::Single(_) => Vec::new(),
            };
            t.params
                .iter()
                .map(|p| &p.name)
                .chain(lets)
                .chain(outs)
                .find(|i| i.name == name)
                .map(|i| i.span)
        }
        ItemKind::Op(op) => {
            let lets = op.body.iter().filter_map(|s| match s {
                ast::Stmt::Let { name, .. } => Some(name),
                _ => None,
            });
            op.params
                .iter()
                .map(|p| &p.name)
                .chain(op.generics.iter())
                .chain(lets)
                .find(|i| i.name == name)
                .map(|i| i.span)
        }
        _ => None,
    }
}

/// The location of the definition of the name at `offset`.
pub fn definition(a: &Analysis, uri: &lsp::Uri, text: &str, offset: usize) -> Option<lsp::Location> {
    let o = offset as u32;
    // The module or file of an import.
    if let Some(ast::Item {
        kind: ItemKind::Import(imp),
        ..
    }) = item_at(&a.ast, o)
    {
        match &imp.source {
            ast::ImportSource::File(path, span) if contains(*span, o) => {
                let base = files::uri_to_path(uri.as_str())?;
                let target = base.parent()?.join(path);
                let target = std::fs::canonicalize(&target).ok()?;
                return Some(lsp::Location {
                    uri: lsp::Uri::from_str(&files::path_to_uri(&target)).ok()?,
                    range: lsp::Range::default(),
                });
            }
            ast::ImportSource::Std(segs) => {
                if let Some(seg) = segs.iter().skip(1).find(|s| contains(s.span, o)) {
                    let p = files::stdlib_path(&seg.name)?;
                    return Some(lsp::Location {
                        uri: lsp::Uri::from_str(&files::path_to_uri(&p)).ok()?,
                        range: lsp::Range::default(),
                    });
                }
            }
            _ => {}
        }
    }
    let c = cursor(&a.lexed().toks, text, offset)?;
    if c.field_of.is_none() {
        if let Some(span) = item_at(&a.ast, o).and_then(|it| local_def(it, c.name)) {
            return a.location(span, uri);
        }
    }
    let d = a.def_named(c.name)?;
    a.location(d.name_span, uri)
}

// ---------------------------------------------------------------- completion

/// The definitions of every stdlib module (for completion and hover of names not imported).
fn stdlib_defs() -> &'static [(&'static str, Def)] {
    static DEFS: OnceLock<Vec<(&'static str, Def)>> = OnceLock::new();
    DEFS.get_or_init(|| {
        let mut out = Vec::new();
        for (i, (m, text)) in hpmoe_dsl::stdlib::MODULES.iter().enumerate() {
            let (file, _, _) = hpmoe_dsl::syntax::parse_text(text, hpmoe_dsl::FileId(i as u32));
            let mut defs = Vec::new();
            super::analysis::collect_defs(&file, &mut defs);
            out.extend(defs.into_iter().map(|d| (*m, d)));
        }
        out
    })
}

fn item(label: &str, kind: lsp::CompletionItemKind, detail: String, doc: Option<String>) -> lsp::CompletionItem {
    lsp::CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail: Some(detail),
        documentation: doc.map(|d| {
            lsp::Documentation::MarkupContent(lsp::MarkupContent {
                kind: lsp::MarkupKind::Markdown,
                value: d,
            })
        }),
        ..Default::default()
    }
}

fn def_kind(k: DefKind) -> lsp::CompletionItemKind {
    match k {
        DefKind::Param => lsp::CompletionItemKind::CONSTANT,
        DefKind::Route => lsp::CompletionItemKind::VARIABLE,
        DefKind::Op | DefKind::Comm | DefKind::RoutingKind => lsp::CompletionItemKind::FUNCTION,
        DefKind::Taskflow => lsp::CompletionItemKind::MODULE,
        DefKind::Profile | DefKind::Policy => lsp::CompletionItemKind::ENUM_MEMBER,
    }
}

/// Completions at `offset`: after `device.` the device fields, after `on` the engines,
/// after `schedule ... =` the policies, else every keyword, op, param, routing, taskflow,
/// dtype, engine, policy, routing kind and profile in scope (the stdlib's too), and the
/// device fields inside a device or profile declaration; at most [`MAX_COMPLETIONS`] of
/// them (the answer then says it is incomplete).
pub fn completion(a: &Analysis, text: &str, offset: usize) -> lsp::CompletionResponse {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    // The word starts after the last character that is not part of one (which may be
    // several bytes long: `€`, a no-break space).
    let word_start = before
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let prefix = &before[word_start..];
    let head = before[..word_start].trim_end();
    let line = head.rsplit('\n').next().unwrap_or(head);
    let fields = || {
        DEVICE_FIELDS
            .iter()
            .map(|f| {
                item(
                    f.name,
                    lsp::CompletionItemKind::FIELD,
                    format!("device field: {}", f.quantity.word()),
                    Some(f.doc.trim().to_string()),
                )
            })
            .collect::<Vec<_>>()
    };
    let engines = || {
        ENGINES
            .iter()
            .map(|(e, d)| {
                item(
                    e,
                    lsp::CompletionItemKind::ENUM_MEMBER,
                    "engine".into(),
                    Some(d.to_string()),
                )
            })
            .collect::<Vec<_>>()
    };
    let policies = || {
        Policy::ALL
            .iter()
            .map(|p| item(p.name(), lsp::CompletionItemKind::ENUM_MEMBER, "policy".into(), None))
            .collect::<Vec<_>>()
    };
    let mut out = Completions::new(prefix);
    if head.ends_with('.') && head[..head.len() - 1].trim_end().ends_with("device") {
        out.extend(fields());
    } else if head.ends_with(" on") || head == "on" || head.ends_with("\ton") || head.ends_with("\non") {
        out.extend(engines());
    } else if line.trim_start().starts_with("schedule") && line.ends_with('=') {
        out.extend(policies());
    } else {
        for k in KEYWORDS {
            out.add(k, || item(k, lsp::CompletionItemKind::KEYWORD, "keyword".into(), None));
        }
        for d in DType::ALL {
            out.add(d.name(), || {
                item(
                    d.name(),
                    lsp::CompletionItemKind::TYPE_PARAMETER,
                    format!("dtype, {} byte(s)", d.size()),
                    None,
                )
            });
        }
        out.extend(engines());
        out.extend(policies());
        for d in &a.defs {
            out.add(&d.name, || {
                item(
                    &d.name,
                    def_kind(d.kind),
                    d.kind.word().into(),
                    (!d.docs.is_empty()).then(|| d.docs.join("\n")),
                )
            });
        }
        for (m, d) in stdlib_defs() {
            out.add(&d.name, || {
                item(
                    &d.name,
                    def_kind(d.kind),
                    format!("{} from std::{m}", d.kind.word()),
                    (!d.docs.is_empty()).then(|| d.docs.join("\n")),
                )
            });
        }
        let in_device = item_at(&a.ast, offset as u32)
            .is_some_and(|it| matches!(it.kind, ItemKind::Device(_) | ItemKind::Profile(_)));
        if in_device {
            out.extend(fields());
        }
    }
    out.finish()
}

/// The most completions one answer lists; past it the list is marked incomplete (the client
/// asks again as the word grows).
pub const MAX_COMPLETIONS: usize = 1000;

/// The completions of one request: those whose label starts with the word typed so far, one
/// per label (the first: the document's own definition before the stdlib's), at most
/// [`MAX_COMPLETIONS`]. An item is built only once it is kept.
struct Completions<'p> {
    prefix: &'p str,
    seen: std::collections::HashSet<String>,
    items: Vec<lsp::CompletionItem>,
    incomplete: bool,
}

impl<'p> Completions<'p> {
    fn new(prefix: &'p str) -> Self {
        Completions {
            prefix,
            seen: Default::default(),
            items: Vec::new(),
            incomplete: false,
        }
    }

    fn add(&mut self, label: &str, make: impl FnOnce() -> lsp::CompletionItem) {
        if self.incomplete || !label.starts_with(self.prefix) || self.seen.contains(label) {
            return;
        }
        if self.items.len() == MAX_COMPLETIONS {
            self.incomplete = true;
            return;
        }
        self.seen.insert(label.to_string());
        self.items.push(make());
    }

    fn extend(&mut self, items: Vec<lsp::CompletionItem>) {
        for c in items {
            let label = c.label.clone();
            self.add(&label, || c);
        }
    }

    fn finish(self) -> lsp::CompletionResponse {
        if self.incomplete {
            lsp::CompletionResponse::List(lsp::CompletionList {
                is_incomplete: true,
                items: self.items,
            })
        } else {
            lsp::CompletionResponse::Array(self.items)
        }
    }
}

// ---------------------------------------------------------------- formatting

/// The edits that format the document as `hpmoe fmt` does; `None` when it does not parse.
pub fn formatting(text: &str) -> Option<Vec<lsp::TextEdit>> {
    let out = hpmoe_dsl::syntax::fmt::format_source(text).ok()?;
    if out == text {
        return Some(Vec::new());
    }
    let idx = super::text::LineIndex::new(text);
    Some(vec![lsp::TextEdit {
        range: idx.range(text, 0, text.len()),
        new_text: out,
    }])
}

// ---------------------------------------------------------------- semantic tokens

/// The token types of the legend, in order (a token's type is its index here).
pub const TOKEN_TYPES: &[lsp::SemanticTokenType] = &[
    lsp::SemanticTokenType::KEYWORD,
    lsp::SemanticTokenType::TYPE,
    lsp::SemanticTokenType::FUNCTION,
    lsp::SemanticTokenType::VARIABLE,
    lsp::SemanticTokenType::PARAMETER,
    lsp::SemanticTokenType::PROPERTY,
    lsp::SemanticTokenType::NUMBER,
    lsp::SemanticTokenType::STRING,
    lsp::SemanticTokenType::COMMENT,
    lsp::SemanticTokenType::ENUM_MEMBER,
    lsp::SemanticTokenType::NAMESPACE,
];
/// The modifiers of the legend (bit `i` is the modifier at index `i`).
pub const TOKEN_MODIFIERS: &[lsp::SemanticTokenModifier] = &[
    lsp::SemanticTokenModifier::DECLARATION,
    lsp::SemanticTokenModifier::DOCUMENTATION,
];

const T_KEYWORD: u32 = 0;
const T_TYPE: u32 = 1;
const T_FUNCTION: u32 = 2;
const T_VARIABLE: u32 = 3;
const T_PARAMETER: u32 = 4;
const T_PROPERTY: u32 = 5;
const T_NUMBER: u32 = 6;
const T_STRING: u32 = 7;
const T_COMMENT: u32 = 8;
const T_ENUM_MEMBER: u32 = 9;
const T_NAMESPACE: u32 = 10;
const M_DECLARATION: u32 = 1;
const M_DOCUMENTATION: u32 = 2;

/// The spans of the parameters and generics of the document's ops and taskflows.
fn parameter_spans(file: &ast::File) -> (Vec<Span>, Vec<Span>) {
    let mut params = Vec::new();
    let mut generics = Vec::new();
    for it in &file.items {
        match &it.kind {
            ItemKind::Op(o) => {
                params.extend(o.params.iter().map(|p| p.name.span));
                generics.extend(o.generics.iter().map(|g| g.span));
            }
            ItemKind::Taskflow(t) => {
                params.extend(t.params.iter().map(|p| p.name.span));
                if let ast::TaskflowRet::Named(v) = &t.ret {
                    params.extend(v.iter().map(|(n, _)| n.span));
                }
            }
            _ => {}
        }
    }
    (params, generics)
}

/// The semantic tokens of the document, encoded as the protocol wants (relative
/// positions, UTF-16 lengths, one token per line for tokens that span lines).
pub fn semantic_tokens(a: &Analysis, text: &str) -> Vec<lsp::SemanticToken> {
    let lexed = a.lexed();
    let toks = &lexed.toks;
    // Sorted, for a binary search per token.
    let sorted = |mut v: Vec<Span>| {
        v.sort_unstable_by_key(|s| (s.lo, s.hi));
        v
    };
    let has = |v: &[Span], s: Span| v.binary_search_by_key(&(s.lo, s.hi), |x| (x.lo, x.hi)).is_ok();
    let (params, generics) = parameter_spans(&a.ast);
    let (params, generics) = (sorted(params), sorted(generics));
    let declared = sorted(
        a.defs
            .iter()
            .filter(|d| d.name_span.file == a.root)
            .map(|d| d.name_span)
            .collect(),
    );
    let mut raw: Vec<(u32, u32, u32, u32)> = Vec::new();
    let mut in_import = false;
    for (i, &(span, kind)) in toks.iter().enumerate() {
        let (ty, mods) = match kind {
            Tok::Ident => {
                let n = tok_text(text, span);
                let prev_dot = is_punct(toks, i.checked_sub(1), Punct::Dot);
                let next_colon = is_punct(toks, Some(i + 1), Punct::Colon);
                let next_path = is_punct(toks, Some(i + 1), Punct::ColonColon);
                if n == "import" && !prev_dot {
                    in_import = true;
                }
                let decl = if has(&declared, span) { M_DECLARATION } else { 0 };
                let ty = if has(&params, span) {
                    T_PARAMETER
                } else if has(&generics, span) {
                    T_TYPE
                } else if prev_dot {
                    T_PROPERTY
                } else if in_import && next_path {
                    T_NAMESPACE
                } else if KEYWORDS.contains(&n) && !next_colon {
                    T_KEYWORD
                } else if DType::parse(n).is_some() {
                    T_TYPE
                } else if ENGINES.iter().any(|(e, _)| *e == n) || Policy::parse(n).is_some() {
                    T_ENUM_MEMBER
                } else if next_colon {
                    T_PROPERTY
                } else {
                    match a
                        .def_named(n)
                        .map(|d| d.kind)
                        .or_else(|| stdlib_defs().iter().find(|(_, d)| d.name == n).map(|(_, d)| d.kind))
                    {
                        Some(DefKind::Op | DefKind::Comm | DefKind::RoutingKind) => T_FUNCTION,
                        Some(DefKind::Profile | DefKind::Policy) => T_ENUM_MEMBER,
                        Some(DefKind::Taskflow) => T_NAMESPACE,
                        Some(DefKind::Param | DefKind::Route) | None => {
                            if ir::Func::parse(n).is_some()
                                && toks.get(i + 1).is_some_and(|t| t.1 == Tok::Open(Delim::Paren))
                            {
                                T_FUNCTION
                            } else {
                                T_VARIABLE
                            }
                        }
                    }
                };
                (ty, decl)
            }
            Tok::Number => (T_NUMBER, 0),
            Tok::Str => (T_STRING, 0),
            Tok::Doc => (T_COMMENT, M_DOCUMENTATION),
            Tok::Punct(Punct::Semi) => {
                in_import = false;
                continue;
            }
            _ => continue,
        };
        raw.push((span.lo, span.hi, ty, mods));
    }
    raw.extend(lexed.comments.iter().map(|c| (c.lo, c.hi, T_COMMENT, 0)));
    raw.sort_unstable();
    let Some(idx) = a.lines(a.root) else {
        return Vec::new();
    };
    let mut walk = super::text::Walker::new(idx, text);
    let mut out = Vec::new();
    let (mut last_line, mut last_start) = (0u32, 0u32);
    for (lo, hi, ty, mods) in raw {
        let (lo, hi) = (lo as usize, (hi as usize).min(text.len()));
        let start = walk.position(lo);
        let end = walk.position(hi);
        // One piece per line the token covers.
        for line in start.line..=end.line {
            let (ls, le) = match idx.line_range(text, line as usize) {
                Some(r) => r,
                None => break,
            };
            let a0 = if line == start.line { lo } else { ls };
            let b0 = if line == end.line { hi.min(le) } else { le };
            if b0 <= a0 {
                continue;
            }
            let col = if line == start.line { start.character } else { 0 };
            let len = text.get(a0..b0).map_or(0, |s| s.encode_utf16().count() as u32);
            let delta_line = line - last_line;
            let delta_start = if delta_line == 0 { col - last_start } else { col };
            out.push(lsp::SemanticToken {
                delta_line,
                delta_start,
                length: len,
                token_type: ty,
                token_modifiers_bitset: mods,
            });
            last_line = line;
            last_start = col;
        }
    }
    out
}
