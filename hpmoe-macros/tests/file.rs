//! `taskflow_file!`: a `.hpm` file checked, lowered, verified and scheduled at compile time
//! (relative to this crate's `Cargo.toml`), embedded, and re-checked at run time.

use hpmoe_dsl::embed::Dim;
use hpmoe_dsl::schedule::Policy;

hpmoe_macros::taskflow_file!("../examples/deepseek_v3_ep8_fwd.hpm");

#[test]
fn the_file_handle_is_typed_and_compiles() {
    assert_eq!(MoeFfn::NAME, "moe_ffn");
    assert_eq!(MoeFfn::SOURCE.name, "../examples/deepseek_v3_ep8_fwd.hpm");
    assert!(MoeFfn::SOURCE.text.starts_with("//! DeepSeek-V3-style"));
    assert_eq!(
        MoeFfn::INPUTS.w_up.shape,
        &[Dim::Fixed(32), Dim::Fixed(7168), Dim::Fixed(4096)][..]
    );
    assert_eq!(MoeFfn::INPUTS.w_up.written, "bf16[experts / ranks, hidden, 2 * inter]");
    let names: Vec<&str> = MoeFfn::PARAMS.iter().map(|p| p.name).collect();
    assert_eq!(names, ["tokens", "hidden", "inter", "experts", "topk", "ranks"]);
    let c = MoeFfn::new()
        .tokens(256)
        .hidden(1024)
        .inter(256)
        .experts(16)
        .compile(Some(Policy::Interleaved))
        .unwrap();
    assert_eq!(c.taskflow().name, "moe_ffn");
    assert!(!c.compiled.graph.is_empty());
    // An unknown param is reported at run time with the program's names.
    let err = MoeFfn::new()
        .set("tokenz", hpmoe_dsl::ir::Value::Int(1))
        .program()
        .unwrap_err();
    assert!(err.to_string().contains("did you mean `tokens`?"), "{err}");
}
