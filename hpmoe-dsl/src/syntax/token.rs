//! Tokens shared by every front end (files, the REPL, the `taskflow!` macro).
//!
//! In: nothing. Out: [`Token`], [`Span`] and the [`TokenSource`] trait through which the parser
//! reads tokens. A file feeds it byte ranges from the logos lexer; the macro feeds it
//! `proc_macro2` tokens whose spans are token indices into its own side table.

use std::fmt;

/// Identifies one source (a file, a REPL line, a macro invocation) in a [`crate::SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A range in a source: byte offsets for files; token indices for the macro.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub lo: u32,
    pub hi: u32,
}

impl Span {
    pub fn new(file: FileId, lo: u32, hi: u32) -> Self {
        Span { file, lo, hi }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            file: self.file,
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }
    pub fn len(self) -> u32 {
        self.hi - self.lo
    }
    pub fn is_empty(self) -> bool {
        self.hi == self.lo
    }
}

/// Punctuation, joined as Rust joins it (`::`, `->`, `+=`, `..`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Punct {
    ColonColon,
    Colon,
    Semi,
    Comma,
    Dot,
    DotDot,
    Arrow,
    FatArrow,
    Eq,
    PlusEq,
    MinusEq,
    EqEq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    At,
    Pound,
    Bang,
    And,
    Or,
    Caret,
    Question,
    Dollar,
    Tilde,
}

impl Punct {
    pub fn as_str(self) -> &'static str {
        use Punct::*;
        match self {
            ColonColon => "::",
            Colon => ":",
            Semi => ";",
            Comma => ",",
            Dot => ".",
            DotDot => "..",
            Arrow => "->",
            FatArrow => "=>",
            Eq => "=",
            PlusEq => "+=",
            MinusEq => "-=",
            EqEq => "==",
            Ne => "!=",
            Lt => "<",
            Gt => ">",
            Le => "<=",
            Ge => ">=",
            Plus => "+",
            Minus => "-",
            Star => "*",
            Slash => "/",
            Percent => "%",
            At => "@",
            Pound => "#",
            Bang => "!",
            And => "&",
            Or => "|",
            Caret => "^",
            Question => "?",
            Dollar => "$",
            Tilde => "~",
        }
    }
}

/// Bracket kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delim {
    Paren,
    Bracket,
    Brace,
}

impl Delim {
    pub fn open(self) -> char {
        match self {
            Delim::Paren => '(',
            Delim::Bracket => '[',
            Delim::Brace => '{',
        }
    }
    pub fn close(self) -> char {
        match self {
            Delim::Paren => ')',
            Delim::Bracket => ']',
            Delim::Brace => '}',
        }
    }
}

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenKind {
    Ident(String),
    /// An integer literal; `None` when it does not fit in 64 bits (the source reports it).
    Int(Option<u64>),
    Float(f64),
    Str(String),
    /// `///` outer doc comment (the text after the slashes).
    Doc(String),
    /// `//!` inner doc comment.
    InnerDoc(String),
    Punct(Punct),
    Open(Delim),
    Close(Delim),
    /// Something the lexer could not read; it has already been reported.
    Error,
    Eof,
}

impl TokenKind {
    /// Short human description used in "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match self {
            TokenKind::Ident(s) => format!("`{s}`"),
            TokenKind::Int(Some(v)) => format!("`{v}`"),
            TokenKind::Int(None) => "an integer literal".into(),
            TokenKind::Float(v) => format!("`{v}`"),
            TokenKind::Str(_) => "a string".into(),
            TokenKind::Doc(_) | TokenKind::InnerDoc(_) => "a doc comment".into(),
            TokenKind::Punct(p) => format!("`{}`", p.as_str()),
            TokenKind::Open(d) => format!("`{}`", d.open()),
            TokenKind::Close(d) => format!("`{}`", d.close()),
            TokenKind::Error => "an invalid token".into(),
            TokenKind::Eof => "the end of the input".into(),
        }
    }
}

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub kind: TokenKind,
    pub span: Span,
}

/// Where the parser gets its tokens. Implementations report their own lexical errors.
pub trait TokenSource {
    /// The next token; [`TokenKind::Eof`] forever once the input is exhausted.
    fn next_token(&mut self) -> Token;
}

impl<I: Iterator<Item = Token>> TokenSource for (I, Span) {
    fn next_token(&mut self) -> Token {
        self.0.next().unwrap_or(Token {
            kind: TokenKind::Eof,
            span: self.1,
        })
    }
}
