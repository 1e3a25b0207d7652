//! [`GgufError`]: every way reading a GGUF file or looking up its contents can fail.
//!
//! Parse errors carry the absolute byte offset (`at`) of the field that is wrong, so a
//! hex dump of the file shows the problem directly; tensor errors name the tensor. A
//! variant that wraps another error names what it was doing and returns the cause from
//! [`source`](std::error::Error::source) without repeating it, so printing the chain
//! shows each cause once.

use crate::backend::{DType, ShapeError};
use std::path::PathBuf;
use thiserror::Error;

/// Why a GGUF file could not be read, or a metadata or tensor lookup failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("cannot read {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error (the [`source`](std::error::Error::source)).
        source: std::io::Error,
    },
    /// The path exists but is not a regular file (a directory, a device, ...).
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// What the file holds.
        found: [u8; 4],
    },
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {0} (kvcore reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The file ends inside a field.
    #[error("file truncated at byte {at}: {what} needs {need} bytes, {have} remain")]
    Truncated {
        /// Absolute byte offset of the field.
        at: u64,
        /// Bytes the field needs.
        need: u64,
        /// Bytes left in the file.
        have: u64,
        /// Which field or operand.
        what: &'static str,
    },
    /// A string's declared length runs past the end of the file.
    #[error("string at byte {at} declares {len} bytes, only {remaining} remain")]
    StringTooLong {
        /// Absolute byte offset of the field.
        at: u64,
        /// The declared or actual length.
        len: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A string is not valid UTF-8.
    #[error("string at byte {at} is not valid UTF-8")]
    InvalidUtf8 {
        /// Absolute byte offset of the field.
        at: u64,
    },
    /// A count (metadata entries, tensors, array elements) needs more bytes than remain,
    /// checked before anything is allocated for it.
    #[error(
        "{what} count {count} at byte {at} needs at least {min_bytes} bytes, only {remaining} remain"
    )]
    CountTooLarge {
        /// Absolute byte offset of the field.
        at: u64,
        /// Which field or operand.
        what: &'static str,
        /// The count read.
        count: u64,
        /// The fewest bytes that many items take.
        min_bytes: u128,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {type_id} at byte {at}")]
    UnknownValueType {
        /// Absolute byte offset of the field.
        at: u64,
        /// The type id read.
        type_id: u32,
    },
    /// A bool stored as a byte other than 0 or 1.
    #[error("invalid bool byte {byte:#04x} at byte {at}")]
    InvalidBool {
        /// Absolute byte offset of the field.
        at: u64,
        /// The byte read.
        byte: u8,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH).
    #[error("array at byte {at} is nested deeper than {max} levels")]
    ArrayTooDeep {
        /// Absolute byte offset of the field.
        at: u64,
        /// The deepest nesting allowed.
        max: usize,
    },
    /// The same metadata key twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// `general.alignment` is zero, not a power of two, or does not fit `usize`.
    #[error("general.alignment is {0}, expected a non-zero power of two")]
    BadAlignment(u64),
    /// A tensor with more than four dimensions.
    #[error("tensor {tensor:?} has {n_dims} dimensions, at most 4 are allowed")]
    TooManyDims {
        /// The tensor's name.
        tensor: String,
        /// Dimensions declared.
        n_dims: u32,
    },
    /// A tensor type id that is not a ggml type at all.
    #[error("tensor {tensor:?} has unknown ggml type id {type_id}")]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The type id read.
        type_id: u32,
    },
    /// A real ggml type that kvcore does not implement.
    #[error(
        "tensor {tensor:?} has ggml type {type_name} (id {type_id}), which kvcore does not support"
    )]
    UnsupportedTensorType {
        /// The tensor's name.
        tensor: String,
        /// The type id read.
        type_id: u32,
        /// ggml's name for the type.
        type_name: &'static str,
    },
    /// The element count or byte size of a tensor overflows.
    #[error("tensor {tensor:?}: the size of dims {dims:?} overflows")]
    DimsOverflow {
        /// The tensor's name.
        tensor: String,
        /// The dims declared (`ne0` first).
        dims: Vec<u64>,
    },
    /// The first dimension is not a whole number of blocks of the tensor's type.
    #[error("tensor {tensor:?}: ne0 = {ne0} is not a multiple of the {dtype} block length")]
    PartialBlock {
        /// The tensor's name.
        tensor: String,
        /// The element format.
        dtype: DType,
        /// The first (contiguous) dimension.
        ne0: u64,
    },
    /// A tensor's bytes run past the end of the data section.
    #[error(
        "tensor {tensor:?}: bytes {offset}..{offset}+{n_bytes} run past the data section of {data_len} bytes"
    )]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Offset of the data relative to the data section.
        offset: u64,
        /// Bytes of stored data.
        n_bytes: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor's name.
        tensor: String,
        /// Offset of the data relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// A required metadata key is absent.
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    /// A metadata value of the wrong type.
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongType {
        /// The metadata key.
        key: String,
        /// What was expected.
        expected: &'static str,
        /// What the file holds.
        found: &'static str,
    },
    /// A metadata integer of the right type whose value is out of the requested range
    /// (a negative count, say).
    #[error("metadata key {key:?} = {value} is out of range: expected {expected}")]
    OutOfRange {
        /// The metadata key.
        key: String,
        /// The value read.
        value: i64,
        /// What was expected.
        expected: &'static str,
    },
    /// A tensor's dims do not make a valid [`Weights`](crate::backend::Weights) view.
    #[error("tensor {tensor:?} cannot be viewed as a matrix")]
    Shape {
        /// The tensor's name.
        tensor: String,
        /// The underlying error (the [`source`](std::error::Error::source)).
        source: ShapeError,
    },
}
