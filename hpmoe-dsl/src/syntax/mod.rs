//! Syntax: source text (or macro tokens) in, an [`ast::File`] with spans and all syntax errors
//! out.
//!
//! - [`token`]: the token type and the [`token::TokenSource`] trait every front end feeds;
//! - [`lexer`]: the logos lexer for files and REPL lines;
//! - [`parser`]: the recursive-descent parser with error recovery;
//! - [`parts`]: a large source parsed in parts on several threads, as if whole;
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
mod parts;
#[cfg(feature = "proc-macro2")]
pub mod proc;
#[cfg(feature = "reference-grammar")]
pub mod reference;
pub mod token;

use crate::diag::Diagnostic;
use token::FileId;

/// Lexes and parses a file's text.
pub fn parse_text(src: &str, file: FileId) -> (ast::File, Vec<Diagnostic>, Vec<lexer::Comment>) {
    parse_with(lexer::Lexer::new(src, file))
}

/// Lexes and parses a file's text for reading its code only: as [`parse_text`], without
/// collecting the comments.
///
/// A source of several MiB is parsed in parts on the machine's threads ([`parts`]), with
/// the same result.
pub fn parse_code(src: &str, file: FileId) -> (ast::File, Vec<Diagnostic>) {
    if src.len() >= 2 * parts::MIN_PART_BYTES {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(out) = parts::parse_in_parts(src, file, threads) {
            return out;
        }
    }
    let (f, diags, _) = parse_with(lexer::Lexer::new(src, file).without_comments());
    (f, diags)
}

fn parse_with(mut lx: lexer::Lexer<'_>) -> (ast::File, Vec<Diagnostic>, Vec<lexer::Comment>) {
    let mut p = parser::Parser::new(&mut lx);
    let f = p.file();
    let parse_diags = p.diags;
    let mut diags = std::mem::take(&mut lx.diags);
    diags.extend(parse_diags);
    (f, diags, std::mem::take(&mut lx.comments))
}
