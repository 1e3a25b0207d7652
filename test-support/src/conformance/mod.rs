//! The backend conformance suite: every kernel of a [`Backend`] against the scalar
//! reference ([`kvcore_scalar::Scalar`]) on the same seeded inputs, for kvcore's own
//! backends and for a backend written outside kvcore's repository.
//!
//! What it checks, for each kernel:
//! - proptest cases (fixed RNG seed, so every run draws the same inputs) over shapes 0,
//!   1, tile sizes ±1 (8, 16, 32, 64 ±1), odd lengths, 192 and 576, every weight format,
//!   RoPE positions up to 40 000, GQA groupings, segmented KV views and sliding windows;
//! - SmolLM2-135M's shapes as deterministic cases, and Gemma 3 270M's projections in
//!   its `Q5_0`, `Q4_K` and `Q6_K` ([`model`]);
//! - GEMM row `t` against the backend's own GEMV of token `t`;
//! - quantised GEMV/GEMM against the same backend on an F32 copy of the decoded weights
//!   (random matrices, and the real SmolLM2 and Gemma 3 rows of the [`reference_data`]);
//! - every shape error, returned as the specific `ShapeError` with the output left
//!   untouched ([`shape_errors`]).
//!
//! Tolerance: output `i` of a backend must be within `2·bound_i` of the scalar's, where
//! `bound_i = ε_abs + ε_rel·Σ|terms|` is the worst-case error of one correct f32
//! implementation of that output (derived per kernel in [`oracle`]; for a dot product
//! of `n` terms `ε_rel = (min(n, 8·√n) + 2)·2^-24`, `1.1e-5` at `n = 576`, and
//! `Σ|terms| = Σ_j |w_j·x_j|`). Both backends lie within `bound_i` of the exact value,
//! so within `2·bound_i` of each other; the scalar reference is itself held to
//! `bound_i` against the float64 oracle by kvcore's `tests/integration/scalar_reference.rs`.
//! Embedding lookups and residual adds are exact operations and must match bit for bit.
//!
//! # Running it against a backend
//! One line in a `tests/` file of the backend's crate, with `kvcore` and
//! `kvcore-test-support` as dev-dependencies, declares a module of `#[test]` functions
//! ([`conformance_suite!`](crate::conformance_suite) lists them):
//!
//! ```no_run
//! // tests/conformance.rs
//! use kvcore_scalar::Scalar; // the backend under test
//!
//! kvcore_test_support::conformance_suite!(scalar, Scalar::new);
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs them. The SmolLM2-rows test reads
//! `quant-blocks.json` from `$KVCORE_REFERENCE` (outside kvcore's repository, point it
//! at a copy of kvcore's `shared/reference`); without it the test fails, naming the path
//! and the variable. Failing proptest cases are saved next to the test file
//! (`tests/conformance.proptest-regressions`) and replayed first.
//!
//! # Parts
//! - [`inputs`]: the seeded generator [`Rng`](inputs::Rng) and random weight matrices;
//! - [`decode`]: an independent float64 decoder of the weight formats;
//! - [`oracle`]: float64 reference kernels with their error bounds, and the checks;
//! - [`cases`]: one input set per kernel (the [`Case`](cases::Case) trait), which any
//!   backend runs and the oracle answers;
//! - [`strategy`]: the proptest strategies and configuration;
//! - [`reference_data`]: the loader of the reference data;
//! - [`suite`], [`model`], [`shape_errors`]: the checks the macro's tests call.
//!
//! [`Backend`]: kvcore::backend::Backend

pub mod cases;
pub mod decode;
pub mod inputs;
pub mod model;
pub mod oracle;
pub mod reference_data;
pub mod shape_errors;
pub mod strategy;
pub mod suite;

/// What [`conformance_suite!`](crate::conformance_suite) expands to use, so that its
/// caller needs no dependency of its own on these crates.
#[doc(hidden)]
pub mod __private {
    pub use kvcore;
    pub use proptest;
}
