//! kvcore's integration tests, one module per file, in one test binary.
//!
//! One binary instead of one per file: every binary linked its own copy of the
//! monomorphised forward pass for each backend (most of the test build's time), and
//! `cargo test` runs binaries one after another, so a binary with one slow test left the
//! other core idle. Here the harness spreads all the tests over the cores.
//!
//! Run one file's tests with its module path, e.g.
//! `cargo test --release --test integration batch::`.
//!
//! `conformance`, `golden`, `golden_q8` and `golden_gemma3` stay binaries of their own:
//! `.ci/wasm.sh` builds and runs them on wasm32, where the rest (threads, processes, the
//! model fetch) does not apply.

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod fuzz_corpus_replay;
mod gemma3_tiny;
mod generation;
mod gguf_malformed;
mod gguf_real;
mod gguf_real_gemma3;
mod gguf_roundtrip;
mod golden_q8_gemma3;
mod grow_vs_dense;
mod kv_fuzz_corpus;
mod kv_pool;
mod kv_props;
mod kv_q4;
mod kv_types_budget;
mod non_finite;
mod paged_model;
mod q8_prefill;
mod quant_vectors;
mod quant_vectors_k;
mod rayon_bitwise;
mod rayon_scope;
mod scalar_reference;
mod session_file;
mod session_key_offsets;
mod session_reuse;
mod session_window;
mod sink_store;
mod tokenizer_gemma;
mod tokenizer_golden;
mod tokenizer_props;
mod transactions;
mod window_attention;
mod window_checkpoints;
mod window_gemma3;
