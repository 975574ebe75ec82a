//! "Did you mean ...?" suggestions.
//!
//! A suggestion compares a name with every candidate in scope, so a program with many unknown
//! names and many candidates would make the checker quadratic. Each thread therefore has a
//! budget of comparison work (about the product of the two names' lengths per comparison),
//! renewed by [`reset_budget`] at the start of every check; once spent, further unknown names
//! get their diagnostic without a suggestion. The budget is counted in work, not time, so the
//! same input always gets the same suggestions.

use std::cell::Cell;

/// Comparison work one check may spend on suggestions: a few hundred thousand comparisons of
/// ordinary identifiers, well under a second.
pub const BUDGET: u64 = 40_000_000;

thread_local! {
    static LEFT: Cell<u64> = const { Cell::new(BUDGET) };
}

/// Renews this thread's suggestion budget (called when a check starts).
pub fn reset_budget() {
    LEFT.with(|l| l.set(BUDGET));
}

/// Whether this thread may still compute suggestions: a caller that must first gather a long
/// candidate list asks before gathering it.
pub fn has_budget() -> bool {
    LEFT.with(Cell::get) > 0
}

/// How many names a list in a help message shows.
pub const LISTED: usize = 12;

/// Names for a help message ("the params are: ..."): all of them, or past [`LISTED`] the
/// first ones and how many there are, so that a program with thousands of names and as many
/// errors does not print every name once per error.
pub fn listing<S: AsRef<str>>(names: &[S]) -> String {
    listing_of(names, names.len())
}

/// [`listing`] of the first of `total` names (at least [`LISTED`] of them, when there are
/// more), for a caller that writes out only the names listed.
pub fn listing_of<S: AsRef<str>>(first: &[S], total: usize) -> String {
    let shown: Vec<&str> = first.iter().take(LISTED).map(AsRef::as_ref).collect();
    let mut s = shown.join(", ");
    if total > LISTED {
        s.push_str(&format!(", ... ({total} in all)"));
    }
    s
}

/// The candidate closest to `name` by edit distance, if it is close enough to be a likely typo.
/// Returns `None` without comparing once this thread's budget is spent.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut left = LEFT.with(Cell::get);
    let mut best: Option<(&str, f64)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let cost = (name.len() as u64 + 1) * (c.len() as u64 + 1);
        if cost > left {
            left = 0;
            best = None;
            break;
        }
        left -= cost;
        let score = strsim::jaro_winkler(name, c);
        let lev = strsim::levenshtein(name, c);
        let close = lev <= (name.len().max(c.len()) / 3).max(1) || score >= 0.88;
        if close && best.is_none_or(|(_, s)| score > s) {
            best = Some((c, score));
        }
    }
    LEFT.with(|l| l.set(left));
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_a_close_name() {
        reset_budget();
        assert_eq!(closest("tokns", ["tokens", "hidden"].into_iter()), Some("tokens"));
        assert_eq!(closest("zzz", ["tokens", "hidden"].into_iter()), None);
    }

    #[test]
    fn a_long_listing_is_cut() {
        assert_eq!(listing(&["a", "b"]), "a, b");
        let names: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let l = listing(&names);
        assert!(
            l.starts_with("n0, n1, ") && l.ends_with(", n11, ... (100 in all)"),
            "{l}"
        );
    }

    #[test]
    fn a_spent_budget_stops_suggesting_until_reset() {
        reset_budget();
        let names: Vec<String> = (0..2000).map(|i| format!("name{i}")).collect();
        // Each comparison of two 5-7 byte names costs about 50 units: 2000 candidates per
        // call cost about 100,000, so the budget lasts a few hundred calls.
        let mut suggested = 0;
        for _ in 0..1000 {
            if closest("name1x", names.iter().map(String::as_str)).is_some() {
                suggested += 1;
            }
        }
        assert!(suggested > 0 && suggested < 1000, "{suggested}");
        assert_eq!(closest("name1x", names.iter().map(String::as_str)), None);
        reset_budget();
        assert!(closest("name1x", names.iter().map(String::as_str)).is_some());
    }
}
