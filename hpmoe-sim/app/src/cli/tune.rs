//! `hpmoe tune`: a program in; its search space (`crate::tune`), the candidates of a seeded
//! search evaluated in parallel on the simulator; the best configurations printed as a table
//! (or JSON) and the best written as a `.hpm` file that `hpmoe run` takes as it is.
//!
//! With `--shard I/N` (or in a Slurm job array) only the shard's candidates run and a part
//! file is written to `--out-dir`; `hpmoe tune FILE --merge DIR...` joins the parts into the
//! outputs of the whole search, byte for byte those of an unsharded run.
//!
//! Exit codes: 0 done, 1 the program does not check or a file cannot be read or written (or
//! every candidate failed), 2 a usage error.

use super::{style, usage, Format, ProgramArgs};
use crate::shard::{self, Shard};
use crate::tune::{self, Outcome, Settings, SetupError, Tuner};
use hpmoe_dsl::diag;
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// The budget when neither `--budget` nor `--time` is given.
pub const DEFAULT_BUDGET: usize = 64;

/// The most candidates a `--time` search without a budget lists.
const TIME_LIMIT_CANDIDATES: usize = 100_000;

/// Options of `hpmoe tune`.
pub(crate) struct TuneCli<'a> {
    pub file: &'a Path,
    pub prog: &'a ProgramArgs,
    pub taskflow: Option<&'a str>,
    pub budget: Option<usize>,
    pub time: Option<f64>,
    pub seed: u64,
    pub jobs: usize,
    pub top: usize,
    pub output: Option<&'a Path>,
    pub format: Format,
    pub max_tasks: u64,
    pub shard: Option<&'a str>,
    /// `--out-dir`, given only with a shard.
    pub out_dir: Option<&'a Path>,
}

fn pool(jobs: usize) -> Result<rayon::ThreadPool, i32> {
    rayon::ThreadPoolBuilder::new().num_threads(jobs).build().map_err(|e| {
        errln!("error: cannot start the worker threads: {e}");
        1
    })
}

fn setup(file: &Path, settings: Settings, pool: &rayon::ThreadPool) -> Result<Tuner, i32> {
    match Tuner::new(file, settings, pool) {
        Ok(t) => Ok(t),
        Err(SetupError::Check(ds, sources)) => {
            errout!("{}", diag::render_all(ds.as_slice(), ds.dropped(), &sources, style()));
            Err(1)
        }
        Err(SetupError::Message(m)) => {
            errln!("error: {m}");
            Err(1)
        }
    }
}

fn bar(n: usize) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(n as u64);
        if let Ok(s) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} candidates, {elapsed} (eta {eta})")
        {
            b.set_style(s);
        }
        b
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// Where a shard writes its part file without `--out-dir`.
const DEFAULT_OUT_DIR: &str = "tune-out";

pub(crate) fn tune(o: &TuneCli) -> i32 {
    let shard = match Shard::from_args(o.shard) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    // Each output option belongs to one mode: refused in the other rather than ignored.
    if shard.is_none() && o.out_dir.is_some() {
        return usage(
            "--out-dir is where a shard writes its part file: give --shard I/N (or run in a Slurm job array), or leave it out".into(),
        );
    }
    if shard.is_some() && o.output.is_some() {
        return usage(
            "--output is written by a whole search or by --merge; a shard writes its part file to --out-dir".into(),
        );
    }
    let out_dir = o.out_dir.unwrap_or(Path::new(DEFAULT_OUT_DIR));
    if shard.is_some() && o.time.is_some() {
        return usage(
            "--time cannot be sharded (each shard would stop at a different candidate); give --budget".into(),
        );
    }
    if o.budget == Some(0) {
        return usage("--budget must be at least 1 (the file's own configuration)".into());
    }
    if let Some(t) = o.time {
        if !(t.is_finite() && t > 0.0) {
            return usage(format!("--time {t} must be a positive number of seconds"));
        }
    }
    if o.top == 0 {
        return usage("--top must be at least 1".into());
    }
    for s in &o.prog.set {
        if let Err(e) = hpmoe_dsl::check::Override::parse(s) {
            return usage(format!("--set {e}"));
        }
    }
    let checked_path = if let Some(s) = shard {
        super::paths::output_dir("--out-dir", out_dir)
            .and_then(|()| super::paths::files_in_dir("--out-dir", out_dir, [s.file_name("tune").as_str()]))
    } else {
        let written = o.output.map_or_else(|| default_output(o.file), Path::to_path_buf);
        super::paths::output_file("--output", &written)
            .and_then(|()| super::paths::distinct_outputs(o.file, &[("--output", &written)]))
    };
    if let Err(e) = checked_path {
        return usage(e);
    }
    let settings = Settings {
        set: o.prog.set.clone(),
        device: o.prog.device.clone(),
        routing: o.prog.routing.clone(),
        allow_path: o.prog.allow_path.clone(),
        taskflow: o.taskflow.map(str::to_string),
        seed: o.seed,
        max_tasks: o.max_tasks,
    };
    let pool = match pool(o.jobs) {
        Ok(p) => p,
        Err(c) => return c,
    };
    let t = match setup(o.file, settings, &pool) {
        Ok(t) => t,
        Err(c) => return c,
    };
    if shard.is_none() {
        let written = o.output.map_or_else(|| default_output(o.file), Path::to_path_buf);
        if let Err(e) = super::paths::outputs_not_read(&t.read, &[("--output", &written)]) {
            return usage(e);
        }
    }
    let budget = match (o.budget, o.time) {
        (Some(b), _) => b,
        (None, Some(_)) => TIME_LIMIT_CANDIDATES,
        (None, None) => DEFAULT_BUDGET,
    };
    if let Err(e) = t.check_budget(budget) {
        return usage(e);
    }
    let cands = t.candidates(budget);
    let indices: Vec<usize> = (0..cands.len()).filter(|&i| shard.is_none_or(|s| s.owns(i))).collect();
    let pb = bar(indices.len());
    let deadline = o
        .time
        .map(|secs| std::time::Instant::now() + std::time::Duration::from_secs_f64(secs.min(1e9)));
    let batch = pool.current_num_threads().max(1) * 2;
    let outcomes = tune::evaluate(&t, &cands, &indices, &pool, batch, deadline, &|| pb.inc(1));
    pb.finish_and_clear();
    if let Some(s) = shard {
        let part = tune::part(&t, budget, cands.len(), s, &outcomes);
        return match shard::write_part(out_dir, "tune", s, &part) {
            Ok(path) => {
                let failed = outcomes.iter().filter(|r| r.latency_us.is_err()).count();
                if o.format == Format::Human {
                    outln!(
                        "shard {} of {}: {} of {} candidate(s), {} failed; wrote {}",
                        s.index,
                        s.count,
                        outcomes.len(),
                        cands.len(),
                        failed,
                        path.display()
                    );
                } else {
                    outln!(
                        "{}",
                        json!({"shard": s.index, "shards": s.count, "candidates": outcomes.len(), "failed": failed, "part": path.display().to_string()})
                    );
                }
                0
            }
            Err(e) => {
                errln!("error: {e}");
                1
            }
        };
    }
    let budget_shown = o.budget.or(if o.time.is_some() { None } else { Some(budget) });
    report(&t, &cands, &outcomes, budget_shown, o.top, o.output, o.format)
}

/// `hpmoe tune FILE --merge DIR...`.
pub(crate) fn merge(
    file: &Path,
    dirs: &[PathBuf],
    jobs: usize,
    top: usize,
    output: Option<&Path>,
    format: Format,
) -> i32 {
    if top == 0 {
        return usage("--top must be at least 1".into());
    }
    let written = output.map_or_else(|| default_output(file), Path::to_path_buf);
    if let Err(e) = super::paths::output_file("--output", &written)
        .and_then(|()| super::paths::distinct_outputs(file, &[("--output", &written)]))
    {
        return usage(e);
    }
    let parts = match shard::read_parts(dirs, "tune") {
        Ok(p) => p,
        Err(e) => {
            errln!("error: {e}");
            return 1;
        }
    };
    let settings = match Settings::from_json(&parts[0]["settings"]) {
        Ok(s) => s,
        Err(e) => {
            errln!("error: cannot merge the tune parts: {e}");
            return 1;
        }
    };
    let (budget, n, outcomes) = match tune::merge(&parts) {
        Ok(x) => x,
        Err(e) => {
            errln!("error: cannot merge the tune parts: {e}");
            return 1;
        }
    };
    let pool = match pool(jobs) {
        Ok(p) => p,
        Err(c) => return c,
    };
    let t = match setup(file, settings, &pool) {
        Ok(t) => t,
        Err(c) => return c,
    };
    if let Err(e) = super::paths::outputs_not_read(&t.read, &[("--output", &written)]) {
        return usage(e);
    }
    if parts[0]["fingerprint"].as_str() != Some(t.fingerprint(budget).as_str()) {
        errln!(
            "error: the parts were not computed from this text of `{}` (the file changed, or they come from another file)",
            file.display()
        );
        return 1;
    }
    if let Err(e) = t.check_budget(budget) {
        errln!("error: cannot merge the tune parts: {e}");
        return 1;
    }
    let cands = t.candidates(budget);
    if cands.len() != n {
        errln!(
            "error: the parts list {n} candidates but this search has {}; they come from another version of hpmoe",
            cands.len()
        );
        return 1;
    }
    report(&t, &cands, &outcomes, Some(budget), top, output, format)
}

/// The default name of the best configuration's file: `STEM.tuned.hpm` in the working
/// directory.
fn default_output(file: &Path) -> PathBuf {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tuned".into());
    PathBuf::from(format!("{stem}.tuned.hpm"))
}

fn report(
    t: &Tuner,
    cands: &[Vec<u16>],
    outcomes: &[Outcome],
    budget: Option<usize>,
    top: usize,
    output: Option<&Path>,
    format: Format,
) -> i32 {
    let rank = tune::ranking(outcomes);
    let failed = outcomes.len() - rank.len();
    let default = outcomes.iter().find(|o| o.index == 0).map(|o| &o.latency_us);
    let Some(&(best, best_lat)) = rank.first() else {
        let why = match default {
            Some(Err(e)) => format!(": the file's own configuration fails with {e}"),
            _ => String::new(),
        };
        errln!("error: none of the {} evaluated candidate(s) ran{why}", outcomes.len());
        return 1;
    };
    let path = output.map_or_else(|| default_output(&t.file), Path::to_path_buf);
    let text = t.text(&cands[best]);
    if let Err(e) = hpmoe_dsl::outfile::write(&path, &text) {
        errln!("error: cannot write `{}`: {e}", path.display());
        return 1;
    }
    let def = default.and_then(|d| d.as_ref().ok()).copied();
    let speedup = |l: f64| def.filter(|_| l > 0.0).map(|d| d / l);
    let rows: Vec<(usize, usize, f64)> = rank
        .iter()
        .take(top)
        .enumerate()
        .map(|(k, &(i, l))| (k + 1, i, l))
        .collect();
    let verdict = match (def, default) {
        (Some(d), _) if best != 0 && best_lat < d => format!(
            "beat the file's own configuration: {best_lat:.1} us against {d:.1} us ({:.3}x, {:.1}% less)",
            d / best_lat,
            100.0 * (d - best_lat) / d
        ),
        (Some(d), _) => format!(
            "the file's own configuration ({d:.1} us) is already the best of the {} evaluated",
            outcomes.len()
        ),
        (None, Some(Err(e))) => {
            format!("the file's own configuration failed ({e}); the best found runs in {best_lat:.1} us")
        }
        (None, _) => format!("the file's own configuration was not evaluated; the best found runs in {best_lat:.1} us"),
    };
    match format {
        Format::Json => {
            let entry = |k: usize, i: usize, l: f64| {
                json!({
                    "rank": k,
                    "candidate": i,
                    "latency_us": l,
                    "speedup_vs_file": speedup(l),
                    "changes": t.describe(&cands[i]),
                })
            };
            let doc = json!({
                "file": t.file.display().to_string(),
                "taskflow": t.taskflow,
                "policy": t.policy.name(),
                "seed": t.settings.seed,
                "budget": budget,
                "candidates": cands.len(),
                "evaluated": outcomes.len(),
                "failed": failed,
                "space": t.space_json(),
                "file_config": match default {
                    Some(Ok(l)) => json!({"latency_us": l}),
                    Some(Err(e)) => json!({"error": e}),
                    None => json!(null),
                },
                "best": entry(1, best, best_lat),
                "improved": def.is_some_and(|d| best != 0 && best_lat < d),
                "verdict": verdict,
                "expanded_grad_of": t.expanded_from,
                "output": path.display().to_string(),
                "top": rows.iter().map(|&(k, i, l)| entry(k, i, l)).collect::<Vec<_>>(),
            });
            out!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n");
        }
        Format::Human => {
            let choices = t.coords.iter().fold(1usize, |a, c| a.saturating_mul(c.values.len()));
            outln!(
                "tune {} of {} under {}: {} candidate(s) evaluated, {} failed, seed {}; a space of {} coordinate(s), {} configuration(s)",
                t.taskflow,
                t.file.display(),
                t.policy.name(),
                outcomes.len(),
                failed,
                t.settings.seed,
                t.coords.len(),
                choices
            );
            if let Some(f) = &t.expanded_from {
                outln!(
                    "`{}` is derived by `grad` from `{f}`: tuned with the file's `grad` declarations written out as source (as `hpmoe fmt --expand-grad` writes them), and so is the file written",
                    t.taskflow
                );
            }
            outln!(
                "{:>4}  {:>9}  {:>12}  {:>8}  configuration",
                "rank",
                "candidate",
                "latency us",
                "vs file"
            );
            for &(k, i, l) in &rows {
                outln!(
                    "{:>4}  {:>9}  {:>12.1}  {:>8}  {}",
                    k,
                    i,
                    l,
                    speedup(l).map(|s| format!("{s:.3}x")).unwrap_or_else(|| "-".into()),
                    t.describe(&cands[i])
                );
            }
            outln!("{verdict}");
            outln!("wrote the best configuration to {}", path.display());
        }
    }
    0
}
