//! The dtype conversions against reference tables generated offline with NumPy and ml_dtypes
//! (`tests/data/gen_fp8.py`; the tables are committed, so this test needs no Python):
//! every fp8 bit pattern decodes to the reference value, and tricky inputs (every
//! representable value, every halfway point and one f32 ulp either side, subnormals,
//! saturation and overflow edges, NaN, signed zeros, random values) convert to the
//! reference bit patterns and integers.

use hpmoe_dsl::ir::cast::{fp8_decode, fp8_encode};
use hpmoe_dsl::ir::DType;

fn table(name: &str) -> Vec<Vec<String>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn hex32(s: &str) -> f32 {
    f32::from_bits(u32::from_str_radix(s, 16).unwrap())
}

fn same(got: f64, want: f32) -> bool {
    if want.is_nan() {
        got.is_nan() && got.is_sign_negative() == want.is_sign_negative()
    } else {
        (got as f32).to_bits() == want.to_bits() && got == want as f64
    }
}

#[test]
fn every_fp8_bit_pattern_decodes_as_ml_dtypes() {
    let rows = table("fp8_decode.txt");
    assert_eq!(rows.len(), 256);
    let mut nans = [0, 0];
    for r in &rows {
        let bits = u8::from_str_radix(&r[0], 16).unwrap();
        for (k, d) in [DType::Fp8E4M3, DType::Fp8E5M2].into_iter().enumerate() {
            let want = hex32(&r[1 + k]);
            let got = fp8_decode(d, bits).unwrap();
            assert!(same(got, want), "{} {bits:#04x}: got {got}, want {want}", d.name());
            nans[k] += want.is_nan() as usize;
            // Every non-NaN pattern encodes back to itself.
            if !want.is_nan() {
                assert_eq!(fp8_encode(d, got), Some(bits), "{} {bits:#04x} round trip", d.name());
            }
        }
    }
    // E4M3FN has two NaNs (0x7f, 0xff); E5M2 six (exponent 11111, mantissa not 0).
    assert_eq!(nans, [2, 6]);
}

#[test]
fn conversions_round_and_saturate_as_the_reference() {
    let rows = table("fp8_encode.txt");
    assert!(rows.len() > 2000, "{} rows", rows.len());
    for r in &rows {
        let x = hex32(&r[0]) as f64;
        let e4 = u8::from_str_radix(&r[1], 16).unwrap();
        let e5 = u8::from_str_radix(&r[2], 16).unwrap();
        let i: f64 = r[3].parse().unwrap();
        let u: f64 = r[4].parse().unwrap();
        assert_eq!(fp8_encode(DType::Fp8E4M3, x), Some(e4), "fp8e4m3 of {x:e} ({})", r[0]);
        assert_eq!(fp8_encode(DType::Fp8E5M2, x), Some(e5), "fp8e5m2 of {x:e} ({})", r[0]);
        // The value cast computes is the value of the bit pattern.
        for (d, b) in [(DType::Fp8E4M3, e4), (DType::Fp8E5M2, e5)] {
            let want = fp8_decode(d, b).unwrap();
            let got = d.cast(x);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{} of {x:e}: {got} vs {want}",
                d.name()
            );
        }
        assert_eq!(DType::I8.cast(x), i, "i8 of {x:e}");
        assert_eq!(DType::U8.cast(x), u, "u8 of {x:e}");
    }
}

#[test]
fn the_table_covers_the_tricky_cases() {
    let xs: Vec<f32> = table("fp8_encode.txt").iter().map(|r| hex32(&r[0])).collect();
    let has = |v: f32| xs.iter().any(|x| x.to_bits() == v.to_bits());
    // A halfway case that ties to even in E4M3 (1 + 2^-4 -> 1), the smallest subnormals,
    // saturation (464 ties to 448; 480 saturates), E5M2 overflow at 61440, NaN and -0.
    for v in [
        1.0625,
        2f32.powi(-9),
        2f32.powi(-10),
        2f32.powi(-16),
        464.0,
        480.0,
        61440.0,
        -0.0,
    ] {
        assert!(has(v), "{v:e} missing");
    }
    assert!(xs.iter().any(|x| x.is_nan()) && xs.iter().any(|x| x.is_infinite()));
}
