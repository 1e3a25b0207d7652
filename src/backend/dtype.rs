//! The run-time tag of a weight format.
//!
//! A [`DType`] is what a GGUF tensor info or a [`Weights`](super::Weights) view carries;
//! each tag's format is a type in [`format`](super::format) (its block geometry, byte
//! layout and reference decode), and every constant below is read from that type
//! through the one table from tag to type there ([`DType::visit`]).

use std::fmt;

use super::format::{BlockFormat, with_format};

/// Weights per block of the legacy GGUF block formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`).
pub const QK: usize = 32;

/// Weights per super-block of the K formats (`Q4_K`, `Q6_K`).
pub const QK_K: usize = 256;

/// A weight element format: the tag of the format type of the same name in
/// [`format`](super::format), which describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub enum DType {
    /// [`format::F32`](super::format::F32).
    F32,
    /// [`format::F16`](super::format::F16).
    F16,
    /// [`format::BF16`](super::format::BF16).
    BF16,
    /// [`format::Q8_0`](super::format::Q8_0).
    Q8_0,
    /// [`format::Q4_0`](super::format::Q4_0).
    Q4_0,
    /// [`format::Q4_1`](super::format::Q4_1).
    Q4_1,
    /// [`format::Q5_0`](super::format::Q5_0).
    Q5_0,
    /// [`format::Q4_K`](super::format::Q4_K).
    Q4_K,
    /// [`format::Q6_K`](super::format::Q6_K).
    Q6_K,
}

impl DType {
    /// Every supported format, in a fixed order (for tests and tables).
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q4_K,
        DType::Q6_K,
    ];

    /// Weights per block: 1 for the plain float formats, [`QK`] for the legacy block
    /// formats, [`QK_K`] for the K formats.
    pub const fn block_len(self) -> usize {
        with_format!(self, F => F::BLOCK)
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        with_format!(self, F => F::BYTES)
    }

    /// Bytes of one row of `cols` weights, or `None` when `cols` is not a whole number
    /// of blocks or the size overflows `usize`.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_len()) {
            return None;
        }
        (cols / self.block_len()).checked_mul(self.block_bytes())
    }

    /// The ggml type id used in GGUF tensor infos.
    pub const fn ggml_type(self) -> u32 {
        with_format!(self, F => F::GGML_TYPE)
    }

    /// The format of a ggml type id, or `None` for a type kvcore does not support.
    pub const fn from_ggml_type(id: u32) -> Option<DType> {
        let mut i = 0;
        while i < DType::ALL.len() {
            if DType::ALL[i].ggml_type() == id {
                return Some(DType::ALL[i]);
            }
            i += 1;
        }
        None
    }

    /// The conventional name (`"Q4_1"`, `"F32"`, ...).
    pub const fn name(self) -> &'static str {
        with_format!(self, F => F::NAME)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
