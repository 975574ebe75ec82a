//! One layer, forward and backward: the backward `fwd_bwd` fed by the forward's memories
//! (its saved activations) computes the gradient of the forward, checked against central
//! finite differences of the forward evaluated densely in f64. The layer has routed experts
//! and a shared expert. With random saved activations instead, the same check fails.

use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::lower::TaskGraph;
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::numerics::{self, eval::RouteIndex, exec, store, store::TensorStore, Memories, NumericsOptions};

const LAYER: &str = "import std::moe::*;\nimport std::device::ascend_a3;\n\
param tokens = 6;\nparam hidden = 8;\nparam inter = 4;\nparam experts = 4;\nparam ranks = 2;\nparam local = experts / ranks;\n\
device = ascend_a3 { ranks: ranks };\n\
route r = uniform(experts: experts, topk: 2, seed: 3);\n\
taskflow fwd(x: f32[tokens, hidden], w_up: f32[local, hidden, 2 * inter], w_down: f32[local, inter, hidden],\n\
             ws_up: f32[hidden, 2 * inter], ws_down: f32[inter, hidden]) -> f32[tokens, hidden] {\n\
  let xd = dispatch(x, r) tile(t: 2);\n\
  let hs = mm(x, ws_up) tile(m: 4, n: 8);\n\
  let sa = swiglu(hs) tile(m: 2);\n\
  let ys = mm(sa, ws_down) tile(m: 4, n: 8);\n\
  let h = gmm(xd, w_up) tile(m: 4, n: 8);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let y = gmm(a, w_down) tile(m: 4, n: 8);\n\
  let yr = combine(y, r) tile(m: 2);\n\
  return add(yr, ys) tile(m: 2);\n}\n\
taskflow fwd_bwd(dy: f32[tokens, hidden], x: f32[tokens, hidden], xd: f32[r.recv, hidden], h: f32[r.recv, 2 * inter],\n\
             hs: f32[tokens, 2 * inter], w_up: f32[local, hidden, 2 * inter], w_down: f32[local, inter, hidden],\n\
             ws_up: f32[hidden, 2 * inter], ws_down: f32[inter, hidden])\n\
  -> (dx: f32[tokens, hidden], dw_up: f32[local, hidden, 2 * inter], dw_down: f32[local, inter, hidden],\n\
      dws_up: f32[hidden, 2 * inter], dws_down: f32[inter, hidden]) {\n\
  let dyd = combine_grad(dy, r) tile(t: 2);\n\
  let sa = swiglu(hs) tile(m: 2);\n\
  let dsa = mm_grad_x(dy, ws_down) tile(m: 4, k: 4);\n\
  let dws_down = mm_grad_w(sa, dy) tile(k: 4, n: 8);\n\
  let dhs = swiglu_grad(dsa, hs) tile(m: 2);\n\
  let dxs = mm_grad_x(dhs, ws_up) tile(m: 4, k: 8);\n\
  let dws_up = mm_grad_w(x, dhs) tile(k: 8, n: 8);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let da = gmm_grad_x(dyd, w_down) tile(m: 4, k: 4);\n\
  let dw_down = gmm_grad_w(a, dyd, r) tile(k: 4, n: 8);\n\
  let dh = swiglu_grad(da, h) tile(m: 2);\n\
  let dxd = gmm_grad_x(dh, w_up) tile(m: 4, k: 8);\n\
  let dw_up = gmm_grad_w(xd, dh, r) tile(k: 8, n: 8);\n\
  let dxr = dispatch_grad(dxd, r) tile(m: 2);\n\
  let dx = add(dxr, dxs) tile(m: 2);\n\
  return (dx, dw_up, dw_down, dws_up, dws_down);\n}\n";

fn program() -> Checked {
    let mut sm = SourceMap::new();
    let out = check_text("layer.hpm", LAYER, None, &Options::default(), &mut sm);
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

fn compile(p: &Checked, name: &str) -> Compiled {
    let spec = PolicySpec::defaults(p, Policy::Interleaved);
    p.compile(p.taskflow(name).unwrap(), &spec, &CompileOptions::default())
        .unwrap()
}

/// Runs a taskflow's numerics (fed by `saved` when given) and returns its memories.
fn numerics_of(
    p: &Checked,
    name: &str,
    c: &Compiled,
    saved: Option<&Memories>,
) -> (numerics::NumericsReport, Memories) {
    let order = numerics::schedule_order(&c.graph, &c.schedule);
    let opts = NumericsOptions {
        seed: 5,
        ..Default::default()
    };
    let (r, m) = numerics::run_bound(
        p,
        p.taskflow(name).unwrap(),
        &c.graph,
        &c.schedule,
        &order,
        &opts,
        saved,
        true,
    )
    .unwrap();
    (r, m.unwrap())
}

/// The loss `sum(dy * y)` of the forward on `inputs` (by name), evaluated densely in f64.
fn loss(tf: &Taskflow, g: &TaskGraph, inputs: &Memories, dy: &TensorStore<f64>) -> f64 {
    let routes: Vec<Option<RouteIndex>> = g.layouts.iter().map(|l| l.as_ref().map(RouteIndex::new)).collect();
    let mut st: Vec<TensorStore<f64>> = store::allocate(tf, g, false);
    for &i in &tf.inputs {
        st[i.0 as usize] = inputs.get(&tf.tensor(i).name).unwrap().clone();
    }
    exec::execute_dense(tf, g, &mut st, &routes);
    let y = &st[tf.outputs[0].1 .0 as usize];
    y.data
        .iter()
        .flatten()
        .zip(dy.data.iter().flatten())
        .map(|(a, b)| a * b)
        .sum()
}

/// Relative L2 distance between the backward's gradients and central finite differences of
/// the forward's loss, over a spread of elements of every input with a gradient.
fn gradient_error(p: &Checked, fc: &Compiled, fmem: &Memories, bmem: &Memories) -> f64 {
    let tf = p.taskflow("fwd").unwrap();
    let dy = bmem.get("dy").unwrap();
    let eps = 1e-4;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (input, grad) in [
        ("x", "dx"),
        ("w_up", "dw_up"),
        ("w_down", "dw_down"),
        ("ws_up", "dws_up"),
        ("ws_down", "dws_down"),
    ] {
        let g = bmem.get(grad).unwrap();
        for rank in 0..g.data.len() {
            let n = g.data[rank].len();
            for k in (0..n).step_by(7) {
                let mut plus = fmem.clone();
                let mut minus = fmem.clone();
                for (m, d) in [(&mut plus, eps), (&mut minus, -eps)] {
                    let t = m.tensors.iter_mut().find(|(nm, _)| nm == input).unwrap();
                    t.1.data[rank][k] += d;
                }
                let fd = (loss(tf, &fc.graph, &plus, dy) - loss(tf, &fc.graph, &minus, dy)) / (2.0 * eps);
                let got = g.data[rank][k];
                num += (fd - got) * (fd - got);
                den += fd * fd;
            }
        }
    }
    assert!(den > 0.0, "the gradient is not identically zero");
    (num / den).sqrt()
}

#[test]
fn backward_fed_by_the_forward_is_its_gradient() {
    let p = program();
    let (fc, bc) = (compile(&p, "fwd"), compile(&p, "fwd_bwd"));
    let (fr, fmem) = numerics_of(&p, "fwd", &fc, None);
    assert!(fr.passed(), "{}", fr.text());
    let (br, bmem) = numerics_of(&p, "fwd_bwd", &bc, Some(&fmem));
    assert!(br.passed(), "{}", br.text());
    let (f, names) = br.saved_from.clone().unwrap();
    assert_eq!(f, "fwd");
    assert_eq!(names, ["x", "xd", "h", "hs", "w_up", "w_down", "ws_up", "ws_down"]);
    // The saved `h` is the forward's xd * W_up: the same values, not fresh random ones.
    assert_eq!(bmem.get("h").unwrap().data, fmem.get("h").unwrap().data);
    let err = gradient_error(&p, &fc, &fmem, &bmem);
    assert!(
        err < 1e-4,
        "relative L2 error of the gradient vs finite differences: {err}"
    );
}

#[test]
fn random_saved_activations_are_not_the_gradient() {
    let p = program();
    let (fc, bc) = (compile(&p, "fwd"), compile(&p, "fwd_bwd"));
    let (_, fmem) = numerics_of(&p, "fwd", &fc, None);
    // Without the forward's memories, `xd`, `h` and `hs` are seeded random values (the
    // weights and `x` agree, seeded by name).
    let (br, bmem) = numerics_of(&p, "fwd_bwd", &bc, None);
    assert!(br.saved_from.is_none());
    let err = gradient_error(&p, &fc, &fmem, &bmem);
    assert!(err > 0.1, "random saved activations gave the gradient: {err}");
}

#[test]
fn saved_activation_of_another_window_is_refused() {
    // The forward under a static worst-case window and the backward under an exact one:
    // the saved window rows differ per rank, so feeding them is an error, not a wrong answer.
    let p = program();
    let fspec = PolicySpec::defaults(&p, Policy::ExpertLevel);
    let fc = p
        .compile(p.taskflow("fwd").unwrap(), &fspec, &CompileOptions::default())
        .unwrap();
    let bc = compile(&p, "fwd_bwd");
    let (_, fmem) = numerics_of(&p, "fwd", &fc, None);
    let btf = p.taskflow("fwd_bwd").unwrap();
    let xd = btf.named("xd").unwrap();
    let exact: Vec<Vec<usize>> = (0..2).map(|r| store::rank_shape(btf, &bc.graph, xd, r)).collect();
    assert_ne!(fmem.get("xd").unwrap().shape, exact, "the two windows should differ");
    let order = numerics::schedule_order(&bc.graph, &bc.schedule);
    let e = numerics::run_bound(
        &p,
        p.taskflow("fwd_bwd").unwrap(),
        &bc.graph,
        &bc.schedule,
        &order,
        &NumericsOptions::default(),
        Some(&fmem),
        false,
    )
    .unwrap_err();
    assert_eq!(e.code, hpmoe_dsl::Code::SavedMismatch);
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

/// Balanced routing, 2 ranks of 8 tokens, 4 experts, top-2: global token g picks experts
/// 2g mod 4 and 2g + 1 mod 4, so every rank sends 4 rows to every expert and every expert
/// receives 8 rows (4 from each rank).
const SMALL: &str = "import std::moe::*;\nimport std::device::ascend_a3;\n\
device = ascend_a3 { ranks: 2 };\n\
route r = balanced(experts: 4, topk: 2, tokens: 8);\n";

#[test]
fn dispatch_only_and_combine_only_lower_to_the_counted_tasks() {
    let p = checked(&format!(
        "{SMALL}taskflow d(x: bf16[8, 16]) -> bf16[r.recv, 16] {{ return dispatch(x, r) tile(t: 3); }}\n\
         taskflow c(y: bf16[r.recv, 16]) -> bf16[8, 16] {{ return combine(y, r) tile(m: 3); }}\n\
         taskflow c2(y: bf16[r.recv, 16]) -> bf16[8, 16] {{ return combine(y, r) tile(m: 3) order(ratr); }}\n"
    ));
    // dispatch: per rank, 4 destination experts x ceil(4 / 3) = 2 tiles: 8; 16 in all.
    assert_eq!(compile(&p, "d").graph.len(), 16);
    // combine: per rank, 2 local experts of 8 rows, ceil(8 / 3) = 3 tiles each: 6; 12 in all.
    assert_eq!(compile(&p, "c").graph.len(), 12);
    // with order(ratr) every tile has one destination: per expert 2 sources x ceil(4 / 3).
    assert_eq!(compile(&p, "c2").graph.len(), 16);
}

/// The row of (rank s, token t, choice j) in its destination's window, from the expert ids
/// alone (docs/FORMATS.md "Receive windows"), written independently of the lowering.
#[allow(clippy::too_many_arguments)]
fn window_row(
    ids: &[f64],
    ranks: usize,
    tokens: usize,
    topk: usize,
    local: usize,
    s: usize,
    t: usize,
    j: usize,
    static_cap: bool,
) -> usize {
    let id = |s: usize, t: usize, j: usize| ids[(s * tokens + t) * topk + j] as usize;
    let picked = |s: usize, t: usize, e: usize| (0..topk).any(|j| id(s, t, j) == e);
    let n = |s: usize, e: usize| (0..tokens).filter(|&t| picked(s, t, e)).count();
    let e = id(s, t, j);
    let (d, el) = (e / local, e % local);
    let before = (0..t).filter(|&u| picked(s, u, e)).count();
    if static_cap {
        return (el * ranks + s) * tokens + before;
    }
    let earlier: usize = (0..el)
        .flat_map(|e2| (0..ranks).map(move |s2| (s2, d * local + e2)))
        .map(|(s2, e2)| n(s2, e2))
        .sum();
    earlier + (0..s).map(|s2| n(s2, e)).sum::<usize>() + before
}

#[test]
fn dumped_window_rows_follow_the_documented_layout() {
    let text = "import std::moe::*;\nimport std::device::ascend_a3;\n\
        device = ascend_a3 { ranks: 2 };\n\
        route r = zipf(experts: 8, topk: 2, s: 1.1, seed: 4);\n\
        taskflow d(x: f32[10, 4]) -> f32[r.recv, 4] { return dispatch(x, r) tile(t: 2); }\n";
    let p = checked(text);
    for (policy, static_cap) in [(Policy::Interleaved, false), (Policy::ExpertLevel, true)] {
        let dir = std::env::temp_dir().join(format!("hpmoe-window-rows-{}-{static_cap}", std::process::id()));
        let spec = PolicySpec::defaults(&p, policy);
        let c = p
            .compile(p.taskflow("d").unwrap(), &spec, &CompileOptions::default())
            .unwrap();
        let order = numerics::schedule_order(&c.graph, &c.schedule);
        let opts = NumericsOptions {
            dump: Some(dir.clone()),
            ..Default::default()
        };
        let r = numerics::run(&p, p.taskflow("d").unwrap(), &c.graph, &c.schedule, &order, &opts).unwrap();
        assert!(r.passed(), "{}", r.text());
        let ids = hpmoe_dsl::npy::read(&dir.join("route_ids.npy")).unwrap();
        let rows = hpmoe_dsl::npy::read(&dir.join("route_window_rows.npy")).unwrap();
        let x = hpmoe_dsl::npy::read(&dir.join("x.npy")).unwrap();
        let out = hpmoe_dsl::npy::read(&dir.join("out.npy")).unwrap();
        assert_eq!(rows.shape, [2, 10, 2]);
        let max_rows = out.shape[1];
        if static_cap {
            assert_eq!(max_rows, 4 * 2 * 10, "L * ranks * tokens rows");
        }
        for s in 0..2 {
            for t in 0..10 {
                for j in 0..2 {
                    let row = window_row(&ids.data, 2, 10, 2, 4, s, t, j, static_cap);
                    assert_eq!(
                        rows.data[(s * 10 + t) * 2 + j] as usize,
                        row,
                        "rank {s} token {t} choice {j}"
                    );
                    // The dispatched window holds x's row there.
                    let d = ids.data[(s * 10 + t) * 2 + j] as usize / 4;
                    for h in 0..4 {
                        assert_eq!(out.data[(d * max_rows + row) * 4 + h], x.data[(s * 10 + t) * 4 + h]);
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
