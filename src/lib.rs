//! kvcore: the numerics core for transformer inference on the CPU.
//!
//! - [`kv`]: the KV cache, [`KvStore`] with the grow-on-demand [`GrowKv`] and the dense
//!   reference [`DenseKv`].
//! - [`backend`]: the compute contract, [`Backend`], implemented by the crates under
//!   `backends/` (`kvcore-scalar`, `kvcore-simd`, `kvcore-rayon`).
//!
//! ARCHITECTURE.md at the repository root is the map of the whole project.

// `unsafe` is denied everywhere in the core crate; the single audited exception is the
// read-only memory map of a model file in `gguf/mmap.rs`.
#![deny(unsafe_code)]

pub mod backend;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod tokenizer;

pub use backend::{AttnShape, Backend, DType, Rope, RopeStyle, ShapeError, Weights};
pub use kv::{DenseKv, GrowKv, KvError, KvStore};
