//! End-to-end tests of `hpmoe tune` and of sharding `hpmoe sweep` and `hpmoe tune`: the
//! search never returns worse than the file's configuration (as `hpmoe run` measures it), the
//! file it writes runs at the latency it reported, the outputs do not depend on the thread
//! count, merged shards give the unsharded outputs byte for byte, and bad shards and
//! mismatched parts are refused.

use assert_cmd::Command;
use serde_json::Value as J;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hpmoe() -> Command {
    let mut c = Command::cargo_bin("hpmoe").unwrap();
    c.current_dir(root())
        .env("NO_COLOR", "1")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("SLURM_ARRAY_TASK_MIN");
    c
}

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tune-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const FILE: &str = "examples/deepseek_v3_ep8_fwd.hpm";
const SMALL: [&str; 4] = ["--set", "tokens=256", "--set", "experts=16"];

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Out {
    let o = hpmoe().args(args).output().unwrap();
    Out {
        code: o.status.code().unwrap(),
        stdout: String::from_utf8(o.stdout).unwrap(),
        stderr: String::from_utf8(o.stderr).unwrap(),
    }
}

/// `hpmoe tune FILE SMALL --budget B` with `extra`; the best file goes to `best` (a shard,
/// `--shard` in `extra`, writes no best file: `-o` is then not given).
fn tune(best: &Path, budget: &str, extra: &[&str]) -> Out {
    let mut a: Vec<&str> = vec!["tune", FILE];
    a.extend(SMALL);
    a.extend(["--budget", budget]);
    if !extra.contains(&"--shard") {
        a.extend(["-o", best.to_str().unwrap()]);
    }
    a.extend(extra);
    run(&a)
}

/// The latency `hpmoe run` reports for a file under the small shapes.
fn run_latency(file: &str) -> f64 {
    taskflow_latency(file, &[])
}

/// The latency `hpmoe run` reports for the first taskflow run of a file under the small
/// shapes, with `extra` arguments.
fn taskflow_latency(file: &str, extra: &[&str]) -> f64 {
    let mut a = vec!["run", file];
    a.extend(extra);
    a.extend(SMALL);
    a.extend(["--format", "json"]);
    let o = run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: J = serde_json::from_str(&o.stdout).unwrap();
    j["runs"][0]["latency_us"].as_f64().unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn tune_is_no_worse_than_the_file_and_its_file_runs_at_the_reported_latency() {
    let d = dir("best");
    let best = d.join("best.hpm");
    let o = tune(&best, "12", &["--jobs", "2", "--format", "json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: J = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["evaluated"], 12);
    // The file's own configuration, as `hpmoe run` measures it on the original file.
    let own = run_latency(FILE);
    let reported_own = j["file_config"]["latency_us"].as_f64().unwrap();
    assert!(close(own, reported_own), "{own} vs {reported_own}");
    let best_lat = j["best"]["latency_us"].as_f64().unwrap();
    assert!(best_lat <= own, "best {best_lat} is worse than the file's {own}");
    // The top list is sorted and starts with the best.
    let top: Vec<f64> = j["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["latency_us"].as_f64().unwrap())
        .collect();
    assert!(top.windows(2).all(|w| w[0] <= w[1]), "{top:?}");
    assert_eq!(top[0], best_lat);
    assert_eq!(j["improved"], best_lat < own);
    // The written file runs as it is, at the reported latency, and keeps the comments.
    let ran = run_latency(best.to_str().unwrap());
    assert!(
        close(ran, best_lat),
        "the written file runs in {ran} us, tune reported {best_lat}"
    );
    let text = std::fs::read_to_string(&best).unwrap();
    assert!(text.contains("param tokens = 4096; // per rank"), "{text}");
    assert!(text.contains("param ranks = 8; // expert-parallel degree"), "{text}");
    // It is in canonical form.
    let f = run(&["fmt", "--check", best.to_str().unwrap()]);
    assert_eq!(f.code, 0, "{}", f.stdout);
}

#[test]
fn tune_says_whether_it_beat_the_file() {
    let d = dir("verdict");
    let best = d.join("best.hpm");
    // A budget of one is the file's own configuration alone: it is the best evaluated.
    let o = tune(&best, "1", &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("the file's own configuration (")
            && o.stdout.contains("is already the best of the 1 evaluated"),
        "{}",
        o.stdout
    );
    // The file written is the original up to formatting: it runs at the file's latency.
    assert!(close(run_latency(best.to_str().unwrap()), run_latency(FILE)));
}

#[test]
fn tune_is_deterministic_across_runs_and_thread_counts() {
    let d = dir("det");
    let mut outs = Vec::new();
    for jobs in ["1", "2", "2"] {
        let best = d.join("best.hpm");
        let o = tune(&best, "10", &["--jobs", jobs, "--seed", "7"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        outs.push((o.stdout, std::fs::read(&best).unwrap()));
    }
    assert_eq!(outs[0], outs[1], "--jobs 1 and --jobs 2 differ");
    assert_eq!(outs[1], outs[2], "two runs differ");
    // Another seed searches other candidates (the first, the file's own, is the same).
    let o = tune(&d.join("other.hpm"), "10", &["--jobs", "2", "--seed", "8"]);
    assert_eq!(o.code, 0);
    assert_ne!(o.stdout, outs[0].0);
}

#[test]
fn sharded_tune_merged_equals_unsharded() {
    let d = dir("shard");
    let best = d.join("best.hpm");
    let full = tune(&best, "9", &["--format", "json"]);
    assert_eq!(full.code, 0, "{}", full.stderr);
    let full_file = std::fs::read(&best).unwrap();
    for n in [1usize, 2, 3] {
        let mut dirs = Vec::new();
        for i in 0..n {
            let pd = d.join(format!("n{n}-{i}"));
            let shard = format!("{i}/{n}");
            let o = tune(
                &d.join("unused.hpm"),
                "9",
                &["--shard", &shard, "--out-dir", pd.to_str().unwrap()],
            );
            assert_eq!(o.code, 0, "{}", o.stderr);
            assert!(pd.join(format!("tune-part-{i}-of-{n}.json")).exists());
            dirs.push(pd);
        }
        std::fs::remove_file(&best).unwrap();
        let mut a: Vec<String> = vec!["tune".into(), FILE.into(), "--merge".into()];
        a.extend(dirs.iter().map(|p| p.display().to_string()));
        a.extend([
            "-o".into(),
            best.display().to_string(),
            "--format".into(),
            "json".into(),
        ]);
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        let m = run(&args);
        assert_eq!(m.code, 0, "{}", m.stderr);
        assert_eq!(m.stdout, full.stdout, "merged {n} shards differ from the unsharded run");
        assert_eq!(std::fs::read(&best).unwrap(), full_file);
    }
}

/// An option of another mode is refused, not ignored: `--out-dir` without a shard, `--output`
/// with one, and with `--merge` (whose settings come from the parts) the options that make a
/// search or a grid.
#[test]
fn options_of_another_mode_are_refused() {
    let o = run(&["tune", FILE, "--budget", "1", "--out-dir", "/nonexistent/x"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--out-dir"), "{}", o.stderr);
    let o = run(&[
        "tune",
        FILE,
        "--budget",
        "1",
        "--shard",
        "0/2",
        "-o",
        "/nonexistent/x.hpm",
    ]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--output"), "{}", o.stderr);
    let o = run(&["tune", FILE, "--merge", "/nonexistent", "--out-dir", "/nonexistent/x"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    for extra in [
        &["--set", "tokens=64"][..],
        &["--policy", "interleaved"],
        &["--threads", "2"],
        &["--device", "nosuch"],
        &["--routing", "zipf(s: 1.0)"],
        &["--taskflow", "moe_ffn"],
        &["--max-tasks", "1"],
        &["--allow-path", "/"],
    ] {
        let o = run(&[&["sweep", "--merge", "/nonexistent"][..], extra].concat());
        assert_eq!(o.code, 2, "sweep --merge {extra:?}: {}", o.stderr);
        assert!(o.stderr.contains("cannot be used with"), "{}", o.stderr);
    }
}

#[test]
fn bad_shards_are_refused() {
    for s in ["3/3", "0/0", "x/2", "1", "-1/2", "1/2/3"] {
        let arg = format!("--shard={s}");
        let o = run(&["tune", FILE, &arg]);
        assert_eq!(o.code, 2, "tune --shard {s}: {}", o.stderr);
        assert!(o.stderr.contains(&format!("--shard `{s}`")), "{}", o.stderr);
        let o = run(&["sweep", FILE, &arg]);
        assert_eq!(o.code, 2, "sweep --shard {s}: {}", o.stderr);
    }
    let o = run(&["tune", FILE, "--shard", "0/2", "--time", "1"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("--time"), "{}", o.stderr);
    // From a Slurm job array.
    let o = hpmoe()
        .args(["sweep", FILE])
        .env("SLURM_ARRAY_TASK_ID", "4")
        .env("SLURM_ARRAY_TASK_COUNT", "4")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("SLURM_ARRAY_TASK_ID=4"));
    let o = hpmoe()
        .args(["tune", FILE])
        .env("SLURM_ARRAY_TASK_ID", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("SLURM_ARRAY_TASK_COUNT"));
    // A value that is not text is refused, never taken for an unset variable (which would
    // run the whole grid in every task of the array).
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"1\xff");
        for (id, count, min) in [
            (bad, "4".as_ref(), None),
            (bad, bad, None),
            ("1".as_ref(), "4".as_ref(), Some(bad)),
        ] {
            let mut c = hpmoe();
            c.args(["sweep", FILE])
                .env("SLURM_ARRAY_TASK_ID", id)
                .env("SLURM_ARRAY_TASK_COUNT", count);
            if let Some(m) = min {
                c.env("SLURM_ARRAY_TASK_MIN", m);
            }
            let o = c.output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(String::from_utf8_lossy(&o.stderr).contains("is not a non-negative integer"));
        }
    }
}

#[test]
fn a_slurm_array_task_writes_its_part() {
    let d = dir("slurm");
    let o = hpmoe()
        .args(["tune", FILE])
        .args(SMALL)
        .args(["--budget", "4", "--out-dir"])
        .arg(&d)
        .env("SLURM_ARRAY_TASK_ID", "3")
        .env("SLURM_ARRAY_TASK_COUNT", "2")
        .env("SLURM_ARRAY_TASK_MIN", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let part: J = serde_json::from_str(&std::fs::read_to_string(d.join("tune-part-1-of-2.json")).unwrap()).unwrap();
    let idx: Vec<u64> = part["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [1, 3]);
}

#[test]
fn mismatched_parts_are_refused() {
    let d = dir("mismatch");
    let part = |name: &str, shard: &str, budget: &str, extra: &[&str]| {
        let pd = d.join(name);
        let o = tune(
            &d.join("x.hpm"),
            budget,
            &[&["--shard", shard, "--out-dir", pd.to_str().unwrap()], extra].concat(),
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        pd.display().to_string()
    };
    let a0 = part("a0", "0/2", "4", &[]);
    let a1 = part("a1", "1/2", "4", &[]);
    let b1 = part("b1", "1/2", "5", &[]);
    let c1 = part("c1", "1/3", "4", &[]);
    let merge = |dirs: &[&str]| {
        let mut a = vec!["tune", FILE, "--merge"];
        a.extend(dirs);
        let out = d.join("m.hpm");
        let out = out.to_str().unwrap().to_string();
        let mut a: Vec<String> = a.into_iter().map(str::to_string).collect();
        a.extend(["-o".to_string(), out]);
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        run(&args)
    };
    let ok = merge(&[&a0, &a1]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let m = merge(&[&a0]);
    assert_eq!(m.code, 1);
    assert!(m.stderr.contains("missing shard(s) 1 of 2"), "{}", m.stderr);
    let m = merge(&[&a0, &a1, &a1]);
    assert_eq!(m.code, 1);
    assert!(m.stderr.contains("shard 1 of 2 is given twice"), "{}", m.stderr);
    let m = merge(&[&a0, &b1]);
    assert_eq!(m.code, 1);
    assert!(m.stderr.contains("different runs"), "{}", m.stderr);
    let m = merge(&[&a0, &c1]);
    assert_eq!(m.code, 1);
    assert!(m.stderr.contains("shard count"), "{}", m.stderr);
    // The parts of another file's text.
    let other = d.join("other.hpm");
    let text = std::fs::read_to_string(root().join(FILE))
        .unwrap()
        .replace("param hidden = 7168;", "param hidden = 3584;");
    std::fs::write(&other, text).unwrap();
    let o = run(&[
        "tune",
        other.to_str().unwrap(),
        "--merge",
        &a0,
        &a1,
        "-o",
        d.join("m2.hpm").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("were not computed from this text"), "{}", o.stderr);
    // Sweep parts are not tune parts.
    let o = run(&["sweep", "--merge", &a0, "--out", d.join("s").to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("holds no sweep part file"), "{}", o.stderr);
}

/// Runs a small sweep; sharded with `shard` (into `out`) or not.
fn sweep(out: &Path, shard: Option<&str>) {
    let mut a: Vec<&str> = vec!["sweep", FILE];
    a.extend(SMALL);
    a.extend([
        "--vary",
        "tokens=128,256",
        "--vary",
        "device.link_efficiency=0.5,1",
        "--out",
        out.to_str().unwrap(),
    ]);
    if let Some(s) = shard {
        a.extend(["--shard", s]);
    }
    let o = run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn sharded_sweep_merged_equals_unsharded() {
    let d = dir("sweep");
    let full = d.join("full");
    sweep(&full, None);
    for n in [1usize, 2, 3] {
        let mut dirs = Vec::new();
        for i in 0..n {
            let pd = d.join(format!("n{n}-{i}"));
            sweep(&pd, Some(&format!("{i}/{n}")));
            // A shard writes only its part.
            assert!(!pd.join("sweep.csv").exists());
            dirs.push(pd);
        }
        let merged = d.join(format!("merged{n}"));
        let mut a: Vec<String> = vec!["sweep".into(), "--merge".into()];
        a.extend(dirs.iter().map(|p| p.display().to_string()));
        a.extend(["--out".into(), merged.display().to_string()]);
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        let m = run(&args);
        assert_eq!(m.code, 0, "{}", m.stderr);
        for f in crate::SWEEP_FILES {
            assert_eq!(
                std::fs::read(full.join(f)).unwrap(),
                std::fs::read(merged.join(f)).unwrap(),
                "{f} of {n} merged shards differs"
            );
        }
    }
    // 4 configurations x 3 policies.
    let csv = std::fs::read_to_string(full.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 12);
}

/// A backward derived by `grad` is tuned on the program with its `grad` written out: the
/// derived calls are the coordinates, the written file has no `grad` left, and it runs at the
/// latency the search reported; the forward is untouched and keeps its own latency.
#[test]
fn a_derived_backward_is_tuned_written_out() {
    let d = dir("grad");
    let best = d.join("best.hpm");
    let file = "examples/deepseek_v3_grad.hpm";
    let mut a = vec!["tune", file, "--taskflow", "moe_ffn_bwd"];
    a.extend(SMALL);
    a.extend([
        "--budget",
        "6",
        "--seed",
        "3",
        "--format",
        "json",
        "-o",
        best.to_str().unwrap(),
    ]);
    let o = run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: J = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["expanded_grad_of"], "moe_ffn");
    // The coordinates are calls of the derived backward.
    let calls: Vec<String> = j["space"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    assert!(calls.iter().any(|c| c == "dw_up"), "{calls:?}");
    let text = std::fs::read_to_string(&best).unwrap();
    assert!(!text.contains("= grad("), "{text}");
    assert!(text.contains("op gmm_vjp_x"), "{text}");
    // The file runs at the reported latency (the program imports nothing relative).
    let latency = |file: &str, tf: &str| taskflow_latency(file, &["--taskflow", tf]);
    let reported = j["best"]["latency_us"].as_f64().unwrap();
    let best_s = best.to_str().unwrap();
    assert!(close(latency(best_s, "moe_ffn_bwd"), reported));
    assert!(close(latency(best_s, "moe_ffn"), latency(file, "moe_ffn")));
    assert!(reported <= latency(file, "moe_ffn_bwd") * (1.0 + 1e-9));
}

/// Part files are input like any other: a shard count, a candidate count or a grid written
/// into them far past what the files hold is refused with the numbers, before anything of
/// that size is listed or allocated.
#[test]
fn forged_part_counts_are_refused() {
    let d = dir("forged");
    let small = "examples/swiglu_add.hpm";
    let rewrite = |from: &Path, to: &Path, edit: &dyn Fn(&mut J)| {
        let name = std::fs::read_dir(from).unwrap().next().unwrap().unwrap().file_name();
        let mut doc: J = serde_json::from_slice(&std::fs::read(from.join(&name)).unwrap()).unwrap();
        edit(&mut doc);
        std::fs::create_dir_all(to).unwrap();
        std::fs::write(to.join(name), doc.to_string()).unwrap();
    };
    let t = d.join("t");
    let sets = ["--set", "rows=256", "--set", "inter=128"];
    let mut a = vec![
        "tune",
        small,
        "--budget",
        "2",
        "--shard",
        "0/1",
        "--out-dir",
        t.to_str().unwrap(),
    ];
    a.extend(sets);
    assert_eq!(run(&a).code, 0);
    let merge_tune = |part: &Path| {
        let mut a = vec!["tune", small, "--merge", part.to_str().unwrap()];
        let out = d.join("m.hpm");
        a.extend(["-o", out.to_str().unwrap()]);
        run(&a)
    };
    // A huge shard count: the missing shards are named from the gaps, not listed one by one.
    let t1 = d.join("t1");
    rewrite(&t, &t1, &|j| j["shards"] = J::from(1u64 << 60));
    let o = merge_tune(&t1);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains(&format!("missing shard(s) 1-{} of {}", (1u64 << 60) - 1, 1u64 << 60)),
        "{}",
        o.stderr
    );
    // A candidate count past the results the part holds.
    let t2 = d.join("t2");
    rewrite(&t, &t2, &|j| j["candidates"] = J::from(1u64 << 50));
    let o = merge_tune(&t2);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("the parts hold 2 results for 1125899906842624 candidates"),
        "{}",
        o.stderr
    );
    // A sweep part whose grid has more points than a sweep may have.
    let s = d.join("s");
    let mut a = vec![
        "sweep",
        small,
        "--vary",
        "rows=64,128",
        "--shard",
        "0/1",
        "--policy",
        "interleaved",
    ];
    a.extend(["--out", s.to_str().unwrap()]);
    a.extend(sets);
    assert_eq!(run(&a).code, 0);
    let s1 = d.join("s1");
    rewrite(&s, &s1, &|j| {
        let axis = serde_json::json!({"name": "device.link_efficiency", "values": ["0.5", "0.6"]});
        for _ in 0..40 {
            j["settings"]["axes"].as_array_mut().unwrap().push(axis.clone());
        }
    });
    let o = run(&[
        "sweep",
        "--merge",
        s1.to_str().unwrap(),
        "--out",
        d.join("sm").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("the axis `device.link_efficiency` is given twice"),
        "{}",
        o.stderr
    );
    let s2 = d.join("s2");
    rewrite(&s, &s2, &|j| {
        for k in 0..30 {
            let axis = serde_json::json!({"name": format!("p{k}"), "values": ["1", "2"]});
            j["settings"]["axes"].as_array_mut().unwrap().push(axis);
        }
    });
    let o = run(&[
        "sweep",
        "--merge",
        s2.to_str().unwrap(),
        "--out",
        d.join("sm2").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("the grid has more than 1048576 points"),
        "{}",
        o.stderr
    );
}

/// A budget whose list of candidates would not fit in memory (a space of hundreds of
/// coordinates) is refused before any candidate is listed, not run out of memory.
#[test]
fn a_budget_past_the_candidate_memory_is_refused_up_front() {
    let d = dir("budget-memory");
    let mut s = String::from(
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
         op ad<T>(a: T[M, N], b: T[M, N]) -> T[M, N] on aiv { out[m, n] = a[m, n] + b[m, n]; }\n\
         taskflow f(x: bf16[64, 64]) -> bf16[64, 64] {\n    let s0 = ad(x, x) tile(m: 16, n: 16);\n",
    );
    for i in 1..100 {
        s.push_str(&format!("    let s{i} = ad(s{}, x) tile(m: 16, n: 16);\n", i - 1));
    }
    s.push_str("    return s99;\n}\n");
    let file = d.join("chain.hpm");
    std::fs::write(&file, s).unwrap();
    let best = d.join("best.hpm");
    let o = run(&[
        "tune",
        file.to_str().unwrap(),
        "--budget",
        "1000000000",
        "-o",
        best.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("would list 1000000000 of them"), "{}", o.stderr);
    assert!(o.stderr.contains("give --budget"), "{}", o.stderr);
    assert!(!best.exists());
    // A budget that fits is searched as before.
    let o = run(&[
        "tune",
        file.to_str().unwrap(),
        "--budget",
        "2",
        "-o",
        best.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}
