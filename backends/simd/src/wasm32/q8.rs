//! SIMD128 kernels for 8-bit activations (`kvcore::backend::q8` has the numerics); the
//! twin of `aarch64/q8.rs`.
//!
//! - the quantiser's microkernels (`kformat::quantize` has its loop): `abs_max` by
//!   `f32x4_abs`, a finiteness test `|x| < inf` (false for NaN and ±inf) and `f32x4_max`;
//!   `quantize16`: the products in f32, rounded to nearest-even (`f32x4_nearest`, then an
//!   exact conversion), `min(·, 127)`, narrowed 32 → 16 → 8 bits with saturation, and the
//!   sum `Σq` in i32.
//! - `gemv`: SIMD128 has no 8-bit multiply, so the activations are widened to i16 once
//!   per call (a reused buffer) and the weights are widened to i16 in registers: the
//!   integer dot of a block is `i32x4_dot_i16x8` (products of lane pairs, summed in i32:
//!   exact) over its 8-lane vectors, added in i32 (exact).
//!   - `Q4_0`, `Q4_1`, `Q5_0`, `Q8_0` (against `Q8_0`), two rows at a time sharing the
//!     activation loads: the 16 packed bytes are widened to u16 (bytes `0..8`, `8..16`)
//!     and split into low nibbles (weights `0..16`) and high nibbles (`16..32`) by a mask
//!     and a shift in 16-bit lanes; `Q5_0`'s fifth bit `j` is tested in lane `j mod 8` of
//!     the broadcast `qh` against the mask `1 << j` and OR-ed in as 16; `Q8_0`'s bytes are
//!     sign-extended. The block's four i32 lanes are converted to f32 (exact: `|i| < 2^24`)
//!     and `acc ← acc + (d_w·d_a)·i` (a rounded multiply, then a rounded add: SIMD128 has
//!     no FMA). The scales of both rows' blocks are loaded as lanes and widened from f16
//!     in one vector (`[d_0, m_0, d_1, m_1]`, `m = d` for the formats without one) by
//!     `finite_scales_to_f32`, four operations, exact for finite scales (a row pair with
//!     an infinite or NaN scale is computed again with the exact `scales_to_f32`), and
//!     multiplied by
//!     `[d_a, k·d_a s, d_a, k·d_a s]`, built once per call from `Q8Acts::scale_pairs`
//!     (`k = −8, −16, 1, 0` for `Q4_0`, `Q5_0`, `Q4_1`, `Q8_0`; `k·(d_a s)` is exact, a
//!     power of two), so lanes 0 and 2 are the blocks' factors `d_w·d_a` and lanes 1 and 3
//!     their offset terms `m·(d_a·s)` (`Q4_0`: `d_w·(−8·d_a s)`, the same product),
//!     summed in a vector of their own. At the end the lanes are summed and the offsets
//!     added. Against the reference (each term exact, summed in f64) only the rounding of
//!     `d_w·d_a`, the multiply-adds and the final sums differ.
//!     Before a row pair, the next pair's cache lines are touched (`dot::touch_next`).
//!   - With relaxed SIMD (`target_feature = "relaxed-simd"`), `Q4_0`, `Q4_1` and `Q5_0`
//!     skip the widening: `dot2_i7` takes the activation bytes as they are and the
//!     weights as bytes `0..32`, the relaxed dot's 7-bit operand (exact on every
//!     engine: see there); the scales and sums as above. `Q8_0`'s weights are signed
//!     bytes, which cannot be that operand: it keeps the widened path (the activations
//!     split by sign, `a⁺ − a⁻`, two relaxed dots per 16 weights, measured no faster:
//!     BENCHMARKS.md).
//!   - `Q4_K` and `Q6_K` against `Q8_K`, one row at a time, per super-block as on NEON:
//!     each 32-weight (`Q4_K`) or 16-weight (`Q6_K`) sub-block's integer dot times its
//!     integer scale accumulated in four i32 lanes (`Q4_K`: at most `8·8·15·127·63 < 2^23`
//!     a lane, so the conversion to f32 is exact; `Q6_K`: up to `64·32·127·127`, which may
//!     round once), one multiply-add by `d·d_a` per super-block; `Q4_K`'s minimums
//!     `Σ_t m_t·(s_2t + s_2t+1)` in scalar i32, times `dmin·d_a`, subtracted at the end.
//!     `Q6_K`'s quants are assembled in byte lanes (`ql` nibble, `qh` bits shifted to bits
//!     4 and 5 by constant shifts, minus 32) and then sign-extended.

use super::dot::{hsum, load, touch_next};
use super::quant::load_bytes;
use crate::kformat::{f16_at, gemv_start};
use core::arch::wasm32::*;
use core::cell::RefCell;
use kvcore::backend::{DType, Q8Acts, Q8Layout, QK, QK_K, Weights, q4_k_scale_min};

/// `q[0..16] ← min(round(x_j·factor), 127)` (`f32x4_nearest`: to nearest, ties to even,
/// then an exact conversion), narrowed 32 → 16 → 8 bits with saturation; returns `Σ q_j`.
///
/// # Panics
/// If `x` or `q` holds fewer than 16 values.
#[inline]
pub(super) fn quantize16(x: &[f32], factor: f32, q: &mut [i8]) -> i32 {
    assert!(x.len() >= 16 && q.len() >= 16);
    let (f, cap) = (f32x4_splat(factor), i32x4_splat(127));
    let i: [v128; 4] = core::array::from_fn(|l| {
        let r = f32x4_nearest(f32x4_mul(load(&x[4 * l..]), f));
        // `r` is an integer of magnitude ≤ 128: the conversion is exact.
        i32x4_min(i32x4_trunc_sat_f32x4(r), cap)
    });
    let p = i8x16_narrow_i16x8(
        i16x8_narrow_i32x4(i[0], i[1]),
        i16x8_narrow_i32x4(i[2], i[3]),
    );
    // SAFETY: `q` holds at least 16 bytes (asserted); `v128_store` has no alignment
    // requirement.
    unsafe { v128_store(q.as_mut_ptr().cast(), p) };
    hsum_i32(i32x4_add(i32x4_add(i[0], i[1]), i32x4_add(i[2], i[3])))
}

/// Whether none of `x` is NaN or infinite, and the largest `|x|` (exact, so any order
/// gives the reference's `amax`; only meaningful when all are finite).
///
/// # Panics
/// If `x.len()` is not a multiple of 4.
#[inline]
pub(super) fn abs_max(x: &[f32]) -> (bool, f32) {
    assert!(x.len().is_multiple_of(4));
    let inf = f32x4_splat(f32::INFINITY);
    let (mut fin, mut amax) = (u32x4_splat(u32::MAX), f32x4_splat(0.0));
    for c in x.chunks_exact(4) {
        let a = f32x4_abs(load(c));
        // `|x| < inf`: false for ±inf and NaN.
        fin = v128_and(fin, f32x4_lt(a, inf));
        amax = f32x4_max(amax, a);
    }
    let m = f32x4_max(amax, i32x4_shuffle::<2, 3, 0, 1>(amax, amax));
    let m = f32x4_extract_lane::<0>(m).max(f32x4_extract_lane::<1>(m));
    (i32x4_all_true(fin), m)
}

/// The sum of the four i32 lanes of `v`.
#[inline]
fn hsum_i32(v: v128) -> i32 {
    let h = i32x4_add(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    i32x4_extract_lane::<0>(h) + i32x4_extract_lane::<1>(h)
}

/// Eight i16 lanes from `a[0..8]`.
///
/// # Panics
/// If `a.len() < 8`.
#[inline]
fn load_i16(a: &[i16]) -> v128 {
    assert!(a.len() >= 8);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_load` has no alignment requirement.
    unsafe { v128_load(a.as_ptr().cast()) }
}

/// `Σ_j w_j a_j` over 32 weights as four i32 lanes: `w` and `a` as four 8-lane i16
/// vectors each (weights `0..8, 8..16, 16..24, 24..32`); exact.
#[inline]
fn dot32(w: [v128; 4], a: &[v128; 4]) -> v128 {
    i32x4_add(
        i32x4_add(i32x4_dot_i16x8(w[0], a[0]), i32x4_dot_i16x8(w[1], a[1])),
        i32x4_add(i32x4_dot_i16x8(w[2], a[2]), i32x4_dot_i16x8(w[3], a[3])),
    )
}

/// The 32 activations of `a[0..32]` (widened) as four i16 vectors.
#[inline]
fn acts32(a: &[i16]) -> [v128; 4] {
    core::array::from_fn(|k| load_i16(&a[8 * k..]))
}

/// A 32-weight block format against `Q8_0` activations.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Legacy {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
}

impl Legacy {
    #[inline(always)]
    fn bytes(self) -> usize {
        match self {
            Legacy::Q4_0 => DType::Q4_0,
            Legacy::Q4_1 => DType::Q4_1,
            Legacy::Q5_0 => DType::Q5_0,
            Legacy::Q8_0 => DType::Q8_0,
        }
        .block_bytes()
    }

    /// The factor `k` of the offset term `k·d·(d_a·s)` (`Q4_1`: its stored `m`, so 1).
    #[inline(always)]
    fn offset(self) -> f32 {
        match self {
            Legacy::Q4_0 => -8.0,
            Legacy::Q4_1 => 1.0,
            Legacy::Q5_0 => -16.0,
            Legacy::Q8_0 => 0.0,
        }
    }

    /// The f16 bit patterns of the scales of blocks `b0` and `b1` in i16 lanes `0..4`,
    /// `[d_0, m_0, d_1, m_1]` (`m = d` but for `Q4_1`), by lane loads; lanes `4..8` are
    /// zero or copies of `d_0`.
    ///
    /// # Panics
    /// If a block is shorter than 4 bytes.
    #[inline(always)]
    fn scale_bits2(self, b0: &[u8], b1: &[u8]) -> v128 {
        assert!(b0.len() >= 4 && b1.len() >= 4);
        let (p0, p1) = (b0.as_ptr(), b1.as_ptr());
        // SAFETY: each load reads 2 or 4 bytes from the start of a block of at least 4
        // (asserted); the lane loads have no alignment requirement.
        let h = unsafe {
            if self == Legacy::Q4_1 {
                // u16 lanes `[d_0, m_0, d_1, m_1, 0, …]`.
                v128_load32_lane::<1>(v128_load32_zero(p0.cast()), p1.cast())
            } else {
                // u16 lanes `[d_0, d_0, d_1, d_1, d_0, …]`.
                let v = v128_load16_splat(p0.cast());
                v128_load16_lane::<3>(v128_load16_lane::<2>(v, p1.cast()), p1.cast())
            }
        };
        h
    }

    /// Block `b`'s 32 weights (without the offset) as four i16 vectors, in order.
    #[inline(always)]
    fn weights(self, b: &[u8]) -> [v128; 4] {
        match self {
            Legacy::Q8_0 => {
                let (lo, hi) = (load_bytes(&b[2..]), load_bytes(&b[18..]));
                [
                    i16x8_extend_low_i8x16(lo),
                    i16x8_extend_high_i8x16(lo),
                    i16x8_extend_low_i8x16(hi),
                    i16x8_extend_high_i8x16(hi),
                ]
            }
            _ => {
                let qs = match self {
                    Legacy::Q4_1 => 4,
                    Legacy::Q5_0 => 6,
                    _ => 2,
                };
                let p = load_bytes(&b[qs..]);
                let (p0, p1) = (u16x8_extend_low_u8x16(p), u16x8_extend_high_u8x16(p));
                let m = u16x8_splat(15);
                let mut w = [
                    v128_and(p0, m),
                    v128_and(p1, m),
                    u16x8_shr(p0, 4),
                    u16x8_shr(p1, 4),
                ];
                if self == Legacy::Q5_0 {
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    let bit = u16x8(1, 2, 4, 8, 16, 32, 64, 128);
                    let sixteen = u16x8_splat(16);
                    for (k, wk) in w.iter_mut().enumerate() {
                        // Bits 8k..8k + 8 of `qh`, in the low byte of every lane.
                        let h = u16x8_splat((qh >> (8 * k)) as u16);
                        let set = i16x8_ne(v128_and(h, bit), u16x8_splat(0));
                        *wk = v128_or(*wk, v128_and(set, sixteen));
                    }
                }
                w
            }
        }
    }

    /// Block `b`'s 32 weights (without the offset) as two u8 vectors, weights `0..16`
    /// and `16..32`, each at most 31: the 7-bit operand of the relaxed dot (`Q4_0`,
    /// `Q4_1`, `Q5_0` only). The high nibbles are shifted in 16-bit lanes and masked
    /// (SIMD128 has no 8-bit shift; V8 emulates `u8x16_shr` with more operations);
    /// `Q5_0`'s bit `j` of `qh` is tested in byte lane `j mod 16` of `qh`'s byte
    /// `j / 8` spread over eight lanes, and OR-ed in as 16.
    #[cfg(target_feature = "relaxed-simd")]
    #[inline(always)]
    fn weights_u7(self, b: &[u8]) -> [v128; 2] {
        debug_assert!(self != Legacy::Q8_0);
        let qs = match self {
            Legacy::Q4_1 => 4,
            Legacy::Q5_0 => 6,
            _ => 2,
        };
        let p = load_bytes(&b[qs..]);
        let m = u8x16_splat(15);
        let mut w = [v128_and(p, m), v128_and(u16x8_shr(p, 4), m)];
        if self == Legacy::Q5_0 {
            assert!(b.len() >= 6);
            // SAFETY: bytes 2..6 are in bounds (asserted); no alignment requirement.
            let qh = unsafe { v128_load32_splat(b[2..].as_ptr().cast()) };
            let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
            let sixteen = u8x16_splat(16);
            let h = [
                i8x16_shuffle::<0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1>(qh, qh),
                i8x16_shuffle::<2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3>(qh, qh),
            ];
            for (wk, hk) in w.iter_mut().zip(h) {
                let set = i8x16_eq(v128_and(hk, bit), bit);
                *wk = v128_or(*wk, v128_and(set, sixteen));
            }
        }
        w
    }
}

/// Four f16 scales (bit patterns in i16 lanes `0..4`) widened to f32: exact for finite
/// values (`(h & 0x7fff) << 13` as f32 times `2^112`, the sign moved to bit 31), ±inf for
/// ±inf, a NaN for a NaN (its payload not kept: a NaN scale makes the row NaN either
/// way). Four operations fewer than `quant.rs`'s bit-exact `f16x4_to_f32`; the kernels
/// take it only for a row pair with a non-finite scale (`finite_scales_to_f32`).
#[inline(always)]
fn scales_to_f32(h: v128) -> v128 {
    let h = u32x4_extend_low_u16x8(h);
    let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let em = i32x4_shl(v128_and(h, u32x4_splat(0x7fff)), 13);
    let rebased = f32x4_mul(em, f32x4_splat(F16_REBASE));
    // Exponent 31 (inf or NaN) rebases to 2^16 or more; every finite f16 to less.
    let special = f32x4_ge(rebased, f32x4_splat(65536.0));
    let inf_nan = v128_or(em, u32x4_splat(0x7f80_0000));
    v128_or(v128_bitselect(inf_nan, rebased, special), sign)
}

/// `2^112`: an f16's exponent and mantissa placed at bits 13..28 of an f32 are the f16's
/// value times `2^-112` (normal or subnormal), so one multiply rebases them exactly.
const F16_REBASE: f32 = f32::from_bits(0x7780_0000);

/// Four f16 scales (bit patterns in i16 lanes `0..4`) widened to f32 in four operations,
/// exact for finite values, `scales_to_f32`'s value then: each lane sign-extended to
/// i32 and shifted left by 13 has the exponent and mantissa at bits 13..28 and copies of
/// the sign at bits 28..32; clearing bits 28..31 leaves the sign at bit 31 and the rest
/// as `scales_to_f32` places it, and the multiply by `2^112` rebases it. An infinity or
/// NaN (exponent 31) comes out finite, of magnitude `≥ 2^16` (above every finite f16):
/// the kernels note those (`Special`) and compute such a row pair again with
/// `scales_to_f32`.
#[inline(always)]
fn finite_scales_to_f32(h: v128) -> v128 {
    let s = i32x4_shl(i32x4_extend_low_i16x8(h), 13);
    f32x4_mul(
        v128_and(s, u32x4_splat(0x8fff_ffff)),
        f32x4_splat(F16_REBASE),
    )
}

/// Whether any f16 scale a kernel widened was an infinity or a NaN (exponent 31): the
/// largest `h << 1` (the sign shifted out) over i16 lanes, `≥ 0xf800` exactly then.
#[derive(Clone, Copy)]
struct Special(v128);

impl Special {
    #[inline(always)]
    fn new() -> Special {
        Special(u16x8_splat(0))
    }

    /// Notes the scales `h` (i16 lanes, as `scale_bits2` gives them).
    #[inline(always)]
    fn note(&mut self, h: v128) {
        self.0 = u16x8_max(self.0, i16x8_shl(h, 1));
    }

    #[inline(always)]
    fn seen(self) -> bool {
        v128_any_true(u16x8_ge(self.0, u16x8_splat(0xf800)))
    }
}

/// The block factors `[d_0·t_0, m_0·t_1, d_1·t_2, m_1·t_3]` of `dot2`/`dot2_i7`: the
/// scales `h` widened by `finite_scales_to_f32` (`EXACT = false`, noting any non-finite
/// one in `special`) or by `scales_to_f32`.
#[inline(always)]
fn factors<const EXACT: bool>(h: v128, t: v128, special: &mut Special) -> v128 {
    if EXACT {
        f32x4_mul(scales_to_f32(h), t)
    } else {
        special.note(h);
        f32x4_mul(finite_scales_to_f32(h), t)
    }
}

/// Two rows of `fmt` against the widened activations `a` (module docs); `t` holds
/// `[d_a, k·d_a s, d_a, k·d_a s]` per block. (Four rows at a time measured slower under
/// V8 on x86_64: with twice the accumulators live, its 16 vector registers spill.)
///
/// # Panics
/// If a row is not `a.len() / 32` blocks or `t` is not 4 values per block.
#[inline(always)]
fn dot2(fmt: Legacy, rows: [&[u8]; 2], a: &[i16], t: &[f32]) -> [f32; 2] {
    dot2_by(fmt, rows, a, t, |b, ab| {
        f32x4_convert_i32x4(dot32(fmt.weights(b), &acts32(ab)))
    })
}

/// `dot2` with the relaxed-SIMD dot (`Q4_0`, `Q4_1`, `Q5_0`): the 8-bit activations `a`
/// as they are, the weights as bytes (`Legacy::weights_u7`). Each 16-byte half is one
/// `i16x8_relaxed_dot_i8x16_i7x16` (sums of two products, `|·| ≤ 2·128·31`: no lane
/// saturates or wraps, so every engine gives the same exact values); the two halves are
/// added in i16 (`≤ 15 872`) and widened pairwise to i32: lane `i` is weights
/// `4i..4i+4` and `16+4i..16+4i+4`. The rest as `dot2`.
///
/// # Panics
/// If a row is not `a.len() / 32` blocks or `t` is not 4 values per block.
#[cfg(target_feature = "relaxed-simd")]
#[inline(always)]
fn dot2_i7(fmt: Legacy, rows: [&[u8]; 2], a: &[i8], t: &[f32]) -> [f32; 2] {
    dot2_by(fmt, rows, a, t, |b, ab| {
        let w = fmt.weights_u7(b);
        let s = i16x8_add(
            i16x8_relaxed_dot_i8x16_i7x16(load_i8(ab), w[0]),
            i16x8_relaxed_dot_i8x16_i7x16(load_i8(&ab[16..]), w[1]),
        );
        f32x4_convert_i32x4(i32x4_extadd_pairwise_i16x8(s))
    })
}

/// Two rows of `fmt` whose blocks' integer dots (as f32 lanes) `dot(block, activations)`
/// gives, computed with the fast scale widening and, if that saw a non-finite scale,
/// again with the exact one (see `factors`).
#[inline(always)]
fn dot2_by<A>(
    fmt: Legacy,
    rows: [&[u8]; 2],
    a: &[A],
    t: &[f32],
    dot: impl Fn(&[u8], &[A]) -> v128,
) -> [f32; 2] {
    match dot2_with::<false, A>(fmt, rows, a, t, &dot) {
        (y, false) => y,
        _ => dot2_with::<true, A>(fmt, rows, a, t, &dot).0,
    }
}

/// `dot2_by` with the scales widened by `factors::<EXACT>`, and whether a non-finite
/// scale was seen by the fast widening (then only the exact one's result is right).
#[inline(always)]
fn dot2_with<const EXACT: bool, A>(
    fmt: Legacy,
    rows: [&[u8]; 2],
    a: &[A],
    t: &[f32],
    dot: &impl Fn(&[u8], &[A]) -> v128,
) -> ([f32; 2], bool) {
    let bb = fmt.bytes();
    let n = a.len() / QK;
    assert!(t.len() == 4 * n && rows.iter().all(|r| r.len() == n * bb));
    let mut acc = [f32x4_splat(0.0); 2];
    // Lanes 1 and 3: the offset terms of rows 0 and 1.
    let mut offsets = f32x4_splat(0.0);
    let mut special = Special::new();
    let blocks = rows[0]
        .chunks_exact(bb)
        .zip(rows[1].chunks_exact(bb))
        .zip(a.chunks_exact(QK).zip(t.chunks_exact(4)));
    for ((b0, b1), (ab, tb)) in blocks {
        let f = factors::<EXACT>(fmt.scale_bits2(b0, b1), load(tb), &mut special);
        let (i0, i1) = (dot(b0, ab), dot(b1, ab));
        acc[0] = f32x4_add(acc[0], f32x4_mul(i0, i32x4_shuffle::<0, 0, 0, 0>(f, f)));
        acc[1] = f32x4_add(acc[1], f32x4_mul(i1, i32x4_shuffle::<2, 2, 2, 2>(f, f)));
        offsets = f32x4_add(offsets, f);
    }
    let (o0, o1) = if fmt == Legacy::Q8_0 {
        (0.0, 0.0)
    } else {
        (
            f32x4_extract_lane::<1>(offsets),
            f32x4_extract_lane::<3>(offsets),
        )
    };
    let y = [hsum(acc[0]) + o0, hsum(acc[1]) + o1];
    (y, !EXACT && special.seen())
}

/// Sixteen i8 from `a[0..16]`.
///
/// # Panics
/// If `a.len() < 16`.
#[cfg(target_feature = "relaxed-simd")]
#[inline]
fn load_i8(a: &[i8]) -> v128 {
    assert!(a.len() >= 16);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_load` has no alignment requirement.
    unsafe { v128_load(a.as_ptr().cast()) }
}

/// `y ← W x̂` for a 32-weight block format, two rows at a time (an odd last row paired
/// with itself). Inlined into each of `gemv`'s arms, so `fmt` is a constant there. The
/// table is taken out of its thread-local and put back rather than borrowed in a
/// closure: a closure passed to `with_borrow_mut` is one function for every format,
/// which left `fmt` a run-time value in the block loop (a jump table per block and
/// spilled activations).
#[inline(always)]
fn gemv_legacy(
    fmt: Legacy,
    w: &Weights<'_>,
    x: &Q8Acts,
    y: &mut [f32],
    dot2: impl Fn([&[u8]; 2], &[f32]) -> [f32; 2],
) {
    let rb = w.row_bytes();
    let mut table = TABLE.take();
    // `[d_a, k·d_a s, d_a, k·d_a s]` per block, `k` the format's offset factor.
    let k = fmt.offset();
    table.clear();
    table.extend(
        x.scale_pairs()
            .chunks_exact(2)
            .flat_map(|p| [p[0], k * p[1], p[0], k * p[1]]),
    );
    let data = w.data();
    for (i, (r, yr)) in data.chunks(2 * rb).zip(y.chunks_mut(2)).enumerate() {
        touch_next(data, 2 * rb, i);
        let (r0, r1) = if r.len() == 2 * rb {
            r.split_at(rb)
        } else {
            (r, r)
        };
        let v = dot2([r0, r1], &table);
        yr.copy_from_slice(&v[..yr.len()]);
    }
    TABLE.set(table);
}

/// One row of `Q4_K` against `Q8_K` activations (widened: `a`; scales and sums of `x`),
/// see the module docs.
///
/// # Panics
/// If `row` is not `a.len() / 256` super-blocks.
#[inline]
fn dot_q4_k(row: &[u8], a: &[i16], x: &Q8Acts) -> f32 {
    let bytes = DType::Q4_K.block_bytes();
    let per = QK_K / Q8Layout::Q8_K.sum_len();
    assert_eq!(row.len(), x.scales().len() * bytes);
    assert_eq!(x.sums().len(), x.scales().len() * per);
    let mask = u16x8_splat(15);
    let mut acc = f32x4_splat(0.0);
    let mut mins = 0.0f32;
    let blocks = row
        .chunks_exact(bytes)
        .zip(a.chunks_exact(QK_K))
        .zip(x.scales().iter().zip(x.sums().chunks_exact(per)));
    for ((b, ab), (&da, s)) in blocks {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let mut sumi = i32x4_splat(0);
        let mut m_int = 0i32;
        for g in 0..4 {
            let (sc0, m0) = q4_k_scale_min(&b[4..16], 2 * g);
            let (sc1, m1) = q4_k_scale_min(&b[4..16], 2 * g + 1);
            let q = &b[16 + 32 * g..];
            let (p0, p1) = (load_bytes(q), load_bytes(&q[16..]));
            let wide = [
                u16x8_extend_low_u8x16(p0),
                u16x8_extend_high_u8x16(p0),
                u16x8_extend_low_u8x16(p1),
                u16x8_extend_high_u8x16(p1),
            ];
            let lo = wide.map(|v| v128_and(v, mask));
            let hi = wide.map(|v| u16x8_shr(v, 4));
            let d0 = dot32(lo, &acts32(&ab[64 * g..]));
            let d1 = dot32(hi, &acts32(&ab[64 * g + 32..]));
            sumi = i32x4_add(sumi, i32x4_mul(d0, i32x4_splat(i32::from(sc0))));
            sumi = i32x4_add(sumi, i32x4_mul(d1, i32x4_splat(i32::from(sc1))));
            m_int += i32::from(m0) * (s[4 * g] + s[4 * g + 1])
                + i32::from(m1) * (s[4 * g + 2] + s[4 * g + 3]);
        }
        let factor = f32x4_splat(d * da);
        acc = f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sumi), factor));
        mins += (dmin * da) * m_int as f32;
    }
    hsum(acc) - mins
}

/// One row of `Q6_K` against `Q8_K` activations (widened: `a`; scales of `x`), see the
/// module docs.
///
/// # Panics
/// If `row` is not `a.len() / 256` super-blocks.
#[inline]
fn dot_q6_k(row: &[u8], a: &[i16], x: &Q8Acts) -> f32 {
    let bytes = DType::Q6_K.block_bytes();
    assert_eq!(row.len(), x.scales().len() * bytes);
    let mut acc = f32x4_splat(0.0);
    let blocks = row
        .chunks_exact(bytes)
        .zip(a.chunks_exact(QK_K))
        .zip(x.scales());
    for ((b, ab), &da) in blocks {
        assert!(b.len() == 210 && ab.len() == 256);
        let d = f16_at(b, 208);
        let mut sumi = i32x4_splat(0);
        for c in 0..8 {
            let (n, k) = (c / 4, c % 4);
            let low = &b[64 * n + 32 * (k % 2)..];
            let high = &b[128 + 32 * n..];
            for half in 0..2 {
                let l = load_bytes(&low[16 * half..]);
                let l = if k >= 2 {
                    u8x16_shr(l, 4)
                } else {
                    v128_and(l, u8x16_splat(15))
                };
                // (h >> 2k & 3) << 4, by one constant shift and a mask of bits 4, 5.
                let h = load_bytes(&high[16 * half..]);
                let h = match k {
                    0 => i8x16_shl(h, 4),
                    1 => i8x16_shl(h, 2),
                    2 => h,
                    _ => u8x16_shr(h, 2),
                };
                let q = i8x16_sub(v128_or(l, v128_and(h, u8x16_splat(0x30))), i8x16_splat(32));
                let at = 32 * c + 16 * half;
                let dot = i32x4_add(
                    i32x4_dot_i16x8(i16x8_extend_low_i8x16(q), load_i16(&ab[at..])),
                    i32x4_dot_i16x8(i16x8_extend_high_i8x16(q), load_i16(&ab[at + 8..])),
                );
                let sc = i32::from(b[192 + 2 * c + half] as i8);
                sumi = i32x4_add(sumi, i32x4_mul(dot, i32x4_splat(sc)));
            }
        }
        let factor = f32x4_splat(d * da);
        acc = f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sumi), factor));
    }
    hsum(acc)
}

thread_local! {
    /// The activations widened to i16, reused across calls.
    static WIDE: RefCell<Vec<i16>> = const { RefCell::new(Vec::new()) };
    /// The 32-weight formats' per-block activation factors (`gemv_legacy`), reused.
    static TABLE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y ← W x̂` for a block-format `w`.
///
/// # Panics
/// If the shapes do not fit (`x: [cols]`, `y: [rows]`) or `w` is a plain format.
pub(super) fn gemv(w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
    let Some(rb) = gemv_start(w, x.len(), y) else {
        return;
    };
    let dtype = w.dtype();
    assert!(
        kvcore::backend::q8::supports(dtype),
        "no q8 GEMV for {dtype}"
    );
    #[cfg(target_feature = "relaxed-simd")]
    {
        // The 4- and 5-bit formats take the relaxed dot on the 8-bit values as they are.
        // Each arm names its format twice, so it is a constant in the inlined kernel.
        let a = x.values();
        use Legacy::{Q4_0, Q4_1, Q5_0};
        match dtype {
            DType::Q4_0 => return gemv_legacy(Q4_0, w, x, y, |r, t| dot2_i7(Q4_0, r, a, t)),
            DType::Q4_1 => return gemv_legacy(Q4_1, w, x, y, |r, t| dot2_i7(Q4_1, r, a, t)),
            DType::Q5_0 => return gemv_legacy(Q5_0, w, x, y, |r, t| dot2_i7(Q5_0, r, a, t)),
            _ => {}
        }
    }
    WIDE.with_borrow_mut(|a| {
        a.clear();
        a.extend(x.values().iter().map(|&v| i16::from(v)));
        let a = a.as_slice();
        // One loop per format, each with its kernel inlined.
        let data = w.data();
        let rows = data.chunks_exact(rb).enumerate();
        match dtype {
            DType::Q4_K => rows.zip(y.iter_mut()).for_each(|((i, r), yr)| {
                touch_next(data, rb, i);
                *yr = dot_q4_k(r, a, x)
            }),
            DType::Q6_K => rows.zip(y.iter_mut()).for_each(|((i, r), yr)| {
                touch_next(data, rb, i);
                *yr = dot_q6_k(r, a, x)
            }),
            DType::Q4_0 => gemv_legacy(Legacy::Q4_0, w, x, y, |r, t| dot2(Legacy::Q4_0, r, a, t)),
            DType::Q4_1 => gemv_legacy(Legacy::Q4_1, w, x, y, |r, t| dot2(Legacy::Q4_1, r, a, t)),
            DType::Q5_0 => gemv_legacy(Legacy::Q5_0, w, x, y, |r, t| dot2(Legacy::Q5_0, r, a, t)),
            _ => gemv_legacy(Legacy::Q8_0, w, x, y, |r, t| dot2(Legacy::Q8_0, r, a, t)),
        }
    })
}
