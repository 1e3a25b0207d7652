//! The kernel drivers, generic over the instruction-set family `K: Kernel`.
//!
//! - `gemv`: one pass over the weight rows (`K::gemv`); for `Q4_1` the per-block sums
//!   `Σ x_j` are computed once here and shared by every row.
//! - `gemm`: `n = 1` is the GEMV. Otherwise `Y ← X Wᵀ` by `matrixmultiply::sgemm`:
//!   directly on the stored values for aligned `F32` weights (strides express the
//!   transpose, no copy), else on panels of weight rows decoded into an f32 scratch, so
//!   each decoded row serves all `n` tokens: for `n ≤ SMALL_N` panels of [`PANEL_ROWS`]
//!   as plain dot products, without sgemm's packing; else panels of up to
//!   [`SGEMM_PANEL_BYTES`] for `sgemm` (which packs `X` once per panel).
//! - `attention`: per query row and KV group, blocks of [`ATTN_BLOCK`] key rows scored
//!   for every head of the group while they are in cache, the family's softmax (AVX2: a
//!   vectorised `exp`), then the value rows block by block into every head's output.
//! - `rms_norm`: SIMD f32 sum of squares, the scalar's f64 reciprocal square root, SIMD
//!   products.
//!
//! Every output depends only on its own row of `W` (or of `x`) and on `n`, never on how
//! many other rows the call holds, so `kvcore_rayon::Rayon` splitting a call over rows
//! gives bitwise identical results.

use crate::kernel::Kernel;
use crate::sgemm::{Gemm, sgemm};
use kvcore::backend::{AttnParams, DType, Q8Acts, QK, ShapeError, Weights};
use kvcore::kv::{KvRows, KvView};
use kvcore::ndarray::{ArrayView3, ArrayViewMut3, Axis, s};
use std::ops::Range;

/// Weight rows decoded per GEMM panel of a few tokens (`n ≤ SMALL_N`): `64 × 2048 × 4`
/// bytes = 512 KiB at the widest reduction of the two models, in L2 while the tokens are
/// dotted with it.
pub(crate) const PANEL_ROWS: usize = 64;

/// The f32 bytes of one decoded panel for `sgemm` (`n > SMALL_N`). Each `sgemm` call packs
/// all of `X` again, so a panel must be wide enough for that to be small beside the
/// `rows · n · cols` products: with 64-row panels the packing was 24 % of a 696-token
/// Gemma 3 prefill (perf), as much as a quarter of the micro-kernel's time. 2 MiB holds
/// 256 rows at `cols = 2048` and 819 at 640, and stays within a core's share of L3.
pub(crate) const SGEMM_PANEL_BYTES: usize = 2 << 20;

/// Weight rows per decoded panel for `n` tokens and reduction `cols`: [`PANEL_ROWS`] for
/// a few tokens, else as many as fit [`SGEMM_PANEL_BYTES`] (a multiple of 8, at least
/// [`PANEL_ROWS`]).
fn panel_rows(n: usize, cols: usize) -> usize {
    if n <= SMALL_N {
        return PANEL_ROWS;
    }
    (SGEMM_PANEL_BYTES / (4 * cols) / 8 * 8).max(PANEL_ROWS)
}

/// Up to this many tokens, a GEMM of stored (non-f32) weights dots each decoded panel row
/// with each token instead of packing the panel for `sgemm`: the packing is linear in
/// the weights and dominated a 6-token prefill of Gemma 3 (the products are only `n` per
/// weight).
pub(crate) const SMALL_N: usize = 8;

/// `Σ x_j` over each 32-element block of `x`, left to right in f32 (`Q4_1` only).
fn block_sums(dtype: DType, x: &[f32]) -> Vec<f32> {
    if dtype != DType::Q4_1 {
        return Vec::new();
    }
    x.chunks_exact(QK).map(|b| b.iter().sum()).collect()
}

/// `y ← W x`. Shapes are checked by the caller.
pub(crate) fn gemv<K: Kernel>(k: K, w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    k.gemv(w, x, &block_sums(w.dtype(), x), y);
}

/// `Y ← X Wᵀ` for `n = x.len() / cols` tokens. Shapes are checked by the caller
/// (`cols > 0`).
pub(crate) fn gemm<K: Kernel>(k: K, w: &Weights<'_>, x: &[f32], y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    let n = x.len() / cols;
    if n == 1 {
        return gemv(k, w, x, y);
    }
    if n == 0 || rows == 0 {
        return;
    }
    if w.dtype() == DType::F32 {
        // The stored bytes are the values; the cast fails only for a view that is not
        // 4-byte aligned (`Weights` does not require it), which takes the panel path.
        if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(w.data()) {
            if n <= SMALL_N {
                // The same products as a decoded panel's below, so a stored format's GEMM
                // equals the GEMM of its f32 copy bit for bit at every `n`.
                small_gemm(k, values, x, cols, rows, 0, y);
                return;
            }
            sgemm(Gemm {
                x,
                n,
                cols,
                w: values,
                rows,
                y,
                y_col: 0,
                y_stride: rows,
            });
            return;
        }
    }
    let panel_rows = panel_rows(n, cols);
    let len = panel_rows.min(rows) * cols;
    PANEL.with_borrow_mut(|panel| {
        // Every entry used is decoded before it is read, so old contents may stay.
        if panel.len() < len {
            panel.resize(len, 0.0);
        }
        panels(k, w, x, y, panel_rows, &mut panel[..len]);
    });
}

/// The panel loop of [`gemm`] for stored formats, in `panel`'s scratch
/// (`[panel_rows.min(rows), cols]`).
fn panels<K: Kernel>(
    k: K,
    w: &Weights<'_>,
    x: &[f32],
    y: &mut [f32],
    panel_rows: usize,
    panel: &mut [f32],
) {
    let (rows, cols) = (w.rows(), w.cols());
    let n = x.len() / cols;
    for r0 in (0..rows).step_by(panel_rows) {
        let p = panel_rows.min(rows - r0);
        let rb = w.row_bytes();
        let bytes = &w.data()[r0 * rb..(r0 + p) * rb];
        k.dequantize(w.dtype(), bytes, &mut panel[..p * cols]);
        if n <= SMALL_N {
            small_gemm(k, &panel[..p * cols], x, cols, rows, r0, y);
            continue;
        }
        sgemm(Gemm {
            x,
            n,
            cols,
            w: &panel[..p * cols],
            rows: p,
            y,
            y_col: r0,
            y_stride: rows,
        });
    }
}

/// `Y[t] ← W x̂_t` for a few quantised tokens: per panel of [`PANEL_ROWS`] weight rows
/// (in L1/L2 while every token passes), each token's `K::gemv_q8` over the panel. Each
/// output depends only on its row and its token, so row `t` is bit for bit the GEMV of
/// token `t`. Shapes are checked by the caller.
pub(crate) fn gemm_q8<K: Kernel>(k: K, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) {
    let rows = w.rows();
    for r0 in (0..rows).step_by(PANEL_ROWS) {
        let p = PANEL_ROWS.min(rows - r0);
        let panel = w.slice_rows(r0..r0 + p);
        for (t, xt) in x.iter().enumerate() {
            k.gemv_q8(&panel, xt, &mut y[t * rows + r0..][..p]);
        }
    }
}

/// `Y[:, r0 .. r0 + p] ← X Wᵀ` for a few tokens and `p` f32 weight rows `w: [p, cols]`:
/// each row dotted with each token (`scores` with scale 1, exact), while the rows are in
/// cache. Packing them for sgemm would cost more than the `n` products per weight.
fn small_gemm<K: Kernel>(
    k: K,
    w: &[f32],
    x: &[f32],
    cols: usize,
    rows: usize,
    r0: usize,
    y: &mut [f32],
) {
    let p = w.len() / cols;
    for (t, xt) in x.chunks_exact(cols).enumerate() {
        k.scores(xt, w.chunks_exact(cols), 1.0, &mut y[t * rows + r0..][..p]);
    }
}

/// The `[head_dim]` rows of KV head `kvh` at slots `slots` of an f32 run (contiguous
/// last axis, checked by the caller).
fn head_rows<'a>(
    rows: ArrayView3<'a, f32>,
    slots: Range<usize>,
    kvh: usize,
) -> impl Iterator<Item = &'a [f32]> + Clone {
    let head = rows.slice_move(s![slots, kvh, ..]); // [slots, head_dim]
    (0..head.nrows()).map(move |t| {
        head.index_axis_move(Axis(0), t)
            .to_slice()
            .expect("the last axis is contiguous (checked)")
    })
}

/// Slots per attention block: the key (or value) rows of one block, `64 × head_dim × 4`
/// bytes (16 KiB at SmolLM2's 64, 64 KiB at Gemma 3's 256), are read from memory once and
/// served from L1/L2 to every query head of their KV group. (16-row blocks at Gemma 3's
/// head_dim, 16 KiB, were no faster for a 696-token prefill: tried 2026-12-01.)
pub(crate) const ATTN_BLOCK: usize = 64;

thread_local! {
    /// The decoded weight panel of [`gemm`], reused by every call on this thread (up to
    /// [`SGEMM_PANEL_BYTES`]: allocated afresh, it was faulted in page by page per call).
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };

    /// The scores of one query row's KV group, `[group, visible slots]`: reused by every
    /// call on this thread, so a decode step allocates nothing once it has run.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };

    /// One block of key or value rows of a KV head decoded to f32, `[ATTN_BLOCK,
    /// head_dim]`, for rows stored in another type: reused like `SCORES`.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `[head_dim]` f32 rows of KV head `kvh` at `slots` of `rows`: an f32 run's own
/// rows, or for another type the rows decoded by the family's dequantiser (bit for bit
/// the scalar reference's) into `scratch`, one block, never a layer. The last axis is
/// contiguous (checked by the caller).
fn block_rows<'r: 'a, 'a, K: Kernel>(
    k: K,
    rows: KvRows<'r>,
    slots: Range<usize>,
    kvh: usize,
    scratch: &'a mut Vec<f32>,
) -> impl Iterator<Item = &'a [f32]> + Clone + use<'a, K> {
    let (view, slots, kvh): (ArrayView3<'a, f32>, _, _) = match rows {
        KvRows::F32(a) => (a.reborrow(), slots, kvh),
        other => {
            let (n, hd, dtype) = (slots.len(), other.dim().2, other.kv_type().dtype());
            scratch.resize(n * hd, 0.0);
            for (t, out) in slots.zip(scratch.chunks_exact_mut(hd.max(1))) {
                let bytes = other
                    .head_bytes(t, kvh)
                    .expect("the last axis is contiguous (checked)");
                k.dequantize(dtype, bytes, out);
            }
            let decoded = ArrayView3::from_shape((n, 1, hd), &scratch[..n * hd])
                .expect("the scratch holds n · head_dim values");
            (decoded, 0..n, 0)
        }
    };
    head_rows(view, slots, kvh)
}

/// The visible slots of a view for one query position, cut into blocks of at most
/// [`ATTN_BLOCK`] within one segment: `(segment, slots, offset into the scores)`.
fn blocks(visible: &[Range<usize>]) -> impl Iterator<Item = (usize, Range<usize>, usize)> + '_ {
    let mut at = 0;
    visible.iter().enumerate().flat_map(move |(seg, vis)| {
        let start = at;
        at += vis.len();
        (vis.start..vis.end).step_by(ATTN_BLOCK).map(move |b0| {
            let b1 = (b0 + ATTN_BLOCK).min(vis.end);
            (seg, b0..b1, start + (b0 - vis.start))
        })
    })
}

/// One layer's attention; shapes checked by the caller.
///
/// Per query row and KV group: the scores of every query head of the group, block by
/// block of visible slots (each block of key rows read once for the whole group, the
/// score of each head and slot the SIMD dot product of `K::scores`); then each head's
/// softmax (`K::softmax`); then the weighted sum of the value rows, again block by block
/// for the whole group (`K::weighted_sum` continues each output's chain of fused
/// multiply-adds across blocks, so the blocking changes no bits). Every head's numbers are
/// computed by the same operations in the same order whatever the group, the blocking or
/// the split of rows and heads, so `Rayon` splitting a call stays bitwise equal.
pub(crate) fn attention<K: Kernel>(
    k: K,
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
) -> Result<(), ShapeError> {
    let segs = kv.segments();
    let n_heads = q.dim().1;
    let group = n_heads / kv.n_kv_heads();
    let (k_rot, v_rot) = kvcore_scalar::rotations(kv);
    let mut qrot = Vec::new(); // [group][head_dim] rotated query heads (q8_0 keys)
    SCORES.with_borrow_mut(|scores| {
        DECODED.with_borrow_mut(|scratch| {
            for (i, &pos) in q_pos.iter().enumerate() {
                let visible: Vec<Range<usize>> = (segs.iter())
                    .map(|seg| seg.visible(pos, params.mask))
                    .collect();
                let total: usize = visible.iter().map(Range::len).sum();
                scores.clear();
                scores.resize(group * total, 0.0);
                for kvh in 0..kv.n_kv_heads() {
                    let heads = kvh * group..(kvh + 1) * group;
                    if k_rot {
                        // The group's query heads, rotated in place in one reused buffer.
                        qrot.clear();
                        for h in heads.clone() {
                            let at = qrot.len();
                            qrot.extend(q.slice(s![i, h, ..]).iter());
                            kvcore_scalar::unrotate(&mut qrot[at..]);
                        }
                    }
                    for (seg, slots, at) in blocks(&visible) {
                        let n = slots.len();
                        let keys = block_rows(k, segs[seg].keys(), slots, kvh, scratch);
                        for (g, h) in heads.clone().enumerate() {
                            let qh = q.slice(s![i, h, ..]);
                            let qh = match k_rot {
                                true => &qrot[g * qh.len()..(g + 1) * qh.len()],
                                false => qh
                                    .to_slice()
                                    .expect("the last axis is contiguous (checked)"),
                            };
                            let dst = &mut scores[g * total + at..][..n];
                            k.scores(qh, keys.clone(), params.scale, dst);
                        }
                    }
                    for g in 0..group {
                        k.softmax(&mut scores[g * total..(g + 1) * total]);
                        out.slice_mut(s![i, kvh * group + g, ..]).fill(0.0);
                    }
                    for (seg, slots, at) in blocks(&visible) {
                        let n = slots.len();
                        let values = block_rows(k, segs[seg].values(), slots, kvh, scratch);
                        for (g, h) in heads.clone().enumerate() {
                            let p = &scores[g * total + at..][..n];
                            let mut oh = out.slice_mut(s![i, h, ..]);
                            let oh = oh
                                .as_slice_mut()
                                .expect("the last axis is contiguous (checked)");
                            k.weighted_sum(p, values.clone(), oh);
                        }
                    }
                    if v_rot {
                        for h in heads.clone() {
                            let mut oh = out.slice_mut(s![i, h, ..]);
                            let oh = oh
                                .as_slice_mut()
                                .expect("the last axis is contiguous (checked)");
                            kvcore_scalar::unrotate(oh);
                        }
                    }
                }
            }
        })
    });
    Ok(())
}

/// RMSNorm of each `[d]` row. Shapes are checked by the caller.
///
/// Numerics: the sum of squares is f32 in SIMD lanes (error `≤ (d + 1)·u` relative,
/// against the scalar's f64), then `r = 1/√(Σ/d + eps)` exactly as the scalar computes
/// it from that sum (in f64, rounded once), and `out = (x·r)·w` with the scalar's two
/// rounded products.
pub(crate) fn rms_norm<K: Kernel>(k: K, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum_sq = f64::from(k.sum_squares(xr));
        let r = (1.0 / (sum_sq / d as f64 + f64::from(eps)).sqrt()) as f32;
        k.scale_mul(xr, r, weight, or);
    }
}
