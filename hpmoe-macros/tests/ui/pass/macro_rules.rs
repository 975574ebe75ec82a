// `taskflow!` inside a function, fed through `macro_rules!` fragments (invisible groups), with
// doc comments, names that are Rust keywords or handle methods, named outputs and a float
// param.
use hpmoe_macros::taskflow;

macro_rules! activation {
    ($rows:literal, $tile:expr) => {
        taskflow! {
            //! An activation and a sum.
            import std::moe::{swiglu, add};
            /// Rows.
            param type = $rows;
            param compile = 2.5;
            /// The activation.
            taskflow act_sum(h: bf16[type, 256]) -> (a: bf16[type, 128], in: bf16[type, 128]) {
                let a = swiglu(h) tile(m: $tile);
                return (a, add(a, a));
            }
        }
    };
}

fn main() {
    activation!(64, 16);
    let flow = ActSum::new().r#type(32).set_compile(1.5);
    assert_eq!(ActSum::OUTPUTS.r#in.name, "in");
    assert_eq!(ActSum::OUTPUTS.a.shape[0], hpmoe_dsl::embed::Dim::Fixed(64));
    let p = flow.program().unwrap();
    assert_eq!(p.taskflows[0].tensors[0].shape[0], hpmoe_dsl::ir::Dim::Fixed(32));
    assert!(ActSum::SOURCE.text.contains("/// The activation."));
}
