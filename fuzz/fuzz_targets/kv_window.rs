//! Fuzz target `kv_window`: decodes the input into a `kvcore_test_support::kv_diff::Scenario`
//! whose per-layer sliding windows come first (`Scenario::from_window_bytes`) and replays
//! it on the specification store, a `DenseKv`, a `GrowKv` and a `WindowKv` (appends
//! across the window boundary, prefills longer than the window, tail replacements,
//! truncations into and behind the window, forks, clears, refused allocations); any
//! divergence is a crash.

#![no_main]

#[path = "../checks/replay.rs"]
mod replay;

use kvcore_test_support::kv_diff::{Scenario, run};
use libfuzzer_sys::fuzz_target;
use replay::replay;

fuzz_target!(|data: &[u8]| replay(data, Scenario::from_window_bytes, run));
