//! Routings and builtin signatures: `route r = kind(args);` is matched against the routing
//! kind's signature in `std::route`, validated (sizes, reachability of hotspots), and, once
//! the taskflows have bound its token count, materialised to check receive-window capacity.

use super::consts::BareNames;
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{RouteId, RouteKind, RouteSpec, Value};
use crate::syntax::ast::{Arg, ItemKind, RouteDecl, SigParam, SignatureKind};
use crate::syntax::token::Span;
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Clone, Debug)]
pub(crate) struct RouteState {
    pub spec: RouteSpec,
    /// Where the token count was bound (a taskflow input or op call).
    pub tokens_bound: Option<Span>,
    pub capacity_factor: f64,
    /// `gate: tf.z` as written (taskflow, tensor, span), resolved after the taskflows.
    pub gate: Option<(String, String, Span)>,
}

/// A signature parameter's type.
#[derive(Clone, Debug, PartialEq)]
enum SigType {
    Int,
    Float,
    Bool,
    Str,
    /// Another routing, by name (`by_rank(r)`).
    Route,
    /// A tensor of a taskflow, `taskflow.tensor` (or `""` for none).
    Tensor,
    OneOf(Vec<String>),
}

fn sig_type(p: &SigParam) -> SigType {
    if p.ty.len() == 1 {
        match p.ty[0].name.as_str() {
            "int" => return SigType::Int,
            "float" => return SigType::Float,
            "bool" => return SigType::Bool,
            "str" => return SigType::Str,
            "route" => return SigType::Route,
            "tensor" => return SigType::Tensor,
            _ => {}
        }
    }
    SigType::OneOf(p.ty.iter().map(|i| i.name.clone()).collect())
}

fn describe(t: &SigType) -> String {
    match t {
        SigType::Int => "an integer".into(),
        SigType::Float => "a number".into(),
        SigType::Bool => "`true` or `false`".into(),
        SigType::Str => "a string".into(),
        SigType::Route => "a routing".into(),
        SigType::Tensor => "a tensor of a taskflow (`taskflow.tensor`)".into(),
        SigType::OneOf(v) => format!(
            "one of {}",
            v.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
        ),
    }
}

impl Checker<'_> {
    /// Matches arguments against a signature item; returns every parameter's value.
    pub(crate) fn match_sig(
        &mut self,
        sig: ItemRef,
        args: &[Arg],
        span: Span,
        what: &str,
    ) -> Option<BTreeMap<String, (Value, Span)>> {
        let ItemKind::Signature(s) = &self.item(sig).kind else {
            return None;
        };
        let s = s.clone();
        // Looked up by name once per argument: a long signature and a long argument list stay
        // linear in their lengths.
        let by_name: HashMap<&str, usize> = s
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.name.as_str(), i))
            .collect();
        let mut given: BTreeMap<String, (Value, Span)> = BTreeMap::new();
        // Parameters given an argument, valid or not (an invalid one is not also "missing").
        let mut attempted: HashSet<String> = HashSet::new();
        let mut misplaced = false;
        let mut ok = true;
        let mut positional_done = false;
        for (i, a) in args.iter().enumerate() {
            let p = match &a.name {
                Some(n) => {
                    positional_done = true;
                    match by_name.get(n.name.as_str()) {
                        Some(&i) => &s.params[i],
                        None => {
                            let names: Vec<&str> = s.params.iter().map(|p| p.name.name.as_str()).collect();
                            let mut d = Diagnostic::error(
                                Code::UnknownArgument,
                                format!("{what} `{}` has no argument `{}`", s.name.name, n.name),
                            )
                            .primary(n.span, "unknown argument");
                            if let Some(b) = crate::suggest::closest(&n.name, names.iter().copied()) {
                                d = d.help(format!("did you mean `{b}`?"));
                            } else {
                                d = d.help(format!("the arguments are: {}", crate::suggest::listing(&names)));
                            }
                            self.err(d);
                            ok = false;
                            continue;
                        }
                    }
                }
                None => {
                    if positional_done {
                        self.err(
                            Diagnostic::error(Code::UnexpectedToken, "a positional argument after a named one")
                                .primary(a.value.span, "name this argument"),
                        );
                        ok = false;
                        misplaced = true;
                        continue;
                    }
                    match s.params.get(i) {
                        Some(p) => p,
                        None => {
                            self.err(
                                Diagnostic::error(
                                    Code::WrongArgCount,
                                    format!("{what} `{}` takes at most {} arguments", s.name.name, s.params.len()),
                                )
                                .primary(a.value.span, "one too many"),
                            );
                            ok = false;
                            continue;
                        }
                    }
                }
            };
            let pname = p.name.name.clone();
            attempted.insert(pname.clone());
            if let Some((_, prev)) = given.get(&pname) {
                let prev = *prev;
                self.err(
                    Diagnostic::error(Code::DuplicateArgument, format!("argument `{pname}` is given twice"))
                        .primary(a.value.span, "again here")
                        .secondary(prev, "first here"),
                );
                ok = false;
                continue;
            }
            let ty = sig_type(p);
            let bare = if matches!(ty, SigType::OneOf(_) | SigType::Route) {
                BareNames::Accept
            } else {
                BareNames::Reject
            };
            if ty == SigType::Tensor {
                // Named, not evaluated: the taskflows are checked after the routings.
                if let Some(v) = tensor_ref(&a.value) {
                    given.insert(pname, (v, a.value.span));
                    continue;
                }
                use crate::syntax::ast::ExprKind;
                let help = match &a.value.kind {
                    ExprKind::Str(_) => None,
                    ExprKind::Name(n) => {
                        Some((format!("write `{pname}: TASKFLOW.{n}`"), "which taskflow computes it?"))
                    }
                    _ => Some((format!("write `{pname}: TASKFLOW.TENSOR`"), "not a tensor's name")),
                };
                if let Some((help, label)) = help {
                    let d = Diagnostic::error(
                        Code::InvalidValue,
                        format!("`{pname}` takes a tensor of a taskflow, named with its taskflow"),
                    )
                    .primary(a.value.span, label)
                    .help(help);
                    self.err(d);
                    ok = false;
                    continue;
                }
            }
            let Some(v) = self.eval_const(self.root, &a.value, bare) else {
                ok = false;
                continue;
            };
            match self.coerce(v, &ty, a.value.span, &pname) {
                Some(v) => {
                    given.insert(pname, (v, a.value.span));
                }
                None => ok = false,
            }
        }
        // Every missing argument in one diagnostic: a signature of thousands of parameters
        // called with none gives one error, not thousands.
        let mut missing: Vec<&SigParam> = Vec::new();
        for p in &s.params {
            if given.contains_key(&p.name.name) {
                continue;
            }
            if attempted.contains(&p.name.name) || (misplaced && p.default.is_none()) {
                // Already reported: an invalid value, or an argument we could not place.
                continue;
            }
            match &p.default {
                Some(d) => {
                    let ty = sig_type(p);
                    let bare = if matches!(ty, SigType::OneOf(_)) {
                        BareNames::Accept
                    } else {
                        BareNames::Reject
                    };
                    if let Some(v) = self
                        .eval_const(sig.module, d, bare)
                        .and_then(|v| self.coerce(v, &ty, d.span, &p.name.name))
                    {
                        given.insert(p.name.name.clone(), (v, span));
                    }
                }
                None => missing.push(p),
            }
        }
        match missing[..] {
            [] => {}
            [p] => {
                self.err(
                    Diagnostic::error(
                        Code::MissingArgument,
                        format!("{what} `{}` needs the argument `{}`", s.name.name, p.name.name),
                    )
                    .primary(span, format!("`{}` is missing", p.name.name))
                    .help(format!(
                        "add `{}: {}`",
                        p.name.name,
                        describe(&sig_type(p)).replace("an integer", "N")
                    )),
                );
                ok = false;
            }
            _ => {
                // Only the names listed are written out.
                let listed = || missing.iter().take(crate::suggest::LISTED + 1);
                let names: Vec<String> = listed().map(|p| format!("`{}`", p.name.name)).collect();
                let adds: Vec<String> = listed()
                    .map(|p| {
                        format!(
                            "`{}: {}`",
                            p.name.name,
                            describe(&sig_type(p)).replace("an integer", "N")
                        )
                    })
                    .collect();
                self.err(
                    Diagnostic::error(
                        Code::MissingArgument,
                        format!(
                            "{what} `{}` needs {} more arguments: {}",
                            s.name.name,
                            missing.len(),
                            crate::suggest::listing_of(&names, missing.len())
                        ),
                    )
                    .primary(span, format!("{} arguments missing", missing.len()))
                    .help(format!("add {}", crate::suggest::listing_of(&adds, missing.len()))),
                );
                ok = false;
            }
        }
        ok.then_some(given)
    }

    fn coerce(&mut self, v: Value, ty: &SigType, span: Span, name: &str) -> Option<Value> {
        let r = match (ty, &v) {
            (SigType::Int, Value::Int(_)) => Some(v.clone()),
            (SigType::Float, Value::Int(i)) => Some(Value::Float(*i as f64)),
            (SigType::Float, Value::Float(_)) => Some(v.clone()),
            (SigType::Bool, Value::Bool(_)) => Some(v.clone()),
            (SigType::Str, Value::Str(_)) => Some(v.clone()),
            (SigType::OneOf(list), Value::Name(n)) if list.contains(n) => Some(v.clone()),
            (SigType::Route, Value::Name(_)) => Some(v.clone()),
            (SigType::Tensor, Value::Str(t)) if t.is_empty() => Some(v.clone()),
            _ => None,
        };
        if r.is_none() {
            let mut d = Diagnostic::error(
                Code::InvalidValue,
                format!(
                    "`{name}` takes {}, not {} `{}`",
                    describe(ty),
                    v.kind(),
                    super::consts::show_value(&v)
                ),
            )
            .primary(span, format!("expected {}", describe(ty)));
            if let (SigType::OneOf(list), Value::Name(n)) = (ty, &v) {
                if let Some(b) = crate::suggest::closest(n, list.iter().map(|s| s.as_str())) {
                    d = d.help(format!("did you mean `{b}`?"));
                }
            }
            self.err(d);
        }
        r
    }

    /// Checks a signature declared in the root (defaults must match their types).
    pub(super) fn check_signature_item(&mut self, r: ItemRef) {
        let ItemKind::Signature(s) = &self.item(r).kind else {
            return;
        };
        let s = s.clone();
        let mut seen: BTreeMap<String, Span> = BTreeMap::new();
        for p in &s.params {
            if let Some(prev) = seen.insert(p.name.name.clone(), p.name.span) {
                self.err(
                    Diagnostic::error(
                        Code::DuplicateDefinition,
                        format!("parameter `{}` is declared twice", p.name.name),
                    )
                    .primary(p.name.span, "again here")
                    .secondary(prev, "first here"),
                );
            }
            if let Some(d) = &p.default {
                let ty = sig_type(p);
                let bare = if matches!(ty, SigType::OneOf(_)) {
                    BareNames::Accept
                } else {
                    BareNames::Reject
                };
                if let Some(v) = self.eval_const(r.module, d, bare) {
                    self.coerce(v, &ty, d.span, &p.name.name);
                }
            }
        }
    }

    /// The routing of a `route` item, checking it on first use.
    pub(crate) fn route_id(&mut self, r: ItemRef) -> Option<RouteId> {
        if let Some(id) = self.route_of.get(&r) {
            return *id;
        }
        // Marked first: a routing derived from itself (directly or not) finds it unresolved.
        self.route_of.insert(r, None);
        self.routes_in_progress.push(r);
        let id = self.check_route(r);
        self.routes_in_progress.pop();
        self.route_of.insert(r, id);
        id
    }

    fn check_route(&mut self, r: ItemRef) -> Option<RouteId> {
        let ItemKind::Route(decl) = &self.item(r).kind else {
            return None;
        };
        let mut decl = (**decl).clone();
        let item_span = self.item(r).span;
        if r.module == self.root {
            if let Some(text) = self.opts.routing.clone() {
                match self.routing_override(&decl, &text) {
                    Ok(Some(d)) => decl = d,
                    Ok(None) => {}
                    Err(()) => return None,
                }
            }
        }
        let sig = match self.lookup(r.module, &decl.kind.name) {
            Some(s) if matches!(&self.item(s).kind, ItemKind::Signature(x) if x.kind == SignatureKind::Routing) => s,
            _ => {
                let mut d = Diagnostic::error(
                    Code::UnknownRouting,
                    format!("unknown routing kind `{}`", decl.kind.name),
                )
                .primary(decl.kind.span, "not a routing kind");
                if crate::suggest::has_budget() {
                    let kinds = self.names_where(
                        r.module,
                        |k| matches!(k, ItemKind::Signature(x) if x.kind == SignatureKind::Routing),
                    );
                    if let Some(b) = crate::suggest::closest(&decl.kind.name, kinds.iter().map(|s| s.as_str())) {
                        d = d.help(format!("did you mean `{b}`?"));
                    } else {
                        d = d.help(format!("the routing kinds are: {}", crate::suggest::listing(&kinds)));
                    }
                }
                self.err(d);
                return None;
            }
        };
        const GENERATED: [&str; 8] = [
            "balanced", "uniform", "zipf", "hotspot", "file", "router", "by_rank", "fanout",
        ];
        if self.modules[sig.module].std_name.is_none() || !GENERATED.contains(&decl.kind.name.as_str()) {
            // A routing kind declared by the user, even under a builtin's name: its generator
            // does not exist, and its arguments are not the ones the generators read.
            self.err(
                Diagnostic::error(
                    Code::UnknownRouting,
                    format!("routing kind `{}` has no generator", decl.kind.name),
                )
                .primary(decl.kind.span, "declared, but not a builtin routing")
                .help(format!("the builtin routings are {}", GENERATED.join(", "))),
            );
            return None;
        }
        let args = self.match_sig(sig, &decl.args, decl.args_span, "routing")?;
        if matches!(decl.kind.name.as_str(), "by_rank" | "fanout") {
            return self.derived_route(r, &decl, &args);
        }
        let int = |k: &str| match args.get(k) {
            Some((Value::Int(i), s)) => Some((*i, *s)),
            _ => None,
        };
        let float = |k: &str| match args.get(k) {
            Some((Value::Float(f), s)) => Some((*f, *s)),
            _ => None,
        };
        let (experts, es) = int("experts")?;
        let topk = match &decl.kind.name[..] {
            "file" => None,
            _ => Some(int("topk")?),
        };
        let seed = int("seed").map_or(0, |(s, _)| s as u64);
        // Tokens per rank given by the declaration: binds `r.tokens` before any call does.
        let tokens = int("tokens");
        let (cf, cfs) = float("capacity_factor").unwrap_or((0.0, decl.args_span));
        let ranks = self.device.as_ref().map(|d| u64::from(d.ranks()));
        let mut ok = true;
        let mut bad = |ck: &mut Self, span: Span, msg: String, help: Option<String>| {
            let mut d = Diagnostic::error(Code::BadRouting, msg).primary(span, "invalid");
            if let Some(h) = help {
                d = d.help(h);
            }
            ck.err(d);
            ok = false;
        };
        if experts < 1 {
            bad(self, es, format!("`experts` must be at least 1, got {experts}"), None);
        }
        if let Some((k, ks)) = topk {
            if k < 1 {
                bad(self, ks, format!("`topk` must be at least 1, got {k}"), None);
            } else if k > experts {
                bad(
                    self,
                    ks,
                    format!("`topk` = {k} is larger than `experts` = {experts}"),
                    Some("each token picks topk distinct experts".into()),
                );
            }
        }
        if let Some(n) = ranks {
            if experts >= 1 && (experts as u64).checked_rem(n) != Some(0) {
                bad(
                    self,
                    es,
                    format!("{experts} experts do not divide evenly over {n} ranks"),
                    Some(format!("use a multiple of {n} experts, or change the device's `ranks`")),
                );
            }
        }
        if let Some((t, ts)) = tokens {
            if t < 0 {
                bad(
                    self,
                    ts,
                    format!("`tokens` must be 0 (from the first tensor routed) or positive, got {t}"),
                    None,
                );
            }
        }
        if !(cf.is_finite() && cf >= 0.0) {
            bad(
                self,
                cfs,
                format!("`capacity_factor` must be 0 (exact) or positive, got {cf}"),
                None,
            );
        }
        let mut gate = None;
        let kind = match decl.kind.name.as_str() {
            "balanced" => RouteKind::Balanced,
            "uniform" => RouteKind::Uniform { seed },
            "zipf" => {
                let (s, ss) = float("s")?;
                if !(s.is_finite() && s >= 0.0) {
                    bad(
                        self,
                        ss,
                        format!("the Zipf exponent `s` must be at least 0, got {s}"),
                        None,
                    );
                }
                RouteKind::Zipf { s, seed }
            }
            "hotspot" => {
                let (f, fs) = float("max_over_mean")?;
                if let (Some(n), Some((k, _))) = (ranks, topk) {
                    if ok {
                        let fmax = crate::route::hotspot_max(experts as u64, k as u64, n);
                        if !(f >= 1.0 && f <= fmax + 1e-9) {
                            self.err(
                                Diagnostic::error(Code::HotspotUnreachable, format!("a hotspot factor of {f} cannot be reached"))
                                    .primary(fs, format!("reachable: 1 to {fmax:.3}"))
                                    .note(format!(
                                        "with {experts} experts on {n} ranks and top-{k}, sending every token to experts 0..{} gives the hottest rank {fmax:.3} times the mean",
                                        k - 1
                                    )),
                            );
                            ok = false;
                        }
                    }
                }
                RouteKind::Hotspot { max_over_mean: f, seed }
            }
            "router" => {
                let mut spec = crate::ir::RouterSpec {
                    score: match args.get("score") {
                        Some((Value::Name(n), _)) if n == "sigmoid" => crate::ir::ScoreFn::Sigmoid,
                        _ => crate::ir::ScoreFn::Softmax,
                    },
                    normalize: !matches!(args.get("normalize"), Some((Value::Bool(false), _))),
                    scale: float("scale").map_or(1.0, |x| x.0),
                    n_group: 1,
                    topk_group: 1,
                    skew: float("skew").map_or(0.0, |x| x.0),
                    seed,
                    logits: None,
                    bias: None,
                    resolved_logits: None,
                    resolved_bias: None,
                    gate: None,
                    gate_logits: None,
                };
                let bad_router = |ck: &mut Self, span: Span, msg: String, help: Option<String>| {
                    let mut d = Diagnostic::error(Code::BadRouter, msg).primary(span, "invalid");
                    if let Some(h) = help {
                        d = d.help(h);
                    }
                    ck.err(d);
                };
                let (ng, ngs) = int("n_group").unwrap_or((1, decl.args_span));
                let (tg, tgs) = int("topk_group").unwrap_or((1, decl.args_span));
                let mut router_ok = true;
                if ng < 1 || (experts >= 1 && experts % ng != 0) {
                    bad_router(
                        self,
                        ngs,
                        format!("`n_group` = {ng} does not divide the {experts} experts into equal groups"),
                        Some("use a divisor of `experts` (1: no groups)".into()),
                    );
                    router_ok = false;
                } else if tg < 1 || tg > ng {
                    bad_router(
                        self,
                        tgs,
                        format!("`topk_group` = {tg} is outside 1..={ng} (`n_group`)"),
                        None,
                    );
                    router_ok = false;
                } else if let Some((k, ks)) = topk {
                    if experts >= 1 && k >= 1 && k <= experts && tg * (experts / ng) < k {
                        bad_router(
                            self,
                            ks,
                            format!(
                                "`topk` = {k} is more than the {} experts of the {tg} kept groups",
                                tg * (experts / ng)
                            ),
                            Some("raise `topk_group`, or use fewer groups".into()),
                        );
                        router_ok = false;
                    }
                }
                if ng >= 1 {
                    spec.n_group = ng as u64;
                }
                if tg >= 1 {
                    spec.topk_group = tg as u64;
                }
                if !(spec.scale.is_finite() && spec.scale > 0.0) {
                    let sp = float("scale").map_or(decl.args_span, |x| x.1);
                    bad_router(self, sp, format!("`scale` must be positive, got {}", spec.scale), None);
                    router_ok = false;
                }
                if !(spec.skew.is_finite() && spec.skew >= 0.0) {
                    let sp = float("skew").map_or(decl.args_span, |x| x.1);
                    bad_router(self, sp, format!("`skew` must be at least 0, got {}", spec.skew), None);
                    router_ok = false;
                }
                for arg in ["logits", "bias"] {
                    let Some((Value::Str(f), sp)) = args.get(arg) else {
                        continue;
                    };
                    if f.is_empty() {
                        continue;
                    }
                    let resolved = self.resolve_allowed(r, f, *sp)?;
                    if arg == "logits" {
                        spec.logits = Some(f.clone());
                        spec.resolved_logits = Some(resolved);
                    } else {
                        spec.bias = Some(f.clone());
                        spec.resolved_bias = Some(resolved);
                    }
                }
                if let Some((Value::Name(g), gs)) = args.get("gate") {
                    if let Some((_, ls)) = spec.logits.as_ref().and(args.get("logits")) {
                        self.err(
                            Diagnostic::error(
                                Code::BadRouter,
                                "a router takes its logits from `gate` or from `logits`, not both",
                            )
                            .primary(*gs, "computed by the program")
                            .secondary(*ls, "read from a file")
                            .help("remove one of them"),
                        );
                        router_ok = false;
                    }
                    if let Some((tf, t)) = g.split_once('.') {
                        gate = Some((tf.to_string(), t.to_string(), *gs));
                    }
                }
                if !router_ok {
                    return None;
                }
                RouteKind::Router(spec)
            }
            "file" => {
                let path = match args.get("path") {
                    Some((Value::Str(p), _)) => p.clone(),
                    _ => return None,
                };
                let weights = match args.get("weights") {
                    Some((Value::Str(w), _)) if !w.is_empty() => Some(w.clone()),
                    _ => None,
                };
                // Resolved once, here, against the folder of the file that declares the
                // routing: every later stage reads the resolved paths.
                let dir = self.modules[r.module].path.as_ref().and_then(|p| p.parent());
                let resolve = |f: &str| dir.map_or_else(|| std::path::PathBuf::from(f), |d| d.join(f));
                let resolved = resolve(&path);
                let resolved_weights = weights.as_deref().map(resolve);
                // Only files inside the allowed directories are read; a file that does not
                // exist is reported when it is read.
                let mut outside = false;
                for (arg, f) in [("path", Some(&resolved)), ("weights", resolved_weights.as_ref())] {
                    let (Some(f), Some((_, sp))) = (f, args.get(arg)) else {
                        continue;
                    };
                    let Ok(canon) = std::fs::canonicalize(f) else { continue };
                    let shown = f.display().to_string();
                    if let Some(d) = self.outside_allowed(&canon, &format!("cannot read `{shown}`"), *sp) {
                        self.err(d);
                        outside = true;
                    }
                }
                if outside {
                    return None;
                }
                RouteKind::File {
                    path,
                    weights,
                    resolved,
                    resolved_weights,
                }
            }
            _ => return None,
        };
        // For file routings topk comes from the file; read its header now.
        let topk = match (&kind, topk) {
            (_, Some((k, _))) => k,
            (RouteKind::File { path, resolved, .. }, None) => match crate::npy::read_header(resolved) {
                Ok(a) if a.shape.len() == 3 => a.shape[2] as i64,
                Ok(a) => {
                    self.err(
                        Diagnostic::error(
                            Code::BadRouting,
                            format!("`{path}` has shape {:?}; expected [ranks, tokens, topk]", a.shape),
                        )
                        .primary(decl.args_span, "here"),
                    );
                    return None;
                }
                Err(e) => {
                    self.err(
                        Diagnostic::error(Code::FileNotFound, format!("cannot read routing file `{path}`: {e}"))
                            .primary(decl.args_span, "here"),
                    );
                    return None;
                }
            },
            _ => return None,
        };
        let drop = self.drop_spec(&args, cf, decl.args_span);
        if !ok || drop.is_err() {
            return None;
        }
        let drop = drop.ok().flatten();
        // The device is invalid (already reported) when it has no ranks: the routing cannot be
        // sized, and whatever uses it would only report follow-on errors.
        let ranks = ranks?;
        let id = RouteId(self.routes.len() as u32);
        self.routes.push(RouteState {
            spec: RouteSpec {
                name: decl.name.name.clone(),
                kind,
                experts: experts as u64,
                topk: topk as u64,
                ranks,
                tokens: tokens.filter(|t| t.0 > 0).map_or(0, |t| t.0 as u64),
                capacity: 0,
                drop,
                capacity_factor: cf,
                span: item_span,
            },
            tokens_bound: tokens.filter(|t| t.0 > 0).map(|t| t.1),
            capacity_factor: cf,
            gate,
        });
        Some(id)
    }

    /// `by_rank(r)` or `fanout(rr)`: a view of another routing of the same module.
    fn derived_route(
        &mut self,
        r: ItemRef,
        decl: &RouteDecl,
        args: &BTreeMap<String, (Value, Span)>,
    ) -> Option<RouteId> {
        let by_rank = decl.kind.name == "by_rank";
        let Some((Value::Name(pn), psp)) = args.get("of").cloned() else {
            return None;
        };
        let target = self
            .lookup(r.module, &pn)
            .filter(|t| matches!(self.item(*t).kind, ItemKind::Route(_)));
        let Some(pr) = target else {
            let mut d = Diagnostic::error(Code::UnknownName, format!("no routing `{pn}`"))
                .primary(psp, "not a routing of this program");
            if crate::suggest::has_budget() {
                let mut names = self.names_where(r.module, |k| matches!(k, ItemKind::Route(_)));
                names.retain(|n| *n != decl.name.name);
                d = match crate::suggest::closest(&pn, names.iter().map(|s| s.as_str())) {
                    Some(b) => d.help(format!("did you mean `{b}`?")),
                    None if names.is_empty() => {
                        d.help("declare the routing it views first: `route r = balanced(...);`")
                    }
                    None => d.help(format!("the routings are: {}", crate::suggest::listing(&names))),
                };
            }
            self.err(d);
            return None;
        };
        if self.routes_in_progress.contains(&pr) {
            self.err(
                Diagnostic::error(
                    Code::BadRouting,
                    format!("routing `{}` is derived from itself", decl.name.name),
                )
                .primary(psp, format!("`{pn}` depends on `{}`", decl.name.name)),
            );
            return None;
        }
        // The routing viewed is checked (and reported) on its own.
        let pid = self.route_id(pr)?;
        let parent = self.routes[pid.0 as usize].spec.clone();
        let item_span = self.item(r).span;
        let spec = if by_rank {
            if parent.kind.derived_from().is_some() {
                let mut base = pid;
                while let Some(b) = self.routes[base.0 as usize].spec.kind.derived_from() {
                    base = b;
                }
                let base = self.routes[base.0 as usize].spec.name.clone();
                self.err(
                    Diagnostic::error(
                        Code::BadRouting,
                        format!("`by_rank` views a routing of tokens to experts; `{pn}` is derived"),
                    )
                    .primary(psp, "a derived routing")
                    .help(format!("`{pn}` views `{base}`: write `by_rank({base})`")),
                );
                return None;
            }
            RouteSpec {
                name: decl.name.name.clone(),
                kind: RouteKind::ByRank { of: pid },
                experts: parent.ranks,
                topk: parent.topk,
                ranks: parent.ranks,
                tokens: parent.tokens,
                capacity: 0,
                drop: None,
                capacity_factor: 0.0,
                span: item_span,
            }
        } else {
            let RouteKind::ByRank { of: base } = parent.kind else {
                self.err(
                    Diagnostic::error(
                        Code::BadRouting,
                        format!("`fanout` views a `by_rank` routing; `{pn}` is not one"),
                    )
                    .primary(psp, "not declared `by_rank(..)`")
                    .help(format!(
                        "declare `route {pn}_ranks = by_rank({pn});` and write `fanout({pn}_ranks)`"
                    )),
                );
                return None;
            };
            let base = self.routes[base.0 as usize].spec.clone();
            RouteSpec {
                name: decl.name.name.clone(),
                kind: RouteKind::Fanout { of: pid },
                experts: base.experts,
                topk: base.topk.min(base.local_experts()).max(1),
                ranks: base.ranks,
                tokens: 0,
                capacity: 0,
                drop: None,
                capacity_factor: 0.0,
                span: item_span,
            }
        };
        let id = RouteId(self.routes.len() as u32);
        let tokens_bound = self.routes[pid.0 as usize].tokens_bound.filter(|_| by_rank);
        self.routes.push(RouteState {
            spec,
            tokens_bound,
            capacity_factor: 0.0,
            gate: None,
        });
        Some(id)
    }

    /// Makes the view `i` of routing `of` from the routings made before it (`None` when the
    /// routing it views was not made: unused, or already reported).
    fn derived_routing(
        &mut self,
        i: usize,
        made: &[Option<crate::route::Routing>],
        of: RouteId,
    ) -> Option<crate::route::Routing> {
        let parent = made.get(of.0 as usize)?.as_ref()?;
        let spec = self.routes[i].spec.clone();
        match spec.kind {
            RouteKind::ByRank { .. } => Some(parent.by_rank()),
            _ => {
                let base = self.routes[of.0 as usize].spec.kind.derived_from()?;
                let base = made.get(base.0 as usize)?.as_ref()?;
                let window = crate::lower::layout::RouteLayout::new(parent.clone(), false);
                match window.checked_fanout(&spec, base) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        self.err(
                            Diagnostic::error(Code::LimitExceeded, format!("routing `{}`: {e}", spec.name))
                                .primary(spec.span, "too large to materialise")
                                .help("use fewer tokens, ranks or experts"),
                        );
                        None
                    }
                }
            }
        }
    }

    /// The routing whose token count a routing shares: a `by_rank` view has the tokens of
    /// the routing it views.
    pub(crate) fn token_route(&self, id: RouteId) -> RouteId {
        match self.routes.get(id.0 as usize).map(|s| &s.spec.kind) {
            Some(RouteKind::ByRank { of }) => *of,
            _ => id,
        }
    }

    /// Binds the tokens per rank of a routing and of every `by_rank` view sharing them.
    pub(crate) fn bind_tokens(&mut self, id: RouteId, n: u64, span: Span) {
        let owner = self.token_route(id);
        for i in 0..self.routes.len() {
            let rid = RouteId(i as u32);
            if rid == owner || self.token_route(rid) == owner {
                let st = &mut self.routes[i];
                st.spec.tokens = n;
                st.tokens_bound = Some(span);
            }
        }
    }

    /// The capacity-limited dropping a routing asks for (`Ok(None)`: none; `Err`: reported).
    fn drop_spec(
        &mut self,
        args: &BTreeMap<String, (Value, Span)>,
        cf: f64,
        span: Span,
    ) -> Result<Option<crate::ir::DropSpec>, ()> {
        let flag = |k: &str| match args.get(k) {
            Some((Value::Bool(b), s)) => (*b, *s),
            _ => (false, span),
        };
        let (drop, ds) = flag("drop");
        let (renormalize, rs) = flag("renormalize");
        let order = match args.get("drop_order") {
            Some((Value::Name(n), s)) if n == "score" => (crate::ir::DropOrder::Score, Some(*s)),
            Some((_, s)) => (crate::ir::DropOrder::Token, Some(*s)),
            None => (crate::ir::DropOrder::Token, None),
        };
        if !drop {
            // Options of dropping without dropping: only an explicit one is an error.
            let explicit_order = order.1.filter(|s| *s != span && order.0 == crate::ir::DropOrder::Score);
            let explicit_renorm = renormalize.then_some(rs);
            if let Some(s) = explicit_order.or(explicit_renorm) {
                self.err(
                    Diagnostic::error(Code::BadCapacity, "`drop_order` and `renormalize` need `drop: true`")
                        .primary(s, "has no effect without dropping")
                        .help("add `drop: true` (and a `capacity_factor`), or remove the option"),
                );
                return Err(());
            }
            return Ok(None);
        }
        if !(cf.is_finite() && cf > 0.0) {
            self.err(
                Diagnostic::error(
                    Code::BadCapacity,
                    "`drop: true` needs a `capacity_factor` above 0 to size the experts' capacity",
                )
                .primary(ds, "dropping without a capacity")
                .help("add `capacity_factor: 1.25` (each expert keeps 1.25 times its mean rows)"),
            );
            return Err(());
        }
        Ok(Some(crate::ir::DropSpec {
            capacity_factor: cf,
            order: order.0,
            renormalize,
        }))
    }

    /// A file named by a routing argument, resolved against the folder of the file that
    /// declares the routing; reported (and `None`) when it lies outside the allowed
    /// directories. A file that does not exist is reported when it is read.
    fn resolve_allowed(&mut self, r: ItemRef, f: &str, sp: Span) -> Option<std::path::PathBuf> {
        let dir = self.modules[r.module].path.as_ref().and_then(|p| p.parent());
        let resolved = dir.map_or_else(|| std::path::PathBuf::from(f), |d| d.join(f));
        if let Ok(canon) = std::fs::canonicalize(&resolved) {
            let shown = resolved.display().to_string();
            if let Some(d) = self.outside_allowed(&canon, &format!("cannot read `{shown}`"), sp) {
                self.err(d);
                return None;
            }
        }
        Some(resolved)
    }

    /// `--routing` names a routing of the root, or is unnamed and the root has routings (one:
    /// more are reported where the override is applied).
    fn check_routing_target(&mut self) {
        let Some(text) = self.opts.routing.clone() else {
            return;
        };
        let names: Vec<String> = self.modules[self.root]
            .ast
            .items
            .iter()
            .filter_map(|it| match &it.kind {
                ItemKind::Route(r) => Some(r.name.name.clone()),
                _ => None,
            })
            .collect();
        let (target, _) = override_target(&text);
        let missing = match &target {
            Some(n) => !names.contains(n),
            None => names.is_empty(),
        };
        if !missing {
            return;
        }
        let mut d = Diagnostic::error(
            Code::BadOverride,
            match &target {
                Some(n) => format!("`--routing {text}`: the program has no routing `{n}`"),
                None => format!("`--routing {text}`: the program has no routing"),
            },
        );
        if names.is_empty() {
            d = d.help("the program declares no `route`");
        } else if let Some(b) = target
            .as_deref()
            .and_then(|n| crate::suggest::closest(n, names.iter().map(|s| s.as_str())))
        {
            d = d.help(format!("did you mean `{b}`?"));
        } else {
            d = d.help(format!("the routings are: {}", crate::suggest::listing(&names)));
        }
        self.err(d);
    }

    /// Applies `--routing [NAME=]KIND(args)` to a routing of the root, if it names it (or
    /// names none and this is the root's only routing). Named arguments of the declaration
    /// that the override does not give, and that the new kind takes, are kept.
    fn routing_override(&mut self, decl: &RouteDecl, text: &str) -> Result<Option<RouteDecl>, ()> {
        let (target, call) = override_target(text);
        let routes_in_root = self.modules[self.root]
            .ast
            .items
            .iter()
            .filter(|it| matches!(it.kind, ItemKind::Route(_)))
            .count();
        match &target {
            Some(n) if *n != decl.name.name => return Ok(None),
            None if routes_in_root != 1 => {
                self.err(
                    Diagnostic::error(
                        Code::BadOverride,
                        format!("`--routing {text}`: the program has {routes_in_root} routings"),
                    )
                    .help("name the routing: `--routing NAME=KIND(...)`"),
                );
                return Err(());
            }
            _ => {}
        }
        let file = self.sources.add(
            "<--routing>",
            None,
            format!("route {} = {};", decl.name.name, call.trim()),
        );
        let src = self.sources.get(file).map(|f| f.text.clone()).unwrap_or_default();
        let (ast, diags) = crate::syntax::parse_code(&src, file);
        if !diags.is_empty() {
            self.diags.extend(diags);
            return Err(());
        }
        let only = if ast.items.len() == 1 {
            ast.items.into_iter().next()
        } else {
            None
        };
        let Some(ItemKind::Route(new)) = only.map(|i| i.kind) else {
            self.err(Diagnostic::error(
                Code::BadOverride,
                format!("`--routing {text}`: expected one KIND(arg: value, ...) and nothing after it"),
            ));
            return Err(());
        };
        let takes: Vec<String> = match self.lookup(self.root, &new.kind.name).map(|s| &self.item(s).kind) {
            Some(ItemKind::Signature(sg)) => sg.params.iter().map(|p| p.name.name.clone()).collect(),
            _ => Vec::new(),
        };
        let mut args = new.args.clone();
        for a in &decl.args {
            let Some(n) = &a.name else { continue };
            let given = args.iter().any(|b| b.name.as_ref().is_some_and(|m| m.name == n.name));
            if !given && takes.contains(&n.name) {
                args.push(a.clone());
            }
        }
        Ok(Some(RouteDecl { args, ..*new }))
    }

    /// Materialises every routing whose token count is known and checks its windows.
    pub(super) fn finish_routes(&mut self) {
        self.check_routing_target();
        // The routings made so far, for the views derived from them.
        let mut made: Vec<Option<crate::route::Routing>> = Vec::with_capacity(self.routes.len());
        for i in 0..self.routes.len() {
            let st = self.routes[i].clone();
            if let Some(of) = st.spec.kind.derived_from() {
                let routing = self.derived_routing(i, &made, of);
                if let Some(r) = &routing {
                    let max = r.recv_counts().into_iter().max().unwrap_or(0);
                    self.routes[i].spec.capacity = max;
                    self.routes[i].spec.tokens = r.tokens as u64;
                }
                made.push(routing);
                continue;
            }
            made.push(None);
            if st.tokens_bound.is_none() {
                // A call that routes through it although no tensor gave its tokens (an op
                // sized by a param instead of `r.tokens`) would lower to no tasks.
                let user = self.taskflows.iter().find_map(|tf| {
                    tf.nodes
                        .iter()
                        .find(|n| n.routes.iter().any(|r| r.0 as usize == i))
                        .map(|n| (tf.name.clone(), n.name.clone(), n.span))
                });
                if let Some((tf, call, span)) = user {
                    self.err(
                        Diagnostic::error(
                            Code::UnboundShapeSymbol,
                            format!(
                                "routing `{}` is used by `{call}` in `{tf}`, but its tokens per rank are not known",
                                st.spec.name
                            ),
                        )
                        .primary(span, "routes through it")
                        .secondary(st.spec.span, "declared here")
                        .note("no call routes a tensor of `r.tokens` rows through it, so nothing gives its size")
                        .help(format!("give `tokens: N` in the declaration of `{}`", st.spec.name)),
                    );
                }
                // Never used by a taskflow: nothing to size.
                continue;
            }
            // Sized from the declaration before anything is materialised.
            let sp = &st.spec;
            if let Err(e) = crate::lower::layout::check_size(sp.ranks, sp.tokens, sp.topk, sp.experts, false) {
                let mut d = Diagnostic::error(Code::LimitExceeded, format!("routing `{}`: {e}", sp.name))
                    .primary(sp.span, "too large to materialise")
                    .help("use fewer tokens, ranks, experts or choices");
                if let Some(b) = st.tokens_bound {
                    d = d.secondary(b, "the token count is bound here");
                }
                self.err(d);
                continue;
            }
            let routing = match crate::route::Routing::generate(&st.spec) {
                Ok(r) => r,
                Err(e) => {
                    self.err(
                        Diagnostic::error(Code::BadRouting, format!("routing `{}`: {e}", st.spec.name))
                            .primary(st.spec.span, "cannot be generated"),
                    );
                    continue;
                }
            };
            // Kept only when a view is derived from it.
            if self
                .routes
                .iter()
                .any(|r| r.spec.kind.derived_from() == Some(RouteId(i as u32)))
            {
                made[i] = Some(routing.clone());
            }
            let counts = routing.recv_counts();
            let max = counts.iter().copied().max().unwrap_or(0);
            let capacity = match st.spec.window_capacity(&counts) {
                Ok(c) => c,
                Err((rank, got, c)) => {
                    let mut d = Diagnostic::error(
                        Code::RecvOverflow,
                        format!("routing `{}` sends {got} rows to rank {rank}, but its receive window holds {c}", st.spec.name),
                    )
                    .primary(st.spec.span, format!("capacity {c} rows per rank"))
                    .note(format!(
                        "capacity = ceil(capacity_factor {:?} x tokens {} x topk {}); the busiest rank receives {max} rows",
                        st.capacity_factor, st.spec.tokens, st.spec.topk
                    ))
                    .help(format!("raise `capacity_factor` to at least {:.3}, or use 0 to size the window exactly", max as f64 / (st.spec.tokens * st.spec.topk) as f64));
                    if let Some(b) = st.tokens_bound {
                        d = d.secondary(b, "routed here");
                    }
                    self.err(d);
                    c
                }
            };
            self.routes[i].spec.capacity = capacity;
        }
    }
}

/// `taskflow.tensor`, read as written (`Value::Name("taskflow.tensor")`).
fn tensor_ref(e: &crate::syntax::ast::Expr) -> Option<Value> {
    use crate::syntax::ast::ExprKind;
    let ExprKind::Field { base, field } = &e.kind else {
        return None;
    };
    let ExprKind::Name(tf) = &base.kind else {
        return None;
    };
    Some(Value::Name(format!("{tf}.{}", field.name)))
}

/// The routing named by `--routing NAME=KIND(...)` (none when unnamed) and the call.
fn override_target(text: &str) -> (Option<String>, &str) {
    match text.split_once('=') {
        Some((n, c)) if !n.trim().is_empty() && n.trim().chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_') => {
            (Some(n.trim().to_string()), c)
        }
        _ => (None, text),
    }
}
