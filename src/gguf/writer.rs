//! [`GgufWriter`]: builds a GGUF v3 file in memory.
//!
//! Used to make tiny test models, fuzz seeds and (by patching its output) malformed files.
//! Output is deterministic: metadata and tensors in insertion order; tensor `i` at the
//! first multiple of the alignment after tensor `i − 1` (the first at offset 0); the tensor
//! infos and every tensor's data padded with zero bytes to the alignment, as the `gguf`
//! Python package and llama.cpp write them.
//!
//! The writer writes what it is given: duplicate keys or tensor names go into the file
//! as they are (the reader rejects them), which is what tests of the reader need.

use super::DEFAULT_ALIGNMENT;
use super::value::{Value, ValueType};
use crate::backend::DType;

/// An in-memory GGUF v3 file under construction.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: usize,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    data: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty v3 file with the default alignment of 32 bytes (no `general.alignment`
    /// key is written for it).
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Lays the file out with `alignment` and records it as `general.alignment` (`u32`),
    /// replacing an earlier `general.alignment` entry in place or appending one.
    ///
    /// # Panics
    /// If `alignment` is not a power of two that fits a `u32`.
    pub fn alignment(&mut self, alignment: usize) -> &mut Self {
        assert!(
            alignment.is_power_of_two() && u32::try_from(alignment).is_ok(),
            "alignment {alignment} must be a power of two that fits u32"
        );
        self.alignment = alignment;
        let value = Value::U32(alignment as u32);
        match self
            .metadata
            .iter_mut()
            .find(|(k, _)| k == "general.alignment")
        {
            Some(entry) => entry.1 = value,
            None => self.metadata.push(("general.alignment".to_string(), value)),
        }
        self
    }

    /// Appends metadata entry `key = value`. A raw `general.alignment` entry is written as
    /// given and does not change the layout (use [`GgufWriter::alignment`] for that).
    ///
    /// # Panics
    /// If an array (at any depth) mixes element types.
    pub fn metadata(&mut self, key: &str, value: Value) -> &mut Self {
        check_homogeneous(&value);
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Appends tensor `name` of `dtype` with ggml dims `dims` (`ne0` first) and its stored
    /// bytes `data`.
    ///
    /// # Panics
    /// If there are more than four dims, `dims[0]` is not a whole number of blocks of
    /// `dtype`, or `data` is not exactly the tensor's size.
    pub fn tensor(&mut self, name: &str, dtype: DType, dims: &[u64], data: Vec<u8>) -> &mut Self {
        assert!(
            dims.len() <= super::MAX_DIMS,
            "tensor {name}: {} dims",
            dims.len()
        );
        let (rows, cols) = super::matrix_shape(dims)
            .unwrap_or_else(|| panic!("tensor {name}: dims {dims:?} overflow"));
        let n_bytes = dtype
            .row_bytes(cols)
            .and_then(|rb| rb.checked_mul(rows))
            .unwrap_or_else(|| {
                panic!("tensor {name}: {cols} columns of {dtype} are not whole blocks")
            });
        assert_eq!(
            data.len(),
            n_bytes,
            "tensor {name}: {dtype} {dims:?} takes {n_bytes} bytes"
        );
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dtype,
            dims: dims.to_vec(),
            data,
        });
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let a = self.alignment;
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            write_payload(&mut out, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.ggml_type().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.data.len().next_multiple_of(a);
        }
        out.resize(out.len().next_multiple_of(a), 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            out.resize(out.len().next_multiple_of(a), 0);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The encoding of `value` after its type id. An empty array is written with element
/// type `u8`.
fn write_payload(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::Str(s) => write_str(out, s),
        Value::Array(items) => {
            let elem = items.first().map_or(ValueType::U8, Value::value_type);
            out.extend_from_slice(&elem.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_payload(out, item);
            }
        }
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// Panics if an array in `value` mixes element types.
fn check_homogeneous(value: &Value) {
    if let Value::Array(items) = value {
        if let Some(first) = items.first() {
            let ty = first.value_type();
            assert!(
                items.iter().all(|v| v.value_type() == ty),
                "GGUF arrays are homogeneous: mixed element types after {}",
                ty.name()
            );
        }
        items.iter().for_each(check_homogeneous);
    }
}
