//! The AVX-512F width of the attention kernels of [`super`], whose loops are written once
//! over [`Width`]: this file holds the 16-lane [`Width`], the rows' 16-value loads and the
//! two entry points. The results are **bit for bit** the AVX2 ones: the same FMAs in the
//! same order on every lane, twice as many lanes per instruction, on rows of every stored
//! type (converted by the same exact loads, or the same one rounded product `d·q` for
//! `q8_0`). The attention kernels take them on the `avx512` path (with an
//! [`Avx512`](crate::x86::Avx512) token: the CPU has AVX-512F).
//!
//! - Scores ([`scores_by_8`]): a block's 8 key rows in pairs, rows `i` and `i + 4` in the
//!   two 256-bit halves of a register, against each query chunk in both halves; each
//!   half is exactly the AVX2 kernel's 8-lane chain for its row, and the 8 halves go
//!   through the same [`lane_sums`](super::lane_sums).
//! - Weighted sums ([`weighted`]): 16 output columns per register instead of 8; an output
//!   element is still the one chain `o ← fma(p_t, v_tj, o)` in `t` order.
//!
//! So which kernel ran never shows in the results, which is what lets `Rayon<Simd>`,
//! the row-count tests and a state saved on one machine agree across machines with and
//! without AVX-512 (`x86::attn::tests` compares the two on the same inputs).

use super::{Bf16Rows, F16Rows, F32Rows, MAX_VECS, Q8Rows, Rows, Width, weighted_n};
use crate::x86::avx512::{both, high, low, pair};
use crate::x86::{Avx2, Avx512};
use kvcore::kv::Q8_0_BLOCK;
use std::arch::x86_64::*;

/// [`super::scores_by_8`] on the AVX-512F width: a block's 8 rows are held as 4 pairs,
/// rows `i` and `i + 4` in the two halves of a register, against each query chunk in
/// both halves: each half is the AVX2 kernel's 8-lane chain for its row, and the 8 halves
/// go through the same [`lane_sums`](super::lane_sums).
#[allow(private_bounds)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) fn scores_by_8<R: Rows16, const CH: usize>(
    k: Avx512,
    qs: &[f32],
    rows: R,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    super::scores_by_8::<_, _, CH, 4>(k, qs, rows, scale, out, stride);
}

/// Rows read 16 values at a time.
///
/// # Safety
/// `load16(t, j)` requires `t < rows()`, `j + 16 ≤ head_dim()`, `j` a multiple of 16, and
/// a CPU with AVX-512F, AVX2, FMA and F16C.
pub(super) trait Rows16: Rows {
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

// SAFETY (every `unsafe` block in this impl but the row loads'): the intrinsics need
// AVX-512F, AVX2, FMA and F16C, which an `Avx512` proves.
impl<R: Rows16> Width<R> for Avx512 {
    type V = __m512;
    const N: usize = 16;
    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: features detected (see above).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: features detected (see above).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m512 {
        assert!(s.len() >= 16);
        // SAFETY: 16 floats are in bounds (asserted); features detected (see above).
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: __m512) {
        assert!(s.len() >= 16);
        // SAFETY: 16 floats are in bounds (asserted); features detected (see above).
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: features detected (see above).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn q8(self, q: &[f32]) -> __m512 {
        // SAFETY: features detected (see above); `load` checks the length.
        unsafe { both(super::load(q)) }
    }
    #[inline(always)]
    unsafe fn rows32(self, rows: &R, t: usize, u: usize, j: usize) -> [__m512; 4] {
        // SAFETY: the caller's contract is `load32x2`'s; features detected.
        unsafe { rows.load32x2(t, u, j) }
    }
    #[inline(always)]
    unsafe fn cols<const C: usize>(self, rows: &R, t: usize, c0: usize) -> [__m512; C] {
        let mut x = [<Self as Width<R>>::zero(self); C];
        for (c, xc) in x.iter_mut().enumerate() {
            // SAFETY: `t < rows` and `c0 + 16c + 16 ≤ hd` (the caller's contract), a
            // multiple of 16.
            *xc = unsafe { rows.load16(t, c0 + 16 * c) };
        }
        x
    }
    #[inline(always)]
    fn finish<const REGS: usize>(
        self,
        acc: &[__m512; REGS],
        scale: f32,
        dst: &mut [f32],
        m: usize,
    ) {
        let y = <Self as Width<R>>::ymm(self);
        let mut lanes = [<Avx2 as Width<R>>::zero(y); 8];
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: features detected (see above).
            (lanes[i], lanes[i + REGS]) = unsafe { (low(*a), high(*a)) };
        }
        <Avx2 as Width<R>>::finish(y, &lanes, scale, dst, m);
    }
    #[inline(always)]
    fn ymm(self) -> Avx2 {
        Avx2 { avx512: Some(self) }
    }
}

/// [`super::weighted_pass`] on the AVX-512F width: `outs.len() / head_dim ≤ MAX_VECS`
/// outputs, `NV · C ≤ 24` accumulators of 16 lanes, 16 output columns per register; an
/// output element is still the one chain `o ← fma(p_t, v_tj, o)` in `t` order.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(private_bounds)]
pub(super) fn weighted<R: Rows16>(k: Avx512, p: &[f32], stride: usize, rows: R, outs: &mut [f32]) {
    let nv = outs.len() / rows.head_dim();
    assert!((1..=MAX_VECS).contains(&nv), "outputs per pass");
    per_vecs!(nv, NV => match NV {
        1..=6 => weighted_n::<_, R, NV, 4>(k, p, stride, rows, outs),
        _ => weighted_n::<_, R, NV, 2>(k, p, stride, rows, outs),
    })
}
