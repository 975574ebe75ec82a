//! The interconnect: flows of bytes from one rank to another, sharing each rank's egress and
//! ingress bandwidth.
//!
//! In: flows (a put's bytes to one destination) starting and ending. Out: each flow's rate
//! and finish time, per-rank bytes sent and received, busy time and throughput.
//!
//! Model: a flow from `s` to `d` moves at `min(egress / n_out(s), ingress / n_in(d))`, where
//! `n_out(s)` and `n_in(d)` count the flows active at that moment out of `s` and into `d`: N
//! writers into one destination each get `ingress / N` (so they take N times as long as one),
//! which is the hotspot rank-aware reordering removes. This bottleneck share is O(degree) per
//! change; unlike a full max-min allocation it does not hand a flow the share another flow
//! of the same source cannot use (documented limitation). Latency is added by the caller:
//! data and signals arrive `link_latency` after the flow ends.

const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct Links {
    egress: f64,
    ingress: f64,
    /// Per rank: the active flows leaving and entering it.
    out: Vec<Vec<u32>>,
    inn: Vec<Vec<u32>>,
    /// Per flow (ids chosen by the caller, below the `flows` given to `new`).
    src: Vec<u32>,
    dst: Vec<u32>,
    bytes: Vec<f64>,
    rem: Vec<f64>,
    rate: Vec<f64>,
    last: Vec<f64>,
    gen: Vec<u32>,
    pos_out: Vec<u32>,
    pos_in: Vec<u32>,
    /// Per rank: current throughput, totals and busy time.
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

impl Links {
    pub fn new(ranks: usize, flows: usize, egress: f64, ingress: f64) -> Links {
        Links {
            egress,
            ingress,
            out: vec![Vec::new(); ranks],
            inn: vec![Vec::new(); ranks],
            src: vec![0; flows],
            dst: vec![0; flows],
            bytes: vec![0.0; flows],
            rem: vec![0.0; flows],
            rate: vec![0.0; flows],
            last: vec![0.0; flows],
            gen: vec![0; flows],
            pos_out: vec![NONE; flows],
            pos_in: vec![NONE; flows],
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

    /// Brings a flow's remaining bytes up to `now`.
    fn settle(&mut self, f: u32, now: f64) {
        let f = f as usize;
        let dt = now - self.last[f];
        if dt > 0.0 {
            let moved = (self.rate[f] * dt).min(self.rem[f]);
            self.rem[f] -= moved;
            self.moved_out[self.src[f] as usize] += moved;
            self.last[f] = now;
        }
    }

    fn share(&self, f: usize) -> f64 {
        let (s, d) = (self.src[f] as usize, self.dst[f] as usize);
        (self.egress / self.out[s].len() as f64).min(self.ingress / self.inn[d].len() as f64)
    }

    /// Recomputes the rates of the flows leaving `s` and entering `d`; pushes the flows whose
    /// rate changed (with a new generation) to `changed`.
    fn reshare(&mut self, s: usize, d: usize, now: f64, changed: &mut Vec<u32>) {
        self.touched.clear();
        self.touched.extend_from_slice(&self.out[s]);
        self.touched.extend_from_slice(&self.inn[d]);
        for i in 0..self.touched.len() {
            let f = self.touched[i];
            let fu = f as usize;
            let new = self.share(fu);
            if new != self.rate[fu] {
                self.settle(f, now);
                let (fs, fd) = (self.src[fu] as usize, self.dst[fu] as usize);
                self.out_rate[fs] += new - self.rate[fu];
                self.in_rate[fd] += new - self.rate[fu];
                self.rate[fu] = new;
                self.gen[fu] = self.gen[fu].wrapping_add(1);
                changed.push(f);
            }
        }
    }

    fn mark(&mut self, s: usize, d: usize, now: f64) {
        if !self.out[s].is_empty() {
            self.busy_out[s] += now - self.since_out[s];
        }
        self.since_out[s] = now;
        if !self.inn[d].is_empty() {
            self.busy_in[d] += now - self.since_in[d];
        }
        self.since_in[d] = now;
    }

    /// Flow `f` of `bytes` from `s` to `d` starts at `now`. Flows whose finish moved
    /// (including `f`) are pushed to `changed`: ask [`Links::finish_time`] for each.
    pub fn start(&mut self, f: u32, s: u32, d: u32, bytes: f64, now: f64, changed: &mut Vec<u32>) {
        let (fu, su, du) = (f as usize, s as usize, d as usize);
        self.mark(su, du, now);
        self.src[fu] = s;
        self.dst[fu] = d;
        self.bytes[fu] = bytes;
        self.rem[fu] = bytes;
        self.rate[fu] = 0.0;
        self.last[fu] = now;
        self.pos_out[fu] = self.out[su].len() as u32;
        self.out[su].push(f);
        self.pos_in[fu] = self.inn[du].len() as u32;
        self.inn[du].push(f);
        self.reshare(su, du, now, changed);
    }

    /// Flow `f` ends at `now` (its finish event fired): it delivered all its bytes.
    pub fn finish(&mut self, f: u32, now: f64, changed: &mut Vec<u32>) {
        let fu = f as usize;
        self.settle(f, now);
        let (su, du) = (self.src[fu] as usize, self.dst[fu] as usize);
        self.mark(su, du, now);
        // Rounding: whatever is left is delivered now.
        self.moved_out[su] += self.rem[fu];
        self.rem[fu] = 0.0;
        self.out_rate[su] -= self.rate[fu];
        self.in_rate[du] -= self.rate[fu];
        self.rate[fu] = 0.0;
        self.gen[fu] = self.gen[fu].wrapping_add(1);
        let p = self.pos_out[fu] as usize;
        self.out[su].swap_remove(p);
        if let Some(&moved) = self.out[su].get(p) {
            self.pos_out[moved as usize] = p as u32;
        }
        let p = self.pos_in[fu] as usize;
        self.inn[du].swap_remove(p);
        if let Some(&moved) = self.inn[du].get(p) {
            self.pos_in[moved as usize] = p as u32;
        }
        self.pos_out[fu] = NONE;
        self.pos_in[fu] = NONE;
        self.sent[su] += self.bytes[fu];
        self.received[du] += self.bytes[fu];
        if self.out[su].is_empty() {
            self.out_rate[su] = 0.0;
        }
        if self.inn[du].is_empty() {
            self.in_rate[du] = 0.0;
        }
        self.reshare(su, du, now, changed);
    }

    /// When flow `f` finishes at its current rate, and the generation that prediction has.
    pub fn finish_time(&self, f: u32) -> (f64, u32) {
        let fu = f as usize;
        (self.last[fu] + self.rem[fu] / self.rate[fu], self.gen[fu])
    }

    pub fn generation(&self, f: u32) -> u32 {
        self.gen[f as usize]
    }

    pub fn src(&self, f: u32) -> u32 {
        self.src[f as usize]
    }
    pub fn dst(&self, f: u32) -> u32 {
        self.dst[f as usize]
    }

    /// Per rank: bytes sent and received by finished flows; bytes moved out (integrated
    /// rate × time, equal to `sent` once every flow finished); busy time of egress and
    /// ingress; current throughput.
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

    #[test]
    fn writers_into_one_destination_share_its_ingress() {
        let mut l = Links::new(4, 3, 10.0, 10.0);
        let mut ch = Vec::new();
        for s in 1..4 {
            l.start(s - 1, s, 0, 30.0, 0.0, &mut ch);
        }
        // Each gets 10/3: 30 bytes take 9 s.
        for f in 0..3 {
            let (t, _) = l.finish_time(f);
            assert!((t - 9.0).abs() < 1e-9, "{t}");
        }
        ch.clear();
        l.finish(0, 9.0, &mut ch);
        assert_eq!(l.sent()[1], 30.0);
        assert_eq!(l.received()[0], 30.0);
    }

    #[test]
    fn alone_a_flow_gets_the_whole_link() {
        let mut l = Links::new(2, 1, 4.0, 8.0);
        let mut ch = Vec::new();
        l.start(0, 0, 1, 8.0, 1.0, &mut ch);
        assert_eq!(ch, vec![0]);
        assert_eq!(l.finish_time(0).0, 3.0);
    }
}
