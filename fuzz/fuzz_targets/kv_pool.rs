//! Fuzz target `kv_pool`: decodes the input into a
//! `kvcore_test_support::pool_diff::PoolScenario` and replays it on the sequences of one
//! paged KV pool, each beside its own `DenseKv` (appends, replacements, rollbacks,
//! failed passes, truncation, forks, frees, publishing and finding prefixes, eviction,
//! budgets, refused allocations), auditing the pool's books after every op; any
//! divergence is a crash.

#![no_main]

#[path = "../checks/replay.rs"]
mod replay;

use kvcore_test_support::pool_diff::{PoolScenario, run};
use libfuzzer_sys::fuzz_target;
use replay::replay;

fuzz_target!(|data: &[u8]| replay(data, PoolScenario::from_bytes, run));
