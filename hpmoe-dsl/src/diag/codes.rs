//! The registry of error codes. Codes are stable: a code is never reused for another meaning.
//! `hpmoe explain CODE` prints the long form.

use std::fmt;

/// Everything known about one code.
#[derive(Debug)]
pub struct CodeInfo {
    pub code: Code,
    /// Short kebab-case name, e.g. `unknown-name`.
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// The long explanation, with an example and the fix.
    pub explanation: &'static str,
}

macro_rules! codes {
    ($( $variant:ident = $num:literal, $name:literal, $summary:literal, $expl:literal; )*) => {
        /// A stable diagnostic code (`E` followed by four digits).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code { $( $variant ),* }

        /// Every code, in numeric order.
        pub static CODES: &[CodeInfo] = &[
            $( CodeInfo { code: Code::$variant, name: $name, summary: $summary, explanation: $expl } ),*
        ];

        impl Code {
            pub fn number(self) -> u16 {
                match self { $( Code::$variant => $num ),* }
            }
        }
    };
}

impl Code {
    pub fn info(self) -> &'static CodeInfo {
        // CODES is in declaration order, which is the enum order.
        &CODES[self as usize]
    }
    /// `E0201` style.
    pub fn as_string(self) -> String {
        format!("E{:04}", self.number())
    }
    /// Looks a code up by its `E0201` form (case-insensitive, the `E` optional).
    pub fn parse(s: &str) -> Option<Code> {
        let t = s.trim();
        let digits = t.strip_prefix(['E', 'e']).unwrap_or(t);
        let n: u16 = digits.parse().ok()?;
        CODES.iter().find(|c| c.code.number() == n).map(|c| c.code)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "E{:04}", self.number())
    }
}

codes! {
    // ---- syntax: 01xx ----
    UnexpectedToken = 101, "unexpected-token", "the parser found a token it did not expect",
"The text does not follow the grammar of the language. The message names what was expected
and what was found.

    param tokens 4096;      // error: expected `=`, found `4096`
    param tokens = 4096;    // fix

The parser recovers at the next `;` or item keyword and keeps reporting, so one mistake may
explain several later messages: fix the first one first.";
    InvalidCharacter = 102, "invalid-character", "a character that cannot start any token",
"Only Rust tokens are allowed: identifiers, numbers, strings, punctuation, brackets and
comments. Characters such as a back-tick or a non-ASCII symbol outside a string or comment
are errors.

    param x = 4096 ` ;   // error: invalid character";
    Unterminated = 103, "unterminated", "a string or block comment is not closed",
"A string literal needs a closing `\"` and a block comment `/* ... */` a closing `*/`
(block comments nest, as in Rust).";
    UnbalancedDelimiter = 104, "unbalanced-delimiter", "a bracket is not closed, or closes the wrong bracket",
"Every `(`, `[` and `{` needs its matching closer. The label points at the opener that was
left open, or at the closer that does not match.

    op f<T>(x: T[M, N) -> T[M, N] on aiv { out[m, n] = x[m, n]; }
    //                ^ expected `]`";
    LiteralTooLarge = 105, "literal-too-large", "a number literal does not fit in 64 bits",
"Integer literals must fit in an unsigned 64-bit integer (at most 18446744073709551615) and
float literals must be finite.";
    NestingTooDeep = 106, "nesting-too-deep", "expressions or brackets are nested too deeply",
"To keep checking fast and safe, nesting of brackets and expressions is limited (128 levels).
Split the expression with `let` bindings or parameters. In an op body, a statement's value
with its `let`s substituted is limited too (256 levels, 65536 terms): each use of a `let`
repeats its expression, so a long chain of lets that use each other twice grows
exponentially.";
    InvalidLiteral = 107, "invalid-literal", "a literal of the wrong kind or with a suffix",
"Number literals may not carry a type suffix (`4096u32`) and strings are only used for file
names. Write plain numbers; dtypes are given by tensor types.";
    TextDirectionControl = 108, "text-direction-control", "a text direction control character in a comment or string",
"The Unicode embeddings, overrides and isolates (U+202A to U+202E, U+2066 to U+2069) change
the order in which an editor or a review shows the text around them, so a comment or string
holding one can make code display as something other than what is checked and run. They are
errors wherever they appear; remove them.";

    // ---- names: 02xx ----
    UnknownName = 201, "unknown-name", "a name that is not defined",
"A name must be defined before it is used: a `param`, an `op` or `comm` (defined or
imported), a `route`, a tensor bound by `let` or a taskflow input, or a shape variable bound
by an op signature. The help suggests the closest defined name.

    import std::moe::{dispatch, gmm, swiglu, combine};
    let a = swiglo(h);    // error: unknown op `swiglo`; help: did you mean `swiglu`?";
    DuplicateDefinition = 202, "duplicate-definition", "a name is defined twice",
"Each name may be defined once per scope: params, ops, routes, taskflows and profiles share
the file scope; `let` bindings and inputs share the taskflow scope; index variables share an
op body. Rename one of them.";
    UnknownModule = 203, "unknown-module", "an import names a module or item that does not exist",
"`import std::MODULE::{items}` imports from the embedded standard library. The modules are
`std::moe` (operators), `std::route` (routing kinds), `std::device` (device profiles) and
`std::schedule` (policies). `import \"file.hpm\";` imports every item of another file,
relative to the importing file.";
    WrongKind = 204, "wrong-kind", "a name refers to the wrong kind of thing",
"A name was found but it is of the wrong kind: an op where a tensor is expected, a tensor
where an op is called, a routing where a param is expected, and so on.

    let y = gmm(w_up, xd);   // fine if shapes agree
    let z = x(w_up);         // error: `x` is a tensor, not an op";
    UnusedValue = 205, "unused-value", "a value is computed but never used",
"A `let` binding in a taskflow that nothing reads is dead work; the scheduler would still run
its tasks. Remove it or use it. This is a warning.";
    ReservedName = 206, "reserved-name", "a keyword or builtin is used as a name",
"Names such as `out`, `sum`, `group`, `on`, `tile` and the dtype names (`bf16`, `f16`,
`f32`) have a fixed meaning and cannot be redefined.";

    // ---- arity and arguments: 03xx ----
    WrongArgCount = 301, "wrong-arg-count", "a call has the wrong number of arguments",
"An op call, a routing or a function takes a fixed number of arguments; the message gives
the signature.

    let h = gmm(xd);            // error: `gmm` takes 2 arguments, got 1
    let h = gmm(xd, w_up);      // fix";
    UnknownArgument = 302, "unknown-argument", "a named argument or option that does not exist",
"Named arguments of routings, options of schedules, fields of devices and tile keys must be
among the declared ones. The help lists them and suggests the closest.

    route r = balanced(experts: 64, topk: 8, tokens: 4); // error: no argument `tokens`";
    MissingArgument = 303, "missing-argument", "a required argument is not given",
"A routing or policy parameter without a default must be given.

    route r = zipf(experts: 64, topk: 8);   // error: missing `s`";
    DuplicateArgument = 304, "duplicate-argument", "the same argument or option is given twice",
"Each named argument, option, field or tile key may appear once.";
    InvalidValue = 305, "invalid-value", "an argument or option has a value of the wrong kind or out of range",
"For example `topk: 0`, `priority: fastest` (not one of the allowed values), or a string
where a number is expected. The message names the accepted values. Device fields are
bounded by their kind: ratios from 0.001 to 1, counts whole and at least 1, sizes from 1 B to
1 PiB, frequencies from 1 kHz to 1000 GHz, times positive and at most 1 s, bandwidths from
1 KB/s to 1000000 TB/s and per-cycle rates from 0.001 to 2^30.";

    // ---- dtypes: 04xx ----
    DtypeMismatch = 401, "dtype-mismatch", "tensors of different dtypes where one dtype is required",
"A generic op `op f<T>(a: T[..], b: T[..])` needs both arguments of the same dtype. The
message shows where `T` was bound and where it differs.

    taskflow f(a: bf16[4, 4], b: f16[4, 4]) -> bf16[4, 4] { return add(a, b); }
    // error: `T` is bf16 from `a` but f16 from `b`";
    UnknownDtype = 402, "unknown-dtype", "a dtype that is neither builtin nor a generic parameter",
"The dtypes are `bf16`, `f16`, `f32` and `i32`; an op may also use its generic parameters
(`op f<T>(x: T[M])`).";

    // ---- shapes: 05xx ----
    ShapeMismatch = 501, "shape-mismatch", "a dimension does not agree with the signature",
"Op signatures name dimensions with symbols; every use of a symbol must have the same size.
The message gives the symbolic dimension and the concrete sizes on each side.

    op swiglu<T>(h: T[M, 2 * N]) -> T[M, N] on aiv { ... }
    let a = swiglu(x);   // x: bf16[4096, 7168] gives N = 3584, but the output declared N = 2048";
    RankMismatch = 502, "rank-mismatch", "a tensor has the wrong number of dimensions",
"The number of indices or dimensions must match the declared tensor type.

    out[m, n] = x[m];   // error: `x` has 2 dimensions, indexed with 1";
    BodyCoverage = 503, "body-coverage", "an op body does not write every output element exactly once",
"The statements of an op body must together write every element of `out` once: their index
ranges are derived from the tensors they read. A gap leaves output undefined; an overlap
writes twice. The puts of a comm op likewise: `=` puts write each element at most once
(`+=` puts add), and together they write all of `out` (every token's every choice through
`r.slot(t, j)`).

    op half<T>(x: T[M, N]) -> T[M, 2 * N] on aiv { out[m, n] = x[m, n]; }
    // error: `out[.., N..2*N]` is never written
    comm d<T>(x: T[r.tokens, H], r: route) -> T[r.recv, H] {
        put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h + 1];   // error: the last column
    }";
    IndexOutOfRange = 504, "index-out-of-range", "an index expression can leave its dimension",
"Index ranges are derived from the tensors each index variable reads; an index with an
offset must stay inside every dimension it indexes.";
    BadIndex = 505, "bad-index", "an index expression that is not affine in one variable",
"Indices must be of the forms `i`, `i + c`, `i - c`, `a * i + c`, a constant, `group(m)`,
or a routing function (in `comm` ops). Two index variables in one index (`x[i + j]`) or a
tensor read inside an index are not allowed.";
    UnboundShapeSymbol = 506, "unbound-shape-symbol", "a shape symbol that no argument determines",
"Every symbol in an op's output type must be bound by its inputs (`M` in `T[M, N]`), either
directly or by solving a linear dimension such as `2 * N`.";
    NegativeDimension = 507, "negative-dimension", "a dimension that is zero or negative",
"Tensor dimensions must be at least 1.";
    NotGrouped = 508, "not-grouped", "`group(m)` on rows that are not grouped by expert",
"`group(m)` gives the local expert of row `m`; it is only defined for rows that came from a
routing's receive window (`T[r.recv, H]`) and kept their row order. The message names the
tensor whose rows are not grouped.";

    SavedMismatch = 520, "saved-mismatch", "a backward's saved activation differs from the forward's tensor",
"A taskflow named `F_bwd` is the backward of the taskflow `F`. Each of its inputs named like
a tensor of `F` (an input, a `let` or a named output) is a saved activation: `hpmoe run
--numerics` feeds it the forward's values, so it must have the same dtype and shape.

    taskflow moe_ffn(x: bf16[tokens, hidden], ...) -> ... { let xd = dispatch(x, r); ... }
    taskflow moe_ffn_bwd(dy: bf16[tokens, hidden], xd: f32[r.recv, hidden], ...) -> ...
    // error: `xd` is bf16[r.recv, hidden] in the forward

Declare the input with the forward's type, or give it another name if it is not the
forward's tensor.";

    // ---- engines: 06xx ----
    NotDifferentiable = 521, "not-differentiable", "an op on the path of a `grad` has no derived gradient",
"`taskflow B = grad(F, wrt: [..]);` derives the gradient of every op call between the `wrt`
inputs and the outputs of `F` from the op's body. An op cannot be differentiated when the
differentiated input passes through a function without a derivative (`max`, `min`, `relu`,
`abs`, `clamp`, `round`, `%`, a `max(k)` reduction, a cast to an integer or fp8 type),
when one of its reads has an index the gradient cannot invert (a constant, a strided
`2 * i`, the same variable in two dimensions: `x[m, m]`), or when a comm op's puts are not
one of the two routing patterns (`r.rank(t, j)`/`r.slot(t, j)` and
`r.src_rank(m)`/`r.src_token(m)`). A tensor on the gradient's path with an integer or
quantised dtype (`i8`, `u8`, `i32`, `fp8e4m3`, `fp8e5m2`) is refused too: its values are
rounded, and no straight-through estimator is derived.

    op top<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = max(x[m, n], 0); }
    taskflow f(x: f32[8, 8]) -> f32[8, 8] { return top(x); }
    taskflow f_bwd = grad(f, wrt: [x]);   // error: `max` is not differentiable

Write the backward of such an op by hand (a taskflow `F_bwd` with its own ops), or drop the
input from `wrt` if its gradient is not needed.";
    BadGrad = 522, "bad-grad", "a `grad` declaration names something it cannot differentiate",
"In `taskflow B = grad(F, wrt: [a, b], save: [c]);` `F` must be a taskflow, each `wrt`
name one of its inputs (once) on which an output depends, and each `save` name a tensor of
`F` (a `let` or an output; its inputs are always available to the backward).

    taskflow f_bwd = grad(f, wrt: [xd]);   // error: `xd` is a `let` of `f`, not an input

";
    WrongEngine = 601, "wrong-engine", "an op placed on an engine that cannot run it",
"The cube engine (`aic`) only runs contractions (`sum(k) a[..] * b[..]`); elementwise and
communication work runs on the vector engine (`aiv`). An `on` override at a call must name
an engine that can run the op.

    let a = swiglu(h) on aic;   // error: swiglu is elementwise; aic runs only matrix products";
    UnknownEngine = 602, "unknown-engine", "an engine name other than `aic` or `aiv`",
"Engines are `aic` (cube cores) and `aiv` (vector cores).";

    // ---- buffers and tiles: 07xx ----
    TileExceedsUb = 701, "tile-exceeds-ub", "an AIV tile does not fit in the Unified Buffer",
"A vector tile's inputs and output, double-buffered, must fit in one AIV core's Unified
Buffer (192 KiB on Ascend A3). The message gives the bytes needed and the capacity; use a
smaller tile.

    let a = swiglu(h) tile(m: 512, n: 2048);  // 2 x (512x4096 + 512x2048) x 2 B > 192 KiB";
    TileExceedsL0 = 702, "tile-exceeds-l0", "an AIC tile does not fit in the cube buffers",
"A cube tile of m x n with a k-step of k uses, double-buffered, 2 x m x k x b bytes of L0A,
2 x k x n x b of L0B and m x n x 4 (f32 accumulator) of L0C, and its operand panels in L1.
The message names the buffer that overflows.";
    BadTile = 703, "bad-tile", "a tile size that is zero, unknown or does not fit the dimension",
"Tile keys are the index variables of the op (`m`, `n`, `k`, ...). A size must be at least 1;
a tile larger than its dimension is clamped with a warning.";

    // ---- arithmetic: 08xx ----
    Overflow = 801, "overflow", "integer arithmetic overflows 64 bits",
"All shape and parameter arithmetic is checked: an overflow is an error, never a wrap.";
    DivisionByZero = 802, "division-by-zero", "division or remainder by zero",
"A divisor evaluated to zero.";
    NotDivisible = 803, "not-divisible", "an integer division that is not exact",
"`/` on integers must divide exactly (`experts / ranks` with 64 experts on 6 ranks is an
error). Use `ceil_div(a, b)` or `floor_div(a, b)` when rounding is intended.";
    TypeMismatch = 804, "type-mismatch", "a value of the wrong kind in an expression",
"For example a float where an integer dimension is needed, or a tensor in a parameter.";

    // ---- routing and communication: 09xx ----
    UnknownRouting = 901, "unknown-routing", "a routing kind that does not exist",
"Routings are `balanced`, `uniform`, `zipf`, `hotspot`, `file` and `router` (see `std::route`).";
    BadRouting = 902, "bad-routing", "routing parameters that cannot describe a routing",
"For example `topk` larger than `experts`, experts that do not divide evenly over the ranks,
a zipf exponent that is negative, or a hotspot factor below 1.";
    RecvOverflow = 903, "recv-overflow", "a receive window is smaller than what the routing sends",
"A routing's receive window holds `capacity` rows per rank. When the routing sends more rows
to some rank the put would write past the window. The message gives the rank, the rows it
receives and the capacity.";
    HotspotUnreachable = 904, "hotspot-unreachable", "a hotspot factor that no routing can reach",
"`hotspot(max_over_mean: f)` routes a fraction p of tokens to experts 0..topk-1; the hottest
rank then gets a load that grows with p, up to a maximum. A factor above that maximum (or
below 1) cannot be reached.";
    BadComm = 905, "bad-comm", "a malformed communication statement",
"A `comm` op consists of `put` statements: `put out @ RANK [INDEX, ...] = VALUE;` or with
`+=`. The destination rank and the row index come from routing functions.";

    BadRouter = 911, "bad-router", "router options that cannot choose experts",
"`router(...)` computes scores from logits and picks `topk` experts per token. Its groups
must divide the experts evenly (`n_group` divides `experts`), `topk_group` must lie in
1..=n_group, the kept groups must hold at least `topk` experts, `scale` must be positive and
`skew` at least 0. A `logits` file is float32 [ranks, tokens, experts] and a `bias` file
float32 [experts], both finite.";
    BadCapacity = 912, "bad-capacity", "capacity and drop options that cannot limit a routing",
"`drop: true` keeps at most ceil(capacity_factor * ranks * tokens * topk / experts) rows per
expert and drops the rest; it needs a `capacity_factor` above 0. `drop_order` and
`renormalize` only mean something with `drop: true`.";
    BadGate = 913, "bad-gate", "a router gate tensor that cannot give logits",
"`router(..., gate: tf.z)` takes its logits from the tensor `z` of taskflow `tf`: one row of
`experts` floating-point logits per token of the rank (f32, bf16 or f16, shape [tokens,
experts]; a receive window's ragged rows are not tokens). `z` must not be computed from a call that routes through the router it
gates (or a view of it): the routing would depend on itself.";

    // ---- imports and files: 10xx ----
    FileNotFound = 1001, "file-not-found", "an imported or referenced file cannot be read",
"The path is taken relative to the importing file. The message gives the path tried and the
operating system's reason.";
    ImportCycle = 1002, "import-cycle", "files import each other in a cycle",
"`a.hpm` imports `b.hpm` which imports `a.hpm`. Move the shared items to a third file.";

    // ---- devices, schedules, taskflows: 11xx ----
    UnknownProfileField = 1101, "unknown-profile-field", "a device field that the profile does not have",
"Device overrides (`device = ascend_a3 { hbm_bandwidth: 1.2 TB/s }` or
`--set device.NAME=VALUE`) must name a field of the profile; the help lists close names.";
    UnitMismatch = 1102, "unit-mismatch", "a value with a unit of the wrong dimension",
"Every device constant has a unit. An override must use a unit of the same dimension
(`hbm_bandwidth: 1.2 TB/s`, not `1.2 GHz`), or no unit (the profile's own unit).";
    UnknownPolicy = 1103, "unknown-policy", "a schedule policy that does not exist",
"Policies are `kernel_by_kernel`, `expert_level` and `interleaved` (see `std::schedule`).";
    NoTaskflow = 1104, "no-taskflow", "a schedule or command names a taskflow that does not exist",
"A `schedule NAME = ...` must name a taskflow of the program.";
    MissingReturn = 1105, "missing-return", "a taskflow does not end with `return`",
"A taskflow's last statement returns its outputs, matching its declared result type.";
    BadOverride = 1106, "bad-override", "a `--set` override that cannot be applied",
"`--set NAME=VALUE` must name a `param` of the program (or `device.FIELD`), and the value
must be a number.";
    UnimplementedPolicy = 1110, "unimplemented-policy", "a `policy` the scheduler has no implementation of",
"Policies are declared in `std::schedule` and implemented by the scheduler:
`kernel_by_kernel`, `expert_level` and `interleaved`. A program selects one with
`schedule = NAME { options };` (or `--policy NAME`); it cannot declare a new one, which would
otherwise have nothing to run it.";
    PolicyOption = 1111, "policy-option", "a policy option that has no effect, or a value out of its range",
"Each option of a policy means something to the scheduler under that policy only
(`priority` under `interleaved`, `aiv_fraction` under `expert_level`, ...), and its value has
a range: `aiv_fraction` is above 0 and at most 1, `aiv_workers` is at least 0. `std::schedule`
declares each policy's options with their defaults; the scheduler's table of what each option
means must agree with it.";
    OrderNoEffect = 1112, "order-no-effect", "an ordering hint that cannot change the order",
"`order(ratr)` puts a communication call's tiles in rank-aware order: on each rank, the tiles
to the rank itself first, then to the next rank, and so on, so that the ranks write to
different destinations at once. It changes nothing when every tile goes to one destination
(a device of one rank), or when the schedule turns the policy's `ratr` option off
(`schedule = interleaved { ratr: false };`). This is a warning: remove the hint or the
option.";
    // ---- limits: 12xx ----
    LimitExceeded = 1201, "limit-exceeded", "the program exceeds a size limit",
"Inputs are bounded so that no program makes the tool run out of memory or time: nesting
depth, the number of diagnostics, the dimensions of a tensor (6), the variables one reduction
binds (16), the number of tasks (`--max-tasks`), the memory a
taskflow's graph would need (estimated from its tasks, tilings, routings and the rows it puts
back to their source ranks before lowering, and its dependency edges while lowering: 3 GiB at
most), and the size of a routing with its
receive windows (1 GiB), checked from the sizes before anything is generated. The message
names the numbers, the limit and how to raise it where that is possible.";

    // ---- tile-level verification: 13xx ----
    MissingProducer = 1301, "missing-producer", "a task reads a region that no task writes",
"After lowering, every region a task reads must be written by the tasks of the call that
produces the tensor (or be a taskflow input). The message names the reading task (rank, call,
tile), the tensor and the rows nobody writes. It usually means a tile or a routing that does
not cover the producer's output.";
    Race = 1302, "race", "a task reads data whose writer is not ordered before it",
"Every task that writes part of a region another task reads must finish before the reader
starts: there must be a dependency path from the writer to the reader. The message names both
tasks and their op calls and the overlapping region.";
    WriteConflict = 1303, "write-conflict", "two tasks write the same data with no ordering",
"Two tasks write overlapping regions (and are not both accumulating with `+=`), and neither
is ordered before the other: the result depends on timing.";
    Cycle = 1304, "cycle", "the task dependencies form a cycle",
"A task depends, through a chain of dependencies, on itself: no order can run it. The message
lists the tasks of the cycle with their op calls.";
    Deadlock = 1305, "deadlock", "the schedule can deadlock",
"Core queues run in order, and a task starts when its counters reach their thresholds. If a
task waits for a signal from a task queued behind it (on the same or another core, through a
chain), the device hangs. The message shows which core waits on which counter and who should
have signalled it.";
    ThresholdMismatch = 1306, "threshold-mismatch", "a counter's threshold differs from the signals that arrive",
"A counter waits until its value reaches its threshold; each producer adds one when it
finishes. A threshold above the number of producers hangs; one below lets a consumer start too
early. Thresholds are derived by the scheduler; this error means a schedule was edited or
corrupted.";
    BadQueue = 1307, "bad-queue", "a task is missing from the core queues, queued twice, or on a wrong core",
"Every task must appear exactly once, on a core of its own rank and engine.";
}
