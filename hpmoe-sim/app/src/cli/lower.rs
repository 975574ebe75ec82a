//! `hpmoe lower --emit routing|tasks|schedule`.

use super::{style, Format, LowerCli};
use hpmoe_dsl::diag::{self, Diagnostic};
use hpmoe_dsl::driver::{Checked, CompileOptions};
use hpmoe_dsl::ir::RouteKind;
use hpmoe_dsl::schedule;
use hpmoe_dsl::SourceMap;

fn print_diags(ds: &[Diagnostic], sources: &SourceMap, format: Format) {
    match format {
        Format::Human => errout!(
            "{}",
            diag::render_all(ds, hpmoe_dsl::diag::Dropped::NONE, sources, style())
        ),
        Format::Json => {
            let list: Vec<_> = ds.iter().map(|d| diag::to_json(d, sources)).collect();
            outln!("{}", serde_json::json!({ "ok": false, "diagnostics": list }));
        }
    }
}

pub(crate) fn routing(p: &Checked, o: &LowerCli, sources: &SourceMap) -> i32 {
    let layouts = match p.layouts(false) {
        Ok(l) => l,
        Err(d) => {
            print_diags(&[d], sources, o.format);
            return 1;
        }
    };
    let mut json = Vec::new();
    for (spec, l) in p.routes.iter().zip(layouts.iter()) {
        let Some(l) = l else {
            if o.format == Format::Human {
                outln!("route {}: not used by any taskflow", spec.name);
            }
            continue;
        };
        let recv = l.routing.recv_counts();
        let experts = l.routing.expert_counts();
        let stats = hpmoe_dsl::route::count_stats;
        let (rmin, rmax, rmean) = stats(&recv);
        let (emin, emax, emean) = stats(&experts);
        match o.format {
            Format::Human => {
                let tokens = match spec.kind {
                    RouteKind::Fanout { of } => {
                        format!("up to {} rows of `{}`'s window", spec.tokens, p.route(of).name)
                    }
                    _ => format!("{} tokens", spec.tokens),
                };
                outln!(
                    "route {}: {} ranks x {tokens} x top-{} over {} experts ({} per rank); window {} rows",
                    spec.name,
                    spec.ranks,
                    spec.topk,
                    spec.experts,
                    spec.local_experts(),
                    spec.capacity
                );
                match spec.kind {
                    RouteKind::ByRank { of } => {
                        let base = layouts.get(of.0 as usize).and_then(|b| b.as_ref());
                        let sent = l.routing.kept.iter().filter(|k| **k).count();
                        let per_token = base.map_or(0, |b| b.routing.kept.iter().filter(|k| **k).count());
                        outln!(
                            "  a view of `{}`: each token once per rank holding any of its experts; {sent} rows sent where `{}` sends {per_token} ({:.1}% fewer)",
                            p.route(of).name,
                            p.route(of).name,
                            100.0 * (1.0 - sent as f64 / per_token.max(1) as f64)
                        );
                    }
                    RouteKind::Fanout { of } => outln!(
                        "  a view of `{}`: each row it received, to the experts of its rank its token chose; every row stays on its rank",
                        p.route(of).name
                    ),
                    RouteKind::Router(ref rs) => {
                        if let Some(g) = &rs.gate {
                            outln!(
                                "  logits computed by `{}.{}`: drawn from the router's seed here; `hpmoe run --numerics` routes by the values it computes",
                                g.taskflow,
                                g.tensor
                            );
                        }
                    }
                    _ => {}
                }
                outln!(
                    "  rows received per rank: min {rmin}, max {rmax}, mean {rmean:.1}, max/mean {:.3}",
                    rmax as f64 / rmean.max(1e-9)
                );
                outln!(
                    "  rows per expert: min {emin}, max {emax}, mean {emean:.1}, max/mean {:.3}",
                    emax as f64 / emean.max(1e-9)
                );
                let show = |v: &[u64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ");
                outln!("  per rank:   {}", show(&recv));
                if experts.len() <= 64 {
                    outln!("  per expert: {}", show(&experts));
                }
                if let Some(d) = &spec.drop {
                    let n = l.routing.expert.len();
                    outln!(
                        "  dropped: {} of {n} rows ({:.2}%) beyond {} rows per expert",
                        l.routing.dropped(),
                        100.0 * l.routing.dropped() as f64 / n.max(1) as f64,
                        d.expert_capacity(spec.ranks, spec.tokens, spec.topk, spec.experts)
                    );
                }
            }
            Format::Json => {
                let mut j = serde_json::json!({
                    "route": spec.name, "ranks": spec.ranks, "tokens": spec.tokens, "topk": spec.topk,
                    "experts": spec.experts, "capacity": spec.capacity,
                    "view_of": spec.kind.derived_from().map(|v| p.route(v).name.clone()),
                    "recv_per_rank": recv, "rows_per_expert": experts,
                    "recv_max_over_mean": rmax as f64 / rmean.max(1e-9),
                });
                if let (Some(_), Some(m)) = (&spec.drop, j.as_object_mut()) {
                    m.insert("dropped".into(), serde_json::json!(l.routing.dropped()));
                }
                json.push(j)
            }
        }
    }
    if o.format == Format::Json {
        outln!("{}", serde_json::to_string_pretty(&json).unwrap_or_default());
    }
    0
}

pub(crate) fn tasks(p: &Checked, o: &LowerCli, sources: &SourceMap, with_schedule: bool) -> i32 {
    let tfs = match p.select_taskflows(o.taskflow) {
        Ok(t) => t,
        Err(d) => {
            print_diags(&[d], sources, o.format);
            return 1;
        }
    };
    // JSON is streamed once every taskflow compiled, so a failure prints no partial output.
    let mut compiled = Vec::new();
    for tf in tfs {
        let spec = match p.policy(&tf.name, o.policy) {
            Ok(s) => s,
            Err(d) => {
                print_diags(&[d], sources, o.format);
                return 2;
            }
        };
        if let Err(d) = p.layouts(spec.static_capacity) {
            print_diags(&[d], sources, o.format);
            return 1;
        }
        let opts = CompileOptions {
            max_tasks: o.max_tasks,
            verify: o.verify,
        };
        let c = match hpmoe_sim::pipeline::compile(p, tf, &spec, &opts, &mut hpmoe_dsl::timing::Clock::new()) {
            Ok(c) => c,
            Err(ds) => {
                print_diags(&ds, sources, o.format);
                return 1;
            }
        };
        match o.format {
            Format::Human => out!(
                "{}",
                schedule::summary_text(p, tf, &c.graph, with_schedule.then_some(&c.schedule))
            ),
            Format::Json => compiled.push((tf, c)),
        }
    }
    if o.format == Format::Json {
        // The JSON of a large graph is many times its size in memory: it is written as it
        // is produced.
        let mut w = std::io::BufWriter::new(crate::out::Stdout);
        let res = (|| -> std::io::Result<()> {
            use std::io::Write;
            w.write_all(b"[")?;
            for (i, (tf, c)) in compiled.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                if with_schedule {
                    schedule::write_schedule_json(&mut w, &c.graph, &c.schedule)?;
                } else {
                    schedule::write_tasks_json(&mut w, p, tf, &c.graph)?;
                }
            }
            w.write_all(b"]\n")?;
            w.flush()
        })();
        if let Err(e) = res {
            // Reported with the exit code (nothing when the pipe was closed).
            crate::out::stdout_error(&e);
        }
    }
    0
}
