//! A first-order cost estimate of a task on an idle device, used by the schedulers to
//! prioritise and place tasks. (The simulator's timing model is richer: contention, L2
//! residency, links.) Roofline: the larger of compute time and memory time, plus the fixed
//! per-task overhead; communication adds link time and latency.

use crate::ir::{DType, Device, Engine, Program, Taskflow};
use crate::lower::TaskGraph;

/// The device rates the estimate needs, in base units.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub cube_flops: f64,
    /// The cube rate on two int8 operands.
    pub cube_flops_int8: f64,
    pub vector_ops: f64,
    pub core_bytes: f64,
    pub link_bytes: f64,
    pub link_latency: f64,
    pub task_overhead: f64,
}

impl Rates {
    pub fn of(d: &Device) -> Rates {
        Rates {
            cube_flops: d.cube_flops_per_cycle() * d.aic_clock() * d.cube_efficiency(),
            cube_flops_int8: d.cube_int8_flops_per_cycle() * d.aic_clock() * d.cube_efficiency(),
            // Vector lanes for 16-bit elements.
            vector_ops: d.vector_bytes_per_cycle() / 2.0 * d.aiv_clock(),
            core_bytes: d.core_l2_read_rate() * d.aiv_clock(),
            link_bytes: d.link_bandwidth() * d.link_efficiency(),
            link_latency: d.link_latency(),
            task_overhead: d.task_overhead(),
        }
    }
}

/// Seconds task `t` takes on an idle core of its engine.
pub fn task_seconds(tf: &Taskflow, g: &TaskGraph, rates: &Rates, t: usize) -> f64 {
    let node = &tf.nodes[g.node[t] as usize];
    let mem = (g.bytes_in[t] as f64 + g.bytes_out[t] as f64) / rates.core_bytes;
    let compute = match node.engine {
        Engine::Aic => {
            let int8 = |i: usize| {
                node.inputs
                    .get(i)
                    .is_some_and(|&x| matches!(tf.tensor(x).dtype, DType::I8 | DType::U8))
            };
            let fast = node
                .body
                .contraction
                .as_ref()
                .is_some_and(|c| int8(c.lhs) && int8(c.rhs));
            g.flops[t] as f64 / if fast { rates.cube_flops_int8 } else { rates.cube_flops }
        }
        Engine::Aiv => g.flops[t] as f64 / rates.vector_ops,
    };
    let comm = if g.remote[t] > 0.0 {
        g.remote[t] as f64 / rates.link_bytes + rates.link_latency
    } else {
        0.0
    };
    rates.task_overhead + compute.max(mem).max(comm)
}

/// Estimates for every task.
pub fn all(program: &Program, tf: &Taskflow, g: &TaskGraph) -> Vec<f64> {
    let rates = Rates::of(&program.device);
    (0..g.len()).map(|t| task_seconds(tf, g, &rates, t)).collect()
}
