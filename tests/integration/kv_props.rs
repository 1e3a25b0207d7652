//! Property tests: random op sequences on the specification store, `DenseKv`, `GrowKv`
//! and `WindowKv` must agree bit for bit after every step (`kvcore_test_support::kv_diff`
//! does the checking, `kv_diff::suite` draws the scenarios: see its docs for what each
//! family covers), `GrowKv` also keeping to its growth rules (`kv_diff::run`). A paged
//! pool's sequence runs the same suite as a store under test, through the one-line
//! harness an outside store uses (`kv_store_suite!`).

use kvcore::kv::{KvError, KvPool, PagedKv, PoolConfig};
use kvcore_test_support::kv_diff::suite::{self, Family};
use kvcore_test_support::kv_diff::{self, StoreParams};
use proptest::test_runner::{Config, FileFailurePersistence};

/// The suite's configuration with failures kept beside the other regression files (the
/// default would write tests/kv_props.proptest-regressions: the crate root has no lib.rs
/// for its lookup to stop at). Paths are relative to the package root, cargo test's
/// working directory.
fn config() -> Config {
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/kv_props.txt",
        ))),
        ..suite::config(suite::CASES)
    }
}

#[test]
fn stores_match_the_spec_after_every_step() {
    suite::check(Family::Plain, config(), kv_diff::run);
}

#[test]
fn windowed_stores_match_the_spec_after_every_step() {
    suite::check(Family::Windowed, config(), kv_diff::run);
}

/// f16, bf16 and q8_0 rows (K and V chosen separately): the growing and window stores
/// hold the dense store's bytes, and the spec's (each row encoded alone).
#[test]
fn typed_stores_match_the_spec_after_every_step() {
    suite::check(Family::Typed, config(), kv_diff::run);
}

/// q8_0 keys kept less key offsets over positions that cross their blocks: every store
/// holds the spec's bytes (each key encoded less its block's offset) and hands attention
/// the spec's offsets.
#[test]
fn stores_with_key_offsets_match_the_spec_after_every_step() {
    suite::check(Family::KeyOffsets, config(), kv_diff::run);
}

/// One sequence of its own pool of 16-position blocks (no budget, so no refusal).
fn paged(p: &StoreParams) -> Result<PagedKv, KvError> {
    let config = PoolConfig {
        block_len: 16,
        budget: usize::MAX,
        key: [3; 32],
    };
    let pool = KvPool::new(p.geometry, p.types, config)?;
    let pool = match &p.key_offsets {
        Some(o) => pool.with_key_offsets(o.clone())?,
        None => pool,
    };
    pool.sequence(p.max_ctx)
}

kvcore_test_support::kv_store_suite!(paged_kv_matches_the_spec, paged);
