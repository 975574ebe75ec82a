//! Front-end throughput: lexing, parsing and checking a generated ~1 MB program.
//!
//! Run: `cargo bench -p hpmoe-dsl --bench frontend`.

use divan::counter::BytesCount;
use divan::Bencher;
use hpmoe_dsl::check::{check_text, Options};
use hpmoe_dsl::SourceMap;

/// The allocator of the `hpmoe` binary, so the figures are the tool's.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

/// A program of about `bytes` bytes: params, user ops and taskflows calling them.
pub fn generate(bytes: usize) -> String {
    let mut s = String::from(
        "import std::moe::{dispatch, gmm, swiglu, combine};\nimport std::device::ascend_a3;\n\
         param tokens = 512;\nparam hidden = 1024;\nparam inter = 512;\nparam experts = 16;\nparam topk = 4;\nparam ranks = 4;\n\
         device = ascend_a3 { ranks: ranks };\nroute r = balanced(experts: experts, topk: topk);\n\n",
    );
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "/// A gated activation, variant {i}.\n\
             op act{i}<T>(h: T[M, 2 * N]) -> T[M, N] on aiv tile(m: 64) {{\n    \
             out[m, n] = gelu(h[m, n]) * h[m, n + N] + {i}.0 * sigmoid(h[m, n]);\n}}\n\n\
             param scale{i} = ceil_div(hidden * {i} + 7, 8);\n\n\
             taskflow flow{i}(x: bf16[tokens, hidden],\n                 w_up: bf16[experts / ranks, hidden, 2 * inter],\n                 \
             w_down: bf16[experts / ranks, inter, hidden]) -> bf16[tokens, hidden] {{\n    \
             let xd = dispatch(x, r) tile(t: 128) order(ratr);\n    \
             let h = gmm(xd, w_up) tile(m: 128, n: 256);\n    \
             let a = act{i}(h) tile(m: 32, n: 256);\n    \
             let y = gmm(a, w_down) tile(m: 128, n: 256);\n    \
             return combine(y, r) tile(m: 128);\n}}\n\n"
        ));
        i += 1;
    }
    s
}

#[divan::bench]
fn lex(b: Bencher) {
    let text = generate(1 << 20);
    b.counter(BytesCount::of_str(&text))
        .bench(|| hpmoe_dsl::syntax::lexer::tokenize(divan::black_box(&text), hpmoe_dsl::FileId(0)));
}

#[divan::bench]
fn parse(b: Bencher) {
    let text = generate(1 << 20);
    b.counter(BytesCount::of_str(&text))
        .bench(|| hpmoe_dsl::syntax::parse_text(divan::black_box(&text), hpmoe_dsl::FileId(0)));
}

#[divan::bench(sample_count = 10)]
fn parse_and_check(b: Bencher) {
    let text = generate(1 << 20);
    // The generated program must be valid, or the figure would measure error paths.
    let mut sm = SourceMap::new();
    let out = check_text("gen.hpm", &text, None, &Options::default(), &mut sm);
    assert!(
        out.program.is_some(),
        "generated program does not check: {:?}",
        out.diagnostics.as_slice().first()
    );
    b.counter(BytesCount::of_str(&text)).bench(|| {
        let mut sm = SourceMap::new();
        check_text("gen.hpm", divan::black_box(&text), None, &Options::default(), &mut sm)
    });
}
