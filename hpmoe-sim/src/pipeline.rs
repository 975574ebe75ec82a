//! The simulator's half of the driver: the stages after compilation, in order.
//!
//! In: a checked program ([`hpmoe_dsl::driver::Checked`]), one of its taskflows and a
//! policy. Out: a [`Ran`]: the compiled taskflow (lowered, verified, scheduled, by
//! [`Checked::compile_timed`]), its simulation ([`Simulated`]: the device model, the
//! prepared workload and the timeline) and its [`Report`]; or every diagnostic of the first
//! stage that failed (a model the simulator cannot run is E1106, a stalled schedule E1305).
//!
//! Stages, each timed on the caller's clock: `lower`, `verify graph`, `schedule`,
//! `verify schedule` (the compiler driver), then `prepare` (device model and workload),
//! `simulate` and `report`. The command line, the REPL and the sweep run a taskflow through
//! here or through [`crate::sim::simulate_compiled`] (prepare + simulate of a taskflow they
//! compiled and cached themselves).

use crate::model::DeviceModel;
use crate::report::Report;
use crate::sim::{self, SimOptions, Simulated, Workload};
use hpmoe_dsl::driver::{Checked, CompileOptions, Compiled};
use hpmoe_dsl::ir::Taskflow;
use hpmoe_dsl::schedule::PolicySpec;
use hpmoe_dsl::timing::Clock;
use hpmoe_dsl::{Code, Diagnostic};

/// A taskflow compiled, simulated and reported.
#[derive(Clone, Debug)]
pub struct Ran {
    pub compiled: Compiled,
    pub simulated: Simulated,
    pub report: Report,
}

/// Compiles, prepares, simulates and reports a taskflow of `checked` under `spec`.
pub fn run(
    checked: &Checked,
    tf: &Taskflow,
    spec: &PolicySpec,
    compile: &CompileOptions,
    sim_opts: SimOptions,
    clock: &mut Clock,
) -> Result<Ran, Vec<Diagnostic>> {
    let program = checked.program();
    let c = checked.compile_timed(tf, spec, compile, clock)?;
    let model = DeviceModel::new(&program.device).map_err(|msg| vec![Diagnostic::error(Code::BadOverride, msg)])?;
    let workload = Workload::new(program, tf, &c.graph, &c.schedule, &model);
    clock.lap("prepare");
    let result = sim::simulate(&workload, &c.schedule, &model, sim_opts)
        .map_err(|st| vec![sim::stall_diagnostic(program, tf, &c.graph, &c.schedule, &st)])?;
    clock.lap("simulate");
    let report = Report::new(program, tf, &c.graph, &c.schedule, &workload, &model, &result);
    clock.lap("report");
    Ok(Ran {
        compiled: c,
        simulated: Simulated {
            model,
            workload,
            result,
        },
        report,
    })
}
