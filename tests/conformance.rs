//! The backend conformance suite (`kvcore_test_support::conformance`) for kvcore's own
//! backends: every kernel of [`Scalar`], [`Simd`], `Rayon<Scalar>` and `Rayon<Simd>`
//! (2 threads) against the scalar reference, on the same inputs, within twice the f64
//! oracle's error bound (embedding lookups and residual adds bit for bit), plus every
//! shape error. What each test checks, the tolerance and its derivation are documented
//! in the test-support crate; a backend outside this repository runs the same suite with
//! the same one-line invocation.

#[cfg(not(target_family = "wasm"))]
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;

/// Threads of the rayon instantiations.
#[cfg(not(target_family = "wasm"))]
const RAYON_THREADS: usize = 2;

kvcore_test_support::conformance_suite!(scalar, Scalar::new);
#[cfg(not(target_family = "wasm"))] // no threads on wasm32 here (pthread_create fails)
kvcore_test_support::conformance_suite!(rayon_scalar, || {
    Rayon::new(Scalar::new(), RAYON_THREADS).expect("thread pool")
});
kvcore_test_support::conformance_suite!(simd, Simd::new);
#[cfg(not(target_family = "wasm"))]
kvcore_test_support::conformance_suite!(rayon_simd, || {
    Rayon::new(Simd::new(), RAYON_THREADS).expect("thread pool")
});
