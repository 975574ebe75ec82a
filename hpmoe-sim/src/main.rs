//! The `hpmoe` command-line tool.

/// mimalloc: the compiler and simulator allocate many small nodes.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (see `mi_option_t` in mimalloc.h).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory mapped instead of returning it to the OS after 10 ms: the compiler and
/// simulator allocate and free large arrays stage after stage, and re-faulting them cost up
/// to a third of the run time. The process is short-lived, so holding the memory is free.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    // SAFETY: mimalloc's option getters and setters take plain integers and are called here,
    // on the main thread, before any other thread exists. The option is identified by value
    // and checked against its documented default (10 ms) before it is changed.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 10 {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

fn main() {
    keep_freed_memory();
    std::process::exit(hpmoe_sim::cli::main());
}
