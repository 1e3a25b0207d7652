//! Reference element-wise kernels: SwiGLU and the residual add, in f32.
//!
//! SwiGLU: `out_j = silu(g_j) · u_j`, `silu(g) = g / (1 + e^(−g))`. For very negative `g`,
//! `e^(−g)` overflows to `∞` and `silu(g)` is `−0`, the correct limit, so no special case
//! is needed. All operands are `[len]` slices of equal length.

/// `silu(g) = g / (1 + e^(−g))` in f32.
fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// `out ← silu(gate) ⊙ up`. Shapes are checked by the caller.
pub(crate) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `acc ← acc + x`. Shapes are checked by the caller.
pub(crate) fn add(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
    }
}
