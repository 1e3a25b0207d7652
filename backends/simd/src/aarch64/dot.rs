//! NEON f32 lanes: the loads and stores the other NEON kernels share, and [`Neon`]'s 4
//! lanes for the loops of `crate::lanes` (dot products, scores, weighted sums, softmax,
//! SwiGLU, GeGLU, RMSNorm's products, the residual add).
//!
//! Lane order: [`F32Lanes::hsum`] is the across-lane add `vaddvq_f32`,
//! `(x₀+x₁)+(x₂+x₃)`; every multiply-add is fused (`vfmaq_f32`, `vfmsq_f32`), so the
//! Cephes `exp` takes the AVX2 kernels' steps four lanes at a time. `tests/simd_paths.rs`
//! holds the results to the bounds of `lanes.rs` against the scalar reference (run on
//! NEON under qemu by `.ci/aarch64.sh`).

use super::Neon;
use crate::lanes::F32Lanes;
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

// SAFETY (every `unsafe` block in this impl): the intrinsics need NEON, and a `Neon`
// exists only after `Neon::detect` found it at run time.
unsafe impl F32Lanes for Neon {
    const N: usize = 4;
    type V = float32x4_t;

    #[inline(always)]
    fn zero(self) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vdupq_n_f32(0.0) }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> float32x4_t {
        // SAFETY: NEON detected (see above); `load` checks the length.
        unsafe { load(s) }
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: float32x4_t) {
        // SAFETY: NEON detected (see above); `store` checks the length.
        unsafe { store(s, v) }
    }
    crate::lanes::binary_lane_ops!(
        add => vaddq_f32,
        sub => vsubq_f32,
        mul => vmulq_f32,
        div => vdivq_f32,
    );
    #[inline(always)]
    fn neg(self, a: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vnegq_f32(a) }
    }
    /// One fused multiply-add.
    #[inline(always)]
    fn mul_add(self, acc: float32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vfmaq_f32(acc, a, b) }
    }
    /// One fused multiply-subtract.
    #[inline(always)]
    fn mul_sub(self, c: float32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vfmsq_f32(c, a, b) }
    }
    #[inline(always)]
    fn clamp(self, x: float32x4_t, lo: float32x4_t, hi: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vminq_f32(vmaxq_f32(x, lo), hi) }
    }
    #[inline(always)]
    fn round(self, x: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vrndnq_f32(x) }
    }
    #[inline(always)]
    fn pow2(self, n: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe {
            let e = vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127));
            vreinterpretq_f32_s32(vshlq_n_s32::<23>(e))
        }
    }
    #[inline(always)]
    fn zero_below(self, x: float32x4_t, lo: float32x4_t, y: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), vcltq_f32(x, lo))) }
    }
    #[inline(always)]
    fn nan_where_nan(self, x: float32x4_t, y: float32x4_t) -> float32x4_t {
        // SAFETY: NEON detected (see above).
        unsafe { vbslq_f32(vceqq_f32(x, x), y, vdupq_n_f32(f32::NAN)) }
    }
    #[inline(always)]
    fn hsum(self, v: float32x4_t) -> f32 {
        // SAFETY: NEON detected (see above).
        unsafe { vaddvq_f32(v) }
    }
}

crate::lanes::f32_loops!(Neon, #[target_feature(enable = "neon")]);
