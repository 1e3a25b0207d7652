//! NEON f32 kernels: dot products, attention scores, softmax and weighted sums, RMSNorm's
//! sum of squares and products, the residual add, SwiGLU and GeGLU.
//!
//! Numerics of [`dot`]: four independent 4-lane accumulators over 16-element chunks
//! (hiding the FMA latency), then one accumulator over 4-element chunks, the across-lane
//! add `vaddvq_f32`, and a scalar tail. Each lane accumulates a strided subset of the
//! products with fused multiply-adds, so the result differs from the scalar
//! left-to-right sum by rounding only: both are within `γ_n·Σ|a_j b_j|` of the exact
//! value. The element-wise kernels (`scale_mul`, `add`) round exactly as the scalar code.
//!
//! [`softmax`], [`swiglu`] and [`geglu`] are the AVX2 kernels' algorithms four lanes at a
//! time, with [`exp4`], the same Cephes `expf` as the AVX2 `exp8` (the same constants,
//! the same FMA steps, the same clamps): within 3 ulps of the exact value where the result
//! is normal, zero below `ln(f32::MIN_POSITIVE)`, `∞` from 88.38 on, NaN for NaN. The
//! bounds and their derivations are those of `x86/dot.rs`; `tests/simd_paths.rs` holds
//! both paths to them against the scalar reference (run on NEON under qemu by
//! `.ci/aarch64.sh`).

use kvcore::backend::PartStat;
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

/// `e^x` lane by lane (Cephes `expf`; see the module docs and the AVX2 `exp8`).
#[inline]
#[target_feature(enable = "neon")]
fn exp4(x: float32x4_t) -> float32x4_t {
    // e^x = 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2.
    let lo = vdupq_n_f32(-87.336_55); // ln(f32::MIN_POSITIVE)
    let number = vceqq_f32(x, x); // all ones where x is not NaN
    let tiny = vcltq_f32(x, lo);
    let xc = vminq_f32(vmaxq_f32(x, lo), vdupq_n_f32(88.722_84));
    let n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(std::f32::consts::LOG2_E)));
    let r = vfmsq_f32(xc, n, vdupq_n_f32(0.693_359_4));
    let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
    let mut y = vdupq_n_f32(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    ] {
        y = vfmaq_f32(vdupq_n_f32(c), y, r);
    }
    let r2 = vmulq_f32(r, r);
    let y = vaddq_f32(vfmaq_f32(r, y, r2), vdupq_n_f32(1.0));
    // 2^n for n in −126 ..= 128: the biased exponent in the float's bits (n = 128 gives
    // the bits of ∞). NaN lanes convert to 0 here and are replaced below.
    let bits = vshlq_n_s32::<23>(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)));
    let y = vmulq_f32(y, vreinterpretq_f32_s32(bits));
    let y = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), tiny));
    vbslq_f32(number, y, vdupq_n_f32(f32::NAN))
}

/// `x ← e^(x − max)` in place with [`exp4`] and a 4-lane sum, returning the max and the
/// sum (`Kernel::exp_sum`: a NaN row becomes NaN, an empty or all `−∞` row zeros with
/// `PartStat::EMPTY`).
#[target_feature(enable = "neon")]
pub(super) fn exp_sum(x: &mut [f32]) -> PartStat {
    let Some(max) = kvcore_scalar::softmax_max(x) else {
        let nan = x.first().is_some_and(|v| v.is_nan());
        return match nan {
            true => PartStat {
                max: f32::NAN,
                sum: f32::NAN,
            },
            false => PartStat::EMPTY,
        };
    };
    let m = vdupq_n_f32(max);
    let mut sum = vdupq_n_f32(0.0);
    let mut chunks = x.chunks_exact_mut(4);
    for c in chunks.by_ref() {
        let e = exp4(vsubq_f32(load(c), m));
        store(c, e);
        sum = vaddq_f32(sum, e);
    }
    let tail = chunks.into_remainder();
    let mut s = vaddvq_f32(sum);
    if !tail.is_empty() {
        let mut buf = [f32::NEG_INFINITY; 4];
        buf[..tail.len()].copy_from_slice(tail);
        let mut e = [0.0f32; 4];
        store(&mut e, exp4(vsubq_f32(load(&buf), m)));
        for (t, &v) in tail.iter_mut().zip(&e) {
            *t = v;
            s += v;
        }
    }
    PartStat { max, sum: s }
}

/// Softmax of `x` in place: the reference's algorithm (NaN row → NaN, all `−∞` → zeros,
/// max subtracted, divide by the sum) through [`exp_sum`].
#[target_feature(enable = "neon")]
pub(super) fn softmax(x: &mut [f32]) {
    let stat = exp_sum(x);
    if stat.is_empty() || stat.max.is_nan() {
        return;
    }
    for v in x.iter_mut() {
        *v /= stat.sum;
    }
}

/// `out ← act(gate) ⊙ up` with `act(g) = g / (1 + e^(k(g)))`, four lanes at a time (the
/// AVX2 `glu`); the tail runs through a padded vector, so every element takes the same
/// operations.
///
/// # Panics
/// If the lengths differ.
#[inline]
#[target_feature(enable = "neon")]
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], k4: impl Fn(float32x4_t) -> float32x4_t) {
    assert!(gate.len() == up.len() && gate.len() == out.len());
    let one = vdupq_n_f32(1.0);
    let act = |g: float32x4_t, u: float32x4_t| {
        let e = exp4(k4(g));
        vmulq_f32(vdivq_f32(g, vaddq_f32(one, e)), u)
    };
    let mut oc = out.chunks_exact_mut(4);
    let (mut gc, mut uc) = (gate.chunks_exact(4), up.chunks_exact(4));
    for ((o, g), u) in oc.by_ref().zip(gc.by_ref()).zip(uc.by_ref()) {
        store(o, act(load(g), load(u)));
    }
    let tail = oc.into_remainder();
    if !tail.is_empty() {
        let (mut g, mut u, mut o) = ([0.0f32; 4], [0.0f32; 4], [0.0f32; 4]);
        g[..tail.len()].copy_from_slice(gc.remainder());
        u[..tail.len()].copy_from_slice(uc.remainder());
        store(&mut o, act(load(&g), load(&u)));
        tail.copy_from_slice(&o[..tail.len()]);
    }
}

/// SwiGLU `out_j ← g_j / (1 + e^(−g_j)) · u_j` (the AVX2 `swiglu`'s formula and bound).
#[target_feature(enable = "neon")]
pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, |g| vnegq_f32(g));
}

/// GeGLU as the logistic `g / (1 + e^(−2z))`, `z = √(2/π)·(g + 0.044715·g³)` (the AVX2
/// `geglu`'s formula and bound).
#[target_feature(enable = "neon")]
pub(super) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let c = vdupq_n_f32(0.044_715);
    let minus_2s = vdupq_n_f32(-2.0 * 0.797_884_6);
    glu(gate, up, out, |g| {
        let g3 = vmulq_f32(vmulq_f32(g, g), g);
        vmulq_f32(minus_2s, vfmaq_f32(g, c, g3))
    });
}
