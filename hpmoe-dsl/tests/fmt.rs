//! The canonical formatter (`hpmoe_dsl::syntax::fmt`).
//!
//! Properties, over every `.hpm` file of the repository that parses (`stdlib`, `examples`,
//! `tests/ok`, `tests/err`, `tests/grammar`, found at test time) and over the messy inputs in `tests/fmt/`:
//!
//! 1. idempotence: `fmt(fmt(x)) == fmt(x)`;
//! 2. round trip: `parse(fmt(x)) == parse(x)` ignoring spans;
//! 3. every comment's text appears in the output;
//! 4. the multiset of comments is the same after formatting.
//!
//! Plus snapshots of the formatted `tests/fmt/` inputs, exact outputs for tricky expressions,
//! and two property tests: random expression trees print to text that parses back to them,
//! and the four properties hold after inserting comments at random token boundaries.

use hpmoe_dsl::syntax::ast::{self, erase_spans, Expr, ExprKind};
use hpmoe_dsl::syntax::fmt::{expr_text, format_file, format_source};
use hpmoe_dsl::syntax::lexer::{tokenize, Comment};
use hpmoe_dsl::syntax::parse_text;
use hpmoe_dsl::syntax::token::TokenKind;
use hpmoe_dsl::FileId;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn collect_hpm(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let p = entry.path();
        if p.is_dir() {
            collect_hpm(&p, out);
        } else if p.extension().is_some_and(|e| e == "hpm") {
            out.push(p);
        }
    }
}

fn own_inputs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    collect_hpm(&manifest().join("tests/fmt"), &mut v);
    v.sort();
    v
}

fn corpus() -> Vec<PathBuf> {
    let root = manifest().join("..");
    let mut v = Vec::new();
    for d in ["stdlib", "examples", "tests/ok", "tests/err", "tests/grammar"] {
        collect_hpm(&root.join(d), &mut v);
    }
    v.sort();
    v
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The tree without spans and the comments, if the text parses without errors.
fn parse_clean(src: &str) -> Option<(ast::File, Vec<Comment>)> {
    let (mut f, diags, comments) = parse_text(src, FileId(0));
    if diags.iter().any(|d| d.is_error()) {
        return None;
    }
    erase_spans(&mut f);
    Some((f, comments))
}

fn comment_texts(cs: &[Comment]) -> Vec<String> {
    let mut v: Vec<String> = cs.iter().map(|c| c.text.clone()).collect();
    v.sort();
    v
}

/// Checks the four properties on a text that parses; returns the formatted text.
fn check_properties(src: &str) -> Result<String, String> {
    let (tree, comments) = parse_clean(src).ok_or("the input does not parse")?;
    let once = format_source(src).map_err(|d| format!("format_source failed: {d:?}"))?;
    let twice = match format_source(&once) {
        Ok(t) => t,
        Err(d) => {
            let msgs: Vec<_> = d.iter().map(|d| d.message.clone()).collect();
            return Err(format!("the output does not parse: {msgs:?}\n--- output ---\n{once}"));
        }
    };
    if twice != once {
        return Err(format!("not idempotent\n--- once ---\n{once}\n--- twice ---\n{twice}"));
    }
    let (tree2, comments2) = parse_clean(&once).ok_or("the output does not parse")?;
    if tree2 != tree {
        return Err(format!(
            "the tree changed\n--- output ---\n{once}\n--- before ---\n{tree:#?}\n--- after ---\n{tree2:#?}"
        ));
    }
    for c in &comments {
        if !once.contains(&c.text) {
            return Err(format!("comment {:?} lost\n--- output ---\n{once}", c.text));
        }
    }
    if comment_texts(&comments) != comment_texts(&comments2) {
        return Err(format!(
            "the comments changed: {:?} became {:?}\n--- output ---\n{once}",
            comment_texts(&comments),
            comment_texts(&comments2)
        ));
    }
    Ok(once)
}

#[test]
fn own_inputs_parse() {
    let inputs = own_inputs();
    assert!(
        inputs.len() >= 10,
        "expected the inputs in tests/fmt/, found {}",
        inputs.len()
    );
    for p in inputs {
        let (_, diags, _) = parse_text(&read(&p), FileId(0));
        let msgs: Vec<_> = diags.iter().map(|d| d.message.clone()).collect();
        assert!(msgs.is_empty(), "{} does not parse: {msgs:?}", p.display());
    }
}

fn check_all(files: &[PathBuf]) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for p in files {
        let src = read(p);
        if parse_clean(&src).is_none() {
            eprintln!("skipped (does not parse): {}", p.display());
            continue;
        }
        checked += 1;
        if let Err(e) = check_properties(&src) {
            failures.push(format!("{}: {e}", p.display()));
        }
    }
    eprintln!("checked {checked} of {} files", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn properties_hold_on_own_inputs() {
    check_all(&own_inputs());
}

#[test]
fn properties_hold_on_the_corpus() {
    check_all(&corpus());
}

#[test]
fn snapshots_of_own_inputs() {
    for p in own_inputs() {
        let src = read(&p);
        let out = format_source(&src).unwrap_or_else(|d| panic!("{}: {d:?}", p.display()));
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("input").to_string();
        insta::assert_snapshot!(stem, out);
    }
}

/// A call of a call of `max`, too long for one line: the broken form keeps the callee in
/// parentheses, so it does not read back as the reduction `max(a, b) (..)`.
#[test]
fn a_long_call_of_max_keeps_its_parentheses() {
    let arg = "a_very_long_argument_name_that_does_not_fit";
    let src = format!("param p = (max)(a: 1, b: 2)(\"{arg}\"[], {arg}: 100, {arg}_2: 200);\n");
    let out = format_source(&src).unwrap();
    assert!(out.contains("(max(a: 1, b: 2))(\n"), "{out}");
    assert_eq!(format_source(&out).ok(), Some(out.clone()));
}

/// A comment between a taskflow's named results and its body goes inside the broken
/// results list; the first formatting breaks that list (only), as the second does.
#[test]
fn a_comment_before_a_taskflow_body_formats_the_same_twice() {
    for results in [
        "(a: bf16[8], b: bf16[8])",
        "(a: bf16[r.recv, hidden], b: bf16[r.recv, hidden], c: bf16[r.recv, 2 * hidden], d: bf16[r.recv, hidden])",
    ] {
        let src = format!("taskflow f(x: bf16[8]) -> {results}\n\n// c0\n\n {{\n    return (x, x);\n}}\n");
        let out = format_source(&src).unwrap();
        assert!(out.starts_with("taskflow f(x: bf16[8]) -> (\n"), "{out}");
        assert!(out.contains("    // c0\n) {\n"), "{out}");
        assert_eq!(format_source(&out).ok(), Some(out.clone()));
    }
}

#[test]
fn exact_expressions() {
    let cases = [
        ("a - (b - c)", "a - (b - c)"),
        ("(a - b) - c", "a - b - c"),
        ("(a + b) * c", "(a + b) * c"),
        ("a * (b * c)", "a * (b * c)"),
        ("a / (b * c)", "a / (b * c)"),
        ("(a * b) + (c * d)", "a * b + c * d"),
        ("a + (b * c)", "a + b * c"),
        ("-(a + b)", "-(a + b)"),
        ("-(-a)", "- -a"),
        ("(-a).b", "(-a).b"),
        ("-(a.b)", "-a.b"),
        ("(a + b)[0]", "(a + b)[0]"),
        ("((a))", "a"),
        ("(a,)", "(a,)"),
        ("()", "()"),
        ("(a , b , )", "(a, b)"),
        ("f( x : 1 , y )", "f(x: 1, y)"),
        ("sum(k) a * b + c", "sum(k) a * b + c"),
        ("(sum(k) a) * b", "(sum(k) a) * b"),
        ("sum(k) (a + b)", "sum(k) (a + b)"),
        ("sum(k) (a * b)", "sum(k) a * b"),
        ("c * (sum(k) a * b) * 2", "c * (sum(k) a * b) * 2"),
        ("c * (sum(k) a * b) + 2", "c * sum(k) a * b + 2"),
        ("(-sum(k) a) * b", "-(sum(k) a) * b"),
        ("-(sum(k) a * b)", "-sum(k) a * b"),
        ("(sum(k) a)(x)", "(sum(k) a)(x)"),
        ("sum(k, m in group(g)) x", "sum(k, m in group(g)) x"),
        ("1_000", "1000"),
        ("0x10", "16"),
        ("1.50", "1.5"),
        ("1e3", "1000.0"),
        ("1e20", "1e20"),
        ("0.000001", "1e-6"),
        ("\"a\\\"b\\n\"", "\"a\\\"b\\n\""),
    ];
    let mut bad = Vec::new();
    for (input, want) in cases {
        let got = format_source(&format!("param p = {input};")).unwrap_or_else(|d| panic!("{input}: {d:?}"));
        let want = format!("param p = {want};\n");
        if got != want {
            bad.push(format!("{input}: got {got:?}, want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn exact_put_ranks() {
    let cases = [
        ("r.rank(t, j)", "r.rank(t, j)"),
        ("(r.rank(t, j))", "r.rank(t, j)"),
        ("me", "me"),
        ("(a + 1)", "(a + 1)"),
        ("(-a)", "(-a)"),
        ("(peers[t])", "(peers[t])"),
        ("(peers[t]).next(1)", "(peers[t].next(1))"),
        ("(sum(k) a)", "(sum(k) a)"),
    ];
    let mut bad = Vec::new();
    for (input, want) in cases {
        let src = format!("comm c(x: T[M], r: route) -> T[M] {{ put out @ {input} [m] = x[m]; }}");
        let got = format_source(&src).unwrap_or_else(|d| panic!("{input}: {d:?}"));
        let want = format!("comm c(x: T[M], r: route) -> T[M] {{\n    put out @ {want} [m] = x[m];\n}}\n");
        if got != want {
            bad.push(format!("{input}: got {got:?}, want {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn edge_inputs() {
    assert_eq!(format_source("").unwrap(), "");
    assert_eq!(format_source("  \n\n ").unwrap(), "");
    assert_eq!(
        format_source("// only\n\n\n/* comments */").unwrap(),
        "// only\n\n/* comments */\n"
    );
    assert_eq!(format_source("//! doc").unwrap(), "//! doc\n");
    assert_eq!(format_source("///\nparam a=1;").unwrap(), "///\nparam a = 1;\n");
    assert!(format_source("param = ;").is_err());
    assert!(format_source("param a = 1").is_err());
    assert!(format_source("param a = \"unterminated;").is_err());
    // Text that does not belong to the tree must not make it panic.
    let (file, _, comments) = parse_text("param a = 1; // c\nop f() -> T[M] on aiv { out[m] = 1; }", FileId(0));
    for src in [
        "",
        "x",
        "param",
        "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}",
    ] {
        let _ = format_file(&file, &comments, src);
    }
}

// ------------------------------------------------------------------------- property tests

fn name() -> impl Strategy<Value = String> {
    // `max` is both a function and a reduction: generate it often.
    prop_oneof![
        4 => "[A-Za-z_][A-Za-z0-9_]{0,5}".prop_filter("`sum` starts a reduction", |s| s != "sum"),
        1 => Just("max".to_string()),
    ]
}

fn ident() -> impl Strategy<Value = ast::Ident> {
    name().prop_map(|name| ast::Ident {
        name,
        span: Default::default(),
    })
}

fn mk(kind: ExprKind) -> Expr {
    Expr {
        kind,
        span: Default::default(),
    }
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        proptest::num::f64::POSITIVE | proptest::num::f64::ZERO | proptest::num::f64::SUBNORMAL,
        (0u32..100_000).prop_map(|v| f64::from(v) / 100.0),
    ]
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        any::<u64>().prop_map(|v| mk(ExprKind::Int(v))),
        float().prop_map(|v| mk(ExprKind::Float(v))),
        any::<String>().prop_map(|s| mk(ExprKind::Str(s.into()))),
        name().prop_map(|n| mk(ExprKind::Name(n.into()))),
    ];
    leaf.prop_recursive(5, 40, 4, |inner| {
        let op = prop_oneof![
            Just(ast::BinOp::Add),
            Just(ast::BinOp::Sub),
            Just(ast::BinOp::Mul),
            Just(ast::BinOp::Div),
            Just(ast::BinOp::Rem),
        ];
        let binder = prop_oneof![
            ident().prop_map(ast::Binder::Full),
            (ident(), ident()).prop_map(|(var, group)| ast::Binder::InGroup { var, group }),
        ];
        let arg = (proptest::option::of(ident()), inner.clone()).prop_map(|(name, value)| ast::Arg { name, value });
        prop_oneof![
            inner.clone().prop_map(|x| mk(ExprKind::Neg(Box::new(x)))),
            (op, inner.clone(), inner.clone()).prop_map(|(o, l, r)| mk(ExprKind::Binary(o, Box::new(l), Box::new(r)))),
            (inner.clone(), proptest::collection::vec(arg, 0..3)).prop_map(|(c, args)| mk(ExprKind::Call {
                callee: Box::new(c),
                args: args.into()
            })),
            (inner.clone(), proptest::collection::vec(inner.clone(), 0..3)).prop_map(|(b, index)| mk(
                ExprKind::Index {
                    base: Box::new(b),
                    index: index.into()
                }
            )),
            (inner.clone(), ident()).prop_map(|(b, field)| mk(ExprKind::Field {
                base: Box::new(b),
                field: Box::new(field)
            })),
            proptest::collection::vec(inner.clone(), 0..3).prop_map(|v| mk(ExprKind::Tuple(v.into()))),
            (ident(), inner.clone()).prop_map(|(dtype, arg)| mk(ExprKind::Cast {
                dtype: Box::new(dtype),
                arg: Box::new(arg)
            })),
            (
                prop_oneof![Just(ast::ReduceOp::Sum), Just(ast::ReduceOp::Max)],
                proptest::collection::vec(binder, 1..3),
                inner
            )
                .prop_map(|(op, binders, body)| mk(ExprKind::Sum {
                    op,
                    binders: binders.into(),
                    body: Box::new(body)
                })),
        ]
    })
}

/// A comment to insert between tokens.
fn comment_text(kind: u8, k: usize) -> String {
    match kind % 5 {
        0 => format!(" /* c{k} */ "),
        1 => format!(" // c{k}\n"),
        2 => format!("\n/* c{k}\n   spans lines */\n"),
        3 => format!("\n\n// c{k}\n\n"),
        _ => format!(" /* c{k} /* nested */ */"),
    }
}

/// Every file the comment fuzzer starts from: the inputs and the corpus that parse.
fn fuzz_bases() -> Vec<String> {
    own_inputs()
        .into_iter()
        .chain(corpus())
        .map(|p| read(&p))
        .filter(|s| parse_clean(s).is_some())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random trees print to text that parses back to them (parentheses, `sum` bodies,
    /// literals, escapes).
    #[test]
    fn expressions_round_trip(e in expr()) {
        let text = format!("param p = {};", expr_text(&e));
        let (f, diags, _) = parse_text(&text, FileId(0));
        let msgs: Vec<_> = diags.iter().map(|d| d.message.clone()).collect();
        prop_assert!(msgs.is_empty(), "{text}: {msgs:?}");
        let mut f = f;
        erase_spans(&mut f);
        let got = match &f.items[0].kind {
            ast::ItemKind::Param(p) => p.value.clone(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(&got, &e, "{}", text);
        let out = format_source(&text).map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
        prop_assert_eq!(format_source(&out).ok(), Some(out.clone()));
    }

    /// The same as the rank of a `put`, where the index that follows must not be taken as
    /// an index of the rank.
    #[test]
    fn put_ranks_round_trip(e in expr()) {
        let text = format!("comm c(x: T[M], r: route) -> T[M] {{ put out @ ({}) [m] = x[m]; }}", expr_text(&e));
        let out = format_source(&text).map_err(|d| TestCaseError::fail(format!("{text}: {d:?}")))?;
        let (f, diags, _) = parse_text(&out, FileId(0));
        prop_assert!(diags.is_empty(), "{}: {:?}", out, diags);
        let mut f = f;
        erase_spans(&mut f);
        let rank = match &f.items[0].kind {
            ast::ItemKind::Op(o) => match &o.body[0] {
                ast::Stmt::Put { rank, .. } => rank.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(&rank, &e, "{}", out);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// The four properties still hold with comments inserted at random token boundaries.
    #[test]
    fn comments_anywhere(
        pick in any::<proptest::sample::Index>(),
        inserts in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..24),
    ) {
        let bases = fuzz_bases();
        prop_assume!(!bases.is_empty());
        let base = &bases[pick.index(bases.len())];
        let (toks, _, _) = tokenize(base, FileId(0));
        // Insertion points: the start of every token and the end of every token but doc
        // comments (which run to the end of their line).
        let points: Vec<usize> = toks
            .iter()
            .flat_map(|t| {
                let doc = matches!(t.kind, TokenKind::Doc(_) | TokenKind::InnerDoc(_));
                [Some(t.span.lo as usize), (!doc).then_some(t.span.hi as usize)]
            })
            .flatten()
            .collect();
        let mut at: Vec<(usize, String)> = inserts
            .iter()
            .enumerate()
            .map(|(k, (ix, kind))| (points[ix.index(points.len())], comment_text(*kind, k)))
            .collect();
        at.sort_by_key(|a| std::cmp::Reverse(a.0));
        let mut src = base.clone();
        for (pos, text) in at {
            src.insert_str(pos, &text);
        }
        prop_assert!(parse_clean(&src).is_some(), "the mutated text does not parse:\n{}", src);
        if let Err(e) = check_properties(&src) {
            return Err(TestCaseError::fail(format!("{e}\n--- input ---\n{src}")));
        }
        // Doc comments are tokens: they must all survive too.
        let docs = |s: &str| {
            tokenize(s, FileId(0)).0.into_iter()
                .filter(|t| matches!(t.kind, TokenKind::Doc(_) | TokenKind::InnerDoc(_)))
                .count()
        };
        let out = format_source(&src).map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
        prop_assert_eq!(docs(&src), docs(&out));
    }
}
