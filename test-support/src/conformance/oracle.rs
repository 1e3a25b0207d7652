//! Float64 reference implementations of every kernel, each output paired with a bound on
//! the error of a correct f32 implementation.
//!
//! The oracle computes in f64 (53-bit) from the same f32 inputs, so its own error is
//! ~2^-53 relative: negligible next to f32's `u = 2^-24`. Each bound below is a
//! worst-case (not statistical) bound on `|f32 kernel − exact|`, following the standard
//! model `fl(a ∘ b) = (a ∘ b)(1 + δ)`, `|δ| ≤ u`, plus [`TINY`] of absolute error per
//! operation for gradual underflow. Two correct implementations therefore differ by at
//! most twice the bound ([`check_pair`], the conformance suite); [`check`] holds one
//! implementation to the bound itself (kvcore's `scalar_reference.rs` holds the scalar
//! backend to it).
//!
//! Sums. A sum of `n` rounded terms (any order: sequential, SIMD lanes, blocked, with
//! or without FMA) is within `γ_n·Σ|terms|` of the exact sum, `γ_n ≈ n·u`, in the worst
//! case. That worst case needs every rounding error to point the same way; for data like
//! ours, with rounding errors independent and centred, Higham & Mary's probabilistic
//! bound (SIAM J. Sci. Comput. 41(5), 2019) gives `λ·√n·u·Σ|terms|` with probability at
//! least `1 − 2n·exp(−λ²/2)`. With `λ = 8` that is `1 − 1.5e-11` per output at
//! `n = 576`: never seen in practice, while a fixed `n·u` would let through errors 24×
//! larger at `n = 576`. Every bound below counts a sum of `n` terms as
//! [`sum_ulps`]`(n) = min(n, 8·√n)` ulps (at `n = 576`: 192 ulps, `1.1e-5` relative).
//!
//! The bounds, per output:
//! - matmul `y = Σ_j w_j x_j` over `n` terms: `(sum_ulps(n) + 2)·u·Σ_j mag_j·|x_j| +
//!   (n + 2)·TINY`: the `+ 2` covers the product and a per-block scale multiply, and `mag`
//!   (see [`Decoded`]) covers kernels that factor a `Q4_1` block as `d·Σq·x + m·Σx`. For
//!   `n = 576` two implementations may differ by `2.3e-5·Σ|terms|`, for `n = 1536` by
//!   `3.8e-5·Σ|terms|`; activations rounded to bf16 or Q8 (`~4e-3` relative per term)
//!   fail it, as do f16 accumulation and any wrong scale or nibble order.
//! - RoPE `(a·c − b·s, a·s + b·c)`: `4·u·(|a| + |b|) + 2·TINY`: `c`, `s` rounded once from
//!   f64 (`≤ u` each, and `|c|, |s| ≤ 1`), two products and a sum. An f32 angle is
//!   `~5e-4` off at position 8192 and fails this.
//! - softmax `p_i = e^(x_i − m)/Σ_j e^(x_j − m)`: relative
//!   `(2·EXP_ULPS + sum_ulps(n) + 3)·u + u·(|x_i − m| + spread)` where `spread = max_j |x_j − m|`
//!   over finite entries: `exp` within [`EXP_ULPS`] ulps, the rounding of `x − m` moves
//!   the exponent by `u·|x − m|`, the sum of `n` positive terms, one division.
//! - attention of one head: scores `s_t = scale·q·k_t` with absolute error
//!   `E_t = (sum_ulps(head_dim) + 3)·u·scale·Σ_j|q_j k_tj|`; that moves `p_t` by a relative
//!   `2·max_t E_t`; with the softmax error `S` above (worst `i`) and the weighted sum over
//!   `n_keys` values, output `j` is within
//!   `(2·max E + S + (sum_ulps(n_keys) + 2)·u)·Σ_t p_t·|v_tj| + (n_keys + 2)·TINY`.
//! - RMSNorm `x_j·r·w_j`, `r = (Σx²/d + eps)^(−1/2)`: the sum of `d` squares is within
//!   `(sum_ulps(d) + 1)·u` relative, the mean and `eps` add `2u`, the square root halves the
//!   relative error, the reciprocal square root and the two products add up to `6u`
//!   (allowing an approximate `rsqrt` refined to ~2 ulps):
//!   `((sum_ulps(d) + 3)/2 + 9)·u·|out|`.
//! - SwiGLU `g/(1 + e^(−g))·u`: `exp`, the add, the division and the product:
//!   `(EXP_ULPS + 6)·u·|out|`, plus `1e-30·|u|`: for `g < −88`, `e^(−g)` overflows f32 and
//!   the f32 formula returns `−0` where the exact value is below `1e-36`.
//! - GeGLU `½·g·(1 + tanh(z))·u`, `z = √(2/π)·(g + 0.044715·g³)`: `z` is within `6u`
//!   relative (the two terms have the same sign, so nothing cancels); through `tanh`
//!   that is at most `6u·max(z·sech²z) < 3u` absolute, plus `tanh`'s own `EXP_ULPS` ulps
//!   and the add's rounding: `1 + tanh(z)` within `(EXP_ULPS + 5)·u` absolute, which
//!   cancellation for negative `g` makes large relative to the result; the three products
//!   add `3u` relative: `3u·|out| + (EXP_ULPS + 5)·u·½|g·u|`.
//! - add: IEEE addition is correctly rounded, `u·|out|`; two correct implementations
//!   agree bit for bit, which the conformance suite requires.

use kvcore::backend::{Q8Acts, Q8Layout, Rope, RopeStyle};

use super::decode::{Decoded, dot_f64};
use super::inputs::Matrix;

/// The unit roundoff of f32, `2^-24`.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The smallest positive normal f32, `2^-126`: below it the relative error model of
/// floating point fails (gradual underflow, or flush-to-zero in SIMD units), so each
/// rounding may add this much absolute error.
pub const TINY: f64 = f32::MIN_POSITIVE as f64;

/// Relative error allowed for an f32 `exp`, in ulps. libm's `expf` is within 1 ulp; a
/// vectorised polynomial `exp` is typically within 2–4. 16 leaves room and still rejects
/// an approximation good only to ~1e-4.
pub const EXP_ULPS: f64 = 16.0;

/// The `λ` of the probabilistic sum bound (see the module docs).
const LAMBDA: f64 = 8.0;

/// Relative error, in units of `u`, of a sum of `n` terms: the worst case `n`, or the
/// probabilistic `λ·√n` when smaller (see the module docs).
pub fn sum_ulps(n: usize) -> f64 {
    let n = n as f64;
    n.min(LAMBDA * n.sqrt())
}

/// An exact output and the error bound of a correct f32 implementation.
#[derive(Clone, Copy, Debug)]
pub struct Bounded {
    /// The exact output (to f64 accuracy).
    pub value: f64,
    /// The most a correct f32 implementation may differ from `value`.
    pub bound: f64,
}

/// `y = W x` for every row of `m`.
pub fn gemv(m: &Matrix, x: &[f32]) -> Vec<Bounded> {
    (0..m.rows).map(|r| dot_bounded(&m.row(r), x)).collect()
}

/// `y = W x̂` with `x̂` the reference 8-bit quantisation of `x` in the layout `W`'s format
/// meets (`kvcore::backend::q8`): the formula's exact value from `q8::row_terms` (integer
/// dot products, f64 scaling). Bound: every term carries at most 3 roundings (`d_w·d_a`,
/// the conversion of a lane's integer sum to f32 when it exceeds `2^24`, its product with
/// that sum, or the two of `m·(d_a·s)`), and a kernel sums at most `K = 9·blocks` terms
/// (8 partial dots and 1 offset per activation block of 32 or 256) in any order, so
/// `(K + 3)·u·Σ_b mag_b`, plus [`TINY`] per term. The quantisation itself must be exact
/// (it is compared bit for bit in the SIMD path tests).
pub fn gemv_q8(m: &Matrix, x: &[f32]) -> Vec<Bounded> {
    let layout = Q8Layout::of(m.dtype).expect("a format with an 8-bit path");
    let xq = Q8Acts::from_f32(layout, x).expect("whole blocks");
    let w = m.weights();
    let k = 9.0 * (m.cols / layout.block_len()) as f64;
    (0..m.rows)
        .map(|r| {
            let (value, mag) = kvcore::backend::q8::row_terms(&w, r, &xq)
                .fold((0.0, 0.0), |(v, a), (t, b)| (v + t, a + b));
            Bounded {
                value,
                bound: (k + 3.0) * (U * mag + TINY),
            }
        })
        .collect()
}

/// `Y = X Wᵀ`, `[n, rows]`.
pub fn gemm(m: &Matrix, x: &[f32]) -> Vec<Bounded> {
    let rows: Vec<Vec<Decoded>> = (0..m.rows).map(|r| m.row(r)).collect();
    x.chunks_exact(m.cols.max(1))
        .flat_map(|xt| rows.iter().map(move |w| dot_bounded(w, xt)))
        .collect()
}

fn dot_bounded(w: &[Decoded], x: &[f32]) -> Bounded {
    let (value, abs) = dot_f64(w, x);
    let n = w.len();
    Bounded {
        value,
        bound: (sum_ulps(n) + 2.0) * U * abs + (n as f64 + 2.0) * TINY,
    }
}

/// `(cos, sin)` of pair `i`'s angle at `pos`, in f64.
fn angle(pos: usize, i: usize, head_dim: usize, base: f32) -> (f64, f64) {
    let theta = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
    let (s, c) = (pos as f64 * theta).sin_cos();
    (c, s)
}

/// RoPE of `x: [positions.len(), n_heads, head_dim]`.
pub fn rope(x: &[f32], head_dim: usize, positions: &[usize], rope: &Rope) -> Vec<Bounded> {
    let mut out = vec![
        Bounded {
            value: 0.0,
            bound: 0.0
        };
        x.len()
    ];
    if x.is_empty() {
        return out;
    }
    let row_len = x.len() / positions.len();
    let half = head_dim / 2;
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..row_len / head_dim {
            let at = t * row_len + h * head_dim;
            for i in 0..half {
                let (ia, ib) = match rope.style {
                    RopeStyle::Interleaved => (at + 2 * i, at + 2 * i + 1),
                    RopeStyle::Halves => (at + i, at + i + half),
                };
                let (a, b) = (f64::from(x[ia]), f64::from(x[ib]));
                let (c, s) = angle(pos, i, head_dim, rope.base);
                let bound = 4.0 * U * (a.abs() + b.abs()) + 2.0 * TINY;
                out[ia] = Bounded {
                    value: a * c - b * s,
                    bound,
                };
                out[ib] = Bounded {
                    value: a * s + b * c,
                    bound,
                };
            }
        }
    }
    out
}

/// Exact softmax of `x` (f64), with each element's relative error bound, and the worst
/// relative bound of the row. All-`−∞` rows give zeros with bound 0.
fn softmax_f64(x: &[f64]) -> (Vec<f64>, Vec<f64>, f64) {
    let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    if m == f64::NEG_INFINITY {
        return (vec![0.0; x.len()], vec![0.0; x.len()], 0.0);
    }
    let e: Vec<f64> = x.iter().map(|&v| (v - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    let spread = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |a, &v| a.max((v - m).abs()));
    let base = (2.0 * EXP_ULPS + sum_ulps(x.len()) + 3.0) * U;
    let rel: Vec<f64> = x
        .iter()
        .map(|&v| {
            let d = if v.is_finite() { (v - m).abs() } else { 0.0 };
            base + U * (d + spread)
        })
        .collect();
    (
        e.iter().map(|v| v / sum).collect(),
        rel,
        base + 2.0 * U * spread,
    )
}

/// Softmax of one row.
pub fn softmax(x: &[f32]) -> Vec<Bounded> {
    let xs: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let (p, rel, _) = softmax_f64(&xs);
    p.iter()
        .zip(&rel)
        .map(|(&value, &r)| Bounded {
            value,
            bound: r * value + 2.0 * TINY,
        })
        .collect()
}

/// One attention head over the rows it sees: `q: [hd]`, `keys`/`values: [n_keys, kv_dim]`,
/// head `kv_head` (the caller gathers the visible rows; the attention case does).
/// `spread`, for values stored rotated: each value's rotation group's mean magnitude
/// (same layout as `values`) and the rotation length, added to the bound in proportion
/// to the weights (see `cases::Encoded::spread`).
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    spread: Option<(&[f32], usize)>,
    n_keys: usize,
    kv_dim: usize,
    kv_head: usize,
    scale: f32,
) -> Vec<Bounded> {
    let hd = q.len();
    let scale = f64::from(scale);
    let col = |m: &[f32], t: usize, j: usize| f64::from(m[t * kv_dim + kv_head * hd + j]);
    let mut scores = Vec::with_capacity(n_keys);
    let mut max_err = 0.0f64;
    for t in 0..n_keys {
        let (mut s, mut a) = (0.0, 0.0);
        for (j, &qj) in q.iter().enumerate() {
            let p = f64::from(qj) * col(keys, t, j);
            s += p;
            a += p.abs();
        }
        scores.push(scale * s);
        max_err = max_err.max((sum_ulps(hd) + 3.0) * U * scale.abs() * a);
    }
    let (p, _, sm_rel) = softmax_f64(&scores);
    let rel = 2.0 * max_err + sm_rel + (sum_ulps(n_keys) + 2.0) * U;
    (0..hd)
        .map(|j| {
            let (mut v, mut a, mut sp) = (0.0, 0.0, 0.0);
            for (t, &pt) in p.iter().enumerate() {
                v += pt * col(values, t, j);
                a += pt * col(values, t, j).abs();
                if let Some((s, _)) = spread {
                    sp += pt * col(s, t, j);
                }
            }
            // Rotated values: the sum's error spread by the back-rotation, and that
            // rotation's own `log2 n` rounding steps.
            let back = spread.map_or(0.0, |(_, n)| rel + f64::from(n.trailing_zeros() + 1) * U);
            Bounded {
                value: v,
                bound: rel * a + back * sp + (n_keys as f64 + 2.0) * TINY,
            }
        })
        .collect()
}

/// RMSNorm of each `[d]` row of `x`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<Bounded> {
    let d = weight.len();
    let rel = ((sum_ulps(d) + 3.0) / 2.0 + 9.0) * U;
    x.chunks_exact(d)
        .flat_map(|row| {
            let ss: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum();
            let r = 1.0 / (ss / d as f64 + f64::from(eps)).sqrt();
            row.iter().zip(weight).map(move |(&v, &w)| {
                let value = f64::from(v) * r * f64::from(w);
                Bounded {
                    value,
                    bound: rel * value.abs() + 4.0 * TINY,
                }
            })
        })
        .collect()
}

/// `silu(gate) ⊙ up`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<Bounded> {
    gated(gate, up, |g, u| {
        let value = g / (1.0 + (-g).exp()) * u;
        Bounded {
            value,
            bound: (EXP_ULPS + 6.0) * U * value.abs() + 1e-30 * u.abs() + 4.0 * TINY,
        }
    })
}

/// `f(gate[i], up[i])` for each element, in f64.
fn gated(gate: &[f32], up: &[f32], f: impl Fn(f64, f64) -> Bounded) -> Vec<Bounded> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| f(f64::from(g), f64::from(u)))
        .collect()
}

/// `gelu_tanh(gate) ⊙ up`.
pub fn geglu(gate: &[f32], up: &[f32]) -> Vec<Bounded> {
    gated(gate, up, |g, u| {
        let z = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
        let value = 0.5 * g * (1.0 + z.tanh()) * u;
        Bounded {
            value,
            bound: 3.0 * U * value.abs() + (EXP_ULPS + 5.0) * U * 0.5 * (g * u).abs() + 4.0 * TINY,
        }
    })
}

/// `acc + x`.
pub fn add(acc: &[f32], x: &[f32]) -> Vec<Bounded> {
    acc.iter()
        .zip(x)
        .map(|(&a, &b)| {
            let value = f64::from(a) + f64::from(b);
            Bounded {
                value,
                bound: U * value.abs(),
            }
        })
        .collect()
}

/// Bit patterns, for exact comparisons that also tell `0.0` from `-0.0` and see NaN.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every `got[i]` within `bound[i]` of the exact value.
pub fn check(what: &str, got: &[f32], want: &[Bounded]) -> Result<(), String> {
    check_scaled(what, got, want, |b| b.value, 1.0)
}

/// `got[i]` within twice the bound of `reference[i]` (both are f32 implementations
/// within the bound of the exact value).
pub fn check_pair(
    what: &str,
    got: &[f32],
    reference: &[f32],
    want: &[Bounded],
) -> Result<(), String> {
    if reference.len() != want.len() {
        return Err(format!("{what}: reference has {} outputs", reference.len()));
    }
    let mut i = 0;
    check_scaled(
        what,
        got,
        want,
        |_| {
            i += 1;
            f64::from(reference[i - 1])
        },
        2.0,
    )
}

fn check_scaled(
    what: &str,
    got: &[f32],
    want: &[Bounded],
    mut target: impl FnMut(&Bounded) -> f64,
    factor: f64,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} outputs, expected {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (&g, w)) in got.iter().zip(want).enumerate() {
        let t = target(w);
        let err = (f64::from(g) - t).abs();
        if err.is_nan() || err > factor * w.bound {
            return Err(format!(
                "{what}[{i}]: got {g:e}, want {t:e} (exact {:e}): |diff| {err:e} > tolerance {:e}",
                w.value,
                factor * w.bound
            ));
        }
    }
    Ok(())
}
