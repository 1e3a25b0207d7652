//! Weight formats described once: one zero-sized type per [`DType`], implementing
//! [`BlockFormat`] (its block geometry, its stored block and the reference decode and
//! f32 dot) and, for the block-quantised formats, [`QuantFormat`] (the 8-bit activation
//! layout it pairs with and the reference integer dot), in the spirit of candle's
//! `GgmlType`.
//!
//! Every format is stored row-major, `[rows, cols]`, exactly as in a GGUF tensor, so a
//! memory-mapped tensor is used in place. A row of `cols` weights is `cols / BLOCK`
//! consecutive blocks of `BYTES` bytes each, and `cols` must be a multiple of `BLOCK`
//! (32 weights for the legacy formats, a super-block of [`QK_K`] = 256 for the K
//! formats, 1 for the plain float formats). Each block is a `#[repr(C)]` struct of bytes
//! (alignment 1, so a row of any address is viewed as blocks in place,
//! [`BlockFormat::blocks`]), its size checked at compile time:
//!
//! | format | block | bytes | decodes to |
//! |--------|-------|-------|------------|
//! | [`F32`]  | 1     | 4     | the value (little-endian IEEE binary32) |
//! | [`F16`]  | 1     | 2     | IEEE binary16 widened to f32 |
//! | [`BF16`] | 1     | 2     | bfloat16 widened to f32 |
//! | [`Q8_0`] | 32    | 34    | [`BlockQ8_0`]: `w[j] = d·qs[j]` |
//! | [`Q4_0`] | 32    | 18    | [`BlockQ4_0`]: `w[j] = d·((qs[j] & 15) − 8)`, `w[j+16] = d·((qs[j] >> 4) − 8)` |
//! | [`Q4_1`] | 32    | 20    | [`BlockQ4_1`]: `w[j] = d·(qs[j] & 15) + m`, `w[j+16] = d·(qs[j] >> 4) + m` |
//! | [`Q5_0`] | 32    | 22    | [`BlockQ5_0`]: `w[j] = d·((nibble_j \| bit_j << 4) − 16)` |
//! | [`Q4_K`] | 256   | 144   | [`BlockQ4_K`]: sub-block `s` of 32: `w = (d·sc_s)·q − dmin·m_s` |
//! | [`Q6_K`] | 256   | 210   | [`BlockQ6_K`]: sub-block `s` of 16: `w = (d·scales[s])·(q − 32)`, `q` 6 bits |
//!
//! where `nibble_j` is the low nibble of `qs[j]` for `j < 16` and the high nibble of
//! `qs[j − 16]` otherwise; each block type's docs spell out its bit layout.
//!
//! ## Numerics of the reference decode
//! Every product and sum is rounded to f32 separately, never fused, so the decoded values
//! are bit for bit those of the `gguf` Python package's numpy dequantiser (gguf-py
//! `quants.py`), checked against `shared/reference/quant-blocks.json` and
//! `quant-blocks-k.json`. The K-format scales `d·sc`, `dmin·m` and `d·scale` are exact in
//! f32 (at most 19 significant bits), and so are the products with the quants in `Q5_0`
//! and `Q4_K`; in `Q4_K` only the final subtraction rounds, once. A `Q6_K` product
//! `(d·scale)·(q − 32)` can need 25 bits and then rounds once, the same in any decoder
//! that forms `d·scale` first (as llama.cpp and gguf-py do).
//!
//! ## The reference encoders
//! [`BlockFormat::encode`] reproduces gguf-py's numpy quantisers (`quants.quantize`) for
//! the float and legacy formats, including their exact order of operations and
//! intermediate precisions (each impl's docs give its rule), checked byte for byte
//! against `shared/reference/quant-blocks.json` (which has no `Q5_0` vectors). A block
//! scale is computed in f32 and rounded to f16 (ties to even) only when stored; its
//! reciprocal is 0 for a zero scale (numpy's `np.where(d == 0, 0, 1 / d)`). gguf-py has
//! no K-format encoder; the ones here round to nearest without searching for the best
//! scales (unlike llama.cpp's), for test data only.
//!
//! ## One place from tag to type
//! [`DType`] stays the run-time tag (what a GGUF file or a [`Weights`] view carries);
//! [`DType::visit`] is the one place each tag meets its type, so a loop written once over
//! `F: BlockFormat` ([`decode_row`], [`dot_row`]) serves every format. A new format is
//! a `DType` variant, one impl here (and a [`QuantFormat`] impl for an 8-bit path), and,
//! per architecture, the microkernels that need intrinsics.
//!
//! [`Weights`]: super::Weights

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::q8::{self, Q8Block, Q8Layout};
use super::{DType, QK, QK_K};

/// A weight format: the geometry of its blocks and their reference decode.
pub trait BlockFormat: Copy + Send + Sync + 'static {
    /// The run-time tag of this format.
    const DTYPE: DType;
    /// The conventional name (`"Q4_1"`, `"F32"`, ...).
    const NAME: &'static str;
    /// The ggml type id used in GGUF tensor infos.
    const GGML_TYPE: u32;
    /// Weights per block (at most [`MAX_BLOCK`]).
    const BLOCK: usize;
    /// One stored block: plain bytes, alignment 1.
    type Block: Pod;
    /// Bytes per block.
    const BYTES: usize = size_of::<Self::Block>();

    /// Decodes one block into `out: [BLOCK]` (see the module docs for the numerics).
    fn decode(block: &Self::Block, out: &mut [f32]);

    /// Encodes `values: [BLOCK]` as one block: the reference quantiser (see the module
    /// docs and each impl).
    fn encode(values: &[f32]) -> Self::Block;

    /// The blocks of `bytes`, in place.
    ///
    /// # Panics
    /// If `bytes.len()` is not a multiple of [`BYTES`](Self::BYTES).
    #[inline]
    fn blocks(bytes: &[u8]) -> &[Self::Block] {
        bytemuck::cast_slice(bytes)
    }

    /// Decodes `blocks` into `out: [blocks.len() · BLOCK]`, block after block.
    #[inline]
    fn decode_blocks(blocks: &[Self::Block], out: &mut [f32]) {
        debug_assert_eq!(out.len(), blocks.len() * Self::BLOCK);
        for (b, o) in blocks.iter().zip(out.chunks_exact_mut(Self::BLOCK)) {
            Self::decode(b, o);
        }
    }

    /// The reference dot product of the weights `blocks` with `x: [blocks.len() · BLOCK]`:
    /// each weight decoded as [`decode`](Self::decode) does, then `acc ← acc + w_j·x_j`
    /// from left to right in one f32 accumulator, the product and the sum each rounded
    /// (no fused multiply-add).
    #[inline]
    fn dot(blocks: &[Self::Block], x: &[f32]) -> f32 {
        debug_assert_eq!(x.len(), blocks.len() * Self::BLOCK);
        let mut buf = [0.0f32; MAX_BLOCK];
        let w = &mut buf[..Self::BLOCK];
        let mut acc = 0.0f32;
        for (b, xb) in blocks.iter().zip(x.chunks_exact(Self::BLOCK)) {
            Self::decode(b, w);
            for (&wj, &xj) in w.iter().zip(xb) {
                acc += wj * xj;
            }
        }
        acc
    }
}

/// A block-quantised format with an 8-bit-activation path (see [`q8`]).
pub trait QuantFormat: BlockFormat {
    /// The activation layout whose blocks this format's blocks meet (llama.cpp's
    /// `vec_dot_type`).
    const ACTS: Q8Layout;

    /// The reference term of `block` against its activation block `acts` (`[BLOCK]`
    /// values and their sums), as f64 with its magnitude (the same sum with every integer
    /// product and offset taken by absolute value, for error bounds). The formulas are in
    /// the [`q8`] module docs.
    fn dot_q8(block: &Self::Block, acts: Q8Block<'_>) -> (f64, f64);
}

/// The largest [`BlockFormat::BLOCK`] of any format.
pub const MAX_BLOCK: usize = QK_K;

// Checked when compiled: every format's block fits [`BlockFormat::dot`]'s scratch, and
// its ggml id names it alone.
const _: () = {
    let mut i = 0;
    while i < DType::ALL.len() {
        let d = DType::ALL[i];
        assert!(d.block_len() <= MAX_BLOCK);
        assert!(matches!(DType::from_ggml_type(d.ggml_type()), Some(e) if e as u8 == d as u8));
        i += 1;
    }
};

/// A computation generic over the format, run for a run-time tag by [`DType::visit`]
/// (a closure that can be instantiated for every format).
pub trait FormatFn {
    /// What the computation returns.
    type Output;
    /// Runs the computation for format `F`.
    fn call<F: BlockFormat>(self) -> Self::Output;
}

/// `$body` with `$F` naming the format type of the tag `$dtype`: the one table from tag
/// to type (usable in `const fn`s, for the tag's constants).
macro_rules! with_format {
    ($dtype:expr, $F:ident => $body:expr) => {{
        use $crate::backend::format as fmt;
        match $dtype {
            $crate::backend::DType::F32 => {
                type $F = fmt::F32;
                $body
            }
            $crate::backend::DType::F16 => {
                type $F = fmt::F16;
                $body
            }
            $crate::backend::DType::BF16 => {
                type $F = fmt::BF16;
                $body
            }
            $crate::backend::DType::Q8_0 => {
                type $F = fmt::Q8_0;
                $body
            }
            $crate::backend::DType::Q4_0 => {
                type $F = fmt::Q4_0;
                $body
            }
            $crate::backend::DType::Q4_1 => {
                type $F = fmt::Q4_1;
                $body
            }
            $crate::backend::DType::Q5_0 => {
                type $F = fmt::Q5_0;
                $body
            }
            $crate::backend::DType::Q4_K => {
                type $F = fmt::Q4_K;
                $body
            }
            $crate::backend::DType::Q6_K => {
                type $F = fmt::Q6_K;
                $body
            }
        }
    }};
}
pub(crate) use with_format;

/// A function of `(bytes of whole blocks, their activations)` for one [`QuantFormat`]:
/// what [`q8_term`] returns.
pub type Q8TermFn = fn(&[u8], Q8Block<'_>) -> (f64, f64);

/// The reference 8-bit term of one stored block of `dtype` ([`QuantFormat::dot_q8`]) and
/// its activation layout, or `None` for a format without an 8-bit path.
pub const fn q8_term(dtype: DType) -> Option<(Q8Layout, Q8TermFn)> {
    /// `F::dot_q8` of the one block `bytes` holds.
    fn term<F: QuantFormat>(bytes: &[u8], acts: Q8Block<'_>) -> (f64, f64) {
        F::dot_q8(&F::blocks(bytes)[0], acts)
    }
    macro_rules! quant {
        ($F:ty) => {
            Some((<$F>::ACTS, term::<$F> as Q8TermFn))
        };
    }
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => None,
        DType::Q8_0 => quant!(Q8_0),
        DType::Q4_0 => quant!(Q4_0),
        DType::Q4_1 => quant!(Q4_1),
        DType::Q5_0 => quant!(Q5_0),
        DType::Q4_K => quant!(Q4_K),
        DType::Q6_K => quant!(Q6_K),
    }
}

impl DType {
    /// Runs `f` for this tag's format type.
    pub fn visit<V: FormatFn>(self, f: V) -> V::Output {
        with_format!(self, F => f.call::<F>())
    }
}

/// Decodes the stored bytes of `out.len()` consecutive weights of `dtype` into `out`
/// ([`BlockFormat::decode_blocks`]).
///
/// # Panics
/// If `bytes` is not exactly `dtype.row_bytes(out.len())` long.
pub fn decode_row(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    struct Decode<'a> {
        bytes: &'a [u8],
        out: &'a mut [f32],
    }
    impl FormatFn for Decode<'_> {
        type Output = ();
        fn call<F: BlockFormat>(self) {
            let blocks = F::blocks(self.bytes);
            assert_eq!(
                blocks.len() * F::BLOCK,
                self.out.len(),
                "decode_row: lengths"
            );
            F::decode_blocks(blocks, self.out);
        }
    }
    dtype.visit(Decode { bytes, out });
}

/// The bytes of `values` encoded as `dtype`, block after block ([`BlockFormat::encode`]).
///
/// # Panics
/// If `values.len()` is not a whole number of `dtype` blocks.
pub fn encode_row(dtype: DType, values: &[f32]) -> Vec<u8> {
    struct Encode<'a>(&'a [f32]);
    impl FormatFn for Encode<'_> {
        type Output = Vec<u8>;
        fn call<F: BlockFormat>(self) -> Vec<u8> {
            assert!(
                self.0.len().is_multiple_of(F::BLOCK),
                "encode_row: {} values are not whole {} blocks",
                self.0.len(),
                F::NAME
            );
            let blocks: Vec<F::Block> = self.0.chunks_exact(F::BLOCK).map(F::encode).collect();
            bytemuck::cast_slice(&blocks).to_vec()
        }
    }
    dtype.visit(Encode(values))
}

/// The reference dot product of the stored weights `bytes` of `dtype` with
/// `x: [weights]` ([`BlockFormat::dot`]).
///
/// # Panics
/// If `bytes` is not exactly `dtype.row_bytes(x.len())` long.
pub fn dot_row(dtype: DType, bytes: &[u8], x: &[f32]) -> f32 {
    struct Dot<'a> {
        bytes: &'a [u8],
        x: &'a [f32],
    }
    impl FormatFn for Dot<'_> {
        type Output = f32;
        fn call<F: BlockFormat>(self) -> f32 {
            let blocks = F::blocks(self.bytes);
            assert_eq!(blocks.len() * F::BLOCK, self.x.len(), "dot_row: lengths");
            F::dot(blocks, self.x)
        }
    }
    dtype.visit(Dot { bytes, x })
}

/// The f16 stored in `b` (little-endian), widened.
#[inline]
fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// `v` rounded to f16 (ties to even), little-endian.
fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// The reciprocal of a block scale, or 0 for a zero scale (numpy's
/// `np.where(d == 0, 0, 1 / d)`), in f32.
fn inverse(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// The first value of largest magnitude, keeping its sign (numpy's `argmax` of `|x|`).
fn signed_absmax(values: &[f32]) -> f32 {
    values
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m })
}

/// The nearest integer to `v` (ties away from zero), clamped to `lo..=hi`.
fn nearest(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// Quantises 32 weights with `q` and packs weight `j` into the low nibble and weight
/// `j + 16` into the high nibble of byte `j`.
fn pack_nibbles(values: &[f32], q: impl Fn(f32) -> u8) -> [u8; QK / 2] {
    let (lo, hi) = values.split_at(QK / 2);
    std::array::from_fn(|j| q(lo[j]) | (q(hi[j]) << 4))
}

// ---------------------------------------------------------------------------------------
// The plain float formats: blocks of one value.

/// 32-bit IEEE floats.
#[derive(Clone, Copy, Debug, Default)]
pub struct F32;

impl BlockFormat for F32 {
    const DTYPE: DType = DType::F32;
    const NAME: &'static str = "F32";
    const GGML_TYPE: u32 = 0;
    const BLOCK: usize = 1;
    type Block = [u8; 4];

    #[inline]
    fn decode(block: &[u8; 4], out: &mut [f32]) {
        out[0] = f32::from_le_bytes(*block);
    }

    /// The little-endian bytes.
    fn encode(values: &[f32]) -> [u8; 4] {
        values[0].to_le_bytes()
    }
}

/// 16-bit IEEE floats.
#[derive(Clone, Copy, Debug, Default)]
pub struct F16;

impl BlockFormat for F16 {
    const DTYPE: DType = DType::F16;
    const NAME: &'static str = "F16";
    const GGML_TYPE: u32 = 1;
    const BLOCK: usize = 1;
    type Block = [u8; 2];

    #[inline]
    fn decode(block: &[u8; 2], out: &mut [f32]) {
        out[0] = f16_le(*block);
    }

    /// Round to nearest, ties to even (numpy `astype(float16)`).
    fn encode(values: &[f32]) -> [u8; 2] {
        f16_bytes(values[0])
    }
}

/// bfloat16, the top 16 bits of an f32.
#[derive(Clone, Copy, Debug, Default)]
pub struct BF16;

impl BlockFormat for BF16 {
    const DTYPE: DType = DType::BF16;
    const NAME: &'static str = "BF16";
    const GGML_TYPE: u32 = 30;
    const BLOCK: usize = 1;
    type Block = [u8; 2];

    /// The bits become the top half of a binary32.
    #[inline]
    fn decode(block: &[u8; 2], out: &mut [f32]) {
        out[0] = f32::from_bits(u32::from(u16::from_le_bytes(*block)) << 16);
    }

    /// ggml's `fp32_to_bf16`, as `half::bf16::from_f32` does it: NaN forced quiet
    /// (keeping sign and top payload bits), everything else rounded to nearest, ties to
    /// even, on the bit pattern (finite values past the bf16 range round to infinity).
    fn encode(values: &[f32]) -> [u8; 2] {
        half::bf16::from_f32(values[0]).to_le_bytes()
    }
}

// ---------------------------------------------------------------------------------------
// The legacy block formats: 32 weights, one f16 scale.

/// A `Q8_0` block: 32 signed bytes with an f16 scale (llama.cpp's `block_q8_0`; the KV
/// store's `kv::BlockQ8_0` holds the same bytes with an aligned `f16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// The scale `d`, an f16.
    pub d: [u8; 2],
    /// The quants: `w[j] = d·qs[j]`.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34 && align_of::<BlockQ8_0>() == 1);

/// Blocks of 32 signed bytes with an f16 scale (34 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q8_0;

impl BlockFormat for Q8_0 {
    const DTYPE: DType = DType::Q8_0;
    const NAME: &'static str = "Q8_0";
    const GGML_TYPE: u32 = 8;
    const BLOCK: usize = QK;
    type Block = BlockQ8_0;

    #[inline]
    fn decode(b: &BlockQ8_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (w, &q) in out.iter_mut().zip(&b.qs) {
            *w = d * f32::from(q);
        }
    }

    /// `d = max|x| / 127`, `q = round(x · (1/d))` with ties away from zero (gguf-py's
    /// `np_roundf`; `f32::round` rounds so), so `|q| ≤ 127`.
    fn encode(values: &[f32]) -> BlockQ8_0 {
        let d = values.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
        let id = inverse(d);
        BlockQ8_0 {
            d: f16_bytes(d),
            qs: std::array::from_fn(|j| (values[j] * id).round() as i8),
        }
    }
}

impl QuantFormat for Q8_0 {
    const ACTS: Q8Layout = Q8Layout::Q8_0;

    fn dot_q8(b: &BlockQ8_0, acts: Q8Block<'_>) -> (f64, f64) {
        let w = b.qs.map(i32::from);
        q8::legacy_term(f16_le(b.d), 0.0, &w, acts)
    }
}

/// A `Q4_0` block: 32 4-bit quants offset by 8 with an f16 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// The scale `d`, an f16.
    pub d: [u8; 2],
    /// Weight `j` in the low nibble of byte `j`, weight `j + 16` in its high nibble.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18 && align_of::<BlockQ4_0>() == 1);

/// Blocks of 32 4-bit values offset by 8 with an f16 scale (18 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q4_0;

impl BlockFormat for Q4_0 {
    const DTYPE: DType = DType::Q4_0;
    const NAME: &'static str = "Q4_0";
    const GGML_TYPE: u32 = 2;
    const BLOCK: usize = QK;
    type Block = BlockQ4_0;

    #[inline]
    fn decode(b: &BlockQ4_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b.qs) {
            *l = d * f32::from((q & 15) as i8 - 8);
            *h = d * f32::from((q >> 4) as i8 - 8);
        }
    }

    /// `d = x_max / −8` where `x_max` is the first value of largest magnitude (keeping
    /// its sign); `q = trunc(f32(f64(x)·f64(1/d) + 8.5))` clipped to `0..=15`. gguf-py
    /// computes the sum in f64 ("Q4_0's reference rounding is cursed and depends on FMA")
    /// and rounds it to f32 before truncating: both steps are kept.
    fn encode(values: &[f32]) -> BlockQ4_0 {
        let d = signed_absmax(values) / -8.0;
        let id = f64::from(inverse(d));
        let q = |x: f32| (((f64::from(x) * id + 8.5) as f32).trunc() as u8).min(15);
        BlockQ4_0 {
            d: f16_bytes(d),
            qs: pack_nibbles(values, q),
        }
    }
}

impl QuantFormat for Q4_0 {
    const ACTS: Q8Layout = Q8Layout::Q8_0;

    fn dot_q8(b: &BlockQ4_0, acts: Q8Block<'_>) -> (f64, f64) {
        let d = f16_le(b.d);
        q8::legacy_term(d, -8.0 * f64::from(d), &nibbles(&b.qs, 0), acts)
    }
}

/// A `Q4_1` block: 32 4-bit quants with an f16 scale and an f16 minimum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// The scale `d`, an f16.
    pub d: [u8; 2],
    /// The minimum `m`, an f16.
    pub m: [u8; 2],
    /// The quants, packed as [`BlockQ4_0::qs`].
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20 && align_of::<BlockQ4_1>() == 1);

/// Blocks of 32 4-bit values with an f16 scale and an f16 minimum (20 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q4_1;

impl BlockFormat for Q4_1 {
    const DTYPE: DType = DType::Q4_1;
    const NAME: &'static str = "Q4_1";
    const GGML_TYPE: u32 = 3;
    const BLOCK: usize = QK;
    type Block = BlockQ4_1;

    /// `(d·nibble_j) + m`, two roundings.
    #[inline]
    fn decode(b: &BlockQ4_1, out: &mut [f32]) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b.qs) {
            *l = d * f32::from(q & 15) + m;
            *h = d * f32::from(q >> 4) + m;
        }
    }

    /// `d = (max − min) / 15`, `m = min`, `q = trunc((x − min)·(1/d) + 0.5)` in f32,
    /// clipped to `0..=15`.
    fn encode(values: &[f32]) -> BlockQ4_1 {
        let max = values.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let min = values.iter().fold(f32::INFINITY, |m, &x| m.min(x));
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let q = |x: f32| (((x - min) * id + 0.5).trunc() as u8).min(15);
        BlockQ4_1 {
            d: f16_bytes(d),
            m: f16_bytes(min),
            qs: pack_nibbles(values, q),
        }
    }
}

impl QuantFormat for Q4_1 {
    const ACTS: Q8Layout = Q8Layout::Q8_0;

    fn dot_q8(b: &BlockQ4_1, acts: Q8Block<'_>) -> (f64, f64) {
        let m = f64::from(f16_le(b.m));
        q8::legacy_term(f16_le(b.d), m, &nibbles(&b.qs, 0), acts)
    }
}

/// A `Q5_0` block: 32 5-bit quants offset by 16 with an f16 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    /// The scale `d`, an f16.
    pub d: [u8; 2],
    /// A little-endian `u32` whose bit `j` is the 5th bit of weight `j`.
    pub qh: [u8; 4],
    /// The low 4 bits, packed as [`BlockQ4_0::qs`].
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22 && align_of::<BlockQ5_0>() == 1);

/// Blocks of 32 5-bit values offset by 16 with an f16 scale (22 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q5_0;

impl BlockFormat for Q5_0 {
    const DTYPE: DType = DType::Q5_0;
    const NAME: &'static str = "Q5_0";
    const GGML_TYPE: u32 = 6;
    const BLOCK: usize = QK;
    type Block = BlockQ5_0;

    #[inline]
    fn decode(b: &BlockQ5_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for (j, ((l, h), &q)) in lo.iter_mut().zip(hi).zip(&b.qs).enumerate() {
            let bit = |k: usize| ((qh >> k) as u8 & 1) << 4;
            *l = d * f32::from(((q & 15) | bit(j)) as i8 - 16);
            *h = d * f32::from(((q >> 4) | bit(j + 16)) as i8 - 16);
        }
    }

    /// `Q4_0`'s rule with 16 levels a side: `d = x_max / −16`,
    /// `q = trunc(f32(f64(x)·f64(1/d) + 16.5))` clipped to `0..=31`.
    fn encode(values: &[f32]) -> BlockQ5_0 {
        let d = signed_absmax(values) / -16.0;
        let id = f64::from(inverse(d));
        let q = |x: f32| (((f64::from(x) * id + 16.5) as f32).trunc() as u8).min(31);
        let qh = values
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &x)| h | u32::from(q(x) >> 4) << j);
        BlockQ5_0 {
            d: f16_bytes(d),
            qh: qh.to_le_bytes(),
            qs: pack_nibbles(values, |x| q(x) & 15),
        }
    }
}

impl QuantFormat for Q5_0 {
    const ACTS: Q8Layout = Q8Layout::Q8_0;

    fn dot_q8(b: &BlockQ5_0, acts: Q8Block<'_>) -> (f64, f64) {
        let d = f16_le(b.d);
        let w = nibbles(&b.qs, u32::from_le_bytes(b.qh));
        q8::legacy_term(d, -16.0 * f64::from(d), &w, acts)
    }
}

/// The unsigned quants of a legacy block: the nibbles of `qs` (weight `j` low, `j + 16`
/// high) with bit `j` of `qh` as weight `j`'s 5th bit.
fn nibbles(qs: &[u8; QK / 2], qh: u32) -> [i32; QK] {
    let bit = |j: usize| (((qh >> j) & 1) << 4) as i32;
    let mut w = [0i32; QK];
    for (j, &byte) in qs.iter().enumerate() {
        w[j] = i32::from(byte & 15) | bit(j);
        w[j + 16] = i32::from(byte >> 4) | bit(j + 16);
    }
    w
}

// ---------------------------------------------------------------------------------------
// The K formats: super-blocks of 256 weights in sub-blocks with their own scales
// (llama.cpp's `dequantize_row_q4_K` / `dequantize_row_q6_K`).

/// A `Q4_K` super-block: 8 sub-blocks of 32 4-bit quants, each with a 6-bit scale and
/// minimum.
///
/// Sub-block `s` (weights `32s..32s + 32`) has the scale and minimum
/// [`q4_k_scale_min`]`(scales, s)`; bytes `qs[32g..32g + 32]` hold sub-block `2g` in
/// their low nibbles and `2g + 1` in their high ones; `w = (d·sc)·q − dmin·m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_K {
    /// The super-block scale `d`, an f16.
    pub d: [u8; 2],
    /// The super-block minimum scale `dmin`, an f16.
    pub dmin: [u8; 2],
    /// Eight 6-bit `(sc, m)` pairs, packed ([`q4_k_scale_min`]).
    pub scales: [u8; 12],
    /// The quants.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4_K>() == 144 && align_of::<BlockQ4_K>() == 1);

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

/// Super-blocks of 256 4-bit values in 8 sub-blocks with 6-bit scales and minimums
/// (144 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q4_K;

impl BlockFormat for Q4_K {
    const DTYPE: DType = DType::Q4_K;
    const NAME: &'static str = "Q4_K";
    const GGML_TYPE: u32 = 12;
    const BLOCK: usize = QK_K;
    type Block = BlockQ4_K;

    #[inline]
    fn decode(b: &BlockQ4_K, out: &mut [f32]) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        // Sub-blocks 2g and 2g + 1 share the 32 bytes qs[32g..32g + 32].
        for (g, (o, q)) in out
            .chunks_exact_mut(64)
            .zip(b.qs.chunks_exact(32))
            .enumerate()
        {
            let (lo, hi) = o.split_at_mut(32);
            for (s, half, nibble) in [(2 * g, lo, 0), (2 * g + 1, hi, 4)] {
                let (sc, m) = q4_k_scale_min(&b.scales, s);
                let (ds, dm) = (d * f32::from(sc), dmin * f32::from(m));
                for (w, &q) in half.iter_mut().zip(q) {
                    *w = ds * f32::from((q >> nibble) & 15) - dm;
                }
            }
        }
    }

    /// Round to nearest without a search: sub-block `s` spans `[min_s, max_s]` with
    /// `min_s ≤ 0`; its scale is rounded up, `sc_s = ⌈r_s / d⌉` with
    /// `r_s = (max_s − min_s + dmin) / 15` and `d = max_s r_s / 63`, and its minimum
    /// `m_s = ⌈−min_s / dmin⌉` with `dmin = max_s(−min_s) / 63` (`d`, `dmin` as stored in
    /// f16), so every weight lies in range and is within half a step `d·sc_s` of its value
    /// (up to the f16 rounding of the scales).
    fn encode(values: &[f32]) -> BlockQ4_K {
        let subs: Vec<(f32, f32)> = values
            .chunks_exact(32)
            .map(|s| {
                let lo = s.iter().fold(0.0f32, |m, &x| m.min(x));
                let hi = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                (lo, hi)
            })
            .collect();
        let dmin = f16::from_f32(subs.iter().fold(0.0f32, |m, s| m.max(-s.0)) / 63.0).to_f32();
        let range = |(lo, hi): (f32, f32)| (hi - lo + dmin) / 15.0;
        let d = f16::from_f32(subs.iter().fold(0.0f32, |m, &s| m.max(range(s))) / 63.0).to_f32();
        let mut b = BlockQ4_K {
            d: f16_bytes(d),
            dmin: f16_bytes(dmin),
            scales: [0; 12],
            qs: [0; QK_K / 2],
        };
        for (s, (&(lo, hi), x)) in subs.iter().zip(values.chunks_exact(32)).enumerate() {
            let sc = (range((lo, hi)) * inverse(d)).ceil().min(63.0) as u8;
            let m = (-lo * inverse(dmin)).ceil().min(63.0) as u8;
            if s < 4 {
                b.scales[s] = sc;
                b.scales[s + 4] = m;
            } else {
                b.scales[s + 4] = (sc & 15) | (m & 15) << 4;
                b.scales[s - 4] |= (sc >> 4) << 6;
                b.scales[s] |= (m >> 4) << 6;
            }
            let (step, offset) = (d * f32::from(sc), dmin * f32::from(m));
            for (j, &x) in x.iter().enumerate() {
                let q = nearest((x + offset) * inverse(step), 0, 15) as u8;
                b.qs[32 * (s / 2) + j] |= q << (4 * (s % 2));
            }
        }
        b
    }
}

impl QuantFormat for Q4_K {
    const ACTS: Q8Layout = Q8Layout::Q8_K;

    fn dot_q8(b: &BlockQ4_K, acts: Q8Block<'_>) -> (f64, f64) {
        let mut scales = [(0, 0); 8];
        for (t, st) in scales.iter_mut().enumerate() {
            let (sc, m) = q4_k_scale_min(&b.scales, t);
            *st = (i32::from(sc), i32::from(m));
        }
        let mut w = [0i32; QK_K];
        for (g, q) in b.qs.chunks_exact(32).enumerate() {
            for (l, &byte) in q.iter().enumerate() {
                w[64 * g + l] = i32::from(byte & 15);
                w[64 * g + 32 + l] = i32::from(byte >> 4);
            }
        }
        q8::k_term(f16_le(b.d), f16_le(b.dmin), &w, &scales, acts)
    }
}

/// A `Q6_K` super-block: 16 sub-blocks of 16 6-bit quants offset by 32, each with an
/// 8-bit scale.
///
/// In half `n` (weights `128n..128n + 128`), with `L = ql[64n..]`, `H = qh[32n..]`, for
/// `l < 32` the four weights `l`, `l + 32`, `l + 64`, `l + 96` take the low nibble of
/// `L[l]`, of `L[l + 32]`, the high nibble of `L[l]`, of `L[l + 32]`, with bits `0–1`,
/// `2–3`, `4–5`, `6–7` of `H[l]` on top; weight `i` of the super-block has scale
/// `scales[i / 16]` and `w = (d·scale)·(q − 32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6_K {
    /// The low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// The high 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// The sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// The super-block scale `d`, an f16.
    pub d: [u8; 2],
}
const _: () = assert!(size_of::<BlockQ6_K>() == 210 && align_of::<BlockQ6_K>() == 1);

impl BlockQ6_K {
    /// The 6-bit quants (unsigned, `0..64`) of the four weights `128n + 32k + l`,
    /// `k = 0..4`, of half `n` (see the type's docs).
    #[inline]
    fn quants(&self, n: usize, l: usize) -> [u8; 4] {
        let (lo, hi, h) = (
            self.ql[64 * n + l],
            self.ql[64 * n + l + 32],
            self.qh[32 * n + l],
        );
        [
            (lo & 15) | (h & 3) << 4,
            (hi & 15) | ((h >> 2) & 3) << 4,
            (lo >> 4) | ((h >> 4) & 3) << 4,
            (hi >> 4) | ((h >> 6) & 3) << 4,
        ]
    }
}

/// Super-blocks of 256 6-bit values offset by 32 in 16 sub-blocks with 8-bit scales
/// (210 bytes).
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub struct Q6_K;

impl BlockFormat for Q6_K {
    const DTYPE: DType = DType::Q6_K;
    const NAME: &'static str = "Q6_K";
    const GGML_TYPE: u32 = 14;
    const BLOCK: usize = QK_K;
    type Block = BlockQ6_K;

    #[inline]
    fn decode(b: &BlockQ6_K, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (n, o) in out.chunks_exact_mut(128).enumerate() {
            for l in 0..32 {
                for (k, q) in b.quants(n, l).into_iter().enumerate() {
                    let i = 32 * k + l;
                    let sc = f32::from(b.scales[8 * n + i / 16]);
                    o[i] = (d * sc) * f32::from(q as i8 - 32);
                }
            }
        }
    }

    /// Round to nearest without a search: sub-block `s` (16 weights) needs the step
    /// `r_s = max|x| / 31`; `d = max_s r_s / 127` (stored in f16) and
    /// `scale_s = ⌈r_s / d⌉`, so `q = round(x / (d·scale_s)) + 32` stays in `0..64`.
    fn encode(values: &[f32]) -> BlockQ6_K {
        let steps: Vec<f32> = values
            .chunks_exact(16)
            .map(|s| s.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 31.0)
            .collect();
        let d = f16::from_f32(steps.iter().fold(0.0f32, |m, &r| m.max(r)) / 127.0).to_f32();
        let mut b = BlockQ6_K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: std::array::from_fn(|s| (steps[s] * inverse(d)).ceil().min(127.0) as i8),
            d: f16_bytes(d),
        };
        let q: Vec<u8> = values
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let step = d * f32::from(b.scales[i / 16]);
                (nearest(x * inverse(step), -32, 31) + 32) as u8
            })
            .collect();
        for n in 0..2 {
            for l in 0..32 {
                let at = |k: usize| q[128 * n + 32 * k + l];
                b.ql[64 * n + l] = (at(0) & 15) | (at(2) & 15) << 4;
                b.ql[64 * n + l + 32] = (at(1) & 15) | (at(3) & 15) << 4;
                b.qh[32 * n + l] =
                    (at(0) >> 4) | (at(1) >> 4) << 2 | (at(2) >> 4) << 4 | (at(3) >> 4) << 6;
            }
        }
        b
    }
}

impl QuantFormat for Q6_K {
    const ACTS: Q8Layout = Q8Layout::Q8_K;

    fn dot_q8(b: &BlockQ6_K, acts: Q8Block<'_>) -> (f64, f64) {
        let mut w = [0i32; QK_K];
        for n in 0..2 {
            for l in 0..32 {
                for (k, q) in b.quants(n, l).into_iter().enumerate() {
                    w[128 * n + 32 * k + l] = i32::from(q) - 32;
                }
            }
        }
        let scales = b.scales.map(|s| (i32::from(s), 0));
        q8::k_term(f16_le(b.d), 0.0, &w, &scales, acts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tag's constants are its type's, and `visit` reaches that type.
    #[test]
    fn each_tag_meets_its_type() {
        struct Tag;
        impl FormatFn for Tag {
            type Output = (DType, usize, usize);
            fn call<F: BlockFormat>(self) -> Self::Output {
                (F::DTYPE, F::BLOCK, F::BYTES)
            }
        }
        for dtype in DType::ALL {
            assert_eq!(
                dtype.visit(Tag),
                (dtype, dtype.block_len(), dtype.block_bytes())
            );
            let acts = q8_term(dtype).map(|(layout, _)| layout);
            assert_eq!(acts, Q8Layout::of(dtype));
            if let Some(layout) = acts {
                assert!(dtype.block_len().is_multiple_of(layout.block_len()));
            }
        }
    }

    /// `dot` is the left-to-right sum of the decoded weights times `x`.
    #[test]
    fn dot_is_the_decoded_rows_dot() {
        let bytes: Vec<u8> = (0..2 * 144u32).map(|i| (i * 37 % 251) as u8).collect();
        let x: Vec<f32> = (0..512).map(|i| (i as f32 - 200.0) / 64.0).collect();
        let mut w = vec![0.0; 512];
        decode_row(DType::Q4_K, &bytes, &mut w);
        let want = w.iter().zip(&x).fold(0.0f32, |acc, (a, b)| acc + a * b);
        assert_eq!(dot_row(DType::Q4_K, &bytes, &x).to_bits(), want.to_bits());
    }
}
