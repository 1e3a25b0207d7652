//! NEON GEMV and decoding on the stored bytes of every weight format.
//!
//! Decoding (shared by the GEMV and by `dequantize`): each 32-weight block becomes eight
//! 4-lane f32 vectors holding weights `0..4, 4..8, …, 28..32`.
//! - `Q4_*`: the 16 packed bytes are split into low nibbles (weights `0..16`) and high
//!   nibbles (`16..32`) with a mask and a shift, `Q4_0`'s offset 8 is subtracted in 8-bit
//!   integers (exact), then widened 8 → 16 → 32 bits and converted to f32 (exact).
//! - `Q8_0`: the signed bytes widened and converted the same way.
//! - `F16`: widened in integer lanes (`f16` arithmetic is not stable in Rust):
//!   `(h & 0x7fff) << 13` reinterpreted as f32 and multiplied by `2^112` rebases the
//!   exponent exactly for normal and subnormal values; infinities and NaNs (exponent
//!   31) get the f32 exponent 255 (NaNs made quiet, as the `half` crate does); the sign
//!   bit is moved to bit 31. `BF16`: shifted left by 16. `F32`: a byte load.
//!
//! GEMV numerics, per row: for block `b` with scale `d`, the 32 products `q_j·x_j` are
//! summed in a 4-lane vector (two chains, one multiply and three FMAs each, then an
//! add), and `acc_{b mod 2} ← acc_{b mod 2} + d·t` (FMA; two accumulators so consecutive
//! blocks do not wait on each other); at the end the accumulators and lanes are summed.
//! `Q4_1` uses `Σ_j (d·q_j + m)·x_j = d·Σ_j q_j x_j + m·Σ_j x_j` with the per-block
//! `Σ x_j` precomputed once per call, adding `m·Σx` in a scalar accumulator. Compared with
//! the scalar reference only the rounding differs (order of the sum, fused
//! multiply-adds, `Q4_1`'s factored form: error `≤ γ·Σ_j (|d·q_j| + |m|)·|x_j|`). The
//! plain formats use `dot.rs`'s order (four 4-lane accumulators).
//!
//! `dequantize` computes `d·q` (then `+ m` for `Q4_1`) with separately rounded
//! multiplies and adds, bit for bit as the scalar decoder.
//!
//! `Q5_0`, `Q4_K` and `Q6_K` are decoded and multiplied in `kquant.rs`.

use super::dot::{load, store};
use super::kquant::{self, Format};
use half::f16;
use kvcore::backend::{DType, QK, Weights};
use std::arch::aarch64::*;

/// Plain-format codes for the const-generic decoders.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// The little-endian f16 at `b[at..at + 2]`, widened (a block scale or offset).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Bytes per element of plain format `FMT`.
const fn width<const FMT: u8>() -> usize {
    if FMT == F32 { 4 } else { 2 }
}

/// Sixteen bytes from `b[0..16]`.
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
fn load_bytes(b: &[u8]) -> uint8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: 16 bytes are in bounds (asserted); bytes have no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// Four f16 bit patterns (in u32 lanes) widened exactly to f32 (see the module docs).
#[inline]
#[target_feature(enable = "neon")]
fn f16x4_to_f32(w: uint32x4_t) -> float32x4_t {
    let sign = vshlq_n_u32::<16>(vandq_u32(w, vdupq_n_u32(0x8000)));
    let em = vshlq_n_u32::<13>(vandq_u32(w, vdupq_n_u32(0x7fff)));
    let rebased = vmulq_f32(
        vreinterpretq_f32_u32(em),
        vdupq_n_f32(f32::from_bits(0x7780_0000)),
    );
    let exp_all_ones = vceqq_u32(vandq_u32(w, vdupq_n_u32(0x7c00)), vdupq_n_u32(0x7c00));
    let quiet = vandq_u32(vtstq_u32(w, vdupq_n_u32(0x03ff)), vdupq_n_u32(0x0040_0000));
    let special = vorrq_u32(vorrq_u32(em, vdupq_n_u32(0x7f80_0000)), quiet);
    let bits = vbslq_u32(exp_all_ones, special, vreinterpretq_u32_f32(rebased));
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// Eight weights of plain format `FMT` from `b[0 .. 8·width]`, widened to f32.
///
/// # Panics
/// If `b` is shorter than 8 elements.
#[inline]
#[target_feature(enable = "neon")]
fn widen8<const FMT: u8>(b: &[u8]) -> [float32x4_t; 2] {
    if FMT == F32 {
        return [
            vreinterpretq_f32_u8(load_bytes(&b[..16])),
            vreinterpretq_f32_u8(load_bytes(&b[16..32])),
        ];
    }
    let h = vreinterpretq_u16_u8(load_bytes(b));
    if FMT == F16 {
        [
            f16x4_to_f32(vmovl_u16(vget_low_u16(h))),
            f16x4_to_f32(vmovl_high_u16(h)),
        ]
    } else {
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
        ]
    }
}

/// One weight of plain format `FMT` from `b[0..width]`, widened to f32.
fn widen1<const FMT: u8>(b: &[u8]) -> f32 {
    match FMT {
        F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => f16_at(b, 0),
        _ => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
    }
}

/// Sixteen signed bytes converted to f32, in order, as four vectors.
#[inline]
#[target_feature(enable = "neon")]
fn i8x16_to_f32(v: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(v));
    let hi = vmovl_high_s8(v);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

/// Concatenate two groups of four vectors.
#[target_feature(enable = "neon")]
fn join(a: [float32x4_t; 4], b: [float32x4_t; 4]) -> [float32x4_t; 8] {
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// The 32 nibbles of a `Q4_*` block (`qs[0..16]`) minus `OFFSET`, as eight f32 vectors.
#[inline]
#[target_feature(enable = "neon")]
fn q4_lanes<const OFFSET: i8>(qs: &[u8]) -> [float32x4_t; 8] {
    let v = load_bytes(qs);
    let off = vdupq_n_s8(OFFSET);
    let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), off);
    let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)), off);
    join(i8x16_to_f32(lo), i8x16_to_f32(hi))
}

/// The 32 signed bytes of a `Q8_0` block (`qs[0..32]`) as eight f32 vectors.
#[inline]
#[target_feature(enable = "neon")]
fn q8_lanes(qs: &[u8]) -> [float32x4_t; 8] {
    let a = vreinterpretq_s8_u8(load_bytes(&qs[..16]));
    let b = vreinterpretq_s8_u8(load_bytes(&qs[16..32]));
    join(i8x16_to_f32(a), i8x16_to_f32(b))
}

/// `Σ_j q_j·x_j` of one block as a 4-lane vector (lanes still to be summed).
#[inline]
#[target_feature(enable = "neon")]
fn block_dot(q: [float32x4_t; 8], x: &[f32]) -> float32x4_t {
    let mut p0 = vmulq_f32(q[0], load(&x[0..]));
    let mut p1 = vmulq_f32(q[1], load(&x[4..]));
    for l in (2..8).step_by(2) {
        p0 = vfmaq_f32(p0, q[l], load(&x[4 * l..]));
        p1 = vfmaq_f32(p1, q[l + 1], load(&x[4 * l + 4..]));
    }
    vaddq_f32(p0, p1)
}

/// The block format of a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl Block {
    /// Decode one stored block into `(lanes, d, m)`; `m = 0` except for `Q4_1`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn decode(self, b: &[u8]) -> ([float32x4_t; 8], f32, f32) {
        match self {
            Block::Q8_0 => (q8_lanes(&b[2..]), f16_at(b, 0), 0.0),
            Block::Q4_0 => (q4_lanes::<8>(&b[2..]), f16_at(b, 0), 0.0),
            Block::Q4_1 => (q4_lanes::<0>(&b[4..]), f16_at(b, 0), f16_at(b, 2)),
        }
    }

    fn bytes(self) -> usize {
        match self {
            Block::Q8_0 => DType::Q8_0,
            Block::Q4_0 => DType::Q4_0,
            Block::Q4_1 => DType::Q4_1,
        }
        .block_bytes()
    }
}

/// `Σ_j w_j x_j` for one row of block format `fmt` (see the module docs).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks or (`Q4_1`) `sums` is shorter than that.
#[inline]
#[target_feature(enable = "neon")]
fn dot_blocks(fmt: Block, row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    assert_eq!(row.len(), x.len() / QK * fmt.bytes());
    // Two chains, even blocks and odd ones, swapped in registers after each block (on
    // x86 an array indexed by `i & 1` was kept in memory; wasm32 keeps the array, which
    // its JITs run faster).
    let (mut now, mut next) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut offsets = 0.0f32;
    let blocks = row.chunks_exact(fmt.bytes()).zip(x.chunks_exact(QK));
    for (i, (b, xb)) in blocks.enumerate() {
        let (q, d, m) = fmt.decode(b);
        let t = block_dot(q, xb);
        let done = vfmaq_f32(now, vdupq_n_f32(d), t);
        (now, next) = (next, done);
        if fmt == Block::Q4_1 {
            offsets += m * sums[i];
        }
    }
    vaddvq_f32(vaddq_f32(now, next)) + offsets
}

/// `Σ_j w_j x_j` for one row of plain format `FMT`: `dot.rs`'s order.
///
/// # Panics
/// If `row` does not hold `x.len()` elements.
#[inline]
#[target_feature(enable = "neon")]
fn dot_plain<const FMT: u8>(row: &[u8], x: &[f32]) -> f32 {
    let wd = width::<FMT>();
    assert_eq!(row.len(), x.len() * wd);
    let n = x.len();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        let [a, b] = widen8::<FMT>(&row[i * wd..]);
        let [c, d] = widen8::<FMT>(&row[(i + 8) * wd..]);
        acc[0] = vfmaq_f32(acc[0], a, load(&x[i..]));
        acc[1] = vfmaq_f32(acc[1], b, load(&x[i + 4..]));
        acc[2] = vfmaq_f32(acc[2], c, load(&x[i + 8..]));
        acc[3] = vfmaq_f32(acc[3], d, load(&x[i + 12..]));
        i += 16;
    }
    while i + 8 <= n {
        let [a, b] = widen8::<FMT>(&row[i * wd..]);
        acc[0] = vfmaq_f32(acc[0], a, load(&x[i..]));
        acc[1] = vfmaq_f32(acc[1], b, load(&x[i + 4..]));
        i += 8;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut s = vaddvq_f32(v);
    for j in i..n {
        s += widen1::<FMT>(&row[j * wd..]) * x[j];
    }
    s
}

/// `y ← W x`, one row at a time (the per-row format match is loop-invariant).
///
/// # Panics
/// If the shapes do not fit (`x: [cols]`, `y: [rows]`, `sums: [cols / 32]` for `Q4_1`).
#[target_feature(enable = "neon")]
pub(super) fn gemv(w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
    assert!(x.len() == w.cols() && y.len() == w.rows());
    let rb = w.row_bytes();
    if rb == 0 {
        y.fill(0.0);
        return;
    }
    let dtype = w.dtype();
    if let Some(fmt) = Format::of(dtype) {
        return kquant::gemv(fmt, w, x, y);
    }
    for (r, yr) in w.data().chunks_exact(rb).zip(y.iter_mut()) {
        *yr = match dtype {
            DType::F32 => dot_plain::<F32>(r, x),
            DType::F16 => dot_plain::<F16>(r, x),
            DType::BF16 => dot_plain::<BF16>(r, x),
            DType::Q8_0 => dot_blocks(Block::Q8_0, r, x, sums),
            DType::Q4_0 => dot_blocks(Block::Q4_0, r, x, sums),
            DType::Q4_1 => dot_blocks(Block::Q4_1, r, x, sums),
            other => kvcore_scalar::quant::unsupported(other),
        };
    }
}

/// Decode plain format `FMT` from `bytes` into `out`.
#[target_feature(enable = "neon")]
fn decode_plain<const FMT: u8>(bytes: &[u8], out: &mut [f32]) {
    let wd = width::<FMT>();
    let mut oc = out.chunks_exact_mut(8);
    let mut bc = bytes.chunks_exact(8 * wd);
    for (o, b) in oc.by_ref().zip(bc.by_ref()) {
        let [lo, hi] = widen8::<FMT>(b);
        store(&mut o[..4], lo);
        store(&mut o[4..], hi);
    }
    for (o, b) in oc
        .into_remainder()
        .iter_mut()
        .zip(bc.remainder().chunks_exact(wd))
    {
        *o = widen1::<FMT>(b);
    }
}

/// Decode block format `fmt` from `bytes` into `out`: `d·q` (`+ m`), each rounded.
#[target_feature(enable = "neon")]
fn decode_blocks(fmt: Block, bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(fmt.bytes())
        .zip(out.chunks_exact_mut(QK))
    {
        let (q, d, m) = fmt.decode(b);
        let (dv, mv) = (vdupq_n_f32(d), vdupq_n_f32(m));
        for (l, lane) in q.into_iter().enumerate() {
            let w = vmulq_f32(dv, lane);
            let w = if fmt == Block::Q4_1 {
                vaddq_f32(w, mv)
            } else {
                w
            };
            store(&mut o[4 * l..], w);
        }
    }
}

/// Decode `out.len()` weights of `dtype` from `bytes`, bit for bit as the scalar decoder.
///
/// # Panics
/// If `bytes` is not exactly `dtype.row_bytes(out.len())` long.
#[target_feature(enable = "neon")]
pub(super) fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(Some(bytes.len()), dtype.row_bytes(out.len()));
    match dtype {
        DType::F32 => decode_plain::<F32>(bytes, out),
        DType::F16 => decode_plain::<F16>(bytes, out),
        DType::BF16 => decode_plain::<BF16>(bytes, out),
        DType::Q8_0 => decode_blocks(Block::Q8_0, bytes, out),
        DType::Q4_0 => decode_blocks(Block::Q4_0, bytes, out),
        DType::Q4_1 => decode_blocks(Block::Q4_1, bytes, out),
        other => match Format::of(other) {
            Some(fmt) => kquant::dequantize(fmt, bytes, out),
            None => kvcore_scalar::quant::unsupported(other),
        },
    }
}
