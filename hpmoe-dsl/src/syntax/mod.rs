//! Syntax: source text (or macro tokens) in, an [`ast::File`] with spans and all syntax errors
//! out.
//!
//! - [`token`]: the token type and the [`token::TokenSource`] trait every front end feeds;
//! - [`lexer`]: the logos lexer for files and REPL lines;
//! - [`parser`]: the recursive-descent parser with error recovery;
//! - [`ast`]: the tree;
//! - [`fmt`]: the canonical formatter;
//! - `proc` (feature `proc-macro2`): the `taskflow!` macro's token source.
//!
//! `hpm.pest` beside this file is the readable reference grammar; a test keeps it and the
//! parser in agreement (`reference`, feature `reference-grammar`: only tests build pest).

pub mod ast;
pub mod fmt;
pub mod lexer;
pub mod parser;
#[cfg(feature = "proc-macro2")]
pub mod proc;
#[cfg(feature = "reference-grammar")]
pub mod reference;
pub mod token;

use crate::diag::Diagnostic;
use token::FileId;

/// Lexes and parses a file's text.
pub fn parse_text(src: &str, file: FileId) -> (ast::File, Vec<Diagnostic>, Vec<lexer::Comment>) {
    let mut lx = lexer::Lexer::new(src, file);
    // Code has one token per three to four bytes. Up to 16 MiB of source, one per two is
    // reserved, so the buffer never grows (and is copied) on ordinary input; beyond, one per
    // four, to bound what is reserved.
    let guess = if src.len() <= 16 << 20 {
        src.len() / 2
    } else {
        src.len() / 4
    };
    let mut p = parser::Parser::with_capacity(&mut lx, guess + 16);
    let f = p.file();
    let mut diags = std::mem::take(&mut lx.diags);
    diags.extend(p.diags);
    (f, diags, std::mem::take(&mut lx.comments))
}
