//! Reference rotary position embedding, both pairings ([`RopeStyle`]).
//!
//! Pair `i` of a head (`i in 0..d/2`, `d = head_dim`) is rotated by `φ = pos·θ_i`,
//! `θ_i = base^(−2i/d)`: `(a, b) ← (a·cos φ − b·sin φ, a·sin φ + b·cos φ)`, the products
//! and sums rounded to f32 separately.
//!
//! Precision of the angle: positions reach 8192 and more, where an f32 angle `pos·θ_0`
//! carries an absolute error of about `8192·2^-24 ≈ 5e-4` rad before any rounding of
//! `θ_i`, and `sin`/`cos` of it inherit that error. The reference therefore computes
//! `θ_i`, `pos·θ_i`, `cos` and `sin` in f64 and rounds only `cos` and `sin` to f32, so
//! they are within one f32 rounding of the exact values.
//!
//! Layout: `x: [n_tokens, n_heads, head_dim]`; `Interleaved` pairs `(x[2i], x[2i+1])`,
//! `Halves` pairs `(x[i], x[i + d/2])` within each head.

use kvcore::backend::{Rope, RopeStyle};

/// `(cos φ_i, sin φ_i)` for every pair `i` of a head at position `pos`, each rounded once
/// from f64 to f32.
fn angles(pos: usize, head_dim: usize, base: f32) -> impl Iterator<Item = (f32, f32)> {
    let d = head_dim as f64;
    let base = f64::from(base);
    (0..head_dim / 2).map(move |i| {
        // f64 throughout: at position 8192 an f32 angle would already be ~5e-4 rad off.
        let theta = base.powf(-2.0 * i as f64 / d);
        let (sin, cos) = (pos as f64 * theta).sin_cos();
        (cos as f32, sin as f32)
    })
}

/// Rotate `(a, b)` by the angle whose cosine and sine are `(c, s)`.
fn rotate(a: f32, b: f32, (c, s): (f32, f32)) -> (f32, f32) {
    (a * c - b * s, a * s + b * c)
}

/// Rotate every head of every row in place. Shapes are checked by the caller.
pub(crate) fn rope(x: &mut [f32], head_dim: usize, positions: &[usize], rope: &Rope) {
    if x.is_empty() {
        // No rows, or rows of zero heads.
        return;
    }
    let row_len = x.len() / positions.len();
    let half = head_dim / 2;
    for (row, &pos) in x.chunks_exact_mut(row_len).zip(positions) {
        let cs: Vec<(f32, f32)> = angles(pos, head_dim, rope.base).collect();
        for head in row.chunks_exact_mut(head_dim) {
            match rope.style {
                RopeStyle::Interleaved => {
                    for (pair, &cs) in head.chunks_exact_mut(2).zip(&cs) {
                        (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                    }
                }
                RopeStyle::Halves => {
                    let (lo, hi) = head.split_at_mut(half);
                    for ((a, b), &cs) in lo.iter_mut().zip(hi).zip(&cs) {
                        (*a, *b) = rotate(*a, *b, cs);
                    }
                }
            }
        }
    }
}
