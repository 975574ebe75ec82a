//! The sources of a compilation: files, REPL lines, stdlib modules, macro invocations.

use crate::syntax::token::{FileId, Span};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// One source text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// The name shown in diagnostics (`examples/moe.hpm`, `<std>/moe.hpm`, `<repl>`).
    pub name: String,
    /// The path on disk, when the text came from a file (imports are relative to it).
    pub path: Option<PathBuf>,
    /// The text, shared. A `String` in an `Arc` rather than an `Arc<str>`, so that a file
    /// read into a `String` is kept as it is (an `Arc<str>` would copy it).
    pub text: Arc<String>,
}

/// All sources of one compilation, indexed by [`FileId`].
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
    /// Per file, where its lines break (built on first use by diagnostics), so that finding
    /// a position's line costs a binary search, not a scan from the start of the file.
    lines: Vec<OnceLock<Arc<LineTable>>>,
}

/// The line breaks of a text.
#[derive(Debug, Default)]
pub struct LineTable {
    /// Offsets of every `\n`.
    newlines: Vec<usize>,
    /// The start of every line after the first (after each `\n`). A lone `\r` ends no line:
    /// the renderer sees it as a space ([`controls_as_spaces`]), so that its excerpts, its line
    /// numbers and `line_col` agree.
    starts: Vec<usize>,
}

impl LineTable {
    fn new(text: &str) -> LineTable {
        let b = text.as_bytes();
        let mut t = LineTable::default();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'\n' => {
                    t.newlines.push(i);
                    t.starts.push(i + 1);
                }
                b'\r' if b.get(i + 1) == Some(&b'\n') => {
                    t.newlines.push(i + 1);
                    t.starts.push(i + 2);
                    i += 1;
                }
                _ => {}
            }
            i += 1;
        }
        t
    }

    /// The index (0-based) of the renderer's line holding `offset`, and where it starts.
    pub fn line_of(&self, offset: usize) -> (usize, usize) {
        let k = self.starts.partition_point(|&s| s <= offset);
        (k, if k == 0 { 0 } else { self.starts[k - 1] })
    }

    /// The start of the renderer's line `k` (0-based).
    pub fn line_start(&self, k: usize) -> usize {
        if k == 0 {
            0
        } else {
            self.starts[k - 1]
        }
    }
}

/// The text with every `\r` that is not followed by `\n`, and every other ASCII control
/// character but tab and line feed (escape, backspace, NUL, DEL...), replaced by a space
/// (same length), or `None` when it has none. A lone carriage return in an excerpt would send
/// a terminal back to the start of the line, and the renderer would count it as a line end in
/// the position it prints but not in the lines it numbers; an escape would let a file's text
/// drive the terminal that shows its excerpt.
pub fn controls_as_spaces(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let blank = |i: usize| match b[i] {
        b'\r' => b.get(i + 1) != Some(&b'\n'),
        b'\t' | b'\n' => false,
        c => c < 0x20 || c == 0x7f,
    };
    if !(0..b.len()).any(blank) {
        return None;
    }
    let mut out = b.to_vec();
    for (i, c) in out.iter_mut().enumerate() {
        if blank(i) {
            *c = b' ';
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes: still UTF-8.
    String::from_utf8(out).ok()
}

impl SourceMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: impl Into<String>, path: Option<PathBuf>, text: impl Into<String>) -> FileId {
        let id = FileId(self.files.len() as u32);
        self.files.push(SourceFile {
            name: name.into(),
            path,
            text: Arc::new(text.into()),
        });
        self.lines.push(OnceLock::new());
        id
    }

    /// Gives a file another name in diagnostics (a front end that spells an option its own
    /// way, as the REPL's `:set routing = ...` for `--routing`).
    pub fn rename(&mut self, id: FileId, name: impl Into<String>) {
        if let Some(f) = self.files.get_mut(id.0 as usize) {
            f.name = name.into();
        }
    }

    /// A copy with file `id`'s text replaced (the other files' texts are shared): to show a
    /// diagnostic against an earlier state of a text that grew.
    pub fn with_text(&self, id: FileId, text: impl Into<String>) -> SourceMap {
        let mut s = self.clone();
        if let Some(f) = s.files.get_mut(id.0 as usize) {
            f.text = Arc::new(text.into());
            s.lines[id.0 as usize] = OnceLock::new();
        }
        s
    }

    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// Finds a file already loaded from this path.
    pub fn find_path(&self, path: &std::path::Path) -> Option<FileId> {
        self.files
            .iter()
            .position(|f| f.path.as_deref() == Some(path))
            .map(|i| FileId(i as u32))
    }

    /// The text a span covers, if the span is a byte range of a known file.
    pub fn snippet(&self, span: Span) -> Option<&str> {
        self.get(span.file)?.text.get(span.lo as usize..span.hi as usize)
    }

    /// The line breaks of a file (computed once).
    pub fn line_table(&self, id: FileId) -> Option<Arc<LineTable>> {
        let f = self.get(id)?;
        let cell = self.lines.get(id.0 as usize)?;
        Some(Arc::clone(cell.get_or_init(|| Arc::new(LineTable::new(&f.text)))))
    }

    /// 1-based line and column (in bytes) of a span's start, counting `\n` as the line end.
    pub fn line_col(&self, span: Span) -> Option<(usize, usize)> {
        let text = &self.get(span.file)?.text;
        let lo = (span.lo as usize).min(text.len());
        text.get(..lo)?;
        let t = self.line_table(span.file)?;
        let before = t.newlines.partition_point(|&p| p < lo);
        let col = if before == 0 {
            lo
        } else {
            lo - t.newlines[before - 1] - 1
        };
        Some((before + 1, col + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{render_all, Diagnostic, Dropped, RenderStyle};
    use crate::Code;

    #[test]
    fn a_lone_carriage_return_ends_no_line_in_rendered_positions_or_excerpts() {
        // `\r` alone, `\r\n` and `\n`: the position printed, the numbered excerpt line and
        // `line_col` all count the `\n`s only, and no `\r` reaches the output alone.
        let text = "param a = 1;\rparam b = ;\r\nparam c = 2;\n\rparam d = ;\n";
        let mut sm = SourceMap::new();
        let f = sm.add("t.hpm", None, text);
        for (at, line, col) in [(23usize, 1usize, 24usize), (50, 3, 12)] {
            assert_eq!(&text[at..at + 1], ";");
            let span = Span::new(f, at as u32, at as u32 + 1);
            assert_eq!(sm.line_col(span), Some((line, col)));
            let d = Diagnostic::error(Code::UnexpectedToken, "expected an expression").primary(span, "here");
            let out = render_all(&[d], Dropped::NONE, &sm, RenderStyle::Plain);
            assert!(out.contains(&format!("[t.hpm:{line}:{col}]")), "{out}");
            assert!(out.contains(&format!(" {line} | ")), "{out}");
            assert!(!out.replace("\r\n", "\n").contains('\r'), "{out:?}");
        }
        assert_eq!(controls_as_spaces("a\r\nb\n"), None);
        assert_eq!(controls_as_spaces("a\rb\r").as_deref(), Some("a b "));
        assert_eq!(
            controls_as_spaces("a\u{1b}[31mb\u{7f}\u{0}\tc").as_deref(),
            Some("a [31mb  \tc")
        );
    }
}
