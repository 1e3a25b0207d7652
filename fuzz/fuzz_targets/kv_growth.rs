//! Fuzz target `kv_growth`: decodes the input into a `kvcore_test_support::kv_diff::Scenario`
//! and replays it on the specification store, a `DenseKv` and a `GrowKv` (appends,
//! replacements, rollbacks, failed passes, truncation, forks, refused allocations); any
//! divergence between them is a crash.

#![no_main]

use kvcore_test_support::kv_diff::{Scenario, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(scenario) = Scenario::from_bytes(data) else {
        return;
    };
    if let Err(divergence) = run(&scenario) {
        panic!("{divergence}");
    }
});
