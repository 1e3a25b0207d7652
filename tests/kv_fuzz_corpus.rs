//! Replays every committed input of the `kv_growth` and `kv_window` fuzz targets on
//! stable: each file in `fuzz/corpus/kv_growth` is decoded with `Scenario::from_bytes`,
//! each in `fuzz/corpus/kv_window` with `Scenario::from_window_bytes` (as the targets
//! do), and must run with no divergence between the specification store, `DenseKv`,
//! `GrowKv` and `WindowKv`. An empty or missing corpus directory fails.

use std::fs;
use std::path::Path;

use kvcore_test_support::kv_diff::{Scenario, run};

/// Replays `fuzz/corpus/<target>`, decoding each file with `decode`.
fn replay<E: std::fmt::Display>(target: &str, decode: fn(&[u8]) -> Result<Scenario, E>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    for path in &files {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let scenario =
            decode(&bytes).unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()));
        if let Err(divergence) = run(&scenario) {
            panic!("{}: {divergence}", path.display());
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
