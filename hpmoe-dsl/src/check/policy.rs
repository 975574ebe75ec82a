//! Policy declarations against what the scheduler implements ([`crate::policy`]).
//!
//! In: every `policy` declaration loaded (the stdlib's `std::schedule`, and any in the
//! program: a program may declare one of the scheduler's policies again, with other
//! defaults) and the options of each `schedule` statement. Out: the defaults of the
//! declaration in scope for each policy ([`ir::PolicyDecl`], recorded in the program), and
//! diagnostics for a policy the scheduler does not implement, an option that would have no
//! effect, a missing option or default, a declared type that differs from the option's, or
//! a value out of the option's range.

use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Value};
use crate::policy::{self, Policy};
use crate::syntax::ast::{ItemKind, SignatureKind};
use crate::syntax::token::Span;
use std::collections::BTreeMap;

impl Checker<'_> {
    /// Checks every loaded `policy` declaration and returns, for each policy the scheduler
    /// implements, the defaults of the declaration in the root's scope (the stdlib's, unless
    /// the program declares the same policy again with other defaults).
    pub(super) fn check_policies(&mut self) -> Vec<ir::PolicyDecl> {
        let mut valid: Vec<ItemRef> = Vec::new();
        for m in 0..self.modules.len() {
            for i in 0..self.modules[m].ast.items.len() {
                let r = ItemRef { module: m, item: i };
                if self.check_policy_decl(r) {
                    valid.push(r);
                }
            }
        }
        self.valid_policies.clone_from(&valid);
        let mut out = Vec::new();
        for pol in Policy::ALL {
            // The declaration a `schedule` of the root resolves to, else the stdlib's.
            let in_scope = self.lookup(self.root, pol.name()).filter(|r| valid.contains(r));
            let std = valid.iter().copied().find(|r| {
                self.modules[r.module].std_name.is_some()
                    && matches!(&self.item(*r).kind, ItemKind::Signature(s) if s.name.name == pol.name())
            });
            let Some(r) = in_scope.or(std) else {
                continue;
            };
            let ItemKind::Signature(s) = &self.item(r).kind else {
                continue;
            };
            let (span, order): (Span, Vec<String>) =
                (s.name.span, s.params.iter().map(|p| p.name.name.clone()).collect());
            let Some(vals) = self.match_sig(r, &[], span, "policy") else {
                continue;
            };
            if !self.check_policy_values(pol, &vals) {
                continue;
            }
            let defaults = order
                .into_iter()
                .filter_map(|n| vals.get(&n).map(|(v, _)| (n.clone(), v.clone())))
                .collect();
            out.push(ir::PolicyDecl {
                name: pol.name().to_string(),
                defaults,
            });
        }
        out
    }

    /// Checks one item if it is a `policy` declaration: true when it is one the scheduler
    /// implements, with every option it takes, each with its type and a default.
    fn check_policy_decl(&mut self, r: ItemRef) -> bool {
        let ItemKind::Signature(s) = &self.item(r).kind else {
            return false;
        };
        if s.kind != SignatureKind::Policy {
            return false;
        }
        let s = s.clone();
        let known: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        let Some(pol) = Policy::parse(&s.name.name) else {
            self.err(
                Diagnostic::error(
                    Code::UnimplementedPolicy,
                    format!("policy `{}` has no implementation in the scheduler", s.name.name),
                )
                .primary(s.name.span, "declared here")
                .note("a policy's scheduling is built into hpmoe; a declaration names one of its policies and declares that policy's options")
                .help(format!(
                    "select a policy with `schedule = NAME {{ options }};`; the policies are: {}",
                    known.join(", ")
                )),
            );
            return false;
        };
        let mut ok = true;
        for p in &s.params {
            let declared: Vec<&str> = p.ty.iter().map(|t| t.name.as_str()).collect();
            match policy::option(&p.name.name).filter(|o| o.under.contains(&pol)) {
                None => {
                    self.err(
                        Diagnostic::error(
                            Code::PolicyOption,
                            format!("option `{}` has no effect under policy `{}`", p.name.name, pol.name()),
                        )
                        .primary(p.name.span, "the scheduler does not read it under this policy"),
                    );
                    ok = false;
                }
                Some(o) if !o.ty.matches_declared(&declared) => {
                    self.err(
                        Diagnostic::error(
                            Code::PolicyOption,
                            format!(
                                "option `{}` of `{}` is declared as `{}`, but the scheduler reads `{}`",
                                p.name.name,
                                pol.name(),
                                declared.join(" | "),
                                o.ty.declared()
                            ),
                        )
                        .primary(p.span, "declared here"),
                    );
                    ok = false;
                }
                Some(_) if p.default.is_none() => {
                    self.err(
                        Diagnostic::error(
                            Code::PolicyOption,
                            format!("option `{}` of `{}` has no default", p.name.name, pol.name()),
                        )
                        .primary(p.span, "declare a default: `NAME: TYPE = VALUE`"),
                    );
                    ok = false;
                }
                Some(_) => {}
            }
        }
        for o in policy::options_of(pol) {
            if !s.params.iter().any(|p| p.name.name == o.name) {
                self.err(
                    Diagnostic::error(
                        Code::PolicyOption,
                        format!("policy `{}` does not declare its option `{}`", pol.name(), o.name),
                    )
                    .primary(s.name.span, "declared here")
                    .help(format!("add `{}: {} = VALUE`", o.name, o.ty.declared())),
                );
                ok = false;
            }
        }
        ok
    }

    /// Checks the values of a policy's options against their ranges; reports each one out
    /// of range at its value. True when every value is in range.
    pub(super) fn check_policy_values(&mut self, pol: Policy, vals: &BTreeMap<String, (Value, Span)>) -> bool {
        let mut ok = true;
        for (name, (v, span)) in vals {
            let Some(o) = policy::option(name) else {
                continue;
            };
            if let Err(e) = o.ty.check_range(v) {
                self.err(
                    Diagnostic::error(Code::PolicyOption, format!("option `{name}` of `{}` {e}", pol.name()))
                        .primary(*span, format!("{v} is out of range")),
                );
                ok = false;
            }
        }
        ok
    }
}
