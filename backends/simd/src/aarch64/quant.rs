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

use super::Neon;
use super::dot::load;
use crate::kformat::{Block, Blocks, F16, F32, Format, f16_at};
use kvcore::backend::{QK, Weights};
use std::arch::aarch64::*;

/// Sixteen bytes from `b[0..16]`.
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load_bytes(b: &[u8]) -> uint8x16_t {
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

// SAFETY (every `unsafe` block below): the callees are `#[target_feature(enable =
// "neon")]` functions, which a `Neon` value proves may run (`aarch64/mod.rs`); they check
// their slice lengths themselves.
impl Blocks for Neon {
    type Chunk = [float32x4_t; 8];
    type Eight = [float32x4_t; 2];

    #[inline(always)]
    fn widen8<const FMT: u8>(self, b: &[u8]) -> [float32x4_t; 2] {
        unsafe { widen8::<FMT>(b) }
    }
    #[inline(always)]
    fn block(self, fmt: Block, b: &[u8]) -> ([float32x4_t; 8], f32, f32) {
        unsafe { fmt.decode(b) }
    }
    #[inline(always)]
    fn chunk(self, fmt: Format, b: &[u8], c: usize) -> [float32x4_t; 8] {
        unsafe { fmt.chunk(b, c) }
    }
    #[inline(always)]
    fn touch_row(self, data: &[u8], rb: usize, i: usize) {
        let _ = (data, rb, i);
    }
    #[inline(always)]
    fn gemv_blocks(self, fmt: Block, w: &Weights<'_>, x: &[f32], sums: &[f32], y: &mut [f32]) {
        for (r, yr) in w.data().chunks_exact(w.row_bytes()).zip(y.iter_mut()) {
            *yr = unsafe { dot_blocks(fmt, r, x, sums) };
        }
    }
    #[inline(always)]
    fn abs_max(self, x: &[f32]) -> (bool, f32) {
        unsafe { super::q8::abs_max(x) }
    }
    #[inline(always)]
    fn quantize16(self, x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
        unsafe { super::q8::quantize16(x, factor, q) }
    }
}

crate::kformat::block_loops!(Neon);
