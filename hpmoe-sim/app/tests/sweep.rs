//! End-to-end tests of `hpmoe sweep`: agreement with `hpmoe run`, well-formed charts with one
//! bar per point, determinism across thread counts, failing points.

use assert_cmd::Command;
use serde_json::Value as J;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hpmoe() -> Command {
    let mut c = Command::cargo_bin("hpmoe").unwrap();
    c.current_dir(root()).env("NO_COLOR", "1");
    c
}

fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sweep-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const FILE: &str = "examples/deepseek_v3_ep8_fwd.hpm";
const SMALL: [&str; 4] = ["--set", "tokens=256", "--set", "experts=16"];

/// Runs a sweep into `dir`; returns the exit code.
fn sweep(dir: &Path, args: &[&str]) -> i32 {
    let out = hpmoe()
        .arg("sweep")
        .arg(FILE)
        .args(SMALL)
        .args(args)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap();
    out.status.code().unwrap()
}

fn read_json(dir: &Path) -> J {
    serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap()
}

/// CSV rows as maps from header to field (fields here contain no quotes).
fn read_csv(dir: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let mut lines = text.lines();
    let head: Vec<String> = lines.next().unwrap().split(',').map(str::to_string).collect();
    lines
        .map(|l| {
            let f = split_csv(l);
            assert_eq!(f.len(), head.len(), "row `{l}`");
            head.iter().cloned().zip(f).collect()
        })
        .collect()
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Equal up to the last bits lost by serde_json's fast (not exactly rounding) float parser.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// `hpmoe run` of one sweep point: SMALL with `tokens` replaced.
fn run_json(policy: &str, tokens: &str) -> J {
    let tokens = format!("tokens={tokens}");
    let out = hpmoe()
        .args(["run", FILE, "--policy", policy, "--format", "json"])
        .args(SMALL.map(|a| if a.starts_with("tokens=") { tokens.as_str() } else { a }))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    j["runs"][0].clone()
}

#[test]
fn csv_and_json_agree_with_run() {
    let dir = out_dir("agree");
    let code = sweep(
        &dir,
        &[
            "--vary",
            "tokens=128,256",
            "--policy",
            "kernel_by_kernel,interleaved",
            "--threads",
            "2",
        ],
    );
    assert_eq!(code, 0);
    let j = read_json(&dir);
    let points = j["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    let csv = read_csv(&dir);
    assert_eq!(csv.len(), 4);
    for (p, row) in points.iter().zip(&csv) {
        let tokens = p["values"]["tokens"].as_str().unwrap();
        let policy = p["policy"].as_str().unwrap();
        assert_eq!(row["tokens"], tokens);
        assert_eq!(row["policy"], policy);
        let r = run_json(policy, tokens);
        for (sweep_key, run_val) in [
            ("latency_us", &r["latency_us"]),
            ("lower_bound_us", &r["lower_bound_us"]),
            ("efficiency", &r["efficiency"]),
            ("l2_hit_rate", &r["memory"]["l2_hit_rate"]),
        ] {
            let want = run_val.as_f64().unwrap();
            assert_eq!(p[sweep_key].as_f64().unwrap(), want, "{sweep_key} of {tokens}/{policy}");
            assert!(close(row[sweep_key].parse::<f64>().unwrap(), want), "csv {sweep_key}");
        }
        assert_eq!(p["engines"]["aic_busy"], r["engines"]["aic_busy"]);
        assert_eq!(p["engines"]["link_busy"], r["engines"]["link_busy"]);
        assert_eq!(p["communication"]["exposed_us"], r["communication"]["exposed_us"]);
        for ph in r["phases"].as_array().unwrap() {
            let call = ph["call"].as_str().unwrap();
            let want = ph["active_us"].as_f64().unwrap();
            assert!(close(
                row[&format!("phase_{call}_active_us")].parse::<f64>().unwrap(),
                want
            ));
        }
    }
    // The speedup is kernel_by_kernel's latency over the policy's, per configuration.
    let kbk = points[0]["latency_us"].as_f64().unwrap();
    let il = points[1]["latency_us"].as_f64().unwrap();
    // Within rounding: the sweep divides the unrounded latencies, the JSON holds them rounded.
    assert!(close(
        points[1]["speedup_vs_kernel_by_kernel"].as_f64().unwrap(),
        kbk / il
    ));
    assert_eq!(points[0]["speedup_vs_kernel_by_kernel"].as_f64().unwrap(), 1.0);
}

fn count(doc: &roxmltree::Document, tag: &str) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name(tag))
        .filter_map(|n| n.attribute("data-point").map(str::to_string))
        .collect()
}

#[test]
fn charts_are_well_formed_with_one_bar_per_point() {
    let dir = out_dir("charts");
    let code = sweep(
        &dir,
        &[
            "--vary",
            "tokens=128,256",
            "--vary",
            "routing=balanced();hotspot(max_over_mean: 2)",
        ],
    );
    assert_eq!(code, 0);
    let points = 2 * 2 * 3;
    let want: Vec<String> = (0..points).map(|i| i.to_string()).collect();
    for chart in ["latency.svg", "phases.svg", "l2.svg"] {
        let text = std::fs::read_to_string(dir.join(chart)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{chart}: {e}"));
        assert!(doc.root_element().has_tag_name("svg"));
        assert_eq!(count(&doc, "rect"), want, "{chart}");
        assert!(
            text.contains("kernel_by_kernel") && text.contains("interleaved"),
            "{chart} legend"
        );
    }
    let text = std::fs::read_to_string(dir.join("speedup.svg")).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    // One marker per point that has a speedup and is not kernel_by_kernel itself.
    assert_eq!(count(&doc, "circle").len(), 2 * 2 * 2);
    assert!(text.contains(">tokens<"), "x axis title");
    let lat = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
    assert!(
        lat.contains("latency (us)") && lat.contains("x</text>"),
        "axis label and speedup annotations"
    );
    // The L2 chart's bars carry each point's hit rate from sweep.csv, in percent.
    let l2 = std::fs::read_to_string(dir.join("l2.svg")).unwrap();
    assert!(
        l2.contains("L2 hit rate (%)") && !l2.contains("x</text>"),
        "axis, no speedups"
    );
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = head
        .iter()
        .position(|h| *h == "l2_hit_rate")
        .expect("an l2_hit_rate column");
    for line in lines {
        let rate: f64 = line.split(',').nth(col).unwrap().parse().unwrap();
        let shown = format!(": {:.1}%</title>", rate * 100.0);
        assert!(l2.contains(&shown), "{shown} missing from l2.svg");
    }
}

#[test]
fn outputs_do_not_depend_on_the_thread_count() {
    let a = out_dir("threads1");
    let b = out_dir("threads2");
    let args = [
        "--vary",
        "tokens=128,256",
        "--vary",
        "routing=zipf(s: 0.5);zipf(s: 1.2)",
        "--policy",
        "interleaved,kernel_by_kernel",
    ];
    let mut a_args = args.to_vec();
    a_args.extend(["--threads", "1"]);
    let mut b_args = args.to_vec();
    b_args.extend(["--threads", "2"]);
    assert_eq!(sweep(&a, &a_args), 0);
    assert_eq!(sweep(&b, &b_args), 0);
    for f in crate::SWEEP_FILES {
        let x = std::fs::read(a.join(f)).unwrap();
        let y = std::fs::read(b.join(f)).unwrap();
        assert!(x == y, "{f} differs between 1 and 2 threads");
    }
}

#[test]
fn a_failing_point_is_reported_and_the_others_run() {
    let dir = out_dir("failing");
    let out = hpmoe()
        .args([
            "sweep",
            FILE,
            "--set",
            "tokens=256",
            "--vary",
            "experts=16,15",
            "--policy",
            "interleaved",
            "--threads",
            "2",
        ])
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("failed: E"), "{stdout}");
    let j = read_json(&dir);
    let p = j["points"].as_array().unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0]["ok"], true);
    assert!(p[0]["latency_us"].as_f64().unwrap() > 0.0);
    assert_eq!(p[1]["ok"], false);
    assert!(p[1]["error"].as_str().unwrap().contains("15"), "{}", p[1]["error"]);
    assert_eq!(j["failed"], 1);
    let csv = read_csv(&dir);
    assert_eq!(csv[1]["ok"], "false");
    assert!(!csv[1]["error"].is_empty());
    assert!(csv[1]["latency_us"].is_empty());
    let svg = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(count(&doc, "rect"), ["0", "1"]);
    assert!(svg.contains(r#"data-failed="true""#));
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        &["--vary", "tokens"][..],
        &["--vary", "schedule.nonsense=1"],
        &["--policy", "fastest"],
        &["--vary", "tokens=1,,2"],
        // No swept policy takes the option: every row would be the same schedule.
        &[
            "--vary",
            "schedule.priority=fifo,op_order",
            "--policy",
            "kernel_by_kernel,expert_level",
        ],
    ] {
        let out = hpmoe()
            .args(["sweep", FILE])
            .args(args)
            .arg("--out")
            .arg(out_dir("usage"))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn schedule_options_vary_the_policy() {
    let dir = out_dir("schedopt");
    let code = sweep(
        &dir,
        &[
            "--vary",
            "schedule.launch_overhead=true,false",
            "--policy",
            "kernel_by_kernel",
        ],
    );
    assert_eq!(code, 0);
    let j = read_json(&dir);
    let p = j["points"].as_array().unwrap();
    let with = p[0]["latency_us"].as_f64().unwrap();
    let without = p[1]["latency_us"].as_f64().unwrap();
    assert!(without < with, "launch overheads cost time: {with} vs {without}");
}

/// An option axis leaves a policy that does not take it as it is: the baseline's rows are
/// the same at every value, the other policy's differ.
#[test]
fn an_option_axis_leaves_other_policies_unchanged() {
    let dir = out_dir("schedopt-baseline");
    let code = sweep(
        &dir,
        &[
            "--vary",
            "schedule.aiv_fraction=0.25,1.0",
            "--policy",
            "kernel_by_kernel,expert_level",
        ],
    );
    assert_eq!(code, 0);
    let j = read_json(&dir);
    let p = j["points"].as_array().unwrap();
    let lat = |i: usize| p[i]["latency_us"].as_f64().unwrap();
    // Points: (0.25, kbk), (0.25, expert_level), (1.0, kbk), (1.0, expert_level).
    assert_eq!(lat(0), lat(2), "kernel_by_kernel does not read aiv_fraction");
    assert_ne!(lat(1), lat(3), "expert_level does");
}
