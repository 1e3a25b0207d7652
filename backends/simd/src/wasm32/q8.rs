//! SCAFFOLD (to be replaced by the SIMD128 kernels): the scalar reference.

use kvcore::backend::q8::{quantize_block, quantize_block_k};
use kvcore::backend::{Q8Acts, Q8Layout, Weights};

pub(super) fn quantize(
    layout: Q8Layout,
    x: &[f32],
    scales: &mut [f32],
    sums: &mut [i32],
    values: &mut [i8],
) {
    let (block, per) = (layout.block_len(), layout.block_len() / layout.sum_len());
    for (((xb, qb), d), s) in x
        .chunks_exact(block)
        .zip(values.chunks_exact_mut(block))
        .zip(scales.iter_mut())
        .zip(sums.chunks_exact_mut(per))
    {
        *d = match layout {
            Q8Layout::Q8_0 => quantize_block(xb, qb),
            Q8Layout::Q8_K => quantize_block_k(xb, qb),
        };
        for (sj, qj) in s.iter_mut().zip(qb.chunks_exact(layout.sum_len())) {
            *sj = qj.iter().map(|&q| i32::from(q)).sum();
        }
    }
}

pub(super) fn gemv(w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) {
    kvcore::backend::q8::gemv_reference(w, x, y).expect("shapes checked")
}
