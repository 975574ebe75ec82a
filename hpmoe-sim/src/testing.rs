//! Helpers of the crate's unit tests.

use crate::model::DeviceModel;
use hpmoe_dsl::check::{Options, Override};
use hpmoe_dsl::driver::{Checked, Compiled};
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::schedule::Policy;

/// Checks each example (a file of `examples/` with its `--set` overrides) and compiles every
/// taskflow of it under `interleaved` and `expert_level` (skipping a policy the taskflow does
/// not compile under), calling `f` with each.
pub(crate) fn each_compiled(
    examples: &[(&str, &[&str])],
    mut f: impl FnMut(&str, &Checked, &Taskflow, &Compiled, &DeviceModel, Policy),
) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for &(file, sets) in examples {
        let opts = Options {
            overrides: sets.iter().map(|o| Override::parse(o).expect("an override")).collect(),
            ..Options::default()
        };
        let out = hpmoe_dsl::driver::check_path(&root.join(file), &opts, &mut hpmoe_dsl::SourceMap::new());
        let p = out.checked.expect("the example checks");
        let model = DeviceModel::new(&p.device).expect("a model");
        for tf in &p.taskflows {
            for policy in [Policy::Interleaved, Policy::ExpertLevel] {
                let spec = p.select_policy(&tf.name, Some(policy));
                let Ok(c) = p.compile(tf, &spec, &hpmoe_dsl::driver::CompileOptions::default()) else {
                    continue;
                };
                f(file, &p, tf, &c, &model, policy);
            }
        }
    }
}
