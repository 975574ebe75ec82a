//! End-to-end tests of the `hpmoe` command: exit codes, output formats, determinism, and
//! robustness on hostile input.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hpmoe() -> Command {
    let mut c = Command::cargo_bin("hpmoe").unwrap();
    c.current_dir(root()).env("NO_COLOR", "1");
    c
}

fn examples() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "hpm"))
        .map(|p| format!("examples/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    v.sort();
    v
}

#[test]
fn check_passes_on_every_example() {
    for e in examples() {
        hpmoe()
            .args(["check", &e])
            .assert()
            .success()
            .stdout(predicates::str::starts_with("ok:"));
    }
}

#[test]
fn errors_exit_1_and_usage_errors_exit_2() {
    let out = hpmoe()
        .args(["check", "tests/err/shape_mismatch.hpm"])
        .assert()
        .code(1)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("E0501"), "{err}");
    hpmoe().args(["check"]).assert().code(2);
    hpmoe().args(["frobnicate"]).assert().code(2);
    hpmoe()
        .args(["check", "examples/geglu.hpm", "--set", "no_equals_sign"])
        .assert()
        .code(2);
    hpmoe().args(["check", "does/not/exist.hpm"]).assert().code(1);
    hpmoe()
        .args([
            "lower",
            "examples/geglu.hpm",
            "--emit",
            "schedule",
            "--policy",
            "fastest",
        ])
        .assert()
        .code(2);
}

#[test]
fn json_outputs_parse() {
    let out = hpmoe()
        .args(["check", "tests/err/shape_mismatch.hpm", "--format", "json"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["diagnostics"][0]["code"], "E0501");
    assert!(v["diagnostics"][0]["labels"][0]["line"].as_u64().unwrap() > 0);
    for emit in ["ops", "routing", "tasks", "schedule"] {
        let out = hpmoe()
            .args([
                "lower",
                "examples/geglu.hpm",
                "--emit",
                emit,
                "--format",
                "json",
                "--set",
                "tokens=64",
            ])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let _: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{emit}: {e}"));
    }
}

#[test]
fn json_outputs_count_the_diagnostics_left_out() {
    // 300 unused values: the list keeps 200 warnings; the document says 100 were left out.
    // With an unknown op after them, the failed check's document says so too.
    let dir = std::env::temp_dir().join(format!("hpmoe-cli-dropped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from(
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
         op e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }\n\
         taskflow f(x: f32[4, 4]) -> f32[4, 4] {\n",
    );
    for i in 0..300 {
        text.push_str(&format!("    let u{i} = e(x);\n"));
    }
    let ok = dir.join("warned.hpm");
    std::fs::write(&ok, format!("{text}    return e(x);\n}}\n")).unwrap();
    let bad = dir.join("failed.hpm");
    std::fs::write(&bad, format!("{text}    return nosuch(x);\n}}\n")).unwrap();
    let doc = |args: &[&str], code: i32| -> serde_json::Value {
        let out = hpmoe().args(args).assert().code(code).get_output().stdout.clone();
        serde_json::from_slice(&out).unwrap()
    };
    let (ok, bad) = (ok.to_str().unwrap(), bad.to_str().unwrap());
    for args in [
        vec!["check", ok, "--format", "json"],
        vec!["run", ok, "--format", "json"],
    ] {
        let v = doc(&args, 0);
        assert_eq!(v["diagnostics"].as_array().unwrap().len(), 200, "{args:?}");
        assert_eq!(
            v["dropped"],
            serde_json::json!({"errors": 0, "warnings": 100}),
            "{args:?}"
        );
    }
    let v = doc(&["check", bad, "--format", "json"], 1);
    assert_eq!(v["ok"], false);
    assert!(v["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["severity"] == "error"));
    assert_eq!(v["dropped"], serde_json::json!({"errors": 0, "warnings": 100}));
    // Nothing left out: no `dropped` at all.
    let v = doc(&["check", "examples/geglu.hpm", "--format", "json"], 0);
    assert!(v.get("dropped").is_none());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_policy_lowers_every_example() {
    for e in examples() {
        let text = std::fs::read_to_string(root().join(&e)).unwrap();
        for p in ["kernel_by_kernel", "expert_level", "interleaved"] {
            let mut args = vec!["lower", e.as_str(), "--emit", "schedule", "--policy", p];
            // Smaller token counts keep the debug build quick; the shapes stay the example's.
            if text.contains("param tokens") {
                args.extend(["--set", "tokens=64"]);
            }
            hpmoe().args(&args).assert().success();
        }
    }
}

#[test]
fn outputs_are_deterministic() {
    for args in [
        vec![
            "lower",
            "examples/deepseek_v3_ep8_fwd.hpm",
            "--emit",
            "schedule",
            "--format",
            "json",
            "--set",
            "tokens=128",
        ],
        vec![
            "lower",
            "examples/qwen_moe_ep8_bwd.hpm",
            "--emit",
            "tasks",
            "--format",
            "json",
            "--set",
            "tokens=64",
        ],
        vec!["lower", "examples/geglu.hpm", "--emit", "ops", "--format", "json"],
        vec!["check", "tests/err/names_unknown_op.hpm", "--format", "json"],
    ] {
        let a = hpmoe().args(&args).output().unwrap();
        let b = hpmoe().args(&args).output().unwrap();
        assert_eq!(a.stdout, b.stdout, "{args:?}");
        assert_eq!(a.stderr, b.stderr, "{args:?}");
    }
}

#[test]
fn the_task_limit_fails_before_allocating() {
    let out = hpmoe()
        .args([
            "lower",
            "examples/deepseek_v3_ep8_fwd.hpm",
            "--emit",
            "tasks",
            "--max-tasks",
            "1000",
        ])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8_lossy(&out);
    assert!(err.contains("E1201") && err.contains("more than 1000 tasks"), "{err}");
}

/// The numerics of several taskflows, each under its own work limit, are refused together
/// before any starts when their sum is over the limit of a run; one of them alone runs.
#[test]
fn the_numerics_work_of_all_taskflows_is_limited_together() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-numerics-total");
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from(
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
         op mm<T>(x: T[M, K], w: T[K, N]) -> T[M, N] on aic { out[m, n] = sum(k) x[m, k] * w[k, n]; }\n",
    );
    for t in ["f", "g", "h"] {
        text.push_str(&format!(
            "taskflow {t}(x: bf16[512, 600], w: bf16[600, 512]) -> bf16[512, 512] {{ return mm(x, w) tile(m: 128, n: 128, k: 64); }}\n"
        ));
    }
    let file = dir.join("three.hpm");
    std::fs::write(&file, text).unwrap();
    let started = std::time::Instant::now();
    let out = hpmoe()
        .args(["run", file.to_str().unwrap(), "--numerics"])
        .assert()
        .code(1)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("E1201") && err.contains("numerics of 3 taskflows"),
        "{err}"
    );
    assert!(err.contains("--taskflow NAME"), "{err}");
    // Refused before any numerics ran (each takes seconds).
    assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    let out = hpmoe()
        .args([
            "run",
            file.to_str().unwrap(),
            "--taskflow",
            "f",
            "--policy",
            "kernel_by_kernel",
        ])
        .assert()
        .code(0)
        .get_output()
        .clone();
    assert!(!out.stdout.is_empty());
}

#[test]
fn hostile_files_get_diagnostics_not_panics() {
    let dir = std::env::temp_dir().join(format!("hpmoe-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("binary.hpm", (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect()),
        ("deep.hpm", format!("param x = {}1;", "(".repeat(50_000)).into_bytes()),
        ("huge.hpm", b"param x = 123456789012345678901234567890;".to_vec()),
        (
            "truncated.hpm",
            b"taskflow f(x: bf16[4, 4]) -> bf16[4, 4] { let y = add(x, ".to_vec(),
        ),
        ("import_self.hpm", b"import \"import_self.hpm\";".to_vec()),
        ("import_dir.hpm", b"import \".\";".to_vec()),
    ];
    for (name, bytes) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = hpmoe().args(["check", p.to_str().unwrap()]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{name}: a diagnostic");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn explain_and_fmt() {
    let out = hpmoe()
        .args(["explain", "E0501"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(String::from_utf8_lossy(&out).contains("shape-mismatch"));
    hpmoe().args(["explain", "--list"]).assert().success();
    hpmoe().args(["explain", "E9999"]).assert().code(1);
    // The project's own programs are in canonical form.
    let mut files: Vec<String> = Vec::new();
    for dir in ["stdlib", "examples", "tests/ok"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "hpm") {
                files.push(format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()));
            }
        }
    }
    files.sort();
    let mut args = vec!["fmt".to_string(), "--check".to_string()];
    args.extend(files);
    hpmoe().args(&args).assert().success();
}

/// Small sizes for the layer example, so the tests stay quick.
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

#[test]
fn timings_go_to_stderr_and_leave_the_report_unchanged() {
    let mut args = vec!["run", "examples/deepseek_v3_layer.hpm"];
    args.extend(SMALL_LAYER);
    let plain = hpmoe().args(&args).assert().success().get_output().clone();
    args.push("--timings");
    let timed = hpmoe().args(&args).assert().success().get_output().clone();
    assert_eq!(plain.stdout, timed.stdout, "--timings changed the report");
    let err = String::from_utf8_lossy(&timed.stderr);
    assert!(err.starts_with("timings (wall clock"), "{err}");
    for stage in [
        "check",
        "lower",
        "verify graph",
        "schedule",
        "verify schedule",
        "peak RSS",
    ] {
        assert!(err.contains(stage), "no `{stage}` in {err}");
    }
    // The schedule kept among candidates was simulated while they were compared; otherwise
    // it is prepared and simulated after.
    assert!(
        err.contains("candidates") || (err.contains("prepare") && err.contains("simulate")),
        "{err}"
    );
    // Simulated again on its own: the same report, to the byte, and its own stages.
    let mut again = args.clone();
    again.push("--resimulate");
    let resim = hpmoe().args(&again).assert().success().get_output().clone();
    assert_eq!(plain.stdout, resim.stdout, "--resimulate changed the report");
    let err = String::from_utf8_lossy(&resim.stderr);
    assert!(err.contains("prepare") && err.contains("simulate"), "{err}");
    // Jobs run side by side or one at a time: the same report, byte for byte.
    let mut one_at_a_time = args[..args.len() - 1].to_vec();
    one_at_a_time.extend(["--jobs", "1"]);
    let seq = hpmoe().args(&one_at_a_time).assert().success().get_output().clone();
    assert_eq!(plain.stdout, seq.stdout, "--jobs 1 changed the report");
    // A layer this small stays far within the link solves' budget: exact either way.
    let mut exact = args[..args.len() - 1].to_vec();
    exact.push("--exact-links");
    let ex = hpmoe().args(&exact).assert().success().get_output().clone();
    assert_eq!(
        plain.stdout, ex.stdout,
        "--exact-links changed a report within the budget"
    );
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("re-shared"));
    let mut compare = args[..args.len() - 1].to_vec();
    compare.extend(["--compare", "kernel_by_kernel"]);
    let a = hpmoe()
        .args(&compare)
        .arg("--jobs=1")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let b = hpmoe()
        .args(&compare)
        .arg("--jobs=4")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(a, b, "--compare differs between one and four jobs");
    // Both taskflows of the layer are timed.
    assert!(err.contains("moe_ffn under interleaved:"), "{err}");
    assert!(err.contains("moe_ffn_bwd under interleaved:"), "{err}");

    args.extend(["--format", "json"]);
    let out = hpmoe().args(&args).assert().success().get_output().stdout.clone();
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let t = &j["timings"];
    let runs = t["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, report) in runs.iter().zip(j["runs"].as_array().unwrap()) {
        assert_eq!(r["taskflow"], report["taskflow"]);
        assert!(report["link_pacing"].is_null(), "{report}");
        assert!(r["link_solves"]["solves"].as_u64().unwrap() > 0, "{r}");
        assert!(r["tasks"].as_u64().unwrap() > 0);
        assert!(r["edges"].as_u64().unwrap() >= r["counter_entries"].as_u64().unwrap());
        let stages = r["stages_s"].as_object().unwrap();
        let sum: f64 = stages.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((sum - r["total_s"].as_f64().unwrap()).abs() < 1e-6, "{r}");
    }
    assert!(t["total_s"].as_f64().unwrap() >= t["check_s"].as_f64().unwrap());
    if cfg!(target_os = "linux") {
        assert!(t["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    }
    // Without --timings the JSON has no timings.
    let out = hpmoe()
        .args(["run", "examples/geglu.hpm", "--format", "json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(j.get("timings").is_none());
}

#[test]
fn scale_tabulates_every_value_in_its_own_process() {
    let mut args = vec!["scale", "examples/deepseek_v3_layer.hpm", "--values", "2,4"];
    args.extend(SMALL_LAYER);
    args.extend(["--format", "json"]);
    let out = hpmoe().args(&args).assert().success().get_output().stdout.clone();
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(j["param"], "ranks");
    let points = j["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    let tasks = |p: &serde_json::Value, i: usize| p["runs"][i]["tasks"].as_u64().unwrap();
    // Twice the ranks, twice the forward tasks (each rank keeps its tokens); the backward
    // grows too, less than twice (weight-gradient tiles follow the local experts).
    assert_eq!(tasks(&points[1], 0), 2 * tasks(&points[0], 0), "{j}");
    assert!(tasks(&points[1], 1) > tasks(&points[0], 1), "{j}");
    assert_eq!(j["growth"].as_array().unwrap().len(), 2);

    let md_args: Vec<&str> = args[..args.len() - 2]
        .iter()
        .copied()
        .chain(["--format", "markdown"])
        .collect();
    let out = hpmoe().args(&md_args).assert().success().get_output().stdout.clone();
    let md = String::from_utf8_lossy(&out);
    assert!(md.starts_with("| ranks | taskflow | tasks | edges |"), "{md}");
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| 2 |") || l.starts_with("| 4 |"))
            .count(),
        4,
        "{md}"
    );
    assert!(md.contains("| growth | moe_ffn_bwd |"), "{md}");
}

#[test]
fn scale_reports_bad_arguments_and_failed_points() {
    let base = ["scale", "examples/geglu.hpm"];
    let code = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        hpmoe().args(&a).output().unwrap()
    };
    assert_eq!(code(&["--param", "a b"]).status.code(), Some(2));
    assert_eq!(code(&["--values", "1,,2"]).status.code(), Some(2));
    assert_eq!(code(&["--repeat", "0"]).status.code(), Some(2));
    assert_eq!(code(&["--set", "ranks=2"]).status.code(), Some(2));
    // A value the checker refuses fails the study with the point's diagnostics.
    let out = code(&["--param", "ranks", "--values", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ranks=0 failed"), "{err}");
    let out = hpmoe().args(["scale", "no/such/file.hpm"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}

// ---- run: reports, traces, charts, exit codes -------------------------------------------

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn cli_run_reports_and_compares() {
    let out = hpmoe()
        .args([
            "run",
            "examples/deepseek_v3_ep4_fwd.hpm",
            "--set",
            "tokens=256",
            "--format",
            "json",
            "--compare",
            "kernel_by_kernel",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], true);
    assert_eq!(v["runs"].as_array().map(|a| a.len()), Some(2));
    let cmp = &v["comparisons"][0];
    assert_eq!(cmp["base"], "kernel_by_kernel");
    assert_eq!(cmp["other"], "interleaved");
    let speedup = cmp["speedup"].as_f64().expect("speedup");
    let (b, o) = (
        cmp["base_latency_us"].as_f64().unwrap_or(0.0),
        cmp["other_latency_us"].as_f64().unwrap_or(1.0),
    );
    assert!(close(speedup, b / o, 1e-12));
    for key in [
        "latency_us",
        "lower_bound_us",
        "efficiency",
        "phases",
        "per_rank",
        "engines",
        "memory",
        "communication",
    ] {
        assert!(!v["runs"][0][key].is_null(), "missing {key}");
    }
    // Human output: tables.
    let out = hpmoe()
        .args(["run", "examples/deepseek_v3_ep4_fwd.hpm", "--set", "tokens=256"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for s in [
        "Dispatch-to-Combine latency",
        "lower bound",
        "phases (op calls)",
        "per rank",
        "L2 hit rate",
    ] {
        assert!(text.contains(s), "no `{s}` in:\n{text}");
    }
}

#[test]
fn cli_run_writes_traces_and_charts() {
    let dir = std::env::temp_dir().join(format!("hpmoe-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (tr, gt) = (dir.join("t.json"), dir.join("g.svg"));
    let out = hpmoe()
        .args([
            "run",
            "examples/deepseek_v3_ep4_fwd.hpm",
            "--set",
            "tokens=256",
            "--policy",
            "expert_level",
            "--trace-ranks",
            "0,2",
            "--trace-window",
            "0..300",
        ])
        .arg("--trace")
        .arg(&tr)
        .arg("--gantt")
        .arg(&gt)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tr).expect("trace")).expect("trace json");
    let pids: std::collections::BTreeSet<i64> = v["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["pid"].as_i64())
        .collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), vec![0, 2]);
    let svg = std::fs::read_to_string(&gt).expect("chart");
    assert!(svg.contains("rank 0") && svg.contains("rank 2") && !svg.contains("rank 1<"));
    // Slices on one core never overlap once rounded to the trace's nanoseconds (Perfetto would
    // nest them): read ts and dur back as integer nanoseconds.
    let mut per_core: std::collections::BTreeMap<(i64, i64), Vec<(i64, i64)>> = Default::default();
    for e in v["traceEvents"].as_array().expect("events") {
        if e["ph"] == "X" {
            let ns = |k: &str| (e[k].as_f64().expect("number") * 1000.0).round() as i64;
            let key = (e["pid"].as_i64().expect("pid"), e["tid"].as_i64().expect("tid"));
            per_core.entry(key).or_default().push((ns("ts"), ns("ts") + ns("dur")));
        }
    }
    assert!(!per_core.is_empty());
    for (core, mut slices) in per_core {
        slices.sort();
        for w in slices.windows(2) {
            assert!(w[0].1 <= w[1].0, "core {core:?}: {:?} overlaps {:?}", w[0], w[1]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Output paths and sweep axes are checked before any work: exit 2 at once, nothing written.
#[test]
fn bad_output_paths_and_axes_fail_before_any_work() {
    let dir = std::env::temp_dir().join(format!("hpmoe-cli-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("plain");
    std::fs::write(&file, "x").expect("file");
    let d = dir.display().to_string();
    let f = file.display().to_string();
    refused(
        &["run", "examples/geglu.hpm", "--trace", &format!("{d}/no/t.json")],
        2,
        "does not exist",
    );
    refused(&["run", "examples/geglu.hpm", "--gantt", &d], 2, "is a directory");
    refused(
        &["run", "examples/geglu.hpm", "--dump", &format!("{f}/sub")],
        2,
        "is not a directory",
    );
    refused(
        &["sweep", "examples/geglu.hpm", "--vary", "tokens=8", "--out", &f],
        2,
        "not a directory",
    );
    let out = dir.join("sw");
    refused(
        &[
            "sweep",
            "examples/geglu.hpm",
            "--vary",
            "rankz=4,8",
            "--out",
            &out.display().to_string(),
        ],
        2,
        "--vary rankz=4: E1106: the program has no param `rankz`",
    );
    assert!(!out.exists(), "a refused sweep writes nothing");
    refused(
        &[
            "sweep",
            "examples/geglu.hpm",
            "--vary",
            "device.link_latencyy=1us",
            "--out",
            &out.display().to_string(),
        ],
        2,
        "link_latencyy",
    );
    refused(
        &[
            "tune",
            "examples/geglu.hpm",
            "--budget",
            "2",
            "-o",
            &format!("{d}/no/best.hpm"),
        ],
        2,
        "does not exist",
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("file"),
        "x",
        "an existing file is left alone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_man_and_help_describe_the_tool() {
    let text = |args: &[&str]| {
        let o = hpmoe().args(args).output().expect("runs");
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).expect("utf-8")
    };
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let s = text(&["completions", shell]);
        assert!(s.contains("hpmoe") && s.contains("sweep"), "{shell}");
    }
    let man = text(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH hpmoe"),
        "{}",
        &man[..man.len().min(200)]
    );
    assert!(man.contains(".TH hpmoe 1"));
    let help = text(&["run", "--help"]);
    // Every policy and every stdlib device profile is named in the help.
    let stdlib = std::fs::read_to_string(root().join("stdlib/device.hpm")).expect("stdlib");
    let profiles: Vec<&str> = stdlib
        .lines()
        .filter_map(|l| l.strip_prefix("profile "))
        .filter_map(|l| l.split([' ', ':', '{']).next())
        .collect();
    assert!(profiles.len() >= 3, "{profiles:?}");
    for name in profiles
        .iter()
        .copied()
        .chain(["kernel_by_kernel", "expert_level", "interleaved"])
    {
        assert!(help.contains(name), "`run --help` does not name `{name}`");
    }
    assert!(help.contains("The program: a `.hpm` file"), "{help}");
    assert!(
        help.contains("Output: text for people"),
        "--format is described: {help}"
    );
}

#[test]
fn color_is_chosen_by_flag_then_environment() {
    let run = |color: Option<&str>| {
        let mut c = Command::cargo_bin("hpmoe").unwrap();
        c.current_dir(root())
            .env_remove("NO_COLOR")
            .args(["check", "tests/err/args_count.hpm"]);
        if let Some(w) = color {
            c.args(["--color", w]);
        }
        let o = c.output().expect("runs");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(run(Some("always")).contains('\x1b'), "--color always colours a pipe");
    assert!(!run(Some("never")).contains('\x1b'));
    assert!(!run(None).contains('\x1b'), "auto: a pipe gets no colour");
    refused(
        &["check", "tests/ok/imports.hpm", "--color", "sometimes"],
        2,
        "sometimes",
    );
}

#[test]
fn cli_run_errors_have_exit_codes() {
    let code = |args: &[&str]| hpmoe().args(args).output().expect("runs").status.code();
    assert_eq!(
        code(&["run", "examples/geglu.hpm", "--policy", "kernel_by_kernal"]),
        Some(2)
    );
    assert_eq!(code(&["run", "examples/geglu.hpm", "--trace-ranks", "x"]), Some(2));
    assert_eq!(code(&["run", "examples/geglu.hpm", "--trace-window", "5..2"]), Some(2));
    assert_eq!(code(&["run", "examples/geglu.hpm", "--trace-ranks", "9"]), Some(2));
    assert_eq!(code(&["run", "examples/no_such_file.hpm"]), Some(1));
    assert_eq!(code(&["run", "examples/geglu.hpm", "--taskflow", "nope"]), Some(1));
    assert_eq!(
        code(&["run", "examples/geglu.hpm", "--set", "device.link_efficiency=2 GB/s"]),
        Some(1)
    );
    assert_eq!(code(&["run"]), Some(2));
}

/// Runs `hpmoe ARGS`; asserts the exit code and that stderr names `want`; no panic.
fn refused(args: &[&str], code: i32, want: &str) {
    let out = hpmoe().args(args).assert().code(code).get_output().clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn a_routing_override_must_name_a_routing() {
    refused(
        &["check", "examples/geglu.hpm", "--routing", "q=zipf(s: 1.0)"],
        1,
        "no routing `q`",
    );
    refused(
        &["run", "examples/geglu.hpm", "--routing", "q=zipf(s: 1.0)"],
        1,
        "no routing `q`",
    );
    refused(
        &[
            "lower",
            "examples/geglu.hpm",
            "--emit",
            "routing",
            "--routing",
            "nope=uniform()",
        ],
        1,
        "no routing `nope`",
    );
    hpmoe()
        .args(["check", "examples/geglu.hpm", "--routing", "r=zipf(s: 1.0)"])
        .assert()
        .success();
}

#[test]
fn a_routing_override_takes_nothing_after_the_routing() {
    for r in [
        "zipf(s: 1); param evil = 1",
        "r=zipf(s: 1); route other = uniform()",
        "zipf(s: 1) zipf(s: 2)",
    ] {
        let out = hpmoe()
            .args(["check", "examples/geglu.hpm", "--routing", r])
            .assert()
            .code(1)
            .get_output()
            .clone();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--routing"), "{r}: {err}");
    }
}

#[test]
fn an_input_given_twice_is_a_usage_error() {
    refused(
        &["run", "examples/geglu.hpm", "--input", "x=a.npy", "--input", "x=b.npy"],
        2,
        "`x` is given twice",
    );
    refused(
        &[
            "run",
            "examples/geglu.hpm",
            "--input",
            "x=a.npy",
            "--input",
            " x = a.npy",
        ],
        2,
        "`x` is given twice",
    );
}

#[test]
fn an_integer_too_large_is_named_so() {
    for v in [
        "100000000000000000000000",
        "-100000000000000000000000",
        "9_223_372_036_854_775_808",
    ] {
        let set = format!("tokens={v}");
        refused(
            &["check", "examples/geglu.hpm", "--set", &set],
            2,
            "the integer is too large",
        );
    }
    refused(
        &[
            "sweep",
            "examples/geglu.hpm",
            "--vary",
            "tokens=64,100000000000000000000000",
            "--out",
            env!("CARGO_TARGET_TMPDIR"),
        ],
        2,
        "the integer is too large",
    );
}

#[test]
fn warnings_are_part_of_the_json_outputs() {
    // tests/ok/taskflows.hpm checks with exactly one warning: an unused value (E0205).
    let file = "tests/ok/taskflows.hpm";
    let severities = |j: &serde_json::Value| -> Vec<(String, String)> {
        j["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["code"].as_str().unwrap().to_string(),
                    d["severity"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let want = vec![("E0205".to_string(), "warning".to_string())];
    let out = hpmoe().args(["check", file, "--format", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ok"], true);
    assert_eq!(severities(&j), want);
    let out = hpmoe().args(["run", file, "--format", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(severities(&j), want);
    // `lower` keeps stdout for the lowered document and shows the warning on stderr.
    let out = hpmoe().args(["lower", file, "--format", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("E0205"));
}

/// The training layer at a size numerics can run: routed experts and a shared expert.
const TRAIN_SMALL: &[&str] = &[
    "run",
    "examples/deepseek_v3_train_layer.hpm",
    "--set",
    "tokens=16",
    "--set",
    "hidden=32",
    "--set",
    "inter=16",
    "--set",
    "experts=16",
    "--set",
    "ranks=2",
];

#[test]
fn a_layer_reports_forward_backward_and_their_sum_with_saved_activations() {
    let mut args = TRAIN_SMALL.to_vec();
    args.extend(["--numerics", "--format", "json"]);
    let out = hpmoe().args(&args).assert().success().get_output().clone();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let layer = &j["layers"][0];
    assert_eq!(layer["forward"], "moe_layer");
    assert_eq!(layer["backward"], "moe_layer_bwd");
    let (f, b, t) = (
        layer["forward_us"].as_f64().unwrap(),
        layer["backward_us"].as_f64().unwrap(),
        layer["total_us"].as_f64().unwrap(),
    );
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs[0]["latency_us"].as_f64().unwrap(), f);
    assert_eq!(runs[1]["latency_us"].as_f64().unwrap(), b);
    assert!((t - (f + b)).abs() <= 1e-9 * t, "{t} != {f} + {b}");
    let bwd = &j["numerics"][1];
    assert_eq!(bwd["taskflow"], "moe_layer_bwd");
    assert_eq!(bwd["result"]["passed"], true);
    assert_eq!(bwd["result"]["saved_from"]["forward"], "moe_layer");
    let saved: Vec<&str> = bwd["result"]["saved_from"]["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(saved, ["x", "xd", "h", "hs", "w_up", "w_down", "ws_up", "ws_down"]);
    // The router's logits come from the forward: both taskflows run on that routing.
    assert_eq!(
        j["gates"],
        serde_json::json!([{"routing": "r", "taskflow": "moe_layer", "tensor": "z"}])
    );
    assert_eq!(j["numerics"][0]["result"]["passed"], true);
    // The human report has the F+B line.
    let out = hpmoe().args(TRAIN_SMALL).assert().success().get_output().clone();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("layer moe_layer + moe_layer_bwd under interleaved: forward"),
        "{text}"
    );
    assert!(text.contains("= F+B "), "{text}");
}

#[test]
fn an_input_can_name_one_taskflows_argument() {
    let dir = std::env::temp_dir().join(format!("hpmoe-cli-layer-input-{}", std::process::id()));
    let d = dir.display().to_string();
    let mut args = TRAIN_SMALL.to_vec();
    args.extend(["--taskflow", "moe_layer_bwd", "--dump", &d]);
    hpmoe().args(&args).assert().success();
    let dy = format!("moe_layer_bwd.dy={d}/dy.npy");
    let mut args = TRAIN_SMALL.to_vec();
    args.extend(["--numerics", "--input", &dy]);
    let out = hpmoe().args(&args).assert().success().get_output().clone();
    assert!(String::from_utf8_lossy(&out.stdout).contains("inputs from the forward"));
    // A name no taskflow run has is a usage error, with the qualified names.
    let mut args = TRAIN_SMALL.to_vec();
    let bad = format!("moe_layer.dy={d}/dy.npy");
    args.extend(["--input", &bad]);
    refused(&args, 2, "names no input of the taskflows run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_piped_run_prints_no_progress_display() {
    let out = hpmoe()
        .args(["run", "examples/qwen_moe_ep8_fwd.hpm"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    // stderr is a pipe here: the spinner of a terminal run must not appear.
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Dispatch-to-Combine latency"));
}

/// Numerics outside their tolerance are exit 1 with an error on stderr naming the output and
/// its error, and a note when a value overflowed f32.
#[test]
fn failed_numerics_say_why_on_stderr() {
    let dir = std::env::temp_dir().join(format!("hpmoe-numerics-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("overflow.hpm");
    std::fs::write(
        &f,
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
         op e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n] * 1e39; }\n\
         taskflow f(x: f32[64, 64]) -> f32[64, 64] { return e(x); }\n",
    )
    .unwrap();
    let out = hpmoe()
        .args(["run", f.to_str().unwrap(), "--numerics"])
        .assert()
        .code(1)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: numerics of taskflow `f`: `out`"), "{err}");
    assert!(err.contains("overflowed f32"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank named twice in `--trace-ranks` is a usage error; a `--trace-window` that starts
/// after the run is a warning (the trace is written, empty of tasks).
#[test]
fn trace_filters_that_select_nothing_new_are_reported() {
    let dir = std::env::temp_dir().join(format!("hpmoe-trace-filters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tr = dir.join("t.json");
    let tr = tr.to_str().unwrap();
    let out = hpmoe()
        .args(["run", "examples/geglu.hpm", "--trace", tr, "--trace-ranks", "0,0-1"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stderr).contains("names rank 0 twice"));
    let out = hpmoe()
        .args(["run", "examples/geglu.hpm", "--trace", tr, "--trace-window", "1e12.."])
        .assert()
        .success()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: --trace-window starts at"), "{err}");
    assert!(std::path::Path::new(tr).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `check` reports the memory a derived backward's `save` costs. The figures by hand: the
/// balanced routing sends 4096 tokens x top-8 = 32768 rows to each rank; `xd` is bf16
/// [32768, 7168] = 448 MiB, `h` [32768, 4096] = 256 MiB, the recomputed `a` [32768, 2048] =
/// 128 MiB.
#[test]
fn check_reports_what_a_grad_keeps_and_recomputes() {
    let out = hpmoe()
        .args(["check", "examples/deepseek_v3_grad.hpm"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.contains("grad moe_ffn_bwd of moe_ffn: keeps xd 448.0 MiB, h 256.0 MiB (704.0 MiB per rank); recomputes a 128.0 MiB (128.0 MiB per rank not kept)"),
        "{text}"
    );
    let out = hpmoe()
        .args(["check", "examples/deepseek_v3_grad.hpm", "--format", "json"])
        .assert()
        .success();
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let g = &j["grads"][0];
    assert_eq!(g["saved"][0]["bytes_per_rank"], 32768u64 * 7168 * 2);
    assert_eq!(g["recomputed"][0]["tensor"], "a");
}

/// A fresh directory under the system's temporary directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hpmoe-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `fmt --expand-grad` writes the derived backward as ordinary source: the written file has
/// no `grad` left, is formatted, checks, and lowers each taskflow to the same tasks as the
/// original.
#[test]
fn fmt_expand_grad_writes_the_derived_backward_as_source() {
    let dir = scratch("expand");
    let file = dir.join("layer.hpm");
    std::fs::copy(root().join("examples/deepseek_v3_grad.hpm"), &file).unwrap();
    let f = file.to_str().unwrap();
    let printed = hpmoe()
        .args(["fmt", "--expand-grad", "--stdout", f])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let printed = String::from_utf8(printed).unwrap();
    assert!(!printed.contains("= grad("), "{printed}");
    for want in [
        "/// The backward of `moe_ffn`, derived",
        "taskflow moe_ffn_bwd(",
        "let dw_up = gmm_vjp_w(dh, xd)",
        "/// Derived by `grad`: the vector-Jacobian product of `gmm` with respect to `w`.\nop gmm_vjp_w<T>(",
        "comm dispatch_vjp_x<T>(dout: T[r.recv, H], r: route) -> T[r.tokens, H] {",
    ] {
        assert!(printed.contains(want), "{want} not in\n{printed}");
    }
    // --stdout leaves the file; without it, the file is written.
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        std::fs::read_to_string(root().join("examples/deepseek_v3_grad.hpm")).unwrap()
    );
    hpmoe().args(["fmt", "--expand-grad", f]).assert().success();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), printed);
    hpmoe().args(["fmt", "--check", f]).assert().success();
    hpmoe()
        .args(["check", f])
        .assert()
        .success()
        .stdout(predicates::str::starts_with("ok:"));
    for tf in ["moe_ffn", "moe_ffn_bwd"] {
        let lower = |path: &str| {
            let out = hpmoe()
                .args(["lower", path, "--emit", "tasks", "--taskflow", tf])
                .assert()
                .success()
                .get_output()
                .stdout
                .clone();
            String::from_utf8(out).unwrap()
        };
        let (a, b) = (lower("examples/deepseek_v3_grad.hpm"), lower(f));
        assert!(a.contains(" tasks on 8 ranks"), "{a}");
        assert_eq!(a, b, "{tf}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program whose `grad` cannot be derived is reported (exit 1) and left as it is; the
/// option's misuses are usage errors.
#[test]
fn fmt_expand_grad_refuses_a_program_with_errors() {
    let dir = scratch("expand-err");
    let file = dir.join("bad.hpm");
    let text = "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
                op top<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = relu(x[m, n]); }\n\
                taskflow f(x: f32[8, 8]) -> f32[8, 8] { return top(x); }\n\
                taskflow f_bwd = grad(f, wrt: [x]);\n";
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    hpmoe()
        .args(["fmt", "--expand-grad", f])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("E0521"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    hpmoe().args(["fmt", "--expand-grad", "--check", f]).assert().code(2);
    hpmoe().args(["fmt", "--allow-path", "/tmp", f]).assert().code(2);
    hpmoe().args(["fmt", "--expand-grad"]).assert().code(2);
    let _ = std::fs::remove_dir_all(&dir);
}
