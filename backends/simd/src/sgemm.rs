//! A checked, safe wrapper around `matrixmultiply::sgemm` for `Y ← X Wᵀ`.
//!
//! `matrixmultiply` computes `C ← α A B + β C` from raw pointers and strides. Here
//! `A = X: [n, cols]` (row stride `cols`), `B = Wᵀ: [cols, rows]` read straight from the
//! row-major `W: [rows, cols]` with row stride 1 and column stride `cols` (no transpose
//! copy), and `C` is the column block `y_col .. y_col + rows` of `Y: [n, y_stride]`.
//! `α = 1`, `β = 0`, so `C` is written, never read.
//!
//! Numerics: each output is one dot product over `cols`, accumulated by matrixmultiply's
//! micro-kernel in `k` order within its `kc` blocks (with FMA where the CPU has it); the
//! order does not depend on `n` or `rows`, only on `cols`.

/// Operands of one `Y[:, y_col .. y_col + rows] ← X Wᵀ`.
pub(crate) struct Gemm<'a> {
    /// `X: [n, cols]`.
    pub x: &'a [f32],
    /// Tokens (rows of `X` and `Y`).
    pub n: usize,
    /// The reduction length.
    pub cols: usize,
    /// `W: [rows, cols]`, f32.
    pub w: &'a [f32],
    /// Rows of `W` (columns of `Y` written).
    pub rows: usize,
    /// `Y: [n, y_stride]`.
    pub y: &'a mut [f32],
    /// First column of `Y` written.
    pub y_col: usize,
    /// Row stride of `Y`.
    pub y_stride: usize,
}

/// Run one GEMM.
///
/// # Panics
/// If the slices do not hold the shapes above (a programming error).
pub(crate) fn sgemm(g: Gemm<'_>) {
    assert_eq!(g.x.len(), g.n * g.cols, "sgemm: x is not [n, cols]");
    assert_eq!(g.w.len(), g.rows * g.cols, "sgemm: w is not [rows, cols]");
    assert!(
        g.y_col + g.rows <= g.y_stride,
        "sgemm: columns past the row"
    );
    assert_eq!(g.y.len(), g.n * g.y_stride, "sgemm: y is not [n, y_stride]");
    if g.n == 0 || g.rows == 0 {
        return;
    }
    let (cols, stride) = (g.cols as isize, g.y_stride as isize);
    // SAFETY: matrixmultiply reads A[i, kk] = x[i·cols + kk] for i < n, kk < cols: within
    // `x.len() = n·cols`; B[kk, j] = w[j·cols + kk] for j < rows: within
    // `w.len() = rows·cols`; and writes C[i, j] = y[y_col + i·y_stride + j] for j < rows:
    // the largest index is y_col + rows − 1 + (n − 1)·y_stride < n·y_stride = y.len()
    // because y_col + rows ≤ y_stride (all asserted above). `y` is borrowed mutably, so
    // it does not alias `x` or `w`. β = 0, so `y` is never read.
    unsafe {
        matrixmultiply::sgemm(
            g.n,
            g.cols,
            g.rows,
            1.0,
            g.x.as_ptr(),
            cols,
            1,
            g.w.as_ptr(),
            1,
            cols,
            0.0,
            g.y.as_mut_ptr().add(g.y_col),
            stride,
            1,
        );
    }
}
