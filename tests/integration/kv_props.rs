//! Property tests: random op sequences on the specification store, `DenseKv`, `GrowKv`
//! and `WindowKv` must agree bit for bit after every step (`kvcore_test_support::kv_diff::run` does the
//! checking): appends of every length and end (committed, rolled back, failed part-way,
//! incomplete, refused rows), replacements of the tail, truncation, clear, forks and
//! refused allocations.
//!
//! The strategy builds `Scenario`s directly rather than through `Arbitrary`, so that
//! positions are drawn around the scenario's own `max_ctx` (in range, at the ceiling,
//! past it, near `usize::MAX`), appends cross the growth boundaries, values are biased
//! towards the floats that expose a lossy copy (NaN payloads of both signs, `-0.0`,
//! infinities, subnormals), and failures shrink to small cases.
//!
//! The third repeats the second with K and V in f16, bf16 or q8_0 (chosen separately).
//!
//! The second test gives layers sliding windows (mostly small, so appends cross them, and
//! prefills longer than the window are common) and adds truncations relative to the end:
//! by one position (always possible), into the window and behind it (refused with
//! `KvError::BehindWindow`); the window store must then agree with the spec's window
//! rule, and with the dense and growing stores at every position a query can see.

use kvcore::KvType;
use kvcore_test_support::kv_diff::{self, End, KvOp, Scenario, Start};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

/// f32 bit patterns: uniform, or one of the special classes.
fn float_bits() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => any::<u32>(),
        1 => Just((-0.0f32).to_bits()),
        1 => Just(0.0f32.to_bits()),
        // NaNs with a random sign and nonzero payload (quiet and signalling).
        2 => (any::<bool>(), 1..=0x007f_ffffu32)
            .prop_map(|(neg, payload)| (u32::from(neg) << 31) | 0x7f80_0000 | payload),
        1 => prop_oneof![Just(f32::INFINITY.to_bits()), Just(f32::NEG_INFINITY.to_bits())],
        // Subnormals.
        1 => (any::<bool>(), 1..=0x007f_ffffu32).prop_map(|(neg, m)| (u32::from(neg) << 31) | m),
    ]
}

/// Positions around a ceiling: mostly valid, some at or past it, a few absurd.
fn position(max_ctx: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0..max_ctx.max(1),
        2 => max_ctx..max_ctx + 4,
        1 => Just(usize::MAX),
        1 => (0..4usize).prop_map(|d| usize::MAX - 1 - d),
    ]
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        6 => Just(End::Commit),
        1 => Just(End::Rollback),
        1 => any::<u8>().prop_map(End::FailAfter),
        1 => any::<u8>().prop_map(End::SkipLayer),
        1 => any::<u8>().prop_map(End::BadRow),
    ]
}

fn start(max_ctx: usize) -> impl Strategy<Value = Start> {
    prop_oneof![
        6 => Just(Start::End),
        3 => (0u16..80).prop_map(Start::Back),
        1 => position(max_ctx).prop_map(Start::At),
    ]
}

fn op(max_ctx: usize, kv_dim: usize) -> impl Strategy<Value = KvOp> {
    // Enough words for distinct rows most of the time, sometimes fewer.
    let bits = move || prop::collection::vec(float_bits(), 0..=2 * kv_dim + 2);
    let n = prop_oneof![6 => 0usize..=4, 3 => 0usize..=140, 1 => position(max_ctx)];
    let seq = 0u8..4;
    prop_oneof![
        10 => (seq.clone(), start(max_ctx), n, bits(), end())
            .prop_map(|(seq, start, n, bits, end)| KvOp::Append { seq, start, n, bits, end }),
        2 => (seq.clone(), prop_oneof![0..=max_ctx, position(max_ctx)])
            .prop_map(|(seq, n)| KvOp::Truncate { seq, n }),
        1 => seq.clone().prop_map(|seq| KvOp::Clear { seq }),
        2 => seq.clone().prop_map(|seq| KvOp::Fork { seq }),
        1 => seq.prop_map(|seq| KvOp::Free { seq }),
        1 => Just(KvOp::RefuseNextAlloc),
    ]
}

/// [`op`], plus truncations relative to the end.
fn windowed_op(max_ctx: usize, kv_dim: usize) -> impl Strategy<Value = KvOp> {
    let back = prop_oneof![3 => 0u16..=2, 2 => 0u16..=50, 1 => any::<u16>()];
    prop_oneof![
        8 => op(max_ctx, kv_dim),
        2 => (0u8..4, back).prop_map(|(seq, back)| KvOp::TruncateBack { seq, back }),
    ]
}

/// Windows: none (a global layer), mostly small ones, sometimes up to the ceiling.
fn window() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![
        2 => Just(None),
        5 => (1usize..=12).prop_map(Some),
        2 => (13usize..=kv_diff::MAX_WINDOW).prop_map(Some),
    ]
}

fn windowed_scenario() -> impl Strategy<Value = Scenario> {
    let max_ctx = prop_oneof![1 => 0..=3usize, 4 => 0..=kv_diff::MAX_CTX];
    (
        1..=kv_diff::MAX_LAYERS,
        1..=kv_diff::MAX_KV_HEADS,
        0..=kv_diff::MAX_HEAD_DIM,
        max_ctx,
    )
        .prop_flat_map(|(n_layers, n_kv_heads, head_dim, max_ctx)| {
            let initial = prop::option::of(0..=max_ctx + 8);
            let ops = prop::collection::vec(
                windowed_op(max_ctx, n_kv_heads * head_dim),
                0..=kv_diff::MAX_OPS,
            );
            let windows = prop::collection::vec(window(), n_layers);
            (initial, ops, windows).prop_map(move |(initial, ops, windows)| Scenario {
                n_layers,
                n_kv_heads,
                head_dim,
                max_ctx,
                initial,
                ops,
                windows,
                types: (KvType::F32, KvType::F32),
            })
        })
}

/// K and V types with at least one of them not f32.
fn quantized_types() -> impl Strategy<Value = (KvType, KvType)> {
    let ty = || prop::sample::select(KvType::ALL.to_vec());
    (ty(), ty()).prop_filter("not f32 for both", |&t| t != (KvType::F32, KvType::F32))
}

/// [`windowed_scenario`] with quantized or half-precision rows (`q8_0` makes a head one
/// block of 32 values, `Scenario::geometry`).
fn typed_scenario() -> impl Strategy<Value = Scenario> {
    (windowed_scenario(), quantized_types(), any::<bool>()).prop_map(|(mut s, types, global)| {
        s.types = types;
        if global {
            s.windows.clear();
        }
        s
    })
}

/// [`windowed_scenario`] with q8_0 keys kept less key offsets (`Scenario::key_offsets`:
/// an odd `max_ctx`), deep enough to cross the offsets' 256-position blocks.
fn offset_scenario() -> impl Strategy<Value = Scenario> {
    let deep = windowed_scenario().prop_filter("past one block", |s| s.max_ctx > 256);
    (
        deep,
        prop::sample::select(KvType::ALL.to_vec()),
        any::<bool>(),
    )
        .prop_map(|(mut s, v, global)| {
            s.types = (KvType::Q8_0, v);
            s.max_ctx |= 1;
            s.head_dim = s.head_dim.max(1);
            if global {
                s.windows.clear();
            }
            s
        })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let max_ctx = prop_oneof![0..=3usize, 0..=kv_diff::MAX_CTX];
    (
        1..=kv_diff::MAX_LAYERS,
        1..=kv_diff::MAX_KV_HEADS,
        0..=kv_diff::MAX_HEAD_DIM,
        max_ctx,
    )
        .prop_flat_map(|(n_layers, n_kv_heads, head_dim, max_ctx)| {
            let initial = prop::option::of(0..=max_ctx + 8);
            let ops =
                prop::collection::vec(op(max_ctx, n_kv_heads * head_dim), 0..=kv_diff::MAX_OPS);
            (initial, ops).prop_map(move |(initial, ops)| Scenario {
                n_layers,
                n_kv_heads,
                head_dim,
                max_ctx,
                initial,
                ops,
                windows: Vec::new(),
                types: (KvType::F32, KvType::F32),
            })
        })
}

proptest! {
    #![proptest_config(Config {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x6b76_636f_7265),
        // The default would write tests/kv_props.proptest-regressions (the crate root has
        // no lib.rs for its lookup to stop at); keep it with the others. Paths are
        // relative to the package root, cargo test's working directory.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/kv_props.txt"
        ))),
        ..Config::default()
    })]

    #[test]
    fn stores_match_the_spec_after_every_step(s in scenario()) {
        if let Err(d) = kv_diff::run(&s) {
            return Err(TestCaseError::fail(d.to_string()));
        }
    }

    #[test]
    fn windowed_stores_match_the_spec_after_every_step(s in windowed_scenario()) {
        if let Err(d) = kv_diff::run(&s) {
            return Err(TestCaseError::fail(d.to_string()));
        }
    }

    /// f16, bf16 and q8_0 rows (K and V chosen separately): the growing and window
    /// stores hold the dense store's bytes, and the spec's (each row encoded alone).
    #[test]
    fn typed_stores_match_the_spec_after_every_step(s in typed_scenario()) {
        if let Err(d) = kv_diff::run(&s) {
            return Err(TestCaseError::fail(d.to_string()));
        }
    }

    /// q8_0 keys kept less key offsets over positions that cross their blocks: every
    /// store holds the spec's bytes (each key encoded less its block's offset) and hands
    /// attention the spec's offsets.
    #[test]
    fn stores_with_key_offsets_match_the_spec_after_every_step(s in offset_scenario()) {
        prop_assert!(s.key_offsets().is_some());
        if let Err(d) = kv_diff::run(&s) {
            return Err(TestCaseError::fail(d.to_string()));
        }
    }
}
