//! Fuzz target `gguf_model`: a TinyLlama GGUF with metadata, tensor types, dims, offsets
//! and data mutated as the input describes, then `Llama::load` on the scalar backend and
//! a short forward pass (the input format and the check are in
//! `fuzz/checks/gguf_model.rs`, shared with `tests/integration/fuzz_corpus_replay.rs`).

#![no_main]

#[path = "../checks/gguf_model.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check_gguf_model(data));
