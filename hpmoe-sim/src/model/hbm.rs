//! HBM bandwidth sharing on every die: a deterministic fluid model.
//!
//! In: jobs (a task's bytes that miss in L2, or write-backs of dirty L2 blocks) joining a
//! die's HBM at a time. Out: when each job has moved its bytes, and the die's HBM throughput
//! over time.
//!
//! Model: all jobs active on a die at once share `hbm_bandwidth` max-min fairly, each capped
//! by its core's rate (`core_hbm_rate × clock`; write-backs are capped by the die's
//! bandwidth only and all pending write-backs of a die form one job). Rates change only when
//! a job joins or leaves. Within a class (AIC jobs, AIV jobs, write-back) every job receives
//! the same rate, so a class keeps a *virtual time* (bytes served to each of its jobs so
//! far): a job joining at virtual time `V` with `D` bytes finishes when the class's virtual
//! time reaches `V + D`. Jobs of a class finish in order of that virtual finish (a heap), and
//! only the earliest finish of each class needs an event: a join or leave is O(log n). A
//! die's finish event is pushed again only when its predicted time moves earlier; one that
//! fires early (rates dropped since) is predicted again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Job classes: the two engine classes ([`super::AIC`], [`super::AIV`]) and write-backs.
pub const WRITEBACK: usize = 2;
const CLASSES: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Job {
    /// Virtual finish (non-negative f64 bits: ordered like the value).
    finish: u64,
    task: u32,
}

#[derive(Clone, Debug, Default)]
struct Die {
    virt: [f64; CLASSES],
    n: [u32; CLASSES],
    rate: [f64; CLASSES],
    last: f64,
    jobs: [BinaryHeap<Reverse<Job>>; 2],
    /// Virtual finish of the write-back job (when `n[WRITEBACK] == 1`).
    wb_finish: f64,
    /// Generation of the pending finish event, and its time (infinite when none).
    gen: u32,
    sched: f64,
    served: f64,
    writeback: f64,
    busy: f64,
    /// When the die last moved data, and when its last task job left (from then on only
    /// the write-back job runs, alone, at the full bandwidth).
    active_until: f64,
    tasks_done_at: f64,
}

/// The HBM of every die.
#[derive(Clone, Debug)]
pub struct Hbm {
    bandwidth: f64,
    cap: [f64; CLASSES],
    /// Classes by increasing cap, for water-filling.
    order: [usize; CLASSES],
    dies: Vec<Die>,
}

/// Tolerance (relative) under which a job counts as finished.
fn close(finish: f64, virt: f64) -> bool {
    finish <= virt + 1e-12 * finish.abs().max(1.0)
}

impl Hbm {
    /// `bandwidth` per die; `core_caps`: the per-core HBM rate of each engine class.
    pub fn new(dies: usize, bandwidth: f64, core_caps: [f64; 2]) -> Hbm {
        let cap = [core_caps[0], core_caps[1], bandwidth];
        let mut order = [0, 1, 2];
        order.sort_by(|&a, &b| cap[a].total_cmp(&cap[b]).then(a.cmp(&b)));
        Hbm {
            bandwidth,
            cap,
            order,
            dies: vec![
                Die {
                    sched: f64::INFINITY,
                    ..Die::default()
                };
                dies
            ],
        }
    }

    fn advance(&mut self, d: usize, now: f64) {
        let die = &mut self.dies[d];
        let dt = now - die.last;
        if dt > 0.0 {
            let mut total = 0.0;
            for k in 0..CLASSES {
                if die.n[k] > 0 {
                    die.virt[k] += die.rate[k] * dt;
                    total += die.n[k] as f64 * die.rate[k] * dt;
                }
            }
            if total > 0.0 {
                die.busy += dt;
                die.served += total;
                die.active_until = now;
            }
            die.last = now;
        }
    }

    fn rebalance(&mut self, d: usize) {
        let die = &mut self.dies[d];
        let mut bw = self.bandwidth;
        let mut left: u32 = die.n.iter().sum();
        let mut fair_from = CLASSES;
        for (i, &k) in self.order.iter().enumerate() {
            if die.n[k] == 0 {
                continue;
            }
            let fair = bw / left as f64;
            if self.cap[k] <= fair {
                die.rate[k] = self.cap[k];
                bw -= die.n[k] as f64 * self.cap[k];
                left -= die.n[k];
            } else {
                fair_from = i;
                break;
            }
        }
        if fair_from < CLASSES && left > 0 {
            let fair = bw / left as f64;
            for &k in &self.order[fair_from..] {
                die.rate[k] = fair;
            }
        }
    }

    /// At `now` on die `d`: dirty bytes `writeback` evicted from L2 must go back to HBM,
    /// and a task's job (class, task, bytes) joins, if given. A finish event to schedule, if
    /// any, goes to `wakes` as (die, time, generation).
    pub fn update(
        &mut self,
        d: usize,
        now: f64,
        writeback: f64,
        job: Option<(usize, u32, f64)>,
        wakes: &mut Vec<(u32, f64, u32)>,
    ) {
        if job.is_none() {
            if writeback <= 0.0 {
                return;
            }
            let die = &mut self.dies[d];
            if die.n[WRITEBACK] == 1 {
                // More demand for the running write-back: rates stay, its finish only moves
                // later, and the pending event (if it is the one) fires early and predicts
                // again.
                die.writeback += writeback;
                die.wb_finish += writeback;
                return;
            }
        }
        self.advance(d, now);
        let die = &mut self.dies[d];
        let mut counts_changed = false;
        if writeback > 0.0 {
            die.writeback += writeback;
            if die.n[WRITEBACK] == 0 {
                die.wb_finish = die.virt[WRITEBACK] + writeback;
                die.n[WRITEBACK] = 1;
                counts_changed = true;
            } else {
                die.wb_finish += writeback;
            }
        }
        if let Some((class, task, bytes)) = job {
            let finish = die.virt[class] + bytes;
            die.jobs[class].push(Reverse(Job {
                finish: finish.to_bits(),
                task,
            }));
            die.n[class] += 1;
            counts_changed = true;
        }
        if counts_changed {
            self.rebalance(d);
        }
        self.wake(d, wakes);
    }

    /// A task's job of `bytes` joins die `d` at `now` (see [`Hbm::update`]).
    pub fn join(&mut self, d: usize, class: usize, task: u32, bytes: f64, now: f64, wakes: &mut Vec<(u32, f64, u32)>) {
        self.update(d, now, 0.0, Some((class, task, bytes)), wakes);
    }

    /// Dirty bytes evicted on die `d` at `now` must go back to HBM (see [`Hbm::update`]).
    pub fn writeback(&mut self, d: usize, bytes: f64, now: f64, wakes: &mut Vec<(u32, f64, u32)>) {
        self.update(d, now, bytes, None, wakes);
    }

    /// When the next job of die `d` finishes at current rates, and its class.
    fn next(&self, d: usize) -> Option<(f64, usize)> {
        let die = &self.dies[d];
        let mut best: Option<(f64, usize)> = None;
        for k in 0..CLASSES {
            if die.n[k] == 0 {
                continue;
            }
            let finish = if k == WRITEBACK {
                die.wb_finish
            } else {
                match die.jobs[k].peek() {
                    Some(Reverse(j)) => f64::from_bits(j.finish),
                    None => continue,
                }
            };
            let t = die.last + ((finish - die.virt[k]) / die.rate[k]).max(0.0);
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, k));
            }
        }
        best
    }

    /// Schedules die `d`'s finish event if it is now earlier than the pending one.
    fn wake(&mut self, d: usize, wakes: &mut Vec<(u32, f64, u32)>) {
        if let Some((t, _)) = self.next(d) {
            let die = &mut self.dies[d];
            if t < die.sched {
                die.gen = die.gen.wrapping_add(1);
                die.sched = t;
                wakes.push((d as u32, t, die.gen));
            }
        }
    }

    /// The finish event `(d, gen)` fired at `now`: the tasks whose jobs finished go to `done`
    /// (in order); new events to `wakes`.
    pub fn fire(&mut self, d: usize, gen: u32, now: f64, done: &mut Vec<u32>, wakes: &mut Vec<(u32, f64, u32)>) {
        if self.dies[d].gen != gen {
            return;
        }
        self.dies[d].sched = f64::INFINITY;
        self.advance(d, now);
        let mut changed = self.pop_finished(d, done);
        if !changed {
            // A job whose remaining time is below the clock's resolution finishes now.
            if let Some((t, k)) = self.next(d) {
                if t <= now {
                    let die = &mut self.dies[d];
                    if k == WRITEBACK {
                        die.virt[k] = die.virt[k].max(die.wb_finish);
                    } else if let Some(Reverse(j)) = die.jobs[k].peek() {
                        die.virt[k] = die.virt[k].max(f64::from_bits(j.finish));
                    }
                    changed = self.pop_finished(d, done);
                }
            }
        }
        if changed {
            self.rebalance(d);
        }
        self.wake(d, wakes);
    }

    /// Removes the jobs of die `d` that moved all their bytes; whether any did.
    fn pop_finished(&mut self, d: usize, done: &mut Vec<u32>) -> bool {
        let die = &mut self.dies[d];
        let mut changed = false;
        for k in 0..2 {
            while let Some(Reverse(j)) = die.jobs[k].peek() {
                if !close(f64::from_bits(j.finish), die.virt[k]) {
                    break;
                }
                done.push(j.task);
                die.jobs[k].pop();
                die.n[k] -= 1;
                changed = true;
            }
        }
        if changed && die.n[0] + die.n[1] == 0 {
            die.tasks_done_at = die.last;
        }
        if die.n[WRITEBACK] == 1 && close(die.wb_finish, die.virt[WRITEBACK]) {
            die.n[WRITEBACK] = 0;
            changed = true;
        }
        changed
    }

    /// The die's current throughput (B/s).
    pub fn throughput(&self, d: usize) -> f64 {
        let die = &self.dies[d];
        (0..CLASSES)
            .map(|k| die.n[k] as f64 * if die.n[k] > 0 { die.rate[k] } else { 0.0 })
            .sum()
    }

    /// Bytes moved by die `d` so far (integrated), of which write-backs requested.
    pub fn served(&self, d: usize) -> f64 {
        self.dies[d].served
    }
    /// Bytes moved by die `d` up to time `t`, for a `t` at or after its last task job left
    /// (the end of the layer: every task ends after its HBM job): past that point only the
    /// write-back job runs, alone at the full bandwidth, so the bytes after `t` are the
    /// bandwidth times the time it still ran. `None` for an earlier `t`.
    pub fn served_by(&self, d: usize, t: f64) -> Option<f64> {
        let die = &self.dies[d];
        if die.n[0] + die.n[1] > 0 || t < die.tasks_done_at {
            return None;
        }
        let after = (die.active_until - t).max(0.0) * self.bandwidth;
        Some((die.served - after).max(0.0))
    }
    pub fn writeback_bytes(&self, d: usize) -> f64 {
        self.dies[d].writeback
    }
    /// Time during which die `d` moved data.
    pub fn busy(&self, d: usize) -> f64 {
        self.dies[d].busy
    }
    /// Jobs still active on die `d` (write-back included).
    pub fn active(&self, d: usize) -> u32 {
        self.dies[d].n.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(h: &mut Hbm, mut wakes: Vec<(u32, f64, u32)>) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        let mut done = Vec::new();
        while !wakes.is_empty() {
            wakes.sort_by(|a, b| b.1.total_cmp(&a.1));
            let (d, t, g) = wakes.pop().unwrap_or((0, 0.0, 0));
            done.clear();
            h.fire(d as usize, g, t, &mut done, &mut wakes);
            out.extend(done.iter().map(|&x| (x, t)));
        }
        out
    }

    #[test]
    fn one_job_runs_at_its_cap() {
        let mut h = Hbm::new(1, 100.0, [10.0, 20.0]);
        let mut w = Vec::new();
        h.join(0, 0, 7, 50.0, 0.0, &mut w);
        assert_eq!(drain(&mut h, w), vec![(7, 5.0)]);
    }

    #[test]
    fn contention_shares_fairly() {
        // 4 jobs capped at 40 on 100: each gets 25; equal jobs finish together.
        let mut h = Hbm::new(1, 100.0, [40.0, 40.0]);
        let mut w = Vec::new();
        for t in 0..4 {
            h.join(0, 0, t, 100.0, 0.0, &mut w);
        }
        let out = drain(&mut h, w);
        assert_eq!(out.len(), 4);
        for (_, t) in out {
            assert!((t - 4.0).abs() < 1e-9);
        }
        assert!((h.served(0) - 400.0).abs() < 1e-6);
    }

    #[test]
    fn a_leaving_job_speeds_up_the_others() {
        // Two jobs of 10 and 30 on 20 B/s (caps 100): 10 B/s each until t=1, then 20 B/s.
        let mut h = Hbm::new(1, 20.0, [100.0, 100.0]);
        let mut w = Vec::new();
        h.join(0, 0, 1, 10.0, 0.0, &mut w);
        h.join(0, 1, 2, 30.0, 0.0, &mut w);
        let out = drain(&mut h, w);
        assert_eq!(out[0], (1, 1.0));
        assert_eq!(out[1].0, 2);
        assert!((out[1].1 - 2.0).abs() < 1e-9);
    }

    #[test]
    fn bytes_by_a_time_leave_out_the_write_back_after_it() {
        // 100 B/s. A task job of 50 B (cap 100) and a write-back of 150 B join at 0: 50 B/s
        // each until the job ends at 1 s, then the write-back alone at 100 B/s moves its last
        // 100 B by 2 s. By 1.5 s: 50 + 50 + 50 = 150 B of the 200; by 2 s and later: all.
        let mut h = Hbm::new(1, 100.0, [100.0, 100.0]);
        let mut w = Vec::new();
        h.update(0, 0.0, 150.0, Some((0, 1, 50.0)), &mut w);
        let out = drain(&mut h, w);
        assert_eq!(out, vec![(1, 1.0)]);
        assert!((h.served(0) - 200.0).abs() < 1e-9);
        assert!((h.served_by(0, 1.5).unwrap_or(f64::NAN) - 150.0).abs() < 1e-9);
        assert!((h.served_by(0, 1.0).unwrap_or(f64::NAN) - 100.0).abs() < 1e-9);
        assert_eq!(h.served_by(0, 3.0), Some(200.0));
        // Before the task job left, the split is not known.
        assert_eq!(h.served_by(0, 0.5), None);
    }
}
