//! Open documents, `file:` URIs and paths, and the standard library on disk.
//!
//! The standard library is embedded in the binary; so that an editor can open an op's
//! definition in `std::moe`, its modules are written once per binary version to a
//! directory under the system's temporary directory (`hpmoe-stdlib-VERSION-HASH/`, the hash
//! of the texts, so a changed stdlib never reuses stale files) and named by those paths.

use super::analysis::Analysis;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One document the client has open.
#[derive(Debug)]
pub struct Document {
    pub version: i32,
    pub text: String,
    /// The path of a `file:` URI (imports are resolved relative to it).
    pub path: Option<PathBuf>,
    /// The analysis of the current text; `None` after a change, until it is analysed again.
    pub analysis: Option<Analysis>,
    /// The edits that format the current text, once a request asked (emptied by a change).
    pub formatted: std::cell::OnceCell<Option<Vec<lsp_types::TextEdit>>>,
}

/// The open documents by URI (ordered, so every walk over them is deterministic).
pub type Documents = BTreeMap<String, Document>;

/// The path a `file:` URI names (percent-decoded); `None` for other schemes or a URI that
/// is not well-formed.
pub fn uri_to_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let b = rest.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = rest.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    Some(PathBuf::from(s))
}

/// The `file:` URI of an absolute path (bytes other than unreserved ones and `/`
/// percent-encoded).
pub fn path_to_uri(path: &Path) -> String {
    let s = path.to_string_lossy();
    let mut out = String::from("file://");
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~/".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The directory holding the standard library's modules as files, written on first use;
/// `None` when it cannot be written.
fn stdlib_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        // FNV-1a of every module's name and text.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (name, text) in hpmoe_dsl::stdlib::MODULES {
            for &b in name.as_bytes().iter().chain(text.as_bytes()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        let dir = std::env::temp_dir().join(format!("hpmoe-stdlib-{}-{h:016x}", env!("CARGO_PKG_VERSION")));
        std::fs::create_dir_all(&dir).ok()?;
        for (name, text) in hpmoe_dsl::stdlib::MODULES {
            let p = dir.join(format!("{name}.hpm"));
            let same = std::fs::read_to_string(&p).is_ok_and(|t| t == *text);
            if !same {
                // Written under another name first, then renamed: a concurrent reader sees the
                // old file or the new one, never half of one.
                let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
                std::fs::write(&tmp, text).ok()?;
                std::fs::rename(&tmp, &p).ok()?;
            }
        }
        Some(dir)
    })
    .as_deref()
}

/// The file of the standard module `name` (`moe` for `std::moe`).
pub fn stdlib_path(module: &str) -> Option<PathBuf> {
    hpmoe_dsl::stdlib::module(module)?;
    Some(stdlib_dir()?.join(format!("{module}.hpm")))
}

/// The module of a stdlib source as the checker names it (`<std>/moe.hpm` → `moe`).
pub fn stdlib_module(source_name: &str) -> Option<&str> {
    source_name.strip_prefix("<std>/")?.strip_suffix(".hpm")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_and_paths() {
        let p = Path::new("/tmp/a b/ü.hpm");
        let u = path_to_uri(p);
        assert_eq!(u, "file:///tmp/a%20b/%C3%BC.hpm");
        assert_eq!(uri_to_path(&u).as_deref(), Some(p));
        assert_eq!(
            uri_to_path("file://localhost/x.hpm").as_deref(),
            Some(Path::new("/x.hpm"))
        );
        assert_eq!(uri_to_path("untitled:Untitled-1"), None);
        assert_eq!(uri_to_path("file:///bad%zz"), None);
        assert_eq!(uri_to_path("file:///bad%e"), None);
    }

    #[test]
    fn stdlib_files_hold_the_embedded_text() {
        let p = stdlib_path("moe").unwrap();
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            hpmoe_dsl::stdlib::module("moe").unwrap()
        );
        assert!(stdlib_path("nope").is_none());
        assert_eq!(stdlib_module("<std>/device.hpm"), Some("device"));
        assert_eq!(stdlib_module("examples/a.hpm"), None);
    }
}
