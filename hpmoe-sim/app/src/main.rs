//! The `hpmoe` command-line tool: command-line arguments, a REPL session or a sweep's grid
//! in; reports, diagnostics, files and an exit code out. It runs the library stages
//! (`hpmoe_dsl` to check and compile, `hpmoe_sim` to simulate and report) and holds
//! what only the application needs:
//!
//! - `cli`: the `hpmoe` command (clap): `check`, `lower`, `run`, `scale`, `sweep`, `tune`,
//!   `repl`, `fmt`, `explain`, `lsp`;
//! - `lsp`: the language server for editors (`hpmoe lsp`, lsp-server);
//! - `repl`: the interactive session (`hpmoe repl`, reedline);
//! - `sweep`: grids of configurations × policies in parallel (rayon), CSV/JSON and SVG
//!   charts (`hpmoe sweep`);
//! - `tune`: the search over a program's tiles, orders, priorities and policy options with
//!   the simulator as the cost model (`hpmoe tune`);
//! - `shard`: splitting a sweep or a search across processes and merging their parts.

#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
mod out;

mod cli;
mod lsp;
mod repl;
mod shard;
mod sweep;
mod tune;

/// mimalloc: the compiler and simulator allocate many small nodes.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (see `mi_option_t` in mimalloc.h; the same index in v2
/// and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc's `allow_thp` option: its index in the `mi_option_t` of the mimalloc v3 that
/// libmimalloc-sys 0.1.49 builds (37 in v2); a test pins that version.
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Tunes the allocator for a short-lived process that allocates large arrays stage after
/// stage:
/// - keeps freed memory mapped instead of returning it to the OS: re-faulting it (zeroing
///   fresh pages in the kernel) cost up to a third of the run time;
/// - no transparent huge pages: a sparse array (a static-capacity receive window is mostly
///   padding that is never written) would be faulted in 2 MiB at a time, each zeroed by the
///   kernel; with 4 KiB pages an EP64 dispatch peaks at 0.6 GiB instead of 1.4 GiB and runs
///   a quarter faster.
///
/// An explicit `MIMALLOC_PURGE_DELAY` or `MIMALLOC_ALLOW_THP` in the environment wins.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mimalloc's option setter takes plain integers and is called here, on the
        // main thread, before any other thread exists; -1 is the documented "never purge".
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above; 0 stops mimalloc from asking for huge pages (madvise) on the
        // memory it maps from now on.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
        }
        // Where the system gives huge pages without being asked (THP "always"), the process
        // opts out; an error (an old kernel) leaves things as they were.
        #[cfg(target_os = "linux")]
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments and changes only this
        // process's page-fault policy.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// Returns the memory this thread's heap holds free to the system: a worker that finished
/// a large sweep point keeps it mapped otherwise (see [`tune_allocator`]), out of reach of
/// the other workers' heaps.
#[allow(unsafe_code)]
pub(crate) fn return_freed_memory() {
    // SAFETY: mi_collect takes a plain flag and only tidies the calling thread's heap.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

fn main() {
    tune_allocator();
    let code = cli::main();
    std::process::exit(out::finish(code));
}

#[cfg(test)]
mod tests {
    /// The allocator option indices above are those of the mimalloc this version of
    /// libmimalloc-sys builds; a different version must be checked against its mimalloc.h.
    #[test]
    fn the_allocator_options_match_the_locked_mimalloc() {
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock")).expect("Cargo.lock");
        assert!(
            lock.contains("name = \"libmimalloc-sys\"\nversion = \"0.1.49\""),
            "libmimalloc-sys changed: check MI_OPTION_ALLOW_THP and MI_OPTION_PURGE_DELAY in main.rs"
        );
    }
}
