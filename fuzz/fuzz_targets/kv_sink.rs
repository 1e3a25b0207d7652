//! Fuzz target `kv_sink`: decodes the input into a `kvcore_test_support::kv_diff::Scenario`
//! whose windows come first (`Scenario::from_window_bytes`; the first gives the sink
//! store's window, the second its sinks, `kv_diff::sink::sink_params`) and replays it on
//! a `SinkKv` against a `DenseKv` (`kv_diff::sink::run`: appends across the sinks and the
//! window, prefills longer than the window, tail replacements, truncations into and
//! behind the window, forks, clears, refused allocations); any divergence is a crash.

#![no_main]

#[path = "../checks/replay.rs"]
mod replay;

use kvcore_test_support::kv_diff::{Scenario, sink};
use libfuzzer_sys::fuzz_target;
use replay::replay;

fuzz_target!(|data: &[u8]| replay(data, Scenario::from_window_bytes, sink::run));
