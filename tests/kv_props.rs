//! Property test: random op sequences on a `GrowKv` and the reference `DenseKv` must
//! agree bit for bit after every op (`kvcore::kv::diff::run` does the checking).
//!
//! The strategy builds `Scenario`s directly rather than through `Arbitrary`, so that
//! positions are drawn around the scenario's own `max_ctx` (in range, at the ceiling,
//! past it, near `usize::MAX`), values are biased towards the floats that expose a lossy
//! copy (NaN payloads of both signs, `-0.0`, infinities, subnormals), and failures shrink
//! to small cases.

use kvcore::kv::diff::{self, KvOp, Plane, Scenario};
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

fn plane() -> impl Strategy<Value = Plane> {
    prop_oneof![Just(Plane::K), Just(Plane::V), Just(Plane::Both)]
}

fn op(max_ctx: usize, kv_dim: usize) -> impl Strategy<Value = KvOp> {
    // Enough words for distinct K and V rows most of the time, sometimes fewer.
    let bits = || prop::collection::vec(float_bits(), 0..=2 * kv_dim);
    prop_oneof![
        6 => (any::<u8>(), plane(), bits())
            .prop_map(|(layer, plane, bits)| KvOp::Append { layer, plane, bits }),
        3 => (any::<u8>(), position(max_ctx), plane(), bits()).prop_map(
            |(layer, pos, plane, bits)| KvOp::WriteAt { layer, pos, plane, bits }
        ),
        2 => prop_oneof![0..=max_ctx, position(max_ctx)].prop_map(|n| KvOp::SetSeqLen { n }),
        1 => Just(KvOp::Clear),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let max_ctx = prop_oneof![0..=3usize, 0..=diff::MAX_CTX];
    (1..=diff::MAX_LAYERS, 0..=diff::MAX_KV_DIM, max_ctx).prop_flat_map(
        |(n_layers, kv_dim, max_ctx)| {
            let initial = prop::option::of(0..=max_ctx + 8);
            let ops = prop::collection::vec(op(max_ctx, kv_dim), 0..=diff::MAX_OPS);
            (initial, ops).prop_map(move |(initial, ops)| Scenario {
                n_layers,
                kv_dim,
                max_ctx,
                initial,
                ops,
            })
        },
    )
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
    fn grow_matches_dense_after_every_op(s in scenario()) {
        if let Err(d) = diff::run(&s) {
            return Err(TestCaseError::fail(d.to_string()));
        }
    }
}
