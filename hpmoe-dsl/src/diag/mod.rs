//! Diagnostics: every stage reports problems as [`Diagnostic`] values that carry a stable
//! [`Code`], a message, labelled source spans and optional help.
//!
//! In: spans from the syntax stage and messages from every stage. Out: diagnostics rendered by
//! [`render`] (graphical or plain text through miette) or as JSON ([`to_json`]).

mod codes;
mod render;

pub use codes::{Code, CodeInfo, CODES};
pub use render::{render, render_all, shown, to_json, RenderStyle};

use crate::syntax::token::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// A span with a message.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub span: Span,
    pub message: String,
    pub primary: bool,
}

/// One problem found in a program.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub labels: Vec<Label>,
    pub help: Option<String>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            labels: Vec::new(),
            help: None,
            notes: Vec::new(),
        }
    }

    pub fn warning(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, message)
        }
    }

    /// The main location, with a message.
    pub fn primary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            message: message.into(),
            primary: true,
        });
        self
    }

    /// A further location that explains the main one.
    pub fn secondary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            message: message.into(),
            primary: false,
        });
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    /// The primary span, if any.
    pub fn span(&self) -> Option<Span> {
        self.labels
            .iter()
            .find(|l| l.primary)
            .or(self.labels.first())
            .map(|l| l.span)
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// A growable list of diagnostics with a cap, so a pathological input cannot make us
/// produce (and print) millions of them. Errors and warnings have caps of their own: an
/// error that comes after many warnings is still kept (and still fails the run).
#[derive(Clone, Debug, Default)]
pub struct Diagnostics {
    list: Vec<Diagnostic>,
    /// Per severity, how many are in `list` (counted as they come, so that a push past the
    /// cap does not count the list).
    kept: Dropped,
    dropped: Dropped,
}

/// Errors and warnings counted apart: those left out of a capped list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub errors: usize,
    pub warnings: usize,
}

impl Dropped {
    /// Nothing left out.
    pub const NONE: Dropped = Dropped { errors: 0, warnings: 0 };

    /// What was left out, in words ("3 more errors and 1 more warning"); `None` for nothing.
    pub fn describe(&self) -> Option<String> {
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        match (self.errors, self.warnings) {
            (0, 0) => None,
            (e, 0) => Some(plural(e, "more error")),
            (0, w) => Some(plural(w, "more warning")),
            (e, w) => Some(format!("{} and {}", plural(e, "more error"), plural(w, "more warning"))),
        }
    }

    /// Whether nothing was left out.
    pub fn is_none(&self) -> bool {
        *self == Dropped::NONE
    }

    /// Adds `"dropped": {"errors", "warnings"}` to a JSON document with a `diagnostics` list
    /// when its list left some out (nothing otherwise).
    pub fn add_to_json(&self, doc: &mut serde_json::Value) {
        if let (false, Some(m)) = (self.is_none(), doc.as_object_mut()) {
            m.insert(
                "dropped".into(),
                serde_json::json!({"errors": self.errors, "warnings": self.warnings}),
            );
        }
    }

    fn of(&mut self, d: &Diagnostic) -> &mut usize {
        if d.is_error() {
            &mut self.errors
        } else {
            &mut self.warnings
        }
    }
}

/// At most this many errors, and this many warnings, are kept per run; the rest are counted.
pub const MAX_DIAGNOSTICS: usize = 200;

impl Diagnostics {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, d: Diagnostic) {
        let kept = self.kept.of(&d);
        if *kept < MAX_DIAGNOSTICS {
            *kept += 1;
            self.list.push(d);
        } else {
            *self.dropped.of(&d) += 1;
        }
    }
    pub fn extend(&mut self, ds: impl IntoIterator<Item = Diagnostic>) {
        for d in ds {
            self.push(d);
        }
    }
    pub fn has_errors(&self) -> bool {
        self.dropped.errors > 0 || self.list.iter().any(Diagnostic::is_error)
    }
    pub fn error_count(&self) -> usize {
        self.list.iter().filter(|d| d.is_error()).count() + self.dropped.errors
    }
    /// The errors and warnings left out of the list.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }
    pub fn as_slice(&self) -> &[Diagnostic] {
        &self.list
    }
    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.list
    }
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    pub fn len(&self) -> usize {
        self.list.len()
    }
    /// Adds a note to every diagnostic pushed since there were `from`.
    pub fn note_since(&mut self, from: usize, note: &str) {
        for d in self.list.iter_mut().skip(from) {
            d.notes.push(note.to_string());
        }
    }
    /// Sorts by file and position, keeping the order of equal positions; stable output.
    pub fn sort(&mut self) {
        self.list
            .sort_by_key(|d| d.span().map(|s| (s.file, s.lo, s.hi)).unwrap_or_default());
    }
    /// Removes repeated identical diagnostics (call after [`Diagnostics::sort`]).
    pub fn dedup(&mut self) {
        let mut kept: Vec<Diagnostic> = Vec::with_capacity(self.list.len());
        for d in std::mem::take(&mut self.list) {
            let same_span = d.span();
            let dup = kept.iter().rev().take_while(|k| k.span() == same_span).any(|k| *k == d);
            if !dup {
                kept.push(d);
            }
        }
        self.list = kept;
    }
}
