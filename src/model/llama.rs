//! The forward pass of the Llama family (architectures `llama` and `gemma3`), generic over
//! the compute [`Backend`] and the [`KvStore`].
//!
//! One call to [`Llama::forward`] appends `n` tokens at positions `pos0 .. pos0 + n`
//! (`pos0 = kv.len()`) in one transaction on the store ([`Append`]): committed when the
//! logits are computed, rolled back on any error. Prefill passes the whole prompt at once
//! (the matmuls are GEMMs), decode passes one token (GEMVs). Per block, with
//! `x: [n, d_model]` the residual stream:
//!
//! ```text
//! x = embed(tokens) · embed_scale
//! per block:
//!   xn = rms_norm(x) ⊙ attn_norm
//!   q = xn Wqᵀ, k = xn Wkᵀ, v = xn Wvᵀ
//!   [qk_norm]  q, k ← rms_norm per head ⊙ attn_q_norm / attn_k_norm
//!   rope(q), rope(k)                           (the layer's base and the model's pairing)
//!   K/V rows pos0.. ← k, v                     (the pass's open append)
//!   a = attention(q, view(layer)) Woᵀ          (the layer's mask, from the positions)
//!   [post_norms]  a ← rms_norm(a) ⊙ post_attention_norm
//!   x += a
//!   xn = rms_norm(x) ⊙ ffn_norm
//!   f = (act(xn Wgateᵀ) ⊙ xn Wupᵀ) Wdownᵀ     (act: silu, or tanh gelu)
//!   [post_norms]  f ← rms_norm(f) ⊙ post_ffw_norm
//!   x += f
//! ```
//! then `logits = rms_norm(x) ⊙ output_norm · Woutᵀ` (`Wout` is the token embedding when
//! the file has no `output.weight`). The bracketed steps, the scale, the activation and
//! each layer's RoPE base and attention window are [`LlamaConfig`]: Llama uses none of
//! the optional steps, Gemma 3 all of them (see `config`). Weights stay in the memory-mapped file in their stored
//! format; only the tiny norm vectors are decoded to f32 at load.
//!
//! Activations are f32 by default. With [`Activations::Q8`] (llama.cpp's numerics) a
//! pass of up to [`Q8_MAX_TOKENS`] tokens quantises each matmul input to 8 bits once —
//! `xn` for q/k/v and for gate/up, the attention output, the SwiGLU output, the final
//! `xn`, each token's row on its own — and runs the block-quantised matrices through
//! `Backend::gemv_q8` (one token) or `Backend::gemm_q8` (a few, bit for bit each token's
//! GEMV), with integer dot products (see `backend::q8`). Plain-format matrices and longer
//! passes (a prefill of more tokens: f32 GEMM) stay f32.

use super::{FfnActivation, LlamaConfig, ModelError};
use crate::backend::{AttnParams, Backend, Mask, Q8Acts, Q8Layout, Rope, Weights};
use crate::gguf::GgufFile;
use crate::kv::{Append, GrowKv, KvError, KvGeometry, KvStore, KvType, WindowKv};
use ndarray::{Array2, Axis};
use std::cell::OnceCell;

/// Which rows of logits a forward pass computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's: `[1, vocab]` (generation).
    Last,
    /// Every position's: `[n, vocab]` (scoring, tests).
    All,
    /// None: fill the KV cache only (`[0, vocab]`).
    None,
}

/// The most tokens a pass quantises its matmul inputs for with [`Activations::Q8`]: a
/// short prompt (a chat turn's few new tokens, the first tokens of a conversation) then
/// reads each weight panel once for all of them through integer dots, where the f32 GEMM
/// would decode every weight to f32 for only this many products. Longer prefills take the
/// f32 GEMM, whose decoded panels serve hundreds of tokens.
pub const Q8_MAX_TOKENS: usize = 8;

/// The precision of the activations entering the decode GEMVs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Activations {
    /// f32 throughout (the default): weights dequantised exactly, within ~1e-4 of a
    /// float64 forward pass.
    #[default]
    F32,
    /// 8-bit activations against block-quantised weights in passes of up to
    /// [`Q8_MAX_TOKENS`] tokens, as llama.cpp computes: faster, and further from the
    /// float64 reference (see `backend::q8`).
    Q8,
}

impl Activations {
    /// `"f32"` or `"q8"`.
    pub const fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Q8 => "q8",
        }
    }
}

/// A matmul input shared by the matmuls that read it: the f32 rows and, when 8-bit
/// activations apply, their quantised forms, one per [`Q8Layout`] (`[Q8_0, Q8_K]`), each
/// computed the first time a matrix needs it and then shared: `Q8_0` blocks of 32 for
/// `Q8_0`/`Q4_*`/`Q5_0` matrices, `Q8_K` blocks of 256 for `Q4_K`/`Q6_K` (Gemma 3's
/// `ffn_down` is `Q4_K` in some layers and `Q6_K` in others, its `attn_v` `Q5_0` or
/// `Q8_0`), so an input is quantised at most once per layout.
struct Input<'x> {
    x: &'x Array2<f32>,
    /// Per layout, one quantised row per token.
    q8: Option<[OnceCell<Vec<Q8Acts>>; 2]>,
}

/// Index of a matrix tensor in the file, with its shape checked at load.
#[derive(Clone, Copy, Debug)]
struct MatRef {
    index: usize,
}

/// The matrices of one transformer block.
#[derive(Debug)]
struct Block {
    attn_norm: Vec<f32>, // [d_model]
    wq: MatRef,          // [q_dim, d_model]
    wk: MatRef,          // [kv_dim, d_model]
    wv: MatRef,          // [kv_dim, d_model]
    wo: MatRef,          // [d_model, q_dim]
    ffn_norm: Vec<f32>,  // [d_model]
    w_gate: MatRef,      // [ffn_dim, d_model]
    w_up: MatRef,        // [ffn_dim, d_model]
    w_down: MatRef,      // [d_model, ffn_dim]
    /// `qk_norm`: the per-head norms of q and k, `[head_dim]` each.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `post_norms`: after attention and after the FFN, `[d_model]` each.
    post_norms: Option<(Vec<f32>, Vec<f32>)>,
}

/// A Llama-family model (`llama` or `gemma3`): the GGUF file (weights borrowed from its memory map), its config and a
/// compute backend.
#[derive(Debug)]
pub struct Llama<B: Backend> {
    file: GgufFile,
    config: LlamaConfig,
    backend: B,
    token_embd: MatRef,    // [vocab, d_model]
    output_norm: Vec<f32>, // [d_model]
    output: MatRef,        // [vocab, d_model]
    blocks: Vec<Block>,
    activations: Activations,
}

impl<B: Backend> Llama<B> {
    /// Binds the tensors of a GGUF file of a supported architecture, checking every shape
    /// against the config read from its metadata.
    pub fn load(file: GgufFile, backend: B) -> Result<Self, ModelError> {
        let config = LlamaConfig::from_gguf(&file)?;
        let c = &config;
        let mat = |name: &str, rows: usize, cols: usize| -> Result<MatRef, ModelError> {
            let index = file
                .tensors()
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                })?;
            let w = file.weights(&file.tensors()[index])?;
            if w.rows() != rows || w.cols() != cols {
                return Err(ModelError::TensorShape {
                    name: name.to_string(),
                    expected: vec![cols as u64, rows as u64],
                    found: file.tensors()[index].dims.clone(),
                });
            }
            Ok(MatRef { index })
        };
        let vector_of = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let m = mat(name, 1, len)?;
            let w = file.weights(&file.tensors()[m.index])?;
            let mut out = vec![0.0; len];
            backend.embed_row(&w, 0, &mut out)?;
            Ok(out)
        };
        let vector = |name: &str| vector_of(name, c.d_model);
        let token_embd = mat("token_embd.weight", c.vocab_size, c.d_model)?;
        let output = if c.tied_embeddings {
            token_embd
        } else {
            mat("output.weight", c.vocab_size, c.d_model)?
        };
        let output_norm = vector("output_norm.weight")?;
        // `n_layers` comes from the file: bound the reservation by the tensors actually
        // present (each block needs nine), so a huge count is a missing-tensor error
        // below, not a capacity-overflow panic or an abort.
        let mut blocks = Vec::with_capacity(c.n_layers.min(file.tensors().len() / 9));
        for l in 0..c.n_layers {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            blocks.push(Block {
                attn_norm: vector(&name("attn_norm"))?,
                wq: mat(&name("attn_q"), c.q_dim(), c.d_model)?,
                wk: mat(&name("attn_k"), c.kv_dim(), c.d_model)?,
                wv: mat(&name("attn_v"), c.kv_dim(), c.d_model)?,
                wo: mat(&name("attn_output"), c.d_model, c.q_dim())?,
                ffn_norm: vector(&name("ffn_norm"))?,
                w_gate: mat(&name("ffn_gate"), c.ffn_dim, c.d_model)?,
                w_up: mat(&name("ffn_up"), c.ffn_dim, c.d_model)?,
                w_down: mat(&name("ffn_down"), c.d_model, c.ffn_dim)?,
                qk_norm: match c.qk_norm {
                    true => Some((
                        vector_of(&name("attn_q_norm"), c.head_dim)?,
                        vector_of(&name("attn_k_norm"), c.head_dim)?,
                    )),
                    false => None,
                },
                post_norms: match c.post_norms {
                    true => Some((
                        vector(&name("post_attention_norm"))?,
                        vector(&name("post_ffw_norm"))?,
                    )),
                    false => None,
                },
            });
        }
        Ok(Llama {
            file,
            config,
            backend,
            token_embd,
            output_norm,
            output,
            blocks,
            activations: Activations::F32,
        })
    }

    /// The same model computing with `activations` (see [`Activations`]).
    pub fn with_activations(mut self, activations: Activations) -> Self {
        self.activations = activations;
        self
    }

    /// The activation precision of the decode GEMVs.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The GGUF file the weights live in (metadata, tokenizer, tensor table).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The identity of the model file: [`GgufFile::fingerprint`], the SHA-256 of its
    /// bytes (computed on first use). Session files record it.
    pub fn fingerprint(&self) -> &[u8; 32] {
        self.file.fingerprint()
    }

    /// The compute backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// A new empty grow-on-demand KV store for this model with a `max_ctx` ceiling that
    /// keeps every position of every layer (see [`new_kv`](Self::new_kv) for the store
    /// that evicts what sliding-window layers no longer see).
    pub fn new_grow_kv(&self, max_ctx: usize) -> Result<GrowKv, KvError> {
        GrowKv::new(self.kv_geometry(), max_ctx)
    }

    /// The store this model runs on by default: empty, growing on demand up to `max_ctx`
    /// positions, holding what the model can still read. A [`GrowKv`] when every layer
    /// is global (Llama); a [`WindowKv`] when some layers attend through a sliding
    /// window (Gemma 3), whose window layers keep only their last `window` positions, so
    /// at 32 768 positions Gemma 3 270M's cache is 0.18× of a store keeping everything.
    /// Both give bitwise the logits of a [`DenseKv`](crate::kv::DenseKv) (the reference,
    /// which keeps every position and relies on the masks).
    pub fn new_kv(&self, max_ctx: usize) -> Result<Box<dyn KvStore>, KvError> {
        self.new_kv_with_types(max_ctx, (KvType::F32, KvType::F32))
    }

    /// [`new_kv`](Self::new_kv) keeping K rows in `types.0` and V rows in `types.1`
    /// (`kv/elem.rs` states each type's encoding; attention reads them in place).
    ///
    /// Errors: as [`new_kv`](Self::new_kv), and [`KvError::BlockShape`] when a type's
    /// blocks do not divide the head size.
    pub fn new_kv_with_types(
        &self,
        max_ctx: usize,
        types: (KvType, KvType),
    ) -> Result<Box<dyn KvStore>, KvError> {
        let windows = self.config.windows();
        let g = self.kv_geometry();
        Ok(if windows.iter().all(Option::is_none) {
            Box::new(GrowKv::with_types(g, max_ctx, types)?)
        } else {
            Box::new(WindowKv::with_types(g, max_ctx, &windows, types)?)
        })
    }

    fn weights(&self, m: MatRef) -> Weights<'_> {
        // Shapes and byte ranges were validated in `load`; `GgufFile` is immutable.
        self.file
            .weights(&self.file.tensors()[m.index])
            .expect("tensor validated at load")
    }

    /// `x` as a matmul input, to be quantised to 8 bits too (on first use, per layout)
    /// when the model uses [`Activations::Q8`] and `x` is at most [`Q8_MAX_TOKENS`] tokens.
    fn input<'x>(&self, x: &'x Array2<f32>) -> Result<Input<'x>, ModelError> {
        let q8 = (self.activations == Activations::Q8 && x.nrows() <= Q8_MAX_TOKENS)
            .then(|| [OnceCell::new(), OnceCell::new()]);
        Ok(Input { x, q8 })
    }

    /// `x` quantised in `layout`: computed on the first call, then shared.
    fn input_q8<'i>(
        &self,
        x: &'i Input<'_>,
        layout: Q8Layout,
    ) -> Result<Option<&'i [Q8Acts]>, ModelError> {
        let Some(cells) = &x.q8 else {
            return Ok(None);
        };
        let cell = &cells[match layout {
            Q8Layout::Q8_0 => 0,
            Q8Layout::Q8_K => 1,
        }];
        if let Some(q) = cell.get() {
            return Ok(Some(q));
        }
        let mut rows = Vec::with_capacity(x.x.nrows());
        for row in x.x.rows() {
            let mut q = Q8Acts::new();
            let xs = row.to_slice().expect("activations are standard-layout");
            self.backend.quantize_q8(layout, xs, &mut q)?;
            rows.push(q);
        }
        Ok(Some(cell.get_or_init(|| rows)))
    }

    /// `Y ← X Wᵀ` for `x: [n, cols]`: a GEMV for one token, a GEMM for several (with the
    /// 8-bit input in the layout `W`'s format meets, when the model uses 8-bit
    /// activations, `W` is block-quantised and `n ≤ Q8_MAX_TOKENS`).
    fn matmul(&self, m: MatRef, x: &Input<'_>) -> Result<Array2<f32>, ModelError> {
        let w = self.weights(m);
        let n = x.x.nrows();
        let mut y = Array2::<f32>::zeros((n, w.rows()));
        let xs = x.x.as_slice().expect("activations are standard-layout");
        let ys = y.as_slice_mut().expect("fresh array is standard-layout");
        let q = match Q8Layout::of(w.dtype()) {
            Some(layout) => self.input_q8(x, layout)?,
            None => None,
        };
        match q {
            Some([q]) => self.backend.gemv_q8(&w, q, ys)?,
            Some(q) => self.backend.gemm_q8(&w, q, ys)?,
            None if n == 1 => self.backend.gemv(&w, xs, ys)?,
            None => self.backend.gemm(&w, xs, ys)?,
        }
        Ok(y)
    }

    fn rms_norm(&self, x: &Array2<f32>, weight: &[f32]) -> Result<Array2<f32>, ModelError> {
        let mut out = Array2::<f32>::zeros(x.raw_dim());
        self.backend.rms_norm(
            x.as_slice().expect("standard layout"),
            weight,
            self.config.rms_eps,
            out.as_slice_mut().expect("standard layout"),
        )?;
        Ok(out)
    }

    /// Runs `tokens` through the model at positions `kv.len() ..`, appending their K and
    /// V rows to `kv`, and returns the requested logits, `[rows, vocab]`.
    ///
    /// The append is a transaction ([`KvStore::begin`]): if any step fails — a token id
    /// outside the vocabulary, positions past `kv.max_ctx()` ([`KvError::ContextOverflow`]),
    /// a refused allocation, a kernel's shape error in any layer — the call returns the
    /// error and `kv` is exactly as it was.
    pub fn forward<K: KvStore + ?Sized>(
        &self,
        kv: &mut K,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Array2<f32>, ModelError> {
        self.forward_from(kv, kv.len(), tokens, logits)
    }

    /// [`forward`](Self::forward) at positions `at ..` (`at ≤ kv.len()`): on success `kv`
    /// holds positions `0 .. at + tokens.len()`, its rows from `at` on replaced by those
    /// of `tokens`; on error it is unchanged. With no tokens nothing changes.
    pub fn forward_from<K: KvStore + ?Sized>(
        &self,
        kv: &mut K,
        at: usize,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Array2<f32>, ModelError> {
        self.check_inputs(kv, tokens)?;
        if tokens.is_empty() {
            return Ok(Array2::zeros((0, self.config.vocab_size)));
        }
        self.backend.scope(|| {
            let mut tx = Append::begin(kv, at, tokens.len())?;
            let x = self.blocks(&mut tx, at, tokens)?; // [n, d_model]
            let out = self.logits(x, logits)?;
            tx.commit()?;
            Ok(out)
        })
    }

    /// The model's KV geometry, as every store it runs on must have.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.config.kv_geometry()
    }

    /// Checks that `kv` has this model's geometry, keeps every position each layer can
    /// see, and that every token is in the vocabulary.
    fn check_inputs<K: KvStore + ?Sized>(&self, kv: &K, tokens: &[u32]) -> Result<(), ModelError> {
        let expected = self.kv_geometry();
        if kv.geometry() != expected {
            return Err(ModelError::KvGeometry {
                expected,
                found: kv.geometry(),
            });
        }
        // A store that evicts behind a window is only right for a layer whose mask hides
        // at least as much.
        for (layer, lc) in self.config.layers.iter().enumerate() {
            if let Some(store) = kv.window(layer) {
                if lc.window.is_none_or(|model| model > store) {
                    return Err(ModelError::KvWindow {
                        layer,
                        store,
                        model: lc.window,
                    });
                }
            }
        }
        let vocab_size = self.config.vocab_size;
        match tokens.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// The requested logits rows of the residual stream `x: [n, d_model]`, `[rows, vocab]`.
    fn logits(&self, x: Array2<f32>, logits: Logits) -> Result<Array2<f32>, ModelError> {
        let n = x.nrows();
        let rows = match logits {
            Logits::None => return Ok(Array2::zeros((0, self.config.vocab_size))),
            Logits::Last => x
                .slice_axis(Axis(0), ndarray::Slice::from(n - 1..))
                .to_owned(),
            Logits::All => x,
        };
        let xn = self.rms_norm(&rows, &self.output_norm)?; // [rows, d_model]
        self.matmul(self.output, &self.input(&xn)?) // [rows, vocab]
    }

    /// The residual stream after the last block, `[n, d_model]` (before the output norm),
    /// for `tokens` (`n ≥ 1`) at positions `at ..`, writing their K/V rows into the open
    /// append `tx`.
    fn blocks<K: KvStore + ?Sized>(
        &self,
        tx: &mut Append<'_, K>,
        at: usize,
        tokens: &[u32],
    ) -> Result<Array2<f32>, ModelError> {
        let c = &self.config;
        let b = &self.backend;
        let n = tokens.len();
        let positions: Vec<usize> = (at..at + n).collect();

        // x: [n, d_model], the residual stream.
        let mut x = Array2::<f32>::zeros((n, c.d_model));
        let embd = self.weights(self.token_embd);
        for (row, &id) in x.axis_iter_mut(Axis(0)).zip(tokens) {
            let row = row.into_slice().expect("standard layout");
            b.embed_row(&embd, id as usize, row)?;
            if c.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embed_scale);
            }
        }

        for (layer, (blk, lc)) in self.blocks.iter().zip(&c.layers).enumerate() {
            let rope = Rope {
                base: lc.rope_base,
                style: c.rope_style,
            };
            let params = AttnParams {
                scale: c.attn_scale,
                mask: match lc.window {
                    Some(window) => Mask::SlidingWindow { window },
                    None => Mask::Causal,
                },
            };

            // Attention.
            let xn = self.rms_norm(&x, &blk.attn_norm)?; // [n, d_model]
            let xn = self.input(&xn)?;
            let mut q = self.matmul(blk.wq, &xn)?; // [n, q_dim]
            let mut k = self.matmul(blk.wk, &xn)?; // [n, kv_dim]
            let v = self.matmul(blk.wv, &xn)?; // [n, kv_dim]
            if let Some((q_norm, k_norm)) = &blk.qk_norm {
                // Rows of [n·heads, head_dim]: one RMSNorm per head.
                q = self
                    .rms_norm(
                        &q.into_shape_with_order((n * c.n_heads, c.head_dim))
                            .expect("std"),
                        q_norm,
                    )?
                    .into_shape_with_order((n, c.q_dim()))
                    .expect("std");
                k = self
                    .rms_norm(
                        &k.into_shape_with_order((n * c.n_kv_heads, c.head_dim))
                            .expect("std"),
                        k_norm,
                    )?
                    .into_shape_with_order((n, c.kv_dim()))
                    .expect("std");
            }
            b.rope(std_slice_mut(&mut q), c.head_dim, &positions, &rope)?;
            b.rope(std_slice_mut(&mut k), c.head_dim, &positions, &rope)?;
            tx.write(layer, k.view(), v.view())?; // K/V rows at..at+n
            let mut att = Array2::<f32>::zeros((n, c.q_dim())); // [n, q_dim]
            let att_heads = att
                .view_mut()
                .into_shape_with_order((n, c.n_heads, c.head_dim))
                .expect("standard layout [n, n_heads·head_dim]");
            let q_heads = q
                .view()
                .into_shape_with_order((n, c.n_heads, c.head_dim))
                .expect("standard layout [n, n_heads·head_dim]");
            b.attention(q_heads, &positions, &tx.view(layer)?, &params, att_heads)?;
            let mut o = self.matmul(blk.wo, &self.input(&att)?)?; // [n, d_model]
            if let Some((post_attn, _)) = &blk.post_norms {
                o = self.rms_norm(&o, post_attn)?;
            }
            self.residual(&mut x, &o)?;

            // Feed-forward (SwiGLU or GeGLU).
            let xn = self.rms_norm(&x, &blk.ffn_norm)?; // [n, d_model]
            let xn = self.input(&xn)?;
            let gate = self.matmul(blk.w_gate, &xn)?; // [n, ffn_dim]
            let up = self.matmul(blk.w_up, &xn)?; // [n, ffn_dim]
            let mut h = Array2::<f32>::zeros(gate.raw_dim()); // [n, ffn_dim]
            let (g, u, hs) = (
                gate.as_slice().expect("std"),
                up.as_slice().expect("std"),
                h.as_slice_mut().expect("std"),
            );
            match c.ffn_activation {
                FfnActivation::Silu => b.swiglu(g, u, hs)?,
                FfnActivation::GeluTanh => b.geglu(g, u, hs)?,
            }
            let mut down = self.matmul(blk.w_down, &self.input(&h)?)?; // [n, d_model]
            if let Some((_, post_ffw)) = &blk.post_norms {
                down = self.rms_norm(&down, post_ffw)?;
            }
            self.residual(&mut x, &down)?;
        }

        Ok(x)
    }

    fn residual(&self, x: &mut Array2<f32>, delta: &Array2<f32>) -> Result<(), ModelError> {
        self.backend.add(
            x.as_slice_mut().expect("standard layout"),
            delta.as_slice().expect("standard layout"),
        )?;
        Ok(())
    }

    /// Sentence embedding of `tokens`: the final hidden state (after the output norm),
    /// mean-pooled over positions and L2-normalised, `[d_model]`.
    ///
    /// Runs on a KV store of its own (never committed), so a conversation's cache is
    /// never disturbed.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let mut kv = GrowKv::new(self.kv_geometry(), tokens.len())?;
        self.check_inputs(&kv, tokens)?;
        let hidden = self.backend.scope(|| {
            let mut tx = Append::begin(&mut kv, 0, tokens.len())?;
            self.blocks(&mut tx, 0, tokens)
        })?; // [n, d_model]
        let normed = self.rms_norm(&hidden, &self.output_norm)?; // [n, d_model]
        let mean = normed.mean_axis(Axis(0)).expect("n > 0"); // [d_model]
        let norm = mean
            .iter()
            .map(|v| f64::from(*v) * f64::from(*v))
            .sum::<f64>()
            .sqrt();
        if !norm.is_finite() || norm == 0.0 {
            return Err(ModelError::NonFinite { what: "embedding" });
        }
        Ok(mean.iter().map(|v| (f64::from(*v) / norm) as f32).collect())
    }
}

/// The elements of a standard-layout array (every activation here is one).
fn std_slice_mut(a: &mut Array2<f32>) -> &mut [f32] {
    a.as_slice_mut().expect("standard layout")
}
