//! Scheduling policies as data.
//!
//! A policy is declared once, in `stdlib/schedule.hpm`: its name, its options, their types,
//! defaults and documentation. This module holds the other half, what the scheduler
//! implements, as one table:
//!
//! - [`Policy`]: the strategies the scheduler has (a declared policy must name one);
//! - [`Policy::base`]: what a strategy does where it has no option (fixed behaviour);
//! - [`OPTIONS`]: every option's meaning: the strategies it has an effect under, the type
//!   and range of its values, and the field of [`PolicySpec`] it sets.
//!
//! The checker holds every `policy` declaration against this table (a declared option must
//! have a meaning under its policy, with the declared type; a policy declared in a program,
//! not in the stdlib, has no implementation and is rejected) and records the declared
//! defaults in [`crate::ir::Program::policies`]. A [`PolicySpec`] is then built only from
//! those defaults and the options a program or a front end gives: there is no second copy
//! of a default here.
//!
//! Adding a policy: a `policy` declaration in `stdlib/schedule.hpm`, and here a variant of
//! [`Policy`] with its name, its fixed behaviour and the options it takes; its scheduling
//! code goes into `schedule/`.

use crate::ir::{Program, Value};
use std::collections::BTreeMap;

/// The scheduling strategies the scheduler implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// The baseline: one kernel per op call, a barrier after each.
    KernelByKernel,
    /// The reference runtime: static round-robin queues, per-expert pipelining.
    ExpertLevel,
    /// Tile-level list scheduling across op calls.
    Interleaved,
}

impl Policy {
    /// Every strategy, in the order reports and comparisons list them.
    pub const ALL: [Policy; 3] = [Policy::KernelByKernel, Policy::ExpertLevel, Policy::Interleaved];

    /// The strategy a declared name selects.
    pub fn parse(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The name a `policy` declaration gives it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::KernelByKernel => "kernel_by_kernel",
            Policy::ExpertLevel => "expert_level",
            Policy::Interleaved => "interleaved",
        }
    }

    /// Every strategy (see [`Policy::ALL`]).
    pub fn all() -> [Policy; 3] {
        Policy::ALL
    }

    /// What the strategy does where it takes no option; declared options are applied on
    /// top of this (with the stdlib's defaults first).
    fn base(self) -> PolicySpec {
        PolicySpec {
            policy: self,
            priority: Priority::CriticalPath,
            ratr: false,
            aiv_workers: 0,
            interleave_backward: false,
            static_capacity: false,
            aiv_fraction: 1.0,
            // Every strategy launches its kernels; only the baseline can leave it out.
            launch_overhead: true,
            // Only the baseline runs communication as a collective.
            alltoall: AllToAll::Unordered,
            candidates: false,
        }
    }
}

/// Priorities of the interleaved policy's list scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Longest remaining path to the end first.
    CriticalPath,
    /// Ready order.
    Fifo,
    /// Op-call order, then tile order.
    OpOrder,
    /// Tile-interleaved: every call's tiles by their position within the call on their rank
    /// (the k-th of n tiles of a call at k/n), producer calls first at equal positions, so a
    /// consumer tile runs soon after its producer and its input is still in L2.
    Wavefront,
}

impl Priority {
    /// The name an option value uses.
    pub fn name(self) -> &'static str {
        match self {
            Priority::CriticalPath => "critical_path",
            Priority::Fifo => "fifo",
            Priority::OpOrder => "op_order",
            Priority::Wavefront => "wavefront",
        }
    }
}

/// How `kernel_by_kernel` runs its communication calls, as a collective library would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllToAll {
    /// HCCL's pairwise AllToAllV: step 0 copies a rank's own rows, then at step k
    /// (1..ranks) rank i sends to rank i+k and receives from rank i-k; a step's sends start
    /// once the previous step's exchange (its own sends and the rows it receives) is done.
    Pairwise,
    /// Every rank sends in tile order (the lowering's order: destination expert or source
    /// rank ascending), all at once, with no steps: the unordered baseline.
    Unordered,
}

impl AllToAll {
    /// The name an option value uses.
    pub fn name(self) -> &'static str {
        match self {
            AllToAll::Pairwise => "pairwise",
            AllToAll::Unordered => "unordered",
        }
    }
}

/// A policy with every option resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    pub policy: Policy,
    pub priority: Priority,
    /// Rank-aware reordering of communication tiles.
    pub ratr: bool,
    /// Vector cores used per rank (0: all).
    pub aiv_workers: u32,
    /// Interleave independent backward GMM calls on the cube queues.
    pub interleave_backward: bool,
    /// Receive windows sized for the worst case instead of the routing.
    pub static_capacity: bool,
    /// Fraction of the vector cores used.
    pub aiv_fraction: f64,
    /// Charge a kernel launch per kernel.
    pub launch_overhead: bool,
    /// The collective algorithm of `kernel_by_kernel`'s communication calls.
    pub alltoall: AllToAll,
    /// Simulate candidate schedules of the same task graph and keep the fastest (the
    /// selection runs in the simulator's pipeline, `hpmoe_sim::pipeline::compile`).
    pub candidates: bool,
}

/// The type of an option's values, with the range the scheduler accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionType {
    Bool,
    /// An integer in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    /// A number in `(min, max]` when `min_open`, else `[min, max]`.
    Float {
        min: f64,
        max: f64,
        min_open: bool,
    },
    /// One of these names.
    OneOf(&'static [&'static str]),
}

impl OptionType {
    /// Whether a declared signature type (`bool`, `int`, `float`, `a | b`) is this type.
    pub fn matches_declared(&self, declared: &[&str]) -> bool {
        match self {
            OptionType::Bool => declared == ["bool"],
            OptionType::Int { .. } => declared == ["int"],
            OptionType::Float { .. } => declared == ["float"],
            OptionType::OneOf(names) => {
                let mut a: Vec<&str> = names.to_vec();
                let mut b: Vec<&str> = declared.to_vec();
                a.sort_unstable();
                b.sort_unstable();
                a == b
            }
        }
    }

    /// How the type is written in a declaration.
    pub fn declared(&self) -> String {
        match self {
            OptionType::Bool => "bool".into(),
            OptionType::Int { .. } => "int".into(),
            OptionType::Float { .. } => "float".into(),
            OptionType::OneOf(n) => n.join(" | "),
        }
    }

    /// Checks a value of an already type-checked option against the range.
    pub fn check_range(&self, v: &Value) -> Result<(), String> {
        match (self, v) {
            (OptionType::Int { min, max }, Value::Int(i)) if i < min || i > max => {
                Err(format!("must be an integer from {min} to {max}"))
            }
            (OptionType::Float { min, max, min_open }, _) => match v.as_f64() {
                Some(f) if f.is_finite() && (f > *min || (!min_open && f == *min)) && f <= *max => Ok(()),
                Some(_) => Err(if *min_open {
                    format!("must be above {min} and at most {max}")
                } else {
                    format!("must be from {min} to {max}")
                }),
                None => Err("must be a number".into()),
            },
            (OptionType::Bool, Value::Bool(_)) | (OptionType::Int { .. }, Value::Int(_)) => Ok(()),
            (OptionType::OneOf(names), Value::Name(n)) if names.contains(&n.as_str()) => Ok(()),
            (OptionType::OneOf(names), _) => Err(format!("must be one of {}", names.join(", "))),
            (OptionType::Bool, _) => Err("must be `true` or `false`".into()),
            (OptionType::Int { .. }, _) => Err("must be an integer".into()),
        }
    }
}

/// What one option means.
#[derive(Debug)]
pub struct OptionDef {
    pub name: &'static str,
    /// The strategies it has an effect under.
    pub under: &'static [Policy],
    pub ty: OptionType,
    /// The field it sets (values are checked first).
    set: fn(&mut PolicySpec, &Value),
}

/// Every policy option the scheduler gives a meaning to.
pub static OPTIONS: &[OptionDef] = &[
    OptionDef {
        name: "priority",
        under: &[Policy::Interleaved],
        ty: OptionType::OneOf(&["critical_path", "fifo", "op_order", "wavefront"]),
        set: |s, v| {
            if let Value::Name(n) = v {
                s.priority = match n.as_str() {
                    "fifo" => Priority::Fifo,
                    "op_order" => Priority::OpOrder,
                    "wavefront" => Priority::Wavefront,
                    _ => Priority::CriticalPath,
                }
            }
        },
    },
    OptionDef {
        name: "ratr",
        under: &[Policy::KernelByKernel, Policy::ExpertLevel, Policy::Interleaved],
        ty: OptionType::Bool,
        set: |s, v| {
            if let Value::Bool(b) = v {
                s.ratr = *b;
            }
        },
    },
    OptionDef {
        name: "aiv_workers",
        under: &[Policy::Interleaved],
        ty: OptionType::Int { min: 0, max: 1 << 20 },
        set: |s, v| {
            if let Value::Int(i) = v {
                s.aiv_workers = u32::try_from(*i).unwrap_or(0);
            }
        },
    },
    OptionDef {
        name: "interleave_backward",
        under: &[Policy::ExpertLevel],
        ty: OptionType::Bool,
        set: |s, v| {
            if let Value::Bool(b) = v {
                s.interleave_backward = *b;
            }
        },
    },
    OptionDef {
        name: "static_capacity",
        under: &[Policy::ExpertLevel],
        ty: OptionType::Bool,
        set: |s, v| {
            if let Value::Bool(b) = v {
                s.static_capacity = *b;
            }
        },
    },
    OptionDef {
        name: "aiv_fraction",
        under: &[Policy::ExpertLevel],
        ty: OptionType::Float {
            min: 0.0,
            max: 1.0,
            min_open: true,
        },
        set: |s, v| {
            if let Some(f) = v.as_f64() {
                s.aiv_fraction = f;
            }
        },
    },
    OptionDef {
        name: "candidates",
        under: &[Policy::Interleaved],
        ty: OptionType::Bool,
        set: |s, v| {
            if let Value::Bool(b) = v {
                s.candidates = *b;
            }
        },
    },
    OptionDef {
        name: "launch_overhead",
        under: &[Policy::KernelByKernel],
        ty: OptionType::Bool,
        set: |s, v| {
            if let Value::Bool(b) = v {
                s.launch_overhead = *b;
            }
        },
    },
    OptionDef {
        name: "alltoall",
        under: &[Policy::KernelByKernel],
        ty: OptionType::OneOf(&["pairwise", "unordered"]),
        set: |s, v| {
            if let Value::Name(n) = v {
                s.alltoall = match n.as_str() {
                    "unordered" => AllToAll::Unordered,
                    _ => AllToAll::Pairwise,
                }
            }
        },
    },
];

/// The meaning of an option, if it has one.
pub fn option(name: &str) -> Option<&'static OptionDef> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// The options a strategy takes, in table order.
pub fn options_of(policy: Policy) -> impl Iterator<Item = &'static OptionDef> {
    OPTIONS.iter().filter(move |o| o.under.contains(&policy))
}

impl PolicySpec {
    /// A policy with the defaults its declaration gives (`program.policies`).
    pub fn defaults(program: &Program, policy: Policy) -> PolicySpec {
        let mut spec = policy.base();
        if let Some(decl) = program.policy_decl(policy.name()) {
            for (name, value) in &decl.defaults {
                spec.set(name, value);
            }
        }
        spec
    }

    /// A policy with its defaults, then `options` applied. Every option must be declared
    /// for this policy in the program and have a value of its type and range.
    pub fn with_options(
        program: &Program,
        policy: Policy,
        options: &BTreeMap<String, Value>,
    ) -> Result<PolicySpec, String> {
        let mut spec = PolicySpec::defaults(program, policy);
        spec.apply(program, options)?;
        Ok(spec)
    }

    /// Applies options (see [`PolicySpec::with_options`]).
    pub fn apply(&mut self, program: &Program, options: &BTreeMap<String, Value>) -> Result<(), String> {
        let declared = program.policy_decl(self.policy.name());
        for (name, value) in options {
            let def = option(name)
                .filter(|d| d.under.contains(&self.policy))
                .filter(|_| declared.is_some_and(|d| d.defaults.iter().any(|(n, _)| n == name)));
            let Some(def) = def else {
                let names: Vec<&str> = options_of(self.policy).map(|o| o.name).collect();
                return Err(format!(
                    "policy `{}` has no option `{name}` (its options: {})",
                    self.policy.name(),
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
            };
            def.ty
                .check_range(value)
                .map_err(|e| format!("option `{name}` of `{}` {e}", self.policy.name()))?;
            (def.set)(self, value);
        }
        Ok(())
    }

    /// Sets a checked option.
    fn set(&mut self, name: &str, value: &Value) {
        if let Some(d) = option(name) {
            (d.set)(self, value);
        }
    }

    /// The policy a program selects for a taskflow with its options, or `fallback` with its
    /// defaults when the program selects none.
    pub fn from_program(program: &Program, taskflow: &str, fallback: Policy) -> PolicySpec {
        let Some(sc) = program.schedule_for(taskflow) else {
            return PolicySpec::defaults(program, fallback);
        };
        let Some(policy) = Policy::parse(&sc.policy) else {
            return PolicySpec::defaults(program, fallback);
        };
        let mut spec = PolicySpec::defaults(program, policy);
        // The checker filled in and checked every option.
        for (name, value) in &sc.options {
            spec.set(name, value);
        }
        spec
    }

    /// The policy of a taskflow when a front end asks for `policy`: the program's own
    /// options apply when it selects the same policy; otherwise the declared defaults. With
    /// no request, the program's selection, else `interleaved`.
    pub fn select(program: &Program, taskflow: &str, policy: Option<Policy>) -> PolicySpec {
        let declared = PolicySpec::from_program(program, taskflow, Policy::Interleaved);
        match policy {
            Some(p) if p != declared.policy => PolicySpec::defaults(program, p),
            _ => declared,
        }
    }

    /// How the lowering must tile for this policy.
    pub fn lower_options(&self, program: &Program, max_tasks: u64) -> crate::lower::LowerOptions {
        crate::lower::LowerOptions {
            static_capacity: self.static_capacity,
            retile: if self.policy == Policy::ExpertLevel {
                crate::lower::Retile::ExpertLevel {
                    aic_cores: program.device.aic_cores(),
                }
            } else {
                crate::lower::Retile::Annotated
            },
            max_tasks,
            dest_tiles: if self.policy == Policy::KernelByKernel && self.alltoall == AllToAll::Pairwise {
                crate::lower::DestTiles::All
            } else if self.ratr {
                crate::lower::DestTiles::Ordered
            } else {
                crate::lower::DestTiles::None
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_has_a_strategy_and_names_are_unique() {
        let mut names: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), OPTIONS.len());
        for o in OPTIONS {
            assert!(!o.under.is_empty(), "{} applies nowhere", o.name);
        }
    }

    #[test]
    fn ranges_refuse_out_of_range_values() {
        let frac = option("aiv_fraction").unwrap().ty;
        assert!(frac.check_range(&Value::Float(0.5)).is_ok());
        assert!(frac.check_range(&Value::Float(1.0)).is_ok());
        assert!(frac.check_range(&Value::Float(0.0)).is_err());
        assert!(frac.check_range(&Value::Float(-0.5)).is_err());
        assert!(frac.check_range(&Value::Float(1.5)).is_err());
        assert!(frac.check_range(&Value::Float(f64::NAN)).is_err());
        let workers = option("aiv_workers").unwrap().ty;
        assert!(workers.check_range(&Value::Int(-1)).is_err());
        assert!(workers.check_range(&Value::Int(0)).is_ok());
    }

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()), Some(p));
        }
        assert_eq!(Policy::parse("fastest"), None);
    }
}
