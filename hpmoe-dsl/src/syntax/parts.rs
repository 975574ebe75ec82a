//! Parsing a large source in parts, one thread per part, with the result of parsing it
//! whole: source text in, the [`File`] and syntax errors [`parse_code`](super::parse_code)
//! returns, item for item and error for error.
//!
//! The source is cut at guessed item boundaries: lines that start, unindented, with an item
//! keyword or a `///` block (see [`cut_near`]). A guess can be wrong (the line is inside a
//! block comment, a string or an op's body), so no part's result is trusted on its own:
//! - each part starts lexing at its cut and parses items until the next item starts
//!   exactly at a later cut, and stops there;
//! - the first part starts at the start of the source, and the parts are chained: the part
//!   that begins at the cut where the chain stopped goes on from there.
//!
//! Between two items the parser holds nothing but its position, and the lexer nothing at a
//! token's start, so a part that begins at the cut parses the same items a whole parse
//! would from there. A part whose cut the chain went past (a wrong guess) is dropped, and
//! the part before it parses on through; when every guess is wrong, the first part parses
//! the whole source as one thread would.
//!
//! What a part reports is joined as a whole parse would have reported it: the lexer's
//! errors first and the parser's after, each in source order. A part's lexer reads a few
//! tokens past its stop, so its errors at or after the stop are left to the next part. The
//! depth limit is reported once per source, so a later part's report of it is dropped when
//! an earlier one reported it.

use super::ast::{File, Item};
use super::lexer::Lexer;
use super::parser::{Parser, PartEnd, ITEM_KEYWORDS};
use super::token::FileId;
use crate::diag::{Code, Diagnostic};
use std::sync::atomic::{AtomicBool, Ordering};

/// Sources shorter than this per part are parsed by one thread: a thread costs far less,
/// but a part this size parses in about ten milliseconds.
pub const MIN_PART_BYTES: usize = 1 << 20;

/// At most this many parts.
const MAX_PARTS: usize = 8;

/// What one part parsed.
struct Part {
    docs: Vec<String>,
    items: Vec<Item>,
    lex_diags: Vec<Diagnostic>,
    parse_diags: Vec<Diagnostic>,
    /// Whether the parser reported the depth limit in this part.
    too_deep: bool,
    end: PartEnd,
}

/// Parses `src` in parts on up to `threads` threads; `None` when the source is too short
/// to be worth it (or only one thread is asked for), so that the caller parses it whole.
pub(super) fn parse_in_parts(src: &str, file: FileId, threads: usize) -> Option<(File, Vec<Diagnostic>)> {
    let parts = threads.min(MAX_PARTS).min(src.len() / MIN_PART_BYTES);
    if parts < 2 {
        return None;
    }
    let mut cuts: Vec<usize> = Vec::with_capacity(parts - 1);
    for k in 1..parts {
        let from = (src.len() / parts * k).max(cuts.last().map_or(0, |&c| c + 1));
        if let Some(c) = cut_near(src.as_bytes(), from, from + src.len() / parts / 2) {
            cuts.push(c);
        }
    }
    if cuts.is_empty() {
        return None;
    }
    let (file, diags, _) = parse_at_cuts(src, file, &cuts);
    Some((file, diags))
}

/// Parses `src` in parts that begin at `cuts` (ascending char boundaries inside the
/// source; any, since a wrong one only costs its part) and at its start, each part but the
/// first on a thread of its own; also returns how many parts the result was joined from.
fn parse_at_cuts(src: &str, file: FileId, cuts: &[usize]) -> (File, Vec<Diagnostic>, usize) {
    // `dead[k]`: the first part went past cut `k`, so the part from it cannot be used.
    let dead: Vec<AtomicBool> = cuts.iter().map(|_| AtomicBool::new(false)).collect();
    let (first, rest) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cuts.len())
            .map(|k| {
                let dead = &dead;
                std::thread::Builder::new()
                    .name("hpmoe-parse".into())
                    .stack_size(PART_STACK)
                    .spawn_scoped(s, move || {
                        parse_part(src, file, cuts[k], &cuts[k + 1..], &|_| {}, &|| {
                            dead[k].load(Ordering::Relaxed)
                        })
                    })
            })
            .collect();
        let first = parse_part(src, file, 0, cuts, &|k| dead[k].store(true, Ordering::Relaxed), &|| {
            false
        });
        // The parts it went past already know; when it went to the end, no part is used.
        if !matches!(first.end, PartEnd::Stop(_)) {
            for d in &dead {
                d.store(true, Ordering::Relaxed);
            }
        }
        // A part that did not start or that panicked is `None`; a chain that needs it
        // parses on from its cut on this thread instead.
        let rest: Vec<Option<Part>> = handles
            .into_iter()
            .map(|h| h.ok().and_then(|h| h.join().ok()))
            .collect();
        (first, rest)
    });
    join(src, file, cuts, first, rest)
}

/// The stack of a part's thread: as large as a main thread's, since the parser recurses
/// up to its depth limit.
const PART_STACK: usize = 8 << 20;

/// Parses from `start` until the next item starts exactly at one of `stops` (offsets after
/// `start`, ascending) or the source ends.
fn parse_part(
    src: &str,
    file: FileId,
    start: usize,
    stops: &[usize],
    passed: &dyn Fn(usize),
    cancelled: &dyn Fn() -> bool,
) -> Part {
    let mut lx = Lexer::new(src, file).without_comments().starting_at(start);
    let mut p = Parser::new(&mut lx);
    let mut docs = Vec::new();
    if start == 0 {
        p.inner_docs(&mut docs);
    }
    // Room for every item of the part at once (growing a large list copies it): each item
    // ends with `;` or `}`, so their count bounds the items. Room beyond what is used is
    // never touched, so it costs no memory.
    // The first part holds every part's items in the end, so it makes room for all.
    let upto = if start == 0 {
        src.len()
    } else {
        stops.first().copied().unwrap_or(src.len())
    };
    let mut items = Vec::with_capacity(item_bound(&src.as_bytes()[start..upto]));
    let end = p.items_until(&mut items, stops, passed, cancelled);
    let too_deep = p.reported_depth_limit();
    let parse_diags = std::mem::take(&mut p.diags);
    let mut lex_diags = std::mem::take(&mut lx.diags);
    if let PartEnd::Stop(k) = end {
        // The lexer read ahead past the stop; what it found there is the next part's.
        let stop = stops[k] as u32;
        lex_diags.retain(|d| d.span().is_none_or(|s| s.lo < stop));
    }
    Part {
        docs,
        items,
        lex_diags,
        parse_diags,
        too_deep,
        end,
    }
}

/// Chains the parts from the first: each ends where the next begins.
fn join(
    src: &str,
    file: FileId,
    cuts: &[usize],
    first: Part,
    mut rest: Vec<Option<Part>>,
) -> (File, Vec<Diagnostic>, usize) {
    let mut joined = 1;
    let mut out = File {
        docs: first.docs,
        items: first.items,
    };
    let mut lex_diags = first.lex_diags;
    let mut parse_diags = first.parse_diags;
    let mut too_deep = first.too_deep;
    // The cut the chain stopped at, as an index into `cuts`.
    let mut at = match first.end {
        PartEnd::Stop(k) => Some(k),
        _ => None,
    };
    while let Some(k) = at {
        let part = match rest[k].take() {
            Some(part) if part.end != PartEnd::Cancelled => part,
            // The part from this cut is missing: parse on from it here, to the end.
            _ => parse_part(src, file, cuts[k], &[], &|_| {}, &|| false),
        };
        if out.items.capacity() - out.items.len() < part.items.len() {
            out.items.reserve(part.items.len());
        }
        out.items.extend(part.items);
        lex_diags.extend(part.lex_diags);
        let mut pd = part.parse_diags;
        if too_deep && part.too_deep {
            if let Some(i) = pd.iter().position(|d| d.code == Code::NestingTooDeep) {
                pd.remove(i);
            }
        }
        too_deep |= part.too_deep;
        joined += 1;
        parse_diags.extend(pd);
        // The part's stops are the cuts after its own.
        at = match part.end {
            PartEnd::Stop(j) => Some(k + 1 + j),
            _ => None,
        };
    }
    lex_diags.extend(parse_diags);
    (out, lex_diags, joined)
}

/// An upper bound on the items in a stretch of source: every item ends with `;` or `}`.
fn item_bound(bytes: &[u8]) -> usize {
    let ends = |c: &[u8]| {
        c.iter()
            .map(|&b| u8::from((b == b';') | (b == b'}')))
            .fold(0u8, u8::wrapping_add)
    };
    // Counted in blocks of at most 255 bytes, whose count fits a byte (so the count
    // vectorizes).
    let mut blocks = bytes.chunks_exact(255);
    let n: usize = (&mut blocks).map(|c| usize::from(ends(c))).sum();
    n + usize::from(ends(blocks.remainder())) + 1
}

/// The first line start in `from..to` that looks like an item's start: unindented, an item
/// keyword followed by a space (or a `///` doc block's first line), and not after a `///`
/// line (whose item it would cut from its docs).
fn cut_near(bytes: &[u8], from: usize, to: usize) -> Option<usize> {
    let to = to.min(bytes.len());
    let mut p = from;
    // To the start of the next line (or stay, if `from` starts one).
    if p > 0 && bytes.get(p - 1) != Some(&b'\n') {
        p += bytes.get(p..to)?.iter().position(|&b| b == b'\n')? + 1;
    }
    while p < to {
        let line = &bytes[p..];
        let starts_item = line.starts_with(b"///") && !line.starts_with(b"////")
            || ITEM_KEYWORDS
                .iter()
                .any(|kw| line.starts_with(kw.as_bytes()) && matches!(line.get(kw.len()), Some(b' ' | b'\t')));
        if starts_item && !after_doc_line(bytes, p) {
            return Some(p);
        }
        p += bytes[p..to].iter().position(|&b| b == b'\n')? + 1;
    }
    None
}

/// Whether the line before the one starting at `p` is a `///` line.
fn after_doc_line(bytes: &[u8], p: usize) -> bool {
    if p == 0 {
        return false;
    }
    let prev_start = bytes[..p - 1].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let prev = &bytes[prev_start..p - 1];
    let trimmed = prev
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .map_or(&prev[..0], |i| &prev[i..]);
    trimmed.starts_with(b"///")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of programs, right and wrong: items, docs, and the things that make a line
    /// that looks like an item's start not one (comments, strings, unclosed groups).
    fn piece(i: usize, kind: u8) -> String {
        match kind % 20 {
            0..=2 => format!("param a{i} = {i} * 2 + (a{} % 7) - 3;", i / 2),
            3 => format!("/// Doc {i}.\n/// More.\nparam d{i} = {i};"),
            4 => format!(
                "op e{i}<T>(x: T[M, N]) -> T[M, N] on aiv tile(m: 64) {{\n    out[m, n] = silu(x[m, n]) + {i}.0;\n}}"
            ),
            5 => "/*\nparam hidden = 1;\n/* nested */\nop x() {}\n*/".to_string(),
            6 => format!("param s{i} = \"a\nparam inside = 2;\n\";"),
            7 => "param bad = ;".to_string(),
            8 => "param = 3;".to_string(),
            9 => format!("op broken{i}(x: {{\nparam p = 1;\n"),
            10 => format!("param deep{i} = {}1{};", "(".repeat(140), ")".repeat(140)),
            11 => "//! a late inner doc".to_string(),
            12 => "param u = 1 @ 2 $ 3;".to_string(),
            13 => "param e = \"bad \\q escape\";".to_string(),
            14 => "param \u{3b1}lpha = 1; \u{1F600}".to_string(),
            15 => "/* never closed".to_string(),
            16 => "/// a doc with nothing after it".to_string(),
            17 => format!("taskflow t{i}(x: bf16[m, h]) -> bf16[m, h] {{\n    let y = e4(x);\n    return y;\n}}"),
            18 => "import std::moe::*;\nroute r = all_to_all(experts: 8);".to_string(),
            _ => format!("param big{i} = 99999999999999999999999;"),
        }
    }

    fn program(kinds: &[u8]) -> String {
        let mut s = String::new();
        for (i, &k) in kinds.iter().enumerate() {
            s.push_str(&piece(i, k));
            s.push('\n');
        }
        s
    }

    fn whole(src: &str) -> (File, Vec<Diagnostic>) {
        assert!(src.len() < 2 * MIN_PART_BYTES);
        super::super::parse_code(src, FileId(0))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the cuts (item starts, the middle of a token, inside a comment or a
        /// string), the parts join into what a whole parse gives.
        #[test]
        fn parts_join_into_the_whole_parse(
            kinds in prop::collection::vec(any::<u8>(), 1..40),
            fractions in prop::collection::vec(0.0f64..1.0, 1..5),
            guessed in any::<bool>(),
        ) {
            let src = program(&kinds);
            let mut cuts: Vec<usize> = if guessed {
                // Where the parser would cut.
                fractions.iter().filter_map(|f| cut_near(src.as_bytes(), (f * src.len() as f64) as usize, src.len())).collect()
            } else {
                fractions
                    .iter()
                    .map(|f| {
                        let mut c = (f * src.len() as f64) as usize;
                        while !src.is_char_boundary(c) {
                            c -= 1;
                        }
                        c
                    })
                    .collect()
            };
            cuts.sort_unstable();
            cuts.dedup();
            cuts.retain(|&c| c > 0 && c < src.len());
            prop_assume!(!cuts.is_empty());
            let (file, diags, _) = parse_at_cuts(&src, FileId(0), &cuts);
            let (wfile, wdiags) = whole(&src);
            prop_assert_eq!(file, wfile);
            prop_assert_eq!(diags, wdiags);
        }
    }

    /// The bound on items counts every `;` and `}`, in and out of its blocks.
    #[test]
    fn the_item_bound_counts_every_end() {
        for n in [0usize, 1, 254, 255, 256, 1000] {
            let text: Vec<u8> = (0..n).map(|i| [b';', b'}', b'a', b'{'][i % 4]).collect();
            let ends = (0..n).filter(|i| i % 4 < 2).count();
            assert_eq!(item_bound(&text), ends + 1, "{n} bytes");
        }
        assert_eq!(item_bound(&[b';'; 600]), 601);
    }

    /// On a program of items the guessed cuts are item starts, so every part is used.
    #[test]
    fn cuts_near_item_starts_are_all_used() {
        let kinds: Vec<u8> = (0..400).map(|i| [0, 3, 4, 0, 17][i % 5]).collect();
        let src = program(&kinds);
        let cuts: Vec<usize> = (1..4)
            .filter_map(|k| cut_near(src.as_bytes(), src.len() * k / 4, src.len()))
            .collect();
        assert_eq!(cuts.len(), 3);
        for &c in &cuts {
            // After a line break, not after a doc line.
            assert_eq!(src.as_bytes()[c - 1], b'\n');
            assert!(!after_doc_line(src.as_bytes(), c));
        }
        let (file, diags, joined) = parse_at_cuts(&src, FileId(0), &cuts);
        assert_eq!(joined, 4);
        assert_eq!((file, diags), whole(&src));
    }

    /// A cut inside a block comment is passed: the first part parses through, and the
    /// part from the cut (whose items would be wrong) is dropped.
    #[test]
    fn a_cut_inside_a_comment_is_dropped() {
        let src = "param a = 1;\n/*\nparam hidden = 2;\n*/\nparam b = 3;\n";
        let cut = src.find("param hidden").unwrap();
        let (file, diags, joined) = parse_at_cuts(src, FileId(0), &[cut]);
        assert_eq!(joined, 1);
        assert_eq!(file.items.len(), 2);
        assert!(diags.is_empty());
    }

    /// The depth limit is reported once, though two parts hit it.
    #[test]
    fn the_depth_limit_is_reported_once() {
        let deep = format!("param d = {}1{};\n", "(".repeat(140), ")".repeat(140));
        let src = format!("{deep}param x = 1;\n{deep}");
        let cut = src.find("param x").unwrap();
        let (_, diags, joined) = parse_at_cuts(&src, FileId(0), &[cut]);
        assert_eq!(joined, 2);
        assert_eq!(diags.iter().filter(|d| d.code == Code::NestingTooDeep).count(), 1);
        assert_eq!(diags, whole(&src).1);
    }

    /// Large sources take the parallel path; it finds its cuts and joins every part.
    #[test]
    fn a_large_source_is_parsed_in_parts() {
        let kinds: Vec<u8> = (0..60_000).map(|i| [0, 3, 4, 0, 17][i % 5]).collect();
        let src = program(&kinds);
        assert!(src.len() >= 2 * MIN_PART_BYTES);
        let (file, diags) = parse_in_parts(&src, FileId(0), 2).expect("parsed in parts");
        assert_eq!(file.items.len(), 60_000);
        let (wf, wd, _) = super::super::parse_with(Lexer::new(&src, FileId(0)).without_comments());
        assert_eq!((file, diags), (wf, wd));
        assert!(parse_in_parts(&src, FileId(0), 1).is_none());
    }
}
