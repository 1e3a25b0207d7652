//! aarch64 kernels: Advanced SIMD (NEON), 4 f32 lanes per register.
//!
//! - `dot.rs`: the f32 lanes of `crate::lanes`'s loops, and the loads and stores the
//!   other kernels share;
//! - `quant.rs`: the block microkernels of every weight format (decode a block to lanes,
//!   the `Q8_0`/`Q4_*` row loop) as `kformat::Blocks`, whose generic loops make the GEMV,
//!   the decoder and the 8-bit quantiser (`kquant.rs`: the chunk decoders of `Q5_0`,
//!   `Q4_K` and `Q6_K`);
//! - `q8.rs`: the 8-bit activation quantiser and the integer-dot GEMV of the block
//!   formats against it.
//!
//! Every kernel is a safe `#[target_feature(enable = "neon")]` function (Rust requires the
//! attribute even though the `aarch64-unknown-linux-gnu` target enables NEON at compile
//! time); the only `unsafe` outside the loads and stores is the call into that code from
//! [`Neon`]'s trait methods (and its `kformat::Blocks` methods, which the generic loops
//! call directly: NEON is on for every function of this target), justified by the
//! run-time detection that created the token.

mod dot;
mod kquant;
mod q8;
mod quant;

use crate::kernel::Kernel;
use kvcore::backend::{Q8Acts, Weights};

/// Proof that this CPU runs NEON: only [`Neon::detect`] creates one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Neon {
    _detected: (),
}

impl Neon {
    /// `Some` when the CPU has NEON (run-time detection).
    pub(crate) fn detect() -> Option<Neon> {
        std::arch::is_aarch64_feature_detected!("neon").then_some(Neon { _detected: () })
    }
}

// SAFETY (every `unsafe` block below): the callees are `#[target_feature(enable =
// "neon")]` functions, and a `Neon` value exists only after `Neon::detect` found NEON at
// run time. The callees check their slice lengths themselves.
impl Kernel for Neon {
    fn gemv_q8(self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
        // SAFETY: NEON detected (see above).
        unsafe { q8::gemv(w, x, y) }
    }
}
