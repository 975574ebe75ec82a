//! Interactive REPL sessions through a pseudo-terminal (expectrl): Tab completion, a
//! multi-line definition, history recall across sessions, Ctrl-C on a line and during a
//! command, Ctrl-D to leave, input highlighting under `NO_COLOR` and `--color`; and `hpmoe
//! run`'s progress display on a terminal.
//!
//! Robustness: the line editor asks the terminal where its cursor is (`ESC [ 6 n`); the
//! harness answers every such query as a terminal would. Output is matched after stripping
//! escape sequences, anywhere after the point where the keys were sent, with generous
//! timeouts and no assertion on elapsed time.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(90);
const SMALL: &str = "tests/repl_fixtures/small.hpm";

/// Removes ANSI escape sequences (CSI, OSC, two-byte escapes) and carriage returns.
fn strip(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\u{1b}' => match it.next() {
                Some('[') => {
                    for d in it.by_ref() {
                        if ('@'..='~').contains(&d) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    while let Some(d) = it.next() {
                        if d == '\u{7}' {
                            break;
                        }
                        if d == '\u{1b}' && it.peek() == Some(&'\\') {
                            it.next();
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

struct Term {
    s: expectrl::Session,
    raw: Vec<u8>,
    answered: usize,
    mark: usize,
}

impl Term {
    fn spawn(args: &[&str], history: &Path) -> Term {
        Term::spawn_command(&[&["repl"], args].concat(), history)
    }

    /// `hpmoe ARGS` in a pseudo-terminal of 120 x 40, with `NO_COLOR=1`.
    fn spawn_command(args: &[&str], history: &Path) -> Term {
        Term::spawn_command_colour(args, history, false)
    }

    /// `hpmoe ARGS` in a pseudo-terminal of 120 x 40; `NO_COLOR` unset if `colour`.
    fn spawn_command_colour(args: &[&str], history: &Path, colour: bool) -> Term {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hpmoe"));
        cmd.args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("HPMOE_HISTORY", history)
            .env("HPMOE_REPL_NO_TIMINGS", "1")
            .env("TERM", "xterm-256color")
            .env_remove("HPMOE_REPL_ECHO");
        if colour {
            cmd.env_remove("NO_COLOR");
        } else {
            cmd.env("NO_COLOR", "1");
        }
        let mut s = expectrl::Session::spawn(cmd).expect("spawn hpmoe repl in a pty");
        let _ = s.get_process_mut().set_window_size(120, 40);
        Term {
            s,
            raw: Vec::new(),
            answered: 0,
            mark: 0,
        }
    }

    /// Reads what is available; answers cursor-position queries. Returns false at EOF.
    fn pump(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        let mut alive = true;
        loop {
            match self.s.try_read(&mut buf) {
                Ok(0) => {
                    alive = false;
                    break;
                }
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    alive = false;
                    break;
                }
            }
        }
        let queries = self.raw.windows(4).filter(|w| w == b"\x1b[6n").count();
        while self.answered < queries {
            let _ = self.s.write_all(b"\x1b[1;1R");
            let _ = self.s.flush();
            self.answered += 1;
        }
        alive
    }

    /// Sends keys; later matches look only at output produced from here on.
    fn send(&mut self, keys: &str) {
        self.pump();
        self.mark = self.raw.len();
        self.s.write_all(keys.as_bytes()).expect("write keys");
        self.s.flush().expect("flush keys");
    }

    /// Sends more keys, still matching from the previous mark.
    fn type_more(&mut self, keys: &str) {
        self.s.write_all(keys.as_bytes()).expect("write keys");
        self.s.flush().expect("flush keys");
    }

    /// The output since the mark, without escapes.
    fn since_mark(&self) -> String {
        strip(&self.raw[self.mark.min(self.raw.len())..])
    }

    /// Waits until `needle` shows up after the mark; returns the text since the mark.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let alive = self.pump();
            let text = self.since_mark();
            if text.contains(needle) {
                return text;
            }
            if !alive || Instant::now() > deadline {
                panic!(
                    "timed out waiting for {needle:?}; output since the last keys:\n{text}\n--- whole session:\n{}",
                    strip(&self.raw)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the last `needle` after the mark is followed by a fresh prompt: the
    /// editor is reading keys again (in raw mode), so control keys reach it.
    fn wait_then_prompt(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let alive = self.pump();
            let text = self.since_mark();
            if let Some(i) = text.rfind(needle) {
                if text[i + needle.len()..].contains("hpmoe>") {
                    return text;
                }
            }
            if !alive || Instant::now() > deadline {
                panic!("timed out waiting for {needle:?} and a prompt; output since the last keys:\n{text}\n--- whole session:\n{}", strip(&self.raw));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to end; returns its exit code.
    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            self.pump();
            match self.s.get_process().status() {
                Ok(expectrl::WaitStatus::Exited(_, code)) => return code,
                Ok(expectrl::WaitStatus::Signaled(_, sig, _)) => panic!("killed by {sig:?}"),
                _ => {}
            }
            if Instant::now() > deadline {
                let _ = self.s.get_process_mut().exit(true);
                panic!("the session did not end; output:\n{}", strip(&self.raw));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        if self.s.get_process().is_alive().unwrap_or(false) {
            let _ = self.s.get_process_mut().exit(true);
        }
    }
}

fn history_file(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("repl-pty");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn completion_multi_line_ctrl_c_and_ctrl_d() {
    let hist = history_file("session.txt");
    let mut t = Term::spawn(&[SMALL], &hist);
    t.wait_then_prompt("loaded tests/repl_fixtures/small.hpm");

    // Completion of a command name, then of a view and a param name of the loaded program.
    t.send(":sh\t");
    t.wait_for(":show ");
    t.type_more("par\t");
    t.wait_for(":show params ");
    t.type_more("\r");
    t.wait_then_prompt("inter   = 128");

    t.send(":set tok\t");
    t.wait_for(":set tokens ");
    t.type_more("= 32\r");
    t.wait_then_prompt("tokens = 32\nstages: check");

    // A multi-line definition: the open bracket keeps the input going.
    t.send("param extra = (\r");
    t.wait_for("...>");
    t.type_more("    7 + 1\r");
    t.type_more(");\r");
    t.wait_then_prompt("defined param extra");
    t.send(":show params\r");
    let out = t.wait_then_prompt("extra   = 8");
    assert!(out.contains("tokens  = 32  (set)"), "{out}");

    // Ctrl-C drops the line being edited; the session goes on.
    t.send("this is not run");
    t.wait_for("this is not run");
    t.type_more("\x03");
    t.wait_then_prompt("this is not run");
    t.send(":help quit\r");
    t.wait_then_prompt("Leaves the session");
    let all = strip(&t.raw);
    assert!(!all.contains("expected an item"), "the cancelled line ran:\n{all}");

    // Ctrl-D on an empty line leaves with exit code 0 and writes the history.
    t.send("\x04");
    assert_eq!(t.wait_exit(), 0);
    let saved = std::fs::read_to_string(&hist).expect("the history file was written");
    assert!(saved.contains(":help quit"), "{saved}");
    assert!(
        saved.contains("param extra = (<\\n>"),
        "multi-line entries are kept whole: {saved}"
    );
    assert!(!saved.contains("this is not run"), "{saved}");
}

/// The SGR sequences that set a colour or an attribute (every `ESC [ ... m` but a reset).
fn styling(raw: &[u8]) -> Vec<String> {
    let s = String::from_utf8_lossy(raw);
    let mut out = Vec::new();
    for part in s.split("\x1b[").skip(1) {
        let params: String = part.chars().take_while(|c| c.is_ascii_digit() || *c == ';').collect();
        if part[params.len()..].starts_with('m') && params.split(';').any(|p| !p.is_empty() && p != "0") {
            out.push(params);
        }
    }
    out
}

#[test]
fn input_highlighting_follows_no_color_and_the_color_option() {
    // (NO_COLOR unset, extra arguments, colours expected in the echo of the typed line)
    for (i, (colour_env, extra, coloured)) in [
        (false, &[][..], false),
        (true, &[][..], true),
        (true, &["--color", "never"][..], false),
    ]
    .into_iter()
    .enumerate()
    {
        let hist = history_file(&format!("colour-{i}.txt"));
        let args = [&["repl", SMALL], extra].concat();
        let mut t = Term::spawn_command_colour(&args, &hist, colour_env);
        t.wait_then_prompt("loaded");
        // A command, a param name and a number: each has its own colour when colours are on.
        t.send(":show params 7");
        t.wait_for(":show params 7");
        let typed = styling(&t.raw[t.mark..]);
        assert_eq!(
            !typed.is_empty(),
            coloured,
            "case {i} (NO_COLOR unset: {colour_env}, {extra:?}): styles {typed:?}"
        );
        t.type_more("\x03");
        t.wait_then_prompt(":show params 7");
        t.send("\x04");
        assert_eq!(t.wait_exit(), 0);
    }
}

#[test]
fn history_is_recalled_in_the_next_session() {
    let hist = history_file("recall.txt");
    {
        let mut t = Term::spawn(&[SMALL], &hist);
        t.wait_then_prompt("loaded");
        t.send(":show tasks call=xd rank=2 limit=1\r");
        t.wait_then_prompt("tasks match");
        t.send(":quit\r");
        assert_eq!(t.wait_exit(), 0);
    }
    let mut t = Term::spawn(&[SMALL], &hist);
    t.wait_then_prompt("loaded");
    // Up twice: `:quit`, then the command before it.
    t.send("\x1b[A");
    t.wait_for(":quit");
    t.type_more("\x1b[A");
    t.wait_for(":show tasks call=xd rank=2 limit=1");
    t.type_more("\r");
    let out = t.wait_then_prompt("tasks match");
    assert!(out.contains(" xd "), "{out}");
    t.send("\x04");
    assert_eq!(t.wait_exit(), 0);
}

#[test]
fn an_unwritable_history_is_not_an_error() {
    // A directory cannot be a history file: the session keeps its history in memory.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("repl-pty")
        .join("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    let mut t = Term::spawn(&[], &dir);
    t.wait_then_prompt("the history is not saved");
    t.send(":help run\r");
    t.wait_then_prompt("simulate the current configuration");
    t.send("\x1b[A");
    t.wait_for(":help run");
    t.type_more("\x03");
    t.wait_then_prompt(":help run");
    t.send("\x04");
    assert_eq!(t.wait_exit(), 0);
}

#[test]
fn ctrl_c_cancels_a_running_command_and_the_session_goes_on() {
    let hist = history_file("cancel.txt");
    let layer = "../../examples/deepseek_v3_layer.hpm";
    let mut t = Term::spawn(&[layer, "--set", "ranks=256"], &hist);
    t.wait_then_prompt("loaded");
    t.send(":run\r");
    // A 256-rank layer takes far longer than this pause to lower, verify and simulate;
    // whatever stage it is in, Ctrl-C stops it at that stage's next check point.
    std::thread::sleep(Duration::from_millis(1500));
    t.type_more("\x03");
    let out = t.wait_then_prompt("cancelled");
    assert!(!out.contains("internal error") && !out.contains("panicked"), "{out}");
    // The session kept its state: the setting is still there, and a command runs.
    t.send(":show params\r");
    t.wait_then_prompt("ranks   = 256  (set)");
    t.send("\x04");
    assert_eq!(t.wait_exit(), 0);
}

#[test]
fn run_on_a_terminal_shows_the_stages_done_and_the_tasks_simulated() {
    let hist = history_file("run.txt");
    // Under `interleaved`, several candidate schedules are simulated: the display names them.
    let mut t = Term::spawn_command(&["run", "../../examples/deepseek_v3_ep8_fwd.hpm", "--jobs", "1"], &hist);
    t.mark = 0;
    let out = t.wait_for("Dispatch-to-Combine latency");
    assert_eq!(t.wait_exit(), 0);
    let out = format!("{out}{}", t.since_mark());
    assert!(
        out.contains("moe_ffn (interleaved): done: lower, verify graph, schedule"),
        "{out}"
    );
    let simulated = out
        .split("candidate schedule ")
        .skip(1)
        .filter_map(|s| {
            let s = s.split_once(": simulated ")?.1;
            let (done, rest) = s.split_once(" of ")?;
            let total = rest.split_once(" tasks")?.0;
            Some((done.parse::<u64>().ok()?, total.parse::<u64>().ok()?))
        })
        .collect::<Vec<_>>();
    assert!(!simulated.is_empty(), "no candidate's progress was shown:\n{out}");
    assert!(simulated.iter().all(|&(d, n)| d <= n && n > 0), "{simulated:?}");
    // One of the candidates is the schedule kept: its task count is the report's.
    assert!(
        simulated.iter().any(|&(_, n)| out.contains(&format!("{n} tasks\n"))),
        "{simulated:?}\n{out}"
    );
}
