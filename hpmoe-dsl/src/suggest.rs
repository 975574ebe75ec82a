//! "Did you mean ...?" suggestions.

/// The candidate closest to `name` by edit distance, if it is close enough to be a likely typo.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let score = strsim::jaro_winkler(name, c);
        let lev = strsim::levenshtein(name, c);
        let close = lev <= (name.len().max(c.len()) / 3).max(1) || score >= 0.88;
        if close && best.is_none_or(|(_, s)| score > s) {
            best = Some((c, score));
        }
    }
    best.map(|(c, _)| c)
}
