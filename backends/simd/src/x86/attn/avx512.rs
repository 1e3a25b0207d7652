//! AVX-512F twins of the f32 attention kernels of [`super`], **bit for bit** the AVX2
//! ones: the same FMAs in the same order on every lane, twice as many lanes per
//! instruction. They take the rows the AVX2 kernels read as f32 — f32 keys and values,
//! and a prefill's staged rows of every type — where the CPU has AVX-512F
//! ([`enabled`]); everything else stays on the AVX2 kernels.
//!
//! - Scores ([`scores_by_8`]): two query vectors share a 512-bit register, one in each
//!   256-bit half, against each key row broadcast to both halves; each half is exactly
//!   the AVX2 kernel's 8-lane chain for its vector, reduced by the same [`lane_sums`].
//! - Weighted sums ([`weighted`]): 16 output columns per register instead of 8; an output
//!   element is still the one chain `o ← fma(p_t, v_tj, o)` in `t` order.
//!
//! So which kernel ran never shows in the results, which is what lets `Rayon<Simd>`,
//! the row-count tests and a state saved on one machine agree across machines with and
//! without AVX-512 (`x86::attn::tests` compares the two on the same inputs).

use super::{F32Rows, MAX_VECS, Rows, lane_sums, weighted_from};
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether the AVX-512F kernels run: the CPU has AVX-512F (and the AVX2, FMA and F16C
/// the AVX2 kernels need), and `KVCORE_AVX512` is not `0` (which keeps the AVX2 kernels,
/// for comparisons on one machine).
pub(in crate::x86) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && std::env::var("KVCORE_AVX512").map_or(true, |v| v != "0")
    })
}

/// `x` in both 256-bit halves.
#[inline]
#[target_feature(enable = "avx512f")]
fn both(x: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(x)))
}

/// `a` in the low 256-bit half, `b` in the high one.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
    ))
}

/// The high 256-bit half of `x`.
#[inline]
#[target_feature(enable = "avx512f")]
fn high(x: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))
}

/// The first `m ≤ 8` scores of `s` to `dst` (a whole block in one store).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn put(dst: &mut [f32], m: usize, s: __m256) {
    if m == 8 {
        super::store(dst, s);
    } else {
        let mut part = [0.0f32; 8];
        super::store(&mut part, s);
        dst[..m].copy_from_slice(&part[..m]);
    }
}

/// [`super::scores_by_8`] for f32 rows: `out[v · stride + t] ← scale · q_v·k_t`, the
/// vectors in pairs (an odd last one on 256 bits, as the AVX2 kernel runs it).
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`enabled`]).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn scores_by_8<const CH: usize>(
    qs: &[f32],
    rows: F32Rows<'_>,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let (n, hd) = (rows.rows(), rows.head_dim());
    assert!(hd == 8 * CH && CH > 0 && CH.is_multiple_of(4), "head size");
    let nv = qs.len() / hd;
    assert!(
        n == 0 || (nv - 1) * stride + n <= out.len(),
        "scores length"
    );
    let sc = _mm256_set1_ps(scale);
    // Each of the block's 8 rows as CH chunks of 8, each chunk in both halves.
    let mut buf = [[_mm512_setzero_ps(); CH]; 8];
    for t0 in (0..n).step_by(8) {
        let m = (n - t0).min(8);
        for (r, row) in buf.iter_mut().enumerate() {
            let t = t0 + r.min(m - 1);
            for (c, x) in row.iter_mut().enumerate() {
                // SAFETY: `t < n`, `8c + 8 ≤ hd`, a multiple of 8; features enabled.
                *x = both(unsafe { rows.load8(t, 8 * c) });
            }
        }
        for v in (0..nv - nv % 2).step_by(2) {
            let mut acc = [_mm512_setzero_ps(); 8];
            for c in 0..CH {
                let qc = pair(
                    super::load(&qs[v * hd + 8 * c..]),
                    super::load(&qs[(v + 1) * hd + 8 * c..]),
                );
                for (a, row) in acc.iter_mut().zip(&buf) {
                    *a = _mm512_fmadd_ps(qc, row[c], *a);
                }
            }
            let (mut lo, mut hi) = ([_mm256_setzero_ps(); 8], [_mm256_setzero_ps(); 8]);
            for ((l, h), a) in lo.iter_mut().zip(&mut hi).zip(&acc) {
                (*l, *h) = (_mm512_castps512_ps256(*a), high(*a));
            }
            put(
                &mut out[v * stride + t0..],
                m,
                _mm256_mul_ps(sc, lane_sums(&lo)),
            );
            put(
                &mut out[(v + 1) * stride + t0..],
                m,
                _mm256_mul_ps(sc, lane_sums(&hi)),
            );
        }
        if nv % 2 == 1 {
            let v = nv - 1;
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in 0..CH {
                let qc = super::load(&qs[v * hd + 8 * c..]);
                for (a, row) in acc.iter_mut().zip(&buf) {
                    *a = _mm256_fmadd_ps(qc, _mm512_castps512_ps256(row[c]), *a);
                }
            }
            put(
                &mut out[v * stride + t0..],
                m,
                _mm256_mul_ps(sc, lane_sums(&acc)),
            );
        }
    }
}

/// Columns `c0 .. c0 + 16·C` of `NV` outputs: `outs[v] += Σ_t p[v·stride + t] · v_t`
/// ([`super::weighted_cols`] on 16 lanes).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn cols<const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: F32Rows<'_>,
    outs: &mut [f32],
    c0: usize,
) {
    let hd = rows.head_dim();
    let n = rows.rows();
    assert!(c0 + 16 * C <= hd && outs.len() >= NV * hd, "columns");
    assert!(n == 0 || (NV - 1) * stride + n <= p.len(), "weights length");
    let mut acc = [[_mm512_setzero_ps(); C]; NV];
    for (v, a) in acc.iter_mut().enumerate() {
        for (c, x) in a.iter_mut().enumerate() {
            // SAFETY: `v·hd + c0 + 16c + 16 ≤ NV·hd ≤ outs.len()` (asserted above).
            *x = unsafe { _mm512_loadu_ps(outs.as_ptr().add(v * hd + c0 + 16 * c)) };
        }
    }
    for t in 0..n {
        let mut x = [_mm512_setzero_ps(); C];
        for (c, xc) in x.iter_mut().enumerate() {
            // SAFETY: `t < n` and `c0 + 16c + 16 ≤ hd` (asserted above): 16 floats of
            // row `t`, which `F32Rows` borrows.
            *xc = unsafe { _mm512_loadu_ps(rows.0.at(t, c0 + 16 * c)) };
        }
        for (v, a) in acc.iter_mut().enumerate() {
            // SAFETY: `v < NV` and `t < n`, so `v·stride + t < (NV − 1)·stride + n ≤
            // p.len()` (asserted above).
            let pv = _mm512_set1_ps(unsafe { *p.as_ptr().add(v * stride + t) });
            for (c, o) in a.iter_mut().enumerate() {
                *o = _mm512_fmadd_ps(pv, x[c], *o);
            }
        }
    }
    for (v, a) in acc.iter().enumerate() {
        for (c, x) in a.iter().enumerate() {
            // SAFETY: as the loads above.
            unsafe { _mm512_storeu_ps(outs.as_mut_ptr().add(v * hd + c0 + 16 * c), *x) };
        }
    }
}

/// `outs[v] += Σ_t p[v · stride + t] · v_t` for `NV` outputs `outs: [NV, head_dim]`:
/// column passes of `16·C`, then of 16, then the AVX2 kernel's from the first column
/// left (8 at a time, then its unfused tail).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn weighted_n<const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: F32Rows<'_>,
    outs: &mut [f32],
) {
    let hd = rows.head_dim();
    let mut c0 = 0;
    while c0 + 16 * C <= hd {
        cols::<NV, C>(p, stride, rows, outs, c0);
        c0 += 16 * C;
    }
    while c0 + 16 <= hd {
        cols::<NV, 1>(p, stride, rows, outs, c0);
        c0 += 16;
    }
    weighted_from::<_, NV>(p, stride, rows, outs, c0);
}

/// [`super::weighted_pass`] for f32 rows: `outs.len() / head_dim ≤ MAX_VECS` outputs,
/// `NV · C ≤ 24` accumulators of 16 lanes.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`enabled`]).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn weighted(p: &[f32], stride: usize, rows: F32Rows<'_>, outs: &mut [f32]) {
    let nv = outs.len() / rows.head_dim();
    assert!((1..=MAX_VECS).contains(&nv), "outputs per pass");
    per_vecs!(nv, NV => match NV {
        1..=6 => weighted_n::<NV, 4>(p, stride, rows, outs),
        _ => weighted_n::<NV, 2>(p, stride, rows, outs),
    })
}
