//! Replays every committed input of the `kv_growth`, `kv_window` and `kv_sink` fuzz
//! targets on stable: each file in `fuzz/corpus/kv_growth` is decoded with
//! `Scenario::from_bytes`, each in `fuzz/corpus/kv_window` with
//! `Scenario::from_window_bytes` (as the targets do), and must run with no divergence
//! between the specification store, `DenseKv`, `GrowKv` and `WindowKv`; each in
//! `fuzz/corpus/kv_sink` likewise on a `SinkKv` against a `DenseKv` (`kv_diff::sink`);
//! each in `fuzz/corpus/kv_pool` with `PoolScenario::from_bytes` on a paged pool beside
//! one `DenseKv` per sequence. An empty or missing corpus directory fails.

use crate::common;
use kvcore_test_support::kv_diff::{Scenario, run, sink};
use kvcore_test_support::pool_diff::{self, PoolScenario};

/// Replays `fuzz/corpus/<target>`, decoding each file with `decode`.
fn replay<E: std::fmt::Display>(target: &str, decode: fn(&[u8]) -> Result<Scenario, E>) {
    replay_with(target, decode, run);
}

/// [`replay`] through the runner `runner`.
fn replay_with<E: std::fmt::Display, D: std::fmt::Display>(
    target: &str,
    decode: fn(&[u8]) -> Result<Scenario, E>,
    runner: fn(&Scenario) -> Result<(), D>,
) {
    each_input(target, |bytes| {
        let scenario = decode(bytes).map_err(|e| format!("decoding: {e}"))?;
        runner(&scenario).map_err(|d| d.to_string())
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
fn kv_sink_corpus_replays_without_divergence() {
    replay_with("kv_sink", Scenario::from_window_bytes, sink::run);
}

#[test]
fn kv_pool_corpus_replays_without_divergence() {
    each_input("kv_pool", |bytes| {
        let scenario = PoolScenario::from_bytes(bytes).map_err(|e| format!("decoding: {e}"))?;
        pool_diff::run(&scenario).map_err(|d| d.to_string())
    });
}
