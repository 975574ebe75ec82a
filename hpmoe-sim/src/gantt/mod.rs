//! Gantt charts: a simulated schedule and a [`Filter`] in; an SVG out, with one lane per core
//! of the chosen ranks, tasks coloured by op call, a legend and a time axis.
//!
//! Neighbouring tasks of the same call on a lane that would touch at the chart's resolution
//! are drawn as one bar (its tooltip counts them), so a chart of a big run stays small.

use crate::trace::{Filter, Run};
use std::fmt::Write as _;
use std::io::{self, Write};

/// Colour-blind-friendly palette (Tableau 10), one colour per op call.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
];

/// Chart geometry, in pixels.
const WIDTH: f64 = 1600.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const LEGEND_ROW: f64 = 18.0;
const AXIS: f64 = 28.0;
const RANK_GAP: f64 = 10.0;
/// Lane heights between which the chart scales, and the height it aims at.
const LANE_MIN: f64 = 3.0;
const LANE_MAX: f64 = 14.0;
const TARGET_LANES_HEIGHT: f64 = 1000.0;
/// The most ticks on the time axis (a nice step gives about ten).
const MAX_TICKS: usize = 32;
/// Bars closer than this (pixels) merge.
const MERGE_GAP: f64 = 0.5;

/// A step of 1, 2 or 5 times a power of ten close to `span / 10`.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 10.0).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// Escapes text for SVG/XML content and attribute values; characters XML 1.0 cannot hold
/// (control characters other than tab and newlines) become U+FFFD. The one escape of every
/// SVG the tool writes.
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(ch),
            c if c.is_control() => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

fn esc(s: &str) -> String {
    xml_escape(s)
}

/// Writes the chart.
pub fn write(out: &mut dyn Write, run: &Run, filter: &Filter) -> io::Result<()> {
    let svg = to_string(run, filter);
    out.write_all(svg.as_bytes())
}

/// The chart as a string.
pub fn to_string(run: &Run, filter: &Filter) -> String {
    let (program, tf, g, s, r) = (run.program, run.tf, run.graph, run.schedule, run.result);
    let cpr = s.cores_per_rank();
    let ranks: Vec<u32> = (0..g.ranks).filter(|&k| filter.keeps_rank(k)).collect();
    let (t0, t1) = match filter.window {
        Some((a, b)) => (a, b.min(r.makespan.max(a))),
        None => (0.0, r.makespan),
    };
    let span = (t1 - t0).max(f64::MIN_POSITIVE);
    let lanes = ranks.len() as f64 * cpr as f64;
    let lane_h = (TARGET_LANES_HEIGHT / lanes.max(1.0)).clamp(LANE_MIN, LANE_MAX).floor();
    let nodes = tf.nodes.len();
    let per_row = ((WIDTH - LEFT - RIGHT) / 220.0).floor().max(1.0) as usize;
    let legend_rows = nodes.div_ceil(per_row).max(1);
    let legend_h = legend_rows as f64 * LEGEND_ROW;
    let plot_top = TOP + legend_h + AXIS;
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = plot_top + lanes * lane_h + ranks.len() as f64 * RANK_GAP + 10.0;
    let x_of = |t: f64| LEFT + (t - t0) / span * plot_w;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(o, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let title = format!(
        "{} under {}: latency {:.1} us; ranks {}",
        tf.name,
        s.policy.policy.name(),
        r.makespan * 1e6,
        ranks.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(
        o,
        "<text x=\"{LEFT}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        esc(&title)
    );
    // Legend.
    for (i, node) in tf.nodes.iter().enumerate() {
        let (row, col) = (i / per_row, i % per_row);
        let x = LEFT + col as f64 * 220.0;
        let y = TOP + row as f64 * LEGEND_ROW;
        let _ = writeln!(
            o,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{} ({}, {})</text>",
            y,
            PALETTE[i % PALETTE.len()],
            x + 16.0,
            y + 10.0,
            esc(&node.name),
            esc(&program.op(node.op).name),
            node.engine.name()
        );
    }
    // Time axis.
    let step = nice_step(span * 1e6);
    let axis_y = plot_top - 6.0;
    let bottom = height - 10.0;
    let _ = writeln!(
        o,
        "<line x1=\"{LEFT}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"black\"/>",
        LEFT + plot_w
    );
    // About ten ticks; counted, so that a window too narrow or too far out for the step to
    // advance the time (1e-300 us wide, or past 2^53 steps) cannot loop for ever.
    let first = (t0 * 1e6 / step).ceil();
    for i in 0..MAX_TICKS {
        let tu = (first + i as f64) * step;
        if tu > t1 * 1e6 + step * 1e-6 {
            break;
        }
        let x = x_of(tu * 1e-6);
        let label = if step >= 1000.0 {
            format!("{:.0} ms", tu / 1000.0)
        } else if step >= 1.0 {
            format!("{tu:.0} us")
        } else {
            format!("{tu} us")
        };
        let _ = writeln!(
            o,
            "<line x1=\"{x:.1}\" y1=\"{axis_y}\" x2=\"{x:.1}\" y2=\"{bottom}\" stroke=\"#dddddd\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            axis_y - 4.0
        );
    }
    // Lanes.
    let mut lane_y = vec![f64::NAN; (g.ranks * cpr) as usize];
    let mut y = plot_top;
    for &rank in &ranks {
        let _ = writeln!(
            o,
            "<text x=\"4\" y=\"{:.1}\" font-weight=\"bold\">rank {rank}</text>",
            y + 10.0
        );
        for l in 0..cpr {
            let core = rank * cpr + l;
            lane_y[core as usize] = y;
            if l % 2 == 1 {
                let _ = writeln!(
                    o,
                    "<rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{plot_w}\" height=\"{lane_h}\" fill=\"#f4f4f4\"/>"
                );
            }
            let every = if lane_h >= 9.0 {
                1
            } else {
                (9.0 / lane_h).ceil() as u32 * 2
            };
            if l % every == 0 && l > 0 || (l == 0 && lane_h >= 9.0) {
                let _ = writeln!(
                    o,
                    "<text x=\"{}\" y=\"{:.1}\" font-size=\"{:.0}\" text-anchor=\"end\">{}</text>",
                    LEFT - 4.0,
                    y + lane_h - 1.0,
                    (lane_h - 1.0).clamp(6.0, 10.0),
                    s.core_name(core)
                );
            }
            y += lane_h;
        }
        y += RANK_GAP;
    }
    // Bars, lane by lane in queue order, merged when they touch.
    let bar_h = (lane_h - 1.0).max(1.0);
    for &rank in &ranks {
        for l in 0..cpr {
            let core = (rank * cpr + l) as usize;
            let ly = lane_y[core];
            let mut cur: Option<(u32, f64, f64, u32, f64, f64)> = None; // (node, x0, x1, count, t_start, t_end)
            let flush = |o: &mut String, c: Option<(u32, f64, f64, u32, f64, f64)>| {
                if let Some((node, x0, x1, cnt, ta, tb)) = c {
                    let nd = &tf.nodes[node as usize];
                    let _ = writeln!(
                        o,
                        "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{bar_h}\" fill=\"{}\"><title>{} ({}): {} task{}, {:.2}..{:.2} us</title></rect>",
                        x0,
                        ly,
                        (x1 - x0).max(0.3),
                        PALETTE[node as usize % PALETTE.len()],
                        esc(&nd.name),
                        esc(&program.op(nd.op).name),
                        cnt,
                        if cnt == 1 { "" } else { "s" },
                        ta * 1e6,
                        tb * 1e6
                    );
                }
            };
            for &t in s.queues.row(core) {
                let t = t as usize;
                let (a, b) = (r.start[t], r.end[t]);
                if !filter.keeps_span(a, b) || b < t0 || a > t1 {
                    continue;
                }
                let (xa, xb) = (x_of(a.max(t0)), x_of(b.min(t1)));
                let node = g.node[t];
                match &mut cur {
                    Some(c) if c.0 == node && xa - c.2 <= MERGE_GAP => {
                        c.2 = xb;
                        c.3 += 1;
                        c.5 = b;
                    }
                    _ => {
                        flush(&mut o, cur.take());
                        cur = Some((node, xa, xb, 1, a, b));
                    }
                }
            }
            flush(&mut o, cur.take());
        }
    }
    let _ = writeln!(o, "</svg>");
    o
}
