//! Fuzz target `gguf_parse`: arbitrary bytes through `GgufFile::from_bytes`, then every
//! accessor of what parses (the check is `fuzz/checks/gguf_parse.rs`, shared with the
//! stable replay test `tests/integration/fuzz_corpus_replay.rs`).

#![no_main]

#[path = "../checks/gguf_parse.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check_gguf_parse(data));
