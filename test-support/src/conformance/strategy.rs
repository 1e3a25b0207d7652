//! Proptest strategies and configuration shared by the suites: shapes around the edges
//! kernels special-case, every weight format, RoPE positions and bases, head sizes.

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
