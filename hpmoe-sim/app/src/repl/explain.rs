//! `:explain TASK`: why a task started when it did. From the task back to the start of the
//! run, each link is what the task waited for last:
//!
//! - a dependency: the counter it waited on that became ready last, and among the tasks that
//!   signal it, the one whose signal arrived last (over the link when it came from another
//!   rank; a kernel barrier adds the kernel launch);
//! - a busy core: the previous task of its core's queue, which ended after every counter it
//!   waited on was ready;
//! - the start: the first task of a core, at the kernel launch.
//!
//! A task starts at the later of its core becoming free and its last counter becoming ready
//! (that is the simulator's rule), so the chain is exact, and it ends: every link goes to a
//! task that ended no later than the one before started, along the verified, acyclic union of
//! dependencies and queue order.

use super::session::{words, Session};
use hpmoe_dsl::verify::describe;
use std::fmt::Write as _;

/// Links printed unless `all` is given.
const MAX_LINKS: usize = 60;
/// Runs of busy-core links longer than this are folded.
const FOLD: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Why {
    Dependency {
        counter: usize,
        from: usize,
        /// When the counter was ready (after any launch delay).
        ready: f64,
        latency: f64,
        remote: bool,
        delay: f64,
        /// What the counter is: a dependency counter, a step of a pairwise AllToAll or a
        /// kernel barrier.
        what: &'static str,
    },
    Core {
        prev: usize,
    },
    Start {
        at: f64,
    },
}

fn us(x: f64) -> String {
    format!("{:.3}", x * 1e6)
}

impl Session {
    pub(crate) fn explain(&mut self, rest: &str) -> Result<(), ()> {
        let args = words(rest);
        let mut all = false;
        let mut which: Option<String> = None;
        for a in args {
            if a == "all" {
                all = true;
            } else if which.is_none() {
                which = Some(a);
            } else {
                self.error("usage: :explain [TASK | last] [all]");
                return Err(());
            }
        }
        let v = self.view(true, false)?;
        let (program, tf) = (&v.program, v.taskflow());
        let g = &v.compiled().graph;
        let s = &v.compiled().schedule;
        let Some(run) = v.sim.clone() else { return Err(()) };
        let (r, w, m) = (&run.sim.result, &run.sim.workload, &run.sim.model);
        let n = g.len();
        if n == 0 {
            self.error(&format!("`{}` has no tasks", tf.name));
            return Err(());
        }
        let last = (0..n)
            .max_by(|&a, &b| r.end[a].total_cmp(&r.end[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        let target = match which.as_deref() {
            None | Some("last") => last,
            Some(x) => match x.parse::<usize>() {
                Ok(t) if t < n => t,
                _ => {
                    self.error(&format!(
                        "`{x}` is not a task of `{}`: the tasks are 0..{} (`:show tasks` lists them; `last` is the task that ended last)",
                        tf.name,
                        n - 1
                    ));
                    return Err(());
                }
            },
        };
        let signallers = run.signallers(s);
        let positions = run.positions(s);
        // The chain, from the target back to the start.
        let mut chain: Vec<(usize, Why)> = Vec::new();
        let mut t = target;
        for _ in 0..=n {
            let c = s.core[t] as usize;
            let pos = positions[t] as usize;
            let prev = (pos > 0).then(|| s.queues.row(c)[pos - 1] as usize);
            let core_free = prev.map_or(w.start_time, |q| r.end[q]);
            let mut best: Option<(usize, f64)> = None;
            for &k in s.waits.row(t) {
                let k = k as usize;
                let ready = r.counter_time[k];
                if signallers.row(s, k).next().is_some() && best.is_none_or(|(_, b)| ready > b) {
                    best = Some((k, ready));
                }
            }
            let why = match best {
                Some((k, ready)) if ready >= core_free => {
                    let lat = |p: usize| {
                        if s.counter_rank.get(k).copied() != Some(g.rank[p]) {
                            (m.link_latency, true)
                        } else {
                            (m.event_latency, false)
                        }
                    };
                    let from = signallers
                        .row(s, k)
                        .map(|p| p as usize)
                        .max_by(|&a, &b| (r.end[a] + lat(a).0).total_cmp(&(r.end[b] + lat(b).0)).then(b.cmp(&a)))
                        .unwrap_or(0);
                    let (latency, remote) = lat(from);
                    Why::Dependency {
                        counter: k,
                        from,
                        ready,
                        latency,
                        remote,
                        delay: w.delay.get(k).copied().unwrap_or(0.0),
                        what: if k < g.counters.len() {
                            "counter"
                        } else if hpmoe_dsl::schedule::collective::step_counters(g, s).contains(&k) {
                            "AllToAll step counter"
                        } else {
                            "kernel barrier"
                        },
                    }
                }
                _ => match prev {
                    Some(q) => Why::Core { prev: q },
                    None => Why::Start { at: w.start_time },
                },
            };
            chain.push((t, why));
            t = match why {
                Why::Dependency { from, .. } => from,
                Why::Core { prev } => prev,
                Why::Start { .. } => break,
            };
        }
        // Print, folding long runs of one busy core.
        let core_of = |t: usize| format!("{} of rank {}", s.core_name(s.core[t]), s.core_rank(s.core[t]));
        let task_line = |t: usize| -> String {
            let mut line = format!(
                "{} on {}: {} -> {} us",
                describe(program, tf, g, t),
                core_of(t),
                us(r.start[t]),
                us(r.end[t])
            );
            let flows = w.task_flows(t);
            if !flows.is_empty() {
                let bytes: f64 = w.flow_bytes[flows.clone()].iter().sum();
                let mut dests: Vec<u32> = w.flow_dst[flows.clone()].to_vec();
                dests.sort_unstable();
                dests.dedup();
                let left = r.flow_end[flows]
                    .iter()
                    .copied()
                    .filter(|x| x.is_finite())
                    .fold(0.0, f64::max);
                let _ = write!(
                    line,
                    "; puts {:.3} MB to {} rank(s), the last left at {} us",
                    bytes / 1e6,
                    dests.len(),
                    us(left)
                );
            }
            line
        };
        let why_line = |t: usize, why: &Why| -> String {
            match *why {
                Why::Dependency {
                    counter,
                    from,
                    ready,
                    latency,
                    remote,
                    delay,
                    what,
                } => {
                    let mut l = format!(
                        "<- dependency: waited for {what} {counter} (rank {}, {} signal{}), ready at {} us; the last signal came from task {from}, which ended at {} us",
                        s.counter_rank.get(counter).copied().unwrap_or(0),
                        s.threshold.get(counter).copied().unwrap_or(0),
                        if s.threshold.get(counter) == Some(&1) { "" } else { "s" },
                        us(ready),
                        us(r.end[from])
                    );
                    if remote {
                        let _ = write!(
                            l,
                            ", over the link from rank {} (+{} us link latency)",
                            g.rank[from],
                            us(latency)
                        );
                    } else {
                        let _ = write!(l, " (+{} us event latency)", us(latency));
                    }
                    if delay > 0.0 {
                        let _ = write!(l, " and the next kernel's launch (+{} us)", us(delay));
                    }
                    l
                }
                Why::Core { prev } => format!(
                    "<- busy core: {} ran task {prev} until {} us",
                    s.core_name(s.core[t]),
                    us(r.end[prev])
                ),
                Why::Start { at } => {
                    format!(
                        "<- start: the first task of {}, at the kernel launch ({} us)",
                        core_of(t),
                        us(at)
                    )
                }
            }
        };
        let mut out = String::new();
        if which.is_none() || which.as_deref() == Some("last") {
            let _ = writeln!(
                out,
                "the last task to end is task {target} (at {} us)",
                us(r.end[target])
            );
        }
        let _ = writeln!(
            out,
            "why task {target} started at {} us ({} under {}):",
            us(r.start[target]),
            tf.name,
            v.spec().policy.name()
        );
        let mut printed = 0usize;
        let mut i = 0usize;
        let mut cut = false;
        while i < chain.len() {
            if !all && printed >= MAX_LINKS {
                cut = true;
                break;
            }
            let (t, why) = chain[i];
            let _ = writeln!(out, "  {}", task_line(t));
            let _ = writeln!(out, "      {}", why_line(t, &why));
            printed += 1;
            if matches!(why, Why::Core { .. }) {
                let mut j = i;
                while j + 1 < chain.len() && matches!(chain[j + 1].1, Why::Core { .. }) {
                    j += 1;
                }
                if j - i >= FOLD {
                    let folded = j - i - 1;
                    let (a, b) = (chain[i + 1].0, chain[j - 1].0);
                    let _ = writeln!(
                        out,
                        "  ... {folded} more tasks of {} ran back to back, {} -> {} us (tasks {a} back to {b})",
                        core_of(t),
                        us(r.start[b]),
                        us(r.end[a])
                    );
                    i = j;
                    continue;
                }
            }
            i += 1;
        }
        if cut {
            let _ = writeln!(
                out,
                "  ... {} more links to the start (`:explain {target} all` prints every link)",
                chain.len() - i
            );
        }
        let deps = chain
            .iter()
            .filter(|(_, w)| matches!(w, Why::Dependency { .. }))
            .count();
        let remote = chain
            .iter()
            .filter(|(_, w)| matches!(w, Why::Dependency { remote: true, .. }))
            .count();
        let core = chain.iter().filter(|(_, w)| matches!(w, Why::Core { .. })).count();
        let start = chain.last().map_or(w.start_time, |&(t, _)| r.start[t]);
        let _ = writeln!(
            out,
            "chain: {} back to the start at {} us: {deps} dependenc{} ({remote} over the link), {core} busy core",
            if chain.len() == 1 {
                "1 link".to_string()
            } else {
                format!("{} links", chain.len())
            },
            us(start),
            if deps == 1 { "y" } else { "ies" }
        );
        self.say_block(&out);
        Ok(())
    }
}
