//! Fuzz target `kv_window`: decodes the input into a `kvcore_test_support::kv_diff::Scenario`
//! whose per-layer sliding windows come first (`Scenario::from_window_bytes`) and replays
//! it on the specification store, a `DenseKv`, a `GrowKv` and a `WindowKv` (appends
//! across the window boundary, prefills longer than the window, tail replacements,
//! truncations into and behind the window, forks, clears, refused allocations); any
//! divergence is a crash.

#![no_main]

use kvcore_test_support::kv_diff::{Scenario, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(scenario) = Scenario::from_window_bytes(data) else {
        return;
    };
    if let Err(divergence) = run(&scenario) {
        panic!("{divergence}");
    }
});
