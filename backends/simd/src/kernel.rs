//! The crate-private kernel trait every instruction-set family implements.
//!
//! A kernel is a zero-sized token (`x86::Avx2`, `aarch64::Neon`) that can
//! only be obtained from run-time feature detection, so holding one proves the CPU runs
//! its instructions. The drivers in `ops.rs` are generic over `K: Kernel` and are
//! monomorphised per family (the matrixmultiply pattern); each method below runs one
//! whole loop inside the family's `#[target_feature]` code, so the feature boundary is
//! crossed once per call, not once per element.
//!
//! Layouts follow `kvcore::backend`: row-major `[rows, cols]`, weights in their stored
//! bytes, activations `f32`.

use kvcore::backend::{DType, Q8Acts, Q8Layout, Weights};

/// One instruction-set family's kernels. All lengths are checked by the callers in
/// `ops.rs`; the implementations assert them again before any unchecked access.
pub(crate) trait Kernel: Copy {
    /// GEMV `y ← W x` for every dtype.
    ///
    /// `w: [rows, cols]`, `x: [cols]`, `y: [rows]`; `block_sums: [cols / 32]` holds
    /// `Σ x_j` over each 32-element block of `x` (used by `Q4_1`, empty for the plain
    /// formats).
    fn gemv(self, w: &Weights<'_>, x: &[f32], block_sums: &[f32], y: &mut [f32]);

    /// Quantise `x` to 8 bits in `layout` into `(scales, sums, values)` (as
    /// `kvcore::backend::Q8Acts::fill` sizes them), bit for bit as
    /// `kvcore::backend::Q8Acts::quantize`.
    fn quantize_q8(
        self,
        layout: Q8Layout,
        x: &[f32],
        scales: &mut [f32],
        sums: &mut [i32],
        values: &mut [i8],
    );

    /// GEMV with 8-bit activations `y ← W x̂` for a block-format `w` and `x` in the layout
    /// it meets (see `kvcore::backend::q8`). `x: [cols]`, `y: [rows]`.
    fn gemv_q8(self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]);

    /// Decode `out.len()` consecutive weights of `dtype` from `bytes` (whole blocks),
    /// bit for bit equal to `kvcore_scalar::quant::dequantize`.
    fn dequantize(self, dtype: DType, bytes: &[u8], out: &mut [f32]);

    /// Attention scores `s_t ← scale · q·k_t` for `t in 0..scores.len()`, `k_t` the
    /// `t`-th row of `keys` (each `q.len()` long).
    fn scores<'a>(
        self,
        q: &[f32],
        keys: impl Iterator<Item = &'a [f32]>,
        scale: f32,
        scores: &mut [f32],
    );

    /// Weighted sum `out ← out + Σ_t p_t · v_t` in `t` order, `v_t` the `t`-th row of
    /// `values` (each `out.len()` long) and `t in 0..p.len()`.
    fn weighted_sum<'a>(self, p: &[f32], values: impl Iterator<Item = &'a [f32]>, out: &mut [f32]);

    /// Softmax of one row in place, with `Backend::softmax`'s contract (max-subtracted;
    /// a NaN makes the row NaN; an all-`−∞` row becomes zeros). The default is the scalar
    /// reference (exact `exp`); a family may vectorise it within the conformance
    /// tolerance (whose `exp` allowance is `EXP_ULPS` ulps).
    fn softmax(self, x: &mut [f32]) {
        use kvcore::backend::Backend;
        kvcore_scalar::Scalar.softmax(x)
    }

    /// SwiGLU `out ← silu(gate) ⊙ up` within the conformance bound. The default is the
    /// scalar reference (exact `exp`).
    fn swiglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        use kvcore::backend::Backend;
        kvcore_scalar::Scalar
            .swiglu(gate, up, out)
            .expect("lengths checked by the caller");
    }

    /// GeGLU `out ← gelu_tanh(gate) ⊙ up` within the conformance bound. The default is the
    /// scalar reference (exact `tanh`).
    fn geglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        use kvcore::backend::Backend;
        kvcore_scalar::Scalar
            .geglu(gate, up, out)
            .expect("lengths checked by the caller");
    }

    /// `Σ x_j²` in f32.
    fn sum_squares(self, x: &[f32]) -> f32;

    /// `out_j ← (x_j · r) · w_j`, two rounded products (as the scalar reference).
    fn scale_mul(self, x: &[f32], r: f32, w: &[f32], out: &mut [f32]);

    /// `acc_j ← acc_j + x_j` (correctly rounded, so bit for bit the scalar result).
    fn add(self, acc: &mut [f32], x: &[f32]);
}
