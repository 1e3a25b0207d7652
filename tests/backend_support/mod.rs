//! Test helpers shared by the backend suites (`conformance.rs`, `scalar_reference.rs`,
//! `rayon_bitwise.rs`): a seeded generator of activations and weights, and an
//! independent float64 decoder of the weight formats.
//!
//! Proptest draws only shapes and a `u64` seed; the bulk data comes from [`Rng`]
//! (splitmix64), so shrinking works on shapes and every case is reproducible from its
//! printed seed.

#![allow(dead_code)] // each test binary uses a different subset of these helpers

pub mod cases;
pub mod oracle;

use half::{bf16, f16};
use kvcore::backend::{DType, QK, Weights};
use kvcore_scalar::quant::quantize_row;

/// The unit roundoff of f32, `2^-24`.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The smallest positive normal f32, `2^-126`: below it the relative error model of
/// floating point fails (gradual underflow, or flush-to-zero in SIMD units), so each
/// rounding may add this much absolute error.
pub const TINY: f64 = f32::MIN_POSITIVE as f64;

/// splitmix64: a tiny, fast, well-mixed generator for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

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
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Vec<u8>,
}

impl Matrix {
    /// `cols` must be a whole number of `dtype` blocks.
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

    pub fn weights(&self) -> Weights<'_> {
        Weights::new(self.dtype, self.rows, self.cols, &self.bytes).expect("valid matrix")
    }

    /// Row `r` decoded in f64 by [`decode`].
    pub fn row(&self, r: usize) -> Vec<Decoded> {
        decode(self.weights().dtype(), self.weights().row(r), self.cols)
    }
}

/// One decoded weight: its exact value and the magnitude of the terms that make it.
#[derive(Clone, Copy, Debug)]
pub struct Decoded {
    /// The weight as the format defines it (an f32 value, held in f64).
    pub value: f64,
    /// `|d·q| + |m|` for `Q4_1` (a kernel may expand `Σ(d·q_j + m)·x_j` as
    /// `d·Σq_j·x_j + m·Σx_j`, whose rounding scales with both parts), `|value|` otherwise.
    pub mag: f64,
}

/// Decode `cols` weights of `dtype` from `bytes`, independently of `kvcore_scalar`:
/// scales and quants are read and multiplied in f64 (`d·q` is exact there), and the
/// result is rounded once to f32 as the format defines.
pub fn decode(dtype: DType, bytes: &[u8], cols: usize) -> Vec<Decoded> {
    let plain = |value: f64| Decoded {
        value,
        mag: value.abs(),
    };
    let f16_at = |b: &[u8], at: usize| f64::from(f16::from_le_bytes([b[at], b[at + 1]]));
    let nibble = |qs: &[u8], j: usize| {
        if j < QK / 2 {
            qs[j] & 15
        } else {
            qs[j - QK / 2] >> 4
        }
    };
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    let out: Vec<Decoded> = match dtype {
        DType::F32 => blocks
            .map(|b| plain(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))))
            .collect(),
        DType::F16 => blocks.map(|b| plain(f16_at(b, 0))).collect(),
        DType::BF16 => blocks
            .map(|b| plain(f64::from(bf16::from_le_bytes([b[0], b[1]]))))
            .collect(),
        DType::Q8_0 => blocks
            .flat_map(|b| {
                let d = f16_at(b, 0);
                (0..QK).map(move |j| plain(f64::from((d * f64::from(b[2 + j] as i8)) as f32)))
            })
            .collect(),
        DType::Q4_0 => blocks
            .flat_map(|b| {
                let d = f16_at(b, 0);
                (0..QK).map(move |j| {
                    let q = f64::from(nibble(&b[2..], j)) - 8.0;
                    plain(f64::from((d * q) as f32))
                })
            })
            .collect(),
        DType::Q4_1 => blocks
            .flat_map(|b| {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                (0..QK).map(move |j| {
                    let dq = d * f64::from(nibble(&b[4..], j));
                    Decoded {
                        value: f64::from((dq + m) as f32),
                        mag: dq.abs() + m.abs(),
                    }
                })
            })
            .collect(),
        other => panic!("the oracle has no decoder for {other}"),
    };
    assert_eq!(out.len(), cols, "decode: byte count does not match cols");
    out
}

/// `(Σ w_j·x_j, Σ mag_j·|x_j|)` in f64: the exact dot product (to f64 accuracy) and the
/// sum of the absolute terms that scales its rounding error.
pub fn dot_f64(w: &[Decoded], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, &x)| {
        let x = f64::from(x);
        (s + w.value * x, a + w.mag * x.abs())
    })
}

/// Bit patterns, for exact comparisons that also tell `0.0` from `-0.0` and see NaN.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Proptest strategies and configuration shared by the suites.
pub mod strategy {
    use kvcore::backend::{DType, RopeStyle};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    /// A fixed seed and `cases` cases, so every run draws the same inputs.
    pub fn config(cases: u32) -> Config {
        Config {
            cases,
            rng_seed: RngSeed::Fixed(0x6b76_636f_7265),
            ..Config::default()
        }
    }

    /// Any weight format.
    pub fn dtype() -> impl Strategy<Value = DType> {
        prop::sample::select(DType::ALL.to_vec())
    }

    /// Lengths around the edges kernels special-case: 0, 1, tile sizes ±1, odd lengths,
    /// and the SmolLM2 widths.
    pub fn dim() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0usize),
            1usize..7,
            prop::sample::select(vec![7usize, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65]),
            66usize..140,
            prop::sample::select(vec![192usize, 576]),
        ]
    }

    /// A positive length from [`dim`].
    pub fn dim1() -> impl Strategy<Value = usize> {
        dim().prop_map(|d| d.max(1))
    }

    /// `(dtype, cols)` with `cols` a whole number of blocks (possibly 0).
    pub fn dtype_cols() -> impl Strategy<Value = (DType, usize)> {
        (dtype(), dim()).prop_map(|(t, c)| (t, c.next_multiple_of(t.block_len())))
    }

    /// Either RoPE pairing.
    pub fn rope_style() -> impl Strategy<Value = RopeStyle> {
        prop::sample::select(vec![RopeStyle::Interleaved, RopeStyle::Halves])
    }

    /// RoPE positions: small, and around 8192 where f32 angles lose accuracy.
    pub fn position() -> impl Strategy<Value = usize> {
        prop_oneof![0usize..64, 8000usize..8300, 0usize..40_000]
    }

    /// RoPE frequency bases in use (Llama 2, SmolLM2, Llama 3).
    pub fn rope_base() -> impl Strategy<Value = f32> {
        prop::sample::select(vec![10_000.0f32, 100_000.0, 500_000.0])
    }

    /// Even head sizes including the tile edges.
    pub fn head_dim_even() -> impl Strategy<Value = usize> {
        prop::sample::select(vec![
            2usize, 4, 6, 8, 14, 16, 18, 30, 32, 34, 62, 64, 66, 128,
        ])
    }

    /// Head sizes for attention (any positive size).
    pub fn head_dim() -> impl Strategy<Value = usize> {
        prop::sample::select(vec![1usize, 2, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65])
    }
}
