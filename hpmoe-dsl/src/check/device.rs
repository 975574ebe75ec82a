//! Devices: profiles (with inheritance), units, overrides in the program and from the
//! command line, and the validation of every constant.

use super::consts::BareNames;
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{Device, DeviceField, Quantity, Value};
use crate::syntax::ast::{Field, ItemKind};
use crate::syntax::token::Span;
use std::collections::BTreeMap;

/// Every unit: name, quantity, factor to the base unit (B, Hz, s, B/s, ...).
pub const UNITS: &[(&str, Quantity, f64)] = &[
    ("count", Quantity::Count, 1.0),
    ("ratio", Quantity::Ratio, 1.0),
    ("B", Quantity::Bytes, 1.0),
    ("KB", Quantity::Bytes, 1e3),
    ("MB", Quantity::Bytes, 1e6),
    ("GB", Quantity::Bytes, 1e9),
    ("TB", Quantity::Bytes, 1e12),
    ("KiB", Quantity::Bytes, 1024.0),
    ("MiB", Quantity::Bytes, 1048576.0),
    ("GiB", Quantity::Bytes, 1073741824.0),
    ("Hz", Quantity::Frequency, 1.0),
    ("kHz", Quantity::Frequency, 1e3),
    ("MHz", Quantity::Frequency, 1e6),
    ("GHz", Quantity::Frequency, 1e9),
    ("s", Quantity::Time, 1.0),
    ("ms", Quantity::Time, 1e-3),
    ("us", Quantity::Time, 1e-6),
    ("ns", Quantity::Time, 1e-9),
    ("B/s", Quantity::Bandwidth, 1.0),
    ("KB/s", Quantity::Bandwidth, 1e3),
    ("MB/s", Quantity::Bandwidth, 1e6),
    ("GB/s", Quantity::Bandwidth, 1e9),
    ("TB/s", Quantity::Bandwidth, 1e12),
    ("GiB/s", Quantity::Bandwidth, 1073741824.0),
    ("Gb/s", Quantity::Bandwidth, 1.25e8),
    ("B/cycle", Quantity::BytesPerCycle, 1.0),
    ("FLOP/cycle", Quantity::FlopsPerCycle, 1.0),
    ("cycle", Quantity::Cycles, 1.0),
];

/// The fields every profile must define, with their quantity.
pub const REQUIRED_FIELDS: &[(&str, Quantity)] = &[
    ("ranks", Quantity::Count),
    ("aic_cores", Quantity::Count),
    ("aiv_cores", Quantity::Count),
    ("aic_clock", Quantity::Frequency),
    ("aiv_clock", Quantity::Frequency),
    ("cube_flops_per_cycle", Quantity::FlopsPerCycle),
    ("cube_efficiency", Quantity::Ratio),
    ("vector_bytes_per_cycle", Quantity::BytesPerCycle),
    ("ub_size", Quantity::Bytes),
    ("l1_size", Quantity::Bytes),
    ("l0a_size", Quantity::Bytes),
    ("l0b_size", Quantity::Bytes),
    ("l0c_size", Quantity::Bytes),
    ("l2_size", Quantity::Bytes),
    ("hbm_size", Quantity::Bytes),
    ("hbm_bandwidth", Quantity::Bandwidth),
    ("core_hbm_rate", Quantity::BytesPerCycle),
    ("core_l2_read_rate", Quantity::BytesPerCycle),
    ("core_l2_write_rate", Quantity::BytesPerCycle),
    ("link_bandwidth", Quantity::Bandwidth),
    ("link_efficiency", Quantity::Ratio),
    ("link_latency", Quantity::Time),
    ("event_latency", Quantity::Time),
    ("kernel_launch", Quantity::Time),
    ("task_overhead", Quantity::Time),
    ("put_chunk_bytes", Quantity::Bytes),
    ("system_counter", Quantity::Frequency),
];

/// The deepest chain of profile inheritance accepted.
const MAX_PROFILE_DEPTH: usize = 16;

/// The largest number of ranks a device may have.
pub const MAX_RANKS: f64 = 4096.0;

pub fn unit(name: &str) -> Option<(Quantity, f64)> {
    UNITS.iter().find(|(n, _, _)| *n == name).map(|(_, q, f)| (*q, *f))
}

/// A quantity in words, for messages.
fn quantity_word(q: Quantity) -> &'static str {
    match q {
        Quantity::Count => "a count",
        Quantity::Ratio => "a ratio",
        Quantity::Bytes => "a size in bytes",
        Quantity::Frequency => "a frequency",
        Quantity::Time => "a time",
        Quantity::Bandwidth => "a bandwidth",
        Quantity::BytesPerCycle => "bytes per cycle",
        Quantity::FlopsPerCycle => "FLOP per cycle",
        Quantity::Cycles => "a number of cycles",
    }
}

fn units_of(q: Quantity) -> String {
    UNITS
        .iter()
        .filter(|(_, qq, _)| *qq == q)
        .map(|(n, _, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Splits `1.2TB/s` or `1.2 TB/s` into the number and the unit.
fn split_number_unit(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|(_, c)| {
            !(c.is_ascii_digit() || *c == '.' || *c == '_' || *c == 'e' || *c == 'E' || *c == '-' || *c == '+')
        })
        .map_or(s.len(), |(i, _)| i);
    // `e` may start a unit such as nothing here; numbers with exponents are digits-e-digits.
    let (num, unit) = s.split_at(end);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    Some((num.parse().ok()?, unit.trim()))
}

impl Checker<'_> {
    /// Resolves a profile item into its fields (base first), reporting errors in the profile.
    /// `chain`: the profiles that derive from `r`, outermost first (reports about the
    /// inheritance go to the outermost one, which the user is checking).
    fn profile_fields(&mut self, r: ItemRef, chain: &mut Vec<ItemRef>) -> Option<BTreeMap<String, DeviceField>> {
        let ItemKind::Profile(p) = &self.item(r).kind else {
            return None;
        };
        let p = p.clone();
        let mut fields = BTreeMap::new();
        if let Some(base) = &p.base {
            match self.lookup(r.module, &base.name) {
                Some(b) if matches!(self.item(b).kind, ItemKind::Profile(_)) => {
                    let name_of =
                        |ck: &Self, x: ItemRef| ck.item(x).kind.name().map_or_else(String::new, |n| n.name.clone());
                    let first = chain.first().copied().unwrap_or(r);
                    let first_base = match &self.item(first).kind {
                        ItemKind::Profile(fp) => fp.base.as_ref().map_or(base.span, |b| b.span),
                        _ => base.span,
                    };
                    if let Some(pos) = chain.iter().chain(std::iter::once(&r)).position(|x| *x == b) {
                        let names: Vec<String> = chain
                            .iter()
                            .chain([r, b].iter())
                            .skip(pos)
                            .map(|x| name_of(self, *x))
                            .collect();
                        self.err(
                            Diagnostic::error(
                                Code::LimitExceeded,
                                format!("profile inheritance has a cycle: {}", names.join(" -> ")),
                            )
                            .primary(first_base, "this base leads back to a profile already on the way")
                            .help("derive one of the profiles from a profile outside the cycle"),
                        );
                        return None;
                    }
                    if chain.len() >= MAX_PROFILE_DEPTH {
                        self.err(
                            Diagnostic::error(
                                Code::LimitExceeded,
                                format!(
                                    "profile `{}` inherits through more than {MAX_PROFILE_DEPTH} levels",
                                    name_of(self, first)
                                ),
                            )
                            .primary(first_base, "too deep")
                            .help("copy fields into a profile nearer the top of the chain"),
                        );
                        return None;
                    }
                    chain.push(r);
                    let base_fields = self.profile_fields(b, chain);
                    chain.pop();
                    fields = base_fields?;
                }
                Some(_) => {
                    self.err(
                        Diagnostic::error(Code::WrongKind, format!("`{}` is not a device profile", base.name))
                            .primary(base.span, "expected a profile"),
                    );
                    return None;
                }
                None => {
                    self.unknown_name(r.module, &base.name, base.span, "profile");
                    return None;
                }
            }
        }
        let mut seen: BTreeMap<String, Span> = BTreeMap::new();
        for f in &p.fields {
            if let Some(prev) = seen.insert(f.name.name.clone(), f.name.span) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateArgument,
                        format!("field `{}` is given twice", f.name.name),
                    )
                    .primary(f.name.span, "again here")
                    .secondary(prev, "first here"),
                );
                continue;
            }
            let Some(unit_ast) = &f.unit else {
                self.err(
                    Diagnostic::error(
                        Code::UnitMismatch,
                        format!("profile field `{}` has no unit", f.name.name),
                    )
                    .primary(f.value.span, "add a unit after the value")
                    .help("every device constant carries its unit, e.g. `1850 MHz`, `192 KiB`, `24 count`"),
                );
                continue;
            };
            let utext = unit_ast.text();
            let Some((q, factor)) = unit(&utext) else {
                self.unknown_unit(&utext, unit_ast.span);
                continue;
            };
            match REQUIRED_FIELDS.iter().find(|(n, _)| *n == f.name.name) {
                Some(&(_, rq)) if rq != q => {
                    self.err(
                        Diagnostic::error(
                            Code::UnitMismatch,
                            format!(
                                "`{}` is {}, but `{utext}` is a unit of {}",
                                f.name.name,
                                quantity_word(rq),
                                quantity_word(q)
                            ),
                        )
                        .primary(unit_ast.span, "wrong kind of unit")
                        .help(format!("use one of: {}", units_of(rq))),
                    );
                    continue;
                }
                Some(_) => {}
                None => {
                    // A misspelt field would otherwise be ignored, and the base's value kept.
                    let mut d = Diagnostic::error(
                        Code::UnknownProfileField,
                        format!("`{}` is not a device field", f.name.name),
                    )
                    .primary(f.name.span, "unknown field");
                    d = match crate::suggest::closest(&f.name.name, REQUIRED_FIELDS.iter().map(|(n, _)| *n)) {
                        Some(b) => d.help(format!("did you mean `{b}`?")),
                        None => d.help(format!(
                            "the fields are: {}",
                            REQUIRED_FIELDS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        )),
                    };
                    self.err(d);
                    continue;
                }
            }
            let Some(v) = self.eval_const(r.module, &f.value, BareNames::Reject) else {
                continue;
            };
            let Some(x) = v.as_f64() else {
                self.type_mismatch(f.value.span, "a number", &v);
                continue;
            };
            fields.insert(
                f.name.name.clone(),
                DeviceField {
                    value: x * factor,
                    quantity: q,
                    unit: utext,
                    docs: f.docs.clone(),
                    span: f.span,
                },
            );
        }
        Some(fields)
    }

    fn unknown_unit(&mut self, u: &str, span: Span) {
        let mut d = Diagnostic::error(Code::UnitMismatch, format!("unknown unit `{u}`")).primary(span, "not a unit");
        if let Some(b) = crate::suggest::closest(u, UNITS.iter().map(|(n, _, _)| *n)) {
            d = d.help(format!("did you mean `{b}`?"));
        } else {
            d = d.help(format!(
                "units are: {}",
                UNITS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
            ));
        }
        self.err(d);
    }

    /// Checks a profile defined in the root module (so errors in it are reported even unused).
    pub(super) fn check_profile_item(&mut self, r: ItemRef) {
        if let Some(fields) = self.profile_fields(r, &mut Vec::new()) {
            let span = self.item(r).kind.name().map_or(self.item(r).span, |n| n.span);
            self.validate_device(&fields, span);
        }
    }

    fn validate_device(&mut self, fields: &BTreeMap<String, DeviceField>, span: Span) -> bool {
        let mut ok = true;
        let missing: Vec<&str> = REQUIRED_FIELDS
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| !fields.contains_key(*n))
            .collect();
        if !missing.is_empty() {
            let list = missing.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
            let msg = match missing.len() {
                1 => format!("the device profile lacks {list}"),
                n => format!("the device profile lacks {n} fields: {list}"),
            };
            self.err(
                Diagnostic::error(Code::MissingArgument, msg)
                    .primary(span, "incomplete profile")
                    .help("define the fields, or derive the profile from a complete one: `profile NAME : ascend_a3 { ... }`"),
            );
            ok = false;
        }
        for (name, f) in fields {
            let bad = !f.value.is_finite()
                || f.value <= 0.0
                || (f.quantity == Quantity::Ratio && f.value > 1.0)
                || (f.quantity == Quantity::Count && f.value.fract() != 0.0)
                || (name == "ranks" && f.value > MAX_RANKS);
            if bad {
                let why = if f.quantity == Quantity::Ratio {
                    "a ratio must be in (0, 1]".to_string()
                } else if f.quantity == Quantity::Count {
                    format!(
                        "a count must be a whole number of at least 1{}",
                        if name == "ranks" {
                            format!(" and at most {MAX_RANKS}")
                        } else {
                            String::new()
                        }
                    )
                } else {
                    "rates, sizes and times must be positive".to_string()
                };
                self.err(
                    Diagnostic::error(
                        Code::InvalidValue,
                        format!("device field `{name}` = {} {} is out of range", f.value, f.unit),
                    )
                    .primary(f.span, "invalid value")
                    .note(why),
                );
                ok = false;
            }
        }
        ok
    }

    pub(super) fn check_device(&mut self) {
        let root = self.root;
        let decls: Vec<(crate::syntax::ast::DeviceDecl, Span)> = self.modules[root]
            .ast
            .items
            .iter()
            .filter_map(|it| match &it.kind {
                ItemKind::Device(d) => Some((d.clone(), it.span)),
                _ => None,
            })
            .collect();
        for (_, sp) in decls.iter().skip(1) {
            let first = decls[0].1;
            self.err(
                Diagnostic::error(Code::DuplicateDefinition, "the device is declared twice")
                    .primary(*sp, "declared again here")
                    .secondary(first, "first declared here"),
            );
        }
        let mut decls = decls;
        let mut forced = None;
        if let Some(name) = self.opts.device.clone() {
            let ident = crate::syntax::ast::Ident {
                name: name.clone(),
                span: Span::default(),
            };
            match decls.first_mut() {
                Some((d, _)) => d.profile = ident,
                None => decls.push((
                    crate::syntax::ast::DeviceDecl {
                        profile: ident,
                        fields: Vec::new(),
                    },
                    Span::default(),
                )),
            }
            // A profile of the stdlib may be named without importing it.
            if self.lookup(root, &name).is_none() {
                let std_dev = self.load_std("device", &mut Vec::new());
                let names: Vec<(String, usize)> = std_dev
                    .map(|m| {
                        self.modules[m]
                            .ast
                            .items
                            .iter()
                            .enumerate()
                            .filter_map(|(i, it)| match &it.kind {
                                ItemKind::Profile(p) => Some((p.name.name.clone(), i)),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                forced = std_dev.and_then(|m| {
                    names
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, i)| ItemRef { module: m, item: *i })
                });
                if forced.is_none() {
                    let mut d =
                        Diagnostic::error(Code::UnknownName, format!("`--device {name}`: no such device profile"));
                    d = match crate::suggest::closest(&name, names.iter().map(|(s, _)| s.as_str())) {
                        Some(b) => d.help(format!("did you mean `{b}`?")),
                        None => d.help(format!(
                            "the profiles are: {}",
                            names.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>().join(", ")
                        )),
                    };
                    self.err(d);
                    return;
                }
            }
        }
        let (profile_ref, decl_fields, profile_name, name_span) = match (forced, decls.first()) {
            (Some(r), Some((d, _))) => (r, d.fields.clone(), d.profile.name.clone(), d.profile.span),
            (_, first) => match first {
                Some((d, _)) => {
                    let r = match self.lookup(root, &d.profile.name) {
                        Some(r) if matches!(self.item(r).kind, ItemKind::Profile(_)) => r,
                        Some(r) => {
                            let w = super::consts::item_kind_word(&self.item(r).kind);
                            self.err(
                                Diagnostic::error(
                                    Code::WrongKind,
                                    format!("`{}` is {w}, not a device profile", d.profile.name),
                                )
                                .primary(d.profile.span, "expected a profile"),
                            );
                            return;
                        }
                        None => {
                            let std_dev = self.load_std("device", &mut Vec::new());
                            let known = std_dev.and_then(|m| {
                                self.modules[m]
                                    .ast
                                    .items
                                    .iter()
                                    .position(|it| it.kind.name().is_some_and(|n| n.name == d.profile.name))
                                    .map(|_| m)
                            });
                            let mut diag = Diagnostic::error(
                                Code::UnknownName,
                                format!("unknown device profile `{}`", d.profile.name),
                            )
                            .primary(d.profile.span, "not defined");
                            if known.is_some() {
                                diag = diag.help(format!("import it: `import std::device::{};`", d.profile.name));
                            } else {
                                let mut names = self.names_where(root, |k| matches!(k, ItemKind::Profile(_)));
                                if let Some(m) = std_dev {
                                    names.extend(self.modules[m].ast.items.iter().filter_map(|it| match &it.kind {
                                        ItemKind::Profile(p) => Some(p.name.name.clone()),
                                        _ => None,
                                    }));
                                }
                                if let Some(b) =
                                    crate::suggest::closest(&d.profile.name, names.iter().map(|s| s.as_str()))
                                {
                                    diag = diag.help(format!("did you mean `{b}`?"));
                                }
                            }
                            self.err(diag);
                            return;
                        }
                    };
                    (r, d.fields.clone(), d.profile.name.clone(), d.profile.span)
                }
                None => {
                    // The default device: the A3 profile of the stdlib.
                    let Some(m) = self.load_std("device", &mut Vec::new()) else {
                        return;
                    };
                    let Some(i) = self.modules[m]
                        .ast
                        .items
                        .iter()
                        .position(|it| it.kind.name().is_some_and(|n| n.name == "ascend_a3"))
                    else {
                        return;
                    };
                    (
                        ItemRef { module: m, item: i },
                        Vec::new(),
                        "ascend_a3".to_string(),
                        Span::default(),
                    )
                }
            },
        };
        let Some(mut fields) = self.profile_fields(profile_ref, &mut Vec::new()) else {
            return;
        };
        let mut ok = true;
        let mut seen: BTreeMap<String, Span> = BTreeMap::new();
        for f in &decl_fields {
            if let Some(prev) = seen.insert(f.name.name.clone(), f.name.span) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateArgument,
                        format!("field `{}` is given twice", f.name.name),
                    )
                    .primary(f.name.span, "again here")
                    .secondary(prev, "first here"),
                );
                ok = false;
                continue;
            }
            ok &= self.override_field(&mut fields, f);
        }
        for ov in self.opts.overrides.clone() {
            let Some(name) = ov.name.strip_prefix("device.") else {
                continue;
            };
            ok &= self.override_from_cli(&mut fields, name, &ov.value);
        }
        ok &= self.validate_device(&fields, name_span);
        if ok {
            self.device = Some(Device {
                profile: profile_name,
                fields,
            });
        }
    }

    fn unknown_field(&mut self, fields: &BTreeMap<String, DeviceField>, name: &str, span: Option<Span>) {
        let mut d = Diagnostic::error(Code::UnknownProfileField, format!("the device has no field `{name}`"));
        if let Some(s) = span {
            d = d.primary(s, "unknown field");
        }
        if let Some(b) = crate::suggest::closest(name, fields.keys().map(|s| s.as_str())) {
            d = d.help(format!("did you mean `{b}`?"));
        } else {
            d = d.help(format!(
                "the fields are: {}",
                fields.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        self.err(d);
    }

    fn override_field(&mut self, fields: &mut BTreeMap<String, DeviceField>, f: &Field) -> bool {
        let Some(existing) = fields.get(&f.name.name).cloned() else {
            self.unknown_field(fields, &f.name.name, Some(f.name.span));
            return false;
        };
        let factor = match &f.unit {
            Some(u) => {
                let t = u.text();
                let Some((q, factor)) = unit(&t) else {
                    self.unknown_unit(&t, u.span);
                    return false;
                };
                if q != existing.quantity {
                    self.err(
                        Diagnostic::error(
                            Code::UnitMismatch,
                            format!(
                                "`{}` is {}, measured in {}, not in `{t}`",
                                f.name.name,
                                quantity_word(existing.quantity),
                                existing.unit
                            ),
                        )
                        .primary(u.span, "wrong kind of unit")
                        .help(format!("use one of: {}", units_of(existing.quantity))),
                    );
                    return false;
                }
                factor
            }
            None => unit(&existing.unit).map_or(1.0, |(_, f)| f),
        };
        let Some(v) = self.eval_const(self.root, &f.value, BareNames::Reject) else {
            return false;
        };
        let Some(x) = v.as_f64() else {
            self.type_mismatch(f.value.span, "a number", &v);
            return false;
        };
        fields.insert(
            f.name.name.clone(),
            DeviceField {
                value: x * factor,
                span: f.span,
                ..existing
            },
        );
        true
    }

    fn override_from_cli(&mut self, fields: &mut BTreeMap<String, DeviceField>, name: &str, v: &Value) -> bool {
        let Some(existing) = fields.get(name).cloned() else {
            self.unknown_field(fields, name, None);
            return false;
        };
        let own = unit(&existing.unit).map_or(1.0, |(_, f)| f);
        let value = match v {
            Value::Int(i) => *i as f64 * own,
            Value::Float(f) => *f * own,
            Value::Str(s) => {
                let Some((x, u)) = split_number_unit(s) else {
                    self.err(Diagnostic::error(
                        Code::BadOverride,
                        format!("`--set device.{name}={s}`: not a number with a unit"),
                    ));
                    return false;
                };
                if u.is_empty() {
                    x * own
                } else {
                    match unit(u) {
                        Some((q, f)) if q == existing.quantity => x * f,
                        Some(_) => {
                            self.err(
                                Diagnostic::error(
                                    Code::UnitMismatch,
                                    format!(
                                        "`--set device.{name}`: `{u}` is not a unit of {}",
                                        quantity_word(existing.quantity)
                                    ),
                                )
                                .help(format!("use one of: {}", units_of(existing.quantity))),
                            );
                            return false;
                        }
                        None => {
                            self.err(Diagnostic::error(
                                Code::UnitMismatch,
                                format!("`--set device.{name}`: unknown unit `{u}`"),
                            ));
                            return false;
                        }
                    }
                }
            }
            other => {
                self.err(Diagnostic::error(
                    Code::BadOverride,
                    format!("`--set device.{name}={other}`: expected a number"),
                ));
                return false;
            }
        };
        fields.insert(name.to_string(), DeviceField { value, ..existing });
        true
    }
}
