//! Checking a document: the hpmoe-dsl checker on the editor's text (its imports read from
//! disk, relative to the document), the diagnostics in the protocol's terms, and an index of
//! every definition in the sources the check loaded.
//!
//! A document is checked again after each batch of changes (the main loop coalesces the
//! changes that arrived together); the text of the previous check is kept with its results,
//! so every request answers from one consistent state.

use super::files;
use super::text::LineIndex;
use hpmoe_dsl::check::Options;
use hpmoe_dsl::diag::{Diagnostic, Severity};
use hpmoe_dsl::driver::Checked;
use hpmoe_dsl::syntax::ast::{self, ItemKind};
use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::token::FileId;
use hpmoe_dsl::syntax::token::{Delim, Punct, TokenKind};
use hpmoe_dsl::{SourceMap, Span};
use lsp_types as lsp;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

/// What a global name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefKind {
    Param,
    Route,
    Op,
    Comm,
    Taskflow,
    Profile,
    RoutingKind,
    Policy,
}

impl DefKind {
    pub fn word(self) -> &'static str {
        match self {
            DefKind::Param => "param",
            DefKind::Route => "route",
            DefKind::Op => "op",
            DefKind::Comm => "comm",
            DefKind::Taskflow => "taskflow",
            DefKind::Profile => "profile",
            DefKind::RoutingKind => "routing",
            DefKind::Policy => "policy",
        }
    }
}

/// One definition of a global name.
#[derive(Clone, Debug)]
pub struct Def {
    pub kind: DefKind,
    pub name: String,
    /// The name where it is defined.
    pub name_span: Span,
    /// The whole item.
    pub item_span: Span,
    pub docs: Vec<String>,
}

/// The result of checking one text.
#[derive(Debug)]
pub struct Analysis {
    pub sources: SourceMap,
    pub root: FileId,
    /// The parse of the document itself.
    pub ast: ast::File,
    pub checked: Option<Checked>,
    pub diagnostics: Vec<Diagnostic>,
    /// Every definition of every loaded source, the document's first.
    pub defs: Vec<Def>,
    /// Per taskflow, once a hover asked: the policy and the tiles per rank of every call (or
    /// why they could not be counted).
    pub tiles: TileCache,
    /// The first definition of each name (an index into `defs`): a request looks a name up
    /// once, not with a scan of every definition.
    first_def: HashMap<String, usize>,
    /// The line index of each loaded source, built when a request first needs it.
    lines: Vec<OnceCell<LineIndex>>,
    /// The document's tokens, lexed when a request first needs them.
    lexed: OnceCell<Lexed>,
}

/// What a token of the document is, without its text (an identifier's name is the text of
/// its span).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok {
    Ident,
    Number,
    Str,
    Doc,
    Punct(Punct),
    Open(Delim),
    Other,
}

/// The tokens and comments of the document, in order.
#[derive(Debug, Default)]
pub struct Lexed {
    pub toks: Vec<(Span, Tok)>,
    pub comments: Vec<Span>,
}

/// Tiles per rank of every call of a taskflow, by taskflow name.
pub type TileCache = std::cell::RefCell<std::collections::BTreeMap<String, Result<(String, Vec<Vec<u32>>), String>>>;

/// Checks `text`, the document at `path` (or an unsaved buffer named `name`).
pub fn analyse(name: &str, path: Option<&Path>, text: &str) -> Analysis {
    let mut sources = SourceMap::new();
    let canon = path.map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
    let shown = path.map_or_else(|| name.to_string(), |p| p.display().to_string());
    let root = sources.add(shown, canon, text);
    let checking = hpmoe_dsl::driver::check_file(root, &Options::default(), &mut sources);
    let (ast, _, _) = hpmoe_dsl::syntax::parse_text(text, root);
    let mut defs = Vec::new();
    collect_defs(&ast, &mut defs);
    for (id, f) in sources.files() {
        if id != root {
            let (other, _, _) = hpmoe_dsl::syntax::parse_text(&f.text, id);
            collect_defs(&other, &mut defs);
        }
    }
    let mut first_def = HashMap::new();
    for (i, d) in defs.iter().enumerate() {
        first_def.entry(d.name.clone()).or_insert(i);
    }
    let lines = (0..sources.files().count()).map(|_| OnceCell::new()).collect();
    Analysis {
        root,
        ast,
        checked: checking.checked,
        diagnostics: checking.diagnostics.into_vec(),
        defs,
        sources,
        tiles: TileCache::default(),
        first_def,
        lines,
        lexed: OnceCell::new(),
    }
}

pub(super) fn collect_defs(file: &ast::File, out: &mut Vec<Def>) {
    for item in &file.items {
        let (kind, name) = match &item.kind {
            ItemKind::Param(p) => (DefKind::Param, &p.name),
            ItemKind::Route(r) => (DefKind::Route, &r.name),
            ItemKind::Op(o) => (
                match o.kind {
                    ast::OpKind::Compute => DefKind::Op,
                    ast::OpKind::Comm => DefKind::Comm,
                },
                &o.name,
            ),
            ItemKind::Taskflow(t) => (DefKind::Taskflow, &t.name),
            ItemKind::Grad(g) => (DefKind::Taskflow, &g.name),
            ItemKind::Profile(p) => (DefKind::Profile, &p.name),
            ItemKind::Signature(s) => (
                match s.kind {
                    ast::SignatureKind::Routing => DefKind::RoutingKind,
                    ast::SignatureKind::Policy => DefKind::Policy,
                },
                &s.name,
            ),
            ItemKind::Import(_) | ItemKind::Device(_) | ItemKind::Schedule(_) => continue,
        };
        out.push(Def {
            kind,
            name: name.name.clone(),
            name_span: name.span,
            item_span: item.span,
            docs: item.docs.clone(),
        });
    }
}

impl Analysis {
    /// The definition of a name: the document's, else the first of the sources it loaded.
    pub fn def_named(&self, name: &str) -> Option<&Def> {
        self.first_def.get(name).map(|&i| &self.defs[i])
    }

    /// The line index of a loaded source.
    pub fn lines(&self, file: FileId) -> Option<&LineIndex> {
        let f = self.sources.get(file)?;
        Some(self.lines.get(file.0 as usize)?.get_or_init(|| LineIndex::new(&f.text)))
    }

    /// The tokens and comments of the document.
    pub fn lexed(&self) -> &Lexed {
        self.lexed.get_or_init(|| {
            let text = self.source_text(self.root).unwrap_or("");
            let (toks, _, comments) = tokenize(text, self.root);
            Lexed {
                toks: toks
                    .iter()
                    .filter(|t| t.kind != TokenKind::Eof)
                    .map(|t| {
                        let kind = match t.kind {
                            TokenKind::Ident(_) => Tok::Ident,
                            TokenKind::Int(_) | TokenKind::Float(_) => Tok::Number,
                            TokenKind::Str(_) => Tok::Str,
                            TokenKind::Doc(_) | TokenKind::InnerDoc(_) => Tok::Doc,
                            TokenKind::Punct(p) => Tok::Punct(p),
                            TokenKind::Open(d) => Tok::Open(d),
                            TokenKind::Close(_) | TokenKind::Error | TokenKind::Eof => Tok::Other,
                        };
                        (t.span, kind)
                    })
                    .collect(),
                comments: comments.iter().map(|c| c.span).collect(),
            }
        })
    }

    /// The text of a loaded source.
    pub fn source_text(&self, file: FileId) -> Option<&str> {
        self.sources.get(file).map(|f| f.text.as_str())
    }

    /// The location of a span of any loaded source: the document, an imported file, or a
    /// stdlib module (as its file on disk). `None` for a source that has no file.
    pub fn location(&self, span: Span, doc_uri: &lsp::Uri) -> Option<lsp::Location> {
        let f = self.sources.get(span.file)?;
        let uri = if span.file == self.root {
            doc_uri.clone()
        } else if let Some(p) = &f.path {
            lsp::Uri::from_str(&files::path_to_uri(p)).ok()?
        } else {
            let p = files::stdlib_path(files::stdlib_module(&f.name)?)?;
            lsp::Uri::from_str(&files::path_to_uri(&p)).ok()?
        };
        let idx = self.lines(span.file)?;
        Some(lsp::Location {
            uri,
            range: idx.range(&f.text, span.lo as usize, span.hi as usize),
        })
    }

    /// The diagnostics in the protocol's terms. A problem found in another file (an import)
    /// is shown at the top of the document, its own place as related information.
    pub fn lsp_diagnostics(&self, doc_uri: &lsp::Uri) -> Vec<lsp::Diagnostic> {
        let doc_text = self.source_text(self.root).unwrap_or("");
        let Some(idx) = self.lines(self.root) else {
            return Vec::new();
        };
        self.diagnostics
            .iter()
            .map(|d| {
                let primary = d.labels.iter().find(|l| l.primary).or(d.labels.first());
                let mut message = d.message.clone();
                let mut related = Vec::new();
                let range = match primary {
                    Some(l) if l.span.file == self.root => {
                        if !l.message.is_empty() {
                            message.push_str(&format!("\n{}", l.message));
                        }
                        idx.range(doc_text, l.span.lo as usize, l.span.hi as usize)
                    }
                    Some(l) => {
                        let name = self.sources.get(l.span.file).map_or("?", |f| f.name.as_str());
                        message = format!("in {name}: {message}");
                        if let Some(loc) = self.location(l.span, doc_uri) {
                            related.push(lsp::DiagnosticRelatedInformation {
                                location: loc,
                                message: if l.message.is_empty() {
                                    d.message.clone()
                                } else {
                                    l.message.clone()
                                },
                            });
                        }
                        lsp::Range::default()
                    }
                    None => lsp::Range::default(),
                };
                for l in &d.labels {
                    if primary.is_some_and(|p| std::ptr::eq(p, l)) {
                        continue;
                    }
                    if let Some(loc) = self.location(l.span, doc_uri) {
                        related.push(lsp::DiagnosticRelatedInformation {
                            location: loc,
                            message: l.message.clone(),
                        });
                    }
                }
                if let Some(h) = &d.help {
                    message.push_str(&format!("\nhelp: {h}"));
                }
                for n in &d.notes {
                    message.push_str(&format!("\nnote: {n}"));
                }
                lsp::Diagnostic {
                    range,
                    severity: Some(match d.severity {
                        Severity::Error => lsp::DiagnosticSeverity::ERROR,
                        Severity::Warning => lsp::DiagnosticSeverity::WARNING,
                    }),
                    code: Some(lsp::NumberOrString::String(d.code.to_string())),
                    code_description: None,
                    source: Some("hpmoe".into()),
                    message,
                    related_information: (!related.is_empty()).then_some(related),
                    tags: None,
                    data: None,
                }
            })
            .collect()
    }
}
