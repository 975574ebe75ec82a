//! The hpmoe language and compiler.
//!
//! A program goes through these stages, each a module with a doc saying what goes in and what
//! comes out:
//!
//! 1. [`syntax`]: text or macro tokens → AST with spans;
//! 2. [`check`]: AST + parameter overrides → a checked [`ir::Program`] (names, dtypes, shapes,
//!    engines, buffer fit, routings, devices), or diagnostics;
//! 3. [`ir`]: the typed op graph (the first level of the IR).
//!
//! [`embed`] is what the `taskflow!` macro expands to (and, with the `proc-macro2` feature,
//! the expansion itself).
//!
//! Every stage returns all of its errors as [`diag::Diagnostic`]s with source spans.

pub mod check;
pub mod diag;
pub mod embed;
pub mod ir;
pub mod lower;
pub mod npy;
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
