//! `hpmoe scale`: a program, a param and its values in; for every value the whole pipeline
//! (check, lower, verify, schedule, simulate) runs in a fresh `hpmoe run --timings` process,
//! one after the other, and a table comes out: tasks, edges, seconds per stage and peak
//! resident memory per point, with the growth exponent of every stage's time against the
//! task count (1 is linear). A fresh process per point makes the peak memory that point's
//! own. Exit code 1 if a point failed (its diagnostics are shown), 2 on a usage error.

use super::{usage, ProgramArgs};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// Options of `hpmoe scale`.
pub(crate) struct ScaleCli<'a> {
    pub file: &'a Path,
    pub prog: &'a ProgramArgs,
    pub param: &'a str,
    pub values: &'a str,
    pub policy: Option<&'a str>,
    pub taskflow: Option<&'a str>,
    pub repeat: u32,
    pub max_tasks: u64,
    pub format: ScaleFormat,
}

/// How `hpmoe scale` prints its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ScaleFormat {
    /// A table for people.
    Human,
    /// A Markdown table (as in the README).
    Markdown,
    /// One JSON document on stdout.
    Json,
}

/// The stages of a table's columns, in order, and the run stages each one sums.
const COLUMNS: &[(&str, &[&str])] = &[
    ("lower", &["lower"]),
    ("verify", &["verify graph", "verify schedule"]),
    ("schedule", &["schedule"]),
    ("candidates", &["candidates"]),
    ("prepare", &["prepare"]),
    ("simulate", &["simulate"]),
    ("report", &["report"]),
];

/// One taskflow at one value.
#[derive(Clone, Debug)]
struct Row {
    value: String,
    taskflow: String,
    policy: String,
    tasks: u64,
    edges: u64,
    counter_entries: u64,
    graph_bytes: u64,
    /// Seconds per column of [`COLUMNS`].
    stages: Vec<f64>,
    total: f64,
}

/// One process: its rows, its check time, wall time and peak memory.
#[derive(Clone, Debug)]
struct Point {
    value: String,
    rows: Vec<Row>,
    check: f64,
    /// Materialising the routings, once per process.
    layouts: f64,
    total: f64,
    peak_rss: Option<u64>,
}

/// Parses the `timings` of one `hpmoe run --format json --timings`.
fn parse_point(value: &str, json: &serde_json::Value) -> Result<Point, String> {
    let t = json.get("timings").ok_or("the run printed no timings")?;
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64()).ok_or(format!("no `{k}`"));
    let int = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64()).ok_or(format!("no `{k}`"));
    let mut rows = Vec::new();
    for r in t.get("runs").and_then(|r| r.as_array()).ok_or("no `runs`")? {
        let stages_s = r.get("stages_s").and_then(|s| s.as_object()).ok_or("no `stages_s`")?;
        let stages = COLUMNS
            .iter()
            // (Folded from +0: a sum of no stages is 0, where `Sum` would give -0.)
            .map(|(_, parts)| {
                parts
                    .iter()
                    .filter_map(|p| stages_s.get(*p)?.as_f64())
                    .fold(0.0, |a, b| a + b)
            })
            .collect();
        let text = |k: &str| {
            r.get(k)
                .and_then(|x| x.as_str())
                .map(str::to_string)
                .ok_or(format!("no `{k}`"))
        };
        rows.push(Row {
            value: value.to_string(),
            taskflow: text("taskflow")?,
            policy: text("policy")?,
            tasks: int(r, "tasks")?,
            edges: int(r, "edges")?,
            counter_entries: int(r, "counter_entries")?,
            graph_bytes: int(r, "graph_bytes")?,
            stages,
            total: num(r, "total_s")?,
        });
    }
    Ok(Point {
        value: value.to_string(),
        rows,
        check: num(t, "check_s")?,
        layouts: num(t, "layouts_s")?,
        total: num(t, "total_s")?,
        peak_rss: t.get("peak_rss_bytes").and_then(|x| x.as_u64()),
    })
}

/// The smaller of two measurements of the same point, stage by stage (the least disturbed
/// by other work on the machine); memory and sizes are the same in both.
fn fold_min(a: Point, b: Point) -> Point {
    let rows = a
        .rows
        .into_iter()
        .zip(b.rows)
        .map(|(x, y)| Row {
            stages: x.stages.iter().zip(&y.stages).map(|(p, q)| p.min(*q)).collect(),
            total: x.total.min(y.total),
            ..x
        })
        .collect();
    Point {
        rows,
        check: a.check.min(b.check),
        layouts: a.layouts.min(b.layouts),
        total: a.total.min(b.total),
        peak_rss: a.peak_rss.max(b.peak_rss),
        value: a.value,
    }
}

/// The least-squares slope of log(y) against log(x): time ~ tasks^slope.
fn growth(xs: &[f64], ys: &[f64]) -> Option<f64> {
    let pts: Vec<(f64, f64)> = xs
        .iter()
        .zip(ys)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Per taskflow, the growth exponent of every column and of the total.
fn exponents(points: &[Point]) -> Vec<(String, Vec<Option<f64>>)> {
    let mut names: Vec<String> = Vec::new();
    for r in points.iter().flat_map(|p| &p.rows) {
        if !names.contains(&r.taskflow) {
            names.push(r.taskflow.clone());
        }
    }
    names
        .into_iter()
        .map(|name| {
            let rows: Vec<&Row> = points
                .iter()
                .flat_map(|p| &p.rows)
                .filter(|r| r.taskflow == name)
                .collect();
            let xs: Vec<f64> = rows.iter().map(|r| r.tasks as f64).collect();
            let mut e: Vec<Option<f64>> = (0..COLUMNS.len())
                .map(|c| growth(&xs, &rows.iter().map(|r| r.stages[c]).collect::<Vec<_>>()))
                .collect();
            e.push(growth(&xs, &rows.iter().map(|r| r.total).collect::<Vec<_>>()));
            (name, e)
        })
        .collect()
}

fn gib(b: Option<u64>) -> String {
    match b {
        Some(b) => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        None => "n/a".into(),
    }
}

fn millions(n: u64) -> String {
    if n >= 100_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

fn exp(e: Option<f64>) -> String {
    e.map_or("-".into(), |e| format!("{e:.2}"))
}

/// The table: one row per taskflow and value, then the growth exponents.
fn table(param: &str, points: &[Point], markdown: bool) -> String {
    let mut head: Vec<String> = vec![
        param.to_string(),
        "taskflow".into(),
        "tasks".into(),
        "edges".into(),
        "counters".into(),
        "graph B/task".into(),
        "check + routings s".into(),
    ];
    head.extend(COLUMNS.iter().map(|(n, _)| format!("{n} s")));
    head.extend(["total s".to_string(), "tasks/s".into(), "peak RSS".into()]);
    let mut body: Vec<Vec<String>> = Vec::new();
    for p in points {
        for (i, r) in p.rows.iter().enumerate() {
            let mut cells = vec![
                r.value.clone(),
                format!("{} ({})", r.taskflow, r.policy),
                millions(r.tasks),
                millions(r.edges),
                millions(r.counter_entries),
                format!("{:.1}", r.graph_bytes as f64 / r.tasks.max(1) as f64),
                // Once per process, on its first row.
                if i == 0 {
                    format!("{:.3}", p.check + p.layouts)
                } else {
                    String::new()
                },
            ];
            cells.extend(r.stages.iter().map(|s| format!("{s:.3}")));
            cells.push(format!("{:.3}", r.total));
            cells.push(format!("{:.2} M", r.tasks as f64 / r.total.max(1e-9) / 1e6));
            // The process's peak, on its last row.
            cells.push(if i + 1 == p.rows.len() {
                gib(p.peak_rss)
            } else {
                String::new()
            });
            body.push(cells);
        }
    }
    let mut growth_rows: Vec<Vec<String>> = Vec::new();
    for (name, e) in exponents(points) {
        let mut cells = vec!["growth".to_string(), name];
        cells.extend(std::iter::repeat_n(String::new(), 5));
        cells.extend(e.iter().map(|x| exp(*x)));
        cells.extend([String::new(), String::new()]);
        growth_rows.push(cells);
    }
    let mut s = String::new();
    if markdown {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        s.push_str(&line(&head));
        let align: Vec<String> = head
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 1 { "---".into() } else { "--:".into() })
            .collect();
        s.push_str(&line(&align));
        for r in body.iter().chain(&growth_rows) {
            s.push_str(&line(r));
        }
    } else {
        let all: Vec<&Vec<String>> = std::iter::once(&head).chain(&body).chain(&growth_rows).collect();
        let widths: Vec<usize> = (0..head.len())
            .map(|c| all.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for r in &all {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c == 1 {
                    let _ = write!(line, "  {cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(line, "  {cell:>w$}", w = widths[c]);
                }
            }
            s.push_str(line.trim_end());
            s.push('\n');
        }
    }
    s.push_str(&format!(
        "\ngrowth: the least-squares exponent b of seconds ~ tasks^b over the {param} values (1 is linear)\n"
    ));
    s
}

fn json(param: &str, points: &[Point]) -> serde_json::Value {
    let exps = exponents(points);
    serde_json::json!({
        "ok": true,
        "param": param,
        "points": points.iter().map(|p| serde_json::json!({
            "value": p.value,
            "check_s": p.check,
            "layouts_s": p.layouts,
            "total_s": p.total,
            "peak_rss_bytes": p.peak_rss,
            "runs": p.rows.iter().map(|r| {
                let stages: serde_json::Map<String, serde_json::Value> = COLUMNS
                    .iter()
                    .zip(&r.stages)
                    .map(|((n, _), s)| (n.to_string(), serde_json::json!(s)))
                    .collect();
                serde_json::json!({
                    "taskflow": r.taskflow,
                    "policy": r.policy,
                    "tasks": r.tasks,
                    "edges": r.edges,
                    "counter_entries": r.counter_entries,
                    "graph_bytes": r.graph_bytes,
                    "stages_s": stages,
                    "total_s": r.total,
                })
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "growth": exps.iter().map(|(name, e)| {
            let mut m: serde_json::Map<String, serde_json::Value> = COLUMNS
                .iter()
                .zip(e)
                .map(|((n, _), x)| (n.to_string(), serde_json::json!(x)))
                .collect();
            m.insert("total".into(), serde_json::json!(e.last().copied().flatten()));
            serde_json::json!({"taskflow": name, "exponents": m})
        }).collect::<Vec<_>>(),
    })
}

/// Runs one point in a fresh process.
fn measure(o: &ScaleCli, exe: &Path, value: &str) -> Result<Point, i32> {
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg(o.file)
        .args(["--format", "json", "--timings", "--jobs", "1"])
        .arg("--max-tasks")
        .arg(o.max_tasks.to_string());
    for s in &o.prog.set {
        cmd.arg("--set").arg(s);
    }
    cmd.arg("--set").arg(format!("{}={value}", o.param));
    if let Some(d) = &o.prog.device {
        cmd.arg("--device").arg(d);
    }
    if let Some(r) = &o.prog.routing {
        cmd.arg("--routing").arg(r);
    }
    if let Some(p) = o.policy {
        cmd.arg("--policy").arg(p);
    }
    if let Some(t) = o.taskflow {
        cmd.arg("--taskflow").arg(t);
    }
    let out = cmd.output().map_err(|e| {
        errln!("error: cannot start `{}`: {e}", exe.display());
        1
    })?;
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
    if !out.status.success() {
        errln!("error: {}={value} failed", o.param);
        errout!("{}", String::from_utf8_lossy(&out.stderr));
        // Diagnostics of a failed check come as JSON on stdout.
        if let Some(ds) = parsed
            .as_ref()
            .and_then(|j| j.get("diagnostics"))
            .and_then(|d| d.as_array())
        {
            for d in ds {
                let msg = d.get("message").and_then(|m| m.as_str()).unwrap_or("");
                let code = d.get("code").and_then(|m| m.as_str()).unwrap_or("");
                errln!("  {code}: {msg}");
            }
        }
        return Err(1);
    }
    let j = parsed.ok_or_else(|| {
        errln!("error: {}={value}: the run printed no JSON", o.param);
        1
    })?;
    parse_point(value, &j).map_err(|e| {
        errln!("error: {}={value}: {e}", o.param);
        1
    })
}

/// The most runs (values times `--repeat`) one `hpmoe scale` makes.
const MAX_RUNS: u64 = 256;

pub(crate) fn scale(o: &ScaleCli) -> i32 {
    let param = o.param.trim();
    if param.is_empty() || !param.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
        return usage(format!("--param `{param}` is not a param or device field name"));
    }
    let values: Vec<String> = o.values.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(|v| v.is_empty()) {
        return usage(format!("--values `{}` has an empty value", o.values));
    }
    // A value listed twice would measure the same point twice (as `sweep --vary` refuses).
    if let Some(v) = values
        .iter()
        .enumerate()
        .find_map(|(i, v)| values[..i].contains(v).then_some(v))
    {
        return usage(format!("--values lists `{v}` twice"));
    }
    if o.prog
        .set
        .iter()
        .any(|s| s.split_once('=').is_some_and(|(n, _)| n.trim() == param))
    {
        return usage(format!("`{param}` is both scaled and set with --set"));
    }
    if o.repeat == 0 {
        return usage("--repeat must be at least 1".into());
    }
    // Every point is a fresh process: the runs are bounded before the first one starts.
    let runs = (values.len() as u64).saturating_mul(u64::from(o.repeat));
    if runs > MAX_RUNS {
        return usage(format!(
            "{} values x --repeat {} is {runs} runs, more than {MAX_RUNS}; scale fewer values",
            values.len(),
            o.repeat
        ));
    }
    if !o.file.is_file() {
        errln!("error: cannot read `{}`", o.file.display());
        return 1;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            errln!("error: cannot find the hpmoe executable: {e}");
            return 1;
        }
    };
    let mut points = Vec::new();
    for v in &values {
        let mut best: Option<Point> = None;
        for _ in 0..o.repeat {
            let p = match measure(o, &exe, v) {
                Ok(p) => p,
                Err(code) => return code,
            };
            best = Some(match best {
                Some(b) => fold_min(b, p),
                None => p,
            });
        }
        let Some(p) = best else { continue };
        if o.format != ScaleFormat::Json {
            let tasks: u64 = p.rows.iter().map(|r| r.tasks).sum();
            errln!(
                "{param}={v}: {tasks} tasks in {:.2} s, peak {}",
                p.total,
                gib(p.peak_rss)
            );
        }
        points.push(p);
    }
    match o.format {
        ScaleFormat::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&json(param, &points)).unwrap_or_default()
        ),
        ScaleFormat::Human => out!("{}", table(param, &points, false)),
        ScaleFormat::Markdown => out!("{}", table(param, &points, true)),
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_recovers_the_exponent_of_a_power_law() {
        let xs = [1e3, 1e4, 1e5, 1e6];
        let lin: Vec<f64> = xs.iter().map(|x| 2e-7 * x).collect();
        let quad: Vec<f64> = xs.iter().map(|x| 1e-9 * x * x).collect();
        assert!((growth(&xs, &lin).unwrap() - 1.0).abs() < 1e-9);
        assert!((growth(&xs, &quad).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(growth(&xs[..1], &lin[..1]), None);
        // Zero times (a skipped stage) are left out rather than breaking the fit.
        assert_eq!(growth(&[1.0, 2.0], &[0.0, 1.0]), None);
    }

    fn point(value: &str, tasks: u64, secs: f64) -> serde_json::Value {
        serde_json::json!({"timings": {
            "check_s": 0.01, "layouts_s": 0.0, "total_s": secs, "peak_rss_bytes": 1u64 << 30,
            "runs": [{"taskflow": "f", "policy": "interleaved", "tasks": tasks, "edges": 2 * tasks,
                      "counter_entries": tasks / 2, "graph_bytes": 50 * tasks,
                      "stages_s": {"layouts": 0.0, "lower": secs / 4.0, "verify graph": secs / 4.0,
                                   "schedule": secs / 4.0, "simulate": secs / 4.0},
                      "total_s": secs}],
            "value": value}})
    }

    #[test]
    fn points_parse_fold_and_tabulate() {
        let a = parse_point("8", &point("8", 1000, 1.0)).unwrap();
        let b = parse_point("8", &point("8", 1000, 0.5)).unwrap();
        let m = fold_min(a, b);
        assert_eq!(m.rows[0].stages[0], 0.125);
        assert_eq!(m.rows[0].total, 0.5);
        let c = parse_point("16", &point("16", 2000, 1.0)).unwrap();
        let md = table("ranks", &[m, c], true);
        assert!(md.starts_with("| ranks | taskflow | tasks |"), "{md}");
        assert!(
            md.contains("| 16 | f (interleaved) | 2000 | 4000 | 1000 | 50.0 | 0.010 |"),
            "{md}"
        );
        // A stage the runs did not have (no `candidates`, `prepare` or `report` here) is 0,
        // not -0.
        assert!(!md.contains("-0.000"), "{md}");
        // Time doubled with tasks: linear growth.
        assert!(md.contains("| growth | f |"), "{md}");
        assert!(md.contains("| 1.00 |"), "{md}");
        assert!(parse_point("8", &serde_json::json!({"ok": true})).is_err());
    }
}
