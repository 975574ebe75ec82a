//! Loading: the root file and, transitively, every module it imports (standard modules from
//! the embedded stdlib, files relative to the importer). Detects missing files and cycles,
//! then builds each module's scope.

use super::{Checker, ItemRef, ModId, Module};
use crate::diag::{Code, Diagnostic};
use crate::stdlib;
use crate::syntax::ast::{ImportNames, ImportSource, ItemKind};
use crate::syntax::token::{FileId, Span};
use std::path::{Path, PathBuf};

/// At most this many modules per program (a guard against pathological import graphs).
const MAX_MODULES: usize = 256;

impl Checker<'_> {
    pub(super) fn load_root(&mut self, file: FileId) -> Option<ModId> {
        let path = self.sources.get(file).and_then(|f| f.path.clone());
        let mut stack = Vec::new();
        let root = self.load_module(file, None, path, &mut stack);
        // Prelude modules are always loaded.
        for name in stdlib::PRELUDE {
            self.load_std(name, &mut Vec::new());
        }
        Some(root)
    }

    fn parse_into(&mut self, file: FileId, std_name: Option<String>, path: Option<PathBuf>) -> ModId {
        let text = self.sources.get(file).map(|f| f.text.clone()).unwrap_or_default();
        let (ast, diags) = crate::syntax::parse_code(&text, file);
        self.add_module(file, ast, diags, std_name, path)
    }

    /// Registers a parsed module (its syntax errors included).
    pub(super) fn add_module(
        &mut self,
        file: FileId,
        ast: crate::syntax::ast::File,
        diags: Vec<crate::Diagnostic>,
        std_name: Option<String>,
        path: Option<PathBuf>,
    ) -> ModId {
        // Items and `let`s that failed to parse are dropped from the AST: uses of their names
        // would only repeat the syntax error, so they stay silent.
        let poisoned = if diags.is_empty() {
            Default::default()
        } else {
            let text = self.sources.get(file).map(|f| f.text.clone()).unwrap_or_default();
            declared_names(&text, file)
        };
        self.diags.extend(diags);
        let ident = path.as_deref().and_then(file_identity);
        self.modules.push(Module {
            file,
            ast: std::rc::Rc::new(ast),
            std_name,
            ident,
            path,
            scope: Default::default(),
            poisoned,
        });
        self.modules.len() - 1
    }

    /// The root from an already parsed source (the `taskflow!` macro), with its imports and
    /// the prelude.
    pub(super) fn load_root_parsed(
        &mut self,
        file: FileId,
        ast: crate::syntax::ast::File,
        diags: Vec<crate::Diagnostic>,
    ) -> ModId {
        let path = self.sources.get(file).and_then(|f| f.path.clone());
        let root = self.add_module(file, ast, diags, None, path.clone());
        self.load_imports(root, path, &mut Vec::new());
        for name in stdlib::PRELUDE {
            self.load_std(name, &mut Vec::new());
        }
        root
    }

    /// Loads a module and its imports; `stack` holds the canonical paths being loaded.
    fn load_module(
        &mut self,
        file: FileId,
        std_name: Option<String>,
        path: Option<PathBuf>,
        stack: &mut Vec<PathBuf>,
    ) -> ModId {
        let m = self.parse_into(file, std_name, path.clone());
        self.load_imports(m, path, stack);
        m
    }

    /// Loads the imports of module `m` (whose canonical path is `path`).
    fn load_imports(&mut self, m: ModId, path: Option<PathBuf>, stack: &mut Vec<PathBuf>) {
        if let Some(p) = &path {
            stack.push(p.clone());
        }
        let imports: Vec<(ImportSource, Span)> = self.modules[m]
            .ast
            .items
            .iter()
            .filter_map(|it| match &it.kind {
                ItemKind::Import(imp) => Some((imp.source.clone(), it.span)),
                _ => None,
            })
            .collect();
        for (src, span) in imports {
            match src {
                ImportSource::Std(path) => {
                    if path.len() != 2 || path[0].name != "std" {
                        let sp = path.first().map(|p| p.span).unwrap_or(span);
                        let sp = path.iter().fold(sp, |a, p| a.to(p.span));
                        self.err(
                            Diagnostic::error(Code::UnknownModule, "unknown module path")
                                .primary(sp, "not a standard module")
                                .help(format!(
                                    "standard modules are {}; files are imported with `import \"file.hpm\";`",
                                    stdlib::MODULES
                                        .iter()
                                        .map(|(n, _)| format!("`std::{n}`"))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                )),
                        );
                        continue;
                    }
                    let name = &path[1];
                    if stdlib::module(&name.name).is_none() {
                        let mut d =
                            Diagnostic::error(Code::UnknownModule, format!("no standard module `std::{}`", name.name))
                                .primary(name.span, "unknown module");
                        if let Some(b) = crate::suggest::closest(&name.name, stdlib::MODULES.iter().map(|(n, _)| *n)) {
                            d = d.help(format!("did you mean `std::{b}`?"));
                        }
                        self.err(d);
                        continue;
                    }
                    self.load_std(&name.name, stack);
                }
                ImportSource::File(rel, sp) => {
                    self.load_file_import(m, &rel, sp, stack);
                }
            }
        }
        if path.is_some() {
            stack.pop();
        }
    }

    pub(super) fn load_std(&mut self, name: &str, stack: &mut Vec<PathBuf>) -> Option<ModId> {
        if let Some(i) = self.modules.iter().position(|m| m.std_name.as_deref() == Some(name)) {
            return Some(i);
        }
        let text = stdlib::module(name)?;
        let file = self.sources.add(format!("<std>/{name}.hpm"), None, text);
        let first_new = self.modules.len();
        let m = self.load_module(file, Some(name.to_string()), None, stack);
        // Loaded late (e.g. the default device): its scope was not built with the others.
        if self.scopes_built {
            for new in first_new..self.modules.len() {
                self.build_scope(new);
            }
        }
        Some(m)
    }

    fn load_file_import(&mut self, from: ModId, rel: &str, span: Span, stack: &mut Vec<PathBuf>) -> Option<ModId> {
        let base = self.modules[from]
            .path
            .as_ref()
            .and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let joined = match base {
            Some(b) => b.join(rel),
            None => PathBuf::from(rel),
        };
        // The name shown in diagnostics: relative to the importer's shown name, so a root
        // given as a relative path shows its imports relative too.
        let shown = match self.sources.get(self.modules[from].file) {
            Some(f) if f.path.is_some() => Path::new(&f.name)
                .parent()
                .map_or_else(|| PathBuf::from(rel), |d| d.join(rel)),
            _ => joined.clone(),
        };
        let canon = match std::fs::canonicalize(&joined) {
            Ok(c) => c,
            Err(e) => {
                self.err(
                    Diagnostic::error(Code::FileNotFound, format!("cannot import `{rel}`: {e}"))
                        .primary(span, "this file cannot be read")
                        .note(format!("looked for {}", shown.display())),
                );
                return None;
            }
        };
        if let Some(d) = self.outside_allowed(&canon, &format!("cannot import `{rel}`"), span) {
            self.err(d);
            return None;
        }
        let canon = self.loaded_path(canon);
        if let Some(pos) = stack.iter().position(|p| *p == canon) {
            let chain: Vec<String> = stack[pos..]
                .iter()
                .chain(std::iter::once(&canon))
                .map(|p| {
                    p.file_name()
                        .map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned())
                })
                .collect();
            self.err(
                Diagnostic::error(Code::ImportCycle, format!("import cycle: {}", chain.join(" -> ")))
                    .primary(span, "this import closes the cycle")
                    .help("move the shared items to a file that both import"),
            );
            return None;
        }
        if let Some(i) = self.modules.iter().position(|m| m.path.as_ref() == Some(&canon)) {
            return Some(i);
        }
        if self.modules.len() >= MAX_MODULES {
            self.err(
                Diagnostic::error(Code::LimitExceeded, format!("more than {MAX_MODULES} imported files"))
                    .primary(span, "one import too many"),
            );
            return None;
        }
        // The files of a program hold at most a source file's limit together: each file
        // within the limit, many of them would not fit in memory.
        let used: u64 = self
            .modules
            .iter()
            .filter(|m| m.std_name.is_none())
            .filter_map(|m| self.sources.get(m.file))
            .map(|f| f.text.len() as u64)
            .sum();
        let too_much = |size: u64| {
            Diagnostic::error(
                Code::LimitExceeded,
                format!(
                    "the program's files would hold more than {} MiB together",
                    MAX_SOURCE_BYTES >> 20
                ),
            )
            .primary(span, format!("this import adds {size} bytes to {used}"))
            .help("the root file and the files it imports hold at most 64 MiB of source text together")
        };
        let size = std::fs::metadata(&canon).map_or(0, |m| m.len());
        if used.saturating_add(size) > MAX_SOURCE_BYTES {
            self.err(too_much(size));
            return None;
        }
        let text = match read_source(&canon) {
            Ok(t) => t,
            Err(e) => {
                self.err(
                    Diagnostic::error(Code::FileNotFound, format!("cannot import `{rel}`: {e}"))
                        .primary(span, "this file cannot be read"),
                );
                return None;
            }
        };
        // A file whose size was not known before reading it (under `/proc`).
        if used.saturating_add(text.len() as u64) > MAX_SOURCE_BYTES {
            self.err(too_much(text.len() as u64));
            return None;
        }
        let file = self.sources.add(shown.display().to_string(), Some(canon.clone()), text);
        Some(self.load_module(file, None, Some(canon), stack))
    }

    /// The path under which the file at canonical path `canon` is (or will be) loaded: the
    /// path of an already loaded module with the same identity (a hard link to it), else
    /// `canon` itself.
    fn loaded_path(&self, canon: PathBuf) -> PathBuf {
        let Some(id) = file_identity(&canon) else {
            return canon;
        };
        self.modules
            .iter()
            .find(|m| m.ident == Some(id))
            .and_then(|m| m.path.clone())
            .unwrap_or(canon)
    }

    /// The directories files may be read from: the root file's directory (the current
    /// directory for a root without a path) and the `--allow-path` directories, canonical.
    fn allowed_dirs(&self) -> Vec<PathBuf> {
        let root_dir = self
            .modules
            .first()
            .and_then(|m| m.path.as_deref())
            .and_then(Path::parent)
            .map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d })
            .unwrap_or(Path::new("."));
        std::iter::once(root_dir)
            .chain(self.opts.allow_paths.iter().map(PathBuf::as_path))
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .collect()
    }

    /// A diagnostic (that does not read the file) when canonical path `canon` lies outside
    /// every allowed directory.
    pub(crate) fn outside_allowed(&self, canon: &Path, what: &str, span: Span) -> Option<Diagnostic> {
        let dirs = self.allowed_dirs();
        if dirs.iter().any(|d| canon.starts_with(d)) {
            return None;
        }
        let shown = dirs
            .first()
            .map_or_else(|| ".".to_string(), |d| d.display().to_string());
        Some(
            Diagnostic::error(Code::FileNotFound, format!("{what}: outside the program's directory"))
                .primary(span, "this file is not read")
                .note(format!("it resolves to {}, outside {shown}", canon.display()))
                .help("files are read only from the root file's directory and below; `--allow-path DIR` allows another directory"),
        )
    }

    /// The module an import refers to (already loaded).
    fn import_target(&self, from: ModId, src: &ImportSource) -> Option<ModId> {
        match src {
            ImportSource::Std(path) => {
                let name = &path.get(1)?.name;
                if path.len() != 2 {
                    return None;
                }
                self.modules
                    .iter()
                    .position(|m| m.std_name.as_deref() == Some(name.as_str()))
            }
            ImportSource::File(rel, _) => {
                let base = self.modules[from]
                    .path
                    .as_ref()
                    .and_then(|p| p.parent().map(|d| d.to_path_buf()));
                let joined = match base {
                    Some(b) => b.join(rel),
                    None => PathBuf::from(rel),
                };
                let canon = self.loaded_path(std::fs::canonicalize(joined).ok()?);
                self.modules.iter().position(|m| m.path.as_ref() == Some(&canon))
            }
        }
    }

    /// Builds a module's scope: its own items, the prelude, and its imports.
    pub(super) fn build_scope(&mut self, m: ModId) {
        let mut scope: super::Scope = Default::default();
        // A shared handle to the file, so its names are read in place.
        let ast = std::rc::Rc::clone(&self.modules[m].ast);
        // Room for every item's name at once: growing would rehash every name so far.
        scope.reserve(ast.items.len());
        for (i, item) in ast.items.iter().enumerate() {
            if matches!(item.kind, ItemKind::Schedule(_)) {
                continue;
            }
            let Some(name) = item.kind.name() else {
                continue;
            };
            match scope.entry(super::ScopeKey::from(name.name.as_str())) {
                std::collections::hash_map::Entry::Occupied(prev) => {
                    let prev = prev.get().0;
                    let prev_span = self.item(prev).kind.name().map_or(name.span, |n| n.span);
                    self.err(
                        Diagnostic::error(Code::DuplicateDefinition, format!("`{}` is defined twice", name.name))
                            .primary(name.span, "defined again here")
                            .secondary(prev_span, "first defined here")
                            .help("rename one of them"),
                    );
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert((ItemRef { module: m, item: i }, name.span));
                }
            }
        }
        // The prelude: routing kinds and policies, unless shadowed.
        for p in stdlib::PRELUDE {
            let Some(pm) = self.modules.iter().position(|x| x.std_name.as_deref() == Some(*p)) else {
                continue;
            };
            if pm == m {
                continue;
            }
            for (i, item) in self.modules[pm].ast.items.iter().enumerate() {
                if let Some(n) = item.kind.name() {
                    scope
                        .entry(super::ScopeKey::from(n.name.as_str()))
                        .or_insert((ItemRef { module: pm, item: i }, n.span));
                }
            }
        }
        // Imports.
        let imports: Vec<(ImportSource, ImportNames)> = self.modules[m]
            .ast
            .items
            .iter()
            .filter_map(|it| match &it.kind {
                ItemKind::Import(imp) => Some((imp.source.clone(), imp.names.clone())),
                _ => None,
            })
            .collect();
        let mut item_maps: rustc_hash::FxHashMap<ModId, rustc_hash::FxHashMap<super::ScopeKey, usize>> =
            Default::default();
        for (src, names) in imports {
            let Some(t) = self.import_target(m, &src) else { continue };
            let module_desc = match &src {
                ImportSource::Std(p) => p.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join("::"),
                ImportSource::File(f, _) => format!("\"{f}\""),
            };
            let mut bring = Vec::new();
            match names {
                ImportNames::All(sp) => {
                    for (i, item) in self.modules[t].ast.items.iter().enumerate() {
                        if let Some(n) = item.kind.name() {
                            if !matches!(item.kind, ItemKind::Schedule(_)) {
                                bring.push((n.name.clone(), ItemRef { module: t, item: i }, sp));
                            }
                        }
                    }
                }
                ImportNames::List(list) => {
                    // The module's items by name (the first of each name), made once per
                    // module: a long list, or many lists, from a long module are not a search
                    // of every item per name.
                    let by_name = item_maps.entry(t).or_insert_with(|| {
                        let mut map: rustc_hash::FxHashMap<super::ScopeKey, usize> = Default::default();
                        for (i, it) in self.modules[t].ast.items.iter().enumerate().rev() {
                            if let (false, Some(n)) = (matches!(it.kind, ItemKind::Schedule(_)), it.kind.name()) {
                                map.insert(super::ScopeKey::from(n.name.as_str()), i);
                            }
                        }
                        map
                    });
                    let mut listed: rustc_hash::FxHashMap<&str, Span> = Default::default();
                    for id in &list {
                        if let Some(first) = listed.insert(id.name.as_str(), id.span) {
                            self.err(
                                Diagnostic::error(
                                    Code::DuplicateDefinition,
                                    format!("`{}` is imported twice", id.name),
                                )
                                .primary(id.span, "imported again here")
                                .secondary(first, "first imported here")
                                .help("list each name once"),
                            );
                            continue;
                        }
                        let found = by_name.get(id.name.as_str()).copied();
                        match found {
                            Some(i) => bring.push((id.name.clone(), ItemRef { module: t, item: i }, id.span)),
                            None if self.modules[t].poisoned.contains(&id.name) => {
                                // The item did not parse in its file: already reported there.
                                self.modules[m].poisoned.insert(id.name.clone());
                            }
                            None => {
                                self.modules[m].poisoned.insert(id.name.clone());
                                let mut d = Diagnostic::error(
                                    Code::UnknownModule,
                                    format!("`{module_desc}` has no item `{}`", id.name),
                                )
                                .primary(id.span, "not found in this module");
                                let items = &self.modules[t].ast.items;
                                let names = || items.iter().filter_map(|it| it.kind.name().map(|n| n.name.as_str()));
                                if let Some(b) = crate::suggest::closest(&id.name, names()) {
                                    d = d.help(format!("did you mean `{b}`?"));
                                } else {
                                    // A long module is summarised, not listed.
                                    const SHOWN: usize = 12;
                                    let total = names().count();
                                    let mut list: Vec<&str> = names().take(SHOWN).collect();
                                    if total > SHOWN {
                                        list.push("...");
                                    }
                                    if total > 0 {
                                        let more = if total > SHOWN {
                                            format!(" ({total} items)")
                                        } else {
                                            String::new()
                                        };
                                        d = d.help(format!("it defines{more}: {}", list.join(", ")));
                                    }
                                }
                                self.err(d);
                            }
                        }
                    }
                }
            }
            for (name, r, sp) in bring {
                match scope.get(name.as_str()) {
                    Some((prev, _)) if *prev == r => {}
                    Some((prev, psp))
                        if prev.module == m
                            || self.modules[prev.module]
                                .std_name
                                .as_deref()
                                .is_none_or(|n| !stdlib::PRELUDE.contains(&n)) =>
                    {
                        let psp = *psp;
                        self.err(
                            Diagnostic::error(
                                Code::DuplicateDefinition,
                                format!("`{name}` is imported but already defined"),
                            )
                            .primary(sp, "imported here")
                            .secondary(psp, "already defined here"),
                        );
                    }
                    _ => {
                        scope.insert(super::ScopeKey::from(name), (r, sp));
                    }
                }
            }
        }
        self.modules[m].scope = scope;
    }
}

/// The largest source file accepted, and the most source text the files of one program (the
/// root file and every file it imports) hold together.
pub const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// Reads a source file: a regular file of at most [`MAX_SOURCE_BYTES`], as UTF-8. At most
/// that many bytes are read, whatever size the file system reports (a file under `/proc`
/// reports 0 and may go on for gigabytes).
pub fn read_source(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let too_large = || std::io::Error::other(format!("larger than {} MiB", MAX_SOURCE_BYTES >> 20));
    // Asked before opening: opening a FIFO would wait for a writer.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > MAX_SOURCE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)?
        .take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let before = &bytes[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        // The column counts characters; the prefix of the line is valid UTF-8.
        let column = std::str::from_utf8(&before[line_start..]).map_or(at - line_start, |s| s.chars().count()) + 1;
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "invalid UTF-8 at line {line}, column {column} (byte {at}, 0x{:02x})",
                bytes[at]
            ),
        )
    })
}

/// Every name that follows a defining keyword (`param NAME`, `op NAME`, `let NAME`, ...)
/// in a text, found from its tokens alone, so it works where the parse failed.
fn declared_names(text: &str, file: FileId) -> std::collections::BTreeSet<String> {
    use crate::syntax::token::TokenKind;
    const DEFINING: &[&str] = &[
        "param", "route", "op", "comm", "taskflow", "profile", "routing", "policy", "let",
    ];
    use crate::syntax::token::TokenSource;
    // Token by token, two at a time: a large file's tokens are never held all at once.
    let mut lx = crate::syntax::lexer::Lexer::new(text, file).without_comments();
    let mut names = std::collections::BTreeSet::new();
    let mut prev = TokenKind::Eof;
    loop {
        let t = lx.next_token();
        if t.kind == TokenKind::Eof {
            return names;
        }
        if let (TokenKind::Ident(kw), TokenKind::Ident(name)) = (&prev, &t.kind) {
            if DEFINING.contains(&kw.as_str()) {
                names.insert(name.clone());
            }
        }
        prev = t.kind;
    }
}

/// A file's identity: (device, inode) on Unix, so the names of one file are recognised.
#[cfg(unix)]
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A file's identity: none where the platform has no inode numbers (canonical paths only).
#[cfg(not(unix))]
fn file_identity(_path: &Path) -> Option<(u64, u64)> {
    None
}
