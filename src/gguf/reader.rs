//! The GGUF parser: a bounds-checked cursor over the file's bytes and the validation of
//! every header field, metadata entry and tensor info.
//!
//! Layout (GGUF v2/v3, little-endian):
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × (key: string, type: u32, value)
//! tensor_count × (name: string, n_dims: u32, dims: u64 × n_dims, ggml_type: u32, offset: u64)
//! zero padding to the next multiple of `general.alignment` (default 32)
//! data section: tensor t occupies data[offset_t .. offset_t + n_bytes_t]
//! ```
//!
//! The input is untrusted. Every read is bounds-checked; every count is checked against the
//! bytes that remain (`count × minimum encoded size`) before anything is allocated for it;
//! every size and offset computation is overflow-checked; nothing panics.

use super::value::{Value, ValueType};
use super::{DEFAULT_ALIGNMENT, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, TensorInfo, matrix_shape};
use crate::backend::DType;
use std::collections::HashMap;

type Result<T> = std::result::Result<T, GgufError>;

/// The smallest metadata entry: an empty key (8), a type id (4), a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The smallest tensor info: an empty name (8), n_dims (4), no dims, a type (4), an offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything [`parse`] reads from a file; the tensor data stays where it is.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: usize,
    pub metadata: Vec<(String, Value)>,
    pub keys: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub names: HashMap<String, usize>,
    /// Absolute file offset of the data section.
    pub data_start: usize,
}

/// Parses and validates a whole GGUF file.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed> {
    parse_up_to(bytes, true)
}

/// Parses and validates the header and the metadata only: the tensor table is not read,
/// so `tensors` is empty and `data_start` is where the table begins.
pub(crate) fn parse_metadata(bytes: &[u8]) -> Result<Parsed> {
    parse_up_to(bytes, false)
}

/// [`parse`], or with `tensors` false [`parse_metadata`].
fn parse_up_to(bytes: &[u8], tensors: bool) -> Result<Parsed> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic: [u8; 4] = c.array("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count_at = c.at();
    let tensor_count = c.u64("tensor count")?;
    let n_kv = c.count("metadata entry", MIN_KV_BYTES)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut keys = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        if keys.insert(key.clone(), i).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.push((key, value));
    }
    let alignment = alignment(&metadata, &keys)?;
    if !tensors {
        return Ok(Parsed {
            version,
            alignment,
            metadata,
            keys,
            tensors: Vec::new(),
            names: HashMap::new(),
            data_start: c.pos,
        });
    }

    let n_tensors = c.check_count(
        tensor_count_at,
        tensor_count,
        "tensor info",
        MIN_TENSOR_INFO_BYTES,
    )?;
    let mut raw = Vec::with_capacity(n_tensors);
    let mut names = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info = c.tensor_info()?;
        if names.insert(info.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        raw.push(info);
    }

    let end_of_infos = c.pos;
    let Some(data_start) = end_of_infos.checked_next_multiple_of(alignment) else {
        return Err(GgufError::BadAlignment(alignment as u64));
    };
    if data_start > bytes.len() {
        return Err(GgufError::Truncated {
            at: end_of_infos as u64,
            need: (data_start - end_of_infos) as u64,
            have: c.remaining() as u64,
            what: "padding before the tensor data",
        });
    }
    let data_len = (bytes.len() - data_start) as u64;
    let tensors = raw
        .into_iter()
        .map(|r| r.validate(alignment as u64, data_len))
        .collect::<Result<Vec<_>>>()?;

    Ok(Parsed {
        version,
        alignment,
        metadata,
        keys,
        tensors,
        names,
        data_start,
    })
}

/// `general.alignment`: a `u32` or `u64` non-zero power of two, [`DEFAULT_ALIGNMENT`]
/// when absent.
fn alignment(metadata: &[(String, Value)], keys: &HashMap<String, usize>) -> Result<usize> {
    const KEY: &str = "general.alignment";
    let Some(&i) = keys.get(KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = match metadata[i].1 {
        Value::U32(a) => u64::from(a),
        Value::U64(a) => a,
        ref other => {
            return Err(GgufError::WrongType {
                key: KEY.to_string(),
                expected: "u32",
                found: other.type_name(),
            });
        }
    };
    match usize::try_from(a) {
        Ok(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment(a)),
    }
}

/// A tensor info as stored, before its type, size and placement are checked.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

impl RawTensorInfo {
    /// Checks the type, the size and the placement within a data section of `data_len`
    /// bytes.
    fn validate(self, alignment: u64, data_len: u64) -> Result<TensorInfo> {
        let RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        } = self;
        let Some(dtype) = DType::from_ggml_type(type_id) else {
            return Err(match ggml_type_name(type_id) {
                Some(type_name) => GgufError::UnsupportedTensorType {
                    tensor: name,
                    type_id,
                    type_name,
                },
                None => GgufError::UnknownTensorType {
                    tensor: name,
                    type_id,
                },
            });
        };
        let Some((rows, cols)) = matrix_shape(&dims) else {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        };
        if !cols.is_multiple_of(dtype.block_len()) {
            return Err(GgufError::PartialBlock {
                tensor: name,
                dtype,
                ne0: cols as u64,
            });
        }
        let Some(n_bytes) = dtype.row_bytes(cols).and_then(|rb| rb.checked_mul(rows)) else {
            return Err(GgufError::DimsOverflow { tensor: name, dims });
        };
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            });
        }
        let n_bytes_u64 = n_bytes as u64;
        if offset
            .checked_add(n_bytes_u64)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::TensorOutOfBounds {
                tensor: name,
                offset,
                n_bytes: n_bytes_u64,
                data_len,
            });
        }
        Ok(TensorInfo {
            name,
            dims,
            dtype,
            offset,
            n_bytes,
        })
    }
}

/// The name of a ggml type id that exists in ggml, or `None` for an id ggml never
/// assigned: a format kvcore implements by its [`DType`]'s name, any other from ggml's
/// list.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    if let Some(dtype) = DType::from_ggml_type(id) {
        return Some(dtype.name());
    }
    Some(match id {
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        13 => "Q5_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// A read position in the file. Every read checks the bytes that remain.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn at(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field for the error.
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let have = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= have => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(GgufError::Truncated {
                at: self.at(),
                need: n,
                have: have as u64,
                what,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A `u64` count of items of at least `min_bytes` each, checked against the bytes
    /// that remain after it.
    fn count(&mut self, what: &'static str, min_bytes: u64) -> Result<usize> {
        let at = self.at();
        let count = self.u64(what)?;
        self.check_count(at, count, what, min_bytes)
    }

    /// Checks that `count` items of at least `min_bytes` each fit in what remains.
    fn check_count(
        &self,
        at: u64,
        count: u64,
        what: &'static str,
        min_bytes: u64,
    ) -> Result<usize> {
        let need = u128::from(count) * u128::from(min_bytes);
        let remaining = self.remaining() as u64;
        if need > u128::from(remaining) {
            return Err(GgufError::CountTooLarge {
                at,
                what,
                count,
                min_bytes: need,
                remaining,
            });
        }
        // count ≤ remaining (min_bytes ≥ 1), which is a usize.
        Ok(count as usize)
    }

    /// A GGUF string: `len: u64` then `len` bytes of UTF-8.
    fn string(&mut self, what: &'static str) -> Result<String> {
        let at = self.at();
        let len = self.u64(what)?;
        let remaining = self.remaining() as u64;
        if len > remaining {
            return Err(GgufError::StringTooLong { at, len, remaining });
        }
        let start = self.at();
        let raw = self.take(len, what)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                at: start + e.valid_up_to() as u64,
            }),
        }
    }

    /// A `u32` value type id.
    fn value_type(&mut self) -> Result<ValueType> {
        let at = self.at();
        let type_id = self.u32("value type")?;
        ValueType::from_id(type_id).ok_or(GgufError::UnknownValueType { at, type_id })
    }

    /// The payload of a value of type `ty`; `depth` is the number of enclosing arrays.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8("u8 value")?),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array("i8 value")?)),
            ValueType::U16 => Value::U16(self.u16("u16 value")?),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16 value")?)),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32 value")?)),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64 value")?)),
            ValueType::Bool => {
                let at = self.at();
                match self.u8("bool value")? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    byte => return Err(GgufError::InvalidBool { at, byte }),
                }
            }
            ValueType::Str => Value::Str(self.string("string value")?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        at: self.at(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let elem = self.value_type()?;
                let n = self.count("array element", elem.min_size())?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }

    /// One tensor info, with only its dimension count checked.
    fn tensor_info(&mut self) -> Result<RawTensorInfo> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims,
            });
        }
        let dims = (0..n_dims)
            .map(|_| self.u64("tensor dimension"))
            .collect::<Result<Vec<_>>>()?;
        let type_id = self.u32("tensor type")?;
        let offset = self.u64("tensor offset")?;
        Ok(RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;

    #[test]
    fn metadata_parses_without_the_tensor_table() {
        let mut w = GgufWriter::new();
        w.metadata("k", Value::U32(7))
            .tensor("t", DType::Q8_0, &[32], vec![0; 34]);
        let mut bytes = w.to_bytes();
        // The tensor info is the name (u64 length + "t"), n_dims, one dim, then the type.
        let name = [&1u64.to_le_bytes()[..], b"t"].concat();
        let at = bytes.windows(9).position(|x| x == name).unwrap() + 9 + 4 + 8;
        bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes()); // IQ2_XXS

        assert!(matches!(
            parse(&bytes),
            Err(GgufError::UnsupportedTensorType { type_id: 16, .. })
        ));
        let p = parse_metadata(&bytes).unwrap();
        assert_eq!(p.metadata, [("k".to_string(), Value::U32(7))]);
        assert!(p.tensors.is_empty() && p.names.is_empty());
        // A truncated tensor table does not matter either; truncated metadata does.
        assert!(parse_metadata(&bytes[..at]).is_ok());
        assert!(parse_metadata(&bytes[..30]).is_err());
    }
}
