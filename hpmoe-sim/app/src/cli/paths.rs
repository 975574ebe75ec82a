//! Output paths checked before any work: a path in, `Ok` or a usage message out.
//!
//! A run that simulates for a minute and then cannot write its trace wastes that minute, so
//! every file or directory the command will write is checked first: a file's directory must
//! exist and the file must be writable (an existing directory of that name is refused); a
//! directory must exist or be creatable under an existing parent. Nothing is left behind: a
//! probe file created to test writability is removed again.

use std::fs::OpenOptions;
use std::path::Path;

/// The directory a file path lives in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks that `path` can be written as a file. `what` names the option (`--trace`).
pub(crate) fn output_file(what: &str, path: &Path) -> Result<(), String> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(format!("{what} is an empty path"));
    }
    if path.is_dir() {
        return Err(format!("{what} `{shown}` is a directory; give a file name"));
    }
    if let Some(kind) = hpmoe_dsl::outfile::unwritable_kind(path) {
        // Asked before opening: opening a FIFO for writing would wait for a reader.
        return Err(format!(
            "{what} `{shown}` is {kind}, not a regular file; give a file name"
        ));
    }
    let dir = parent_of(path);
    if !dir.is_dir() {
        return Err(format!(
            "{what} `{shown}`: the directory `{}` does not exist",
            dir.display()
        ));
    }
    if path.exists() {
        // Opening for writing without truncating tests the permission and leaves it intact.
        OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| format!("{what} `{shown}` cannot be written: {e}"))
    } else {
        match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(f) => {
                drop(f);
                let _ = std::fs::remove_file(path);
                Ok(())
            }
            Err(e) => Err(format!("{what} `{shown}` cannot be created: {e}")),
        }
    }
}

/// A path as the file it names: the canonical form of an existing path, else of its
/// directory joined with its name (so `./a.json` and `a.json` are one file).
fn resolved(path: &Path) -> Option<std::path::PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let dir = std::fs::canonicalize(parent_of(path)).ok()?;
    Some(dir.join(path.file_name()?))
}

/// Checks that none of the files a command writes into the directory `dir` (`names`) is
/// already there as a directory, a FIFO, a socket or a block device: the write would fail
/// after all the work, or (a FIFO) wait for a reader for ever.
pub(crate) fn files_in_dir<'a>(what: &str, dir: &Path, names: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    for name in names {
        let path = dir.join(name);
        let kind = if path.is_dir() {
            Some("a directory")
        } else {
            hpmoe_dsl::outfile::unwritable_kind(&path)
        };
        if let Some(kind) = kind {
            return Err(format!(
                "{what} `{}`: `{name}`, a file it writes, is {kind} there; write into another directory",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Checks that a `--dump` directory holds none of the `.npy` files a run reads (`read`: the
/// routings' files and the `--input` files): the dump writes `.npy` files named after the
/// taskflow's tensors and routings there, which could replace an input without a word.
pub(crate) fn dump_not_over_inputs(dir: &Path, read: &[std::path::PathBuf]) -> Result<(), String> {
    let Ok(dir_r) = std::fs::canonicalize(dir) else {
        // A directory that does not exist yet holds nothing.
        return Ok(());
    };
    for p in read {
        let is_npy = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
        if let (true, Some(r)) = (is_npy, resolved(p)) {
            if r.parent() == Some(dir_r.as_path()) {
                return Err(format!(
                    "--dump `{}` holds `{}`, a file the run reads; dump into another directory",
                    dir.display(),
                    p.display()
                ));
            }
        }
    }
    Ok(())
}

/// The files a checked program read besides its root file: the imported sources and the
/// `.npy` files of its routings (expert ids, weights, router logits and biases).
pub(crate) fn files_read(sources: &hpmoe_dsl::SourceMap, program: &hpmoe_dsl::ir::Program) -> Vec<std::path::PathBuf> {
    let mut read: Vec<std::path::PathBuf> = sources.files().filter_map(|(_, f)| f.path.clone()).collect();
    for r in &program.routes {
        if let hpmoe_dsl::ir::RouteKind::File {
            resolved,
            resolved_weights,
            ..
        } = &r.kind
        {
            read.push(resolved.clone());
            read.extend(resolved_weights.clone());
        }
        if let Some(rs) = r.kind.router() {
            read.extend(rs.resolved_logits.clone());
            read.extend(rs.resolved_bias.clone());
        }
    }
    read
}

/// Checks that no file a command writes is one its program read (`files_read`): a trace or
/// a tuned program written over an imported module or a routing's `.npy` file would destroy
/// an input without a word.
pub(crate) fn outputs_not_read(read: &[std::path::PathBuf], outputs: &[(&str, &Path)]) -> Result<(), String> {
    let read: Vec<std::path::PathBuf> = read.iter().filter_map(|p| resolved(p)).collect();
    for &(what, path) in outputs {
        let Some(r) = resolved(path) else { continue };
        if read.contains(&r) {
            return Err(format!(
                "{what} `{}` is a file the program reads; give another file name",
                path.display()
            ));
        }
    }
    Ok(())
}

/// Checks that the files a command writes are not its program and not each other: a trace
/// written over the `.hpm` file it came from, or a chart over the trace, would silently lose
/// one of them. `outputs` are (option, path) pairs.
pub(crate) fn distinct_outputs(program: &Path, outputs: &[(&str, &Path)]) -> Result<(), String> {
    let program = resolved(program);
    let mut seen: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for &(what, path) in outputs {
        let Some(r) = resolved(path) else { continue };
        if program.as_ref() == Some(&r) {
            return Err(format!(
                "{what} `{}` is the program itself; give another file name",
                path.display()
            ));
        }
        if let Some((other, _)) = seen.iter().find(|(_, p)| *p == r) {
            return Err(format!(
                "{what} `{}` is also the file of {other}; give each output its own file",
                path.display()
            ));
        }
        seen.push((what, r));
    }
    Ok(())
}

/// Checks that `path` is, or can be created as, a directory the command writes files into.
pub(crate) fn output_dir(what: &str, path: &Path) -> Result<(), String> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(format!("{what} is an empty path"));
    }
    if path.exists() {
        if !path.is_dir() {
            return Err(format!("{what} `{shown}` exists and is not a directory"));
        }
        let probe = path.join(".hpmoe-write-probe");
        return match hpmoe_dsl::outfile::create(&probe) {
            Ok(f) => {
                drop(f);
                let _ = std::fs::remove_file(&probe);
                Ok(())
            }
            Err(e) => Err(format!("{what} `{shown}` cannot be written into: {e}")),
        };
    }
    // The nearest existing ancestor must be a directory (create_dir_all makes the rest).
    let mut anc = parent_of(path);
    loop {
        if anc.exists() {
            return if anc.is_dir() {
                Ok(())
            } else {
                Err(format!("{what} `{shown}`: `{}` is not a directory", anc.display()))
            };
        }
        match anc.parent() {
            Some(p) if !p.as_os_str().is_empty() => anc = p,
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_dirs() {
        let tmp = std::env::temp_dir().join(format!("hpmoe-paths-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        assert!(output_file("--trace", &tmp.join("t.json")).is_ok());
        assert!(!tmp.join("t.json").exists(), "the probe is removed");
        assert!(output_file("--trace", &tmp).unwrap_err().contains("is a directory"));
        assert!(output_file("--trace", &tmp.join("no/t.json"))
            .unwrap_err()
            .contains("does not exist"));
        assert!(output_dir("--dump", &tmp.join("a/b")).is_ok());
        std::fs::write(tmp.join("f"), "x").unwrap();
        assert!(output_dir("--dump", &tmp.join("f"))
            .unwrap_err()
            .contains("not a directory"));
        assert!(output_dir("--dump", &tmp.join("f/sub"))
            .unwrap_err()
            .contains("not a directory"));
        assert!(output_file("--trace", &tmp.join("f")).is_ok());
        assert_eq!(
            std::fs::read_to_string(tmp.join("f")).unwrap(),
            "x",
            "an existing file is kept"
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// A FIFO named as an output file, or as a file written into an output directory, is
    /// refused without being opened; so is a directory where a file is written.
    #[test]
    fn fifos_and_directories_named_as_outputs() {
        let tmp = std::env::temp_dir().join(format!("hpmoe-paths-fifo-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("sub/sweep.json")).unwrap();
        let fifo = tmp.join("sub/sweep.csv");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = output_file("--trace", &fifo).unwrap_err();
            assert!(e.contains("is a FIFO, not a regular file"), "{e}");
            let e = files_in_dir("--out", &tmp.join("sub"), ["sweep.csv"]).unwrap_err();
            assert!(e.contains("`sweep.csv`, a file it writes, is a FIFO"), "{e}");
        }
        let e = files_in_dir("--out", &tmp.join("sub"), ["l2.svg", "sweep.json"]).unwrap_err();
        assert!(e.contains("`sweep.json`, a file it writes, is a directory"), "{e}");
        assert!(files_in_dir("--out", &tmp.join("sub"), ["l2.svg"]).is_ok());
        assert!(files_in_dir("--out", &tmp.join("none"), ["l2.svg"]).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// A dump directory is refused when an `.npy` file the run reads lies in it (however
    /// the path is written); a source file there, or a dump directory beside it, is fine.
    #[test]
    fn dumps_over_files_read() {
        let tmp = std::env::temp_dir().join(format!("hpmoe-paths-dump-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("out")).unwrap();
        std::fs::write(tmp.join("x.npy"), b"").unwrap();
        let read = [tmp.join("lib.hpm"), tmp.join(".").join("x.npy")];
        let e = dump_not_over_inputs(&tmp, &read).unwrap_err();
        assert!(e.contains("x.npy`, a file the run reads"), "{e}");
        assert!(dump_not_over_inputs(&tmp.join("out"), &read).is_ok());
        assert!(dump_not_over_inputs(&tmp, &read[..1]).is_ok());
        assert!(dump_not_over_inputs(&tmp.join("missing"), &read).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// An output is refused when it names a file the program read, however the path is
    /// written; other names in the same directory are fine.
    #[test]
    fn outputs_over_files_read() {
        let tmp = std::env::temp_dir().join(format!("hpmoe-paths-read-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("lib.hpm"), "param a = 1;\n").unwrap();
        let read = [tmp.join("lib.hpm")];
        let dotted = tmp.join(".").join("lib.hpm");
        let e = outputs_not_read(&read, &[("--gantt", &tmp.join("g.svg")), ("--trace", &dotted)]).unwrap_err();
        assert!(
            e.starts_with("--trace `") && e.contains("is a file the program reads"),
            "{e}"
        );
        assert!(outputs_not_read(&read, &[("--trace", &tmp.join("t.json"))]).is_ok());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
