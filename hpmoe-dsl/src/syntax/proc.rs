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
//! - a raw identifier `r#name` is the identifier `name`; an identifier with a character
//!   beyond ASCII is E0102, as in a file;
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
                } else if line == 0
                    && matches!(
                        self.toks[i - 1].kind,
                        TokenKind::Punct(Punct::Semi) | TokenKind::Open(Delim::Brace) | TokenKind::Close(Delim::Brace)
                    )
                {
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
                TokenKind::Error => out.push('`'),
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
                    // Rust takes Unicode identifiers; the language (and the file lexer) only
                    // ASCII ones.
                    match name.chars().find(|c| !c.is_ascii()) {
                        Some(ch) => self.error(
                            Code::InvalidCharacter,
                            format!("invalid character {ch:?} in identifier `{name}`"),
                            "not part of any token of the language",
                            "identifiers are ASCII letters, digits and `_`, as in `.hpm` files",
                            (id.span(), id.span()),
                        ),
                        None => self.push(TokenKind::Ident(name), (id.span(), id.span())),
                    }
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
            let kind = if inner {
                TokenKind::InnerDoc(line)
            } else {
                TokenKind::Doc(line)
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn convert(src: &str) -> ProcTokens {
        ProcTokens::new(TokenStream::from_str(src).expect("Rust tokens"), FileId(7))
    }

    fn kinds(p: &ProcTokens) -> Vec<TokenKind> {
        p.tokens().iter().map(|t| t.kind.clone()).collect()
    }

    /// `(line, column)` of the first and last `proc_macro2` span of token `i` (1-based lines,
    /// 0-based columns, as `proc_macro2` counts).
    fn at(p: &ProcTokens, i: u32) -> ((usize, usize), (usize, usize)) {
        let (a, b) = p.range(Span::new(p.file(), i, i + 1));
        ((a.start().line, a.start().column), (b.end().line, b.end().column))
    }

    fn lexed(src: &str) -> Vec<TokenKind> {
        let (toks, diags, _) = lexer::tokenize(src, FileId(0));
        assert!(diags.is_empty(), "{diags:?}");
        toks.into_iter()
            .map(|t| t.kind)
            .filter(|k| *k != TokenKind::Eof)
            .collect()
    }

    #[test]
    fn every_token_kind_with_its_span() {
        let src = "param x = 0x1F;\nroute r = zipf(s: 1.5, path: \"a\\tb\");\n@ $ ~ ? ^ | & ! % #";
        let p = convert(src);
        assert!(p.diags.is_empty(), "{:?}", p.diags);
        let k = kinds(&p);
        use TokenKind as K;
        let id = |s: &str| K::Ident(s.into());
        assert_eq!(
            k[..14],
            [
                id("param"),
                id("x"),
                K::Punct(Punct::Eq),
                K::Int(Some(31)),
                K::Punct(Punct::Semi),
                id("route"),
                id("r"),
                K::Punct(Punct::Eq),
                id("zipf"),
                K::Open(Delim::Paren),
                id("s"),
                K::Punct(Punct::Colon),
                K::Float(1.5),
                K::Punct(Punct::Comma),
            ]
        );
        assert_eq!(k[16], K::Str("a\tb".into()));
        assert_eq!(k[17], K::Close(Delim::Paren));
        // Spans: line 1 `0x1F` at columns 10..14; the float on line 2; the string; the `)`.
        assert_eq!(at(&p, 3), ((1, 10), (1, 14)));
        assert_eq!(at(&p, 12), ((2, 18), (2, 21)));
        assert_eq!(at(&p, 16), ((2, 29), (2, 35)));
        assert_eq!(at(&p, 17), ((2, 35), (2, 36)));
        // Every token is one index; the end of the input is past the last token.
        for (i, t) in p.tokens().iter().enumerate() {
            assert_eq!(t.span, Span::new(FileId(7), i as u32, i as u32 + 1));
        }
        assert_eq!(p.eof_span(), Span::new(FileId(7), k.len() as u32, k.len() as u32));
        assert_eq!(k, lexed(src));
        // The end of the input maps to the last token.
        let last = at(&p, k.len() as u32 - 1);
        let (a, b) = p.range(p.eof_span());
        assert_eq!(
            ((a.start().line, a.start().column), (b.end().line, b.end().column)),
            last
        );
    }

    #[test]
    fn nested_groups_and_ranges() {
        let src = "taskflow f(x: bf16[a, [b]]) -> bf16[a] {\n    return g(x);\n}";
        let p = convert(src);
        let k = kinds(&p);
        assert_eq!(k, lexed(src));
        let opens: Vec<usize> = k
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, TokenKind::Open(_)))
            .map(|(i, _)| i)
            .collect();
        let closes: Vec<usize> = k
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, TokenKind::Close(_)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(opens.len(), 6);
        assert_eq!(closes.len(), 6);
        // `(` of the parameters at column 10; its `)` at 26; the inner `[` at 22, `]` at 24.
        assert_eq!(at(&p, opens[0] as u32), ((1, 10), (1, 11)));
        assert_eq!(at(&p, closes[2] as u32), ((1, 26), (1, 27)));
        assert_eq!(at(&p, opens[2] as u32), ((1, 22), (1, 23)));
        // A range from the parameters' `(` to their `)`.
        let (a, b) = p.range(Span::new(p.file(), opens[0] as u32, closes[2] as u32 + 1));
        assert_eq!((a.start().column, b.end().column), (10, 27));
        // The body's braces on lines 1 and 3.
        assert_eq!(at(&p, opens[4] as u32).0, (1, 39));
        assert_eq!(at(&p, *closes.last().unwrap() as u32).0, (3, 0));
    }

    #[test]
    fn none_delimited_groups_are_transparent() {
        let inner = TokenStream::from_str("1 + 2").unwrap();
        let mut ts = TokenStream::from_str("param x =").unwrap();
        ts.extend([TokenTree::Group(proc_macro2::Group::new(Delimiter::None, inner))]);
        ts.extend(TokenStream::from_str(";").unwrap());
        let p = ProcTokens::new(ts, FileId(0));
        assert_eq!(kinds(&p), lexed("param x = 1 + 2;"));
    }

    #[test]
    fn doc_comments_and_doc_attributes() {
        let src = "//! The file.\n//!\n/// An item, with \"quotes\" and \\ slashes.\n#[doc = \"second\\u{41}\"]\n#[doc = r\" raw\"]\nparam x = 1;";
        let p = convert(src);
        assert!(p.diags.is_empty(), "{:?}", p.diags);
        let k = kinds(&p);
        assert_eq!(
            k[..5],
            [
                TokenKind::InnerDoc("The file.".into()),
                TokenKind::InnerDoc(String::new()),
                TokenKind::Doc("An item, with \"quotes\" and \\ slashes.".into()),
                TokenKind::Doc("secondA".into()),
                TokenKind::Doc("raw".into()),
            ]
        );
        // A doc comment's span is the comment's line.
        assert_eq!(at(&p, 0).0 .0, 1);
        assert_eq!(at(&p, 2).0 .0, 3);
        assert_eq!(at(&p, 3).0 .0, 4);
        // The text form lexes to the same tokens.
        assert_eq!(lexed(&p.text()), k);
        // Another attribute is not a doc: its `#` is a token of its own.
        let p = convert("#[inline] param x = 1;");
        assert_eq!(kinds(&p)[0], TokenKind::Punct(Punct::Pound));
        assert_eq!(kinds(&p)[1], TokenKind::Open(Delim::Bracket));
    }

    #[test]
    fn joint_punctuation_is_joined_as_the_lexer_joins_it() {
        for src in [
            "a::b -> c => d += 1 -= 2 == 3 != 4 <= 5 >= 6 .. 7",
            "a: :b - > c = > d + = 1 < = 2",
            "a..=b ... c <<= d ->> e ==> f !== g",
            "x::<T> y::*",
        ] {
            let p = convert(src);
            assert!(p.diags.is_empty(), "{src}: {:?}", p.diags);
            assert_eq!(kinds(&p), lexed(src), "{src}");
            assert_eq!(lexed(&p.text()), kinds(&p), "{src}");
        }
        // A joined token's range runs from its first character to its last.
        let p = convert("a ::b");
        assert_eq!(at(&p, 1), ((1, 2), (1, 4)));
    }

    #[test]
    fn literals_follow_the_lexer() {
        let p = convert("1_000 0b101 0o17 1e3 2.5e-3 18446744073709551615");
        assert!(p.diags.is_empty());
        assert_eq!(
            kinds(&p),
            [
                TokenKind::Int(Some(1000)),
                TokenKind::Int(Some(5)),
                TokenKind::Int(Some(15)),
                TokenKind::Float(1e3),
                TokenKind::Float(2.5e-3),
                TokenKind::Int(Some(u64::MAX)),
            ]
        );
        // Overflow: `Int(None)` and E0105 at the literal.
        let p = convert("param x = 18446744073709551616;");
        assert_eq!(kinds(&p)[3], TokenKind::Int(None));
        assert_eq!(p.diags.len(), 1);
        assert_eq!(p.diags[0].code, Code::LiteralTooLarge);
        assert_eq!(p.diags[0].span(), Some(Span::new(FileId(7), 3, 4)));
        // Suffixes, characters, bytes, raw strings and `1.`: E0107 at the literal.
        for (src, code) in [
            ("4096u32", Code::InvalidLiteral),
            ("1.5f32", Code::InvalidLiteral),
            ("0xffu8", Code::InvalidLiteral),
            ("'a'", Code::InvalidLiteral),
            ("b\"x\"", Code::InvalidLiteral),
            ("r\"x\"", Code::InvalidLiteral),
            ("1.", Code::InvalidLiteral),
            ("\"\\u{41}\"", Code::InvalidLiteral),
        ] {
            let p = convert(&format!("x = {src};"));
            assert_eq!(p.diags.len(), 1, "{src}: {:?}", p.diags);
            assert_eq!(p.diags[0].code, code, "{src}");
            assert_eq!(p.diags[0].span(), Some(Span::new(FileId(7), 2, 3)), "{src}");
            assert_eq!(kinds(&p)[2], TokenKind::Error, "{src}");
        }
        // A lifetime's quote is an invalid character.
        let p = convert("x = 'a;");
        assert_eq!(p.diags[0].code, Code::InvalidCharacter);
        // Raw identifiers are identifiers.
        assert_eq!(kinds(&convert("r#type"))[0], TokenKind::Ident("type".into()));
        // Identifiers beyond ASCII (Rust has them, the language does not): E0102 at the
        // identifier, which becomes an error token.
        for src in ["_\u{663}", "caf\u{e9}", "r#\u{e9}t\u{e9}", "_\u{300}a"] {
            let p = convert(&format!("x = {src};"));
            assert_eq!(p.diags.len(), 1, "{src}: {:?}", p.diags);
            assert_eq!(p.diags[0].code, Code::InvalidCharacter, "{src}");
            assert_eq!(p.diags[0].span(), Some(Span::new(FileId(7), 2, 3)), "{src}");
            assert_eq!(kinds(&p)[2], TokenKind::Error, "{src}");
        }
    }

    #[test]
    fn negative_literals_from_fragments() {
        let ts = TokenStream::from_iter([TokenTree::Literal(proc_macro2::Literal::i64_unsuffixed(-3))]);
        let p = ProcTokens::new(ts, FileId(0));
        assert_eq!(kinds(&p), [TokenKind::Punct(Punct::Minus), TokenKind::Int(Some(3))]);
    }

    #[test]
    fn text_keeps_lines_and_lexes_to_the_same_tokens() {
        let src = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/deepseek_v3_ep8_fwd.hpm"
        ))
        .unwrap();
        let p = convert(&src);
        assert!(p.diags.is_empty());
        let text = p.text();
        assert_eq!(lexed(&text), kinds(&p));
        // One line per source line with tokens; blank lines kept (at most one).
        assert!(text.contains("param tokens = 4096 ;\nparam hidden = 7168 ;"), "{text}");
        assert!(text.contains("ranks = 8 ;\n\ndevice"), "{text}");
    }
}
