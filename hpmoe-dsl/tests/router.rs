//! Routing computed from logits and capacity-limited routing: the router's choices and weights
//! equal a NumPy reference (`tests/data/router/gen_router.py`), a router lowers to the same
//! tasks as the `file(...)` routing of its choices, and dropping drops exactly the documented
//! (token, choice) rows (hand-computed).

use hpmoe_dsl::check::Options;
use hpmoe_dsl::diag::Code;
use hpmoe_dsl::driver::{check_text, Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::{DropOrder, DropSpec};
use hpmoe_dsl::route::Routing;
use hpmoe_dsl::schedule::Policy;
use hpmoe_dsl::SourceMap;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/router")
}

fn check(text: &str) -> (Option<Checked>, Vec<Code>, String) {
    let mut sm = SourceMap::new();
    let out = check_text("t.hpm", text, Some(&data()), &Options::default(), &mut sm);
    let codes = out.diagnostics.as_slice().iter().map(|d| d.code).collect();
    let shown = hpmoe_dsl::diag::render_all(
        out.diagnostics.as_slice(),
        hpmoe_dsl::diag::Dropped::NONE,
        &sm,
        hpmoe_dsl::diag::RenderStyle::Plain,
    );
    (out.checked, codes, shown)
}

fn program(text: &str) -> Checked {
    let (p, _, shown) = check(text);
    p.unwrap_or_else(|| panic!("program does not check:\n{shown}"))
}

fn compile(p: &Checked, policy: Policy) -> Compiled {
    let spec = p.select_policy(&p.taskflows[0].name, Some(policy));
    match p.compile(&p.taskflows[0], &spec, &CompileOptions::default()) {
        Ok(c) => c,
        Err(ds) => panic!("{:?}", ds.iter().map(|d| d.message.clone()).collect::<Vec<_>>()),
    }
}

/// A forward MoE layer on 2 ranks with 8 tokens each, 16 experts, routed by `route`.
fn layer(route: &str) -> String {
    format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\n\
         param tokens = 8;\nparam hidden = 32;\nparam inter = 16;\nparam local = 8;\n\
         device = ascend_a3 {{ ranks: 2 }};\nroute r = {route};\n\
         taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
           let xd = dispatch(x, r) tile(t: 4);\n\
           let h = gmm(xd, w_up) tile(m: 8, n: 16, k: 16);\n\
           let a = swiglu(h) tile(m: 4);\n\
           let y = gmm(a, w_down) tile(m: 8, n: 16, k: 16);\n\
           return combine(y, r) tile(m: 4);\n}}\n"
    )
}

fn routing(p: &Checked) -> Routing {
    Routing::generate(&p.routes[0]).unwrap()
}

fn npy(name: &str) -> Vec<f64> {
    hpmoe_dsl::npy::read(&data().join(name)).unwrap().data
}

#[test]
fn router_choices_and_weights_equal_the_numpy_reference() {
    let cases = [
        ("softmax_top4", "topk: 4"),
        ("softmax_top2_raw", "topk: 2, normalize: false"),
        (
            "sigmoid_grouped",
            "topk: 4, score: sigmoid, scale: 2.5, n_group: 4, topk_group: 2, bias: \"bias.npy\"",
        ),
    ];
    for (name, args) in cases {
        let p = program(&layer(&format!("router(experts: 16, {args}, logits: \"logits.npy\")")));
        let r = routing(&p);
        let ids = npy(&format!("{name}_ids.npy"));
        let w = npy(&format!("{name}_weights.npy"));
        assert_eq!(r.expert.len(), ids.len(), "{name}");
        for i in 0..ids.len() {
            assert_eq!(r.expert[i] as f64, ids[i], "{name}: entry {i}");
            assert!(
                (r.weight[i] as f64 - w[i]).abs() <= 1e-6 * w[i].abs().max(1.0),
                "{name}: weight {i}: {} vs {}",
                r.weight[i],
                w[i]
            );
        }
        assert_eq!(r.dropped(), 0);
    }
}

#[test]
fn a_router_lowers_to_the_tasks_of_the_file_routing_of_its_choices() {
    let a = program(&layer(
        "router(experts: 16, topk: 4, score: sigmoid, scale: 2.5, n_group: 4, topk_group: 2, bias: \"bias.npy\", logits: \"logits.npy\")",
    ));
    let b = program(&layer(
        "file(path: \"sigmoid_grouped_ids.npy\", weights: \"sigmoid_grouped_weights.npy\", experts: 16)",
    ));
    assert_eq!(a.routes[0].capacity, b.routes[0].capacity);
    for policy in Policy::all() {
        let (ca, cb) = (compile(&a, policy), compile(&b, policy));
        let (ga, gb) = (&ca.graph, &cb.graph);
        assert!(!ga.rank.is_empty());
        assert_eq!(ga.rank, gb.rank, "{policy:?}");
        assert_eq!(ga.node, gb.node, "{policy:?}");
        assert_eq!(ga.tile, gb.tile, "{policy:?}");
        assert_eq!(ga.flops, gb.flops, "{policy:?}");
        assert_eq!(ga.bytes_in, gb.bytes_in, "{policy:?}");
        assert_eq!(ga.remote, gb.remote, "{policy:?}");
        assert_eq!(ga.wait, gb.wait, "{policy:?}");
    }
}

#[test]
fn drawn_logits_are_deterministic_and_skew_concentrates_the_load() {
    let flat = program(&layer("router(experts: 16, topk: 2, seed: 5)"));
    let again = program(&layer("router(experts: 16, topk: 2, seed: 5)"));
    assert_eq!(routing(&flat), routing(&again));
    let skewed = program(&layer("router(experts: 16, topk: 2, seed: 5, skew: 3.0)"));
    let count0 = |r: &Routing| r.expert_counts()[0];
    // With skew 3, expert 0's logit is ln(16^3) above expert 15's: nearly every token picks it.
    assert!(
        count0(&routing(&skewed)) >= 14,
        "{:?}",
        routing(&skewed).expert_counts()
    );
    assert!(count0(&routing(&flat)) < 14);
}

/// The hand-made routing of `gen_router.py`: 2 ranks x 3 tokens, top-2 over 4 experts.
fn hand_routing() -> Routing {
    Routing {
        ranks: 2,
        tokens: 3,
        topk: 2,
        experts: 4,
        expert: vec![0, 1, 0, 2, 1, 0, 0, 3, 2, 1, 3, 2],
        weight: vec![0.6, 0.4, 0.3, 0.7, 0.5, 0.5, 0.9, 0.1, 0.8, 0.2, 0.55, 0.45],
        kept: vec![true; 12],
    }
}

/// Flat index of (rank, token, choice) in the hand routing.
fn at(s: usize, t: usize, j: usize) -> usize {
    (s * 3 + t) * 2 + j
}

#[test]
fn dropping_drops_exactly_the_documented_rows() {
    // Mean rows per expert: 2 * 3 * 2 / 4 = 3; capacity ceil(0.5 * 3) = 2.
    let d = |order, renormalize| DropSpec {
        capacity_factor: 0.5,
        order,
        renormalize,
    };
    assert_eq!(d(DropOrder::Token, false).expert_capacity(2, 3, 2, 4), 2);
    // Token order. Expert 0 receives (0,0,0) (0,1,0) (0,2,1) (1,0,0): the last two drop.
    // Expert 1: (0,0,1) (0,2,0) (1,1,1): (1,1,1) drops. Expert 2: (0,1,1) (1,1,0) (1,2,1):
    // (1,2,1) drops. Expert 3 receives 2 rows and keeps them.
    let mut r = hand_routing();
    r.apply_drops(&d(DropOrder::Token, false));
    let dropped: Vec<usize> = (0..12).filter(|&i| !r.kept[i]).collect();
    assert_eq!(dropped, vec![at(0, 2, 1), at(1, 0, 0), at(1, 1, 1), at(1, 2, 1)]);
    assert_eq!(r.expert_counts(), vec![2, 2, 2, 2]);
    assert_eq!(r.weight[at(0, 2, 0)], 0.5);
    assert_eq!(r.weight[at(0, 2, 1)], 0.0);
    // Renormalised: a token's kept weight takes the whole sum.
    let mut r = hand_routing();
    r.apply_drops(&d(DropOrder::Token, true));
    assert_eq!(r.weight[at(0, 2, 0)], 1.0);
    assert_eq!(r.weight[at(1, 0, 1)], 1.0);
    assert!(
        (r.weight[at(0, 0, 0)] - 0.6).abs() < 1e-7,
        "untouched token keeps its weights"
    );
    // Score order. Expert 0 keeps 0.9 (1,0,0) and 0.6 (0,0,0), drops 0.5 (0,2,1) and
    // 0.3 (0,1,0); experts 1 and 2 drop their lowest, 0.2 (1,1,1) and 0.45 (1,2,1).
    let mut r = hand_routing();
    r.apply_drops(&d(DropOrder::Score, true));
    let dropped: Vec<usize> = (0..12).filter(|&i| !r.kept[i]).collect();
    assert_eq!(dropped, vec![at(0, 1, 0), at(0, 2, 1), at(1, 1, 1), at(1, 2, 1)]);
    assert_eq!(r.weight[at(0, 1, 1)], 1.0);
}

#[test]
fn a_dropping_file_routing_sizes_its_window_and_sends_only_kept_rows() {
    let text = |extra: &str| {
        format!(
            "import std::moe::*;\nimport std::device::ascend_a3;\n\
             param tokens = 3;\nparam hidden = 16;\nparam inter = 8;\nparam local = 2;\n\
             device = ascend_a3 {{ ranks: 2 }};\n\
             route r = file(path: \"drop_ids.npy\", weights: \"drop_weights.npy\", experts: 4{extra});\n\
             taskflow fwd(x: bf16[tokens, hidden]) -> bf16[r.recv, hidden] {{\n\
               return dispatch(x, r) tile(t: 1);\n}}\n"
        )
    };
    let p = program(&text(", capacity_factor: 0.5, drop: true"));
    // Window: 2 local experts x capacity 2.
    assert_eq!(p.routes[0].capacity, 4);
    let full = program(&text(""));
    // Without dropping rank 0 (experts 0, 1) receives 7 rows.
    assert_eq!(full.routes[0].capacity, 7);
    let c = compile(&p, Policy::KernelByKernel);
    let cf = compile(&full, Policy::KernelByKernel);
    let l = c.graph.layouts[0].as_ref().unwrap();
    assert_eq!(
        l.send.iter().map(|s| s.len()).sum::<usize>(),
        8,
        "12 rows less the 4 dropped"
    );
    let has_source = |d: usize| l.recv[d].iter().filter(|e| e.src_rank != u32::MAX).count();
    // Rank 0 (experts 0, 1) keeps 2 + 2 rows, rank 1 (experts 2, 3) 2 + 2.
    assert_eq!((has_source(0), has_source(1)), (4, 4));
    // Of the dropped rows, (1,0,0) and (1,1,1) would have crossed from rank 1 to rank 0;
    // (0,2,1) and (1,2,1) stay on their rank. Two rows of 16 bf16 fewer cross.
    let sent = |c: &Compiled| c.graph.remote.iter().map(|&b| b as f64).sum::<f64>();
    assert_eq!(sent(&cf) - sent(&c), 2.0 * 16.0 * 2.0);
}

#[test]
fn invalid_router_and_capacity_options_have_their_codes() {
    let bad = [
        ("router(experts: 16, topk: 2, n_group: 3)", Code::BadRouter),
        (
            "router(experts: 16, topk: 2, n_group: 4, topk_group: 5)",
            Code::BadRouter,
        ),
        (
            "router(experts: 16, topk: 8, n_group: 4, topk_group: 1)",
            Code::BadRouter,
        ),
        ("router(experts: 16, topk: 2, scale: 0)", Code::BadRouter),
        ("router(experts: 16, topk: 2, skew: -1)", Code::BadRouter),
        ("balanced(experts: 16, topk: 2, drop: true)", Code::BadCapacity),
        ("balanced(experts: 16, topk: 2, renormalize: true)", Code::BadCapacity),
        ("uniform(experts: 16, topk: 2, drop_order: score)", Code::BadCapacity),
    ];
    for (route, code) in bad {
        let (p, codes, shown) = check(&layer(route));
        assert!(p.is_none(), "{route} checks");
        assert!(codes.contains(&code), "{route}: {shown}");
    }
    // A logits file of the wrong shape is a routing error, not a panic.
    let (p, codes, shown) = check(&layer("router(experts: 16, topk: 2, logits: \"bias.npy\")"));
    assert!(p.is_none(), "{shown}");
    assert!(codes.contains(&Code::BadRouting), "{shown}");
}
