//! Reference element-wise kernels: SwiGLU, GeGLU and the residual add, in f32.
//!
//! SwiGLU: `out_j = silu(g_j) · u_j`, `silu(g) = g / (1 + e^(−g))`. For very negative `g`,
//! `e^(−g)` overflows to `∞` and `silu(g)` is `−0`, the correct limit, so no special case
//! is needed.
//!
//! GeGLU: `out_j = gelu(g_j) · u_j` with the tanh approximation of GELU,
//! `gelu(g) = ½·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))` (Gemma's `gelu_pytorch_tanh`; the
//! erf form differs by up to ~5e-4 and is not what the models were trained with). `tanh`
//! saturates to ±1 without overflow; for very negative `g` the cube overflows to `−∞`,
//! `tanh` gives `−1` and `gelu(g)` is `−0`, again the correct limit.
//!
//! All operands are `[len]` slices of equal length.

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

/// `√(2/π)`, rounded to f32.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// Tanh-approximated GELU in f32.
fn gelu_tanh(g: f32) -> f32 {
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
}

/// `out ← gelu_tanh(gate) ⊙ up`. Shapes are checked by the caller.
pub(crate) fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// `acc ← acc + x`. Shapes are checked by the caller.
pub(crate) fn add(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
    }
}
