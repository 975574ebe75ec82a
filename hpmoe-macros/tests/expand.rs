//! The macro front end against the file front end, on every example, stdlib module and
//! conformance file that Rust can tokenize:
//!
//! - `check_parsed` on the tokens (token-index spans) gives the same program and the same
//!   diagnostics as `check_path` on the file (byte spans), and every diagnostic's span covers
//!   the same bytes once mapped back through the token table;
//! - the expansion of an `ok` file has no `compile_error!`, and the text it embeds checks to
//!   the same program; that of an `err` file has one `compile_error!` per error.

use hpmoe_dsl::check::{check_parsed, check_path, check_text, Options};
use hpmoe_dsl::embed::{expand_with, ExpandOptions};
use hpmoe_dsl::ir::program_text;
use hpmoe_dsl::syntax::parser::Parser;
use hpmoe_dsl::syntax::proc::ProcTokens;
use hpmoe_dsl::{FileId, SourceMap};
use proc_macro2::TokenStream;
use std::path::{Path, PathBuf};
use std::str::FromStr;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hpm"))
        .collect();
    v.sort();
    v
}

/// Whether a file holds a text direction control (U+202A-202E, U+2066-2069). In a comment it
/// is no token, so a macro invocation cannot report it; rustc refuses such characters in
/// comments and literals itself (`text_direction_codepoint_in_comment`, `_in_literal`).
fn has_text_direction_control(text: &str) -> bool {
    text.chars()
        .any(|c| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'))
}

fn corpus() -> Vec<PathBuf> {
    ["examples", "stdlib", "tests/ok", "tests/err"]
        .iter()
        .flat_map(|d| files(d))
        .collect()
}

#[test]
fn check_parsed_agrees_with_check_path() {
    let mut compared = 0;
    for path in corpus() {
        let text = std::fs::read_to_string(&path).unwrap();
        // Files with text that is not Rust tokens (unterminated strings, stray characters).
        let Ok(ts) = TokenStream::from_str(&text) else { continue };
        if has_text_direction_control(&text) {
            continue;
        }
        let mut sm1 = SourceMap::new();
        let o1 = check_path(&path, &Options::default(), &mut sm1);

        let mut sm2 = SourceMap::new();
        let mut toks = ProcTokens::new(ts, FileId(0));
        let canon = std::fs::canonicalize(&path).unwrap();
        sm2.add(path.display().to_string(), Some(canon), toks.text());
        let (ast, parse) = {
            let mut p = Parser::new(&mut toks);
            (p.file(), p.diags)
        };
        let mut diags = std::mem::take(&mut toks.diags);
        diags.extend(parse);
        let o2 = check_parsed(FileId(0), ast, diags, &Options::default(), &mut sm2);

        let name = path.display();
        assert_eq!(
            o1.program.as_ref().map(program_text),
            o2.program.as_ref().map(program_text),
            "{name}"
        );
        let (d1, d2) = (o1.diagnostics.as_slice(), o2.diagnostics.as_slice());
        let show = |ds: &[hpmoe_dsl::Diagnostic]| {
            ds.iter()
                .map(|d| format!("{} {}", d.code, d.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(show(d1), show(d2), "{name}");
        for (a, b) in d1.iter().zip(d2) {
            assert_eq!((&a.help, &a.notes), (&b.help, &b.notes), "{name}: {}", a.message);
            assert_eq!(a.labels.len(), b.labels.len(), "{name}: {}", a.message);
            for (la, lb) in a.labels.iter().zip(&b.labels) {
                assert_eq!(la.message, lb.message, "{name}");
                assert_eq!(la.span.file, lb.span.file, "{name}");
                if la.span.file != FileId(0) {
                    assert_eq!(la.span, lb.span, "{name}");
                    continue;
                }
                // The end of the file: the macro points at the last token instead.
                if la.span.is_empty() && la.span.lo as usize == text.len() {
                    continue;
                }
                let (s, e) = toks.range(lb.span);
                let bytes = (s.byte_range().start as u32, e.byte_range().end as u32);
                assert_eq!(
                    (la.span.lo, la.span.hi),
                    bytes,
                    "{name}: {}: `{}`",
                    a.message,
                    &text[bytes.0 as usize..bytes.1 as usize]
                );
            }
        }
        compared += 1;
    }
    assert!(compared >= 80, "only {compared} files compared");
}

fn expand_file_tokens(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let ts = TokenStream::from_str(&text).ok()?;
    let opts = ExpandOptions {
        dir: path.parent().map(Path::to_path_buf),
        // The forward examples are lowered (this test runs unoptimised); the backward ones,
        // of 100 000 to 520 000 tasks, only checked.
        max_tasks: 100_000,
    };
    Some(expand_with(ts, &opts).to_string())
}

#[test]
fn ok_files_expand_without_errors_and_embed_a_text_that_checks_the_same() {
    let mut checked = 0;
    for path in files("tests/ok").into_iter().chain(files("examples")) {
        let out = expand_file_tokens(&path).unwrap_or_else(|| panic!("{} is not Rust tokens", path.display()));
        assert!(!out.contains("compile_error"), "{}:\n{out}", path.display());
        // The embedded text: the string after `text :`.
        let ts = TokenStream::from_str(&out).unwrap();
        let Some(lit) = find_text_literal(ts) else {
            // A program without taskflows has no handle.
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("taskflow "), "{}:\n{out}", path.display());
            continue;
        };
        let embedded: String = syn_like_unquote(&lit);
        let dir = path.parent().unwrap();
        let mut sm = SourceMap::new();
        let a = check_text("<taskflow!>", &embedded, Some(dir), &Options::default(), &mut sm);
        let mut sm = SourceMap::new();
        let b = check_path(&path, &Options::default(), &mut sm);
        assert!(
            a.diagnostics.as_slice().iter().all(|d| !d.is_error()),
            "{}: {:?}\n{embedded}",
            path.display(),
            a.diagnostics
        );
        assert_eq!(
            a.program.as_ref().map(program_text),
            b.program.as_ref().map(program_text),
            "{}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} files checked");
}

#[test]
fn err_files_expand_to_one_compile_error_per_error() {
    for path in files("tests/err") {
        // A macro invocation is not the file, so importing the file is not a cycle there;
        // and it never sees comments (Rust drops them, and lints their text direction
        // controls itself).
        if path.ends_with("import_self.hpm") || has_text_direction_control(&std::fs::read_to_string(&path).unwrap()) {
            continue;
        }
        let Some(out) = expand_file_tokens(&path) else { continue };
        let mut sm = SourceMap::new();
        let o = check_path(&path, &Options::default(), &mut sm);
        let errors = o.diagnostics.as_slice().iter().filter(|d| d.is_error()).count();
        assert!(errors > 0, "{}", path.display());
        assert_eq!(
            out.matches("compile_error").count(),
            errors,
            "{}:\n{out}",
            path.display()
        );
    }
}

/// The first string literal after the identifier `text` and a `:` in the expansion.
fn find_text_literal(ts: TokenStream) -> Option<String> {
    let trees: Vec<proc_macro2::TokenTree> = ts.into_iter().collect();
    for (i, t) in trees.iter().enumerate() {
        match t {
            proc_macro2::TokenTree::Ident(id) if id == "text" => {
                if let Some(proc_macro2::TokenTree::Literal(l)) = trees.get(i + 2) {
                    return Some(l.to_string());
                }
            }
            proc_macro2::TokenTree::Group(g) => {
                if let Some(l) = find_text_literal(g.stream()) {
                    return Some(l);
                }
            }
            _ => {}
        }
    }
    None
}

/// The value of a string literal as `proc_macro2` prints it (`Literal::string`'s escapes).
fn syn_like_unquote(lit: &str) -> String {
    let inner = &lit[1..lit.len() - 1];
    let mut out = String::new();
    let mut cs = inner.chars();
    while let Some(c) = cs.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match cs.next().unwrap() {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'u' => {
                let hex: String = cs.by_ref().skip(1).take_while(|&c| c != '}').collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
            }
            other => panic!("escape {other}"),
        }
    }
    out
}

#[test]
fn file_errors_are_shown_at_the_path_with_their_place_in_the_file() {
    let opts = ExpandOptions {
        dir: Some(root()),
        ..ExpandOptions::default()
    };
    let out = hpmoe_dsl::embed::expand_file_with(
        TokenStream::from_str("\"tests/err/shape_mismatch.hpm\"").unwrap(),
        &opts,
    )
    .to_string();
    assert_eq!(out.matches("compile_error").count(), 4, "{out}");
    assert!(out.contains("E0501: shape mismatch in `gmm`"), "{out}");
    assert!(
        out.contains("at tests/err/shape_mismatch.hpm:18:20: dimension 1 of `w` is 256"),
        "{out}"
    );
    assert!(out.contains("   | "), "{out}");
    // The handles are still there.
    assert!(out.contains("pub struct F "), "{out}");
    // A missing file, and an argument that is not a path.
    let out = hpmoe_dsl::embed::expand_file_with(TokenStream::from_str("\"no/such.hpm\"").unwrap(), &opts).to_string();
    assert!(out.contains("E1001: cannot read"), "{out}");
    let out = hpmoe_dsl::embed::expand_file_with(TokenStream::from_str("moe").unwrap(), &opts).to_string();
    assert!(out.contains("expected the path of a `.hpm` file"), "{out}");
    // A directory, and a FIFO (opening it would wait for a writer): refused, not read.
    let out = hpmoe_dsl::embed::expand_file_with(TokenStream::from_str("\"tests\"").unwrap(), &opts).to_string();
    assert!(
        out.contains("E1001: cannot read") && out.contains("not a regular file"),
        "{out}"
    );
    #[cfg(unix)]
    {
        let dir = std::env::temp_dir().join(format!("hpmoe-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("f.hpm");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let opts = ExpandOptions {
                dir: Some(dir.clone()),
                ..ExpandOptions::default()
            };
            let out =
                hpmoe_dsl::embed::expand_file_with(TokenStream::from_str("\"f.hpm\"").unwrap(), &opts).to_string();
            assert!(out.contains("not a regular file"), "{out}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn warnings_are_deprecation_warnings_at_their_tokens() {
    let src = "import std::moe::{add, swiglu};\n\
               taskflow f(x: f32[64, 128], y: f32[64, 64]) -> f32[64, 64] {\n\
               let a = swiglu(x);\n let dead = add(a, y);\n return add(a, y);\n}";
    let out = hpmoe_dsl::embed::expand(TokenStream::from_str(src).unwrap()).to_string();
    assert!(!out.contains("compile_error"), "{out}");
    assert!(
        out.contains("deprecated (note = \"E0205: `dead` is computed but never used"),
        "{out}"
    );
}

#[test]
fn the_handle_of_an_empty_or_broken_program() {
    // No taskflow: nothing but the checks.
    let out = hpmoe_dsl::embed::expand(TokenStream::from_str("param x = 1;").unwrap()).to_string();
    assert!(out.trim().is_empty(), "{out}");
    // Two taskflows whose handles would have the same name.
    let src = "import std::moe::{swiglu};\n\
               taskflow moe_ffn(h: bf16[64, 256]) -> bf16[64, 128] { return swiglu(h) tile(m: 16); }\n\
               taskflow moeFfn(h: bf16[64, 256]) -> bf16[64, 128] { return swiglu(h) tile(m: 16); }";
    let out = hpmoe_dsl::embed::expand(TokenStream::from_str(src).unwrap()).to_string();
    assert!(out.contains("would be named like that of `moe_ffn`"), "{out}");
    // Unparsable input still gives the handle of what parsed.
    let src = "import std::moe::{swiglu};\nparam rows 64;\n\
               taskflow act(h: bf16[64, 256]) -> bf16[64, 128] { return swiglu(h) tile(m: 16); }";
    let out = hpmoe_dsl::embed::expand(TokenStream::from_str(src).unwrap()).to_string();
    assert!(out.contains("E0101") && out.contains("pub struct Act "), "{out}");
    // Names defined twice are errors of the language; the handle has them once.
    let src = "import std::moe::{add};\nparam n = 8;\nparam n = 9;\n\
               taskflow f(x: f32[n, 8], x: f32[n, 8]) -> (y: f32[n, 8], y: f32[n, 8]) { return (add(x, x), add(x, x)); }";
    let out = hpmoe_dsl::embed::expand(TokenStream::from_str(src).unwrap()).to_string();
    assert!(out.contains("E0202"), "{out}");
    assert_eq!(out.matches("pub fn n (").count(), 1, "{out}");
    assert_eq!(out.matches("pub x :").count(), 1, "{out}");
    assert_eq!(out.matches("pub y :").count(), 1, "{out}");
}

#[test]
fn the_compile_time_task_limit_from_the_environment_is_a_number_or_an_error() {
    use hpmoe_dsl::embed::{max_tasks_from, MAX_COMPILE_TIME_TASKS};
    use std::ffi::OsStr;
    assert_eq!(max_tasks_from(None), Ok(MAX_COMPILE_TIME_TASKS));
    assert_eq!(max_tasks_from(Some(OsStr::new("0"))), Ok(0));
    assert_eq!(max_tasks_from(Some(OsStr::new(" 5000 "))), Ok(5000));
    for bad in ["", "abc", "-1", "1e6", "18446744073709551616", "5 000"] {
        let e = max_tasks_from(Some(OsStr::new(bad))).unwrap_err();
        assert!(e.contains(&format!("HPMOE_MACRO_MAX_TASKS is `{bad}`")), "{e}");
        assert!(e.contains("not a number of tasks"), "{e}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let e = max_tasks_from(Some(OsStr::from_bytes(b"12\xff"))).unwrap_err();
        assert!(e.contains("not a number of tasks"), "{e}");
    }
}
