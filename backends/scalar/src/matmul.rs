//! Reference GEMV (`y ← W x`) and GEMM (`Y ← X Wᵀ`) over every weight format.
//!
//! Algorithm: the GEMV takes each weight row's reference dot product with `x`
//! ([`dot_row`], the format's [`BlockFormat::dot`]: block by block decoded, then
//! accumulated); the GEMM decodes each weight row once into a `[cols]` f32 scratch with
//! [`dequantize_row`] (the matrix itself is never decoded as a whole) and takes its dot
//! product with every activation row. The dot product is one f32 accumulator running
//! left to right, `acc ← acc + w_j·x_j` with the product and the sum each rounded (no
//! fused multiply-add), so the result is independent of how the work is blocked: GEMM row
//! `t` is bitwise equal to `gemv(W, X[t])`.
//!
//! [`BlockFormat::dot`]: kvcore::backend::BlockFormat::dot
//!
//! Layouts: `W: [rows, cols]` in its stored format, `x: [cols]`, `y: [rows]`;
//! `X: [n, cols]`, `Y: [n, rows]`, all row-major.

use crate::quant::dequantize_row;
use kvcore::backend::Weights;
use kvcore::backend::format::dot_row;

/// `Σ_j a_j·b_j` in f32, left to right, one rounding per product and per sum.
///
/// Panics in debug builds if the lengths differ; the shorter length is used otherwise.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0, |acc, (&x, &y)| acc + x * y)
}

/// `y ← W x`. Shapes are checked by the caller.
pub(crate) fn gemv(w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    for (r, yr) in y.iter_mut().enumerate() {
        *yr = dot_row(w.dtype(), w.row(r), x);
    }
}

/// Tokens whose dot products with one decoded row run side by side in [`gemm`]. One
/// chain alone waits on its previous sum (the adder's latency); eight independent chains
/// keep the adders busy, and each is still `dot`'s left-to-right sum, so the bits do not
/// change. On the 2-core Zen 3 VM the slowest scalar model tests ran 3× faster with 4
/// lanes and ~10 % faster again with 8.
const LANES: usize = 8;

/// `Y ← X Wᵀ` for `n` tokens. Shapes are checked by the caller (`n ≥ 0`, `cols > 0`).
pub(crate) fn gemm(w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    let mut row = vec![0.0; cols];
    for r in 0..rows {
        dequantize_row(w, r, &mut row);
        let mut xs = x.chunks_exact(cols * LANES);
        let mut ys = y.chunks_exact_mut(rows * LANES);
        for (xg, yg) in (&mut xs).zip(&mut ys) {
            let xt: [&[f32]; LANES] = std::array::from_fn(|t| &xg[t * cols..(t + 1) * cols]);
            let mut acc = [0.0f32; LANES];
            for (j, &wj) in row.iter().enumerate() {
                for (a, xt) in acc.iter_mut().zip(&xt) {
                    *a += wj * xt[j];
                }
            }
            for (t, a) in acc.into_iter().enumerate() {
                yg[t * rows + r] = a;
            }
        }
        let rest = xs.remainder().chunks_exact(cols);
        for (xt, yt) in rest.zip(ys.into_remainder().chunks_exact_mut(rows)) {
            yt[r] = dot(&row, xt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{gemm, gemv};
    use crate::quant::quantize_row;
    use kvcore::backend::{DType, Weights};

    /// Every GEMM row is bit for bit the GEMV of its token, for token counts around the
    /// lanes (whole groups, a remainder, both), on f32 and a block format.
    #[test]
    fn gemm_rows_are_their_gemvs() {
        let (rows, cols) = (5, 64);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) / 97.0)
            .collect();
        let q: Vec<u8> = values
            .chunks(cols)
            .flat_map(|r| quantize_row(DType::Q4_1, r))
            .collect();
        let matrices = [
            Weights::from_f32(rows, cols, &values).unwrap(),
            Weights::new(DType::Q4_1, rows, cols, &q).unwrap(),
        ];
        for w in &matrices {
            for n in 0..=9 {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 104_729 % 211) as f32 - 105.0) / 53.0)
                    .collect();
                let mut y = vec![f32::NAN; n * rows];
                gemm(w, &x, &mut y);
                for (xt, yt) in x.chunks(cols).zip(y.chunks(rows)) {
                    let mut want = vec![0.0; rows];
                    gemv(w, xt, &mut want);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(yt), bits(&want), "{:?}, {n} tokens", w.dtype());
                }
            }
        }
    }
}
