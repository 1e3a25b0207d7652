//! The crate-private kernel trait every instruction-set family implements.
//!
//! A kernel is a zero-sized token (`x86::Avx2`, `aarch64::Neon`) that can
//! only be obtained from run-time feature detection, so holding one proves the CPU runs
//! its instructions. The drivers in `ops.rs` are generic over `K: Kernel` and are
//! monomorphised per family (the matrixmultiply pattern); each method below runs one
//! whole loop inside the family's `#[target_feature]` code, so the feature boundary is
//! crossed once per call, not once per element.
//!
//! Layouts follow `kvcore::backend`: row-major `[rows, cols]`, weights in their stored
//! bytes, activations `f32`.

use crate::kformat::BlockLoops;
use crate::lanes::F32Loops;
use kvcore::backend::BlockFormat;
use kvcore::backend::format::Q4_0;
use kvcore::backend::{DType, PartStat, Q8Acts, Q8Layout, Weights};
use kvcore::kv::{BlockQ4_0, BlockQ8_0, KvRows};
use kvcore::ndarray::{ArrayView2, Axis, s};
use std::ops::Range;

use half::{bf16, f16};

/// The rows of one KV head over a run of slots, `[rows, units]`, in their stored type
/// (a unit is a value, or a block of 32 for `q8_0` and `q4_0`), last axis contiguous: what the
/// attention kernels read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HeadRows<'a> {
    F32(ArrayView2<'a, f32>),
    F16(ArrayView2<'a, f16>),
    BF16(ArrayView2<'a, bf16>),
    Q8_0(ArrayView2<'a, BlockQ8_0>),
    Q4_0(ArrayView2<'a, BlockQ4_0>),
}

impl<'a> HeadRows<'a> {
    /// KV head `kvh` of `rows` at `slots`, or `None` for an element type without a
    /// variant here (the caller decodes those).
    pub(crate) fn of(rows: KvRows<'a>, slots: Range<usize>, kvh: usize) -> Option<Self> {
        Some(match rows {
            KvRows::F32(a) => HeadRows::F32(a.slice_move(s![slots, kvh, ..])),
            KvRows::F16(a) => HeadRows::F16(a.slice_move(s![slots, kvh, ..])),
            KvRows::BF16(a) => HeadRows::BF16(a.slice_move(s![slots, kvh, ..])),
            KvRows::Q8_0(a) => HeadRows::Q8_0(a.slice_move(s![slots, kvh, ..])),
            KvRows::Q4_0(a) => HeadRows::Q4_0(a.slice_move(s![slots, kvh, ..])),
            _ => return None,
        })
    }

    /// The same rows for a shorter lifetime (the enum is invariant over it).
    pub(crate) fn reborrow<'b>(self) -> HeadRows<'b>
    where
        'a: 'b,
    {
        match self {
            HeadRows::F32(a) => HeadRows::F32(a.reborrow()),
            HeadRows::F16(a) => HeadRows::F16(a.reborrow()),
            HeadRows::BF16(a) => HeadRows::BF16(a.reborrow()),
            HeadRows::Q8_0(a) => HeadRows::Q8_0(a.reborrow()),
            HeadRows::Q4_0(a) => HeadRows::Q4_0(a.reborrow()),
        }
    }

    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        match self {
            HeadRows::F32(a) => a.nrows(),
            HeadRows::F16(a) => a.nrows(),
            HeadRows::BF16(a) => a.nrows(),
            HeadRows::Q8_0(a) => a.nrows(),
            HeadRows::Q4_0(a) => a.nrows(),
        }
    }

    /// Values per row.
    pub(crate) fn head_dim(&self) -> usize {
        match self {
            HeadRows::F32(a) => a.ncols(),
            HeadRows::F16(a) => a.ncols(),
            HeadRows::BF16(a) => a.ncols(),
            HeadRows::Q8_0(a) => a.ncols() * kvcore::kv::Q8_0_BLOCK,
            HeadRows::Q4_0(a) => a.ncols() * kvcore::kv::Q8_0_BLOCK,
        }
    }

    /// The rows in place when they are f32 with a contiguous last axis (as the store
    /// lays them out): the default rows kernels read them without a copy.
    pub(crate) fn f32_rows(&self) -> Option<impl Iterator<Item = &'a [f32]> + Clone + use<'a>> {
        match *self {
            HeadRows::F32(a) if a.ncols() == 0 || a.strides()[1] == 1 => {
                Some((0..a.nrows()).map(move |t| {
                    a.index_axis_move(Axis(0), t)
                        .to_slice()
                        .expect("the last axis is contiguous (checked)")
                }))
            }
            _ => None,
        }
    }

    /// Row `t` decoded to f32 into `out` (`[head_dim]`), bit for bit the scalar
    /// reference's decoding (every conversion here is exact but the block types' one
    /// product `d · q`).
    pub(crate) fn decode_row(&self, t: usize, out: &mut [f32]) {
        match self {
            HeadRows::F32(a) => out
                .iter_mut()
                .zip(a.index_axis(Axis(0), t))
                .for_each(|(o, &v)| *o = v),
            HeadRows::F16(a) => out
                .iter_mut()
                .zip(a.index_axis(Axis(0), t))
                .for_each(|(o, v)| *o = v.to_f32()),
            HeadRows::BF16(a) => out
                .iter_mut()
                .zip(a.index_axis(Axis(0), t))
                .for_each(|(o, v)| *o = v.to_f32()),
            HeadRows::Q8_0(a) => {
                let blocks = a.index_axis(Axis(0), t);
                for (o, b) in out.chunks_exact_mut(kvcore::kv::Q8_0_BLOCK).zip(blocks) {
                    let d = b.d.to_f32();
                    o.iter_mut()
                        .zip(b.qs)
                        .for_each(|(o, q)| *o = d * f32::from(q));
                }
            }
            HeadRows::Q4_0(a) => {
                let blocks = a.index_axis(Axis(0), t);
                for (o, b) in out.chunks_exact_mut(kvcore::kv::Q8_0_BLOCK).zip(blocks) {
                    Q4_0::decode(b, o);
                }
            }
        }
    }
}

thread_local! {
    /// The decoded rows of the default `scores_rows`/`weighted_rows`, reused per thread.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The default of the rows kernels: `rows` decoded to f32 (`[len, head_dim]`) on this
/// thread's scratch, handed to `f`.
fn with_decoded<R>(rows: HeadRows<'_>, f: impl FnOnce(&[f32]) -> R) -> R {
    DECODED.with_borrow_mut(|buf| {
        let hd = rows.head_dim();
        buf.resize(rows.len() * hd, 0.0);
        for (t, out) in buf.chunks_exact_mut(hd.max(1)).enumerate() {
            rows.decode_row(t, out);
        }
        f(&buf[..rows.len() * hd])
    })
}

/// One instruction-set family's kernels. All lengths are checked by the callers in
/// `ops.rs`; the implementations assert them again before any unchecked access.
///
/// The f32 methods (scores, weighted sums, softmax, the GLUs, RMSNorm's parts, the
/// residual add) are the loops of `crate::lanes` on the family's lanes ([`F32Loops`]),
/// and the weight methods (GEMV, dequantize, the 8-bit quantiser) the loops of
/// `crate::kformat` on its block microkernels ([`BlockLoops`]), the same for every
/// family; the others are the family's own.
//
// SAFETY (every `unsafe` block of the provided methods): the `F32Loops` and `BlockLoops`
// entry points need
// the family's instructions, and a `Kernel` value is a token that exists only where the
// CPU runs them (see the module docs).
pub(crate) trait Kernel: F32Loops + BlockLoops {
    /// GEMV `y ← W x` for every dtype.
    ///
    /// `w: [rows, cols]`, `x: [cols]`, `y: [rows]`; `block_sums: [cols / 32]` holds
    /// `Σ x_j` over each 32-element block of `x` (used by `Q4_1`, empty for the plain
    /// formats): `kformat::gemv`.
    fn gemv(self, w: &Weights<'_>, x: &[f32], block_sums: &[f32], y: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_gemv(w, x, block_sums, y) }
    }

    /// Quantise `x` to 8 bits in `layout` into `(scales, sums, values)` (as
    /// `kvcore::backend::Q8Acts::fill` sizes them), bit for bit as
    /// `kvcore::backend::Q8Acts::quantize`: `kformat::quantize`.
    fn quantize_q8(
        self,
        layout: Q8Layout,
        x: &[f32],
        scales: &mut [f32],
        sums: &mut [i32],
        values: &mut [i8],
    ) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_quantize(layout, x, scales, sums, values) }
    }

    /// GEMV with 8-bit activations `y ← W x̂` for a block-format `w` and `x` in the layout
    /// it meets (see `kvcore::backend::q8`). `x: [cols]`, `y: [rows]`.
    fn gemv_q8(self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]);

    /// [`gemv_q8`](Kernel::gemv_q8) of several tokens over the same rows:
    /// `y[t·stride ..][..rows] ← W x̂_t` for each token `t` of `x`, each bit for bit that
    /// token's `gemv_q8` (a family may decode each weight block once for several tokens;
    /// it may not change a token's arithmetic). The default runs `gemv_q8` per token.
    fn gemv_q8_tokens(self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32], stride: usize) {
        for (t, xt) in x.iter().enumerate() {
            self.gemv_q8(w, xt, &mut y[t * stride..][..w.rows()]);
        }
    }

    /// Decode `out.len()` consecutive weights of `dtype` from `bytes` (whole blocks),
    /// bit for bit equal to `kvcore_scalar::quant::dequantize`: `kformat::dequantize`.
    fn dequantize(self, dtype: DType, bytes: &[u8], out: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_dequantize(dtype, bytes, out) }
    }

    /// Attention scores `s_t ← scale · q·k_t` for `t in 0..scores.len()`, `k_t` the
    /// `t`-th row of `keys` (each `q.len()` long): `lanes::scores`.
    fn scores<'a>(
        self,
        q: &[f32],
        keys: impl Iterator<Item = &'a [f32]>,
        scale: f32,
        scores: &mut [f32],
    ) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_scores(q, keys, scale, scores) }
    }

    /// The few-token GEMM on f32 rows: `y[t·stride + r] ← w_r·x_t` for every row `w_r`
    /// of `w: [p, cols]` and token `x_t` of `x: [n, cols]`, each output by the same
    /// operations whatever `p` and `n` (so it depends on its row and token alone). The
    /// default is [`scores`](Kernel::scores) (scale 1) per token.
    fn gemm_rows(self, w: &[f32], x: &[f32], cols: usize, y: &mut [f32], stride: usize) {
        let p = w.len() / cols;
        for (t, xt) in x.chunks_exact(cols).enumerate() {
            self.scores(xt, w.chunks_exact(cols), 1.0, &mut y[t * stride..][..p]);
        }
    }

    /// The few-token GEMM straight from `w`'s stored bytes, where the family has such a
    /// kernel for its format and `n = x.len() / cols` tokens: `y[t·stride + r] ← w_r·x_t`,
    /// each output bit for bit what [`gemm_rows`](Kernel::gemm_rows) gives on the decoded
    /// rows, and `true`; else `false`, nothing written. The default has none.
    fn gemm_stored(self, _w: &Weights<'_>, _x: &[f32], _y: &mut [f32], _stride: usize) -> bool {
        false
    }

    /// A hint that `bytes` will be read soon (x86: each cache line prefetched towards
    /// L2). The default does nothing.
    fn prefetch(self, _bytes: &[u8]) {}

    /// Weighted sum `out ← out + Σ_t p_t · v_t` in `t` order, `v_t` the `t`-th row of
    /// `values` (each `out.len()` long) and `t in 0..p.len()`: `lanes::weighted_sum`.
    fn weighted_sum<'a>(self, p: &[f32], values: impl Iterator<Item = &'a [f32]>, out: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_weighted_sum(p, values, out) }
    }

    /// Attention scores of `nv = qs.len() / head_dim` query vectors against rows in
    /// their stored type: `out[v · stride + t] ← scale · q_v·k_t` for every row `t` of
    /// `keys` (`qs: [nv, head_dim]`). Each vector's score is computed by the same
    /// operations whatever `nv`, so splitting vectors over calls changes no bits. The
    /// default runs [`scores`](Kernel::scores) per vector on the rows, f32 ones in place,
    /// the other types decoded first.
    fn scores_rows(
        self,
        qs: &[f32],
        keys: HeadRows<'_>,
        scale: f32,
        out: &mut [f32],
        stride: usize,
    ) {
        let hd = keys.head_dim();
        if let Some(rows) = keys.f32_rows() {
            for (v, q) in qs.chunks_exact(hd).enumerate() {
                let dst = &mut out[v * stride..][..keys.len()];
                self.scores(q, rows.clone(), scale, dst);
            }
            return;
        }
        with_decoded(keys, |rows| {
            for (v, q) in qs.chunks_exact(hd).enumerate() {
                let dst = &mut out[v * stride..][..keys.len()];
                self.scores(q, rows.chunks_exact(hd), scale, dst);
            }
        })
    }

    /// Weighted sums of rows in their stored type for `nv = outs.len() / head_dim`
    /// outputs: `outs[v] ← outs[v] + Σ_t p[v · stride + t] · v_t` in `t` order over the
    /// rows of `values` (`outs: [nv, head_dim]`), each output's chain the same whatever
    /// `nv`. The default runs [`weighted_sum`](Kernel::weighted_sum) per output on the
    /// rows, f32 ones in place, the other types decoded first.
    fn weighted_rows(self, p: &[f32], stride: usize, values: HeadRows<'_>, outs: &mut [f32]) {
        let hd = values.head_dim();
        if let Some(rows) = values.f32_rows() {
            for (v, o) in outs.chunks_exact_mut(hd).enumerate() {
                let pv = &p[v * stride..][..values.len()];
                self.weighted_sum(pv, rows.clone(), o);
            }
            return;
        }
        with_decoded(values, |rows| {
            for (v, o) in outs.chunks_exact_mut(hd).enumerate() {
                let pv = &p[v * stride..][..values.len()];
                self.weighted_sum(pv, rows.chunks_exact(hd), o);
            }
        })
    }

    /// `rows` decoded to f32 into `out` (`[len, head_dim]`), bit for bit
    /// [`HeadRows::decode_row`] (the scalar reference's decoding): what a prefill stages
    /// once per part for all its tiles. The default decodes row by row.
    fn decode_rows(self, rows: HeadRows<'_>, out: &mut [f32]) {
        let hd = rows.head_dim();
        for (t, o) in out.chunks_exact_mut(hd.max(1)).enumerate().take(rows.len()) {
            rows.decode_row(t, o);
        }
    }

    /// `o ← H o / n`, a rotated `q8_0` head's query or output rotated back
    /// (`kvcore_scalar::unrotate`, whose bits every family's must equal). The default is
    /// that one.
    fn unrotate(self, o: &mut [f32]) {
        kvcore_scalar::unrotate(o);
    }

    /// The unnormalised softmax of one row in place: `x ← e^(x − max)`, returning the
    /// max and the sum. A NaN makes the row NaN (and the state NaN); an empty or all
    /// `−∞` row becomes zeros with [`PartStat::EMPTY`]. `lanes::exp_sum`: within the
    /// conformance tolerance (whose `exp` allowance is `EXP_ULPS` ulps).
    fn exp_sum(self, x: &mut [f32]) -> PartStat {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_exp_sum(x) }
    }

    /// Softmax of one row in place, with `Backend::softmax`'s contract (max-subtracted;
    /// a NaN makes the row NaN; an all-`−∞` row becomes zeros): `lanes::softmax`, within
    /// the conformance tolerance.
    fn softmax(self, x: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_softmax(x) }
    }

    /// SwiGLU `out ← silu(gate) ⊙ up` within the conformance bound (`lanes::swiglu`).
    fn swiglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_swiglu(gate, up, out) }
    }

    /// GeGLU `out ← gelu_tanh(gate) ⊙ up` within the conformance bound (`lanes::geglu`).
    fn geglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_geglu(gate, up, out) }
    }

    /// `Σ x_j²` in f32 (`lanes::dot`).
    fn sum_squares(self, x: &[f32]) -> f32 {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_dot(x, x) }
    }

    /// `out_j ← (x_j · r) · w_j`, two rounded products (as the scalar reference).
    fn scale_mul(self, x: &[f32], r: f32, w: &[f32], out: &mut [f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_scale_mul(x, r, w, out) }
    }

    /// `acc_j ← acc_j + x_j` (correctly rounded, so bit for bit the scalar result).
    fn add(self, acc: &mut [f32], x: &[f32]) {
        // SAFETY: the token proves the features (see above).
        unsafe { self.run_add(acc, x) }
    }
}
