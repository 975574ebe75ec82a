//! The language inside Rust: what the `taskflow!` and `taskflow_file!` macros (crate
//! `hpmoe-macros`) expand to, and the expansion itself.
//!
//! In: the tokens of a macro invocation (or the path of a `.hpm` file). Out: a typed handle per
//! taskflow: a struct with builder methods for the params, the signatures of its inputs and
//! outputs as typed constants, and methods that re-check the embedded program with the chosen
//! overrides ([`Source::program`]) and compile it ([`Source::compile`]). The program is
//! checked, lowered, verified and scheduled at compile time; every diagnostic becomes a
//! `compile_error!` at its tokens. See `docs/MACRO.md`.
//!
//! The run-time part (this module's types) is always compiled; the expansion
//! ([`expand`], [`expand_file`]) needs the `proc-macro2` feature.

#[cfg(feature = "proc-macro2")]
mod expand;

#[cfg(feature = "proc-macro2")]
pub use expand::{
    expand, expand_file, expand_file_with, expand_with, max_tasks_from, ExpandOptions, MAX_COMPILE_TIME_TASKS,
};

use crate::check::{Options, Override};
use crate::diag::{render_all, Diagnostic, RenderStyle};
use crate::driver::{self, Checked, CompileOptions, Compiled};
use crate::ir::{DType, Program, Taskflow, Value};
use crate::schedule::{self, Policy, PolicySpec};
use crate::source::SourceMap;
use std::fmt;
use std::path::Path;

/// A program embedded in a Rust binary by a macro: its checked text and where its file
/// imports (and file routings) are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The name shown in diagnostics.
    pub name: &'static str,
    /// The program text (canonical for `taskflow!`, the file for `taskflow_file!`).
    pub text: &'static str,
    /// The absolute directory that file imports and file routings are relative to (the
    /// crate's `CARGO_MANIFEST_DIR` for `taskflow!`, the file's directory for
    /// `taskflow_file!`).
    pub dir: &'static str,
}

impl Source {
    /// Checks the program with parameter (and `device.FIELD`) overrides.
    pub fn program(&self, overrides: &[Override]) -> Result<Program, Error> {
        self.check(overrides).map(|(c, _)| c.into_program())
    }

    fn check(&self, overrides: &[Override]) -> Result<(Checked, SourceMap), Error> {
        let mut sources = SourceMap::new();
        let opts = Options {
            overrides: overrides.to_vec(),
            ..Options::default()
        };
        let out = driver::check_text(self.name, self.text, Some(Path::new(self.dir)), &opts, &mut sources);
        match out.checked {
            Some(c) => Ok((c, sources)),
            None => Err(Error {
                diagnostics: out.diagnostics.into_vec(),
                sources,
            }),
        }
    }

    /// Checks the program with overrides, then lowers, verifies and schedules `taskflow`
    /// with `policy` (by default the program's `schedule` for it, else `interleaved`; a policy
    /// that the program declares keeps its declared options).
    pub fn compile(
        &self,
        taskflow: &str,
        overrides: &[Override],
        policy: Option<Policy>,
    ) -> Result<CompiledTaskflow, Error> {
        let (checked, sources) = self.check(overrides)?;
        let fail = |ds: Vec<Diagnostic>, sources: SourceMap| Error {
            diagnostics: ds,
            sources,
        };
        let Some(index) = checked.program().taskflows.iter().position(|t| t.name == taskflow) else {
            let d = Diagnostic::error(
                crate::Code::NoTaskflow,
                format!("the program has no taskflow `{taskflow}`"),
            );
            return Err(fail(vec![d], sources));
        };
        let spec = checked.select_policy(taskflow, policy);
        let tf = &checked.program().taskflows[index];
        match checked.compile(tf, &spec, &CompileOptions::default()) {
            Ok(compiled) => Ok(CompiledTaskflow {
                program: checked.into_program(),
                index,
                policy: spec,
                compiled,
            }),
            Err(ds) => Err(fail(ds, sources)),
        }
    }
}

/// A taskflow lowered, verified and scheduled at run time.
#[derive(Clone, Debug)]
pub struct CompiledTaskflow {
    /// The checked program (with the overrides).
    pub program: Program,
    /// The taskflow's index in `program.taskflows`.
    pub index: usize,
    /// The policy it was scheduled with.
    pub policy: PolicySpec,
    /// The task graph and the static schedule.
    pub compiled: Compiled,
}

impl CompiledTaskflow {
    /// The checked taskflow.
    pub fn taskflow(&self) -> &Taskflow {
        &self.program.taskflows[self.index]
    }

    /// Task counts per op call and engine, and the schedule (see
    /// [`schedule::summary_text`]).
    pub fn summary(&self) -> String {
        schedule::summary_text(
            &self.program,
            self.taskflow(),
            &self.compiled.graph,
            Some(&self.compiled.schedule),
        )
    }
}

/// Diagnostics of a run-time check or compilation, with the sources they point into.
#[derive(Clone, Debug)]
pub struct Error {
    pub diagnostics: Vec<Diagnostic>,
    pub sources: SourceMap,
}

impl Error {
    /// The diagnostics drawn with their source snippets.
    pub fn render(&self, style: RenderStyle) -> String {
        render_all(&self.diagnostics, crate::diag::Dropped::NONE, &self.sources, style)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(RenderStyle::Plain).trim_end())
    }
}

impl std::error::Error for Error {}

impl From<Error> for Vec<Diagnostic> {
    fn from(e: Error) -> Self {
        e.diagnostics
    }
}

/// A dimension of a taskflow input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(u64),
    /// The rows a rank receives through routing `route`: ragged, at most `capacity` (the
    /// receive window).
    Recv {
        route: &'static str,
        capacity: u64,
    },
}

impl Dim {
    /// The number of elements it can hold (the capacity for a received dimension).
    pub fn bound(self) -> u64 {
        match self {
            Dim::Fixed(n) => n,
            Dim::Recv { capacity, .. } => capacity,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Recv { route, capacity } => write!(f, "{route}.recv (<= {capacity})"),
        }
    }
}

/// The signature of a taskflow input or output, at the program's default params.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSig {
    pub name: &'static str,
    pub dtype: DType,
    /// The shape at the default params.
    pub shape: &'static [Dim],
    /// The type as written, e.g. `bf16[tokens, hidden]`.
    pub written: &'static str,
}

impl TensorSig {
    /// Elements (using the capacity of received dimensions).
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|d| d.bound()).product()
    }
    /// Bytes (using the capacity of received dimensions).
    pub fn bytes(&self) -> u64 {
        self.elements() * self.dtype.size()
    }
}

impl fmt::Display for TensorSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}[", self.name, self.dtype.name())?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The default value of a param.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<ParamValue> for Value {
    fn from(v: ParamValue) -> Value {
        match v {
            ParamValue::Int(i) => Value::Int(i),
            ParamValue::Float(f) => Value::Float(f),
            ParamValue::Bool(b) => Value::Bool(b),
        }
    }
}

/// A param of the program with its default value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamSig {
    pub name: &'static str,
    pub default: ParamValue,
}

/// Sets an override, replacing an earlier one of the same name (for the generated builders).
pub fn set_override(overrides: &mut Vec<Override>, name: &str, value: Value) {
    overrides.retain(|o| o.name != name);
    overrides.push(Override {
        name: name.to_string(),
        value,
    });
}
