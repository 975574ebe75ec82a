//! `:show params | ops | routing | device | tasks | queue | config | source`.

use super::session::{summary, value_text, words, Session};
use hpmoe_dsl::ir::{Engine, Quantity};
use std::fmt::Write as _;

const WHATS: &[&str] = &[
    "params", "ops", "routing", "device", "tasks", "queue", "config", "source",
];
/// Rows `:show tasks` and `:show queue` print unless `limit=` says otherwise.
const DEFAULT_LIMIT: usize = 50;

/// `12.345`: seconds as microseconds.
fn us(x: f64) -> String {
    if x.is_finite() {
        format!("{:.3}", x * 1e6)
    } else {
        "-".to_string()
    }
}

fn quantity(v: f64, q: Quantity) -> String {
    match q {
        Quantity::Bytes => {
            if v >= (1u64 << 30) as f64 {
                format!("{} GiB", v / (1u64 << 30) as f64)
            } else if v >= (1 << 20) as f64 {
                format!("{} MiB", v / (1 << 20) as f64)
            } else if v >= 1024.0 {
                format!("{} KiB", v / 1024.0)
            } else {
                format!("{v} B")
            }
        }
        Quantity::Frequency => format!("{} MHz", v / 1e6),
        Quantity::Time => format!("{} us", v * 1e6),
        Quantity::Bandwidth => format!("{} GB/s", v / 1e9),
        Quantity::BytesPerCycle => format!("{v} B/cycle"),
        Quantity::FlopsPerCycle => format!("{v} flop/cycle"),
        Quantity::Cycles => format!("{v} cycles"),
        Quantity::Count => format!("{v}"),
        Quantity::Ratio => format!("{v}"),
    }
}

/// Parses `key=value` filters.
fn filters<'a>(args: &'a [String], allowed: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut out = Vec::new();
    for a in args {
        let Some((k, v)) = a.split_once('=') else {
            return Err(format!(
                "`{a}` is not a filter; the filters are {}",
                allowed.iter().map(|k| format!("{k}=")).collect::<Vec<_>>().join(" ")
            ));
        };
        if !allowed.contains(&k) {
            let hint = match hpmoe_dsl::suggest::closest(k, allowed.iter().copied()) {
                Some(b) => format!("did you mean `{b}=`?"),
                None => format!(
                    "the filters are {}",
                    allowed.iter().map(|k| format!("{k}=")).collect::<Vec<_>>().join(" ")
                ),
            };
            return Err(format!("unknown filter `{k}=`: {hint}"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn number(k: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>().map_err(|_| format!("{k}={v}: `{v}` is not a number"))
}

/// Parses a core of a rank: `aic3`, `aiv17` or an index (cube cores first).
fn parse_core(s: &str, aic: u32, aiv: u32) -> Result<u32, String> {
    let err = || {
        format!(
            "`{s}` is not a core: write aic0..aic{} or aiv0..aiv{} (or an index below {})",
            aic.saturating_sub(1),
            aiv.saturating_sub(1),
            aic + aiv
        )
    };
    let (base, limit, num) = if let Some(n) = s.strip_prefix("aic") {
        (0, aic, n)
    } else if let Some(n) = s.strip_prefix("aiv") {
        (aic, aiv, n)
    } else {
        (0, aic + aiv, s)
    };
    let i: u32 = num.parse().map_err(|_| err())?;
    if i >= limit {
        return Err(err());
    }
    Ok(base + i)
}

impl Session {
    pub(crate) fn show(&mut self, rest: &str) -> Result<(), ()> {
        let args = words(rest);
        let (what, more) = match args.split_first() {
            Some((w, m)) => (w.as_str(), m),
            None => ("config", &[][..]),
        };
        let matches: Vec<&str> = WHATS.iter().copied().filter(|w| w.starts_with(what)).collect();
        let what = match (WHATS.contains(&what), matches.as_slice()) {
            (true, _) => what,
            (false, [one]) => one,
            _ => {
                let hint = match hpmoe_dsl::suggest::closest(what, WHATS.iter().copied()) {
                    Some(b) => format!("did you mean `{b}`?"),
                    None => format!("use one of {}", WHATS.join(", ")),
                };
                self.error(&format!("cannot show `{what}`: {hint}"));
                return Err(());
            }
        };
        let no_args = |s: &mut Session| -> Result<(), ()> {
            if more.is_empty() {
                Ok(())
            } else {
                s.error(&format!("`:show {what}` takes no arguments"));
                Err(())
            }
        };
        match what {
            "params" => {
                no_args(self)?;
                self.show_params()
            }
            "ops" => self.show_ops(more),
            "routing" => {
                no_args(self)?;
                self.show_routing()
            }
            "device" => {
                no_args(self)?;
                self.show_device()
            }
            "tasks" => self.show_tasks(more),
            "queue" => self.show_queue(more),
            "source" => {
                no_args(self)?;
                let text = self.buffer.to_string();
                if text.trim().is_empty() {
                    self.say("(the session is empty)");
                } else {
                    self.say_block(&text);
                }
                Ok(())
            }
            _ => {
                no_args(self)?;
                self.show_config();
                Ok(())
            }
        }
    }

    fn show_config(&mut self) {
        let mut s = String::new();
        match &self.file {
            Some(f) => {
                let _ = write!(s, "file: {}", f.display());
            }
            None => s.push_str("file: none"),
        }
        if self.edits > 0 {
            let _ = write!(
                s,
                " (+{} typed definition{})",
                self.edits,
                if self.edits == 1 { "" } else { "s" }
            );
        }
        s.push('\n');
        let _ = writeln!(s, "settings: {}", self.settings_text());
        if let Some(p) = self.current_program() {
            let _ = writeln!(s, "program: {}", summary(&p));
            for tf in &p.taskflows {
                let spec = self.spec_for(&p, &tf.name, self.view_policy);
                let from = match (self.view_policy, self.settings.policy) {
                    (Some(_), _) => "the last :run",
                    (None, Some(_)) => ":set policy",
                    (None, None) if p.schedule_for(&tf.name).is_some() => "the program's schedule",
                    (None, None) => "the default",
                };
                let _ = writeln!(s, "policy of {}: {} (from {from})", tf.name, spec.policy.name());
            }
        } else if !(self.buffer.trim().is_empty() && self.file.is_none()) {
            s.push_str("program: does not check (`:run` shows the errors)\n");
        }
        self.say_block(&s);
    }

    fn show_params(&mut self) -> Result<(), ()> {
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        let w = p.params.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut s = String::from("params:\n");
        if p.params.is_empty() {
            s.push_str("  (none)\n");
        }
        for (k, v) in &p.params {
            let set = self.settings.overrides.iter().any(|(n, _)| n == k);
            let _ = writeln!(s, "  {k:<w$} = {v}{}", if set { "  (set)" } else { "" });
        }
        let dev: Vec<String> = self
            .settings
            .overrides
            .iter()
            .filter(|(k, _)| k.starts_with("device."))
            .map(|(k, o)| format!("{k} = {}", value_text(&o.value)))
            .collect();
        if !dev.is_empty() {
            let _ = writeln!(s, "device settings: {}", dev.join(", "));
        }
        self.say_block(&s);
        Ok(())
    }

    fn show_ops(&mut self, more: &[String]) -> Result<(), ()> {
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        match more {
            [] => {
                let w = p.ops.iter().map(|o| o.name.len()).max().unwrap_or(0);
                let mut s = String::from("ops:\n");
                for o in &p.ops {
                    let _ = writeln!(s, "  {:<w$}  {}", o.name, o.signature);
                    if let Some(d) = o.docs.first() {
                        let _ = writeln!(s, "  {:<w$}  /// {}", "", d.trim());
                    }
                }
                s.push_str("(`:show ops NAME` for one op's whole doc comment)\n");
                self.say_block(&s);
                Ok(())
            }
            [name] => match p.ops.iter().find(|o| &o.name == name) {
                Some(o) => {
                    let mut s = String::new();
                    for d in &o.docs {
                        let _ = writeln!(s, "/// {d}");
                    }
                    let _ = writeln!(s, "{}", o.signature);
                    let used: Vec<String> = p
                        .taskflows
                        .iter()
                        .flat_map(|t| {
                            t.nodes
                                .iter()
                                .filter(|n| p.op(n.op).name == o.name)
                                .map(move |n| format!("`{}` in {}", n.name, t.name))
                        })
                        .collect();
                    if !used.is_empty() {
                        let _ = writeln!(s, "called as {}", used.join(", "));
                    }
                    self.say_block(&s);
                    Ok(())
                }
                None => {
                    let hint = match hpmoe_dsl::suggest::closest(name, p.ops.iter().map(|o| o.name.as_str())) {
                        Some(b) => format!("did you mean `{b}`?"),
                        None => "`:show ops` lists them".to_string(),
                    };
                    self.error(&format!("no op `{name}` in the program: {hint}"));
                    Err(())
                }
            },
            _ => {
                self.error("usage: :show ops [NAME]");
                Err(())
            }
        }
    }

    fn show_routing(&mut self) -> Result<(), ()> {
        let v = self.view(false, false)?;
        let g = &v.compiled().graph;
        let mut s = String::new();
        for (spec, l) in v.program.routes.iter().zip(g.layouts.iter()) {
            let Some(l) = l else {
                let _ = writeln!(s, "route {}: not used by {}", spec.name, v.taskflow().name);
                continue;
            };
            let recv = l.routing.recv_counts();
            let experts = l.routing.expert_counts();
            let stats = hpmoe_dsl::route::count_stats;
            let (rmin, rmax, rmean) = stats(&recv);
            let (emin, emax, emean) = stats(&experts);
            let _ = writeln!(
                s,
                "route {} = {}: {} ranks x {} tokens x top-{} over {} experts ({} per rank); window {} rows",
                spec.name,
                kind_text(&v.program, &spec.kind),
                spec.ranks,
                spec.tokens,
                spec.topk,
                spec.experts,
                spec.local_experts(),
                spec.capacity
            );
            let _ = writeln!(
                s,
                "  rows received per rank: min {rmin}, max {rmax}, mean {rmean:.1}, max/mean {:.3}",
                rmax as f64 / rmean.max(1e-9)
            );
            let _ = writeln!(
                s,
                "  rows per expert: min {emin}, max {emax}, mean {emean:.1}, max/mean {:.3}",
                emax as f64 / emean.max(1e-9)
            );
            let show = |x: &[u64]| x.iter().map(|y| y.to_string()).collect::<Vec<_>>().join(" ");
            let _ = writeln!(s, "  per rank:   {}", show(&recv));
            if experts.len() <= 64 {
                let _ = writeln!(s, "  per expert: {}", show(&experts));
            }
        }
        if v.program.routes.is_empty() {
            s.push_str("the program has no routing\n");
        }
        self.say_block(&s);
        Ok(())
    }

    fn show_device(&mut self) -> Result<(), ()> {
        let c = self.program()?;
        let Some(p) = c.program.clone() else { return Err(()) };
        let mut s = format!("device {} ({} ranks)\n", p.device.profile, p.device.ranks());
        match hpmoe_sim::model::DeviceModel::new(&p.device) {
            Ok(m) => s.push_str(&m.describe()),
            Err(e) => {
                let _ = writeln!(s, "  (the model rejects this device: {e})");
            }
        }
        s.push_str("fields (`:set device.NAME = VALUE [UNIT]`):\n");
        let mut fields: Vec<hpmoe_dsl::ir::FieldValue> = p.device.fields().collect();
        fields.sort_by_key(|f| f.spec.name);
        let w = fields.iter().map(|f| f.spec.name.len()).max().unwrap_or(0);
        for f in &fields {
            let k = f.spec.name;
            let set = self
                .settings
                .overrides
                .iter()
                .any(|(n, _)| n.strip_prefix("device.") == Some(k));
            let _ = writeln!(
                s,
                "  {k:<w$} = {}{}",
                quantity(f.value, f.spec.quantity),
                if set { "  (set)" } else { "" }
            );
        }
        self.say_block(&s);
        Ok(())
    }

    fn show_tasks(&mut self, more: &[String]) -> Result<(), ()> {
        let fs = match filters(more, &["call", "rank", "engine", "limit"]) {
            Ok(f) => f,
            Err(e) => {
                self.error(&e);
                return Err(());
            }
        };
        let v = self.view(true, false)?;
        let tf = v.taskflow();
        let (mut call, mut rank, mut engine, mut limit) = (None, None, None, DEFAULT_LIMIT);
        for (k, val) in fs {
            let res: Result<(), String> = match k {
                "call" => match tf.nodes.iter().position(|n| n.name == val) {
                    Some(i) => {
                        call = Some(i as u32);
                        Ok(())
                    }
                    None => {
                        let names: Vec<&str> = tf.nodes.iter().map(|n| n.name.as_str()).collect();
                        Err(match hpmoe_dsl::suggest::closest(val, names.iter().copied()) {
                            Some(b) => format!("`{}` has no call `{val}`: did you mean `{b}`?", tf.name),
                            None => format!("`{}` has no call `{val}`: the calls are {}", tf.name, names.join(", ")),
                        })
                    }
                },
                "rank" => number(k, val).and_then(|r| {
                    if r >= v.compiled().graph.ranks as u64 {
                        Err(format!("rank={r}: the device has {} ranks", v.compiled().graph.ranks))
                    } else {
                        rank = Some(r as u32);
                        Ok(())
                    }
                }),
                "engine" => match Engine::parse(val) {
                    Some(e) => {
                        engine = Some(e);
                        Ok(())
                    }
                    None => Err(format!("engine={val}: the engines are aic and aiv")),
                },
                _ => number(k, val).map(|n| limit = if n == 0 { usize::MAX } else { n as usize }),
            };
            if let Err(e) = res {
                self.error(&e);
                return Err(());
            }
        }
        let g = &v.compiled().graph;
        let s = &v.compiled().schedule;
        let Some(sim) = v.sim.as_ref() else { return Err(()) };
        let r = &sim.sim.result;
        let matching: Vec<usize> = (0..g.len())
            .filter(|&t| call.is_none_or(|c| g.node[t] == c))
            .filter(|&t| rank.is_none_or(|x| g.rank[t] == x))
            .filter(|&t| engine.is_none_or(|e| g.engine(tf, t) == e))
            .collect();
        let mut out = format!(
            "{} under {}: {} of {} tasks match",
            tf.name,
            v.spec().policy.name(),
            matching.len(),
            g.len()
        );
        if matching.len() > limit {
            let _ = write!(out, "; the first {limit} (limit=N for more, limit=0 for all)");
        }
        out.push('\n');
        let cw = tf.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
        let ow = tf
            .nodes
            .iter()
            .map(|n| v.program.op(n.op).name.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let _ = writeln!(
            out,
            "  {:>7} {:>4} {:<cw$} {:<ow$} {:<6} {:<6} {:>12} {:>12}  tile",
            "task", "rank", "call", "op", "engine", "core", "start us", "end us"
        );
        for &t in matching.iter().take(limit) {
            let node = &tf.nodes[g.node[t] as usize];
            let _ = writeln!(
                out,
                "  {:>7} {:>4} {:<cw$} {:<ow$} {:<6} {:<6} {:>12} {:>12}  {}",
                t,
                g.rank[t],
                node.name,
                v.program.op(node.op).name,
                node.engine.name(),
                s.core_name(s.core[t]),
                us(r.start[t]),
                us(r.end[t]),
                hpmoe_sim::trace::tile_text(g, t)
            );
        }
        self.say_block(&out);
        Ok(())
    }

    fn show_queue(&mut self, more: &[String]) -> Result<(), ()> {
        let (rank, core, rest) = match more {
            [r, c, rest @ ..] => (r.clone(), c.clone(), rest),
            _ => {
                self.error("usage: :show queue RANK CORE [limit=N]  (CORE: aic3, aiv17 or an index)");
                return Err(());
            }
        };
        let mut limit = DEFAULT_LIMIT;
        match filters(rest, &["limit"]) {
            Ok(fs) => {
                for (k, val) in fs {
                    match number(k, val) {
                        Ok(n) => limit = if n == 0 { usize::MAX } else { n as usize },
                        Err(e) => {
                            self.error(&e);
                            return Err(());
                        }
                    }
                }
            }
            Err(e) => {
                self.error(&e);
                return Err(());
            }
        }
        let v = self.view(true, false)?;
        let g = &v.compiled().graph;
        let s = &v.compiled().schedule;
        let rank: u32 = match rank.parse::<u32>() {
            Ok(r) if r < g.ranks => r,
            _ => {
                self.error(&format!(
                    "`{rank}` is not a rank: the device has ranks 0..{}",
                    g.ranks.saturating_sub(1)
                ));
                return Err(());
            }
        };
        let local = match parse_core(&core, s.aic_cores, s.aiv_cores) {
            Ok(c) => c,
            Err(e) => {
                self.error(&e);
                return Err(());
            }
        };
        let c = rank * s.cores_per_rank() + local;
        let Some(sim) = v.sim.as_ref() else { return Err(()) };
        let r = &sim.sim.result;
        let tf = v.taskflow();
        let queue = s.queues.row(c as usize);
        let busy: f64 = queue.iter().map(|&t| r.end[t as usize] - r.start[t as usize]).sum();
        let mut out = format!(
            "queue {} of rank {rank} ({} under {}): {} task{}, busy {} us of {} us",
            s.core_name(c),
            tf.name,
            v.spec().policy.name(),
            queue.len(),
            if queue.len() == 1 { "" } else { "s" },
            us(busy),
            us(r.makespan)
        );
        if queue.len() > limit {
            let _ = write!(out, "; the first {limit} (limit=N for more, limit=0 for all)");
        }
        out.push('\n');
        let cw = tf.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
        let _ = writeln!(
            out,
            "  {:>5} {:>7} {:<cw$} {:>12} {:>12} {:>10}  waits on",
            "pos", "task", "call", "start us", "end us", "idle us"
        );
        let mut prev_end = sim.sim.workload.start_time;
        for (i, &t) in queue.iter().enumerate().take(limit) {
            let t = t as usize;
            let node = &tf.nodes[g.node[t] as usize];
            let waits: Vec<String> = s
                .waits
                .row(t)
                .iter()
                .map(|&k| {
                    let k = k as usize;
                    let what = if k >= g.counters.len() { "barrier" } else { "counter" };
                    format!(
                        "{what} {k} ({} signals, ready {} us)",
                        s.threshold[k],
                        us(r.counter_time[k])
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  {:>5} {:>7} {:<cw$} {:>12} {:>12} {:>10}  {}",
                i,
                t,
                node.name,
                us(r.start[t]),
                us(r.end[t]),
                us((r.start[t] - prev_end).max(0.0)),
                if waits.is_empty() {
                    "-".to_string()
                } else {
                    waits.join(", ")
                }
            );
            prev_end = r.end[t];
        }
        if queue.is_empty() {
            out.push_str("  (no task runs on this core)\n");
        }
        self.say_block(&out);
        Ok(())
    }
}

fn kind_text(p: &hpmoe_dsl::ir::Program, k: &hpmoe_dsl::ir::RouteKind) -> String {
    use hpmoe_dsl::ir::RouteKind as K;
    match k {
        K::ByRank { of } => format!("by_rank({})", p.route(*of).name),
        K::Fanout { of } => format!("fanout({})", p.route(*of).name),
        K::Balanced => "balanced".to_string(),
        K::Uniform { seed } => format!("uniform(seed: {seed})"),
        K::Zipf { s, seed } => format!("zipf(s: {s}, seed: {seed})"),
        K::Hotspot { max_over_mean, seed } => format!("hotspot(max_over_mean: {max_over_mean}, seed: {seed})"),
        K::File { path, .. } => format!("file({path:?})"),
        K::Router(r) => format!(
            "router(score: {}, n_group: {}, topk_group: {}, {})",
            match r.score {
                hpmoe_dsl::ir::ScoreFn::Softmax => "softmax",
                hpmoe_dsl::ir::ScoreFn::Sigmoid => "sigmoid",
            },
            r.n_group,
            r.topk_group,
            r.logits
                .as_ref()
                .map_or(format!("seed: {}", r.seed), |p| format!("logits: {p:?}"))
        ),
    }
}
