//! hpmoe's device model, executors, reports and the `hpmoe` command-line tool.
//!
//! - [`cli`]: the command-line interface (check, lower, fmt, explain).

pub mod cli;
