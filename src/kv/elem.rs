//! The element types a store keeps its rows in, and `Buf`, the typed row buffer every
//! store is built from.
//!
//! A row is one position's keys (or values) of one layer, `kv_dim = n_kv_heads ·
//! head_dim` values. It is stored as *units*: one element for the plain types, one
//! 32-value block for `q8_0`. Encoding is per row, so a row's stored bytes depend on that
//! row alone: two stores given the same rows hold the same bytes, whatever their layout
//! or history, which is what keeps a quantized `GrowKv` bitwise equal to a quantized
//! `DenseKv`.
//!
//! | type | unit | bytes per value | encoding of an f32 `x` |
//! |------|------|----------------:|------------------------|
//! | `f32` | `f32` | 4 | exact |
//! | `f16` | IEEE half | 2 | round to nearest even (`half::f16::from_f32`); beyond ±65504 → ±∞ |
//! | `bf16` | bfloat16 | 2 | round to nearest even (`half::bf16::from_f32`), NaN kept NaN |
//! | `q8_0` | [`BlockQ8_0`], 32 values | 34/32 | each head rotated, `y = H x` ([`hadamard`] over [`rotation_len`] values), keys of a store with key offsets less their block's (`y − t_b`, `kv/offsets.rs`), then llama.cpp's `Q8_0` layout per block of 32: `d = amax/127` rounded to f16 (up, when rounding to nearest went down to a positive finite scale), `q_j = round_ties_even(y_j / d)` against that stored `d`, with [`q8::quantize_block`](crate::backend::q8::quantize_block)'s special cases (a non-finite block: `d = NaN`; a tiny one: `d = 0`; a scale f16 rounds to 0 or ∞ is stored so, the quants against the f32 `d`) |
//!
//! | `q4_0` | [`BlockQ4_0`], 32 values | 18/32 | each head rotated and keys less their offsets as `q8_0`, then llama.cpp's `Q4_0` layout per block of 32 (`quantize_row_q4_0_ref`): `m` the value of largest magnitude (the first of equals), `d = m / −8`, `q_j = min(15, trunc(y_j / d + 8.5))` against the f32 `d`, `d` stored as f16; a block of zeros or one holding a NaN or ±∞ stores `d = 0` or NaN as that arithmetic gives |
//!
//! A `q8_0` block stores `f32(d) · q_j ≈ (H x)_j`, decoded exactly as GGUF's `Q8_0`
//! weights (the kernels use the same dequantisers for both); attention rotates the query
//! (for keys) or its output (for values) to match, see [`hadamard`]. A `q8_0` block
//! never spans two heads, so it needs `head_dim` to be a multiple of 32
//! ([`KvError::BlockShape`]).

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use ndarray::{ArrayView2, ArrayView3, ArrayViewMut2, Axis};

use super::codec::LayerCodec;
use super::codec::encode_block_row;
use super::mem::Mem;
use super::{Gate, KvError, KvRows, KvType};
use crate::backend::q8;

/// One `q8_0` block, llama.cpp's 34-byte `block_q8_0` layout (the scale `d` as f16, then
/// the 32 signed quants, byte for byte GGUF's `Q8_0`). In a store its values are those of
/// a **rotated** head, `y = H x` ([`encode_q8_0`](super::codec::encode_q8_0),
/// [`hadamard`](super::codec::hadamard)).
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// The scale.
    pub d: f16,
    /// The quants.
    pub qs: [i8; 32],
}

/// Values per [`BlockQ8_0`].
pub const Q8_0_BLOCK: usize = 32;

impl BlockQ8_0 {
    /// Quantises 32 values in llama.cpp's `Q8_0` layout (no rotation:
    /// [`encode_q8_0`](super::codec::encode_q8_0) rotates first), the quants rounded against the scale as stored.
    pub fn encode(x: &[f32]) -> BlockQ8_0 {
        let mut qs = [0i8; 32];
        let x = &x[..Q8_0_BLOCK];
        let d = q8::quantize_block(x, &mut qs);
        let d16 = f16::from_f32(d);
        // The quants against the scale as stored: `d` rounded to f16 scales every value
        // of the block by the same factor (up to 1 ± 2⁻¹²), one error all 32 share;
        // quantising with the stored scale itself (rounded up so that `amax` stays
        // within ±127) leaves each value only its own rounding.
        let mut ds = d16.to_f32();
        if ds.is_finite() && ds > 0.0 {
            if ds < d {
                ds = f16::from_bits(d16.to_bits() + 1).to_f32();
            }
            if ds.is_finite() {
                for (q, &v) in qs.iter_mut().zip(x) {
                    *q = (v / ds).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
                return BlockQ8_0 {
                    d: f16::from_f32(ds),
                    qs,
                };
            }
        }
        BlockQ8_0 { d: d16, qs }
    }

    /// The 32 stored values `f32(d) · q_j` (in a store, of the rotated head).
    pub fn decode(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * f32::from(q);
        }
    }
}

/// One `q4_0` block: llama.cpp's 18-byte `block_q4_0`, byte for byte GGUF's `Q4_0`
/// (the scale `d` as little-endian f16 bytes, then 16 bytes of two 4-bit quants each:
/// value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble). In a
/// store its values are those of a rotated head, as `q8_0`'s.
pub use crate::backend::format::BlockQ4_0;

/// Quantises 32 values in llama.cpp's `Q4_0` layout (`quantize_row_q4_0_ref`; no
/// rotation: the codec rotates first): the scale `d = m / −8` from the value `m` of
/// largest magnitude, `q_j = min(15, trunc(x_j / d + 8.5))` against the f32 `d`
/// (0 when `d` is 0), stored `(q_j)` offset by 8.
pub fn q4_0_block(x: &[f32]) -> BlockQ4_0 {
    let x = &x[..Q8_0_BLOCK];
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `as u8` saturates (NaN → 0), as llama.cpp's `(int8_t)` conversion of an in-range
    // value truncates.
    let q = |v: f32| ((v * id + 8.5) as u8).min(15);
    let mut qs = [0u8; Q8_0_BLOCK / 2];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = q(x[j]) | (q(x[j + Q8_0_BLOCK / 2]) << 4);
    }
    BlockQ4_0 {
        d: f16::from_f32(d).to_bits().to_le_bytes(),
        qs,
    }
}

/// Rows of one element type, `[rows][units per row]`, with the typed storage behind it.
pub(super) struct Buf {
    /// Units per row.
    units: usize,
    data: Data,
}

enum Data {
    F32(Mem<f32>),
    F16(Mem<f16>),
    BF16(Mem<bf16>),
    Q8_0(Mem<BlockQ8_0>),
    Q4_0(Mem<BlockQ4_0>),
}

/// Applies `$body` to the vector inside a `Data`, whatever its type.
macro_rules! each {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => $body,
            Data::F16($v) => $body,
            Data::BF16($v) => $body,
            Data::Q8_0($v) => $body,
            Data::Q4_0($v) => $body,
        }
    };
}

impl Buf {
    /// `rows` zeroed rows of `kv_dim` values of type `ty` (`kv_dim` a multiple of 32 for
    /// `q8_0`, checked by the store's constructor).
    pub(super) fn zeroed(
        ty: KvType,
        kv_dim: usize,
        rows: usize,
        gate: &Gate,
    ) -> Result<Buf, KvError> {
        let units = ty.row_units(kv_dim);
        // The store checked `max_ctx · row bytes` fits, and `rows ≤` that many rows.
        let len = rows * units;
        let data = match ty {
            KvType::F32 => Data::F32(Mem::zeroed(gate, len)?),
            KvType::F16 => Data::F16(Mem::zeroed(gate, len)?),
            KvType::BF16 => Data::BF16(Mem::zeroed(gate, len)?),
            KvType::Q8_0 => Data::Q8_0(Mem::zeroed(gate, len)?),
            KvType::Q4_0 => Data::Q4_0(Mem::zeroed(gate, len)?),
        };
        Ok(Buf { units, data })
    }

    /// The element type.
    pub(super) fn kv_type(&self) -> KvType {
        match self.data {
            Data::F32(_) => KvType::F32,
            Data::F16(_) => KvType::F16,
            Data::BF16(_) => KvType::BF16,
            Data::Q8_0(_) => KvType::Q8_0,
            Data::Q4_0(_) => KvType::Q4_0,
        }
    }

    /// Rows held.
    pub(super) fn rows(&self) -> usize {
        let len = each!(&self.data, v => v.len());
        len.checked_div(self.units).unwrap_or(0)
    }

    /// Bytes allocated.
    pub(super) fn bytes(&self) -> usize {
        each!(&self.data, v => v.bytes())
    }

    /// Copies `n` rows of `src` (the same type and row size) from row `from` to row `to`.
    pub(super) fn copy_rows(&mut self, to: usize, src: &Buf, from: usize, n: usize) {
        let u = self.units;
        let (to, from, len) = (to * u, from * u, n * u);
        match (&mut self.data, &src.data) {
            (Data::F32(d), Data::F32(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            (Data::F16(d), Data::F16(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            (Data::BF16(d), Data::BF16(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            (Data::Q8_0(d), Data::Q8_0(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            (Data::Q4_0(d), Data::Q4_0(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),
            _ => unreachable!("rows are copied between buffers of one type"),
        }
    }

    /// Encodes `rows: [n, kv_dim]` f32 (any strides) of heads of `head_dim`, positions
    /// `pos ..`, into rows `at .. at + n` through `codec` (of this buffer's type and its
    /// model layer): keys of a calibrated `q8_0` codec are stored less their block's
    /// rotated key offset (`Q8_0(H k − t_b)`, `kv/offsets.rs`).
    pub(super) fn encode(
        &mut self,
        at: usize,
        rows: ArrayView2<'_, f32>,
        head_dim: usize,
        codec: LayerCodec<'_>,
        pos: usize,
    ) {
        debug_assert_eq!(codec.kv_type(), self.kv_type(), "the buffer's own codec");
        let (n, kv_dim) = rows.dim();
        let span = at * self.units..(at + n) * self.units;
        match &mut self.data {
            Data::F32(d) => ArrayViewMut2::from_shape((n, kv_dim), &mut d[span])
                .expect("the span holds n · kv_dim values")
                .assign(&rows),
            Data::F16(d) => {
                for (o, &x) in d[span].iter_mut().zip(rows.iter()) {
                    *o = f16::from_f32(x);
                }
            }
            Data::BF16(d) => {
                for (o, &x) in d[span].iter_mut().zip(rows.iter()) {
                    *o = bf16::from_f32(x);
                }
            }
            Data::Q8_0(d) => {
                encode_blocks(&mut d[span], rows, head_dim, codec, pos, BlockQ8_0::encode)
            }
            Data::Q4_0(d) => encode_blocks(&mut d[span], rows, head_dim, codec, pos, q4_0_block),
        }
    }

    /// Writes rows already in this buffer's type, `rows: [n, n_kv_heads, units per
    /// head]`, into rows `at .. at + n`. The caller checked the type and shape.
    pub(super) fn assign(&mut self, at: usize, rows: KvRows<'_>) {
        let span = at * self.units..(at + rows.len()) * self.units;
        match (&mut self.data, rows) {
            (Data::F32(d), KvRows::F32(r)) => fill(&mut d[span], r),
            (Data::F16(d), KvRows::F16(r)) => fill(&mut d[span], r),
            (Data::BF16(d), KvRows::BF16(r)) => fill(&mut d[span], r),
            (Data::Q8_0(d), KvRows::Q8_0(r)) => fill(&mut d[span], r),
            (Data::Q4_0(d), KvRows::Q4_0(r)) => fill(&mut d[span], r),
            _ => unreachable!("the caller checked the rows' type"),
        }
    }

    /// Rows `at .. at + n` as `[n, n_kv_heads, head_dim]` rows of this type.
    pub(super) fn view(&self, at: usize, n: usize, n_kv_heads: usize) -> KvRows<'_> {
        let span = at * self.units..(at + n) * self.units;
        let per_head = self.units.checked_div(n_kv_heads).unwrap_or(0);
        let shape = (n, n_kv_heads, per_head);
        let err = "the span holds n · n_kv_heads · units per head";
        match &self.data {
            Data::F32(d) => KvRows::F32(ArrayView3::from_shape(shape, &d[span]).expect(err)),
            Data::F16(d) => KvRows::F16(ArrayView3::from_shape(shape, &d[span]).expect(err)),
            Data::BF16(d) => KvRows::BF16(ArrayView3::from_shape(shape, &d[span]).expect(err)),
            Data::Q8_0(d) => KvRows::Q8_0(ArrayView3::from_shape(shape, &d[span]).expect(err)),
            Data::Q4_0(d) => KvRows::Q4_0(ArrayView3::from_shape(shape, &d[span]).expect(err)),
        }
    }
}

/// Encodes `rows: [n, kv_dim]` at positions `pos ..` into `out` (`n` rows of
/// `kv_dim / 32` blocks) through `codec` ([`encode_block_row`]), each block by `block`.
fn encode_blocks<B>(
    out: &mut [B],
    rows: ArrayView2<'_, f32>,
    head_dim: usize,
    codec: LayerCodec<'_>,
    pos: usize,
    block: impl Fn(&[f32]) -> B,
) {
    let kv_dim = rows.ncols();
    let mut y = vec![0f32; kv_dim];
    let units = kv_dim / Q8_0_BLOCK;
    for (t, (row, out)) in rows
        .axis_iter(Axis(0))
        .zip(out.chunks_exact_mut(units.max(1)))
        .enumerate()
    {
        y.iter_mut().zip(row.iter()).for_each(|(y, &x)| *y = x);
        encode_block_row(&mut y, head_dim, codec, pos + t, out, &block);
    }
}

/// Copies `rows` (any strides) into `dst`, row-major.
fn fill<T: Copy>(dst: &mut [T], rows: ArrayView3<'_, T>) {
    for (o, &x) in dst.iter_mut().zip(rows.iter()) {
        *o = x;
    }
}

/// Appends the stored units of `rows` (any strides, in logical order) to `out` in the
/// type's little-endian file layout (the bytes of the GGUF format of [`KvType::dtype`]),
/// calling `flush` whenever `out` holds at least `chunk` bytes.
pub(super) fn rows_le<E>(
    rows: KvRows<'_>,
    out: &mut Vec<u8>,
    chunk: usize,
    mut flush: impl FnMut(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    fn each<'a, T: 'a, E>(
        units: impl Iterator<Item = &'a T>,
        out: &mut Vec<u8>,
        chunk: usize,
        flush: &mut impl FnMut(&mut Vec<u8>) -> Result<(), E>,
        put: impl Fn(&T, &mut Vec<u8>),
    ) -> Result<(), E> {
        for u in units {
            put(u, out);
            if out.len() >= chunk {
                flush(out)?;
            }
        }
        Ok(())
    }
    let f = &mut flush;
    match rows {
        KvRows::F32(a) => each(a.iter(), out, chunk, f, |v, b| {
            b.extend_from_slice(&v.to_le_bytes())
        }),
        KvRows::F16(a) => each(a.iter(), out, chunk, f, |v, b| {
            b.extend_from_slice(&v.to_bits().to_le_bytes())
        }),
        KvRows::BF16(a) => each(a.iter(), out, chunk, f, |v, b| {
            b.extend_from_slice(&v.to_bits().to_le_bytes())
        }),
        KvRows::Q8_0(a) => each(a.iter(), out, chunk, f, |v, b| {
            b.extend_from_slice(&v.d.to_bits().to_le_bytes());
            b.extend(v.qs.iter().map(|&q| q as u8));
        }),
        KvRows::Q4_0(a) => each(a.iter(), out, chunk, f, |v, b| {
            b.extend_from_slice(bytemuck::bytes_of(v))
        }),
    }
}

/// Rows of one element type read back from their little-endian file layout
/// ([`rows_le`]): an owned buffer, refilled for each layer.
pub(crate) struct StoredRows {
    data: Stored,
}

enum Stored {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
}

impl StoredRows {
    /// An empty buffer of rows of `ty`.
    pub(super) fn new(ty: KvType) -> StoredRows {
        let data = match ty {
            KvType::F32 => Stored::F32(Vec::new()),
            KvType::F16 => Stored::F16(Vec::new()),
            KvType::BF16 => Stored::BF16(Vec::new()),
            KvType::Q8_0 => Stored::Q8_0(Vec::new()),
            KvType::Q4_0 => Stored::Q4_0(Vec::new()),
        };
        StoredRows { data }
    }

    /// Refills the buffer with `rows` rows of `kv_dim` values (a whole number of units:
    /// the caller checked): `read` fills their bytes, in the file layout.
    pub(crate) fn read<E>(
        &mut self,
        rows: usize,
        kv_dim: usize,
        read: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        fn fill<T: Pod, E>(
            v: &mut Vec<T>,
            len: usize,
            read: impl FnOnce(&mut [u8]) -> Result<(), E>,
            from_le: impl Fn(&mut T),
        ) -> Result<(), E> {
            v.clear();
            v.resize(len, T::zeroed());
            read(bytemuck::cast_slice_mut(v))?;
            v.iter_mut().for_each(from_le);
            Ok(())
        }
        match &mut self.data {
            Stored::F32(v) => fill(v, rows * kv_dim, read, |x| {
                *x = f32::from_bits(u32::from_le(x.to_bits()))
            }),
            Stored::F16(v) => fill(v, rows * kv_dim, read, |x| {
                *x = f16::from_bits(u16::from_le(x.to_bits()))
            }),
            Stored::BF16(v) => fill(v, rows * kv_dim, read, |x| {
                *x = bf16::from_bits(u16::from_le(x.to_bits()))
            }),
            Stored::Q8_0(v) => fill(v, rows * (kv_dim / Q8_0_BLOCK), read, |b| {
                b.d = f16::from_bits(u16::from_le(b.d.to_bits()))
            }),
            // Bytes only: the scale stays in its little-endian bytes.
            Stored::Q4_0(v) => fill(v, rows * (kv_dim / Q8_0_BLOCK), read, |_| {}),
        }
    }

    /// The rows read, `[rows, n_kv_heads, head_dim]`.
    pub(crate) fn view(&self, rows: usize, n_kv_heads: usize, head_dim: usize) -> KvRows<'_> {
        let err = "the buffer holds rows · kv_dim values";
        let shape = (rows, n_kv_heads, head_dim);
        match &self.data {
            Stored::F32(v) => KvRows::F32(ArrayView3::from_shape(shape, v).expect(err)),
            Stored::F16(v) => KvRows::F16(ArrayView3::from_shape(shape, v).expect(err)),
            Stored::BF16(v) => KvRows::BF16(ArrayView3::from_shape(shape, v).expect(err)),
            Stored::Q8_0(v) => {
                let shape = (rows, n_kv_heads, head_dim / Q8_0_BLOCK);
                KvRows::Q8_0(ArrayView3::from_shape(shape, v).expect(err))
            }
            Stored::Q4_0(v) => {
                let shape = (rows, n_kv_heads, head_dim / Q8_0_BLOCK);
                KvRows::Q4_0(ArrayView3::from_shape(shape, v).expect(err))
            }
        }
    }
}
