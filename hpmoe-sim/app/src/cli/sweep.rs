//! `hpmoe sweep`: a program, `--vary` axes and policies in; the grid runs in parallel
//! (`crate::sweep`), `sweep.csv`, `sweep.json` and SVG charts are written to `--out`, and a
//! table (or the JSON) is printed. Exit code 1 if any point failed, 2 on a usage error.
//!
//! With `--shard I/N` (or in a Slurm job array) only the shard's points run and a part file
//! is written to `--out` instead (`crate::shard`); `--merge DIR...` joins the parts into the
//! outputs of the whole grid, byte for byte those of an unsharded run.

use super::{usage, Format, ProgramArgs};
use crate::sweep::{self, svg, Axis, Sweep};
use hpmoe_dsl::check::Override;
use hpmoe_dsl::schedule::Policy;
use std::io::IsTerminal;
use std::path::Path;

/// Options of `hpmoe sweep`.
pub(crate) struct SweepCli<'a> {
    pub file: &'a Path,
    pub prog: &'a ProgramArgs,
    pub vary: &'a [String],
    pub policy: &'a str,
    pub taskflow: Option<&'a str>,
    pub out: &'a Path,
    pub threads: usize,
    pub format: Format,
    pub max_tasks: u64,
    pub shard: Option<&'a str>,
}

/// The files a whole sweep (or a merge) writes into `--out`.
const OUTPUT_FILES: [&str; 6] = [
    "sweep.csv",
    "sweep.json",
    "latency.svg",
    "phases.svg",
    "l2.svg",
    "speedup.svg",
];

fn write(path: &Path, text: &str) -> Result<(), i32> {
    hpmoe_dsl::outfile::write(path, text).map_err(|e| {
        errln!("error: cannot write `{}`: {e}", path.display());
        1
    })
}

pub(crate) fn sweep(o: &SweepCli) -> i32 {
    let shard = match crate::shard::Shard::from_args(o.shard) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let mut axes: Vec<Axis> = Vec::new();
    // (A set: the command line may hold a hundred thousand `--vary`s.)
    let mut names = std::collections::BTreeSet::new();
    for v in o.vary {
        match Axis::parse(v) {
            Ok(a) => {
                if !names.insert(a.name.clone()) {
                    return usage(format!("--vary `{}` is given twice", a.name));
                }
                axes.push(a);
            }
            Err(e) => return usage(format!("--vary {e}")),
        }
    }
    let mut policies = Vec::new();
    for name in o.policy.split(',').map(str::trim) {
        match Policy::parse(name) {
            Some(p) if !policies.contains(&p) => policies.push(p),
            Some(_) => return usage(format!("--policy lists `{name}` twice")),
            None => {
                let names: Vec<&str> = Policy::all().iter().map(|p| p.name()).collect();
                return usage(format!(
                    "unknown policy `{name}`; the policies are: {}",
                    names.join(", ")
                ));
            }
        }
    }
    if let Err(e) = sweep::grid_size(&axes, policies.len()) {
        return usage(e);
    }
    if let Err(e) = crate::sweep::check_schedule_axes(&axes, &policies) {
        return usage(format!("--vary {e}"));
    }
    for s in &o.prog.set {
        if let Err(e) = Override::parse(s) {
            return usage(format!("--set {e}"));
        }
    }
    if let Err(e) = super::paths::output_dir("--out", o.out) {
        return usage(e);
    }
    let part_name = shard.map(|s| s.file_name("sweep"));
    let written: Vec<&str> = match &part_name {
        Some(name) => vec![name.as_str()],
        None => OUTPUT_FILES.to_vec(),
    };
    if let Err(e) = super::paths::files_in_dir("--out", o.out, written) {
        return usage(e);
    }
    if !o.file.exists() {
        errln!("error: cannot read `{}`: no such file", o.file.display());
        return 1;
    }
    let sw = Sweep {
        file: o.file.to_path_buf(),
        set: o.prog.set.clone(),
        device: o.prog.device.clone(),
        routing: o.prog.routing.clone(),
        axes,
        policies,
        taskflow: o.taskflow.map(str::to_string),
        max_tasks: o.max_tasks,
    };
    if let Err(e) = sw.preflight() {
        return usage(e);
    }
    let source = match hpmoe_dsl::check::read_source(o.file) {
        Ok(t) => t,
        Err(e) => {
            errln!("error: cannot read `{}`: {e}", o.file.display());
            return 1;
        }
    };
    let n = match shard {
        Some(s) => (0..sw.points()).filter(|&i| s.owns(i)).count(),
        None => sw.points(),
    };
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(n as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} points, {elapsed} (eta {eta})")
        {
            b.set_style(style);
        }
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let rows = match sw.run_shard(shard, o.threads, &|| bar.inc(1)) {
        Ok(r) => r,
        Err(e) => {
            bar.finish_and_clear();
            errln!("error: {e}");
            return 1;
        }
    };
    bar.finish_and_clear();
    if let Some(s) = shard {
        let part = sweep::part(&sw, &source, s, &rows);
        return match crate::shard::write_part(o.out, "sweep", s, &part) {
            Ok(path) => {
                let failed = rows.iter().filter(|r| r.outcome.is_err()).count();
                if o.format == Format::Human {
                    outln!(
                        "shard {} of {}: {} of {} point(s), {} failed; wrote {}",
                        s.index,
                        s.count,
                        rows.len(),
                        sw.points(),
                        failed,
                        path.display()
                    );
                } else {
                    outln!(
                        "{}",
                        serde_json::json!({"shard": s.index, "shards": s.count, "points": rows.len(), "failed": failed, "part": path.display().to_string()})
                    );
                }
                i32::from(failed > 0)
            }
            Err(e) => {
                errln!("error: {e}");
                1
            }
        };
    }
    outputs(&sw, &rows, o.out, o.format)
}

/// `hpmoe sweep --merge DIR...`: the part files of `dirs` joined, then written and printed as
/// an unsharded sweep writes and prints them. With `file`, the parts must come from its text.
pub(crate) fn merge(dirs: &[std::path::PathBuf], file: Option<&Path>, out: &Path, format: Format) -> i32 {
    if let Err(e) =
        super::paths::output_dir("--out", out).and_then(|()| super::paths::files_in_dir("--out", out, OUTPUT_FILES))
    {
        return usage(e);
    }
    let parts = match crate::shard::read_parts(dirs, "sweep") {
        Ok(p) => p,
        Err(e) => {
            errln!("error: {e}");
            return 1;
        }
    };
    let (sw, rows) = match sweep::merge(&parts) {
        Ok(x) => x,
        Err(e) => {
            errln!("error: cannot merge the sweep parts: {e}");
            return 1;
        }
    };
    if let Some(f) = file {
        let text = match hpmoe_dsl::check::read_source(f) {
            Ok(t) => t,
            Err(e) => {
                errln!("error: cannot read `{}`: {e}", f.display());
                return 1;
            }
        };
        let settings = sweep::settings(&sw);
        let fp = crate::shard::fingerprint(&[text.as_bytes(), settings.to_string().as_bytes()]);
        if parts[0]["fingerprint"].as_str() != Some(fp.as_str()) {
            errln!(
                "error: the parts were not computed from this text of `{}` (the file changed, or they come from another file)",
                f.display()
            );
            return 1;
        }
    }
    outputs(&sw, &rows, out, format)
}

/// Writes `sweep.csv`, `sweep.json` and the charts to `out` and prints the table or the JSON.
fn outputs(sw: &Sweep, rows: &[sweep::Row], out: &Path, format: Format) -> i32 {
    if let Err(e) = std::fs::create_dir_all(out) {
        errln!("error: cannot create `{}`: {e}", out.display());
        return 1;
    }
    let name = sw
        .file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let json = sweep::json(sw, rows);
    let json_text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
    let mut files = vec![
        ("sweep.csv".to_string(), sweep::csv(&sw.axes, rows)),
        ("sweep.json".to_string(), json_text.clone()),
        (
            "latency.svg".to_string(),
            svg::latency_chart(&format!("{name}: latency per policy"), &sw.axes, rows),
        ),
        (
            "phases.svg".to_string(),
            svg::phases_chart(&format!("{name}: per-phase active time"), &sw.axes, rows),
        ),
        (
            "l2.svg".to_string(),
            svg::l2_chart(&format!("{name}: L2 hit rate per policy"), &sw.axes, rows),
        ),
    ];
    if let Some(s) = svg::speedup_chart(&format!("{name}: speedup over kernel_by_kernel"), &sw.axes, rows) {
        files.push(("speedup.svg".to_string(), s));
    }
    for (f, text) in &files {
        if let Err(code) = write(&out.join(f), text) {
            return code;
        }
    }
    let failed = rows.iter().filter(|r| r.outcome.is_err()).count();
    match format {
        Format::Json => out!("{json_text}"),
        Format::Human => {
            let labels: Vec<String> = rows.iter().map(|r| r.label(&sw.axes)).collect();
            let w = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0).max(13);
            outln!(
                "{:<w$}  {:<16}  {:>12}  {:>8}  {:>6}  {:>6}  {:>8}  {:>6}",
                "configuration",
                "policy",
                "latency us",
                "speedup",
                "eff",
                "L2 hit",
                "exposed",
                "AIC"
            );
            for (r, l) in rows.iter().zip(&labels) {
                match &r.outcome {
                    Ok(m) => outln!(
                        "{:<w$}  {:<16}  {:>12.1}  {:>8}  {:>5.1}%  {:>5.1}%  {:>7.1}%  {:>5.1}%",
                        l,
                        r.policy,
                        m.latency_us,
                        r.speedup.map(|s| format!("{s:.3}x")).unwrap_or_else(|| "-".into()),
                        100.0 * m.efficiency,
                        100.0 * m.l2_hit_rate,
                        100.0 * m.exposed_share,
                        100.0 * m.aic_busy
                    ),
                    Err(e) => outln!("{:<w$}  {:<16}  failed: {e}", l, r.policy),
                }
            }
            outln!(
                "{} point(s), {} failed; wrote {} to {}",
                rows.len(),
                failed,
                files.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>().join(", "),
                out.display()
            );
        }
    }
    if failed > 0 {
        1
    } else {
        0
    }
}
