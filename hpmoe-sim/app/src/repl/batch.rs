//! Consecutive definitions of a script, checked together.
//!
//! Each definition is checked with the whole session text, so a script of N definitions run
//! one by one costs N checks of a growing text: quadratic. A run of definitions that a
//! script gives one after the other is instead added together and checked once, when that is
//! sure to print and leave what adding them one by one would:
//!
//! - the session's text checks with no error before the run (warnings are allowed), and
//!   that check is cached (its output was already printed);
//! - each definition parses, and each of its items is a `param`, `op`/`comm`, `route` or
//!   `taskflow` with a name that is new: not an item of the session, not an identifier
//!   anywhere in the session's text (so no name the text uses, an import or a builtin,
//!   changes meaning), not a name of the standard library, not defined twice in the run, and
//!   not an identifier of an earlier definition of the run (a forward reference);
//! - the text with the whole run checks with no error, and each of its warnings is one of the
//!   session's (the same code, message and place) or lies inside one definition of the run;
//!   or, when the session had more warnings than a check keeps, it keeps the session's.
//!
//! An input of comments only, or with a syntax error, may sit in a run: it prints the same
//! whatever the session holds (its echo, or its error), and changes nothing.
//!
//! Then every intermediate text (the session plus the first k definitions) checks with no
//! error too, and with the session's warnings and those inside its definitions: an item only
//! adds what it defines, and no earlier item can name it, so what an earlier text says about
//! its items the whole text says as well. Each definition then prints what it prints alone:
//! the warnings inside it that no earlier text had, shown against the text it ends, its
//! actions and its `stages: check` line (with its share of the time). When the run's check
//! finds anything else, the run is halved and tried again, down to one definition, which runs
//! as it always does; after a success the next run may be twice as long.

use super::input::{self, ItemKey};
use super::session::{diag_key, DiagKey};
use super::session::{prepared_definition, Session};
use hpmoe_dsl::diag::{Diagnostic, Dropped};
use hpmoe_dsl::syntax::ast::ItemKind;
use hpmoe_dsl::syntax::lexer::tokenize;
use hpmoe_dsl::syntax::token::{FileId, TokenKind};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::Instant;

/// The names of the session's text: its items' keys and every identifier in it.
#[derive(Debug, Default)]
struct Known {
    keys: HashSet<String>,
    idents: HashSet<String>,
}

impl Known {
    fn of(text: &str) -> Known {
        let mut k = Known::default();
        for (item, _) in input::items_with_ranges(text) {
            if let ItemKey::Named(n) = input::item_key(&item, text) {
                k.keys.insert(n);
            }
        }
        k.idents = identifiers(text);
        k
    }
}

fn identifiers(text: &str) -> HashSet<String> {
    let (toks, _, _) = tokenize(text, FileId(0));
    toks.into_iter()
        .filter_map(|t| match t.kind {
            TokenKind::Ident(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// Every identifier of the standard library's modules.
fn stdlib_names() -> &'static HashSet<String> {
    static NAMES: OnceLock<HashSet<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut all = HashSet::default();
        for (_, text) in hpmoe_dsl::stdlib::MODULES {
            all.extend(identifiers(text));
        }
        all
    })
}

/// A definition of a run: its text as added, the names it defines and the identifiers it
/// uses.
#[derive(Debug)]
struct Candidate {
    text: String,
    names: Vec<String>,
    idents: HashSet<String>,
}

/// An input of a run.
#[derive(Debug)]
enum Entry {
    Def(Candidate),
    /// No item (only comments): it prints nothing but its echo.
    Empty,
    /// A syntax error: what it prints (the error, of the input alone) does not depend on the
    /// session, which it leaves as it is.
    Unparsed,
}

/// What an input is in a run, or `None` when it must run alone.
fn entry(raw: &str, known: &Known) -> Option<Entry> {
    let text = prepared_definition(raw).into_owned();
    let (_, diags, _) = hpmoe_dsl::syntax::parse_text(&text, FileId(0));
    if !diags.is_empty() {
        return Some(Entry::Unparsed);
    }
    let items = input::items_with_ranges(&text);
    if items.is_empty() {
        return Some(Entry::Empty);
    }
    let mut names = Vec::new();
    for (item, _) in &items {
        if !matches!(
            item.kind,
            ItemKind::Param(_) | ItemKind::Op(_) | ItemKind::Route(_) | ItemKind::Taskflow(_)
        ) {
            return None;
        }
        let ItemKey::Named(n) = input::item_key(item, &text) else {
            return None;
        };
        if n.is_empty()
            || names.contains(&n)
            || known.keys.contains(&n)
            || known.idents.contains(&n)
            || stdlib_names().contains(&n)
        {
            return None;
        }
        names.push(n);
    }
    let idents = identifiers(&text);
    Some(Entry::Def(Candidate { text, names, idents }))
}

/// The warnings a definition of a run prints, and the text they are shown against: file
/// `file` (the session's) up to `end`, where the definition ends.
#[derive(Clone)]
struct Shown {
    diags: Vec<Diagnostic>,
    file: FileId,
    end: usize,
}

impl Session {
    /// Runs consecutive definitions of a script (none a `:command`): the same output, session
    /// and exit code as `execute` on each in turn (see the module doc). Returns false when the
    /// output is gone.
    pub(crate) fn execute_definitions(&mut self, inputs: &[String]) -> bool {
        let mut pos = 0;
        let mut run = inputs.len();
        let mut known: Option<Known> = None;
        while pos < inputs.len() {
            if crate::out::stdout_failed() {
                return false;
            }
            let clean = !self.buffer.trim().is_empty()
                && self.cached_check().is_some_and(|c| {
                    c.program.is_some() && c.diags.iter().all(|d| !d.is_error()) && c.dropped.errors == 0
                });
            let mut taken = Vec::new();
            let mut defs = 0;
            if clean && run >= 2 {
                let known = known.get_or_insert_with(|| Known::of(&self.buffer));
                let mut defined: HashSet<String> = HashSet::default();
                let mut used: HashSet<String> = HashSet::default();
                for raw in &inputs[pos..] {
                    if defs == run {
                        break;
                    }
                    let Some(e) = entry(raw, known) else { break };
                    if let Entry::Def(c) = &e {
                        if c.names.iter().any(|n| defined.contains(n) || used.contains(n)) {
                            break;
                        }
                        used.extend(c.idents.iter().cloned());
                        defined.extend(c.names.iter().cloned());
                        defs += 1;
                    }
                    taken.push(e);
                }
                while matches!(taken.last(), Some(Entry::Empty | Entry::Unparsed)) {
                    taken.pop();
                }
            }
            if defs < 2 {
                let before = Rc::clone(&self.buffer);
                self.execute(&inputs[pos]);
                pos += 1;
                // A comment, or a definition refused, leaves the text (and its names) as it was.
                if !Rc::ptr_eq(&before, &self.buffer) {
                    known = None;
                }
                run = run.saturating_mul(2).max(2);
                continue;
            }
            let n = taken.len();
            if self.add_together(&inputs[pos..pos + n], &taken) {
                if let Some(k) = known.as_mut() {
                    for e in taken {
                        if let Entry::Def(c) = e {
                            k.keys.extend(c.names);
                            k.idents.extend(c.idents);
                        }
                    }
                }
                pos += n;
                run = run.saturating_mul(2);
            } else {
                run = defs / 2;
            }
        }
        true
    }

    /// Adds the definitions of a run and checks the text once; keeps them, printing what each
    /// input prints alone, when the text checks with no error and its warnings are the
    /// session's own and each definition's own ([`Self::warnings_by_definition`]), else leaves
    /// the session as it was.
    fn add_together(&mut self, raws: &[String], run: &[Entry]) -> bool {
        let old = Rc::clone(&self.buffer);
        let Some(before) = self.cached_check() else {
            return false;
        };
        let defs: Vec<&Candidate> = run
            .iter()
            .filter_map(|e| match e {
                Entry::Def(c) => Some(c),
                _ => None,
            })
            .collect();
        let mut text = String::with_capacity(old.len() + defs.iter().map(|c| c.text.len() + 2).sum::<usize>());
        text.push_str(&old);
        let mut edits = Vec::with_capacity(defs.len());
        let mut ends = Vec::with_capacity(defs.len());
        for c in &defs {
            edits.push(input::append_items(&mut text, &c.text));
            ends.push(text.len());
        }
        self.buffer = Rc::from(text.as_str());
        let t0 = Instant::now();
        let checked = self.check_uncached();
        let took = t0.elapsed() / defs.len().max(1) as u32;
        let shown = match (&checked.program, checked.dropped == Dropped::NONE) {
            (Some(_), true) => self.warnings_by_definition(&before, &checked, old.len(), &ends),
            // The session already had more warnings than a check keeps, and the kept ones
            // are still the session's: each text on the way keeps them too, so a definition
            // added alone shows none of its own.
            (Some(_), false)
                if before.dropped.warnings > 0
                    && checked.dropped.errors == 0
                    && checked.diags.iter().map(diag_key).eq(before.diags.iter().map(diag_key)) =>
            {
                Some(vec![None; ends.len()])
            }
            _ => None,
        };
        let Some(shown) = shown else {
            self.buffer = old;
            return false;
        };
        self.keep_check(&checked);
        self.update_names(&checked);
        let mut edits = edits.into_iter();
        let mut shown = shown.into_iter();
        for (raw, e) in raws.iter().zip(run) {
            match e {
                Entry::Def(_) => {
                    let Some(edit) = edits.next() else { break };
                    self.echo(raw);
                    self.failed_now = false;
                    self.stages.clear();
                    if let Some(w) = shown.next().flatten() {
                        // (Each text on the way is made only to be shown, then dropped.)
                        let sources = checked.sources.with_text(w.file, &text[..w.end]);
                        self.diagnostics(&w.diags, Dropped::NONE, &sources);
                    }
                    self.defined(&edit.actions, &edit.params);
                    self.stage("check", Some(took));
                    self.print_stages();
                }
                Entry::Empty => self.echo(raw),
                Entry::Unparsed => {
                    self.execute(raw);
                }
            }
        }
        self.stages.clear();
        true
    }

    /// What each definition of a run would print alone, from the check of the text with all
    /// of them (`after`; `before` is the session's): per definition, the warnings whose
    /// keys no earlier text had ([`diag_key`], as a definition added alone shows them),
    /// shown against the text it ends (so an excerpt has no later line). `None` unless every
    /// diagnostic is a warning whose primary label lies in the session's text, as one of the
    /// session's own, or in one definition's (the text `start..` `ends[k]`): a run's item is
    /// named by no other item and changes the meaning of no name, so the warnings of each
    /// text on the way are then exactly the session's and those of its definitions.
    fn warnings_by_definition(
        &self,
        before: &super::cache::Checked,
        after: &super::cache::Checked,
        start: usize,
        ends: &[usize],
    ) -> Option<Vec<Option<Shown>>> {
        if after.diags.is_empty() {
            return Some(vec![None; ends.len()]);
        }
        let (file, _) = after.sources.files().find(|(_, f)| f.text.as_str() == &*self.buffer)?;
        let mut own: Vec<DiagKey> = Vec::new();
        let mut per: Vec<Vec<&Diagnostic>> = vec![Vec::new(); ends.len()];
        for d in &after.diags {
            if d.is_error() {
                return None;
            }
            let at = d.labels.iter().find(|l| l.primary)?.span;
            if at.file != file {
                return None;
            }
            let lo = at.lo as usize;
            if lo < start {
                own.push(diag_key(d));
            } else {
                per[ends.partition_point(|&e| e <= lo).min(ends.len() - 1)].push(d);
            }
        }
        let mut had: Vec<DiagKey> = before.diags.iter().map(diag_key).collect();
        own.sort();
        had.sort();
        if own != had {
            return None;
        }
        let mut seen: HashSet<DiagKey> = had.into_iter().collect();
        let mut out = Vec::with_capacity(ends.len());
        for (k, ds) in per.into_iter().enumerate() {
            let keys: Vec<DiagKey> = ds.iter().map(|d| diag_key(d)).collect();
            let new: Vec<Diagnostic> = ds
                .iter()
                .zip(&keys)
                .filter(|(_, key)| !seen.contains(*key))
                .map(|(d, _)| (*d).clone())
                .collect();
            seen.extend(keys);
            out.push((!new.is_empty()).then(|| Shown {
                diags: new,
                file,
                end: ends[k],
            }));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::session::{Config, Session};
    use super::super::{input, Names};
    use hpmoe_dsl::diag::RenderStyle;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Output shared by a session's two streams, in the order written.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn session(echo: bool) -> (Session, Shared) {
        let out = Shared::default();
        let cfg = Config {
            timings: false,
            echo,
            style: RenderStyle::Plain,
        };
        let names = Arc::new(Mutex::new(Names::initial()));
        (
            Session::new(cfg, Box::new(out.clone()), Box::new(out.clone()), names),
            out,
        )
    }

    /// The inputs of a script, split as the reader splits them.
    fn inputs(script: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut pending = String::new();
        for line in script.split_inclusive('\n') {
            pending.push_str(line);
            if pending.trim().is_empty() {
                pending.clear();
            } else if input::is_complete(&pending) {
                out.push(std::mem::take(&mut pending));
            }
        }
        out
    }

    /// Runs the inputs one by one, and consecutive definitions together; returns both
    /// transcripts, the sessions' texts and whether each failed.
    fn both(script: &str, echo: bool) -> [(String, String, bool); 2] {
        let ins = inputs(script);
        let (mut one, o1) = session(echo);
        for i in &ins {
            one.execute(i);
        }
        let (mut together, o2) = session(echo);
        let mut i = 0;
        while i < ins.len() {
            let defs = ins[i..].iter().take_while(|t| !t.trim_start().starts_with(':')).count();
            if defs >= 2 {
                assert!(together.execute_definitions(&ins[i..i + defs]));
                i += defs;
            } else {
                together.execute(&ins[i]);
                i += 1;
            }
        }
        let text = |o: &Shared| String::from_utf8(o.0.lock().unwrap().clone()).unwrap();
        [
            (text(&o1), one.buffer.to_string(), one.failed),
            (text(&o2), together.buffer.to_string(), together.failed),
        ]
    }

    /// A small deterministic generator.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) % n as u64) as usize
        }
    }

    /// Scripts of definitions, mostly valid, with the cases that must not be checked
    /// together: forward references, names the session uses (a builtin, an import),
    /// redefinitions, errors, warnings, definitions of several items, commands between.
    fn script(rng: &mut Rng, n: usize) -> String {
        let mut s = String::from("import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n");
        let mut ops = vec![];
        for i in 0..n {
            let line = match rng.below(21) {
                0..=7 => format!("param p{i} = {};", 1 + rng.below(9)),
                8 => format!("param q{i} = p{} + 1;", rng.below(i + 1)),
                9 => {
                    ops.push(i);
                    format!("op e{i}<T>(x: T[M, N]) -> T[M, N] on aiv {{ out[m, n] = x[m, n] * 2.0; }}")
                }
                10 if !ops.is_empty() => format!(
                    "taskflow t{i}(x: f32[64, 64]) -> f32[64, 64] {{ return e{}(x) tile(m: 16); }}",
                    ops[rng.below(ops.len())]
                ),
                11 => format!("param f{i} = p{};", i + 1 + rng.below(3)),
                12 => "op gelu<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }".to_string(),
                13 => format!("param p{} = 5;", rng.below(i + 1)),
                14 => [":show params", ":set p0 = 7", ":unset p0"][rng.below(3)].to_string(),
                15 if !ops.is_empty() => format!(
                    "taskflow u{i}(x: f32[64, 64]) -> f32[64, 64] {{ let a = e{}(x); {}return x; }}",
                    ops[rng.below(ops.len())],
                    ["", "let b = x; ", "let c = e0(x); "][rng.below(3)]
                ),
                16 => format!("param big{i} = 9223372036854775807 + {};", rng.below(2)),
                17 => format!("param m{i} = 1; param n{i} = m{i} * 2;"),
                18 => format!("param z{i} = (\n  {i} +\n  1)"),
                19 if rng.below(2) == 0 => format!("// a comment {i}"),
                19 => format!("param bad{i} = ;"),
                _ => format!("/// doc\nparam d{i} = {i};"),
            };
            s.push_str(&line);
            s.push('\n');
        }
        s
    }

    #[test]
    fn definitions_checked_together_print_and_leave_what_one_by_one_does() {
        let mut rng = Rng(7);
        for k in 0..40 {
            let n = 5 + rng.below(60);
            let s = script(&mut rng, n);
            let [one, together] = both(&s, k % 2 == 0);
            assert_eq!(one, together, "script {k}:\n{s}");
        }
    }

    #[test]
    fn definitions_with_warnings_are_checked_together_too() {
        // Each taskflow leaves a value unused (one warning each, some with the same message
        // as an earlier one): added in a few checks, each warning printed once, with its
        // definition, against the text that definition ends, as one by one.
        let mut s = String::from(
            "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\nop e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }\n",
        );
        // Past the 200 diagnostics a check keeps, a definition shows none of its own, one by
        // one or together.
        for i in 0..260 {
            let name = if i % 2 == 0 { format!("b{i}") } else { "a".to_string() };
            s.push_str(&format!(
                "taskflow f{i}(x: f32[4, 4]) -> f32[4, 4] {{ let y = e(x); let {name} = e(x); return y; }}\n"
            ));
        }
        let ins = inputs(&s);
        let (mut one, one_out) = session(true);
        for i in &ins {
            one.execute(i);
        }
        let (mut together, out) = session(true);
        for i in &ins[..4] {
            together.execute(i);
        }
        assert!(together.execute_definitions(&ins[4..]));
        assert!(together.cache.checks() < 40, "{} checks", together.cache.checks());
        assert_eq!(one.buffer, together.buffer);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("is computed but never used").count(), 200, "{text}");
        assert_eq!(text, String::from_utf8(one_out.0.lock().unwrap().clone()).unwrap());
    }

    #[test]
    fn many_new_params_are_checked_in_a_few_checks() {
        // Comments and syntax errors between them do not split the run.
        let s: String = (0..2000)
            .map(|i| match i % 3 {
                1 => format!("param p{i} = {i};\n// note\n"),
                2 => format!("param p{i} = {i};\nparam bad = ;\n"),
                _ => format!("param p{i} = {i};\n"),
            })
            .collect();
        let ins = inputs(&s);
        let (mut one, one_out) = session(false);
        one.execute(&ins[0]);
        let (mut together, out) = session(false);
        together.execute(&ins[0]);
        assert!(together.execute_definitions(&ins[1..]));
        // All but the first were added with one check: the cache holds two texts.
        assert_eq!(together.cache.checks(), 2);
        for i in &ins[1..] {
            one.execute(i);
        }
        assert_eq!(one.buffer, together.buffer);
        assert!(one.failed && together.failed);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("stages: check\n").count(), 2000, "{text}");
        assert_eq!(text, String::from_utf8(one_out.0.lock().unwrap().clone()).unwrap());
    }
}
