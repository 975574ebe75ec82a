//! Cooperative cancellation of a long computation: an interactive front end (the REPL)
//! [`request`]s it from a signal handler; the long-running loops of lowering, verification,
//! scheduling, simulation and numerics [`check`] at regular points and unwind with a
//! [`Cancelled`] payload, which the front end catches (`std::panic::catch_unwind`) and
//! reports as "cancelled". Nothing else requests it, so for every other caller `check` is a
//! relaxed atomic load that never fires.
//!
//! Unwinding (rather than an error value through every stage's return type) keeps the
//! stages' types about their own failures; a cancelled stage leaves no partial result
//! behind, since each stage's output is built before it is stored. [`is_cancelled`] tells a
//! panic hook to stay quiet for it.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The panic payload of a cancelled computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled;

/// Asks the running computation to stop at its next check point. Safe in a signal handler.
pub fn request() {
    REQUESTED.store(true, Ordering::Relaxed);
}

/// Whether a cancellation is pending.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// Forgets a pending request (before the next command starts).
pub fn clear() {
    REQUESTED.store(false, Ordering::Relaxed);
}

/// A check point: unwinds with [`Cancelled`] when a cancellation was requested.
#[inline]
pub fn check() {
    check_flag(&REQUESTED);
}

#[inline]
fn check_flag(flag: &AtomicBool) {
    if flag.load(Ordering::Relaxed) {
        std::panic::panic_any(Cancelled);
    }
}

/// A check point in a hot loop: checks on every 4096th iteration only.
#[inline]
pub fn check_every(i: usize) {
    check_every_flag(&REQUESTED, i);
}

#[inline]
fn check_every_flag(flag: &AtomicBool, i: usize) {
    if i & 4095 == 0 {
        check_flag(flag);
    }
}

/// Whether a panic payload is a cancellation.
pub fn is_cancelled(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.is::<Cancelled>()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The process-wide flag is left alone: other tests of this binary run check points.
    #[test]
    fn a_request_unwinds_at_the_next_check_and_is_recognised() {
        let flag = AtomicBool::new(false);
        check_flag(&flag);
        flag.store(true, Ordering::Relaxed);
        let r = std::panic::catch_unwind(|| {
            for i in 1..10_000 {
                check_every_flag(&flag, i);
            }
            unreachable!("the loop reaches iteration 4096");
        });
        let payload = r.expect_err("the loop is cancelled");
        assert!(is_cancelled(payload.as_ref()));
    }
}
