//! What the AVX-512F twins of the x86 kernels share: the switch that picks them and the
//! moves between 256-bit halves they are built from. Every twin is bit for bit its AVX2
//! kernel (each 256-bit half runs the AVX2 kernel's lanes), so the switch changes speed
//! only: `attn/avx512.rs` (scores, weighted sums) and `quant/avx512.rs` (the few-token
//! GEMM from blocks).

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether the AVX-512F twins run: the CPU has AVX-512F (and the AVX2, FMA and F16C the
/// AVX2 kernels need), and `KVCORE_AVX512` is not `0` (which keeps the AVX2 kernels, for
/// comparisons on one machine and for testing them there).
pub(super) fn enabled() -> bool {
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
pub(super) fn both(x: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(x)))
}

/// `a` in the low 256-bit half, `b` in the high one.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn pair(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
    ))
}

/// The low 256-bit half of `x`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn low(x: __m512) -> __m256 {
    _mm512_castps512_ps256(x)
}

/// The high 256-bit half of `x`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn high(x: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))
}
