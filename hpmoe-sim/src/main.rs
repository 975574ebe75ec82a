//! The `hpmoe` command-line tool.

/// mimalloc: the compiler and simulator allocate many small nodes.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(hpmoe_sim::cli::main());
}
