//! AVX2 kernels for 8-bit activations (`kvcore::backend::q8` has the numerics).
//!
//! - `quantize`: per block of 32, the absolute maximum by `vmaxps`, `d = amax/127` and
//!   `1/d` in scalar f32 (the reference's operations), the products `x·(1/d)` in f32 and
//!   `vcvtps2dq` (round to nearest, ties to even, under the default MXCSR), packed to
//!   bytes with saturating packs (no value saturates: `|q| ≤ 127`). The sum `Σq` in i32.
//!   Bit for bit the reference quantiser; non-finite and tiny blocks take its special
//!   cases.
//! - `gemv`: per row, per block: the 32 weight quants in one 256-bit register (`Q4_*`:
//!   the 16 packed bytes, low nibbles in the low half and high nibbles in the high half,
//!   matching activations `0..16, 16..32`; `Q8_0`: the 32 bytes), against the 32
//!   activation bytes with `vpmaddubsw` (unsigned × signed bytes, pairs summed to i16:
//!   at most `2·128·127 = 32512`, so it never saturates; `Q8_0`'s signed weights go in
//!   as `|w|` with the sign moved onto the activation, `vpsignb`) and `vpmaddwd` by ones
//!   (i32, 8 lanes, exact). The lanes are converted to f32 (exact) and accumulated with
//!   one FMA by `d_w·d_a` into a single 8-lane accumulator; the offset term
//!   `m·(d_a·s)` (`m = −8·d_w` for `Q4_0`) is summed in order in one lane. For `Q4_*` one
//!   4-lane multiply of the block's f16 `[d_w, m]` by the activation block's
//!   `[d_a, d_a·s]` (`Q8Acts::scale_pairs`, derived once per quantisation) gives both
//!   `d_w·d_a` and the offset term (fewer scalar operations per block than computing them
//!   one by one; same roundings). At the end the lanes are summed and the offsets added. Against the reference (each term exact,
//!   summed in f64) only the rounding of `d_w·d_a`, the FMAs and the final sums differ.
//!
//! One accumulator is faster here than two: the loop is bound by the loads and the
//! integer ports, not by the FMA latency (measured: a two-accumulator version ran at
//! 0.75× on `[1536, 576]` `Q4_1`).

use super::dot::{hsum, load};
use kvcore::backend::q8::Q8_MAX;
use kvcore::backend::{DType, Q8Acts, QK, Weights};
use std::arch::x86_64::*;

/// The largest of the 8 lanes of `v` (no NaN lanes).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// The sum of the 8 i32 lanes of `v` (exact: the callers' sums are far from overflow).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Quantises `x` into `(scales, sums, values)`, bit for bit as `Q8Acts::quantize`.
///
/// # Panics
/// If the lengths are not `x: [32·k]`, `scales`, `sums: [k]`, `values: [32·k]`.
#[target_feature(enable = "avx2,fma")]
pub(super) fn quantize(x: &[f32], scales: &mut [f32], sums: &mut [i32], values: &mut [i8]) {
    assert!(x.len() == values.len() && x.len() == scales.len() * QK);
    assert_eq!(scales.len(), sums.len());
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let blocks = x
        .chunks_exact(QK)
        .zip(values.chunks_exact_mut(QK))
        .zip(scales.iter_mut().zip(sums.iter_mut()));
    for ((xb, qb), (d, s)) in blocks {
        let v = [
            load(&xb[0..]),
            load(&xb[8..]),
            load(&xb[16..]),
            load(&xb[24..]),
        ];
        let a = v.map(|v| _mm256_andnot_ps(sign, v));
        // |x| ≥ inf, or unordered (NaN).
        let bad = a.iter().fold(_mm256_setzero_ps(), |acc, &ai| {
            _mm256_or_ps(acc, _mm256_cmp_ps::<_CMP_NLT_UQ>(ai, inf))
        });
        let finite = _mm256_movemask_ps(bad) == 0;
        let amax = hmax(_mm256_max_ps(
            _mm256_max_ps(a[0], a[1]),
            _mm256_max_ps(a[2], a[3]),
        ));
        let dd = amax / Q8_MAX;
        if !finite || dd < f32::MIN_POSITIVE {
            qb.fill(0);
            (*d, *s) = (if finite { 0.0 } else { f32::NAN }, 0);
            continue;
        }
        let id = _mm256_set1_ps(1.0 / dd);
        let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
        let t = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        // Bytes after the packs, per 128-bit half: i0[0..4] i1[0..4] i2[0..4] i3[0..4] |
        // i0[4..8] ...; the permutation puts the 4-byte groups back in order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, order);
        // SAFETY: `qb` is 32 bytes (a `chunks_exact(32)` chunk); `storeu` has no
        // alignment requirement.
        unsafe { _mm256_storeu_si256(qb.as_mut_ptr().cast(), p) };
        (*d, *s) = (dd, hsum_i32(t));
    }
}

/// One row of `Q4_0` (`Q4_1 = false`) or `Q4_1` against `x` (module docs).
///
/// Per block, the f16 `[d_w, m]` (`Q4_0`: `[d_w, d_w]`) times the activation block's
/// `[d_a, d_a·s]` (`Q8Acts::scale_pairs`) in one 4-lane multiply: lane 0 is `d_w·d_a`
/// (broadcast for the FMA), lane 1 the offset term (`Q4_0`: without its `−8`, applied to
/// the sum), accumulated in lane 1 of a vector (the same sequential f32 sum as a scalar).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4<const Q4_1: bool>(row: &[u8], x: &Q8Acts) -> f32 {
    let (bytes, qs) = if Q4_1 { (20, 4) } else { (18, 2) };
    assert_eq!(row.len(), x.scales().len() * bytes);
    assert_eq!(x.scale_pairs().len(), 2 * x.scales().len());
    let mask = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut offsets = _mm_setzero_ps();
    let blocks = row
        .chunks_exact(bytes)
        .zip(x.values().chunks_exact(QK))
        .zip(x.scale_pairs().chunks_exact(2));
    for ((b, a), f) in blocks {
        assert!(b.len() >= qs + 16 && a.len() >= 32 && f.len() == 2);
        let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        let dm = if Q4_1 { dm } else { _mm_moveldup_ps(dm) };
        // SAFETY: bytes `qs..qs + 16` of the block, the 32 activation bytes and the two
        // factors are in bounds (asserted); `loadu`/`load_sd` have no alignment
        // requirement.
        let (packed, a, fv) = unsafe {
            (
                _mm_loadu_si128(b.as_ptr().add(qs).cast()),
                _mm256_loadu_si256(a.as_ptr().cast()),
                _mm_castpd_ps(_mm_load_sd(f.as_ptr().cast())),
            )
        };
        let t = _mm_mul_ps(dm, fv);
        let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed), mask);
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(t), _mm256_cvtepi32_ps(p), acc);
        offsets = _mm_add_ps(offsets, t);
    }
    // `Q4_0`: the offsets were summed as `d_w·(d_a·s)`; `−8` scales the sum exactly (a
    // power of two), the same value as summing the `−8·d_w·(d_a·s)` terms.
    let offsets = _mm_cvtss_f32(_mm_movehdup_ps(offsets));
    hsum(acc) + if Q4_1 { offsets } else { -8.0 * offsets }
}

/// One row of `Q8_0` against `x` (module docs).
///
/// # Panics
/// If `row` is not `x.len() / 32` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0(row: &[u8], x: &Q8Acts) -> f32 {
    assert_eq!(row.len(), x.scales().len() * 34);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let blocks = row
        .chunks_exact(34)
        .zip(x.values().chunks_exact(QK))
        .zip(x.scales());
    for ((b, a), &da) in blocks {
        let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            u16::from_le_bytes([b[0], b[1]]),
        ))));
        assert!(b.len() >= 34 && a.len() >= 32);
        // SAFETY: bytes `2..34` of the block and the 32 activation bytes are in bounds
        // (asserted); `loadu` has no alignment requirement.
        let (w, a) = unsafe {
            (
                _mm256_loadu_si256(b.as_ptr().add(2).cast()),
                _mm256_loadu_si256(a.as_ptr().cast()),
            )
        };
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
        let p = _mm256_madd_epi16(p, ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(p), acc);
    }
    hsum(acc)
}

/// `y ← W x̂` for a block-format `w`.
///
/// # Panics
/// If the shapes do not fit (`x: [cols]`, `y: [rows]`) or `w` is a plain format.
#[target_feature(enable = "avx2,fma,f16c")]
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
