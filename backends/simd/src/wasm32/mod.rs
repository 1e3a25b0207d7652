//! wasm32 kernels: WebAssembly SIMD128, 4 f32 lanes per `v128`.
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
//! WebAssembly has no run-time feature detection: a module either validates with SIMD128
//! instructions or it does not load. So this module exists only when the crate is built
//! with `-C target-feature=+simd128` (`.ci/wasm/env.sh simd`), and then every function in
//! it may use the `core::arch::wasm32` intrinsics; without the flag the `Simd` backend is
//! the scalar path. SIMD128 has no fused multiply-add (the relaxed-SIMD proposal's is
//! not deterministic across engines) and no 8-bit multiply: products are rounded, then
//! added, and integer dots widen the bytes to 16 bits (`i32x4_dot_i16x8`).
//!
//! Built with `+relaxed-simd` as well (`.ci/wasm/env.sh relaxed`: Chrome 114+ and wasmtime
//! run it; the web page takes that module where the browser validates it), two things
//! change:
//! - the 4- and 5-bit formats' integer dots against 8-bit activations use
//!   `i16x8_relaxed_dot_i8x16_i7x16` (one `pmaddubsw` on x86_64). It is exact and the
//!   same on every engine when its second operand's bytes are below 128, which weights
//!   of `0..32` are (`q8.rs`);
//! - `dot::mul_add` is `f32x4_relaxed_madd`: one FMA where the engine and CPU have it
//!   (V8 and wasmtime on x86_64 with FMA3), else a multiply and an add. The f32 results
//!   of that build may then differ between engines by rounding, within the tolerances
//!   the tests hold every backend to (the FMA paths of x86_64 and aarch64 meet them);
//!   an engine makes one choice, so within a run they are deterministic, as the rayon
//!   backend's bitwise equality with its inner backend requires.

mod dot;
mod kquant;
mod q8;
mod quant;

use crate::kernel::Kernel;
use kvcore::backend::{Q8Acts, Weights};

/// Proof that this module was compiled for SIMD128: only [`Simd128::detect`] creates one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Simd128 {
    _compiled: (),
}

impl Simd128 {
    /// Always `Some`: a module built with SIMD128 only runs on an engine that validated
    /// its SIMD instructions.
    pub(crate) fn detect() -> Option<Simd128> {
        Some(Simd128 { _compiled: () })
    }
}

impl Kernel for Simd128 {
    fn gemv_q8(self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
        q8::gemv(w, x, y)
    }
}
