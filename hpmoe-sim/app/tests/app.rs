//! The `hpmoe` binary's end-to-end tests, one test crate (one link) for all of them: each
//! module runs the built binary as a user would.

mod cli;
mod lsp;
mod repl;
mod robust;
mod sweep;
mod tune;
