//! The canonical formatter.
//!
//! In: a parsed [`File`], the comments the lexer collected and the source text. Out: the
//! file in canonical layout ([`format_file`]); [`format_source`] parses first and refuses text
//! with syntax errors.
//!
//! Layout (rustfmt-like):
//!
//! - 4-space indentation, lines of at most [`MAX_WIDTH`] columns where the language allows;
//! - a blank line between items of different kinds and around blocks (ops, comms, taskflows,
//!   profiles, devices with fields); consecutive params, imports, routes, schedules and
//!   signatures keep at most one blank line the user put between them; blank lines inside
//!   blocks are kept (at most one), never at the start or the end of a block;
//! - `a: b`, `a = b`, binary operators spaced (`2 * N`), parentheses only where precedence,
//!   associativity or the greedy body of `sum(..)` needs them (the parser drops them);
//! - headers (`op`, `comm`, `taskflow`, `route`, `routing`, `policy`, `schedule`, `import`) on one
//!   line when they fit, else their lists (parameters first, then results or tiles) one element
//!   per line with a trailing comma; a list containing a comment or a doc comment is always
//!   laid out one element per line;
//! - fields of devices and profiles one per line with a trailing comma;
//! - taskflow annotations after the call on the same line; when the line is too long the
//!   annotations go one per continuation line and over-long calls break their arguments one
//!   per line;
//! - doc comments as `/// text` and `//! text`; units as `1.6 TB/s`; floats in their shortest
//!   round-trip form (always with a `.` or an exponent), integers in decimal.
//!
//! Comments: every comment of the input is printed exactly once, with its text unchanged. A
//! comment on its own line(s) before a construct (item, field, parameter, statement, closing
//! bracket) stays before it; a comment after the end of a construct on the same source line
//! stays at the end of its line. A comment inside a construct that is printed on one line
//! moves: a `//` comment to its own line just before the line, a `/* */` comment to the end of
//! the line. One mechanism does this: comments sorted by position, each flushed the first time
//! a printed line reaches past its start (see `Printer::lead`, `Printer::eol`,
//! `Printer::flush_before`); whatever is left is printed at the end of the file.

use super::ast::*;
use super::lexer::{self, Comment};
use super::token::{Delim, FileId, Span, TokenKind};
use crate::diag::Diagnostic;
use std::fmt::Write as _;

/// The column limit.
pub const MAX_WIDTH: usize = 100;

/// Formats a source text. Returns its syntax errors when it does not parse.
pub fn format_source(src: &str) -> Result<String, Vec<Diagnostic>> {
    let (file, diags, comments) = super::parse_text(src, FileId(0));
    if diags.iter().any(Diagnostic::is_error) {
        return Err(diags);
    }
    Ok(format_file(&file, &comments, src))
}

/// Formats a parsed file. `comments` and `src` are the comments and the text it was parsed
/// from (spans are byte offsets into `src`).
pub fn format_file(file: &File, comments: &[Comment], src: &str) -> String {
    let mut p = Printer::new(src, comments);
    p.file(file);
    p.finish()
}

// ------------------------------------------------------------------------- expressions

fn pad(indent: usize) -> String {
    "    ".repeat(indent)
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// A float literal that lexes back to the same value and stays a float token.
fn float_text(v: f64) -> String {
    let s = format!("{v:?}");
    if !v.is_finite() || s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

fn quote(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            '\0' => o.push_str("\\0"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn is_binary(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Binary(..))
}

/// Whether an expression can stand before `(`, `[` or `.` without parentheses.
fn is_postfix_level(e: &Expr) -> bool {
    !matches!(e.kind, ExprKind::Neg(_) | ExprKind::Binary(..) | ExprKind::Sum { .. })
}

/// Whether `r`, the right operand of `op`, needs parentheses.
fn right_needs_parens(op: BinOp, r: &Expr) -> bool {
    matches!(&r.kind, ExprKind::Binary(o, ..) if o.precedence() <= op.precedence())
}

fn write_wrapped(e: &Expr, parens: bool, closed: bool, s: &mut String) {
    if parens {
        s.push('(');
        write_expr(e, false, s);
        s.push(')');
    } else {
        write_expr(e, closed, s);
    }
}

fn write_list<T>(items: &[T], s: &mut String, mut f: impl FnMut(&T, &mut String)) {
    for (k, it) in items.iter().enumerate() {
        if k > 0 {
            s.push_str(", ");
        }
        f(it, s);
    }
}

fn write_arg(a: &Arg, s: &mut String) {
    if let Some(n) = &a.name {
        s.push_str(&n.name);
        s.push_str(": ");
    }
    write_expr(&a.value, false, s);
}

fn write_expr_top(e: &Expr, s: &mut String) {
    write_expr(e, false, s);
}

/// Writes `e`. `closed`: a `*`, `/` or `%` follows, so a `sum(..)` at the right end of `e`
/// must be parenthesized (its body would take the operator).
fn write_expr(e: &Expr, closed: bool, s: &mut String) {
    match &e.kind {
        ExprKind::Int(v) => {
            let _ = write!(s, "{v}");
        }
        ExprKind::Float(v) => s.push_str(&float_text(*v)),
        ExprKind::Str(t) => s.push_str(&quote(t)),
        ExprKind::Name(n) => s.push_str(n),
        ExprKind::Neg(x) => {
            s.push('-');
            // `- -x`, not `--x`.
            if matches!(x.kind, ExprKind::Neg(_)) {
                s.push(' ');
            }
            write_wrapped(x, is_binary(x), closed, s);
        }
        ExprKind::Binary(op, l, r) => {
            let p = op.precedence();
            let lp = matches!(&l.kind, ExprKind::Binary(o, ..) if o.precedence() < p);
            write_wrapped(l, lp, p >= 2, s);
            s.push(' ');
            s.push_str(op.as_str());
            s.push(' ');
            write_wrapped(r, right_needs_parens(*op, r), closed, s);
        }
        ExprKind::Sum { .. } if closed => write_wrapped(e, true, false, s),
        ExprKind::Call { callee, args } => {
            write_callee(callee, s);
            s.push('(');
            write_list(args, s, write_arg);
            s.push(')');
        }
        ExprKind::Index { base, index } => {
            write_wrapped(base, !is_postfix_level(base), false, s);
            s.push('[');
            write_list(index, s, write_expr_top);
            s.push(']');
        }
        ExprKind::Field { base, field } => {
            write_wrapped(base, !is_postfix_level(base), false, s);
            s.push('.');
            s.push_str(&field.name);
        }
        ExprKind::Tuple(items) => {
            s.push('(');
            write_list(items, s, write_expr_top);
            if items.len() == 1 {
                s.push(',');
            }
            s.push(')');
        }
        ExprKind::Cast { dtype, arg } => {
            let _ = write!(s, "cast<{}>(", dtype.name);
            write_expr(arg, false, s);
            s.push(')');
        }
        ExprKind::Sum { op, binders, body } => {
            s.push_str(op.as_str());
            s.push('(');
            write_list(binders, s, |b, s| match b {
                Binder::Full(v) => s.push_str(&v.name),
                Binder::InGroup { var, group } => {
                    let _ = write!(s, "{} in group({})", var.name, group.name);
                }
            });
            s.push_str(") ");
            let bp = matches!(&body.kind, ExprKind::Binary(o, ..) if o.precedence() < 2)
                || (*op == ReduceOp::Max && blocks_max(body));
            write_wrapped(body, bp, false, s);
        }
        // Only after a syntax error, which `format_source` refuses.
        ExprKind::Error => s.push('_'),
    }
}

/// Whether `e`, written as the body of `max(..)`, would make it read as the function `max`:
/// its first token is `-`, a string or an annotation keyword (see the parser's
/// `max_is_reduction`).
fn blocks_max(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Neg(_) | ExprKind::Str(_) => true,
        ExprKind::Name(n) => crate::syntax::parser::ANNOTATION_KEYWORDS.contains(&&**n),
        ExprKind::Binary(_, l, _) => {
            let lp = matches!(&l.kind, ExprKind::Binary(o, ..) if o.precedence() < 2);
            !lp && blocks_max(l)
        }
        ExprKind::Call { callee: b, .. } | ExprKind::Index { base: b, .. } | ExprKind::Field { base: b, .. } => {
            is_postfix_level(b) && blocks_max(b)
        }
        _ => false,
    }
}

/// An expression on its own.
pub fn expr_text(e: &Expr) -> String {
    let mut s = String::new();
    write_expr(e, false, &mut s);
    s
}

/// Whether `e` can be the rank of a `put` without parentheses: calls and field accesses but
/// no indexing (`put out @ RANK [INDEX]`: the index that follows belongs to the statement).
fn rank_is_plain(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Call { callee: b, .. } | ExprKind::Field { base: b, .. } => is_postfix_level(b) && rank_is_plain(b),
        ExprKind::Index { .. } | ExprKind::Neg(_) | ExprKind::Binary(..) | ExprKind::Sum { .. } => false,
        _ => true,
    }
}

/// The callee of a call, in parentheses where it would not read back as one: below postfix
/// level, or `max(a)` (`max(a)(b)` would read as the reduction `max(a) (b)`).
fn write_callee(callee: &Expr, s: &mut String) {
    let max_call = matches!(&callee.kind, ExprKind::Call { callee: c, .. } if c.name() == Some("max"));
    write_wrapped(callee, !is_postfix_level(callee) || max_call, false, s);
}

fn callee_text(callee: &Expr) -> String {
    let mut s = String::new();
    write_callee(callee, &mut s);
    s
}

fn exprs_text(es: &[Expr]) -> String {
    let mut s = String::new();
    write_list(es, &mut s, write_expr_top);
    s
}

fn arg_text(a: &Arg) -> String {
    let mut s = String::new();
    write_arg(a, &mut s);
    s
}

fn unit_text(u: &Unit) -> String {
    match &u.den {
        Some(d) => format!("{}/{}", u.num.name, d.name),
        None => u.num.name.clone(),
    }
}

fn field_text(f: &Field) -> String {
    let mut s = format!("{}: {}", f.name.name, expr_text(&f.value));
    if let Some(u) = &f.unit {
        s.push(' ');
        s.push_str(&unit_text(u));
    }
    s
}

fn fields_inline(fields: &[Field]) -> String {
    fields.iter().map(field_text).collect::<Vec<_>>().join(", ")
}

fn tensor_text(t: &TensorType) -> String {
    format!("{}[{}]", t.dtype.name, exprs_text(&t.dims))
}

fn op_param_text(p: &OpParam) -> String {
    match &p.ty {
        ParamType::Tensor(t) => format!("{}: {}", p.name.name, tensor_text(t)),
        ParamType::Route(_) => format!("{}: route", p.name.name),
    }
}

fn sig_param_text(p: &SigParam) -> String {
    let ty = p.ty.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(" | ");
    match &p.default {
        Some(d) => format!("{}: {ty} = {}", p.name.name, expr_text(d)),
        None => format!("{}: {ty}", p.name.name),
    }
}

fn doc_line(prefix: &str, text: &str) -> String {
    if text.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix} {text}")
    }
}

/// `prefix EXPR suffix` at `indent`: on one line if it fits, else an outermost call broken
/// one argument per line (recursively).
fn break_expr(e: &Expr, indent: usize, prefix: &str, suffix: &str) -> Vec<String> {
    let flat = format!("{}{prefix}{}{suffix}", pad(indent), expr_text(e));
    if width(&flat) <= MAX_WIDTH {
        return vec![flat];
    }
    if let ExprKind::Call { callee, args } = &e.kind {
        if !args.is_empty() {
            let mut lines = vec![format!("{}{prefix}{}(", pad(indent), callee_text(callee))];
            for a in args {
                let p = a.name.as_ref().map(|n| format!("{}: ", n.name)).unwrap_or_default();
                lines.extend(break_expr(&a.value, indent + 1, &p, ","));
            }
            lines.push(format!("{}){suffix}", pad(indent)));
            return lines;
        }
    }
    vec![flat]
}

/// An annotation: element 0 is the text that continues the current line, the others (only for
/// a `tile(..)` with doc comments) are whole lines, the list at `indent + 1`.
fn annot_lines(a: &Annot, indent: usize) -> Vec<String> {
    match a {
        Annot::Tile { fields, .. } if fields.iter().any(|f| !f.docs.is_empty()) => {
            let mut v = vec!["tile(".to_string()];
            for f in fields {
                for d in &f.docs {
                    v.push(format!("{}{}", pad(indent + 1), doc_line("///", d)));
                }
                v.push(format!("{}{},", pad(indent + 1), field_text(f)));
            }
            v.push(format!("{})", pad(indent)));
            v
        }
        Annot::Tile { fields, .. } => vec![format!("tile({})", fields_inline(fields))],
        Annot::On { engine, .. } => vec![format!("on {}", engine.name)],
        Annot::Order { hints, .. } => vec![format!(
            "order({})",
            hints.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", ")
        )],
        Annot::Priority { value, .. } => vec![format!("priority({})", expr_text(value))],
    }
}

/// A taskflow statement as lines (with indentation).
fn flow_lines(st: &FlowStmt, indent: usize) -> Vec<String> {
    let (prefix, value) = match &st.kind {
        FlowStmtKind::Let { name, value } => (format!("let {} = ", name.name), value),
        FlowStmtKind::Return { value } => ("return ".to_string(), value),
    };
    let annots: Vec<Vec<String>> = st.annots.iter().map(|a| annot_lines(a, indent + 1)).collect();
    let multi = annots.iter().any(|a| a.len() > 1);
    let inline: String = annots.iter().map(|a| format!(" {}", a[0])).collect();
    if !multi {
        let line = format!("{}{prefix}{}{inline};", pad(indent), expr_text(value));
        if width(&line) <= MAX_WIDTH {
            return vec![line];
        }
    }
    if annots.is_empty() {
        return break_expr(value, indent, &prefix, ";");
    }
    let mut lines = break_expr(value, indent, &prefix, "");
    if lines.len() > 1 && !multi {
        if let Some(last) = lines.last_mut() {
            let cand = format!("{last}{inline};");
            if width(&cand) <= MAX_WIDTH {
                *last = cand;
                return lines;
            }
        }
    }
    let n = annots.len();
    for (k, mut a) in annots.into_iter().enumerate() {
        a[0] = format!("{}{}", pad(indent + 1), a[0]);
        if k + 1 == n {
            if let Some(l) = a.last_mut() {
                l.push(';');
            }
        }
        lines.extend(a);
    }
    lines
}

/// An op body statement as lines (with indentation).
fn stmt_lines(st: &Stmt, indent: usize) -> Vec<String> {
    let op = |acc: bool| if acc { "+=" } else { "=" };
    match st {
        Stmt::Let { name, value, .. } => break_expr(value, indent, &format!("let {} = ", name.name), ";"),
        Stmt::Assign {
            target,
            index,
            accumulate,
            value,
            ..
        } => {
            let prefix = format!("{}[{}] {} ", target.name, exprs_text(index), op(*accumulate));
            break_expr(value, indent, &prefix, ";")
        }
        Stmt::Put {
            target,
            rank,
            index,
            accumulate,
            value,
            ..
        } => {
            let prefix = format!(
                "put {} @ {} [{}] {} ",
                target.name,
                if rank_is_plain(rank) {
                    expr_text(rank)
                } else {
                    format!("({})", expr_text(rank))
                },
                exprs_text(index),
                op(*accumulate)
            );
            break_expr(value, indent, &prefix, ";")
        }
    }
}

// ------------------------------------------------------------------------- items and lists

/// Whether a blank line goes before the next thing printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blank {
    /// Never (first element of a block).
    No,
    /// If the source has one there.
    Keep,
    /// Always (between items of different kinds).
    Force,
}

/// One element of a bracketed, comma-separated list.
#[derive(Debug)]
struct Elem<'d> {
    lo: usize,
    hi: usize,
    docs: &'d [String],
    text: String,
}

/// A bracketed list: inline (`(a, b)`) or one element per line with trailing commas.
#[derive(Debug)]
struct List<'d> {
    open: &'static str,
    close: &'static str,
    /// Inline with spaces inside the brackets: `{ a: 1 }`.
    spaced: bool,
    /// The brackets in the source, when there are some.
    delims: Option<(Span, Span)>,
    elems: Vec<Elem<'d>>,
    /// One element per line whatever the width.
    force: bool,
}

impl List<'_> {
    fn inline(&self) -> String {
        if self.elems.is_empty() {
            return format!("{}{}", self.open, self.close);
        }
        let body = self
            .elems
            .iter()
            .map(|e| e.text.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if self.spaced {
            format!("{} {body} {}", self.open, self.close)
        } else {
            format!("{}{body}{}", self.open, self.close)
        }
    }
}

/// A piece of a header: text or a list.
#[derive(Debug)]
enum Seg<'d> {
    Text(String),
    List(List<'d>),
}

fn lo(s: Span) -> usize {
    s.lo as usize
}
fn hi(s: Span) -> usize {
    s.hi as usize
}

fn is_line_comment(c: &Comment) -> bool {
    c.text.starts_with("//")
}

fn field_elems(fields: &[Field]) -> Vec<Elem<'_>> {
    fields
        .iter()
        .map(|f| Elem {
            lo: lo(f.span),
            hi: hi(f.span),
            docs: &f.docs,
            text: field_text(f),
        })
        .collect()
}

fn op_param_elems(params: &[OpParam]) -> Vec<Elem<'static>> {
    params
        .iter()
        .map(|p| Elem {
            lo: lo(p.span),
            hi: hi(p.span),
            docs: &[],
            text: op_param_text(p),
        })
        .collect()
}

fn item_group(k: &ItemKind) -> u8 {
    match k {
        ItemKind::Import(_) => 0,
        ItemKind::Param(_) => 1,
        ItemKind::Device(_) => 2,
        ItemKind::Route(_) => 3,
        ItemKind::Op(_) => 4,
        ItemKind::Taskflow(_) | ItemKind::Grad(_) => 5,
        ItemKind::Schedule(_) => 6,
        ItemKind::Profile(_) => 7,
        ItemKind::Signature(_) => 8,
    }
}

fn is_block(k: &ItemKind) -> bool {
    match k {
        ItemKind::Op(_) | ItemKind::Taskflow(_) | ItemKind::Profile(_) => true,
        ItemKind::Device(d) => !d.fields.is_empty(),
        _ => false,
    }
}

/// What the printer reads of a token: where it is, and whether it is a bracket, a doc
/// comment, the word `tile` or the end. Twelve bytes a token, with no text: a source near
/// the size limit has tens of millions of tokens, which held whole (a string per
/// identifier) took more memory than its syntax tree.
#[derive(Clone, Copy, Debug)]
struct Tok {
    lo: u32,
    hi: u32,
    mark: Mark,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    Open(Delim),
    Close(Delim),
    Doc,
    InnerDoc,
    Tile,
    Eof,
    Other,
}

impl Tok {
    fn span(&self) -> Span {
        Span::new(FileId(0), self.lo, self.hi)
    }
}

/// The tokens of a text as the printer reads them ([`Tok`]), ending with `Eof`.
fn marks(src: &str) -> Vec<Tok> {
    let mut lx = lexer::Lexer::new(src, FileId(0)).without_comments();
    let mut out = Vec::new();
    loop {
        let t = super::token::TokenSource::next_token(&mut lx);
        let mark = match &t.kind {
            TokenKind::Open(d) => Mark::Open(*d),
            TokenKind::Close(d) => Mark::Close(*d),
            TokenKind::Doc(_) => Mark::Doc,
            TokenKind::InnerDoc(_) => Mark::InnerDoc,
            TokenKind::Ident(s) if s == "tile" => Mark::Tile,
            TokenKind::Eof => Mark::Eof,
            _ => Mark::Other,
        };
        out.push(Tok {
            lo: t.span.lo,
            hi: t.span.hi,
            mark,
        });
        if mark == Mark::Eof {
            return out;
        }
    }
}

/// The output under construction, and the comments not printed yet.
#[derive(Debug)]
struct Printer<'a> {
    src: &'a str,
    toks: Vec<Tok>,
    /// Sorted by position.
    comments: Vec<Comment>,
    done: Vec<bool>,
    /// Every comment before this index is printed.
    first: usize,
    out: String,
    /// The source position up to which everything is printed (code or comments).
    last: usize,
    /// Right after an opening bracket (or at the start): no blank line.
    fresh: bool,
}

enum Thing {
    Comment(usize),
    Doc(usize),
}

impl<'a> Printer<'a> {
    fn new(src: &'a str, comments: &[Comment]) -> Self {
        let toks = marks(src);
        let mut comments = comments.to_vec();
        comments.sort_by_key(|c| (c.span.lo, c.span.hi));
        Printer {
            src,
            toks,
            done: vec![false; comments.len()],
            comments,
            first: 0,
            out: String::new(),
            last: 0,
            fresh: true,
        }
    }

    fn finish(mut self) -> String {
        self.flush_before(0, usize::MAX);
        if self.out.trim().is_empty() {
            return String::new();
        }
        self.out
    }

    // ---------------------------------------------------------------- source queries

    fn has_blank(&self, a: usize, b: usize) -> bool {
        if a >= b {
            return false;
        }
        let Some(t) = self.src.get(a..b) else {
            return false;
        };
        let parts: Vec<&str> = t.split('\n').collect();
        parts.len() >= 3 && parts[1..parts.len() - 1].iter().any(|s| s.trim().is_empty())
    }

    fn tok_lo(&self, i: usize) -> usize {
        self.toks.get(i).map_or(usize::MAX, |t| t.lo as usize)
    }

    /// The first `Open(d)` token starting in `from..to`, and its matching closer.
    fn delims(&self, from: usize, to: usize, d: Delim) -> Option<(Span, Span)> {
        let start = self.toks.partition_point(|t| (t.lo as usize) < from);
        let open = (start..self.toks.len())
            .take_while(|&i| self.tok_lo(i) < to)
            .find(|&i| self.toks[i].mark == Mark::Open(d))?;
        self.with_close(open)
    }

    fn with_close(&self, open: usize) -> Option<(Span, Span)> {
        let mut depth = 0i64;
        for t in self.toks.iter().skip(open) {
            match t.mark {
                Mark::Open(_) => depth += 1,
                Mark::Close(_) => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((self.toks[open].span(), t.span()));
                    }
                }
                Mark::Eof => return None,
                _ => {}
            }
        }
        None
    }

    /// The spans of the `n` doc comments right before the token at `pos`.
    fn doc_spans(&self, pos: usize, n: usize) -> Option<Vec<Span>> {
        let j = self.toks.partition_point(|t| (t.lo as usize) < pos);
        let toks = self.toks.get(j.checked_sub(n)?..j)?;
        toks.iter().map(|t| (t.mark == Mark::Doc).then(|| t.span())).collect()
    }

    /// Whether a comment not yet printed that satisfies `pred` starts in `a..b`: only the
    /// comments starting there are looked at (they are sorted by position), so that a file
    /// of many items is formatted in time linear in its size.
    fn undone_in(&self, a: usize, b: usize, pred: impl Fn(&Comment) -> bool) -> bool {
        let from = self.first.max(self.comments.partition_point(|c| lo(c.span) < a));
        (from..self.comments.len())
            .take_while(|&i| lo(self.comments[i].span) < b)
            .any(|i| !self.done[i] && pred(&self.comments[i]))
    }

    /// Whether a line comment not yet printed starts in `a..b`.
    fn line_comment_between(&self, a: usize, b: usize) -> bool {
        self.undone_in(a, b, is_line_comment)
    }

    fn comment_inside(&self, delims: Option<(Span, Span)>) -> bool {
        let Some((o, c)) = delims else {
            return false;
        };
        self.undone_in(hi(o), lo(c), |_| true)
    }

    // ---------------------------------------------------------------- output

    fn raw_line(&mut self, indent: usize, text: &str) {
        if !text.is_empty() {
            self.out.push_str(&pad(indent));
            self.out.push_str(text);
        }
        self.out.push('\n');
        self.fresh = false;
    }

    fn blank_line(&mut self) {
        if !self.fresh && !self.out.is_empty() && !self.out.ends_with("\n\n") {
            self.out.push('\n');
        }
    }

    fn advance_first(&mut self) {
        while self.first < self.done.len() && self.done[self.first] {
            self.first += 1;
        }
    }

    fn comment_line(&mut self, indent: usize, i: usize) {
        self.done[i] = true;
        let text = self.comments[i].text.clone();
        self.raw_line(indent, &text);
        self.last = self.last.max(hi(self.comments[i].span));
    }

    /// Prints, each on its own line, the comments starting before `pos`, keeping (at most one)
    /// blank line before each where the source has one.
    fn flush_before(&mut self, indent: usize, pos: usize) {
        let mut i = self.first;
        while i < self.comments.len() && lo(self.comments[i].span) < pos {
            if !self.done[i] {
                if self.has_blank(self.last, lo(self.comments[i].span)) {
                    self.blank_line();
                }
                self.comment_line(indent, i);
            }
            i += 1;
        }
        self.advance_first();
    }

    /// Before a construct starting at `lo` whose first printed line covers the source up to
    /// `first_hi`: the blank line `policy` asks for, the comments before it, its doc comments
    /// (in source order), and the `//` comments inside its first line (which cannot stay inside).
    fn lead(&mut self, indent: usize, lo_: usize, first_hi: usize, docs: &[String], policy: Blank) {
        self.lead_with(indent, lo_, first_hi, &[], docs, policy);
    }

    /// [`Self::lead`], also taking the comments that start in one of the `gaps` (source
    /// ranges of the construct whose comments have no place of their own).
    fn lead_with(
        &mut self,
        indent: usize,
        lo_: usize,
        first_hi: usize,
        gaps: &[(usize, usize)],
        docs: &[String],
        policy: Blank,
    ) {
        let spans = self.doc_spans(lo_, docs.len());
        let mut things: Vec<(usize, usize, Thing)> = Vec::new();
        let until = gaps.iter().map(|g| g.1).fold(first_hi.max(lo_), usize::max);
        let mut i = self.first;
        while i < self.comments.len() && lo(self.comments[i].span) < until {
            let c = &self.comments[i];
            let at = lo(c.span);
            let in_gap = gaps.iter().any(|&(a, b)| at >= a && at < b);
            if !self.done[i] && ((at < first_hi.max(lo_) && (at < lo_ || is_line_comment(c))) || in_gap) {
                things.push((lo(c.span), hi(c.span), Thing::Comment(i)));
            }
            i += 1;
        }
        for k in 0..docs.len() {
            let (a, b) = spans
                .as_ref()
                .and_then(|v| v.get(k))
                .map_or((lo_, lo_), |s| (lo(*s), hi(*s)));
            things.push((a, b, Thing::Doc(k)));
        }
        things.sort_by_key(|t| t.0);
        let mut prev: Option<usize> = None;
        for (a, b, t) in things {
            let blank = match prev {
                None => self.policy_blank(policy, a.min(lo_)),
                Some(pe) => a <= lo_ && self.has_blank(pe, a),
            };
            if blank {
                self.blank_line();
            }
            match t {
                Thing::Comment(i) => self.comment_line(indent, i),
                Thing::Doc(k) => {
                    self.raw_line(indent, &doc_line("///", &docs[k]));
                    self.last = self.last.max(b);
                }
            }
            prev = Some(b);
        }
        let blank = match prev {
            None => self.policy_blank(policy, lo_),
            Some(pe) => pe <= lo_ && self.has_blank(pe, lo_),
        };
        if blank {
            self.blank_line();
        }
        self.advance_first();
    }

    fn policy_blank(&self, policy: Blank, pos: usize) -> bool {
        match policy {
            Blank::No => false,
            Blank::Keep => self.has_blank(self.last, pos),
            Blank::Force => true,
        }
    }

    /// Prints, each on its own line, the `//` comments starting before `pos`.
    fn pre_line(&mut self, indent: usize, pos: usize) {
        let mut i = self.first;
        while i < self.comments.len() && lo(self.comments[i].span) < pos {
            if !self.done[i] && is_line_comment(&self.comments[i]) {
                self.comment_line(indent, i);
            }
            i += 1;
        }
        self.advance_first();
    }

    /// The comments that end a line whose code reaches `pos` in the source: those starting
    /// before `pos`, then those after it on the same source line.
    fn eol(&mut self, pos: usize) -> String {
        let mut s = String::new();
        let mut end = pos;
        let mut i = self.first;
        while i < self.comments.len() && lo(self.comments[i].span) < pos {
            if !self.done[i] {
                self.done[i] = true;
                let c = &self.comments[i];
                s.push(' ');
                s.push_str(&c.text);
                end = end.max(hi(c.span));
                if is_line_comment(c) {
                    // Nothing may follow it on the line; later comments get their own lines.
                    self.last = self.last.max(end);
                    self.advance_first();
                    return s;
                }
            }
            i += 1;
        }
        while i < self.comments.len() {
            if self.done[i] {
                i += 1;
                continue;
            }
            let c = &self.comments[i];
            let same_line = lo(c.span) >= end
                && self
                    .src
                    .get(end..lo(c.span))
                    .is_some_and(|g| g.chars().all(|ch| matches!(ch, ' ' | '\t' | ',')));
            if !same_line {
                break;
            }
            self.done[i] = true;
            s.push(' ');
            s.push_str(&c.text);
            end = hi(c.span);
            if is_line_comment(c) {
                break;
            }
            i += 1;
        }
        self.last = self.last.max(end);
        self.advance_first();
        s
    }

    /// Prints a line (not the first of its construct) whose code reaches `pos`.
    fn finish_line(&mut self, indent: usize, text: &str, pos: usize, first: bool, opens: bool) {
        if !first {
            self.pre_line(indent + 1, pos);
        }
        let suffix = self.eol(pos);
        self.raw_line(indent, &format!("{text}{suffix}"));
        self.fresh = opens;
    }

    /// Prints pre-rendered lines (with indentation) of a construct ending at `pos`.
    fn emit_lines(&mut self, lines: Vec<String>, pos: usize) {
        let n = lines.len();
        for (k, l) in lines.into_iter().enumerate() {
            if k + 1 == n {
                let suffix = self.eol(pos);
                self.raw_line(0, &format!("{l}{suffix}"));
            } else {
                self.raw_line(0, &l);
            }
        }
    }

    /// A statement-like construct: `lines` pre-rendered, spanning `lo..hi` in the source.
    fn unit(&mut self, indent: usize, lo_: usize, hi_: usize, docs: &[String], policy: Blank, lines: Vec<String>) {
        self.lead(indent, lo_, hi_, docs, policy);
        self.emit_lines(lines, hi_);
    }

    // ---------------------------------------------------------------- headers with lists

    /// Which lists are printed one element per line.
    fn layout(&self, indent: usize, segs: &[Seg]) -> Vec<bool> {
        let mut vert: Vec<bool> = segs
            .iter()
            .map(|s| match s {
                Seg::List(l) => l.force || l.elems.iter().any(|e| !e.docs.is_empty()) || self.comment_inside(l.delims),
                Seg::Text(_) => false,
            })
            .collect();
        loop {
            let mut w = indent * 4;
            let mut cand: Option<usize> = None;
            let mut changed = false;
            for (i, s) in segs.iter().enumerate() {
                match s {
                    Seg::Text(t) => w += width(t),
                    Seg::List(l) if vert[i] => {
                        w += width(l.open);
                        if w > MAX_WIDTH {
                            if let Some(c) = cand {
                                vert[c] = true;
                                changed = true;
                                break;
                            }
                        }
                        w = indent * 4 + width(l.close);
                        cand = None;
                    }
                    Seg::List(l) => {
                        w += width(&l.inline());
                        if cand.is_none() && !l.elems.is_empty() {
                            cand = Some(i);
                        }
                    }
                }
            }
            if !changed && w > MAX_WIDTH {
                if let Some(c) = cand {
                    vert[c] = true;
                    changed = true;
                }
            }
            if !changed {
                return vert;
            }
        }
    }

    /// Prints a construct made of text and lists, starting at `lo` and ending at `end` in the
    /// source; `opens` when its last line ends with an opening brace.
    #[allow(clippy::too_many_arguments)]
    fn segs(
        &mut self,
        indent: usize,
        lo_: usize,
        docs: &[String],
        policy: Blank,
        segs: &[Seg],
        end: usize,
        opens: bool,
    ) {
        let vert = self.layout(indent, segs);
        let open_hi = |l: &List| {
            l.delims
                .map_or_else(|| l.elems.first().map_or(end, |e| e.lo), |(o, _)| hi(o))
        };
        let first_hi = segs
            .iter()
            .enumerate()
            .find_map(|(i, s)| match s {
                Seg::List(l) if vert[i] => Some(open_hi(l)),
                _ => None,
            })
            .unwrap_or(end);
        // A comment between two lists (after one's `)`, before the next one's `(`) would be
        // printed inside the next list when it breaks, and then change its layout the next
        // time: it goes before the construct instead.
        let mut gaps: Vec<(usize, usize)> = Vec::new();
        let mut prev_close: Option<usize> = None;
        for s in segs {
            if let Seg::List(List {
                delims: Some((o, c)), ..
            }) = s
            {
                if let Some(pc) = prev_close {
                    gaps.push((pc, lo(*o)));
                }
                prev_close = Some(hi(*c));
            }
        }
        self.lead_with(indent, lo_, first_hi, &gaps, docs, policy);
        let mut cur = String::new();
        let mut first = true;
        for (i, s) in segs.iter().enumerate() {
            match s {
                Seg::Text(t) => cur.push_str(t),
                Seg::List(l) if !vert[i] => cur.push_str(&l.inline()),
                Seg::List(l) => {
                    cur.push_str(l.open);
                    self.finish_line(indent, &cur, open_hi(l), first, true);
                    first = false;
                    cur.clear();
                    self.vertical(indent + 1, l);
                    cur.push_str(l.close);
                }
            }
        }
        self.finish_line(indent, &cur, end, first, opens);
    }

    fn vertical(&mut self, indent: usize, l: &List) {
        for (k, e) in l.elems.iter().enumerate() {
            let policy = if k == 0 { Blank::No } else { Blank::Keep };
            self.lead(indent, e.lo, e.hi, e.docs, policy);
            let suffix = self.eol(e.hi);
            self.raw_line(indent, &format!("{},{suffix}", e.text));
        }
        let close = l
            .delims
            .map_or_else(|| l.elems.last().map_or(0, |e| e.hi), |(_, c)| lo(c));
        self.flush_before(indent, close);
    }

    // ---------------------------------------------------------------- items

    fn file(&mut self, f: &File) {
        let spans: Vec<Span> = self
            .toks
            .iter()
            .take_while(|t| t.mark == Mark::InnerDoc)
            .map(Tok::span)
            .collect();
        for (k, d) in f.docs.iter().enumerate() {
            if let Some(s) = spans.get(k) {
                self.flush_before(0, lo(*s));
                self.last = self.last.max(hi(*s));
            }
            self.raw_line(0, &doc_line("//!", d));
        }
        let mut prev: Option<&Item> = None;
        for item in &f.items {
            let policy = match prev {
                None if f.docs.is_empty() => Blank::No,
                None => Blank::Force,
                Some(p) => {
                    if item_group(&p.kind) != item_group(&item.kind) || is_block(&p.kind) || is_block(&item.kind) {
                        Blank::Force
                    } else {
                        Blank::Keep
                    }
                }
            };
            self.item(item, policy);
            prev = Some(item);
        }
    }

    fn item(&mut self, it: &Item, policy: Blank) {
        let (lo_, hi_) = (lo(it.span), hi(it.span));
        let docs = &it.docs[..];
        match &it.kind {
            ItemKind::Import(im) => {
                let (head, after) = match &im.source {
                    ImportSource::Std(path) => (
                        format!(
                            "import {}",
                            path.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join("::")
                        ),
                        path.last().map_or(lo_, |p| hi(p.span)),
                    ),
                    ImportSource::File(f, s) => (format!("import {}", quote(f)), hi(*s)),
                };
                let segs = match &im.names {
                    ImportNames::All(_) if matches!(im.source, ImportSource::File(..)) => {
                        vec![Seg::Text(format!("{head};"))]
                    }
                    ImportNames::All(_) => vec![Seg::Text(format!("{head}::*;"))],
                    ImportNames::List(names) if names.len() == 1 && matches!(im.source, ImportSource::Std(_)) => {
                        vec![Seg::Text(format!("{head}::{};", names[0].name))]
                    }
                    ImportNames::List(names) => vec![
                        Seg::Text(format!("{head}::")),
                        Seg::List(List {
                            open: "{",
                            close: "}",
                            spaced: false,
                            delims: self.delims(after, hi_, Delim::Brace),
                            elems: names
                                .iter()
                                .map(|n| Elem {
                                    lo: lo(n.span),
                                    hi: hi(n.span),
                                    docs: &[],
                                    text: n.name.clone(),
                                })
                                .collect(),
                            force: false,
                        }),
                        Seg::Text(";".into()),
                    ],
                };
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
            ItemKind::Param(p) => {
                let lines = break_expr(&p.value, 0, &format!("param {} = ", p.name.name), ";");
                self.unit(0, lo_, hi_, docs, policy, lines);
            }
            ItemKind::Grad(g) => {
                let list = |names: &[Ident]| names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ");
                let mut args = vec![g.forward.name.clone(), format!("wrt: [{}]", list(&g.wrt))];
                for (key, names) in [
                    ("save", &g.save),
                    ("straight_through", &g.straight_through),
                    ("detach", &g.detach),
                ] {
                    if !names.is_empty() {
                        args.push(format!("{key}: [{}]", list(names)));
                    }
                }
                let head = format!("taskflow {} = grad(", g.name.name);
                let flat = format!("{head}{});", args.join(", "));
                // One argument per line when the declaration does not fit.
                let lines = if width(&flat) <= MAX_WIDTH {
                    vec![flat]
                } else {
                    let mut lines = vec![head];
                    lines.extend(args.iter().map(|a| format!("    {a},")));
                    lines.push(");".to_string());
                    lines
                };
                self.unit(0, lo_, hi_, docs, policy, lines);
            }
            ItemKind::Device(d) => {
                let head = format!("device = {}", d.profile.name);
                let segs = if d.fields.is_empty() {
                    vec![Seg::Text(format!("{head};"))]
                } else {
                    vec![
                        Seg::Text(format!("{head} ")),
                        Seg::List(List {
                            open: "{",
                            close: "}",
                            spaced: true,
                            delims: self.delims(hi(d.profile.span), hi_, Delim::Brace),
                            elems: field_elems(&d.fields),
                            force: true,
                        }),
                        Seg::Text(";".into()),
                    ]
                };
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
            ItemKind::Route(r) => {
                let segs = vec![
                    Seg::Text(format!("route {} = {}", r.name.name, r.kind.name)),
                    Seg::List(List {
                        open: "(",
                        close: ")",
                        spaced: false,
                        delims: self.delims(hi(r.kind.span), hi_, Delim::Paren),
                        elems: r
                            .args
                            .iter()
                            .map(|a| Elem {
                                lo: a.name.as_ref().map_or(lo(a.value.span), |n| lo(n.span)),
                                hi: hi(a.value.span),
                                docs: &[],
                                text: arg_text(a),
                            })
                            .collect(),
                        force: false,
                    }),
                    Seg::Text(";".into()),
                ];
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
            ItemKind::Op(o) => self.op(o, lo_, hi_, docs, policy),
            ItemKind::Taskflow(t) => self.taskflow(t, lo_, hi_, docs, policy),
            ItemKind::Schedule(s) => {
                let mut head = "schedule".to_string();
                if let Some(t) = &s.taskflow {
                    head.push(' ');
                    head.push_str(&t.name);
                }
                let _ = write!(head, " = {}", s.policy.name);
                let segs = if s.options.is_empty() {
                    vec![Seg::Text(format!("{head};"))]
                } else {
                    vec![
                        Seg::Text(format!("{head} ")),
                        Seg::List(List {
                            open: "{",
                            close: "}",
                            spaced: true,
                            delims: self.delims(hi(s.policy.span), hi_, Delim::Brace),
                            elems: field_elems(&s.options),
                            force: false,
                        }),
                        Seg::Text(";".into()),
                    ]
                };
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
            ItemKind::Profile(p) => {
                let mut head = format!("profile {}", p.name.name);
                let mut after = hi(p.name.span);
                if let Some(b) = &p.base {
                    let _ = write!(head, ": {}", b.name);
                    after = hi(b.span);
                }
                head.push(' ');
                let segs = vec![
                    Seg::Text(head),
                    Seg::List(List {
                        open: "{",
                        close: "}",
                        spaced: true,
                        delims: self.delims(after, hi_, Delim::Brace),
                        elems: field_elems(&p.fields),
                        force: !p.fields.is_empty(),
                    }),
                ];
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
            ItemKind::Signature(s) => {
                let kw = match s.kind {
                    SignatureKind::Routing => "routing",
                    SignatureKind::Policy => "policy",
                };
                let segs = vec![
                    Seg::Text(format!("{kw} {}", s.name.name)),
                    Seg::List(List {
                        open: "(",
                        close: ")",
                        spaced: false,
                        delims: self.delims(hi(s.name.span), hi_, Delim::Paren),
                        elems: s
                            .params
                            .iter()
                            .map(|p| Elem {
                                lo: lo(p.span),
                                hi: hi(p.span),
                                docs: &[],
                                text: sig_param_text(p),
                            })
                            .collect(),
                        force: false,
                    }),
                    Seg::Text(";".into()),
                ];
                self.segs(0, lo_, docs, policy, &segs, hi_, false);
            }
        }
    }

    /// ` {` (and the position after it) or ` {}` for a body with neither statements nor
    /// comments.
    fn body_open(&self, n_stmts: usize, body: Span) -> (&'static str, usize, bool) {
        let has_comment = self.undone_in(lo(body) + 1, hi(body), |_| true);
        if n_stmts == 0 && !has_comment {
            (" {}", hi(body), false)
        } else {
            (" {", lo(body) + 1, true)
        }
    }

    fn op(&mut self, o: &OpDef, lo_: usize, hi_: usize, docs: &[String], policy: Blank) {
        let kw = match o.kind {
            OpKind::Compute => "op",
            OpKind::Comm => "comm",
        };
        let mut head = format!("{kw} {}", o.name.name);
        if !o.generics.is_empty() {
            let g = o
                .generics
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(head, "<{g}>");
        }
        let mut segs = vec![
            Seg::Text(head),
            Seg::List(List {
                open: "(",
                close: ")",
                spaced: false,
                delims: self.delims(hi(o.name.span), lo(o.ret.span), Delim::Paren),
                elems: op_param_elems(&o.params),
                force: false,
            }),
        ];
        let mut tail = format!(" -> {}", tensor_text(&o.ret));
        if let Some(e) = &o.engine {
            let _ = write!(tail, " on {}", e.name);
        }
        if !o.tile.is_empty() {
            tail.push_str(" tile");
            segs.push(Seg::Text(std::mem::take(&mut tail)));
            segs.push(Seg::List(List {
                open: "(",
                close: ")",
                spaced: false,
                delims: self.tile_delims(hi(o.ret.span), lo(o.body_span)),
                elems: field_elems(&o.tile),
                force: false,
            }));
        }
        let (open, end, opens) = self.body_open(o.body.len(), o.body_span);
        tail.push_str(open);
        segs.push(Seg::Text(tail));
        self.segs(0, lo_, docs, policy, &segs, end, opens);
        if opens {
            for (k, s) in o.body.iter().enumerate() {
                let policy = if k == 0 { Blank::No } else { Blank::Keep };
                let sp = s.span();
                self.unit(1, lo(sp), hi(sp), &[], policy, stmt_lines(s, 1));
            }
            self.close_body(o.body_span, hi_);
        }
    }

    /// The brackets of the last `tile(...)` in `from..to`.
    fn tile_delims(&self, from: usize, to: usize) -> Option<(Span, Span)> {
        let start = self.toks.partition_point(|t| (t.lo as usize) < from);
        let mut found = None;
        let mut i = start;
        while i + 1 < self.toks.len() && self.tok_lo(i) < to {
            if self.toks[i].mark == Mark::Tile && self.toks[i + 1].mark == Mark::Open(Delim::Paren) {
                found = Some(i + 1);
            }
            i += 1;
        }
        self.with_close(found?)
    }

    fn close_body(&mut self, body: Span, item_hi: usize) {
        self.flush_before(1, hi(body).saturating_sub(1));
        self.finish_line(0, "}", item_hi, false, false);
    }

    fn taskflow(&mut self, t: &Taskflow, lo_: usize, hi_: usize, docs: &[String], policy: Blank) {
        let ret_lo = match &t.ret {
            TaskflowRet::Single(ty) => lo(ty.span),
            TaskflowRet::Named(outs) => outs.first().map_or(lo(t.body_span), |(n, _)| lo(n.span)),
        };
        let params_delims = self.delims(hi(t.name.span), ret_lo, Delim::Paren);
        let mut segs = vec![
            Seg::Text(format!("taskflow {}", t.name.name)),
            Seg::List(List {
                open: "(",
                close: ")",
                spaced: false,
                delims: params_delims,
                elems: op_param_elems(&t.params),
                force: false,
            }),
        ];
        let (open, end, opens) = self.body_open(t.body.len(), t.body_span);
        match &t.ret {
            TaskflowRet::Single(ty) => segs.push(Seg::Text(format!(" -> {}{open}", tensor_text(ty)))),
            TaskflowRet::Named(outs) => {
                let from = params_delims.map_or(hi(t.name.span), |(_, c)| hi(c));
                let delims = self.delims(from, lo(t.body_span), Delim::Paren);
                // A line comment between the results and the body is printed on its own line
                // inside the broken results list (before its `)`), where the next formatting
                // finds it: break the list now, so that the layout is the same both times.
                // (A block comment there ends the line of the `{`.)
                let trailing = delims.is_some_and(|(_, c)| self.line_comment_between(hi(c), lo(t.body_span)));
                segs.push(Seg::Text(" -> ".into()));
                segs.push(Seg::List(List {
                    open: "(",
                    close: ")",
                    spaced: false,
                    delims,
                    elems: outs
                        .iter()
                        .map(|(n, ty)| Elem {
                            lo: lo(n.span),
                            hi: hi(ty.span),
                            docs: &[],
                            text: format!("{}: {}", n.name, tensor_text(ty)),
                        })
                        .collect(),
                    force: trailing,
                }));
                segs.push(Seg::Text(open.into()));
            }
        }
        self.segs(0, lo_, docs, policy, &segs, end, opens);
        if opens {
            for (k, s) in t.body.iter().enumerate() {
                let policy = if k == 0 { Blank::No } else { Blank::Keep };
                self.unit(1, lo(s.span), hi(s.span), &[], policy, flow_lines(s, 1));
            }
            self.close_body(t.body_span, hi_);
        }
    }
}
