//! The command-line interface: arguments in (clap), output on stdout/stderr and an exit code
//! out: 0 success, 1 a user error (diagnostics printed), 2 a usage error.
//!
//! Subcommands live in their own files: `lower.rs` (`hpmoe lower`), `run.rs` (`hpmoe run`),
//! `scale.rs` (`hpmoe scale`), `sweep.rs` (`hpmoe sweep`), `tune.rs` (`hpmoe tune`).

use clap::{Parser, Subcommand, ValueEnum};
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::diag::{self, RenderStyle};
use hpmoe_dsl::SourceMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

mod lower;
pub(crate) mod paths;
mod run;
mod scale;
mod sweep;
mod tune;

/// Options of `hpmoe lower` past checking.
pub(crate) struct LowerCli<'a> {
    pub format: Format,
    pub policy: Option<&'a str>,
    pub taskflow: Option<&'a str>,
    pub max_tasks: u64,
    pub verify: bool,
}

#[derive(Parser, Debug)]
#[command(
    name = "hpmoe",
    version,
    about = "Design, verify and simulate tile-level MoE schedules for Ascend NPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Colours in diagnostics and the REPL: `auto` (on a terminal, unless `NO_COLOR` is set),
    /// `always` or `never`.
    #[arg(long, global = true, value_enum, default_value_t = ColorWhen::Auto)]
    color: ColorWhen,
}

/// When to use colours (`--color`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ColorWhen {
    /// On a terminal, unless `NO_COLOR` is set.
    Auto,
    /// Always, even into a pipe or a file.
    Always,
    /// Never.
    Never,
}

/// The `--color` choice of this process (set once at start-up).
static COLOR: std::sync::OnceLock<ColorWhen> = std::sync::OnceLock::new();

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Text for people (diagnostics on stderr).
    Human,
    /// One JSON document on stdout.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// The typed op graph.
    Ops,
    /// The tile tasks and their dependencies.
    Tasks,
    /// The static schedule: core queues and counters.
    Schedule,
    /// Per-rank and per-expert receive counts of every routing.
    Routing,
}

/// How a program is configured from the command line.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ProgramArgs {
    /// Override a param (`tokens=1024`) or a device field (`device.link_efficiency=0.5`,
    /// `device.hbm_bandwidth=1.2TB/s`).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// Use this device profile instead of the declared one: `ascend_910b`, `ascend_910b3`,
    /// `ascend_a3`, or a `profile` the program declares.
    #[arg(long, value_name = "PROFILE")]
    pub device: Option<String>,
    /// Replace the routing: `zipf(s: 1.2, seed: 3)`, `hotspot(max_over_mean: 2)`, or
    /// `NAME=KIND(...)` when there are several; unspecified arguments keep their values.
    #[arg(long, value_name = "[NAME=]KIND(ARGS)")]
    pub routing: Option<String>,
    /// Also read imports and `file(...)` routings from this directory (besides the
    /// program's own directory tree).
    #[arg(long = "allow-path", value_name = "DIR")]
    pub allow_path: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a program: names, types, shapes, engines, buffers, routings.
    Check {
        /// The program: a `.hpm` file.
        file: PathBuf,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Output: text for people, or one JSON document on stdout (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Check and print an intermediate form: the op graph, the routing, the tile tasks or
    /// the schedule.
    Lower {
        /// The program: a `.hpm` file.
        file: PathBuf,
        /// What to print: the op graph, the routing's receive counts, the tile tasks or the
        /// schedule.
        #[arg(long, value_enum, default_value_t = Emit::Ops)]
        emit: Emit,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Output: text for people, or one JSON document on stdout (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Scheduling policy: `kernel_by_kernel`, `expert_level` or `interleaved` (default: the
        /// program's `schedule`, else interleaved).
        #[arg(long)]
        policy: Option<String>,
        /// Only this taskflow (default: all).
        #[arg(long)]
        taskflow: Option<String>,
        /// Refuse to lower to more tasks than this.
        #[arg(long, default_value_t = hpmoe_dsl::lower::DEFAULT_MAX_TASKS)]
        max_tasks: u64,
        /// Skip verification (for experiments; a broken schedule may then hang a device).
        #[arg(long)]
        no_verify: bool,
    },
    /// Simulate a program on the device model: latency, phases, utilisation, exposed
    /// communication, L2 hit rate, lower bound; optionally compare two policies and write a
    /// Chrome trace and a Gantt chart.
    #[command(group(clap::ArgGroup::new("numerics_on").multiple(true)
        .args(["numerics", "bf16_storage", "inputs", "dump"])))]
    #[command(group(clap::ArgGroup::new("trace_out").multiple(true).args(["trace", "gantt"])))]
    Run {
        /// The program: a `.hpm` file.
        file: PathBuf,
        /// Scheduling policy: `kernel_by_kernel`, `expert_level` or `interleaved` (default: the
        /// program's `schedule`, else interleaved).
        #[arg(long)]
        policy: Option<String>,
        /// Also run this policy (`kernel_by_kernel`, `expert_level` or `interleaved`) and print
        /// the speedup of `--policy` over it.
        #[arg(long, value_name = "POLICY")]
        compare: Option<String>,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Output: text for people, or one JSON document on stdout (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Write a Chrome trace (JSON, opens in Perfetto).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Write a Gantt chart (SVG).
        #[arg(long, value_name = "FILE")]
        gantt: Option<PathBuf>,
        /// Ranks in the trace and chart (`0,3` or `0-3`; the chart defaults to rank 0).
        #[arg(long, value_name = "LIST", requires = "trace_out")]
        trace_ranks: Option<String>,
        /// Time window of the trace and chart in microseconds (`START..END`).
        #[arg(long, value_name = "A..B", requires = "trace_out")]
        trace_window: Option<String>,
        /// Refuse to lower to more tasks than this.
        #[arg(long, default_value_t = hpmoe_dsl::lower::DEFAULT_MAX_TASKS)]
        max_tasks: u64,
        /// Skip verification (a broken schedule then ends with a wait-for report).
        #[arg(long)]
        no_verify: bool,
        /// Only this taskflow (default: all).
        #[arg(long)]
        taskflow: Option<String>,
        /// Also execute every task's arithmetic (f32, in simulated start order) on seeded
        /// inputs and compare the outputs with dense and per-token references.
        #[arg(long)]
        numerics: bool,
        /// Round stores of bf16 tensors to bf16, as the device does (implies --numerics).
        #[arg(long)]
        bf16_storage: bool,
        /// An input from a .npy file with a leading rank axis (implies --numerics).
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Write inputs, routing and outputs as .npy files here (implies --numerics).
        #[arg(long, value_name = "DIR")]
        dump: Option<PathBuf>,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0, requires = "numerics_on")]
        seed: u64,
        /// Memory the numerics may use, in MiB.
        #[arg(long, value_name = "MIB", default_value_t = 2048, requires = "numerics_on")]
        numerics_memory: u64,
        /// Print each stage's wall-clock time, the graph's size and the peak memory (to
        /// stderr, or under `timings` in JSON).
        #[arg(long)]
        timings: bool,
        /// Prepare and simulate the schedule chosen among candidates again, as its own
        /// `prepare` and `simulate` stages (by default the choice's own simulation of it is
        /// reported, which is the same to the bit): for timing those stages alone.
        #[arg(long)]
        resimulate: bool,
        /// Solve the link rates exactly at every simulated instant, however long that takes
        /// (by default, a simulation whose solves would pass their budget, as with many ranks
        /// putting to many others, re-shares them at short intervals instead and says so).
        #[arg(long)]
        exact_links: bool,
        /// Taskflows and policies to run at once (0: one per CPU). Each holds its own task
        /// graph, so fewer jobs use less memory; the output is the same whatever the number.
        /// A job running alone simulates its candidate schedules two at a time when memory
        /// allows.
        #[arg(long, default_value_t = 0, value_parser = jobs_parser())]
        jobs: usize,
    },
    /// Simulate a grid of configurations (`--vary`) under several policies in parallel;
    /// write sweep.csv, sweep.json and SVG charts.
    ///
    /// `--shard I/N` (or a Slurm job array) runs only every N-th point from I and writes a part
    /// file to `--out`; `--merge DIR...` joins the parts into the outputs of the whole grid.
    Sweep {
        /// The program (optional with --merge: then the parts must come from its text).
        #[arg(required_unless_present = "merge")]
        file: Option<PathBuf>,
        /// An axis: a param (`ranks=4,8,16`), a device field (`device.link_efficiency=0.5,1`),
        /// `device=PROFILE,...`, `schedule.OPTION=...` (a policy option, e.g.
        /// `schedule.interleave_backward=true,false`) or `routing=...`. Values are separated by
        /// commas outside parentheses, or by `;` when there is one
        /// (`routing=zipf(s: 0.5);zipf(s: 1.2)`). Repeat for a cartesian grid.
        #[arg(long, value_name = "NAME=V1,V2,...")]
        vary: Vec<String>,
        /// Scheduling policies, comma-separated: any of `kernel_by_kernel`, `expert_level` and
        /// `interleaved`.
        #[arg(long, default_value = "kernel_by_kernel,expert_level,interleaved")]
        policy: String,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Only this taskflow (default: the first).
        #[arg(long)]
        taskflow: Option<String>,
        /// Directory for sweep.csv, sweep.json and the charts.
        #[arg(long, default_value = "sweep-out")]
        out: PathBuf,
        /// Worker threads (0: one per CPU).
        #[arg(long, default_value_t = 0, value_parser = jobs_parser())]
        threads: usize,
        /// Output: text for people, or one JSON document on stdout (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Refuse to lower to more tasks than this.
        #[arg(long, default_value_t = hpmoe_dsl::lower::DEFAULT_MAX_TASKS)]
        max_tasks: u64,
        /// Run only shard I of N (0-based): the points i with i % N == I; write a part file
        /// to --out. Default: from SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT when set.
        #[arg(long, value_name = "I/N", conflicts_with = "merge")]
        shard: Option<String>,
        /// Join the part files in these directories into the sweep's outputs (in --out). The
        /// grid's settings come from the parts: the options that make a grid are refused.
        #[arg(long, value_name = "DIR", num_args = 1..,
              conflicts_with_all = ["vary", "shard", "policy", "set", "device", "routing", "allow_path", "taskflow", "threads", "max_tasks"])]
        merge: Vec<PathBuf>,
    },
    /// Search tile sizes, `order(ratr)`, priorities and policy options of a taskflow with the
    /// simulator as the cost model; print the best configurations and write the best as a
    /// `.hpm` file that `hpmoe run` takes as it is.
    ///
    /// The file's own configuration is always evaluated first, so the result is never worse.
    /// Deterministic for a given seed and budget, whatever --jobs; --time is not. `--shard
    /// I/N` (or a Slurm job array) evaluates every N-th candidate from I and writes a part
    /// file to --out-dir; `--merge DIR...` joins the parts into the outputs of the whole search.
    Tune {
        /// The program: a `.hpm` file.
        file: PathBuf,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Only this taskflow (default: the first).
        #[arg(long)]
        taskflow: Option<String>,
        /// Candidates to evaluate, the file's own configuration included (default 64).
        #[arg(long, value_name = "N")]
        budget: Option<usize>,
        /// Stop starting new candidates after this many seconds (the result then depends on
        /// the machine's speed: not deterministic).
        #[arg(long, value_name = "SECS")]
        time: Option<f64>,
        /// Seed of the search.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Candidates evaluated at once (0: one per CPU); the result is the same whatever the
        /// number.
        #[arg(long, default_value_t = 0, value_parser = jobs_parser())]
        jobs: usize,
        /// Configurations in the table.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Where to write the best configuration (default: STEM.tuned.hpm here).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
        /// Output: text for people, or one JSON document on stdout (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Refuse to lower to more tasks than this.
        #[arg(long, default_value_t = hpmoe_dsl::lower::DEFAULT_MAX_TASKS)]
        max_tasks: u64,
        /// Evaluate only shard I of N (0-based): the candidates i with i % N == I; write a part
        /// file to --out-dir. Default: from SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT.
        #[arg(long, value_name = "I/N", conflicts_with = "merge")]
        shard: Option<String>,
        /// Directory for the part file of a shard (default: tune-out); only with a shard.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
        /// Join the part files in these directories (the search's settings come from them).
        #[arg(long, value_name = "DIR", num_args = 1..,
              conflicts_with_all = ["set", "device", "routing", "allow_path", "taskflow", "budget", "time", "seed", "max_tasks", "out_dir"])]
        merge: Vec<PathBuf>,
    },
    /// Measure how the tool scales: run the whole pipeline once per value of a param, each
    /// in a fresh process running one job at a time, and tabulate tasks, edges, seconds per stage, peak memory and the
    /// growth of each stage's time with the task count.
    Scale {
        /// The program: a `.hpm` file.
        file: PathBuf,
        /// The param (or device field) to scale.
        #[arg(long, default_value = "ranks")]
        param: String,
        /// Its values, comma-separated.
        #[arg(long, default_value = "8,16,32,64,128,256")]
        values: String,
        /// Scheduling policy: `kernel_by_kernel`, `expert_level` or `interleaved` (default: the
        /// program's `schedule`, else interleaved).
        #[arg(long)]
        policy: Option<String>,
        /// Only this taskflow (default: all).
        #[arg(long)]
        taskflow: Option<String>,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Run every point this many times and keep each stage's fastest time.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Refuse to lower to more tasks than this.
        #[arg(long, default_value_t = hpmoe_dsl::lower::DEFAULT_MAX_TASKS)]
        max_tasks: u64,
        /// Output: a table for people, a Markdown table, or one JSON document on stdout
        /// (docs/FORMATS.md).
        #[arg(long, value_enum, default_value_t = scale::ScaleFormat::Human)]
        format: scale::ScaleFormat,
    },
    /// Format a program in the canonical layout (in place, or check only).
    ///
    /// With `--expand-grad`, each `taskflow B = grad(F, ...);` declaration is replaced by the
    /// taskflow and ops it derives, written as ordinary source: the program is checked
    /// first, and the expanded text is checked again before it is written.
    Fmt {
        /// The `.hpm` files to format.
        files: Vec<PathBuf>,
        /// Do not write; exit with 1 if a file is not formatted.
        #[arg(long)]
        check: bool,
        /// Print the formatted text instead of writing the file.
        #[arg(long, conflicts_with = "check")]
        stdout: bool,
        /// Replace every `grad` declaration by the derived taskflow and ops (with the sizes
        /// the program's params give them).
        #[arg(long, conflicts_with = "check")]
        expand_grad: bool,
        /// With `--expand-grad`: also read imports and `file(...)` routings from this
        /// directory (besides the program's own directory tree).
        #[arg(long = "allow-path", value_name = "DIR", requires = "expand_grad")]
        allow_path: Vec<PathBuf>,
    },
    /// An interactive session: set parameters, run, compare, inspect tasks, explain waits.
    ///
    /// Load a program, change params, the device, the routing or the policy, run and compare
    /// policies, show tasks and core queues, and ask why a task started when it did. Reads
    /// commands from stdin when it is not a terminal (exit code 1 if any command failed).
    Repl {
        /// A program to load at the start (`:load FILE` loads one later).
        file: Option<PathBuf>,
        #[command(flatten)]
        prog: ProgramArgs,
        /// Scheduling policy: `kernel_by_kernel`, `expert_level` or `interleaved` (default: the
        /// program's `schedule`, else interleaved).
        #[arg(long)]
        policy: Option<String>,
        /// Do not print how long each stage took (also `HPMOE_REPL_NO_TIMINGS=1`).
        #[arg(long)]
        no_timings: bool,
        /// Echo each command with a prompt before its output, for transcripts of scripts
        /// (also `HPMOE_REPL_ECHO=1`).
        #[arg(long)]
        echo: bool,
    },
    /// A language server for editors on stdin/stdout: diagnostics, hover, go to definition,
    /// completion, formatting and semantic tokens for `.hpm` files (docs/EDITORS.md).
    Lsp,
    /// Explain an error code (`hpmoe explain E0501`), or list them all.
    Explain {
        /// The code (`E0501`, `0501` or the code's name, `shape-mismatch`).
        code: Option<String>,
        /// List every code with its one-line summary.
        #[arg(long, conflicts_with = "code")]
        list: bool,
    },
    /// Print a shell completion script (`hpmoe completions bash > ~/.local/share/bash-completion/completions/hpmoe`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) of hpmoe (`hpmoe man > hpmoe.1; man ./hpmoe.1`).
    Man,
}

/// Runs the CLI on the process arguments; returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Rendered as clap prints it (styled on a terminal), but through the writers that
            // report write errors; `--help` and `--version` go to stdout.
            let styled = e.render();
            let terminal = if e.use_stderr() {
                std::io::stderr().is_terminal()
            } else {
                std::io::stdout().is_terminal()
            };
            let text = if terminal {
                styled.ansi().to_string()
            } else {
                styled.to_string()
            };
            if e.use_stderr() {
                errout!("{text}");
                return 2;
            }
            out!("{text}");
            return 0;
        }
    };
    let _ = COLOR.set(cli.color);
    run(cli.command)
}

/// Whether diagnostics on stderr use colours and box drawing: `--color`, then `NO_COLOR`
/// and whether stderr is a terminal.
pub(crate) fn style() -> RenderStyle {
    let on = match COLOR.get().copied().unwrap_or(ColorWhen::Auto) {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            std::io::stderr().is_terminal() && !no_color
        }
    };
    if on {
        RenderStyle::Graphical
    } else {
        RenderStyle::Plain
    }
}

/// Prints a usage error; its exit code (2).
pub(crate) fn usage(msg: String) -> i32 {
    errln!("error: {msg}");
    2
}

/// The most worker threads `--jobs` / `--threads` may ask for: each thread holds a stack
/// (and a task graph), so an unbounded count exhausts memory before any work starts.
pub(crate) const MAX_JOBS: u64 = 256;

fn jobs_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_JOBS)
}

fn parse_overrides(set: &[String]) -> Result<Vec<Override>, String> {
    let list: Vec<Override> = set.iter().map(|s| Override::parse(s)).collect::<Result<_, _>>()?;
    // The same name twice would leave one value silently unused.
    let mut seen = std::collections::HashSet::new();
    for o in &list {
        if !seen.insert(o.name.as_str()) {
            return Err(format!("`{}` is set twice; give each name once", o.name));
        }
    }
    Ok(list)
}

/// Checks a file; prints diagnostics; returns the program on success, with its warnings and
/// the count of those the list left out (for `--format json` outputs, where they are part of
/// the document: `human` output has already printed them on stderr).
pub(crate) fn checked(
    file: &std::path::Path,
    prog: &ProgramArgs,
    format: Format,
) -> Result<(hpmoe_dsl::driver::Checked, SourceMap, diag::Diagnostics), i32> {
    let overrides = match parse_overrides(&prog.set) {
        Ok(o) => o,
        Err(e) => {
            errln!("error: --set {e}");
            return Err(2);
        }
    };
    let opts = Options {
        overrides,
        device: prog.device.clone(),
        routing: prog.routing.clone(),
        allow_paths: prog.allow_path.clone(),
    };
    let mut sources = SourceMap::new();
    let outcome = hpmoe_dsl::driver::check_path(file, &opts, &mut sources);
    let ds = outcome.diagnostics;
    match format {
        Format::Human => {
            if !ds.is_empty() {
                errout!("{}", diag::render_all(ds.as_slice(), ds.dropped(), &sources, style()));
            }
        }
        Format::Json => {
            if outcome.checked.is_none() {
                let list: Vec<_> = ds.as_slice().iter().map(|d| diag::to_json(d, &sources)).collect();
                let mut doc = serde_json::json!({ "ok": false, "diagnostics": list });
                ds.dropped().add_to_json(&mut doc);
                outln!("{}", doc);
            }
        }
    }
    match outcome.checked {
        Some(p) => Ok((p, sources, ds)),
        None => Err(1),
    }
}

/// `lower`'s options that only the task graph uses are refused with `--emit ops` and
/// `--emit routing`, which would otherwise ignore them.
fn lower_options_apply(
    emit: Emit,
    policy: Option<&str>,
    taskflow: Option<&str>,
    max_tasks: u64,
    no_verify: bool,
) -> Result<(), String> {
    if matches!(emit, Emit::Tasks | Emit::Schedule) {
        return Ok(());
    }
    let kind = if emit == Emit::Ops { "ops" } else { "routing" };
    let given = [
        ("--policy", policy.is_some()),
        ("--taskflow", taskflow.is_some()),
        ("--max-tasks", max_tasks != hpmoe_dsl::lower::DEFAULT_MAX_TASKS),
        ("--no-verify", no_verify),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((name, _)) => Err(format!(
            "{name} applies to `--emit tasks` and `--emit schedule`, not to `--emit {kind}`"
        )),
        None => Ok(()),
    }
}

/// The program options of a command, if it has them.
fn program_args(cmd: &Command) -> Option<&ProgramArgs> {
    match cmd {
        Command::Check { prog, .. }
        | Command::Lower { prog, .. }
        | Command::Run { prog, .. }
        | Command::Sweep { prog, .. }
        | Command::Tune { prog, .. }
        | Command::Scale { prog, .. }
        | Command::Repl { prog, .. } => Some(prog),
        _ => None,
    }
}

/// Each `--allow-path` must be an existing directory, given once: a file, a missing path or
/// a repetition would otherwise be accepted and allow nothing (or allow it twice).
fn check_allow_paths(paths: &[PathBuf]) -> Result<(), String> {
    let mut seen: Vec<PathBuf> = Vec::new();
    for p in paths {
        let shown = p.display();
        let meta = std::fs::metadata(p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("--allow-path `{shown}` does not exist"),
            _ => format!("--allow-path `{shown}`: {e}"),
        })?;
        if !meta.is_dir() {
            return Err(format!("--allow-path `{shown}` is not a directory"));
        }
        let canonical = std::fs::canonicalize(p).map_err(|e| format!("--allow-path `{shown}`: {e}"))?;
        if seen.contains(&canonical) {
            return Err(format!("--allow-path `{shown}` is given twice"));
        }
        seen.push(canonical);
    }
    Ok(())
}

fn run(cmd: Command) -> i32 {
    if let Some(prog) = program_args(&cmd) {
        if let Err(e) = check_allow_paths(&prog.allow_path) {
            return usage(e);
        }
        // Every command refuses a malformed or repeated `--set` before any work (tune, sweep
        // and the REPL took the last of a name given twice).
        if let Err(e) = parse_overrides(&prog.set) {
            return usage(format!("--set {e}"));
        }
    }
    match cmd {
        Command::Check { file, prog, format } => {
            // The process ends after this check: its syntax trees are not freed one node at
            // a time but left to the operating system at exit.
            hpmoe_dsl::driver::keep_trees_until_exit();
            match checked(&file, &prog, format) {
                Ok((p, sources, warnings)) => {
                    if format == Format::Json {
                        let list: Vec<_> = warnings.as_slice().iter().map(|d| diag::to_json(d, &sources)).collect();
                        let mut doc = serde_json::json!({ "ok": true, "diagnostics": list, "taskflows": p.taskflows.iter().map(|t| t.name.clone()).collect::<Vec<_>>(), "grads": grad_memory_json(&p) });
                        warnings.dropped().add_to_json(&mut doc);
                        outln!("{}", doc);
                    } else {
                        let nodes: usize = p.taskflows.iter().map(|t| t.nodes.len()).sum();
                        outln!(
                            "ok: {} taskflow(s), {} op call(s), {} routing(s), device {} with {} ranks",
                            p.taskflows.len(),
                            nodes,
                            p.routes.len(),
                            p.device.profile,
                            p.device.ranks()
                        );
                        for line in grad_memory_text(&p) {
                            outln!("{line}");
                        }
                    }
                    0
                }
                Err(code) => code,
            }
        }
        Command::Lower {
            file,
            emit,
            prog,
            format,
            policy,
            taskflow,
            max_tasks,
            no_verify,
        } => {
            if let Err(e) = lower_options_apply(emit, policy.as_deref(), taskflow.as_deref(), max_tasks, no_verify) {
                return usage(e);
            }
            match checked(&file, &prog, format) {
                Ok((p, sources, warnings)) => {
                    if format == Format::Json && !warnings.is_empty() {
                        // The JSON on stdout is the lowered program alone: warnings go to stderr.
                        errout!(
                            "{}",
                            diag::render_all(warnings.as_slice(), warnings.dropped(), &sources, style())
                        );
                    }
                    let opts = LowerCli {
                        format,
                        policy: policy.as_deref(),
                        taskflow: taskflow.as_deref(),
                        max_tasks,
                        verify: !no_verify,
                    };
                    match emit {
                        Emit::Ops => {
                            match format {
                                Format::Human => out!("{}", hpmoe_dsl::ir::program_text(&p)),
                                Format::Json => outln!(
                                    "{}",
                                    serde_json::to_string_pretty(&hpmoe_dsl::ir::program_json(&p)).unwrap_or_default()
                                ),
                            }
                            0
                        }
                        Emit::Routing => lower::routing(&p, &opts, &sources),
                        Emit::Tasks | Emit::Schedule => lower::tasks(&p, &opts, &sources, emit == Emit::Schedule),
                    }
                }
                Err(code) => code,
            }
        }
        Command::Run {
            file,
            policy,
            compare,
            prog,
            format,
            trace,
            gantt,
            trace_ranks,
            trace_window,
            max_tasks,
            no_verify,
            taskflow,
            numerics,
            bf16_storage,
            inputs,
            dump,
            seed,
            numerics_memory,
            timings,
            resimulate,
            exact_links,
            jobs,
        } => {
            let mut parsed = Vec::new();
            for i in &inputs {
                match i.split_once('=') {
                    Some((n, f)) if !n.trim().is_empty() && !f.trim().is_empty() => {
                        let n = n.trim().to_string();
                        if parsed.iter().any(|(m, _)| *m == n) {
                            errln!("error: --input `{n}` is given twice");
                            return 2;
                        }
                        parsed.push((n, PathBuf::from(f.trim())))
                    }
                    _ => {
                        errln!("error: --input `{i}` is not of the form NAME=FILE.npy");
                        return 2;
                    }
                }
            }
            let numerics = (numerics || bf16_storage || dump.is_some() || !parsed.is_empty()).then(|| {
                hpmoe_sim::numerics::NumericsOptions {
                    seed,
                    bf16_storage,
                    memory_limit: numerics_memory.saturating_mul(1 << 20),
                    inputs: parsed,
                    dump: dump.clone(),
                    ..Default::default()
                }
            });
            run::run(&run::RunCli {
                file: &file,
                prog: &prog,
                format,
                policy: policy.as_deref(),
                compare: compare.as_deref(),
                taskflow: taskflow.as_deref(),
                max_tasks,
                verify: !no_verify,
                trace: trace.as_deref(),
                gantt: gantt.as_deref(),
                trace_ranks: trace_ranks.as_deref(),
                trace_window: trace_window.as_deref(),
                numerics,
                timings,
                resimulate,
                exact_links,
                jobs,
            })
        }
        Command::Sweep {
            file,
            vary,
            policy,
            prog,
            taskflow,
            out,
            threads,
            format,
            max_tasks,
            shard,
            merge,
        } => {
            if !merge.is_empty() {
                return sweep::merge(&merge, file.as_deref(), &out, format);
            }
            let Some(file) = file else {
                return usage("a program file is needed (or --merge DIR...)".into());
            };
            sweep::sweep(&sweep::SweepCli {
                file: &file,
                prog: &prog,
                vary: &vary,
                policy: &policy,
                taskflow: taskflow.as_deref(),
                out: &out,
                threads,
                format,
                max_tasks,
                shard: shard.as_deref(),
            })
        }
        Command::Tune {
            file,
            prog,
            taskflow,
            budget,
            time,
            seed,
            jobs,
            top,
            output,
            format,
            max_tasks,
            shard,
            out_dir,
            merge,
        } => {
            if !merge.is_empty() {
                return tune::merge(&file, &merge, jobs, top, output.as_deref(), format);
            }
            tune::tune(&tune::TuneCli {
                file: &file,
                prog: &prog,
                taskflow: taskflow.as_deref(),
                budget,
                time,
                seed,
                jobs,
                top,
                output: output.as_deref(),
                format,
                max_tasks,
                shard: shard.as_deref(),
                out_dir: out_dir.as_deref(),
            })
        }
        Command::Scale {
            file,
            param,
            values,
            policy,
            taskflow,
            prog,
            repeat,
            max_tasks,
            format,
        } => scale::scale(&scale::ScaleCli {
            file: &file,
            prog: &prog,
            param: &param,
            values: &values,
            policy: policy.as_deref(),
            taskflow: taskflow.as_deref(),
            repeat,
            max_tasks,
            format,
        }),
        Command::Fmt {
            files,
            check,
            stdout,
            expand_grad,
            allow_path,
        } => {
            if expand_grad {
                fmt_expand_grad(&files, stdout, &allow_path)
            } else {
                fmt(&files, check, stdout)
            }
        }
        Command::Explain { code, list } => explain(code.as_deref(), list),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut cmd, "hpmoe", &mut buf);
            out!("{}", String::from_utf8_lossy(&buf));
            0
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            let mut buf = Vec::new();
            match clap_mangen::Man::new(cmd).render(&mut buf) {
                Ok(()) => {
                    out!("{}", String::from_utf8_lossy(&buf));
                    0
                }
                Err(e) => {
                    errln!("error: cannot render the manual page: {e}");
                    1
                }
            }
        }
        Command::Lsp => crate::lsp::main(),
        Command::Repl {
            file,
            prog,
            policy,
            no_timings,
            echo,
        } => crate::repl::main(crate::repl::ReplOptions {
            file,
            set: prog.set,
            device: prog.device,
            routing: prog.routing,
            allow_paths: prog.allow_path,
            policy,
            timings: !no_timings,
            echo,
            graphical: style() == RenderStyle::Graphical,
        }),
    }
}

fn fmt(files: &[PathBuf], check: bool, to_stdout: bool) -> i32 {
    if files.is_empty() {
        errln!("error: no files given");
        return 2;
    }
    let mut status = 0;
    for f in files {
        let text = match hpmoe_dsl::check::read_source(f) {
            Ok(t) => t,
            Err(e) => {
                errln!("error: cannot read `{}`: {e}", f.display());
                status = 1;
                continue;
            }
        };
        match hpmoe_dsl::syntax::fmt::format_source(&text) {
            Ok(out) => {
                if to_stdout {
                    out!("{out}");
                } else if check {
                    if out != text {
                        outln!("{} is not formatted", f.display());
                        status = 1;
                    }
                } else if out != text {
                    if let Err(e) = hpmoe_dsl::outfile::write(f, out) {
                        errln!("error: cannot write `{}`: {e}", f.display());
                        status = 1;
                    }
                }
            }
            Err(ds) => {
                let mut sources = SourceMap::new();
                let id = sources.add(f.display().to_string(), Some(f.clone()), text);
                // Bounded as the checker's are: the first ones rendered, the rest counted.
                let mut kept = diag::Diagnostics::new();
                kept.extend(ds.into_iter().map(|mut d| {
                    for l in &mut d.labels {
                        l.span.file = id;
                    }
                    d
                }));
                errout!(
                    "{}",
                    diag::render_all(kept.as_slice(), kept.dropped(), &sources, style())
                );
                status = 1;
            }
        }
    }
    status
}

/// `hpmoe fmt --expand-grad`: each file checked, its `grad` declarations replaced by the
/// derived items, the result checked again, then printed or written.
fn fmt_expand_grad(files: &[PathBuf], to_stdout: bool, allow_paths: &[PathBuf]) -> i32 {
    if files.is_empty() {
        errln!("error: no files given");
        return 2;
    }
    let mut status = 0;
    for f in files {
        match expanded_text(f, allow_paths) {
            Ok(out) => {
                if to_stdout {
                    out!("{out}");
                } else if let Err(e) = hpmoe_dsl::outfile::write(f, out) {
                    errln!("error: cannot write `{}`: {e}", f.display());
                    status = 1;
                }
            }
            Err(code) => status = status.max(code),
        }
    }
    status
}

/// The text of `f` with its `grad` declarations expanded, or the exit code after reporting.
fn expanded_text(f: &std::path::Path, allow_paths: &[PathBuf]) -> Result<String, i32> {
    let prog = ProgramArgs {
        allow_path: allow_paths.to_vec(),
        ..Default::default()
    };
    let (p, sources, _) = checked(f, &prog, Format::Human)?;
    let root = p.grads.first().map(|g| g.span.file).or_else(|| sources.find_path(f));
    let Some(text) = root.and_then(|id| sources.get(id)).map(|s| s.text.clone()) else {
        errln!("error: cannot find the text of `{}`", f.display());
        return Err(1);
    };
    let out = match hpmoe_dsl::driver::expand_grads(&p, &text) {
        Ok(out) => out,
        Err(ds) => {
            errout!(
                "{}",
                diag::render_all(&ds, hpmoe_dsl::diag::Dropped::NONE, &sources, style())
            );
            return Err(1);
        }
    };
    // The expanded program must check as the original did.
    let opts = Options {
        allow_paths: allow_paths.to_vec(),
        ..Default::default()
    };
    let mut again = SourceMap::new();
    let path = std::fs::canonicalize(f).unwrap_or_else(|_| f.to_path_buf());
    let id = again.add(format!("{} (grad expanded)", f.display()), Some(path), out.clone());
    let outcome = hpmoe_dsl::driver::check_file(id, &opts, &mut again);
    if outcome.checked.is_none() {
        errln!(
            "error: the text of `{}` with its `grad` declarations expanded does not check; nothing written",
            f.display()
        );
        let ds = outcome.diagnostics;
        errout!("{}", diag::render_all(ds.as_slice(), ds.dropped(), &again, style()));
        return Err(1);
    }
    Ok(out)
}

fn explain(code: Option<&str>, list: bool) -> i32 {
    let mut out = crate::out::Stdout;
    if list || code.is_none() {
        for c in diag::CODES {
            let _ = writeln!(out, "{}  {:<24} {}", c.code, c.name, c.summary);
        }
        return 0;
    }
    let code = code.unwrap_or_default();
    let found = hpmoe_dsl::Code::parse(code).or_else(|| diag::CODES.iter().find(|c| c.name == code).map(|c| c.code));
    match found {
        Some(c) => {
            let info = c.info();
            let _ = writeln!(out, "{} ({}): {}\n\n{}", c, info.name, info.summary, info.explanation);
            0
        }
        None => {
            errln!("error: `{code}` is not an hpmoe error code; `hpmoe explain --list` lists them");
            1
        }
    }
}

/// The forward tensors a `grad` keeps or recomputes, each with its bytes per rank.
fn grad_tensors(p: &hpmoe_dsl::ir::Program, g: &hpmoe_dsl::ir::GradInfo) -> [Vec<(String, u64)>; 2] {
    let Some(f) = p.taskflow(&g.forward) else {
        return [Vec::new(), Vec::new()];
    };
    let list = |ts: &[hpmoe_dsl::ir::TensorId]| -> Vec<(String, u64)> {
        ts.iter()
            .map(|t| (f.tensor(*t).name.clone(), p.tensor_bytes(f.tensor(*t))))
            .collect()
    };
    [list(&g.saved), list(&g.recomputed)]
}

/// Per derived backward, the memory its choice of saved tensors costs: what it keeps from
/// the forward, and what it recomputes instead of keeping (bytes per rank; a receive window
/// at its capacity).
fn grad_memory_text(p: &hpmoe_dsl::ir::Program) -> Vec<String> {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / 1048576.0);
    let names = |v: &[(String, u64)]| {
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.iter()
                .map(|(n, b)| format!("{n} {}", mib(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    p.grads
        .iter()
        .map(|g| {
            let [saved, recomputed] = grad_tensors(p, g);
            let total = |v: &[(String, u64)]| v.iter().map(|x| x.1).fold(0u64, u64::saturating_add);
            format!(
                "grad {} of {}: keeps {} ({} per rank); recomputes {} ({} per rank not kept)",
                g.taskflow,
                g.forward,
                names(&saved),
                mib(total(&saved)),
                names(&recomputed),
                mib(total(&recomputed))
            )
        })
        .collect()
}

fn grad_memory_json(p: &hpmoe_dsl::ir::Program) -> serde_json::Value {
    let side = |v: Vec<(String, u64)>| -> serde_json::Value {
        v.into_iter()
            .map(|(n, b)| serde_json::json!({ "tensor": n, "bytes_per_rank": b }))
            .collect()
    };
    p.grads
        .iter()
        .map(|g| {
            let [saved, recomputed] = grad_tensors(p, g);
            serde_json::json!({ "taskflow": g.taskflow, "forward": g.forward, "saved": side(saved), "recomputed": side(recomputed) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every subcommand says what it is in `--help`, and so does each
    /// value of an option with a fixed list of values (`--format`, `--emit`, `--color`).
    #[test]
    fn every_argument_and_value_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
                // Switches have the values true and false; the shells of `completions` are
                // their own names.
                if !a.get_action().takes_values() || id == "shell" {
                    continue;
                }
                for v in a.get_possible_values() {
                    if !v.is_hide_set() && v.get_help().is_none() && !a.is_hide_possible_values_set() {
                        missing.push(format!("{path} {id}={}", v.get_name()));
                    }
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "hpmoe", &mut missing);
        assert!(missing.is_empty(), "undescribed in --help: {missing:?}");
    }

    /// Every `--policy` and `--compare` names the three policies; every `--device` names each
    /// device profile of the stdlib (read from `stdlib/device.hpm` itself).
    #[test]
    fn policy_and_device_options_list_their_values() {
        let device_hpm = hpmoe_dsl::stdlib::MODULES
            .iter()
            .find(|(m, _)| *m == "device")
            .map(|(_, text)| *text)
            .expect("the stdlib's device module");
        let profiles: Vec<&str> = device_hpm
            .lines()
            .filter_map(|l| l.strip_prefix("profile "))
            .filter_map(|l| l.split([' ', ':', '{', '(']).next())
            .collect();
        assert!(profiles.len() >= 3, "{profiles:?}");
        let mut seen = 0;
        for sub in Cli::command().get_subcommands() {
            for a in sub.get_arguments() {
                let help = a
                    .get_long_help()
                    .or(a.get_help())
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                let want: Vec<&str> = match a.get_id().as_str() {
                    "policy" | "compare" => vec!["kernel_by_kernel", "expert_level", "interleaved"],
                    "device" => profiles.clone(),
                    _ => continue,
                };
                seen += 1;
                for w in want {
                    assert!(
                        help.contains(&format!("`{w}`")),
                        "`hpmoe {} --{}` does not name `{w}`: {help}",
                        sub.get_name(),
                        a.get_id()
                    );
                }
            }
        }
        assert!(seen >= 10, "only {seen} options checked");
    }
}
