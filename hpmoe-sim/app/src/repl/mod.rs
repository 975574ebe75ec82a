//! `hpmoe repl`: an interactive session. In: a program (a file, definitions typed at the
//! prompt) and commands; out: reports, tables, explanations, traces and dumps.
//!
//! - [`session`](self): the session text (the loaded file plus typed definitions, re-checked
//!   whole; a redefinition replaces the old item), the settings (`:set`) and the commands;
//! - `cache`: the stage caches, so a re-run redoes only the stages a change affects;
//! - `show`, `explain`: the views of a compiled and simulated taskflow;
//! - `input`: whether an input is complete (the parser decides) and buffer editing;
//! - `editor`, `complete`: the terminal front end on reedline (history, completion,
//!   highlighting with the logos lexer, multi-line input).
//!
//! When stdin or stdout is not a terminal, commands are read line by line with the same
//! multi-line rule, nothing is echoed (unless asked), and the exit code is 1 if any command
//! failed (printed an error), else 0.

mod batch;
mod cache;
mod commands;
mod complete;
mod editor;
mod explain;
mod input;
mod session;
mod show;

use hpmoe_dsl::check::Override;
use hpmoe_dsl::diag::RenderStyle;
use session::{Config, Flow, Session};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Names the completer and highlighter know, refreshed after every successful check.
#[derive(Clone, Debug, Default)]
pub struct Names {
    pub params: Vec<String>,
    pub device_fields: Vec<String>,
    pub ops: Vec<String>,
    pub taskflows: Vec<String>,
    pub routes: Vec<String>,
    /// Op call names (`xd`, `h`, ...) of every taskflow.
    pub calls: Vec<String>,
    /// Names currently set with `:set`.
    pub settings: Vec<String>,
    /// Device profiles of `std::device`.
    pub profiles: Vec<String>,
}

impl Names {
    /// Names known before any program: the standard device profiles.
    pub fn initial() -> Names {
        let mut profiles = Vec::new();
        if let Some(text) = hpmoe_dsl::stdlib::module("device") {
            let (file, _, _) = hpmoe_dsl::syntax::parse_text(text, hpmoe_dsl::FileId(0));
            for it in &file.items {
                if let hpmoe_dsl::syntax::ast::ItemKind::Profile(p) = &it.kind {
                    profiles.push(p.name.name.clone());
                }
            }
        }
        profiles.sort();
        Names {
            profiles,
            ..Names::default()
        }
    }
}

/// How `hpmoe repl` was started.
#[derive(Clone, Debug, Default)]
pub struct ReplOptions {
    pub file: Option<PathBuf>,
    /// `--set NAME=VALUE` (params and `device.FIELD`).
    pub set: Vec<String>,
    pub device: Option<String>,
    pub routing: Option<String>,
    /// `--allow-path DIR`: also read imports and routing files from these directories.
    pub allow_paths: Vec<PathBuf>,
    pub policy: Option<String>,
    /// Print the time each stage took (`--no-timings` or `HPMOE_REPL_NO_TIMINGS=1` turn it off).
    pub timings: bool,
    /// Echo each input with a prompt before its output (`--echo`, `HPMOE_REPL_ECHO=1`): a
    /// transcript of a script.
    pub echo: bool,
    /// Diagnostics drawn with colours and boxes (a terminal) or plain.
    pub graphical: bool,
}

impl ReplOptions {
    /// Applies `HPMOE_REPL_NO_TIMINGS` and `HPMOE_REPL_ECHO` (set to anything but `0` or empty).
    pub fn with_env(mut self) -> ReplOptions {
        let on = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0");
        if on("HPMOE_REPL_NO_TIMINGS") {
            self.timings = false;
        }
        if on("HPMOE_REPL_ECHO") {
            self.echo = true;
        }
        self
    }
}

/// Creates a session from the options: the command-line settings, then the file. A bad
/// setting is a usage error (exit code 2).
fn start(
    opts: &ReplOptions,
    out: Box<dyn Write>,
    mut err: Box<dyn Write>,
    names: Arc<Mutex<Names>>,
) -> Result<Session, i32> {
    let mut settings = session::Settings::default();
    for s in &opts.set {
        match Override::parse(s) {
            Ok(o) => {
                let name = o.name.clone();
                settings.overrides.retain(|(k, _)| *k != name);
                settings.overrides.push((name, o));
            }
            Err(e) => {
                let _ = writeln!(err, "error: --set {e}");
                return Err(2);
            }
        }
    }
    if let Some(p) = &opts.policy {
        match session::parse_policy(p) {
            Ok(p) => settings.policy = Some(p),
            Err(e) => {
                let _ = writeln!(err, "error: --policy: {e}");
                return Err(2);
            }
        }
    }
    settings.device = opts.device.clone();
    settings.routing = opts.routing.clone();
    settings.allow_paths = opts.allow_paths.clone();
    let cfg = Config {
        timings: opts.timings,
        echo: opts.echo,
        style: if opts.graphical {
            RenderStyle::Graphical
        } else {
            RenderStyle::Plain
        },
    };
    let mut s = Session::new(cfg, out, err, names);
    s.settings = settings;
    if let Some(f) = &opts.file {
        s.failed_now = false;
        if s.load_path(f).is_err() || s.failed_now {
            s.failed = true;
        }
        s.stages.clear();
    }
    Ok(s)
}

/// Ctrl-C presses since the running command started.
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Interactive sessions: Ctrl-C while a command runs (the editor is not reading keys, so the
/// terminal sends SIGINT) cancels the command at its next check point and the session goes
/// on; a third press before it gets there ends the process as an interrupt does (exit 130).
/// At the prompt the line editor reads Ctrl-C itself (it clears the line).
fn cancel_on_interrupt() {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !hpmoe_dsl::cancel::is_cancelled(info.payload()) {
            quiet(info);
        }
    }));
    let installed = ctrlc::set_handler(|| {
        if INTERRUPTS.fetch_add(1, Ordering::Relaxed) >= 2 {
            std::process::exit(130);
        }
        hpmoe_dsl::cancel::request();
    });
    if let Err(e) = installed {
        errln!("note: Ctrl-C will end the session, not cancel a command ({e})");
    }
}

/// Runs one input, catching a panic (a bug) so that the session goes on, and a cancellation
/// (Ctrl-C) so that the command stops and the session goes on.
fn exec(s: &mut Session, text: &str) -> Flow {
    guarded(s, |s| s.execute(text))
}

/// Runs `f` on the session, catching a panic or a cancellation as [`exec`] does.
fn guarded(s: &mut Session, f: impl FnOnce(&mut Session) -> Flow) -> Flow {
    INTERRUPTS.store(0, Ordering::Relaxed);
    hpmoe_dsl::cancel::clear();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s)));
    hpmoe_dsl::cancel::clear();
    match r {
        Ok(f) => f,
        Err(p) if hpmoe_dsl::cancel::is_cancelled(p.as_ref()) => {
            // A stage stopped half-way: drop what it may have left in the caches.
            s.cache.clear();
            s.stages.clear();
            s.error("cancelled");
            Flow::Continue
        }
        Err(_) => {
            s.cache.clear();
            s.stages.clear();
            s.error("internal error while running this input (a bug in hpmoe; please report it); the session goes on");
            s.failed = true;
            Flow::Continue
        }
    }
}

/// Runs the inputs read so far, in order: consecutive definitions together
/// (`Session::execute_definitions`), commands one by one. Returns `Some(quit)` when the
/// session ends (`:quit`, or the output is gone).
fn run_queued(s: &mut Session, queue: &mut Vec<String>) -> Option<bool> {
    let inputs = std::mem::take(queue);
    let mut i = 0;
    while i < inputs.len() {
        if crate::out::stdout_failed() {
            return Some(false);
        }
        let defs = inputs[i..]
            .iter()
            .take_while(|t| !t.trim_start().starts_with(':'))
            .count();
        if defs >= 2 {
            let mut gone = false;
            guarded(s, |s| {
                gone = !s.execute_definitions(&inputs[i..i + defs]);
                Flow::Continue
            });
            if gone {
                return Some(false);
            }
            i += defs;
            continue;
        }
        if exec(s, &inputs[i]) == Flow::Quit {
            return Some(true);
        }
        i += 1;
    }
    None
}

/// Bytes of whole lines a read-ahead chunk holds before it is sent (a longer line is sent
/// alone), and the chunks read ahead at most.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;
const CHUNKS_AHEAD: usize = 64;

/// Reads `input` on a thread of its own, in chunks of whole lines: a chunk is sent once it
/// holds [`CHUNK_BYTES`] or once no further whole line is buffered (the next read could
/// wait), so a line typed alone arrives alone. The thread ends at the input's end or error
/// (sent last), or when the receiver is gone; it is never joined, so a session that ends
/// while its input stays open does not wait for it.
fn read_ahead<R: Read + Send + 'static>(
    mut input: BufReader<R>,
) -> std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(CHUNKS_AHEAD);
    let spawned = std::thread::Builder::new().name("repl input".into()).spawn(move || {
        let mut chunk = Vec::new();
        loop {
            match input.read_until(b'\n', &mut chunk) {
                Ok(0) => break,
                Ok(_) => {
                    let send_now = chunk.len() >= CHUNK_BYTES || !input.buffer().contains(&b'\n');
                    if send_now && tx.send(Ok(std::mem::take(&mut chunk))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if !chunk.is_empty() && tx.send(Ok(std::mem::take(&mut chunk))).is_err() {
                        return;
                    }
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
        if !chunk.is_empty() {
            let _ = tx.send(Ok(chunk));
        }
    });
    if let Err(e) = spawned {
        // (No thread: the receiver reports the error as a read error.)
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let _ = tx.send(Err(e));
        return rx;
    }
    rx
}

/// Reads inputs line by line (an input goes on while a bracket is open) and runs them.
/// Inputs already read in full are run together (so that consecutive definitions are checked
/// together); inputs run only once no further line has arrived for as long as the last run
/// took, and the lines that arrive while they run are read meanwhile ([`read_ahead`]), so
/// the inputs of a script piped in, however fast its writer, are run in a few runs that grow
/// with the session (a session re-checks its whole text once per run), and a line given
/// alone waits at most as long as the last run took. Returns whether `:quit` was given.
fn run_lines<R: Read + Send + 'static>(s: &mut Session, input: BufReader<R>) -> bool {
    let chunks = read_ahead(input);
    // How long the last run of inputs took.
    let mut last_run = std::time::Duration::ZERO;
    let mut pending = String::new();
    let mut scan = input::OpenScan::default();
    let mut queue: Vec<String> = Vec::new();
    loop {
        if crate::out::stdout_failed() {
            // The output is gone (a closed pipe, a full disk): nothing more can be shown.
            return false;
        }
        let next = match chunks.try_recv() {
            Ok(c) => Some(c),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => None,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                // Nothing more has arrived: wait for more at most as long as the last run
                // took, then run what was read before waiting.
                use std::sync::mpsc::RecvTimeoutError;
                let more = if queue.is_empty() {
                    Err(RecvTimeoutError::Timeout)
                } else {
                    chunks.recv_timeout(last_run)
                };
                match more {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Disconnected) => None,
                    Err(RecvTimeoutError::Timeout) => {
                        let t0 = std::time::Instant::now();
                        if let Some(quit) = run_queued(s, &mut queue) {
                            return quit;
                        }
                        last_run = t0.elapsed();
                        chunks.recv().ok()
                    }
                }
            }
        };
        let bytes = match next {
            None => break,
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                if let Some(quit) = run_queued(s, &mut queue) {
                    return quit;
                }
                s.error(&format!("cannot read the input: {e}"));
                s.failed = true;
                break;
            }
        };
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            pending.push_str(&line);
            if !pending.ends_with('\n') {
                pending.push('\n');
            }
            if pending.trim().is_empty() {
                pending.clear();
                scan = input::OpenScan::default();
            } else {
                scan.line(&line);
                if scan.is_complete(&pending) {
                    queue.push(std::mem::take(&mut pending));
                    scan = input::OpenScan::default();
                }
            }
        }
    }
    if let Some(quit) = run_queued(s, &mut queue) {
        return quit;
    }
    if !pending.trim().is_empty() {
        // The input ended inside a bracket: run it, and let the parser say what is missing.
        return exec(s, &pending) == Flow::Quit;
    }
    false
}

/// Runs a session on a script: the inputs of `input`, results to `out`, diagnostics and
/// errors to `err`. Returns the exit code: 0, or 1 if any input failed (2 for bad options).
pub fn run_script(
    input: impl Read + Send + 'static,
    opts: &ReplOptions,
    out: Box<dyn Write>,
    err: Box<dyn Write>,
) -> i32 {
    let names = Arc::new(Mutex::new(Names::initial()));
    let mut s = match start(opts, out, err, names) {
        Ok(s) => s,
        Err(code) => return code,
    };
    run_lines(&mut s, BufReader::with_capacity(CHUNK_BYTES, input));
    i32::from(s.failed)
}

/// `hpmoe repl`: interactive on a terminal, a script otherwise.
pub fn main(opts: ReplOptions) -> i32 {
    let opts = opts.with_env();
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        editor::interactive(&opts)
    } else {
        run_script(
            std::io::stdin(),
            &opts,
            Box::new(crate::out::Stdout),
            Box::new(crate::out::Stderr),
        )
    }
}
