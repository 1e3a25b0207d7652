//! SIMD128 f32 kernels: dot products, attention scores, softmax and weighted sums,
//! RMSNorm's sum of squares and products, the residual add, SwiGLU and GeGLU.
//!
//! Numerics of [`dot`]: four independent 4-lane accumulators over 16-element chunks
//! (hiding the add latency), then one accumulator over 4-element chunks, an across-lane
//! add, and a scalar tail. SIMD128 has no fused multiply-add, so each product is rounded
//! and then added: every lane accumulates a strided subset of the products, and the
//! result differs from the scalar left-to-right sum by rounding only — both are within
//! `γ_(n+1)·Σ|a_j b_j|` of the exact value (one more rounding per term than with FMA,
//! inside the `+ 2` of the tolerance in `tests/simd_paths.rs`; with relaxed SIMD,
//! [`mul_add`] may be fused, see `mod.rs`). The element-wise kernels
//! (`scale_mul`, `add`) round exactly as the scalar code.
//!
//! [`softmax`], [`swiglu`] and [`geglu`] are the AVX2 and NEON kernels' algorithms four
//! lanes at a time, with [`exp4`], the same Cephes `expf` (the same constants and clamps)
//! evaluated with separate multiplies and adds, as Cephes itself wrote it: the range
//! reduction `x − n·C1` is exact (`C1 = 0.693359375` has 9 significant bits, `|n| ≤ 128`),
//! the degree-5 polynomial on `|r| ≤ ln2/2` adds under an ulp of rounding, so the result
//! stays within 3 ulps where it is normal, zero below `ln(f32::MIN_POSITIVE)`, `∞` from
//! 88.38 on, NaN for NaN — the bounds `tests/simd_paths.rs` holds the other vector paths to.

use core::arch::wasm32::*;
use kvcore::backend::PartStat;

/// Four f32 from `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
pub(super) fn load(s: &[f32]) -> v128 {
    assert!(s.len() >= 4);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_load` has no alignment requirement.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// Store four f32 to `s[0..4]`.
///
/// # Panics
/// If `s.len() < 4`.
#[inline]
pub(super) fn store(s: &mut [f32], v: v128) {
    assert!(s.len() >= 4);
    // SAFETY: 16 bytes are in bounds (asserted); `v128_store` has no alignment requirement.
    unsafe { v128_store(s.as_mut_ptr().cast(), v) }
}

/// The sum of the four lanes, `(l0 + l2) + (l1 + l3)`.
#[inline]
pub(super) fn hsum(v: v128) -> f32 {
    let h = f32x4_add(v, i32x4_shuffle::<2, 3, 0, 1>(v, v));
    f32x4_extract_lane::<0>(h) + f32x4_extract_lane::<1>(h)
}

/// `acc + a·b`, rounded twice (SIMD128 has no fused multiply-add).
#[cfg(not(target_feature = "relaxed-simd"))]
#[inline]
pub(super) fn mul_add(acc: v128, a: v128, b: v128) -> v128 {
    f32x4_add(acc, f32x4_mul(a, b))
}

/// `acc + a·b`, rounded once or twice as the engine chooses (relaxed SIMD's
/// `f32x4.relaxed_madd`: one FMA on a CPU that has it).
#[cfg(target_feature = "relaxed-simd")]
#[inline]
pub(super) fn mul_add(acc: v128, a: v128, b: v128) -> v128 {
    f32x4_relaxed_madd(a, b, acc)
}

/// `Σ_j a_j·b_j` (see the module docs for the order).
///
/// # Panics
/// If the lengths differ.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let n = a.len();
    let mut acc = [f32x4_splat(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (l, lane) in acc.iter_mut().enumerate() {
            let j = i + 4 * l;
            *lane = mul_add(*lane, load(&a[j..]), load(&b[j..]));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = mul_add(acc[0], load(&a[i..]), load(&b[i..]));
        i += 4;
    }
    let v = f32x4_add(f32x4_add(acc[0], acc[1]), f32x4_add(acc[2], acc[3]));
    let mut s = hsum(v);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

/// `y ← y + α·x`.
///
/// # Panics
/// If the lengths differ.
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let a = f32x4_splat(alpha);
    let mut yc = y.chunks_exact_mut(4);
    let mut xc = x.chunks_exact(4);
    for (yv, xv) in yc.by_ref().zip(xc.by_ref()) {
        store(yv, mul_add(load(yv), a, load(xv)));
    }
    for (yv, &xv) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *yv += alpha * xv;
    }
}

/// `scores[t] ← scale · q·k_t` for the rows `k_t` of `keys`, in order.
///
/// # Panics
/// If a row's length is not `q.len()`, or `keys` yields fewer rows than `scores` holds.
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
pub(super) fn scale_mul(x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
    assert!(x.len() == w.len() && x.len() == out.len());
    let rv = f32x4_splat(r);
    let mut oc = out.chunks_exact_mut(4);
    let (mut xc, mut wc) = (x.chunks_exact(4), w.chunks_exact(4));
    for ((o, xv), wv) in oc.by_ref().zip(xc.by_ref()).zip(wc.by_ref()) {
        store(o, f32x4_mul(f32x4_mul(load(xv), rv), load(wv)));
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
pub(super) fn add(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    let mut ac = acc.chunks_exact_mut(4);
    let mut xc = x.chunks_exact(4);
    for (a, xv) in ac.by_ref().zip(xc.by_ref()) {
        store(a, f32x4_add(load(a), load(xv)));
    }
    for (a, &xv) in ac.into_remainder().iter_mut().zip(xc.remainder()) {
        *a += xv;
    }
}

/// `e^x` lane by lane (Cephes `expf`; see the module docs and the AVX2 `exp8`).
#[inline]
fn exp4(x: v128) -> v128 {
    // e^x = 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2.
    let lo = f32x4_splat(-87.336_55); // ln(f32::MIN_POSITIVE)
    let number = f32x4_eq(x, x); // all ones where x is not NaN
    let tiny = f32x4_lt(x, lo);
    // pmin/pmax: the clamps of a NaN lane give NaN or a bound; that lane is replaced below.
    let xc = f32x4_pmin(f32x4_pmax(x, lo), f32x4_splat(88.722_84));
    let n = f32x4_nearest(f32x4_mul(xc, f32x4_splat(std::f32::consts::LOG2_E)));
    let r = f32x4_sub(xc, f32x4_mul(n, f32x4_splat(0.693_359_4)));
    let r = f32x4_sub(r, f32x4_mul(n, f32x4_splat(-2.121_944_4e-4)));
    let mut y = f32x4_splat(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    ] {
        y = mul_add(f32x4_splat(c), y, r);
    }
    let r2 = f32x4_mul(r, r);
    let y = f32x4_add(mul_add(r, y, r2), f32x4_splat(1.0));
    // 2^n for n in −126 ..= 128: the biased exponent in the float's bits (n = 128 gives
    // the bits of ∞). `n` is integral and in range, so the truncating conversion is exact;
    // NaN lanes convert to 0 here and are replaced below.
    let bits = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    let y = f32x4_mul(y, bits);
    let y = v128_andnot(y, tiny);
    v128_bitselect(y, f32x4_splat(f32::NAN), number)
}

/// `x ← e^(x − max)` in place with [`exp4`] and a 4-lane sum, returning the max and the
/// sum (`Kernel::exp_sum`: a NaN row becomes NaN, an empty or all `−∞` row zeros with
/// `PartStat::EMPTY`).
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
    let m = f32x4_splat(max);
    let mut sum = f32x4_splat(0.0);
    let mut chunks = x.chunks_exact_mut(4);
    for c in chunks.by_ref() {
        let e = exp4(f32x4_sub(load(c), m));
        store(c, e);
        sum = f32x4_add(sum, e);
    }
    let tail = chunks.into_remainder();
    let mut s = hsum(sum);
    if !tail.is_empty() {
        let mut buf = [f32::NEG_INFINITY; 4];
        buf[..tail.len()].copy_from_slice(tail);
        let mut e = [0.0f32; 4];
        store(&mut e, exp4(f32x4_sub(load(&buf), m)));
        for (t, &v) in tail.iter_mut().zip(&e) {
            *t = v;
            s += v;
        }
    }
    PartStat { max, sum: s }
}

/// Softmax of `x` in place: the reference's algorithm (NaN row → NaN, all `−∞` → zeros,
/// max subtracted, divide by the sum) through [`exp_sum`].
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
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], k4: impl Fn(v128) -> v128) {
    assert!(gate.len() == up.len() && gate.len() == out.len());
    let one = f32x4_splat(1.0);
    let act = |g: v128, u: v128| {
        let e = exp4(k4(g));
        f32x4_mul(f32x4_div(g, f32x4_add(one, e)), u)
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
pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, |g| f32x4_neg(g));
}

/// GeGLU as the logistic `g / (1 + e^(−2z))`, `z = √(2/π)·(g + 0.044715·g³)` (the AVX2
/// `geglu`'s formula and bound).
pub(super) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let c = f32x4_splat(0.044_715);
    let minus_2s = f32x4_splat(-2.0 * 0.797_884_6);
    glu(gate, up, out, |g| {
        let g3 = f32x4_mul(f32x4_mul(g, g), g);
        f32x4_mul(minus_2s, mul_add(g, c, g3))
    });
}

/// Reads one byte of each 64-byte cache line of piece `i + 1` of `data` cut into
/// `unit`-byte pieces (nothing past the end), and drops it. WebAssembly has no prefetch
/// instruction, and the hardware prefetchers stop at every 4 KiB page of the weights, so
/// the GEMVs touch the next row (or row pair) before they multiply one: its lines are
/// then fetched side by side, not one page's first lines after another as the loop
/// reaches them. SmolLM2's 8-bit decode under wasmtime and Node measured faster with it
/// (BENCHMARKS.md); touching two or more pieces ahead measured slower than one.
#[inline(always)]
pub(super) fn touch_next(data: &[u8], unit: usize, i: usize) {
    let start = (i + 1) * unit;
    if let Some(piece) = data.get(start..(start + unit).min(data.len())) {
        for line in piece.chunks(64) {
            // SAFETY: `line` is a non-empty chunk of `data`, so its first byte is in
            // bounds; a volatile read is emitted even though its value is unused.
            unsafe { core::ptr::read_volatile(line.as_ptr()) };
        }
    }
}
