//! The backend conformance suite (`kvcore_test_support::conformance`) for kvcore's own
//! backends: every kernel of [`Scalar`], [`Simd`] on each of its kernel paths (on x86_64
//! `avx512` and `avx2`, elsewhere the architecture's one), `Rayon<Scalar>` and
//! `Rayon<Simd>` (2 threads, the best path) against the scalar reference, on the same
//! inputs, within twice the f64 oracle's error bound (embedding lookups and residual adds
//! bit for bit), plus every shape error. What each test checks, the tolerance and its
//! derivation are documented in the test-support crate; a backend outside this repository
//! runs the same suite with the same one-line invocation.
//!
//! A path this CPU does not run (`avx512` without AVX-512F) cannot be checked here: its
//! tests then run the best path the CPU has, and the first of them to build the backend
//! says so on the terminal (past the harness's output capture), so the run does not
//! pass for a check it did not make. `backends/simd/tests/simd_paths.rs` reports paths
//! the same way.

#[cfg(not(target_family = "wasm"))]
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
#[cfg(target_arch = "x86_64")]
use kvcore_simd::SimdPath;

/// Threads of the rayon instantiations.
#[cfg(not(target_family = "wasm"))]
const RAYON_THREADS: usize = 2;

/// The SIMD backend on `path`, or where this CPU does not run it, on its best path after
/// saying so straight to the process's stderr.
#[cfg(target_arch = "x86_64")]
fn simd_on(path: SimdPath) -> Simd {
    Simd::with_path(path).unwrap_or_else(|| {
        use std::io::Write;
        let best = Simd::best();
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: the conformance suite on the {} kernels (this CPU does not run them); \
             its tests ran {} instead",
            path.name(),
            best.path().name()
        );
        best
    })
}

kvcore_test_support::conformance_suite!(scalar, Scalar::new);
#[cfg(not(target_family = "wasm"))] // no threads on wasm32 here (pthread_create fails)
kvcore_test_support::conformance_suite!(rayon_scalar, || {
    Rayon::new(Scalar::new(), RAYON_THREADS).expect("thread pool")
});
#[cfg(target_arch = "x86_64")]
kvcore_test_support::conformance_suite!(simd_avx512, || simd_on(SimdPath::Avx512));
#[cfg(target_arch = "x86_64")]
kvcore_test_support::conformance_suite!(simd_avx2, || simd_on(SimdPath::Avx2Fma));
#[cfg(not(target_arch = "x86_64"))]
kvcore_test_support::conformance_suite!(simd, Simd::best);
#[cfg(not(target_family = "wasm"))]
kvcore_test_support::conformance_suite!(rayon_simd, || {
    Rayon::new(Simd::best(), RAYON_THREADS).expect("thread pool")
});
