//! Completion and highlighting, as pure functions of the input (the line editor wraps them).
//!
//! Completion knows the commands, the `:set` targets (params, `device.FIELD`, `device`,
//! `routing`, `policy`, `taskflow`) and their values (policies, routing kinds, profiles,
//! taskflows), the `:show` views and filters, op call names, file paths (`:load`, `:trace`,
//! `:gantt`, `:dump`), and in definitions the keywords and the names of the program.
//! Highlighting classifies the tokens of the logos lexer.

use super::commands::{self, COMMANDS};
use super::Names;
use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::parser::ITEM_KEYWORDS;
use hpmoe_dsl::syntax::token::{FileId, TokenKind};
use std::ops::Range;

const POLICIES: &[&str] = &["kernel_by_kernel", "expert_level", "interleaved"];
const ROUTINGS: &[&str] = &["balanced(", "uniform(", "zipf(", "hotspot(", "file("];
/// Words with a meaning inside items (besides the item keywords).
const KEYWORDS: &[&str] = &[
    "let",
    "return",
    "on",
    "tile",
    "order",
    "priority",
    "sum",
    "put",
    "out",
    "group",
    "in",
    "ratr",
    "grad",
    "wrt",
    "save",
    "straight_through",
    "detach",
];
const TYPES: &[&str] = &[
    "bf16", "f16", "f32", "i32", "aic", "aiv", "route", "int", "float", "bool", "str",
];
const SHOW: &[&str] = &[
    "params", "ops", "routing", "device", "tasks", "queue", "config", "source",
];
const MAX_PATHS: usize = 200;

/// A completion: the text replacing `start..pos` of the line, and whether a space follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub value: String,
    pub start: usize,
    pub space: bool,
}

fn matching(cands: impl IntoIterator<Item = String>, prefix: &str, start: usize) -> Vec<Completion> {
    let mut v: Vec<String> = cands
        .into_iter()
        .filter(|c| c.starts_with(prefix) && c != prefix)
        .collect();
    v.sort();
    v.dedup();
    v.into_iter()
        .map(|value| {
            let space = !(value.ends_with('=') || value.ends_with('(') || value.ends_with('/') || value.ends_with('.'));
            Completion { value, start, space }
        })
        .collect()
}

fn owned(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PathKind {
    Any,
    Hpm,
    Dir,
}

fn paths(cur: &str, start: usize, kind: PathKind) -> Vec<Completion> {
    let (dir, prefix) = match cur.rfind('/') {
        Some(i) => (&cur[..=i], &cur[i + 1..]),
        None => ("", cur),
    };
    let read = if dir.is_empty() {
        std::path::PathBuf::from(".")
    } else if let Some(rest) = dir.strip_prefix("~/") {
        match std::env::var_os("HOME") {
            Some(h) => std::path::PathBuf::from(h).join(rest),
            None => std::path::PathBuf::from(dir),
        }
    } else {
        std::path::PathBuf::from(dir)
    };
    let Ok(rd) = std::fs::read_dir(&read) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten().take(10_000) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) || (name.starts_with('.') && !prefix.starts_with('.')) {
            continue;
        }
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir()) || e.path().is_dir();
        if is_dir {
            out.push(format!("{dir}{name}/"));
        } else if kind == PathKind::Any || (kind == PathKind::Hpm && name.ends_with(".hpm")) {
            out.push(format!("{dir}{name}"));
        }
    }
    out.sort();
    out.truncate(MAX_PATHS);
    matching(out, cur, start)
}

/// Completions at byte `pos` of `line`.
pub fn complete(names: &Names, line: &str, pos: usize) -> Vec<Completion> {
    let pos = pos.min(line.len());
    if !line.is_char_boundary(pos) {
        return Vec::new();
    }
    let before = &line[..pos];
    let trimmed = before.trim_start();
    if trimmed.starts_with(':') {
        return complete_command(names, trimmed, pos);
    }
    // A definition: the identifier under the cursor.
    let start = before
        .char_indices()
        .rev()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let cur = &before[start..];
    if cur.is_empty() {
        return Vec::new();
    }
    let mut cands = owned(ITEM_KEYWORDS);
    cands.extend(owned(KEYWORDS));
    cands.extend(owned(TYPES));
    cands.extend(owned(POLICIES));
    cands.extend(ROUTINGS.iter().map(|r| r.trim_end_matches('(').to_string()));
    cands.extend(names.params.iter().cloned());
    cands.extend(names.ops.iter().cloned());
    cands.extend(names.taskflows.iter().cloned());
    cands.extend(names.routes.iter().cloned());
    cands.extend(names.profiles.iter().cloned());
    matching(cands, cur, start)
}

fn complete_command(names: &Names, t: &str, pos: usize) -> Vec<Completion> {
    let ends_ws = t.ends_with(char::is_whitespace);
    let words: Vec<&str> = t.split_whitespace().collect();
    let (done, cur): (&[&str], &str) = if ends_ws || words.is_empty() {
        (&words[..], "")
    } else {
        (&words[..words.len() - 1], words[words.len() - 1])
    };
    let start = pos - cur.len();
    let Some(first) = done.first() else {
        return matching(COMMANDS.iter().map(|c| format!(":{}", c.name)), cur, start);
    };
    let Ok(cmd) = commands::lookup(first.trim_start_matches(':')) else {
        return Vec::new();
    };
    let args = &done[1..];
    match cmd.name {
        "load" if args.is_empty() => paths(cur, start, PathKind::Hpm),
        "dump" if args.is_empty() => paths(cur, start, PathKind::Dir),
        "dump" => matching(owned(&["seed=", "bf16"]), cur, start),
        "trace" | "gantt" if args.is_empty() => paths(cur, start, PathKind::Any),
        "trace" | "gantt" => matching(owned(&["ranks=", "window="]), cur, start),
        "run" if args.is_empty() => matching(owned(POLICIES), cur, start),
        "compare" if args.len() < 2 => matching(owned(POLICIES), cur, start),
        "help" if args.is_empty() => matching(COMMANDS.iter().map(|c| c.name.to_string()), cur, start),
        "explain" => matching(owned(&["last", "all"]), cur, start),
        "unset" if args.is_empty() => matching(names.settings.iter().cloned(), cur, start),
        "show" => match args {
            [] => matching(owned(SHOW), cur, start),
            ["tasks", ..] => match cur.split_once('=') {
                Some(("call", v)) => matching(names.calls.iter().cloned(), v, pos - v.len()),
                Some(("engine", v)) => matching(owned(&["aic", "aiv"]), v, pos - v.len()),
                Some(_) => Vec::new(),
                None => matching(owned(&["call=", "rank=", "engine=", "limit="]), cur, start),
            },
            ["ops"] => matching(names.ops.iter().cloned(), cur, start),
            _ => Vec::new(),
        },
        "set" => {
            // `:set NAME = VALUE`, `:set NAME=VALUE`, `:set NAME =VALUE`.
            let mut text = args.join(" ");
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(cur);
            match text.split_once('=') {
                None if args.is_empty() => {
                    let mut c: Vec<String> = names.params.clone();
                    c.extend(owned(&["device", "routing", "policy", "taskflow", "device."]));
                    if cur.starts_with("device.") {
                        c.extend(names.device_fields.iter().map(|f| format!("device.{f}")));
                    }
                    matching(c, cur, start)
                }
                None => matching(owned(&["="]), cur, start),
                Some((name, value)) => {
                    let value = value.trim_start();
                    let vstart = pos - value.len();
                    let cands = match name.trim() {
                        "policy" => {
                            let mut c = owned(POLICIES);
                            c.push("default".into());
                            c
                        }
                        "routing" => owned(ROUTINGS),
                        "device" => names.profiles.clone(),
                        "taskflow" => names.taskflows.clone(),
                        _ => Vec::new(),
                    };
                    matching(cands, value, vstart)
                }
            }
        }
        _ => Vec::new(),
    }
}

/// What a piece of the input is, for highlighting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Plain,
    Command,
    UnknownCommand,
    ItemKeyword,
    Keyword,
    Type,
    Number,
    Str,
    Comment,
    /// An op, taskflow or routing name.
    Name,
    Param,
    Error,
}

/// Classifies every byte of `line`: consecutive ranges covering it from 0 to its end.
pub fn highlight_spans(names: &Names, line: &str) -> Vec<(Range<usize>, Class)> {
    let mut out: Vec<(Range<usize>, Class)> = Vec::new();
    let mut offset = 0;
    let lead = line.len() - line.trim_start().len();
    if line[lead..].starts_with(':') {
        let end = line[lead..].find(char::is_whitespace).map_or(line.len(), |i| lead + i);
        let cls = if commands::lookup(&line[lead + 1..end]).is_ok() {
            Class::Command
        } else {
            Class::UnknownCommand
        };
        out.push((lead..end, cls));
        offset = end;
    }
    let rest = &line[offset..];
    let (toks, _, comments) = tokenize(rest, FileId(0));
    let mut spans: Vec<(Range<usize>, Class)> = Vec::new();
    for t in &toks {
        let r = offset + t.span.lo as usize..offset + t.span.hi as usize;
        let cls = match &t.kind {
            TokenKind::Eof => continue,
            TokenKind::Ident(s) if ITEM_KEYWORDS.contains(&s.as_str()) => Class::ItemKeyword,
            TokenKind::Ident(s) if KEYWORDS.contains(&s.as_str()) => Class::Keyword,
            TokenKind::Ident(s) if TYPES.contains(&s.as_str()) => Class::Type,
            TokenKind::Ident(s) if names.params.contains(s) => Class::Param,
            TokenKind::Ident(s) if names.ops.contains(s) || names.taskflows.contains(s) || names.routes.contains(s) => {
                Class::Name
            }
            TokenKind::Ident(_) | TokenKind::Punct(_) | TokenKind::Open(_) | TokenKind::Close(_) => Class::Plain,
            TokenKind::Int(_) | TokenKind::Float(_) => Class::Number,
            TokenKind::Str(_) => Class::Str,
            TokenKind::Doc(_) | TokenKind::InnerDoc(_) => Class::Comment,
            TokenKind::Error => Class::Error,
        };
        spans.push((r, cls));
    }
    for c in &comments {
        spans.push((offset + c.span.lo as usize..offset + c.span.hi as usize, Class::Comment));
    }
    spans.sort_by_key(|(r, _)| r.start);
    let mut at = out.last().map_or(0, |(r, _)| r.end);
    for (r, cls) in spans {
        if r.start < at || r.end > line.len() || !line.is_char_boundary(r.start) || !line.is_char_boundary(r.end) {
            continue;
        }
        if r.start > at {
            out.push((at..r.start, Class::Plain));
        }
        at = r.end;
        out.push((r, cls));
    }
    if at < line.len() {
        out.push((at..line.len(), Class::Plain));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            params: vec!["tokens".into(), "topk".into()],
            ops: vec!["gmm".into(), "geglu".into()],
            calls: vec!["h".into(), "xd".into()],
            device_fields: vec!["link_latency".into()],
            taskflows: vec!["moe_ffn".into()],
            ..Names::initial()
        }
    }

    fn values(v: Vec<Completion>) -> Vec<String> {
        v.into_iter().map(|c| c.value).collect()
    }

    #[test]
    fn commands_and_args() {
        let n = names();
        assert_eq!(values(complete(&n, ":lo", 3)), vec![":load"]);
        assert_eq!(values(complete(&n, ":s", 2)), vec![":set", ":show"]);
        assert_eq!(values(complete(&n, ":set to", 7)), vec!["tokens", "topk"]);
        assert_eq!(values(complete(&n, ":set device.li", 14)), vec!["device.link_latency"]);
        assert_eq!(values(complete(&n, ":set policy = ex", 16)), vec!["expert_level"]);
        assert_eq!(values(complete(&n, ":set policy=in", 14)), vec!["interleaved"]);
        assert_eq!(values(complete(&n, ":set routing = z", 16)), vec!["zipf("]);
        assert_eq!(values(complete(&n, ":run k", 6)), vec!["kernel_by_kernel"]);
        assert_eq!(values(complete(&n, ":show tasks call=x", 18)), vec!["xd"]);
        assert_eq!(values(complete(&n, ":show t", 7)), vec!["tasks"]);
        let c = complete(&n, ":show tasks call=x", 18);
        assert_eq!(c[0].start, 17);
    }

    #[test]
    fn definitions() {
        let n = names();
        assert_eq!(values(complete(&n, "let y = ge", 10)), vec!["geglu"]);
        assert_eq!(values(complete(&n, "task", 4)), vec!["taskflow"]);
        assert_eq!(values(complete(&n, "taskflow b = gra", 16)), vec!["grad"]);
        assert!(complete(&n, "let y = ", 8).is_empty());
    }

    #[test]
    fn highlighting_covers_the_line() {
        let n = names();
        for line in [
            ":set tokens = 64",
            "op geglu<T>(h: T[M]) -> T[M] on aiv { // c\n out[m] = h[m]; }",
            "param x = \"unterminated",
            ":nope x",
            "  \u{e9}\u{e9} 3",
        ] {
            let spans = highlight_spans(&n, line);
            let mut at = 0;
            for (r, _) in &spans {
                assert_eq!(r.start, at, "{line:?}: {spans:?}");
                at = r.end;
            }
            assert_eq!(at, line.len());
        }
        let spans = highlight_spans(&n, ":set tokens = 64");
        assert_eq!(spans[0].1, Class::Command);
        assert!(spans.iter().any(|(_, c)| *c == Class::Param));
        assert!(spans.iter().any(|(_, c)| *c == Class::Number));
    }
}
