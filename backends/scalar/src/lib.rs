//! `kvcore-scalar`: the reference [`Backend`], plain loops written for clarity.
//!
//! Every other backend is tested against this one (`tests/conformance.rs`), and this one
//! is tested against a float64 implementation (`tests/integration/scalar_reference.rs`). The kernels
//! favour obviously-correct code over speed:
//!
//! - [`quant`]: the quantisers of every [`DType`](kvcore::DType), byte-compatible with
//!   the `gguf` Python package, and the row decoder (each format's reference decode is
//!   its type's in `kvcore::backend::format`);
//! - `matmul`: GEMV/GEMM over those types, a left-to-right f32 dot product of each decoded
//!   weight row;
//! - `softmax`: max-subtracted softmax (an all-`−∞` row gives zeros) and attention over
//!   a layer's view;
//! - `rope`: both RoPE pairings, angles in f64;
//! - `norm`: RMSNorm with an f64 sum of squares;
//! - `elementwise`: SwiGLU, GeGLU (tanh GELU) and the residual add.
//!
//! Activations and accumulators are f32 unless a module says otherwise; no operation uses
//! a fused multiply-add. Every entry point runs the matching `kvcore::backend::check`
//! first and touches no data on a [`ShapeError`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod elementwise;
mod matmul;
mod norm;
pub mod quant;
mod rope;
mod softmax;

pub use softmax::{attention_part, softmax_max, unrotate};

use kvcore::backend::{AttnParams, Backend, PartStat, Rope, ShapeError, Weights, check};
use kvcore::kv::KvView;
use kvcore::ndarray::{ArrayView3, ArrayViewMut3};

/// The scalar reference backend: single-threaded, no SIMD, no state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scalar;

impl Scalar {
    /// The backend (it has no configuration).
    pub const fn new() -> Self {
        Scalar
    }
}

impl Backend for Scalar {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn gemv(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemv(w, x, y)?;
        quant::check_format("scalar gemv", w.dtype())?;
        matmul::gemv(w, x, y);
        Ok(())
    }

    fn gemm(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemm(w, x, y)?;
        quant::check_format("scalar gemm", w.dtype())?;
        matmul::gemm(w, x, y);
        Ok(())
    }

    /// Every output is its own `dot` of a weight row and a token's row.
    fn gemm_rows_alone_from(&self) -> Option<usize> {
        Some(1)
    }

    fn rope(
        &self,
        x: &mut [f32],
        head_dim: usize,
        positions: &[usize],
        rope: &Rope,
    ) -> Result<(), ShapeError> {
        check::rope(x, head_dim, positions)?;
        rope::rope(x, head_dim, positions, rope);
        Ok(())
    }

    fn attention(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError> {
        check::attention(&q, q_pos, kv, &out)?;
        softmax::attention(q, q_pos, kv, params, out)
    }

    /// [`attention_part`] (the reference's parts; it names no part length, so no caller
    /// splits its attention into them).
    fn attention_part(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
        stats: &mut [PartStat],
    ) -> Result<(), ShapeError> {
        check::attention_part(&q, q_pos, kv, &out, stats)?;
        attention_part(q, q_pos, kv, params, out, stats, false);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        check::rms_norm(x, weight, out)?;
        norm::rms_norm(x, weight, eps, out);
        Ok(())
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("swiglu up", gate.len(), up.len())?;
        check::same_len("swiglu out", gate.len(), out.len())?;
        elementwise::swiglu(gate, up, out);
        Ok(())
    }

    fn geglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("geglu up", gate.len(), up.len())?;
        check::same_len("geglu out", gate.len(), out.len())?;
        elementwise::geglu(gate, up, out);
        Ok(())
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), ShapeError> {
        check::same_len("add x", acc.len(), x.len())?;
        elementwise::add(acc, x);
        Ok(())
    }

    fn softmax(&self, x: &mut [f32]) {
        softmax::softmax(x);
    }

    fn embed_row(
        &self,
        table: &Weights<'_>,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        check::embed_row(table, row, out)?;
        quant::check_format("scalar embed_row", table.dtype())?;
        quant::dequantize_row(table, row, out);
        Ok(())
    }
}
