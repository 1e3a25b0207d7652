//! Fuzz target `tokenizer`: arbitrary text round-trips through encode and decode, and
//! arbitrary id sequences decode or report their unknown id, on synthetic byte-level
//! vocabularies and, when `~/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf` exists, the
//! real SmolLM2 one (the input format and the check are in `fuzz/checks/tokenizer.rs`,
//! shared with `tests/fuzz_corpus_replay.rs`).

#![no_main]

#[path = "../checks/tokenizer.rs"]
mod check;

use std::sync::OnceLock;

use check::Vocab;
use kvcore::gguf::GgufFile;
use kvcore::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

/// The SmolLM2 vocabulary, if the model file is in the cache (never downloaded here).
fn real() -> Option<&'static Vocab> {
    static REAL: OnceLock<Option<Vocab>> = OnceLock::new();
    REAL.get_or_init(|| {
        let path = kvcore_fetch::cache_path().ok()?;
        let file = GgufFile::open(&path).ok()?;
        Some(Vocab::new(Tokenizer::from_gguf(&file).ok()?))
    })
    .as_ref()
}

fuzz_target!(|data: &[u8]| check::check_tokenizer(data, real()));
