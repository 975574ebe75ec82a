//! The `hpmoe` command on hostile surroundings: stdout a full disk or a pipe closed early,
//! source files that are not regular files, inputs that flood the diagnostics, and bad
//! command-line values. Every case ends with a diagnostic or quietly, never with a panic or
//! a hang.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("robust-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn hpmoe() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hpmoe"));
    c.current_dir(root()).env("NO_COLOR", "1");
    c
}

/// Waits for a child; kills it and fails if it has not ended after a long time (a hang
/// detector: the commands tested end in well under a second).
fn wait_bounded(mut child: Child, what: &str) -> (ExitStatus, String) {
    for _ in 0..600 {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return (status, err);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("`{what}` did not end");
}

const FILE: &str = "examples/geglu.hpm";
const LAYER: &str = "examples/deepseek_v3_layer.hpm";
const SMALL_LAYER: [&str; 8] = [
    "--set",
    "tokens=256",
    "--set",
    "hidden=512",
    "--set",
    "inter=256",
    "--set",
    "experts=32",
];

/// Every subcommand that prints on stdout, with arguments that make it print.
fn printing_commands(dir: &Path) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let out = dir.join("sweep-out").display().to_string();
    let mut scale = s(&["scale", LAYER, "--values", "2"]);
    scale.extend(s(&SMALL_LAYER));
    vec![
        s(&["check", FILE]),
        s(&["check", FILE, "--format", "json"]),
        s(&["check", "tests/err/shape_mismatch.hpm", "--format", "json"]),
        s(&["lower", FILE]),
        s(&["lower", FILE, "--format", "json"]),
        s(&["lower", FILE, "--emit", "routing"]),
        s(&["lower", FILE, "--emit", "routing", "--format", "json"]),
        s(&["lower", FILE, "--emit", "tasks"]),
        s(&["lower", FILE, "--emit", "tasks", "--format", "json"]),
        s(&["lower", FILE, "--emit", "schedule", "--format", "json"]),
        s(&["run", FILE]),
        s(&["run", FILE, "--format", "json"]),
        s(&[
            "sweep",
            FILE,
            "--vary",
            "tokens=64,128",
            "--threads",
            "1",
            "--out",
            &out,
        ]),
        scale,
        s(&["fmt", "--stdout", FILE]),
        s(&["explain"]),
        s(&["explain", "E0501"]),
        s(&["--help"]),
        s(&["--version"]),
        s(&["run", "--help"]),
        s(&["repl", FILE, "--no-timings"]),
    ]
}

fn spawn(args: &[String], stdout: Stdio) -> Child {
    let mut c = hpmoe();
    c.args(args).stdout(stdout).stderr(Stdio::piped());
    if args.first().is_some_and(|a| a == "repl") {
        c.stdin(Stdio::piped());
    } else {
        c.stdin(Stdio::null());
    }
    let mut child = c.spawn().unwrap();
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(b":help\n:show\n:run\n:show tasks\n");
    }
    child
}

#[test]
fn a_full_disk_on_stdout_is_an_error_not_a_panic() {
    let dir = tmp("full");
    for args in printing_commands(&dir) {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let what = args.join(" ");
        let (status, err) = wait_bounded(spawn(&args, Stdio::from(full)), &what);
        assert_eq!(status.code(), Some(1), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(err.contains("cannot write the output"), "{what}: {err}");
    }
}

#[test]
fn a_closed_pipe_on_stdout_ends_quietly() {
    let dir = tmp("pipe");
    for args in printing_commands(&dir) {
        let what = args.join(" ");
        let mut child = spawn(&args, Stdio::piped());
        drop(child.stdout.take());
        let (status, err) = wait_bounded(child, &what);
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_ne!(status.code(), Some(101), "{what}: {err}");
        assert!(!err.contains("cannot write"), "{what}: {err}");
        // The failing diagnostics case exits 1 for its diagnostics; everything else succeeds.
        if !what.contains("tests/err/") {
            assert_eq!(status.code(), Some(0), "{what}: {err}");
        }
    }
}

/// Runs `hpmoe ARGS` with `stdin` as its input; returns its status and stderr, failing if it
/// does not end.
fn run_bounded(args: &[&str], stdin: &str) -> (ExitStatus, String) {
    let mut child = hpmoe()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(mut i) = child.stdin.take() {
        use std::io::Write;
        let _ = i.write_all(stdin.as_bytes());
    }
    wait_bounded(child, &args.join(" "))
}

#[test]
fn sources_that_are_not_regular_files_are_refused() {
    let dir = tmp("special");
    let fifo = dir.join("fifo.hpm");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Larger than the source limit, without using the disk (a sparse file).
    let huge = dir.join("huge.hpm");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(hpmoe_dsl_source_limit() + 1)
        .unwrap();
    let fifo = fifo.display().to_string();
    let huge = huge.display().to_string();
    for path in [fifo.as_str(), "/dev/zero", huge.as_str(), "/tmp"] {
        let load = format!(":load {path}\n");
        for (args, stdin) in [
            (vec!["fmt", path], ""),
            (vec!["fmt", "--check", path], ""),
            (vec!["fmt", "--stdout", path], ""),
            (vec!["check", path], ""),
            (vec!["run", path], ""),
            (vec!["repl", path], ""),
            (vec!["repl"], load.as_str()),
        ] {
            let (status, err) = run_bounded(&args, stdin);
            let what = format!("{} <<< {stdin}", args.join(" "));
            assert_eq!(status.code(), Some(1), "{what}: {err}");
            assert!(err.contains("cannot read"), "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
    }
}

/// The checker's limit on the size of a source file (64 MiB).
fn hpmoe_dsl_source_limit() -> u64 {
    64 << 20
}

#[test]
fn fmt_bounds_the_syntax_errors_it_prints() {
    let dir = tmp("many-errors");
    let bad = dir.join("bad.hpm");
    let text: String = (0..20_000).map(|i| format!("param x{i} = = ;\n")).collect();
    std::fs::write(&bad, text).unwrap();
    let bad = bad.display().to_string();
    for args in [
        vec!["fmt", &bad],
        vec!["fmt", "--check", &bad],
        vec!["fmt", "--stdout", &bad],
    ] {
        let (status, err) = run_bounded(&args, "");
        let what = args.join(" ");
        assert_eq!(status.code(), Some(1), "{what}");
        // The same bound and the same closing lines as `hpmoe check`.
        assert!(err.contains("... and 19800 more errors not shown"), "{what}");
        assert!(err.ends_with("20000 errors, 0 warnings\n"), "{what}");
        assert_eq!(
            err.matches("\nE").count() + usize::from(err.starts_with('E')),
            200,
            "{what}"
        );
    }
}

#[test]
fn invalid_utf8_is_reported_with_its_position() {
    let d = tmp("utf8");
    let f = d.join("bad.hpm");
    std::fs::write(&f, b"param a = 1;\nparam b = \xff\xfe 2;\n").unwrap();
    for cmd in ["check", "fmt", "run"] {
        let out = hpmoe().arg(cmd).arg(&f).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
        // The renderer may wrap the message: compare its words.
        let err = err
            .split_whitespace()
            .filter(|w| *w != "|")
            .collect::<Vec<_>>()
            .join(" ");
        // Line 2, column 11 is the first byte that is not UTF-8 (byte 23 of the file).
        assert!(
            err.contains("invalid UTF-8 at line 2, column 11 (byte 23, 0xff)"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("check the path"), "{cmd}: {err}");
    }
}

/// The corpus files of a directory (not its subdirectories, which hold imported modules).
fn hpm_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "hpm"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_corpus_is_checked_under_a_memory_cap() {
    // Every program of the corpus and every example, checked by the binary with its address
    // space capped at 4 GiB (`prlimit`, util-linux) and a time limit: each ends with its
    // expected exit code, never with a signal (an out-of-memory abort, a stack overflow) or a
    // panic message.
    let mut cases: Vec<(PathBuf, i32)> = hpm_files("tests/err").into_iter().map(|p| (p, 1)).collect();
    cases.extend(hpm_files("tests/ok").into_iter().map(|p| (p, 0)));
    cases.extend(hpm_files("examples").into_iter().map(|p| (p, 0)));
    assert!(cases.len() > 50, "the corpus was found ({} files)", cases.len());
    for (file, want) in cases {
        let (status, err) = capped(&["check".as_ref(), file.as_os_str()]);
        assert_eq!(status.code(), Some(want), "check {}: {status:?}\n{err}", file.display());
        assert!(!err.contains("panicked"), "check {}: {err}", file.display());
    }
}

/// Counts and names given twice or past their bounds are usage errors (exit 2) before any
/// work: a thread count past 256 would exhaust memory on stacks alone, a second `--set` of
/// one name would leave a value silently unused.
#[test]
fn out_of_bound_counts_and_repeated_options_are_usage_errors() {
    let file = root().join("examples/swiglu_add.hpm").display().to_string();
    let out = tmp("bounds").join("sweep").display().to_string();
    for args in [
        vec!["run", file.as_str(), "--jobs", "1000000000"],
        vec!["run", file.as_str(), "--jobs", "257"],
        vec!["tune", file.as_str(), "--jobs", "100000"],
        vec![
            "sweep",
            file.as_str(),
            "--vary",
            "rows=64",
            "--threads",
            "4096",
            "--out",
            out.as_str(),
        ],
        vec!["check", file.as_str(), "--set", "rows=64", "--set", "rows=128"],
    ] {
        let (status, err) = run_bounded(&args, "");
        assert_eq!(status.code(), Some(2), "{}: {err}", args.join(" "));
        assert!(
            err.contains("256") || err.contains("twice"),
            "{}: {err}",
            args.join(" ")
        );
    }
}

/// Options that would be ignored, outputs written over the program or over each other, and
/// option values that name nothing are usage errors (exit 2) before any work; the program
/// file is left as it was.
#[test]
fn ignored_conflicting_and_self_overwriting_options_are_usage_errors() {
    let dir = tmp("conflicts");
    let file = dir.join("prog.hpm");
    let text = std::fs::read_to_string(root().join("examples/swiglu_add.hpm")).unwrap();
    std::fs::write(&file, &text).unwrap();
    let f = file.display().to_string();
    let same = dir.join("same.out").display().to_string();
    let same_again = format!("{}/./same.out", dir.display());
    let tuned_over_program = format!("{}/./prog.hpm", dir.display());
    let not_a_dir = f.clone();
    let missing = dir.join("no/such/dir").display().to_string();
    let d = dir.display().to_string();
    let d_slash = format!("{d}/");
    for (args, says) in [
        (vec!["run", &f, "--trace", &f], "is the program itself"),
        (vec!["run", &f, "--gantt", &tuned_over_program], "is the program itself"),
        (
            vec!["run", &f, "--trace", &same, "--gantt", &same_again],
            "is also the file of --trace",
        ),
        (
            vec!["tune", &f, "--budget", "1", "-o", &tuned_over_program],
            "is the program itself",
        ),
        (
            vec!["run", &f, "--policy", "interleaved", "--compare", "interleaved"],
            "compare two different",
        ),
        (vec!["run", &f, "--seed", "3"], "--numerics"),
        (vec!["run", &f, "--numerics-memory", "64"], "--numerics"),
        (vec!["run", &f, "--trace-window", "0..1"], "--trace"),
        (vec!["run", &f, "--trace-ranks", "0"], "--trace"),
        (
            vec!["lower", &f, "--policy", "interleaved"],
            "applies to `--emit tasks`",
        ),
        (
            vec!["lower", &f, "--emit", "routing", "--taskflow", "nosuch"],
            "applies to `--emit tasks`",
        ),
        (vec!["lower", &f, "--no-verify"], "applies to `--emit tasks`"),
        (vec!["fmt", "--check", "--stdout", &f], "cannot be used with"),
        (vec!["explain", "--list", "E0501"], "cannot be used with"),
        (vec!["scale", &f, "--param", "rows", "--values", "64,64"], "twice"),
        (vec!["check", &f, "--allow-path", &not_a_dir], "is not a directory"),
        (vec!["check", &f, "--allow-path", &missing], "does not exist"),
        (
            vec!["run", &f, "--allow-path", &d, "--allow-path", &d_slash],
            "given twice",
        ),
        (vec!["repl", &f, "--allow-path", &missing], "does not exist"),
    ] {
        let (status, err) = run_bounded(&args, "");
        let what = args.join(" ");
        assert_eq!(status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
    }
    // `:trace` in the REPL over the loaded program is refused too.
    let (status, err) = run_bounded(&["repl", &f, "--no-timings"], &format!(":run\n:trace {f}\n"));
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("is the program itself"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        text,
        "the program is unchanged"
    );
    assert!(!dir.join("same.out").exists());
}

/// A sweep grid and a scaling study are sized from their options before anything is
/// listed or run: past their bounds they are usage errors that name the factors.
#[test]
fn sweep_grids_and_scale_runs_are_bounded_before_they_start() {
    let file = root().join("examples/swiglu_add.hpm").display().to_string();
    let out = tmp("grid").join("out").display().to_string();
    let values = |n: usize| (0..n).map(|i| (64 + i).to_string()).collect::<Vec<_>>().join(",");
    let (rows, inter) = (format!("rows={}", values(1000)), format!("inter={}", values(1000)));
    let (status, err) = run_bounded(&["sweep", &file, "--vary", &rows, "--vary", &inter, "--out", &out], "");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("more than 1048576 points (1000 values of `rows` x 1000 values of `inter` x 3 policies)"),
        "{err}"
    );
    let many = values(300);
    let (status, err) = run_bounded(&["scale", &file, "--param", "rows", "--values", &many], "");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("300 values x --repeat 1 is 300 runs, more than 256"),
        "{err}"
    );
}

/// A part file that is not a regular file (a FIFO named like one) is refused, not read
/// forever.
#[test]
fn merging_a_part_that_is_not_a_regular_file_is_an_error() {
    let dir = tmp("merge-fifo");
    let fifo = dir.join("tune-part-0-of-1.json");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let file = root().join("examples/swiglu_add.hpm").display().to_string();
    let d = dir.display().to_string();
    let o = dir.join("t.hpm").display().to_string();
    let (status, err) = run_bounded(&["tune", &file, "--merge", &d, "-o", &o], "");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
}

/// The binary with `args`, its address space capped at 4 GiB (`prlimit`, util-linux) and a
/// time limit: its exit status and stderr.
fn capped(args: &[&std::ffi::OsStr]) -> (ExitStatus, String) {
    let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("prlimit (util-linux) is needed by this test");
    let child = Command::new(prlimit)
        .arg("--as=4294967296")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_hpmoe"))
        .args(args)
        .current_dir(root())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let what: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
    wait_bounded(child, &what.join(" "))
}

/// `hpmoe run` of a program under the cap ([`capped`]), two jobs side by side if they fit,
/// kernel by kernel (one schedule each).
fn run_capped(dir: &Path, source: &str) -> (ExitStatus, String) {
    let file = dir.join("p.hpm");
    std::fs::write(&file, source).unwrap();
    let args = ["run", "--jobs", "2", "--policy", "kernel_by_kernel"];
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    all.push(file.as_os_str());
    capped(&all)
}

/// A dispatch and combine of `tokens` rows per rank on 4 ranks (top-2, 64 columns), tiled
/// `tile` rows a task: few tasks, many routed rows.
fn routed_rows(tokens: u64, tile: u64, taskflows: &[&str]) -> String {
    let mut s = format!(
        "import std::moe::{{dispatch, combine}};\nimport std::device::ascend_a3;\n\
         param tokens = {tokens};\ndevice = ascend_a3 {{ ranks: 4 }};\n\
         route r = balanced(experts: 8, topk: 2);\n"
    );
    for name in taskflows {
        s += &format!(
            "taskflow {name}(x: bf16[tokens, 64]) -> bf16[tokens, 64] {{\n    \
             let xd = dispatch(x, r) tile(t: {tile});\n    \
             return combine(xd, r) tile(m: {tile});\n}}\n"
        );
    }
    s
}

/// Memory that grows with routed rows rather than tasks stays within the cap: two taskflows
/// of a million tokens per rank each (8 M rows sent and 8 M put back, 125 K tasks) run side
/// by side (their estimates fit together); a taskflow whose rows put back alone would pass
/// the cap is refused with its estimate before it is lowered. Neither ends with a signal (an
/// out-of-memory abort).
#[test]
fn routed_rows_count_against_the_memory_limit() {
    let dir = tmp("routed-rows");
    let (status, err) = run_capped(&dir, &routed_rows(1_000_000, 128, &["a", "b"]));
    assert_eq!(status.code(), Some(0), "{status:?}\n{err}");
    let (status, err) = run_capped(&dir, &routed_rows(4_000_000, 32, &["a"]));
    assert_eq!(status.code(), Some(1), "{status:?}\n{err}");
    // The message, its lines unwrapped.
    let text = err
        .split_whitespace()
        .filter(|w| *w != "|")
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        text.contains("E1201") && text.contains("rows put back to their sources") && text.contains("MiB allowed"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A taskflow its lowering refuses is reported before any other taskflow runs: here the
/// third and fourth of four are over the task limit (the first of them is reported) while
/// the others are large but within it (they would take minutes to simulate, and their
/// results would not be shown).
#[test]
fn a_taskflow_over_the_limits_is_reported_before_the_others_run() {
    let child = hpmoe()
        .args([
            "run",
            "examples/comm_bench.hpm",
            "--set",
            "experts=1000000",
            "--set",
            "ranks=64",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_bounded(child, "run comm_bench.hpm over the task limit");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("E1201") && err.contains("dispatch_int8"), "{err}");
}
