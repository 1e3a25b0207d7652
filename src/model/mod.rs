//! The model runtime (Llama-family architectures: llama, gemma3): config, forward pass
//! and generation.
//!
//! - [`config`]: hyper-parameters from GGUF metadata;
//! - [`llama`]: [`Llama`], the forward pass over any `Backend` and `KvStore`;
//! - [`batch`]: [`Llama::forward_batch`], one pass over several sequences ([`BatchSeq`]);
//! - [`decoder`]: [`Decoder`], from logits to the next token and its text, and when to
//!   stop (every front end's);
//! - [`generate`](mod@generate): the generation loop of one session and [`GenStats`].

pub mod batch;
pub mod config;
pub mod decoder;
pub mod generate;
pub mod llama;
pub mod perplexity;
pub mod sample;

pub use batch::BatchSeq;
pub use config::{Arch, FfnActivation, LayerConfig, LlamaConfig};
pub use decoder::{Decoder, FinishReason, GenerateParams, Logprobs, Step, token_room};
pub use generate::{GenStats, Generation, generate};
pub use llama::{Activations, Llama, Logits, Q8_MAX_TOKENS};
pub use sample::{Sampler, SamplerParams, Sampling};

use crate::backend::ShapeError;
use crate::gguf::GgufError;
use crate::kv::{KvError, KvGeometry};
use thiserror::Error;

/// Errors of loading and running a model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model file could not be read or parsed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The KV store refused the pass (context overflow, allocation, misuse).
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A kernel was called with operands whose shapes do not fit. The message includes the
    /// [`ShapeError`]'s, so it is not also the `source`.
    #[error("kernel shape error: {0}")]
    Shape(ShapeError),
    /// `general.architecture` names an architecture kvcore does not run.
    #[error("unsupported architecture {arch:?}: kvcore runs llama and gemma3 models")]
    UnsupportedArchitecture {
        /// The file's architecture.
        arch: String,
    },
    /// A metadata value is missing, mistyped or inconsistent.
    #[error("bad model metadata {key}: {problem}")]
    Config {
        /// The metadata key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("tensor {name} is missing from the model file")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor's dims disagree with the config.
    #[error("tensor {name} has dims {found:?}, the config implies {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The dims the config implies (ggml order, `ne0` first).
        expected: Vec<u64>,
        /// The dims in the file.
        found: Vec<u64>,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A KV store whose geometry is not the model's.
    #[error("KV store has geometry {found:?}, the model needs {expected:?}")]
    KvGeometry {
        /// The model's.
        expected: KvGeometry,
        /// The store's.
        found: KvGeometry,
    },
    /// A KV store whose layer keeps only a window of positions the layer's attention
    /// can see past (a causal layer, or a larger window).
    #[error(
        "KV store layer {layer} keeps only the last {store} positions, but the model's attention there sees {}",
        match model { Some(w) => format!("{w}"), None => "every past position".to_string() }
    )]
    KvWindow {
        /// The layer.
        layer: usize,
        /// The store's window.
        store: usize,
        /// The model's window on that layer (`None`: causal).
        model: Option<usize>,
    },
    /// [`Llama::forward_batch`]: sequence `index` of the batch was refused — its store's
    /// geometry or window, a token id, its context overflowing, its store refusing the
    /// append's allocation (`error` says which). No store of the batch changed.
    #[error("sequence {index} of the batch: {error}")]
    Sequence {
        /// The sequence's index in the batch.
        index: usize,
        /// What was wrong with it.
        #[source]
        error: Box<ModelError>,
    },
    /// An empty prompt or text where at least one token is needed.
    #[error("empty input")]
    EmptyInput,
    /// NaN or infinite values where a result needs finite ones.
    #[error("non-finite values in the {what}")]
    NonFinite {
        /// Which values.
        what: &'static str,
    },
    /// A sampling parameter outside its range.
    #[error("invalid sampling parameter: {param} must be {rule}, got {value}")]
    Sampling {
        /// The parameter (`temperature`, `top-p`).
        param: &'static str,
        /// Its valid range.
        rule: &'static str,
        /// The value given.
        value: f32,
    },
}

impl From<ShapeError> for ModelError {
    fn from(e: ShapeError) -> Self {
        ModelError::Shape(e)
    }
}
