//! No input makes the front end panic: random bytes, random token soups, and mutations of
//! every corpus file (truncation at token boundaries, deletion and duplication of tokens)
//! are lexed, parsed and checked; each must end with a program or with diagnostics.

use hpmoe_dsl::check::{check_text, Options};
use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::token::TokenKind;
use hpmoe_dsl::{FileId, SourceMap};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn corpus() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for dir in ["stdlib", "examples", "tests/ok", "tests/err"] {
        let mut stack = vec![PathBuf::from(dir)];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else { continue };
            let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|e| e == "hpm") {
                    if let Ok(t) = std::fs::read_to_string(&p) {
                        out.push((p, t));
                    }
                }
            }
        }
    }
    out
}

/// Runs the whole front end on a text; returns whether it produced a program.
fn front_end(text: &str, dir: Option<&Path>) -> bool {
    let mut sources = SourceMap::new();
    let out = check_text("input.hpm", text, dir, &Options::default(), &mut sources);
    // Rendering must not panic either.
    for d in out.diagnostics.as_slice() {
        let _ = hpmoe_dsl::diag::render(d, &sources, hpmoe_dsl::diag::RenderStyle::Plain);
        let _ = hpmoe_dsl::diag::to_json(d, &sources);
    }
    assert!(
        out.program.is_some() || out.diagnostics.has_errors(),
        "no program and no error"
    );
    out.program.is_some()
}

/// The byte ranges of a text's tokens.
fn token_ranges(text: &str) -> Vec<(usize, usize)> {
    let (toks, _, _) = tokenize(text, FileId(0));
    toks.iter()
        .filter(|t| t.kind != TokenKind::Eof)
        .map(|t| (t.span.lo as usize, t.span.hi as usize))
        .collect()
}

#[test]
fn corpus_mutations_never_panic() {
    let files = corpus();
    assert!(files.len() >= 10, "the corpus is missing");
    for (path, text) in &files {
        let dir = path.parent();
        let toks = token_ranges(text);
        // Keep the run short on big files: visit about 60 cut points per file.
        let stride = (toks.len() / 60).max(1);
        for (i, &(lo, hi)) in toks.iter().enumerate().step_by(stride) {
            // Truncation after token i.
            front_end(&text[..hi], dir);
            // Deletion of token i.
            let deleted = format!("{}{}", &text[..lo], &text[hi..]);
            front_end(&deleted, dir);
            // Duplication of token i.
            let dup = format!("{}{}{}", &text[..hi], &text[lo..hi], &text[hi..]);
            front_end(&dup, dir);
            let _ = i;
        }
    }
}

#[test]
fn deep_nesting_is_a_diagnostic() {
    for open in ["(", "[", "{", "-"] {
        let depth = 100_000;
        let text = format!("param x = {}1;", open.repeat(depth));
        assert!(!front_end(&text, None));
    }
    let sum = format!(
        "op f<T>(x: T[N]) -> T[N] on aiv {{ out[n] = {}x[n]; }}",
        "sum(k) ".repeat(5000)
    );
    assert!(!front_end(&sum, None));
}

/// A list longer than `MAX_LIST` is E1201 where it passes the limit, whatever the list; one
/// at the limit parses. A `max(...)` group too long to be a list of binders is the function.
#[test]
fn long_lists_are_a_diagnostic() {
    use hpmoe_dsl::syntax::parser::MAX_LIST;
    let limit_error = |text: &str| {
        let mut sources = SourceMap::new();
        let out = check_text("t.hpm", text, None, &Options::default(), &mut sources);
        out.diagnostics
            .as_slice()
            .iter()
            .any(|d| d.code.to_string() == "E1201" && d.message.contains("a list of more than"))
    };
    let over = MAX_LIST + 1;
    for text in [
        format!("param p = min({}1);", "1,".repeat(over - 1)),
        format!("param p = max({}1);", "1,".repeat(over - 1)),
        format!(
            "op e<{}>(x: T[M]) -> T[M] on aiv {{ out[m] = x[m]; }}",
            "T,".repeat(over)
        ),
        format!("{}param a = 1;", "///\n".repeat(over)),
        format!("import std{};", "::a".repeat(over)),
        format!(
            "op e<T>(x: T[M]) -> T[M] on aiv {{ {} out[m] = x[m]; }}",
            "let a = 1;".repeat(over)
        ),
    ] {
        assert!(limit_error(&text), "{}", &text[..60]);
    }
    assert!(!limit_error(&format!("param p = min({}1);", "1,".repeat(MAX_LIST - 1))));
    // A long group after `max` is not read ahead to its end: it is the function.
    let long = format!("param p = max(1, {}1);", "(1),".repeat(5000));
    let mut sources = SourceMap::new();
    let out = check_text("t.hpm", &long, None, &Options::default(), &mut sources);
    assert!(
        out.diagnostics
            .as_slice()
            .iter()
            .any(|d| d.message.contains("positional arguments")),
        "{:?}",
        out.diagnostics.as_slice().first()
    );
}

#[test]
fn huge_literals_are_diagnostics() {
    assert!(!front_end("param x = 99999999999999999999999999;", None));
    assert!(!front_end("param x = 1e999;", None));
    assert!(!front_end("param x = 9223372036854775807 + 1;", None));
    assert!(!front_end("param x = 4294967296 * 4294967296;", None));
}

const FRAGMENTS: &[&str] = &[
    "import",
    "std",
    "::",
    "moe",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ";",
    ":",
    "param",
    "x",
    "=",
    "1",
    "2.5",
    "+",
    "-",
    "*",
    "/",
    "%",
    "op",
    "comm",
    "on",
    "aiv",
    "aic",
    "taskflow",
    "let",
    "return",
    "tile",
    "route",
    "r",
    "balanced",
    "sum",
    "out",
    "put",
    "@",
    "->",
    "<",
    ">",
    "T",
    "bf16",
    "device",
    "ascend_a3",
    "schedule",
    "interleaved",
    "profile",
    "\"f.hpm\"",
    "///doc\n",
    "// c\n",
    "/*",
    "*/",
    "group",
    "in",
    "+=",
    ".",
    "..",
    "m",
    "n",
    "k",
    "N",
    "M",
    "\"",
    "0x",
    "1e",
    "é",
    "`",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        front_end(&text, None);
    }

    #[test]
    fn token_soup_never_panics(idx in proptest::collection::vec(0..FRAGMENTS.len(), 0..120)) {
        let text: Vec<&str> = idx.iter().map(|&i| FRAGMENTS[i]).collect();
        front_end(&text.join(" "), None);
    }
}

/// The codes of the diagnostics of a text's front end.
fn codes(text: &str) -> Vec<String> {
    let mut sources = SourceMap::new();
    let out = check_text("input.hpm", text, None, &Options::default(), &mut sources);
    out.diagnostics.as_slice().iter().map(|d| d.code.to_string()).collect()
}

/// Long flat chains (sums, params defined in reverse order, cycles of params) and the
/// deepest accepted nestings go through the parser, the checker and the formatter on the
/// test thread's stack: each ends with a program, a formatted text or a diagnostic.
#[test]
fn long_flat_chains_are_bounded() {
    // A flat sum longer than the nesting limit: E0106, in check and in fmt.
    for n in [20_000, 50_000] {
        let text = format!("param p = {};", vec!["1"; n].join(" + "));
        let c = codes(&text);
        assert!(c.iter().any(|c| c == "E0106"), "{c:?}");
        assert!(hpmoe_dsl::syntax::fmt::format_source(&text).is_err());
    }
    // Mixed operators, unary minus and products: the same limit.
    let text = format!("param p = {}1;", "2 * -".repeat(10_000));
    assert!(codes(&text).iter().any(|c| c == "E0106"));
    let body = vec!["x[i]"; 20_000].join(" + ");
    let text = format!("op f<T>(x: T[N]) -> T[N] on aiv {{ out[i] = {body}; }}");
    assert!(codes(&text).iter().any(|c| c == "E0106"));
    // Just under the limit: a program, formatted to itself.
    let text = format!("param p = {};\n", vec!["1"; 100].join(" + "));
    assert!(front_end(&text, None));
    let f = hpmoe_dsl::syntax::fmt::format_source(&text).expect("formats");
    assert_eq!(hpmoe_dsl::syntax::fmt::format_source(&f).expect("formats again"), f);
    let nested = format!("param p = {}1{};\n", "(1 + ".repeat(60), ")".repeat(60));
    assert!(front_end(&nested, None));
    assert!(hpmoe_dsl::syntax::fmt::format_source(&nested).is_ok());
    let body = vec!["x[i]"; 100].join(" + ");
    let text = format!(
        "op f<T>(x: T[N]) -> T[N] on aiv {{ out[i] = {body}; }}\ntaskflow t(x: f32[8]) -> f32[8] {{ return f(x); }}\n"
    );
    assert!(front_end(&text, None));
    assert!(hpmoe_dsl::syntax::fmt::format_source(&text).is_ok());
}

#[test]
fn long_param_chains_are_evaluated_without_deep_recursion() {
    let n = 10_000;
    // Defined in reverse dependency order: each param names the next.
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("param p{i} = p{} + 1;\n", i + 1));
    }
    text.push_str(&format!("param p{n} = 1;\n"));
    assert!(front_end(&text, None));
    assert!(hpmoe_dsl::syntax::fmt::format_source(&text).is_ok());
    // A cycle through all of them is one diagnostic, not a stack overflow.
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("param p{i} = p{};\n", (i + 1) % n));
    }
    let c = codes(&text);
    assert!(c.iter().any(|c| c == "E0201"), "{c:?}");
    // Long chains through several names per param, in both orders.
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("param q{i} = max(q{}, 1) + min(q{}, 2);\n", i + 1, i + 1));
    }
    text.push_str(&format!("param q{n} = 1;\n"));
    assert!(front_end(&text, None));
}

/// The rendered diagnostics of a file checked from disk.
fn check_disk(path: &Path, opts: &Options) -> (bool, String, usize) {
    let mut sources = SourceMap::new();
    let out = hpmoe_dsl::check::check_path(path, opts, &mut sources);
    let text: String = out
        .diagnostics
        .as_slice()
        .iter()
        .map(|d| hpmoe_dsl::diag::render(d, &sources, hpmoe_dsl::diag::RenderStyle::Plain))
        .collect();
    (out.program.is_some(), text, sources.files().count())
}

/// A file imported under many names (hard links, `./` prefixes) is read and loaded once;
/// files outside the root's directory are refused without being read, unless allowed.
#[test]
fn imports_are_loaded_once_and_confined() {
    let base = std::env::temp_dir().join(format!("hpmoe-imports-{}", std::process::id()));
    let dir = base.join("prog");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.hpm"), "param width = 8;\n").unwrap();
    let mut root = String::new();
    for i in 0..60 {
        let link = dir.join(format!("link{i}.hpm"));
        #[cfg(unix)]
        std::fs::hard_link(dir.join("lib.hpm"), &link).unwrap();
        #[cfg(not(unix))]
        std::fs::copy(dir.join("lib.hpm"), &link).unwrap();
        if cfg!(unix) {
            root.push_str(&format!(
                "import \"link{i}.hpm\"::{{}};\nimport \"./link{i}.hpm\"::{{}};\n"
            ));
        }
    }
    root.push_str("import \"lib.hpm\"::{width};\nparam w = width;\n");
    std::fs::write(dir.join("root.hpm"), &root).unwrap();
    let (ok, text, files) = check_disk(&dir.join("root.hpm"), &Options::default());
    assert!(ok, "{text}");
    // The root, one copy of the library and the standard modules.
    let std_files = check_disk(&dir.join("lib.hpm"), &Options::default()).2 - 1;
    assert_eq!(files, 2 + std_files);

    // Outside the root's directory: refused, and the content is not quoted.
    let secret = base.join("secret.hpm");
    std::fs::write(&secret, "param leaked_secret_value = 1;\n").unwrap();
    std::fs::write(
        dir.join("out.hpm"),
        "import \"../secret.hpm\";\nparam x = leaked_secret_value;\n",
    )
    .unwrap();
    let (ok, text, _) = check_disk(&dir.join("out.hpm"), &Options::default());
    assert!(!ok);
    assert!(
        text.contains("E1001") && !text.contains("param leaked_secret_value"),
        "{text}"
    );
    for target in ["/etc/passwd", "/proc/self/environ", "../../../../../../etc/hostname"] {
        std::fs::write(dir.join("sys.hpm"), format!("import \"{target}\";\n")).unwrap();
        let (ok, text, _) = check_disk(&dir.join("sys.hpm"), &Options::default());
        assert!(!ok && text.contains("E1001"), "{text}");
        assert!(!text.contains("root:") && !text.contains("PATH="), "{text}");
    }
    // A symbolic link inside the tree that leads outside is outside too.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&secret, dir.join("inside.hpm")).unwrap();
        std::fs::write(dir.join("sym.hpm"), "import \"inside.hpm\";\n").unwrap();
        let (ok, text, _) = check_disk(&dir.join("sym.hpm"), &Options::default());
        assert!(!ok && !text.contains("param leaked_secret_value"), "{text}");
    }
    // `--allow-path` names another directory.
    let opts = Options {
        allow_paths: vec![base.clone()],
        ..Options::default()
    };
    let (ok, text, _) = check_disk(&dir.join("out.hpm"), &opts);
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&base);
}

/// A taskflow that would lower to far more tasks than the limit is refused from an estimate
/// made before any task or chunk is allocated (E1201, naming the estimate and the limit).
#[test]
fn task_limits_are_checked_before_lowering_allocates() {
    let text = "import std::device::ascend_a3;\n\
        device = ascend_a3 { ranks: 4 };\n\
        op scale<T>(x: T[M, N]) -> T[M, N] on aiv tile(m: 1, n: 1) { out[m, n] = x[m, n] * 2.0; }\n\
        taskflow f(x: bf16[32768, 32768]) -> bf16[32768, 32768] { return scale(x) tile(m: 1, n: 1); }\n";
    let mut sources = SourceMap::new();
    let out = hpmoe_dsl::driver::check_text("big.hpm", text, None, &Options::default(), &mut sources);
    let checked = out.checked.expect("checks");
    let tf = checked.select_taskflow("f").expect("a taskflow");
    let spec = checked.select_policy("f", None);
    for max_tasks in [1000, hpmoe_dsl::lower::DEFAULT_MAX_TASKS] {
        let opts = hpmoe_dsl::driver::CompileOptions {
            max_tasks,
            ..Default::default()
        };
        let Err(ds) = checked.compile(tf, &spec, &opts) else {
            panic!("4294967296 tasks were lowered under a limit of {max_tasks}");
        };
        assert_eq!(ds[0].code.to_string(), "E1201");
        assert!(ds[0].message.contains("4294967296") && ds[0].message.contains(&max_tasks.to_string()));
    }
}

/// Under a raised task limit, the memory estimate refuses a graph that would not fit:
/// 16384 x 4096 one-element tiles are 67,108,864 tasks, about 44 GiB at 700 bytes a task,
/// far past the 3 GiB allowed; nothing is lowered.
#[test]
fn memory_is_estimated_before_lowering_allocates() {
    let text = "import std::device::ascend_a3;\n\
        device = ascend_a3 { ranks: 1 };\n\
        op scale<T>(x: T[M, N]) -> T[M, N] on aiv tile(m: 1, n: 1) { out[m, n] = x[m, n] * 2.0; }\n\
        taskflow f(x: bf16[16384, 4096]) -> bf16[16384, 4096] { return scale(x) tile(m: 1, n: 1); }\n";
    let mut sources = SourceMap::new();
    let out = hpmoe_dsl::driver::check_text("big.hpm", text, None, &Options::default(), &mut sources);
    let checked = out.checked.expect("checks");
    let tf = checked.select_taskflow("f").expect("a taskflow");
    let spec = checked.select_policy("f", None);
    let opts = hpmoe_dsl::driver::CompileOptions {
        max_tasks: 100_000_000,
        ..Default::default()
    };
    let Err(ds) = checked.compile(tf, &spec, &opts) else {
        panic!("67108864 tasks were lowered");
    };
    assert_eq!(ds[0].code.to_string(), "E1201");
    assert!(
        ds[0].message.contains("67108864 tasks") && ds[0].message.contains("3072 MiB"),
        "{}",
        ds[0].message
    );
}

#[test]
fn an_error_after_more_warnings_than_are_kept_still_fails_the_check() {
    // 300 unused values (warnings) come before the unknown op of the second taskflow: the
    // list keeps 200 warnings, and the error is kept and fails the check all the same.
    let mut text = String::from(
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 2 };\n\
         op ad<T>(a: T[M, N], b: T[M, N]) -> T[M, N] on aiv { out[m, n] = a[m, n] + b[m, n]; }\n\
         taskflow f(x: f32[16, 16]) -> f32[16, 16] {\n",
    );
    for i in 0..300 {
        text.push_str(&format!("    let s{i} = ad(x, x);\n"));
    }
    text.push_str("    return x;\n}\ntaskflow g(x: f32[16, 16]) -> f32[16, 16] {\n    return nosuch(x);\n}\n");
    let mut sources = SourceMap::new();
    let out = check_text("input.hpm", &text, None, &Options::default(), &mut sources);
    assert!(out.program.is_none(), "the unknown op fails the check");
    assert!(out.diagnostics.has_errors());
    assert_eq!(out.diagnostics.error_count(), 1);
    let ds = out.diagnostics.as_slice();
    assert!(
        ds.iter().any(|d| d.is_error() && d.message.contains("nosuch")),
        "the error is listed"
    );
    assert_eq!(
        ds.iter().filter(|d| !d.is_error()).count(),
        hpmoe_dsl::diag::MAX_DIAGNOSTICS
    );
    let dropped = out.diagnostics.dropped();
    assert_eq!((dropped.errors, dropped.warnings), (0, 100));
    let shown = hpmoe_dsl::diag::render_all(ds, dropped, &sources, hpmoe_dsl::diag::RenderStyle::Plain);
    assert!(
        shown.ends_with("... and 100 more warnings not shown\n1 error, 300 warnings\n"),
        "{}",
        &shown[shown.len() - 200..]
    );
}

#[test]
fn suggestions_for_many_unknown_names_are_bounded() {
    // 6,000 params and 6,000 uses of unknown names that are each one edit from a param: a
    // suggestion for every one would compare every name with every candidate. The checker
    // suggests for the first ones, then reports the rest without a suggestion (and keeps
    // only the first 200 diagnostics, counting the rest).
    let n = 6000;
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!("param p{i} = 1;\n"));
    }
    for i in 0..n {
        text.push_str(&format!("param q{i} = p{i}x + 1;\n"));
    }
    let mut sources = SourceMap::new();
    let out = check_text("input.hpm", &text, None, &Options::default(), &mut sources);
    let diags = out.diagnostics.as_slice();
    assert_eq!(out.diagnostics.error_count(), n, "one error per unknown name");
    assert_eq!(diags.len(), hpmoe_dsl::diag::MAX_DIAGNOSTICS);
    let helped = |d: &hpmoe_dsl::diag::Diagnostic| {
        hpmoe_dsl::diag::to_json(d, &sources)
            .to_string()
            .contains("did you mean")
    };
    assert!(helped(&diags[0]), "the first unknown name gets a suggestion");
    assert!(
        !helped(diags.last().unwrap()),
        "the budget is spent before the last kept name"
    );
    // The same input gives the same diagnostics (the budget counts work, not time).
    let mut sources2 = SourceMap::new();
    let again = check_text("input.hpm", &text, None, &Options::default(), &mut sources2);
    let j1: Vec<String> = diags
        .iter()
        .map(|d| hpmoe_dsl::diag::to_json(d, &sources).to_string())
        .collect();
    let j2: Vec<String> = again
        .diagnostics
        .as_slice()
        .iter()
        .map(|d| hpmoe_dsl::diag::to_json(d, &sources2).to_string())
        .collect();
    assert_eq!(j1, j2);
}

/// Sizes from ordinary to absurd: zero, one, odd, powers of two, past 32 bits, near
/// `i64::MAX`.
const EXTREME: &[u64] = &[
    0,
    1,
    3,
    16,
    128,
    4096,
    1_000_003,
    1 << 31,
    1 << 40,
    (1 << 62) + 1,
    i64::MAX as u64,
];

/// A structurally valid program: an elementwise op whose body nests `depth` unary calls,
/// a chain of `calls` calls of it, then a dispatch, a grouped product and a combine over a
/// routing, with every size, count, tile and device field drawn from [`EXTREME`].
fn extreme_program(v: &[u64], depth: usize, calls: usize, route: usize) -> String {
    let at = |i: usize| v[i % v.len()];
    let (tokens, hidden, experts, topk, ranks, tile) = (at(0), at(1), at(2), at(3), at(4), at(5));
    let cores = at(6);
    let body = format!("{}x[m, n]{}", "silu(".repeat(depth), ")".repeat(depth));
    let kind = ["balanced", "uniform", "zipf", "hotspot"][route % 4];
    let extra = match route % 4 {
        2 => ", s: 1.0, seed: 1",
        3 => ", max_over_mean: 2.0, seed: 1",
        1 => ", seed: 1",
        _ => "",
    };
    let mut flow = String::from("    let y0 = x;\n");
    for i in 0..calls {
        flow.push_str(&format!("    let y{} = act(y{i}) tile(m: {tile});\n", i + 1));
    }
    format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = {tokens};\nparam hidden = {hidden};\nparam experts = {experts};\n\
         device = ascend_a3 {{ ranks: {ranks}, aic_cores: {cores} }};\n\
         route r = {kind}(experts: experts, topk: {topk}{extra});\n\
         op act<T>(x: T[M, N]) -> T[M, N] on aiv {{ out[m, n] = {body}; }}\n\
         taskflow f(x: bf16[tokens, hidden], w: bf16[experts / {ranks}, hidden, hidden]) -> bf16[tokens, hidden] {{\n\
         {flow}    let xd = dispatch(y{calls}, r) tile(t: {tile});\n\
         let h = gmm(xd, w) tile(m: {tile}, n: 16, k: 16);\n\
         return combine(h, r) tile(m: {tile});\n}}\n"
    )
}

proptest! {
    // Each case is checked twice and possibly lowered under a small task limit: keep few.
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, .. ProptestConfig::default() })]

    /// A valid structure with extreme values ends in a compiled graph within the limits or
    /// in diagnostics with codes; the same text gives the same diagnostics.
    #[test]
    fn extreme_programs_end_in_a_graph_or_a_code(
        v in proptest::collection::vec(proptest::sample::select(EXTREME), 7),
        small in proptest::collection::vec(1u64..64, 7),
        mix in any::<u8>(),
        depth in prop_oneof![0usize..8, 100usize..140, 5_000usize..5_001],
        calls in prop_oneof![0usize..3, 200usize..300],
        route in 0usize..4,
    ) {
        // Mix extreme and small values so that some programs get past the checker.
        let vals: Vec<u64> = v.iter().zip(&small).enumerate()
            .map(|(i, (e, s))| if mix >> (i % 8) & 1 == 1 { *e } else { *s })
            .collect();
        let text = extreme_program(&vals, depth, calls, route);
        let mut sources = SourceMap::new();
        let out = hpmoe_dsl::driver::check_text("x.hpm", &text, None, &Options::default(), &mut sources);
        let json = |ds: &[hpmoe_dsl::diag::Diagnostic], s: &SourceMap| -> Vec<String> {
            ds.iter().map(|d| hpmoe_dsl::diag::to_json(d, s).to_string()).collect()
        };
        let first = json(out.diagnostics.as_slice(), &sources);
        let mut sources2 = SourceMap::new();
        let again = hpmoe_dsl::driver::check_text("x.hpm", &text, None, &Options::default(), &mut sources2);
        prop_assert_eq!(&first, &json(again.diagnostics.as_slice(), &sources2));
        let Some(checked) = out.checked else {
            prop_assert!(out.diagnostics.has_errors(), "refused without an error:\n{}", text);
            return Ok(());
        };
        let tf = checked.select_taskflow("f").expect("the taskflow");
        let spec = checked.select_policy("f", None);
        let opts = hpmoe_dsl::driver::CompileOptions { max_tasks: 20_000, verify: true };
        match checked.compile(tf, &spec, &opts) {
            Ok(c) => prop_assert!(c.graph.len() <= 20_000),
            Err(ds) => prop_assert!(!ds.is_empty() && ds.iter().all(|d| d.code.to_string().starts_with('E'))),
        }
    }
}
