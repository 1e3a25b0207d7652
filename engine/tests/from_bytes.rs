//! `Engine::from_bytes`, the loader of embedders that hand the file in (the web page,
//! WebAssembly hosts): the same model as `Engine::load` of the path, checked against the
//! independent reference's greedy continuations, and clear errors for bad bytes.

use kvcore_engine::{BackendChoice, Engine, ErrorKind, GenerateParams, Options, SimdPath};
use serde_json::Value;

fn options() -> Options {
    Options {
        backend: BackendChoice::Simd,
        threads: None,
        ..Options::default()
    }
}

/// `(prompt ids, greedy ids)` of the SmolLM2 reference (`../shared/reference`, float64).
fn reference() -> Vec<(Vec<u32>, Vec<u32>)> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("reference logits"))
        .expect("parse the reference");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    v.as_array()
        .expect("a list")
        .iter()
        .map(|p| (ids(&p["prompt_ids"]), ids(&p["greedy_ids"])))
        .collect()
}

#[test]
fn from_bytes_generates_the_reference_continuations() {
    let path = kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required");
    let bytes = std::fs::read(&path).expect("read SmolLM2");
    let engine = Engine::from_bytes(bytes, options()).expect("load from bytes");
    assert_eq!(engine.path().to_str(), Some("<memory>"));
    assert!(engine.kernel_path().starts_with("simd/"), "{engine:?}");
    for (prompt, greedy) in reference() {
        let mut session = engine.new_session(None).expect("session");
        let mut params = GenerateParams::default();
        params.max_tokens = Some(greedy.len());
        let c = engine
            .generate(&mut session, &prompt, &params, |_| true)
            .expect("generate");
        let n = c.tokens.len();
        assert!(
            n > 0 && c.tokens[..] == greedy[..n],
            "{:?} vs {greedy:?}",
            c.tokens
        );
    }
}

#[test]
fn from_bytes_names_what_is_wrong() {
    let e = Engine::from_bytes(b"GGUF but not really".to_vec(), options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ModelFile, "{e}");
    assert!(e.message().contains("<memory>"), "{e}");
    let e = Engine::from_bytes(Vec::new(), options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ModelFile, "{e}");
    // Another architecture's kernels: refused, naming them, before the bytes are read.
    let foreign = if cfg!(target_arch = "x86_64") {
        SimdPath::Neon
    } else {
        SimdPath::Avx2Fma
    };
    let other = Options {
        kernels: Some(foreign),
        ..options()
    };
    let e = Engine::from_bytes(Vec::new(), other).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.message().contains(&format!("the {foreign} kernels")),
        "{e}"
    );
    let zero = Options {
        threads: Some(0),
        ..options()
    };
    let e = Engine::from_bytes(Vec::new(), zero).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}
