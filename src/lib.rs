//! kvcore: the numerics core for transformer inference on the CPU.
//!
//! - [`kv`]: the KV cache, [`KvStore`] with the grow-on-demand [`GrowKv`], the dense
//!   reference [`DenseKv`] and the sliding-window [`WindowKv`].
//! - [`backend`]: the compute contract, [`Backend`], implemented by the crates under
//!   `backends/` (`kvcore-scalar`, `kvcore-simd`, `kvcore-rayon`).
//!
//! - [`model`]: the Llama forward pass, the [`model::Decoder`] (sampling, text, when to
//!   stop) and [`model::generate()`].
//! - [`session`]: a [`Session`] keeps a conversation's cache across turns and in files.
//! - [`tokenizer`] and [`gguf`]: the model file, its tokenizer and chat template.
//!
//! ARCHITECTURE.md at the repository root is the map of the whole project.
//!
//! # Quickstart
//!
//! Load a model, chat for two turns through one session (the second turn reuses the
//! first one's cached positions), and score a text. `examples/quickstart.rs` is the same
//! program, with a perplexity, ready to run (`cargo run --release --example quickstart`).
//!
//! ```no_run
//! use kvcore::gguf::GgufFile;
//! use kvcore::model::{self, Decoder, GenerateParams, Llama, Logits};
//! use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer};
//! use kvcore::{GrowKv, KvStore, Session};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let template = ChatTemplate::from_gguf(&file)?.ok_or("no chat template")?;
//! // Any backend: kvcore-scalar (the reference), kvcore-simd, kvcore-rayon.
//! let model = Llama::load(file, kvcore_simd::Simd::new())?;
//!
//! let store = GrowKv::new(model.kv_geometry(), model.config().context_len)?;
//! let mut session = Session::new(store);
//! let params = GenerateParams::default(); // greedy, at most 128 tokens
//! let mut messages = vec![];
//! for question in ["What is the capital of France?", "And of Italy?"] {
//!     messages.push(ChatMessage::new("user", question));
//!     // Markup becomes control tokens, the user's text never does.
//!     let prompt = template.render_chat(&messages, true)?.encode(&tok);
//!     // The decoder samples, turns tokens into text and decides when to stop.
//!     let mut decoder = Decoder::new(&tok, &params, &prompt, session.kv().max_ctx())?;
//!     let out = model::generate(&model, &mut session, &prompt, &mut decoder, |_| true)
//!         .map_err(|e| e.source)?;
//!     println!("{} ({} positions reused)", decoder.text(), out.stats.reused_tokens);
//!     messages.push(ChatMessage::new("assistant", decoder.text()));
//! }
//!
//! // Every position's logits in one pass, [n, vocab]: what a perplexity needs.
//! let ids = tok.encode("The quick brown fox", Special::Literal);
//! let mut kv = GrowKv::new(model.kv_geometry(), ids.len())?;
//! let logits = model.forward(&mut kv, &ids, Logits::All)?;
//! assert_eq!(logits.nrows(), ids.len());
//! # Ok(())
//! # }
//! ```

// `unsafe` is denied everywhere in the core crate; the single audited exception is the
// read-only memory map of a model file in `gguf/mmap.rs`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod session;
pub mod tokenizer;

pub use backend::{
    AttnJob, AttnParams, Backend, DType, Mask, Rope, RopeStyle, ShapeError, Weights,
};
pub use kv::{
    Append, DenseKv, GrowKv, KvError, KvGeometry, KvRestore, KvStore, KvType, KvView, SinkKv,
    WindowKv,
};
/// The array crate of kvcore's public signatures (attention's operands, the KV views),
/// re-exported so callers use the same version.
pub use ndarray;
pub use session::{Prefill, Session, SessionError};
