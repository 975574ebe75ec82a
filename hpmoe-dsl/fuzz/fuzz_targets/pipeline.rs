//! Structure-aware: small programs generated from the grammar's constructs (sizes, routings,
//! tiles, user-defined elementwise ops with random bodies, policies) go through checking,
//! lowering, verification and every scheduling policy. A checked program must lower, verify
//! and schedule; nothing may panic.
#![no_main]

use arbitrary::Arbitrary;
use hpmoe_dsl::check::Options;
use hpmoe_dsl::driver::{check_text, CompileOptions};
use hpmoe_dsl::schedule::{Policy, PolicySpec};
use hpmoe_dsl::SourceMap;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum E {
    Read(bool, u8),
    Num(u8),
    Bin(u8, Box<E>, Box<E>),
    Call(u8, Box<E>),
}

fn expr(e: &E, depth: u32) -> String {
    if depth > 6 {
        return "h[m, n]".into();
    }
    match e {
        E::Read(second, off) => {
            if *second {
                format!("h[m, n + N - {}]", off % 2)
            } else {
                "h[m, n]".into()
            }
        }
        E::Num(v) => format!("{}.5", v % 7),
        E::Bin(op, a, b) => format!("({} {} {})", expr(a, depth + 1), ["+", "-", "*", "/"][*op as usize % 4], expr(b, depth + 1)),
        E::Call(f, a) => format!("{}({})", ["exp", "silu", "gelu", "sigmoid", "tanh", "relu", "abs"][*f as usize % 7], expr(a, depth + 1)),
    }
}

#[derive(Arbitrary, Debug)]
struct Prog {
    ranks: u8,
    local: u8,
    topk: u8,
    tokens: u8,
    hidden: u8,
    inter: u8,
    route: u8,
    param: u8,
    tiles: [u8; 4],
    body: E,
    policy: u8,
    backward: bool,
}

fuzz_target!(|p: Prog| {
    let ranks = [1, 2, 3, 4, 8][p.ranks as usize % 5];
    let experts = ranks * (1 + p.local as u64 % 4);
    let topk = 1 + p.topk as u64 % experts.min(4);
    let tokens = 1 + p.tokens as u64 % 40;
    let hidden = 16 * (1 + p.hidden as u64 % 4);
    let inter = 16 * (1 + p.inter as u64 % 3);
    let route = match p.route % 5 {
        0 => "balanced(experts: experts, topk: topk)".to_string(),
        1 => format!("uniform(experts: experts, topk: topk, seed: {})", p.param),
        2 => format!("zipf(experts: experts, topk: topk, s: {}.{}, seed: 1)", p.param % 3, p.param % 10),
        3 => format!("hotspot(experts: experts, topk: topk, max_over_mean: 1.{}, seed: 2)", p.param % 10),
        _ => format!("balanced(experts: experts, topk: topk, capacity_factor: 0.{})", 5 + p.param % 5),
    };
    let t = |i: usize| [1u64, 4, 16, 64, 128, 1000][p.tiles[i] as usize % 6];
    let fwd = format!(
        "taskflow fwd(x: bf16[tokens, hidden], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden]) -> bf16[tokens, hidden] {{\n\
         let xd = dispatch(x, r) tile(t: {}) order(ratr);\n let h = gmm(xd, w_up) tile(m: {}, n: 16, k: 16);\n\
         let a = act(h) tile(m: {});\n let y = gmm(a, w_down) tile(m: {}, n: 16, k: 16);\n return combine(y, r) tile(m: 16);\n}}\n",
        t(0), t(1), t(2), t(3)
    );
    let bwd = "taskflow bwd(dy: bf16[tokens, hidden], xd: bf16[r.recv, hidden], h: bf16[r.recv, 2 * inter], w_up: bf16[local, hidden, 2 * inter], w_down: bf16[local, inter, hidden])\n\
         -> (dx: bf16[tokens, hidden], dw_up: bf16[local, hidden, 2 * inter], dw_down: bf16[local, inter, hidden]) {\n\
         let dyd = combine_grad(dy, r);\n let a = swiglu(h) tile(m: 8);\n let da = gmm_grad_x(dyd, w_down) tile(m: 16, k: 16, n: 16);\n\
         let dw_down = gmm_grad_w(a, dyd, r) tile(k: 16, n: 16, m: 8);\n let dh = swiglu_grad(da, h) tile(m: 8);\n\
         let dxd = gmm_grad_x(dh, w_up) tile(m: 16, k: 16, n: 16);\n let dw_up = gmm_grad_w(xd, dh, r) tile(k: 16, n: 16, m: 8);\n\
         let dx = dispatch_grad(dxd, r);\n return (dx, dw_up, dw_down);\n}\n";
    let text = format!(
        "import std::moe::*;\nimport std::device::ascend_a3;\nparam tokens = {tokens};\nparam hidden = {hidden};\nparam inter = {inter};\n\
         param experts = {experts};\nparam topk = {topk};\nparam ranks = {ranks};\nparam local = experts / ranks;\n\
         device = ascend_a3 {{ ranks: ranks }};\nroute r = {route};\n\
         op act<T>(h: T[M, 2 * N]) -> T[M, N] on aiv {{ out[m, n] = {}; }}\n{fwd}{}",
        expr(&p.body, 0),
        if p.backward { bwd } else { "" }
    );
    let mut sources = SourceMap::new();
    let out = check_text("fuzz.hpm", &text, None, &Options::default(), &mut sources);
    let Some(program) = out.checked else { return };
    let policy = Policy::all()[p.policy as usize % 3];
    let opts = CompileOptions { max_tasks: 2_000_000, verify: true };
    for tf in &program.taskflows {
        let spec = PolicySpec::defaults(&program, policy);
        match program.compile(tf, &spec, &opts) {
            Ok(c) => assert!(c.graph.len() > 0),
            Err(ds) => panic!("a checked program failed to compile:\n{text}\n{:?}", ds.iter().map(|d| &d.message).collect::<Vec<_>>()),
        }
    }
});
