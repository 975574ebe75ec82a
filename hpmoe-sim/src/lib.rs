//! hpmoe's device model, executors (timing, numerics), reports, traces and charts.
//!
//! A compiled taskflow (task graph + schedule from `hpmoe_dsl::schedule::compile`) goes
//! through these stages, each a module with a doc saying what goes in and what comes out:
//!
//! 1. [`model`]: the device profile → rates, sizes and latencies, and the shared resources
//!    (L2 residency, HBM bandwidth sharing, link sharing);
//! 2. [`sim`]: the workload (per-task costs, L2 blocks, flows) and the discrete-event
//!    simulation of every rank → a timeline ([`sim::SimResult`]) or a wait-for report;
//! 3. [`report`]: latency, phases, utilisation, exposed communication, L2 hit rate, lower
//!    bound and efficiency, comparisons of policies (tables and JSON);
//! 4. [`trace`]: Chrome trace event JSON (Perfetto);
//! 5. [`gantt`]: SVG charts of core timelines;
//! 6. [`numerics`]: the real numbers of a schedule, compared with dense and per-token
//!    references, with a dynamic race check.
//!
//! [`api_guide`] walks through the whole path from Rust (check or `taskflow!`, compile,
//! simulate, report, numerics). The `hpmoe` command-line tool, its REPL and its sweeps are
//! a separate package (`hpmoe-sim/app`) built on this library; the library itself depends
//! on no command-line crate.

pub mod gantt;
pub mod model;
pub mod numerics;
pub mod pipeline;
pub mod report;
pub mod sim;
#[cfg(test)]
mod testing;
pub mod trace;

#[doc = include_str!("../../docs/API.md")]
pub mod api_guide {}
