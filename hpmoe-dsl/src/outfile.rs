//! Files the tool writes (traces, charts, tuned programs, dumps, part files).
//!
//! A path that names a FIFO, a socket or a block device is refused before it is opened:
//! opening a FIFO for writing waits until some process opens it for reading, which may never
//! happen, and a block device is a disk. A regular file (new or replaced) and a character
//! device (`/dev/null`, `/dev/full`, a terminal) are written.

use std::path::Path;

/// What `path` names when a write to it is refused: `"a FIFO"`, `"a socket"` or `"a block
/// device"`. `None` for a regular file, a character device, a directory (its write fails on
/// its own) or a path that does not exist.
pub fn unwritable_kind(path: &Path) -> Option<&'static str> {
    let meta = std::fs::metadata(path).ok()?;
    kind_of(&meta.file_type())
}

#[cfg(unix)]
fn kind_of(t: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_block_device() {
        Some("a block device")
    } else {
        None
    }
}

#[cfg(not(unix))]
fn kind_of(_: &std::fs::FileType) -> Option<&'static str> {
    None
}

/// The error of a write refused by [`unwritable_kind`].
fn refused(kind: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("it is {kind}, not a regular file"),
    )
}

/// Creates or truncates `path` for writing, as [`std::fs::File::create`] does, unless it
/// names a FIFO, a socket or a block device.
pub fn create(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(kind) = unwritable_kind(path) {
        return Err(refused(kind));
    }
    std::fs::File::create(path)
}

/// Writes `bytes` to `path` (created or replaced), as [`std::fs::write`] does, unless it
/// names a FIFO, a socket or a block device.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    create(path)?.write_all(bytes.as_ref())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A FIFO is refused without being opened (an open would wait for a reader); a regular
    /// file and `/dev/null` are written.
    #[test]
    fn refuses_fifos_without_opening_them() {
        let dir = std::env::temp_dir().join(format!("hpmoe-outfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("f");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert_eq!(unwritable_kind(&fifo), Some("a FIFO"));
            let e = write(&fifo, b"x").unwrap_err();
            assert!(e.to_string().contains("a FIFO, not a regular file"), "{e}");
        }
        let file = dir.join("a.txt");
        write(&file, b"abc").unwrap();
        write(&file, b"d").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"d");
        assert_eq!(unwritable_kind(&file), None);
        assert_eq!(unwritable_kind(&dir.join("none")), None);
        write(Path::new("/dev/null"), b"x").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
