//! The hpmoe language and compiler.
//!
//! A program goes through these stages, each a module with a doc saying what goes in and what
//! comes out; [`driver`] runs them in order and caches their results, and every front end
//! (the `hpmoe` command, its REPL and sweeps, the `taskflow!` macro, the Rust API) goes
//! through it:
//!
//! 1. [`syntax`]: text or macro tokens → AST with spans;
//! 2. [`check`]: AST + parameter overrides → a checked [`ir::Program`] (names, dtypes, shapes,
//!    engines, buffer fit, routings, devices, policies), or diagnostics;
//! 3. [`route`]: routings materialised from their specs; [`lower::layouts`] their receive
//!    windows;
//! 4. [`lower`]: a checked taskflow + routings → a tile-level [`lower::TaskGraph`];
//! 5. [`verify`]: task graph (and schedule) → diagnostics (missing producers, races, write
//!    conflicts, cycles, deadlocks);
//! 6. [`schedule`]: task graph + [`policy::PolicySpec`] → per-core queues and counters.
//!
//! [`ir`] is the typed op graph (the first level of the IR); [`policy`] the scheduling
//! policies' meaning as data; [`embed`] what the `taskflow!` macro expands to (and, with the
//! `proc-macro2` feature, the expansion itself).
//!
//! Every stage returns all of its errors as [`diag::Diagnostic`]s with source spans.

pub mod cancel;
pub mod check;
pub mod diag;
pub mod driver;
pub mod embed;
pub mod ir;
pub mod lower;
pub mod npy;
pub mod outfile;
pub mod policy;
pub mod route;
pub mod schedule;
pub mod source;
pub mod stdlib;
pub mod suggest;
pub mod syntax;
pub mod timing;
pub mod verify;

pub use diag::{Code, Diagnostic, Severity};
pub use source::SourceMap;
pub use syntax::token::{FileId, Span};
