//! Random tiny Llama-family models as in-memory GGUF files, for tests and fuzzing.
//!
//! [`TinyLlama`] writes a complete llama-architecture GGUF (metadata and every tensor) with
//! seeded random weights in any [`DType`] ([`TinyLlama::to_gguf`]), or the same shapes as
//! a `gemma3`-architecture file with a sliding window of any size
//! ([`TinyLlama::to_gemma3_gguf`]: per-head q/k norms, post norms, GeGLU, and layer `l` a
//! window layer when `l % 6 < 5`). Block formats get random quants under a small
//! scale, so the network's activations stay in a sane range at every depth. The files load
//! through the same [`GgufFile`](kvcore::gguf::GgufFile) and
//! [`Llama::load`](kvcore::model::Llama::load) path as a real model.

use half::{bf16, f16};
use kvcore::backend::DType;
use kvcore::gguf::{GgufWriter, Value};

/// The shape and weight format of a tiny random model.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyLlama {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Elements per head (even; `d_model = n_heads · head_dim`).
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Trained context length.
    pub context_len: usize,
    /// Format of the matrices (norms are always F32). Block formats need `d_model` and
    /// `ffn_dim` to be multiples of 32.
    pub dtype: DType,
    /// Seed of the weights.
    pub seed: u64,
    /// Whether to write a separate `output.weight` (false: tied to the embedding).
    pub untied_output: bool,
}

impl TinyLlama {
    /// `n_heads · head_dim`.
    pub fn d_model(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The GGUF file's bytes (`general.architecture = llama`).
    pub fn to_gguf(&self) -> Vec<u8> {
        self.write(None)
    }

    /// The same shapes as a `gemma3` file whose window layers see `window` positions.
    pub fn to_gemma3_gguf(&self, window: usize) -> Vec<u8> {
        self.write(Some(window))
    }

    fn write(&self, gemma3_window: Option<usize>) -> Vec<u8> {
        let d = self.d_model();
        let kv_dim = self.n_kv_heads * self.head_dim;
        let mut rng = self.seed ^ 0x6b76_636f_7265;
        let mut w = GgufWriter::new();
        let u32v = |v: usize| Value::U32(v as u32);
        let arch = if gemma3_window.is_some() {
            "gemma3"
        } else {
            "llama"
        };
        let key = |k: &str| format!("{arch}.{k}");
        // Gemma 3's global layers use the file's base, its window layers 10 000.
        let rope_base = if gemma3_window.is_some() {
            1_000_000.0
        } else {
            10_000.0
        };
        w.metadata("general.architecture", Value::Str(arch.into()))
            .metadata("general.name", Value::Str(format!("tiny-random-{arch}")))
            .metadata(&key("block_count"), u32v(self.n_layers))
            .metadata(&key("context_length"), u32v(self.context_len))
            .metadata(&key("embedding_length"), u32v(d))
            .metadata(&key("feed_forward_length"), u32v(self.ffn_dim))
            .metadata(&key("attention.head_count"), u32v(self.n_heads))
            .metadata(&key("attention.head_count_kv"), u32v(self.n_kv_heads))
            .metadata(&key("rope.freq_base"), Value::F32(rope_base))
            .metadata(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
            .metadata(&key("vocab_size"), u32v(self.vocab_size));
        if let Some(window) = gemma3_window {
            w.metadata(&key("attention.key_length"), u32v(self.head_dim))
                .metadata(&key("attention.value_length"), u32v(self.head_dim))
                .metadata(&key("attention.sliding_window"), u32v(window));
        }
        let mut mat = |w: &mut GgufWriter, name: String, rows: usize, cols: usize| {
            let scale = 1.0 / (cols as f32).sqrt();
            let data = random_matrix(self.dtype, rows, cols, scale, &mut rng);
            w.tensor(&name, self.dtype, &[cols as u64, rows as u64], data);
        };
        mat(&mut w, "token_embd.weight".into(), self.vocab_size, d);
        if self.untied_output {
            mat(&mut w, "output.weight".into(), self.vocab_size, d);
        }
        for l in 0..self.n_layers {
            mat(&mut w, format!("blk.{l}.attn_q.weight"), d, d);
            mat(&mut w, format!("blk.{l}.attn_k.weight"), kv_dim, d);
            mat(&mut w, format!("blk.{l}.attn_v.weight"), kv_dim, d);
            mat(&mut w, format!("blk.{l}.attn_output.weight"), d, d);
            mat(&mut w, format!("blk.{l}.ffn_gate.weight"), self.ffn_dim, d);
            mat(&mut w, format!("blk.{l}.ffn_up.weight"), self.ffn_dim, d);
            mat(&mut w, format!("blk.{l}.ffn_down.weight"), d, self.ffn_dim);
        }
        let mut norm_of = |w: &mut GgufWriter, name: String, len: usize| {
            let v: Vec<f32> = (0..len).map(|_| 1.0 + 0.1 * uniform(&mut rng)).collect();
            w.tensor(
                &name,
                DType::F32,
                &[len as u64],
                bytemuck::cast_slice(&v).to_vec(),
            );
        };
        norm_of(&mut w, "output_norm.weight".into(), d);
        for l in 0..self.n_layers {
            norm_of(&mut w, format!("blk.{l}.attn_norm.weight"), d);
            norm_of(&mut w, format!("blk.{l}.ffn_norm.weight"), d);
            if gemma3_window.is_some() {
                norm_of(&mut w, format!("blk.{l}.attn_q_norm.weight"), self.head_dim);
                norm_of(&mut w, format!("blk.{l}.attn_k_norm.weight"), self.head_dim);
                norm_of(&mut w, format!("blk.{l}.post_attention_norm.weight"), d);
                norm_of(&mut w, format!("blk.{l}.post_ffw_norm.weight"), d);
            }
        }
        w.to_bytes()
    }
}

/// Uniform in `[-1, 1)` from a SplitMix64 step.
fn uniform(state: &mut u64) -> f32 {
    (next(state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `[rows, cols]` random weights of magnitude ≤ `scale` stored as `dtype`.
fn random_matrix(dtype: DType, rows: usize, cols: usize, scale: f32, rng: &mut u64) -> Vec<u8> {
    let n = rows * cols;
    let mut out = Vec::new();
    match dtype {
        DType::F32 => (0..n).for_each(|_| out.extend((scale * uniform(rng)).to_le_bytes())),
        DType::F16 => (0..n).for_each(|_| {
            out.extend(f16::from_f32(scale * uniform(rng)).to_le_bytes());
        }),
        DType::BF16 => (0..n).for_each(|_| {
            out.extend(bf16::from_f32(scale * uniform(rng)).to_le_bytes());
        }),
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 => {
            for _ in 0..n / 32 {
                // Quants reach ±8 (±16 for Q5_0), so `|w| ≤ scale`.
                let levels = if dtype == DType::Q5_0 { 16.0 } else { 8.0 };
                let d = f16::from_f32(scale * (0.5 + 0.5 * uniform(rng).abs()) / levels);
                out.extend(d.to_le_bytes());
                match dtype {
                    DType::Q8_0 => {
                        out.extend((0..32).map(|_| ((next(rng) % 17) as i8 - 8) as u8));
                    }
                    DType::Q4_1 => {
                        out.extend(f16::from_f32(-scale).to_le_bytes());
                        out.extend((0..16).map(|_| next(rng) as u8));
                    }
                    DType::Q5_0 => {
                        out.extend((0..20).map(|_| next(rng) as u8)); // qh, then qs
                    }
                    _ => out.extend((0..16).map(|_| next(rng) as u8)),
                }
            }
        }
        other => panic!("TinyLlama cannot write {other} weights yet"),
    }
    out
}
