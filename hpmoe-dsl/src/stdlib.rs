//! The standard library, embedded in the binary so the tool works from any directory.
//!
//! Modules: `std::moe` (MoE operators, forward and backward), `std::quant` (quantised
//! payloads: int8/fp8 quantisation, scales, quantised GMM), `std::route` (routing kinds),
//! `std::schedule` (scheduling policies), `std::device` (device profiles). The routing kinds
//! and policies form the prelude: they are in scope in every file without an import.

/// `(module name, source text)` for every standard module.
pub const MODULES: &[(&str, &str)] = &[
    ("moe", include_str!("../../stdlib/moe.hpm")),
    ("quant", include_str!("../../stdlib/quant.hpm")),
    ("route", include_str!("../../stdlib/route.hpm")),
    ("schedule", include_str!("../../stdlib/schedule.hpm")),
    ("device", include_str!("../../stdlib/device.hpm")),
];

/// Modules whose items are in scope everywhere.
pub const PRELUDE: &[&str] = &["route", "schedule"];

/// The text of `std::NAME`.
pub fn module(name: &str) -> Option<&'static str> {
    MODULES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}
