//! Agreement test: the reference grammar (`hpmoe-dsl/src/syntax/hpm.pest`, through
//! `hpmoe_dsl::syntax::reference`) and the real parser (`hpmoe_dsl::syntax::parse_text`) must
//! accept and reject the same texts.
//!
//! In: every `.hpm` file under `stdlib/`, `examples/`, `tests/ok/`, `tests/err/` and
//! `tests/grammar/` (walked at test time), programs generated from the grammar, mutations of
//! them (a token deleted, duplicated or swapped, the text truncated at a token, a character
//! deleted or inserted), and short lexical fragments in a few places of a program. Out: a
//! failure naming the input (shrunk, for generated ones) whenever the two disagree. Set
//! `PROPTEST_CASES` for a longer run than the default 256 cases per property.
//!
//! Two kinds of disagreement are classified instead of failing, and counted in the summary
//! each test prints (`cargo test --test grammar -- --nocapture`):
//! - the intentional differences listed in the grammar's header (nesting deeper than 256
//!   levels, literals out of range), recognised by the parser's error codes;
//! - [`KNOWN_BUGS`]: parser bugs found by this test, each recognised precisely. The test
//!   `known_parser_bugs` fails while any of them is present, so none is skipped silently;
//!   set `HPMOE_GRAMMAR_STRICT=1` to make the other tests fail on them too. When a bug is
//!   fixed, delete its entry.
//!
//! Files in `tests/grammar/` named `ok_*.hpm` must be accepted by the grammar, `err_*.hpm`
//! rejected.

use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::token::TokenKind;
use hpmoe_dsl::syntax::{parse_text, reference};
use hpmoe_dsl::{Code, Diagnostic, FileId};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------- running both parsers

/// What each parser says about one text.
struct Outcome {
    /// `None` when the grammar accepts.
    grammar_error: Option<String>,
    /// Empty when the parser accepts.
    parser_diags: Vec<Diagnostic>,
}

impl Outcome {
    fn of(src: &str) -> Outcome {
        let (_, parser_diags, _) = parse_text(src, FileId(0));
        Outcome {
            grammar_error: reference::parse_error(src),
            parser_diags,
        }
    }
    fn grammar_ok(&self) -> bool {
        self.grammar_error.is_none()
    }
    fn parser_ok(&self) -> bool {
        self.parser_diags.is_empty()
    }
    fn describe(&self) -> String {
        let g = match &self.grammar_error {
            None => "grammar: accepts".to_string(),
            Some(e) => format!("grammar: rejects\n{e}"),
        };
        let p = if self.parser_ok() {
            "parser: accepts".to_string()
        } else {
            let msgs: Vec<String> = self
                .parser_diags
                .iter()
                .map(|d| format!("  {:?} {} at {:?}", d.code, d.message, d.span().map(|s| (s.lo, s.hi))))
                .collect();
            format!("parser: rejects\n{}", msgs.join("\n"))
        };
        format!("{g}\n{p}")
    }
}

/// How the two parsers relate on one text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Agree,
    /// One of the differences the grammar's header lists.
    Intentional(&'static str),
    /// One of [`KNOWN_BUGS`], by id.
    KnownBug(&'static str),
    Disagree,
}

fn judge(src: &str, o: &Outcome) -> Verdict {
    if o.grammar_ok() == o.parser_ok() {
        return Verdict::Agree;
    }
    if o.grammar_ok() {
        // The parser rejects: each of its errors must be explained.
        if o.parser_diags.iter().any(|d| d.code == Code::NestingTooDeep) {
            // The errors after it are its consequences.
            return Verdict::Intentional("nesting deeper than 128 levels");
        }
        if o.parser_diags
            .iter()
            .any(|d| d.code == Code::LiteralTooLarge && d.message.contains("float"))
        {
            // The lexer drops a float that is not finite, so errors may follow.
            return Verdict::Intentional("number literal out of range");
        }
        let mut bug = None;
        for d in &o.parser_diags {
            if d.code == Code::LiteralTooLarge {
                continue;
            }
            let explained = KNOWN_BUGS.iter().find(|b| match b.shows {
                Shows::ParserError(f) => f(d),
                Shows::ParserAccepts(_) => false,
            });
            match explained {
                Some(b) => bug = Some(b.id),
                None => return Verdict::Disagree,
            }
        }
        return bug.map_or(Verdict::Intentional("number literal out of range"), Verdict::KnownBug);
    }
    // The parser accepts what the grammar rejects.
    KNOWN_BUGS
        .iter()
        .find(|b| match b.shows {
            Shows::ParserAccepts(f) => f(src),
            Shows::ParserError(_) => false,
        })
        .map_or(Verdict::Disagree, |b| Verdict::KnownBug(b.id))
}

fn strict() -> bool {
    std::env::var_os("HPMOE_GRAMMAR_STRICT").is_some_and(|v| v != "0")
}

/// Whether `v` should fail the test.
fn fails(v: Verdict) -> bool {
    match v {
        Verdict::Agree | Verdict::Intentional(_) => false,
        Verdict::KnownBug(_) => strict(),
        Verdict::Disagree => true,
    }
}

// ---------------------------------------------------------------- known parser bugs

/// A parser bug this test found: the grammar is right, the parser is not.
struct KnownBug {
    id: &'static str,
    what: &'static str,
    /// The smallest text showing it.
    minimal: &'static str,
    /// What the grammar (and the language doc) says about `minimal`.
    should_accept: bool,
    /// How to recognise it when the two parsers disagree.
    shows: Shows,
}

#[derive(Clone, Copy)]
enum Shows {
    /// The parser rejects a valid text with errors like this one. (No such bug is known at the
    /// moment; `put` statements were one until the parser read the rank without indexing.)
    #[allow(dead_code)]
    ParserError(fn(&Diagnostic) -> bool),
    /// The parser accepts an invalid text that has this property.
    ParserAccepts(fn(&str) -> bool),
}

const KNOWN_BUGS: &[KnownBug] = &[KnownBug {
    id: "float-suffix-accepted",
    what: "The lexer rejects a number with a letter suffix (`1GB`: \"suffixes are not \
          allowed\") only for integers and exponent-only floats without a sign: after a float \
          with a fraction (`1.6TB`, `1.5e`) or a signed exponent (`1e-3x`) it starts a new \
          identifier token. So `bw: 1.6TB/s` is accepted as `1.6 TB/s` while `bw: 1TB/s` is an \
          error. Fix: `SuffixedNumber` patterns for those floats too.",
    minimal: "device = d { bw: 1.6TB/s };",
    should_accept: false,
    shows: Shows::ParserAccepts(float_runs_into_ident),
}];

/// Whether a float token is directly followed (no space) by an identifier.
fn float_runs_into_ident(src: &str) -> bool {
    let (toks, _, _) = tokenize(src, FileId(0));
    toks.windows(2).any(|w| {
        matches!(w[0].kind, TokenKind::Float(_))
            && matches!(w[1].kind, TokenKind::Ident(_))
            && w[0].span.hi == w[1].span.lo
    })
}

/// Fails while any known parser bug is present, with its minimal input; none is skipped
/// silently.
#[test]
fn known_parser_bugs() {
    let mut present = Vec::new();
    for bug in KNOWN_BUGS {
        let o = Outcome::of(bug.minimal);
        assert_eq!(
            o.grammar_ok(),
            bug.should_accept,
            "the grammar changed its mind about the minimal input of `{}`:\n{}\n{}",
            bug.id,
            bug.minimal,
            o.describe()
        );
        if o.parser_ok() != bug.should_accept {
            assert!(
                judge(bug.minimal, &o) == Verdict::KnownBug(bug.id),
                "`{}` does not recognise its own minimal input:\n{}",
                bug.id,
                o.describe()
            );
            present.push(format!(
                "parser bug `{}`\n  input:    {}\n  expected: {}\n  actual:   {}\n  {}\n{}",
                bug.id,
                bug.minimal,
                if bug.should_accept { "accepted" } else { "rejected" },
                if o.parser_ok() { "accepted" } else { "rejected" },
                bug.what,
                o.describe()
            ));
        }
    }
    assert!(
        present.is_empty(),
        "{} known parser bug(s) still present (the other tests of this file classify them; \
         delete an entry of KNOWN_BUGS once it is fixed):\n\n{}",
        present.len(),
        present.join("\n\n")
    );
}

// ---------------------------------------------------------------- the corpus

/// Every `.hpm` file under `dir`, recursively, sorted.
fn hpm_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            hpm_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "hpm") {
            out.push(p);
        }
    }
}

/// The files this test brings in `tests/grammar/`; they must be found.
const OWN_FILES: &[&str] = &[
    "ok_whole_program.hpm",
    "ok_comments.hpm",
    "ok_docs.hpm",
    "ok_trailing_commas.hpm",
    "ok_empty_bodies.hpm",
    "ok_taskflow_outputs.hpm",
    "ok_sum.hpm",
    "ok_put.hpm",
    "ok_units.hpm",
    "ok_literals.hpm",
    "ok_keywords_as_names.hpm",
    "ok_imports.hpm",
    "err_number_suffix.hpm",
    "err_float_suffix.hpm",
    "err_dangling_doc.hpm",
    "err_late_inner_doc.hpm",
    "err_unterminated_comment.hpm",
    "err_bad_escape.hpm",
    "err_op_without_engine.hpm",
    "err_item_keyword_in_body.hpm",
    "err_priority_two_values.hpm",
    "err_profile_semicolon.hpm",
];

#[test]
fn corpus_agrees() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["stdlib", "examples", "tests/ok", "tests/err", "tests/grammar"] {
        hpm_files(&root.join(dir), &mut files);
    }
    for own in OWN_FILES {
        assert!(
            files.iter().any(|f| f.ends_with(Path::new("tests/grammar").join(own))),
            "tests/grammar/{own} was not found by the corpus walk"
        );
    }

    let mut failures = Vec::new();
    let mut classified = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(root).unwrap_or(path).display().to_string();
        let src = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{rel}: cannot read: {e}"));
                continue;
            }
        };
        let o = Outcome::of(&src);
        let v = judge(&src, &o);
        if fails(v) {
            failures.push(format!("{rel}: the parsers disagree ({v:?})\n{}", o.describe()));
        } else if v != Verdict::Agree {
            classified.push(format!("{rel}: {v:?}"));
        }
        // The naming convention of tests/grammar/ states what the grammar must say.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if rel.starts_with("tests/grammar") {
            let want = if name.starts_with("ok_") {
                Some(true)
            } else if name.starts_with("err_") {
                Some(false)
            } else {
                None
            };
            if let Some(want) = want {
                if o.grammar_ok() != want {
                    failures.push(format!(
                        "{rel}: the grammar {} it, the file name says it should {}\n{}",
                        if o.grammar_ok() { "accepts" } else { "rejects" },
                        if want { "be accepted" } else { "be rejected" },
                        o.describe()
                    ));
                }
            }
        }
    }
    println!(
        "corpus: {} files, {} classified, {} failures",
        files.len(),
        classified.len(),
        failures.len()
    );
    for c in &classified {
        println!("  classified: {c}");
    }
    assert!(
        failures.is_empty(),
        "{} corpus file(s) fail:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------- generated programs

/// A program as a list of tokens (comments count as tokens here); rendered with spaces.
type Toks = Vec<String>;
type Gen = BoxedStrategy<Toks>;

fn render(toks: &[String]) -> String {
    toks.join(" ")
}

/// Fixed tokens, separated by spaces in `s`.
fn lit(s: &'static str) -> Gen {
    Just(words(s)).boxed()
}

fn words(s: &str) -> Toks {
    s.split(' ').filter(|w| !w.is_empty()).map(String::from).collect()
}

/// Concatenates generated parts.
fn seq(parts: Vec<Gen>) -> Gen {
    parts.into_iter().fold(Just(Vec::new()).boxed(), |acc, p| {
        (acc, p)
            .prop_map(|(mut a, b)| {
                a.extend(b);
                a
            })
            .boxed()
    })
}

fn opt(g: Gen) -> Gen {
    prop_oneof![Just(Vec::new()), g].boxed()
}

fn many(g: Gen, max: usize) -> Gen {
    prop::collection::vec(g, 0..=max).prop_map(|v| v.concat()).boxed()
}

/// `open item, item, ... [,] close` with `min..=max` items.
fn list(item: Gen, min: usize, max: usize, open: &'static str, close: &'static str) -> Gen {
    (prop::collection::vec(item, min..=max), any::<bool>())
        .prop_map(move |(items, trailing)| {
            let mut out = vec![open.to_string()];
            let n = items.len();
            for (i, it) in items.into_iter().enumerate() {
                out.extend(it);
                if i + 1 < n || trailing {
                    out.push(",".into());
                }
            }
            out.push(close.to_string());
            out
        })
        .boxed()
}

/// Names that are fine anywhere a name is: plain ones and keywords used as names (keywords
/// are not reserved). `sum` is left out: before `(` it starts a sum.
fn name() -> Gen {
    select(vec![
        "x", "y", "w_up", "tokens", "hidden", "M", "N", "K", "T", "_", "a1", "r", "bf16", "group", "in", "on", "tile",
        "order", "priority", "route", "let", "return", "put", "param", "op", "taskflow",
    ])
    .prop_map(|s| vec![s.to_string()])
    .boxed()
}

fn number() -> Gen {
    select(vec![
        "0",
        "1",
        "42",
        "4096",
        "1_000",
        "0xFF",
        "0x_1f",
        "0b1010",
        "0o17",
        "18446744073709551615",
        "1.5",
        "1e12",
        "1.6e-3",
        "0.85",
        "2.5E+3",
        "1_0.5_",
        "1e_5",
    ])
    .prop_map(|s| vec![s.to_string()])
    .boxed()
}

fn string() -> Gen {
    select(vec![r#""ops.hpm""#, r#""""#, r#""a\n\t\r\0\\\"\'b""#, "\"two\nlines\""])
        .prop_map(|s| vec![s.to_string()])
        .boxed()
}

fn expr() -> Gen {
    let leaf = prop_oneof![3 => name(), 2 => number(), 1 => string()].boxed();
    leaf.prop_recursive(3, 24, 3, |inner| {
        let inner: Gen = inner.boxed();
        let arg = seq(vec![opt(seq(vec![name(), lit(":")])), inner.clone()]);
        let binder = prop_oneof![
            name(),
            seq(vec![name(), lit("in group ("), name(), opt(lit(",")), lit(")")]),
        ]
        .boxed();
        prop_oneof![
            // a + b, a * b, ...
            seq(vec![
                inner.clone(),
                select(vec!["+", "-", "*", "/", "%"])
                    .prop_map(|s| vec![s.to_string()])
                    .boxed(),
                inner.clone()
            ]),
            seq(vec![lit("-"), inner.clone()]),
            list(inner.clone(), 0, 3, "(", ")"),
            // calls, indexes and fields
            seq(vec![inner.clone(), list(arg, 0, 3, "(", ")")]),
            seq(vec![inner.clone(), list(inner.clone(), 0, 3, "[", "]")]),
            seq(vec![inner.clone(), lit("."), name()]),
            seq(vec![lit("sum"), list(binder, 1, 2, "(", ")"), inner]),
        ]
        .boxed()
    })
    .boxed()
}

fn docs() -> Gen {
    many(
        select(vec![
            "/// A doc line.\n",
            "///\n",
            "/// `code` and /* not a comment */\n",
        ])
        .prop_map(|s| vec![s.to_string()])
        .boxed(),
        2,
    )
}

fn tensor_type() -> Gen {
    seq(vec![name(), list(expr(), 0, 3, "[", "]")])
}

fn field() -> Gen {
    seq(vec![docs(), name(), lit(":"), expr()])
}

fn unit_field() -> Gen {
    let unit = select(vec!["MHz", "KiB", "count", "us", "ratio", "TB / s", "B / cycle"])
        .prop_map(words)
        .boxed();
    seq(vec![field(), opt(unit)])
}

fn tile() -> Gen {
    seq(vec![lit("tile"), list(field(), 0, 2, "(", ")")])
}

fn on_engine() -> Gen {
    seq(vec![lit("on"), name()])
}

fn params() -> Gen {
    let ty = prop_oneof![1 => lit("route"), 3 => tensor_type()].boxed();
    list(seq(vec![name(), lit(":"), ty]), 0, 3, "(", ")")
}

fn op_signature() -> Gen {
    seq(vec![
        name(),
        opt(list(name(), 1, 2, "<", ">")),
        params(),
        lit("->"),
        tensor_type(),
    ])
}

fn op_body() -> Gen {
    let target = select(vec!["out", "route", "y", "acc"])
        .prop_map(|s| vec![s.to_string()])
        .boxed();
    let assign_op = select(vec!["=", "+="]).prop_map(|s| vec![s.to_string()]).boxed();
    let rank = select(vec![
        "r . rank ( t , j )",
        "r . src_rank ( m )",
        "0",
        "( ranks [ t ] )",
        "peer",
    ])
    .prop_map(words)
    .boxed();
    let stmt = prop_oneof![
        seq(vec![lit("let"), name(), lit("="), expr(), lit(";")]),
        seq(vec![
            target,
            list(expr(), 0, 3, "[", "]"),
            assign_op.clone(),
            expr(),
            lit(";")
        ]),
        seq(vec![
            lit("put"),
            name(),
            lit("@"),
            rank,
            list(expr(), 0, 3, "[", "]"),
            assign_op,
            expr(),
            lit(";"),
        ]),
    ]
    .boxed();
    seq(vec![lit("{"), many(stmt, 3), lit("}")])
}

fn annotation() -> Gen {
    prop_oneof![
        tile(),
        on_engine(),
        seq(vec![lit("order"), list(name(), 0, 2, "(", ")")]),
        seq(vec![lit("priority ("), expr(), opt(lit(",")), lit(")")]),
    ]
    .boxed()
}

fn item() -> Gen {
    let import = prop_oneof![
        lit(r#"import "ops.hpm" ;"#),
        seq(vec![
            lit(r#"import "ops.hpm" ::"#),
            prop_oneof![lit("*"), list(name(), 0, 3, "{", "}")].boxed(),
            lit(";")
        ]),
        seq(vec![
            lit("import std :: moe ::"),
            prop_oneof![lit("*"), list(name(), 0, 3, "{", "}")].boxed(),
            lit(";")
        ]),
        lit("import std :: device :: ascend_a3 ;"),
        lit("import a :: b ;"),
    ]
    .boxed();
    let param = seq(vec![lit("param"), name(), lit("="), expr(), lit(";")]);
    let device = seq(vec![
        lit("device ="),
        name(),
        opt(list(unit_field(), 0, 3, "{", "}")),
        lit(";"),
    ]);
    let route = seq(vec![
        lit("route"),
        name(),
        lit("="),
        name(),
        list(seq(vec![opt(seq(vec![name(), lit(":")])), expr()]), 0, 3, "(", ")"),
        lit(";"),
    ]);
    // `on` and `tile(...)` in either order, each once (`on` required on a compute op).
    let op = seq(vec![
        lit("op"),
        op_signature(),
        prop_oneof![seq(vec![on_engine(), opt(tile())]), seq(vec![tile(), on_engine()])].boxed(),
        op_body(),
    ]);
    let comm = seq(vec![
        lit("comm"),
        op_signature(),
        opt(prop_oneof![seq(vec![on_engine(), opt(tile())]), seq(vec![tile(), opt(on_engine())])].boxed()),
        op_body(),
    ]);
    let flow_stmt = seq(vec![
        prop_oneof![
            seq(vec![lit("let"), name(), lit("="), expr()]),
            seq(vec![lit("return"), expr()])
        ]
        .boxed(),
        many(annotation(), 3),
        lit(";"),
    ]);
    let result = prop_oneof![
        tensor_type(),
        list(seq(vec![name(), lit(":"), tensor_type()]), 0, 3, "(", ")"),
    ]
    .boxed();
    let taskflow = seq(vec![
        lit("taskflow"),
        name(),
        params(),
        lit("->"),
        result,
        lit("{"),
        many(flow_stmt, 4),
        lit("}"),
    ]);
    let schedule = seq(vec![
        lit("schedule"),
        opt(name()),
        lit("="),
        name(),
        opt(list(field(), 0, 3, "{", "}")),
        lit(";"),
    ]);
    let profile = seq(vec![
        lit("profile"),
        name(),
        opt(seq(vec![lit(":"), name()])),
        list(unit_field(), 0, 3, "{", "}"),
    ]);
    let sig_param = seq(vec![
        name(),
        lit(":"),
        name(),
        many(seq(vec![lit("|"), name()]), 2),
        opt(seq(vec![lit("="), expr()])),
    ]);
    let signature = seq(vec![
        select(vec!["routing", "policy"])
            .prop_map(|s| vec![s.to_string()])
            .boxed(),
        name(),
        list(sig_param, 0, 3, "(", ")"),
        lit(";"),
    ]);
    seq(vec![
        docs(),
        prop_oneof![import, param, device, route, op, comm, taskflow, schedule, profile, signature].boxed(),
    ])
}

/// A valid program: inner docs, items, and comments spread between the tokens.
fn program() -> Gen {
    let inner_docs = many(
        select(vec!["//! The file.\n", "//!\n"])
            .prop_map(|s| vec![s.to_string()])
            .boxed(),
        2,
    );
    let comment = select(vec![
        "/* c */",
        "/* a /* nested */ b */",
        "/**/",
        "// line\n",
        "//// four\n",
    ]);
    (
        inner_docs,
        prop::collection::vec(item(), 1..=5),
        prop::collection::vec((any::<Index>(), comment), 0..=3),
    )
        .prop_map(|(mut toks, items, comments)| {
            let start = toks.len();
            toks.extend(items.concat());
            // Comments go anywhere after the inner docs (before them they are fine too, but
            // keep the inner docs first).
            for (at, c) in comments {
                let i = start + at.index(toks.len() - start + 1);
                toks.insert(i, c.to_string());
            }
            toks
        })
        .boxed()
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(Index),
    Duplicate(Index),
    Swap(Index, Index),
    Truncate(Index),
    /// Beyond tokens: a character of the rendered text removed, or one inserted.
    DeleteChar(Index),
    InsertChar(Index, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::Duplicate),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        any::<Index>().prop_map(Mutation::DeleteChar),
        (
            any::<Index>(),
            select(vec![' ', '/', '*', '.', '_', 'e', '1', '"', '(', ']', ':', '-', '!'])
        )
            .prop_map(|(i, c)| Mutation::InsertChar(i, c)),
    ]
}

/// The rendered text of `toks` after `m`.
fn mutate(toks: &[String], m: &Mutation) -> String {
    let mut t = toks.to_vec();
    if t.is_empty() {
        return String::new();
    }
    match m {
        Mutation::Delete(i) => {
            t.remove(i.index(t.len()));
        }
        Mutation::Duplicate(i) => {
            let i = i.index(t.len());
            t.insert(i, t[i].clone());
        }
        Mutation::Swap(a, b) => {
            let (a, b) = (a.index(t.len()), b.index(t.len()));
            t.swap(a, b);
        }
        Mutation::Truncate(i) => t.truncate(i.index(t.len())),
        Mutation::DeleteChar(i) => {
            let mut chars: Vec<char> = render(&t).chars().collect();
            chars.remove(i.index(chars.len()));
            return chars.into_iter().collect();
        }
        Mutation::InsertChar(i, c) => {
            let mut chars: Vec<char> = render(&t).chars().collect();
            chars.insert(i.index(chars.len() + 1), *c);
            return chars.into_iter().collect();
        }
    }
    render(&t)
}

/// Counts of verdicts over a run, printed at the end.
#[derive(Default, Debug)]
struct Tally {
    by_verdict: BTreeMap<String, usize>,
    accepted: usize,
    rejected: usize,
}

impl Tally {
    fn add(&mut self, v: Verdict, o: &Outcome) {
        *self.by_verdict.entry(format!("{v:?}")).or_default() += 1;
        if o.grammar_ok() {
            self.accepted += 1;
        } else {
            self.rejected += 1;
        }
    }
}

/// Checks one text; an unexplained disagreement fails the case (and proptest shrinks it).
fn check(src: &str, tally: &RefCell<Tally>) -> Result<(), TestCaseError> {
    let o = Outcome::of(src);
    let v = judge(src, &o);
    tally.borrow_mut().add(v, &o);
    if fails(v) {
        return Err(TestCaseError::fail(format!(
            "the parsers disagree ({v:?}) on:\n---\n{src}\n---\n{}",
            o.describe()
        )));
    }
    Ok(())
}

/// A runner for `cases` cases, or `PROPTEST_CASES` when set (for longer runs by hand).
fn runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

#[test]
fn generated_programs_and_mutants_agree() {
    let valid = RefCell::new(Tally::default());
    let mutants = RefCell::new(Tally::default());
    let strategy = (program(), prop::collection::vec(mutation(), 4));
    let result = runner(256).run(&strategy, |(toks, muts)| {
        let src = render(&toks);
        // A generated program is valid by construction.
        if let Some(e) = reference::parse_error(&src) {
            return Err(TestCaseError::fail(format!(
                "the grammar rejects a generated program:\n---\n{src}\n---\n{e}"
            )));
        }
        check(&src, &valid)?;
        for m in &muts {
            check(&mutate(&toks, m), &mutants)?;
        }
        Ok(())
    });
    println!("valid programs: {:?}", valid.borrow());
    println!("mutants: {:?}", mutants.borrow());
    if let Err(e) = result {
        panic!("{e}");
    }
    let m = mutants.borrow();
    assert!(
        m.rejected > 0 && m.accepted > 0,
        "the mutations should give both valid and invalid texts: {m:?}"
    );
}

/// Short strings of lexically interesting characters in a few places of a program: numbers,
/// strings, comments, doc comments, and what the lexer makes of their neighbours.
#[test]
fn lexical_fragments_agree() {
    let alphabet = vec![
        "0", "1", "9", "e", "E", "x", "b", "o", "f", "_", ".", "+", "-", "\"", "\\", "n", "'", "/", "*", "!", " ",
        "\n", "a", ":", "#", "é", "0x", "0b", "1.5", "//", "/*", "*/", "///", "//!", "\t", "\r", "\u{0C}", "\u{0B}",
        "\u{A0}", "=", ">", "<", "(", ")", "[", "]", "{", "}", ",", ";", "|", "@",
    ];
    let fragment = prop::collection::vec(select(alphabet), 0..10).prop_map(|v| v.concat());
    let context = select(vec![
        "param a = {};",
        "param a = 1 {} 2;",
        "device = d { f: {} };",
        "device = d { f: 1 {} };",
        "{}",
        "{}param a = 1;",
        "param a = 1;{}",
        "import {};",
        "import a::{};",
        "op f<{}>() -> T[{}] on aic { out[i] = {}; }",
        "taskflow t() -> T[] { return x {}; }",
        "routing r(p: {});",
    ]);
    let tally = RefCell::new(Tally::default());
    let result = runner(256).run(&(context, fragment), |(ctx, frag)| {
        check(&ctx.replace("{}", &frag), &tally)
    });
    println!("lexical fragments: {:?}", tally.borrow());
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------- the editors' grammar

/// The words a TextMate grammar's rule highlights, with the scope it gives them: every rule
/// reachable from the top-level patterns (through `include`s of the repository) whose match
/// is a whole-word alternation `\b(a|b|c)\b`, as a `name` or as the capture of the group.
fn textmate_words(tm: &serde_json::Value) -> BTreeMap<String, String> {
    fn rule(tm: &serde_json::Value, r: &serde_json::Value, seen: &mut Vec<String>, out: &mut BTreeMap<String, String>) {
        if let Some(inc) = r["include"].as_str() {
            let key = inc.trim_start_matches('#').to_string();
            if !seen.contains(&key) {
                seen.push(key.clone());
                rule(tm, &tm["repository"][key.as_str()], seen, out);
            }
            return;
        }
        if let Some(m) = r["match"].as_str() {
            let scope = r["name"].as_str().or(r["captures"]["1"]["name"].as_str());
            let inner = m.strip_prefix("\\b(").and_then(|m| m.strip_suffix(")\\b"));
            if let (Some(scope), Some(inner)) = (scope, inner) {
                for w in inner.split('|') {
                    if w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                        out.entry(w.to_string()).or_insert_with(|| scope.to_string());
                    }
                }
            }
        }
        for p in r["patterns"].as_array().into_iter().flatten() {
            rule(tm, p, seen, out);
        }
    }
    let mut out = BTreeMap::new();
    rule(tm, tm, &mut Vec::new(), &mut out);
    out
}

/// Every keyword of the reference grammar (its `kw_*` rules) is highlighted as a keyword by
/// the TextMate grammar of the editors (docs/editors/), and every dtype as a type.
#[test]
fn textmate_grammar_covers_every_keyword() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pest = std::fs::read_to_string(root.join("hpmoe-dsl/src/syntax/hpm.pest")).unwrap();
    let keywords: Vec<&str> = pest
        .lines()
        .filter(|l| l.starts_with("kw_"))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(keywords.len() >= 20, "the keyword rules were not found: {keywords:?}");
    let path = root.join("docs/editors/vscode/syntaxes/hpm.tmLanguage.json");
    let tm: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(tm["scopeName"], "source.hpm");
    assert!(tm["fileTypes"].as_array().unwrap().contains(&serde_json::json!("hpm")));
    let words = textmate_words(&tm);
    for k in &keywords {
        let scope = words.get(*k).map(String::as_str).unwrap_or("not highlighted");
        assert!(
            scope.starts_with("keyword.") || scope.starts_with("storage.type"),
            "keyword `{k}`: {scope}"
        );
    }
    for d in hpmoe_dsl::ir::DType::ALL {
        let scope = words.get(d.name()).map(String::as_str).unwrap_or("not highlighted");
        assert!(scope.starts_with("storage.type.dtype"), "dtype `{}`: {scope}", d.name());
    }
    // The extension's manifest names this grammar and starts the language server.
    let vscode = root.join("docs/editors/vscode");
    let pkg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(vscode.join("package.json")).unwrap()).unwrap();
    let g = &pkg["contributes"]["grammars"][0];
    assert_eq!(g["scopeName"], "source.hpm");
    assert!(vscode.join(g["path"].as_str().unwrap()).is_file());
    assert_eq!(pkg["contributes"]["languages"][0]["extensions"][0], ".hpm");
    let js = std::fs::read_to_string(vscode.join(pkg["main"].as_str().unwrap())).unwrap();
    assert!(js.contains("args: [\"lsp\"]"), "{js}");
}
