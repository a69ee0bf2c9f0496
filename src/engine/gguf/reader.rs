//! A GGUF reader that trusts nothing in the file: every count and length is checked
//! against the bytes that are left before anything is allocated for it, so a hostile or
//! truncated file is an error naming what is wrong, never a panic or an allocation the
//! file cannot back. It reads the header, the metadata and the tensor table (each
//! tensor's extent is checked against the file's size), not the tensors' data.
//!
//! The format (llama.cpp's `gguf.md`): magic `GGUF`, version (2 or 3; little endian),
//! tensor count and metadata count (u64), the metadata as key (string) / type (u32) /
//! value, the tensor infos (name, dimensions, type, offset), padding to
//! `general.alignment`, then the data.

use std::collections::HashMap;
use std::io::Read;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::Unsigned(n) => Some(n),
            MetaValue::Signed(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// What a GGUF file holds besides its tensors' data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: HashMap<String, MetaValue>,
    pub tensors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file (it starts with {0:?}, not \"GGUF\")")]
    NotGguf([u8; 4]),
    #[error("GGUF version {0} is not one this gateway reads (2 or 3)")]
    Version(u32),
    #[error("the file is truncated or damaged: {0}")]
    Damaged(String),
    #[error("could not read the file: {0}")]
    Io(String),
}

/// Arrays inside arrays at most this deep (the format allows it; no model uses more than one).
const MAX_DEPTH: usize = 2;
/// Longest dimension list of a tensor.
const MAX_DIMS: u32 = 8;

/// Reads `len` bytes of `input`.
pub fn read_header(input: impl Read, len: u64) -> Result<Header, GgufError> {
    let mut r = Input { input, pos: 0, len };
    let mut magic = [0u8; 4];
    r.bytes_into(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(GgufError::NotGguf(magic));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let tensors = r.u64()?;
    let entries = r.u64()?;
    // A key of one byte (8 + 1), a type (4) and the smallest value (1).
    r.fits(entries, 14, "metadata entries")?;
    let mut metadata = HashMap::new();
    for _ in 0..entries {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0)?;
        metadata.insert(key, value);
    }
    let alignment = metadata
        .get("general.alignment")
        .and_then(MetaValue::as_u64)
        .unwrap_or(32);
    if alignment == 0 || alignment > 1 << 20 || !alignment.is_power_of_two() {
        return Err(GgufError::Damaged(format!(
            "general.alignment is {alignment}"
        )));
    }
    // A name of one byte (9), one dimension (4 + 8), a type (4) and an offset (8).
    r.fits(tensors, 33, "tensor infos")?;
    let mut extents = Vec::new();
    for _ in 0..tensors {
        let name = r.string()?;
        let dims = r.u32()?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(GgufError::Damaged(format!(
                "tensor {name} has {dims} dimensions"
            )));
        }
        let mut elements: u64 = 1;
        for _ in 0..dims {
            elements = elements
                .checked_mul(r.u64()?)
                .ok_or_else(|| GgufError::Damaged(format!("tensor {name}'s size overflows")))?;
        }
        let kind = r.u32()?;
        let offset = r.u64()?;
        if offset % alignment != 0 {
            return Err(GgufError::Damaged(format!("tensor {name} is not aligned")));
        }
        let bytes = tensor_bytes(kind, elements)
            .ok_or_else(|| GgufError::Damaged(format!("tensor {name}'s size overflows")))?;
        extents.push((name, offset, bytes));
    }
    let data_start = r.pos.div_ceil(alignment).saturating_mul(alignment);
    for (name, offset, bytes) in extents {
        let end = bytes
            .and_then(|b| data_start.checked_add(offset)?.checked_add(b))
            .unwrap_or(data_start.saturating_add(offset));
        if end > len {
            return Err(GgufError::Damaged(format!(
                "tensor {name} ends at byte {end}, past the end of the file ({len} bytes)"
            )));
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
    })
}

/// Bytes of `elements` of GGML type `kind`: `Some(None)` for a type this reader does
/// not size (its extent is then checked by its offset only), `None` on overflow.
fn tensor_bytes(kind: u32, elements: u64) -> Option<Option<u64>> {
    // (elements per block, bytes per block), from ggml's type traits.
    let (block, size) = match kind {
        0 => (1, 4),           // F32
        1 | 30 => (1, 2),      // F16, BF16
        2 | 20 => (32, 18),    // Q4_0, IQ4_NL
        3 => (32, 20),         // Q4_1
        6 => (32, 22),         // Q5_0
        7 => (32, 24),         // Q5_1
        8 => (32, 34),         // Q8_0
        9 => (32, 36),         // Q8_1
        10 => (256, 84),       // Q2_K
        11 | 21 => (256, 110), // Q3_K, IQ3_S
        12 => (256, 144),      // Q4_K
        13 => (256, 176),      // Q5_K
        14 => (256, 210),      // Q6_K
        15 => (256, 292),      // Q8_K
        24 => (1, 1),          // I8
        25 => (1, 2),          // I16
        26 => (1, 4),          // I32
        27 | 28 => (1, 8),     // I64, F64
        _ => return Some(None),
    };
    elements.div_ceil(block).checked_mul(size).map(Some)
}

/// The input and how far into it the reader is.
struct Input<R> {
    input: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Input<R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// `count` items of at least `min` bytes each fit in what is left.
    fn fits(&self, count: u64, min: u64, what: &str) -> Result<(), GgufError> {
        if count.saturating_mul(min) > self.left() {
            return Err(GgufError::Damaged(format!(
                "{count} {what} cannot fit in the {} bytes left",
                self.left()
            )));
        }
        Ok(())
    }

    fn bytes_into(&mut self, buf: &mut [u8]) -> Result<(), GgufError> {
        let n = buf.len() as u64;
        if n > self.left() {
            return Err(GgufError::Damaged(format!(
                "it ends at byte {} in the middle of a value",
                self.len
            )));
        }
        self.input
            .read_exact(buf)
            .map_err(|e| GgufError::Io(e.to_string()))?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        self.bytes_into(&mut buf)?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        self.fits(len, 1, "string bytes")?;
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        self.bytes_into(&mut buf)?;
        Ok(String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match kind {
            0 => MetaValue::Unsigned(u64::from(self.array::<1>()?[0])),
            1 => MetaValue::Signed(i64::from(i8::from_le_bytes(self.array()?))),
            2 => MetaValue::Unsigned(u64::from(u16::from_le_bytes(self.array()?))),
            3 => MetaValue::Signed(i64::from(i16::from_le_bytes(self.array()?))),
            4 => MetaValue::Unsigned(u64::from(self.u32()?)),
            5 => MetaValue::Signed(i64::from(i32::from_le_bytes(self.array()?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.array()?))),
            7 => MetaValue::Bool(self.array::<1>()?[0] != 0),
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(GgufError::Damaged("arrays nested too deep".into()));
                }
                let element = self.u32()?;
                let count = self.u64()?;
                self.fits(count, element_min_bytes(element), "array elements")?;
                let mut items =
                    Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(1 << 16));
                for _ in 0..count {
                    items.push(self.value(element, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Unsigned(self.u64()?),
            11 => MetaValue::Signed(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(GgufError::Damaged(format!(
                    "metadata value type {other} does not exist"
                )))
            }
        })
    }
}

/// The fewest bytes one element of type `kind` takes.
fn element_min_bytes(kind: u32) -> u64 {
    match kind {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // An array: its element type and count.
        9 => 12,
        _ => 1,
    }
}

/// Writes a GGUF header (tests and fuzzing seeds): `metadata` as (key, type, encoded
/// value), `tensors` as (name, dimensions, type, offset).
pub fn write_header(
    metadata: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, &[u64], u32, u64)],
) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    for (key, kind, value) in metadata {
        string(&mut out, key);
        out.extend(kind.to_le_bytes());
        out.extend(value);
    }
    for (name, dims, kind, offset) in tensors {
        string(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(kind.to_le_bytes());
        out.extend(offset.to_le_bytes());
    }
    out
}

/// A GGUF string value, for [`write_header`].
pub fn string_value(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend(s.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
        read_header(bytes, bytes.len() as u64)
    }

    #[test]
    fn a_small_file_is_read() {
        let mut file = write_header(
            &[
                ("general.architecture", 8, string_value("llama")),
                ("llama.context_length", 4, 8192u32.to_le_bytes().to_vec()),
            ],
            &[("t", &[32], 8, 0)],
        );
        file.resize(file.len().div_ceil(32) * 32 + 34, 0);
        let header = parse(&file).expect("valid");
        assert_eq!(
            header.metadata["general.architecture"].as_str(),
            Some("llama")
        );
        assert_eq!(header.metadata["llama.context_length"].as_u64(), Some(8192));
    }

    #[test]
    fn hostile_counts_and_lengths_are_errors_not_allocations() {
        let mut huge_count = b"GGUF".to_vec();
        huge_count.extend(3u32.to_le_bytes());
        huge_count.extend(0u64.to_le_bytes());
        huge_count.extend(u64::MAX.to_le_bytes());
        assert!(matches!(parse(&huge_count), Err(GgufError::Damaged(_))));

        let huge_string = write_header(&[("k", 8, u64::MAX.to_le_bytes().to_vec())], &[]);
        assert!(matches!(parse(&huge_string), Err(GgufError::Damaged(_))));

        let mut huge_array = 9u32.to_le_bytes().to_vec();
        huge_array.extend(4u32.to_le_bytes());
        huge_array.extend((u64::MAX / 2).to_le_bytes());
        let file = write_header(&[("tokens", 9, huge_array)], &[]);
        assert!(matches!(parse(&file), Err(GgufError::Damaged(_))));

        let truncated = write_header(
            &[("general.architecture", 8, string_value("llama"))],
            &[("w", &[4096, 4096], 8, 0)],
        );
        let error = parse(&truncated).expect_err("no data");
        assert!(error.to_string().contains("past the end"), "{error}");

        assert!(matches!(
            parse(b"PK\x03\x04rest"),
            Err(GgufError::NotGguf(_))
        ));
        assert!(matches!(
            parse(b"GGUF\x07\x00\x00\x00"),
            Err(GgufError::Version(7))
        ));
        assert!(parse(b"GG").is_err());
    }
}
