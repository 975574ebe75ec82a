//! The device model: a checked [`Device`] (a profile from `stdlib/device.hpm` with its
//! overrides, in base units) in; the rates, sizes and latencies the simulator uses out
//! ([`DeviceModel`]), plus the three shared resources whose state changes while a schedule
//! runs:
//!
//! - [`l2`]: the L2 of every die, a CLOCK (second-chance) residency of data blocks (a block
//!   is what one task wrote on one rank, or an input region), so a consumer that runs soon
//!   after its producer hits and one that runs after a large unrelated working set misses;
//! - [`hbm`]: the HBM bandwidth of every die, shared by every core that is moving data from or
//!   to HBM at the same time (a deterministic fluid model, max-min fair with per-core caps);
//! - [`link`]: the interconnect, a topology of ports and links per profile (packages, nodes,
//!   the fabric between nodes) shared max-min fairly by the flows that use them at the same
//!   time.
//!
//! Every number comes from a device field; nothing here is a constant of the code.
//!
//! ## Equations (per rank = one die)
//!
//! | quantity | equation |
//! |---|---|
//! | cube rate of one AIC core (FLOP/s) | `cube_flops_per_cycle × aic_clock × cube_efficiency` |
//! | ... on int8 operands (both `i8`/`u8`) | `cube_int8_flops_per_cycle × aic_clock × cube_efficiency`; fp8 operands run at the bf16 rate (no fp8 MAC on 910B/A3) |
//! | vector elements per second | at the width of the widest dtype among an op's inputs and output |
//! | vector rate of one AIV core (elements/s) | `vector_bytes_per_cycle / element size × aiv_clock` |
//! | per-core HBM, L2 read, L2 write rates (B/s) | `core_hbm_rate`, `core_l2_read_rate`, `core_l2_write_rate` × the core's clock |
//! | HBM of a die (B/s) | `hbm_bandwidth`, shared (see [`hbm`]) |
//! | L2 capacity (B) | `l2_size` (see [`l2`]) |
//! | a flow's rate (B/s) | max-min fair over its pair's link and the ports and uplinks on its path, every rate × `link_efficiency` (see [`link`]) |
//! | remote data and signals | arrive the pair's path latency after they leave (`package_link_latency`, `link_latency`, or `link_latency + cross_hops × cross_hop_latency`); a signal is ordered after its data |
//! | a put's messages | one row of its target each (at most `put_chunk_bytes`); `core_puts_in_flight` outstanding per queue, each from its descriptor until it lands: a flow of `k` messages alone takes `k (put_overhead + latency) + bytes / pair rate` (see [`link`]) |
//! | a put's flows | up to `core_puts_in_flight` per core and `die_puts_in_flight` per die at once, each after `put_overhead`, plus `peer_setup` for a call's first put from a rank to a peer |
//! | local signals | arrive `event_latency` after the task ends |
//! | a task | `max(compute, memory, link) + task_overhead` (see `sim`) |
//! | a kernel | `kernel_launch` before its first task (one for a fused schedule) |
//! | a put | staged through the UB in `put_chunk_bytes` chunks: the link starts after the first chunk is read |

pub mod hbm;
pub mod heap;
pub mod l2;
pub mod link;

/// Asks the processor to bring the memory of `x` (every cache line it spans) into its
/// caches ahead of use. A hint: it changes no value and never faults; on targets without a
/// stable prefetch instruction it does nothing.
#[inline(always)]
pub fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        // Each 64-byte line the object spans, once.
        let p = (x as *const T).cast::<i8>();
        let offset = p as usize % 64;
        let mut at = 0;
        while at < offset + std::mem::size_of::<T>().max(1) {
            prefetch_line(p.wrapping_add(at).wrapping_sub(offset));
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_line(p: *const i8) {
    // SAFETY: a prefetch is only a hint to the cache: it reads nothing the program sees,
    // writes nothing and never faults, whatever the address (here always within a live
    // reference). SSE, which it needs, is part of every x86_64 target.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
}

/// A first-in-first-out queue: a vector and the index of its head, compacted when the head
/// passed half of it (cheaper per operation than a ring buffer; amortised O(1)).
#[derive(Clone, Debug)]
pub struct Fifo<T> {
    items: Vec<T>,
    head: usize,
}

impl<T: Copy> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            items: Vec::new(),
            head: 0,
        }
    }
}

impl<T: Copy> Fifo<T> {
    #[inline]
    pub fn push(&mut self, x: T) {
        self.items.push(x);
    }
    #[inline]
    pub fn front(&self) -> Option<&T> {
        self.items.get(self.head)
    }
    #[inline]
    pub fn back(&self) -> Option<&T> {
        if self.head < self.items.len() {
            self.items.last()
        } else {
            None
        }
    }
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        let x = *self.items.get(self.head)?;
        self.head += 1;
        if self.head >= 1024 && self.head * 2 >= self.items.len() {
            self.items.drain(..self.head);
            self.head = 0;
        }
        Some(x)
    }
    /// The item `k` places behind the head (the head itself at 0).
    #[inline]
    pub fn get(&self, k: usize) -> Option<&T> {
        self.items.get(self.head + k)
    }
    pub fn len(&self) -> usize {
        self.items.len() - self.head
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

use hpmoe_dsl::ir::{Device, Engine};

/// Engine classes: index 0 for the cube cores, 1 for the vector cores.
pub const AIC: usize = 0;
pub const AIV: usize = 1;

/// The class index of an engine.
pub fn class(e: Engine) -> usize {
    match e {
        Engine::Aic => AIC,
        Engine::Aiv => AIV,
    }
}

/// The static part of the model, in base units (s, B, B/s, FLOP/s).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceModel {
    pub ranks: u32,
    pub aic_cores: u32,
    pub aiv_cores: u32,
    /// Sustained FLOP/s of one AIC core.
    pub cube_flops: f64,
    /// Sustained operations per second of one AIC core on int8 operands.
    pub cube_flops_int8: f64,
    /// Peak FLOP/s of one AIC core (`cube_flops_per_cycle × aic_clock`), for MAC utilisation.
    pub cube_peak: f64,
    /// Bytes per second the vector unit of one AIV core processes (divide by the element size
    /// for elements per second).
    pub vector_bytes: f64,
    /// Per engine class ([`AIC`], [`AIV`]): the per-core HBM, L2 read and L2 write rates.
    pub core_hbm: [f64; 2],
    pub core_l2_read: [f64; 2],
    pub core_l2_write: [f64; 2],
    /// HBM bandwidth of one die, shared by its cores.
    pub hbm_bandwidth: f64,
    /// L2 capacity of one die.
    pub l2_size: f64,
    /// The fabric (see [`link`]).
    pub topology: link::Topology,
    /// The most one rank sends or receives at once over every tier, and the smallest latency
    /// between two ranks: for lower bounds.
    pub link_egress: f64,
    pub link_ingress: f64,
    pub link_latency: f64,
    pub event_latency: f64,
    pub kernel_launch: f64,
    pub task_overhead: f64,
    pub put_chunk_bytes: f64,
}

impl DeviceModel {
    /// The model of a checked device. The checker guarantees every field positive and
    /// finite; a product of two fields can still overflow (a clock of 1e300 Hz times 1e300
    /// FLOP per cycle), and such a device is rejected here with the rate it breaks.
    pub fn new(d: &Device) -> Result<DeviceModel, String> {
        let clock = [d.aic_clock(), d.aiv_clock()];
        let per_core = |rate: f64| [rate * clock[AIC], rate * clock[AIV]];
        let topology = link::Topology::new(d);
        let link = topology.max_rank_rate();
        let m = DeviceModel {
            ranks: d.ranks(),
            aic_cores: d.aic_cores(),
            aiv_cores: d.aiv_cores(),
            cube_flops: d.cube_flops_per_cycle() * clock[AIC] * d.cube_efficiency(),
            cube_flops_int8: d.cube_int8_flops_per_cycle() * clock[AIC] * d.cube_efficiency(),
            cube_peak: d.cube_flops_per_cycle() * clock[AIC],
            vector_bytes: d.vector_bytes_per_cycle() * clock[AIV],
            core_hbm: per_core(d.core_hbm_rate()),
            core_l2_read: per_core(d.core_l2_read_rate()),
            core_l2_write: per_core(d.core_l2_write_rate()),
            hbm_bandwidth: d.hbm_bandwidth(),
            l2_size: d.l2_size(),
            link_egress: link,
            link_ingress: link,
            link_latency: topology.min_latency(),
            event_latency: d.event_latency(),
            kernel_launch: d.kernel_launch(),
            task_overhead: d.task_overhead(),
            put_chunk_bytes: d.put_chunk_bytes(),
            topology,
        };
        let derived = [
            (
                "cube rate (cube_flops_per_cycle x aic_clock x cube_efficiency)",
                m.cube_flops,
            ),
            (
                "int8 cube rate (cube_int8_flops_per_cycle x aic_clock x cube_efficiency)",
                m.cube_flops_int8,
            ),
            ("cube peak (cube_flops_per_cycle x aic_clock)", m.cube_peak),
            ("vector rate (vector_bytes_per_cycle x aiv_clock)", m.vector_bytes),
            ("AIC HBM rate (core_hbm_rate x aic_clock)", m.core_hbm[AIC]),
            ("AIV HBM rate (core_hbm_rate x aiv_clock)", m.core_hbm[AIV]),
            ("AIC L2 read rate (core_l2_read_rate x aic_clock)", m.core_l2_read[AIC]),
            ("AIV L2 read rate (core_l2_read_rate x aiv_clock)", m.core_l2_read[AIV]),
            (
                "AIC L2 write rate (core_l2_write_rate x aic_clock)",
                m.core_l2_write[AIC],
            ),
            (
                "AIV L2 write rate (core_l2_write_rate x aiv_clock)",
                m.core_l2_write[AIV],
            ),
            (
                "link rate (link_bandwidth x link_efficiency)",
                m.topology.port_bandwidth,
            ),
            (
                "pair rate (pair_bandwidth x link_efficiency)",
                m.topology.pair_bandwidth,
            ),
            (
                "cross pair rate (cross_pair_bandwidth x link_efficiency)",
                m.topology.cross_pair_bandwidth,
            ),
            (
                "cross port rate (cross_port_bandwidth x link_efficiency)",
                m.topology.cross_port_bandwidth,
            ),
            (
                "package link rate (package_link_bandwidth x link_efficiency)",
                m.topology.package_bandwidth,
            ),
        ];
        for (what, v) in derived {
            if !v.is_finite() || v <= 0.0 {
                return Err(format!("the device's {what} is {v}: it cannot be simulated"));
            }
        }
        Ok(m)
    }

    pub fn cores_per_rank(&self) -> u32 {
        self.aic_cores + self.aiv_cores
    }

    /// Seconds of compute of `ops` operations on one core of an engine class (`elem`: the
    /// element size in bytes, for the vector unit; `int8`: a cube contraction of two int8
    /// operands).
    pub fn compute_seconds(&self, class: usize, ops: f64, elem: f64, int8: bool) -> f64 {
        if class == AIC {
            ops / if int8 { self.cube_flops_int8 } else { self.cube_flops }
        } else {
            ops * elem.max(1.0) / self.vector_bytes
        }
    }

    /// The fastest rate at which one core of a class reads (L2 or HBM), for lower bounds.
    pub fn best_read_rate(&self, class: usize) -> f64 {
        self.core_l2_read[class].max(self.core_hbm[class])
    }

    /// The derived rates, one per line (for `hpmoe run` and the docs).
    pub fn describe(&self) -> String {
        let g = 1e9;
        let t = &self.topology;
        format!(
            "device model: {} ranks x ({} AIC + {} AIV)\n\
             \x20 cube {:.2} TFLOP/s per AIC core sustained ({:.2} peak); vector {:.1} GB/s per AIV core\n\
             \x20 per core: HBM {:.1} GB/s, L2 read {:.1} GB/s, L2 write {:.1} GB/s (AIC); {:.1} / {:.1} / {:.1} (AIV)\n\
             \x20 HBM {:.1} GB/s per die (shared); L2 {:.0} MiB per die\n\
             \x20 fabric: {} dies per package, {} per node; port {:.1} GB/s per rank and direction; pair {:.1} GB/s in a node, {:.1} across (cross port {:.1}, uplinks x{:.2}); package link {:.1}\n\
             \x20 latencies: package {:.2} us, node {:.2} us, across nodes {:.2} us, event {:.2} us, kernel launch {:.2} us, task overhead {:.2} us\n\
             \x20 puts: {:.2} us each, {:.2} us more to a new peer per call; {} in flight per core, {} per die; chunk {:.0} KiB\n",
            self.ranks,
            self.aic_cores,
            self.aiv_cores,
            self.cube_flops / 1e12,
            self.cube_peak / 1e12,
            self.vector_bytes / g,
            self.core_hbm[AIC] / g,
            self.core_l2_read[AIC] / g,
            self.core_l2_write[AIC] / g,
            self.core_hbm[AIV] / g,
            self.core_l2_read[AIV] / g,
            self.core_l2_write[AIV] / g,
            self.hbm_bandwidth / g,
            self.l2_size / 1048576.0,
            t.dies_per_package,
            t.dies_per_node,
            t.port_bandwidth / g,
            t.pair_bandwidth / g,
            t.cross_pair_bandwidth / g,
            t.cross_port_bandwidth / g,
            t.uplink_ratio,
            t.package_bandwidth / g,
            t.package_latency * 1e6,
            t.node_latency * 1e6,
            t.cross_latency * 1e6,
            self.event_latency * 1e6,
            self.kernel_launch * 1e6,
            self.task_overhead * 1e6,
            t.put_overhead * 1e6,
            t.peer_setup * 1e6,
            t.core_puts,
            t.die_puts,
            self.put_chunk_bytes / 1024.0,
        )
    }
}
