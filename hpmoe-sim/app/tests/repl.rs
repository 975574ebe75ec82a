//! Scripted REPL sessions (stdin, not a terminal): every command and its error paths, with
//! insta snapshots of the transcript. Inputs are echoed (`--echo`) and stage timings hidden
//! (`--no-timings`), so a transcript is deterministic; `stages:` lines still say which
//! stages were cached.
//!
//! The interactive tests (completion, multi-line input, history, Ctrl-C, Ctrl-D through a
//! pseudo-terminal) are in `repl/pty.rs`.
//!
//! Most sessions run `hpmoe repl FILE --echo --no-timings` on a script with one file for
//! results and diagnostics (so they interleave as on a terminal); the last tests check the
//! binary's exit codes, options and stream separation.

/// Interactive sessions through a pseudo-terminal.
#[cfg(unix)]
mod pty;

use assert_cmd::Command;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};

const EP8: &str = "../../examples/deepseek_v3_ep8_fwd.hpm";
const SMALL: &str = "tests/repl_fixtures/small.hpm";

/// Runs a script on `hpmoe repl [file] --echo --no-timings`, with stdout and stderr written
/// to one file (results and diagnostics in the order they were printed); returns the
/// transcript and the exit code.
fn session(file: Option<&str>, script: &str) -> (String, i32) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("repl-sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!(
        "{}-{}.txt",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let log = std::fs::File::create(&path).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hpmoe"));
    cmd.arg("repl");
    cmd.args(file);
    cmd.args(["--echo", "--no-timings"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env_remove("HPMOE_REPL_NO_TIMINGS")
        .env_remove("HPMOE_REPL_ECHO")
        .stdin(Stdio::piped())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut child = cmd.spawn().expect("the hpmoe binary runs");
    if let Some(mut stdin) = child.stdin.take() {
        // A session that quits early stops reading: a broken pipe is not an error here.
        let _ = stdin.write_all(script.as_bytes());
    }
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    (text, status.code().expect("an exit code, not a signal"))
}

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn set_and_rerun_the_ep8_example_redoes_only_affected_stages() {
    let (out, code) = session(
        Some(EP8),
        ":set tokens = 64
:show params
:run
:run
:set tokens = 128
:set tokens = 64
:run
:set device.link_latency = 2 us
:run
:set policy = expert_level
:run
:unset device.link_latency
:run
:set policy = default
:run interleaved
",
    );
    assert_eq!(code, 0, "{out}");
    // The inputs, the stages (what was cached) and the headline of each report; whole
    // reports are in the other transcripts.
    let brief: Vec<&str> = out
        .lines()
        .filter(|l| {
            [
                "loaded",
                "hpmoe>",
                "stages:",
                "moe_ffn under",
                "  Dispatch-to-Combine",
                "tokens",
                "device.",
                "policy",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .collect();
    insta::assert_snapshot!(brief.join("\n"));
}

#[test]
fn definitions_typed_at_the_prompt() {
    // From an empty session to a running program; a redefinition replaces the old item; a
    // definition that breaks the program is refused; `;` may be left out at the end.
    let (out, code) = session(
        None,
        "import std::moe::{dispatch, gmm, combine};
import std::device::ascend_a3;
param tokens = 64;
param hidden = 256;
param inter = 128;
param experts = 16;
param topk = 4;
param ranks = 4
device = ascend_a3 { ranks: ranks };
route r = uniform(experts: experts, topk: topk, seed: 3);
/// GeGLU: gelu(gate) * up.
/// (typed at the prompt)
op geglu<T>(h: T[M, 2 * N]) -> T[M, N] on aiv tile(m: 64) {
    out[m, n] = gelu(h[m, n]) * h[m, n + N];
}
taskflow moe(
    x: bf16[tokens, hidden],
    w_up: bf16[experts / ranks, hidden, 2 * inter],
    w_down: bf16[experts / ranks, inter, hidden],
) -> bf16[tokens, hidden] {
    let xd = dispatch(x, r) tile(t: 64);
    let h = gmm(xd, w_up) tile(m: 64, n: 128);
    let a = geglu(h) tile(m: 32);
    let y = gmm(a, w_down) tile(m: 64, n: 128);
    return combine(y, r) tile(m: 64);
}
:run
param tokens = 128;
:show params
op geglu<T>(h: T[M, 2 * N]) -> T[M, N] on aic { out[m, n] = h[m, n]; }
:show ops geglu
schedule moe = kernel_by_kernel;
:show config
:run
:set tokens = 32
param tokens = 96;
:show source
",
    );
    assert_eq!(code, 1, "the refused definition fails: {out}");
    insta::assert_snapshot!(out);
}

#[test]
fn views_show_and_explain() {
    let (out, code) = session(
        Some(SMALL),
        ":show
:show params
:show ops
:show ops gmm
:show routing
:show device
:show tasks limit=5
:show tasks call=h rank=1
:show tasks engine=aiv rank=0 limit=3
:show queue 0 aic0
:show queue 1 aiv3 limit=2
:explain
:explain 7
:explain last all
:show source
",
    );
    assert_eq!(code, 0, "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn run_policies_and_compare() {
    let (out, code) = session(
        Some(SMALL),
        ":compare kernel_by_kernel interleaved
:compare expert_level interleaved
:run kernel_by_kernel
:show tasks limit=3
:explain
:set routing = hotspot(max_over_mean: 2)
:show routing
:run
:set device = ascend_910b3
:show config
",
    );
    assert_eq!(code, 0, "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn trace_gantt_and_dump_write_files() {
    let dir = tmp("repl-outputs");
    let d = dir.display().to_string();
    let (out, code) = session(
        Some(SMALL),
        &format!(
            ":trace {d}/run.json
:trace {d}/two.json ranks=0-1 window=10..15
:gantt {d}/run.svg
:gantt {d}/all.svg ranks=0,1,2,3
:set hidden = 64
:set inter = 32
:set tokens = 16
:dump {d}/npy
:set policy = expert_level
:dump {d}/npy_el seed=3 bf16
"
        ),
    );
    assert_eq!(code, 0, "{out}");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert!(
        trace.to_string().contains("traceEvents") || trace.is_array(),
        "not a trace"
    );
    serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(dir.join("two.json")).unwrap()).unwrap();
    for svg in ["run.svg", "all.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(
            text.trim_start().starts_with("<svg") || text.starts_with("<?xml"),
            "{svg}"
        );
    }
    for f in [
        "x.npy",
        "w_up.npy",
        "w_down.npy",
        "out.npy",
        "route_ids.npy",
        "route_weights.npy",
    ] {
        let bytes = std::fs::read(dir.join("npy").join(f)).unwrap();
        assert!(bytes.starts_with(b"\x93NUMPY"), "{f}");
    }
    insta::assert_snapshot!(out.replace(&d, "[TMP]"));
}

#[test]
fn errors_are_reported_and_the_session_goes_on() {
    let dir = tmp("repl-errors");
    let d = dir.display().to_string();
    let (out, code) = session(
        Some(SMALL),
        &format!(
            ":bogus
:s
:set tokenz = 5
:set tokens
:set tokens = 1e999
:set experts = 7
:set policy = fastest
:set taskflow = nope
:set routing = zipf(q: 2)
:set device = ascend_a9
:set device.hbm_bandwidth = 3 parsecs
:unset tokens
:run fastest
:run interleaved extra
:compare interleaved
:show everything
:show params extra
:show ops nope
:show tasks call=zz
:show tasks rank=99
:show tasks engine=gpu
:show tasks limit=many
:show tasks foo=1
:show queue
:show queue 7 aic0
:show queue 0 aiv99
:explain 100000
:explain 1 2 3
:trace
:trace {d}/missing/dir/t.json
:trace {d}/t.json ranks=9
:trace {d}/t.json window=5..1
:gantt {d}/g.svg ranks=x
:dump
:load does-not-exist.hpm
:help nope
param = 3;
tokens * 2
taskflow broken(x: bf16[tokens, hidden]) -> bf16[tokens, hidden] {{ return nope(x); }}
:show config
:run
"
        ),
    );
    assert_eq!(code, 1);
    insta::assert_snapshot!(out.replace(&d, "[TMP]"));
}

/// A setting the checker refuses is quoted as the REPL command that was typed, and the help
/// suggests a REPL command: never the command line's `--set`, `--device` or `--routing`.
#[test]
fn refused_settings_are_worded_as_repl_commands() {
    let (out, code) = session(
        Some(SMALL),
        ":set tokens = abc\n:set device = ascend_a9\n:set device.hbm_bandwidth = fast\n:show params\n",
    );
    assert_eq!(code, 1, "{out}");
    for want in [
        "`:set tokens = abc`: a param takes a number",
        "write e.g. `:set tokens = 1024`",
        "`:set device = ascend_a9`: no such device profile",
        "`:set device.hbm_bandwidth = fast`: expected a number",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    assert!(
        !out.contains("`--set") && !out.contains("`--device"),
        "command-line syntax in:\n{out}"
    );
    assert_eq!(out.matches("note: the setting was not applied").count(), 3, "{out}");
    // Nothing was applied: the params are the file's.
    assert!(out.contains("tokens  = 64\n") && !out.contains("(set)"), "{out}");
}

/// Comparing a policy with itself is refused, as `hpmoe run --compare` refuses it.
#[test]
fn compare_with_the_same_policy_is_refused() {
    let (out, code) = session(Some(SMALL), ":compare interleaved interleaved\n");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("compares a policy with itself"), "{out}");
    assert!(!out.contains("latency (us)"), "{out}");
}

#[test]
fn an_option_given_twice_is_refused_not_the_last_taken() {
    let dir = tmp("repl-twice");
    let d = dir.display();
    for (line, opt) in [
        (":show tasks limit=1 limit=2".to_string(), "limit="),
        (":show tasks rank=0 rank=0".to_string(), "rank="),
        (format!(":trace {d}/t.json ranks=0 ranks=0"), "ranks="),
        (format!(":gantt {d}/g.svg window=0..5 window=1..2"), "window="),
        (format!(":dump {d}/n seed=1 seed=2"), "seed="),
        (format!(":dump {d}/n bf16 bf16"), "bf16"),
        (":explain 0 all all".to_string(), "all"),
    ] {
        let (out, code) = session(Some(SMALL), &format!(":run\n{line}\n"));
        assert_eq!(code, 1, "{line}\n{out}");
        assert!(out.contains(&format!("`{opt}` is given twice")), "{line}\n{out}");
    }
    assert!(!dir.join("n").exists(), "nothing was dumped");
    // `:quit` with words after it is a mistake, not a way out.
    let (out, code) = session(Some(SMALL), ":quit now\n:show params\n");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("`:quit` takes no arguments"), "{out}");
    assert!(out.contains("tokens"), "the session went on: {out}");
}

#[test]
fn numerics_memory_limit_is_an_error_not_a_crash() {
    let dir = tmp("repl-big");
    let (out, code) = session(Some(EP8), &format!(":dump {}\n:show config\n", dir.display()));
    assert_eq!(code, 1);
    insta::assert_snapshot!(out.replace(&dir.display().to_string(), "[TMP]"));
}

#[test]
fn help_lists_and_explains_every_command() {
    let mut script = String::from(":help\n");
    for c in [
        "load", "set", "unset", "show", "run", "compare", "explain", "trace", "gantt", "dump", "help", "quit",
    ] {
        script.push_str(&format!(":help {c}\n"));
    }
    script.push_str(":h :q\n:?\n");
    let (out, code) = session(None, &script);
    assert_eq!(code, 0, "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn multi_line_input_follows_the_parser() {
    // An open bracket continues the input; a `///` line documents the next item; a script
    // that ends inside a bracket reports what is missing.
    let (out, code) = session(
        Some(SMALL),
        "/// Twice the input.
op twice<T>(
    x: T[M, N],
) -> T[M, N] on aiv {
    /* a comment
       over two lines */
    out[m, n] = x[m, n] * 2.0;
}
:show ops twice
// a comment alone does nothing

param inter = (
    64 +
    64
);
:show params
op unfinished<T>(x: T[M]) -> T[M] on aiv {
    out[m] = x[m];
",
    );
    assert_eq!(code, 1, "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn load_reload_and_quit() {
    let (out, code) = session(
        None,
        &format!(
            ":load
:load {SMALL}
:set tokens = 32
param topk = 2;
:load
:show config
:load {EP8}
:show config
:quit
:run
"
        ),
    );
    assert_eq!(code, 1, "the first :load has no file: {out}");
    insta::assert_snapshot!(out);
}

// ---------------------------------------------------------------------- the binary

fn hpmoe() -> Command {
    let mut c = Command::cargo_bin("hpmoe").unwrap();
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env("HPMOE_REPL_NO_TIMINGS", "1")
        .env_remove("HPMOE_REPL_ECHO");
    c
}

#[test]
fn binary_script_exits_0_when_every_command_succeeds() {
    let out = hpmoe()
        .args(["repl", SMALL])
        .write_stdin(":set tokens = 32\n:run\n:explain 3\n")
        .assert()
        .code(0)
        .get_output()
        .clone();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Nothing extra is echoed: no prompts, no inputs.
    assert!(!stdout.contains("hpmoe>"), "{stdout}");
    assert!(!stdout.contains(":run"), "{stdout}");
    assert!(stdout.starts_with("loaded tests/repl_fixtures/small.hpm"), "{stdout}");
    assert!(stdout.contains("Dispatch-to-Combine latency"), "{stdout}");
    assert!(stdout.contains("why task 3 started"), "{stdout}");
    // No timings with HPMOE_REPL_NO_TIMINGS.
    assert!(!stdout.contains(" ms"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn binary_script_exits_1_when_a_command_fails_and_goes_on() {
    let out = hpmoe()
        .args(["repl", SMALL])
        .write_stdin(":set tokenz = 32\n:run\n")
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("E1106") && stderr.contains("did you mean `tokens`?"),
        "{stderr}"
    );
    // The run after the error still happened.
    assert!(stdout.contains("Dispatch-to-Combine latency"), "{stdout}");
}

#[test]
fn binary_quit_stops_reading_and_echo_and_timings_options() {
    let out = hpmoe()
        .args([
            "repl",
            SMALL,
            "--echo",
            "--set",
            "tokens=32",
            "--policy",
            "expert_level",
        ])
        .env_remove("HPMOE_REPL_NO_TIMINGS")
        .write_stdin(":run\n:quit\n:bogus\n")
        .assert()
        .code(0)
        .get_output()
        .clone();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("hpmoe> :run"), "{stdout}");
    assert!(stdout.contains("under expert_level"), "{stdout}");
    assert!(stdout.contains(" ms"), "timings are on by default: {stdout}");
    assert!(!stdout.contains("bogus"), "{stdout}");
}

#[test]
fn binary_bad_options_are_usage_errors() {
    hpmoe()
        .args(["repl", SMALL, "--set", "tokens"])
        .write_stdin("")
        .assert()
        .code(2);
    hpmoe()
        .args(["repl", SMALL, "--policy", "fastest"])
        .write_stdin("")
        .assert()
        .code(2);
    // A file that does not check still starts a session; the script's exit code says so.
    let out = hpmoe()
        .args(["repl", "nope.hpm"])
        .write_stdin(":show config\n")
        .assert()
        .code(1)
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stdout).contains("file: none"));
}

#[test]
fn binary_survives_hostile_input() {
    let mut junk = Vec::new();
    junk.extend_from_slice(b"\xff\xfe:run\n");
    junk.extend_from_slice(b"op (((((((((\n");
    junk.extend_from_slice("\u{0}\u{7}:show tasks call=\u{1F600}\n".as_bytes());
    junk.extend_from_slice(&b"[".repeat(5000));
    junk.extend_from_slice(b"\n:explain -1\n:show queue -1 -1\n:set = \n:set ==\n:load \"\n");
    let out = hpmoe()
        .args(["repl", SMALL])
        .write_stdin(junk)
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn binary_allow_path_reaches_the_sessions_checks() {
    // A program that imports a module from a sibling directory: refused by default, read
    // when `--allow-path` names that directory.
    let d = tmp("allow-path");
    std::fs::create_dir_all(d.join("prog")).unwrap();
    std::fs::create_dir_all(d.join("lib")).unwrap();
    std::fs::write(d.join("lib/sizes.hpm"), "param hidden = 64;\n").unwrap();
    std::fs::write(
        d.join("prog/main.hpm"),
        "import \"../lib/sizes.hpm\";\nparam width = hidden * 2;\n",
    )
    .unwrap();
    let main = d.join("prog/main.hpm");
    let refused = hpmoe()
        .arg("repl")
        .arg(&main)
        .write_stdin(":show params\n")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("outside the program's directory"), "{err}");
    let allowed = hpmoe()
        .arg("repl")
        .arg(&main)
        .arg("--allow-path")
        .arg(d.join("lib"))
        .write_stdin(":show params\n")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&allowed.stdout);
    let err = String::from_utf8_lossy(&allowed.stderr);
    assert_eq!(allowed.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("width") && out.contains("128"), "{out}");
}

#[test]
fn dump_routes_by_the_gate_the_program_computes() {
    let dir = tmp("repl-gate");
    let script = format!(
        ":set tokens=16\n:set hidden=32\n:set inter=16\n:set experts=16\n:set ranks=2\n:set taskflow=moe_layer\n:dump {}\n",
        dir.display()
    );
    let (out, code) = session(Some("../../examples/deepseek_v3_train_layer.hpm"), &script);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("routing r: experts chosen from `moe_layer.z` as the program computes it"),
        "{out}"
    );
    assert!(out.contains("moe_layer under interleaved"), "{out}");
    // The routing the numerics used is dumped: 8 distinct experts per token.
    let ids = hpmoe_dsl::npy::read(&dir.join("route_ids.npy")).unwrap();
    assert_eq!(ids.shape, vec![2, 16, 8]);
    for tok in ids.data.chunks(8) {
        let mut t: Vec<i64> = tok.iter().map(|&e| e as i64).collect();
        t.sort_unstable();
        t.dedup();
        assert!(t.len() == 8 && t.iter().all(|e| (0..16).contains(e)), "{tok:?}");
    }
}

#[test]
fn a_script_of_mistakes_does_not_grow_the_session_or_repeat_itself() {
    // Each definition with an error of its own is refused, so the session stays as it was
    // and each error is printed once; each warning is printed once too, with the definition
    // that brought it, not again with every later one.
    let mut script = String::new();
    for i in 0..40 {
        script.push_str(&format!("param p{i} = nosuch{i};\n"));
    }
    script.push_str("import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n");
    script.push_str("op e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }\n");
    for i in 0..40 {
        script.push_str(&format!(
            "taskflow f{i}(x: f32[4, 4]) -> f32[4, 4] {{ let a = e(x); let b{i} = e(x); return a; }}\n"
        ));
    }
    script.push_str(":show config\n");
    let (out, _) = session(None, &script);
    for i in 0..40 {
        assert_eq!(out.matches(&format!("unknown param `nosuch{i}`")).count(), 1, "{out}");
        assert_eq!(
            out.matches(&format!("`b{i}` is computed but never used")).count(),
            1,
            "{out}"
        );
    }
    assert_eq!(out.matches("the definition was not added").count(), 40, "{out}");
    assert!(!out.contains("defined param p"), "{out}");
    assert!(out.contains("40 taskflows"), "{out}");
}

#[test]
fn a_definition_that_fixes_nothing_in_a_broken_file_is_kept_and_says_what_is_left() {
    // A loaded program with an error: a definition that brings none of its own is added,
    // and the note counts the errors left instead of printing them again.
    let dir = tmp("repl-broken-file");
    let file = dir.join("broken.hpm");
    std::fs::write(&file, "param a = nosuch;\nparam b = alsonot;\n").unwrap();
    let (out, _) = session(
        Some(file.to_str().unwrap()),
        "param c = 1;\nparam d = missing;\nparam nosuch = 2;\n",
    );
    assert!(out.contains("defined param c"), "{out}");
    assert!(out.contains("still has 2 errors from before"), "{out}");
    assert_eq!(out.matches("unknown param `nosuch`").count(), 1, "{out}");
    assert_eq!(out.matches("unknown param `missing`").count(), 1, "{out}");
    assert!(!out.contains("defined param d"), "{out}");
    // Defining the missing name fixes one of the two errors.
    assert!(out.contains("defined param nosuch"), "{out}");
    assert!(out.contains("still has 1 error from before"), "{out}");
}
