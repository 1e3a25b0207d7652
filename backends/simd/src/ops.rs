//! The kernel drivers, generic over the instruction-set family `K: Kernel`.
//!
//! - `gemv`: one pass over the weight rows (`K::gemv`); for `Q4_1` the per-block sums
//!   `Σ x_j` are computed once here and shared by every row.
//! - `gemm`: `n = 1` is the GEMV. Otherwise `Y ← X Wᵀ` by `matrixmultiply::sgemm`:
//!   directly on the stored values for aligned `F32` weights (strides express the
//!   transpose, no copy), else on panels of weight rows decoded into an f32 scratch, so
//!   each decoded row serves all `n` tokens: for `n ≤ SMALL_N` panels of
//!   [`PANEL_ROWS`] through `K::gemm_rows` (AVX2: register blocks of 3 rows × 4 tokens),
//!   without sgemm's packing; else panels of up to
//!   [`SGEMM_PANEL_BYTES`] for `sgemm` (which packs `X` once per panel).
//! - `attention`: flash-attention's online softmax at the granularity of parts of
//!   [`ATTN_PART`] positions: each part ([`attention_part`]) gives every query row and
//!   head its unnormalised output and softmax state, and the parts are folded by
//!   `kvcore::backend::merge_part` (exact log-sum-exp rescaling) — so no row ever holds
//!   more than one part's scores, and `Rayon` can compute one decode step's parts on
//!   several threads and fold them to the same bits. Within a part, tiles of query rows ×
//!   the heads of a KV group are scored against blocks of [`ATTN_BLOCK`] key rows read in
//!   their stored type (`K::scores_rows`: each row loaded and converted once for the whole
//!   tile), exponentiated with the family's `exp` (`K::exp_sum`), and the value rows added
//!   into every vector of the tile the same way (`K::weighted_rows`). A call of more
//!   than one tile (a prefill) first decodes the part's f16, bf16, q8_0 or q4_0 rows of a KV
//!   head to f32 (`K::decode_rows`, the reference's values), so each row is converted
//!   once per part instead of once per tile.
//! - `rms_norm`: SIMD f32 sum of squares, the scalar's f64 reciprocal square root, SIMD
//!   products.
//!
//! Every output depends only on its own row of `W` (or of `x`) and on `n`, never on how
//! many other rows the call holds, so `kvcore_rayon::Rayon` splitting a call over rows
//! gives bitwise identical results.

use crate::kernel::{HeadRows, Kernel};
use crate::sgemm::{Gemm, sgemm};
use kvcore::backend::{
    AttnParams, DType, PartStat, Q8Acts, QK, ShapeError, Weights, finish_part, merge_part,
};
use kvcore::kv::{KEY_OFFSET_BLOCK, KvRows, KvView};
use kvcore::ndarray::{ArrayView2, ArrayView3, ArrayViewMut3, Axis, s};
use std::ops::Range;

/// Weight rows decoded per GEMM panel of a few tokens (`n ≤ SMALL_N`): `64 × 2048 ×
/// 4` bytes = 512 KiB at the widest reduction of the two models, in L2 while the tokens
/// are dotted with it. (8 to 64 rows measured alike in batched decode with f32
/// activations.)
pub(crate) const PANEL_ROWS: usize = 64;

/// The f32 bytes of one decoded panel for `sgemm` (`n > SMALL_N`). Each `sgemm`
/// call packs all of `X` again, so a panel must be wide enough for that to be small beside the
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

/// Up to this many tokens, a GEMM dots each decoded panel row with each token
/// (`K::gemm_rows`) instead of packing the panel for `sgemm`: the packing is linear in the
/// weights and dominated a 6-token prefill of Gemma 3 (the products are only `n` per
/// weight). AVX2's `gemm_rows` outran `sgemm` at 16 tokens too (540 against 685 µs), but the bound stays at
/// `kvcore::model::Q8_MAX_TOKENS`: a pass with 8-bit activations sends longer chunks'
/// rows through the f32 GEMM, alone or stacked with other sequences' chunks, and they
/// give the same bits either way only if every such GEMM takes the same path (`sgemm`,
/// whose rows do not depend on `n`).
pub(crate) const SMALL_N: usize = 8;
const _: () = assert!(SMALL_N <= kvcore::model::Q8_MAX_TOKENS);

/// `Σ x_j` over each 32-element block of `x` (`Q4_1` only), in f32: eight lanes, each
/// the left-to-right sum of every eighth element (independent chains, so the compiler
/// vectorises them without reordering a sum), then the lanes pairwise. One chain of 32
/// dependent adds per block was ~2 % of a decode step's samples.
fn block_sums(dtype: DType, x: &[f32]) -> Vec<f32> {
    if dtype != DType::Q4_1 {
        return Vec::new();
    }
    let sum = |b: &[f32]| {
        let mut lanes = [0.0f32; 8];
        for c in b.chunks_exact(8) {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += v;
            }
        }
        let [a, b, c, d, e, f, g, h] = lanes;
        ((a + e) + (c + g)) + ((b + f) + (d + h))
    };
    x.chunks_exact(QK).map(sum).collect()
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
    if n <= SMALL_N && k.gemm_stored(w, x, y, rows) {
        return; // the panels' bits, straight from the stored blocks
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
        // The next panel's bytes come from memory while this one's products run.
        let next = (r0 + p) * rb..((r0 + p + panel_rows).min(rows)) * rb;
        k.prefetch(&w.data()[next]);
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
/// (in L1/L2 while every token passes), `K::gemv_q8_tokens` over the panel (AVX2: each
/// row's blocks decoded once per group of up to 8 tokens). Each output depends only on
/// its row and its token, by the same operations as a GEMV, so row `t` is bit for bit
/// the GEMV of token `t`. Shapes are checked by the caller.
pub(crate) fn gemm_q8<K: Kernel>(k: K, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) {
    let rows = w.rows();
    if x.is_empty() {
        return; // no tokens: `y` is empty, and `y[r0..]` below would be out of range
    }
    for r0 in (0..rows).step_by(PANEL_ROWS) {
        let p = PANEL_ROWS.min(rows - r0);
        let panel = w.slice_rows(r0..r0 + p);
        k.gemv_q8_tokens(&panel, x, &mut y[r0..], rows);
    }
}

/// `Y[:, r0 .. r0 + p] ← X Wᵀ` for a few tokens and `p` f32 weight rows `w: [p, cols]`
/// (`K::gemm_rows`: AVX2 dots three rows with four tokens per pass), while the rows are in
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
    k.gemm_rows(w, x, cols, &mut y[r0..], rows);
}

/// Slots per attention block: the key (or value) rows of one KV head read by one
/// `scores_rows` (`weighted_rows`) call, `64 × head_dim × 4` bytes at most (16 KiB at
/// SmolLM2's 64, 64 KiB at Gemma 3's 256), in L1/L2 while every query vector of the
/// tile passes over them.
pub(crate) const ATTN_BLOCK: usize = 64;

/// Slots per part of the split attention ([`Backend::attention_part_len`]): a query row's
/// keys are scored, exponentiated and summed part by part, the parts folded by
/// `kvcore::backend::merge_part` (flash-attention's online softmax at part granularity).
/// 256 slots of one KV head's keys and values are `2 × 256 × 64 × 4` = 128 KiB for
/// SmolLM2 in f32 (512 KiB for Gemma 3's 256-wide heads), within L2 while every query
/// row of a prefill passes over them; a decode step at depth 4096 is 16 parts per KV
/// head, enough pieces to balance two or more threads.
///
/// [`Backend::attention_part_len`]: kvcore::backend::Backend::attention_part_len
pub(crate) const ATTN_PART: usize = 256;

// Each part's keys share one key offset (`kvcore::kv::KEY_OFFSET_BLOCK`).
const _: () = assert!(KEY_OFFSET_BLOCK.is_multiple_of(ATTN_PART));

/// Query vectors (query rows × heads of one KV group) per tile of `attention_part`: a
/// tile's vectors share every key and value row read and converted (SmolLM2: 8 query
/// rows × 3 heads). 24 instead of 8 made the tiled prefill kernels 8 % faster
/// (`cargo bench --bench kernels -- attention_prefill`, f32 rows, Zen 3): the 8 key rows
/// `x86/attn.rs` converts per block serve three times the vectors. A decode step's tile
/// is its one row whatever this is.
const TILE_VECS: usize = 24;

/// Slots of one KV head a prefill's [`attention_part`] stages as f32 at most: a part of
/// [`ATTN_PART`] (64 KiB of keys and as much of values at SmolLM2's heads of 64, 512 KiB
/// together at Gemma 3's 256).
const STAGE_MAX: usize = ATTN_PART;

thread_local! {
    /// The decoded weight panel of [`gemm`], reused by every call on this thread (up to
    /// [`SGEMM_PANEL_BYTES`]: allocated afresh, it was faulted in page by page per call).
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };

    /// The scratch of [`attention_part`], reused by every call on this thread, so a
    /// decode step allocates nothing once it has run.
    static PART: std::cell::RefCell<PartScratch> = const { std::cell::RefCell::new(PartScratch::new()) };

    /// The scratch of [`attention`]'s fold over parts.
    static FOLD: std::cell::RefCell<FoldScratch> = const { std::cell::RefCell::new(FoldScratch::new()) };
}

/// What one tile of [`attention_part`] works in.
struct PartScratch {
    /// The tile's query vectors, `[vectors, head_dim]` (rotated for `q8_0` keys).
    q: Vec<f32>,
    /// Their scores over the union of the slots they see, `[vectors, stride]`.
    scores: Vec<f32>,
    /// Their unnormalised outputs, `[vectors, head_dim]`.
    acc: Vec<f32>,
    /// Their softmax states.
    stats: Vec<PartStat>,
    /// The visible slots of each row of the tile in each segment, `[rows, segments]`.
    vis: Vec<Range<usize>>,
    /// Each segment's union of the tile's visible slots, and its offset in `stride`.
    union: Vec<(Range<usize>, usize)>,
    /// One KV head's key (value) rows of the part decoded to f32, `[slots, head_dim]`,
    /// when staged.
    k_stage: Vec<f32>,
    v_stage: Vec<f32>,
    /// Each segment's first slot in the part and its first row in the stages.
    staged: Vec<(usize, usize)>,
}

impl PartScratch {
    const fn new() -> Self {
        PartScratch {
            q: Vec::new(),
            scores: Vec::new(),
            acc: Vec::new(),
            stats: Vec::new(),
            vis: Vec::new(),
            union: Vec::new(),
            k_stage: Vec::new(),
            v_stage: Vec::new(),
            staged: Vec::new(),
        }
    }
}

/// What [`attention`] folds parts in.
struct FoldScratch {
    /// The running states, `[n · n_heads]`.
    stats: Vec<PartStat>,
    /// The queries rotated for `q8_0` keys, `[n, n_heads, head_dim]`.
    q: Vec<f32>,
    /// One part's outputs `[n, n_heads, head_dim]` and states.
    part: Vec<f32>,
    part_stats: Vec<PartStat>,
}

impl FoldScratch {
    const fn new() -> Self {
        FoldScratch {
            stats: Vec::new(),
            q: Vec::new(),
            part: Vec::new(),
            part_stats: Vec::new(),
        }
    }
}

/// KV head `kvh` of `rows` at `slots`, in place.
fn head_rows(rows: KvRows<'_>, slots: Range<usize>, kvh: usize) -> HeadRows<'_> {
    HeadRows::of(rows, slots, kvh).expect("element types checked by attention_part")
}

/// KV head `kvh` of `rows` at `slots` decoded to f32 into `out` (`[slots, head_dim]`):
/// by the kernel for the types it reads, else by the scalar reference's decoding of each
/// row (`kvcore_scalar::quant::dequantize`, the weight format of the type).
fn decode_head<K: Kernel>(
    k: K,
    rows: KvRows<'_>,
    slots: Range<usize>,
    kvh: usize,
    out: &mut [f32],
) {
    if let Some(h) = HeadRows::of(rows, slots.clone(), kvh) {
        return k.decode_rows(h, out);
    }
    let hd = rows.dim().2;
    for (t, o) in slots.zip(out.chunks_exact_mut(hd.max(1))) {
        let bytes = rows
            .head_bytes(t, kvh)
            .expect("the last axis is contiguous (checked)");
        kvcore_scalar::quant::dequantize(rows.kv_type().dtype(), bytes, o);
    }
}

/// KV head `kvh` of a segment's `rows` at `slots`: in place, or from its `stage` — the
/// f32 rows of the segment's slots from `lo` at row `at` of the stage's `[_, hd]`.
fn rows_at<'a: 's, 's>(
    rows: KvRows<'a>,
    stage: Option<(&'s [f32], (usize, usize))>,
    slots: Range<usize>,
    kvh: usize,
    hd: usize,
) -> HeadRows<'s> {
    let Some((stage, (lo, at))) = stage else {
        return head_rows(rows, slots, kvh).reborrow();
    };
    let f = &stage[(at + slots.start - lo) * hd..(at + slots.end - lo) * hd];
    HeadRows::F32(ArrayView2::from_shape((slots.len(), hd), f).expect("rows × head_dim"))
}

/// One layer's attention (shapes checked by the caller): [`attention_part`] over the
/// view's slots at positions `0..ATTN_PART, ATTN_PART..2·ATTN_PART, …` (those the view
/// holds), folded in that order by
/// `merge_part` and normalised by `finish_part` — the promise of
/// `Backend::attention_part_len`, which lets `Rayon` compute the parts on several
/// threads and fold them to the same bits.
pub(crate) fn attention<K: Kernel>(
    k: K,
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
) -> Result<(), ShapeError> {
    let (n, n_heads, _) = q.dim();
    FOLD.with_borrow_mut(|f| {
        let mut stats = std::mem::take(&mut f.stats);
        stats.clear();
        stats.resize(n * n_heads, PartStat::EMPTY);
        let folded = fold(k, f, q, q_pos, kv, params, out.view_mut(), &mut stats);
        if folded.is_ok() {
            for (&st, mut o) in stats.iter().zip(out.rows_mut()) {
                finish_part(
                    st,
                    o.as_slice_mut()
                        .expect("the last axis is contiguous (checked)"),
                );
            }
        }
        f.stats = stats;
        folded
    })
}

/// [`attention`] without its last step: every row and head's state `stats[i · n_heads +
/// h]` and unnormalised output over all the view's parts, folded in position order —
/// also `Backend::attention_part` of a view that spans more than one block of key
/// offsets (each part's keys must share one).
pub(crate) fn attention_fold<K: Kernel>(
    k: K,
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    out: ArrayViewMut3<'_, f32>,
    stats: &mut [PartStat],
) -> Result<(), ShapeError> {
    stats.fill(PartStat::EMPTY);
    FOLD.with_borrow_mut(|f| fold(k, f, q, q_pos, kv, params, out, stats))
}

/// The fold of [`attention`] and [`attention_fold`] (`stats` all [`PartStat::EMPTY`]).
#[allow(clippy::too_many_arguments)] // the trait method's operands, the scratch, the states
fn fold<K: Kernel>(
    k: K,
    f: &mut FoldScratch,
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
    stats: &mut [PartStat],
) -> Result<(), ShapeError> {
    let (n, n_heads, hd) = q.dim();
    let span = kv.span();
    let first = span.start / ATTN_PART * ATTN_PART;
    if span.end <= first + ATTN_PART {
        return attention_part(k, q, q_pos, kv, 0..usize::MAX, params, out, stats, false);
    }
    f.part.resize(n * n_heads * hd, 0.0);
    f.part_stats.resize(n * n_heads, PartStat::EMPTY);
    // Queries against rotated (q8_0) keys are rotated once here for every part
    // (the same values each part would compute).
    let k_rot = kv.codecs().0.rotated();
    if k_rot {
        f.q.clear();
        f.q.extend(q.iter());
        f.q.chunks_exact_mut(hd).for_each(|h| k.unrotate(h));
    }
    let q = if k_rot {
        ArrayView3::from_shape((n, n_heads, hd), &f.q[..])
            .expect("the fold scratch holds n · n_heads · head_dim")
    } else {
        q.view()
    };
    for p0 in (first..span.end).step_by(ATTN_PART) {
        let part = p0..p0 + ATTN_PART;
        let mut po = ArrayViewMut3::from_shape((n, n_heads, hd), &mut f.part[..])
            .expect("the fold scratch holds n · n_heads · head_dim");
        let (po, ps) = (po.view_mut(), &mut f.part_stats);
        attention_part(k, q, q_pos, kv, part, params, po, ps, k_rot)?;
        // The output rows `[i, h, ..]` in `idx = i · n_heads + h` order.
        let rows = (stats.iter_mut().zip(&f.part_stats))
            .zip(f.part.chunks_exact(hd))
            .zip(out.rows_mut());
        for (((acc, &ps), part), mut o) in rows {
            let o = o
                .as_slice_mut()
                .expect("the last axis is contiguous (checked)");
            merge_part(acc, o, ps, part);
        }
    }
    Ok(())
}

/// One part of attention (`Backend::attention_part`; shapes checked by the caller):
/// each query row's unnormalised softmax-weighted sum over the slots of `kv` at
/// `positions` it sees, and its state (for the fold of [`attention`], which so needs no
/// sub-view per part).
///
/// The rows are taken in tiles of `max(1, TILE_VECS / group)` and each KV group's heads
/// together: the tile's query vectors are scored against each block of [`ATTN_BLOCK`]
/// key rows in one pass over the rows (`K::scores_rows`, the union of the slots the tile
/// sees, each row read once for all vectors, in its stored type), each vector's own
/// visible scores exponentiated and summed (`K::exp_sum`), and the value rows added block
/// by block into every vector of a run of rows that sees the same slots of the block
/// (`K::weighted_rows`). With more than one tile, each KV head's f16, bf16, q8_0 or q4_0 rows
/// of the part are first decoded to f32 (`K::decode_rows`) and every tile reads those:
/// the values the kernels would convert in registers, so the same bits, at one
/// conversion per row and part instead of one per tile (q8_0 KV prefill at 4096
/// tokens: BENCHMARKS.md). Each vector's numbers come from the same operations in the
/// same order whatever the tile, the group, the blocking, the staging or a split of
/// rows and heads, so `Rayon` splitting a call stays bitwise equal.
///
/// `q_rotated`: the queries are already rotated for `q8_0` keys ([`attention`] rotates
/// them once for all its parts); else a tile rotates its own (`K::unrotate`).
#[allow(clippy::too_many_arguments)] // the trait method's operands, the part, the flag
pub(crate) fn attention_part<K: Kernel>(
    k: K,
    q: ArrayView3<'_, f32>,
    q_pos: &[usize],
    kv: &KvView<'_>,
    positions: Range<usize>,
    params: &AttnParams,
    mut out: ArrayViewMut3<'_, f32>,
    stats: &mut [PartStat],
    q_rotated: bool,
) -> Result<(), ShapeError> {
    // Every segment of a view has the same element types (`KvView::new`): the first
    // one answers for all. Only the segments holding some of the part's positions take
    // part (a paged view has one segment per block: thousands at depth).
    let all = kv.segments();
    let lo = all.partition_point(|s| s.start() + s.len() <= positions.start);
    let hi = lo + all[lo..].partition_point(|s| s.start() < positions.end);
    let segs = &all[lo..hi];
    // A type without this kernel's row readers (none of today's) has its part's rows
    // staged as f32 below (the scalar reference's decoding); a view longer than a stage
    // holds is the scalar reference's part.
    let readers = |rows: KvRows<'_>| HeadRows::of(rows, 0..0, 0).is_some();
    if let Some(seg) = all.first()
        && !(readers(seg.keys()) && readers(seg.values()))
    {
        let part = kv.at_positions(positions.clone());
        if part.len() > STAGE_MAX {
            kvcore_scalar::attention_part(q, q_pos, &part, params, out, stats, q_rotated);
            return Ok(());
        }
    }
    let (n, n_heads, hd) = q.dim();
    let group = n_heads / kv.n_kv_heads();
    let (keys, values) = kv.codecs();
    let (k_rot, v_rot) = (keys.rotated(), values.rotated());
    let tile = (TILE_VECS / group).max(1);
    // A position of the part's keys, for their key offset (every key of a part shares it).
    let block_pos = segs.first().map(|s| s.start().max(positions.start));
    debug_assert!(
        keys.offset_block().is_none_or(|b| {
            segs.last().is_none_or(|s| {
                let last = (s.start() + s.len()).min(positions.end).saturating_sub(1);
                block_pos.is_some_and(|p| p / b == last / b)
            })
        }),
        "one key offset per part"
    );
    // A segment's visible slots restricted to the part's positions.
    let clip = |vis: Range<usize>, seg: &kvcore::kv::KvSegment<'_>| {
        let at = |p: usize| p.clamp(seg.start(), seg.start() + seg.len()) - seg.start();
        let (lo, hi) = (
            vis.start.max(at(positions.start)),
            vis.end.min(at(positions.end)),
        );
        if lo < hi { lo..hi } else { 0..0 }
    };
    // A prefill (more than one tile) decodes the part's f16, bf16, q8_0 or q4_0 rows of a KV
    // head to f32 once for all its tiles (each tile would convert them again); a decode
    // step's one tile reads them in place. Up to `STAGE_MAX` slots: a direct
    // `attention_part` call over a long view reads in place.
    PART.with_borrow_mut(|sc| {
        // Each segment's slots in the part and their first row in the stages.
        sc.staged.clear();
        let mut at = 0;
        for seg in segs {
            let c = clip(0..seg.len(), seg);
            sc.staged.push((c.start, at));
            at += c.len();
        }
        // Rows without a reader of their own are staged in every call.
        let staged = |rows: KvRows<'_>| {
            (n > tile || !readers(rows)) && !matches!(rows, KvRows::F32(_)) && at <= STAGE_MAX
        };
        let (k_staged, v_staged) = match segs.first() {
            Some(seg) => (staged(seg.keys()), staged(seg.values())),
            None => (false, false),
        };
        for kvh in 0..kv.n_kv_heads() {
            for (on, stage, pick) in [
                (k_staged, &mut sc.k_stage, 0),
                (v_staged, &mut sc.v_stage, 1),
            ] {
                if !on {
                    continue;
                }
                stage.resize(at * hd, 0.0);
                for (seg, &(lo, row)) in segs.iter().zip(&sc.staged) {
                    let hi = clip(0..seg.len(), seg).end;
                    let rows = if pick == 0 { seg.keys() } else { seg.values() };
                    let dst = &mut stage[row * hd..(row + hi - lo) * hd];
                    decode_head(k, rows, lo..hi, kvh, dst);
                }
            }
            for i0 in (0..n).step_by(tile) {
                let rows = i0..(i0 + tile).min(n);
                let (nr, nseg) = (rows.len(), segs.len());
                sc.vis.clear();
                for &pos in &q_pos[rows.clone()] {
                    sc.vis.extend(
                        segs.iter()
                            .map(|seg| clip(seg.visible(pos, params.mask), seg)),
                    );
                }
                sc.union.clear();
                let mut stride = 0;
                for s in 0..nseg {
                    let seen = (0..nr)
                        .map(|r| sc.vis[r * nseg + s].clone())
                        .filter(|v| !v.is_empty());
                    let u = seen
                        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
                        .unwrap_or(0..0);
                    sc.union.push((u.clone(), stride));
                    stride += u.len();
                }
                // Each row's visible slots, contiguous in the concatenated unions (a row
                // sees one range of positions, and positions ascend across segments).
                let flat = |vis: &[Range<usize>], union: &[(Range<usize>, usize)], r: usize| {
                    let mut span: Option<Range<usize>> = None;
                    for s in 0..nseg {
                        let v = &vis[r * nseg + s];
                        if v.is_empty() {
                            continue;
                        }
                        let (u, off) = &union[s];
                        let (a, b) = (off + v.start - u.start, off + v.end - u.start);
                        span = Some(span.map_or(a..b, |sp| sp.start..b));
                    }
                    span.unwrap_or(0..0)
                };
                let nv = nr * group;
                let heads = kvh * group..(kvh + 1) * group;
                sc.q.clear();
                for i in rows.clone() {
                    for h in heads.clone() {
                        let at = sc.q.len();
                        let qv = q.slice(s![i, h, ..]);
                        let qv = qv
                            .as_slice()
                            .expect("the last axis is contiguous (checked)");
                        sc.q.extend_from_slice(qv);
                        if k_rot && !q_rotated {
                            k.unrotate(&mut sc.q[at..]);
                        }
                    }
                }
                sc.scores.resize(nv * stride, 0.0);
                for (s, seg) in segs.iter().enumerate() {
                    let (u, off) = sc.union[s].clone();
                    for b0 in u.clone().step_by(ATTN_BLOCK) {
                        let b1 = (b0 + ATTN_BLOCK).min(u.end);
                        let stage = k_staged.then(|| (&sc.k_stage[..], sc.staged[s]));
                        let keys = rows_at(seg.keys(), stage, b0..b1, kvh, hd);
                        let dst = &mut sc.scores[off + (b0 - u.start)..];
                        k.scores_rows(&sc.q, keys, params.scale, dst, stride);
                    }
                }
                sc.stats.clear();
                for v in 0..nv {
                    let span = flat(&sc.vis, &sc.union, v / group);
                    let row = &mut sc.scores[v * stride..];
                    sc.stats.push(k.exp_sum(&mut row[span]));
                }
                // Keys stored less a key offset `t_b` (one per part: `KEY_OFFSET_BLOCK` is
                // a multiple of `ATTN_PART`) score `scale · q·t_b` higher each: the part's
                // softmax is the same, its maximum that much higher.
                if let Some(t_b) = block_pos.and_then(|p| keys.key_offset(p, kvh)) {
                    for (v, st) in sc.stats.iter_mut().enumerate() {
                        if !st.is_empty() {
                            let qv = &sc.q[v * hd..(v + 1) * hd];
                            let c: f32 = qv.iter().zip(t_b).map(|(a, b)| a * b).sum();
                            st.max += params.scale * c;
                        }
                    }
                }
                sc.acc.clear();
                sc.acc.resize(nv * hd, 0.0);
                for (s, seg) in segs.iter().enumerate() {
                    let (u, off) = sc.union[s].clone();
                    for b0 in u.clone().step_by(ATTN_BLOCK) {
                        let b1 = (b0 + ATTN_BLOCK).min(u.end);
                        let clip = |r: usize| {
                            let v = &sc.vis[r * nseg + s];
                            v.start.max(b0)..v.end.min(b1)
                        };
                        // Runs of consecutive rows that see the same slots of the block.
                        let mut r0 = 0;
                        while r0 < nr {
                            let c = clip(r0);
                            let mut r1 = r0 + 1;
                            while r1 < nr && clip(r1) == c {
                                r1 += 1;
                            }
                            if !c.is_empty() {
                                let stage = v_staged.then(|| (&sc.v_stage[..], sc.staged[s]));
                                let values = rows_at(seg.values(), stage, c.clone(), kvh, hd);
                                let p =
                                    &sc.scores[r0 * group * stride + off + (c.start - u.start)..];
                                let outs = &mut sc.acc[r0 * group * hd..r1 * group * hd];
                                k.weighted_rows(p, stride, values, outs);
                            }
                            r0 = r1;
                        }
                    }
                }
                for v in 0..nv {
                    let acc = &mut sc.acc[v * hd..(v + 1) * hd];
                    if v_rot {
                        k.unrotate(acc);
                    }
                    let (i, h) = (rows.start + v / group, kvh * group + v % group);
                    let mut o = out.index_axis_mut(Axis(0), i).index_axis_move(Axis(0), h);
                    o.as_slice_mut()
                        .expect("the last axis is contiguous (checked)")
                        .copy_from_slice(acc);
                    stats[i * n_heads + h] = sc.stats[v];
                }
            }
        }
        Ok(())
    })
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
