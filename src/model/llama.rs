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
//! The same loop runs several sequences at once ([`Llama::forward_batch`], `batch.rs`):
//! their new tokens are stacked as the rows of `x: [N, d_model]`, every step above runs
//! once over all `N` rows, except the K/V writes and attention, which run per sequence
//! (a `Span`: its rows and first position) on its own open append. A single-sequence
//! pass is a batch of one; there is one layer loop (`blocks`), one logits head
//! (`logits`) and one commit sequence (`pass`).
//!
//! Activations are f32 by default. With [`Activations::Q8`] (llama.cpp's numerics) a
//! pass of up to [`Q8_MAX_TOKENS`] tokens quantises each matmul input to 8 bits once —
//! `xn` for q/k/v and for gate/up, the attention output, the SwiGLU output, the final
//! `xn`, each token's row on its own — and runs the block-quantised matrices through
//! `Backend::gemv_q8` (one token) or `Backend::gemm_q8` (a few, bit for bit each token's
//! GEMV), with integer dot products (see `backend::q8`). Plain-format matrices and longer
//! passes (a prefill of more tokens: f32 GEMM) stay f32. In a batch the rule is per
//! sequence (its rows are quantised when it brings at most `Q8_MAX_TOKENS` tokens), so
//! every sequence computes as it would alone.

use super::{FfnActivation, LlamaConfig, ModelError};
use crate::backend::{
    AttnJob, AttnParams, Backend, Mask, PartStat, Q8Acts, Q8Layout, Rope, Weights, finish_part,
    merge_part,
};
use crate::gguf::GgufFile;
use crate::kv::{Append, GrowKv, KvCodec, KvError, KvGeometry, KvStore, KvType, KvView, WindowKv};
use ndarray::{Array2, Array3, ArrayView2, Axis, s};
use std::ops::Range;
use std::sync::{Mutex, OnceLock, PoisonError};

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
/// activations apply to some of them, their quantised forms, one per [`Q8Layout`]
/// (`[Q8_0, Q8_K]`), each computed the first time a matrix needs it and then shared:
/// each matrix reads the layout its format pairs with
/// ([`QuantFormat::ACTS`](crate::backend::QuantFormat::ACTS)), and one model may mix
/// formats of both (Gemma 3's `ffn_down` differs between layers), so an input is
/// quantised at most once per layout.
///
/// In a batch the rows are several sequences' stacked; each sequence's rows are
/// quantised or not as that sequence alone would be (see [`Llama::input`]).
struct Input<'x> {
    x: &'x Array2<f32>,
    /// The rows quantised to 8 bits, ascending (empty: none, the f32 path).
    q8_rows: Vec<usize>,
    /// Per layout, one quantised row per entry of `q8_rows`.
    q8: [OnceLock<Vec<Q8Acts>>; 2],
}

/// One sequence's share of a forward pass: the position of its first token and its rows
/// in the pass's stacked `[N, ·]` activations (never empty).
#[derive(Clone, Debug)]
pub(super) struct Span {
    /// Position of the sequence's first new token in its store.
    pub(super) at: usize,
    /// Its rows of the stacked tokens.
    pub(super) rows: Range<usize>,
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
    /// The key codecs built so far, one per key type, shared by the stores that fit them
    /// ([`key_codec`](Self::key_codec)).
    key_codecs: Mutex<Vec<KvCodec>>,
}

/// The text a key codec that calibrates sees this model run on
/// ([`Llama::key_codec`]; plain English prose, written for kvcore; any ordinary text
/// serves, `kv/offsets.rs`).
const CALIBRATION_TEXT: &str = "The old harbour town wakes slowly. Before the sun clears \
the hills, the fishing boats are already coming back, their engines low, gulls circling \
the nets that hang from the masts. On the quay a baker sets out bread still warm from the \
oven, and the first customers, mostly sailors and a few early walkers, stand in line and \
talk about the weather. It rained for most of the week, and the river that runs through \
the middle of the town is high and brown. Children cross the stone bridge on their way to \
school, stopping to throw sticks into the water and race to the other side to watch them \
come out. By nine the market square is full. Farmers from the valley sell cheese, apples \
and honey; a woman with a small cart offers knives sharpened while you wait. The town \
hall clock, which has been five minutes slow for as long as anyone can remember, strikes \
the hour, and nobody looks up. In the library the librarian opens the windows to let in \
the smell of the sea and begins sorting the books that came back yesterday: a history of \
the lighthouse, two novels, a guide to mushrooms, and a children's book about a cat who \
sails around the world. Later, when the tide turns, the boats will go out again, and the \
town will settle into the quiet of the afternoon, waiting for the evening, when the \
lamps along the harbour wall are lit one by one and the cafes fill with people who have \
nowhere in particular to be.";

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
            key_codecs: Mutex::new(Vec::new()),
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
        let windows = self.config.windows();
        let g = self.kv_geometry();
        Ok(if windows.iter().all(Option::is_none) {
            Box::new(GrowKv::new(g, max_ctx)?)
        } else {
            Box::new(WindowKv::new(g, max_ctx, &windows)?)
        })
    }

    /// [`new_kv`](Self::new_kv) keeping K rows in `types.0` and V rows in `types.1`
    /// (`kv/elem.rs` states each type's encoding; attention reads them in place), the
    /// keys with this model's [`key_codec`](Self::key_codec) (its calibration, if the
    /// type has one).
    ///
    /// Errors: as [`new_kv`](Self::new_kv), [`KvError::BlockShape`] when a type's blocks
    /// do not divide the head size, and the calibration's errors.
    pub fn new_kv_with_types(
        &self,
        max_ctx: usize,
        types: (KvType, KvType),
    ) -> Result<Box<dyn KvStore>, ModelError> {
        let windows = self.config.windows();
        let g = self.kv_geometry();
        // The types' own check (blocks within a head) before any calibration.
        types.0.check_head_dim(g.head_dim)?;
        types.1.check_head_dim(g.head_dim)?;
        let keys = self.key_codec(types.0, max_ctx)?;
        Ok(if windows.iter().all(Option::is_none) {
            Box::new(GrowKv::with_types(g, max_ctx, types)?.with_key_codec(&keys)?)
        } else {
            Box::new(WindowKv::with_types(g, max_ctx, &windows, types)?.with_key_codec(&keys)?)
        })
    }

    /// Each layer's RoPE.
    pub fn ropes(&self) -> Vec<Rope> {
        (self.config.layers.iter())
            .map(|lc| Rope {
                base: lc.rope_base,
                style: self.config.rope_style,
            })
            .collect()
    }

    /// The codec of keys of `kv_type` for this model's stores of up to `max_ctx`
    /// positions ([`KvCodec::for_keys`]): a type that calibrates sees this model run
    /// once on a short text (on first use, through its own forward pass with f32 keys)
    /// and keeps its keys less what it derives from them. The same model gives the same
    /// codec; stores and pools that share it share prefix blocks and state files.
    ///
    /// Errors: the calibration pass's (a refused allocation, a kernel's shape error).
    pub fn key_codec(&self, kv_type: KvType, max_ctx: usize) -> Result<KvCodec, ModelError> {
        let mut cache = self
            .key_codecs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = cache.iter_mut().find(|c| c.kv_type() == kv_type) {
            *c = c.covering(max_ctx)?;
            return Ok(c.clone());
        }
        let g = self.kv_geometry();
        let codec = KvCodec::for_keys(kv_type, g, &self.ropes(), max_ctx, || {
            self.calibration_keys()
        })?;
        cache.push(codec.clone());
        Ok(codec)
    }

    /// The calibration pass a key codec asks for: [`CALIBRATION_TEXT`] through the model
    /// (its tokenizer's ids; a file without one reads the text's bytes as ids modulo the
    /// vocabulary), returning the f32 store of its keys.
    fn calibration_keys(&self) -> Result<GrowKv, ModelError> {
        let vocab = self.config.vocab_size.max(1);
        let ids: Vec<u32> = match crate::tokenizer::Tokenizer::from_gguf(&self.file) {
            Ok(t) => t.encode(CALIBRATION_TEXT, crate::tokenizer::Special::Literal),
            Err(_) => (CALIBRATION_TEXT.bytes())
                .map(|b| (usize::from(b) % vocab) as u32)
                .collect(),
        };
        let ids = &ids[..ids.len().min(self.config.context_len.max(2))];
        let mut kv = GrowKv::new(self.kv_geometry(), ids.len())?;
        self.forward(&mut kv, ids, Logits::None)?;
        Ok(kv)
    }

    fn weights(&self, m: MatRef) -> Weights<'_> {
        // Shapes and byte ranges were validated in `load`; `GgufFile` is immutable.
        self.file
            .weights(&self.file.tensors()[m.index])
            .expect("tensor validated at load")
    }

    /// `x` as a matmul input, `x` being the rows of sequences of `groups[i]` rows each (in
    /// order): a sequence's rows are to be quantised to 8 bits too (on first use, per
    /// layout) when the model uses [`Activations::Q8`] and the sequence has at most
    /// [`Q8_MAX_TOKENS`] rows in `x` — what a pass of that sequence alone would do, so a
    /// batch keeps every sequence on its own numerics.
    fn input<'x>(&self, x: &'x Array2<f32>, groups: &[usize]) -> Input<'x> {
        debug_assert_eq!(groups.iter().sum::<usize>(), x.nrows());
        let mut q8_rows = Vec::new();
        if self.activations == Activations::Q8 {
            let mut start = 0;
            for &len in groups {
                if len <= Q8_MAX_TOKENS {
                    q8_rows.extend(start..start + len);
                }
                start += len;
            }
        }
        Input {
            x,
            q8_rows,
            q8: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The rows `x.q8_rows` quantised in `layout` (`None` when there are none): computed
    /// on the first call, then shared.
    fn input_q8<'i>(
        &self,
        x: &'i Input<'_>,
        layout: Q8Layout,
    ) -> Result<Option<&'i [Q8Acts]>, ModelError> {
        if x.q8_rows.is_empty() {
            return Ok(None);
        }
        let cell = &x.q8[match layout {
            Q8Layout::Q8_0 => 0,
            Q8Layout::Q8_K => 1,
        }];
        if let Some(q) = cell.get() {
            return Ok(Some(q));
        }
        let mut rows = Vec::with_capacity(x.q8_rows.len());
        for &r in &x.q8_rows {
            let mut q = Q8Acts::new();
            let row = x.x.row(r);
            let xs = row.to_slice().expect("activations are standard-layout");
            self.backend.quantize_q8(layout, xs, &mut q)?;
            rows.push(q);
        }
        Ok(Some(cell.get_or_init(|| rows)))
    }

    /// Quantises `x`'s 8-bit rows for `m`'s layout now (when it takes them), so that
    /// matmuls of `x` run side by side ([`Backend::join`]) find them done rather than
    /// each quantising them.
    fn prepare(&self, m: MatRef, x: &Input<'_>) -> Result<(), ModelError> {
        if let Some(layout) = Q8Layout::of(self.weights(m).dtype()) {
            self.input_q8(x, layout)?;
        }
        Ok(())
    }

    /// `Y ← X Wᵀ` for `x: [n, cols]`: a GEMV for one token, a GEMM for several; with the
    /// 8-bit input in the layout `W`'s format meets for the rows `x.q8_rows` when `W` is
    /// block-quantised. When only some rows are quantised (a batch mixing sequences of a
    /// few tokens with longer ones), the quantised rows go through `gemm_q8` and the
    /// others through the f32 GEMM, each row as its sequence alone would.
    fn matmul(&self, m: MatRef, x: &Input<'_>) -> Result<Array2<f32>, ModelError> {
        let w = self.weights(m);
        let n = x.x.nrows();
        let mut y = Array2::<f32>::zeros((n, w.rows()));
        let q = match Q8Layout::of(w.dtype()) {
            Some(layout) => self.input_q8(x, layout)?,
            None => None,
        };
        let Some(q) = q else {
            self.matmul_f32(&w, x.x, &mut y)?;
            return Ok(y);
        };
        if q.len() == n {
            self.matmul_q8(&w, q, std_slice_mut(&mut y))?;
            return Ok(y);
        }
        let f32_rows: Vec<usize> = (0..n)
            .filter(|r| x.q8_rows.binary_search(r).is_err())
            .collect();
        let xf = x.x.select(Axis(0), &f32_rows); // [n − q8 rows, cols]
        let mut yf = Array2::<f32>::zeros((f32_rows.len(), w.rows()));
        self.matmul_f32(&w, &xf, &mut yf)?;
        let mut yq = Array2::<f32>::zeros((q.len(), w.rows()));
        self.matmul_q8(&w, q, std_slice_mut(&mut yq))?;
        for (rows, part) in [(&f32_rows, &yf), (&x.q8_rows, &yq)] {
            for (&r, row) in rows.iter().zip(part.rows()) {
                y.row_mut(r).assign(&row);
            }
        }
        Ok(y)
    }

    /// `y ← x Wᵀ` in f32, `x: [n ≥ 1, cols]`: a GEMV for one row, else a GEMM.
    fn matmul_f32(
        &self,
        w: &Weights<'_>,
        x: &Array2<f32>,
        y: &mut Array2<f32>,
    ) -> Result<(), ModelError> {
        let xs = x.as_slice().expect("activations are standard-layout");
        let ys = std_slice_mut(y);
        match x.nrows() {
            1 => self.backend.gemv(w, xs, ys)?,
            _ => self.backend.gemm(w, xs, ys)?,
        }
        Ok(())
    }

    /// `y ← x̂ Wᵀ` with 8-bit activations, one quantised row per token: a GEMV for one,
    /// else `gemm_q8` (each row bit for bit its GEMV).
    fn matmul_q8(&self, w: &Weights<'_>, q: &[Q8Acts], y: &mut [f32]) -> Result<(), ModelError> {
        match q {
            [q] => self.backend.gemv_q8(w, q, y)?,
            q => self.backend.gemm_q8(w, q, y)?,
        }
        Ok(())
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
            let tx = Append::begin(kv, at, tokens.len())?;
            let span = Span {
                at,
                rows: 0..tokens.len(),
            };
            let mut out = self.pass(vec![tx], &[span], tokens, &[logits])?;
            Ok(out.pop().expect("one sequence, one result"))
        })
    }

    /// One forward pass over the sequences of `spans`, whose open appends are `txs` (in
    /// the same order) and whose tokens are stacked in `tokens` (`[N]`, each span's rows
    /// its tokens): the blocks, each sequence's `logits`, then every commit. The
    /// single-sequence pass is this with one span. On error every append not yet
    /// committed is dropped, rolling its store back.
    pub(super) fn pass<K: KvStore + ?Sized>(
        &self,
        mut txs: Vec<Append<'_, K>>,
        spans: &[Span],
        tokens: &[u32],
        logits: &[Logits],
    ) -> Result<Vec<Array2<f32>>, ModelError> {
        let x = self.blocks(&mut txs, spans, tokens)?; // [N, d_model]
        let out = self.logits(x, spans, logits)?;
        for tx in txs {
            tx.commit()?;
        }
        Ok(out)
    }

    /// The model's KV geometry, as every store it runs on must have.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.config.kv_geometry()
    }

    /// Checks that `kv` has this model's geometry, keeps every position each layer can
    /// see, and that every token is in the vocabulary.
    pub(super) fn check_inputs<K: KvStore + ?Sized>(
        &self,
        kv: &K,
        tokens: &[u32],
    ) -> Result<(), ModelError> {
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
            if let Some(store) = kv.window(layer)
                && lc.window.is_none_or(|model| model > store)
            {
                return Err(ModelError::KvWindow {
                    layer,
                    store,
                    model: lc.window,
                });
            }
        }
        let vocab_size = self.config.vocab_size;
        match tokens.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// The requested logits rows of the residual stream `x: [N, d_model]`, per span:
    /// `[rows, vocab]` with `rows` the last of the span's rows ([`Logits::Last`]), all of
    /// them ([`Logits::All`]) or none. The output norm and matrix run once over the rows
    /// every sequence asked for.
    fn logits(
        &self,
        x: Array2<f32>,
        spans: &[Span],
        logits: &[Logits],
    ) -> Result<Vec<Array2<f32>>, ModelError> {
        let vocab = self.config.vocab_size;
        let wanted: Vec<Range<usize>> = spans
            .iter()
            .zip(logits)
            .map(|(span, l)| match l {
                Logits::None => span.rows.end..span.rows.end,
                Logits::Last => span.rows.end - 1..span.rows.end,
                Logits::All => span.rows.clone(),
            })
            .collect();
        let counts: Vec<usize> = wanted.iter().map(ExactSizeIterator::len).collect();
        if counts.iter().all(|&c| c == 0) {
            return Ok(counts.iter().map(|_| Array2::zeros((0, vocab))).collect());
        }
        let rows = if wanted.len() == 1 && counts[0] == x.nrows() {
            x // [N, d_model]: all of it
        } else {
            let picked: Vec<usize> = wanted.iter().flat_map(Range::clone).collect();
            x.select(Axis(0), &picked) // [rows, d_model]
        };
        let xn = self.rms_norm(&rows, &self.output_norm)?; // [rows, d_model]
        let out = self.matmul(self.output, &self.input(&xn, &counts))?; // [rows, vocab]
        if counts.len() == 1 {
            return Ok(vec![out]);
        }
        let mut start = 0;
        Ok(counts
            .iter()
            .map(|&c| {
                start += c;
                out.slice(s![start - c..start, ..]).to_owned()
            })
            .collect())
    }

    /// The residual stream after the last block, `[N, d_model]` (before the output norm),
    /// for the stacked `tokens` of the sequences of `spans` (each span non-empty, its
    /// tokens at positions `at ..`), writing each sequence's K/V rows into its open
    /// append (`txs`, in the order of `spans`).
    ///
    /// Every step but attention runs once over all `N` rows (the matmuls read each weight
    /// once for the whole batch; RoPE rotates each row for its own position); attention
    /// runs per sequence, its query rows against its own store's view.
    fn blocks<K: KvStore + ?Sized>(
        &self,
        txs: &mut [Append<'_, K>],
        spans: &[Span],
        tokens: &[u32],
    ) -> Result<Array2<f32>, ModelError> {
        let c = &self.config;
        let b = &self.backend;
        let n = tokens.len();
        debug_assert_eq!(txs.len(), spans.len());
        let positions: Vec<usize> = spans
            .iter()
            .flat_map(|span| span.at..span.at + span.rows.len())
            .collect();
        let groups: Vec<usize> = spans.iter().map(|span| span.rows.len()).collect();

        // x: [N, d_model], the residual stream.
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
            let xn = self.rms_norm(&x, &blk.attn_norm)?; // [N, d_model]
            let xn = self.input(&xn, &groups);
            self.prepare(blk.wq, &xn)?;
            let (q, (k, v)) = b.join(
                || self.matmul(blk.wq, &xn),
                || b.join(|| self.matmul(blk.wk, &xn), || self.matmul(blk.wv, &xn)),
            );
            let (mut q, mut k, v) = (q?, k?, v?); // [N, q_dim], [N, kv_dim], [N, kv_dim]
            if let Some((q_norm, k_norm)) = &blk.qk_norm {
                // [N, heads·head_dim] as rows of [N·heads, head_dim]: one RMSNorm per head.
                let per_head = |x: Array2<f32>, heads: usize, norm: &[f32]| {
                    let rows = x.into_shape_with_order((n * heads, c.head_dim));
                    let normed = self.rms_norm(&rows.expect("std"), norm)?;
                    let out = normed.into_shape_with_order((n, heads * c.head_dim));
                    Ok::<_, ModelError>(out.expect("std"))
                };
                q = per_head(q, c.n_heads, q_norm)?;
                k = per_head(k, c.n_kv_heads, k_norm)?;
            }
            b.rope(std_slice_mut(&mut k), c.head_dim, &positions, &rope)?;
            for (tx, span) in txs.iter_mut().zip(spans) {
                let r = span.rows.clone();
                // K/V rows at .. at + len of this sequence.
                tx.write(layer, k.slice(s![r.clone(), ..]), v.slice(s![r, ..]))?;
            }
            let views = (txs.iter())
                .map(|tx| tx.view(layer))
                .collect::<Result<Vec<_>, _>>()?;
            // A view scoring some keys with the query elsewhere (a sink store's sinks)
            // rotates the query again from its unrotated rows.
            let q_raw = (!views.iter().all(KvView::is_plain)).then(|| q.clone());
            b.rope(std_slice_mut(&mut q), c.head_dim, &positions, &rope)?;
            let mut att = Array2::<f32>::zeros((n, c.q_dim())); // [N, q_dim]
            let mut att_heads = att
                .view_mut()
                .into_shape_with_order((n, c.n_heads, c.head_dim))
                .expect("standard layout [N, n_heads·head_dim]");
            let q_heads = q
                .view()
                .into_shape_with_order((n, c.n_heads, c.head_dim))
                .expect("standard layout [N, n_heads·head_dim]");
            // Every plain sequence's attention in one call (a parallel backend spreads
            // them); the others in parts, one per group of segments scored alike.
            let mut jobs = Vec::with_capacity(spans.len());
            let mut rest = att_heads.view_mut();
            for (view, span) in views.iter().zip(spans) {
                let r = span.rows.clone();
                debug_assert_eq!(r.start, n - rest.len_of(Axis(0)), "spans stack in order");
                let (out, tail) = rest.split_at(Axis(0), r.len());
                rest = tail;
                let mut job = AttnJob {
                    q: q_heads.slice(s![r.clone(), .., ..]),
                    q_pos: &positions[r.clone()],
                    kv: view,
                    out,
                };
                match &q_raw {
                    Some(raw) if !view.is_plain() => {
                        let raw = raw.slice(s![r, ..]);
                        attention_in_groups(b, &mut job, raw, &rope, &params)?;
                    }
                    _ => jobs.push(job),
                }
            }
            b.attention_batch(&mut jobs, &params)?;
            drop(jobs);
            let mut o = self.matmul(blk.wo, &self.input(&att, &groups))?; // [N, d_model]
            if let Some((post_attn, _)) = &blk.post_norms {
                o = self.rms_norm(&o, post_attn)?;
            }
            self.residual(&mut x, &o)?;

            // Feed-forward (SwiGLU or GeGLU).
            let xn = self.rms_norm(&x, &blk.ffn_norm)?; // [N, d_model]
            let xn = self.input(&xn, &groups);
            self.prepare(blk.w_gate, &xn)?;
            let (gate, up) = b.join(
                || self.matmul(blk.w_gate, &xn),
                || self.matmul(blk.w_up, &xn),
            );
            let (gate, up) = (gate?, up?); // [N, ffn_dim] each
            let mut h = Array2::<f32>::zeros(gate.raw_dim()); // [N, ffn_dim]
            let (g, u, hs) = (
                gate.as_slice().expect("std"),
                up.as_slice().expect("std"),
                h.as_slice_mut().expect("std"),
            );
            match c.ffn_activation {
                FfnActivation::Silu => b.swiglu(g, u, hs)?,
                FfnActivation::GeluTanh => b.geglu(g, u, hs)?,
            }
            let mut down = self.matmul(blk.w_down, &self.input(&h, &groups))?; // [N, d_model]
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
            let tx = Append::begin(&mut kv, 0, tokens.len())?;
            let span = Span {
                at: 0,
                rows: 0..tokens.len(),
            };
            self.blocks(&mut [tx], &[span], tokens)
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

/// Attention of `job` over a view whose segments differ in how they are scored
/// ([`Scoring`](crate::kv::Scoring)): each group of segments scored alike ([`KvView::groups`]) is one
/// attention part, its queries rotated (from `q_raw: [n, q_dim]`, before RoPE) and
/// masked at their scored positions through the group's mask (else `params`'), and the
/// parts are folded in position order by [`merge_part`] and normalised by
/// [`finish_part`]. A group scored at the queries' own positions reads `job.q`.
fn attention_in_groups<B: Backend>(
    b: &B,
    job: &mut AttnJob<'_>,
    q_raw: ArrayView2<'_, f32>,
    rope: &Rope,
    params: &AttnParams,
) -> Result<(), ModelError> {
    let (n, heads, head_dim) = job.q.dim();
    let mut acc = vec![PartStat::EMPTY; n * heads];
    let mut acc_out = Array3::<f32>::zeros((n, heads, head_dim));
    let mut part = Array3::<f32>::zeros((n, heads, head_dim));
    let mut stats = vec![PartStat::EMPTY; n * heads];
    for (scoring, view) in job.kv.groups() {
        let group = AttnParams {
            mask: scoring.mask.unwrap_or(params.mask),
            ..*params
        };
        let pos: Vec<usize> = job.q_pos.iter().map(|&p| scoring.query_pos(p)).collect();
        let moved;
        let q = if pos == job.q_pos {
            job.q.view()
        } else {
            let mut q = q_raw.to_owned();
            b.rope(std_slice_mut(&mut q), head_dim, &pos, rope)?;
            moved = q;
            moved
                .view()
                .into_shape_with_order((n, heads, head_dim))
                .expect("standard layout [n, n_heads·head_dim]")
        };
        b.attention_part(q, &pos, &view, &group, part.view_mut(), &mut stats)?;
        let rows = (acc.iter_mut().zip(&stats))
            .zip(
                acc_out
                    .as_slice_mut()
                    .expect("std")
                    .chunks_exact_mut(head_dim),
            )
            .zip(part.as_slice().expect("std").chunks_exact(head_dim));
        for (((acc, &stat), out), part) in rows {
            merge_part(acc, out, stat, part);
        }
    }
    let rows = acc.iter().zip(
        acc_out
            .as_slice_mut()
            .expect("std")
            .chunks_exact_mut(head_dim),
    );
    for (&stat, out) in rows {
        finish_part(stat, out);
    }
    job.out.assign(&acc_out);
    Ok(())
}

/// The elements of a standard-layout array (every activation here is one).
fn std_slice_mut(a: &mut Array2<f32>) -> &mut [f32] {
    a.as_slice_mut().expect("standard layout")
}
