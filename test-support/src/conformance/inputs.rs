//! Seeded test data: [`Rng`], a splitmix64 generator of activations, and [`Matrix`], a
//! random weight matrix in any stored format.
//!
//! Proptest draws only shapes and a `u64` seed; the bulk data comes from [`Rng`], so
//! shrinking works on shapes and every case is reproducible from its printed seed.

use kvcore::backend::{DType, Weights};
use kvcore_scalar::quant::quantize_row;

use super::decode::{Decoded, decode};

/// splitmix64: a tiny, fast, well-mixed generator for test data.
pub struct Rng(u64);

impl Rng {
    /// The generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 24 random bits.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` values `±[0, 1)·2^e` with `e` uniform in `-4..=2`: mixed signs and magnitudes.
    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let e = self.below(7) as i32 - 4;
                self.range(-1.0, 1.0) * 2f32.powi(e)
            })
            .collect()
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn uniform(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.range(-scale, scale)).collect()
    }
}

/// A weight matrix `[rows, cols]` in stored form, quantised from random values with the
/// reference quantiser.
pub struct Matrix {
    /// The stored format.
    pub dtype: DType,
    /// Output rows.
    pub rows: usize,
    /// Input columns, a whole number of `dtype` blocks.
    pub cols: usize,
    /// `rows` stored rows, back to back.
    pub bytes: Vec<u8>,
}

impl Matrix {
    /// Random values of [`Rng::values`], quantised row by row.
    ///
    /// # Panics
    /// If `rows > 0` and `cols` is not a whole number of `dtype` blocks.
    pub fn random(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Self {
        let bytes = (0..rows)
            .flat_map(|_| quantize_row(dtype, &rng.values(cols)))
            .collect();
        Matrix {
            dtype,
            rows,
            cols,
            bytes,
        }
    }

    /// The matrix as kernels take it.
    pub fn weights(&self) -> Weights<'_> {
        Weights::new(self.dtype, self.rows, self.cols, &self.bytes).expect("valid matrix")
    }

    /// Row `r` decoded in f64 by [`decode`].
    pub fn row(&self, r: usize) -> Vec<Decoded> {
        decode(self.weights().dtype(), self.weights().row(r), self.cols)
    }

    /// Every weight as the plain f32 value it decodes to, row-major `[rows, cols]`: an
    /// F32 copy of the same matrix.
    pub fn decoded_f32(&self) -> Vec<f32> {
        (0..self.rows)
            .flat_map(|r| self.row(r).into_iter().map(|d| d.value as f32))
            .collect()
    }
}
