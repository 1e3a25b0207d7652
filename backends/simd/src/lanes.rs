//! The f32 loops every instruction-set family shares, written once over a small trait of
//! lane operations ([`F32Lanes`]: AVX2 + FMA's 8 lanes, NEON's 4, SIMD128's 4).
//!
//! A family implements [`F32Lanes`] on its token (one intrinsic, or a few, per method,
//! each `#[inline(always)]`) and instantiates the loops with [`f32_loops!`], which writes
//! its [`F32Loops`] entry points inside its `#[target_feature]` context: the loops, the
//! lane methods and the intrinsics are all inlined into those entry points, so the
//! feature boundary is crossed once per call (the matrixmultiply pattern). The
//! `Kernel` trait's f32 methods call these entry points.
//!
//! Numerics, the same on every family but for the lane operations' own rounding (which
//! [`F32Lanes::mul_add`] and [`F32Lanes::hsum`] state per family):
//! - [`dot`]: four independent accumulators over chunks of `4·N` (hiding the
//!   multiply-add latency), then the first one over chunks of `N`, the four added as
//!   `(a₀+a₁)+(a₂+a₃)`, the lanes summed by [`F32Lanes::hsum`], and an unfused scalar
//!   tail in order. Each lane accumulates a strided subset of the products, so the result
//!   differs from the scalar left-to-right sum by rounding only: both are within
//!   `γ_n·Σ|a_j b_j|` of the exact value (`γ_(n+1)` where the multiply-add rounds twice);
//! - [`weighted_sum`]: each output element is the chain `o ← o + p_t·v_tj` in `t` order
//!   through [`F32Lanes::mul_add`] (an unfused `o + p_t·v_tj` for the `len mod N` tail);
//!   up to `8·N` outputs stay in registers across 64 value rows, which changes the
//!   memory traffic, not the chain;
//! - the element-wise kernels ([`scale_mul`], [`add`]) round exactly as the scalar code;
//! - [`softmax`] is the reference's algorithm (NaN row → NaN, all `−∞` → zeros, max
//!   subtracted, divide by the sum) with a vectorised `exp` ([`exp`]) and an `N`-lane sum.
//!   [`exp`] is Cephes' `expf`: `n = round(x·log₂e)`, `r = x − n·ln2` in two steps, a
//!   degree-7 polynomial, `·2ⁿ` through the exponent bits. It is within 3 ulps of the
//!   exact value for every argument `≤ 0` that does not underflow, and flushes results
//!   below `f32::MIN_POSITIVE` (arguments below −87.3) to zero where libm returns a
//!   subnormal: an absolute error below `1.2e-38`. Both are inside the conformance
//!   suite's allowance for `exp` (`EXP_ULPS` = 16 ulps) and its absolute `TINY` terms.
//!   The reference's exact `expf` costs ~5 ns per score, which at a depth of 4096
//!   positions is most of a decode step's attention. Where the family has no fused
//!   multiply-add the range reduction `x − n·C1` is still exact (`C1 = 0.693359375` has 9
//!   significant bits, `|n| ≤ 128`) and the polynomial adds under an ulp of rounding;
//! - [`swiglu`] and [`geglu`] are `g / (1 + e^(k(g))) · u` through [`exp`] (see their
//!   docs for the bounds); every tail runs through a padded vector, so every element
//!   takes the same operations.

use kvcore::backend::PartStat;

/// The most lanes of any family: the size of the padded tail buffers.
const MAX_N: usize = 16;

/// The f32 lane operations of one instruction-set family, on its token.
///
/// # Safety
/// A value of an implementing type may exist only where the CPU runs the family's
/// instructions (it is created by run-time detection, or the module was compiled for
/// them): the methods are safe because holding `self` proves it.
pub(crate) unsafe trait F32Lanes: Copy {
    /// Lanes per vector (at most 16).
    const N: usize;
    /// A vector of `N` f32.
    type V: Copy;

    /// All lanes `0.0`.
    fn zero(self) -> Self::V;
    /// All lanes `x`.
    fn splat(self, x: f32) -> Self::V;
    /// `s[0..N]`.
    ///
    /// # Panics
    /// If `s.len() < N`.
    fn load(self, s: &[f32]) -> Self::V;
    /// `s[0..N] ← v`.
    ///
    /// # Panics
    /// If `s.len() < N`.
    fn store(self, s: &mut [f32], v: Self::V);
    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `−a` (the sign bit flipped).
    fn neg(self, a: Self::V) -> Self::V;
    /// `acc + a·b`: one rounding where the family has a fused multiply-add, else two.
    fn mul_add(self, acc: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// `c − a·b`: one rounding where the family has a fused multiply-add, else two.
    fn mul_sub(self, c: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// `x` clamped to `[lo, hi]` (any value in the lanes where `x` is NaN).
    fn clamp(self, x: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
    /// `x` rounded to the nearest integer, ties to even.
    fn round(self, x: Self::V) -> Self::V;
    /// `2ⁿ` through the exponent bits, for integral `n` in `−126 ..= 128` (`n = 128`
    /// gives `∞`); any value where `n` is NaN.
    fn pow2(self, n: Self::V) -> Self::V;
    /// `y`, with `+0` in the lanes where `x < lo`.
    fn zero_below(self, x: Self::V, lo: Self::V, y: Self::V) -> Self::V;
    /// `y`, with NaN in the lanes where `x` is NaN.
    fn nan_where_nan(self, x: Self::V, y: Self::V) -> Self::V;
    /// The sum of the `N` lanes, in the family's fixed order.
    fn hsum(self, v: Self::V) -> f32;
}

/// The methods of an [`F32Lanes`] impl that are one intrinsic on two vectors:
/// `binary_lane_ops!(add => _mm256_add_ps, sub => _mm256_sub_ps, …)`.
macro_rules! binary_lane_ops {
    ($($name:ident => $op:path),* $(,)?) => {$(
        #[inline(always)]
        #[allow(unused_unsafe, reason = "SIMD128's intrinsics are safe functions")]
        fn $name(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: the token proves the family's instructions (`F32Lanes`' contract).
            unsafe { $op(a, b) }
        }
    )*};
}
pub(crate) use binary_lane_ops;

/// The loops of this module instantiated in one family's target features:
/// `f32_loops!(Token, #[target_feature(enable = "…")])` implements it.
///
/// # Safety (every method)
/// The CPU runs the family's instructions: a token exists (see [`F32Lanes`]).
pub(crate) trait F32Loops: F32Lanes {
    /// [`dot`].
    unsafe fn run_dot(self, a: &[f32], b: &[f32]) -> f32;
    /// [`scores`].
    unsafe fn run_scores<'a>(
        self,
        q: &[f32],
        keys: impl Iterator<Item = &'a [f32]>,
        scale: f32,
        scores: &mut [f32],
    );
    /// [`weighted_sum`].
    unsafe fn run_weighted_sum<'a>(
        self,
        p: &[f32],
        values: impl Iterator<Item = &'a [f32]>,
        out: &mut [f32],
    );
    /// [`exp_sum`].
    unsafe fn run_exp_sum(self, x: &mut [f32]) -> PartStat;
    /// [`softmax`].
    unsafe fn run_softmax(self, x: &mut [f32]);
    /// [`swiglu`].
    unsafe fn run_swiglu(self, gate: &[f32], up: &[f32], out: &mut [f32]);
    /// [`geglu`].
    unsafe fn run_geglu(self, gate: &[f32], up: &[f32], out: &mut [f32]);
    /// [`scale_mul`].
    unsafe fn run_scale_mul(self, x: &[f32], r: f32, w: &[f32], out: &mut [f32]);
    /// [`add`].
    unsafe fn run_add(self, acc: &mut [f32], x: &[f32]);
}

/// `impl F32Loops for $token`, every loop inlined into a method carrying `$attr` (the
/// family's `#[target_feature]`, or nothing where the features are compiled in).
macro_rules! f32_loops {
    ($token:ty $(, #[$attr:meta])*) => {
        impl $crate::lanes::F32Loops for $token {
            $(#[$attr])*
            unsafe fn run_dot(self, a: &[f32], b: &[f32]) -> f32 {
                $crate::lanes::dot(self, a, b)
            }
            $(#[$attr])*
            unsafe fn run_scores<'a>(
                self,
                q: &[f32],
                keys: impl Iterator<Item = &'a [f32]>,
                scale: f32,
                scores: &mut [f32],
            ) {
                $crate::lanes::scores(self, q, keys, scale, scores)
            }
            $(#[$attr])*
            unsafe fn run_weighted_sum<'a>(
                self,
                p: &[f32],
                values: impl Iterator<Item = &'a [f32]>,
                out: &mut [f32],
            ) {
                $crate::lanes::weighted_sum(self, p, values, out)
            }
            $(#[$attr])*
            unsafe fn run_exp_sum(self, x: &mut [f32]) -> kvcore::backend::PartStat {
                $crate::lanes::exp_sum(self, x)
            }
            $(#[$attr])*
            unsafe fn run_softmax(self, x: &mut [f32]) {
                $crate::lanes::softmax(self, x)
            }
            $(#[$attr])*
            unsafe fn run_swiglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
                $crate::lanes::swiglu(self, gate, up, out)
            }
            $(#[$attr])*
            unsafe fn run_geglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
                $crate::lanes::geglu(self, gate, up, out)
            }
            $(#[$attr])*
            unsafe fn run_scale_mul(self, x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
                $crate::lanes::scale_mul(self, x, r, w, out)
            }
            $(#[$attr])*
            unsafe fn run_add(self, acc: &mut [f32], x: &[f32]) {
                $crate::lanes::add(self, acc, x)
            }
        }
    };
}
pub(crate) use f32_loops;

/// `Σ_j a_j·b_j` (see the module docs for the order).
///
/// # Panics
/// If the lengths differ.
#[inline(always)]
pub(crate) fn dot<L: F32Lanes>(l: L, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let (n, w) = (a.len(), L::N);
    let mut acc = [l.zero(); 4];
    let mut i = 0;
    while i + 4 * w <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            let j = i + w * k;
            *lane = l.mul_add(*lane, l.load(&a[j..]), l.load(&b[j..]));
        }
        i += 4 * w;
    }
    while i + w <= n {
        acc[0] = l.mul_add(acc[0], l.load(&a[i..]), l.load(&b[i..]));
        i += w;
    }
    let v = l.add(l.add(acc[0], acc[1]), l.add(acc[2], acc[3]));
    let mut s = l.hsum(v);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// `scores[t] ← scale · q·k_t` for the rows `k_t` of `keys`, in order ([`dot`]).
///
/// # Panics
/// If a row's length is not `q.len()`, or `keys` yields fewer rows than `scores` holds.
#[inline(always)]
pub(crate) fn scores<'a, L: F32Lanes>(
    l: L,
    q: &[f32],
    mut keys: impl Iterator<Item = &'a [f32]>,
    scale: f32,
    scores: &mut [f32],
) {
    for s in scores.iter_mut() {
        *s = scale * dot(l, q, keys.next().expect("one key row per score"));
    }
}

/// `out ← out + Σ_t p_t · v_t` for the rows `v_t` of `values`, in `t` order (see the
/// module docs for each output's chain).
///
/// # Panics
/// If a row's length is not `out.len()`, or `values` yields fewer rows than `p` holds.
#[inline(always)]
pub(crate) fn weighted_sum<'a, L: F32Lanes>(
    l: L,
    p: &[f32],
    mut values: impl Iterator<Item = &'a [f32]>,
    out: &mut [f32],
) {
    /// Rows gathered per pass over the output columns.
    const ROWS: usize = 64;
    /// Output vectors kept in registers.
    const VECS: usize = 8;
    let (d, w) = (out.len(), L::N);
    let mut rows: [&[f32]; ROWS] = [&[]; ROWS];
    for pc in p.chunks(ROWS) {
        for r in rows.iter_mut().take(pc.len()) {
            *r = values.next().expect("one value row per weight");
            assert_eq!(r.len(), d, "value row length");
        }
        let rows = &rows[..pc.len()];
        let mut c0 = 0;
        while c0 + w <= d {
            let nv = ((d - c0) / w).min(VECS);
            let mut acc = [l.zero(); VECS];
            for (v, a) in acc.iter_mut().enumerate().take(nv) {
                *a = l.load(&out[c0 + w * v..]);
            }
            for (&pt, row) in pc.iter().zip(rows) {
                let pv = l.splat(pt);
                for (v, a) in acc.iter_mut().enumerate().take(nv) {
                    *a = l.mul_add(*a, pv, l.load(&row[c0 + w * v..]));
                }
            }
            for (v, a) in acc.iter().enumerate().take(nv) {
                l.store(&mut out[c0 + w * v..], *a);
            }
            c0 += w * nv;
        }
        for j in c0..d {
            for (&pt, row) in pc.iter().zip(rows) {
                out[j] += pt * row[j];
            }
        }
    }
}

/// `e^x` lane by lane (see the module docs for the error, which holds for positive
/// arguments too up to 88.37); from `127.5·ln 2 ≈ 88.376` on, where `n` reaches 128, the
/// result is `∞` (exactly so past `ln(f32::MAX) ≈ 88.723`); NaN lanes give NaN.
#[inline(always)]
pub(crate) fn exp<L: F32Lanes>(l: L, x: L::V) -> L::V {
    // Cephes expf: e^x = 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2.
    let lo = l.splat(-87.336_55); // ln(f32::MIN_POSITIVE)
    let xc = l.clamp(x, lo, l.splat(88.722_84));
    let n = l.round(l.mul(xc, l.splat(std::f32::consts::LOG2_E)));
    let r = l.mul_sub(xc, n, l.splat(0.693_359_4));
    let r = l.mul_sub(r, n, l.splat(-2.121_944_4e-4));
    let mut y = l.splat(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    ] {
        y = l.mul_add(l.splat(c), y, r);
    }
    let r2 = l.mul(r, r);
    let y = l.add(l.mul_add(r, y, r2), l.splat(1.0));
    let y = l.mul(y, l.pow2(n));
    l.nan_where_nan(x, l.zero_below(x, lo, y))
}

/// `x ← e^(x − max)` in place with [`exp`] and an `N`-lane sum, returning the max and the
/// sum (`Kernel::exp_sum`: a NaN row becomes NaN, an empty or all `−∞` row zeros with
/// `PartStat::EMPTY`).
#[inline(always)]
pub(crate) fn exp_sum<L: F32Lanes>(l: L, x: &mut [f32]) -> PartStat {
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
    let m = l.splat(max);
    let mut sum = l.zero();
    let mut chunks = x.chunks_exact_mut(L::N);
    for c in chunks.by_ref() {
        let e = exp(l, l.sub(l.load(c), m));
        l.store(c, e);
        sum = l.add(sum, e);
    }
    let tail = chunks.into_remainder();
    let mut s = l.hsum(sum);
    if !tail.is_empty() {
        let mut buf = [f32::NEG_INFINITY; MAX_N];
        buf[..tail.len()].copy_from_slice(tail);
        let mut e = [0.0f32; MAX_N];
        l.store(&mut e, exp(l, l.sub(l.load(&buf), m)));
        for (t, &v) in tail.iter_mut().zip(&e) {
            *t = v;
            s += v;
        }
    }
    PartStat { max, sum: s }
}

/// Softmax of `x` in place (see the module docs): [`exp_sum`], then each value divided
/// by the sum.
#[inline(always)]
pub(crate) fn softmax<L: F32Lanes>(l: L, x: &mut [f32]) {
    let stat = exp_sum(l, x);
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
#[inline(always)]
pub(crate) fn scale_mul<L: F32Lanes>(l: L, x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
    assert!(x.len() == w.len() && x.len() == out.len());
    let rv = l.splat(r);
    let mut oc = out.chunks_exact_mut(L::N);
    let (mut xc, mut wc) = (x.chunks_exact(L::N), w.chunks_exact(L::N));
    for ((o, xv), wv) in oc.by_ref().zip(xc.by_ref()).zip(wc.by_ref()) {
        l.store(o, l.mul(l.mul(l.load(xv), rv), l.load(wv)));
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
#[inline(always)]
pub(crate) fn add<L: F32Lanes>(l: L, acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    let mut ac = acc.chunks_exact_mut(L::N);
    let mut xc = x.chunks_exact(L::N);
    for (a, xv) in ac.by_ref().zip(xc.by_ref()) {
        l.store(a, l.add(l.load(a), l.load(xv)));
    }
    for (a, &xv) in ac.into_remainder().iter_mut().zip(xc.remainder()) {
        *a += xv;
    }
}

/// `out ← act(gate) ⊙ up` with `act(g) = g / (1 + e^(k(g)))`, `N` lanes at a time: `k`
/// maps a vector of `g` to the exponent. SiLU is `k(g) = −g`; tanh-GELU,
/// `½g(1 + tanh z) = g / (1 + e^(−2z))`, is `k(g) = −2z`. The tail runs through a padded
/// vector, so every element takes the same operations.
///
/// # Panics
/// If the lengths differ.
#[inline(always)]
fn glu<L: F32Lanes, const GELU: bool>(l: L, gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && gate.len() == out.len());
    let mut oc = out.chunks_exact_mut(L::N);
    let (mut gc, mut uc) = (gate.chunks_exact(L::N), up.chunks_exact(L::N));
    for ((o, g), u) in oc.by_ref().zip(gc.by_ref()).zip(uc.by_ref()) {
        l.store(o, glu_lanes::<L, GELU>(l, l.load(g), l.load(u)));
    }
    let tail = oc.into_remainder();
    if !tail.is_empty() {
        let (mut g, mut u, mut o) = ([0.0f32; MAX_N], [0.0f32; MAX_N], [0.0f32; MAX_N]);
        g[..tail.len()].copy_from_slice(gc.remainder());
        u[..tail.len()].copy_from_slice(uc.remainder());
        l.store(&mut o, glu_lanes::<L, GELU>(l, l.load(&g), l.load(&u)));
        tail.copy_from_slice(&o[..tail.len()]);
    }
}

/// `g / (1 + e^(k(g))) · u` on one vector, `k` SwiGLU's `−g` or GeGLU's `−2z` (see
/// [`geglu`]). A function, not a closure: a closure the compiler declines to inline
/// would be compiled outside the family's `#[target_feature]` entry point, with every
/// lane operation in it a call.
#[inline(always)]
fn glu_lanes<L: F32Lanes, const GELU: bool>(l: L, g: L::V, u: L::V) -> L::V {
    let k = if GELU {
        let g3 = l.mul(l.mul(g, g), g);
        l.mul(
            l.splat(-2.0 * 0.797_884_6),
            l.mul_add(g, l.splat(0.044_715), g3),
        )
    } else {
        l.neg(g)
    };
    let e = exp(l, k);
    l.mul(l.div(g, l.add(l.splat(1.0), e)), u)
}

/// SwiGLU `out_j ← g_j / (1 + e^(−g_j)) · u_j`: the reference's formula with [`exp`]
/// (within 3 ulps); for `g < −88.4` the exponential saturates to `∞` and the result is
/// `−0`, as in the reference. Within the conformance suite's SwiGLU bound (`EXP_ULPS`).
#[inline(always)]
pub(crate) fn swiglu<L: F32Lanes>(l: L, gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu::<L, false>(l, gate, up, out);
}

/// GeGLU with tanh-GELU written as a logistic: `½g(1 + tanh z) = g / (1 + e^(−2z))`,
/// `z = √(2/π)·(g + 0.044715·g³)`, so no `1 + tanh z` cancels for negative `g`:
/// `z` is within `4u` relative (one multiply-add, the cube's two products, the scale),
/// `e^(−2z)` within 3 ulps plus `|2z|·4u` relative from its argument, which the logistic
/// damps by `σ(2z)·|2z| < 0.56`, so the result is within about `6u·|g·u|` — inside the
/// conformance suite's GeGLU bound of `3u·|out| + (EXP_ULPS + 5)·u·½|g·u|`. Limits as the
/// reference: for large `g` the exponential is `0` (result `g·u`), for very negative `g`
/// it is `∞` (result `−0`); NaN stays NaN.
#[inline(always)]
pub(crate) fn geglu<L: F32Lanes>(l: L, gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu::<L, true>(l, gate, up, out);
}
