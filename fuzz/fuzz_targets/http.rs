//! Fuzz target `http`: request bytes (head and body) through `kvcore serve`'s router, its
//! body checks and the scheduler's admission, on SmolLM2 from the cache
//! (`~/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf`; the target does nothing without
//! it). The input format and the check are in `fuzz/checks/http.rs`, shared with
//! `server/tests/http_corpus.rs`.

#![no_main]

#[path = "../checks/http.rs"]
mod check;
#[path = "../checks/replay.rs"]
mod replay;

use std::sync::OnceLock;

use check::Target;
use libfuzzer_sys::fuzz_target;

fn target() -> Option<&'static Target> {
    static TARGET: OnceLock<Option<Target>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            Target::new(
                &kvcore_fetch::SMOLLM2.cache_path().ok()?,
                Some(std::time::Duration::from_millis(50)),
            )
            .ok()
        })
        .as_ref()
}

fuzz_target!(|data: &[u8]| {
    if let Some(t) = target() {
        replay::replay(data, check::decode, |raw| t.run(raw));
    }
});
