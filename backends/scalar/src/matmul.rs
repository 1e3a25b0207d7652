//! Reference GEMV (`y ← W x`) and GEMM (`Y ← X Wᵀ`) over every weight format.
//!
//! Algorithm: for each weight row `r`, decode the row into a `[cols]` f32 scratch with
//! [`dequantize_row`] (the matrix itself is never decoded as a whole), then take its dot
//! product with the activation row(s). The dot product is one f32 accumulator running
//! left to right, `acc ← acc + w_j·x_j` with the product and the sum each rounded (no
//! fused multiply-add), so the result is independent of how the work is blocked: GEMM row
//! `t` is bitwise equal to `gemv(W, X[t])`.
//!
//! Layouts: `W: [rows, cols]` in its stored format, `x: [cols]`, `y: [rows]`;
//! `X: [n, cols]`, `Y: [n, rows]`, all row-major.

use crate::quant::dequantize_row;
use kvcore::backend::Weights;

/// `Σ_j a_j·b_j` in f32, left to right, one rounding per product and per sum.
///
/// Panics in debug builds if the lengths differ; the shorter length is used otherwise.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0, |acc, (&x, &y)| acc + x * y)
}

/// `y ← W x`. Shapes are checked by the caller.
pub(crate) fn gemv(w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    let mut row = vec![0.0; w.cols()];
    for (r, yr) in y.iter_mut().enumerate() {
        dequantize_row(w, r, &mut row);
        *yr = dot(&row, x);
    }
}

/// `Y ← X Wᵀ` for `n` tokens. Shapes are checked by the caller (`n ≥ 0`, `cols > 0`).
pub(crate) fn gemm(w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    let mut row = vec![0.0; cols];
    for r in 0..rows {
        dequantize_row(w, r, &mut row);
        for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
            yt[r] = dot(&row, xt);
        }
    }
}
