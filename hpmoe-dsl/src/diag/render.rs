//! Rendering diagnostics: graphical (miette), plain (miette, no colour, ASCII) and JSON.

use super::{Diagnostic, Severity};
use crate::source::LineTable;
use crate::source::SourceMap;
use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents, SourceCode, SourceSpan,
    SpanContents,
};
use std::fmt;
use std::sync::Arc;

/// A file's text as the renderer reads it: the excerpt around a span is found from the
/// file's line table, so rendering a diagnostic near the end of a large file costs the
/// excerpt, not a scan of the whole file (and the text is shared, not copied, unless it has
/// a lone `\r`).
struct Excerpts {
    name: String,
    text: Arc<String>,
    lines: Arc<LineTable>,
}

impl SourceCode for Excerpts {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        // Start a few whole lines before the span: the renderer's own reading of the text
        // from there gives the same excerpt as from the start of the file, with line
        // numbers and offsets counted from that line.
        let (line, _) = self.lines.line_of(span.offset());
        let first = line.saturating_sub(context_lines_before + 1);
        let base = self.lines.line_start(first).min(self.text.len());
        let rest = &self.text[base..];
        let local = SourceSpan::new((span.offset() - base).into(), span.len());
        let c = rest.read_span(&local, context_lines_before, context_lines_after)?;
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            c.data(),
            SourceSpan::new((c.span().offset() + base).into(), c.span().len()),
            c.line() + first,
            c.column(),
            c.line_count() + first,
        )))
    }
}

/// How to draw diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenderStyle {
    /// Colours and Unicode box drawing, for a terminal.
    Graphical,
    /// No colour and ASCII only: for files, pipes, snapshots and `NO_COLOR`.
    Plain,
}

struct MietteDiag {
    message: String,
    code: String,
    severity: miette::Severity,
    help: Option<String>,
    labels: Vec<LabeledSpan>,
    source: Option<Excerpts>,
    related: Vec<MietteDiag>,
}

impl fmt::Debug for MietteDiag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
impl fmt::Display for MietteDiag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
impl std::error::Error for MietteDiag {}

impl miette::Diagnostic for MietteDiag {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        if self.code.is_empty() {
            None
        } else {
            Some(Box::new(&self.code))
        }
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help.as_ref().map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.source.as_ref().map(|s| s as &dyn miette::SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            None
        } else {
            Some(Box::new(self.labels.iter().cloned()))
        }
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            None
        } else {
            Some(Box::new(self.related.iter().map(|d| d as &dyn miette::Diagnostic)))
        }
    }
}

fn labeled(span: crate::Span, text: &str, msg: &str, primary: bool) -> LabeledSpan {
    let lo = (span.lo as usize).min(text.len());
    let hi = (span.hi as usize).clamp(lo, text.len());
    let label = if msg.is_empty() { None } else { Some(msg.to_string()) };
    if primary {
        LabeledSpan::new_primary_with_span(label, lo..hi)
    } else {
        LabeledSpan::new_with_span(label, lo..hi)
    }
}

/// A message as shown on a terminal: control characters but tab and line feed escaped
/// (`\u{1b}`), so that a name or a file's text quoted in it cannot drive the terminal.
pub fn shown(s: &str) -> String {
    let raw = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !s.chars().any(raw) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if raw(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn to_miette(d: &Diagnostic, sources: &SourceMap) -> MietteDiag {
    let mut help = d.help.as_deref().map(shown);
    for n in &d.notes {
        let line = format!("note: {}", shown(n));
        help = Some(match help {
            Some(h) => format!("{h}\n{line}"),
            None => line,
        });
    }
    let primary_file = d.span().map(|s| s.file);
    let mut labels = Vec::new();
    let mut related = Vec::new();
    let mut source = None;
    let excerpts = |id: crate::FileId| -> Option<Excerpts> {
        let f = sources.get(id)?;
        Some(Excerpts {
            name: shown(&f.name),
            text: crate::source::controls_as_spaces(&f.text).map_or_else(|| Arc::clone(&f.text), Arc::new),
            lines: sources.line_table(id)?,
        })
    };
    if let Some(file) = primary_file.and_then(|f| sources.get(f)) {
        source = primary_file.and_then(excerpts);
        for l in &d.labels {
            if Some(l.span.file) == primary_file {
                labels.push(labeled(l.span, &file.text, &shown(&l.message), l.primary));
            } else if let Some(other) = sources.get(l.span.file) {
                related.push(MietteDiag {
                    message: if l.message.is_empty() {
                        "see here".into()
                    } else {
                        shown(&l.message)
                    },
                    code: String::new(),
                    // A location in another file that explains the main one: not a warning.
                    severity: miette::Severity::Advice,
                    help: None,
                    labels: vec![labeled(l.span, &other.text, "", true)],
                    source: excerpts(l.span.file),
                    related: Vec::new(),
                });
            }
        }
    }
    MietteDiag {
        message: shown(&d.message),
        code: d.code.to_string(),
        severity: match d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        },
        help,
        labels,
        source,
        related,
    }
}

/// Lines longer than this are not drawn with a source excerpt (the excerpt would be
/// unreadable, and very long lines exceed what the drawing library supports).
const MAX_DRAWN_LINE: usize = 2000;

fn has_long_line(d: &Diagnostic, sources: &SourceMap) -> bool {
    d.labels.iter().any(|l| {
        let Some(f) = sources.get(l.span.file) else {
            return false;
        };
        let text = &f.text;
        let lo = (l.span.lo as usize).min(text.len());
        let hi = (l.span.hi as usize).clamp(lo, text.len());
        let start = text.get(..lo).and_then(|t| t.rfind('\n')).map_or(0, |p| p + 1);
        let end = text.get(hi..).and_then(|t| t.find('\n')).map_or(text.len(), |p| hi + p);
        end - start > MAX_DRAWN_LINE
    })
}

/// A compact rendering without source excerpts: `error[E0101]: message` and locations.
fn render_compact(d: &Diagnostic, sources: &SourceMap) -> String {
    let mut out = format!("{}[{}]: {}\n", sev_word(d.severity), d.code, shown(&d.message));
    for l in &d.labels {
        let name = sources
            .get(l.span.file)
            .map_or("<unknown>".to_string(), |f| shown(&f.name));
        let (line, col) = sources.line_col(l.span).unwrap_or((0, 0));
        out.push_str(&format!("  --> {name}:{line}:{col}"));
        if !l.message.is_empty() {
            out.push_str(&format!(": {}", shown(&l.message)));
        }
        out.push('\n');
    }
    if let Some(h) = &d.help {
        out.push_str(&format!("  help: {}\n", shown(h)));
    }
    for n in &d.notes {
        out.push_str(&format!("  note: {}\n", shown(n)));
    }
    out
}

/// Renders one diagnostic to a string.
pub fn render(d: &Diagnostic, sources: &SourceMap, style: RenderStyle) -> String {
    if has_long_line(d, sources) {
        return render_compact(d, sources);
    }
    let theme = match style {
        RenderStyle::Graphical => GraphicalTheme::unicode(),
        RenderStyle::Plain => GraphicalTheme::none(),
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false)
        .with_urls(false);
    let md = to_miette(d, sources);
    let mut out = String::new();
    if handler.render_report(&mut out, &md).is_err() {
        out = render_compact(d, sources);
    }
    out
}

fn sev_word(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// Renders a list, each followed by a blank line, and a closing count (of those listed and
/// those `dropped` from the list).
pub fn render_all(ds: &[Diagnostic], dropped: super::Dropped, sources: &SourceMap, style: RenderStyle) -> String {
    let mut out = String::new();
    for d in ds {
        out.push_str(&render(d, sources, style));
        out.push('\n');
    }
    let errors = ds.iter().filter(|d| d.is_error()).count() + dropped.errors;
    let warnings = ds.iter().filter(|d| !d.is_error()).count() + dropped.warnings;
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    if let Some(l) = dropped.describe() {
        out.push_str(&format!("... and {l} not shown\n"));
    }
    if errors > 0 || warnings > 0 {
        out.push_str(&format!(
            "{}, {}\n",
            plural(errors, "error"),
            plural(warnings, "warning")
        ));
    }
    out
}

/// A diagnostic as JSON: code, severity, message, help, notes, and labels with file, byte
/// range, 1-based line and column.
pub fn to_json(d: &Diagnostic, sources: &SourceMap) -> serde_json::Value {
    let labels: Vec<_> = d
        .labels
        .iter()
        .map(|l| {
            let file = sources.get(l.span.file).map(|f| f.name.clone());
            let (line, col) = sources.line_col(l.span).unwrap_or((0, 0));
            serde_json::json!({
                "file": file,
                "start": l.span.lo,
                "end": l.span.hi,
                "line": line,
                "column": col,
                "message": l.message,
                "primary": l.primary,
            })
        })
        .collect();
    serde_json::json!({
        "code": d.code.to_string(),
        "name": d.code.info().name,
        "severity": d.severity,
        "message": d.message,
        "help": d.help,
        "notes": d.notes,
        "labels": labels,
    })
}
