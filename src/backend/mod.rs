//! The compute contract: the [`Backend`] trait and the views its kernels take.
//!
//! A backend supplies every numeric operation of a Llama forward pass. Implementations
//! live in their own crates under `backends/` (`scalar`, the reference; `simd`; `rayon`);
//! the model is generic over `B: Backend`, so the choice costs nothing at run time.
//!
//! Conventions shared by every kernel:
//! - all shapes are row-major and written `[rows, cols]`; a batch of `n` vectors of
//!   length `d` is one slice of `n·d` floats, `[n, d]`;
//! - weights are a [`Weights`] view over their stored bytes (any [`DType`]) and are
//!   never copied into a dequantised buffer;
//! - activations and accumulators are `f32`;
//! - every entry point checks its shapes first and returns a [`ShapeError`] that names
//!   the mismatch; once the shapes are checked a kernel cannot fail.

mod dtype;
pub mod format;
mod part;
pub mod q8;
mod shape;

pub use dtype::{DType, QK, QK_K};
pub use format::{BlockFormat, QuantFormat, q4_k_scale_min};
pub use part::{PartStat, finish_part, merge_part};
pub use q8::{Q8Acts, Q8Layout};
pub use shape::{ShapeError, check};

use std::ops::Range;

use crate::kv::KvView;
use ndarray::{ArrayView3, ArrayViewMut3};

/// A read-only view of a weight matrix `W: [rows, cols]` in its stored format.
///
/// Row `r` occupies bytes `r·row_bytes .. (r+1)·row_bytes` of `data`, with
/// `row_bytes = dtype.row_bytes(cols)`. There is no alignment requirement: kernels read
/// the bytes with unaligned loads.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    dtype: DType,
    rows: usize,
    cols: usize,
    data: &'a [u8],
}

impl<'a> Weights<'a> {
    /// A view of `data` as a `[rows, cols]` matrix of `dtype`.
    ///
    /// Errors when `cols` is not a whole number of blocks of `dtype` or when `data` is not
    /// exactly `rows · row_bytes` long.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, ShapeError> {
        let row_bytes = dtype
            .row_bytes(cols)
            .ok_or(ShapeError::PartialBlock { dtype, cols })?;
        let expected = rows.checked_mul(row_bytes).ok_or(ShapeError::Overflow {
            what: "weight bytes",
        })?;
        if data.len() != expected {
            return Err(ShapeError::WeightBytes {
                dtype,
                rows,
                cols,
                expected,
                actual: data.len(),
            });
        }
        Ok(Weights {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// A view of plain `f32` values `[rows, cols]`.
    pub fn from_f32(rows: usize, cols: usize, values: &'a [f32]) -> Result<Self, ShapeError> {
        Weights::new(DType::F32, rows, cols, bytemuck::cast_slice(values))
    }

    /// The element format.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of rows (output features of a matmul).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (the reduction length of a matmul).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        // Checked in `new`: cols is a whole number of blocks and the product fits.
        self.data.len().checked_div(self.rows).unwrap_or(0)
    }

    /// All stored bytes, `rows · row_bytes` of them.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The stored bytes of row `r`.
    ///
    /// # Panics
    /// If `r >= rows` (a programming error).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} out of range for {} rows", self.rows);
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// The sub-matrix of rows `range`.
    ///
    /// # Panics
    /// If the range is not within `0..rows` (a programming error).
    pub fn slice_rows(&self, range: Range<usize>) -> Weights<'a> {
        assert!(
            range.start <= range.end && range.end <= self.rows,
            "rows {range:?} out of range for {} rows",
            self.rows
        );
        let rb = self.row_bytes();
        Weights {
            dtype: self.dtype,
            rows: range.len(),
            cols: self.cols,
            data: &self.data[range.start * rb..range.end * rb],
        }
    }
}

/// How RoPE pairs the elements of a head vector `x[0..d]`.
///
/// Both rotate pair `i` (for `i in 0..d/2`) by the angle `pos · θ_i`, with
/// `θ_i = base^(−2i/d)`:
/// `(a, b) ← (a·cos − b·sin, a·sin + b·cos)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs of adjacent elements `(x[2i], x[2i+1])`: llama.cpp's layout for llama-arch
    /// GGUF files (whose converter permutes the Q and K weights to match).
    Interleaved,
    /// Pairs split across the halves `(x[i], x[i + d/2])`: Hugging Face checkpoints
    /// (`rotate_half`).
    Halves,
}

/// Rotary position embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Frequency base (`10000` for Llama 2, `100000` for SmolLM2).
    pub base: f32,
    /// The pairing of elements within a head.
    pub style: RopeStyle,
}

/// Which cached positions a query may attend to, computed from positions (never from
/// slot indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mask {
    /// A query at position `p` sees every key at a position `≤ p`.
    Causal,
    /// A query at `p` sees the keys at positions `p − window < k ≤ p`: itself and the
    /// `window − 1` positions before it (Gemma's sliding window: a key is hidden once
    /// `p − k ≥ window`).
    SlidingWindow {
        /// Positions seen, the query's own included.
        window: usize,
    },
}

impl Mask {
    /// The key positions a query at `q_pos` sees: a range (empty for a zero window).
    pub fn visible_positions(self, q_pos: usize) -> Range<usize> {
        let end = q_pos.saturating_add(1);
        match self {
            Mask::Causal => 0..end,
            Mask::SlidingWindow { window } => end.saturating_sub(window)..end,
        }
    }

    /// Whether a query at `q_pos` sees the key at `k_pos`.
    pub fn sees(self, q_pos: usize, k_pos: usize) -> bool {
        self.visible_positions(q_pos).contains(&k_pos)
    }
}

/// The parameters of one attention call besides its operands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// The factor on every score `q·k` (`1/√head_dim` for Llama and Gemma 3).
    pub scale: f32,
    /// Which positions each query sees.
    pub mask: Mask,
}

impl AttnParams {
    /// Causal attention with the usual `1/√head_dim` scale.
    pub fn causal(head_dim: usize) -> Self {
        AttnParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            mask: Mask::Causal,
        }
    }
}

/// One sequence's operands of [`Backend::attention_batch`]: those of
/// [`Backend::attention`] (`q: [n, n_heads, head_dim]` at positions `q_pos`, the layer's
/// view `kv`, `out: [n, n_heads, head_dim]`).
pub struct AttnJob<'a> {
    /// The queries of the sequence's new rows.
    pub q: ArrayView3<'a, f32>,
    /// Their positions.
    pub q_pos: &'a [usize],
    /// The sequence's view of the layer.
    pub kv: &'a KvView<'a>,
    /// Where the rows' outputs go.
    pub out: ArrayViewMut3<'a, f32>,
}

/// The numeric kernels of a Llama forward pass.
///
/// Every method checks its shapes with [`check`] and returns [`ShapeError`] on a mismatch
/// before touching any data. Implementations must agree with the `scalar` reference
/// within the tolerances stated in `tests/conformance.rs`.
pub trait Backend: Send + Sync {
    /// A short name for reports: `"scalar"`, `"simd"`, `"rayon"`.
    fn name(&self) -> &'static str;

    /// The kernels that compute, for reports: a backend with several kernel paths names
    /// the one it runs (`"simd/avx512"`, `"simd/avx2"`), a backend that hands its work
    /// to another names that one's. The default is [`name`](Backend::name).
    fn kernel_path(&self) -> &'static str {
        self.name()
    }

    /// Worker threads this backend computes with.
    fn threads(&self) -> usize {
        1
    }

    /// Runs `f` in this backend's execution context and returns its result.
    ///
    /// A forward pass calls hundreds of kernels per token. A thread-pool backend runs
    /// `f` on one of its own workers, so each kernel's parallel split is a cheap
    /// fork-join inside the pool instead of a hand-off from an outside thread (which
    /// costs a wake-up and a block per call). Results must not depend on it. The default
    /// simply calls `f`.
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R
    where
        Self: Sized,
    {
        f()
    }

    /// Runs `a` and `b`, at the same time where the backend has threads for it, and
    /// returns both results: independent matmuls of one input (Q, K and V; gate and
    /// up) as one parallel region, so a thread done with its share of one takes pieces
    /// of the other instead of waiting at a join. Results must not depend on it. The
    /// default runs `a`, then `b`.
    fn join<A: Send, C: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> C + Send,
    ) -> (A, C)
    where
        Self: Sized,
    {
        (a(), b())
    }

    /// GEMV, the decode path: `y ← W x`.
    ///
    /// `w: [rows, cols]`, `x: [cols]`, `y: [rows]`. Accumulates in f32.
    fn gemv(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError>;

    /// Quantises activations to 8 bits in `layout` for [`gemv_q8`](Backend::gemv_q8):
    /// `out ← q8(x)`, bit for bit as the reference [`Q8Acts::quantize`] (see [`q8`]).
    /// `x.len()` must be a multiple of the layout's block. The default is the reference;
    /// a backend's own quantiser writes through [`Q8Acts::fill`], which derives the rest.
    fn quantize_q8(&self, layout: Q8Layout, x: &[f32], out: &mut Q8Acts) -> Result<(), ShapeError> {
        out.quantize(layout, x)
    }

    /// GEMV with 8-bit activations, llama.cpp's decode numerics: `y ← W x̂` for a
    /// block-quantised `w` and `x̂` from [`quantize_q8`](Backend::quantize_q8) in the
    /// layout `w`'s format meets ([`Q8Layout::of`], [`QuantFormat::ACTS`]), with integer
    /// block dot products (see [`q8`]).
    /// Plain-format weights and activations in the other layout are
    /// [`ShapeError::Unsupported`]. The default is the reference [`q8::gemv_reference`].
    fn gemv_q8(&self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) -> Result<(), ShapeError> {
        q8::gemv_reference(w, x, y)
    }

    /// GEMM with 8-bit activations for a few tokens (a short prefill with
    /// [`Activations::Q8`](crate::model::Activations::Q8)): `Y[t] ← W x̂_t` for each
    /// quantised token `x̂_t = x[t]` (as [`gemv_q8`](Backend::gemv_q8) takes it),
    /// `y: [n, rows]`. Row `t` of `Y` is bit for bit `gemv_q8(W, x[t])`: an implementation
    /// may share the weights' trips through memory between the tokens, not change a
    /// token's arithmetic. The default runs `gemv_q8` per token.
    fn gemm_q8(&self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemm_q8(w, x, y)?;
        if w.rows() == 0 {
            return Ok(());
        }
        for (xt, yt) in x.iter().zip(y.chunks_exact_mut(w.rows())) {
            self.gemv_q8(w, xt, yt)?;
        }
        Ok(())
    }

    /// GEMM, the prefill path: `Y ← X Wᵀ`.
    ///
    /// `w: [rows, cols]`, `x: [n, cols]`, `y: [n, rows]`, with `n = x.len() / cols`.
    /// Row `t` of `Y` equals `gemv(W, X[t])` up to rounding.
    fn gemm(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError>;

    /// The fewest tokens from which [`gemm`](Backend::gemm)'s rows stand alone, or `None`
    /// (the default) when they may not.
    ///
    /// `Some(m)` is a promise: in a call of at least `m` tokens, row `t` of `Y` is, bit
    /// for bit, a function of `W` and `X[t]` alone, whatever the other tokens of the call
    /// and their number. A parallel backend uses it to split a long prefill's GEMM over
    /// tokens (each piece packing only its own activations) and stay bitwise equal.
    fn gemm_rows_alone_from(&self) -> Option<usize> {
        None
    }

    /// Rotary position embedding, in place.
    ///
    /// `x: [positions.len(), n_heads, head_dim]`; row `t` is rotated for absolute position
    /// `positions[t]`. `head_dim` must be even.
    fn rope(
        &self,
        x: &mut [f32],
        head_dim: usize,
        positions: &[usize],
        rope: &Rope,
    ) -> Result<(), ShapeError>;

    /// Grouped-query attention of `n` new positions against one layer of the cache.
    ///
    /// `q: [n, n_heads, head_dim]`, row `i` at position `q_pos[i]`; `kv` the layer's view
    /// (`[slots, n_kv_heads, head_dim]` per segment); `out: [n, n_heads, head_dim]`.
    /// Query head `h` reads KV head `h / (n_heads / n_kv_heads)`. For each row and head:
    /// `out ← Σ_t softmax_t(scale · q·k_t) v_t` over the slots `t` whose positions
    /// `params.mask` lets the row see, in view order (ascending positions). The softmax
    /// subtracts the maximum score first; a row that sees no slot gets zeros (an empty
    /// softmax has no weights, rather than 0/0 = NaN). The last axis of `q`, `out` and
    /// the rows must be contiguous; the others may be strided.
    fn attention(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError>;

    /// [`attention`](Backend::attention) of several sequences in one call (a batched
    /// forward pass: each sequence its own queries, positions and cache), with one
    /// `params` for all. Each job's `out` is bit for bit what `attention` of its operands
    /// gives. The default runs them one after another; a parallel backend may spread the
    /// sequences over its threads (one dispatch for them all instead of one per
    /// sequence). On an error (the first job whose shapes do not fit, in order) the
    /// outputs of the jobs are unspecified; nothing else is touched.
    fn attention_batch(
        &self,
        jobs: &mut [AttnJob<'_>],
        params: &AttnParams,
    ) -> Result<(), ShapeError> {
        for j in jobs.iter_mut() {
            self.attention(j.q.view(), j.q_pos, j.kv, params, j.out.view_mut())?;
        }
        Ok(())
    }

    /// Slots per part when this backend's [`attention`](Backend::attention) is computed in
    /// parts of the view, or `None` (the default) when it is one piece.
    ///
    /// `Some(len)` is a promise: `attention` equals, bit for bit,
    /// [`attention_part`](Backend::attention_part) over the slots at positions
    /// `k·len .. (k + 1)·len` ([`KvView::at_positions`]) for `k = 0, 1, …`, folded in that
    /// order by [`merge_part`] and normalised by [`finish_part`]. Parts are cut by
    /// positions, so every store holding the same rows cuts them alike. A parallel
    /// backend uses it to split one query row's keys over threads (flash-decoding) and
    /// stay bitwise equal.
    fn attention_part_len(&self) -> Option<usize> {
        None
    }

    /// One part of a split attention (folded by [`merge_part`]): the same operands as [`attention`](Backend::attention), and for each row `i` and head `h`,
    /// `stats[i · n_heads + h]` ← the part's [`PartStat`] (largest visible score `m`,
    /// `Σ e^(s−m)`) and `out[i, h]` ← `Σ e^(s−m) v` over the slots of `kv` the row sees,
    /// unnormalised (zeros and [`PartStat::EMPTY`] when it sees none). Values stored
    /// rotated (`q8_0`) are rotated back in `out`.
    ///
    /// Backends that return `None` from
    /// [`attention_part_len`](Backend::attention_part_len) need not provide it; the
    /// default is [`ShapeError::NotProvided`].
    fn attention_part(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
        stats: &mut [PartStat],
    ) -> Result<(), ShapeError> {
        let _ = (q, q_pos, kv, params, out, stats);
        Err(ShapeError::NotProvided {
            what: "attention_part",
            backend: self.name(),
        })
    }

    /// RMSNorm of each row: `out[t] ← x[t] / √(mean(x[t]²) + eps) ⊙ weight`.
    ///
    /// `x`, `out`: `[n, d]`, `weight: [d]`.
    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), ShapeError>;

    /// SwiGLU: `out ← silu(gate) ⊙ up`, `silu(g) = g / (1 + e^(−g))`. All the same length.
    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError>;

    /// GeGLU with the tanh-approximated GELU (Gemma's `gelu_pytorch_tanh`):
    /// `out ← gelu(gate) ⊙ up`, `gelu(g) = ½·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))`.
    /// All the same length.
    fn geglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError>;

    /// Residual add: `acc ← acc + x`. Same length.
    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), ShapeError>;

    /// Softmax of one row in place, max-subtracted. An empty row is left empty; a row
    /// whose maximum is `−∞` (every entry masked) becomes all zeros rather than NaN.
    fn softmax(&self, x: &mut [f32]);

    /// Embedding lookup: `out ← W[row]` dequantised. `out: [cols]`.
    fn embed_row(&self, table: &Weights<'_>, row: usize, out: &mut [f32])
    -> Result<(), ShapeError>;
}

/// Writes methods of a [`Backend`] impl that hand each call on to another backend: a
/// reference's referent, a wrapper's inner backend. `forward_backend!(|s| to; m, ...)`
/// defines each named method `m` as `Backend::m(to, <its arguments>)`, with `s` bound to
/// `&self` in the expression `to` (a `&impl Backend` or `&dyn Backend`). `to` may do
/// something first, `|s| { s.count()?; &s.inner }`, where every named method returns a
/// `Result<_, ShapeError>`. The methods are [`Backend`]'s, by name; a method not named
/// keeps its default or is written by hand.
///
/// ```
/// use kvcore::backend::{Backend, ShapeError, Weights};
///
/// struct Named<B>(B);
///
/// impl<B: Backend> Backend for Named<B> {
///     fn name(&self) -> &'static str {
///         "named"
///     }
///     kvcore::forward_backend!(|s| &s.0;
///         gemv, gemm, rope, attention, rms_norm, swiglu, geglu, add, softmax, embed_row);
/// }
/// ```
#[macro_export]
macro_rules! forward_backend {
    (|$s:ident| $to:expr; $($method:ident),+ $(,)?) => {
        $($crate::forward_backend!(@ $method |$s| $to);)+
    };
    (@ name |$s:ident| $to:expr) => {
        fn name(&self) -> &'static str {
            let $s = self;
            $crate::backend::Backend::name($to)
        }
    };
    (@ kernel_path |$s:ident| $to:expr) => {
        fn kernel_path(&self) -> &'static str {
            let $s = self;
            $crate::backend::Backend::kernel_path($to)
        }
    };
    (@ threads |$s:ident| $to:expr) => {
        fn threads(&self) -> usize {
            let $s = self;
            $crate::backend::Backend::threads($to)
        }
    };
    (@ scope |$s:ident| $to:expr) => {
        fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
            let $s = self;
            $crate::backend::Backend::scope($to, f)
        }
    };
    (@ join |$s:ident| $to:expr) => {
        fn join<A: Send, C: Send>(
            &self,
            a: impl FnOnce() -> A + Send,
            b: impl FnOnce() -> C + Send,
        ) -> (A, C) {
            let $s = self;
            $crate::backend::Backend::join($to, a, b)
        }
    };
    (@ gemv |$s:ident| $to:expr) => {
        fn gemv(
            &self,
            w: &$crate::backend::Weights<'_>,
            x: &[f32],
            y: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::gemv($to, w, x, y)
        }
    };
    (@ quantize_q8 |$s:ident| $to:expr) => {
        fn quantize_q8(
            &self,
            layout: $crate::backend::Q8Layout,
            x: &[f32],
            out: &mut $crate::backend::Q8Acts,
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::quantize_q8($to, layout, x, out)
        }
    };
    (@ gemv_q8 |$s:ident| $to:expr) => {
        fn gemv_q8(
            &self,
            w: &$crate::backend::Weights<'_>,
            x: &$crate::backend::Q8Acts,
            y: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::gemv_q8($to, w, x, y)
        }
    };
    (@ gemm_q8 |$s:ident| $to:expr) => {
        fn gemm_q8(
            &self,
            w: &$crate::backend::Weights<'_>,
            x: &[$crate::backend::Q8Acts],
            y: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::gemm_q8($to, w, x, y)
        }
    };
    (@ gemm |$s:ident| $to:expr) => {
        fn gemm(
            &self,
            w: &$crate::backend::Weights<'_>,
            x: &[f32],
            y: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::gemm($to, w, x, y)
        }
    };
    (@ gemm_rows_alone_from |$s:ident| $to:expr) => {
        fn gemm_rows_alone_from(&self) -> Option<usize> {
            let $s = self;
            $crate::backend::Backend::gemm_rows_alone_from($to)
        }
    };
    (@ rope |$s:ident| $to:expr) => {
        fn rope(
            &self,
            x: &mut [f32],
            head_dim: usize,
            positions: &[usize],
            rope: &$crate::backend::Rope,
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::rope($to, x, head_dim, positions, rope)
        }
    };
    (@ attention |$s:ident| $to:expr) => {
        fn attention(
            &self,
            q: $crate::ndarray::ArrayView3<'_, f32>,
            q_pos: &[usize],
            kv: &$crate::kv::KvView<'_>,
            params: &$crate::backend::AttnParams,
            out: $crate::ndarray::ArrayViewMut3<'_, f32>,
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::attention($to, q, q_pos, kv, params, out)
        }
    };
    (@ attention_batch |$s:ident| $to:expr) => {
        fn attention_batch(
            &self,
            jobs: &mut [$crate::backend::AttnJob<'_>],
            params: &$crate::backend::AttnParams,
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::attention_batch($to, jobs, params)
        }
    };
    (@ attention_part_len |$s:ident| $to:expr) => {
        fn attention_part_len(&self) -> Option<usize> {
            let $s = self;
            $crate::backend::Backend::attention_part_len($to)
        }
    };
    (@ attention_part |$s:ident| $to:expr) => {
        fn attention_part(
            &self,
            q: $crate::ndarray::ArrayView3<'_, f32>,
            q_pos: &[usize],
            kv: &$crate::kv::KvView<'_>,
            params: &$crate::backend::AttnParams,
            out: $crate::ndarray::ArrayViewMut3<'_, f32>,
            stats: &mut [$crate::backend::PartStat],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::attention_part($to, q, q_pos, kv, params, out, stats)
        }
    };
    (@ rms_norm |$s:ident| $to:expr) => {
        fn rms_norm(
            &self,
            x: &[f32],
            weight: &[f32],
            eps: f32,
            out: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::rms_norm($to, x, weight, eps, out)
        }
    };
    (@ swiglu |$s:ident| $to:expr) => {
        fn swiglu(
            &self,
            gate: &[f32],
            up: &[f32],
            out: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::swiglu($to, gate, up, out)
        }
    };
    (@ geglu |$s:ident| $to:expr) => {
        fn geglu(
            &self,
            gate: &[f32],
            up: &[f32],
            out: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::geglu($to, gate, up, out)
        }
    };
    (@ add |$s:ident| $to:expr) => {
        fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::add($to, acc, x)
        }
    };
    (@ softmax |$s:ident| $to:expr) => {
        fn softmax(&self, x: &mut [f32]) {
            let $s = self;
            $crate::backend::Backend::softmax($to, x)
        }
    };
    (@ embed_row |$s:ident| $to:expr) => {
        fn embed_row(
            &self,
            table: &$crate::backend::Weights<'_>,
            row: usize,
            out: &mut [f32],
        ) -> Result<(), $crate::backend::ShapeError> {
            let $s = self;
            $crate::backend::Backend::embed_row($to, table, row, out)
        }
    };
}

/// A shared reference to a backend is a backend: one backend can serve several models.
/// Every method forwards to `B`'s, so a model on `&B` computes as one on `B`.
impl<B: Backend> Backend for &B {
    forward_backend!(|b| &**b;
        name, kernel_path, threads, scope, join, gemv, quantize_q8, gemv_q8, gemm_q8, gemm,
        gemm_rows_alone_from, rope, attention, attention_batch, attention_part_len,
        attention_part, rms_norm, swiglu, geglu, add, softmax, embed_row);
}

/// A reference to a trait object is a backend too. [`Backend::scope`] and
/// [`Backend::join`] are generic, so a `dyn Backend` has neither: through it, `scope`
/// runs `f` in the caller's context and `join` runs `a`, then `b` (the same results).
/// Every other method forwards. Use `&B` or own the backend (`Llama<Rayon<_>>`) where
/// the thread pool's scope matters.
impl<'a> Backend for &(dyn Backend + 'a) {
    forward_backend!(|b| &**b;
        name, kernel_path, threads, gemv, quantize_q8, gemv_q8, gemm_q8, gemm,
        gemm_rows_alone_from, rope, attention, attention_batch, attention_part_len,
        attention_part, rms_norm, swiglu, geglu, add, softmax, embed_row);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A backend that records the name of every method called on it (and computes
    /// nothing), each overridden, so that a call through `&Recorder` that reaches a
    /// default instead of `Recorder`'s method shows as a missing name.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<&'static str>>);

    impl Recorder {
        fn saw(&self, method: &'static str) {
            self.0.lock().expect("not poisoned").push(method);
        }
    }

    impl Backend for Recorder {
        fn name(&self) -> &'static str {
            self.saw("name");
            "recorder"
        }
        fn kernel_path(&self) -> &'static str {
            self.saw("kernel_path");
            "recorder/path"
        }
        fn threads(&self) -> usize {
            self.saw("threads");
            7
        }
        fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
            self.saw("scope");
            f()
        }
        fn join<A: Send, C: Send>(
            &self,
            a: impl FnOnce() -> A + Send,
            b: impl FnOnce() -> C + Send,
        ) -> (A, C) {
            self.saw("join");
            (a(), b())
        }
        fn gemv(&self, _: &Weights<'_>, _: &[f32], _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("gemv");
            Ok(())
        }
        fn quantize_q8(&self, _: Q8Layout, _: &[f32], _: &mut Q8Acts) -> Result<(), ShapeError> {
            self.saw("quantize_q8");
            Ok(())
        }
        fn gemv_q8(&self, _: &Weights<'_>, _: &Q8Acts, _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("gemv_q8");
            Ok(())
        }
        fn gemm_q8(&self, _: &Weights<'_>, _: &[Q8Acts], _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("gemm_q8");
            Ok(())
        }
        fn gemm(&self, _: &Weights<'_>, _: &[f32], _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("gemm");
            Ok(())
        }
        fn gemm_rows_alone_from(&self) -> Option<usize> {
            self.saw("gemm_rows_alone_from");
            Some(3)
        }
        fn rope(&self, _: &mut [f32], _: usize, _: &[usize], _: &Rope) -> Result<(), ShapeError> {
            self.saw("rope");
            Ok(())
        }
        fn attention(
            &self,
            _: ArrayView3<'_, f32>,
            _: &[usize],
            _: &KvView<'_>,
            _: &AttnParams,
            _: ArrayViewMut3<'_, f32>,
        ) -> Result<(), ShapeError> {
            self.saw("attention");
            Ok(())
        }
        fn attention_batch(&self, _: &mut [AttnJob<'_>], _: &AttnParams) -> Result<(), ShapeError> {
            self.saw("attention_batch");
            Ok(())
        }
        fn attention_part_len(&self) -> Option<usize> {
            self.saw("attention_part_len");
            Some(5)
        }
        fn attention_part(
            &self,
            _: ArrayView3<'_, f32>,
            _: &[usize],
            _: &KvView<'_>,
            _: &AttnParams,
            _: ArrayViewMut3<'_, f32>,
            _: &mut [PartStat],
        ) -> Result<(), ShapeError> {
            self.saw("attention_part");
            Ok(())
        }
        fn rms_norm(&self, _: &[f32], _: &[f32], _: f32, _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("rms_norm");
            Ok(())
        }
        fn swiglu(&self, _: &[f32], _: &[f32], _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("swiglu");
            Ok(())
        }
        fn geglu(&self, _: &[f32], _: &[f32], _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("geglu");
            Ok(())
        }
        fn add(&self, _: &mut [f32], _: &[f32]) -> Result<(), ShapeError> {
            self.saw("add");
            Ok(())
        }
        fn softmax(&self, _: &mut [f32]) {
            self.saw("softmax");
        }
        fn embed_row(&self, _: &Weights<'_>, _: usize, _: &mut [f32]) -> Result<(), ShapeError> {
            self.saw("embed_row");
            Ok(())
        }
    }

    /// Every method of `B` called on `b`, as a generic caller (a model) calls them.
    fn call_every_method<B: Backend>(b: &B) -> Result<(), ShapeError> {
        let w = Weights::new(DType::F32, 0, 0, &[])?;
        let params = AttnParams::causal(2);
        let rope = Rope {
            base: 10_000.0,
            style: RopeStyle::Halves,
        };
        let kv = KvView::new(1, 2, Vec::new()).expect("an empty view");
        let q = ndarray::Array3::<f32>::zeros((0, 1, 2));
        let mut out = ndarray::Array3::<f32>::zeros((0, 1, 2));
        let mut acts = Q8Acts::new();
        assert_eq!(b.name(), "recorder");
        assert_eq!(b.kernel_path(), "recorder/path");
        assert_eq!(b.threads(), 7);
        assert_eq!(b.scope(|| 1), 1);
        assert_eq!(b.join(|| 1, || 2), (1, 2));
        b.gemv(&w, &[], &mut [])?;
        b.quantize_q8(Q8Layout::Q8_0, &[], &mut acts)?;
        b.gemv_q8(&w, &acts, &mut [])?;
        b.gemm_q8(&w, &[], &mut [])?;
        b.gemm(&w, &[], &mut [])?;
        assert_eq!(b.gemm_rows_alone_from(), Some(3));
        b.rope(&mut [], 2, &[], &rope)?;
        b.attention(q.view(), &[], &kv, &params, out.view_mut())?;
        {
            // A view of its own: a job holds its view and its output for one lifetime.
            let kv = KvView::new(1, 2, Vec::new()).expect("an empty view");
            let job = AttnJob {
                q: q.view(),
                q_pos: &[],
                kv: &kv,
                out: out.view_mut(),
            };
            b.attention_batch(&mut [job], &params)?;
        }
        assert_eq!(b.attention_part_len(), Some(5));
        b.attention_part(q.view(), &[], &kv, &params, out.view_mut(), &mut [])?;
        b.rms_norm(&[], &[], 1e-5, &mut [])?;
        b.swiglu(&[], &[], &mut [])?;
        b.geglu(&[], &[], &mut [])?;
        b.add(&mut [], &[])?;
        b.softmax(&mut []);
        b.embed_row(&w, 0, &mut [])?;
        Ok(())
    }

    /// `&B` forwards every method of the trait to `B`: each of `Recorder`'s overrides
    /// runs once when called through a reference, none falls back to a default; through
    /// `&dyn Backend`, every method but the generic `scope` and `join`.
    #[test]
    fn a_reference_forwards_every_method() {
        let direct = Recorder::default();
        call_every_method(&direct).expect("the recorder computes nothing");
        let want = direct.0.into_inner().expect("not poisoned");
        assert_eq!(want.len(), 22, "every method of the trait, called directly");

        let rec = Recorder::default();
        call_every_method::<&Recorder>(&&rec).expect("the recorder computes nothing");
        let seen = rec.0.into_inner().expect("not poisoned");
        assert_eq!(seen, want, "methods that did not reach B through &B");

        let rec = Recorder::default();
        call_every_method::<&dyn Backend>(&(&rec as &dyn Backend))
            .expect("the recorder computes nothing");
        let seen = rec.0.into_inner().expect("not poisoned");
        let generic = ["scope", "join"];
        let want: Vec<_> = want.into_iter().filter(|m| !generic.contains(m)).collect();
        assert_eq!(
            seen, want,
            "methods that did not reach B through &dyn Backend"
        );
    }
}
