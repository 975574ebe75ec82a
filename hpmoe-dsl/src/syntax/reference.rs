//! The reference grammar: the pest grammar `hpm.pest` (beside this file) turned
//! into a parser.
//!
//! In: the text of a `.hpm` file. Out: whether the grammar accepts it ([`accepts`]), or the
//! first syntax error as a pest message ([`parse_error`]); [`ReferenceParser`] gives the whole
//! pest parse tree (start at [`Rule::file`]).
//!
//! This parser is not used by the compiler: it exists so that the readable grammar is
//! checked. `tests/grammar.rs` runs it and [`crate::syntax::parse_text`] over the corpus and
//! over generated programs, and fails when they disagree. The header of `hpm.pest` lists the
//! two intentional differences (nesting depth and the range of number literals).

use pest::Parser as _;

/// The pest parser generated from `hpm.pest`.
#[derive(pest_derive::Parser, Debug)]
#[grammar = "syntax/hpm.pest"]
pub struct ReferenceParser;

/// Whether the reference grammar accepts `src` as a whole file.
pub fn accepts(src: &str) -> bool {
    ReferenceParser::parse(Rule::file, src).is_ok()
}

/// The reference grammar's error for `src` (position and expected rules), or `None` when it
/// accepts it.
pub fn parse_error(src: &str) -> Option<String> {
    ReferenceParser::parse(Rule::file, src).err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_small_program() {
        let src = "//! A file.\nimport std::moe::{gmm, swiglu};\n/// Tokens.\nparam tokens = 4_096;\n\
                   device = ascend_a3 { hbm_bw: 1.6 TB/s, ranks: 8 };\n";
        assert_eq!(parse_error(src), None);
    }

    #[test]
    fn rejects_a_number_with_a_suffix() {
        assert!(!accepts("param f = 1850MHz;"));
        assert!(parse_error("param f = 1850MHz;").is_some());
    }
}
