//! AVX2 + FMA f32 kernels: dot products, attention scores and weighted sums, RMSNorm's
//! sum of squares and products, the residual add.
//!
//! Numerics of [`dot`]: four independent 8-lane accumulators over 32-element chunks
//! (hiding the 4-cycle FMA latency), then one accumulator over 8-element chunks, a
//! pairwise horizontal sum, and a scalar tail. Each lane accumulates a strided subset of
//! the products with fused multiply-adds, so the result differs from the scalar
//! left-to-right sum by rounding only: both are within `γ_n·Σ|a_j b_j|` of the exact
//! value. The element-wise kernels (`scale_mul`, `add`) round exactly as the scalar code.

use std::arch::x86_64::*;

/// Eight f32 from `s[0..8]`.
///
/// # Panics
/// If `s.len() < 8`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn load(s: &[f32]) -> __m256 {
    assert!(s.len() >= 8);
    // SAFETY: 8 floats are in bounds (asserted); `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Store eight f32 to `s[0..8]`.
///
/// # Panics
/// If `s.len() < 8`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn store(s: &mut [f32], v: __m256) {
    assert!(s.len() >= 8);
    // SAFETY: 8 floats are in bounds (asserted); `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
}

/// The sum of the eight lanes: halves, then pairs, then the last two.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `Σ_j a_j·b_j` (see the module docs for the order).
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let n = a.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (l, lane) in acc.iter_mut().enumerate() {
            let j = i + 8 * l;
            *lane = _mm256_fmadd_ps(load(&a[j..]), load(&b[j..]), *lane);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(&a[i..]), load(&b[i..]), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// `y ← y + α·x` with fused multiply-adds (scalar tail unfused).
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "avx2,fma")]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let a = _mm256_set1_ps(alpha);
    let mut yc = y.chunks_exact_mut(8);
    let mut xc = x.chunks_exact(8);
    for (yv, xv) in yc.by_ref().zip(xc.by_ref()) {
        store(yv, _mm256_fmadd_ps(a, load(xv), load(yv)));
    }
    for (yv, &xv) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *yv += alpha * xv;
    }
}

/// `scores[t] ← scale · q·k_t` for the rows `k_t` of `keys`, in order.
///
/// # Panics
/// If a row's length is not `q.len()`, or `keys` yields fewer rows than `scores` holds.
#[target_feature(enable = "avx2,fma")]
pub(super) fn scores<'a>(
    q: &[f32],
    mut keys: impl Iterator<Item = &'a [f32]>,
    scale: f32,
    scores: &mut [f32],
) {
    for s in scores.iter_mut() {
        *s = scale * dot(q, keys.next().expect("one key row per score"));
    }
}

/// `out ← out + Σ_t p_t · v_t` for the rows `v_t` of `values`, in `t` order.
///
/// # Panics
/// If a row's length is not `out.len()`, or `values` yields fewer rows than `p` holds.
#[target_feature(enable = "avx2,fma")]
pub(super) fn weighted_sum<'a>(
    p: &[f32],
    mut values: impl Iterator<Item = &'a [f32]>,
    out: &mut [f32],
) {
    for &pt in p {
        axpy(pt, values.next().expect("one value row per weight"), out);
    }
}

/// `out_j ← (x_j · r) · w_j`.
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "avx2,fma")]
pub(super) fn scale_mul(x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
    assert!(x.len() == w.len() && x.len() == out.len());
    let rv = _mm256_set1_ps(r);
    let mut oc = out.chunks_exact_mut(8);
    let (mut xc, mut wc) = (x.chunks_exact(8), w.chunks_exact(8));
    for ((o, xv), wv) in oc.by_ref().zip(xc.by_ref()).zip(wc.by_ref()) {
        store(o, _mm256_mul_ps(_mm256_mul_ps(load(xv), rv), load(wv)));
    }
    let tail = oc
        .into_remainder()
        .iter_mut()
        .zip(xc.remainder())
        .zip(wc.remainder());
    for ((o, &xv), &wv) in tail {
        *o = xv * r * wv;
    }
}

/// `acc ← acc + x`.
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "avx2,fma")]
pub(super) fn add(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    let mut ac = acc.chunks_exact_mut(8);
    let mut xc = x.chunks_exact(8);
    for (a, xv) in ac.by_ref().zip(xc.by_ref()) {
        store(a, _mm256_add_ps(load(a), load(xv)));
    }
    for (a, &xv) in ac.into_remainder().iter_mut().zip(xc.remainder()) {
        *a += xv;
    }
}
