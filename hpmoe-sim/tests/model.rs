//! The simulator library's integration tests, one test crate (one link) for all of them.

mod gates;
mod grad;
mod interleaved;
mod layer;
mod numerics;
mod order;
mod sim;
