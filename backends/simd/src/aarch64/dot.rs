//! NEON f32 kernels: dot products, attention scores and weighted sums, RMSNorm's sum of
//! squares and products, the residual add.
//!
//! Numerics of [`dot`]: four independent 4-lane accumulators over 16-element chunks
//! (hiding the FMA latency), then one accumulator over 4-element chunks, the across-lane
//! add `vaddvq_f32`, and a scalar tail. Each lane accumulates a strided subset of the
//! products with fused multiply-adds, so the result differs from the scalar
//! left-to-right sum by rounding only: both are within `γ_n·Σ|a_j b_j|` of the exact
//! value. The element-wise kernels (`scale_mul`, `add`) round exactly as the scalar code.

use std::arch::aarch64::*;

/// Four f32 from `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load(s: &[f32]) -> float32x4_t {
    assert!(s.len() >= 4);
    // SAFETY: 4 floats are in bounds (asserted); the pointer is a valid `*const f32`.
    unsafe { vld1q_f32(s.as_ptr()) }
}

/// Store four f32 to `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn store(s: &mut [f32], v: float32x4_t) {
    assert!(s.len() >= 4);
    // SAFETY: 4 floats are in bounds (asserted); the pointer is a valid `*mut f32`.
    unsafe { vst1q_f32(s.as_mut_ptr(), v) }
}

/// `Σ_j a_j·b_j` (see the module docs for the order).
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "neon")]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let n = a.len();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (l, lane) in acc.iter_mut().enumerate() {
            let j = i + 4 * l;
            *lane = vfmaq_f32(*lane, load(&a[j..]), load(&b[j..]));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], load(&a[i..]), load(&b[i..]));
        i += 4;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut s = vaddvq_f32(v);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// `y ← y + α·x` with fused multiply-adds (scalar tail unfused).
///
/// # Panics
/// If the lengths differ.
#[target_feature(enable = "neon")]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let a = vdupq_n_f32(alpha);
    let mut yc = y.chunks_exact_mut(4);
    let mut xc = x.chunks_exact(4);
    for (yv, xv) in yc.by_ref().zip(xc.by_ref()) {
        store(yv, vfmaq_f32(load(yv), a, load(xv)));
    }
    for (yv, &xv) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *yv += alpha * xv;
    }
}

/// `scores[t] ← scale · q·k_t` for the rows `k_t` of `keys`, in order.
///
/// # Panics
/// If a row's length is not `q.len()`, or `keys` yields fewer rows than `scores` holds.
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
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
#[target_feature(enable = "neon")]
pub(super) fn scale_mul(x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
    assert!(x.len() == w.len() && x.len() == out.len());
    let rv = vdupq_n_f32(r);
    let mut oc = out.chunks_exact_mut(4);
    let (mut xc, mut wc) = (x.chunks_exact(4), w.chunks_exact(4));
    for ((o, xv), wv) in oc.by_ref().zip(xc.by_ref()).zip(wc.by_ref()) {
        store(o, vmulq_f32(vmulq_f32(load(xv), rv), load(wv)));
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
#[target_feature(enable = "neon")]
pub(super) fn add(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    let mut ac = acc.chunks_exact_mut(4);
    let mut xc = x.chunks_exact(4);
    for (a, xv) in ac.by_ref().zip(xc.by_ref()) {
        store(a, vaddq_f32(load(a), load(xv)));
    }
    for (a, &xv) in ac.into_remainder().iter_mut().zip(xc.remainder()) {
        *a += xv;
    }
}
