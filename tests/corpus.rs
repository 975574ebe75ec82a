//! The conformance corpus: programs that must check cleanly and programs that must fail with
//! exactly the diagnostics their comments announce.
//!
//! In: the `.hpm` files directly in `tests/ok/` and `tests/err/` (the roots; files in
//! subdirectories such as `tests/ok/lib/` and `tests/err/cycle/` are only imported), every
//! `examples/*.hpm` and every `stdlib/*.hpm` module. Out: a failure that names the file and
//! shows the difference between what was expected and what the checker reported, with the
//! rendered diagnostics.
//!
//! # Annotations
//!
//! An expected diagnostic is announced in a `//` comment:
//!
//! ```text
//! let a = swiglo(h);          // ERROR E0201
//! let b = gmm(a);             // ERROR E0301 E0201     (several codes on one line)
//! let c = add(a, a);          // WARNING E0205
//! // ERROR@+1 E0103           (the next line; `@-1` the previous one)
//! // ERROR@12 E0104           (absolute line 12)
//! ```
//!
//! - A marker is the word `ERROR` or `WARNING`, optionally followed (without a space) by
//!   `@+N`, `@-N` (relative to the comment's line) or `@N` (an absolute line). It is followed
//!   by one or more codes (`E` and four digits); free text may follow the codes. A marker
//!   without a code, or an unknown code, fails the test (it is a typo in the corpus).
//! - The reported line of a diagnostic is the 1-based line of its primary label; a
//!   diagnostic without a label counts as line 0 (none should occur in the corpus).
//! - Annotations are read from every file of the program that lives on disk (the root and
//!   the files it imports), and a diagnostic is matched in the file its primary label points
//!   into. So an import cycle, reported at an `import` inside `tests/err/cycle/b.hpm`, is
//!   annotated there.
//! - Matching is by set: the set of `(file, line, code, severity)` reported must equal the
//!   set announced. Two diagnostics with the same code on the same line need one annotation.
//! - `tests/err` files must announce at least one error; `tests/ok` files may announce only
//!   warnings (and then must produce exactly those).
//!
//! The annotations are read from the text line by line, without lexing: a `// ERROR` inside a
//! string literal counts too (useful for unterminated strings).
//!
//! Snapshots: [`snapshots_of_rendered_errors`] renders some error files with
//! [`RenderStyle::Plain`] into `tests/snapshots/`; update them with
//! `INSTA_UPDATE=always cargo test --test corpus` and review the diff.

use hpmoe_dsl::check::{check_path, Options, Outcome, Override};
use hpmoe_dsl::diag::{render_all, RenderStyle, CODES};
use hpmoe_dsl::{Code, Severity, SourceMap};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Codes that the error corpus does not cover, each with the reason.
const EXCLUDED: &[(Code, &str)] = &[
    (
        Code::BadOverride,
        "only `--set NAME=VALUE` options produce it, never a file: see `command_line_overrides`",
    ),
    (
        Code::MissingProducer,
        "a tile-level verification code: a correct lowering never produces it from a file; \
         the verifier's mutation tests (hpmoe-dsl/tests/lowering.rs) inject the fault",
    ),
    (
        Code::Race,
        "tile-level verification: see the mutation tests in hpmoe-dsl/tests/lowering.rs",
    ),
    (
        Code::WriteConflict,
        "tile-level verification: see the mutation tests in hpmoe-dsl/tests/lowering.rs",
    ),
    (
        Code::Cycle,
        "tile-level verification: see the mutation tests in hpmoe-dsl/tests/lowering.rs",
    ),
    (
        Code::Deadlock,
        "schedule verification: see the mutation tests in hpmoe-dsl/tests/lowering.rs",
    ),
    (
        Code::ThresholdMismatch,
        "schedule verification: see the mutation tests in hpmoe-dsl/tests/lowering.rs",
    ),
    (
        Code::BadQueue,
        "schedule verification of edited schedules; not reachable from a program",
    ),
];

/// One expected or reported diagnostic: file name as shown, 1-based line, code, severity.
type Key = (String, usize, Code, Severity);

/// A checked program with the sources needed to render its diagnostics.
struct Checked {
    outcome: Outcome,
    sources: SourceMap,
}

impl Checked {
    fn rendered(&self) -> String {
        let ds = &self.outcome.diagnostics;
        render_all(ds.as_slice(), ds.dropped(), &self.sources, RenderStyle::Plain)
    }

    /// What the checker reported, as keys.
    fn reported(&self) -> BTreeSet<Key> {
        self.outcome
            .diagnostics
            .as_slice()
            .iter()
            .map(|d| match d.span() {
                Some(span) => {
                    let file = self.sources.get(span.file).map_or_else(String::new, |f| f.name.clone());
                    let line = self.sources.line_col(span).map_or(0, |(l, _)| l);
                    (file, line, d.code, d.severity)
                }
                None => (String::new(), 0, d.code, d.severity),
            })
            .collect()
    }

    /// The message of a reported key (for failure output).
    fn message_of(&self, k: &Key) -> String {
        let found = self.outcome.diagnostics.as_slice().iter().find(|d| {
            d.code == k.2
                && d.severity == k.3
                && d.span().and_then(|s| self.sources.line_col(s)).map_or(0, |(l, _)| l) == k.1
        });
        found.map_or_else(String::new, |d| d.message.clone())
    }

    /// What the annotations of every on-disk file of the program announce.
    fn expected(&self) -> Result<BTreeSet<Key>, String> {
        let mut out = BTreeSet::new();
        for (_, f) in self.sources.files() {
            if f.path.is_none() {
                continue; // a standard module
            }
            out.extend(parse_annotations(&f.name, &f.text)?);
        }
        Ok(out)
    }
}

/// Checks a file given by a path relative to the package root; a panic becomes an `Err`.
fn check(path: &Path) -> Result<Checked, String> {
    catch_unwind(AssertUnwindSafe(|| {
        let mut sources = SourceMap::new();
        let outcome = check_path(path, &Options::default(), &mut sources);
        Checked { outcome, sources }
    }))
    .map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{}: the checker panicked: {msg}", path.display())
    })
}

/// The `.hpm` files directly in a directory (relative paths, sorted).
fn roots(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {dir}: {e}"))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "hpm"))
        .map(|p| Path::new(dir).join(p.file_name().unwrap_or_default()))
        .collect();
    v.sort();
    v
}

/// Parses the annotations of one file (see the module doc).
fn parse_annotations(name: &str, text: &str) -> Result<Vec<Key>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let here = i + 1;
        let Some(pos) = line.find("//") else { continue };
        let mut words = line[pos + 2..].split_whitespace().peekable();
        while let Some(w) = words.next() {
            let (severity, rest) = if let Some(r) = w.strip_prefix("ERROR") {
                (Severity::Error, r)
            } else if let Some(r) = w.strip_prefix("WARNING") {
                (Severity::Warning, r)
            } else {
                continue;
            };
            let bad = |why: &str| format!("{name}:{here}: malformed annotation `{w}`: {why}");
            let target = if rest.is_empty() {
                here
            } else if let Some(spec) = rest.strip_prefix('@') {
                let parsed = if let Some(n) = spec.strip_prefix('+') {
                    n.parse::<usize>().ok().map(|n| here + n)
                } else if let Some(n) = spec.strip_prefix('-') {
                    n.parse::<usize>().ok().and_then(|n| here.checked_sub(n))
                } else {
                    spec.parse::<usize>().ok()
                };
                parsed
                    .filter(|&l| l >= 1)
                    .ok_or_else(|| bad("expected `@+N`, `@-N` or `@N`"))?
            } else {
                return Err(bad("expected a space or `@` after the marker"));
            };
            let mut n = 0;
            while let Some(c) = words.peek() {
                if !(c.len() == 5 && c.starts_with('E') && c[1..].chars().all(|d| d.is_ascii_digit())) {
                    break;
                }
                let code = Code::parse(c).ok_or_else(|| format!("{name}:{here}: unknown code `{c}`"))?;
                out.push((name.to_string(), target, code, severity));
                words.next();
                n += 1;
            }
            if n == 0 {
                return Err(bad("no code follows it"));
            }
        }
    }
    Ok(out)
}

fn show_key(k: &Key) -> String {
    let sev = match k.3 {
        Severity::Error => "ERROR",
        Severity::Warning => "WARNING",
    };
    format!("{}:{}: {sev} {}", k.0, k.1, k.2)
}

/// Checks one file against its annotations; `Err` describes the difference.
fn compare(path: &Path, must_fail: bool) -> Result<(), String> {
    let c = check(path)?;
    let expected = c.expected()?;
    let reported = c.reported();
    let mut problems = Vec::new();
    if must_fail && !expected.iter().any(|k| k.3 == Severity::Error) {
        problems.push("the file announces no `// ERROR` (every file of tests/err must)".to_string());
    }
    if !must_fail {
        for k in expected.iter().filter(|k| k.3 == Severity::Error) {
            problems.push(format!(
                "announces an error, but tests/ok files must check: {}",
                show_key(k)
            ));
        }
    }
    for k in expected.difference(&reported) {
        problems.push(format!("expected, not reported:  {}", show_key(k)));
    }
    for k in reported.difference(&expected) {
        problems.push(format!(
            "reported, not expected:  {}  ({})",
            show_key(k),
            c.message_of(k)
        ));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "== {}\n{}\n-- rendered diagnostics:\n{}",
        path.display(),
        problems.join("\n"),
        c.rendered()
    ))
}

fn run_all(paths: &[PathBuf], must_fail: bool) {
    assert!(!paths.is_empty(), "no files to check");
    let failures: Vec<String> = paths.iter().filter_map(|p| compare(p, must_fail).err()).collect();
    eprintln!("checked {} files, {} failed", paths.len(), failures.len());
    if !failures.is_empty() {
        panic!(
            "{} of {} files disagree with their annotations:\n\n{}",
            failures.len(),
            paths.len(),
            failures.join("\n\n")
        );
    }
}

#[test]
fn ok_corpus_checks_clean() {
    let paths = roots("tests/ok");
    assert!(paths.len() >= 15, "the ok corpus has only {} files", paths.len());
    run_all(&paths, false);
}

#[test]
fn err_corpus_reports_exactly_the_annotated_diagnostics() {
    let paths = roots("tests/err");
    assert!(paths.len() >= 45, "the err corpus has only {} files", paths.len());
    run_all(&paths, true);
}

#[test]
fn every_code_is_covered_twice_by_the_err_corpus() {
    // Count the (file, line) places each code is announced, over the whole err corpus.
    let mut count: BTreeMap<Code, usize> = BTreeMap::new();
    for p in roots("tests/err") {
        let c = check(&p).unwrap_or_else(|e| panic!("{e}"));
        for k in c.expected().unwrap_or_else(|e| panic!("{e}")) {
            *count.entry(k.2).or_default() += 1;
        }
    }
    let mut missing = Vec::new();
    for info in CODES {
        let n = count.get(&info.code).copied().unwrap_or(0);
        let excluded = EXCLUDED.iter().any(|(c, _)| *c == info.code);
        if excluded {
            continue;
        }
        if n < 2 {
            missing.push(format!("{} ({}): announced {n} time(s)", info.code, info.name));
        }
    }
    assert!(
        missing.is_empty(),
        "codes covered fewer than twice by tests/err:\n{}",
        missing.join("\n")
    );
    let covered = CODES.iter().filter(|i| count.contains_key(&i.code)).count();
    eprintln!(
        "{covered} of {} codes covered; excluded: {:?}",
        CODES.len(),
        EXCLUDED.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>()
    );
}

#[test]
fn examples_and_stdlib_check_clean() {
    let mut paths = roots("examples");
    paths.extend(roots("stdlib"));
    assert!(
        paths.len() >= 5,
        "expected the example and the four stdlib modules, found {paths:?}"
    );
    let mut failures = Vec::new();
    for p in &paths {
        match check(p) {
            Ok(c) if c.outcome.diagnostics.is_empty() && c.outcome.program.is_some() => {}
            Ok(c) => failures.push(format!("== {}\n{}", p.display(), c.rendered())),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "these files do not check clean:\n\n{}",
        failures.join("\n\n")
    );
}

/// `--set` overrides are not part of a file: the codes they produce are checked here.
#[test]
fn command_line_overrides() {
    let run = |sets: &[&str]| -> Vec<(Code, Severity)> {
        let overrides = sets
            .iter()
            .map(|s| Override::parse(s).unwrap_or_else(|e| panic!("{s}: {e}")))
            .collect();
        let mut sources = SourceMap::new();
        let out = check_path(
            Path::new("tests/ok/moe_forward.hpm"),
            &Options {
                overrides,
                ..Options::default()
            },
            &mut sources,
        );
        out.diagnostics
            .as_slice()
            .iter()
            .map(|d| (d.code, d.severity))
            .collect()
    };
    assert_eq!(
        run(&[
            "tokens=1024",
            "device.link_efficiency=0.5",
            "device.hbm_bandwidth=1.2TB/s"
        ]),
        vec![]
    );
    assert_eq!(run(&["tokns=1024"]), vec![(Code::BadOverride, Severity::Error)]);
    assert_eq!(run(&["tokens=many"]), vec![(Code::BadOverride, Severity::Error)]);
    assert_eq!(
        run(&["device.ub_size=fast"]),
        vec![(Code::BadOverride, Severity::Error)]
    );
    assert_eq!(
        run(&["device.ub_size=1.2GHz"]),
        vec![(Code::UnitMismatch, Severity::Error)]
    );
    assert_eq!(
        run(&["device.ub_sise=1"]),
        vec![(Code::UnknownProfileField, Severity::Error)]
    );
    // Values out of range, also when only the conversion to base units leaves the floats.
    for bad in [
        "device.link_latency=0",
        "device.ranks=-4",
        "device.aic_cores=1.5",
        "device.hbm_bandwidth=1e308TB/s",
        "device.cube_efficiency=2",
    ] {
        assert_eq!(run(&[bad]), vec![(Code::InvalidValue, Severity::Error)], "{bad}");
    }
    // A field no device has, even one that profiles used to carry.
    assert_eq!(
        run(&["device.system_counter=50MHz"]),
        vec![(Code::UnknownProfileField, Severity::Error)]
    );
    // A value that makes the program wrong is reported in the program.
    assert_eq!(run(&["topk=100"]), vec![(Code::BadRouting, Severity::Error)]);
}

/// Representative error files whose rendered diagnostics are snapshotted.
const SNAPSHOTS: &[&str] = &[
    "syntax_unexpected",
    "names_unknown_op",
    "args_routing",
    "dtype_mismatch",
    "shape_mismatch",
    "body_coverage_gap",
    "index_not_affine",
    "engine_elementwise_on_aic",
    "tile_exceeds_ub",
    "tile_exceeds_l0",
    "routing_recv_overflow",
    "device_units",
    "device_range",
    "device_hbm",
    "import_cycle",
];

#[test]
fn snapshots_of_rendered_errors() {
    for name in SNAPSHOTS {
        let path = PathBuf::from(format!("tests/err/{name}.hpm"));
        let c = check(&path).unwrap_or_else(|e| panic!("{e}"));
        insta::assert_snapshot!(*name, c.rendered());
    }
}

#[test]
fn annotation_parser() {
    let text = "a // ERROR E0201\nb // ERROR E0301 E0201 more text\n// ERROR@+1 E0103\nc\n// WARNING@1 E0205\n";
    let got = parse_annotations("f", text).expect("well-formed");
    let want: Vec<Key> = vec![
        ("f".into(), 1, Code::UnknownName, Severity::Error),
        ("f".into(), 2, Code::WrongArgCount, Severity::Error),
        ("f".into(), 2, Code::UnknownName, Severity::Error),
        ("f".into(), 4, Code::Unterminated, Severity::Error),
        ("f".into(), 1, Code::UnusedValue, Severity::Warning),
    ];
    assert_eq!(got, want);
    assert!(parse_annotations("f", "x // ERROR\n").is_err());
    assert!(parse_annotations("f", "x // ERROR E9999\n").is_err());
    assert!(parse_annotations("f", "x // ERROR@-5 E0201\n").is_err());
    assert!(parse_annotations("f", "x // ERRORS E0201\n").is_err());
}
