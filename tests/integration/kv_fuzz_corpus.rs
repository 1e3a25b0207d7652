//! Replays every committed input of the `kv_growth` and `kv_window` fuzz targets on
//! stable: each file in `fuzz/corpus/kv_growth` is decoded with `Scenario::from_bytes`,
//! each in `fuzz/corpus/kv_window` with `Scenario::from_window_bytes` (as the targets
//! do), and must run with no divergence between the specification store, `DenseKv`,
//! `GrowKv` and `WindowKv`; each in `fuzz/corpus/kv_pool` with
//! `PoolScenario::from_bytes` on a paged pool beside one `DenseKv` per sequence. An
//! empty or missing corpus directory fails.

use crate::common;
use kvcore_test_support::kv_diff::{Scenario, run};
use kvcore_test_support::pool_diff::{self, PoolScenario};

/// Replays `fuzz/corpus/<target>`, decoding each file with `decode`.
fn replay<E: std::fmt::Display>(target: &str, decode: fn(&[u8]) -> Result<Scenario, E>) {
    each_input(target, |bytes| {
        let scenario = decode(bytes).map_err(|e| format!("decoding: {e}"))?;
        run(&scenario).map_err(|d| d.to_string())
    });
}

/// Runs `check` on every file of `fuzz/corpus/<target>`.
fn each_input(target: &str, check: impl Fn(&[u8]) -> Result<(), String>) {
    for (path, bytes) in common::fuzz_corpus(target) {
        if let Err(e) = check(&bytes) {
            panic!("{}: {e}", path.display());
        }
    }
}

#[test]
fn kv_growth_corpus_replays_without_divergence() {
    replay("kv_growth", Scenario::from_bytes);
}

#[test]
fn kv_window_corpus_replays_without_divergence() {
    replay("kv_window", Scenario::from_window_bytes);
}

#[test]
fn kv_pool_corpus_replays_without_divergence() {
    each_input("kv_pool", |bytes| {
        let scenario = PoolScenario::from_bytes(bytes).map_err(|e| format!("decoding: {e}"))?;
        pool_diff::run(&scenario).map_err(|d| d.to_string())
    });
}
