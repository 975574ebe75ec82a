//! The typed op graph: the first level of the IR.
//!
//! In: produced by [`crate::check`] from a checked program. Out: consumed by lowering (tiles),
//! the CLI's `lower --emit ops` dump and the REPL. A value of these types is valid by
//! construction: every shape is concrete (ragged receive-window dimensions carry their
//! routing), every op call has its engine, tiling and analysed body, and every index refers
//! to an existing tensor, op or routing.

pub mod body;
pub mod cast;
mod device;
mod dump;

pub use body::*;
pub use device::*;
pub use dump::{program_json, program_text};

use crate::Span;
use std::collections::BTreeMap;

/// Element types. Conversions between them: [`DType::cast`] (module `cast`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F16,
    F32,
    I32,
    /// Signed 8-bit integers (quantised payloads).
    I8,
    /// Unsigned 8-bit integers.
    U8,
    /// OCP FP8 E4M3FN: 4 exponent bits, 3 mantissa bits, no infinity, max 448.
    Fp8E4M3,
    /// OCP FP8 E5M2: 5 exponent bits, 2 mantissa bits, IEEE-like, max 57344.
    Fp8E5M2,
}

impl DType {
    /// Every dtype, in the order the language lists them.
    pub const ALL: [DType; 8] = [
        DType::Bf16,
        DType::F16,
        DType::F32,
        DType::I32,
        DType::I8,
        DType::U8,
        DType::Fp8E4M3,
        DType::Fp8E5M2,
    ];
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Fp8E4M3 => "fp8e4m3",
            DType::Fp8E5M2 => "fp8e5m2",
        }
    }
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::I8 | DType::U8 | DType::Fp8E4M3 | DType::Fp8E5M2 => 1,
            DType::Bf16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
    /// The names of every dtype, comma-separated (for messages).
    pub fn names() -> String {
        DType::ALL.map(DType::name).join(", ")
    }
}

/// The two kinds of core of an Ascend die.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Cube cores: matrix products.
    Aic,
    /// Vector cores: elementwise work and communication.
    Aiv,
}

impl Engine {
    pub fn parse(s: &str) -> Option<Engine> {
        match s {
            "aic" => Some(Engine::Aic),
            "aiv" => Some(Engine::Aiv),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Engine::Aic => "aic",
            Engine::Aiv => "aiv",
        }
    }
}

/// Index of a routing in [`Program::routes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RouteId(pub u32);
/// Index of an op definition in [`Program::ops`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct OpId(pub u32);
/// Index of a tensor in [`Taskflow::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TensorId(pub u32);
/// Index of an op call in [`Taskflow::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct NodeId(pub u32);

/// A concrete dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(u64),
    /// The rows a rank receives through a routing: ragged across ranks, bounded by the
    /// routing's receive-window capacity.
    Recv(RouteId),
}

impl Dim {
    pub fn fixed(self) -> Option<u64> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Recv(_) => None,
        }
    }
}

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Home {
    /// A taskflow input, in each rank's HBM.
    Input,
    /// An intermediate result in each rank's HBM.
    Hbm,
    /// A receive window (symmetric memory) written by remote puts.
    Window,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub home: Home,
    /// Rows grouped by local expert of this routing (`group(m)` is defined).
    pub grouped: Option<RouteId>,
    /// The op call producing it; `None` for inputs.
    pub producer: Option<NodeId>,
    pub span: Span,
}

/// One op call of a taskflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: OpId,
    /// The `let` name, or `out`/the output name for the returned call, or `op#N` for nested.
    pub name: String,
    pub inputs: Vec<TensorId>,
    pub routes: Vec<RouteId>,
    pub output: TensorId,
    pub engine: Engine,
    pub dtype: DType,
    /// Tile size per index variable of the body (after defaults and clamping).
    pub tile: Vec<(String, u64)>,
    /// Ordering hints (`ratr`).
    pub order: Vec<String>,
    pub priority: i64,
    /// The body with concrete ranges and offsets for this call (shared by calls with the
    /// same argument types).
    pub body: std::sync::Arc<ConcreteBody>,
    pub span: Span,
}

/// A checked taskflow: the op graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Taskflow {
    pub name: String,
    pub tensors: Vec<Tensor>,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<(String, TensorId)>,
    /// In a topological order (the order of the source).
    pub nodes: Vec<Node>,
    pub span: Span,
}

impl Taskflow {
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }
    /// Per tensor: whether some call of the taskflow takes it as an input.
    pub fn tensors_read(&self) -> Vec<bool> {
        let mut read = vec![false; self.tensors.len()];
        for node in &self.nodes {
            for &i in &node.inputs {
                if let Some(x) = read.get_mut(i.0 as usize) {
                    *x = true;
                }
            }
        }
        read
    }
    /// The tensor a name denotes in this taskflow: an input, a `let` or a named output.
    pub fn named(&self, name: &str) -> Option<TensorId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .or_else(|| {
                self.tensors
                    .iter()
                    .position(|t| t.name == name)
                    .map(|i| TensorId(i as u32))
            })
    }
    /// The saved activations of a backward: each input of `self` (the backward) whose name
    /// denotes a tensor of `forward`, as (backward input, forward tensor), in input order.
    pub fn saved_from(&self, forward: &Taskflow) -> Vec<(TensorId, TensorId)> {
        self.inputs
            .iter()
            .filter_map(|&i| forward.named(&self.tensor(i).name).map(|f| (i, f)))
            .collect()
    }
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }
}

/// A checked op definition.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDef {
    pub name: String,
    pub is_comm: bool,
    pub engine: Engine,
    pub docs: Vec<String>,
    /// The signature as written (for dumps and the REPL).
    pub signature: String,
    pub span: Span,
}

/// A routing kind with its arguments, and the routing it produces once materialised.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSpec {
    pub name: String,
    pub kind: RouteKind,
    pub experts: u64,
    pub topk: u64,
    pub ranks: u64,
    /// Tokens per rank (bound by the first taskflow that routes a tensor).
    pub tokens: u64,
    /// Receive-window rows per rank.
    pub capacity: u64,
    /// Capacity-limited routing: rows beyond an expert's capacity are dropped.
    pub drop: Option<DropSpec>,
    /// `capacity_factor` as declared (0: the window is sized exactly).
    pub capacity_factor: f64,
    pub span: Span,
}

/// Which rows an over-full expert keeps first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropOrder {
    /// In window order: by (source rank, token, choice).
    Token,
    /// By gate weight, highest first; ties in window order.
    Score,
}

/// `capacity_factor: c, drop: true`: every expert keeps at most
/// `ceil(c * ranks * tokens * topk / experts)` rows, in `order`; the others are dropped.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DropSpec {
    pub capacity_factor: f64,
    pub order: DropOrder,
    /// Rescale a token's kept weights to the sum of all its weights.
    pub renormalize: bool,
}

impl DropSpec {
    /// Rows each expert keeps: `ceil(capacity_factor * ranks * tokens * topk / experts)`.
    pub fn expert_capacity(&self, ranks: u64, tokens: u64, topk: u64, experts: u64) -> u64 {
        let mean = ranks.saturating_mul(tokens).saturating_mul(topk) as f64 / experts.max(1) as f64;
        // The product is rounded to 12 digits first, so that 1.25 * 8 is 10, not 10.000000000000002.
        let x = (self.capacity_factor * mean * 1e12).round() / 1e12;
        x.ceil().max(0.0) as u64
    }
}

impl RouteSpec {
    pub fn local_experts(&self) -> u64 {
        self.experts / self.ranks.max(1)
    }
    /// The receive-window rows per rank of this routing (not a view) given the rows each
    /// rank receives: with dropping, every local expert's capacity; with a capacity factor
    /// f > 0, ceil(f * tokens * topk), or the first (rank, rows) that does not fit; else the
    /// busiest rank's rows.
    pub fn window_capacity(&self, recv: &[u64]) -> Result<u64, (usize, u64, u64)> {
        let max = recv.iter().copied().max().unwrap_or(0);
        if let Some(d) = &self.drop {
            return Ok(self.local_experts() * d.expert_capacity(self.ranks, self.tokens, self.topk, self.experts));
        }
        if self.capacity_factor > 0.0 {
            let c = (self.capacity_factor * (self.tokens * self.topk) as f64).ceil() as u64;
            return match recv.iter().enumerate().find(|(_, &got)| got > c) {
                Some((rank, &got)) => Err((rank, got, c)),
                None => Ok(c),
            };
        }
        Ok(max)
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RouteKind {
    Balanced,
    Uniform {
        seed: u64,
    },
    Zipf {
        s: f64,
        seed: u64,
    },
    Hotspot {
        max_over_mean: f64,
        seed: u64,
    },
    /// Routing read from `.npy` files. `path` and `weights` are as written; `resolved` and
    /// `resolved_weights` are the files they name, relative to the file that declared the
    /// routing (the checker resolves them once).
    File {
        path: String,
        weights: Option<String>,
        #[serde(skip)]
        resolved: std::path::PathBuf,
        #[serde(skip)]
        resolved_weights: Option<std::path::PathBuf>,
    },
    /// A router: per token, logits over the experts (from `logits`, or drawn from the seed),
    /// scores by softmax or sigmoid, a (group-limited) top-k on the scores plus `bias`, and
    /// the chosen scores as gate weights (normalised and scaled as asked).
    Router(RouterSpec),
    /// `by_rank(r)`: routing `r` seen by destination rank. Each token goes once to every
    /// rank that holds at least one of its (kept) experts: choice j is kept when it is the
    /// first kept choice of its token on its rank. One "expert" per rank, weight 1.
    ByRank {
        of: RouteId,
    },
    /// `fanout(rr)` of `rr = by_rank(r)`: on every rank, from the rows of `rr`'s window
    /// (one per (source rank, token)) to `r`'s experts on that rank. Its tokens are `rr`'s
    /// window rows; its choices and weights are `r`'s, kept where the expert is local.
    Fanout {
        of: RouteId,
    },
}

impl RouteKind {
    /// The router of this routing, when it is one.
    pub fn router(&self) -> Option<&RouterSpec> {
        match self {
            RouteKind::Router(r) => Some(r),
            _ => None,
        }
    }
    /// The routing this one is derived from.
    pub fn derived_from(&self) -> Option<RouteId> {
        match self {
            RouteKind::ByRank { of } | RouteKind::Fanout { of } => Some(*of),
            _ => None,
        }
    }
}

/// How a router turns logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFn {
    Softmax,
    Sigmoid,
}

/// The arguments of a `router(...)` routing.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RouterSpec {
    pub score: ScoreFn,
    pub normalize: bool,
    pub scale: f64,
    pub n_group: u64,
    pub topk_group: u64,
    /// Logits drawn when no file is given: N(0, 1) minus `skew * ln(e + 1)` for expert e.
    pub skew: f64,
    pub seed: u64,
    /// float32 [ranks, tokens, experts], as written.
    pub logits: Option<String>,
    /// float32 [experts], added to the scores for the selection only, as written.
    pub bias: Option<String>,
    #[serde(skip)]
    pub resolved_logits: Option<std::path::PathBuf>,
    #[serde(skip)]
    pub resolved_bias: Option<std::path::PathBuf>,
    /// `gate: tf.z`: the logits are a tensor the program computes.
    pub gate: Option<GateRef>,
    /// The gate's values once a numerics run has computed them ([ranks, tokens, experts],
    /// row-major): they take the place of `logits` and of the seeded draw.
    #[serde(skip)]
    pub gate_logits: Option<std::sync::Arc<Vec<f64>>>,
}

/// The tensor a router's logits come from: `[tokens, experts]` per rank, computed by a
/// taskflow of the program. Calls of that taskflow which route through the router (or a view
/// of it) wait for the whole tensor on their rank; every other taskflow sees the routing as
/// fixed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GateRef {
    pub taskflow: String,
    pub tensor: String,
    #[serde(skip)]
    pub id: TensorId,
    #[serde(skip)]
    pub span: Span,
}

/// A value of a constant expression.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// A bare name used as a value (`priority: critical_path`).
    Name(String),
}

impl Value {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Bool(_) => "a boolean",
            Value::Str(_) => "a string",
            Value::Name(_) => "a name",
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            // Very large or small magnitudes in exponent form: `1e300`, not its 301 digits.
            Value::Float(x) if *x != 0.0 && !(1e-6..1e16).contains(&x.abs()) => write!(f, "{x:e}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Name(n) => write!(f, "{n}"),
        }
    }
}

/// The selected schedule of a taskflow.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSpec {
    pub taskflow: Option<String>,
    pub policy: String,
    pub options: BTreeMap<String, Value>,
    pub span: Span,
}

/// A scheduling policy as the stdlib declares it: its name and every option's default
/// (in declaration order). The checker guarantees that the name is a strategy of
/// [`crate::policy::Policy`] and that each option has a meaning under it.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyDecl {
    pub name: String,
    pub defaults: Vec<(String, Value)>,
}

/// A checked program.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Parameters of the root file (and those it imports), in definition order.
    pub params: Vec<(String, Value)>,
    pub device: Device,
    pub routes: Vec<RouteSpec>,
    pub ops: Vec<OpDef>,
    pub taskflows: Vec<Taskflow>,
    pub schedules: Vec<ScheduleSpec>,
    /// The policies in scope (`std::schedule`), with their declared defaults.
    pub policies: Vec<PolicyDecl>,
    /// The taskflows derived by `grad`, with what each keeps from its forward.
    pub grads: Vec<GradInfo>,
}

/// A backward derived by `grad`: the forward's tensors (`let`s and outputs, by the forward's
/// [`TensorId`]s) it reads as saved activations, and those it recomputes instead; and the
/// derived items as source text, which replaces the `grad` declaration in
/// `hpmoe fmt --expand-grad` (see `driver::expand_grads`).
#[derive(Clone, Debug, PartialEq)]
pub struct GradInfo {
    pub taskflow: String,
    pub forward: String,
    pub saved: Vec<TensorId>,
    pub recomputed: Vec<TensorId>,
    /// The `grad` item in the root file (without its doc comments).
    pub span: Span,
    /// The derived taskflow (without the `grad` item's doc comments, which stay before it),
    /// in canonical layout.
    pub taskflow_source: String,
    /// The derived ops (each with its doc comment), in canonical layout.
    pub ops_source: String,
}

impl Program {
    /// The declaration of a policy.
    pub fn policy_decl(&self, name: &str) -> Option<&PolicyDecl> {
        self.policies.iter().find(|p| p.name == name)
    }
    pub fn route(&self, id: RouteId) -> &RouteSpec {
        &self.routes[id.0 as usize]
    }
    /// The routing a view is derived from, through every view (a routing of tokens to
    /// experts is its own base).
    pub fn base_route(&self, mut id: RouteId) -> RouteId {
        // Views are acyclic (checked); the bound only guards a hand-built program.
        for _ in 0..self.routes.len() {
            match self.routes.get(id.0 as usize).and_then(|r| r.kind.derived_from()) {
                Some(of) => id = of,
                None => break,
            }
        }
        id
    }
    /// The gate tensor of `tf` that a call routing through `id` must wait for: the tensor
    /// of `tf` whose values choose the experts of `id` (or of the routing it views).
    pub fn gate_in(&self, tf: &Taskflow, id: RouteId) -> Option<TensorId> {
        let base = self.routes.get(self.base_route(id).0 as usize)?;
        let g = base.kind.router()?.gate.as_ref()?;
        (g.taskflow == tf.name && (g.id.0 as usize) < tf.tensors.len()).then_some(g.id)
    }
    /// The gate tensors call `node` of `tf` waits for, whole, on its rank, with their shapes
    /// ([tokens, experts], checked): those of the routers it routes through (or views of
    /// them) that `tf` computes. A call reads its routing, made from the gate's logits.
    pub fn gate_reads(&self, tf: &Taskflow, node: usize) -> Vec<(TensorId, [u64; 2])> {
        let mut v: Vec<(TensorId, [u64; 2])> = Vec::new();
        let Some(n) = tf.nodes.get(node) else { return v };
        for &r in &n.routes {
            let Some(z) = self.gate_in(tf, r) else { continue };
            if let [Dim::Fixed(a), Dim::Fixed(b)] = tf.tensor(z).shape[..] {
                if !v.iter().any(|g| g.0 == z) {
                    v.push((z, [a, b]));
                }
            }
        }
        v
    }
    /// The routings whose experts a tensor of the program chooses (`router(gate: ...)`).
    pub fn gated_routes(&self) -> Vec<RouteId> {
        (0..self.routes.len())
            .filter(|&i| self.routes[i].kind.router().is_some_and(|r| r.gate.is_some()))
            .map(|i| RouteId(i as u32))
            .collect()
    }
    pub fn op(&self, id: OpId) -> &OpDef {
        &self.ops[id.0 as usize]
    }
    /// Bytes of one rank's share of a tensor (a receive window counts its capacity rows).
    pub fn tensor_bytes(&self, t: &Tensor) -> u64 {
        t.shape
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Recv(r) => self.route(*r).capacity,
            })
            .fold(t.dtype.size(), u64::saturating_mul)
    }
    pub fn taskflow(&self, name: &str) -> Option<&Taskflow> {
        self.taskflows.iter().find(|t| t.name == name)
    }
    /// The forward a taskflow is the backward of: a taskflow named `F_bwd` is paired with
    /// the taskflow `F` of the same program (docs/LANGUAGE.md, "Forward and backward").
    pub fn forward_of(&self, backward: &Taskflow) -> Option<&Taskflow> {
        let f = backward.name.strip_suffix("_bwd")?;
        self.taskflow(f)
    }
    /// The (forward, backward) pairs of the program, in the order of the backward taskflows.
    pub fn layer_pairs(&self) -> Vec<(&Taskflow, &Taskflow)> {
        self.taskflows
            .iter()
            .filter_map(|b| self.forward_of(b).map(|f| (f, b)))
            .collect()
    }
    /// The schedule that applies to a taskflow: its own, else the file-wide one.
    pub fn schedule_for(&self, taskflow: &str) -> Option<&ScheduleSpec> {
        self.schedules
            .iter()
            .find(|s| s.taskflow.as_deref() == Some(taskflow))
            .or_else(|| self.schedules.iter().find(|s| s.taskflow.is_none()))
    }
}
