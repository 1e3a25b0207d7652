//! The body of the differential KV fuzz targets (`kv_growth`, `kv_window`, `kv_sink`,
//! `kv_pool`):
//! an input that decodes to a scenario is replayed, and any divergence is a crash.

use std::fmt::Display;

/// Decodes `data` with `decode` (an input that does not decode is skipped) and replays the
/// scenario with `run`, panicking with the divergence it reports.
pub fn replay<S, E, D: Display>(
    data: &[u8],
    decode: impl FnOnce(&[u8]) -> Result<S, E>,
    run: impl FnOnce(&S) -> Result<(), D>,
) {
    let Ok(scenario) = decode(data) else {
        return;
    };
    if let Err(divergence) = run(&scenario) {
        panic!("{divergence}");
    }
}
