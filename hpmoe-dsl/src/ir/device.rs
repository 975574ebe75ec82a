//! The device: one table declares every device constant (its name, quantity, Rust type,
//! bounds and meaning), and everything else about device fields comes from it.
//!
//! In: the checker ([`crate::check`]) resolves a profile as written (inheritance, overrides,
//! values with units and spans) into one number per field in base units and calls
//! [`Device::new`], which validates every value against the table. Out: a [`Device`] with
//! typed fields in base units (`u32` counts; `f64` seconds, bytes, hertz, bytes per second,
//! ...), read through accessors named after the fields (`device.aic_cores()`), plus the unit
//! each value was written in, for dumps and the REPL. A `Device` exists only once every
//! field passed its bounds, so its readers never meet a missing, zero, negative or non-finite
//! value.
//!
//! The same table lists the fields for the checker's messages and suggestions, for
//! `--set device.FIELD=VALUE` overrides, for completion and for dumps
//! ([`DEVICE_FIELDS`]).

/// The dimension of a physical quantity, for device constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    Count,
    Ratio,
    Bytes,
    Frequency,
    Time,
    Bandwidth,
    BytesPerCycle,
    FlopsPerCycle,
    Cycles,
}

impl Quantity {
    /// The quantity in words, for messages.
    pub fn word(self) -> &'static str {
        match self {
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
}

/// A unit a device constant may be written in.
#[derive(Debug, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    pub quantity: Quantity,
    /// The factor to the base unit (B, Hz, s, B/s, ...).
    pub factor: f64,
}

const fn u(name: &'static str, quantity: Quantity, factor: f64) -> Unit {
    Unit { name, quantity, factor }
}

/// Every unit.
pub static UNITS: &[Unit] = &[
    u("count", Quantity::Count, 1.0),
    u("ratio", Quantity::Ratio, 1.0),
    u("B", Quantity::Bytes, 1.0),
    u("KB", Quantity::Bytes, 1e3),
    u("MB", Quantity::Bytes, 1e6),
    u("GB", Quantity::Bytes, 1e9),
    u("TB", Quantity::Bytes, 1e12),
    u("KiB", Quantity::Bytes, 1024.0),
    u("MiB", Quantity::Bytes, 1048576.0),
    u("GiB", Quantity::Bytes, 1073741824.0),
    u("Hz", Quantity::Frequency, 1.0),
    u("kHz", Quantity::Frequency, 1e3),
    u("MHz", Quantity::Frequency, 1e6),
    u("GHz", Quantity::Frequency, 1e9),
    u("s", Quantity::Time, 1.0),
    u("ms", Quantity::Time, 1e-3),
    u("us", Quantity::Time, 1e-6),
    u("ns", Quantity::Time, 1e-9),
    u("B/s", Quantity::Bandwidth, 1.0),
    u("KB/s", Quantity::Bandwidth, 1e3),
    u("MB/s", Quantity::Bandwidth, 1e6),
    u("GB/s", Quantity::Bandwidth, 1e9),
    u("TB/s", Quantity::Bandwidth, 1e12),
    u("GiB/s", Quantity::Bandwidth, 1073741824.0),
    u("Gb/s", Quantity::Bandwidth, 1.25e8),
    u("B/cycle", Quantity::BytesPerCycle, 1.0),
    u("FLOP/cycle", Quantity::FlopsPerCycle, 1.0),
    u("cycle", Quantity::Cycles, 1.0),
];

impl Unit {
    /// The unit of this name.
    pub fn named(name: &str) -> Option<&'static Unit> {
        UNITS.iter().find(|u| u.name == name)
    }
    /// The names of the units of a quantity, comma-separated (for messages).
    pub fn names_of(q: Quantity) -> String {
        UNITS
            .iter()
            .filter(|u| u.quantity == q)
            .map(|u| u.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The largest number of ranks a device may have.
pub const MAX_RANKS: u32 = 4096;
/// The largest number of cores of one kind per rank.
pub const MAX_CORES: u32 = 1024;

/// The largest size a device field may give: 1 PiB.
const MAX_BYTES: f64 = (1u64 << 50) as f64;
/// The smallest ratio a device field may give.
const MIN_RATIO: f64 = 1e-3;
/// The largest per-cycle rate a device field may give.
const MAX_PER_CYCLE: f64 = (1u64 << 30) as f64;

/// The declaration of one device field.
#[derive(Debug, PartialEq)]
pub struct DeviceFieldSpec {
    pub name: &'static str,
    pub quantity: Quantity,
    /// For counts: the largest value accepted.
    pub max: Option<u32>,
    /// What the field means (the doc comment of its declaration).
    pub doc: &'static str,
}

impl DeviceFieldSpec {
    /// The field of this name.
    pub fn named(name: &str) -> Option<&'static DeviceFieldSpec> {
        DEVICE_FIELDS.iter().find(|f| f.name == name)
    }

    /// Why a value in base units is out of this field's range, or `None` when it is valid:
    /// every value must be finite and positive, a ratio at most 1, a count a whole number
    /// no larger than its maximum.
    pub fn out_of_range(&self, value: f64) -> Option<String> {
        if !value.is_finite() {
            return Some("the value must be a finite number".to_string());
        }
        match self.quantity {
            // A ratio scales a rate: below a thousandth it describes no device, and a tiny one
            // (1e-300) leaves the simulator's clock range like a tiny rate.
            Quantity::Ratio if !(MIN_RATIO..=1.0).contains(&value) => {
                Some(format!("a ratio must be between {MIN_RATIO} and 1"))
            }
            Quantity::Count => {
                let max = self.max.unwrap_or(u32::MAX);
                if value < 1.0 || value.fract() != 0.0 || value > f64::from(max) {
                    Some(match self.max {
                        Some(m) => format!("a count must be a whole number of at least 1 and at most {m}"),
                        None => "a count must be a whole number of at least 1".to_string(),
                    })
                } else {
                    None
                }
            }
            _ if value <= 0.0 => Some("rates, sizes and times must be positive".to_string()),
            // Past these bounds a value describes no device, and the times it gives (a latency
            // of 1e300 s, a rate of 1e-300 B/s) leave the simulator's clock range.
            Quantity::Bytes if !(1.0..=MAX_BYTES).contains(&value) => {
                Some("a size must be at least 1 B and at most 1 PiB".to_string())
            }
            Quantity::Frequency if !(1e3..=1e12).contains(&value) => {
                Some("a frequency must be between 1 kHz and 1000 GHz".to_string())
            }
            Quantity::Time if value > 1.0 => Some("a time must be at most 1 s".to_string()),
            Quantity::Bandwidth if !(1e3..=1e18).contains(&value) => {
                Some("a bandwidth must be between 1 KB/s and 1000000 TB/s".to_string())
            }
            Quantity::BytesPerCycle | Quantity::FlopsPerCycle | Quantity::Cycles
                if !(1e-3..=MAX_PER_CYCLE).contains(&value) =>
            {
                Some(format!(
                    "{} must be between 0.001 and {MAX_PER_CYCLE}",
                    self.quantity.word()
                ))
            }
            _ => None,
        }
    }
}

/// A field's Rust type: how a validated value in base units becomes it and back.
trait FieldType: Copy {
    /// `value` has passed [`DeviceFieldSpec::out_of_range`].
    fn from_base(value: f64) -> Self;
    fn to_base(self) -> f64;
}

impl FieldType for u32 {
    fn from_base(value: f64) -> u32 {
        // A whole number in [1, max]: exact.
        value as u32
    }
    fn to_base(self) -> f64 {
        f64::from(self)
    }
}

impl FieldType for f64 {
    fn from_base(value: f64) -> f64 {
        value
    }
    fn to_base(self) -> f64 {
        self
    }
}

/// A field out of range: which one, its value in base units, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub field: &'static DeviceFieldSpec,
    pub value: f64,
    pub reason: String,
}

/// One field of a device, for display: its declaration, value in base units and the unit it
/// was written in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FieldValue {
    pub spec: &'static DeviceFieldSpec,
    pub value: f64,
    pub unit: &'static Unit,
}

/// A package's dies are in one node (ranks are numbered package by package, node by node):
/// `dies_per_node` must be a multiple of `dies_per_package`, or a pair of ranks would share a
/// package across two nodes. The error is the node field's. `values`: one per field in base
/// units, in [`DEVICE_FIELDS`] order.
fn nesting_error(values: &[f64]) -> Option<FieldError> {
    let value = |name: &str| Some(values[DEVICE_FIELDS.iter().position(|f| f.name == name)?]);
    let (dies_per_package, dies_per_node) = (value("dies_per_package")?, value("dies_per_node")?);
    if dies_per_node % dies_per_package == 0.0 {
        return None;
    }
    Some(FieldError {
        field: DeviceFieldSpec::named("dies_per_node")?,
        value: dies_per_node,
        reason: format!(
            "`dies_per_node` must be a multiple of `dies_per_package` ({dies_per_package}): a package's dies are in one node"
        ),
    })
}

/// `Some` of the argument, or `None` without one.
macro_rules! optional {
    () => {
        None
    };
    ($e:expr) => {
        Some($e)
    };
}

macro_rules! device_fields {
    ($( $(#[doc = $doc:literal])+ $name:ident : $ty:ident = $q:ident $(($max:expr))?; )+) => {
        /// Every device field, in declaration order.
        pub static DEVICE_FIELDS: &[DeviceFieldSpec] = &[
            $( DeviceFieldSpec {
                name: stringify!($name),
                quantity: Quantity::$q,
                max: optional!($($max)?),
                doc: concat!($($doc),+),
            } ),+
        ];

        /// The number of device fields.
        pub const DEVICE_FIELD_COUNT: usize = [$(stringify!($name)),+].len();

        /// A checked device: every field of [`DEVICE_FIELDS`] in base units, within its
        /// bounds.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Device {
            /// The name of the profile the device comes from.
            pub profile: String,
            $( $name: $ty, )+
            /// The unit each field was written in, in [`DEVICE_FIELDS`] order.
            units: [&'static Unit; DEVICE_FIELD_COUNT],
        }

        impl Device {
            $(
                $(#[doc = $doc])+
                pub fn $name(&self) -> $ty {
                    self.$name
                }
            )+

            /// A device from one value per field in base units (in [`DEVICE_FIELDS`]
            /// order) and the unit each was written in. Fails with every field that is out
            /// of range, or whose unit is not of its quantity.
            pub fn new(
                profile: String,
                values: [f64; DEVICE_FIELD_COUNT],
                units: [&'static Unit; DEVICE_FIELD_COUNT],
            ) -> Result<Device, Vec<FieldError>> {
                let errors: Vec<FieldError> = DEVICE_FIELDS
                    .iter()
                    .zip(values.iter().zip(units.iter()))
                    .filter_map(|(spec, (&value, unit))| {
                        let reason = if unit.quantity != spec.quantity {
                            Some(format!("`{}` is not a unit of {}", unit.name, spec.quantity.word()))
                        } else {
                            spec.out_of_range(value)
                        }?;
                        Some(FieldError { field: spec, value, reason })
                    })
                    .collect();
                if !errors.is_empty() {
                    return Err(errors);
                }
                if let Some(e) = nesting_error(&values) {
                    return Err(vec![e]);
                }
                let [$($name),+] = values;
                Ok(Device {
                    profile,
                    $( $name: <$ty as FieldType>::from_base($name), )+
                    units,
                })
            }

            /// Every field's value in base units, in [`DEVICE_FIELDS`] order.
            pub fn values(&self) -> [f64; DEVICE_FIELD_COUNT] {
                [$( FieldType::to_base(self.$name) ),+]
            }
        }
    };
}

device_fields! {
    /// Dies in the expert-parallel group (one rank per die).
    ranks: u32 = Count(MAX_RANKS);
    /// Cube (AIC) cores per die.
    aic_cores: u32 = Count(MAX_CORES);
    /// Vector (AIV) cores per die.
    aiv_cores: u32 = Count(MAX_CORES);
    /// Cube clock (Hz).
    aic_clock: f64 = Frequency;
    /// Vector clock (Hz).
    aiv_clock: f64 = Frequency;
    /// Peak FLOP per cycle of one cube core (fp16/bf16 operands).
    cube_flops_per_cycle: f64 = FlopsPerCycle;
    /// Peak operations (2 per MAC) per cycle of one cube core on int8 operands.
    cube_int8_flops_per_cycle: f64 = FlopsPerCycle;
    /// Fraction of the cube peak a well-tiled pipeline sustains.
    cube_efficiency: f64 = Ratio;
    /// Bytes the vector unit of one AIV core processes per cycle.
    vector_bytes_per_cycle: f64 = BytesPerCycle;
    /// Unified Buffer per AIV core (B).
    ub_size: f64 = Bytes;
    /// L1 buffer per AIC core (B).
    l1_size: f64 = Bytes;
    /// L0A (left operand) buffer per AIC core (B).
    l0a_size: f64 = Bytes;
    /// L0B (right operand) buffer per AIC core (B).
    l0b_size: f64 = Bytes;
    /// L0C (accumulator) buffer per AIC core (B).
    l0c_size: f64 = Bytes;
    /// Shared L2 per die (B).
    l2_size: f64 = Bytes;
    /// HBM capacity per die (B): every tensor of a taskflow must fit in it on each rank.
    hbm_size: f64 = Bytes;
    /// HBM bandwidth per die, shared by its cores (B/s).
    hbm_bandwidth: f64 = Bandwidth;
    /// Per-core HBM transfer rate (B per cycle of the core's clock).
    core_hbm_rate: f64 = BytesPerCycle;
    /// Per-core L2 read rate (B per cycle of the core's clock).
    core_l2_read_rate: f64 = BytesPerCycle;
    /// Per-core L2 write rate (B per cycle of the core's clock).
    core_l2_write_rate: f64 = BytesPerCycle;
    /// Bandwidth of a die's port to the other dies of its node and beyond, per direction
    /// (B/s): every put leaving the die's package goes through it.
    link_bandwidth: f64 = Bandwidth;
    /// Derating applied to every link rate (1: the rates as given).
    link_efficiency: f64 = Ratio;
    /// One-way latency of a put or signal between two dies of one node, outside one package (s).
    link_latency: f64 = Time;
    /// Dies per package (joined die to die); ranks `k * dies_per_package ..` share a package.
    dies_per_package: u32 = Count(MAX_RANKS);
    /// Dies per node (server); ranks `k * dies_per_node ..` share a node.
    dies_per_node: u32 = Count(MAX_RANKS);
    /// Bandwidth between the two dies of a package, per pair and direction (B/s).
    package_link_bandwidth: f64 = Bandwidth;
    /// One-way latency between the dies of a package (s).
    package_link_latency: f64 = Time;
    /// Bandwidth one pair of dies of one node reaches, per direction (B/s).
    pair_bandwidth: f64 = Bandwidth;
    /// Bandwidth one pair of dies in different nodes reaches, per direction (B/s).
    cross_pair_bandwidth: f64 = Bandwidth;
    /// Bandwidth of a die's port to other nodes, per direction (B/s), beside `link_bandwidth`.
    cross_port_bandwidth: f64 = Bandwidth;
    /// Switch hops a path between nodes adds to a path inside a node.
    cross_hops: u32 = Count(64);
    /// Latency of one of those hops (s).
    cross_hop_latency: f64 = Time;
    /// Bandwidth of a node's uplinks over the sum of its dies' `cross_port_bandwidth`
    /// (1: non-blocking).
    cross_uplink_ratio: f64 = Ratio;
    /// Fixed cost of one put (descriptor and doorbell) before its bytes move (s).
    put_overhead: f64 = Time;
    /// Extra cost of the first put from a rank to a peer within one op call (s).
    peer_setup: f64 = Time;
    /// Puts one core has in flight at once, and messages its put queue keeps outstanding
    /// (a message is outstanding from its descriptor until it lands).
    core_puts_in_flight: u32 = Count(MAX_CORES);
    /// Puts one die has in flight at once (its DMA queues).
    die_puts_in_flight: u32 = Count(MAX_CORES);
    /// Latency of a counter event between cores of one die (s).
    event_latency: f64 = Time;
    /// Fixed start-up of a kernel launch (s).
    kernel_launch: f64 = Time;
    /// Fixed cost of starting one task on a core (s).
    task_overhead: f64 = Time;
    /// Bytes staged per put chunk through the UB (B): the largest message of a put (a put's
    /// messages are the rows of its target, a longer row in chunks of this size).
    put_chunk_bytes: f64 = Bytes;
}

impl Device {
    /// Every field with its value and the unit it was written in, in [`DEVICE_FIELDS`] order.
    pub fn fields(&self) -> impl Iterator<Item = FieldValue> + '_ {
        DEVICE_FIELDS
            .iter()
            .zip(self.values())
            .zip(self.units.iter())
            .map(|((spec, value), &unit)| FieldValue { spec, value, unit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a3_like() -> ([f64; DEVICE_FIELD_COUNT], [&'static Unit; DEVICE_FIELD_COUNT]) {
        let mut values = [0.0; DEVICE_FIELD_COUNT];
        let mut units = [&UNITS[0]; DEVICE_FIELD_COUNT];
        for (i, f) in DEVICE_FIELDS.iter().enumerate() {
            values[i] = match f.quantity {
                Quantity::Ratio => 0.5,
                Quantity::Frequency => 1e9,
                Quantity::Time => 1e-6,
                Quantity::Bandwidth => 1e11,
                _ => 8.0,
            };
            units[i] = UNITS
                .iter()
                .find(|u| u.quantity == f.quantity)
                .expect("a unit per quantity");
        }
        (values, units)
    }

    #[test]
    fn names_are_unique_and_every_quantity_has_a_unit() {
        for (i, f) in DEVICE_FIELDS.iter().enumerate() {
            assert!(DEVICE_FIELDS[..i].iter().all(|g| g.name != f.name), "{} twice", f.name);
            assert!(UNITS.iter().any(|u| u.quantity == f.quantity), "{} has no unit", f.name);
            assert!(!f.doc.trim().is_empty(), "{} has no doc", f.name);
        }
        assert_eq!(DEVICE_FIELD_COUNT, DEVICE_FIELDS.len());
    }

    #[test]
    fn a_valid_device_keeps_its_values_and_units() {
        let (values, units) = a3_like();
        let d = Device::new("t".into(), values, units).expect("valid");
        assert_eq!(d.values(), values);
        assert_eq!(d.aic_cores(), 8);
        assert_eq!(d.cube_efficiency(), 0.5);
        let shown: Vec<FieldValue> = d.fields().collect();
        assert_eq!(shown.len(), DEVICE_FIELD_COUNT);
        assert!(shown.iter().all(|f| f.unit.quantity == f.spec.quantity));
    }

    #[test]
    fn every_out_of_range_value_is_rejected_with_its_field() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0] {
            for i in 0..DEVICE_FIELD_COUNT {
                let (mut values, units) = a3_like();
                values[i] = bad;
                let errs = Device::new("t".into(), values, units).expect_err("out of range");
                assert_eq!(errs.len(), 1);
                assert_eq!(errs[0].field.name, DEVICE_FIELDS[i].name);
            }
        }
        let at = |name: &str| DEVICE_FIELDS.iter().position(|f| f.name == name).expect("a field");
        for (name, bad) in [
            ("ranks", 4097.0),
            ("ranks", 2.5),
            ("aic_cores", 1025.0),
            ("link_efficiency", 1.5),
            ("link_efficiency", 1e-300),
            ("cube_efficiency", 5e-324),
            ("cross_uplink_ratio", 1e-4),
            // Finite and positive, but no device: each kind of field is bounded.
            ("l2_size", 1e30),
            ("ub_size", 0.5),
            ("aic_clock", 1e-300),
            ("kernel_launch", 1e300),
            ("link_bandwidth", 1e-300),
            ("core_hbm_rate", 1e-300),
            ("cube_flops_per_cycle", 1e300),
        ] {
            let (mut values, units) = a3_like();
            values[at(name)] = bad;
            assert!(Device::new("t".into(), values, units).is_err(), "{name} = {bad}");
        }
    }

    #[test]
    fn a_unit_of_another_quantity_is_rejected() {
        let (values, mut units) = a3_like();
        units[0] = Unit::named("GHz").expect("a unit");
        let errs = Device::new("t".into(), values, units).expect_err("wrong unit");
        assert_eq!(errs[0].field.name, "ranks");
    }
}
