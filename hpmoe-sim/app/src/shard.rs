//! Sharding a sweep or a search across processes (`--shard I/N`, or a Slurm job array):
//! which items a shard evaluates, the part files shards write, and the checks that merging
//! them needs.
//!
//! Items (grid points of a sweep, candidates of a search) are numbered `0..n`; shard `I` of
//! `N` evaluates the items `i` with `i % N == I`. A shard writes `KIND-part-I-of-N.json` into
//! its output directory; `--merge DIR...` reads every part file of the directories, checks
//! that they come from the same run (the same input hash and settings) and that shards
//! `0..N` are each present once, and joins them. Numbers in part files are written as text
//! (`"1.25"`, Rust's shortest round-trip form) so that a merge reproduces every bit.

use serde_json::{json, Value as J};
use std::path::{Path, PathBuf};

/// The most runs of missing shards a failed merge names.
const MAX_LISTED: usize = 10;

/// The version of the part file format (`docs/FORMATS.md`).
pub const PART_FORMAT: u64 = 1;

/// The most shards a search is split into: the largest job array Slurm allows
/// (`MaxArraySize` is at most 4000001). A merge needs every part, so a larger count could
/// never be merged.
pub const MAX_SHARDS: usize = 4_000_001;

/// One shard of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Whether item `i` belongs to this shard.
    pub fn owns(&self, i: usize) -> bool {
        i % self.count == self.index
    }

    /// Parses `I/N` (0-based `I`, `I < N`, `N >= 1`).
    pub fn parse(s: &str) -> Result<Shard, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("--shard `{s}` is not of the form I/N (e.g. 0/4)"))?;
        let i: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("--shard `{s}`: `{}` is not a shard index (0, 1, ...)", i.trim()))?;
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("--shard `{s}`: `{}` is not a shard count (1, 2, ...)", n.trim()))?;
        Shard::new(i, n).map_err(|e| format!("--shard `{s}`: {e}"))
    }

    fn new(index: usize, count: usize) -> Result<Shard, String> {
        if count == 0 {
            return Err("the shard count must be at least 1".into());
        }
        if count > MAX_SHARDS {
            return Err(format!(
                "{count} shards are more than {MAX_SHARDS}, the most a merge reads (a Slurm job array holds at most as many tasks)"
            ));
        }
        if index >= count {
            return Err(format!(
                "shard index {index} is out of range: shards are numbered 0 to {}",
                count - 1
            ));
        }
        Ok(Shard { index, count })
    }

    /// The shard from `--shard`, else from a Slurm job array (`SLURM_ARRAY_TASK_ID`,
    /// `SLURM_ARRAY_TASK_COUNT`, and `SLURM_ARRAY_TASK_MIN` when the array does not start at
    /// 0), else none.
    pub fn from_args(arg: Option<&str>) -> Result<Option<Shard>, String> {
        if let Some(a) = arg {
            return Shard::parse(a).map(Some);
        }
        // Set (and not blank) or not; a value that is not text is kept (lossily) so that it
        // is refused as a number below, never taken for an unset variable.
        let var = |k: &str| {
            std::env::var_os(k)
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.trim().is_empty())
        };
        let (id, count) = (var("SLURM_ARRAY_TASK_ID"), var("SLURM_ARRAY_TASK_COUNT"));
        let (id, count) = match (id, count) {
            (None, None) => return Ok(None),
            (Some(id), Some(count)) => (id, count),
            (Some(_), None) => {
                return Err("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not".into());
            }
            (None, Some(_)) => {
                return Err("SLURM_ARRAY_TASK_COUNT is set but SLURM_ARRAY_TASK_ID is not".into());
            }
        };
        let num = |k: &str, v: &str| -> Result<usize, String> {
            v.trim()
                .parse()
                .map_err(|_| format!("{k}=`{v}` is not a non-negative integer"))
        };
        let id = num("SLURM_ARRAY_TASK_ID", &id)?;
        let count = num("SLURM_ARRAY_TASK_COUNT", &count)?;
        let min = match var("SLURM_ARRAY_TASK_MIN") {
            Some(m) => num("SLURM_ARRAY_TASK_MIN", &m)?,
            None => 0,
        };
        let index = id
            .checked_sub(min)
            .ok_or_else(|| format!("SLURM_ARRAY_TASK_ID={id} is below SLURM_ARRAY_TASK_MIN={min}"))?;
        Shard::new(index, count).map(Some).map_err(|e| {
            format!(
                "from SLURM_ARRAY_TASK_ID={id} and SLURM_ARRAY_TASK_COUNT={count}: {e} (submit with --array=0-{})",
                count.max(1) - 1
            )
        })
    }

    /// The part file's name for a kind (`sweep`, `tune`).
    pub fn file_name(&self, kind: &str) -> String {
        format!("{kind}-part-{}-of-{}.json", self.index, self.count)
    }
}

/// FNV-1a (64 bits) of some bytes, as 16 hex digits: a stable fingerprint of an input.
pub fn fingerprint(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        // Length first, so that ("ab", "c") and ("a", "bc") differ.
        for b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// A number as part files hold it: its shortest round-trip text.
pub fn num(x: f64) -> J {
    J::String(x.to_string())
}

/// A number read back from [`num`].
pub fn read_num(v: &J, what: &str) -> Result<f64, String> {
    v.as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| format!("{what} is not a number written as text"))
}

/// A measure read back from [`num`] (a time, a share, a rate): finite and not negative, as
/// every measure a shard writes is; a part file edited to hold `NaN`, `inf` or `-1` is
/// refused rather than merged into tables and charts.
pub fn read_measure(v: &J, what: &str) -> Result<f64, String> {
    let x = read_num(v, what)?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("{what} is {x}, not a finite non-negative number"))
    }
}

/// The header every part file starts with.
pub fn header(kind: &str, shard: Shard, fingerprint: &str, settings: J) -> J {
    json!({
        "format": PART_FORMAT,
        "kind": kind,
        "shard": shard.index,
        "shards": shard.count,
        "fingerprint": fingerprint,
        "settings": settings,
    })
}

/// Writes a part file into `dir` (created if needed); returns its path.
pub fn write_part(dir: &Path, kind: &str, shard: Shard, doc: &J) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let path = dir.join(shard.file_name(kind));
    let text = serde_json::to_string_pretty(doc).unwrap_or_default() + "\n";
    hpmoe_dsl::outfile::write(&path, text).map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    Ok(path)
}

/// Reads the part files of a kind in `dirs` and checks that they make one whole run: the same
/// format, fingerprint, settings and shard count, and every shard `0..N` exactly once.
/// Returns the parts in shard order.
pub fn read_parts(dirs: &[PathBuf], kind: &str) -> Result<Vec<J>, String> {
    if dirs.is_empty() {
        return Err("--merge needs at least one directory".into());
    }
    let prefix = format!("{kind}-part-");
    let mut files: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let entries = std::fs::read_dir(d).map_err(|e| format!("cannot read directory `{}`: {e}", d.display()))?;
        let mut here: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
            })
            .collect();
        here.sort();
        if here.is_empty() {
            return Err(format!(
                "`{}` holds no {kind} part file ({prefix}I-of-N.json)",
                d.display()
            ));
        }
        files.extend(here);
    }
    let mut parts: Vec<(usize, PathBuf, J)> = Vec::new();
    for f in &files {
        // A regular file of bounded size: a FIFO or a device named like a part would block or
        // never end.
        let text = hpmoe_dsl::check::read_source(f).map_err(|e| format!("cannot read `{}`: {e}", f.display()))?;
        let doc: J = serde_json::from_str(&text).map_err(|e| format!("`{}` is not JSON: {e}", f.display()))?;
        if doc["kind"].as_str() != Some(kind) {
            return Err(format!("`{}` is not a {kind} part file", f.display()));
        }
        if doc["format"].as_u64() != Some(PART_FORMAT) {
            return Err(format!(
                "`{}` has part format {}; this hpmoe reads format {PART_FORMAT}",
                f.display(),
                doc["format"]
            ));
        }
        let (Some(i), Some(n)) = (doc["shard"].as_u64(), doc["shards"].as_u64()) else {
            return Err(format!("`{}` has no shard number", f.display()));
        };
        let (i, n) = (i as usize, n as usize);
        if n == 0 || i >= n {
            return Err(format!("`{}` claims to be shard {i} of {n}", f.display()));
        }
        parts.push((i, f.clone(), doc));
    }
    let (_, first_path, first) = &parts[0];
    let n = first["shards"].as_u64().unwrap_or(0) as usize;
    for (_, p, d) in &parts[1..] {
        for (key, what) in [
            ("shards", "shard count"),
            ("fingerprint", "input (file or settings)"),
            ("settings", "settings"),
        ] {
            if d[key] != first[key] {
                return Err(format!(
                    "`{}` and `{}` come from different runs: their {what} differ ({} vs {})",
                    first_path.display(),
                    p.display(),
                    compact(&first[key]),
                    compact(&d[key])
                ));
            }
        }
    }
    parts.sort_by_key(|(i, _, _)| *i);
    for w in parts.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(format!(
                "shard {} of {n} is given twice: `{}` and `{}`",
                w[0].0,
                w[0].1.display(),
                w[1].1.display()
            ));
        }
    }
    // The parts are sorted and distinct, so shards `0..n` are all there exactly when there
    // are `n` of them; the shard count comes from the files, so the missing ones are found
    // from the gaps between the parts (a few named), never by walking `0..n`.
    if parts.len() != n {
        let mut gaps = Vec::new();
        let mut next = 0usize;
        for i in parts.iter().map(|(i, _, _)| *i).chain([n]) {
            if i > next {
                gaps.push(if i - next == 1 {
                    next.to_string()
                } else {
                    format!("{next}-{}", i - 1)
                });
            }
            next = i + 1;
            if gaps.len() > MAX_LISTED {
                break;
            }
        }
        let more = if gaps.len() > MAX_LISTED { ", ..." } else { "" };
        gaps.truncate(MAX_LISTED);
        return Err(format!(
            "missing shard(s) {}{more} of {n} ({} missing; found {} part file(s))",
            gaps.join(", "),
            n - parts.len(),
            parts.len()
        ));
    }
    Ok(parts.into_iter().map(|(_, _, d)| d).collect())
}

fn compact(v: &J) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        let cut: String = s.chars().take(117).collect();
        format!("{cut}...")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shards() {
        assert_eq!(Shard::parse("0/1"), Ok(Shard { index: 0, count: 1 }));
        assert_eq!(Shard::parse(" 2 / 3 "), Ok(Shard { index: 2, count: 3 }));
        assert!(Shard::parse("3/3").unwrap_err().contains("out of range"));
        assert!(Shard::parse("0/0").unwrap_err().contains("at least 1"));
        assert!(Shard::parse("0/18446744073709551615")
            .unwrap_err()
            .contains("the most a merge reads"));
        assert_eq!(
            Shard::parse("4000000/4000001"),
            Ok(Shard {
                index: 4_000_000,
                count: 4_000_001
            })
        );
        assert!(Shard::parse("-1/2").is_err());
        assert!(Shard::parse("1").is_err());
        assert!(Shard::parse("a/b").is_err());
    }

    #[test]
    fn shards_partition_the_items() {
        for n in 1..5 {
            for i in 0..20 {
                let owners = (0..n).filter(|&s| Shard { index: s, count: n }.owns(i)).count();
                assert_eq!(owners, 1);
            }
        }
    }

    #[test]
    fn fingerprints_separate_parts() {
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        // FNV-1a of nothing is its offset basis.
        assert_eq!(fingerprint(&[]), "cbf29ce484222325");
    }

    #[test]
    fn measures_are_finite_and_not_negative() {
        assert_eq!(read_measure(&num(1.5), "x"), Ok(1.5));
        assert_eq!(read_measure(&num(0.0), "x"), Ok(0.0));
        for bad in ["NaN", "inf", "-inf", "-1", "1e400"] {
            let e = read_measure(&J::String(bad.into()), "x").unwrap_err();
            assert!(e.contains("not a finite non-negative number"), "{bad}: {e}");
        }
        assert!(read_measure(&json!(1.5), "x").unwrap_err().contains("written as text"));
    }

    #[test]
    fn numbers_round_trip() {
        for x in [0.1 + 0.2, 1e-300, 123456.789e10, f64::MIN_POSITIVE] {
            assert_eq!(read_num(&num(x), "x").unwrap().to_bits(), x.to_bits());
        }
    }
}
