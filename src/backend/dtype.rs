//! Weight element formats and their byte layouts.
//!
//! Every format is stored row-major, `[rows, cols]`, exactly as in a GGUF tensor, so a
//! memory-mapped tensor is used in place. Block formats pack [`DType::block_len`]
//! consecutive weights of one row into one block of [`DType::block_bytes`] bytes (32
//! weights for the legacy formats, a super-block of [`QK_K`] = 256 for the K formats); a
//! row of `cols` weights is `cols / block_len` blocks and `cols` must be a multiple of
//! `block_len`. Those two numbers are stated once, here; every decoder, kernel and check
//! takes them from [`DType`].
//!
//! | format | block | bytes | decodes to |
//! |--------|-------|-------|------------|
//! | `F32`  | 1     | 4     | the value (little-endian IEEE binary32) |
//! | `F16`  | 1     | 2     | IEEE binary16 widened to f32 |
//! | `BF16` | 1     | 2     | bfloat16 widened to f32 |
//! | `Q8_0` | 32    | 34    | `d: f16`, `qs: [i8; 32]`; `w[j] = d·qs[j]` |
//! | `Q4_0` | 32    | 18    | `d: f16`, `qs: [u8; 16]`; `w[j] = d·((qs[j] & 15) − 8)`, `w[j+16] = d·((qs[j] >> 4) − 8)` |
//! | `Q4_1` | 32    | 20    | `d: f16`, `m: f16`, `qs: [u8; 16]`; `w[j] = d·(qs[j] & 15) + m`, `w[j+16] = d·(qs[j] >> 4) + m` |
//! | `Q5_0` | 32    | 22    | `d: f16`, `qh: u32` (bit `j` is the 5th bit of weight `j`), `qs: [u8; 16]` (nibbles as `Q4_0`); `w[j] = d·((nibble_j \| bit_j << 4) − 16)` |
//! | `Q4_K` | 256   | 144   | `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit `(sc, m)` pairs), `qs: [u8; 128]`; sub-block `s` of 32: `w = (d·sc_s)·q − dmin·m_s` |
//! | `Q6_K` | 256   | 210   | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`; sub-block `s` of 16: `w = (d·scales[s])·(q − 32)`, `q` 6 bits |
//!
//! The products and sums above are each rounded to f32 (no fused multiply-add), which is
//! how the `gguf` reference implementation decodes them. The bit layouts of the K
//! formats (which nibble and which high bits belong to which weight) are spelled out in
//! `kvcore_scalar::quant`, their reference decoder.

use std::fmt;

/// Weights per block of the legacy GGUF block formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`).
pub const QK: usize = 32;

/// Weights per super-block of the K formats (`Q4_K`, `Q6_K`).
pub const QK_K: usize = 256;

/// A weight element format. See the module docs for the byte layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
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
    /// Blocks of 32 5-bit values offset by 16 with an f16 scale (22 bytes).
    Q5_0,
    /// Super-blocks of 256 4-bit values in 8 sub-blocks with 6-bit scales and minimums
    /// (144 bytes).
    Q4_K,
    /// Super-blocks of 256 6-bit values offset by 32 in 16 sub-blocks with 8-bit scales
    /// (210 bytes).
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
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 => QK,
            DType::Q4_K | DType::Q6_K => QK_K,
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
            DType::Q5_0 => 22,
            DType::Q4_K => 144,
            DType::Q6_K => 210,
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
            DType::Q5_0 => 6,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q6_K => 14,
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
            6 => DType::Q5_0,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            14 => DType::Q6_K,
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
            DType::Q5_0 => "Q5_0",
            DType::Q4_K => "Q4_K",
            DType::Q6_K => "Q6_K",
        }
    }
}

/// The 6-bit `(scale, min)` of sub-block `t` (`0..8`) of a `Q4_K` super-block from its 12
/// packed scale bytes (llama.cpp's `get_scale_min_k4`): for `t < 4`
/// `sc = scales[t] & 63`, `m = scales[t + 4] & 63`; for `t ≥ 4`
/// `sc = (scales[t + 4] & 15) | (scales[t − 4] >> 6) << 4`,
/// `m = (scales[t + 4] >> 4) | (scales[t] >> 6) << 4`. Every decoder and kernel takes it
/// from here.
///
/// # Panics
/// If `scales.len() < 12` or `t >= 8`.
pub fn q4_k_scale_min(scales: &[u8], t: usize) -> (u8, u8) {
    if t < 4 {
        (scales[t] & 63, scales[t + 4] & 63)
    } else {
        (
            (scales[t + 4] & 15) | (scales[t - 4] >> 6) << 4,
            (scales[t + 4] >> 4) | (scales[t] >> 6) << 4,
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
