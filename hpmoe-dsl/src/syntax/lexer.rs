//! The file lexer: source text in, [`Token`]s with byte-range spans out (through
//! [`TokenSource`]). Built on logos. Accepts exactly the Rust tokens the language uses, so
//! the same text can be written inside the `taskflow!` macro.

use super::token::{Delim, FileId, Punct, Span, Token, TokenKind, TokenSource};
use crate::diag::{Code, Diagnostic};
use logos::Logos;

#[derive(Logos, Debug, Clone, PartialEq)]
#[logos(skip r"[ \t\r\n\f]+")]
enum Raw {
    #[regex(r"//[^\n]*", allow_greedy = true)]
    LineComment,
    #[token("/*")]
    BlockCommentStart,
    #[regex(r"[A-Za-z_][A-Za-z0-9_]*")]
    Ident,
    #[regex(r"[0-9][0-9_]*")]
    #[regex(r"0x[0-9a-fA-F_]+")]
    #[regex(r"0b[01_]+")]
    #[regex(r"0o[0-7_]+")]
    Int,
    #[regex(r"[0-9][0-9_]*[A-Za-z][A-Za-z0-9_]*", priority = 1)]
    #[regex(
        r"[0-9][0-9_]*\.[0-9][0-9_]*([eE][+-]?[0-9_]*[0-9][0-9_]*)?[A-Za-z_][A-Za-z0-9_]*",
        priority = 1
    )]
    #[regex(r"[0-9][0-9_]*[eE][+-][0-9_]*[0-9][0-9_]*[A-Za-z_][A-Za-z0-9_]*", priority = 1)]
    SuffixedNumber,
    #[regex(r"[0-9][0-9_]*\.[0-9][0-9_]*([eE][+-]?[0-9_]*[0-9][0-9_]*)?")]
    #[regex(r"[0-9][0-9_]*[eE][+-]?[0-9_]*[0-9][0-9_]*")]
    Float,
    #[token("\"")]
    StrStart,
    #[token("::")]
    ColonColon,
    #[token(":")]
    Colon,
    #[token(";")]
    Semi,
    #[token(",")]
    Comma,
    #[token(".")]
    Dot,
    #[token("..")]
    DotDot,
    #[token("->")]
    Arrow,
    #[token("=>")]
    FatArrow,
    #[token("=")]
    Eq,
    #[token("+=")]
    PlusEq,
    #[token("-=")]
    MinusEq,
    #[token("==")]
    EqEq,
    #[token("!=")]
    Ne,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token("<=")]
    Le,
    #[token(">=")]
    Ge,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("@")]
    At,
    #[token("#")]
    Pound,
    #[token("!")]
    Bang,
    #[token("&")]
    And,
    #[token("|")]
    Or,
    #[token("^")]
    Caret,
    #[token("?")]
    Question,
    #[token("$")]
    Dollar,
    #[token("~")]
    Tilde,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
}

/// A comment seen while lexing; the formatter keeps them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    pub span: Span,
    /// The whole comment text, including `//` or `/* */`.
    pub text: String,
}

/// Lexes a file. Errors go to `diags`; comments (not doc comments) are collected.
#[derive(Debug)]
pub struct Lexer<'s> {
    inner: logos::Lexer<'s, Raw>,
    src: &'s str,
    file: FileId,
    pub diags: Vec<Diagnostic>,
    pub comments: Vec<Comment>,
    /// Whether comments are collected into `comments` (see [`Lexer::without_comments`]).
    keep_comments: bool,
    done: bool,
}

impl<'s> Lexer<'s> {
    pub fn new(src: &'s str, file: FileId) -> Self {
        Lexer {
            inner: Raw::lexer(src),
            src,
            file,
            diags: Vec::new(),
            comments: Vec::new(),
            keep_comments: true,
            done: false,
        }
    }

    /// A lexer that skips comments without collecting them, for readers that only want the
    /// code (the checker): a large file need not hold every comment's text.
    pub fn without_comments(mut self) -> Self {
        self.keep_comments = false;
        self
    }

    /// A lexer whose first token is the one at byte `at` (spans stay offsets into the
    /// whole source). `at` must be where a token or the space before one starts, and a
    /// char boundary; otherwise the lexer starts at the source's end.
    pub(crate) fn starting_at(mut self, at: usize) -> Self {
        if at <= self.src.len() && self.src.is_char_boundary(at) {
            self.inner.bump(at);
        } else {
            self.inner.bump(self.src.len());
        }
        self
    }

    fn comment(&mut self, span: Span, text: std::ops::Range<usize>) {
        self.bidi(text.clone(), "comment");
        if self.keep_comments {
            self.comments.push(Comment {
                span,
                text: self.src[text].to_string(),
            });
        }
    }

    /// An error for the first text direction control in `r` (a comment's or a string's
    /// text), if any.
    fn bidi(&mut self, r: std::ops::Range<usize>, what: &str) {
        let text = &self.src[r.clone()];
        if text.is_ascii() {
            return;
        }
        let mut found = text.char_indices().filter(|&(_, c)| bidi_name(c).is_some());
        let Some((k, ch)) = found.next() else {
            return;
        };
        let more = found.count();
        let at = r.start + k;
        let mut d = Diagnostic::error(
            Code::TextDirectionControl,
            format!(
                "text direction control U+{:04X} ({}) in a {what}",
                ch as u32,
                bidi_name(ch).unwrap_or_default()
            ),
        )
        .primary(
            self.span(at..at + ch.len_utf8()),
            "makes the text around it display in another order than it is read",
        );
        if more > 0 {
            d = d.note(format!("and {more} more in this {what}"));
        }
        self.diags
            .push(d.help("remove it: editors and reviews may show code that is not the code compiled"));
    }

    fn span(&self, r: std::ops::Range<usize>) -> Span {
        Span::new(self.file, r.start as u32, r.end as u32)
    }

    fn eof(&self) -> Token {
        let n = self.src.len() as u32;
        Token {
            kind: TokenKind::Eof,
            span: Span::new(self.file, n, n),
        }
    }

    /// Skips a (nested) block comment that starts at `start`; returns its end.
    fn block_comment(&mut self, start: usize) -> usize {
        let bytes = self.src.as_bytes();
        let mut i = start + 2;
        let mut depth = 1usize;
        while i < bytes.len() {
            if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
                depth += 1;
                i += 2;
            } else if bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/') {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            } else {
                i += 1;
            }
        }
        self.diags.push(
            Diagnostic::error(Code::Unterminated, "unterminated block comment")
                .primary(self.span(start..start + 2), "this comment is never closed")
                .help("close it with `*/`"),
        );
        bytes.len()
    }

    /// Reads a string literal whose opening quote is at `start`; returns the value and end.
    fn string(&mut self, start: usize) -> (Option<String>, usize) {
        let bytes = self.src.as_bytes();
        let mut i = start + 1;
        let mut out = String::new();
        let mut ok = true;
        // Where the first text direction control is, reported once the string ends (once per
        // string; the string stays a string, so that nothing after it is reported for its sake).
        let mut bidi: Option<usize> = None;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    if let Some(at) = bidi {
                        self.bidi(at..i, "string");
                    }
                    return (ok.then_some(out), i + 1);
                }
                b'\\' => {
                    let esc = bytes.get(i + 1).copied();
                    match esc {
                        Some(b'n') => out.push('\n'),
                        Some(b't') => out.push('\t'),
                        Some(b'r') => out.push('\r'),
                        Some(b'0') => out.push('\0'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'"') => out.push('"'),
                        Some(b'\'') => out.push('\''),
                        _ => {
                            ok = false;
                            self.diags.push(
                                Diagnostic::error(Code::InvalidLiteral, "unknown escape in string")
                                    .primary(self.span(i..(i + 2).min(bytes.len())), "not a valid escape")
                                    .help("the escapes are \\n \\t \\r \\0 \\\\ \\\" \\'"),
                            );
                        }
                    }
                    i += 2;
                    // Skip over the rest of a multi-byte char after a bad escape.
                    while i < bytes.len() && !self.src.is_char_boundary(i) {
                        i += 1;
                    }
                }
                _ => {
                    let ch = self.src[i..].chars().next().unwrap_or('\u{fffd}');
                    if bidi.is_none() && !ch.is_ascii() && bidi_name(ch).is_some() {
                        bidi = Some(i);
                    }
                    out.push(ch);
                    i += ch.len_utf8();
                }
            }
        }
        if let Some(at) = bidi {
            self.bidi(at..bytes.len(), "string");
        }
        self.diags.push(
            Diagnostic::error(Code::Unterminated, "unterminated string literal")
                .primary(self.span(start..start + 1), "this string is never closed")
                .help("add a closing `\"`"),
        );
        (None, bytes.len())
    }

    fn int_value(&mut self, text: &str, span: Span) -> Option<u64> {
        // Plain decimal digits (the common case) are read in place; otherwise the `_`s are
        // dropped first.
        let owned;
        let clean = if text.contains('_') {
            owned = text.chars().filter(|&c| c != '_').collect::<String>();
            owned.as_str()
        } else {
            text
        };
        let (digits, radix) = if let Some(h) = clean.strip_prefix("0x") {
            (h, 16)
        } else if let Some(b) = clean.strip_prefix("0b") {
            (b, 2)
        } else if let Some(o) = clean.strip_prefix("0o") {
            (o, 8)
        } else {
            (clean, 10)
        };
        match u64::from_str_radix(digits, radix) {
            Ok(v) => Some(v),
            Err(_) => {
                self.diags.push(
                    Diagnostic::error(Code::LiteralTooLarge, "integer literal does not fit in 64 bits")
                        .primary(span, "too large")
                        .note("the largest integer is 18446744073709551615"),
                );
                None
            }
        }
    }
}

impl TokenSource for Lexer<'_> {
    fn next_token(&mut self) -> Token {
        loop {
            if self.done {
                return self.eof();
            }
            let Some(raw) = self.inner.next() else {
                self.done = true;
                return self.eof();
            };
            let range = self.inner.span();
            let span = self.span(range.clone());
            let text = self.inner.slice();
            let kind = match raw {
                Err(()) => {
                    let ch = self.src[range.start..].chars().next().unwrap_or('?');
                    let end = range.start + ch.len_utf8();
                    // Make sure logos resumes after the whole character.
                    if end > range.end {
                        self.inner.bump(end - range.end);
                    }
                    self.diags.push(
                        Diagnostic::error(Code::InvalidCharacter, format!("invalid character {ch:?}"))
                            .primary(self.span(range.start..end), "not part of any token")
                            .help(
                                "the language uses Rust tokens: identifiers, numbers, strings, punctuation, brackets",
                            ),
                    );
                    TokenKind::Error
                }
                Ok(Raw::LineComment) => {
                    if let Some(doc) = text.strip_prefix("///") {
                        if !doc.starts_with('/') {
                            self.bidi(range.clone(), "comment");
                            TokenKind::Doc(doc.strip_prefix(' ').unwrap_or(doc).to_string())
                        } else {
                            self.comment(span, range);
                            continue;
                        }
                    } else if let Some(doc) = text.strip_prefix("//!") {
                        self.bidi(range.clone(), "comment");
                        TokenKind::InnerDoc(doc.strip_prefix(' ').unwrap_or(doc).to_string())
                    } else {
                        self.comment(span, range);
                        continue;
                    }
                }
                Ok(Raw::BlockCommentStart) => {
                    let end = self.block_comment(range.start);
                    self.inner.bump(end - range.end);
                    self.comment(self.span(range.start..end), range.start..end);
                    continue;
                }
                Ok(Raw::StrStart) => {
                    let (value, end) = self.string(range.start);
                    self.inner.bump(end - range.end);
                    let span = self.span(range.start..end);
                    return Token {
                        kind: value.map_or(TokenKind::Error, TokenKind::Str),
                        span,
                    };
                }
                Ok(Raw::Ident) => TokenKind::Ident(text.to_string()),
                Ok(Raw::Int) => TokenKind::Int(self.int_value(text, span)),
                Ok(Raw::SuffixedNumber) => {
                    self.diags.push(
                        Diagnostic::error(Code::InvalidLiteral, format!("number with a suffix: `{text}`"))
                            .primary(span, "suffixes are not allowed")
                            .help("write the number alone; a unit goes after a space, as in `1850 MHz`"),
                    );
                    TokenKind::Error
                }
                Ok(Raw::Float) => {
                    let parsed = if text.contains('_') {
                        text.chars().filter(|&c| c != '_').collect::<String>().parse::<f64>()
                    } else {
                        text.parse::<f64>()
                    };
                    // A literal with a digit other than 0 before its exponent is not 0: one
                    // that rounds to 0 (`1e-400`) is out of range as much as one too large.
                    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
                    let nonzero = mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b));
                    match parsed {
                        Ok(v) if v == 0.0 && nonzero => {
                            self.diags.push(
                                Diagnostic::error(Code::LiteralTooLarge, "float literal rounds to 0")
                                    .primary(span, "too small for a 64-bit float")
                                    .help("the least positive 64-bit float is about 4.9e-324; write 0 for zero"),
                            );
                            TokenKind::Error
                        }
                        Ok(v) if v.is_finite() => TokenKind::Float(v),
                        _ => {
                            self.diags.push(
                                Diagnostic::error(Code::LiteralTooLarge, "float literal is not finite")
                                    .primary(span, "too large"),
                            );
                            TokenKind::Error
                        }
                    }
                }
                Ok(p) => punct_kind(p),
            };
            return Token { kind, span };
        }
    }
}

/// The name of a text direction control (an embedding, override or isolate, or their end),
/// the characters that can make source display in another order than it is read.
fn bidi_name(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{202A}' => "LEFT-TO-RIGHT EMBEDDING",
        '\u{202B}' => "RIGHT-TO-LEFT EMBEDDING",
        '\u{202C}' => "POP DIRECTIONAL FORMATTING",
        '\u{202D}' => "LEFT-TO-RIGHT OVERRIDE",
        '\u{202E}' => "RIGHT-TO-LEFT OVERRIDE",
        '\u{2066}' => "LEFT-TO-RIGHT ISOLATE",
        '\u{2067}' => "RIGHT-TO-LEFT ISOLATE",
        '\u{2068}' => "FIRST STRONG ISOLATE",
        '\u{2069}' => "POP DIRECTIONAL ISOLATE",
        _ => return None,
    })
}

fn punct_kind(raw: Raw) -> TokenKind {
    use Punct as P;
    let p = match raw {
        Raw::ColonColon => P::ColonColon,
        Raw::Colon => P::Colon,
        Raw::Semi => P::Semi,
        Raw::Comma => P::Comma,
        Raw::Dot => P::Dot,
        Raw::DotDot => P::DotDot,
        Raw::Arrow => P::Arrow,
        Raw::FatArrow => P::FatArrow,
        Raw::Eq => P::Eq,
        Raw::PlusEq => P::PlusEq,
        Raw::MinusEq => P::MinusEq,
        Raw::EqEq => P::EqEq,
        Raw::Ne => P::Ne,
        Raw::Lt => P::Lt,
        Raw::Gt => P::Gt,
        Raw::Le => P::Le,
        Raw::Ge => P::Ge,
        Raw::Plus => P::Plus,
        Raw::Minus => P::Minus,
        Raw::Star => P::Star,
        Raw::Slash => P::Slash,
        Raw::Percent => P::Percent,
        Raw::At => P::At,
        Raw::Pound => P::Pound,
        Raw::Bang => P::Bang,
        Raw::And => P::And,
        Raw::Or => P::Or,
        Raw::Caret => P::Caret,
        Raw::Question => P::Question,
        Raw::Dollar => P::Dollar,
        Raw::Tilde => P::Tilde,
        Raw::LParen => return TokenKind::Open(Delim::Paren),
        Raw::RParen => return TokenKind::Close(Delim::Paren),
        Raw::LBracket => return TokenKind::Open(Delim::Bracket),
        Raw::RBracket => return TokenKind::Close(Delim::Bracket),
        Raw::LBrace => return TokenKind::Open(Delim::Brace),
        Raw::RBrace => return TokenKind::Close(Delim::Brace),
        _ => return TokenKind::Error,
    };
    TokenKind::Punct(p)
}

/// The comments of a text (its tokens are read and dropped, never held together).
pub fn comments(src: &str, file: FileId) -> Vec<Comment> {
    let mut lx = Lexer::new(src, file);
    while lx.next_token().kind != TokenKind::Eof {}
    lx.comments
}

/// Lexes a whole text into a vector (ending with `Eof`), with its diagnostics and comments.
pub fn tokenize(src: &str, file: FileId) -> (Vec<Token>, Vec<Diagnostic>, Vec<Comment>) {
    let mut lx = Lexer::new(src, file);
    let mut out = Vec::new();
    loop {
        let t = lx.next_token();
        let eof = t.kind == TokenKind::Eof;
        out.push(t);
        if eof {
            break;
        }
    }
    (out, lx.diags, lx.comments)
}
