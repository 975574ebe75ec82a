//! Stage timings and process memory, for `--timings` and scaling studies.
//!
//! In: calls to [`Clock::lap`] after each stage. Out: the stages' wall-clock durations, and
//! the process's peak resident memory ([`peak_rss_bytes`]). Timings are measurements, not
//! results: they are printed only when asked for and never enter a report that must be
//! reproducible byte for byte.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called with each stage's name as it ends (a progress display listens here).
#[derive(Clone)]
pub struct LapObserver(pub Arc<dyn Fn(&'static str) + Send + Sync>);

impl std::fmt::Debug for LapObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LapObserver")
    }
}

/// Wall-clock durations of consecutive stages.
#[derive(Clone, Debug)]
pub struct Clock {
    last: Instant,
    laps: Vec<(&'static str, Duration)>,
    observer: Option<LapObserver>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// Starts timing now.
    pub fn new() -> Clock {
        Clock {
            last: Instant::now(),
            laps: Vec::new(),
            observer: None,
        }
    }
    /// Starts timing now; `observer` hears of every stage as it ends.
    pub fn observed(observer: LapObserver) -> Clock {
        Clock {
            observer: Some(observer),
            ..Clock::new()
        }
    }
    /// Ends the stage `name` (it began at the previous lap, or at the start) and begins the
    /// next. A stage that runs twice adds up.
    pub fn lap(&mut self, name: &'static str) {
        // A stage boundary is a cancellation check point.
        crate::cancel::check();
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        match self.laps.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += d,
            None => self.laps.push((name, d)),
        }
        if let Some(o) = &self.observer {
            (o.0)(name);
        }
    }
    /// Adds a stage timed elsewhere (a later step of the same run).
    pub fn add(&mut self, name: &'static str, d: Duration) {
        match self.laps.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += d,
            None => self.laps.push((name, d)),
        }
    }
    /// Restarts the current stage without recording the time since the last lap.
    pub fn skip(&mut self) {
        self.last = Instant::now();
    }
    /// The stages in the order they first ran.
    pub fn laps(&self) -> &[(&'static str, Duration)] {
        &self.laps
    }
    /// The sum of all stages.
    pub fn total(&self) -> Duration {
        self.laps.iter().map(|(_, d)| *d).sum()
    }
}

/// The peak resident set size of this process in bytes (`VmHWM` of `/proc/self/status`), or
/// `None` where the platform does not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The address space this process may still map: its soft limit (`Max address space` of
/// `/proc/self/limits`) less what it maps (`VmSize`); `None` when there is no limit or the
/// platform does not report one.
pub fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(soft.saturating_sub(status_bytes("VmSize:")?))
}

/// A size in kB of `/proc/self/status`, in bytes.
fn status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line
        .trim_start_matches(key)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_accumulate_by_name_in_first_run_order() {
        let mut c = Clock::new();
        c.lap("a");
        c.lap("b");
        c.lap("a");
        let names: Vec<_> = c.laps().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(c.total(), c.laps()[0].1 + c.laps()[1].1);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn peak_rss_is_reported_on_linux() {
        let v = std::hint::black_box(vec![1u8; 8 << 20]);
        let peak = peak_rss_bytes().expect("VmHWM on Linux");
        assert!(peak >= v.len() as u64, "peak {peak} below an 8 MiB live buffer");
    }
}
