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
#![warn(missing_docs)]

pub mod backend;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod session;
pub mod tokenizer;

pub use backend::{AttnParams, Backend, DType, Mask, Rope, RopeStyle, ShapeError, Weights};
pub use kv::{Append, DenseKv, GrowKv, KvError, KvGeometry, KvStore, KvType, KvView};
/// The array crate of kvcore's public signatures (attention's operands, the KV views),
/// re-exported so callers use the same version.
pub use ndarray;
pub use session::{Prefill, Session, SessionError};
