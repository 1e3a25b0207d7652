//! NEON kernels for 8-bit activations (`kvcore::backend::q8` has the numerics), baseline
//! Advanced SIMD only (no `sdot`/`i8mm`).
//!
//! - `quantize`: per block of 32, the eight 4-lane vectors' absolute values (`vabsq_f32`),
//!   a finiteness test `|x| < inf` (false for NaN and ±inf) and the absolute maximum by
//!   `vmaxq_f32`/`vmaxvq_f32` (exact, so any order gives the reference's `amax`);
//!   `d = amax/127` and `1/d` in scalar f32 (the reference's operations), the products
//!   `x·(1/d)` in f32 and `fcvtns` (`vcvtnq_s32_f32`: round to nearest, ties to even),
//!   narrowed 32 → 16 → 8 bits (no value is out of range: `|q| ≤ 127`). The sum `Σq` in
//!   i32. Bit for bit the reference quantiser; non-finite and tiny blocks take its special
//!   cases.
//! - `gemv`: per row, per block: the integer dot `i = Σ_j w_j q_j` with widening byte
//!   multiplies (`smull`/`smull2`, signed: `Q4_*`'s nibbles `0..16` are non-negative
//!   bytes). `Q4_*`: the 16 packed bytes split into low nibbles (weights `0..16`, against
//!   activations `0..16`) and high nibbles (weights `16..32`, against `16..32`); the four
//!   8-lane products are accumulated in i16 (`smlal`; at most `4·15·128 = 7680` per lane)
//!   and then pairwise widened to i32 (`saddlp`). `Q8_0`: each 8-lane i16 product vector
//!   holds one product per lane (at most `128·128`) and is pairwise added into i32
//!   (`saddlp`/`sadalp`, two chains then an add). Either way the four i32 lanes are exact;
//!   they are converted to f32 (exact, `|i| < 2^24`) and accumulated with one FMA by
//!   `d_w·d_a` into a single 4-lane accumulator; the offset term `m·(d_a·s)`
//!   (`m = −8·d_w` for `Q4_0`, the stored `m` for `Q4_1`) goes to a scalar accumulator. At
//!   the end the lanes are summed (`vaddvq_f32`) and the offsets added. Against the
//!   reference (each term exact, summed in f64) only the rounding of `d_w·d_a`, the FMAs
//!   and the final sums differ.
//!
//! One accumulator, as on x86 (where a second one measured slower): the per-block integer
//! work is much longer than the FMA latency. Not measured on Arm hardware.

use super::dot::load;
use half::f16;
use kvcore::backend::q8::Q8_MAX;
use kvcore::backend::{DType, Q8Acts, QK, Weights};
use std::arch::aarch64::*;

/// The little-endian f16 at `b[at..at + 2]`, widened (a block scale or offset).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Sixteen signed bytes from `b[0..16]`.
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
fn load_i8(b: &[i8]) -> int8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: 16 bytes are in bounds (asserted); bytes have no alignment requirement.
    unsafe { vld1q_s8(b.as_ptr()) }
}

/// Sixteen bytes from `b[0..16]`.
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
fn load_u8(b: &[u8]) -> uint8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: 16 bytes are in bounds (asserted); bytes have no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// Sixteen signed bytes from `b[0..16]`, reinterpreted (a `Q8_0` block's quants).
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
fn load_u8_as_i8(b: &[u8]) -> int8x16_t {
    vreinterpretq_s8_u8(load_u8(b))
}

/// Four i32 lanes narrowed to bytes (the values fit: `|v| ≤ 127`), 16 in order.
#[inline]
#[target_feature(enable = "neon")]
fn narrow16(i: &[int32x4_t]) -> int8x16_t {
    let lo = vcombine_s16(vmovn_s32(i[0]), vmovn_s32(i[1]));
    let hi = vcombine_s16(vmovn_s32(i[2]), vmovn_s32(i[3]));
    vcombine_s8(vmovn_s16(lo), vmovn_s16(hi))
}

/// Quantises `x` into `(scales, sums, values)`, bit for bit as `Q8Acts::quantize`.
///
/// # Panics
/// If the lengths are not `x: [32·k]`, `scales`, `sums: [k]`, `values: [32·k]`.
#[target_feature(enable = "neon")]
pub(super) fn quantize(x: &[f32], scales: &mut [f32], sums: &mut [i32], values: &mut [i8]) {
    assert!(x.len() == values.len() && x.len() == scales.len() * QK);
    assert_eq!(scales.len(), sums.len());
    let inf = vdupq_n_f32(f32::INFINITY);
    let blocks = x
        .chunks_exact(QK)
        .zip(values.chunks_exact_mut(QK))
        .zip(scales.iter_mut().zip(sums.iter_mut()));
    for ((xb, qb), (d, s)) in blocks {
        let v: [float32x4_t; 8] = std::array::from_fn(|l| load(&xb[4 * l..]));
        let a = v.map(|v| vabsq_f32(v));
        // All lanes `|x| < inf`: false for ±inf and NaN.
        let fin = a.iter().fold(vdupq_n_u32(u32::MAX), |acc, &al| {
            vandq_u32(acc, vcltq_f32(al, inf))
        });
        let finite = vminvq_u32(fin) == u32::MAX;
        let m = |p: usize| vmaxq_f32(a[p], a[p + 1]);
        let amax = vmaxvq_f32(vmaxq_f32(vmaxq_f32(m(0), m(2)), vmaxq_f32(m(4), m(6))));
        let dd = amax / Q8_MAX;
        if !finite || dd < f32::MIN_POSITIVE {
            qb.fill(0);
            (*d, *s) = (if finite { 0.0 } else { f32::NAN }, 0);
            continue;
        }
        let id = 1.0 / dd;
        let i = v.map(|v| vcvtnq_s32_f32(vmulq_n_f32(v, id)));
        let t = vaddq_s32(
            vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3])),
            vaddq_s32(vaddq_s32(i[4], i[5]), vaddq_s32(i[6], i[7])),
        );
        let (q0, q1) = (narrow16(&i[..4]), narrow16(&i[4..]));
        assert!(qb.len() >= 32);
        // SAFETY: `qb` is 32 bytes (asserted); bytes have no alignment requirement.
        unsafe {
            vst1q_s8(qb.as_mut_ptr(), q0);
            vst1q_s8(qb.as_mut_ptr().add(16), q1);
        }
        (*d, *s) = (dd, vaddvq_s32(t));
    }
}

/// One row of `Q4_0` (`Q4_1 = false`) or `Q4_1` against `x` (module docs).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks.
#[inline]
#[target_feature(enable = "neon")]
fn dot_q4<const Q4_1: bool>(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, qs) = if Q4_1 { (20, 4) } else { (18, 2) };
    assert_eq!(row.len(), x.scales().len() * bytes);
    let mask = vdupq_n_u8(15);
    let mut acc = vdupq_n_f32(0.0);
    let mut offsets = 0.0f32;
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(QK))
        .zip(x.scales().iter().zip(x.sums()));
    for ((b, a), (&da, &s)) in blocks {
        let dw = f16_at(b, 0);
        let m = if Q4_1 { f16_at(b, 2) } else { -8.0 * dw };
        let packed = load_u8(&b[qs..]);
        let (a0, a1) = (load_i8(&a[..16]), load_i8(&a[16..]));
        let lo = vreinterpretq_s8_u8(vandq_u8(packed, mask));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(packed));
        // Four products per i16 lane, each in 0..16 × -128..128: |Σ| ≤ 7680.
        let p = vmull_s8(vget_low_s8(lo), vget_low_s8(a0));
        let p = vmlal_high_s8(p, lo, a0);
        let p = vmlal_s8(p, vget_low_s8(hi), vget_low_s8(a1));
        let p = vmlal_high_s8(p, hi, a1);
        let i = vpaddlq_s16(p);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(i), dw * da);
        offsets += m * (da * s as f32);
    }
    vaddvq_f32(acc) + offsets
}

/// One row of `Q8_0` against `x` (module docs).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks.
#[inline]
#[target_feature(enable = "neon")]
fn dot_q8_0(row: &[u8], x: &Q8Acts) -> f32 {
    assert_eq!(row.len(), x.scales().len() * 34);
    let mut acc = vdupq_n_f32(0.0);
    let blocks = row
        .chunks_exact(34)
        .zip(x.values().chunks_exact(QK))
        .zip(x.scales());
    for ((b, a), &da) in blocks {
        let dw = f16_at(b, 0);
        let (w0, w1) = (load_u8_as_i8(&b[2..]), load_u8_as_i8(&b[18..]));
        let (a0, a1) = (load_i8(&a[..16]), load_i8(&a[16..]));
        // One product per i16 lane (|w·q| ≤ 128·128), pairs added in i32.
        let s0 = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
        let s0 = vpadalq_s16(s0, vmull_high_s8(w0, a0));
        let s1 = vpaddlq_s16(vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
        let s1 = vpadalq_s16(s1, vmull_high_s8(w1, a1));
        let i = vaddq_s32(s0, s1);
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(i), dw * da);
    }
    vaddvq_f32(acc)
}

/// `y ← W x̂` for a block-format `w`.
///
/// # Panics
/// If the shapes do not fit (`x: [cols]`, `y: [rows]`) or `w` is a plain format.
#[target_feature(enable = "neon")]
pub(super) fn gemv(w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
    assert!(x.len() == w.cols() && y.len() == w.rows());
    let rb = w.row_bytes();
    if rb == 0 {
        y.fill(0.0);
        return;
    }
    let dtype = w.dtype();
    assert!(
        kvcore::backend::q8::supports(dtype),
        "no q8 GEMV for {dtype}"
    );
    // Plain loops (not closures) so the row kernels inline under this target feature.
    for (r, yr) in w.data().chunks_exact(rb).zip(y.iter_mut()) {
        *yr = match dtype {
            DType::Q4_1 => dot_q4::<true>(r, x),
            DType::Q4_0 => dot_q4::<false>(r, x),
            _ => dot_q8_0(r, x),
        };
    }
}
