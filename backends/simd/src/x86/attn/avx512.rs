//! AVX-512F twins of the attention kernels of [`super`], **bit for bit** the AVX2 ones:
//! the same FMAs in the same order on every lane, twice as many lanes per instruction,
//! on rows of every stored type (converted by the same exact loads, or the same one
//! rounded product `d·q` for `q8_0` and `q4_0`). The attention kernels take them on the `avx512`
//! path (with an [`Avx512`](crate::x86::Avx512) token: the CPU has AVX-512F).
//!
//! - Scores ([`scores_by_8`]): a block's 8 key rows in pairs, rows `i` and `i + 4` in the
//!   two 256-bit halves of a register, against each query chunk in both halves; each
//!   half is exactly the AVX2 kernel's 8-lane chain for its row, and the 8 halves go
//!   through the same [`lane_sums`].
//! - Weighted sums ([`weighted`]): 16 output columns per register instead of 8; an output
//!   element is still the one chain `o ← fma(p_t, v_tj, o)` in `t` order.
//!
//! So which kernel ran never shows in the results, which is what lets `Rayon<Simd>`,
//! the row-count tests and a state saved on one machine agree across machines with and
//! without AVX-512 (`x86::attn::tests` compares the two on the same inputs).

use super::{Bf16Rows, F16Rows, F32Rows, MAX_VECS, Q4Rows, Q8Rows, Rows, lane_sums, weighted_from};
use crate::x86::avx512::{both, high, low, pair};
use kvcore::kv::Q8_0_BLOCK;
use std::arch::x86_64::*;

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

/// [`super::scores_by_8`]: `out[v · stride + t] ← scale · q_v·k_t`. A block's 8 rows are
/// held as 4 pairs, rows `i` and `i + 4` in the two halves of a register, against each
/// query chunk in both halves: each half is the AVX2 kernel's 8-lane chain for its row,
/// and the 8 halves go through the same [`lane_sums`].
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`Avx512`](crate::x86::Avx512)).
#[allow(private_bounds)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn scores_by_8<R: Rows16, const CH: usize>(
    qs: &[f32],
    rows: R,
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
    // Rows `i` and `i + 4` of the block as CH chunks of 8 (the AVX2 kernel's re-read of
    // the last row fills a partial block's unused slots alike).
    let mut buf = [[_mm512_setzero_ps(); CH]; 4];
    for t0 in (0..n).step_by(8) {
        let m = (n - t0).min(8);
        // The block after next, from memory while these two are scored.
        for t in t0 + 16..t0 + 24 {
            rows.prefetch(t);
        }
        for (i, pair) in buf.iter_mut().enumerate() {
            let (t, u) = (t0 + i.min(m - 1), t0 + (i + 4).min(m - 1));
            for (c4, x) in pair.chunks_exact_mut(4).enumerate() {
                // SAFETY: `t, u < n`, `32·c4 + 32 ≤ hd` (`CH` is a multiple of 4), a
                // multiple of 32; features enabled.
                x.copy_from_slice(&unsafe { rows.load32x2(t, u, 32 * c4) });
            }
        }
        for v in 0..nv {
            let mut acc = [_mm512_setzero_ps(); 4];
            for c in 0..CH {
                let qc = both(super::load(&qs[v * hd + 8 * c..]));
                for (a, pair) in acc.iter_mut().zip(&buf) {
                    *a = _mm512_fmadd_ps(qc, pair[c], *a);
                }
            }
            let mut lanes = [_mm256_setzero_ps(); 8];
            for (i, a) in acc.iter().enumerate() {
                (lanes[i], lanes[i + 4]) = (low(*a), high(*a));
            }
            put(
                &mut out[v * stride + t0..],
                m,
                _mm256_mul_ps(sc, lane_sums(&lanes)),
            );
        }
    }
}

/// Rows read 16 values at a time.
///
/// # Safety
/// `load16(t, j)` requires `t < rows()`, `j + 16 ≤ head_dim()`, `j` a multiple of 16, and
/// a CPU with AVX-512F, AVX2, FMA and F16C.
trait Rows16: Rows {
    /// Values `j .. j + 16` of row `t` as f32: the values of two `load8`.
    unsafe fn load16(&self, t: usize, j: usize) -> __m512;
    /// Values `j .. j + 32` of rows `t` (low halves) and `u` (high halves) as f32, 8 per
    /// half: the values of `load32` of each row (`j` a multiple of 32, `u < rows()`).
    #[inline(always)]
    unsafe fn load32x2(&self, t: usize, u: usize, j: usize) -> [__m512; 4] {
        // SAFETY: the caller's contract covers both rows' `j .. j + 32` and the features.
        unsafe {
            let (a, b) = (self.load32(t, j), self.load32(u, j));
            [
                pair(a[0], b[0]),
                pair(a[1], b[1]),
                pair(a[2], b[2]),
                pair(a[3], b[3]),
            ]
        }
    }
}

impl Rows16 for F32Rows<'_> {
    #[inline(always)]
    unsafe fn load16(&self, t: usize, j: usize) -> __m512 {
        // SAFETY: 16 floats of row `t` from `j` are in bounds (the trait's contract).
        unsafe { _mm512_loadu_ps(self.0.at(t, j)) }
    }
}

impl Rows16 for F16Rows<'_> {
    #[inline(always)]
    unsafe fn load16(&self, t: usize, j: usize) -> __m512 {
        // SAFETY: 16 halves (32 bytes) of row `t` from `j` are in bounds (the trait's
        // contract); the conversion is exact, as `vcvtph2ps` on 8.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.at(t, j).cast())) }
    }
}

impl Rows16 for Bf16Rows<'_> {
    #[inline(always)]
    unsafe fn load16(&self, t: usize, j: usize) -> __m512 {
        // SAFETY: 16 bf16 (32 bytes) of row `t` from `j` are in bounds (the trait's
        // contract). A bf16 is the high half of an f32.
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(self.0.at(t, j).cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
        }
    }
}

impl Rows16 for Q8Rows<'_> {
    #[inline(always)]
    unsafe fn load16(&self, t: usize, j: usize) -> __m512 {
        // SAFETY: `j` is a multiple of 16 in bounds (the trait's contract), so the 16
        // quants from `j % 32` lie in block `j / 32` of row `t`. Each value is the one
        // rounded product `d · q` of the AVX2 load and of the reference.
        unsafe {
            let (qs, d) = self.block(t, j);
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(j % Q8_0_BLOCK).cast()));
            _mm512_mul_ps(_mm512_cvtepi32_ps(q), both(d))
        }
    }
    #[inline(always)]
    unsafe fn load32x2(&self, t: usize, u: usize, j: usize) -> [__m512; 4] {
        // SAFETY: `j` is a multiple of 32 in bounds and `t, u < rows` (the trait's
        // contract): block `j / 32` of each row, 32 quants each. Eight quants of each row
        // share a 16-byte register, widened and converted together, each multiplied by
        // its own row's scale: the one rounded product `d · q` of `load32`.
        unsafe {
            let ((qt, dt), (qu, du)) = (self.block(t, j), self.block(u, j));
            let d = pair(dt, du);
            let f = |k: usize| {
                let q = _mm_unpacklo_epi64(
                    _mm_loadl_epi64(qt.add(8 * k).cast()),
                    _mm_loadl_epi64(qu.add(8 * k).cast()),
                );
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d)
            };
            [f(0), f(1), f(2), f(3)]
        }
    }
}

impl Rows16 for Q4Rows<'_> {
    #[inline(always)]
    unsafe fn load16(&self, t: usize, j: usize) -> __m512 {
        // SAFETY: `j` is a multiple of 16 in bounds (the trait's contract): the 16 values
        // of one half of block `j / 32` of row `t`, each the one rounded product `d · q`
        // of the AVX2 load and of the reference.
        unsafe {
            let (q, d) = self.block(t, j);
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), both(d))
        }
    }
}

/// Columns `c0 .. c0 + 16·C` of `NV` outputs: `outs[v] += Σ_t p[v·stride + t] · v_t`
/// ([`super::weighted_cols`] on 16 lanes).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn cols<R: Rows16, const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: R,
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
        rows.prefetch(t + 8);
        let mut x = [_mm512_setzero_ps(); C];
        for (c, xc) in x.iter_mut().enumerate() {
            // SAFETY: `t < n` and `c0 + 16c + 16 ≤ hd` (asserted above), `c0` a multiple
            // of 16 (the callers' passes); features enabled.
            *xc = unsafe { rows.load16(t, c0 + 16 * c) };
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
fn weighted_n<R: Rows16, const NV: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    rows: R,
    outs: &mut [f32],
) {
    let hd = rows.head_dim();
    let mut c0 = 0;
    while c0 + 16 * C <= hd {
        cols::<R, NV, C>(p, stride, rows, outs, c0);
        c0 += 16 * C;
    }
    while c0 + 16 <= hd {
        cols::<R, NV, 1>(p, stride, rows, outs, c0);
        c0 += 16;
    }
    weighted_from::<_, NV>(p, stride, rows, outs, c0);
}

/// [`super::weighted_pass`]: `outs.len() / head_dim ≤ MAX_VECS` outputs, `NV · C ≤ 24`
/// accumulators of 16 lanes.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C ([`Avx512`](crate::x86::Avx512)).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(private_bounds)]
pub(super) unsafe fn weighted<R: Rows16>(p: &[f32], stride: usize, rows: R, outs: &mut [f32]) {
    let nv = outs.len() / rows.head_dim();
    assert!((1..=MAX_VECS).contains(&nv), "outputs per pass");
    per_vecs!(nv, NV => match NV {
        1..=6 => weighted_n::<R, NV, 4>(p, stride, rows, outs),
        _ => weighted_n::<R, NV, 2>(p, stride, rows, outs),
    })
}

/// `dst[..16] ← rows.load16(t, j)` of `q4_0` rows, for the test of their loads.
///
/// # Safety
/// `load16`'s contract.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn store16(dst: &mut [f32], rows: Q4Rows<'_>, t: usize, j: usize) {
    assert!(dst.len() >= 16, "16 values");
    // SAFETY: the caller's contract; 16 floats fit in `dst` (asserted).
    unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), rows.load16(t, j)) }
}
