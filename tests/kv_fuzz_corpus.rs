//! Replays every committed input of the `kv_growth` fuzz target on stable: each file in
//! `fuzz/corpus/kv_growth` is decoded with `Scenario::from_bytes` (as the fuzz target
//! does) and must run with no divergence between `GrowKv` and `DenseKv`. An empty or
//! missing corpus directory fails.

use std::fs;
use std::path::Path;

use kvcore_test_support::kv_diff::{Scenario, run};

#[test]
fn kv_growth_corpus_replays_without_divergence() {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/corpus/kv_growth"
    ));
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    for path in &files {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let scenario = Scenario::from_bytes(&bytes)
            .unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()));
        if let Err(divergence) = run(&scenario) {
            panic!("{}: {divergence}", path.display());
        }
    }
}
