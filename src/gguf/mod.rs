//! GGUF model files: reading ([`GgufFile`]) and writing ([`GgufWriter`]).
//!
//! A GGUF file (versions 2 and 3) is a header, typed metadata key/values ([`Value`]), a
//! table of tensor infos ([`TensorInfo`]: name, dims, ggml type, offset) and a data
//! section aligned to `general.alignment` (default 32 bytes) holding every tensor's bytes
//! in its stored format. The byte layout is documented in `reader.rs` (file structure) and
//! `value.rs` (value encodings); everything is little-endian.
//!
//! [`GgufFile`] parses and validates the whole file up front: magic, version, every count
//! against the bytes that remain, UTF-8, duplicate keys and tensor names, the alignment,
//! and every tensor's type, size and placement in the data section. After that, tensor
//! data is handed out as borrowed slices ([`GgufFile::tensor_data`]) and [`Weights`] views
//! ([`GgufFile::weights`]) of the file's own bytes: never copied, never dequantised.
//! [`GgufFile::open_metadata`] stops after the metadata, for what a file says about
//! itself (its tokenizer, its config) when its tensors are in formats kvcore cannot load.
//!
//! Tensor dims follow ggml: `dims[0]` (`ne0`) is the contiguous, fastest-varying
//! dimension. As a matrix, a tensor is `[rows, cols]` with `cols = dims[0]` and
//! `rows = dims[1] · dims[2] · dims[3]`.

mod error;
#[cfg(any(unix, windows))]
mod mmap;
mod reader;
mod value;
mod writer;

pub use error::GgufError;
pub use value::Value;
pub use writer::GgufWriter;

use crate::backend::{DType, Weights};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

/// `general.alignment` when the file does not set it.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The deepest nesting of arrays the reader accepts (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// The most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor of a GGUF file, as listed in its tensor-info table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, unique within the file (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml dims, `ne0` first (the contiguous one); at most [`MAX_DIMS`], possibly zero.
    pub dims: Vec<u64>,
    /// The stored element format.
    pub dtype: DType,
    /// Byte offset of the tensor's data relative to the start of the data section; a
    /// multiple of the file's alignment.
    pub offset: u64,
    /// Bytes of stored data: `rows · dtype.row_bytes(cols)` (see the module docs).
    pub n_bytes: usize,
}

/// A parsed, validated GGUF file that owns its bytes.
pub struct GgufFile {
    bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
    /// SHA-256 of `bytes`, computed on first use.
    fingerprint: OnceLock<[u8; 32]>,
}

impl GgufFile {
    /// Memory-maps (read-only) and parses the file at `path`. Tensor data stays in the
    /// map: weights are paged in on demand and never copied.
    ///
    /// The file must not be modified or truncated while the `GgufFile` lives (the caveat of
    /// every memory-mapped reader; see `mmap.rs`). On a platform without memory maps
    /// (wasm32) the file is read into memory instead.
    ///
    /// Errors: [`GgufError::Io`] (naming the path) when it cannot be read,
    /// [`GgufError::NotAFile`] for a directory or other non-regular file, and any parse
    /// error of [`GgufFile::from_bytes`].
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        GgufFile::from_parsed(GgufFile::map(path)?, reader::parse)
    }

    /// Like [`GgufFile::open`], but parses only the header and the metadata: for the
    /// tokenizer, chat template or config of a file whose tensors kvcore cannot load (a
    /// weight format it does not implement). [`GgufFile::tensors`] is empty and
    /// [`GgufFile::data_start`] is where the tensor table begins.
    ///
    /// Errors: those of [`GgufFile::open`] but the tensor table's.
    pub fn open_metadata(path: &Path) -> Result<GgufFile, GgufError> {
        GgufFile::from_parsed(GgufFile::map(path)?, reader::parse_metadata)
    }

    /// Memory-maps the regular file at `path` read-only.
    #[cfg(any(unix, windows))]
    fn map(path: &Path) -> Result<memmap2::Mmap, GgufError> {
        GgufFile::regular(path)?;
        let file = std::fs::File::open(path).map_err(|e| GgufFile::io(path, e))?;
        mmap::map_readonly(&file).map_err(|e| GgufFile::io(path, e))
    }

    /// Reads the regular file at `path` into memory: the platforms without a memory map
    /// (wasm32-wasip1), where `open` therefore costs a copy of the file. In pieces of
    /// 16 MiB: a WASI host may refuse one read as large as a model (wasmtime answers
    /// `ENOMEM` for 250 MB).
    #[cfg(not(any(unix, windows)))]
    fn map(path: &Path) -> Result<Vec<u8>, GgufError> {
        use std::io::Read;
        const PIECE: usize = 16 << 20;
        GgufFile::regular(path)?;
        let io = |e| GgufFile::io(path, e);
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let len = usize::try_from(len).map_err(|_| io(std::io::ErrorKind::OutOfMemory.into()))?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| io(std::io::ErrorKind::OutOfMemory.into()))?;
        loop {
            let n = (&mut file)
                .take(PIECE as u64)
                .read_to_end(&mut bytes)
                .map_err(io)?;
            if n == 0 {
                return Ok(bytes);
            }
        }
    }

    /// `Ok` if `path` is a regular file.
    fn regular(path: &Path) -> Result<(), GgufError> {
        let meta = std::fs::metadata(path).map_err(|e| GgufFile::io(path, e))?;
        if meta.is_file() {
            Ok(())
        } else {
            Err(GgufError::NotAFile(path.to_path_buf()))
        }
    }

    /// The I/O error `source` of `path`.
    fn io(path: &Path, source: std::io::Error) -> GgufError {
        GgufError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Parses a whole file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_storage(bytes)
    }

    /// Parses a whole file from any owner of its bytes: a `Vec<u8>`, a `memmap2::Mmap`,
    /// an `Arc<[u8]>`. The bytes must not change while the `GgufFile` lives.
    pub fn from_storage(
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
    ) -> Result<GgufFile, GgufError> {
        GgufFile::from_parsed(bytes, reader::parse)
    }

    /// `bytes` as parsed by `parse`.
    fn from_parsed(
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
        parse: fn(&[u8]) -> Result<reader::Parsed, GgufError>,
    ) -> Result<GgufFile, GgufError> {
        let p = parse(bytes.as_ref())?;
        Ok(GgufFile {
            bytes: Box::new(bytes),
            version: p.version,
            alignment: p.alignment,
            data_start: p.data_start,
            metadata: p.metadata,
            keys: p.keys,
            tensors: p.tensors,
            names: p.names,
            fingerprint: OnceLock::new(),
        })
    }

    /// The format version, 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes (`general.alignment`, default [`DEFAULT_ALIGNMENT`]).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute file offset of the data section (tensor offsets are relative to it).
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }

    /// The file's identity: the SHA-256 of all its bytes (header, metadata, tensor table
    /// and tensor data), so two files that differ anywhere, even in one weight of the same
    /// shapes, have different fingerprints. Computed on the first call (one pass over the
    /// file) and cached.
    pub fn fingerprint(&self) -> &[u8; 32] {
        self.fingerprint
            .get_or_init(|| Sha256::digest(self.bytes()).into())
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key`, or [`GgufError::MissingKey`].
    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    /// A string value. Errors: [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// An integer value of any integer type, which must be non-negative.
    /// Errors: [`GgufError::MissingKey`], [`GgufError::WrongType`] for a non-integer,
    /// [`GgufError::OutOfRange`] for a negative integer.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => Ok(u),
            (None, Some(value)) => Err(GgufError::OutOfRange {
                key: key.to_string(),
                value,
                expected: "a non-negative integer",
            }),
            (None, None) => Err(Self::wrong_type(key, "an integer", v)),
        }
    }

    /// A float value: `f32`, or `f64` rounded to the nearest `f32`.
    /// Errors: [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| Self::wrong_type(key, "f32", v))
    }

    /// A bool value. Errors: [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong_type(key, "bool", v))
    }

    /// An array value's elements. Errors: [`GgufError::MissingKey`],
    /// [`GgufError::WrongType`].
    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// Every tensor info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.names.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of tensor `t`, `t.n_bytes` of them, borrowed from the file.
    ///
    /// # Panics
    /// If `t` is not one of this file's tensors and its range lies outside the data
    /// section (a programming error: the file's own tensors are validated at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let data = &self.bytes()[self.data_start..];
        let start = usize::try_from(t.offset).ok();
        let range = start.and_then(|s| Some(s..s.checked_add(t.n_bytes)?));
        range
            .and_then(|r| data.get(r))
            .unwrap_or_else(|| panic!("tensor {:?} lies outside this file's data", t.name))
    }

    /// Tensor `t` as a `[rows, cols]` matrix view: `cols = dims[0]` (ggml `ne0`),
    /// `rows` the product of the other dims (1 for a vector).
    ///
    /// Errors: [`GgufError::DimsOverflow`] or [`GgufError::Shape`] when `t`'s dims and
    /// size do not describe a matrix (only possible for a `TensorInfo` altered or made by
    /// hand; the file's own are validated at parse time).
    ///
    /// # Panics
    /// As [`GgufFile::tensor_data`].
    pub fn weights(&self, t: &TensorInfo) -> Result<Weights<'_>, GgufError> {
        let (rows, cols) = matrix_shape(&t.dims).ok_or_else(|| GgufError::DimsOverflow {
            tensor: t.name.clone(),
            dims: t.dims.clone(),
        })?;
        Weights::new(t.dtype, rows, cols, self.tensor_data(t)).map_err(|source| GgufError::Shape {
            tensor: t.name.clone(),
            source,
        })
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("len", &self.bytes().len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// `(rows, cols)` of ggml dims: `cols = dims[0]`, `rows = dims[1] · … ` (1 each when
/// absent). `None` when the product of the non-zero dims exceeds `i64::MAX` (ggml counts
/// elements in `int64_t`) or `usize`, so every partial product (rows, rows · cols) fits.
fn matrix_shape(dims: &[u64]) -> Option<(usize, usize)> {
    let mut bound: u64 = 1;
    for &d in dims {
        bound = bound
            .checked_mul(d.max(1))
            .filter(|&b| b <= i64::MAX as u64)?;
    }
    usize::try_from(bound).ok()?;
    let cols = dims.first().map_or(1, |&d| d as usize);
    let rows = dims.iter().skip(1).map(|&d| d as usize).product();
    Some((rows, cols))
}
