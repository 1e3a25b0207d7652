//! SCAFFOLD (to be replaced by the SIMD128 kernels): the scalar reference.

use kvcore::backend::{Backend, DType, Weights};

pub(super) fn gemv(w: &Weights<'_>, x: &[f32], _sums: &[f32], y: &mut [f32]) {
    kvcore_scalar::Scalar.gemv(w, x, y).expect("shapes checked")
}

pub(super) fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    kvcore_scalar::quant::dequantize(dtype, bytes, out)
}
