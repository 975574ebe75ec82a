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

/// Keeps freed memory mapped instead of returning it to the OS: the compiler and simulator
/// allocate and free large arrays stage after stage, and re-faulting them (zeroing fresh pages
/// in the kernel) cost up to a third of the run time. The process is short-lived, so holding
/// the memory is free. An explicit `MIMALLOC_PURGE_DELAY` in the environment wins.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mimalloc's option setter takes plain integers and is called here, on the main
    // thread, before any other thread exists; -1 is the documented "never purge" value.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
}

fn main() {
    keep_freed_memory();
    let code = cli::main();
    std::process::exit(out::finish(code));
}
