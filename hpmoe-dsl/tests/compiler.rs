//! The compiler library's integration tests, one test crate (one link) for all of them.

mod dtypes;
mod fmt;
mod lowering;
mod order;
mod router;
