//! The `hpmoe` binary's end-to-end tests, one test crate (one link) for all of them: each
//! module runs the built binary as a user would.

mod cli;
mod lsp;
mod repl;
mod robust;
mod sweep;
mod tune;

/// Every file a sweep writes (an unsharded run, or the merge of its shards).
const SWEEP_FILES: [&str; 6] = [
    "sweep.csv",
    "sweep.json",
    "latency.svg",
    "phases.svg",
    "speedup.svg",
    "l2.svg",
];
