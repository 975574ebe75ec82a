//! Schedules: in, the root module's `schedule` declarations; out, the checked
//! `ScheduleSpec`s (policy and options, one per taskflow or file-wide) or diagnostics.

use super::*;

impl Checker<'_> {
    /// Checks the schedules of the root module.
    pub(in crate::check) fn check_schedules(&mut self) {
        let root = self.root;
        let decls: Vec<(crate::syntax::ast::ScheduleDecl, Span)> = self.modules[root]
            .ast
            .items
            .iter()
            .filter_map(|it| match &it.kind {
                ItemKind::Schedule(s) => Some(((**s).clone(), it.span)),
                _ => None,
            })
            .collect();
        let mut seen: BTreeMap<Option<String>, Span> = BTreeMap::new();
        for (d, span) in decls {
            let key = d.taskflow.as_ref().map(|t| t.name.clone());
            if let Some(prev) = seen.insert(key.clone(), span) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateDefinition,
                        format!(
                            "two schedules for {}",
                            key.as_deref().map_or("all taskflows".to_string(), |k| format!("`{k}`"))
                        ),
                    )
                    .primary(span, "again here")
                    .secondary(prev, "first here"),
                );
                continue;
            }
            if let Some(t) = &d.taskflow {
                let is_tf = self
                    .lookup(root, &t.name)
                    .is_some_and(|r| matches!(self.item(r).kind, ItemKind::Taskflow(_) | ItemKind::Grad(_)));
                if !is_tf && self.modules[root].poisoned.contains(&t.name) {
                    continue; // the taskflow did not parse
                }
                if !is_tf {
                    let mut diag = Diagnostic::error(Code::NoTaskflow, format!("no taskflow `{}` to schedule", t.name))
                        .primary(t.span, "not a taskflow");
                    if crate::suggest::has_budget() {
                        let names = self.names_where(root, |k| matches!(k, ItemKind::Taskflow(_)));
                        if let Some(b) = crate::suggest::closest(&t.name, names.iter().map(|s| s.as_str())) {
                            diag = diag.help(format!("did you mean `{b}`?"));
                        }
                    }
                    self.err(diag);
                    continue;
                }
            }
            let pol = match self.lookup(root, &d.policy.name) {
                Some(p) if matches!(&self.item(p).kind, ItemKind::Signature(s) if s.kind == SignatureKind::Policy) => p,
                _ => {
                    let mut diag = Diagnostic::error(
                        Code::UnknownPolicy,
                        format!("unknown scheduling policy `{}`", d.policy.name),
                    )
                    .primary(d.policy.span, "not a policy");
                    if crate::suggest::has_budget() {
                        let names = self.names_where(
                            root,
                            |k| matches!(k, ItemKind::Signature(s) if s.kind == SignatureKind::Policy),
                        );
                        diag = match crate::suggest::closest(&d.policy.name, names.iter().map(|s| s.as_str())) {
                            Some(b) => diag.help(format!("did you mean `{b}`?")),
                            None => diag.help(format!("the policies are: {}", crate::suggest::listing(&names))),
                        };
                    }
                    self.err(diag);
                    continue;
                }
            };
            if !self.valid_policies.contains(&pol) {
                // A declaration with errors (E1110, E1111), reported where it is declared:
                // the options are not matched against it.
                continue;
            }
            let args: Vec<crate::syntax::ast::Arg> = d
                .options
                .iter()
                .map(|f| crate::syntax::ast::Arg {
                    name: Some(f.name.clone()),
                    value: f.value.clone(),
                })
                .collect();
            let Some(vals) = self.match_sig(pol, &args, span, "policy") else {
                continue;
            };
            if let Some(p) = crate::policy::Policy::parse(&d.policy.name) {
                if !self.check_policy_values(p, &vals) {
                    continue;
                }
            }
            self.schedules.push(ir::ScheduleSpec {
                taskflow: key,
                policy: d.policy.name.clone(),
                options: vals.into_iter().map(|(k, (v, _))| (k, v)).collect(),
                span,
            });
        }
    }

    /// Warns about every `order(ratr)` that cannot change anything: on a device of one rank
    /// (every tile goes to one destination), or under a schedule whose `ratr` is off.
    pub(in crate::check) fn check_order_effects(&mut self, policies: &[ir::PolicyDecl]) {
        let ranks = self.device.as_ref().map(|d| d.ranks());
        let mut warnings = Vec::new();
        for tf in &self.taskflows {
            let sched = self
                .schedules
                .iter()
                .find(|s| s.taskflow.as_deref() == Some(tf.name.as_str()))
                .or_else(|| self.schedules.iter().find(|s| s.taskflow.is_none()));
            let ratr_off = sched.and_then(|s| {
                let v = s.options.get("ratr").or_else(|| {
                    policies
                        .iter()
                        .find(|p| p.name == s.policy)
                        .and_then(|p| p.defaults.iter().find(|(n, _)| n == "ratr").map(|(_, v)| v))
                });
                matches!(v, Some(ir::Value::Bool(false))).then_some(s)
            });
            for node in tf.nodes.iter().filter(|n| n.order.iter().any(|o| o == "ratr")) {
                if ranks == Some(1) {
                    warnings.push(
                        Diagnostic::warning(
                            Code::OrderNoEffect,
                            format!(
                                "`order(ratr)` on `{}` has no effect: the device has one rank",
                                node.name
                            ),
                        )
                        .primary(node.span, "every tile goes to one destination")
                        .help("remove the hint, or run on more ranks"),
                    );
                } else if let Some(s) = ratr_off {
                    warnings.push(
                        Diagnostic::warning(
                            Code::OrderNoEffect,
                            format!(
                                "`order(ratr)` on `{}` has no effect: the schedule of `{}` turns `ratr` off",
                                node.name, tf.name
                            ),
                        )
                        .primary(node.span, "not reordered")
                        .secondary(s.span, "`ratr: false` here")
                        .help("remove the hint, or the `ratr: false` option"),
                    );
                }
            }
        }
        for w in warnings {
            self.err(w);
        }
    }
}
