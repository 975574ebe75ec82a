//! The interconnect: flows of bytes from one rank to another, sharing each rank's egress and
//! ingress bandwidth.
//!
//! In: flows (a put's bytes to one destination) starting; finish events. Out: when each flow
//! delivered its last byte, per-rank bytes sent and received, busy time and throughput.
//!
//! Model: a flow from `s` to `d` moves at `min(egress / n_out(s), ingress / n_in(d))`, where
//! `n_out(s)` and `n_in(d)` count the flows active at that moment out of `s` and into `d`: N
//! writers into one destination each get `ingress / N` (so they take N times as long as one),
//! which is the hotspot rank-aware reordering removes. This bottleneck share does not hand a
//! flow the share another flow of its source cannot use (a full max-min allocation would);
//! documented limitation. Latency is added by the caller: data and signals arrive
//! `link_latency` after the flow ends.
//!
//! Cost: flows between the same two ranks always move at the same rate, so they are grouped
//! by (source, destination) *pair*: a pair keeps a virtual time (bytes served to each of its
//! flows) and a heap of its flows by virtual finish; a start or finish touches only the pairs
//! of its source and destination, and a pair's finish event is pushed again only when its
//! predicted finish moves earlier (an event that fires early is re-predicted).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const NONE: u32 = u32::MAX;

/// A finish event to schedule: pair, time, generation.
pub type Wake = (u32, f64, u32);

#[derive(Clone, Debug)]
struct Pair {
    src: u32,
    dst: u32,
    n: u32,
    virt: f64,
    rate: f64,
    last: f64,
    /// Flows by virtual finish (non-negative f64 bits).
    flows: BinaryHeap<Reverse<(u64, u32)>>,
    gen: u32,
    /// Time of the pending finish event (infinite when none).
    sched: f64,
    pos_out: u32,
    pos_in: u32,
}

#[derive(Clone, Debug)]
pub struct Links {
    egress: f64,
    ingress: f64,
    pairs: Vec<Pair>,
    /// Per rank: active pairs leaving and entering it, and active flows.
    out: Vec<Vec<u32>>,
    inn: Vec<Vec<u32>>,
    n_out: Vec<u32>,
    n_in: Vec<u32>,
    out_rate: Vec<f64>,
    in_rate: Vec<f64>,
    sent: Vec<f64>,
    received: Vec<f64>,
    moved_out: Vec<f64>,
    busy_out: Vec<f64>,
    busy_in: Vec<f64>,
    since_out: Vec<f64>,
    since_in: Vec<f64>,
    touched: Vec<u32>,
}

/// Relative tolerance under which a flow counts as delivered.
fn close(finish: f64, virt: f64) -> bool {
    finish <= virt + 1e-12 * finish.abs().max(1.0)
}

impl Links {
    /// `pairs`: the (source, destination) of every pair id the caller will use.
    pub fn new(ranks: usize, pairs: &[(u32, u32)], egress: f64, ingress: f64) -> Links {
        Links {
            egress,
            ingress,
            pairs: pairs
                .iter()
                .map(|&(src, dst)| Pair {
                    src,
                    dst,
                    n: 0,
                    virt: 0.0,
                    rate: 0.0,
                    last: 0.0,
                    flows: BinaryHeap::new(),
                    gen: 0,
                    sched: f64::INFINITY,
                    pos_out: NONE,
                    pos_in: NONE,
                })
                .collect(),
            out: vec![Vec::new(); ranks],
            inn: vec![Vec::new(); ranks],
            n_out: vec![0; ranks],
            n_in: vec![0; ranks],
            out_rate: vec![0.0; ranks],
            in_rate: vec![0.0; ranks],
            sent: vec![0.0; ranks],
            received: vec![0.0; ranks],
            moved_out: vec![0.0; ranks],
            busy_out: vec![0.0; ranks],
            busy_in: vec![0.0; ranks],
            since_out: vec![0.0; ranks],
            since_in: vec![0.0; ranks],
            touched: Vec::new(),
        }
    }

    fn settle(&mut self, p: usize, now: f64) {
        let pr = &mut self.pairs[p];
        let dt = now - pr.last;
        if dt > 0.0 {
            if pr.n > 0 {
                pr.virt += pr.rate * dt;
                self.moved_out[pr.src as usize] += pr.n as f64 * pr.rate * dt;
            }
            pr.last = now;
        }
    }

    fn mark(&mut self, s: usize, d: usize, now: f64) {
        if self.n_out[s] > 0 {
            self.busy_out[s] += now - self.since_out[s];
        }
        self.since_out[s] = now;
        if self.n_in[d] > 0 {
            self.busy_in[d] += now - self.since_in[d];
        }
        self.since_in[d] = now;
    }

    /// The predicted finish of pair `p`'s first flow.
    fn predict(&self, p: usize) -> Option<f64> {
        let pr = &self.pairs[p];
        let Reverse((vf, _)) = pr.flows.peek()?;
        Some(pr.last + ((f64::from_bits(*vf) - pr.virt) / pr.rate).max(0.0))
    }

    /// Pushes an event for `p` if its predicted finish is earlier than the pending one.
    fn wake(&mut self, p: usize, wakes: &mut Vec<Wake>) {
        if let Some(t) = self.predict(p) {
            let pr = &mut self.pairs[p];
            if t < pr.sched {
                pr.gen = pr.gen.wrapping_add(1);
                pr.sched = t;
                wakes.push((p as u32, t, pr.gen));
            }
        }
    }

    /// Re-rates the pairs of `s` and `d` after their counts changed.
    fn reshare(&mut self, s: usize, d: usize, now: f64, wakes: &mut Vec<Wake>) {
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        touched.extend_from_slice(&self.out[s]);
        touched.extend_from_slice(&self.inn[d]);
        for &p in &touched {
            let p = p as usize;
            let (ps, pd, n) = (self.pairs[p].src as usize, self.pairs[p].dst as usize, self.pairs[p].n);
            let new = (self.egress / self.n_out[ps] as f64).min(self.ingress / self.n_in[pd] as f64);
            let old = self.pairs[p].rate;
            if new != old {
                self.settle(p, now);
                self.pairs[p].rate = new;
                let delta = n as f64 * (new - old);
                self.out_rate[ps] += delta;
                self.in_rate[pd] += delta;
                self.wake(p, wakes);
            }
        }
        self.touched = touched;
    }

    fn activate(&mut self, p: usize, now: f64) {
        let (s, d) = (self.pairs[p].src as usize, self.pairs[p].dst as usize);
        let pr = &mut self.pairs[p];
        pr.last = now;
        pr.rate = 0.0;
        pr.pos_out = self.out[s].len() as u32;
        self.out[s].push(p as u32);
        pr.pos_in = self.inn[d].len() as u32;
        self.inn[d].push(p as u32);
    }

    fn deactivate(&mut self, p: usize) {
        let (s, d) = (self.pairs[p].src as usize, self.pairs[p].dst as usize);
        let po = self.pairs[p].pos_out as usize;
        self.out[s].swap_remove(po);
        if let Some(&moved) = self.out[s].get(po) {
            self.pairs[moved as usize].pos_out = po as u32;
        }
        let pi = self.pairs[p].pos_in as usize;
        self.inn[d].swap_remove(pi);
        if let Some(&moved) = self.inn[d].get(pi) {
            self.pairs[moved as usize].pos_in = pi as u32;
        }
        let pr = &mut self.pairs[p];
        pr.rate = 0.0;
        pr.pos_out = NONE;
        pr.pos_in = NONE;
        pr.sched = f64::INFINITY;
        pr.gen = pr.gen.wrapping_add(1);
    }

    /// Flow `f` of `bytes` starts on pair `p` at `now`. Events to schedule go to `wakes`.
    pub fn start(&mut self, p: u32, f: u32, bytes: f64, now: f64, wakes: &mut Vec<Wake>) {
        let pu = p as usize;
        let (s, d) = (self.pairs[pu].src as usize, self.pairs[pu].dst as usize);
        self.mark(s, d, now);
        if self.pairs[pu].n == 0 {
            self.activate(pu, now);
        } else {
            self.settle(pu, now);
        }
        let old_rate = self.pairs[pu].rate;
        let pr = &mut self.pairs[pu];
        let vf = pr.virt + bytes;
        pr.flows.push(Reverse((vf.to_bits(), f)));
        pr.n += 1;
        // The new flow moves at the pair's current rate until the re-rating below.
        self.out_rate[s] += old_rate;
        self.in_rate[d] += old_rate;
        self.n_out[s] += 1;
        self.n_in[d] += 1;
        self.reshare(s, d, now, wakes);
        // Its own finish may be the pair's first.
        self.wake(pu, wakes);
    }

    /// The finish event `(p, gen)` fired at `now`: the flows of the pair that delivered all
    /// their bytes go to `done` (with their bytes); new events to `wakes`.
    pub fn fire(&mut self, p: u32, gen: u32, now: f64, flow_bytes: &[f64], done: &mut Vec<u32>, wakes: &mut Vec<Wake>) {
        let pu = p as usize;
        if self.pairs[pu].gen != gen {
            return;
        }
        self.pairs[pu].sched = f64::INFINITY;
        self.settle(pu, now);
        let (s, d) = (self.pairs[pu].src as usize, self.pairs[pu].dst as usize);
        let first = done.len();
        loop {
            let pr = &self.pairs[pu];
            let Some(&Reverse((vf, f))) = pr.flows.peek() else {
                break;
            };
            let vf = f64::from_bits(vf);
            // Delivered, or so close that no time step would change anything.
            let left = vf - pr.virt;
            if !(close(vf, pr.virt) || (done.len() == first && now + left / pr.rate <= now)) {
                break;
            }
            let pr = &mut self.pairs[pu];
            pr.flows.pop();
            pr.virt = pr.virt.max(vf);
            done.push(f);
        }
        if done.len() == first {
            // Fired early (the rate dropped since): predict again.
            self.wake(pu, wakes);
            return;
        }
        self.mark(s, d, now);
        let k = (done.len() - first) as u32;
        let rate = self.pairs[pu].rate;
        for &f in &done[first..] {
            let b = flow_bytes[f as usize];
            self.sent[s] += b;
            self.received[d] += b;
        }
        self.pairs[pu].n -= k;
        self.n_out[s] -= k;
        self.n_in[d] -= k;
        self.out_rate[s] -= k as f64 * rate;
        self.in_rate[d] -= k as f64 * rate;
        if self.pairs[pu].n == 0 {
            self.deactivate(pu);
        }
        if self.n_out[s] == 0 {
            self.out_rate[s] = 0.0;
        }
        if self.n_in[d] == 0 {
            self.in_rate[d] = 0.0;
        }
        self.reshare(s, d, now, wakes);
        if self.pairs[pu].n > 0 {
            self.wake(pu, wakes);
        }
    }

    pub fn src(&self, p: u32) -> u32 {
        self.pairs[p as usize].src
    }
    pub fn dst(&self, p: u32) -> u32 {
        self.pairs[p as usize].dst
    }

    /// Per rank: bytes sent and received by finished flows; bytes moved out (integrated
    /// rate × time, equal to `sent` up to rounding once every flow finished); busy time of
    /// egress and ingress; current throughput (egress, ingress).
    pub fn sent(&self) -> &[f64] {
        &self.sent
    }
    pub fn received(&self) -> &[f64] {
        &self.received
    }
    pub fn moved_out(&self) -> &[f64] {
        &self.moved_out
    }
    pub fn busy_out(&self) -> &[f64] {
        &self.busy_out
    }
    pub fn busy_in(&self) -> &[f64] {
        &self.busy_in
    }
    pub fn throughput(&self, rank: usize) -> (f64, f64) {
        (self.out_rate[rank].max(0.0), self.in_rate[rank].max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs events in time order; returns (flow, finish time).
    fn drain(l: &mut Links, mut wakes: Vec<Wake>, bytes: &[f64]) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        let mut done = Vec::new();
        while !wakes.is_empty() {
            wakes.sort_by(|a, b| b.1.total_cmp(&a.1));
            let (p, t, g) = wakes.pop().unwrap_or((0, 0.0, 0));
            done.clear();
            l.fire(p, g, t, bytes, &mut done, &mut wakes);
            out.extend(done.iter().map(|&f| (f, t)));
        }
        out
    }

    #[test]
    fn writers_into_one_destination_share_its_ingress() {
        let pairs = [(1, 0), (2, 0), (3, 0)];
        let mut l = Links::new(4, &pairs, 10.0, 10.0);
        let mut wakes = Vec::new();
        let bytes = [30.0; 3];
        for p in 0..3 {
            l.start(p, p, 30.0, 0.0, &mut wakes);
        }
        let out = drain(&mut l, wakes, &bytes);
        assert_eq!(out.len(), 3);
        for (_, t) in out {
            // Each gets 10/3: 30 bytes take 9 s.
            assert!((t - 9.0).abs() < 1e-9, "{t}");
        }
        assert_eq!(l.sent()[1], 30.0);
        assert_eq!(l.received()[0], 90.0);
        assert!((l.moved_out()[2] - 30.0).abs() < 1e-9);
    }

    #[test]
    fn alone_a_flow_gets_the_whole_link() {
        let mut l = Links::new(2, &[(0, 1)], 4.0, 8.0);
        let mut wakes = Vec::new();
        l.start(0, 0, 8.0, 1.0, &mut wakes);
        assert_eq!(drain(&mut l, wakes, &[8.0]), vec![(0, 3.0)]);
    }

    #[test]
    fn flows_of_one_pair_share_and_speed_up() {
        // Two flows 0 -> 1 of 10 and 30 bytes on 10 B/s: 5 B/s each until t = 2, then 10.
        let mut l = Links::new(2, &[(0, 1)], 10.0, 10.0);
        let mut wakes = Vec::new();
        l.start(0, 0, 10.0, 0.0, &mut wakes);
        l.start(0, 1, 30.0, 0.0, &mut wakes);
        let out = drain(&mut l, wakes, &[10.0, 30.0]);
        assert_eq!(out[0], (0, 2.0));
        assert_eq!(out[1].0, 1);
        assert!((out[1].1 - 4.0).abs() < 1e-9);
    }
}
