//! What the AVX-512F twins of the x86 kernels share: the token that proves the CPU runs
//! them and the moves between 256-bit halves they are built from. Every twin is bit for
//! bit its AVX2 kernel (each 256-bit half runs the AVX2 kernel's lanes), so which one
//! runs changes speed only: `attn/avx512.rs` (scores, weighted sums) and
//! `quant/avx512.rs` (the few-token GEMM from blocks). The kernels that have a twin take
//! an `Option<Avx512>` from the [`Avx2`](super::Avx2) token: `Some` on the `avx512` path,
//! `None` on the `avx2` path (whatever the CPU).

use std::arch::x86_64::*;

/// Proof that this CPU runs AVX-512F beside the AVX2, FMA and F16C the AVX2 kernels
/// need: only [`Avx512::detect`] creates one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512 {
    _detected: (),
}

impl Avx512 {
    /// `Some` when the CPU has AVX-512F, AVX2, FMA and F16C (run-time detection).
    pub(crate) fn detect() -> Option<Avx512> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx512 { _detected: () })
    }
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

/// The token for a test that compares the twins with the AVX2 kernels, or `None` after
/// saying so on the terminal where this CPU has no AVX-512F (straight to the process's
/// stderr: the test harness captures `eprintln!`, and a comparison that could not run
/// must not pass unnoticed).
#[cfg(test)]
pub(super) fn detect_or_say(test: &str) -> Option<Avx512> {
    use std::io::Write;
    let token = Avx512::detect();
    if token.is_none() {
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN {test}: this CPU has no AVX-512F, the AVX-512F twins were not compared"
        );
    }
    token
}
