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

/// Slots of the per-thread cache of [`angles`] (direct-mapped by position).
const CACHED_POSITIONS: usize = 64;

/// One cached row of [`angles`]: its key and its values.
struct Cached {
    pos: usize,
    head_dim: usize,
    base: u32,
    cs: Vec<(f32, f32)>,
}

std::thread_local! {
    /// The angles of recent positions on this thread, slot `pos % CACHED_POSITIONS`: a
    /// pass calls `rope` twice per layer (queries, keys) at the same positions, so a
    /// decode step of 8 sequences would otherwise compute the same 8 rows of `pow`,
    /// `sin` and `cos` 2·n_layers times (~0.4 ms of a 12 ms step, 2 threads). The cached
    /// values are the ones computed, so results never depend on the cache.
    static CACHE: std::cell::RefCell<Vec<Cached>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rotate every head of every row in place. Shapes are checked by the caller.
pub(crate) fn rope(x: &mut [f32], head_dim: usize, positions: &[usize], rope: &Rope) {
    if x.is_empty() {
        // No rows, or rows of zero heads.
        return;
    }
    let row_len = x.len() / positions.len();
    let half = head_dim / 2;
    CACHE.with_borrow_mut(|cache| {
        for (row, &pos) in x.chunks_exact_mut(row_len).zip(positions) {
            let slot = pos % CACHED_POSITIONS;
            if cache.len() <= slot {
                cache.resize_with(CACHED_POSITIONS, || Cached {
                    pos: usize::MAX,
                    head_dim: 0,
                    base: 0,
                    cs: Vec::new(),
                });
            }
            let c = &mut cache[slot];
            if (c.pos, c.head_dim, c.base) != (pos, head_dim, rope.base.to_bits()) {
                c.cs.clear();
                c.cs.extend(angles(pos, head_dim, rope.base));
                (c.pos, c.head_dim, c.base) = (pos, head_dim, rope.base.to_bits());
            }
            let cs = &c.cs;
            for head in row.chunks_exact_mut(head_dim) {
                match rope.style {
                    RopeStyle::Interleaved => {
                        for (pair, &cs) in head.chunks_exact_mut(2).zip(cs) {
                            (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                        }
                    }
                    RopeStyle::Halves => {
                        let (lo, hi) = head.split_at_mut(half);
                        for ((a, b), &cs) in lo.iter_mut().zip(hi).zip(cs) {
                            (*a, *b) = rotate(*a, *b, cs);
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`rope`] without the cache: the angles of every row computed afresh.
    fn uncached(x: &mut [f32], head_dim: usize, positions: &[usize], r: &Rope) {
        let row_len = x.len() / positions.len();
        for (row, &pos) in x.chunks_exact_mut(row_len).zip(positions) {
            let cs: Vec<(f32, f32)> = angles(pos, head_dim, r.base).collect();
            for head in row.chunks_exact_mut(head_dim) {
                match r.style {
                    RopeStyle::Interleaved => {
                        for (pair, &c) in head.chunks_exact_mut(2).zip(&cs) {
                            (pair[0], pair[1]) = rotate(pair[0], pair[1], c);
                        }
                    }
                    RopeStyle::Halves => {
                        let (lo, hi) = head.split_at_mut(head_dim / 2);
                        for ((a, b), &c) in lo.iter_mut().zip(hi).zip(&cs) {
                            (*a, *b) = rotate(*a, *b, c);
                        }
                    }
                }
            }
        }
    }

    /// The cache never changes a bit: the same slot reused by another position
    /// (`p` and `p + 64`), another base and another head size, both pairings, and
    /// repeated positions within one call.
    #[test]
    fn cached_angles_are_the_computed_ones() {
        // Slot 6 holds position 6 for one base, then the next case asks for it with
        // another base, then with another head size; 5 and 69 share slot 5.
        let cases: [(usize, f32, RopeStyle, &[usize]); 6] = [
            (64, 10_000.0, RopeStyle::Halves, &[5, 6, 5, 69, 6, 8191]),
            (64, 100_000.0, RopeStyle::Halves, &[6, 69, 5]),
            (32, 100_000.0, RopeStyle::Interleaved, &[6, 7000]),
            (32, 100_000.0, RopeStyle::Halves, &[6, 5, 6]),
            (256, 1_000_000.0, RopeStyle::Halves, &[0, 64, 128]),
            (64, 10_000.0, RopeStyle::Interleaved, &[69, 5, 8191]),
        ];
        for (head_dim, base, style, positions) in cases {
            let r = Rope { base, style };
            let len = positions.len() * 3 * head_dim;
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let (mut got, mut want) = (x.clone(), x);
            rope(&mut got, head_dim, positions, &r);
            uncached(&mut want, head_dim, positions, &r);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{head_dim} {base} {positions:?}");
        }
    }
}
