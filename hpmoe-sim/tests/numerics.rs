//! Numerics: every policy computes the same function as the dense and per-token references,
//! forward and backward, on 1, 2 and 4 ranks and every routing; a broken schedule is caught;
//! the GeGLU example computes correct numbers; dumps are standard `.npy` files.

use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::lower::NO_COUNTER;
use hpmoe_dsl::schedule::{self, Policy, PolicySpec};
use hpmoe_dsl::{Code, SourceMap};
use hpmoe_sim::numerics::{self, NumericsOptions};

fn program(text: &str, sets: &[&str]) -> Checked {
    let opts = Options {
        overrides: sets.iter().map(|s| Override::parse(s).unwrap()).collect(),
        ..Options::default()
    };
    let mut sm = SourceMap::new();
    let out = check_text(
        "t.hpm",
        text,
        Some(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))),
        &opts,
        &mut sm,
    );
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

fn compile(p: &Checked, tf: usize, policy: Policy, verify: bool) -> Compiled {
    let spec = PolicySpec::defaults(p, policy);
    let opts = CompileOptions {
        verify,
        ..CompileOptions::default()
    };
    p.compile(&p.taskflows[tf], &spec, &opts).unwrap()
}

fn run(p: &hpmoe_dsl::ir::Program, tf: usize, c: &Compiled, bf16: bool) -> numerics::NumericsReport {
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let opts = NumericsOptions {
        bf16_storage: bf16,
        seed: 11,
        ..Default::default()
    };
    numerics::run(p, &p.taskflows[tf], &c.graph, &c.schedule, &order, &opts).unwrap()
}

fn moe(ranks: u64, route: &str) -> String {
    format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = 12;\nparam hidden = 32;\nparam inter = 16;\nparam experts = {e};\nparam topk = 2;\nparam ranks = {ranks};\n\
         param local = experts / ranks;\n\
         device = ascend_a3 {{ ranks: ranks }};\nroute r = {route};\n\
         taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
           let xd = dispatch(x, r) tile(t: 4) order(ratr);\n\
           let h = gmm(xd, w_up) tile(m: 8, n: 16, k: 16);\n\
           let a = swiglu(h) tile(m: 4, n: 8);\n\
           let y = gmm(a, w_down) tile(m: 8, n: 16, k: 16);\n\
           return combine(y, r) tile(m: 4) order(ratr);\n}}\n\
         taskflow bwd(dy: bf16[tokens, hidden], xd: bf16[r.recv, hidden], h: bf16[r.recv, 2 * inter], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden])\n\
           -> (dx: bf16[tokens, hidden], dw_up: bf16[local, hidden, 2 * inter], dw_down: bf16[local, inter, hidden]) {{\n\
           let dyd = combine_grad(dy, r) tile(t: 4) order(ratr);\n\
           let a = swiglu(h) tile(m: 4);\n\
           let da = gmm_grad_x(dyd, w_down) tile(m: 8, k: 16, n: 16);\n\
           let dw_down = gmm_grad_w(a, dyd, r) tile(k: 8, n: 16, m: 4);\n\
           let dh = swiglu_grad(da, h) tile(m: 4);\n\
           let dxd = gmm_grad_x(dh, w_up) tile(m: 8, k: 16, n: 16);\n\
           let dw_up = gmm_grad_w(xd, dh, r) tile(k: 16, n: 16, m: 4);\n\
           let dx = dispatch_grad(dxd, r) tile(m: 4) order(ratr);\n\
           return (dx, dw_up, dw_down);\n}}\n",
        e = 4 * ranks
    )
}

const ROUTES: &[&str] = &[
    "balanced(experts: experts, topk: topk)",
    "uniform(experts: experts, topk: topk, seed: 4)",
    "zipf(experts: experts, topk: topk, s: 1.5, seed: 4)",
    "hotspot(experts: experts, topk: topk, max_over_mean: 1.0, seed: 4)",
];

#[test]
fn every_policy_matches_the_references() {
    for ranks in [1u64, 2, 4] {
        for route in ROUTES {
            let p = program(&moe(ranks, route), &[]);
            for tf in 0..2 {
                for policy in Policy::all() {
                    let c = compile(&p, tf, policy, true);
                    let r = run(&p, tf, &c, false);
                    assert!(r.races.is_empty(), "EP{ranks} {route} {policy:?}: {:?}", r.races);
                    let per_token = r.checks.iter().filter(|c| c.reference == "per-token").count();
                    assert!(per_token > 0, "the MoE reference applies to {}", p.taskflows[tf].name);
                    assert!(
                        r.passed(),
                        "EP{ranks} {route} {policy:?} {}:\n{}",
                        p.taskflows[tf].name,
                        r.text()
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_storage_stays_within_its_tolerance() {
    let p = program(&moe(2, ROUTES[1]), &[]);
    for tf in 0..2 {
        let c = compile(&p, tf, Policy::Interleaved, true);
        let r = run(&p, tf, &c, true);
        assert!(r.passed(), "{}", r.text());
        // Rounding is real: the error is above f32's.
        assert!(
            r.checks.iter().any(|c| c.computed == "schedule" && c.rel_l2 > 1e-5),
            "{}",
            r.text()
        );
    }
}

#[test]
fn a_dropped_edge_is_caught_with_the_tasks_named() {
    let p = program(&moe(2, ROUTES[0]), &[]);
    let mut c = compile(&p, 0, Policy::Interleaved, true);
    // Every SwiGLU task stops waiting for its GMM producers; verification is off.
    let g = &mut c.graph;
    let swiglu = 2u32;
    for t in 0..g.len() {
        if g.node[t] == swiglu {
            g.wait[t] = NO_COUNTER;
        }
    }
    g.rebuild_reverse();
    c.schedule = schedule::schedule(
        &p,
        &p.taskflows[0],
        &c.graph,
        &PolicySpec::defaults(&p, Policy::Interleaved),
    );
    // Unverified, the swiglu tasks may run first: the race check or the comparison fails.
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let r = numerics::run(
        &p,
        &p.taskflows[0],
        &c.graph,
        &c.schedule,
        &order,
        &NumericsOptions::default(),
    )
    .unwrap();
    assert!(!r.passed(), "a broken schedule must not pass:\n{}", r.text());
    assert!(!r.races.is_empty());
    assert_eq!(r.races[0].code, Code::Race);
    let msg = &r.races[0].message;
    // The reader is a SwiGLU task; the data is `h`, which the GMM call produces.
    assert!(msg.contains("`a` = swiglu") && msg.contains("`h`"), "{msg}");
}

#[test]
fn the_race_check_follows_the_elements_read_not_the_declared_regions() {
    use hpmoe_dsl::lower::regions::{fault, tile_access, Scratch};
    let p = program(&moe(2, ROUTES[0]), &[]);
    let good = compile(&p, 0, Policy::Interleaved, true);
    // A SwiGLU task whose declared reads the lowering drops: it waits for nothing, and a
    // check of the declared regions would have nothing to check.
    let swiglu = 2u32;
    let t = (0..good.graph.len())
        .find(|&t| good.graph.node[t] == swiglu && good.graph.wait[t] != NO_COUNTER)
        .unwrap();
    fault::inject(Some(fault::Fault::DropReads { task: t as u32 }));
    let c = compile(&p, 0, Policy::Interleaved, false);
    let declared = tile_access(&p, &p.taskflows[0], &c.graph, t, &mut Scratch::default())
        .reads
        .len();
    fault::inject(None);
    assert_eq!(declared, 0);
    assert_eq!(c.graph.wait[t], NO_COUNTER);
    let r = run(&p, 0, &c, false);
    // The body still reads `h`, and those reads are checked.
    let reader = format!("task {t} ");
    let race = r.races.iter().find(|d| d.message.contains(&reader));
    let race = race.unwrap_or_else(|| panic!("the reads of task {t} are checked: {:#?}", r.races));
    assert_eq!(race.code, Code::Race);
    assert!(race.message.contains("`h`"), "{}", race.message);
}

#[test]
fn geglu_example_computes_correct_numbers() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/geglu.hpm")).unwrap();
    let p = program(
        &text,
        &["tokens=16", "hidden=32", "inter=16", "experts=8", "ranks=2", "topk=2"],
    );
    for policy in Policy::all() {
        let c = compile(&p, 0, policy, true);
        let r = run(&p, 0, &c, false);
        assert!(r.passed(), "{policy:?}\n{}", r.text());
        assert!(
            r.checks.iter().any(|c| c.reference == "per-token"),
            "per-token reference with the GeGLU body"
        );
    }
}

#[test]
fn memory_limit_fails_fast() {
    let p = program(&moe(2, ROUTES[0]), &[]);
    let c = compile(&p, 0, Policy::Interleaved, true);
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let opts = NumericsOptions {
        memory_limit: 1000,
        ..Default::default()
    };
    let e = numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts).unwrap_err();
    assert_eq!(e.code, Code::LimitExceeded);
    assert!(e.message.contains("MiB"), "{}", e.message);
}

#[test]
fn work_is_estimated_from_the_bodies_and_limited_before_running() {
    // A product of [M, K] by [K, N]: M * N points, each a sum of K terms of three nodes
    // (two reads and a product), plus the sum itself.
    let text = "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 2 };\n\
        op mm<T>(x: T[M, K], w: T[K, N]) -> T[M, N] on aic { out[m, n] = sum(k) x[m, k] * w[k, n]; }\n\
        op e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = exp(x[m, n]) + 1.0; }\n\
        taskflow f(x: f32[32, 48], w: f32[48, 16]) -> f32[32, 16] { let y = mm(x, w); return e(y); }\n";
    let p = program(text, &[]);
    let c = compile(&p, 0, Policy::KernelByKernel, true);
    let tf = &p.taskflows[0];
    let ranks = 2;
    let mm = 32 * 16 * (48 * 3 + 1);
    // exp (two), its read, the constant and the sum.
    let e = 32 * 16 * 5;
    assert_eq!(numerics::work(tf, &c.graph), ranks * (mm + e));
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let at = |work_limit: u64| NumericsOptions {
        work_limit,
        ..Default::default()
    };
    let exact = (ranks * (mm + e)) as u64;
    assert!(numerics::run(&p, tf, &c.graph, &c.schedule, &order, &at(exact))
        .unwrap()
        .passed());
    let err = numerics::run(&p, tf, &c.graph, &c.schedule, &order, &at(exact - 1)).unwrap_err();
    assert_eq!(err.code, Code::LimitExceeded);
    assert!(
        err.message.contains(&format!("would evaluate {exact} operations")),
        "{}",
        err.message
    );
}

#[test]
fn a_routed_reduction_counts_each_rank_s_rows() {
    // The weight gradient sums each group's rows: about the rows a rank received in all.
    let p = program(&moe(2, ROUTES[0]), &[]);
    let c = compile(&p, 1, Policy::Interleaved, true);
    let w = numerics::work(&p.taskflows[1], &c.graph);
    assert!(w > 0);
    // Doubling the tokens doubles every call's points or the rows of its reductions; only
    // the node of each reduction itself, once per point of a weight gradient, stays.
    let p2 = program(&moe(2, ROUTES[0]), &["tokens=24"]);
    let c2 = compile(&p2, 1, Policy::Interleaved, true);
    let w2 = numerics::work(&p2.taskflows[1], &c2.graph);
    assert!(w2 < 2 * w && w2 * 10 > w * 19, "{w} then {w2}");
}

#[test]
fn dumps_are_standard_npy_and_inputs_load_back() {
    let p = program(&moe(2, ROUTES[2]), &[]);
    let c = compile(&p, 0, Policy::ExpertLevel, true);
    let dir = std::env::temp_dir().join(format!("hpmoe-dump-{}", std::process::id()));
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let opts = NumericsOptions {
        dump: Some(dir.clone()),
        ..Default::default()
    };
    let r = numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts).unwrap();
    assert!(r.passed());
    for name in ["x", "w_up", "w_down", "out", "route_ids", "route_weights"] {
        let path = dir.join(format!("{name}.npy"));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "{name}: magic and version 1.0");
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
        assert!(header.starts_with("{'descr': '<"), "{header}");
        assert!(
            header.contains("'fortran_order': False") && header.ends_with('\n'),
            "{header}"
        );
        assert_eq!((10 + hlen) % 64, 0, "data aligned to 64 bytes");
        let a = hpmoe_dsl::npy::read(&path).unwrap();
        assert_eq!(a.shape[0], 2, "leading rank axis");
    }
    // The dumped inputs, fed back, give the same outputs.
    let inputs: Vec<(String, std::path::PathBuf)> = ["x", "w_up", "w_down"]
        .iter()
        .map(|n| (n.to_string(), dir.join(format!("{n}.npy"))))
        .collect();
    let opts2 = NumericsOptions {
        inputs,
        seed: 999,
        ..Default::default()
    };
    let r2 = numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts2).unwrap();
    assert!(r2.passed());
    let out1 = hpmoe_dsl::npy::read(&dir.join("out.npy")).unwrap();
    let dir2 = dir.join("again");
    let opts3 = NumericsOptions {
        inputs: opts2.inputs.clone(),
        dump: Some(dir2.clone()),
        ..Default::default()
    };
    numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts3).unwrap();
    let out2 = hpmoe_dsl::npy::read(&dir2.join("out.npy")).unwrap();
    assert_eq!(out1, out2);
    // A wrong shape names the input.
    let bad = dir.join("bad.npy");
    hpmoe_dsl::npy::write(&bad, hpmoe_dsl::npy::NpyType::F32, &[3, 3], &[0.0; 9]).unwrap();
    let opts4 = NumericsOptions {
        inputs: vec![("x".into(), bad)],
        ..Default::default()
    };
    let e = numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts4).unwrap_err();
    assert!(e.message.contains("input `x`"), "{}", e.message);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A row of hex f32 bit patterns from `hpmoe-dsl/tests/data/qdq.txt` (generated offline by
/// `gen_fp8.py` with NumPy and ml_dtypes).
fn qdq_row(name: &str) -> Vec<f32> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hpmoe-dsl/tests/data/qdq.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name}"));
    line.split_whitespace()
        .skip(1)
        .map(|h| f32::from_bits(u32::from_str_radix(h, 16).unwrap()))
        .collect()
}

#[test]
fn per_token_quantize_dequantize_equals_the_numpy_reference_bit_for_bit() {
    let text = "import std::quant::*;\nimport std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n\
        taskflow i8qdq(x: f32[4, 8]) -> (s: f32[4], q: i8[4, 8], y: bf16[4, 8]) {\n\
          let s = token_scale_i8(x);\n let q = quantize_i8(x, s) tile(m: 2);\n let y = dequantize(q, s);\n return (s, q, y);\n}\n\
        taskflow e4m3qdq(x: f32[4, 8]) -> (s: f32[4], q: fp8e4m3[4, 8], y: bf16[4, 8]) {\n\
          let s = token_scale_e4m3(x);\n let q = quantize_e4m3(x, s) tile(m: 2);\n let y = dequantize(q, s);\n return (s, q, y);\n}\n";
    let p = program(text, &[]);
    let dir = std::env::temp_dir().join(format!("hpmoe-qdq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x: Vec<f64> = qdq_row("x").iter().map(|&v| v as f64).collect();
    let xpath = dir.join("x_in.npy");
    hpmoe_dsl::npy::write(&xpath, hpmoe_dsl::npy::NpyType::F32, &[1, 4, 8], &x).unwrap();
    for (tf, prefix) in [(0, "i8"), (1, "fp8e4m3")] {
        let c = compile(&p, tf, Policy::Interleaved, true);
        let order = numerics::schedule_order(&c.graph, &c.schedule);
        let out = dir.join(prefix);
        let opts = NumericsOptions {
            inputs: vec![("x".to_string(), xpath.clone())],
            dump: Some(out.clone()),
            ..Default::default()
        };
        let r = numerics::run(&p, &p.taskflows[tf], &c.graph, &c.schedule, &order, &opts).unwrap();
        assert!(r.passed(), "{}", r.text());
        for (name, row) in [("s", "scale"), ("q", "q"), ("y", "y")] {
            let got = hpmoe_dsl::npy::read(&out.join(format!("{name}.npy"))).unwrap();
            let want = qdq_row(&format!("{prefix}_{row}"));
            assert_eq!(got.data.len(), want.len(), "{prefix} {name}");
            for (k, (g, w)) in got.data.iter().zip(&want).enumerate() {
                assert_eq!((*g as f32).to_bits(), w.to_bits(), "{prefix} {name}[{k}]: {g} vs {w}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Capacity-limited routings: every policy still matches the references, and the output
/// equals a per-token recomputation here (own SwiGLU FFN, own choice of the kept rows).
#[test]
fn dropping_routings_match_a_per_token_recomputation() {
    let routes = [
        ("zipf(experts: experts, topk: topk, s: 1.5, seed: 4, capacity_factor: 1.0, drop: true)", false),
        (
            "router(experts: experts, topk: topk, skew: 1.0, seed: 3, capacity_factor: 1.0, drop: true, drop_order: score, renormalize: true)",
            true,
        ),
    ];
    for (route, by_score) in routes {
        let p = program(&moe(2, route), &[]);
        let routing = hpmoe_dsl::route::Routing::generate(&p.routes[0]).unwrap();
        assert!(routing.dropped() > 0, "{route}: the test needs drops");
        for tf in 0..2 {
            for policy in Policy::all() {
                let c = compile(&p, tf, policy, true);
                let r = run(&p, tf, &c, false);
                assert!(r.races.is_empty(), "{route} {policy:?}: {:?}", r.races);
                assert!(r.checks.iter().any(|c| c.reference == "per-token"));
                assert!(r.passed(), "{route} {policy:?}:\n{}", r.text());
            }
        }
        let c = compile(&p, 0, Policy::ExpertLevel, true);
        let dir = std::env::temp_dir().join(format!("hpmoe-drop-{}-{by_score}", std::process::id()));
        let order = numerics::schedule_order(&c.graph, &c.schedule);
        let opts = NumericsOptions {
            dump: Some(dir.clone()),
            ..Default::default()
        };
        numerics::run(&p, &p.taskflows[0], &c.graph, &c.schedule, &order, &opts).unwrap();
        let rd = |n: &str| hpmoe_dsl::npy::read(&dir.join(format!("{n}.npy"))).unwrap().data;
        let (x, wu, wd, ids, w, kept, out) = (
            rd("x"),
            rd("w_up"),
            rd("w_down"),
            rd("route_ids"),
            rd("route_weights"),
            rd("route_kept"),
            rd("out"),
        );
        let (ranks, tokens, hidden, inter, topk, local) = (2, 12, 32, 16, 2, 4);
        // Capacity ceil(1.0 * 2 * 12 * 2 / 8) = 6 rows per expert.
        if !by_score {
            let mut n = [0usize; 8];
            for i in 0..ids.len() {
                let e = ids[i] as usize;
                n[e] += 1;
                assert_eq!(kept[i] == 1.0, n[e] <= 6, "row {i}: kept in window order up to 6");
            }
        } else {
            let mut per_expert = [0usize; 8];
            for i in 0..ids.len() {
                if kept[i] == 1.0 {
                    per_expert[ids[i] as usize] += 1;
                }
            }
            assert!(per_expert.iter().all(|&c| c <= 6), "{per_expert:?}");
            for tok in 0..ranks * tokens {
                let s: f64 = w[tok * topk..(tok + 1) * topk].iter().sum();
                let any = (0..topk).any(|j| kept[tok * topk + j] == 1.0);
                assert!(
                    !any || (s - 1.0).abs() < 1e-5,
                    "token {tok}: renormalised weights sum to {s}"
                );
            }
        }
        let silu = |v: f64| v / (1.0 + (-v).exp());
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for s in 0..ranks {
            for t in 0..tokens {
                let xrow = &x[(s * tokens + t) * hidden..][..hidden];
                let mut y = vec![0.0f64; hidden];
                for j in 0..topk {
                    let i = (s * tokens + t) * topk + j;
                    if kept[i] != 1.0 {
                        assert_eq!(w[i], 0.0, "a dropped row has weight 0");
                        continue;
                    }
                    let e = ids[i] as usize;
                    let (d, el) = (e / local, e % local);
                    let up = &wu[(d * local + el) * hidden * 2 * inter..][..hidden * 2 * inter];
                    let down = &wd[(d * local + el) * inter * hidden..][..inter * hidden];
                    let h: Vec<f64> = (0..2 * inter)
                        .map(|n| (0..hidden).map(|k| xrow[k] * up[k * 2 * inter + n]).sum())
                        .collect();
                    let a: Vec<f64> = (0..inter).map(|n| silu(h[n]) * h[n + inter]).collect();
                    for (n, yn) in y.iter_mut().enumerate() {
                        *yn += w[i] * (0..inter).map(|k| a[k] * down[k * hidden + n]).sum::<f64>();
                    }
                }
                for n in 0..hidden {
                    let o = out[(s * tokens + t) * hidden + n];
                    err += (o - y[n]).powi(2);
                    norm += y[n].powi(2);
                }
            }
        }
        assert!(norm > 0.0);
        assert!((err / norm).sqrt() < 1e-4, "{route}: rel l2 {}", (err / norm).sqrt());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The MoE layer of [`moe`] with rank-deduplicated dispatch and combine (`by_rank`, then
/// `fanout`), forward and backward.
fn moe_views(ranks: u64, route: &str) -> String {
    moe(ranks, route)
        .replace(
            "route r = ",
            "route rr = by_rank(r);\nroute rl = fanout(rr);\nroute r = ",
        )
        .replace(
            "let xd = dispatch(x, r) tile(t: 4) order(ratr);",
            "let xr = dispatch(x, rr) tile(t: 4) order(ratr);\n  let xd = dispatch(xr, rl) tile(t: 4);",
        )
        .replace(
            "return combine(y, r) tile(m: 4) order(ratr);",
            "let yr = combine(y, rl) tile(m: 4);\n  return combine(yr, rr) tile(m: 4) order(ratr);",
        )
        .replace(
            "let dyd = combine_grad(dy, r) tile(t: 4) order(ratr);",
            "let dyr = combine_grad(dy, rr) tile(t: 4) order(ratr);\n  let dyd = combine_grad(dyr, rl) tile(t: 4);",
        )
        .replace(
            "let dx = dispatch_grad(dxd, r) tile(m: 4) order(ratr);",
            "let dxr = dispatch_grad(dxd, rl) tile(m: 4);\n  let dx = dispatch_grad(dxr, rr) tile(m: 4) order(ratr);",
        )
        .replace("gmm_grad_w(a, dyd, r)", "gmm_grad_w(a, dyd, rl)")
        .replace("gmm_grad_w(xd, dh, r)", "gmm_grad_w(xd, dh, rl)")
        .replace(
            "xd: bf16[r.recv, hidden], h: bf16[r.recv, 2 * inter]",
            "xd: bf16[rl.recv, hidden], h: bf16[rl.recv, 2 * inter]",
        )
}

#[test]
fn rank_deduplicated_layers_match_the_per_token_reference() {
    let routes = [
        ROUTES[1],
        ROUTES[2],
        "router(experts: experts, topk: topk, score: sigmoid, n_group: 2, topk_group: 1, skew: 0.5, seed: 2)",
        "zipf(experts: experts, topk: topk, s: 1.5, seed: 4, capacity_factor: 1.0, drop: true)",
    ];
    for ranks in [2u64, 4] {
        for route in routes {
            let text = moe_views(ranks, route);
            assert!(
                text.contains("by_rank") && !text.contains("dispatch(x, r)") && !text.contains(", r)"),
                "{text}"
            );
            let p = program(&text, &[]);
            for tf in 0..2 {
                for policy in Policy::all() {
                    let c = compile(&p, tf, policy, true);
                    let r = run(&p, tf, &c, false);
                    let per_token = r.checks.iter().filter(|c| c.reference == "per-token").count();
                    assert!(
                        per_token > 0,
                        "EP{ranks} {route}: the per-token reference applies to {}",
                        p.taskflows[tf].name
                    );
                    assert!(
                        r.passed(),
                        "EP{ranks} {route} {policy:?} {}:\n{}",
                        p.taskflows[tf].name,
                        r.text()
                    );
                }
            }
        }
    }
}
