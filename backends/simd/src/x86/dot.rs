//! AVX2 + FMA f32 kernels: dot products, attention scores, softmax and weighted sums,
//! RMSNorm's sum of squares and products, the residual add.
//!
//! Numerics of [`dot`]: four independent 8-lane accumulators over 32-element chunks
//! (hiding the 4-cycle FMA latency), then one accumulator over 8-element chunks, a
//! pairwise horizontal sum, and a scalar tail. Each lane accumulates a strided subset of
//! the products with fused multiply-adds, so the result differs from the scalar
//! left-to-right sum by rounding only: both are within `γ_n·Σ|a_j b_j|` of the exact
//! value. The element-wise kernels (`scale_mul`, `add`) round exactly as the scalar code.
//!
//! [`gemm_rows`] (the GEMM of a few tokens on f32 or decoded weight rows) computes each
//! output as one 8-lane chain of FMAs over the 8-column chunks in order, the lanes summed
//! as [`hsum`] sums them and the `cols mod 8` tail added in order: within the same
//! `γ_n·Σ|a_j b_j|` of the exact value as [`dot`], by the same operations whatever the
//! number of rows and tokens of the call, so every output depends on its row and its
//! token alone.
//!
//! [`weighted_sum`] keeps up to 64 outputs in registers across the value rows; each
//! output is the chain `o ← fma(p_t, v_tj, o)` in `t` order (an unfused `o + p_t·v_tj`
//! for the `head_dim mod 8` tail), in registers instead of through memory.
//!
//! [`softmax`] is the reference's algorithm (NaN row → NaN, all `−∞` → zeros, max
//! subtracted, divide by the sum) with a vectorised `exp` ([`exp8`]) and an 8-lane sum:
//! `exp` is within 3 ulps of the exact value for every argument `≤ 0` that does not
//! underflow (Cephes' `expf`: `n = round(x·log₂e)`, `r = x − n·ln2` in two FMA steps, a
//! degree-7 polynomial, `·2ⁿ` through the exponent bits), and flushes results below
//! `f32::MIN_POSITIVE` (arguments below −87.3) to zero where libm returns a subnormal: an
//! absolute error below `1.2e-38`. Both are inside the conformance suite's allowance
//! for `exp` (`EXP_ULPS` = 16 ulps) and its absolute `TINY` terms. The reference's
//! exact `expf` costs ~5 ns per score, which at a depth of 4096 positions is most of a
//! decode step's attention.

use kvcore::backend::PartStat;
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

/// How many rows ahead the GEMVs prefetch their weight rows ([`prefetch_row`]).
///
/// Weights stream from memory (a mapped file, 4 KiB pages, where the hardware
/// prefetchers stop at every page): without this the row loops wait on their loads.
/// Measured on SmolLM2 (Xeon VM, `kvcore bench -s`, simd, q8): one-token decode 45 →
/// 73 tok/s, and two tokens grouped per row ran slower than two GEMVs without it.
pub(super) const PREFETCH_ROWS: usize = 4;

/// Prefetches row `r` of `data` (rows of `rb` bytes) into L1, line by line, if the
/// row exists (a prefetch never faults; the row is in bounds anyway).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_row(data: &[u8], r: usize, rb: usize) {
    let Some(end) = r.checked_add(1).and_then(|e| e.checked_mul(rb)) else {
        return;
    };
    if let Some(row) = data.get(r * rb..end) {
        prefetch_l1(row);
    }
}

/// Prefetches every cache line of `bytes` into L1 (`prefetcht0`: SSE, which every
/// x86_64 CPU has; a prefetch never faults).
#[inline(always)]
pub(super) fn prefetch_l1(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: `prefetcht0` is SSE, which every x86_64 CPU has; it reads nothing
        // and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
}

/// Prefetches every cache line of `bytes` towards L2 (`prefetcht1`; a prefetch never
/// faults).
#[target_feature(enable = "avx2,fma")]
pub(super) fn prefetch_l2(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast());
    }
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
/// Inlined into the attention loops: a call per key row was a fifth of a decode step at
/// depth.
/// # Panics
/// If the lengths differ.
#[inline]
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

/// `y[t·stride + r] ← w_r·x_t` for every row `w_r` of `w: [p, cols]` and token `x_t` of
/// `x: [n, cols]`: the few-token GEMM (see the module docs for each output's chain),
/// three rows × four tokens per pass: twelve chains side by side (the FMA latency hidden)
/// with seven loads per twelve FMAs, where a dot product per pair loads two per FMA.
/// (Two rows × four tokens measured ~8 % slower on SmolLM2's FFN shapes.)
///
/// # Panics
/// If `w` or `x` is not a whole number of rows of `cols`, or `y` is too short.
#[target_feature(enable = "avx2,fma")]
pub(super) fn gemm_rows(w: &[f32], x: &[f32], cols: usize, y: &mut [f32], stride: usize) {
    assert!(cols > 0 && w.len().is_multiple_of(cols) && x.len().is_multiple_of(cols));
    let (p, n) = (w.len() / cols, x.len() / cols);
    if p == 0 || n == 0 {
        return;
    }
    assert!(y.len() >= (n - 1) * stride + p, "gemm_rows y");
    let mut r = 0;
    while r < p {
        let nr = (p - r).min(3);
        let mut t = 0;
        while t < n {
            let nt = (n - t).min(4);
            macro_rules! block {
                ($r:literal) => {
                    match nt {
                        4 => gemm_block::<$r, 4>(w, x, cols, y, stride, r, t),
                        3 => gemm_block::<$r, 3>(w, x, cols, y, stride, r, t),
                        2 => gemm_block::<$r, 2>(w, x, cols, y, stride, r, t),
                        _ => gemm_block::<$r, 1>(w, x, cols, y, stride, r, t),
                    }
                };
            }
            match nr {
                3 => block!(3),
                2 => block!(2),
                _ => block!(1),
            }
            t += nt;
        }
        r += nr;
    }
}

/// Rows `r0..r0 + R` against tokens `t0..t0 + T` of [`gemm_rows`]: one 8-lane chain per
/// output over the 8-column chunks in order, its lanes summed by [`hsum`], then the
/// `cols mod 8` tail added in order (unfused) — the same operations for every `R`, `T`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn gemm_block<const R: usize, const T: usize>(
    w: &[f32],
    x: &[f32],
    cols: usize,
    y: &mut [f32],
    stride: usize,
    r0: usize,
    t0: usize,
) {
    let (w, x) = (&w[r0 * cols..][..R * cols], &x[t0 * cols..][..T * cols]);
    let mut wp = [w.as_ptr(); R];
    let mut xp = [x.as_ptr(); T];
    // SAFETY: `w` holds `R` rows of `cols` and `x` holds `T` (sliced just above), so each
    // pointer starts a whole row of `cols` values within them.
    unsafe {
        for (i, p) in wp.iter_mut().enumerate() {
            *p = p.add(i * cols);
        }
        for (j, p) in xp.iter_mut().enumerate() {
            *p = p.add(j * cols);
        }
    }
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut c = 0;
    while c + 8 <= cols {
        // SAFETY: every pointer starts a row of `cols` values (above) and `c + 8 ≤
        // cols`; `loadu` has no alignment requirement.
        unsafe {
            let mut wv = [_mm256_setzero_ps(); R];
            for i in 0..R {
                wv[i] = _mm256_loadu_ps(wp[i].add(c));
            }
            for j in 0..T {
                let xv = _mm256_loadu_ps(xp[j].add(c));
                for i in 0..R {
                    acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
                }
            }
        }
        c += 8;
    }
    for i in 0..R {
        for j in 0..T {
            let mut s = hsum(acc[i][j]);
            for k in c..cols {
                s += w[i * cols + k] * x[j * cols + k];
            }
            y[(t0 + j) * stride + r0 + i] = s;
        }
    }
}

/// `out ← out + Σ_t p_t · v_t` for the rows `v_t` of `values`, in `t` order (see the
/// module docs for each output's chain).
///
/// # Panics
/// If a row's length is not `out.len()`, or `values` yields fewer rows than `p` holds.
#[target_feature(enable = "avx2,fma")]
pub(super) fn weighted_sum<'a>(
    p: &[f32],
    mut values: impl Iterator<Item = &'a [f32]>,
    out: &mut [f32],
) {
    /// Rows gathered per pass over the output columns.
    const ROWS: usize = 64;
    /// Output vectors kept in registers (64 floats).
    const VECS: usize = 8;
    let d = out.len();
    let mut rows: [&[f32]; ROWS] = [&[]; ROWS];
    for pc in p.chunks(ROWS) {
        for r in rows.iter_mut().take(pc.len()) {
            *r = values.next().expect("one value row per weight");
            assert_eq!(r.len(), d, "value row length");
        }
        let rows = &rows[..pc.len()];
        let mut c0 = 0;
        while c0 + 8 <= d {
            let nv = ((d - c0) / 8).min(VECS);
            let mut acc = [_mm256_setzero_ps(); VECS];
            for (v, a) in acc.iter_mut().enumerate().take(nv) {
                *a = load(&out[c0 + 8 * v..]);
            }
            for (&pt, row) in pc.iter().zip(rows) {
                let pv = _mm256_set1_ps(pt);
                for (v, a) in acc.iter_mut().enumerate().take(nv) {
                    *a = _mm256_fmadd_ps(pv, load(&row[c0 + 8 * v..]), *a);
                }
            }
            for (v, a) in acc.iter().enumerate().take(nv) {
                store(&mut out[c0 + 8 * v..], *a);
            }
            c0 += 8 * nv;
        }
        for j in c0..d {
            for (&pt, row) in pc.iter().zip(rows) {
                out[j] += pt * row[j];
            }
        }
    }
}

/// `e^x` in eight lanes (see the module docs for the error, which holds for positive
/// arguments too up to 88.37); from `127.5·ln 2 ≈ 88.376` on, where `n` reaches 128, the
/// result is `∞` (exactly so past `ln(f32::MAX) ≈ 88.723`); NaN lanes give NaN.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp8(x: __m256) -> __m256 {
    // Cephes expf: e^x = 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2.
    let lo = _mm256_set1_ps(-87.336_55); // ln(f32::MIN_POSITIVE)
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
    let xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.722_84));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0));
    // 2^n for n in −126 ..= 128: the biased exponent in the float's bits (n = 128 gives
    // the bits of ∞).
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    let y = _mm256_andnot_ps(tiny, y);
    _mm256_blendv_ps(y, _mm256_set1_ps(f32::NAN), nan)
}

/// `x ← e^(x − max)` in place, returning the max and the sum (`Kernel::exp_sum`: a NaN
/// row becomes NaN, an empty or all `−∞` row zeros with `PartStat::EMPTY`).
#[target_feature(enable = "avx2,fma")]
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
    let m = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut chunks = x.chunks_exact_mut(8);
    for c in chunks.by_ref() {
        let e = exp8(_mm256_sub_ps(load(c), m));
        store(c, e);
        sum = _mm256_add_ps(sum, e);
    }
    let tail = chunks.into_remainder();
    let mut s = hsum(sum);
    if !tail.is_empty() {
        let mut buf = [f32::NEG_INFINITY; 8];
        buf[..tail.len()].copy_from_slice(tail);
        let mut e = [0.0f32; 8];
        store(&mut e, exp8(_mm256_sub_ps(load(&buf), m)));
        for (t, &v) in tail.iter_mut().zip(&e) {
            *t = v;
            s += v;
        }
    }
    PartStat { max, sum: s }
}

/// Softmax of `x` in place (see the module docs): [`exp_sum`], then each value divided
/// by the sum.
#[target_feature(enable = "avx2,fma")]
pub(super) fn softmax(x: &mut [f32]) {
    let stat = exp_sum(x);
    if stat.is_empty() || stat.max.is_nan() {
        return;
    }
    for v in x.iter_mut() {
        *v /= stat.sum;
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

/// `out ← act(gate) ⊙ up` with `act(g) = g / (1 + e^(k(g)))`, eight lanes at a time:
/// `k8` maps a vector of `g` to the exponent. SiLU is `k(g) = −g`; tanh-GELU,
/// `½g(1 + tanh z) = g / (1 + e^(−2z))`, is `k(g) = −2z`. The tail runs through a padded
/// vector, so every element takes the same operations.
///
/// # Panics
/// If the lengths differ.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], k8: impl Fn(__m256) -> __m256) {
    assert!(gate.len() == up.len() && gate.len() == out.len());
    let one = _mm256_set1_ps(1.0);
    let act = |g: __m256, u: __m256| {
        let e = exp8(k8(g));
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u)
    };
    let mut oc = out.chunks_exact_mut(8);
    let (mut gc, mut uc) = (gate.chunks_exact(8), up.chunks_exact(8));
    for ((o, g), u) in oc.by_ref().zip(gc.by_ref()).zip(uc.by_ref()) {
        store(o, act(load(g), load(u)));
    }
    let tail = oc.into_remainder();
    if !tail.is_empty() {
        let (mut g, mut u, mut o) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
        g[..tail.len()].copy_from_slice(gc.remainder());
        u[..tail.len()].copy_from_slice(uc.remainder());
        store(&mut o, act(load(&g), load(&u)));
        tail.copy_from_slice(&o[..tail.len()]);
    }
}

/// SwiGLU `out_j ← g_j / (1 + e^(−g_j)) · u_j`: the reference's formula with [`exp8`]
/// (within 3 ulps); for `g < −88.4` the exponential saturates to `∞` and the result is
/// `−0`, as in the reference. Within the conformance suite's SwiGLU bound (`EXP_ULPS`).
#[target_feature(enable = "avx2,fma")]
pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let neg = _mm256_set1_ps(-0.0);
    glu(gate, up, out, |g| _mm256_xor_ps(g, neg));
}

/// GeGLU with tanh-GELU written as a logistic: `½g(1 + tanh z) = g / (1 + e^(−2z))`,
/// `z = √(2/π)·(g + 0.044715·g³)`, so no `1 + tanh z` cancels for negative `g`:
/// `z` is within `4u` relative (one FMA, the cube's two products, the scale), `e^(−2z)`
/// within 3 ulps plus `|2z|·4u` relative from its argument, which the logistic damps by
/// `σ(2z)·|2z| < 0.56`, so the result is within about `6u·|g·u|` — inside the conformance
/// suite's GeGLU bound of `3u·|out| + (EXP_ULPS + 5)·u·½|g·u|`. Limits as the reference:
/// for large `g` the exponential is `0` (result `g·u`), for very negative `g` it is `∞`
/// (result `−0`); NaN stays NaN.
#[target_feature(enable = "avx2,fma")]
pub(super) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let c = _mm256_set1_ps(0.044_715);
    let minus_2s = _mm256_set1_ps(-2.0 * 0.797_884_6);
    glu(gate, up, out, |g| {
        let g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        _mm256_mul_ps(minus_2s, _mm256_fmadd_ps(c, g3, g))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These kernels need AVX2 and FMA: a machine without them fails, never skips.
    fn require_avx2() {
        assert!(
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            "these tests need AVX2 and FMA"
        );
    }

    /// `exp8` at `x`, through a vector of eight copies.
    fn exp_at(x: f32) -> f32 {
        require_avx2();
        let mut out = [0.0f32; 8];
        // SAFETY: AVX2 and FMA detected above.
        unsafe { store(&mut out, exp8(_mm256_set1_ps(x))) };
        out[0]
    }

    /// Distance in units of the last place of the exact value.
    fn ulps(got: f32, exact: f64) -> f64 {
        let e = exact as f32;
        let ulp = f64::from(f32::from_bits(e.to_bits() + 1) - e);
        (f64::from(got) - exact).abs() / ulp
    }

    /// The bound the module docs state: 3 ulps over the whole range softmax uses, zero
    /// below `ln(f32::MIN_POSITIVE)`, exactly 1 at 0, NaN for NaN.
    #[test]
    fn exp8_is_within_three_ulps_on_the_softmax_range() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let n = 1 << 20;
        for i in 0..=n {
            let x = -87.336_55f32 * (i as f32 / n as f32);
            let u = ulps(exp_at(x), f64::from(x).exp());
            if u > worst {
                (worst, at) = (u, x);
            }
        }
        assert!(worst <= 3.0, "{worst} ulps at {at}");
        assert_eq!(exp_at(0.0), 1.0);
        assert_eq!(exp_at(-87.4), 0.0);
        assert_eq!(exp_at(f32::NEG_INFINITY), 0.0);
        assert!(exp_at(f32::NAN).is_nan());
    }

    /// `exp8` for positive arguments (the GLU kernels use them): 3 ulps up to 88, `∞`
    /// from 88.38 on.
    #[test]
    fn exp8_is_within_three_ulps_for_positive_arguments() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let n = 1 << 20;
        for i in 0..=n {
            let x = 88.0f32 * (i as f32 / n as f32);
            let u = ulps(exp_at(x), f64::from(x).exp());
            if u > worst {
                (worst, at) = (u, x);
            }
        }
        assert!(worst <= 3.0, "{worst} ulps at {at}");
        assert_eq!(exp_at(88.38), f32::INFINITY);
        assert_eq!(exp_at(89.0), f32::INFINITY);
        assert_eq!(exp_at(f32::INFINITY), f32::INFINITY);
    }

    /// `gemm_rows` against the f64 dot products within the bound the module docs state
    /// (`γ_n·Σ|w_j x_j|`, `n = cols`), and each output bit for bit the same when computed
    /// alone (one row, one token): the chain does not depend on the block it ran in. Row
    /// counts cover the 3-row blocks and both remainders, token counts the 4-token blocks
    /// and every remainder, `cols` the 8-lane body with and without a tail.
    #[test]
    fn gemm_rows_is_each_dot_alone_and_within_its_bound() {
        require_avx2();
        let val =
            |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 2001) as f32 / 1000.0 - 1.0;
        for (p, n, cols) in [(7, 9, 576), (5, 3, 13), (1, 1, 8), (2, 6, 3), (6, 16, 100)] {
            let w: Vec<f32> = (0..p * cols).map(|i| val(i, 1)).collect();
            let x: Vec<f32> = (0..n * cols).map(|i| val(i, 2)).collect();
            let stride = p + 3; // a wider output row, as a panel of a larger matrix
            let mut y = vec![f32::NAN; n * stride];
            // SAFETY: AVX2 and FMA detected above.
            unsafe { gemm_rows(&w, &x, cols, &mut y, stride) };
            for t in 0..n {
                for r in 0..p {
                    let (wr, xt) = (&w[r * cols..][..cols], &x[t * cols..][..cols]);
                    let mut one = [f32::NAN];
                    // SAFETY: AVX2 and FMA detected above.
                    unsafe { gemm_rows(wr, xt, cols, &mut one, 1) };
                    let got = y[t * stride + r];
                    assert_eq!(
                        got.to_bits(),
                        one[0].to_bits(),
                        "row {r} token {t} of [{p}, {cols}] x {n}"
                    );
                    let exact: f64 = wr
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let mag: f64 = wr
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                        .sum();
                    let u = f64::from(f32::EPSILON) / 2.0;
                    let gamma = cols as f64 * u / (1.0 - cols as f64 * u);
                    assert!(
                        (f64::from(got) - exact).abs() <= gamma * mag,
                        "row {r} token {t}: {got} vs {exact}"
                    );
                }
                // Outputs outside the rows stay untouched.
                for r in p..stride {
                    assert!(y[t * stride + r].is_nan());
                }
            }
        }
    }

    /// The GLU kernels against the f64 formulas, over the range activations take and
    /// their limits, with the bounds their docs derive (`6u·|g·u|` for GeGLU, `8u·|out|`
    /// for SwiGLU), tails included.
    #[test]
    fn glu_kernels_against_f64() {
        require_avx2();
        let gate: Vec<f32> = (0..4099)
            .map(|i| (i as f32 - 2049.0) * 0.013)
            .chain([
                -200.0, -88.0, -30.0, 0.0, -0.0, 30.0, 88.0, 200.0, 1e30, -1e30,
            ])
            .collect();
        let up: Vec<f32> = (0..gate.len())
            .map(|i| 1.0 + (i % 7) as f32 * 0.3)
            .collect();
        let mut out = vec![0.0f32; gate.len()];
        // SAFETY: AVX2 and FMA detected above.
        unsafe { geglu(&gate, &up, &mut out) };
        for ((&g, &u), &o) in gate.iter().zip(&up).zip(&out) {
            let (g, u) = (f64::from(g), f64::from(u));
            let z = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            let want = 0.5 * g * (1.0 + z.tanh()) * u;
            let bound = 6.0 * 2f64.powi(-24) * (g * u).abs() + 1e-37;
            assert!(
                (f64::from(o) - want).abs() <= bound,
                "geglu({g}) = {o}, want {want}"
            );
        }
        // SAFETY: as above.
        unsafe { swiglu(&gate, &up, &mut out) };
        for ((&g, &u), &o) in gate.iter().zip(&up).zip(&out) {
            let (g, u) = (f64::from(g), f64::from(u));
            let want = g / (1.0 + (-g).exp()) * u;
            let bound = 8.0 * 2f64.powi(-24) * want.abs() + 1e-30 * u.abs();
            assert!(
                (f64::from(o) - want).abs() <= bound,
                "swiglu({g}) = {o}, want {want}"
            );
        }
        let mut nan = [0.0f32; 3];
        // SAFETY: as above.
        unsafe { geglu(&[f32::NAN, 1.0, f32::NAN], &[1.0; 3], &mut nan) };
        assert!(nan[0].is_nan() && nan[2].is_nan() && nan[1] > 0.84);
    }

    /// The softmax keeps the reference's special rows and sums to one.
    #[test]
    fn softmax_rows() {
        let run = |v: &[f32]| {
            let mut x = v.to_vec();
            require_avx2();
            // SAFETY: AVX2 and FMA detected just above.
            unsafe { softmax(&mut x) };
            x
        };
        assert!(run(&[1.0, f32::NAN, 2.0]).iter().all(|v| v.is_nan()));
        assert_eq!(run(&[f32::NEG_INFINITY; 11]), vec![0.0; 11]);
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let p = run(&x);
        let sum: f64 = p.iter().map(|&v| f64::from(v)).sum();
        assert!((sum - 1.0).abs() < 1e-6, "{sum}");
        let max = x.iter().cloned().fold(f32::MIN, f32::max);
        for (pi, xi) in p.iter().zip(&x) {
            let z: f64 = x.iter().map(|&v| f64::from(v - max).exp()).sum();
            let want = f64::from(xi - max).exp() / z;
            assert!(
                (f64::from(*pi) - want).abs() <= 1e-6 * want + 1e-30,
                "{pi} vs {want}"
            );
        }
    }
}
