//! Routings computed by the program (`router(..., gate: tf.z)`): the experts chosen are the
//! top-k of the logits the taskflow computes (checked against a recomputation here, in f64,
//! from the same input files and the router's documented rule), the calls that route wait
//! for the logits, and every policy's numerics match the references on that routing.

use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions};
use hpmoe_dsl::ir::RouteId;
use hpmoe_dsl::npy::{self, NpyType};
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::numerics::{self, gates, NumericsOptions};

const RANKS: usize = 4;
const TOKENS: usize = 24;
const HIDDEN: usize = 32;
const EXPERTS: usize = 16;
const TOPK: usize = 4;
/// Groups of 4 consecutive experts; a token keeps its 2 best groups.
const N_GROUP: usize = 4;
const TOPK_GROUP: usize = 2;
const SCALE: f64 = 2.5;

fn text(route_extra: &str) -> String {
    format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         device = ascend_a3 {{ ranks: {RANKS} }};\n\
         route r = router(experts: {EXPERTS}, topk: {TOPK}, score: sigmoid, scale: {SCALE}, \
           n_group: {N_GROUP}, topk_group: {TOPK_GROUP}, gate: moe_ffn.z{route_extra});\n\
         route rr = by_rank(r);\nroute rl = fanout(rr);\n\
         taskflow moe_ffn(x: f32[{TOKENS}, {HIDDEN}], w_gate: f32[{HIDDEN}, {EXPERTS}],\n\
           w_up: f32[{l}, {HIDDEN}, 32], w_down: f32[{l}, 16, {HIDDEN}]) -> f32[{TOKENS}, {HIDDEN}] {{\n\
           let z = mm(x, w_gate) tile(m: 8);\n\
           let xd = dispatch(x, r) tile(t: 8);\n\
           let h = gmm(xd, w_up) tile(m: 8, n: 16);\n\
           let a = swiglu(h) tile(m: 8);\n\
           let y = gmm(a, w_down) tile(m: 8, n: 16);\n\
           return combine(y, r) tile(m: 8);\n\
         }}\n\
         taskflow dedup(x: f32[{TOKENS}, {HIDDEN}], w_up: f32[{l}, {HIDDEN}, 32], w_down: f32[{l}, 16, {HIDDEN}]) -> f32[{TOKENS}, {HIDDEN}] {{\n\
           let xr = dispatch(x, rr) tile(t: 8);\n\
           let xd = dispatch(xr, rl) tile(t: 8);\n\
           let h = gmm(xd, w_up) tile(m: 8, n: 16);\n\
           let a = swiglu(h) tile(m: 8);\n\
           let y = gmm(a, w_down) tile(m: 8, n: 16);\n\
           let yr = combine(y, rl) tile(m: 8);\n\
           return combine(yr, rr) tile(m: 8);\n\
         }}\n",
        l = EXPERTS / RANKS
    )
}

fn checked(text: &str) -> Checked {
    let mut sm = SourceMap::new();
    let out = check_text("t.hpm", text, None, &Options::default(), &mut sm);
    out.checked.unwrap_or_else(|| {
        panic!(
            "{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        )
    })
}

/// Deterministic values in [-1, 1) (a 64-bit LCG), independent of the simulator's seeding.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// The router's rule as documented in `std::route` (sigmoid scores; groups scored by the
/// sum of their two best; the `TOPK_GROUP` best groups kept; the `TOPK` best experts of
/// those, best first; weights = scores / their sum * scale; ties to the lower id).
fn reference_choice(z: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let s: Vec<f64> = z.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
    let per = EXPERTS / N_GROUP;
    let mut groups: Vec<(f64, usize)> = (0..N_GROUP)
        .map(|g| {
            let mut m: Vec<f64> = s[g * per..(g + 1) * per].to_vec();
            m.sort_by(|a, b| b.total_cmp(a));
            (m[0] + m[1], g)
        })
        .collect();
    groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let kept: Vec<usize> = groups[..TOPK_GROUP].iter().map(|g| g.1).collect();
    let mut cand: Vec<usize> = (0..EXPERTS).filter(|e| kept.contains(&(e / per))).collect();
    cand.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
    let ids: Vec<usize> = cand[..TOPK].to_vec();
    let sum: f64 = ids.iter().map(|&e| s[e]).sum();
    let w = ids.iter().map(|&e| s[e] / sum * SCALE).collect();
    (ids, w)
}

#[test]
fn routing_from_the_gate_is_the_router_applied_to_the_logits_the_program_computes() {
    let dir = std::env::temp_dir().join(format!("hpmoe-gates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = values(RANKS * TOKENS * HIDDEN, 1);
    // One weight, the same copy on every rank.
    let wg1 = values(HIDDEN * EXPERTS, 2);
    let wg: Vec<f64> = (0..RANKS).flat_map(|_| wg1.iter().copied()).collect();
    let (xp, wp) = (dir.join("x.npy"), dir.join("w_gate.npy"));
    npy::write(&xp, NpyType::F32, &[RANKS, TOKENS, HIDDEN], &x).unwrap();
    npy::write(&wp, NpyType::F32, &[RANKS, HIDDEN, EXPERTS], &wg).unwrap();
    // The logits in f64, from the values as the files store them (f32).
    let xf: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
    let wf: Vec<f64> = wg1.iter().map(|&v| v as f32 as f64).collect();

    let p = checked(&text(""));
    let opts = NumericsOptions {
        inputs: vec![("moe_ffn.x".into(), xp.clone()), ("moe_ffn.w_gate".into(), wp.clone())],
        ..Default::default()
    };
    let (q, runs) = gates::route_by_gates(&p, None, &opts)
        .unwrap()
        .expect("the program gates a router");
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (
            runs[0].routing.as_str(),
            runs[0].taskflow.as_str(),
            runs[0].tensor.as_str()
        ),
        ("r", "moe_ffn", "z")
    );
    let before = p.layouts(false).unwrap();
    let after = q.layouts(false).unwrap();
    let (r0, r1) = (
        &before[0].as_ref().unwrap().routing,
        &after[0].as_ref().unwrap().routing,
    );
    let mut max_err: f64 = 0.0;
    for rank in 0..RANKS {
        for t in 0..TOKENS {
            let row = &xf[(rank * TOKENS + t) * HIDDEN..][..HIDDEN];
            let z: Vec<f64> = (0..EXPERTS)
                .map(|e| (0..HIDDEN).map(|h| row[h] * wf[h * EXPERTS + e]).sum())
                .collect();
            let (ids, w) = reference_choice(&z);
            let at = (rank * TOKENS + t) * TOPK;
            let got: Vec<usize> = r1.expert[at..at + TOPK].iter().map(|&e| e as usize).collect();
            assert_eq!(got, ids, "rank {rank} token {t}: logits {z:?}");
            for j in 0..TOPK {
                max_err = max_err.max((r1.weight[at + j] as f64 - w[j]).abs());
            }
        }
    }
    // The gate runs in f32: its weights agree to f32 rounding.
    assert!(max_err < 1e-5, "weights differ by {max_err}");
    assert_ne!(r0.expert, r1.expert, "the seeded routing was not replaced");
    // The receive windows follow the new routing, views too.
    for id in 0..3u32 {
        let l = after[id as usize].as_ref().unwrap();
        let max = l.routing.recv_counts().into_iter().max().unwrap_or(0);
        assert_eq!(q.route(RouteId(id)).capacity, max, "routing {id}");
    }
    // Every policy, and the rank-deduplicated form, compute the references' numbers on it.
    for policy in Policy::all() {
        for (tf, name) in [(0, "moe_ffn"), (1, "dedup")] {
            let spec = PolicySpec::defaults(&q, policy);
            let c = q.compile(&q.taskflows[tf], &spec, &CompileOptions::default()).unwrap();
            let order = numerics::schedule_order(&c.graph, &c.schedule);
            let o = NumericsOptions {
                inputs: gates::inputs_of(&q.taskflows[tf], &opts.inputs),
                ..Default::default()
            };
            let rep = numerics::run(&q, &q.taskflows[tf], &c.graph, &c.schedule, &order, &o).unwrap();
            assert!(rep.passed(), "{name} under {}: {}", policy.name(), rep.text());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calls_that_route_wait_for_the_whole_gate_on_their_rank() {
    let p = checked(&text(""));
    let tf = &p.taskflows[0];
    let z_node = tf.nodes.iter().position(|n| n.name == "z").unwrap() as u32;
    for policy in Policy::all() {
        let spec = PolicySpec::defaults(&p, policy);
        let c = p.compile(tf, &spec, &CompileOptions::default()).unwrap();
        let g = &c.graph;
        let z_tasks = |rank: u32| -> Vec<u32> {
            (0..g.len() as u32)
                .filter(|&t| g.node[t as usize] == z_node && g.rank[t as usize] == rank)
                .collect()
        };
        for t in 0..g.len() {
            let n = &tf.nodes[g.node[t] as usize];
            if !n.routes.contains(&RouteId(0)) {
                continue;
            }
            // A call that routes through `r` reads the routing: every z task of its rank
            // comes first (directly, or through a call that waited for it).
            let mut seen = vec![false; g.len()];
            let mut stack = vec![t as u32];
            while let Some(u) = stack.pop() {
                for &pr in g.preds(u as usize) {
                    if !seen[pr as usize] {
                        seen[pr as usize] = true;
                        stack.push(pr);
                    }
                }
            }
            for zt in z_tasks(g.rank[t]) {
                assert!(
                    seen[zt as usize],
                    "{}: task {t} of `{}` does not wait for z task {zt}",
                    policy.name(),
                    n.name
                );
            }
        }
        // Without the gate, dispatch does not wait for z.
        let plain = checked(&text("").replace(", gate: moe_ffn.z", ""));
        let c = plain
            .compile(&plain.taskflows[0], &spec, &CompileOptions::default())
            .unwrap();
        let d_node = plain.taskflows[0].nodes.iter().position(|n| n.name == "xd").unwrap() as u32;
        let d = (0..c.graph.len()).find(|&t| c.graph.node[t] == d_node).unwrap();
        assert!(c.graph.preds(d).is_empty(), "{}", policy.name());
    }
}

#[test]
fn gate_logits_a_capacity_factor_cannot_hold_are_refused() {
    // Logits that send every token to experts 0..3 (all on rank 0): a window of
    // ceil(1.5 * 24 tokens * top-4) = 144 rows per rank cannot hold 4 ranks' 96 rows.
    let p = checked(&text(", capacity_factor: 1.5").replace("n_group: 4, topk_group: 2", "n_group: 1, topk_group: 1"));
    let mut z = vec![-5.0; RANKS * TOKENS * EXPERTS];
    for tok in 0..RANKS * TOKENS {
        for e in 0..TOPK {
            z[tok * EXPERTS + e] = 5.0;
        }
    }
    let e = p.with_gate_logits(vec![(RouteId(0), z)]).unwrap_err();
    assert_eq!(e.code, hpmoe_dsl::Code::RecvOverflow, "{}", e.message);
    assert!(
        e.message.contains("sends 384 rows to rank 0") && e.message.contains("holds 144"),
        "{}",
        e.message
    );
}

#[test]
fn the_verifier_derives_the_wait_for_the_gate_on_its_own() {
    // The graph lowered without the gate, checked against the program with it: the
    // dispatch's read of the routing has no dependency on the logits.
    let p = checked(&text(""));
    let plain = checked(&text("").replace(", gate: moe_ffn.z", ""));
    let spec = PolicySpec::defaults(&plain, Policy::Interleaved);
    let opts = CompileOptions {
        verify: false,
        ..Default::default()
    };
    let c = plain.compile(&plain.taskflows[0], &spec, &opts).unwrap();
    assert!(hpmoe_dsl::verify::verify_graph(&plain, &plain.taskflows[0], &c.graph).is_empty());
    let ds = hpmoe_dsl::verify::verify_graph(&p, &p.taskflows[0], &c.graph);
    assert!(
        !ds.is_empty(),
        "a dispatch that does not wait for the gate passed verification"
    );
    assert!(
        ds.iter().any(|d| d.message.contains("z") && d.message.contains("xd")),
        "{:?}",
        ds.iter().map(|d| &d.message).collect::<Vec<_>>()
    );
}
