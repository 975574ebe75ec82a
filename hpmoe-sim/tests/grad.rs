//! Backwards derived by `grad`: their numerics are the gradient of the forward (central
//! finite differences of the forward evaluated densely in f64), and the derived backward of
//! the MoE FFN computes what the stdlib's written backward computes, to f32 rounding.

use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::lower::TaskGraph;
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use hpmoe_sim::numerics::{self, eval::RouteIndex, exec, store, store::TensorStore, Memories, NumericsOptions};

const HEAD: &str = "import std::moe::*;\nimport std::device::ascend_a3;\n\
param tokens = 6;\nparam hidden = 8;\nparam inter = 4;\nparam experts = 4;\nparam ranks = 2;\nparam local = experts / ranks;\n\
device = ascend_a3 { ranks: ranks };\n\
route r = uniform(experts: experts, topk: 2, seed: 3);\n";

/// A layer with routed experts behind an activation that exercises every derivable scalar
/// function (and a cast, whose f32 rounding in the forward limits the finite differences to
/// about 1e-4), a shared expert (so `x` has two consumers) and a sum of the two.
const LAYER: &str = "\
op act<T>(h: T[M, N]) -> T[M, N] on aiv {\n\
    let s = sigmoid(h[m, n]);\n\
    out[m, n] = exp(h[m, n] * 0.5) * s + tanh(h[m, n]) / (1.0 + s * s) + gelu(h[m, n])\n\
        - sqrt(1.0 + h[m, n] * h[m, n]) + log(2.0 + silu(h[m, n])) + cast<T>(rsqrt(2.0 + dsilu(h[m, n])));\n\
}\n\
taskflow fwd(x: f32[tokens, hidden], w_up: f32[local, hidden, 2 * inter], w_down: f32[local, inter, hidden],\n\
             ws_up: f32[hidden, 2 * inter], ws_down: f32[inter, hidden]) -> f32[tokens, hidden] {\n\
  let xd = dispatch(x, r) tile(t: 2);\n\
  let hs = mm(x, ws_up) tile(m: 4, n: 8);\n\
  let sa = swiglu(hs) tile(m: 2);\n\
  let ys = mm(sa, ws_down) tile(m: 4, n: 8);\n\
  let h = gmm(xd, w_up) tile(m: 4, n: 8);\n\
  let a = swiglu(act(h)) tile(m: 2);\n\
  let y = gmm(a, w_down) tile(m: 4, n: 8);\n\
  let yr = combine(y, r) tile(m: 2);\n\
  return add(yr, ys) tile(m: 2);\n}\n\
taskflow fwd_bwd = grad(fwd, wrt: [x, w_up, w_down, ws_up, ws_down], save: [xd]);\n";

/// The MoE FFN with the stdlib's written backward and a derived one.
const MOE: &str = "\
taskflow moe_ffn(x: f32[tokens, hidden], w_up: f32[local, hidden, 2 * inter], w_down: f32[local, inter, hidden])\n\
    -> f32[tokens, hidden] {\n\
  let xd = dispatch(x, r) tile(t: 2);\n\
  let h = gmm(xd, w_up) tile(m: 4, n: 8);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let y = gmm(a, w_down) tile(m: 4, n: 8);\n\
  return combine(y, r) tile(m: 2);\n}\n\
taskflow moe_ffn_bwd(dy: f32[tokens, hidden], xd: f32[r.recv, hidden], h: f32[r.recv, 2 * inter],\n\
    w_up: f32[local, hidden, 2 * inter], w_down: f32[local, inter, hidden])\n\
    -> (dx: f32[tokens, hidden], dw_up: f32[local, hidden, 2 * inter], dw_down: f32[local, inter, hidden]) {\n\
  let dyd = combine_grad(dy, r) tile(t: 2);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let da = gmm_grad_x(dyd, w_down) tile(m: 4, k: 4);\n\
  let dw_down = gmm_grad_w(a, dyd, r) tile(k: 4, n: 8);\n\
  let dh = swiglu_grad(da, h) tile(m: 2);\n\
  let dxd = gmm_grad_x(dh, w_up) tile(m: 4, k: 8);\n\
  let dw_up = gmm_grad_w(xd, dh, r) tile(k: 8, n: 8);\n\
  let dx = dispatch_grad(dxd, r) tile(m: 2);\n\
  return (dx, dw_up, dw_down);\n}\n\
taskflow moe_ffn_derived = grad(moe_ffn, wrt: [x, w_up, w_down], save: [xd, h]);\n";

fn program(body: &str) -> Checked {
    let text = format!("{HEAD}{body}");
    let mut sm = SourceMap::new();
    let out = check_text("grad.hpm", &text, None, &Options::default(), &mut sm);
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

fn compile(p: &Checked, name: &str, policy: Policy) -> Compiled {
    let spec = PolicySpec::defaults(p, policy);
    p.compile(p.taskflow(name).unwrap(), &spec, &CompileOptions::default())
        .unwrap()
}

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

/// Relative L2 distance and largest absolute difference between the backward's gradients
/// and central finite differences of the forward's loss, over every element.
fn gradient_error(
    p: &Checked,
    fwd: &str,
    fc: &Compiled,
    fmem: &Memories,
    bmem: &Memories,
    pairs: &[(&str, &str)],
) -> (f64, f64) {
    let tf = p.taskflow(fwd).unwrap();
    let dy = bmem.get("dy").unwrap();
    let eps = 1e-4;
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (input, grad) in pairs {
        let g = bmem.get(grad).unwrap();
        for rank in 0..g.data.len() {
            for k in 0..g.data[rank].len() {
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
                max_abs = max_abs.max((fd - got).abs());
            }
        }
    }
    assert!(den > 0.0, "the gradient is not identically zero");
    ((num / den).sqrt(), max_abs)
}

#[test]
fn derived_backward_is_the_finite_difference_gradient() {
    let p = program(LAYER);
    for policy in [Policy::Interleaved, Policy::KernelByKernel, Policy::ExpertLevel] {
        let (fc, bc) = (compile(&p, "fwd", policy), compile(&p, "fwd_bwd", policy));
        let (fr, fmem) = numerics_of(&p, "fwd", &fc, None);
        assert!(fr.passed(), "{}", fr.text());
        let (br, bmem) = numerics_of(&p, "fwd_bwd", &bc, Some(&fmem));
        assert!(br.passed(), "{}", br.text());
        let (f, names) = br.saved_from.clone().unwrap();
        assert_eq!(f, "fwd");
        assert_eq!(names, ["x", "w_up", "w_down", "ws_up", "ws_down", "xd"]);
        let pairs = [
            ("x", "dx"),
            ("w_up", "dw_up"),
            ("w_down", "dw_down"),
            ("ws_up", "dws_up"),
            ("ws_down", "dws_down"),
        ];
        let (rel, max_abs) = gradient_error(&p, "fwd", &fc, &fmem, &bmem, &pairs);
        eprintln!("{policy:?}: derived gradient vs finite differences: rel L2 {rel:.3e}, max |diff| {max_abs:.3e}");
        assert!(
            rel < 1e-4,
            "relative L2 error of the derived gradient vs finite differences: {rel}"
        );
    }
}

#[test]
fn derived_moe_ffn_backward_equals_the_written_one() {
    let p = program(MOE);
    let fc = compile(&p, "moe_ffn", Policy::Interleaved);
    let (_, fmem) = numerics_of(&p, "moe_ffn", &fc, None);
    let written = compile(&p, "moe_ffn_bwd", Policy::Interleaved);
    let derived = compile(&p, "moe_ffn_derived", Policy::Interleaved);
    // The same calls: the recomputed activation, two products per `gmm`, the two adjoints.
    let (wt, dt) = (
        p.taskflow("moe_ffn_bwd").unwrap(),
        p.taskflow("moe_ffn_derived").unwrap(),
    );
    assert_eq!(wt.nodes.len(), dt.nodes.len());
    let (wr, wmem) = numerics_of(&p, "moe_ffn_bwd", &written, Some(&fmem));
    let (dr, dmem) = numerics_of(&p, "moe_ffn_derived", &derived, Some(&fmem));
    assert!(wr.passed() && dr.passed(), "{}\n{}", wr.text(), dr.text());
    // The derived backward is recognised by the per-token MoE-FFN reference too: each of its
    // gradients is checked against it (and passed, above).
    for g in ["dx", "dw_up", "dw_down"] {
        assert!(
            dr.checks
                .iter()
                .any(|c| c.output == g && c.reference == "per-token" && c.ok),
            "{}",
            dr.text()
        );
    }
    for g in ["dx", "dw_up", "dw_down"] {
        let (a, b) = (wmem.get(g).unwrap(), dmem.get(g).unwrap());
        let (mut max_abs, mut scale) = (0.0f64, 0.0f64);
        for (x, y) in a.data.iter().flatten().zip(b.data.iter().flatten()) {
            max_abs = max_abs.max((x - y).abs());
            scale = scale.max(x.abs());
        }
        eprintln!("{g}: derived vs written backward: max |diff| {max_abs:.3e} (largest |value| {scale:.3e})");
        assert!(
            max_abs <= 4.0 * f32::EPSILON as f64 * scale,
            "{g}: {max_abs} vs scale {scale}"
        );
    }
    // Both are the gradient.
    let pairs = [("x", "dx"), ("w_up", "dw_up"), ("w_down", "dw_down")];
    let (rel, max_abs) = gradient_error(&p, "moe_ffn", &fc, &fmem, &dmem, &pairs);
    eprintln!("MoE FFN derived gradient vs finite differences: rel L2 {rel:.3e}, max |diff| {max_abs:.3e}");
    assert!(rel < 1e-4);
}

#[test]
fn derived_ops_reuse_the_forward_tiles() {
    let p = program(MOE);
    let tf = p.taskflow("moe_ffn_derived").unwrap();
    let tiles: Vec<(String, Vec<(String, u64)>)> = tf
        .nodes
        .iter()
        .map(|n| (p.op(n.op).name.clone(), n.tile.clone()))
        .collect();
    let find = |op: &str| tiles.iter().rev().find(|(o, _)| o == op).unwrap().1.clone();
    let t = |v: &[(&str, u64)]| v.iter().map(|(n, s)| (n.to_string(), *s)).collect::<Vec<_>>();
    // The first gmm's m: 4, n: 8, k: 8 (its k-step 64 clamped to hidden): the input gradient
    // `dxd` writes m (4) and k (n's 8) and sums n in steps of k's 8.
    assert_eq!(find("gmm_vjp_x"), t(&[("m", 4), ("k", 8), ("n", 8)]));
    assert_eq!(find("gmm_vjp_w")[0], ("g".to_string(), 1));
    assert_eq!(find("dispatch_vjp_x")[0], ("m".to_string(), 2));
    assert_eq!(find("combine_vjp_y")[0], ("t".to_string(), 2));
}

/// One scalar function's derived gradient against finite differences.
fn function_error(body: &str) -> f64 {
    let text = format!(
        "op f<T>(h: T[M, N]) -> T[M, N] on aiv {{\n    out[m, n] = {body};\n}}\n\
         taskflow fwd(x: f32[tokens, hidden]) -> f32[tokens, hidden] {{\n  return f(x) tile(m: 2);\n}}\n\
         taskflow fwd_bwd = grad(fwd, wrt: [x]);\n"
    );
    let p = program(&text);
    let (fc, bc) = (
        compile(&p, "fwd", Policy::Interleaved),
        compile(&p, "fwd_bwd", Policy::Interleaved),
    );
    let (_, fmem) = numerics_of(&p, "fwd", &fc, None);
    let (br, bmem) = numerics_of(&p, "fwd_bwd", &bc, Some(&fmem));
    assert!(br.passed(), "{}", br.text());
    gradient_error(&p, "fwd", &fc, &fmem, &bmem, &[("x", "dx")]).0
}

#[test]
fn each_derivable_function_matches_finite_differences() {
    for body in [
        "exp(h[m, n])",
        "log(2.0 + h[m, n])",
        "sqrt(2.0 + h[m, n])",
        "rsqrt(2.0 + h[m, n])",
        "tanh(h[m, n])",
        "sigmoid(h[m, n])",
        "silu(h[m, n])",
        "dsilu(h[m, n])",
        "gelu(h[m, n])",
        "gelu_tanh(h[m, n])",
        "cast<T>(h[m, n] * h[m, n])",
        "h[m, n] / (2.0 + h[m, n] * h[m, n])",
        "-h[m, n] * 3.0 - 1.0",
    ] {
        let e = function_error(body);
        eprintln!("{body}: rel L2 vs finite differences {e:.3e}");
        // The forward's cast rounds to f32: its finite differences carry that rounding
        // (a step of 2^-24 relative over 2e-4), the derived gradient (the cast's identity
        // derivative) does not.
        let tol = if body.starts_with("cast") { 1e-3 } else { 1e-6 };
        assert!(e < tol, "{body}: {e}");
    }
}

/// A reduction inside the body (an RMS-norm-like scale), a broadcast of a vector and a
/// reduction to a column: their gradients are broadcasts and reductions.
#[test]
fn reductions_and_broadcasts_match_finite_differences() {
    let text = "\
op rms<T>(x: T[M, N], b: T[N]) -> T[M, N] on aiv {\n\
    out[m, n] = x[m, n] * b[n] * rsqrt(1.0 + sum(k) x[m, k] * x[m, k]);\n\
}\n\
op rowsum<T>(x: T[M, N]) -> T[M, 1] on aiv {\n\
    out[m, j] = sum(n) exp(x[m, n]);\n\
}\n\
op scale<T>(x: T[M, N], s: T[M, 1]) -> T[M, N] on aiv {\n\
    out[m, n] = x[m, n] / s[m, 0];\n\
}\n\
taskflow fwd(x: f32[tokens, hidden], b: f32[hidden]) -> f32[tokens, hidden] {\n\
  let y = rms(x, b) tile(m: 2);\n\
  let s = rowsum(y) tile(m: 2);\n\
  return scale(y, s) tile(m: 2);\n}\n\
taskflow fwd_bwd = grad(fwd, wrt: [x, b]);\n";
    let p = program(text);
    let (fc, bc) = (
        compile(&p, "fwd", Policy::Interleaved),
        compile(&p, "fwd_bwd", Policy::Interleaved),
    );
    let (_, fmem) = numerics_of(&p, "fwd", &fc, None);
    let (br, bmem) = numerics_of(&p, "fwd_bwd", &bc, Some(&fmem));
    assert!(br.passed(), "{}", br.text());
    let (rel, max_abs) = gradient_error(&p, "fwd", &fc, &fmem, &bmem, &[("x", "dx"), ("b", "db")]);
    eprintln!("reductions and broadcasts: rel L2 {rel:.3e}, max |diff| {max_abs:.3e}");
    assert!(rel < 1e-6, "{rel}");
}

/// The adjoints derived for `dispatch` and `combine` are the stdlib's `dispatch_grad` and
/// `combine_grad` (the same analysed body), and `gmm`'s input gradient is `gmm_grad_x`.
#[test]
fn derived_adjoints_are_the_stdlib_backward_ops() {
    let p = program(MOE);
    let (wt, dt) = (
        p.taskflow("moe_ffn_bwd").unwrap(),
        p.taskflow("moe_ffn_derived").unwrap(),
    );
    let body = |tf: &Taskflow, op: &str| {
        tf.nodes
            .iter()
            .find(|n| p.op(n.op).name == op)
            .unwrap_or_else(|| panic!("no call of {op}"))
            .body
            .clone()
    };
    for (derived, written) in [
        ("dispatch_vjp_x", "dispatch_grad"),
        ("combine_vjp_y", "combine_grad"),
        ("gmm_vjp_x", "gmm_grad_x"),
    ] {
        assert_eq!(body(dt, derived), body(wt, written), "{derived} vs {written}");
    }
}

/// A program from a file of the repository (relative to the workspace root) with `extra`
/// appended and params overridden, checked with imports relative to the file.
fn example(path: &str, extra: &str, set: &[&str]) -> (Checked, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let file = root.join(path);
    let text = format!("{}{extra}", std::fs::read_to_string(&file).unwrap());
    let opts = Options {
        overrides: set
            .iter()
            .map(|s| hpmoe_dsl::check::Override::parse(s).unwrap())
            .collect(),
        ..Default::default()
    };
    let mut sm = SourceMap::new();
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    let out = check_text(&name, &text, file.parent(), &opts, &mut sm);
    let p = out.checked.unwrap_or_else(|| {
        panic!(
            "{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        )
    });
    (p, text)
}

/// The small shapes every example is run at here.
const SMALL: &[&str] = &["tokens=6", "hidden=8", "inter=4", "experts=4", "topk=2", "ranks=2"];

/// The forward and its derived backward run (tiled, f32) under one policy, and the relative
/// L2 error of the backward's gradients against central finite differences of the forward.
fn fd_error(p: &Checked, fwd: &str, bwd: &str, pairs: &[(&str, &str)]) -> f64 {
    let (fc, bc) = (
        compile(p, fwd, Policy::Interleaved),
        compile(p, bwd, Policy::Interleaved),
    );
    let (fr, fmem) = numerics_of(p, fwd, &fc, None);
    assert!(fr.passed(), "{}", fr.text());
    let (br, bmem) = numerics_of(p, bwd, &bc, Some(&fmem));
    assert!(br.passed(), "{}", br.text());
    let (rel, max_abs) = gradient_error(p, fwd, &fc, &fmem, &bmem, pairs);
    eprintln!("{bwd}: rel L2 vs finite differences {rel:.3e}, max |diff| {max_abs:.3e}");
    rel
}

/// `examples/geglu.hpm` (its own `geglu` op: `gelu(gate) * up`, two reads of one input at
/// different offsets) with a derived backward, at small shapes.
#[test]
fn geglu_example_backward_matches_finite_differences() {
    let (p, _) = example(
        "examples/geglu.hpm",
        "taskflow moe_geglu_bwd = grad(moe_geglu, wrt: [x, w_up, w_down], save: [xd]);\n",
        SMALL,
    );
    let tf = p.taskflow("moe_geglu_bwd").unwrap();
    assert!(tf.nodes.iter().any(|n| p.op(n.op).name == "geglu_vjp_h"));
    let rel = fd_error(
        &p,
        "moe_geglu",
        "moe_geglu_bwd",
        &[("x", "dx"), ("w_up", "dw_up"), ("w_down", "dw_down")],
    );
    assert!(rel < 1e-6, "{rel}");
}

/// An expert `gmm → GeLU → gmm` in each GeLU form (tanh and erf) behind the routing.
#[test]
fn gelu_experts_backward_matches_finite_differences() {
    for f in ["gelu", "gelu_tanh", "gelu_erf"] {
        let body = format!(
            "op act<T>(h: T[M, N]) -> T[M, N] on aiv {{\n    out[m, n] = {f}(h[m, n]);\n}}\n\
             taskflow fwd(x: f32[tokens, hidden], w_up: f32[local, hidden, inter], w_down: f32[local, inter, hidden])\n\
                 -> f32[tokens, hidden] {{\n\
               let xd = dispatch(x, r) tile(t: 2);\n\
               let h = gmm(xd, w_up) tile(m: 4, n: 4);\n\
               let a = act(h) tile(m: 2);\n\
               let y = gmm(a, w_down) tile(m: 4, n: 8);\n\
               return combine(y, r) tile(m: 2);\n}}\n\
             taskflow fwd_bwd = grad(fwd, wrt: [x, w_up, w_down], save: [h]);\n"
        );
        let p = program(&body);
        let rel = fd_error(
            &p,
            "fwd",
            "fwd_bwd",
            &[("x", "dx"), ("w_up", "dw_up"), ("w_down", "dw_down")],
        );
        assert!(rel < 1e-6, "{f}: {rel}");
    }
}

/// `erf` and `gelu_erf` alone, and `gelu_erf` against `gelu_tanh`: their derivatives differ,
/// so a gradient of the one is not the finite differences of the other.
#[test]
fn erf_and_gelu_erf_gradients_match_finite_differences() {
    for body in ["erf(h[m, n])", "gelu_erf(h[m, n])", "erf(h[m, n] * 0.5) * h[m, n]"] {
        let e = function_error(body);
        eprintln!("{body}: rel L2 vs finite differences {e:.3e}");
        assert!(e < 1e-6, "{body}: {e}");
    }
}

/// Rounding to a quantised or integer dtype has no derivative: the quantised dispatch
/// example's backward is refused with E0521, naming the rounded tensor.
#[test]
fn quantised_forward_is_not_differentiable() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let file = root.join("examples/quant_dispatch.hpm");
    for (wrt, tensor) in [("x", "xq"), ("w_up", "w_up"), ("s_up", "aq")] {
        let text = format!(
            "{}taskflow q_bwd = grad(moe_int8, wrt: [{wrt}]);\n",
            std::fs::read_to_string(&file).unwrap()
        );
        let mut sm = SourceMap::new();
        let out = check_text("quant_dispatch.hpm", &text, file.parent(), &Options::default(), &mut sm);
        assert!(out.checked.is_none());
        let errs: Vec<_> = out.diagnostics.as_slice().iter().filter(|d| d.is_error()).collect();
        assert!(!errs.is_empty());
        for d in &errs {
            assert_eq!(d.code, hpmoe_dsl::diag::Code::NotDifferentiable, "{}", d.message);
        }
        assert!(
            errs.iter().any(|d| d
                .message
                .starts_with(&format!("`{tensor}` is on the path of the gradient"))
                && d.message.contains("rounding has no derivative")),
            "{wrt}: {:?}",
            errs.iter().map(|d| &d.message).collect::<Vec<_>>()
        );
    }
}

/// Whether two task graphs of two programs have the same tasks, costs and dependencies.
fn same_graph(a: &TaskGraph, b: &TaskGraph) -> bool {
    let bits = |v: &[f32], w: &[f32]| v.len() == w.len() && v.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits());
    a.len() == b.len()
        && a.nodes == b.nodes
        && a.rank == b.rank
        && a.node == b.node
        && a.tile == b.tile
        && bits(&a.flops, &b.flops)
        && bits(&a.bytes_in, &b.bytes_in)
        && bits(&a.bytes_out, &b.bytes_out)
        && a.wait == b.wait
        && a.counters == b.counters
        && a.signals == b.signals
}

/// `driver::expand_grads` writes the program with each `grad` replaced by ordinary source:
/// the text has no `grad` left, checks, and each derived taskflow is the same as in the
/// original: the same calls and bodies, the same task graph under every policy and the same
/// numbers (bit for bit) from the same forward.
fn expansion_round_trips(p: &Checked, text: &str, pairs: &[(&str, &str)], set: &[&str]) {
    let expanded = hpmoe_dsl::driver::expand_grads(p, text).unwrap();
    assert!(!expanded.contains("= grad("), "{expanded}");
    // Canonical: formatting it again changes nothing.
    assert_eq!(hpmoe_dsl::syntax::fmt::format_source(&expanded).unwrap(), expanded);
    let opts = Options {
        overrides: set
            .iter()
            .map(|s| hpmoe_dsl::check::Override::parse(s).unwrap())
            .collect(),
        ..Default::default()
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut sm = SourceMap::new();
    let out = check_text("expanded.hpm", &expanded, Some(&dir), &opts, &mut sm);
    let q = out.checked.unwrap_or_else(|| {
        panic!(
            "{expanded}\n{}",
            hpmoe_dsl::diag::render_all(
                out.diagnostics.as_slice(),
                hpmoe_dsl::diag::Dropped::NONE,
                &sm,
                hpmoe_dsl::diag::RenderStyle::Plain
            )
        )
    });
    assert!(q.grads.is_empty());
    assert_eq!(
        p.taskflows.iter().map(|t| &t.name).collect::<Vec<_>>(),
        q.taskflows.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    assert!(!p.grads.is_empty());
    for &(fwd, bwd) in pairs {
        let (a, b) = (p.taskflow(bwd).unwrap(), q.taskflow(bwd).unwrap());
        assert_eq!(a.nodes.len(), b.nodes.len());
        for (x, y) in a.nodes.iter().zip(&b.nodes) {
            assert_eq!(p.op(x.op).name, q.op(y.op).name);
            assert_eq!(x.body, y.body, "{}", p.op(x.op).name);
            assert_eq!(x.tile, y.tile);
        }
        for policy in [Policy::Interleaved, Policy::KernelByKernel, Policy::ExpertLevel] {
            let (pb, qb) = (compile(p, bwd, policy), compile(&q, bwd, policy));
            assert!(!pb.graph.is_empty());
            assert!(same_graph(&pb.graph, &qb.graph), "{bwd} under {policy:?}");
        }
        let (pf, qf) = (
            compile(p, fwd, Policy::Interleaved),
            compile(&q, fwd, Policy::Interleaved),
        );
        let (_, pmem) = numerics_of(p, fwd, &pf, None);
        let (_, qmem) = numerics_of(&q, fwd, &qf, None);
        let (pb, qb) = (
            compile(p, bwd, Policy::Interleaved),
            compile(&q, bwd, Policy::Interleaved),
        );
        let (pr, pm) = numerics_of(p, bwd, &pb, Some(&pmem));
        let (qr, qm) = numerics_of(&q, bwd, &qb, Some(&qmem));
        assert!(pr.passed() && qr.passed());
        assert_eq!(pr.saved_from, qr.saved_from);
        for (name, t) in &pm.tensors {
            let u = qm.get(name).unwrap();
            assert!(
                t.data
                    .iter()
                    .flatten()
                    .zip(u.data.iter().flatten())
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{bwd}: {name} differs"
            );
        }
    }
}

#[test]
fn expanded_grad_source_checks_and_runs_as_the_grad() {
    let p = program(LAYER);
    expansion_round_trips(&p, &format!("{HEAD}{LAYER}"), &[("fwd", "fwd_bwd")], &[]);
    let p = program(MOE);
    expansion_round_trips(&p, &format!("{HEAD}{MOE}"), &[("moe_ffn", "moe_ffn_derived")], &[]);
    let (p, text) = example(
        "examples/geglu.hpm",
        "/// The backward.\ntaskflow moe_geglu_bwd = grad(moe_geglu, wrt: [x, w_up, w_down], save: [xd]);\n",
        SMALL,
    );
    expansion_round_trips(&p, &text, &[("moe_geglu", "moe_geglu_bwd")], SMALL);
    let (p, text) = example("examples/deepseek_v3_grad.hpm", "", SMALL);
    let pairs: Vec<(String, String)> = p
        .grads
        .iter()
        .map(|g| (g.forward.clone(), g.taskflow.clone()))
        .collect();
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    expansion_round_trips(&p, &text, &pairs, SMALL);
}

/// The quantised MoE FFN of `examples/quant_dispatch.hpm` (int8 activations and weights, per
/// token scales) with a straight-through backward, and its surrogate: the same graph in f32
/// in which each rounding is `v / s + e`, with the scale `s` and the rounding residual `e`
/// inputs (what a straight-through estimator holds constant).
const QUANT: &str = "\
import std::quant::*;\n\
taskflow q(x: f32[tokens, hidden], w_up: i8[local, hidden, 2 * inter], s_up: f32[local, 2 * inter],\n\
           w_down: i8[local, inter, hidden], s_down: f32[local, hidden]) -> bf16[tokens, hidden] {\n\
  let sx = token_scale_i8(x) tile(m: 2);\n\
  let xq = quantize_i8(x, sx) tile(m: 2);\n\
  let xd = dispatch(xq, r) tile(t: 2);\n\
  let sd = dispatch_scale(sx, r) tile(t: 2);\n\
  let hq = qgmm(xd, w_up) tile(m: 4, n: 8);\n\
  let h = dequant_gmm(hq, sd, s_up) tile(m: 2);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let sa = token_scale_i8(a) tile(m: 2);\n\
  let aq = quantize_i8(a, sa) tile(m: 2);\n\
  let yq = qgmm(aq, w_down) tile(m: 4, n: 8);\n\
  let y = dequant_gmm(yq, sa, s_down) tile(m: 2);\n\
  return combine(y, r) tile(m: 2);\n}\n\
taskflow q_bwd = grad(q, wrt: [x, w_up, w_down], save: [xd, h], straight_through: [xq, aq, w_up, w_down],\n\
                      detach: [sx, sa]);\n\
op ste<T>(v: T[M, H], s: f32[M], e: f32[M, H]) -> f32[M, H] on aiv {\n\
    out[m, h] = v[m, h] / s[m] + e[m, h];\n}\n\
taskflow surrogate(x: f32[tokens, hidden], w_up: f32[local, hidden, 2 * inter], s_up: f32[local, 2 * inter],\n\
           w_down: f32[local, inter, hidden], s_down: f32[local, hidden],\n\
           sx: f32[tokens], ex: f32[tokens, hidden], sa: f32[r.recv], ea: f32[r.recv, inter]) -> bf16[tokens, hidden] {\n\
  let xq = ste(x, sx, ex) tile(m: 2);\n\
  let xd = dispatch(xq, r) tile(t: 2);\n\
  let sd = dispatch_scale(sx, r) tile(t: 2);\n\
  let hq = qgmm(xd, w_up) tile(m: 4, n: 8);\n\
  let h = dequant_gmm(hq, sd, s_up) tile(m: 2);\n\
  let a = swiglu(h) tile(m: 2);\n\
  let aq = ste(a, sa, ea) tile(m: 2);\n\
  let yq = qgmm(aq, w_down) tile(m: 4, n: 8);\n\
  let y = dequant_gmm(yq, sa, s_down) tile(m: 2);\n\
  return combine(y, r) tile(m: 2);\n}\n";

/// The straight-through backward of a quantised forward is the gradient of its surrogate: the
/// forward's rounding `round(v / s)` replaced by `v / s + e`, with the scale `s` and the
/// residual `e = round(v / s) - v / s` frozen at the forward's values (so the surrogate's
/// values are the forward's, and its derivative passes each rounding unchanged). Central
/// finite differences of the surrogate, evaluated densely in f64, against the backward's
/// gradients of the activations and of the int8 weights (as real values), under every
/// policy.
#[test]
fn straight_through_backward_is_the_gradient_of_the_surrogate() {
    straight_through_case("i8");
}

/// The same with fp8 E4M3 activations and weights (rounding to 3 mantissa bits).
#[test]
fn straight_through_fp8_backward_is_the_gradient_of_the_surrogate() {
    straight_through_case("e4m3");
}

/// `QUANT` with the rounding of `kind` (`i8` or `e4m3`), checked under every policy.
fn straight_through_case(kind: &str) {
    let text = if kind == "i8" {
        QUANT.to_string()
    } else {
        QUANT
            .replace("_i8", &format!("_{kind}"))
            .replace("i8[", &format!("fp8{kind}["))
    };
    let p = program(&text);
    // The largest rounding residual of a value `v / s` in units of the scale.
    let bound = |v: f64| {
        if kind == "i8" {
            0.5
        } else {
            v.abs() * 2f64.powi(-4) + 2f64.powi(-10)
        }
    };
    for policy in [Policy::Interleaved, Policy::KernelByKernel, Policy::ExpertLevel] {
        let (fc, bc, sc) = (
            compile(&p, "q", policy),
            compile(&p, "q_bwd", policy),
            compile(&p, "surrogate", policy),
        );
        let (fr, fmem) = numerics_of(&p, "q", &fc, None);
        assert!(fr.passed(), "{}", fr.text());
        let (br, bmem) = numerics_of(&p, "q_bwd", &bc, Some(&fmem));
        assert!(br.passed(), "{}", br.text());
        // The surrogate's inputs: the forward's own, its scales, and the residuals of its
        // roundings (a padding row of the window, never written, has scale 0: 1 and 0 there).
        let get = |n: &str| fmem.get(n).unwrap_or_else(|| panic!("no `{n}`")).clone();
        let residual = |v: &str, q: &str, s: &str| {
            let (v, q, s) = (get(v), get(q), get(s));
            let mut e = v.clone();
            let mut sc = s.clone();
            for rank in 0..v.data.len() {
                let cols = v.shape[rank].get(1).copied().unwrap_or(1);
                for (k, e) in e.data[rank].iter_mut().enumerate() {
                    let sv = s.data[rank][k / cols];
                    *e = if sv == 0.0 {
                        0.0
                    } else {
                        q.data[rank][k] - v.data[rank][k] / sv
                    };
                }
                for sv in &mut sc.data[rank] {
                    if *sv == 0.0 {
                        *sv = 1.0;
                    }
                }
            }
            (sc, e)
        };
        let (sx, ex) = residual("x", "xq", "sx");
        let (sa, ea) = residual("a", "aq", "sa");
        // The residuals are roundings: at most half a step.
        for (e, q) in [(&ex, get("xq")), (&ea, get("aq"))] {
            for (e, q) in e.data.iter().flatten().zip(q.data.iter().flatten()) {
                assert!(e.abs() <= bound(q - e) + 1e-6, "a residual of {e} at {q}");
            }
        }
        assert!(ex.data.iter().flatten().any(|e| e.abs() > 1e-3), "the forward rounds x");
        let mut smem = Memories {
            taskflow: "surrogate".into(),
            tensors: Vec::new(),
        };
        for n in ["x", "w_up", "s_up", "w_down", "s_down"] {
            smem.tensors.push((n.to_string(), get(n)));
        }
        for (n, t) in [("sx", sx), ("ex", ex), ("sa", sa), ("ea", ea)] {
            smem.tensors.push((n.to_string(), t));
        }
        // The surrogate computes the forward's output.
        let stf = p.taskflow("surrogate").unwrap();
        let routes: Vec<Option<RouteIndex>> = sc
            .graph
            .layouts
            .iter()
            .map(|l| l.as_ref().map(RouteIndex::new))
            .collect();
        let mut st: Vec<TensorStore<f64>> = store::allocate(stf, &sc.graph, false);
        for &i in &stf.inputs {
            st[i.0 as usize] = smem.get(&stf.tensor(i).name).unwrap().clone();
        }
        exec::execute_dense(stf, &sc.graph, &mut st, &routes);
        let (y, yq) = (&st[stf.outputs[0].1 .0 as usize], get("out"));
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for (a, b) in y.data.iter().flatten().zip(yq.data.iter().flatten()) {
            num += (a - b) * (a - b);
            den += b * b;
        }
        assert!(
            (num / den).sqrt() < 1e-5,
            "surrogate vs forward: rel L2 {}",
            (num / den).sqrt()
        );
        let pairs = [("x", "dx"), ("w_up", "dw_up"), ("w_down", "dw_down")];
        let (rel, max_abs) = gradient_error(&p, "surrogate", &sc, &smem, &bmem, &pairs);
        eprintln!("{kind} {policy:?}: straight-through gradient vs finite differences of the surrogate: rel L2 {rel:.3e}, max |diff| {max_abs:.3e}");
        assert!(rel < 1e-4, "{rel}");
    }
}
