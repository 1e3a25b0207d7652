//! Proptest strategies and configuration shared by the suites: shapes around the edges
//! kernels special-case, every weight format, RoPE positions and bases, head sizes.

use std::ops::Range;

use kvcore::KvType;
use kvcore::backend::{DType, RopeStyle, q8};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::cases::{Attention, AttnShape};

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

/// Any weight format with an 8-bit-activation GEMV.
pub fn q8_dtype() -> impl Strategy<Value = DType> {
    let formats: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|&d| q8::supports(d))
        .collect();
    prop::sample::select(formats)
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

/// The draw of an attention case over stored rows ([`kv_attention`]): its shape, query
/// rows and rows past them, segment cuts, K and V types, window, and whether the keys
/// are stored less key offsets.
#[derive(Clone, Debug)]
pub struct KvAttention {
    /// Heads, head size and the first query position.
    pub shape: AttnShape,
    /// Query rows.
    pub n_new: usize,
    /// Cached rows past the queries (masked).
    pub extra: usize,
    /// Where the rows are cut into segments.
    pub cuts: Vec<usize>,
    /// The element types of the keys and of the values.
    pub kv_types: (KvType, KvType),
    /// A sliding window, or causal.
    pub window: Option<usize>,
    /// Whether `q8_0` keys are stored less key offsets.
    pub key_offsets: bool,
    /// Seed of the inputs.
    pub seed: u64,
}

impl KvAttention {
    /// The case drawn (key offsets from `!seed`).
    pub fn case(&self) -> Attention {
        let case = Attention::new(self.shape, self.n_new, self.extra, self.seed)
            .with_cuts(&self.cuts)
            .with_kv_types(self.kv_types)
            .with_window(self.window);
        if self.key_offsets {
            case.with_key_offsets(!self.seed)
        } else {
            case
        }
    }
}

/// Attention over rows of every KV type (K and V chosen separately): a head size of
/// `head_dims`, KV heads in `n_kv` with 1 to 3 query heads each, the first query at a
/// position in `pos0`, `n_new` query rows and `extra` masked rows past them, the rows cut
/// into up to 3 segments before `pos0.end`, causal or a sliding window of a size in
/// `window`; with `offsets`, the keys stored less key offsets half the time.
pub fn kv_attention(
    head_dims: Vec<usize>,
    n_kv: Range<usize>,
    pos0: Range<usize>,
    n_new: impl Strategy<Value = usize>,
    extra: usize,
    window: Range<usize>,
    offsets: bool,
) -> impl Strategy<Value = KvAttention> {
    let types = || prop::sample::select(KvType::ALL.to_vec());
    let cuts = prop::collection::vec(0..pos0.end, 0..3);
    (
        (
            prop::sample::select(head_dims),
            n_kv,
            1usize..4,
            pos0,
            n_new,
        ),
        (cuts, types(), types(), prop::option::of(window)),
        (any::<u64>(), any::<bool>().prop_map(move |b| b && offsets)),
    )
        .prop_map(
            move |(
                (head_dim, n_kv, group, pos0, n_new),
                (cuts, k, v, window),
                (seed, key_offsets),
            )| {
                KvAttention {
                    shape: AttnShape {
                        n_heads: n_kv * group,
                        n_kv_heads: n_kv,
                        head_dim,
                        pos0,
                    },
                    n_new,
                    extra,
                    cuts,
                    kv_types: (k, v),
                    window,
                    key_offsets,
                    seed,
                }
            },
        )
}
