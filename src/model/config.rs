//! Llama hyper-parameters, read from GGUF metadata and checked for consistency.

use super::ModelError;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::kv::KvGeometry;

/// The shape of a Llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream (`d_model`).
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention: `n_heads` is a multiple).
    pub n_kv_heads: usize,
    /// Elements per head (`d_model / n_heads`).
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward block.
    pub ffn_dim: usize,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// Trained context length in positions.
    pub context_len: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RoPE pairing (GGUF llama files use adjacent pairs).
    pub rope_style: RopeStyle,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Whether the output projection reuses the token embedding (`output.weight` absent).
    pub tied_embeddings: bool,
}

impl LlamaConfig {
    /// Floats per K or V row: `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The KV store geometry: layers, KV heads, head size.
    pub fn kv_geometry(&self) -> KvGeometry {
        KvGeometry {
            n_layers: self.n_layers,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// Floats per query row: `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Reads the `llama.*` metadata of a GGUF file.
    ///
    /// Errors when the architecture is not `llama`, a required key is missing or has the
    /// wrong type, or the numbers are inconsistent (zero sizes, heads not dividing).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = file.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture {
                arch: arch.to_string(),
            });
        }
        let int = |key: &str| -> Result<usize, ModelError> {
            let v = file.get_u64(key)?;
            usize::try_from(v).map_err(|_| ModelError::Config {
                key: key.to_string(),
                problem: format!("{v} does not fit in usize"),
            })
        };
        let n_layers = int("llama.block_count")?;
        let d_model = int("llama.embedding_length")?;
        let n_heads = int("llama.attention.head_count")?;
        let n_kv_heads = match file.get("llama.attention.head_count_kv") {
            Some(_) => int("llama.attention.head_count_kv")?,
            None => n_heads,
        };
        let ffn_dim = int("llama.feed_forward_length")?;
        let context_len = int("llama.context_length")?;
        let rope_base = match file.get("llama.rope.freq_base") {
            Some(_) => file.get_f32("llama.rope.freq_base")?,
            None => 10_000.0,
        };
        let rms_eps = file.get_f32("llama.attention.layer_norm_rms_epsilon")?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let vocab_size = match file.get("llama.vocab_size") {
            Some(_) => int("llama.vocab_size")?,
            None => embd.dims.get(1).copied().unwrap_or(0) as usize,
        };
        let bad = |key: &str, problem: &str| ModelError::Config {
            key: key.to_string(),
            problem: problem.to_string(),
        };
        for (key, v) in [
            ("llama.block_count", n_layers),
            ("llama.embedding_length", d_model),
            ("llama.attention.head_count", n_heads),
            ("llama.attention.head_count_kv", n_kv_heads),
            ("llama.feed_forward_length", ffn_dim),
            ("llama.context_length", context_len),
            ("llama.vocab_size", vocab_size),
        ] {
            if v == 0 {
                return Err(bad(key, "must be non-zero"));
            }
        }
        if d_model % n_heads != 0 {
            return Err(bad(
                "llama.attention.head_count",
                "must divide llama.embedding_length",
            ));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(bad(
                "llama.attention.head_count_kv",
                "must divide llama.attention.head_count",
            ));
        }
        let head_dim = d_model / n_heads;
        if head_dim % 2 != 0 {
            return Err(bad(
                "llama.attention.head_count",
                "head_dim must be even for RoPE",
            ));
        }
        if let Some(v) = file.get("llama.rope.dimension_count") {
            if v.as_u64() != Some(head_dim as u64) {
                return Err(bad(
                    "llama.rope.dimension_count",
                    "partial rotary embedding is not supported: must equal head_dim",
                ));
            }
        }
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad("llama.rope.freq_base", "must be finite and positive"));
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(
                "llama.attention.layer_norm_rms_epsilon",
                "must be finite and non-negative",
            ));
        }
        Ok(LlamaConfig {
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_len,
            rope_base,
            rope_style: RopeStyle::Interleaved,
            rms_eps,
            tied_embeddings: file.tensor("output.weight").is_none(),
        })
    }
}
