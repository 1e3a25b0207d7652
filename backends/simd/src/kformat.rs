//! The weight formats and the loops over their blocks, written once for every
//! architecture.
//!
//! Each architecture implements [`Blocks`] on its kernel token, over its f32 lanes
//! ([`F32Lanes`]), with the microkernels that truly differ (decode one block or chunk of
//! a format to f32 lanes, the absolute maximum and rounding of the 8-bit quantiser, its
//! own row loop for the 32-weight formats). The loops here — GEMV over rows and blocks, the plain formats'
//! dot product, dequantize, the `Q8_0`/`Q8_K` activation quantiser — are generic over it
//! and `#[inline(always)]`, so each is compiled inside the architecture's
//! `#[target_feature]` entry point, one copy per architecture.
//!
//! The accumulation order of every loop is fixed here and is each architecture's
//! previous one (the tests hold the SIMD paths to the scalar reference within bounds and
//! the decoders and quantiser to it bit for bit):
//! - plain formats (`F32`, `F16`, `BF16`): four vector accumulators over `4·N`
//!   weights a step, then steps of 8 weights into the first `8 / N`, the four added
//!   pairwise, the lanes summed, the tail added one by one;
//! - `Q5_0`, `Q4_K`, `Q6_K`: each 32-weight chunk decoded, vector `v` into accumulator
//!   `v mod 4`, the four added pairwise and the lanes summed;
//! - dequantize: every weight with the scalar decoder's roundings (`d·q`, then `+ m`).

use crate::lanes::F32Lanes;
use kvcore::backend::q8::Q8_MAX;
use kvcore::backend::{DType, Q8Layout, QK, QK_K, Weights};

/// `Q5_0`, `Q4_K` or `Q6_K`: the formats each architecture's `kquant.rs` decodes chunk
/// by chunk ([`Blocks::chunk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub(crate) enum Format {
    Q5_0,
    Q4_K,
    Q6_K,
}

impl Format {
    /// The format of `dtype`, if a `kquant.rs` decodes it.
    pub(crate) fn of(dtype: DType) -> Option<Format> {
        match dtype {
            DType::Q5_0 => Some(Format::Q5_0),
            DType::Q4_K => Some(Format::Q4_K),
            DType::Q6_K => Some(Format::Q6_K),
            _ => None,
        }
    }

    /// The format's `DType`.
    pub(crate) fn dtype(self) -> DType {
        match self {
            Format::Q5_0 => DType::Q5_0,
            Format::Q4_K => DType::Q4_K,
            Format::Q6_K => DType::Q6_K,
        }
    }
}

/// `Q8_0`, `Q4_0` or `Q4_1`: 32-weight blocks of an f16 scale `d` (and, for `Q4_1`, an
/// f16 offset `m`) and 8- or 4-bit quants, decoded whole by [`Blocks::block`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[allow(non_camel_case_types, reason = "the ggml names of the formats")]
pub(crate) enum Block {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl Block {
    /// The format of `dtype`, if it is one of these.
    #[inline(always)]
    pub(crate) fn of(dtype: DType) -> Option<Block> {
        match dtype {
            DType::Q8_0 => Some(Block::Q8_0),
            DType::Q4_0 => Some(Block::Q4_0),
            DType::Q4_1 => Some(Block::Q4_1),
            _ => None,
        }
    }

    /// Bytes per block.
    #[inline(always)]
    pub(crate) const fn bytes(self) -> usize {
        match self {
            Block::Q8_0 => DType::Q8_0,
            Block::Q4_0 => DType::Q4_0,
            Block::Q4_1 => DType::Q4_1,
        }
        .block_bytes()
    }
}

/// Plain-format codes for the const-generic decoders.
pub(crate) const F32: u8 = 0;
pub(crate) const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

/// Bytes per element of plain format `FMT`.
pub(crate) const fn width<const FMT: u8>() -> usize {
    if FMT == F32 { 4 } else { 2 }
}

/// The little-endian f16 at `b[at..at + 2]`, widened (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One weight of plain format `FMT` from `b[0..width]`, widened to f32 (exact).
#[inline(always)]
pub(crate) fn widen1<const FMT: u8>(b: &[u8]) -> f32 {
    match FMT {
        F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => f16_at(b, 0),
        _ => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
    }
}

/// An architecture's block microkernels (module docs), over its f32 lanes
/// ([`F32Lanes`]). Implemented on the architecture's kernel token, whose existence proves
/// the CPU runs them; every method is `#[inline(always)]`, so the generic loops below
/// compile inside the architecture's `#[target_feature]` entry points.
pub(crate) trait Blocks: F32Lanes {
    /// 32 weights as `32 / N` vectors, in order.
    type Chunk: Copy + AsRef<[Self::V]>;
    /// 8 weights as `8 / N` vectors, in order.
    type Eight: Copy + AsRef<[Self::V]>;

    /// Eight weights of plain format `FMT` from `b[0 .. 8·width]`, widened (exact).
    fn widen8<const FMT: u8>(self, b: &[u8]) -> Self::Eight;
    /// One stored block of `fmt` as `(quants, d, m)`; `m = 0` but for `Q4_1`.
    fn block(self, fmt: Block, b: &[u8]) -> (Self::Chunk, f32, f32);
    /// Chunk `c` (weights `32c..32c + 32`) of the stored block `b` of `fmt`, decoded bit
    /// for bit as the scalar decoder.
    fn chunk(self, fmt: Format, b: &[u8], c: usize) -> Self::Chunk;
    /// Before row `i` of `data` (rows of `rb` bytes): the architecture's prefetch.
    fn touch_row(self, data: &[u8], rb: usize, i: usize);
    /// Before decoding the block at `bytes[at..]`: the architecture's prefetch.
    #[inline(always)]
    fn touch_block(self, bytes: &[u8], at: usize) {
        let _ = (bytes, at);
    }
    /// `y ← W x` for `w` of `fmt`, the architecture's own row loop (`sums`: the
    /// per-block `Σ x_j`, for `Q4_1`).
    fn gemv_blocks(self, fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]);

    /// Whether none of `x` (a multiple of 16 values) is NaN or infinite, and the largest
    /// `|x|` (exact; only meaningful when all are finite).
    fn abs_max(self, x: &[f32]) -> (bool, f32);
    /// `q[0..16] ← min(round(x_j·factor), 127)` (to nearest, ties to even; the caller
    /// guarantees `|x_j·factor| ≤ 128`), returning `Σ q_j`.
    fn quantize16(self, x: &[f32], factor: f32, q: &mut [i8]) -> i32;
}

/// The loops of this module instantiated in one architecture's target features:
/// `block_loops!(Token, #[target_feature(enable = "…")])` implements it (as
/// `lanes::f32_loops!` does the f32 loops), and the `Kernel` trait's weight methods call
/// these entry points.
///
/// # Safety (every method)
/// The CPU runs the architecture's instructions: a token exists (see `F32Lanes`).
pub(crate) trait BlockLoops: Blocks {
    /// [`gemv`].
    unsafe fn run_gemv(self, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]);
    /// [`dequantize`].
    unsafe fn run_dequantize(self, dtype: DType, bytes: &[u8], out: &mut [f32]);
    /// [`quantize`].
    unsafe fn run_quantize(
        self,
        layout: Q8Layout,
        x: &[f32],
        scales: &mut [f32],
        sums: &mut [i32],
        values: &mut [i8],
    );
}

/// `impl BlockLoops for $token`, every loop inlined into a method carrying `$attr` (the
/// architecture's `#[target_feature]`, or nothing where the features are compiled in).
macro_rules! block_loops {
    ($token:ty $(, #[$attr:meta])*) => {
        impl $crate::kformat::BlockLoops for $token {
            $(#[$attr])*
            unsafe fn run_gemv(
                self,
                w: &kvcore::backend::Weights<'_>,
                x: &[f32],
                sums: &[f32],
                y: &mut [f32],
            ) {
                $crate::kformat::gemv(self, w, x, sums, y)
            }
            $(#[$attr])*
            unsafe fn run_dequantize(
                self,
                dtype: kvcore::backend::DType,
                bytes: &[u8],
                out: &mut [f32],
            ) {
                $crate::kformat::dequantize(self, dtype, bytes, out)
            }
            $(#[$attr])*
            unsafe fn run_quantize(
                self,
                layout: kvcore::backend::Q8Layout,
                x: &[f32],
                scales: &mut [f32],
                sums: &mut [i32],
                values: &mut [i8],
            ) {
                $crate::kformat::quantize(self, layout, x, scales, sums, values)
            }
        }
    };
}
pub(crate) use block_loops;

/// The shape checks every GEMV starts with (`x: [cols]`, `y: [rows]`): `w`'s row bytes,
/// or `None` with `y` zeroed when the rows are empty.
///
/// # Panics
/// If the shapes do not fit.
#[inline(always)]
pub(crate) fn gemv_start(w: &Weights<'_>, x_len: usize, y: &mut [f32]) -> Option<usize> {
    assert!(x_len == w.cols() && y.len() == w.rows());
    let rb = w.row_bytes();
    if rb == 0 {
        y.fill(0.0);
        return None;
    }
    Some(rb)
}

/// `y ← W x` for every weight format (`sums: [cols / 32]`, the per-block `Σ x_j`, read
/// for `Q4_1`).
///
/// # Panics
/// If the shapes do not fit.
#[inline(always)]
pub(crate) fn gemv<L: Blocks>(l: L, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
    let Some(rb) = gemv_start(w, x.len(), y) else {
        return;
    };
    let dtype = w.dtype();
    // One loop per format, each with its format a constant in the inlined kernels.
    match (Format::of(dtype), Block::of(dtype)) {
        (Some(Format::Q5_0), _) => return gemv_chunks(l, Format::Q5_0, w, x, y),
        (Some(Format::Q4_K), _) => return gemv_chunks(l, Format::Q4_K, w, x, y),
        (Some(Format::Q6_K), _) => return gemv_chunks(l, Format::Q6_K, w, x, y),
        (_, Some(Block::Q8_0)) => return l.gemv_blocks(Block::Q8_0, w, x, sums, y),
        (_, Some(Block::Q4_0)) => return l.gemv_blocks(Block::Q4_0, w, x, sums, y),
        (_, Some(Block::Q4_1)) => return l.gemv_blocks(Block::Q4_1, w, x, sums, y),
        _ => {}
    }
    let data = w.data();
    for (i, (r, yr)) in data.chunks_exact(rb).zip(y.iter_mut()).enumerate() {
        l.touch_row(data, rb, i);
        *yr = match dtype {
            DType::F32 => dot_plain::<L, F32>(l, r, x),
            DType::F16 => dot_plain::<L, F16>(l, r, x),
            DType::BF16 => dot_plain::<L, BF16>(l, r, x),
            other => kvcore_scalar::quant::unsupported(other),
        };
    }
}

/// `Σ_j w_j x_j` for one row of plain format `FMT` (module docs).
///
/// # Panics
/// If `row` does not hold `x.len()` elements.
#[inline(always)]
fn dot_plain<L: Blocks, const FMT: u8>(l: L, row: &[u8], x: &[f32]) -> f32 {
    let wd = width::<FMT>();
    assert_eq!(row.len(), x.len() * wd);
    let (n, lanes) = (x.len(), L::N);
    let mut acc = [l.zero(); 4];
    let mut i = 0;
    while i + 4 * lanes <= n {
        for g in 0..lanes / 2 {
            let j = i + 8 * g;
            let e = l.widen8::<FMT>(&row[j * wd..]);
            for (k, &v) in e.as_ref().iter().enumerate() {
                let a = g * (8 / lanes) + k;
                acc[a] = l.mul_add(acc[a], v, l.load(&x[j + lanes * k..]));
            }
        }
        i += 4 * lanes;
    }
    while i + 8 <= n {
        let e = l.widen8::<FMT>(&row[i * wd..]);
        for (k, &v) in e.as_ref().iter().enumerate() {
            acc[k] = l.mul_add(acc[k], v, l.load(&x[i + lanes * k..]));
        }
        i += 8;
    }
    let v = l.add(l.add(acc[0], acc[1]), l.add(acc[2], acc[3]));
    let mut s = l.hsum(v);
    for j in i..n {
        s += widen1::<FMT>(&row[j * wd..]) * x[j];
    }
    s
}

/// `y ← W x` for `w` of `fmt`, row by row ([`dot_chunks`]).
#[inline(always)]
fn gemv_chunks<L: Blocks>(l: L, fmt: Format, w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    assert_eq!(w.dtype(), fmt.dtype());
    let (data, rb) = (w.data(), w.row_bytes());
    for (i, (r, yr)) in data.chunks_exact(rb).zip(y.iter_mut()).enumerate() {
        l.touch_row(data, rb, i);
        *yr = dot_chunks(l, fmt, r, x);
    }
}

/// `Σ_j w_j x_j` for one row of `fmt` (module docs).
///
/// # Panics
/// If `row` does not hold `x.len()` weights.
#[inline(always)]
fn dot_chunks<L: Blocks>(l: L, fmt: Format, row: &[u8], x: &[f32]) -> f32 {
    let dtype = fmt.dtype();
    assert_eq!(Some(row.len()), dtype.row_bytes(x.len()));
    let mut acc = [l.zero(); 4];
    for (b, xb) in row
        .chunks_exact(dtype.block_bytes())
        .zip(x.chunks_exact(dtype.block_len()))
    {
        for (c, xc) in xb.chunks_exact(QK).enumerate() {
            for (v, &w) in l.chunk(fmt, b, c).as_ref().iter().enumerate() {
                acc[v % 4] = l.mul_add(acc[v % 4], w, l.load(&xc[L::N * v..]));
            }
        }
    }
    l.hsum(l.add(l.add(acc[0], acc[1]), l.add(acc[2], acc[3])))
}

/// Decode `out.len()` weights of `dtype` from `bytes`, bit for bit as the scalar decoder.
///
/// # Panics
/// If `bytes` is not exactly `dtype.row_bytes(out.len())` long.
#[inline(always)]
pub(crate) fn dequantize<L: Blocks>(l: L, dtype: DType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(Some(bytes.len()), dtype.row_bytes(out.len()));
    match dtype {
        DType::F32 => decode_plain::<L, F32>(l, bytes, out),
        DType::F16 => decode_plain::<L, F16>(l, bytes, out),
        DType::BF16 => decode_plain::<L, BF16>(l, bytes, out),
        DType::Q8_0 => decode_blocks(l, Block::Q8_0, bytes, out),
        DType::Q4_0 => decode_blocks(l, Block::Q4_0, bytes, out),
        DType::Q4_1 => decode_blocks(l, Block::Q4_1, bytes, out),
        DType::Q5_0 => decode_chunks(l, Format::Q5_0, bytes, out),
        DType::Q4_K => decode_chunks(l, Format::Q4_K, bytes, out),
        DType::Q6_K => decode_chunks(l, Format::Q6_K, bytes, out),
        other => kvcore_scalar::quant::unsupported(other),
    }
}

/// Decode plain format `FMT` from `bytes` into `out`.
#[inline(always)]
fn decode_plain<L: Blocks, const FMT: u8>(l: L, bytes: &[u8], out: &mut [f32]) {
    let wd = width::<FMT>();
    let mut oc = out.chunks_exact_mut(8);
    let mut bc = bytes.chunks_exact(8 * wd);
    for (o, b) in oc.by_ref().zip(bc.by_ref()) {
        for (k, &v) in l.widen8::<FMT>(b).as_ref().iter().enumerate() {
            l.store(&mut o[L::N * k..], v);
        }
    }
    for (o, b) in oc
        .into_remainder()
        .iter_mut()
        .zip(bc.remainder().chunks_exact(wd))
    {
        *o = widen1::<FMT>(b);
    }
}

/// Decode `fmt` from `bytes` into `out`: `d·q` (`+ m`), each rounded.
#[inline(always)]
fn decode_blocks<L: Blocks>(l: L, fmt: Block, bytes: &[u8], out: &mut [f32]) {
    let bs = fmt.bytes();
    for (i, (b, o)) in bytes
        .chunks_exact(bs)
        .zip(out.chunks_exact_mut(QK))
        .enumerate()
    {
        l.touch_block(bytes, i * bs);
        let (q, d, m) = l.block(fmt, b);
        let (dv, mv) = (l.splat(d), l.splat(m));
        for (k, &lane) in q.as_ref().iter().enumerate() {
            let w = l.mul(dv, lane);
            let w = if fmt == Block::Q4_1 { l.add(w, mv) } else { w };
            l.store(&mut o[L::N * k..], w);
        }
    }
}

/// Decode `fmt` from `bytes` into `out`, chunk by chunk.
#[inline(always)]
fn decode_chunks<L: Blocks>(l: L, fmt: Format, bytes: &[u8], out: &mut [f32]) {
    let dtype = fmt.dtype();
    for (b, ob) in bytes
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(dtype.block_len()))
    {
        for (c, oc) in ob.chunks_exact_mut(QK).enumerate() {
            for (v, &w) in l.chunk(fmt, b, c).as_ref().iter().enumerate() {
                l.store(&mut oc[L::N * v..], w);
            }
        }
    }
}

/// Quantises `x` in `layout` into `(scales, sums, values)`, bit for bit as
/// `Q8Acts::quantize`: per block the absolute maximum ([`Blocks::abs_max`]), the
/// reference's special cases for non-finite and tiny blocks, the factor in scalar f32
/// (`Q8_0`: `1/d`, `d = amax/127`; `Q8_K`: `iscale = −127/max`, `max` the first value of
/// largest magnitude), then 16 values at a time ([`Blocks::quantize16`]); the sums are
/// integers (exact in any order).
///
/// # Panics
/// If the lengths are not those `Q8Acts::fill` sizes for `layout` and `x.len()`.
#[inline(always)]
pub(crate) fn quantize<L: Blocks>(
    l: L,
    layout: Q8Layout,
    x: &[f32],
    scales: &mut [f32],
    sums: &mut [i32],
    values: &mut [i8],
) {
    let (block, per) = (layout.block_len(), layout.block_len() / layout.sum_len());
    assert!(x.len() == values.len() && x.len() == scales.len() * block);
    assert_eq!(sums.len(), scales.len() * per);
    let blocks = x
        .chunks_exact(block)
        .zip(values.chunks_exact_mut(block))
        .zip(scales.iter_mut().zip(sums.chunks_exact_mut(per)));
    for ((xb, qb), (d, s)) in blocks {
        let (finite, amax) = l.abs_max(xb);
        if !finite || amax / Q8_MAX < f32::MIN_POSITIVE {
            qb.fill(0);
            s.fill(0);
            *d = if finite { 0.0 } else { f32::NAN };
            continue;
        }
        let (factor, scale) = match layout {
            Q8Layout::Q8_0 => {
                let dd = amax / Q8_MAX;
                (1.0 / dd, dd)
            }
            Q8Layout::Q8_K => {
                let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
                let iscale = -Q8_MAX / max;
                (iscale, 1.0 / iscale)
            }
        };
        let mut group_sums = [0i32; QK_K / 16];
        for ((xg, qg), gs) in xb
            .chunks_exact(16)
            .zip(qb.chunks_exact_mut(16))
            .zip(group_sums.iter_mut())
        {
            *gs = l.quantize16(xg, factor, qg);
        }
        let groups = layout.sum_len() / 16;
        for (sj, g) in s.iter_mut().zip(group_sums.chunks_exact(groups)) {
            *sj = g.iter().sum();
        }
        *d = scale;
    }
}
