//! The binary's standard output and standard error.
//!
//! Every line the binary prints goes through [`out!`]/[`outln!`] (stdout) or
//! [`errout!`]/[`errln!`] (stderr), or through a [`Stdout`] writer. A write error does not
//! panic: the first one is kept, later writes are skipped, and [`finish`] turns it into the
//! exit code. A closed pipe (`hpmoe ... | head`) ends quietly with the command's own status;
//! any other error on stdout (a full disk) is reported on stderr with exit code 1.

use std::io::{self, Write};
use std::sync::Mutex;

/// The first write error on stdout, if any.
static STDOUT_ERROR: Mutex<Option<(io::ErrorKind, String)>> = Mutex::new(None);
/// The first write error on stderr, if any (it cannot be reported anywhere).
static STDERR_ERROR: Mutex<Option<(io::ErrorKind, String)>> = Mutex::new(None);

type Slot = Mutex<Option<(io::ErrorKind, String)>>;

fn first(slot: &Slot) -> Option<io::ErrorKind> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(k, _)| *k)
}

fn keep(slot: &Slot, e: &io::Error) {
    let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some((e.kind(), e.to_string()));
    }
}

/// Whether a write to stdout has failed: the output is gone, and work that only prints can
/// stop.
pub(crate) fn stdout_failed() -> bool {
    first(&STDOUT_ERROR).is_some()
}

/// Records a write error on stdout met outside this module (a writer of the library).
pub(crate) fn stdout_error(e: &io::Error) {
    keep(&STDOUT_ERROR, e);
}

/// Standard output as a writer: an error is recorded (see [`finish`]) and returned; once one
/// write failed, every later one fails too, without writing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(kind) = first(&STDOUT_ERROR) {
            return Err(io::Error::from(kind));
        }
        io::stdout().lock().write(buf).inspect_err(|e| keep(&STDOUT_ERROR, e))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(kind) = first(&STDOUT_ERROR) {
            return Err(io::Error::from(kind));
        }
        io::stdout()
            .lock()
            .write_all(buf)
            .inspect_err(|e| keep(&STDOUT_ERROR, e))
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(kind) = first(&STDOUT_ERROR) {
            return Err(io::Error::from(kind));
        }
        io::stdout().lock().flush().inspect_err(|e| keep(&STDOUT_ERROR, e))
    }
}

/// Standard error as a writer; an error is recorded, and the exit code is then at least 1.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(kind) = first(&STDERR_ERROR) {
            return Err(io::Error::from(kind));
        }
        io::stderr().lock().write(buf).inspect_err(|e| keep(&STDERR_ERROR, e))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(kind) = first(&STDERR_ERROR) {
            return Err(io::Error::from(kind));
        }
        io::stderr()
            .lock()
            .write_all(buf)
            .inspect_err(|e| keep(&STDERR_ERROR, e))
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().lock().flush().inspect_err(|e| keep(&STDERR_ERROR, e))
    }
}

/// Prints formatted text on stdout (errors recorded, see [`finish`]).
pub(crate) fn print_out(args: std::fmt::Arguments<'_>) {
    let _ = Stdout.write_fmt(args);
}

/// Prints formatted text on stderr (errors recorded).
pub(crate) fn print_err(args: std::fmt::Arguments<'_>) {
    let _ = Stderr.write_fmt(args);
}

/// `out!` that never panics.
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::print_out(format_args!($($arg)*)) };
}

/// `outln!` that never panics.
macro_rules! outln {
    () => { $crate::out::print_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::print_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `errout!` that never panics.
macro_rules! errout {
    ($($arg:tt)*) => { $crate::out::print_err(format_args!($($arg)*)) };
}

/// Prints a line of plain text on stderr (errors recorded), its control characters but tab
/// and line feed escaped: a path, a name or a file's text quoted in it cannot drive the
/// terminal.
pub(crate) fn print_err_line(args: std::fmt::Arguments<'_>) {
    let line = std::fmt::format(args);
    let _ = writeln!(Stderr, "{}", hpmoe_dsl::diag::shown(&line));
}

/// `errln!` that never panics (a line of plain text: see [`print_err_line`]).
macro_rules! errln {
    () => { $crate::out::print_err(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::print_err_line(format_args!($($arg)*)) };
}

/// The exit code once a command returned `code`: stdout is flushed; a closed pipe keeps
/// `code`, any other write error on stdout is reported and makes it at least 1, and so does
/// a write error on stderr.
pub(crate) fn finish(code: i32) -> i32 {
    let _ = Stdout.flush();
    let mut code = code;
    let stdout = STDOUT_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match stdout {
        None => {}
        Some((io::ErrorKind::BrokenPipe, _)) => {}
        Some((_, msg)) => {
            errln!("error: cannot write the output: {msg}");
            code = code.max(1);
        }
    }
    if first(&STDERR_ERROR).is_some() {
        code = code.max(1);
    }
    code
}
