//! Fuzz target `kv_growth`: decodes the input into a `kvcore_test_support::kv_diff::Scenario`
//! and replays it on the specification store, a `DenseKv` and a `GrowKv` (appends,
//! replacements, rollbacks, failed passes, truncation, forks, refused allocations); any
//! divergence between them is a crash.

#![no_main]

#[path = "../checks/replay.rs"]
mod replay;

use kvcore_test_support::kv_diff::{Scenario, run};
use libfuzzer_sys::fuzz_target;
use replay::replay;

fuzz_target!(|data: &[u8]| replay(data, Scenario::from_bytes, run));
