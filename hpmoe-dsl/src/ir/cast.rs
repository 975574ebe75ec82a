//! Value conversions between dtypes: what `cast<D>(x)` computes and what a store into a
//! tensor of dtype `D` keeps. Every conversion is exact round-to-nearest, ties to even, from
//! the f64 value (so an f32 value converts as it would from f32: the widening is exact).
//!
//! | dtype | values | overflow | NaN |
//! |---|---|---|---|
//! | `f32` | IEEE binary32 | to ±inf | NaN |
//! | `bf16` | 8 significant bits, exponent of f32 | to ±inf | NaN |
//! | `f16` | IEEE binary16 (max 65504) | to ±inf | NaN |
//! | `fp8e4m3` | OCP E4M3FN: 4 significant bits, bias 7, no inf, max 448, NaN `0x7f`/`0xff` | saturates to ±448 (also ±inf) | NaN |
//! | `fp8e5m2` | OCP E5M2: 3 significant bits, bias 15, IEEE-like, max 57344 | to ±inf (from 61440 up) | NaN |
//! | `i8`, `u8`, `i32` | integers | saturates to the range (±inf too) | 0 |
//!
//! The float conversions are those of `ml_dtypes` `astype` from float32, except that
//! `fp8e4m3` saturates where `ml_dtypes` gives NaN (it equals `ml_dtypes` after
//! `np.clip(x, -448, 448)`), as quantisation kernels convert. The integer conversions are
//! NumPy's `np.clip(np.rint(x), lo, hi)` (`rint` rounds half to even), not `astype`, which
//! truncates and wraps. `hpmoe-dsl/tests/data/gen_fp8.py` generates the reference tables
//! the tests compare with, bit for bit.

use super::DType;

/// A binary floating-point format without overflow handling: `mant` stored mantissa bits,
/// `emin` the exponent of the smallest normal number.
#[derive(Clone, Copy, Debug)]
struct Format {
    mant: i32,
    emin: i32,
}

/// Rounds `x` to the nearest value with `f.mant` mantissa bits and exponent at least
/// `f.emin` (subnormals below), ties to even. Finite in, finite out (no maximum).
fn round_to(x: f64, f: Format) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let a = x.abs();
    let biased = ((a.to_bits() >> 52) & 0x7ff) as i32;
    // f64 subnormals are far below every format's range: they round to zero below.
    let e = if biased == 0 { -1023 } else { biased - 1023 }.max(f.emin);
    // The quantum at this exponent; dividing by a power of two is exact.
    let q = 2f64.powi(e - f.mant);
    let r = (a / q).round_ties_even() * q;
    r.copysign(x)
}

const BF16: Format = Format { mant: 7, emin: -126 };
const F16: Format = Format { mant: 10, emin: -14 };
const E4M3: Format = Format { mant: 3, emin: -6 };
const E5M2: Format = Format { mant: 2, emin: -14 };

/// The largest finite `fp8e4m3` value.
pub const FP8E4M3_MAX: f64 = 448.0;
/// The largest finite `fp8e5m2` value.
pub const FP8E5M2_MAX: f64 = 57344.0;
const BF16_MAX: f64 = 3.389_531_389_251_535_5e38; // (2 - 2^-7) * 2^127
const F16_MAX: f64 = 65504.0;

fn overflow_to_inf(r: f64, max: f64) -> f64 {
    if r.abs() > max {
        f64::INFINITY.copysign(r)
    } else {
        r
    }
}

fn round_int(x: f64, lo: f64, hi: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        // `+ 0.0`: an integer has no negative zero (-0.4 rounds to -0.0).
        x.round_ties_even().clamp(lo, hi) + 0.0
    }
}

impl DType {
    /// Whether the dtype is an integer type.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32)
    }

    /// The largest finite value of the dtype (quantisation maps a row's largest magnitude to
    /// it).
    pub fn max_value(self) -> f64 {
        match self {
            DType::F32 => f32::MAX as f64,
            DType::Bf16 => BF16_MAX,
            DType::F16 => F16_MAX,
            DType::Fp8E4M3 => FP8E4M3_MAX,
            DType::Fp8E5M2 => FP8E5M2_MAX,
            DType::I8 => 127.0,
            DType::U8 => 255.0,
            DType::I32 => i32::MAX as f64,
        }
    }

    /// `x` converted to the dtype (see the module documentation), as an f64.
    pub fn cast(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::Bf16 => {
                if x.is_nan() {
                    x
                } else {
                    overflow_to_inf(round_to(x, BF16), BF16_MAX)
                }
            }
            DType::F16 => {
                if x.is_nan() {
                    x
                } else {
                    overflow_to_inf(round_to(x, F16), F16_MAX)
                }
            }
            DType::Fp8E4M3 => {
                if x.is_nan() {
                    x
                } else {
                    round_to(x.clamp(-FP8E4M3_MAX, FP8E4M3_MAX), E4M3)
                }
            }
            DType::Fp8E5M2 => {
                if x.is_nan() {
                    x
                } else {
                    overflow_to_inf(round_to(x, E5M2), FP8E5M2_MAX)
                }
            }
            DType::I8 => round_int(x, -128.0, 127.0),
            DType::U8 => round_int(x, 0.0, 255.0),
            DType::I32 => round_int(x, i32::MIN as f64, i32::MAX as f64),
        }
    }

    /// Whether a store into a tensor of this dtype must round (always, for the 1-byte types:
    /// their tensors hold only their values; the wider types are rounded only on request,
    /// see the numerics' bf16 storage).
    pub fn rounds_on_store(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::Fp8E4M3 | DType::Fp8E5M2)
    }
}

/// The bit layout of an 8-bit float: (exponent bits, mantissa bits, bias).
fn fp8_layout(d: DType) -> Option<(u32, u32, i32)> {
    match d {
        DType::Fp8E4M3 => Some((4, 3, 7)),
        DType::Fp8E5M2 => Some((5, 2, 15)),
        _ => None,
    }
}

/// The value of an 8-bit float bit pattern (`None` for a dtype that is not an 8-bit float).
pub fn fp8_decode(d: DType, bits: u8) -> Option<f64> {
    let (eb, mb, bias) = fp8_layout(d)?;
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((bits as u32) >> mb) & ((1 << eb) - 1);
    let m = (bits as u32) & ((1 << mb) - 1);
    let emax = (1 << eb) - 1;
    let v = match d {
        DType::Fp8E4M3 if e == emax && m == (1 << mb) - 1 => f64::NAN,
        DType::Fp8E5M2 if e == emax && m == 0 => f64::INFINITY,
        DType::Fp8E5M2 if e == emax => f64::NAN,
        _ if e == 0 => m as f64 * 2f64.powi(1 - bias - mb as i32),
        _ => (1.0 + m as f64 / (1 << mb) as f64) * 2f64.powi(e as i32 - bias),
    };
    Some(if v.is_nan() { f64::NAN.copysign(sign) } else { sign * v })
}

/// The bit pattern of `x` converted to an 8-bit float ([`DType::cast`]); a NaN keeps its
/// sign and becomes `0x7f` (`fp8e4m3`) or `0x7e` (`fp8e5m2`), as `ml_dtypes` writes it.
pub fn fp8_encode(d: DType, x: f64) -> Option<u8> {
    let (eb, mb, bias) = fp8_layout(d)?;
    let v = d.cast(x);
    let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
    if v.is_nan() {
        return Some(sign | if d == DType::Fp8E4M3 { 0x7f } else { 0x7e });
    }
    if v.is_infinite() {
        return Some(sign | (((1u8 << eb) - 1) << mb));
    }
    let a = v.abs();
    if a == 0.0 {
        return Some(sign);
    }
    let emin = 1 - bias;
    let biased = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let bits = if biased < emin {
        // Subnormal: a multiple of 2^(emin - mb).
        (a / 2f64.powi(emin - mb as i32)) as u32
    } else {
        let m = ((a / 2f64.powi(biased) - 1.0) * (1 << mb) as f64) as u32;
        (((biased + bias) as u32) << mb) | m
    };
    Some(sign | bits as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked_values() {
        // 1 + 2^-4 is halfway between 1 and 1.125 in E4M3: ties to even (1).
        assert_eq!(DType::Fp8E4M3.cast(1.0625), 1.0);
        assert_eq!(DType::Fp8E4M3.cast(1.1875), 1.25);
        // The smallest E4M3 subnormal is 2^-9; half of it ties to 0, a bit more rounds up.
        assert_eq!(DType::Fp8E4M3.cast(2f64.powi(-10)), 0.0);
        assert_eq!(DType::Fp8E4M3.cast(2f64.powi(-10) * 1.01), 2f64.powi(-9));
        assert_eq!(DType::Fp8E4M3.cast(1e6), 448.0);
        assert_eq!(DType::Fp8E4M3.cast(f64::NEG_INFINITY), -448.0);
        assert_eq!(DType::Fp8E5M2.cast(61439.0), 57344.0);
        assert_eq!(DType::Fp8E5M2.cast(61440.0), f64::INFINITY);
        assert_eq!(DType::I8.cast(2.5), 2.0);
        assert_eq!(DType::I8.cast(-3.5), -4.0);
        assert_eq!(DType::I8.cast(-1000.0), -128.0);
        assert_eq!(DType::U8.cast(-0.4), 0.0);
        assert!(DType::I8.cast(-0.4).is_sign_positive());
        assert_eq!(DType::I8.cast(f64::NAN), 0.0);
        assert_eq!(fp8_encode(DType::Fp8E4M3, 448.0), Some(0x7e));
        assert_eq!(fp8_encode(DType::Fp8E5M2, f64::INFINITY), Some(0x7c));
        assert_eq!(fp8_decode(DType::Fp8E4M3, 0x01), Some(2f64.powi(-9)));
        assert_eq!(fp8_decode(DType::Fp8E5M2, 0x7b), Some(57344.0));
        assert_eq!(DType::Bf16.cast(1.0 + 1.0 / 256.0), 1.0);
    }
}
