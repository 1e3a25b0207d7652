//! The Llama runtime: config, forward pass, generation, and getting the model file.
//!
//! - [`config`]: hyper-parameters from GGUF metadata;
//! - [`llama`]: [`Llama`], the forward pass over any `Backend` and `KvStore`;
//! - [`generate`]: samplers, the generation loop and [`GenStats`];
//! - [`fetch`]: where the SmolLM2 file lives and how it gets there (PyPI, via pip).

pub mod config;
pub mod fetch;
pub mod generate;
pub mod llama;
pub mod tiny;

pub use config::LlamaConfig;
pub use generate::{GenStats, Generation, Sampler, Sampling, generate};
pub use llama::{Activations, Llama, Logits};

use crate::backend::ShapeError;
use crate::gguf::GgufError;
use crate::kv::KvError;
use thiserror::Error;

/// Errors of loading and running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("kernel shape error: {0}")]
    Shape(#[from] ShapeError),
    #[error("unsupported architecture {0:?}: kvcore runs llama-architecture models")]
    UnsupportedArchitecture(String),
    #[error("bad model metadata {key}: {problem}")]
    Config { key: String, problem: String },
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    #[error("tensor {name} has dims {found:?}, the config implies {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("KV store has {found:?} (layers, kv_dim), the model needs {expected:?}")]
    KvGeometry {
        expected: (usize, usize),
        found: (usize, usize),
    },
    #[error("empty input")]
    EmptyInput,
    #[error("non-finite values in the {0}")]
    NonFinite(&'static str),
    #[error("invalid sampling parameter: {0}")]
    Sampling(String),
}
