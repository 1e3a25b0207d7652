//! Model hyper-parameters, read from GGUF metadata and checked for consistency.
//!
//! One forward description serves every supported architecture; what differs between them
//! is configuration, read here from `general.architecture` and the `<arch>.*` keys:
//!
//! | | `llama` | `gemma3` |
//! |---|---|---|
//! | embedding | as stored | × √d_model (f32 `sqrtf`, as llama.cpp) |
//! | head_dim | d_model / n_heads (or `attention.key_length`) | `attention.key_length` |
//! | q, k per head | — | RMSNorm with `attn_q_norm` / `attn_k_norm` |
//! | RoPE | adjacent pairs, `rope.freq_base` | NEOX halves; `rope.freq_base` on global layers, 10 000 on window layers |
//! | attention | causal on every layer | layer `l` sliding-window (`attention.sliding_window`) when `l % 6 < 5`, else causal |
//! | after attention / FFN | — | `post_attention_norm` / `post_ffw_norm` before the residual add |
//! | feed-forward | SwiGLU | GeGLU (tanh GELU) |
//!
//! Gemma 3's layer pattern and its window-layer RoPE base are not in the file: llama.cpp
//! fixes both for the architecture, and so does this module.

use super::ModelError;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::kv::KvGeometry;

/// A transformer architecture kvcore runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Arch {
    /// `llama` (Llama 2/3, SmolLM2, ...).
    Llama,
    /// `gemma3` (Gemma 3 text models).
    Gemma3,
}

impl Arch {
    /// Every architecture, in code order.
    pub const ALL: [Arch; 2] = [Arch::Llama, Arch::Gemma3];

    /// The `general.architecture` string.
    pub const fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// The architecture named `name`, if kvcore runs it.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// The gated feed-forward block's activation: `down(act(gate(x)) ⊙ up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FfnActivation {
    /// SwiGLU: `silu(g)` (Llama).
    Silu,
    /// GeGLU: tanh-approximated `gelu(g)` (Gemma).
    GeluTanh,
}

/// What differs between the layers of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// RoPE frequency base of this layer's queries and keys.
    pub rope_base: f32,
    /// `Some(w)`: a sliding-window layer, each query sees itself and the `w − 1`
    /// positions before it; `None`: causal attention over the whole past.
    pub window: Option<usize>,
}

/// Gemma 3 alternates five sliding-window layers with one global layer.
const GEMMA3_PATTERN: usize = 6;
/// The RoPE base of Gemma 3's sliding-window layers (not in the file).
const GEMMA3_WINDOW_ROPE_BASE: f32 = 10_000.0;
/// More layers than this is a malformed file, not a model (bounds the per-layer table).
const MAX_LAYERS: usize = 1 << 16;

/// Rejects a layer count the per-layer table was capped at.
fn check_layers(c: LlamaConfig) -> Result<LlamaConfig, ModelError> {
    if c.layers.len() != c.n_layers {
        return Err(ModelError::Config {
            key: format!("{}.block_count", c.arch.name()),
            problem: format!(
                "{} layers is more than the {MAX_LAYERS} supported",
                c.n_layers
            ),
        });
    }
    Ok(c)
}

/// The shape of a Llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The architecture the file declares.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream (`d_model`).
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention: `n_heads` is a multiple).
    pub n_kv_heads: usize,
    /// Elements per head (`d_model / n_heads`, or the file's `attention.key_length`).
    pub head_dim: usize,
    /// Hidden width of the gated feed-forward block.
    pub ffn_dim: usize,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// Trained context length in positions.
    pub context_len: usize,
    /// RoPE frequency base of the global (causal) layers: the file's `rope.freq_base`.
    pub rope_base: f32,
    /// RoPE pairing (GGUF llama files use adjacent pairs).
    pub rope_style: RopeStyle,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Whether the output projection reuses the token embedding (`output.weight` absent).
    pub tied_embeddings: bool,
    /// Factor on the looked-up embedding rows (1 for Llama, √d_model for Gemma).
    pub embed_scale: f32,
    /// Whether each head of q and k gets its own RMSNorm before RoPE.
    pub qk_norm: bool,
    /// Whether the attention and FFN outputs are RMS-normed before their residual adds.
    pub post_norms: bool,
    /// The feed-forward activation.
    pub ffn_activation: FfnActivation,
    /// The factor on every attention score `q·k` (`1/√head_dim` for both).
    pub attn_scale: f32,
    /// Per layer: RoPE base and attention window (`layers.len() == n_layers`).
    pub layers: Vec<LayerConfig>,
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

    /// The attention windows per layer (`None` for a global layer), as a windowed KV
    /// store takes them.
    pub fn windows(&self) -> Vec<Option<usize>> {
        self.layers.iter().map(|l| l.window).collect()
    }

    /// Reads the `<arch>.*` metadata of a GGUF file of a supported architecture.
    ///
    /// Errors when the architecture is not one kvcore runs, a required key is missing or
    /// has the wrong type, or the numbers are inconsistent (zero sizes, heads not
    /// dividing).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let name = file.get_str("general.architecture")?;
        let arch = Arch::from_name(name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: name.to_string(),
        })?;
        let prefix = arch.name();
        let key = |k: &str| format!("{prefix}.{k}");
        let int = |key: &str| -> Result<usize, ModelError> {
            let v = file.get_u64(key)?;
            usize::try_from(v).map_err(|_| ModelError::Config {
                key: key.to_string(),
                problem: format!("{v} does not fit in usize"),
            })
        };
        let n_layers = int(&key("block_count"))?;
        let d_model = int(&key("embedding_length"))?;
        let n_heads = int(&key("attention.head_count"))?;
        let n_kv_heads = match file.get(&key("attention.head_count_kv")) {
            Some(_) => int(&key("attention.head_count_kv"))?,
            None => n_heads,
        };
        let ffn_dim = int(&key("feed_forward_length"))?;
        let context_len = int(&key("context_length"))?;
        let rope_base = match file.get(&key("rope.freq_base")) {
            Some(_) => file.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let rms_eps = file.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let vocab_size = match file.get(&key("vocab_size")) {
            Some(_) => int(&key("vocab_size"))?,
            None => embd.dims.get(1).copied().unwrap_or(0) as usize,
        };
        let bad = |k: &str, problem: &str| ModelError::Config {
            key: key(k),
            problem: problem.to_string(),
        };
        for (k, v) in [
            ("block_count", n_layers),
            ("embedding_length", d_model),
            ("attention.head_count", n_heads),
            ("attention.head_count_kv", n_kv_heads),
            ("feed_forward_length", ffn_dim),
            ("context_length", context_len),
            ("vocab_size", vocab_size),
        ] {
            if v == 0 {
                return Err(bad(k, "must be non-zero"));
            }
        }
        if n_heads % n_kv_heads != 0 {
            return Err(bad(
                "attention.head_count_kv",
                &format!("must divide {prefix}.attention.head_count"),
            ));
        }
        // The head size: the file's key length when given (Gemma 3: 256 with
        // d_model 640, so the query width 1024 differs from d_model), else d_model / n_heads.
        let head_dim = match file.get(&key("attention.key_length")) {
            Some(_) => {
                let k = int(&key("attention.key_length"))?;
                if let Some(v) = file.get(&key("attention.value_length"))
                    && v.as_u64() != Some(k as u64)
                {
                    return Err(bad(
                        "attention.value_length",
                        "must equal attention.key_length",
                    ));
                }
                k
            }
            None if arch == Arch::Gemma3 => {
                return Err(ModelError::Config {
                    key: key("attention.key_length"),
                    problem: "is required".into(),
                });
            }
            None => {
                if d_model % n_heads != 0 {
                    return Err(bad(
                        "attention.head_count",
                        &format!("must divide {prefix}.embedding_length"),
                    ));
                }
                d_model / n_heads
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(
                "attention.key_length",
                "head_dim must be even and non-zero for RoPE",
            ));
        }
        if n_heads.checked_mul(head_dim).is_none() {
            return Err(bad("attention.head_count", "query width overflows"));
        }
        if let Some(v) = file.get(&key("rope.dimension_count"))
            && v.as_u64() != Some(head_dim as u64)
        {
            return Err(bad(
                "rope.dimension_count",
                "partial rotary embedding is not supported: must equal head_dim",
            ));
        }
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad("rope.freq_base", "must be finite and positive"));
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                "must be finite and non-negative",
            ));
        }
        let attn_scale = 1.0 / (head_dim as f32).sqrt();
        let base = LlamaConfig {
            arch,
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
            embed_scale: 1.0,
            qk_norm: false,
            post_norms: false,
            ffn_activation: FfnActivation::Silu,
            attn_scale,
            layers: Vec::new(),
        };
        match arch {
            Arch::Llama => Ok(LlamaConfig {
                layers: vec![
                    LayerConfig {
                        rope_base,
                        window: None,
                    };
                    n_layers.min(MAX_LAYERS)
                ],
                ..base
            })
            .and_then(check_layers),
            Arch::Gemma3 => {
                let window = int(&key("attention.sliding_window"))?;
                if window == 0 {
                    return Err(bad("attention.sliding_window", "must be non-zero"));
                }
                let layers = (0..n_layers.min(MAX_LAYERS))
                    .map(|l| {
                        if l % GEMMA3_PATTERN < GEMMA3_PATTERN - 1 {
                            LayerConfig {
                                rope_base: GEMMA3_WINDOW_ROPE_BASE,
                                window: Some(window),
                            }
                        } else {
                            LayerConfig {
                                rope_base,
                                window: None,
                            }
                        }
                    })
                    .collect();
                check_layers(LlamaConfig {
                    // The GGUF converter adds Gemma's `1 +` to the norm weights, so every
                    // RMSNorm is the plain `x / rms(x) ⊙ w`.
                    embed_scale: (d_model as f32).sqrt(),
                    qk_norm: true,
                    post_norms: true,
                    ffn_activation: FfnActivation::GeluTanh,
                    rope_style: RopeStyle::Halves,
                    layers,
                    ..base
                })
            }
        }
    }
}
