//! Input handling shared by the line editor and scripts: whether an input is complete (a
//! bracket or block comment still open at the end, or a `///` doc comment last, means "go
//! on on the next line"), and the session buffer's items (to add or replace a definition).

use hpmoe_dsl::syntax::ast::{Item, ItemKind};
use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::token::{FileId, TokenKind};

/// Whether `text` is a whole input. A `:command` is one line; a definition goes on while a
/// bracket it opened is not closed, a block comment is open, or its last token is a `///` doc
/// comment (which documents the item on the next lines). A closing bracket that closes none
/// or one of another kind ends the input at its line: the input is an error whatever follows.
/// Decided by the tokens alone (see [`OpenScan`]), never by how the parser recovers from an
/// error, so that an input read line by line is scanned once.
pub fn is_complete(text: &str) -> bool {
    let mut scan = OpenScan::default();
    for line in text.split_inclusive('\n') {
        scan.line(line);
    }
    scan.is_complete(text)
}

/// A scan of an input read line by line that follows the lexer: `//` to the end of the line
/// (`///` is a doc comment, `////` is not), nested `/* */`, strings with `\` escapes going on
/// over lines, and the brackets. Each line is scanned once, so an input of many lines costs
/// linear time.
#[derive(Clone, Debug, Default)]
pub(crate) struct OpenScan {
    brackets: Vec<u8>,
    comments: usize,
    /// Inside a string literal.
    string: bool,
    /// A closing bracket closed none, or one of another kind.
    mismatched: bool,
    /// The last token so far is a `///` doc comment.
    doc_last: bool,
}

impl OpenScan {
    /// Scans the next line of the input (with its `\n`).
    pub fn line(&mut self, line: &str) {
        let b = line.as_bytes();
        let mut i = 0;
        while i < b.len() && !self.mismatched {
            let next = b.get(i + 1).copied();
            if self.string {
                match b[i] {
                    b'\\' => i += 2,
                    b'"' => {
                        self.string = false;
                        i += 1;
                    }
                    _ => i += 1,
                }
                continue;
            }
            if self.comments > 0 {
                match (b[i], next) {
                    (b'/', Some(b'*')) => {
                        self.comments += 1;
                        i += 2;
                    }
                    (b'*', Some(b'/')) => {
                        self.comments -= 1;
                        i += 2;
                    }
                    _ => i += 1,
                }
                continue;
            }
            match (b[i], next) {
                (b'/', Some(b'/')) => {
                    // A comment is no token; a doc comment is one.
                    let rest = &b[i..];
                    if rest.starts_with(b"///") && !rest.starts_with(b"////") {
                        self.doc_last = true;
                    } else if rest.starts_with(b"//!") {
                        self.doc_last = false;
                    }
                    return;
                }
                (b'/', Some(b'*')) => {
                    self.comments = 1;
                    i += 2;
                    continue;
                }
                (b' ' | b'\t' | b'\r' | b'\n' | 0x0c, _) => {}
                (b'"', _) => {
                    self.string = true;
                    self.doc_last = false;
                }
                (c @ (b'(' | b'[' | b'{'), _) => {
                    self.brackets.push(c);
                    self.doc_last = false;
                }
                (c @ (b')' | b']' | b'}'), _) => {
                    let open = match c {
                        b')' => b'(',
                        b']' => b'[',
                        _ => b'{',
                    };
                    if self.brackets.pop() != Some(open) {
                        self.mismatched = true;
                    }
                    self.doc_last = false;
                }
                _ => self.doc_last = false,
            }
            i += 1;
        }
    }

    /// Whether the input whose lines this scan has seen (`text`) is complete: see
    /// [`is_complete`].
    pub fn is_complete(&self, text: &str) -> bool {
        let t = text.trim_start();
        if t.is_empty() || t.starts_with(':') {
            return true;
        }
        self.mismatched || (self.comments == 0 && self.brackets.is_empty() && !self.doc_last)
    }
}

/// The input to add: `text`, or `text;` when the only thing missing is a final `;`
/// (`param tokens = 128` at the prompt).
pub(crate) fn with_final_semicolon(text: &str) -> Option<String> {
    let trimmed = text.trim_end();
    if trimmed.ends_with(';') || trimmed.ends_with('}') {
        return None;
    }
    let fixed = format!("{trimmed};");
    let (_, diags, _) = hpmoe_dsl::syntax::parse_text(&fixed, FileId(0));
    diags.is_empty().then_some(fixed)
}

/// What a definition replaces when it is typed again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ItemKey {
    /// A param, op, comm, taskflow, route, profile or signature: one namespace per file.
    Named(String),
    /// `schedule [TASKFLOW] = ...`.
    Schedule(Option<String>),
    Device,
    /// An import, by its tokens.
    Import(String),
}

/// The key of an item.
pub(crate) fn item_key(item: &Item, text: &str) -> ItemKey {
    match &item.kind {
        ItemKind::Schedule(s) => ItemKey::Schedule(s.taskflow.as_ref().map(|i| i.name.clone())),
        ItemKind::Device(_) => ItemKey::Device,
        ItemKind::Import(_) => {
            let src = text.get(item.span.lo as usize..item.span.hi as usize).unwrap_or("");
            ItemKey::Import(src.split_whitespace().collect::<Vec<_>>().join(" "))
        }
        other => ItemKey::Named(other.name().map(|n| n.name.clone()).unwrap_or_default()),
    }
}

/// How an item is named in messages: `op geglu`, `schedule for moe_ffn`, `device`.
pub(crate) fn item_title(item: &Item, text: &str) -> String {
    let kw = text
        .get(item.span.lo as usize..item.span.hi as usize)
        .and_then(|s| s.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').next())
        .unwrap_or("item")
        .to_string();
    match &item.kind {
        ItemKind::Schedule(s) => match &s.taskflow {
            Some(t) => format!("schedule for {}", t.name),
            None => "schedule".to_string(),
        },
        ItemKind::Device(_) => "device".to_string(),
        ItemKind::Import(_) => {
            let src = text.get(item.span.lo as usize..item.span.hi as usize).unwrap_or("");
            src.trim_end_matches(';')
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        }
        other => format!("{kw} {}", other.name().map(|n| n.name.as_str()).unwrap_or("?")),
    }
}

/// The items of a text with their byte ranges, each range widened to the `///` doc comments
/// in front of the item.
pub(crate) fn items_with_ranges(text: &str) -> Vec<(Item, std::ops::Range<usize>)> {
    let (file, _, _) = hpmoe_dsl::syntax::parse_text(text, FileId(0));
    let (toks, _, _) = tokenize(text, FileId(0));
    file.items
        .into_iter()
        .map(|item| {
            let lo = item.span.lo as usize;
            let mut start = lo;
            if let Ok(i) = toks.binary_search_by_key(&item.span.lo, |t| t.span.lo) {
                let mut j = i;
                while j > 0 && matches!(toks[j - 1].kind, TokenKind::Doc(_)) {
                    j -= 1;
                }
                start = toks[j].span.lo as usize;
            }
            let end = (item.span.hi as usize).min(text.len());
            (item, start.min(end)..end)
        })
        .collect()
}

/// The outcome of adding definitions to a buffer.
#[derive(Debug)]
pub(crate) struct Edit {
    pub text: String,
    /// `defined op geglu` / `replaced param tokens`, one per item.
    pub actions: Vec<String>,
    /// Params (re)defined, to warn when a setting overrides them.
    pub params: Vec<String>,
}

/// Adds the items of `input` to `buffer`: an item whose key is already there replaces it in
/// place; a new one goes at the end; an import already there is skipped.
pub(crate) fn add_items(buffer: &str, input: &str) -> Edit {
    let mut text = buffer.to_string();
    let mut actions = Vec::new();
    let mut params = Vec::new();
    for (item, range) in items_with_ranges(input) {
        let new_text = &input[range];
        let key = item_key(&item, input);
        let title = item_title(&item, input);
        if let ItemKind::Param(p) = &item.kind {
            params.push(p.name.name.clone());
        }
        let existing = items_with_ranges(&text)
            .into_iter()
            .find(|(it, _)| item_key(it, &text) == key);
        match existing {
            Some(_) if matches!(key, ItemKey::Import(_)) => actions.push(format!("{title}: already imported")),
            Some((_, r)) => {
                text.replace_range(r, new_text);
                actions.push(format!("replaced {title}"));
            }
            None => {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(new_text);
                text.push('\n');
                actions.push(format!("defined {title}"));
            }
        }
    }
    Edit { text, actions, params }
}

/// Adds the items of `input` at the end of `text`, as [`add_items`] adds items whose keys
/// `text` does not have (the caller knows it has none of them).
pub(crate) fn append_items(text: &mut String, input: &str) -> Edit {
    let mut actions = Vec::new();
    let mut params = Vec::new();
    for (item, range) in items_with_ranges(input) {
        if let ItemKind::Param(p) = &item.kind {
            params.push(p.name.name.clone());
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&input[range]);
        text.push('\n');
        actions.push(format!("defined {}", item_title(&item, input)));
    }
    Edit {
        text: String::new(),
        actions,
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completeness() {
        assert!(is_complete(":run"));
        assert!(is_complete(":set routing = zipf(s: 1.2"));
        assert!(is_complete("param x = 3;"));
        assert!(is_complete("param x = 3")); // an error, not a continuation
        assert!(!is_complete("op f<T>(x: T[M]) -> T[M] on aiv {"));
        assert!(!is_complete("taskflow t(x: bf16[4, 4]"));
        assert!(!is_complete("/* a comment"));
        assert!(is_complete("op f<T>(x: T[M]) -> T[M] on aiv {\n    out[m] = x[m];\n}"));
        assert!(is_complete("// only a comment"));
        assert!(!is_complete("/// GeGLU"));
        assert!(!is_complete("/// GeGLU\n/// more"));
        assert_eq!(with_final_semicolon("param x = 3").as_deref(), Some("param x = 3;"));
        assert_eq!(with_final_semicolon("param = 3"), None);
    }

    /// What the lexer's tokens say of a whole input: a bracket, a block comment or (inside a
    /// bracket) a string still open, or a doc comment last; a wrong closing bracket ends it.
    fn complete_by_tokens(text: &str) -> bool {
        let t = text.trim_start();
        if t.is_empty() || t.starts_with(':') {
            return true;
        }
        let (toks, diags, _) = tokenize(text, FileId(0));
        let comment_open = diags.iter().any(|d| d.message == "unterminated block comment");
        let mut stack = Vec::new();
        for tok in &toks {
            match &tok.kind {
                TokenKind::Open(d) => stack.push(*d),
                TokenKind::Close(d) if stack.pop() != Some(*d) => return true,
                _ => {}
            }
        }
        let doc_last = toks
            .iter()
            .rev()
            .find(|t| t.kind != TokenKind::Eof)
            .is_some_and(|t| matches!(t.kind, TokenKind::Doc(_)));
        !(comment_open || !stack.is_empty() || doc_last)
    }

    /// The scan, line by line, says what the lexer's tokens of the whole input say, on lines
    /// of random tokens (brackets, comments, strings over lines, escapes, doc comments, item
    /// keywords, deep nesting).
    #[test]
    fn open_scan_follows_the_lexer() {
        const PIECES: &[&str] = &[
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            "param",
            "op",
            "taskflow",
            "a",
            "=",
            "1",
            ";",
            ",",
            ":",
            "/*",
            "*/",
            "// c ( [",
            "/// d",
            "////",
            "//!",
            "\"s ( \\\" ]\"",
            "\"",
            "\\",
            "'",
            "*",
            "/",
            "/*/",
            "x[m, n]",
            "->",
            "\u{a0}",
            "é",
            "\x0c",
        ];
        let mut state = 12345u64;
        let mut next = |n: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % n as u64) as usize
        };
        let (mut open, mut complete) = (0, 0);
        for _ in 0..20_000 {
            let mut text = String::new();
            let mut scan = OpenScan::default();
            for _ in 0..1 + next(6) {
                let mut line = String::new();
                for _ in 0..next(8) {
                    line.push_str(PIECES[next(PIECES.len())]);
                    if next(4) != 0 {
                        line.push(' ');
                    }
                }
                if next(50) == 0 {
                    line.push_str(&"(".repeat(300));
                }
                line.push('\n');
                text.push_str(&line);
                scan.line(&line);
                let c = scan.is_complete(&text);
                assert_eq!(c, complete_by_tokens(&text), "{text:?}");
                assert_eq!(c, is_complete(&text), "{text:?}");
                if c {
                    complete += 1;
                } else {
                    open += 1;
                }
            }
        }
        assert!(open > 10_000 && complete > 10_000, "{open} {complete}");
    }

    /// A wrong closing bracket, a string going on over lines inside a bracket, a doc comment
    /// last, and item keywords inside braces (the parser reports an unclosed `{` there, but
    /// every bracket is closed).
    #[test]
    fn completeness_by_tokens() {
        assert!(is_complete("param a = ((]\nxxx\n"));
        assert!(is_complete(")(\n"));
        assert!(!is_complete("param a = (\"abc\nxx\n"));
        assert!(is_complete("param a = (\"abc\nxx\");\n"));
        assert!(is_complete("param a = \"abc\n"));
        assert!(!is_complete("param a = (\"a\\\n\n"));
        assert!(!is_complete("/// a\n/* b */\n"));
        assert!(is_complete("//// a\n"));
        assert!(is_complete("//! a\n"));
        assert!(is_complete(
            "taskflow f(x: f32[4]) -> f32[4] { param a = 1; return x; }\n"
        ));
    }

    #[test]
    fn add_and_replace() {
        let buf = "param a = 1;\n/// doc\nparam b = 2;\n";
        let e = add_items(buf, "/// new doc\nparam b = 3;");
        assert_eq!(e.text, "param a = 1;\n/// new doc\nparam b = 3;\n");
        assert_eq!(e.actions, vec!["replaced param b"]);
        let e = add_items(&e.text, "param c = 4; schedule = interleaved;");
        assert!(e.text.ends_with("param c = 4;\nschedule = interleaved;\n"));
        assert_eq!(e.actions, vec!["defined param c", "defined schedule"]);
        let e = add_items("import std::moe::*;\n", "import std::moe::*;");
        assert_eq!(e.text, "import std::moe::*;\n");
    }
}
