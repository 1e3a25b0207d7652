//! Weight element formats and their byte layouts.
//!
//! Every format is stored row-major, `[rows, cols]`, exactly as in a GGUF tensor, so a
//! memory-mapped tensor is used in place. Block formats pack 32 consecutive weights of
//! one row into one block; a row of `cols` weights is `cols / 32` blocks and `cols` must be
//! a multiple of 32.
//!
//! | format | block | bytes | decodes to |
//! |--------|-------|-------|------------|
//! | `F32`  | 1     | 4     | the value (little-endian IEEE binary32) |
//! | `F16`  | 1     | 2     | IEEE binary16 widened to f32 |
//! | `BF16` | 1     | 2     | bfloat16 widened to f32 |
//! | `Q8_0` | 32    | 34    | `d: f16`, `qs: [i8; 32]`; `w[j] = d·qs[j]` |
//! | `Q4_0` | 32    | 18    | `d: f16`, `qs: [u8; 16]`; `w[j] = d·((qs[j] & 15) − 8)`, `w[j+16] = d·((qs[j] >> 4) − 8)` |
//! | `Q4_1` | 32    | 20    | `d: f16`, `m: f16`, `qs: [u8; 16]`; `w[j] = d·(qs[j] & 15) + m`, `w[j+16] = d·(qs[j] >> 4) + m` |
//!
//! The products and sums above are each rounded to f32 (no fused multiply-add), which is
//! how the `gguf` reference implementation decodes them.

use std::fmt;

/// Weights per block of the GGUF block formats.
pub const QK: usize = 32;

/// A weight element format. See the module docs for the byte layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE floats.
    F32,
    /// 16-bit IEEE floats.
    F16,
    /// bfloat16: the top 16 bits of an f32.
    BF16,
    /// Blocks of 32 signed bytes with an f16 scale (34 bytes).
    Q8_0,
    /// Blocks of 32 4-bit values offset by 8 with an f16 scale (18 bytes).
    Q4_0,
    /// Blocks of 32 4-bit values with an f16 scale and an f16 minimum (20 bytes).
    Q4_1,
}

impl DType {
    /// Every supported format, in a fixed order (for tests and tables).
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
    ];

    /// Weights per block: 1 for the plain float formats, [`QK`] for the block formats.
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => QK,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
        }
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
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q8_0 => 8,
            DType::BF16 => 30,
        }
    }

    /// The format of a ggml type id, or `None` for a type kvcore does not support.
    pub const fn from_ggml_type(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The conventional name (`"Q4_1"`, `"F32"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
