//! The sources of a compilation: files, REPL lines, stdlib modules, macro invocations.

use crate::syntax::token::{FileId, Span};
use std::path::PathBuf;
use std::sync::Arc;

/// One source text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// The name shown in diagnostics (`examples/moe.hpm`, `<std>/moe.hpm`, `<repl>`).
    pub name: String,
    /// The path on disk, when the text came from a file (imports are relative to it).
    pub path: Option<PathBuf>,
    pub text: Arc<str>,
}

/// All sources of one compilation, indexed by [`FileId`].
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: impl Into<String>, path: Option<PathBuf>, text: impl Into<Arc<str>>) -> FileId {
        let id = FileId(self.files.len() as u32);
        self.files.push(SourceFile {
            name: name.into(),
            path,
            text: text.into(),
        });
        id
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

    /// 1-based line and column of a span's start.
    pub fn line_col(&self, span: Span) -> Option<(usize, usize)> {
        let text = &self.get(span.file)?.text;
        let lo = (span.lo as usize).min(text.len());
        let before = text.get(..lo)?;
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let col = before.rfind('\n').map_or(lo, |p| lo - p - 1) + 1;
        Some((line, col))
    }
}
