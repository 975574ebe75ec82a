//! Devices: profiles (with inheritance), units, overrides in the program and from the
//! command line, and the validation of every constant.
//!
//! In: the root module's `device = PROFILE { ... };` declaration (or `--device NAME`, or the
//! default `ascend_a3`), the profiles it derives from and `--set device.FIELD=VALUE`
//! overrides. A profile is first resolved as written ([`WrittenProfile`]: each field's
//! number, the unit it was written in and its span; a derived profile starts from its
//! base's fields), then turned into the checked [`Device`] (base units, typed fields) by
//! [`Device::new`], whose bounds the diagnostics report in the units the user wrote. Every
//! field name, quantity and bound comes from the table of [`crate::ir::DEVICE_FIELDS`].
//! Out: `Checker::device`, and the check that each taskflow's tensors fit in a rank's HBM.

use super::consts::BareNames;
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{Device, DeviceFieldSpec, Dim, Taskflow, Unit, Value, DEVICE_FIELDS, DEVICE_FIELD_COUNT, UNITS};
use crate::syntax::ast::{Field, ItemKind};
use crate::syntax::token::Span;
use std::collections::BTreeMap;

/// The deepest chain of profile inheritance accepted.
const MAX_PROFILE_DEPTH: usize = 16;

/// One constant of a profile as written.
#[derive(Clone, Copy, Debug)]
struct WrittenField {
    /// The number as written, in `unit`.
    number: f64,
    unit: &'static Unit,
    /// The field's definition (or override).
    span: Span,
}

/// A number for a message: as written for ordinary magnitudes, in exponent form (`1e-300`)
/// for the extreme ones, which would otherwise print hundreds of digits.
fn shown_number(x: f64) -> String {
    if x != 0.0 && !(1e-6..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

impl WrittenField {
    fn base(&self) -> f64 {
        self.number * self.unit.factor
    }
}

/// A profile as written, after inheritance and overrides: the fields defined so far.
type WrittenProfile = BTreeMap<&'static str, WrittenField>;

/// The names of every device field, comma-separated (for messages).
fn field_names() -> String {
    DEVICE_FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
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
    fn profile_fields(&mut self, r: ItemRef, chain: &mut Vec<ItemRef>) -> Option<WrittenProfile> {
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
            let Some(unit) = Unit::named(&utext) else {
                self.unknown_unit(&utext, unit_ast.span);
                continue;
            };
            let Some(spec) = DeviceFieldSpec::named(&f.name.name) else {
                // A misspelt field would otherwise be ignored, and the base's value kept.
                let mut d = Diagnostic::error(
                    Code::UnknownProfileField,
                    format!("`{}` is not a device field", f.name.name),
                )
                .primary(f.name.span, "unknown field");
                d = match crate::suggest::closest(&f.name.name, DEVICE_FIELDS.iter().map(|f| f.name)) {
                    Some(b) => d.help(format!("did you mean `{b}`?")),
                    None => d.help(format!("the fields are: {}", field_names())),
                };
                self.err(d);
                continue;
            };
            if spec.quantity != unit.quantity {
                self.err(
                    Diagnostic::error(
                        Code::UnitMismatch,
                        format!(
                            "`{}` is {}, but `{utext}` is a unit of {}",
                            f.name.name,
                            spec.quantity.word(),
                            unit.quantity.word()
                        ),
                    )
                    .primary(unit_ast.span, "wrong kind of unit")
                    .help(format!("use one of: {}", Unit::names_of(spec.quantity))),
                );
                continue;
            }
            let Some(v) = self.eval_const(r.module, &f.value, BareNames::Reject) else {
                continue;
            };
            let Some(x) = v.as_f64() else {
                self.type_mismatch(f.value.span, "a number", &v);
                continue;
            };
            fields.insert(
                spec.name,
                WrittenField {
                    number: x,
                    unit,
                    span: f.span,
                },
            );
        }
        Some(fields)
    }

    fn unknown_unit(&mut self, u: &str, span: Span) {
        let mut d = Diagnostic::error(Code::UnitMismatch, format!("unknown unit `{u}`")).primary(span, "not a unit");
        if let Some(b) = crate::suggest::closest(u, UNITS.iter().map(|u| u.name)) {
            d = d.help(format!("did you mean `{b}`?"));
        } else {
            d = d.help(format!(
                "units are: {}",
                UNITS.iter().map(|u| u.name).collect::<Vec<_>>().join(", ")
            ));
        }
        self.err(d);
    }

    /// Checks a profile defined in the root module (so errors in it are reported even unused).
    pub(super) fn check_profile_item(&mut self, r: ItemRef) {
        if let Some(fields) = self.profile_fields(r, &mut Vec::new()) {
            let span = self.item(r).kind.name().map_or(self.item(r).span, |n| n.span);
            let name = self.item(r).kind.name().map_or_else(String::new, |n| n.name.clone());
            self.validate_device(name, &fields, span);
        }
    }

    /// The checked device of a profile as written: every field present and in range.
    /// `span`: where to report missing fields.
    fn validate_device(&mut self, profile: String, fields: &WrittenProfile, span: Span) -> Option<Device> {
        let missing: Vec<&str> = DEVICE_FIELDS
            .iter()
            .map(|f| f.name)
            .filter(|n| !fields.contains_key(n))
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
            // The values present are still checked.
            for (name, w) in fields {
                if let Some(why) = DeviceFieldSpec::named(name).and_then(|spec| spec.out_of_range(w.base())) {
                    self.out_of_range(name, w, why);
                }
            }
            return None;
        }
        let mut values = [0.0; DEVICE_FIELD_COUNT];
        let mut units = [&UNITS[0]; DEVICE_FIELD_COUNT];
        for (i, spec) in DEVICE_FIELDS.iter().enumerate() {
            if let Some(w) = fields.get(spec.name) {
                values[i] = w.base();
                units[i] = w.unit;
            }
        }
        match Device::new(profile, values, units) {
            Ok(d) => Some(d),
            Err(errors) => {
                for e in errors {
                    if let Some(w) = fields.get(e.field.name) {
                        self.out_of_range(e.field.name, w, e.reason);
                    }
                }
                None
            }
        }
    }

    fn out_of_range(&mut self, name: &str, w: &WrittenField, why: String) {
        self.err(
            Diagnostic::error(
                Code::InvalidValue,
                format!(
                    "device field `{name}` = {} {} is out of range",
                    shown_number(w.number),
                    w.unit.name
                ),
            )
            .primary(w.span, "invalid value")
            .note(why),
        );
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
        if ok {
            self.device = self.validate_device(profile_name, &fields, name_span);
        } else {
            // Report the values out of range too, but keep no device.
            self.validate_device(profile_name, &fields, name_span);
        }
    }

    fn unknown_field(&mut self, name: &str, span: Option<Span>) {
        let mut d = Diagnostic::error(Code::UnknownProfileField, format!("the device has no field `{name}`"));
        if let Some(s) = span {
            d = d.primary(s, "unknown field");
        }
        if let Some(b) = crate::suggest::closest(name, DEVICE_FIELDS.iter().map(|f| f.name)) {
            d = d.help(format!("did you mean `{b}`?"));
        } else {
            d = d.help(format!("the fields are: {}", field_names()));
        }
        self.err(d);
    }

    /// A field of the `device = PROFILE { ... }` declaration: replaces the profile's value.
    /// Without a unit, the number is in the unit the profile wrote.
    fn override_field(&mut self, fields: &mut WrittenProfile, f: &Field) -> bool {
        let Some((name, existing)) = fields.get_key_value(f.name.name.as_str()).map(|(k, w)| (*k, *w)) else {
            self.unknown_field(&f.name.name, Some(f.name.span));
            return false;
        };
        let unit = match &f.unit {
            Some(u) => {
                let t = u.text();
                let Some(unit) = Unit::named(&t) else {
                    self.unknown_unit(&t, u.span);
                    return false;
                };
                if unit.quantity != existing.unit.quantity {
                    self.err(
                        Diagnostic::error(
                            Code::UnitMismatch,
                            format!(
                                "`{}` is {}, measured in {}, not in `{t}`",
                                f.name.name,
                                existing.unit.quantity.word(),
                                existing.unit.name
                            ),
                        )
                        .primary(u.span, "wrong kind of unit")
                        .help(format!("use one of: {}", Unit::names_of(existing.unit.quantity))),
                    );
                    return false;
                }
                unit
            }
            None => existing.unit,
        };
        let Some(v) = self.eval_const(self.root, &f.value, BareNames::Reject) else {
            return false;
        };
        let Some(x) = v.as_f64() else {
            self.type_mismatch(f.value.span, "a number", &v);
            return false;
        };
        fields.insert(
            name,
            WrittenField {
                number: x,
                unit,
                span: f.span,
            },
        );
        true
    }

    /// `--set device.NAME=VALUE`: a number (in the unit the profile wrote) or a number with a
    /// unit of the field's quantity.
    fn override_from_cli(&mut self, fields: &mut WrittenProfile, name: &str, v: &Value) -> bool {
        let Some((name, existing)) = fields.get_key_value(name).map(|(k, w)| (*k, *w)) else {
            self.unknown_field(name, None);
            return false;
        };
        let quantity = existing.unit.quantity;
        let (number, unit) = match v {
            Value::Int(i) => (*i as f64, existing.unit),
            Value::Float(f) => (*f, existing.unit),
            Value::Str(s) => {
                let Some((x, u)) = split_number_unit(s) else {
                    self.err(Diagnostic::error(
                        Code::BadOverride,
                        format!("`--set device.{name}={s}`: not a number with a unit"),
                    ));
                    return false;
                };
                if u.is_empty() {
                    (x, existing.unit)
                } else {
                    match Unit::named(u) {
                        Some(unit) if unit.quantity == quantity => (x, unit),
                        Some(_) => {
                            self.err(
                                Diagnostic::error(
                                    Code::UnitMismatch,
                                    format!("`--set device.{name}`: `{u}` is not a unit of {}", quantity.word()),
                                )
                                .help(format!("use one of: {}", Unit::names_of(quantity))),
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
        fields.insert(
            name,
            WrittenField {
                number,
                unit,
                span: existing.span,
            },
        );
        true
    }

    /// Checks that every tensor of a taskflow fits in the HBM of one rank at once: the
    /// lowering gives each tensor its own storage on every rank (a receive window its full
    /// capacity), so their sum is what a rank holds.
    pub(super) fn check_hbm_fit(&mut self) {
        let Some(dev) = self.device.as_ref() else { return };
        let hbm = dev.hbm_size();
        // Sizes are reported in the unit `hbm_size` was written in.
        let unit = dev
            .fields()
            .find(|f| f.spec.name == "hbm_size")
            .map_or(&UNITS[0], |f| f.unit);
        let mut errors = Vec::new();
        for tf in &self.taskflows {
            let bytes: f64 = tf
                .tensors
                .iter()
                .map(|t| {
                    t.shape
                        .iter()
                        .map(|d| match *d {
                            Dim::Fixed(n) => n as f64,
                            Dim::Recv(r) => self.routes.get(r.0 as usize).map_or(0.0, |s| s.spec.capacity as f64),
                        })
                        .product::<f64>()
                        * t.dtype.size() as f64
                })
                .sum();
            if bytes > hbm {
                errors.push(hbm_error(tf, bytes, hbm, unit));
            }
        }
        for d in errors {
            self.err(d);
        }
    }
}

fn hbm_error(tf: &Taskflow, bytes: f64, hbm: f64, unit: &Unit) -> Diagnostic {
    let show = |b: f64| format!("{:.2} {}", b / unit.factor, unit.name);
    Diagnostic::error(
        Code::LimitExceeded,
        format!(
            "taskflow `{}` needs {} of HBM per rank, more than the device's `hbm_size` of {}",
            tf.name,
            show(bytes),
            show(hbm)
        ),
    )
    .primary(tf.span, "its tensors do not fit in one rank's HBM")
    .note("every input, intermediate result and receive window of a taskflow has its own storage on each rank")
    .help("spread the experts over more ranks, shrink the shapes, or raise `hbm_size`")
}
