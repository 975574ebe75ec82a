//! Reading and writing NumPy `.npy` files (format versions 1.0 to 3.0, little-endian,
//! C order) for routings, inputs and dumps.

/// Element types we read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyType {
    I8,
    U8,
    I32,
    I64,
    /// IEEE half precision (`<f2`, NumPy's `float16`).
    F16,
    F32,
    F64,
    /// bfloat16, as `ml_dtypes` saves it: NumPy has no name for it, so the header says `|V2`
    /// (two bytes of "void"); a two-byte void array is read as bfloat16.
    Bf16,
}

impl NpyType {
    /// NumPy's name of the type (`float32`; `bfloat16` as `ml_dtypes` names it).
    pub fn name(self) -> &'static str {
        match self {
            NpyType::I8 => "int8",
            NpyType::U8 => "uint8",
            NpyType::I32 => "int32",
            NpyType::I64 => "int64",
            NpyType::F16 => "float16",
            NpyType::F32 => "float32",
            NpyType::F64 => "float64",
            NpyType::Bf16 => "bfloat16",
        }
    }

    fn descr(self) -> &'static str {
        match self {
            NpyType::I8 => "|i1",
            NpyType::U8 => "|u1",
            NpyType::F16 => "<f2",
            NpyType::I32 => "<i4",
            NpyType::I64 => "<i8",
            NpyType::F32 => "<f4",
            NpyType::F64 => "<f8",
            NpyType::Bf16 => "|V2",
        }
    }
    fn size(self) -> usize {
        match self {
            NpyType::I8 | NpyType::U8 => 1,
            NpyType::F16 | NpyType::Bf16 => 2,
            NpyType::I32 | NpyType::F32 => 4,
            NpyType::I64 | NpyType::F64 => 8,
        }
    }
}

/// An array read from a file: its shape and its values widened to f64 (exact for every type
/// but i64 beyond 2^53).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub dtype: NpyType,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// Largest array accepted (elements), so a corrupt header cannot exhaust memory: its values
/// are held as f64, so this is 2 GiB of them.
pub const MAX_ELEMENTS: usize = 1 << 28;

/// Most dimensions accepted (NumPy's own limit is 64).
pub const MAX_DIMS: usize = 32;

/// Longest header accepted (bytes): NumPy writes a few hundred at most; a header announcing
/// more is corrupt, and is refused before it is read.
pub const MAX_HEADER: usize = 1 << 20;

/// What a `.npy` header says: the element type, the shape, and where the data starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub dtype: NpyType,
    pub shape: Vec<usize>,
    /// The byte offset of the first element.
    pub data_start: usize,
    /// The number of elements (the product of the shape, at most [`MAX_ELEMENTS`]).
    pub count: usize,
}

impl Header {
    /// The bytes of the data.
    pub fn data_bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// The length of the header that `prefix` (the first 12 bytes of a file, or fewer) announces,
/// and the offset where it starts.
fn header_len(prefix: &[u8]) -> Result<(usize, usize), String> {
    if prefix.len() < 10 || &prefix[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (missing the \\x93NUMPY magic)".into());
    }
    // NumPy writes and reads versions 1.0, 2.0 and 3.0 only.
    let (hlen, start) = match (prefix[6], prefix[7]) {
        (1, 0) => (usize::from(u16::from_le_bytes([prefix[8], prefix[9]])), 10),
        (2 | 3, 0) => {
            let b = prefix.get(8..12).ok_or("truncated header")?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        (major, minor) => {
            return Err(format!(
                "unsupported .npy format version {major}.{minor} (expected 1.0, 2.0 or 3.0)"
            ))
        }
    };
    if hlen > MAX_HEADER {
        return Err(format!(
            "the header announces {hlen} bytes, more than the {MAX_HEADER} accepted"
        ));
    }
    Ok((hlen, start))
}

/// Parses the header at the start of `bytes` (which must hold all of it).
pub fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let (hlen, start) = header_len(bytes)?;
    let header = bytes.get(start..start + hlen).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not text")?;
    let [descr, fortran, shape_text] = dict_values(header)?;
    // A quoted string, as NumPy writes it (a list of fields is a structured array).
    let descr = descr.trim();
    let descr = ['\'', '"']
        .into_iter()
        .find_map(|q| descr.strip_prefix(q).and_then(|d| d.strip_suffix(q)))
        .filter(|d| !d.contains(['\'', '"']))
        .ok_or_else(|| format!("malformed 'descr' {descr} (expected a quoted type such as '<f4')"))?;
    let dtype = match descr {
        "|i1" | "<i1" => NpyType::I8,
        "|u1" | "<u1" => NpyType::U8,
        "<i4" | "|i4" => NpyType::I32,
        "<i8" => NpyType::I64,
        "<f2" => NpyType::F16,
        "<f4" => NpyType::F32,
        "<f8" => NpyType::F64,
        "|V2" | "<V2" => NpyType::Bf16,
        other => {
            let help = if other.contains('V') {
                " (an fp8 array from ml_dtypes has no NumPy type name, and one byte does not say \
                 which fp8 it is: save it as float32, which is rounded to the tensor's dtype on load)"
            } else {
                ""
            };
            return Err(format!(
                "unsupported dtype '{other}' (expected |i1, |u1, <i4, <i8, <f2, <f4, <f8 or |V2 for bfloat16){help}"
            ));
        }
    };
    match fortran.trim() {
        "False" => {}
        "True" => return Err("Fortran-order arrays are not supported".into()),
        other => return Err(format!("malformed 'fortran_order' {other} (expected False)")),
    }
    let inner = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or("malformed 'shape'")?;
    // A Python tuple: `()`, `(n,)` or `(a, b)`, one trailing comma allowed after an element.
    let inner = inner.trim();
    let inner = inner
        .strip_suffix(',')
        .filter(|i| !i.trim().is_empty())
        .unwrap_or(inner);
    let mut shape = Vec::new();
    for part in inner.split(',') {
        let p = part.trim();
        if p.is_empty() && inner.is_empty() {
            break;
        }
        if p.is_empty() {
            return Err(format!("malformed 'shape' {} (an empty dimension)", shape_text.trim()));
        }
        if shape.len() == MAX_DIMS {
            return Err(format!("the array has more than {MAX_DIMS} dimensions"));
        }
        shape.push(
            p.parse::<usize>()
                .map_err(|_| format!("malformed dimension '{p}' in 'shape'"))?,
        );
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("the array of shape {shape:?} is too large (at most {MAX_ELEMENTS} elements)"))?;
    Ok(Header {
        dtype,
        shape,
        data_start: start + hlen,
        count,
    })
}

/// Decodes `raw` (whole elements of `dtype`) onto the end of `out`.
fn decode(dtype: NpyType, raw: &[u8], out: &mut Vec<f64>) {
    out.extend(raw.chunks_exact(dtype.size()).map(|c| match dtype {
        NpyType::I8 => f64::from(c[0] as i8),
        NpyType::U8 => f64::from(c[0]),
        NpyType::F16 => f16_decode(u16::from_le_bytes([c[0], c[1]])),
        NpyType::Bf16 => bf16_decode(u16::from_le_bytes([c[0], c[1]])),
        NpyType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        NpyType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        NpyType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
        NpyType::F64 => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
    }));
}

fn fewer(count: usize) -> String {
    format!("the file holds fewer than the {count} elements its header announces")
}

/// Parses `.npy` bytes.
pub fn parse(bytes: &[u8]) -> Result<Array, String> {
    let h = parse_header(bytes)?;
    let raw = bytes
        .get(h.data_start..h.data_start + h.data_bytes())
        .ok_or_else(|| fewer(h.count))?;
    let mut data = Vec::with_capacity(h.count);
    decode(h.dtype, raw, &mut data);
    Ok(Array {
        dtype: h.dtype,
        shape: h.shape,
        data,
    })
}

/// The value of an IEEE half-precision bit pattern.
/// A bfloat16 value: the upper half of an f32.
pub fn bf16_decode(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

/// The bfloat16 nearest `x` (via f32; ties to even; NaN stays a quiet NaN).
pub fn bf16_encode(x: f64) -> u16 {
    let b = (x as f32).to_bits();
    if (x as f32).is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

pub fn f16_decode(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = (bits >> 10) & 0x1f;
    let m = f64::from(bits & 0x3ff);
    sign * match e {
        0 => m * 2f64.powi(-24),
        0x1f if m == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        _ => (1.0 + m / 1024.0) * 2f64.powi(i32::from(e) - 15),
    }
}

/// The half-precision bit pattern of `x` rounded to nearest, ties to even (beyond the largest
/// half, infinity; a NaN stays a quiet NaN with its sign).
pub fn f16_encode(x: f64) -> u16 {
    let v = crate::ir::DType::F16.cast(x);
    let sign: u16 = if v.is_sign_negative() { 0x8000 } else { 0 };
    if v.is_nan() {
        return sign | 0x7e00;
    }
    if v.is_infinite() {
        return sign | 0x7c00;
    }
    let a = v.abs();
    if a == 0.0 {
        return sign;
    }
    let exp = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    if exp < -14 {
        // Subnormal: an exact multiple of 2^-24 after the cast.
        return sign | (a * 2f64.powi(24)) as u16;
    }
    let m = ((a / 2f64.powi(exp) - 1.0) * 1024.0) as u16;
    sign | (((exp + 15) as u16) << 10) | m
}

/// The values of the header's Python dict literal (`{'descr': '<f4', 'fortran_order':
/// False, 'shape': (2, 3), }`), as text, read strictly: each of the three keys NumPy writes
/// exactly once and no other (NumPy refuses other keys, and of a key given twice it takes the
/// last, where a search for the key would find the first), values that are a quoted string,
/// a bracketed list or tuple, or a bare word, separated by commas.
fn dict_values(header: &str) -> Result<[&str; 3], String> {
    const KEYS: [&str; 3] = ["descr", "fortran_order", "shape"];
    let body = header
        .trim()
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .ok_or("the header is not a dict literal `{...}`")?;
    let mut found: [Option<&str>; 3] = [None; 3];
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        // The key: a quoted name.
        let q = rest
            .chars()
            .next()
            .filter(|&c| c == '\'' || c == '"')
            .ok_or("malformed header: expected a quoted key")?;
        let end = rest[1..].find(q).ok_or("malformed header: a key is not closed")? + 1;
        let key = &rest[1..end];
        rest = rest[end + 1..].trim_start();
        rest = rest
            .strip_prefix(':')
            .ok_or("malformed header: expected `:` after a key")?
            .trim_start();
        // The value: a quoted string, a bracketed list or tuple, or a bare word.
        let len = match rest.chars().next() {
            Some(c @ ('\'' | '"')) => rest[1..].find(c).ok_or("malformed header: a string is not closed")? + 2,
            Some(open @ ('(' | '[')) => {
                let close = if open == '(' { ')' } else { ']' };
                let mut depth = 0usize;
                let mut at = None;
                for (i, c) in rest.char_indices() {
                    if c == open {
                        depth += 1;
                    } else if c == close {
                        depth -= 1;
                        if depth == 0 {
                            at = Some(i + 1);
                            break;
                        }
                    }
                }
                at.ok_or("malformed header: a bracket is not closed")?
            }
            _ => rest.find([',', '}']).unwrap_or(rest.len()),
        };
        let value = &rest[..len];
        rest = rest[len..].trim_start();
        let k = KEYS
            .iter()
            .position(|&k| k == key)
            .ok_or_else(|| format!("the header has a key '{key}' besides 'descr', 'fortran_order' and 'shape'"))?;
        if found[k].replace(value).is_some() {
            return Err(format!("the header gives '{key}' twice"));
        }
        if let Some(r) = rest.strip_prefix(',') {
            rest = r.trim_start();
        } else if !rest.is_empty() {
            return Err("malformed header: expected `,` between entries".into());
        }
    }
    let [descr, fortran, shape] = found;
    Ok([
        descr.ok_or("the header has no 'descr'")?,
        fortran.ok_or("the header has no 'fortran_order'")?,
        shape.ok_or("the header has no 'shape'")?,
    ])
}

/// Opens a `.npy` file and reads its header, and only its header (at most [`MAX_HEADER`]
/// bytes, however long the file): the file must be a regular file holding every element the
/// header announces.
fn open(path: &std::path::Path) -> Result<(std::fs::File, Header), String> {
    use std::io::Read;
    // Asked before opening: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path).map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut prefix = Vec::with_capacity(12);
    (&mut f).take(12).read_to_end(&mut prefix).map_err(|e| e.to_string())?;
    let (hlen, start) = header_len(&prefix)?;
    let mut bytes = prefix;
    let more = (start + hlen).saturating_sub(bytes.len());
    (&mut f)
        .take(more as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    let h = parse_header(&bytes)?;
    if meta.len() < (h.data_start + h.data_bytes()) as u64 {
        return Err(fewer(h.count));
    }
    Ok((f, h))
}

/// Reads the header of a file (its type and shape), not its data.
pub fn read_header(path: &std::path::Path) -> Result<Header, String> {
    open(path).map(|(_, h)| h)
}

/// Reads a file.
pub fn read(path: &std::path::Path) -> Result<Array, String> {
    read_checked(path, |_| Ok(()))
}

/// Reads a file whose header `check` accepts: the data is read only after the check, so an
/// array of the wrong shape costs no more than its header.
pub fn read_checked(
    path: &std::path::Path,
    check: impl FnOnce(&Header) -> Result<(), String>,
) -> Result<Array, String> {
    use std::io::{Read, Seek};
    let (mut f, h) = open(path)?;
    check(&h)?;
    f.seek(std::io::SeekFrom::Start(h.data_start as u64))
        .map_err(|e| e.to_string())?;
    let mut data = Vec::with_capacity(h.count);
    // The data in pieces of whole elements, so the raw bytes are never held all at once.
    let piece = (1 << 20) * h.dtype.size();
    let mut raw = vec![0u8; piece.min(h.data_bytes())];
    let mut left = h.data_bytes();
    while left > 0 {
        let n = left.min(piece);
        f.read_exact(&mut raw[..n]).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => fewer(h.count),
            _ => e.to_string(),
        })?;
        decode(h.dtype, &raw[..n], &mut data);
        left -= n;
    }
    Ok(Array {
        dtype: h.dtype,
        shape: h.shape,
        data,
    })
}

/// Encodes an array as `.npy` (version 1.0).
pub fn encode(dtype: NpyType, shape: &[usize], data: &[f64]) -> Vec<u8> {
    let shape_txt = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_txt}, }}",
        dtype.descr()
    );
    // Pad so that the data starts on a multiple of 64 bytes, ending with a newline.
    let total = 10 + header.len() + 1;
    let pad = (64 - total % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * dtype.size());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &v in data {
        match dtype {
            NpyType::I8 => out.push(v as i8 as u8),
            NpyType::U8 => out.push(v as u8),
            NpyType::F16 => out.extend_from_slice(&f16_encode(v).to_le_bytes()),
            NpyType::Bf16 => out.extend_from_slice(&bf16_encode(v).to_le_bytes()),
            NpyType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            NpyType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            NpyType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            NpyType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// Writes a file (not over a FIFO, a socket or a block device: [`crate::outfile`]).
pub fn write(path: &std::path::Path, dtype: NpyType, shape: &[usize], data: &[f64]) -> std::io::Result<()> {
    crate::outfile::write(path, encode(dtype, shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The magic, version 1.0 and `header` padded as NumPy pads it (no data).
    fn v1_file(header: &str) -> Vec<u8> {
        let mut h = header.to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b
    }

    #[test]
    fn round_trip() {
        let data: Vec<f64> = (0..24).map(|i| i as f64 - 3.0).collect();
        for t in [NpyType::I32, NpyType::I64, NpyType::F16, NpyType::F32, NpyType::F64] {
            let bytes = encode(t, &[2, 3, 4], &data);
            assert_eq!(
                (bytes.len() - data.len() * t.size()) % 64,
                0,
                "header is padded to 64 bytes"
            );
            let a = parse(&bytes).unwrap();
            assert_eq!(a.shape, vec![2, 3, 4]);
            assert_eq!(a.dtype, t);
            assert_eq!(a.data, data);
        }
    }

    /// The header is NumPy's dict literal, read strictly: a key given twice (NumPy takes the
    /// last, a search the first), another key, or a malformed entry is refused.
    #[test]
    fn header_keys_are_each_given_once_and_no_other() {
        let with = |h: &str| {
            let mut b = v1_file(h);
            b.extend_from_slice(&[0u8; 16]);
            parse_header(&b).map(|h| (h.dtype, h.shape))
        };
        assert_eq!(
            with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }"),
            Ok((NpyType::F32, vec![2, 2]))
        );
        assert_eq!(
            with("{\"shape\": (4,), \"descr\": \"<i4\", \"fortran_order\": False}"),
            Ok((NpyType::I32, vec![4]))
        );
        for (h, msg) in [
            (
                "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                "gives 'descr' twice",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (4,), }",
                "gives 'shape' twice",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'evil': 1, }",
                "a key 'evil'",
            ),
            (
                "{'descr': '<f4',\0 'fortran_order': False, 'shape': (2,), }",
                "expected a quoted key",
            ),
            (
                "{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }",
                "expected `,`",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, }",
                "bracket is not closed",
            ),
            ("{'descr': '<f4', 'fortran_order': False }", "no 'shape'"),
            (
                "'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
                "not a dict literal",
            ),
        ] {
            let e = with(h).unwrap_err();
            assert!(e.contains(msg), "{h}: {e}");
        }
    }

    /// What NumPy's own reader refuses is refused: a format version other than 1.0, 2.0 and
    /// 3.0, a `descr` that is not a quoted string, a `fortran_order` other than `False` or
    /// `True`, and a shape tuple with an empty dimension; a trailing comma and `()` are read.
    #[test]
    fn header_values_are_read_as_numpy_reads_them() {
        let with = |h: &str| parse_header(&v1_file(h)).map(|h| h.shape);
        let shape = |s: &str| with(&format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {s}, }}"));
        assert_eq!(shape("()"), Ok(vec![]));
        assert_eq!(shape("(3,)"), Ok(vec![3]));
        assert_eq!(shape("( 2 , 3 , )"), Ok(vec![2, 3]));
        for bad in ["(2,,3)", "(,)", "(,3)", "(2, 3,,)"] {
            assert!(shape(bad).unwrap_err().contains("empty dimension"), "{bad}");
        }
        for (h, msg) in [
            (
                "{'descr': <f4, 'fortran_order': False, 'shape': (2,), }",
                "malformed 'descr'",
            ),
            (
                "{'descr': \"'<f4'\", 'fortran_order': False, 'shape': (2,), }",
                "malformed 'descr'",
            ),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }",
                "malformed 'fortran_order'",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
                "Fortran-order",
            ),
        ] {
            let e = with(h).unwrap_err();
            assert!(e.contains(msg), "{h}: {e}");
        }
        let mut minor = v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
        minor[7] = 1;
        assert!(parse_header(&minor).unwrap_err().contains("version 1.1"));
    }

    /// A bfloat16 array as `ml_dtypes` saves it (`np.save` of `np.array([1, -2, 3.140625],
    /// dtype=ml_dtypes.bfloat16)`: descr `|V2`, the raw 16-bit patterns), written byte by byte.
    #[test]
    fn reads_ml_dtypes_bfloat16() {
        let mut b = v1_file("{'descr': '|V2', 'fortran_order': False, 'shape': (3,), }");
        for bits in [0x3f80u16, 0xc000, 0x4049] {
            b.extend_from_slice(&bits.to_le_bytes());
        }
        let a = parse(&b).unwrap();
        assert_eq!(a.dtype, NpyType::Bf16);
        assert_eq!(a.data, vec![1.0, -2.0, 3.140625]);
        // Written back, the same bytes.
        assert_eq!(encode(NpyType::Bf16, &[3], &a.data), b);
        // One byte of void says nothing about which fp8 it holds.
        let mut fp8 = encode(NpyType::U8, &[1], &[1.0]);
        let at = fp8.windows(3).position(|w| w == b"|u1").unwrap();
        fp8[at + 1] = b'V';
        assert!(parse(&fp8).unwrap_err().contains("fp8"));
    }

    /// bfloat16 rounding: to nearest, ties to even, the same value as a bf16 store.
    #[test]
    fn bfloat16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even is 1. 1 + 3 * 2^-8 is halfway
        // between 1 + 2^-7 (0x3f81) and 1 + 2^-6 (0x3f82): even is 0x3f82.
        let cases = [
            (1.0, 0x3f80u16),
            (1.00390625, 0x3f80),
            (1.01171875, 0x3f82),
            (-0.0, 0x8000),
            (65280.0, 0x477f),
        ];
        for (x, bits) in cases {
            assert_eq!(bf16_encode(x), bits, "{x}");
        }
        assert!(bf16_decode(bf16_encode(f64::NAN)).is_nan());
        assert_eq!(bf16_decode(bf16_encode(f64::INFINITY)), f64::INFINITY);
        for x in [0.1, -3.7, 1e-30, 12345.678, 3.0e38] {
            assert_eq!(bf16_decode(bf16_encode(x)), crate::ir::DType::Bf16.cast(x), "{x}");
        }
    }

    #[test]
    fn rejects_corrupt() {
        assert!(parse(b"hello").is_err());
        let mut b = encode(NpyType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]);
        b.truncate(b.len() - 2);
        assert!(parse(&b).unwrap_err().contains("fewer"));
        let huge = encode(NpyType::F32, &[1 << 40, 1 << 40], &[]);
        assert!(parse(&huge).is_err());
    }

    /// A header that announces more than [`MAX_HEADER`] bytes, more than [`MAX_DIMS`]
    /// dimensions or more than [`MAX_ELEMENTS`] elements is refused from the header alone.
    #[test]
    fn refuses_oversized_headers() {
        let mut long = b"\x93NUMPY\x02\x00".to_vec();
        long.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&long).unwrap_err().contains("header announces"));
        let dims = encode(NpyType::U8, &[1; 40], &[0.0]);
        assert!(parse(&dims).unwrap_err().contains("dimensions"));
        let big = encode(NpyType::U8, &[MAX_ELEMENTS + 1], &[]);
        assert!(parse_header(&big).unwrap_err().contains("too large"));
    }

    /// `read_checked` reads the header, asks the check, and only then the data; a file
    /// shorter than its header says is refused without reading it.
    #[test]
    fn read_checked_checks_the_header_first() {
        let dir = std::env::temp_dir().join(format!("hpmoe-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npy");
        let data: Vec<f64> = (0..6).map(f64::from).collect();
        std::fs::write(&path, encode(NpyType::F32, &[2, 3], &data)).unwrap();
        let err = read_checked(&path, |h| Err(format!("shape {:?}", h.shape))).unwrap_err();
        assert_eq!(err, "shape [2, 3]");
        assert_eq!(read(&path).unwrap().data, data);
        assert_eq!(read_header(&path).unwrap().shape, vec![2, 3]);
        // A header announcing a million elements over a few bytes of data.
        let mut short = encode(NpyType::F32, &[1 << 20], &[]);
        short.extend_from_slice(&[0; 8]);
        std::fs::write(&path, short).unwrap();
        assert!(read_checked(&path, |_| Ok(())).unwrap_err().contains("fewer"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Half-precision conversions against NumPy 2.4: `np.float16(x)`'s bits (round to
    /// nearest even, overflow to infinity, subnormals) and the value of bit patterns.
    #[test]
    fn half_precision_matches_numpy() {
        let encode_cases: [(f64, u16); 21] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.3333333333333333, 0x3555),
            (2049.0, 0x6800),
            (2051.0, 0x6802),
            (65504.0, 0x7bff),
            (65519.0, 0x7bff),
            (65520.0, 0x7c00),
            (1000000.0, 0x7c00),
            (-1000000.0, 0xfc00),
            (5.960464477539063e-08, 0x0001),
            (2.9802322387695312e-08, 0x0000),
            (2.980232536792755e-08, 0x0001),
            (6.103515625e-05, 0x0400),
            (6.097555160522461e-05, 0x03ff),
            (0.1, 0x2e66),
            (2.71, 0x416c),
            (f64::INFINITY, 0x7c00),
            (f64::NEG_INFINITY, 0xfc00),
        ];
        for (x, bits) in encode_cases {
            assert_eq!(f16_encode(x), bits, "{x}");
        }
        let decode_cases: [(u16, f64); 8] = [
            (0x0001, 5.960464477539063e-08),
            (0x03ff, 6.097555160522461e-05),
            (0x0400, 6.103515625e-05),
            (0x3555, 0.333251953125),
            (0x7bff, 65504.0),
            (0xfbff, -65504.0),
            (0x8001, -5.960464477539063e-08),
            (0x3c01, 1.0009765625),
        ];
        for (bits, x) in decode_cases {
            assert_eq!(f16_decode(bits), x, "{bits:#06x}");
        }
        assert!(f16_decode(0x7e00).is_nan());
        assert_eq!(f16_encode(f64::NAN) & 0x7e00, 0x7e00);
    }

    /// Files NumPy wrote (see tests/data/npy/README.md).
    #[test]
    fn reads_numpy_half_and_byte_arrays() {
        let half = parse(include_bytes!("../tests/data/npy/half.npy")).unwrap();
        assert_eq!(half.dtype, NpyType::F16);
        assert_eq!(half.shape, vec![2, 3]);
        assert_eq!(
            half.data,
            vec![0.5, -1.25, 65504.0, 1.1920928955078125e-07, f64::INFINITY, -0.0]
        );
        assert!(half.data[5].is_sign_negative());
        let i8s = parse(include_bytes!("../tests/data/npy/int8.npy")).unwrap();
        assert_eq!(
            (i8s.dtype, i8s.data),
            (NpyType::I8, vec![-128.0, -1.0, 0.0, 1.0, 127.0])
        );
        let u8s = parse(include_bytes!("../tests/data/npy/uint8.npy")).unwrap();
        assert_eq!((u8s.dtype, u8s.data), (NpyType::U8, vec![0.0, 1.0, 128.0, 255.0]));
        // What we write, NumPy's own bytes: the same header and data.
        let ours = encode(NpyType::I8, &[5], &[-128.0, -1.0, 0.0, 1.0, 127.0]);
        assert_eq!(&ours[..], &include_bytes!("../tests/data/npy/int8.npy")[..]);
    }
}
