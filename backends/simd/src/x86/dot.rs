//! AVX2 + FMA f32 lanes and kernels: the loads, stores and horizontal sum the other x86
//! kernels share, [`Avx2`]'s 8 lanes for the loops of `crate::lanes` (dot products,
//! scores, weighted sums, softmax, SwiGLU, GeGLU, RMSNorm's products, the residual add),
//! and the few-token GEMM on f32 rows.
//!
//! Lane order: [`hsum`] adds the two halves, then pairs, then the last two:
//! `((x₀+x₄)+(x₂+x₆)) + ((x₁+x₅)+(x₃+x₇))`; every multiply-add is fused.
//!
//! [`gemm_rows`] (the GEMM of a few tokens on f32 or decoded weight rows) computes each
//! output as one 8-lane chain of FMAs over the 8-column chunks in order, the lanes summed
//! as [`hsum`] sums them and the `cols mod 8` tail added in order: within the same
//! `γ_n·Σ|a_j b_j|` of the exact value as `lanes::dot`, by the same operations whatever
//! the number of rows and tokens of the call, so every output depends on its row and its
//! token alone.

use super::Avx2;
use crate::lanes::F32Lanes;
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

// SAFETY (every `unsafe` block in this impl): the intrinsics need AVX2 and FMA, and an
// `Avx2` exists only after `Avx2::detect` or `Avx512::detect` found them at run time.
unsafe impl F32Lanes for Avx2 {
    const N: usize = 8;
    type V = __m256;

    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m256 {
        // SAFETY: features detected (see above); `load` checks the length.
        unsafe { load(s) }
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: __m256) {
        // SAFETY: features detected (see above); `store` checks the length.
        unsafe { store(s, v) }
    }
    crate::lanes::binary_lane_ops!(
        add => _mm256_add_ps,
        sub => _mm256_sub_ps,
        mul => _mm256_mul_ps,
        div => _mm256_div_ps,
    );
    #[inline(always)]
    fn neg(self, a: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_xor_ps(a, _mm256_set1_ps(-0.0)) }
    }
    /// One fused multiply-add.
    #[inline(always)]
    fn mul_add(self, acc: __m256, a: __m256, b: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_fmadd_ps(a, b, acc) }
    }
    /// One fused negated multiply-add.
    #[inline(always)]
    fn mul_sub(self, c: __m256, a: __m256, b: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn clamp(self, x: __m256, lo: __m256, hi: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_min_ps(_mm256_max_ps(x, lo), hi) }
    }
    #[inline(always)]
    fn round(self, x: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x) }
    }
    #[inline(always)]
    fn pow2(self, n: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    fn zero_below(self, x: __m256, lo: __m256, y: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe { _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), y) }
    }
    #[inline(always)]
    fn nan_where_nan(self, x: __m256, y: __m256) -> __m256 {
        // SAFETY: features detected (see above).
        unsafe {
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
            _mm256_blendv_ps(y, _mm256_set1_ps(f32::NAN), nan)
        }
    }
    /// [`hsum`]'s order.
    #[inline(always)]
    fn hsum(self, v: __m256) -> f32 {
        // SAFETY: features detected (see above).
        unsafe { hsum(v) }
    }
}

crate::lanes::f32_loops!(Avx2, #[target_feature(enable = "avx2,fma")]);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::{F32Loops, exp};

    /// These kernels need AVX2 and FMA: a machine without them fails, never skips.
    fn require_avx2() -> Avx2 {
        Avx2::detect().expect("these tests need AVX2, FMA and F16C")
    }

    /// `lanes::exp` on 8 lanes at `x`, through a vector of eight copies.
    fn exp_at(x: f32) -> f32 {
        #[target_feature(enable = "avx2,fma")]
        fn exp8(l: Avx2, x: f32) -> f32 {
            let mut out = [0.0f32; 8];
            l.store(&mut out, exp(l, l.splat(x)));
            out[0]
        }
        // SAFETY: AVX2 and FMA detected by `require_avx2`.
        unsafe { exp8(require_avx2(), x) }
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

    /// `exp` for positive arguments (the GLU kernels use them): 3 ulps up to 88, `∞`
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
        let l = require_avx2();
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
        unsafe { l.run_geglu(&gate, &up, &mut out) };
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
        unsafe { l.run_swiglu(&gate, &up, &mut out) };
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
        unsafe { l.run_geglu(&[f32::NAN, 1.0, f32::NAN], &[1.0; 3], &mut nan) };
        assert!(nan[0].is_nan() && nan[2].is_nan() && nan[1] > 0.84);
    }

    /// The softmax keeps the reference's special rows and sums to one.
    #[test]
    fn softmax_rows() {
        let run = |v: &[f32]| {
            let mut x = v.to_vec();
            let l = require_avx2();
            // SAFETY: AVX2 and FMA detected just above.
            unsafe { l.run_softmax(&mut x) };
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
