//! The `taskflow!` front end: a `proc_macro2::TokenStream` in, [`Token`]s out (through
//! [`TokenSource`]), with a side table from each token to its `proc_macro2::Span`.
//!
//! Spans of the tokens are token indices: token `i` has `Span { lo: i, hi: i + 1 }` and the end
//! of the input is `Span { lo: n, hi: n }`. A span `lo..hi` produced by the parser or checker
//! covers the tokens `lo..hi`; [`ProcTokens::range`] turns it into the `proc_macro2` spans of
//! its first and last token, which is what a `compile_error!` needs to underline it.
//!
//! The conversion follows the file lexer ([`super::lexer`]) so that a program means the same
//! inside the macro as in a file:
//!
//! - groups become `Open`/`Close` tokens (spans of the delimiters); `None`-delimited groups
//!   (from `macro_rules!` fragments) are transparent;
//! - `#[doc = "..."]` and `#![doc = "..."]` (what `///` and `//!` become) become `Doc` and
//!   `InnerDoc` tokens, with one leading space removed as the lexer does;
//! - `Joint` punctuation is joined into the language's two-character tokens (`::`, `->`, `=>`,
//!   `+=`, `-=`, `==`, `!=`, `<=`, `>=`, `..`), left to right as the lexer joins them;
//! - a raw identifier `r#name` is the identifier `name`;
//! - literals are read by the file lexer itself: integers (decimal, `0x`, `0o`, `0b`, with
//!   `_`), floats and strings with the lexer's escapes; a suffix is error E0107, an integer
//!   that overflows 64 bits is E0105 (`Int(None)`); character, byte and raw string literals
//!   are E0107; a lifetime's `'` is E0102.
//!
//! [`ProcTokens::text`] prints the tokens back as source text that lexes to the same token
//! kinds, keeping the line structure of the invocation.

use super::lexer;
use super::token::{Delim, FileId, Punct, Span, Token, TokenKind, TokenSource};
use crate::diag::{Code, Diagnostic};
use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// The `proc_macro2` span of the first and of the last source token of one of our tokens (a
/// joined punctuation or a doc attribute is made of several).
pub type SpanPair = (proc_macro2::Span, proc_macro2::Span);

/// The tokens of a macro invocation, their `proc_macro2` spans and the lexical errors found.
#[derive(Debug)]
pub struct ProcTokens {
    file: FileId,
    toks: Vec<Token>,
    /// `spans[i]` for token `i`; `spans[n]` (one more entry) for the end of the input.
    spans: Vec<SpanPair>,
    /// Per token: the source line of its start (1-based; 0 when unknown).
    lines: Vec<usize>,
    pos: usize,
    /// Lexical errors (E0102, E0105, E0107), with token-index spans.
    pub diags: Vec<Diagnostic>,
}

impl ProcTokens {
    /// Converts a token stream. Spans carry `file`.
    pub fn new(stream: TokenStream, file: FileId) -> Self {
        let mut p = ProcTokens {
            file,
            toks: Vec::new(),
            spans: Vec::new(),
            lines: Vec::new(),
            pos: 0,
            diags: Vec::new(),
        };
        p.walk(stream);
        let end = match p.spans.last() {
            Some(&(_, last)) => (last, last),
            None => (proc_macro2::Span::call_site(), proc_macro2::Span::call_site()),
        };
        p.spans.push(end);
        p
    }

    /// The file id in every span.
    pub fn file(&self) -> FileId {
        self.file
    }

    /// The tokens (without the final `Eof`).
    pub fn tokens(&self) -> &[Token] {
        &self.toks
    }

    /// The span of the end of the input (what `Eof` carries).
    pub fn eof_span(&self) -> Span {
        let n = self.toks.len() as u32;
        Span::new(self.file, n, n)
    }

    /// The `proc_macro2` spans of the first and last token a span covers. Spans past the end
    /// are clamped to the last token (or the call site when there is no token).
    pub fn range(&self, span: Span) -> SpanPair {
        let last = self.spans.len() - 1;
        let lo = (span.lo as usize).min(last);
        let hi = if span.hi > span.lo { span.hi as usize - 1 } else { lo };
        let hi = hi.clamp(lo, last);
        (self.spans[lo].0, self.spans[hi].1)
    }

    /// Source text that lexes to exactly these token kinds: tokens separated by a space, a
    /// new line where the invocation had one (at most one blank line kept) and after every
    /// doc comment.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut prev_line = 0usize;
        let mut after_doc = false;
        for (i, t) in self.toks.iter().enumerate() {
            let line = self.lines[i];
            if i > 0 {
                if after_doc || (line > prev_line && prev_line > 0) {
                    out.push('\n');
                    if line > prev_line + 1 && prev_line > 0 {
                        out.push('\n');
                    }
                } else if line == 0 && matches!(self.toks[i - 1].kind, TokenKind::Punct(Punct::Semi) | TokenKind::Open(Delim::Brace) | TokenKind::Close(Delim::Brace)) {
                    out.push('\n');
                } else {
                    out.push(' ');
                }
            }
            after_doc = false;
            match &t.kind {
                TokenKind::Ident(s) => out.push_str(s),
                TokenKind::Int(Some(v)) => out.push_str(&v.to_string()),
                // Already reported: any text that is an integer too large keeps the meaning.
                TokenKind::Int(None) => out.push_str("18446744073709551616"),
                TokenKind::Float(v) => out.push_str(&float_text(*v)),
                TokenKind::Str(s) => out.push_str(&quote(s)),
                TokenKind::Doc(d) => {
                    out.push_str("/// ");
                    out.push_str(d);
                    after_doc = true;
                }
                TokenKind::InnerDoc(d) => {
                    out.push_str("//! ");
                    out.push_str(d);
                    after_doc = true;
                }
                TokenKind::Punct(p) => out.push_str(p.as_str()),
                TokenKind::Open(d) => out.push(d.open()),
                TokenKind::Close(d) => out.push(d.close()),
                // Only after an error; never embedded.
                TokenKind::Error => out.push_str("`"),
                TokenKind::Eof => {}
            }
            if line > 0 {
                prev_line = line;
            }
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }

    // ------------------------------------------------------------------ conversion

    fn push(&mut self, kind: TokenKind, spans: SpanPair) {
        let i = self.toks.len() as u32;
        self.toks.push(Token {
            kind,
            span: Span::new(self.file, i, i + 1),
        });
        self.lines.push(line_of(spans.0));
        self.spans.push(spans);
    }

    fn error(&mut self, code: Code, message: String, label: &str, help: &str, spans: SpanPair) {
        let i = self.toks.len() as u32;
        self.diags.push(
            Diagnostic::error(code, message)
                .primary(Span::new(self.file, i, i + 1), label)
                .help(help),
        );
        self.push(TokenKind::Error, spans);
    }

    fn walk(&mut self, stream: TokenStream) {
        let trees: Vec<TokenTree> = stream.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    let d = match g.delimiter() {
                        Delimiter::Parenthesis => Delim::Paren,
                        Delimiter::Bracket => Delim::Bracket,
                        Delimiter::Brace => Delim::Brace,
                        Delimiter::None => {
                            self.walk(g.stream());
                            i += 1;
                            continue;
                        }
                    };
                    self.push(TokenKind::Open(d), (g.span_open(), g.span_open()));
                    self.walk(g.stream());
                    self.push(TokenKind::Close(d), (g.span_close(), g.span_close()));
                }
                TokenTree::Ident(id) => {
                    let s = id.to_string();
                    let name = s.strip_prefix("r#").map_or(s.clone(), str::to_string);
                    self.push(TokenKind::Ident(name), (id.span(), id.span()));
                }
                TokenTree::Literal(l) => self.literal(l),
                TokenTree::Punct(p) => {
                    if p.as_char() == '#' {
                        if let Some(used) = self.doc_attribute(&trees[i..]) {
                            i += used;
                            continue;
                        }
                    }
                    let next = match (p.spacing(), trees.get(i + 1)) {
                        (Spacing::Joint, Some(TokenTree::Punct(q))) => Some(q),
                        _ => None,
                    };
                    if let Some(q) = next {
                        if let Some(joined) = join(p.as_char(), q.as_char()) {
                            self.push(TokenKind::Punct(joined), (p.span(), q.span()));
                            i += 2;
                            continue;
                        }
                    }
                    match single(p.as_char()) {
                        Some(k) => self.push(TokenKind::Punct(k), (p.span(), p.span())),
                        None => self.error(
                            Code::InvalidCharacter,
                            format!("invalid character {:?}", p.as_char()),
                            "not part of any token of the language",
                            "the language uses Rust tokens: identifiers, numbers, strings, punctuation, brackets",
                            (p.span(), p.span()),
                        ),
                    }
                }
            }
            i += 1;
        }
    }

    /// `#[doc = "..."]` or `#![doc = "..."]` at the start of `trees`: pushes the doc token(s)
    /// and returns how many trees it used.
    fn doc_attribute(&mut self, trees: &[TokenTree]) -> Option<usize> {
        let (inner, group) = match (trees.get(1), trees.get(2)) {
            (Some(TokenTree::Punct(b)), Some(TokenTree::Group(g))) if b.as_char() == '!' => (true, g),
            (Some(TokenTree::Group(g)), _) => (false, g),
            _ => return None,
        };
        if group.delimiter() != Delimiter::Bracket {
            return None;
        }
        let body: Vec<TokenTree> = group.stream().into_iter().collect();
        let [TokenTree::Ident(name), TokenTree::Punct(eq), TokenTree::Literal(lit)] = body.as_slice() else {
            return None;
        };
        if name != "doc" || eq.as_char() != '=' {
            return None;
        }
        let text = rust_string_value(&lit.to_string())?;
        let spans = (trees[0].span(), group.span_close());
        // A block doc comment (`/** ... */`) is one attribute of several lines.
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let line = line.strip_prefix(' ').unwrap_or(line).to_string();
            let kind = if inner { TokenKind::InnerDoc(line) } else { TokenKind::Doc(line) };
            self.push(kind, spans);
        }
        Some(if inner { 3 } else { 2 })
    }

    fn literal(&mut self, l: &proc_macro2::Literal) {
        let text = l.to_string();
        let span = (l.span(), l.span());
        // A negative literal (from a `macro_rules!` fragment): a `-` token, then the number.
        let (neg, body) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let first = body.chars().next().unwrap_or(' ');
        if !(first.is_ascii_digit() || (first == '"' && !neg)) {
            self.error(
                Code::InvalidLiteral,
                format!("`{text}` is not a literal of the language"),
                "not a number or a string",
                "the language has integers, floats and strings; character, byte and raw string literals are not allowed",
                span,
            );
            return;
        }
        if neg {
            self.push(TokenKind::Punct(Punct::Minus), span);
        }
        let (toks, diags, _) = lexer::tokenize(body, FileId(u32::MAX));
        let i = self.toks.len() as u32;
        let here = Span::new(self.file, i, i + 1);
        let toks: Vec<&Token> = toks.iter().filter(|t| t.kind != TokenKind::Eof).collect();
        if toks.len() != 1 {
            // E.g. `1.`, which Rust reads as a float and the language as `1` and `.`.
            self.error(
                Code::InvalidLiteral,
                format!("`{text}` is not a literal of the language"),
                "not a number the language can read",
                "write floats with digits after the point, as in `1.0`",
                span,
            );
            return;
        }
        for mut d in diags {
            for label in &mut d.labels {
                label.span = here;
            }
            self.diags.push(d);
        }
        self.push(toks[0].kind.clone(), span);
    }
}

impl TokenSource for ProcTokens {
    fn next_token(&mut self) -> Token {
        match self.toks.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                t.clone()
            }
            None => Token {
                kind: TokenKind::Eof,
                span: self.eof_span(),
            },
        }
    }
}

/// The 1-based line of a span's start (0 when the compiler does not tell).
fn line_of(s: proc_macro2::Span) -> usize {
    s.start().line
}

fn single(c: char) -> Option<Punct> {
    use Punct as P;
    Some(match c {
        ':' => P::Colon,
        ';' => P::Semi,
        ',' => P::Comma,
        '.' => P::Dot,
        '=' => P::Eq,
        '<' => P::Lt,
        '>' => P::Gt,
        '+' => P::Plus,
        '-' => P::Minus,
        '*' => P::Star,
        '/' => P::Slash,
        '%' => P::Percent,
        '@' => P::At,
        '#' => P::Pound,
        '!' => P::Bang,
        '&' => P::And,
        '|' => P::Or,
        '^' => P::Caret,
        '?' => P::Question,
        '$' => P::Dollar,
        '~' => P::Tilde,
        _ => return None,
    })
}

fn join(a: char, b: char) -> Option<Punct> {
    use Punct as P;
    Some(match (a, b) {
        (':', ':') => P::ColonColon,
        ('.', '.') => P::DotDot,
        ('-', '>') => P::Arrow,
        ('=', '>') => P::FatArrow,
        ('+', '=') => P::PlusEq,
        ('-', '=') => P::MinusEq,
        ('=', '=') => P::EqEq,
        ('!', '=') => P::Ne,
        ('<', '=') => P::Le,
        ('>', '=') => P::Ge,
        _ => return None,
    })
}

/// The value of a Rust string literal (`"..."` with Rust's escapes, or `r#"..."#`); `None`
/// for anything else.
pub(crate) fn rust_string_value(lit: &str) -> Option<String> {
    if let Some(raw) = lit.strip_prefix('r') {
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let inner = raw.get(hashes..raw.len().checked_sub(hashes)?)?;
        return inner.strip_prefix('"')?.strip_suffix('"').map(str::to_string);
    }
    let inner = lit.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'x' => {
                let hex: String = [chars.next()?, chars.next()?].iter().collect();
                out.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
            }
            'u' => {
                if chars.next()? != '{' {
                    return None;
                }
                let mut hex = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        '_' => {}
                        h => hex.push(h),
                    }
                }
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            // A line continuation: the newline and the next line's leading whitespace.
            '\n' => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A float that lexes back to the same value as a float token.
fn float_text(v: f64) -> String {
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// A string literal with the lexer's escapes.
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
