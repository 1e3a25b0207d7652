//! Fuzz target `kv_growth`: decodes the input into a `kvcore::kv::diff::Scenario` (the
//! byte format is in that module's docs) and replays it on a `GrowKv` and a `DenseKv`;
//! any divergence between the two is a crash.

#![no_main]

use kvcore::kv::diff::{Scenario, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(scenario) = Scenario::from_bytes(data) else {
        return;
    };
    if let Err(divergence) = run(&scenario) {
        panic!("{divergence}");
    }
});
