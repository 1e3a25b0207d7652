//! NEON kernels for 8-bit activations (`kvcore::backend::q8` has the numerics), baseline
//! Advanced SIMD only (no `sdot`/`i8mm`).
//!
//! - the quantiser's microkernels (`kformat::quantize` has its loop): `abs_max` by
//!   `vabsq_f32`, a finiteness test `|x| < inf` (false for NaN and ±inf) and
//!   `vmaxq_f32`/`vmaxvq_f32`; `quantize16`: the products in f32, `fcvtns`
//!   (`vcvtnq_s32_f32`: to nearest, ties to even), `min(·, 127)`, narrowed 32 → 16 → 8
//!   bits, and the sum `Σq` in i32.
//! - `gemv` of `Q5_0`: as `Q4_0` below with the fifth bits OR-ed into the nibbles and an
//!   offset of 16; of `Q4_K` and `Q6_K` against `Q8_K`: `dot_q4_k`, `dot_q6_k` (each
//!   documented there).
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
use super::quant::load_bytes;
use crate::kformat::{f16_at, gemv_start};
use kvcore::backend::{DType, Q8Acts, Q8Layout, QK, Weights, q4_k_scale_min};
use std::arch::aarch64::*;

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

/// Sixteen signed bytes from `b[0..16]`, reinterpreted (a `Q8_0` block's quants).
///
/// # Panics
/// If `b.len() < 16`.
#[inline]
#[target_feature(enable = "neon")]
fn load_u8_as_i8(b: &[u8]) -> int8x16_t {
    vreinterpretq_s8_u8(load_bytes(b))
}

/// Four i32 lanes narrowed to bytes (the values fit: `|v| ≤ 127`), 16 in order.
#[inline]
#[target_feature(enable = "neon")]
fn narrow16(i: &[int32x4_t]) -> int8x16_t {
    let lo = vcombine_s16(vmovn_s32(i[0]), vmovn_s32(i[1]));
    let hi = vcombine_s16(vmovn_s32(i[2]), vmovn_s32(i[3]));
    vcombine_s8(vmovn_s16(lo), vmovn_s16(hi))
}

/// Whether none of `x` (a multiple of 4 values) is NaN or infinite, and the largest
/// `|x|` (exact, so any order gives the reference's `amax`; only meaningful when all are
/// finite).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn abs_max(x: &[f32]) -> (bool, f32) {
    let inf = vdupq_n_f32(f32::INFINITY);
    let (mut fin, mut amax) = (vdupq_n_u32(u32::MAX), vdupq_n_f32(0.0));
    for c in x.chunks_exact(4) {
        let a = vabsq_f32(load(c));
        // `|x| < inf`: false for ±inf and NaN.
        fin = vandq_u32(fin, vcltq_f32(a, inf));
        amax = vmaxq_f32(amax, a);
    }
    (vminvq_u32(fin) == u32::MAX, vmaxvq_f32(amax))
}

/// `q[0..16] ← min(round(x_j·factor), 127)` (`fcvtns`: to nearest, ties to even), narrowed
/// 32 → 16 → 8 bits; returns `Σ q_j`.
///
/// # Panics
/// If `x` or `q` holds fewer than 16 values.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn quantize16(x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
    assert!(x.len() >= 16 && q.len() >= 16);
    let cap = vdupq_n_s32(127);
    let i: [int32x4_t; 4] = std::array::from_fn(|l| {
        vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(load(&x[4 * l..]), factor)), cap)
    });
    // SAFETY: `q` holds at least 16 bytes (asserted); bytes have no alignment requirement.
    unsafe { vst1q_s8(q.as_mut_ptr(), narrow16(&i)) };
    vaddvq_s32(vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3])))
}

/// `Σ_j w_j a_j` over 32 signed bytes `w = (w0, w1)`, `a = (a0, a1)` as four i32 lanes
/// (`smull`/`smlal` into i16, four products a lane, then pairwise widened): exact while
/// `4·|w|·|a| < 2^15` (`|w| ≤ 32`, `|a| ≤ 127` here).
#[inline]
#[target_feature(enable = "neon")]
fn dot32(w0: int8x16_t, w1: int8x16_t, a0: int8x16_t, a1: int8x16_t) -> int32x4_t {
    let p = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
    let p = vmlal_high_s8(p, w0, a0);
    let p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(a1));
    let p = vmlal_high_s8(p, w1, a1);
    vpaddlq_s16(p)
}

/// `Σ_j w_j a_j` over 16 signed bytes as four i32 lanes (two products a lane in i16).
#[inline]
#[target_feature(enable = "neon")]
fn dot16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    vpaddlq_s16(vmlal_high_s8(
        vmull_s8(vget_low_s8(w), vget_low_s8(a)),
        w,
        a,
    ))
}

/// The 16 bytes `16·bit_j` for bits `j = 0..16` of `h` (half of a `Q5_0` block's fifth
/// bits), byte `j` in lane `j`.
#[inline]
#[target_feature(enable = "neon")]
fn fifth_bits(h: u16) -> uint8x16_t {
    let bytes = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
    let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vandq_u8(vtstq_u8(bytes, bits), vdupq_n_u8(16))
}

/// One row of a 32-weight nibble format against `x` (module docs): `Q4_0`, `Q4_1` or
/// `Q5_0` (`FMT` 0, 1, 2). `Q5_0`'s fifth bits are OR-ed into the nibbles as `16·bit`
/// bytes (weights `0..32`, four products per i16 lane at most `4·31·127`).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks.
#[inline]
#[target_feature(enable = "neon")]
fn dot_nibbles<const FMT: u8>(row: &[u8], x: &Q8Acts) -> f32 {
    let dtype = [DType::Q4_0, DType::Q4_1, DType::Q5_0][usize::from(FMT.min(2))];
    // Where the packed nibbles start.
    let qs = match dtype {
        DType::Q4_1 => 4,
        DType::Q5_0 => 6,
        _ => 2,
    };
    let bytes = dtype.block_bytes();
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
        let m = match dtype {
            DType::Q4_1 => f16_at(b, 2),
            DType::Q5_0 => -16.0 * dw,
            _ => -8.0 * dw,
        };
        let packed = load_bytes(&b[qs..]);
        let (a0, a1) = (load_i8(&a[..16]), load_i8(&a[16..]));
        let (mut lo, mut hi) = (vandq_u8(packed, mask), vshrq_n_u8::<4>(packed));
        if dtype == DType::Q5_0 {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            lo = vorrq_u8(lo, fifth_bits(qh as u16));
            hi = vorrq_u8(hi, fifth_bits((qh >> 16) as u16));
        }
        let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
        // Weights 0..16 meet activations 0..16, weights 16..32 activations 16..32.
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

/// One row of `Q4_K` against `Q8_K` activations `x` (module docs), per super-block:
/// sub-blocks `2g, 2g + 1` are the low and high nibbles of 32 packed bytes; each
/// sub-block's `dot32` times its 6-bit scale is accumulated in four i32 lanes (at most
/// `8·8·15·127·63 < 2^23` a lane, so they convert to f32 exactly), one FMA by `d·d_a`
/// per super-block; the minimums' `Σ_t m_t·(s_2t + s_2t+1)` in scalar i32, times
/// `dmin·d_a`, summed in a scalar and subtracted at the end.
///
/// # Panics
/// If `row` is not `x.len() / 256` super-blocks.
#[inline]
#[target_feature(enable = "neon")]
fn dot_q4_k(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, block) = (DType::Q4_K.block_bytes(), Q8Layout::Q8_K.block_len());
    let per = block / Q8Layout::Q8_K.sum_len();
    assert_eq!(row.len(), x.scales().len() * bytes);
    assert_eq!(x.sums().len(), x.scales().len() * per);
    let mask = vdupq_n_u8(15);
    let mut acc = vdupq_n_f32(0.0);
    let mut mins = 0.0f32;
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(block))
        .zip(x.scales().iter().zip(x.sums().chunks_exact(per)));
    for ((b, a), (&da, s)) in blocks {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let mut sumi = vdupq_n_s32(0);
        let mut m_int = 0i32;
        for g in 0..4 {
            let (sc0, m0) = q4_k_scale_min(&b[4..16], 2 * g);
            let (sc1, m1) = q4_k_scale_min(&b[4..16], 2 * g + 1);
            let q = &b[16 + 32 * g..];
            let (p0, p1) = (load_bytes(q), load_bytes(&q[16..]));
            let lo = |p| vreinterpretq_s8_u8(vandq_u8(p, mask));
            let hi = |p| vreinterpretq_s8_u8(vshrq_n_u8::<4>(p));
            let ag = &a[64 * g..];
            let (a0, a1, a2, a3) = (
                load_i8(ag),
                load_i8(&ag[16..]),
                load_i8(&ag[32..]),
                load_i8(&ag[48..]),
            );
            sumi = vmlaq_n_s32(sumi, dot32(lo(p0), lo(p1), a0, a1), i32::from(sc0));
            sumi = vmlaq_n_s32(sumi, dot32(hi(p0), hi(p1), a2, a3), i32::from(sc1));
            m_int += i32::from(m0) * (s[4 * g] + s[4 * g + 1])
                + i32::from(m1) * (s[4 * g + 2] + s[4 * g + 3]);
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), d * da);
        mins += (dmin * da) * m_int as f32;
    }
    vaddvq_f32(acc) - mins
}

/// One row of `Q6_K` against `Q8_K` activations `x` (module docs), per super-block:
/// chunk `c` (32 weights) is quarter `k = c mod 4` of half `n = c / 4`: nibble `k / 2`
/// of `ql[64n + 32·(k mod 2)..]` and bits `2k, 2k + 1` of `qh[32n..]`, minus 32, as signed
/// bytes; each 16-weight `dot16` times its scale accumulated in four i32 lanes (up to
/// `64·32·127·127`, which may round once on conversion to f32), one FMA by `d·d_a` per
/// super-block.
///
/// # Panics
/// If `row` is not `x.len() / 256` super-blocks.
#[inline]
#[target_feature(enable = "neon")]
fn dot_q6_k(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, block) = (DType::Q6_K.block_bytes(), Q8Layout::Q8_K.block_len());
    assert_eq!(row.len(), x.scales().len() * bytes);
    let (m15, m3, m32) = (vdupq_n_u8(15), vdupq_n_u8(3), vdupq_n_s8(32));
    let mut acc = vdupq_n_f32(0.0);
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(block))
        .zip(x.scales());
    for ((b, a), &da) in blocks {
        assert!(b.len() == 210 && a.len() == 256);
        let d = f16_at(b, 208);
        let mut sumi = vdupq_n_s32(0);
        for c in 0..8 {
            let (n, k) = (c / 4, c % 4);
            let low = &b[64 * n + 32 * (k % 2)..];
            let high = &b[128 + 32 * n..];
            let lo_shift = vdupq_n_s8(-4 * (k / 2) as i8);
            let hi_shift = vdupq_n_s8(-2 * k as i8);
            for half in 0..2 {
                let l = vandq_u8(vshlq_u8(load_bytes(&low[16 * half..]), lo_shift), m15);
                let h = vandq_u8(vshlq_u8(load_bytes(&high[16 * half..]), hi_shift), m3);
                let q = vorrq_u8(l, vshlq_n_u8::<4>(h));
                let w = vsubq_s8(vreinterpretq_s8_u8(q), m32);
                let av = load_i8(&a[32 * c + 16 * half..]);
                let sc = i32::from(b[192 + 2 * c + half] as i8);
                sumi = vmlaq_n_s32(sumi, dot16(w, av), sc);
            }
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), d * da);
    }
    vaddvq_f32(acc)
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
    let Some(rb) = gemv_start(w, x.len(), y) else {
        return;
    };
    let dtype = w.dtype();
    assert!(
        kvcore::backend::q8::supports(dtype),
        "no q8 GEMV for {dtype}"
    );
    // Plain loops (not closures) so the row kernels inline under this target feature.
    for (r, yr) in w.data().chunks_exact(rb).zip(y.iter_mut()) {
        *yr = match dtype {
            DType::Q4_0 => dot_nibbles::<0>(r, x),
            DType::Q4_1 => dot_nibbles::<1>(r, x),
            DType::Q5_0 => dot_nibbles::<2>(r, x),
            DType::Q4_K => dot_q4_k(r, x),
            DType::Q6_K => dot_q6_k(r, x),
            _ => dot_q8_0(r, x),
        };
    }
}
