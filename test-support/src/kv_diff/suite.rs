//! The store conformance suite: kvcore's property-test scenarios, replayed by
//! [`run_store`] on any [`KvStore`] beside the specification store, so
//! a store written outside kvcore's repository is held to the same differential checks
//! as kvcore's own with one line in its tests.
//!
//! # Running it against a store
//! With `kvcore` and `kvcore-test-support` as dev-dependencies, one
//! [`kv_store_suite!`](crate::kv_store_suite) invocation in a `tests/` file declares a
//! module of `#[test]`s, one per scenario [`Family`]. The constructor gets each
//! scenario's [`StoreParams`] and returns the store, or the error the store's constructor
//! gives (which must be `DenseKv`'s for the same parameters):
//!
//! ```no_run
//! // tests/kv_store.rs
//! use kvcore::kv::{GrowKv, KvError};
//! use kvcore_test_support::kv_diff::StoreParams;
//!
//! /// The store under test: here kvcore's own growing store, keeping every position.
//! fn build(p: &StoreParams) -> Result<GrowKv, KvError> {
//!     let kv = GrowKv::with_types(p.geometry, p.max_ctx, p.types)?;
//!     match &p.key_offsets {
//!         Some(offsets) => kv.with_key_offsets(offsets.clone()),
//!         None => Ok(kv),
//!     }
//! }
//!
//! kvcore_test_support::kv_store_suite!(grow_kv, build);
//! # fn main() {}
//! ```
//!
//! `cargo test --test kv_store` then runs them. Each family draws [`CASES`] scenarios
//! from a fixed seed (every run draws the same ones); a failure panics with the smallest
//! scenario proptest could shrink it to and the first [`Divergence`],
//! and its seed is saved in `proptest-regressions/kv_store_suite.txt` (relative to the
//! package root, `cargo test`'s working directory) and replayed first.
//!
//! The scenarios are built directly rather than through `Arbitrary`, so that positions
//! are drawn around the scenario's own `max_ctx` (in range, at the ceiling, past it, near
//! `usize::MAX`), appends cross the growth boundaries, values are biased towards the
//! floats that expose a lossy copy (NaN payloads of both signs, `-0.0`, infinities,
//! subnormals), and failures shrink to small cases.

use kvcore::kv::{KvError, KvStore, KvType};
use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner,
};

use super::{Divergence, End, KvOp, MAX_CTX, Scenario, Start, StoreParams, run_store};

/// Scenarios per [`Family`] in [`check_store`].
pub const CASES: u32 = 256;

/// The families of scenarios, each a test of [`kv_store_suite!`](crate::kv_store_suite).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Family {
    /// f32 rows, every layer global: appends of every length and end (committed, rolled
    /// back, failed part-way, incomplete, refused rows), replacements of the tail,
    /// truncation, clear, forks and refused allocations.
    Plain,
    /// [`Plain`](Family::Plain) with sliding windows on some layers (mostly small, so
    /// appends cross them) and truncations relative to the end: by one position (always
    /// possible), into the window and behind it (`KvError::BehindWindow` for a store that
    /// applies the windows).
    Windowed,
    /// [`Windowed`](Family::Windowed) with K and V in f16, bf16 or `q8_0` (chosen
    /// separately; `q8_0` makes a head one block of 32 values, `Scenario::geometry`).
    Typed,
    /// `q8_0` keys kept less key offsets ([`Scenario::key_offsets`]: an odd `max_ctx`),
    /// deep enough to cross the offsets' 256-position blocks.
    KeyOffsets,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 4] = [
        Family::Plain,
        Family::Windowed,
        Family::Typed,
        Family::KeyOffsets,
    ];

    /// The scenarios of this family.
    pub fn scenarios(self) -> BoxedStrategy<Scenario> {
        match self {
            Family::Plain => scenario().boxed(),
            Family::Windowed => windowed_scenario().boxed(),
            Family::Typed => typed_scenario().boxed(),
            Family::KeyOffsets => offset_scenario().boxed(),
        }
    }
}

/// `cases` cases from a fixed seed, so every run draws the same scenarios; failures saved
/// in `proptest-regressions/kv_store_suite.txt`.
pub fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x6b76_636f_7265),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/kv_store_suite.txt",
        ))),
        ..Config::default()
    }
}

/// Runs [`CASES`] scenarios of `family` on the store `build` makes ([`run_store`]).
///
/// # Panics
/// On the first divergence, with the smallest failing scenario.
pub fn check_store<S: KvStore>(family: Family, build: impl Fn(&StoreParams) -> Result<S, KvError>) {
    check(family, config(CASES), |s| run_store(s, &build));
}

/// Runs `config.cases` scenarios of `family` through `run` (a runner such as
/// [`run_store`] with a store, or [`run`](super::run)).
///
/// # Panics
/// On the first divergence, with the smallest failing scenario.
pub fn check(family: Family, config: Config, run: impl Fn(&Scenario) -> Result<(), Divergence>) {
    let mut runner = TestRunner::new(config);
    let result = runner.run(&family.scenarios(), |s| {
        if family == Family::KeyOffsets && s.key_offsets().is_none() {
            return Err(TestCaseError::fail(
                "a KeyOffsets scenario without key offsets",
            ));
        }
        run(&s).map_err(|d| TestCaseError::fail(d.to_string()))
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, s)) => {
            panic!("{family:?} scenarios diverge: {reason}\nminimal scenario: {s:#?}")
        }
        Err(TestError::Abort(reason)) => panic!("{family:?} scenarios aborted: {reason}"),
    }
}

/// The store conformance suite as `#[test]` functions in a new module: kvcore's
/// differential scenarios on the store a constructor makes, against the specification
/// store (see [`suite`](crate::kv_diff::suite)).
///
/// `kv_store_suite!(module, build)` declares `mod module` with one test per
/// [`Family`](crate::kv_diff::suite::Family) (`plain`, `windowed`, `typed`,
/// `key_offsets`), each calling
/// [`check_store`](crate::kv_diff::suite::check_store) with `build`: a function or
/// closure `Fn(&StoreParams) -> Result<S, KvError>` for any store `S`. `build` is
/// evaluated inside the module, which imports the items of the enclosing one.
#[macro_export]
macro_rules! kv_store_suite {
    ($module:ident, $build:expr $(,)?) => {
        $crate::kv_store_suite!(
            @tests $module, $build,
            plain: Plain, windowed: Windowed, typed: Typed, key_offsets: KeyOffsets
        );
    };
    (@tests $module:ident, $build:expr, $($test:ident: $family:ident),+) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            use $crate::kv_diff::suite::{Family, check_store};

            $(
                #[test]
                fn $test() {
                    check_store(Family::$family, $build);
                }
            )+
        }
    };
}

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
        2 => (13usize..=super::MAX_WINDOW).prop_map(Some),
    ]
}

fn windowed_scenario() -> impl Strategy<Value = Scenario> {
    let max_ctx = prop_oneof![1 => 0..=3usize, 4 => 0..=MAX_CTX];
    scenario_of(max_ctx, windowed_op, |n_layers| {
        prop::collection::vec(window(), n_layers)
    })
}

/// Scenarios of f32 rows on random geometry: the context from `max_ctx`, up to
/// `MAX_OPS` ops from `op(max_ctx, kv_dim)`, the layers' windows from `windows(n_layers)`.
fn scenario_of<S, W>(
    max_ctx: impl Strategy<Value = usize>,
    op: impl Fn(usize, usize) -> S,
    windows: impl Fn(usize) -> W,
) -> impl Strategy<Value = Scenario>
where
    S: Strategy<Value = KvOp>,
    W: Strategy<Value = Vec<Option<usize>>>,
{
    (
        1..=super::MAX_LAYERS,
        1..=super::MAX_KV_HEADS,
        0..=super::MAX_HEAD_DIM,
        max_ctx,
    )
        .prop_flat_map(move |(n_layers, n_kv_heads, head_dim, max_ctx)| {
            let initial = prop::option::of(0..=max_ctx + 8);
            let ops = prop::collection::vec(op(max_ctx, n_kv_heads * head_dim), 0..=super::MAX_OPS);
            (initial, ops, windows(n_layers)).prop_map(move |(initial, ops, windows)| Scenario {
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

fn typed_scenario() -> impl Strategy<Value = Scenario> {
    (windowed_scenario(), quantized_types(), any::<bool>()).prop_map(|(mut s, types, global)| {
        s.types = types;
        if global {
            s.windows.clear();
        }
        s
    })
}

fn offset_scenario() -> impl Strategy<Value = Scenario> {
    let deep = windowed_scenario().prop_filter("past one block", |s| s.max_ctx > 256);
    (
        deep,
        prop::sample::select(KvType::ALL.to_vec()),
        prop::sample::select(vec![KvType::Q8_0, KvType::Q4_0]),
        any::<bool>(),
    )
        .prop_map(|(mut s, v, k, global)| {
            s.types = (k, v);
            s.max_ctx |= 1;
            s.head_dim = s.head_dim.max(1);
            if global {
                s.windows.clear();
            }
            s
        })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let max_ctx = prop_oneof![0..=3usize, 0..=MAX_CTX];
    // Global layers only (`Just` draws no randomness).
    scenario_of(max_ctx, op, |_| Just(Vec::new()))
}
