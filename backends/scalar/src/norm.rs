//! Reference RMSNorm.
//!
//! Each row `x: [d]` becomes `out_j = (x_j · r) · w_j` with `r = 1/√(Σ x_j² / d + eps)`.
//! The sum of squares, the mean and `r` are computed in f64 (for any `d` a model uses the
//! f64 sum is exact to ~1e-16 relative, far below f32 resolution) and `r` is rounded once
//! to f32; the two products are f32. Layout: `x`, `out`: `[n, d]` row-major, `weight: [d]`.

/// RMSNorm of each `[d]` row of `x` into `out`. Shapes are checked by the caller.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum_sq: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let r = (1.0 / (sum_sq / d as f64 + f64::from(eps)).sqrt()) as f32;
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * r * w;
        }
    }
}
