//! The terminal front end: reedline with a persistent history (`$HPMOE_HISTORY`, else
//! `~/.hpmoe_history`; kept in memory when the file cannot be written), Tab completion,
//! highlighting with the logos lexer, and multi-line input decided by the parser.

use super::complete::{complete, highlight_spans, Class};
use super::{exec, input, run_lines, start, Names, ReplOptions, CHUNK_BYTES};
use nu_ansi_term::{Color, Style};
use reedline::{
    default_emacs_keybindings, ColumnarMenu, Completer, Emacs, FileBackedHistory, Highlighter, KeyCode, KeyModifiers,
    MenuBuilder, Prompt, PromptEditMode, PromptHistorySearch, PromptHistorySearchStatus, Reedline, ReedlineEvent,
    ReedlineMenu, Signal, StyledText, Suggestion, ValidationResult, Validator,
};
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

const HISTORY_SIZE: usize = 1000;

struct ReplCompleter {
    names: Arc<Mutex<Names>>,
}

impl Completer for ReplCompleter {
    fn complete(&mut self, line: &str, pos: usize) -> Vec<Suggestion> {
        let names = match self.names.lock() {
            Ok(n) => n.clone(),
            Err(_) => Names::default(),
        };
        complete(&names, line, pos)
            .into_iter()
            .map(|c| Suggestion {
                value: c.value,
                span: reedline::Span::new(c.start.min(pos), pos),
                append_whitespace: c.space,
                ..Suggestion::default()
            })
            .collect()
    }
}

struct ReplHighlighter {
    names: Arc<Mutex<Names>>,
    /// Colours on (`--color`, `NO_COLOR` and the terminal decide).
    color: bool,
}

fn style(c: Class) -> Style {
    match c {
        Class::Plain => Style::new(),
        Class::Command => Style::new().bold().fg(Color::Blue),
        Class::UnknownCommand | Class::Error => Style::new().fg(Color::Red),
        Class::ItemKeyword => Style::new().bold().fg(Color::Magenta),
        Class::Keyword => Style::new().fg(Color::Magenta),
        Class::Type => Style::new().fg(Color::Cyan),
        Class::Number => Style::new().fg(Color::Yellow),
        Class::Str => Style::new().fg(Color::Green),
        Class::Comment => Style::new().fg(Color::DarkGray),
        Class::Name => Style::new().fg(Color::LightBlue),
        Class::Param => Style::new().fg(Color::LightCyan),
    }
}

impl Highlighter for ReplHighlighter {
    fn highlight(&self, line: &str, _cursor: usize) -> StyledText {
        let names = match self.names.lock() {
            Ok(n) => n.clone(),
            Err(_) => Names::default(),
        };
        let mut st = StyledText::new();
        for (r, c) in highlight_spans(&names, line) {
            let look = if self.color { style(c) } else { Style::new() };
            st.push((look, line[r].to_string()));
        }
        st
    }
}

struct ReplValidator;

impl Validator for ReplValidator {
    fn validate(&self, line: &str) -> ValidationResult {
        if input::is_complete(line) {
            ValidationResult::Complete
        } else {
            ValidationResult::Incomplete
        }
    }
}

struct ReplPrompt;

impl Prompt for ReplPrompt {
    fn render_prompt_left(&self) -> Cow<'_, str> {
        Cow::Borrowed("hpmoe")
    }
    fn render_prompt_right(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn render_prompt_indicator(&self, _mode: PromptEditMode) -> Cow<'_, str> {
        Cow::Borrowed("> ")
    }
    fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
        Cow::Borrowed("  ...> ")
    }
    fn render_prompt_history_search_indicator(&self, h: PromptHistorySearch) -> Cow<'_, str> {
        let failing = if matches!(h.status, PromptHistorySearchStatus::Failing) {
            "failing "
        } else {
            ""
        };
        Cow::Owned(format!("({failing}search: {}) ", h.term))
    }
}

/// The history file: `$HPMOE_HISTORY`, else `~/.hpmoe_history`.
fn history_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HPMOE_HISTORY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".hpmoe_history"))
}

fn editor(names: &Arc<Mutex<Names>>, color: bool) -> (Reedline, Option<String>) {
    let (history, note) = match history_path() {
        Some(p) => match FileBackedHistory::with_file(HISTORY_SIZE, p.clone()) {
            Ok(h) => (h, None),
            Err(e) => (
                FileBackedHistory::new(HISTORY_SIZE).unwrap_or_default(),
                Some(format!("the history is not saved: cannot use `{}` ({e})", p.display())),
            ),
        },
        None => (FileBackedHistory::new(HISTORY_SIZE).unwrap_or_default(), None),
    };
    let mut keys = default_emacs_keybindings();
    keys.add_binding(
        KeyModifiers::NONE,
        KeyCode::Tab,
        ReedlineEvent::UntilFound(vec![
            ReedlineEvent::Menu("completion_menu".to_string()),
            ReedlineEvent::MenuNext,
        ]),
    );
    keys.add_binding(KeyModifiers::SHIFT, KeyCode::BackTab, ReedlineEvent::MenuPrevious);
    let menu = ColumnarMenu::default().with_name("completion_menu");
    let ed = Reedline::create()
        .with_history(Box::new(history))
        .with_completer(Box::new(ReplCompleter {
            names: Arc::clone(names),
        }))
        .with_quick_completions(true)
        .with_partial_completions(true)
        .with_menu(ReedlineMenu::EngineCompleter(Box::new(menu)))
        .with_highlighter(Box::new(ReplHighlighter {
            names: Arc::clone(names),
            color,
        }))
        .with_ansi_colors(color)
        .with_validator(Box::new(ReplValidator))
        .with_edit_mode(Box::new(Emacs::new(keys)));
    (ed, note)
}

/// The interactive session. Returns 0 when the user leaves (`:quit`, Ctrl-D).
pub(crate) fn interactive(opts: &ReplOptions) -> i32 {
    let names = Arc::new(Mutex::new(Names::initial()));
    outln!("hpmoe repl: `:help` for the commands, Tab completes, Ctrl-C cancels a command, Ctrl-D leaves");
    super::cancel_on_interrupt();
    let mut s = match start(
        opts,
        Box::new(crate::out::Stdout),
        Box::new(crate::out::Stderr),
        Arc::clone(&names),
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (mut ed, note) = editor(&names, opts.graphical);
    if let Some(n) = note {
        s.note(&n);
    }
    let prompt = ReplPrompt;
    // A terminal query can time out on a loaded machine: the editor tries again before it
    // gives up on the terminal.
    let mut failures = 0;
    loop {
        let line = ed.read_line(&prompt);
        if line.is_ok() {
            failures = 0;
        }
        match line {
            Err(_) if failures < EDITOR_RETRIES => {
                failures += 1;
                continue;
            }
            Ok(Signal::Success(buf)) => {
                let _ = ed.sync_history();
                if exec(&mut s, &buf) == super::Flow::Quit {
                    break;
                }
            }
            Ok(Signal::CtrlD) => break,
            Ok(_) => continue,
            Err(e) => {
                // A terminal that does not answer the editor's queries: go on with plain lines.
                s.note(&format!("the line editor stopped ({e}); reading plain lines"));
                run_lines(&mut s, std::io::BufReader::with_capacity(CHUNK_BYTES, std::io::stdin()));
                break;
            }
        }
    }
    // Dropping the editor writes the history.
    drop(ed);
    0
}

/// How many times in a row the line editor may fail (a terminal query timing out) before
/// the REPL reads plain lines.
const EDITOR_RETRIES: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    fn styles(color: bool) -> Vec<Style> {
        let h = ReplHighlighter {
            names: Arc::new(Mutex::new(Names::default())),
            color,
        };
        h.highlight(":run moe_ffn # a comment", 0)
            .buffer
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    #[test]
    fn highlighting_is_plain_without_colour() {
        assert!(styles(false).iter().all(|s| *s == Style::new()));
        // The same line has coloured pieces when colours are on.
        assert!(styles(true).iter().any(|s| *s != Style::new()));
    }
}
