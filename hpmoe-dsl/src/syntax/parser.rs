//! The recursive-descent parser: [`Token`]s in (from any [`TokenSource`]), an [`ast::File`]
//! and every syntax error out. It recovers at statement and item boundaries, so one run
//! reports all independent mistakes. Nesting is bounded ([`MAX_DEPTH`]).

use super::ast::*;
use super::token::{Delim, Punct, Span, Token, TokenKind, TokenSource};
use crate::diag::{Code, Diagnostic};

/// The deepest nesting accepted. Each bracket group, block, unary minus, `sum` and binary
/// operator of an expression counts one level, so the depth of every expression tree (and of
/// the recursion of every later stage over it) is bounded too: a flat chain such as
/// `1 + 1 + ... + 1` of more than this many operators is an error (E0106), not a stack
/// overflow.
pub const MAX_DEPTH: u32 = 128;

/// Item keywords: recovery stops in front of them.
pub const ITEM_KEYWORDS: &[&str] = &[
    "import", "param", "device", "route", "op", "comm", "taskflow", "schedule", "profile", "routing", "policy",
];

/// Keywords that start a call annotation: `max(a, b) tile(...)` is a call, not a reduction.
pub const ANNOTATION_KEYWORDS: &[&str] = &["tile", "on", "order", "priority"];

/// How [`Parser::items_until`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PartEnd {
    /// The source ended.
    Eof,
    /// The next item starts at this stop (an index into the stops).
    Stop(usize),
    /// The caller asked it to stop.
    Cancelled,
}

/// Marker for "an error was reported; recover".
#[derive(Debug)]
pub struct Reported;

type PResult<T> = Result<T, Reported>;

/// Tokens read from the source at a time.
const FILL: usize = 256;
/// Consumed tokens kept behind the current one (the parser looks back at most two).
const KEEP_BEHIND: usize = 2;

/// The most elements of one list of the syntax tree: the arguments, parameters or fields in
/// one pair of brackets, the statements of one block, the annotations of one call, the doc
/// comment lines of one item, the names of one path. Past it the list is E1201: a list of
/// short elements (`max(1, 1, ...)`, `tile(a: 1, a: 1, ...)`) within the source size limit
/// would otherwise hold several GiB.
pub const MAX_LIST: usize = 1 << 20;

/// The most tokens `max(...)` looks ahead to find whether it is a reduction (a list of
/// binders is short): a longer group is the function `max(a, b)`, and is not read ahead.
const MAX_REDUCTION_LOOKAHEAD: usize = 4096;

/// The parser state over a window of the token stream. Tokens are read from the source as
/// the parser reaches them, and consumed ones are dropped, so a large file is never held as
/// one token list.
pub struct Parser<'a> {
    src: &'a mut dyn TokenSource,
    /// The window: consumed tokens (at most a few behind `pos`, plus up to a refill's worth)
    /// and the ones read ahead. Ends with `Eof` once the source is exhausted.
    toks: Vec<Token>,
    /// The current token's index in `toks`.
    pos: usize,
    /// Whether `Eof` is in `toks`.
    done: bool,
    depth: u32,
    pub diags: Vec<Diagnostic>,
    /// Set once the depth limit was hit, so it is reported once.
    too_deep: bool,
}

impl std::fmt::Debug for Parser<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parser")
            .field("toks", &self.toks)
            .field("pos", &self.pos)
            .field("done", &self.done)
            .field("depth", &self.depth)
            .field("diags", &self.diags)
            .field("too_deep", &self.too_deep)
            .finish()
    }
}

/// Parses a whole source into a file.
pub fn parse_file(src: &mut dyn TokenSource) -> (File, Vec<Diagnostic>) {
    let mut p = Parser::new(src);
    let file = p.file();
    (file, p.diags)
}

impl<'a> Parser<'a> {
    pub fn new(src: &'a mut dyn TokenSource) -> Self {
        let mut p = Parser {
            src,
            toks: Vec::with_capacity(FILL + KEEP_BEHIND + 1),
            pos: 0,
            done: false,
            depth: 0,
            diags: Vec::new(),
            too_deep: false,
        };
        p.fill();
        p
    }

    /// Reads tokens until the one after the current is in the window (or the source is
    /// exhausted), first dropping consumed tokens beyond the few kept behind.
    fn fill(&mut self) {
        if self.done || self.pos + 1 < self.toks.len() {
            return;
        }
        if self.pos > KEEP_BEHIND {
            self.toks.drain(..self.pos - KEEP_BEHIND);
            self.pos = KEEP_BEHIND;
        }
        self.read(FILL);
    }

    /// Reads up to `n` more tokens from the source into the window.
    fn read(&mut self, n: usize) {
        for _ in 0..n {
            if self.done {
                return;
            }
            let t = self.src.next_token();
            self.done = matches!(t.kind, TokenKind::Eof);
            // Tokens the lexer already reported stay, so an expression can use them as a
            // placeholder; errors at them are not reported twice.
            self.toks.push(t);
        }
    }

    /// The token `n` past the current one, reading ahead as far as needed; `None` past `Eof`.
    fn ahead(&mut self, n: usize) -> Option<&Token> {
        while !self.done && self.pos + n >= self.toks.len() {
            self.read(FILL);
        }
        self.toks.get(self.pos + n)
    }

    // ---------------------------------------------------------------- token helpers

    fn peek(&self) -> &Token {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }
    fn peek_kind(&self) -> &TokenKind {
        &self.peek().kind
    }
    fn peek_at(&self, n: usize) -> &TokenKind {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].kind
    }
    fn span(&self) -> Span {
        self.peek().span
    }
    fn prev_span(&self) -> Span {
        if self.pos == 0 {
            self.span()
        } else {
            self.toks[self.pos - 1].span
        }
    }
    /// Consumes the current token and returns it. Its text is moved out (the buffer keeps
    /// only the kind's shape and the span), so no string is copied.
    fn bump(&mut self) -> Token {
        let i = self.pos.min(self.toks.len() - 1);
        let t = &mut self.toks[i];
        let kind = match &mut t.kind {
            TokenKind::Ident(s) => TokenKind::Ident(std::mem::take(s)),
            TokenKind::Str(s) => TokenKind::Str(std::mem::take(s)),
            TokenKind::Doc(s) => TokenKind::Doc(std::mem::take(s)),
            TokenKind::InnerDoc(s) => TokenKind::InnerDoc(std::mem::take(s)),
            TokenKind::Eof => {
                return Token {
                    kind: TokenKind::Eof,
                    span: t.span,
                }
            }
            other => other.clone(),
        };
        let tok = Token { kind, span: t.span };
        self.pos += 1;
        self.fill();
        tok
    }
    /// Consumes the current token when only its span is wanted (no text is moved out).
    fn skip(&mut self) -> Span {
        let i = self.pos.min(self.toks.len() - 1);
        let t = &self.toks[i];
        let span = t.span;
        if !matches!(t.kind, TokenKind::Eof) {
            self.pos += 1;
            self.fill();
        }
        span
    }
    fn at_eof(&self) -> bool {
        matches!(self.peek_kind(), TokenKind::Eof)
    }
    fn at_punct(&self, p: Punct) -> bool {
        matches!(self.peek_kind(), TokenKind::Punct(q) if *q == p)
    }
    fn eat_punct(&mut self, p: Punct) -> bool {
        if self.at_punct(p) {
            self.skip();
            true
        } else {
            false
        }
    }
    fn at_open(&self, d: Delim) -> bool {
        matches!(self.peek_kind(), TokenKind::Open(e) if *e == d)
    }
    fn at_close(&self, d: Delim) -> bool {
        matches!(self.peek_kind(), TokenKind::Close(e) if *e == d)
    }
    fn at_kw(&self, kw: &str) -> bool {
        matches!(self.peek_kind(), TokenKind::Ident(s) if s == kw)
    }
    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.at_kw(kw) {
            self.skip();
            true
        } else {
            false
        }
    }
    fn at_item_start(&self) -> bool {
        matches!(self.peek_kind(), TokenKind::Ident(s) if ITEM_KEYWORDS.contains(&s.as_str()))
            || matches!(self.peek_kind(), TokenKind::Doc(_))
    }

    fn error_expected(&mut self, what: &str) -> Reported {
        let t = self.peek().clone();
        if t.kind == TokenKind::Error {
            // Already reported by the lexer.
            return Reported;
        }
        let d = Diagnostic::error(
            Code::UnexpectedToken,
            format!("expected {what}, found {}", t.kind.describe()),
        )
        .primary(t.span, format!("expected {what}"));
        self.push(d);
        Reported
    }

    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn expect_punct(&mut self, p: Punct) -> PResult<Span> {
        if self.at_punct(p) {
            Ok(self.skip())
        } else {
            Err(self.error_expected(&format!("`{}`", p.as_str())))
        }
    }

    fn expect_ident(&mut self, what: &str) -> PResult<Ident> {
        if !matches!(self.peek_kind(), TokenKind::Ident(_)) {
            return Err(self.error_expected(what));
        }
        let t = self.bump();
        match t.kind {
            TokenKind::Ident(name) => Ok(Ident { name, span: t.span }),
            _ => Err(Reported),
        }
    }

    fn expect_kw(&mut self, kw: &str) -> PResult<Span> {
        if self.at_kw(kw) {
            Ok(self.skip())
        } else {
            Err(self.error_expected(&format!("`{kw}`")))
        }
    }

    fn enter(&mut self, span: Span) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            if !self.too_deep {
                self.too_deep = true;
                self.push(
                    Diagnostic::error(Code::NestingTooDeep, format!("nesting deeper than {MAX_DEPTH} levels"))
                        .primary(span, "too deeply nested")
                        .help("split the expression with `let` bindings or parameters"),
                );
            }
            self.depth -= 1;
            return Err(Reported);
        }
        Ok(())
    }
    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Skips a balanced group starting at an opening bracket. Reports an unclosed group.
    fn skip_group(&mut self) {
        let open = self.bump();
        let mut stack = vec![(open.kind.clone(), open.span)];
        while let Some((k, s)) = stack.last().cloned() {
            let t = self.peek().clone();
            match &t.kind {
                TokenKind::Eof => {
                    if let TokenKind::Open(d) = k {
                        self.push(unclosed(d, s));
                    }
                    return;
                }
                TokenKind::Open(_) => {
                    self.skip();
                    stack.push((t.kind.clone(), t.span));
                }
                TokenKind::Close(_) => {
                    self.skip();
                    stack.pop();
                }
                _ => {
                    self.skip();
                }
            }
        }
    }

    /// Whether a list of `len` elements is full ([`MAX_LIST`]); if so, reports it at the
    /// current token.
    fn list_full(&mut self, len: usize, what: &str) -> bool {
        if len < MAX_LIST {
            return false;
        }
        let at = self.span();
        self.push(
            Diagnostic::error(Code::LimitExceeded, format!("a list of more than {MAX_LIST} elements"))
                .primary(at, format!("{what} past the limit"))
                .help("one pair of brackets, block, call's annotations or item's doc comment holds at most 1048576 elements"),
        );
        true
    }

    /// After a list in brackets was found too long: skips to its closing bracket (inner groups
    /// whole) and past it.
    fn skip_rest_of_group(&mut self) {
        loop {
            match self.peek_kind() {
                TokenKind::Eof => return,
                TokenKind::Open(_) => self.skip_group(),
                TokenKind::Close(_) => {
                    self.skip();
                    return;
                }
                _ => {
                    self.skip();
                }
            }
        }
    }

    /// Skips to the end of the current item: past a `;` at depth 0, past a closing `}` group,
    /// or up to the next item keyword at depth 0.
    fn recover_item(&mut self) {
        loop {
            match self.peek_kind() {
                TokenKind::Eof => return,
                TokenKind::Punct(Punct::Semi) => {
                    self.skip();
                    return;
                }
                TokenKind::Open(Delim::Brace) => {
                    self.skip_group();
                    // A brace group ends an item unless `;` follows.
                    self.eat_punct(Punct::Semi);
                    return;
                }
                TokenKind::Open(_) => self.skip_group(),
                TokenKind::Close(_) => {
                    let t = self.bump();
                    self.push(
                        Diagnostic::error(
                            Code::UnbalancedDelimiter,
                            format!("unexpected closing {}", t.kind.describe()),
                        )
                        .primary(t.span, "no bracket is open here"),
                    );
                }
                _ if self.at_item_start() => return,
                _ => {
                    self.skip();
                }
            }
        }
    }

    /// Inside a bracket group: skips to the next `sep` or the closing bracket at depth 0.
    fn recover_in_group(&mut self, close: Delim, sep: Punct) {
        loop {
            match self.peek_kind() {
                TokenKind::Eof => return,
                TokenKind::Punct(p) if *p == sep => return,
                TokenKind::Close(d) if *d == close => return,
                TokenKind::Close(_) => return,
                TokenKind::Open(_) => self.skip_group(),
                _ => {
                    self.skip();
                }
            }
        }
    }

    /// Parses `OPEN item (SEP item)* SEP? CLOSE`, recovering inside the group.
    fn delimited<T>(
        &mut self,
        delim: Delim,
        sep: Punct,
        what: &str,
        mut item: impl FnMut(&mut Self) -> PResult<T>,
    ) -> PResult<(Vec<T>, Span)> {
        if !self.at_open(delim) {
            return Err(self.error_expected(&format!("`{}`", delim.open())));
        }
        // Entered before the bracket is consumed, so recovery skips the whole group.
        self.enter(self.span())?;
        let open = self.skip();
        let mut out = Vec::new();
        let mut failed = false;
        loop {
            if self.at_close(delim) {
                break;
            }
            if self.at_eof() {
                self.leave();
                self.push(unclosed(delim, open));
                return Err(Reported);
            }
            if let TokenKind::Close(other) = *self.peek_kind() {
                let t = self.bump();
                self.push(
                    Diagnostic::error(
                        Code::UnbalancedDelimiter,
                        format!("mismatched closing `{}`", other.close()),
                    )
                    .primary(t.span, format!("expected `{}`", delim.close()))
                    .secondary(open, "to close this"),
                );
                self.leave();
                return Err(Reported);
            }
            if self.list_full(out.len(), what) {
                self.skip_rest_of_group();
                self.leave();
                return Err(Reported);
            }
            match item(self) {
                Ok(v) => out.push(v),
                Err(Reported) => {
                    failed = true;
                    self.recover_in_group(delim, sep);
                }
            }
            if self.eat_punct(sep) {
                continue;
            }
            if !self.at_close(delim) {
                if !failed {
                    let _ = self.error_expected(&format!("`{}` or `{}` after {what}", sep.as_str(), delim.close()));
                }
                failed = true;
                self.recover_in_group(delim, sep);
                if !self.eat_punct(sep) && !self.at_close(delim) {
                    // A mismatched closer or the end: let the loop report it.
                    if self.at_eof() || matches!(self.peek_kind(), TokenKind::Close(_)) {
                        continue;
                    }
                }
            }
        }
        let close = self.skip();
        self.leave();
        if failed {
            Err(Reported)
        } else {
            // Most lists are short: the tree keeps no room for elements that never come.
            out.shrink_to_fit();
            Ok((out, open.to(close)))
        }
    }

    // ---------------------------------------------------------------- items

    pub fn file(&mut self) -> File {
        let mut file = File::default();
        self.inner_docs(&mut file.docs);
        self.items_until(&mut file.items, &[], &|_| {}, &|| false);
        file
    }

    /// The `//!` lines at the start of a file.
    pub(crate) fn inner_docs(&mut self, docs: &mut Vec<String>) {
        let mut full = false;
        while matches!(self.peek_kind(), TokenKind::InnerDoc(_)) {
            if !full && self.list_full(docs.len(), "a doc comment line") {
                full = true;
            }
            if let TokenKind::InnerDoc(d) = self.bump().kind {
                if !full {
                    docs.push(d);
                }
            }
        }
    }

    /// Parses items into `items` until the end of the source, until the next item starts
    /// exactly at one of the byte offsets `stops` (sorted), or until `cancelled` says so
    /// (asked between items). `passed` hears of each stop it went past (its index) as soon
    /// as it knows. The parser's state between two items is its position alone
    /// (and whether it reported the depth limit, see [`Parser::reported_depth_limit`]), so
    /// parsing on from a stop gives what parsing through it would.
    pub(crate) fn items_until(
        &mut self,
        items: &mut Vec<Item>,
        stops: &[usize],
        passed: &dyn Fn(usize),
        cancelled: &dyn Fn() -> bool,
    ) -> PartEnd {
        let mut next = 0;
        loop {
            if self.at_eof() {
                return PartEnd::Eof;
            }
            if next < stops.len() {
                let at = self.peek().span.lo as usize;
                while next < stops.len() && stops[next] < at {
                    passed(next);
                    next += 1;
                }
                if next < stops.len() && stops[next] == at {
                    return PartEnd::Stop(next);
                }
                if cancelled() {
                    return PartEnd::Cancelled;
                }
            }
            if let Some(item) = self.item() {
                items.push(item);
            }
        }
    }

    /// Whether the parser reported the depth limit (which it reports once per source).
    pub(crate) fn reported_depth_limit(&self) -> bool {
        self.too_deep
    }

    fn docs(&mut self) -> Vec<String> {
        let mut docs = Vec::new();
        let mut full = false;
        loop {
            match self.peek_kind() {
                TokenKind::Doc(_) => {
                    if !full && self.list_full(docs.len(), "a doc comment line") {
                        full = true;
                    }
                    if let TokenKind::Doc(d) = self.bump().kind {
                        if !full {
                            docs.push(d);
                        }
                    }
                }
                TokenKind::InnerDoc(_) => {
                    let t = self.bump();
                    self.push(
                        Diagnostic::error(
                            Code::UnexpectedToken,
                            "inner doc comment `//!` after the start of the file",
                        )
                        .primary(t.span, "only allowed at the top of a file")
                        .help("use `///` to document the item that follows"),
                    );
                }
                _ => {
                    docs.shrink_to_fit();
                    return docs;
                }
            }
        }
    }

    /// One item, or `None` after reporting and recovering.
    pub fn item(&mut self) -> Option<Item> {
        let docs = self.docs();
        let start = self.span();
        if self.at_eof() {
            if !docs.is_empty() {
                self.push(
                    Diagnostic::error(Code::UnexpectedToken, "doc comment with nothing to document")
                        .primary(self.prev_span(), "expected an item after this"),
                );
            }
            return None;
        }
        let kw = match self.peek_kind() {
            TokenKind::Ident(kw) => ITEM_KEYWORDS.iter().position(|k| k == kw),
            _ => None,
        };
        let res = match kw.map(|i| ITEM_KEYWORDS[i]) {
            Some("import") => self.import().map(ItemKind::Import),
            Some("param") => self.param().map(ItemKind::Param),
            Some("device") => self.device().map(ItemKind::Device),
            Some("route") => self.route().map(|r| ItemKind::Route(Box::new(r))),
            Some("op" | "comm") => self.op_def().map(|o| ItemKind::Op(Box::new(o))),
            Some("taskflow") => self.taskflow(),
            Some("schedule") => self.schedule().map(|s| ItemKind::Schedule(Box::new(s))),
            Some("profile") => self.profile().map(|p| ItemKind::Profile(Box::new(p))),
            Some("routing" | "policy") => self.signature().map(ItemKind::Signature),
            _ => Err(self.error_item()),
        };
        match res {
            Ok(kind) => Some(Item {
                docs,
                kind,
                span: start.to(self.prev_span()),
            }),
            Err(Reported) => {
                self.recover_item();
                None
            }
        }
    }

    fn error_item(&mut self) -> Reported {
        let t = self.peek().clone();
        if t.kind == TokenKind::Error {
            self.skip();
            return Reported;
        }
        let mut d = Diagnostic::error(
            Code::UnexpectedToken,
            format!("expected an item, found {}", t.kind.describe()),
        )
        .primary(t.span, "expected an item");
        if let TokenKind::Ident(s) = &t.kind {
            if let Some(best) = crate::suggest::closest(s, ITEM_KEYWORDS.iter().copied()) {
                d = d.help(format!("did you mean `{best}`?"));
            } else if s == "let" || s == "return" {
                d = d.help("`let` and `return` belong inside a `taskflow { ... }`");
            } else {
                d = d.help(format!("items start with one of: {}", ITEM_KEYWORDS.join(", ")));
            }
        } else {
            d = d.help(format!("items start with one of: {}", ITEM_KEYWORDS.join(", ")));
        }
        self.push(d);
        Reported
    }

    fn import(&mut self) -> PResult<Import> {
        self.expect_kw("import")?;
        let source;
        let names;
        if let TokenKind::Str(path) = self.peek_kind().clone() {
            let span = self.skip();
            source = ImportSource::File(path, span);
            if self.eat_punct(Punct::ColonColon) {
                names = self.import_tail()?;
            } else {
                names = ImportNames::All(span);
            }
        } else {
            let mut path = vec![self.expect_ident("a module path such as `std::moe` or a file name in quotes")?];
            let mut tail = None;
            while self.eat_punct(Punct::ColonColon) {
                if self.at_open(Delim::Brace) || self.at_punct(Punct::Star) {
                    tail = Some(self.import_tail()?);
                    break;
                }
                if self.list_full(path.len(), "a name") {
                    return Err(Reported);
                }
                path.push(self.expect_ident("a name")?);
            }
            names = match tail {
                Some(t) => t,
                None => {
                    if path.len() < 2 {
                        let s = path[0].span;
                        self.push(
                            Diagnostic::error(Code::UnexpectedToken, "an import needs a module and a name")
                                .primary(s, "incomplete path")
                                .help("write `import std::moe::{gmm, swiglu};` or `import std::moe::*;`"),
                        );
                        return Err(Reported);
                    }
                    let last = path.pop().ok_or(Reported)?;
                    ImportNames::List(vec![last])
                }
            };
            source = ImportSource::Std(path);
        }
        self.expect_punct(Punct::Semi)?;
        Ok(Import { source, names })
    }

    fn import_tail(&mut self) -> PResult<ImportNames> {
        if self.at_punct(Punct::Star) {
            return Ok(ImportNames::All(self.skip()));
        }
        let (names, _) = self.delimited(Delim::Brace, Punct::Comma, "a name", |p| p.expect_ident("a name"))?;
        Ok(ImportNames::List(names))
    }

    fn param(&mut self) -> PResult<Param> {
        self.expect_kw("param")?;
        let name = self.expect_ident("a parameter name")?;
        self.expect_punct(Punct::Eq)?;
        let value = self.expr()?;
        self.expect_punct(Punct::Semi)?;
        Ok(Param { name, value })
    }

    fn device(&mut self) -> PResult<DeviceDecl> {
        self.expect_kw("device")?;
        self.expect_punct(Punct::Eq)?;
        let profile = self.expect_ident("a device profile name such as `ascend_a3`")?;
        let fields = if self.at_open(Delim::Brace) {
            self.fields(Delim::Brace, true)?
        } else {
            Vec::new()
        };
        self.expect_punct(Punct::Semi)?;
        Ok(DeviceDecl { profile, fields })
    }

    /// `{ name: value [unit], ... }` (or parenthesised, for `tile(...)`).
    fn fields(&mut self, delim: Delim, units: bool) -> PResult<Vec<Field>> {
        let (fields, _) = self.delimited(delim, Punct::Comma, "a field", |p| p.field(units))?;
        Ok(fields)
    }

    fn field(&mut self, units: bool) -> PResult<Field> {
        let docs = self.docs();
        let name = self.expect_ident("a field name")?;
        self.expect_punct(Punct::Colon)?;
        let value = self.expr()?;
        let unit = if units { self.unit()? } else { None };
        let span = name.span.to(self.prev_span());
        Ok(Field {
            docs,
            name,
            value,
            unit,
            span,
        })
    }

    fn unit(&mut self) -> PResult<Option<Unit>> {
        if let TokenKind::Ident(_) = self.peek_kind() {
            let num = self.expect_ident("a unit")?;
            let den = if self.eat_punct(Punct::Slash) {
                Some(self.expect_ident("a unit after `/`")?)
            } else {
                None
            };
            let span = num.span.to(self.prev_span());
            Ok(Some(Unit { num, den, span }))
        } else {
            Ok(None)
        }
    }

    fn route(&mut self) -> PResult<RouteDecl> {
        self.expect_kw("route")?;
        let name = self.expect_ident("a routing name")?;
        self.expect_punct(Punct::Eq)?;
        let kind = self.expect_ident("a routing kind such as `balanced`")?;
        let (args, args_span) = self.args()?;
        self.expect_punct(Punct::Semi)?;
        Ok(RouteDecl {
            name,
            kind,
            args,
            args_span,
        })
    }

    fn args(&mut self) -> PResult<(Vec<Arg>, Span)> {
        self.delimited(Delim::Paren, Punct::Comma, "an argument", |p| p.arg())
    }

    fn arg(&mut self) -> PResult<Arg> {
        if matches!(self.peek_kind(), TokenKind::Ident(_)) && matches!(self.peek_at(1), TokenKind::Punct(Punct::Colon))
        {
            let name = self.expect_ident("an argument name")?;
            self.skip();
            let value = self.expr()?;
            Ok(Arg {
                name: Some(name),
                value,
            })
        } else {
            Ok(Arg {
                name: None,
                value: self.expr()?,
            })
        }
    }

    fn schedule(&mut self) -> PResult<ScheduleDecl> {
        self.expect_kw("schedule")?;
        let taskflow = if self.at_punct(Punct::Eq) {
            None
        } else {
            Some(self.expect_ident("a taskflow name or `=`")?)
        };
        self.expect_punct(Punct::Eq)?;
        let policy = self.expect_ident("a policy such as `interleaved`")?;
        let options = if self.at_open(Delim::Brace) {
            self.fields(Delim::Brace, false)?
        } else {
            Vec::new()
        };
        self.expect_punct(Punct::Semi)?;
        Ok(ScheduleDecl {
            taskflow,
            policy,
            options,
        })
    }

    fn profile(&mut self) -> PResult<Profile> {
        self.expect_kw("profile")?;
        let name = self.expect_ident("a profile name")?;
        let base = if self.eat_punct(Punct::Colon) {
            Some(self.expect_ident("a base profile name")?)
        } else {
            None
        };
        let fields = self.fields(Delim::Brace, true)?;
        Ok(Profile { name, base, fields })
    }

    fn signature(&mut self) -> PResult<Signature> {
        let kw = self.bump();
        let kind = if matches!(&kw.kind, TokenKind::Ident(s) if s == "routing") {
            SignatureKind::Routing
        } else {
            SignatureKind::Policy
        };
        let name = self.expect_ident("a name")?;
        let (params, _) = self.delimited(Delim::Paren, Punct::Comma, "a parameter", |p| {
            let name = p.expect_ident("a parameter name")?;
            p.expect_punct(Punct::Colon)?;
            let mut ty = vec![p.expect_ident("a type (`int`, `float`, `bool`, `str`) or allowed names")?];
            while p.eat_punct(Punct::Or) {
                if p.list_full(ty.len(), "an allowed name") {
                    return Err(Reported);
                }
                ty.push(p.expect_ident("a name")?);
            }
            let default = if p.eat_punct(Punct::Eq) { Some(p.expr()?) } else { None };
            let span = name.span.to(p.prev_span());
            Ok(SigParam {
                name,
                ty,
                default,
                span,
            })
        })?;
        self.expect_punct(Punct::Semi)?;
        Ok(Signature { kind, name, params })
    }

    fn generics(&mut self) -> PResult<Vec<Ident>> {
        let mut out = Vec::new();
        if self.eat_punct(Punct::Lt) {
            loop {
                if self.list_full(out.len(), "a dtype parameter") {
                    return Err(Reported);
                }
                out.push(self.expect_ident("a dtype parameter name")?);
                if self.eat_punct(Punct::Comma) {
                    if self.at_punct(Punct::Gt) {
                        break;
                    }
                    continue;
                }
                break;
            }
            self.expect_punct(Punct::Gt)?;
        }
        Ok(out)
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let dtype = self.expect_ident("a dtype such as `bf16` or `T`")?;
        if !self.at_open(Delim::Bracket) {
            return Err(self.error_expected("`[` and the dimensions of the tensor"));
        }
        let (dims, span) = self.delimited(Delim::Bracket, Punct::Comma, "a dimension", |p| p.expr())?;
        Ok(TensorType {
            span: dtype.span.to(span),
            dtype,
            dims,
        })
    }

    fn op_params(&mut self) -> PResult<Vec<OpParam>> {
        let (params, _) = self.delimited(Delim::Paren, Punct::Comma, "a parameter", |p| {
            let name = p.expect_ident("a parameter name")?;
            p.expect_punct(Punct::Colon)?;
            let ty = if p.at_kw("route") && !matches!(p.peek_at(1), TokenKind::Open(Delim::Bracket)) {
                ParamType::Route(p.skip())
            } else {
                ParamType::Tensor(p.tensor_type()?)
            };
            let span = name.span.to(p.prev_span());
            Ok(OpParam { name, ty, span })
        })?;
        Ok(params)
    }

    fn op_def(&mut self) -> PResult<OpDef> {
        let kw = self.bump();
        let kind = if matches!(&kw.kind, TokenKind::Ident(s) if s == "comm") {
            OpKind::Comm
        } else {
            OpKind::Compute
        };
        let name = self.expect_ident("an op name")?;
        let generics = self.generics()?;
        let params = self.op_params()?;
        self.expect_punct(Punct::Arrow)?;
        let ret = self.tensor_type()?;
        let mut engine = None;
        let mut tile = Vec::new();
        // Each clause once: a second one would silently replace the first.
        let mut seen: [Option<Span>; 2] = [None; 2];
        loop {
            let start = self.span();
            let slot = if self.at_kw("on") {
                self.skip();
                engine = Some(self.expect_ident("an engine (`aic` or `aiv`)")?);
                0
            } else if self.at_kw("tile") {
                self.skip();
                tile = self.fields(Delim::Paren, false)?;
                1
            } else {
                break;
            };
            let here = start.to(self.prev_span());
            if let Some(prev) = seen[slot].replace(here) {
                let key = ["on", "tile"][slot];
                self.push(
                    Diagnostic::error(Code::DuplicateArgument, format!("`{key}` is given twice"))
                        .primary(here, "again here")
                        .secondary(prev, "first here")
                        .help(format!("give the op one `{key}` clause")),
                );
                return Err(Reported);
            }
        }
        if kind == OpKind::Compute && engine.is_none() {
            let _ = self.error_expected("`on aic` or `on aiv`");
            return Err(Reported);
        }
        if !self.at_open(Delim::Brace) {
            return Err(self.error_expected("`{` and the op body"));
        }
        let (body, body_span) = self.block(|p| p.op_stmt())?;
        Ok(OpDef {
            kind,
            name,
            generics,
            params,
            ret,
            engine,
            tile,
            body,
            body_span,
        })
    }

    /// `{ stmt* }` with statement-level recovery.
    fn block<T>(&mut self, mut stmt: impl FnMut(&mut Self) -> PResult<T>) -> PResult<(Vec<T>, Span)> {
        // Entered before the bracket is consumed, so recovery skips the whole group.
        self.enter(self.span())?;
        let open = self.skip();
        let mut out = Vec::new();
        let mut failed = false;
        loop {
            if self.at_close(Delim::Brace) {
                break;
            }
            if self.at_eof() {
                self.leave();
                self.push(unclosed(Delim::Brace, open));
                return Err(Reported);
            }
            if let TokenKind::Close(_) = self.peek_kind() {
                let t = self.bump();
                self.push(
                    Diagnostic::error(
                        Code::UnbalancedDelimiter,
                        format!("mismatched closing {}", t.kind.describe()),
                    )
                    .primary(t.span, "expected `}`")
                    .secondary(open, "to close this"),
                );
                failed = true;
                continue;
            }
            if self.at_item_start() && !self.at_kw("route") {
                // Probably a missing `}`: stop here and let the item parse.
                self.leave();
                self.push(unclosed(Delim::Brace, open));
                return Err(Reported);
            }
            if self.list_full(out.len(), "a statement") {
                self.skip_rest_of_group();
                self.leave();
                return Err(Reported);
            }
            match stmt(self) {
                Ok(s) => out.push(s),
                Err(Reported) => {
                    failed = true;
                    self.recover_stmt();
                }
            }
        }
        let close = self.skip();
        self.leave();
        if failed {
            Err(Reported)
        } else {
            // Most lists are short: the tree keeps no room for elements that never come.
            out.shrink_to_fit();
            Ok((out, open.to(close)))
        }
    }

    fn recover_stmt(&mut self) {
        loop {
            match self.peek_kind() {
                TokenKind::Eof | TokenKind::Close(Delim::Brace) => return,
                TokenKind::Punct(Punct::Semi) => {
                    self.skip();
                    return;
                }
                TokenKind::Open(_) => self.skip_group(),
                TokenKind::Close(_) => {
                    self.skip();
                }
                _ => {
                    self.skip();
                }
            }
        }
    }

    fn op_stmt(&mut self) -> PResult<Stmt> {
        let start = self.span();
        if self.eat_kw("let") {
            let name = self.expect_ident("a name")?;
            self.expect_punct(Punct::Eq)?;
            let value = self.expr()?;
            self.expect_punct(Punct::Semi)?;
            return Ok(Stmt::Let {
                name,
                value,
                span: start.to(self.prev_span()),
            });
        }
        if self.eat_kw("put") {
            let target = self.expect_ident("the window to put into (`out`)")?;
            self.expect_punct(Punct::At)?;
            let rank = self.postfix_expr_opts(false)?;
            if !self.at_open(Delim::Bracket) {
                return Err(self.error_expected("`[` and the destination index"));
            }
            let (index, _) = self.delimited(Delim::Bracket, Punct::Comma, "an index", |p| p.expr())?;
            let accumulate = self.assign_op()?;
            let value = self.expr()?;
            self.expect_punct(Punct::Semi)?;
            return Ok(Stmt::Put {
                target,
                rank,
                index,
                accumulate,
                value,
                span: start.to(self.prev_span()),
            });
        }
        let target = self.expect_ident("a statement (`out[...] = ...;`, `let`, or `put`)")?;
        if !self.at_open(Delim::Bracket) {
            return Err(self.error_expected("`[` and the output index"));
        }
        let (index, _) = self.delimited(Delim::Bracket, Punct::Comma, "an index", |p| p.expr())?;
        let accumulate = self.assign_op()?;
        let value = self.expr()?;
        self.expect_punct(Punct::Semi)?;
        Ok(Stmt::Assign {
            target,
            index,
            accumulate,
            value,
            span: start.to(self.prev_span()),
        })
    }

    fn assign_op(&mut self) -> PResult<bool> {
        if self.eat_punct(Punct::Eq) {
            Ok(false)
        } else if self.eat_punct(Punct::PlusEq) {
            Ok(true)
        } else {
            Err(self.error_expected("`=` or `+=`"))
        }
    }

    fn taskflow(&mut self) -> PResult<ItemKind> {
        self.expect_kw("taskflow")?;
        let name = self.expect_ident("a taskflow name")?;
        if self.eat_punct(Punct::Eq) {
            return self.grad(name).map(|g| ItemKind::Grad(Box::new(g)));
        }
        let params = self.op_params()?;
        self.expect_punct(Punct::Arrow)?;
        let ret = if self.at_open(Delim::Paren) {
            let (outs, _) = self.delimited(Delim::Paren, Punct::Comma, "an output", |p| {
                let n = p.expect_ident("an output name")?;
                p.expect_punct(Punct::Colon)?;
                Ok((n, p.tensor_type()?))
            })?;
            TaskflowRet::Named(outs)
        } else {
            TaskflowRet::Single(self.tensor_type()?)
        };
        if !self.at_open(Delim::Brace) {
            return Err(self.error_expected("`{` and the taskflow body"));
        }
        let (body, body_span) = self.block(|p| p.flow_stmt())?;
        Ok(ItemKind::Taskflow(Box::new(Taskflow {
            name,
            params,
            ret,
            body,
            body_span,
        })))
    }

    /// `grad(FORWARD, wrt: [a, b], save: [c], straight_through: [q], detach: [s]);` after
    /// `taskflow NAME =`.
    fn grad(&mut self, name: Ident) -> PResult<GradDecl> {
        const KEYS: [&str; 4] = ["wrt", "save", "straight_through", "detach"];
        let start = self.expect_kw("grad")?;
        if !self.at_open(Delim::Paren) {
            return Err(self.error_expected("`(` and the forward taskflow"));
        }
        let mut forward = None;
        let mut lists: [Option<Vec<Ident>>; 4] = [None, None, None, None];
        let (parts, _) = self.delimited(Delim::Paren, Punct::Comma, "an argument of `grad`", |p| {
            let first = p.expect_ident("the forward taskflow, `wrt:` or `save:`")?;
            if !p.eat_punct(Punct::Colon) {
                return Ok((first, None));
            }
            if !p.at_open(Delim::Bracket) {
                return Err(p.error_expected("`[` and a list of tensor names"));
            }
            let (names, _) = p.delimited(Delim::Bracket, Punct::Comma, "a tensor name", |p| {
                p.expect_ident("a tensor name")
            })?;
            Ok((first, Some(names)))
        })?;
        for (key, names) in parts {
            let Some(names) = names else {
                if forward.is_none() && lists.iter().all(Option::is_none) {
                    forward = Some(key);
                    continue;
                }
                self.push(
                    Diagnostic::error(
                        Code::UnexpectedToken,
                        "`grad` takes the forward taskflow first, then `wrt: [..]` and its other lists",
                    )
                    .primary(
                        key.span,
                        "expected `wrt:`, `save:`, `straight_through:` or `detach:` here",
                    ),
                );
                return Err(Reported);
            };
            let Some(k) = KEYS.iter().position(|k| *k == key.name) else {
                let mut d = Diagnostic::error(Code::UnknownArgument, format!("`grad` has no argument `{}`", key.name))
                    .primary(key.span, "unknown argument")
                    .note(
                        "its arguments are the forward taskflow, `wrt: [..]`, `save: [..]`, `straight_through: [..]` \
                         and `detach: [..]`",
                    );
                if let Some(b) = crate::suggest::closest(&key.name, KEYS.iter().copied()) {
                    d = d.help(format!("did you mean `{b}`?"));
                }
                self.push(d);
                return Err(Reported);
            };
            if lists[k].is_some() {
                self.push(
                    Diagnostic::error(Code::DuplicateArgument, format!("`{}` is given twice", key.name))
                        .primary(key.span, "again here"),
                );
                return Err(Reported);
            }
            lists[k] = Some(names);
        }
        let call_span = start.to(self.prev_span());
        let Some(forward) = forward else {
            self.push(
                Diagnostic::error(Code::MissingArgument, "`grad` needs the forward taskflow")
                    .primary(call_span, "e.g. `grad(moe_ffn, wrt: [x])`"),
            );
            return Err(Reported);
        };
        let [wrt, save, straight_through, detach] = lists;
        let Some(wrt) = wrt else {
            self.push(
                Diagnostic::error(
                    Code::MissingArgument,
                    "`grad` needs `wrt: [..]`, the inputs to differentiate",
                )
                .primary(call_span, "e.g. `grad(moe_ffn, wrt: [x])`"),
            );
            return Err(Reported);
        };
        self.expect_punct(Punct::Semi)?;
        Ok(GradDecl {
            name,
            forward,
            wrt,
            save: save.unwrap_or_default(),
            straight_through: straight_through.unwrap_or_default(),
            detach: detach.unwrap_or_default(),
            call_span,
        })
    }

    fn flow_stmt(&mut self) -> PResult<FlowStmt> {
        let start = self.span();
        let kind = if self.eat_kw("let") {
            let name = self.expect_ident("a name")?;
            self.expect_punct(Punct::Eq)?;
            FlowStmtKind::Let {
                name,
                value: self.expr()?,
            }
        } else if self.eat_kw("return") {
            FlowStmtKind::Return { value: self.expr()? }
        } else {
            return Err(self.error_expected("`let` or `return`"));
        };
        let mut annots = Vec::new();
        loop {
            let s = self.span();
            if ANNOTATION_KEYWORDS.iter().any(|k| self.at_kw(k)) && self.list_full(annots.len(), "an annotation") {
                return Err(Reported);
            }
            if self.eat_kw("tile") {
                let fields = self.fields(Delim::Paren, false)?;
                annots.push(Annot::Tile {
                    fields,
                    span: s.to(self.prev_span()),
                });
            } else if self.eat_kw("on") {
                let engine = self.expect_ident("an engine (`aic` or `aiv`)")?;
                annots.push(Annot::On {
                    engine,
                    span: s.to(self.prev_span()),
                });
            } else if self.eat_kw("order") {
                let (hints, _) = self.delimited(Delim::Paren, Punct::Comma, "an ordering hint", |p| {
                    p.expect_ident("an ordering hint such as `ratr`")
                })?;
                annots.push(Annot::Order {
                    hints,
                    span: s.to(self.prev_span()),
                });
            } else if self.eat_kw("priority") {
                if !self.at_open(Delim::Paren) {
                    return Err(self.error_expected("`(`"));
                }
                let (mut v, _) = self.delimited(Delim::Paren, Punct::Comma, "a priority", |p| p.expr())?;
                if v.len() != 1 {
                    let sp = s.to(self.prev_span());
                    self.push(Diagnostic::error(Code::WrongArgCount, "`priority` takes one value").primary(sp, "here"));
                    return Err(Reported);
                }
                annots.push(Annot::Priority {
                    value: v.remove(0),
                    span: s.to(self.prev_span()),
                });
            } else {
                break;
            }
        }
        if !self.at_punct(Punct::Semi) {
            let mut d = Diagnostic::error(
                Code::UnexpectedToken,
                format!("expected `;` or an annotation, found {}", self.peek_kind().describe()),
            )
            .primary(self.span(), "expected `;`");
            if let TokenKind::Ident(s) = self.peek_kind() {
                if let Some(b) = crate::suggest::closest(s, ANNOTATION_KEYWORDS.iter().copied()) {
                    d = d.help(format!("did you mean `{b}`?"));
                } else {
                    d = d.help("annotations are `tile(...)`, `on ENGINE`, `order(...)` and `priority(N)`");
                }
            }
            self.push(d);
            return Err(Reported);
        }
        self.skip();
        Ok(FlowStmt {
            kind,
            annots,
            span: start.to(self.prev_span()),
        })
    }

    // ---------------------------------------------------------------- expressions

    pub fn expr(&mut self) -> PResult<Expr> {
        self.binary(1)
    }

    fn bin_op(&self) -> Option<BinOp> {
        match self.peek_kind() {
            TokenKind::Punct(Punct::Plus) => Some(BinOp::Add),
            TokenKind::Punct(Punct::Minus) => Some(BinOp::Sub),
            TokenKind::Punct(Punct::Star) => Some(BinOp::Mul),
            TokenKind::Punct(Punct::Slash) => Some(BinOp::Div),
            TokenKind::Punct(Punct::Percent) => Some(BinOp::Rem),
            _ => None,
        }
    }

    /// A chain of binary operators; each operator is a level of the tree, so it counts
    /// against the nesting limit until the chain ends.
    fn binary(&mut self, min_prec: u8) -> PResult<Expr> {
        let mut entered = 0;
        let r = self.binary_chain(min_prec, &mut entered);
        for _ in 0..entered {
            self.leave();
        }
        r
    }

    fn binary_chain(&mut self, min_prec: u8, entered: &mut u32) -> PResult<Expr> {
        let mut lhs = self.unary()?;
        while let Some(op) = self.bin_op() {
            let prec = op.precedence();
            if prec < min_prec {
                break;
            }
            let op_span = self.skip();
            self.enter(op_span)?;
            *entered += 1;
            let rhs = if prec == 1 { self.binary(2)? } else { self.unary()? };
            let span = lhs.span.to(rhs.span);
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                span,
            };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> PResult<Expr> {
        if self.at_punct(Punct::Minus) {
            let s = self.skip();
            self.enter(s)?;
            let inner = self.unary();
            self.leave();
            let inner = inner?;
            let span = s.to(inner.span);
            return Ok(Expr {
                kind: ExprKind::Neg(Box::new(inner)),
                span,
            });
        }
        self.postfix_expr()
    }

    fn postfix_expr(&mut self) -> PResult<Expr> {
        self.postfix_expr_opts(true)
    }

    /// A primary with calls, field accesses and (if `index`) indexing.
    fn postfix_expr_opts(&mut self, index: bool) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            if self.at_open(Delim::Paren) {
                let (args, s) = self.args()?;
                let span = e.span.to(s);
                e = Expr {
                    kind: ExprKind::Call {
                        callee: Box::new(e),
                        args: args.into(),
                    },
                    span,
                };
            } else if index && self.at_open(Delim::Bracket) {
                let (index, s) = self.delimited(Delim::Bracket, Punct::Comma, "an index", |p| p.expr())?;
                let span = e.span.to(s);
                e = Expr {
                    kind: ExprKind::Index {
                        base: Box::new(e),
                        index: index.into(),
                    },
                    span,
                };
            } else if self.at_punct(Punct::Dot) {
                self.skip();
                let field = self.expect_ident("a field or method name after `.`")?;
                let span = e.span.to(field.span);
                e = Expr {
                    kind: ExprKind::Field {
                        base: Box::new(e),
                        field: Box::new(field),
                    },
                    span,
                };
            } else {
                return Ok(e);
            }
        }
    }

    fn primary(&mut self) -> PResult<Expr> {
        if matches!(self.peek_kind(), TokenKind::Ident(name) if name == "max") && self.max_is_reduction() {
            return self.sum(ReduceOp::Max);
        }
        match self.peek_kind() {
            TokenKind::Ident(name) if name == "sum" && matches!(self.peek_at(1), TokenKind::Open(Delim::Paren)) => {
                return self.sum(ReduceOp::Sum);
            }
            TokenKind::Ident(name) if name == "cast" && matches!(self.peek_at(1), TokenKind::Punct(Punct::Lt)) => {
                return self.cast();
            }
            TokenKind::Open(Delim::Paren) => {
                let (mut items, span) = self.delimited(Delim::Paren, Punct::Comma, "an expression", |p| p.expr())?;
                let trailing_comma = matches!(
                    self.toks.get(self.pos.wrapping_sub(2)).map(|t| &t.kind),
                    Some(TokenKind::Punct(Punct::Comma))
                );
                if items.len() == 1 && !trailing_comma {
                    let mut e = items.remove(0);
                    e.span = span;
                    return Ok(e);
                }
                return Ok(Expr {
                    kind: ExprKind::Tuple(items.into()),
                    span,
                });
            }
            TokenKind::Int(_) | TokenKind::Float(_) | TokenKind::Str(_) | TokenKind::Ident(_) | TokenKind::Error => {}
            _ => return Err(self.error_expected("an expression")),
        }
        let t = self.bump();
        let kind = match t.kind {
            // A literal past 64 bits was reported by the lexer: an error node, not a value.
            TokenKind::Int(v) => v.map_or(ExprKind::Error, ExprKind::Int),
            TokenKind::Float(v) => ExprKind::Float(v),
            TokenKind::Str(s) => ExprKind::Str(s.into()),
            TokenKind::Ident(name) => ExprKind::Name(name.into()),
            TokenKind::Error => ExprKind::Error,
            _ => return Err(Reported),
        };
        Ok(Expr { kind, span: t.span })
    }

    /// At `max(`: whether the parenthesised list is followed by the start of a reduction
    /// body (a name, a number or `(`), as in `max(k) abs(x[m, k])`; otherwise `max(a, b)` is
    /// the function. A body starting with `-` or with an annotation keyword (`tile`, `on`,
    /// `order`, `priority`) must be parenthesised.
    fn max_is_reduction(&mut self) -> bool {
        if !matches!(self.peek_at(1), TokenKind::Open(Delim::Paren)) {
            return false;
        }
        let mut depth = 0usize;
        let mut i = 1;
        while let Some(t) = self.ahead(i) {
            if i > MAX_REDUCTION_LOOKAHEAD {
                return false;
            }
            match &t.kind {
                TokenKind::Open(_) => depth += 1,
                TokenKind::Close(_) => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                TokenKind::Eof => return false,
                _ => {}
            }
            i += 1;
        }
        match self.ahead(i + 1).map(|t| &t.kind) {
            Some(TokenKind::Ident(n)) => !ANNOTATION_KEYWORDS.contains(&n.as_str()),
            Some(TokenKind::Int(_) | TokenKind::Float(_) | TokenKind::Open(Delim::Paren)) => true,
            _ => false,
        }
    }

    /// `cast<DTYPE>(EXPR)`.
    fn cast(&mut self) -> PResult<Expr> {
        let start = self.skip();
        self.expect_punct(Punct::Lt)?;
        let dtype = self.expect_ident("a dtype")?;
        self.expect_punct(Punct::Gt)?;
        let (mut args, span) = self.delimited(Delim::Paren, Punct::Comma, "an expression", |p| p.expr())?;
        if args.len() != 1 {
            self.push(
                Diagnostic::error(
                    Code::WrongArgCount,
                    format!("`cast<{}>` takes one argument, got {}", dtype.name, args.len()),
                )
                .primary(span, "as in `cast<i8>(x[m, k])`"),
            );
            return Err(Reported);
        }
        Ok(Expr {
            kind: ExprKind::Cast {
                dtype: Box::new(dtype),
                arg: Box::new(args.remove(0)),
            },
            span: start.to(span),
        })
    }

    fn sum(&mut self, op: ReduceOp) -> PResult<Expr> {
        let start = self.skip();
        let (binders, _) = self.delimited(Delim::Paren, Punct::Comma, "a reduction variable", |p| {
            let var = p.expect_ident("a reduction variable")?;
            if p.eat_kw("in") {
                p.expect_kw("group")?;
                let (mut g, gs) = p.delimited(Delim::Paren, Punct::Comma, "a group variable", |p| {
                    p.expect_ident("a group variable")
                })?;
                if g.len() != 1 {
                    p.push(
                        Diagnostic::error(Code::WrongArgCount, "`group(...)` takes one variable").primary(gs, "here"),
                    );
                    return Err(Reported);
                }
                Ok(Binder::InGroup {
                    var,
                    group: g.remove(0),
                })
            } else {
                Ok(Binder::Full(var))
            }
        })?;
        if binders.is_empty() {
            let s = self.prev_span();
            self.push(
                Diagnostic::error(
                    Code::UnexpectedToken,
                    format!("`{}` needs at least one reduction variable", op.as_str()),
                )
                .primary(start.to(s), "as in `sum(k) x[m, k] * w[k, n]`"),
            );
            return Err(Reported);
        }
        self.enter(start)?;
        let body = self.binary(2);
        self.leave();
        let body = body?;
        let span = start.to(body.span);
        Ok(Expr {
            kind: ExprKind::Sum {
                op,
                binders: binders.into(),
                body: Box::new(body),
            },
            span,
        })
    }
}

fn unclosed(d: Delim, open: Span) -> Diagnostic {
    Diagnostic::error(Code::UnbalancedDelimiter, format!("unclosed `{}`", d.open()))
        .primary(open, format!("this `{}` is never closed", d.open()))
        .help(format!("add the matching `{}`", d.close()))
}
