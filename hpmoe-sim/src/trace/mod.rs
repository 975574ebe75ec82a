//! Chrome trace event JSON (opens in Perfetto and chrome://tracing): a simulated schedule in;
//! a trace out.
//!
//! - one process per rank (`pid` = rank) and one named thread per core (`tid` = the core's
//!   index on its rank, cube cores first), from `M` metadata events;
//! - one complete event (`X`) per task, named after its op call, with the op, call, tile,
//!   rank, task id and L2 bytes in `args`;
//! - flow events (`s` → `f`) from each put to the first task that waited for the counter it
//!   signalled on the destination rank;
//! - counter tracks (`C`) per rank: HBM throughput and link egress/ingress throughput, in
//!   GB/s.
//!
//! A [`Filter`] keeps big runs small: only some ranks, only tasks that overlap a time
//! window. Timestamps are microseconds with nanosecond precision; output is deterministic.

use crate::sim::{SimResult, Workload};
use hpmoe_dsl::ir::{Program, Taskflow};
use hpmoe_dsl::lower::{DimKind, TaskGraph};
use hpmoe_dsl::schedule::Schedule;
use std::io::{self, Write};

/// Which part of a run to draw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Ranks to keep (all when `None`).
    pub ranks: Option<Vec<u32>>,
    /// Keep what overlaps `start..end` (seconds).
    pub window: Option<(f64, f64)>,
}

impl Filter {
    /// Parses `0,3` or `0-3,8` into ranks (sorted; a rank named twice is an error).
    pub fn parse_ranks(s: &str) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let num = |x: &str| {
                x.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("`{x}` is not a rank number"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if b < a {
                        return Err(format!("`{part}` is an empty range"));
                    }
                    if b - a > 1 << 16 {
                        return Err(format!("`{part}` is too large a range"));
                    }
                    out.extend(a..=b);
                }
                None => out.push(num(part)?),
            }
        }
        if out.is_empty() {
            return Err(format!("`{s}` names no rank"));
        }
        out.sort_unstable();
        if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("`{s}` names rank {} twice", w[0]));
        }
        Ok(out)
    }

    /// Parses `START..END` in microseconds (either end may be left out) into seconds.
    pub fn parse_window(s: &str) -> Result<(f64, f64), String> {
        let (a, b) = s
            .split_once("..")
            .ok_or_else(|| format!("`{s}` is not of the form START..END (microseconds)"))?;
        let num = |x: &str, d: f64| -> Result<f64, String> {
            let x = x.trim();
            if x.is_empty() {
                return Ok(d);
            }
            match x.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * 1e-6),
                _ => Err(format!("`{x}` is not a time in microseconds")),
            }
        };
        let (a, b) = (num(a, 0.0)?, num(b, f64::INFINITY)?);
        if b <= a {
            return Err(format!("`{s}` is an empty window"));
        }
        Ok((a, b))
    }

    pub fn keeps_rank(&self, r: u32) -> bool {
        self.ranks.as_ref().is_none_or(|v| v.binary_search(&r).is_ok())
    }
    pub fn keeps_span(&self, a: f64, b: f64) -> bool {
        self.window.is_none_or(|(lo, hi)| b >= lo && a <= hi)
    }
    pub fn keeps_time(&self, t: f64) -> bool {
        self.window.is_none_or(|(lo, hi)| t >= lo && t <= hi)
    }
}

/// `t 0..128 (expert 3), h 0..7168`.
pub fn tile_text(g: &TaskGraph, t: usize) -> String {
    let nt = &g.nodes[g.node[t] as usize];
    let parts: Vec<String> = nt
        .dims
        .iter()
        .zip(g.chunks(t))
        .map(|(d, c)| match d.kind {
            DimKind::Send { .. } => format!("{} {}..{} (expert {})", d.name, c.lo, c.hi, c.group),
            DimKind::Recv(_) => format!("{} {}..{} (local expert {})", d.name, c.lo, c.hi, c.group),
            DimKind::Range { .. } => format!("{} {}..{}", d.name, c.lo, c.hi),
        })
        .collect();
    parts.join(", ")
}

/// A time in whole nanoseconds (the trace's resolution). Start and end of a slice are rounded
/// separately, so slices that follow each other on a core never overlap after rounding.
fn ns(x: f64) -> i64 {
    (x * 1e9).round() as i64
}

/// Nanoseconds as the trace's microseconds, with exactly three decimals (`12.345`).
fn us_ns(n: i64) -> Json {
    let text = if n < 0 {
        format!("-{}.{:03}", (-n) / 1000, (-n) % 1000)
    } else {
        format!("{}.{:03}", n / 1000, n % 1000)
    };
    raw(text)
}

fn us(x: f64) -> Json {
    us_ns(ns(x))
}

/// A number already formatted (fixed decimals), passed through as it is.
fn raw(text: String) -> Json {
    match serde_json::value::RawValue::from_string(text) {
        Ok(r) => Json::Raw(r),
        Err(_) => Json::Value(serde_json::Value::Null),
    }
}

/// An event field: a JSON value, a number with fixed decimals, or an object of such fields.
#[derive(Debug)]
enum Json {
    Value(serde_json::Value),
    Raw(Box<serde_json::value::RawValue>),
    Map(Vec<(&'static str, Json)>),
}

impl serde::Serialize for Json {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Json::Value(v) => v.serialize(s),
            Json::Raw(r) => r.serialize(s),
            Json::Map(fields) => {
                let mut m = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl<T: Into<serde_json::Value>> From<T> for Json {
    fn from(v: T) -> Json {
        Json::Value(v.into())
    }
}

/// Writes one event object with serde_json (the fields in the given order).
fn write_event(out: &mut dyn Write, fields: &[(&str, Json)]) -> io::Result<()> {
    use serde::ser::{SerializeMap, Serializer};
    let mut ser = serde_json::Serializer::new(out);
    let mut map = ser.serialize_map(Some(fields.len())).map_err(io::Error::other)?;
    for (k, v) in fields {
        map.serialize_entry(k, v).map_err(io::Error::other)?;
    }
    map.end().map_err(io::Error::other)
}

/// Everything a trace or a chart needs about a run.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    pub program: &'a Program,
    pub tf: &'a Taskflow,
    pub graph: &'a TaskGraph,
    pub schedule: &'a Schedule,
    pub workload: &'a Workload,
    pub result: &'a SimResult,
}

/// Writes the trace.
pub fn write(out: &mut dyn Write, run: &Run, filter: &Filter) -> io::Result<()> {
    let (program, tf, g, s, w, r) = (run.program, run.tf, run.graph, run.schedule, run.workload, run.result);
    let cpr = s.cores_per_rank();
    let mut first = true;
    let mut ev = |out: &mut dyn Write, fields: Vec<(&str, Json)>| -> io::Result<()> {
        if first {
            first = false;
            out.write_all(b"\n")?;
        } else {
            out.write_all(b",\n")?;
        }
        write_event(out, &fields)
    };
    let meta = |rank: u32, tid: u32, name: &'static str, args: serde_json::Value| {
        vec![
            ("ph", "M".into()),
            ("pid", rank.into()),
            ("tid", tid.into()),
            ("name", name.into()),
            ("args", args.into()),
        ]
    };
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"otherData\":")?;
    write_event(
        out,
        &[
            ("taskflow", tf.name.as_str().into()),
            ("policy", s.policy.policy.name().into()),
            ("latency_us", us(r.makespan)),
        ],
    )?;
    out.write_all(b",\"traceEvents\":[")?;
    // Metadata: processes and threads.
    for rank in 0..g.ranks {
        if !filter.keeps_rank(rank) {
            continue;
        }
        ev(
            out,
            meta(
                rank,
                0,
                "process_name",
                serde_json::json!({"name": format!("rank {rank}")}),
            ),
        )?;
        ev(
            out,
            meta(rank, 0, "process_sort_index", serde_json::json!({"sort_index": rank})),
        )?;
        for l in 0..cpr {
            let name = s.core_name(rank * cpr + l);
            ev(out, meta(rank, l, "thread_name", serde_json::json!({"name": name})))?;
            ev(
                out,
                meta(rank, l, "thread_sort_index", serde_json::json!({"sort_index": l})),
            )?;
        }
    }
    // Tasks.
    let kept = |t: usize| filter.keeps_rank(g.rank[t]) && filter.keeps_span(r.start[t], r.end[t]);
    for t in 0..g.len() {
        if !kept(t) {
            continue;
        }
        let node = &tf.nodes[g.node[t] as usize];
        let op = &program.op(node.op).name;
        let core = s.core[t];
        let (ts, te) = (ns(r.start[t]), ns(r.end[t]));
        ev(
            out,
            vec![
                ("ph", "X".into()),
                ("pid", g.rank[t].into()),
                ("tid", (core % cpr).into()),
                ("ts", us_ns(ts)),
                ("dur", us_ns(te - ts)),
                ("name", node.name.as_str().into()),
                ("cat", op.as_str().into()),
                (
                    "args",
                    Json::Map(vec![
                        ("op", op.as_str().into()),
                        ("call", node.name.as_str().into()),
                        ("tile", tile_text(g, t).into()),
                        ("rank", g.rank[t].into()),
                        ("task", t.into()),
                        ("l2_hit_bytes", r.hit[t].into()),
                        ("hbm_bytes", r.miss[t].into()),
                    ]),
                ),
            ],
        )?;
    }
    // Flows: from a put to the first waiter of each remote dependency counter it signals.
    let graph_counters = s.threshold.len() - s.barriers as usize;
    let mut id = 0u64;
    for t in 0..g.len() {
        if w.task_flows(t).is_empty() || !kept(t) {
            continue;
        }
        for c in s.signals(t) {
            let c = c as usize;
            if c >= graph_counters || s.counter_rank[c] == g.rank[t] {
                continue;
            }
            let Some(&x) = w
                .waiters
                .row(c)
                .iter()
                .min_by(|&&a, &&b| r.start[a as usize].total_cmp(&r.start[b as usize]).then(a.cmp(&b)))
            else {
                continue;
            };
            let x = x as usize;
            if !kept(x) {
                continue;
            }
            id += 1;
            // Inside the put's slice, so the arrow binds to it.
            let (ts, te) = (ns(r.start[t]), ns(r.end[t]));
            let from = (te - 1).max(ts);
            ev(
                out,
                vec![
                    ("ph", "s".into()),
                    ("id", id.into()),
                    ("pid", g.rank[t].into()),
                    ("tid", (s.core[t] % cpr).into()),
                    ("ts", us_ns(from)),
                    ("name", "put".into()),
                    ("cat", "put".into()),
                ],
            )?;
            ev(
                out,
                vec![
                    ("ph", "f".into()),
                    ("bp", "e".into()),
                    ("id", id.into()),
                    ("pid", g.rank[x].into()),
                    ("tid", (s.core[x] % cpr).into()),
                    ("ts", us(r.start[x])),
                    ("name", "put".into()),
                    ("cat", "put".into()),
                ],
            )?;
        }
    }
    // Counter tracks.
    let gbs = |x: f64| raw(format!("{:.3}", x / 1e9));
    for smp in &r.hbm_samples {
        if filter.keeps_rank(smp.rank) && filter.keeps_time(smp.time) {
            ev(
                out,
                vec![
                    ("ph", "C".into()),
                    ("pid", smp.rank.into()),
                    ("ts", us(smp.time)),
                    ("name", "HBM GB/s".into()),
                    ("args", Json::Map(vec![("hbm", gbs(smp.a))])),
                ],
            )?;
        }
    }
    for smp in &r.link_samples {
        if filter.keeps_rank(smp.rank) && filter.keeps_time(smp.time) {
            ev(
                out,
                vec![
                    ("ph", "C".into()),
                    ("pid", smp.rank.into()),
                    ("ts", us(smp.time)),
                    ("name", "link GB/s".into()),
                    ("args", Json::Map(vec![("egress", gbs(smp.a)), ("ingress", gbs(smp.b))])),
                ],
            )?;
        }
    }
    out.write_all(b"\n]}\n")
}

/// The trace as a string.
pub fn to_string(run: &Run, filter: &Filter) -> String {
    let mut v = Vec::new();
    let _ = write(&mut v, run, filter);
    String::from_utf8(v).unwrap_or_default()
}
