//! How the work is cut: size thresholds below which an op stays serial, and aligned chunk
//! lengths.
//!
//! A parallel call costs a fork-join. Inside `Backend::scope`
//! (every forward pass) the other workers spin, so a fork-join is a steal from a busy
//! deque, a few µs; outside it, a worker may first have to be woken (10–20 µs measured on
//! the shared 2-core development machine). An op goes parallel where its serial time is
//! several times that:
//! - matmul and attention from [`PAR_MIN_MACS`] = 2^15 multiply-adds (`rows·cols` for
//!   GEMV, `n·rows·cols` for GEMM, `Σ n_keys·head_dim` over the (row, head) pairs of
//!   attention). The AVX2 quantised GEMV runs ~0.1 ns per multiply-add (SmolLM2's
//!   `[1536, 576]` Q4_1 in ~85 µs), so 2^15 is ~3 µs of AVX2 work, ~30 µs of scalar
//!   work. Every SmolLM2 decode GEMV is parallel, including the `[192, 576]` K/V
//!   projections (110 k), which were serial at the previous 2^18 and left one core idle
//!   for ~10 % of a decode step.
//! - SwiGLU, RMSNorm and RoPE from [`PAR_MIN_ELEMS`] = 2^15 elements: they cost an `exp`,
//!   a square root or a sine per element or row, ~6 ns per element for SwiGLU (2^15
//!   elements in 210 µs). A decode token's activations (576 or 1536 floats) stay serial,
//!   a prefill batch does not.
//! - the residual add from [`PAR_MIN_STREAM`] = 2^18 elements: it is bound by memory
//!   bandwidth at ~0.15 ns per element (2^15 in 4 µs), so only large batches gain.
//!
//! Chunk boundaries (in rows or elements) are multiples of [`ALIGN`] = 64, so an inner
//! backend that runs a vector body plus a scalar tail, or row tiles/panels of up to 64,
//! sees the same tails and tiles in every chunk as it would in the whole operand: its
//! result for each element is then the same bits whatever the thread count. About 8
//! chunks per thread: a `[576, ·]` GEMV is then 9 chunks of 64 rows (5 + 4 on 2
//! threads, 11 % over an even split) rather than 5 chunks of 128 (3 + 2, or 2.5 + 2 by
//! rows: 22 % over).

/// Minimum multiply-adds for a parallel matmul or attention call.
pub(crate) const PAR_MIN_MACS: usize = 1 << 15;

/// Minimum elements for a parallel SwiGLU, RMSNorm or RoPE call.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 15;

/// Minimum elements for a parallel residual add (memory bound).
pub(crate) const PAR_MIN_STREAM: usize = 1 << 18;

/// Chunk boundaries are multiples of this many rows or elements.
pub(crate) const ALIGN: usize = 64;

/// Row chunk boundaries of a GEMM of at most [`FEW_TOKENS`] tokens (a batch of decode
/// steps) are multiples of this many rows: every output row of a matmul depends on its
/// weight row alone in every backend (documented by each), so the chunks need no tile
/// alignment, and finer ones balance the narrow matrices, each several times a GEMV's
/// work: SmolLM2's `[192, 576]` K/V projections are 3 chunks of 64 (2 + 1 on 2 threads,
/// a third over an even split) but 12 of 16, its `[576, ·]` ones 9 of 64 (5 + 4) but
/// 12 of 48. (Larger GEMMs keep [`ALIGN`]: `sgemm` packs the activations once per chunk.)
pub(crate) const FEW_ALIGN: usize = 16;

/// The most tokens of a GEMM split at [`FEW_ALIGN`] (16 sequences decoding together).
pub(crate) const FEW_TOKENS: usize = 16;

/// The fewest tokens of a GEMM split over tokens instead of weight rows (when the inner
/// backend allows it, `Backend::gemm_rows_alone_from`). Split over weight rows, every
/// piece's `sgemm` packs all of `X` again: `[4096, 576]` f32 activations are 9.4 MB,
/// packed by each of 9–12 pieces per matmul (`pack_avx2` 9 % of a 4096-token prefill),
/// and SmolLM2's `[192, 576]` K/V projections are 3 pieces on 2 threads. Over tokens,
/// each piece packs its own rows once and decodes the weights once more (one more pass
/// over them per piece, small beside `n` products per weight).
pub(crate) const TOKEN_SPLIT_MIN: usize = 512;

/// Tasks per worker thread, so that uneven progress (a shared machine, tails) balances.
pub(crate) const TASKS_PER_THREAD: usize = 8;

/// Length of each chunk when `total` units are cut for `threads` workers: about
/// `total / (8·threads)`, rounded up to a multiple of `align` (at least `align`, at least
/// 1).
pub(crate) fn chunk_len(total: usize, threads: usize, align: usize) -> usize {
    let align = align.max(1);
    let tasks = threads.max(1) * TASKS_PER_THREAD;
    total.div_ceil(tasks).div_ceil(align).max(1) * align
}
