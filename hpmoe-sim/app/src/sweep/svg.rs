//! SVG charts of a sweep: grouped latency bars per configuration and policy (annotated with
//! the speedup over `kernel_by_kernel`), stacked per-phase active times, and the speedup
//! against the first axis.
//!
//! Every chart is standalone, well-formed SVG with a title, axis labels and a legend. Each
//! grid point is one element with a `data-point` attribute (its grid index): a `<rect>` per
//! bar in the bar charts (zero height and `data-failed="true"` for a failed point), a
//! `<circle>` per marker in the line chart. Numbers are printed with fixed precision, so the
//! same rows give the same bytes.

use super::{config_label, phase_names, Axis, Row};
use std::fmt::Write as _;

const POLICY_COLOURS: [(&str, &str); 3] = [
    ("kernel_by_kernel", "#9c9c9c"),
    ("expert_level", "#f28e2b"),
    ("interleaved", "#4e79a7"),
];
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
];

fn policy_colour(p: &str, i: usize) -> &'static str {
    POLICY_COLOURS
        .iter()
        .find(|(n, _)| *n == p)
        .map(|(_, c)| *c)
        .unwrap_or(PALETTE[i % PALETTE.len()])
}

/// Escapes text for XML content and attribute values (the simulator's one escape).
pub fn esc(s: &str) -> String {
    hpmoe_sim::gantt::xml_escape(s)
}

/// A "nice" axis maximum and tick step covering `max`.
fn nice(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 {
        return (1.0, 0.25);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn tick_label(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

struct Frame {
    left: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
    width: f64,
    height: f64,
}

fn header(o: &mut String, f: &Frame, title: &str) {
    let _ = writeln!(
        o,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif" font-size="11">
<rect x="0" y="0" width="{w:.0}" height="{h:.0}" fill="white"/>
<text x="{tx:.1}" y="20" font-size="14" text-anchor="middle">{title}</text>"#,
        w = f.width,
        h = f.height,
        tx = f.width / 2.0,
        title = esc(title)
    );
}

/// Y axis with ticks and grid lines, the axis title rotated on the left.
fn y_axis(o: &mut String, f: &Frame, ymax: f64, step: f64, label: &str) {
    let n = (ymax / step).round() as usize;
    for i in 0..=n {
        let v = step * i as f64;
        let y = f.top + f.plot_h - v / ymax * f.plot_h;
        let _ = writeln!(
            o,
            r##"<line x1="{x1:.1}" y1="{y:.1}" x2="{x2:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end">{t}</text>"##,
            x1 = f.left,
            x2 = f.left + f.plot_w,
            tx = f.left - 6.0,
            ty = y + 4.0,
            t = tick_label(v, step)
        );
    }
    let _ = writeln!(
        o,
        r##"<line x1="{l:.1}" y1="{t:.1}" x2="{l:.1}" y2="{b:.1}" stroke="black"/><line x1="{l:.1}" y1="{b:.1}" x2="{r:.1}" y2="{b:.1}" stroke="black"/>
<text x="{lx:.1}" y="{my:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {my:.1})">{label}</text>"##,
        l = f.left,
        t = f.top,
        b = f.top + f.plot_h,
        r = f.left + f.plot_w,
        my = f.top + f.plot_h / 2.0,
        lx = f.left - 54.0,
        label = esc(label)
    );
}

fn x_title(o: &mut String, f: &Frame, label: &str) {
    let _ = writeln!(
        o,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle">{label}</text>"#,
        x = f.left + f.plot_w / 2.0,
        y = f.height - 8.0,
        label = esc(label)
    );
}

/// A legend on the right of the plot.
fn legend(o: &mut String, f: &Frame, items: &[(String, &str)]) {
    let x = f.left + f.plot_w + 16.0;
    let _ = writeln!(o, r#"<g class="legend">"#);
    for (i, (name, colour)) in items.iter().enumerate() {
        let y = f.top + 4.0 + 18.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{x:.1}" y="{y:.1}" width="12" height="12" fill="{colour}"/><text x="{tx:.1}" y="{ty:.1}">{name}</text>"#,
            tx = x + 18.0,
            ty = y + 10.0,
            name = esc(name)
        );
    }
    let _ = writeln!(o, "</g>");
}

/// Configuration labels under each group (rotated when long).
fn group_labels(o: &mut String, f: &Frame, labels: &[String], group_w: f64) {
    let rotate = labels.iter().any(|l| l.chars().count() as f64 * 6.0 > group_w);
    for (g, l) in labels.iter().enumerate() {
        let x = f.left + group_w * (g as f64 + 0.5);
        let y = f.top + f.plot_h + 16.0;
        if rotate {
            let _ = writeln!(
                o,
                r#"<text x="{x:.1}" y="{y:.1}" text-anchor="end" transform="rotate(-30 {x:.1} {y:.1})">{l}</text>"#,
                l = esc(l)
            );
        } else {
            let _ = writeln!(
                o,
                r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle">{l}</text>"#,
                l = esc(l)
            );
        }
    }
}

/// The configurations (in grid order) and the policies (in sweep order) of the rows.
fn groups(axes: &[Axis], rows: &[Row]) -> (Vec<String>, Vec<String>) {
    let mut configs: Vec<(usize, String)> = Vec::new();
    let mut policies: Vec<String> = Vec::new();
    for r in rows {
        if !configs.iter().any(|(c, _)| *c == r.config) {
            configs.push((r.config, config_label(axes, &r.values)));
        }
        if !policies.contains(&r.policy) {
            policies.push(r.policy.clone());
        }
    }
    (configs.into_iter().map(|(_, l)| l).collect(), policies)
}

fn frame(groups: usize, per_group: usize, labels: &[String], legend_w: f64) -> (Frame, f64) {
    let bar_w = 22.0;
    let group_w = (per_group as f64 * bar_w + 20.0).max(60.0);
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64;
    let rotate = longest * 6.0 > group_w;
    let bottom = if rotate { 40.0 + longest * 3.3 } else { 50.0 };
    let plot_w = group_w * groups.max(1) as f64;
    // Rotated labels reach left of their group by about 5.2 px a character.
    let left = if rotate {
        (longest * 5.2 - group_w / 2.0 + 12.0).max(70.0)
    } else {
        70.0
    };
    let f = Frame {
        left,
        top: 40.0,
        plot_w,
        plot_h: 260.0,
        width: (left + plot_w + legend_w).max(560.0),
        height: 40.0 + 260.0 + bottom,
    };
    (f, group_w)
}

/// Grouped bars: latency per configuration and policy, with the speedup over
/// `kernel_by_kernel` above each bar (the paper's Figure 7 kind).
pub fn latency_chart(title: &str, axes: &[Axis], rows: &[Row]) -> String {
    bar_chart(
        title,
        axes,
        rows,
        &Bars {
            value: |m| m.latency_us,
            axis: "latency (us)",
            unit: " us",
            scale: 1.0,
            speedups: true,
            x_title: "configuration (above a bar: speedup over kernel_by_kernel)",
        },
    )
}

/// Grouped bars: the L2 hit rate (share of the bytes read that hit) per configuration and
/// policy; the cache effect of tile-level interleaving shows here.
pub fn l2_chart(title: &str, axes: &[Axis], rows: &[Row]) -> String {
    bar_chart(
        title,
        axes,
        rows,
        &Bars {
            value: |m| m.l2_hit_rate,
            axis: "L2 hit rate (%)",
            unit: "%",
            scale: 100.0,
            speedups: false,
            x_title: "configuration",
        },
    )
}

/// What a grouped bar chart shows: a metric of each point (times `scale` on the axis), its
/// unit in the tooltips, and whether each bar carries its speedup.
struct Bars {
    value: fn(&super::Metrics) -> f64,
    axis: &'static str,
    unit: &'static str,
    scale: f64,
    speedups: bool,
    x_title: &'static str,
}

fn bar_chart(title: &str, axes: &[Axis], rows: &[Row], bars: &Bars) -> String {
    let (labels, policies) = groups(axes, rows);
    let (f, group_w) = frame(labels.len(), policies.len(), &labels, 150.0);
    let value = |m: &super::Metrics| (bars.value)(m) * bars.scale;
    let ymax_raw = rows
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok())
        .map(value)
        .fold(0.0, f64::max);
    let (ymax, step) = nice(ymax_raw * 1.08);
    let mut o = String::new();
    header(&mut o, &f, title);
    y_axis(&mut o, &f, ymax, step, bars.axis);
    let bar_w = (group_w - 20.0) / policies.len().max(1) as f64;
    let bar_w = bar_w.min(22.0);
    let mut ci = 0usize;
    let mut last_config = None;
    for r in rows {
        if last_config.is_some_and(|c| c != r.config) {
            ci += 1;
        }
        last_config = Some(r.config);
        let pi = policies.iter().position(|p| *p == r.policy).unwrap_or(0);
        let gx = f.left + group_w * ci as f64 + (group_w - bar_w * policies.len() as f64) / 2.0;
        let x = gx + bar_w * pi as f64;
        let base = f.top + f.plot_h;
        match &r.outcome {
            Ok(m) => {
                let v = value(m);
                let h = if ymax > 0.0 { v / ymax * f.plot_h } else { 0.0 };
                let _ = writeln!(
                    o,
                    r#"<rect data-point="{i}" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"><title>{lab} / {p}: {v:.1}{u}</title></rect>"#,
                    i = r.index,
                    y = base - h,
                    w = bar_w - 2.0,
                    c = policy_colour(&r.policy, pi),
                    lab = esc(&config_label(axes, &r.values)),
                    p = esc(&r.policy),
                    u = bars.unit,
                );
                if let Some(s) = r.speedup.filter(|_| bars.speedups) {
                    let tx = x + (bar_w - 2.0) / 2.0;
                    let ty = base - h - 4.0;
                    let _ = writeln!(
                        o,
                        r#"<text x="{tx:.1}" y="{ty:.1}" font-size="9" text-anchor="start" transform="rotate(-90 {tx:.1} {ty:.1})">{s:.2}x</text>"#
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(
                    o,
                    r##"<rect data-point="{i}" data-failed="true" x="{x:.1}" y="{base:.1}" width="{w:.1}" height="0" fill="#d62728"><title>{lab} / {p}: failed: {e}</title></rect><text x="{tx:.1}" y="{ty:.1}" fill="#d62728" text-anchor="middle">x</text>"##,
                    i = r.index,
                    w = bar_w - 2.0,
                    lab = esc(&config_label(axes, &r.values)),
                    p = esc(&r.policy),
                    e = esc(e),
                    tx = x + (bar_w - 2.0) / 2.0,
                    ty = base - 4.0
                );
            }
        }
    }
    group_labels(&mut o, &f, &labels, group_w);
    x_title(&mut o, &f, bars.x_title);
    let items: Vec<(String, &str)> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), policy_colour(p, i)))
        .collect();
    legend(&mut o, &f, &items);
    o.push_str("</svg>\n");
    o
}

/// Stacked bars: per point, the active time of each op call stacked (phases overlap, so a
/// stack taller than the latency tick shows overlap); a black tick marks the latency.
pub fn phases_chart(title: &str, axes: &[Axis], rows: &[Row]) -> String {
    let (labels, policies) = groups(axes, rows);
    let phases = phase_names(rows);
    let (f, group_w) = frame(labels.len(), policies.len(), &labels, 150.0);
    let ymax_raw = rows
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok())
        .map(|m| m.phases.iter().map(|p| p.2).sum::<f64>().max(m.latency_us))
        .fold(0.0, f64::max);
    let (ymax, step) = nice(ymax_raw * 1.05);
    let mut o = String::new();
    header(&mut o, &f, title);
    y_axis(&mut o, &f, ymax, step, "active time per phase, stacked (us)");
    let bar_w = ((group_w - 20.0) / policies.len().max(1) as f64).min(22.0);
    let mut ci = 0usize;
    let mut last_config = None;
    let base = f.top + f.plot_h;
    for r in rows {
        if last_config.is_some_and(|c| c != r.config) {
            ci += 1;
        }
        last_config = Some(r.config);
        let pi = policies.iter().position(|p| *p == r.policy).unwrap_or(0);
        let gx = f.left + group_w * ci as f64 + (group_w - bar_w * policies.len() as f64) / 2.0;
        let x = gx + bar_w * pi as f64;
        let w = bar_w - 2.0;
        match &r.outcome {
            Ok(m) => {
                let mut y = base;
                for (call, op, a) in &m.phases {
                    let k = phases.iter().position(|p| p == call).unwrap_or(0);
                    let h = a / ymax * f.plot_h;
                    y -= h;
                    let _ = writeln!(
                        o,
                        r#"<rect data-segment="{call}" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"><title>{p}: {call} ({op}) {a:.1} us</title></rect>"#,
                        call = esc(call),
                        op = esc(op),
                        c = PALETTE[k % PALETTE.len()],
                        p = esc(&r.policy)
                    );
                }
                let total = base - y;
                let ly = base - m.latency_us / ymax * f.plot_h;
                let _ = writeln!(
                    o,
                    r#"<rect data-point="{i}" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{total:.1}" fill="none" stroke="black" stroke-width="0.5"><title>{lab} / {p}: latency {lat:.1} us</title></rect><line x1="{x0:.1}" y1="{ly:.1}" x2="{x1:.1}" y2="{ly:.1}" stroke="black" stroke-width="2"/>"#,
                    i = r.index,
                    lab = esc(&config_label(axes, &r.values)),
                    p = esc(&r.policy),
                    lat = m.latency_us,
                    x0 = x - 1.0,
                    x1 = x + w + 1.0
                );
                let _ = writeln!(
                    o,
                    r#"<text x="{tx:.1}" y="{ty:.1}" font-size="8" text-anchor="middle">{ab}</text>"#,
                    tx = x + w / 2.0,
                    ty = base + 9.0,
                    ab = policy_abbrev(&r.policy)
                );
            }
            Err(e) => {
                let _ = writeln!(
                    o,
                    r##"<rect data-point="{i}" data-failed="true" x="{x:.1}" y="{base:.1}" width="{w:.1}" height="0" fill="#d62728"><title>failed: {e}</title></rect>"##,
                    i = r.index,
                    e = esc(e)
                );
            }
        }
    }
    let f2 = Frame { top: f.top + 8.0, ..f };
    group_labels(&mut o, &f2, &labels, group_w);
    x_title(
        &mut o,
        &f,
        "KK kernel_by_kernel, EL expert_level, IL interleaved; tick: latency",
    );
    let mut items: Vec<(String, &str)> = phases
        .iter()
        .enumerate()
        .map(|(k, p)| (p.clone(), PALETTE[k % PALETTE.len()]))
        .collect();
    items.push(("(tick) latency".to_string(), "black"));
    legend(&mut o, &f, &items);
    o.push_str("</svg>\n");
    o
}

fn policy_abbrev(p: &str) -> String {
    match p {
        "kernel_by_kernel" => "KK".into(),
        "expert_level" => "EL".into(),
        "interleaved" => "IL".into(),
        _ => p.chars().take(2).collect(),
    }
}

/// A line chart of the speedup over `kernel_by_kernel` against the first axis: one line per
/// other policy and combination of the other axes. `None` without axes or without a
/// `kernel_by_kernel` row.
pub fn speedup_chart(title: &str, axes: &[Axis], rows: &[Row]) -> Option<String> {
    let first = axes.first()?;
    if !rows.iter().any(|r| r.speedup.is_some()) {
        return None;
    }
    // Series: (policy, values of the other axes) in order of first appearance.
    let mut series: Vec<(String, Vec<String>)> = Vec::new();
    for r in rows {
        if r.policy == "kernel_by_kernel" {
            continue;
        }
        let key = (r.policy.clone(), r.values[1..].to_vec());
        if !series.contains(&key) {
            series.push(key);
        }
    }
    let n = first.values.len();
    let step_x = 90.0;
    let f = Frame {
        left: 70.0,
        top: 40.0,
        plot_w: step_x * n.max(1) as f64,
        plot_h: 260.0,
        width: 70.0 + step_x * n.max(1) as f64 + 260.0,
        height: 40.0 + 260.0 + 50.0,
    };
    let smax = rows.iter().filter_map(|r| r.speedup).fold(1.0, f64::max);
    let (ymax, step) = nice(smax * 1.1);
    let mut o = String::new();
    header(&mut o, &f, title);
    y_axis(&mut o, &f, ymax, step, "speedup over kernel_by_kernel");
    let base = f.top + f.plot_h;
    let y1 = base - 1.0 / ymax * f.plot_h;
    let _ = writeln!(
        o,
        r##"<line x1="{l:.1}" y1="{y1:.1}" x2="{r:.1}" y2="{y1:.1}" stroke="#555" stroke-dasharray="4 3"/>"##,
        l = f.left,
        r = f.left + f.plot_w
    );
    let xpos = |i: usize| f.left + step_x * (i as f64 + 0.5);
    for (i, v) in first.values.iter().enumerate() {
        let _ = writeln!(
            o,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle">{v}</text>"#,
            x = xpos(i),
            y = base + 16.0,
            v = esc(v)
        );
    }
    let mut items: Vec<(String, &str)> = Vec::new();
    for (si, (policy, rest)) in series.iter().enumerate() {
        // Policy colours when the policy alone names the series, else one colour per series.
        let colour = if axes.len() == 1 {
            policy_colour(policy, si)
        } else {
            PALETTE[si % PALETTE.len()]
        };
        let pts: Vec<(usize, &Row)> = rows
            .iter()
            .filter(|r| r.policy == *policy && r.values[1..] == rest[..])
            .filter_map(|r| first.values.iter().position(|v| *v == r.values[0]).map(|i| (i, r)))
            .collect();
        let path: Vec<String> = pts
            .iter()
            .filter_map(|(i, r)| {
                r.speedup
                    .map(|s| format!("{:.1},{:.1}", xpos(*i), base - s / ymax * f.plot_h))
            })
            .collect();
        if path.len() > 1 {
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                path.join(" ")
            );
        }
        for (i, r) in &pts {
            if let Some(s) = r.speedup {
                let _ = writeln!(
                    o,
                    r#"<circle data-point="{idx}" cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{colour}"><title>{lab} / {p}: {s:.3}x</title></circle>"#,
                    idx = r.index,
                    x = xpos(*i),
                    y = base - s / ymax * f.plot_h,
                    lab = esc(&config_label(axes, &r.values)),
                    p = esc(policy)
                );
            }
        }
        let name = if rest.is_empty() {
            policy.clone()
        } else {
            format!("{policy} ({})", config_label(&axes[1..], rest))
        };
        items.push((name, colour));
    }
    x_title(&mut o, &f, &first.name);
    legend(&mut o, &f, &items);
    o.push_str("</svg>\n");
    Some(o)
}
