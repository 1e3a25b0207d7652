//! `kvcore-rayon`: a [`Backend`] that runs an inner backend's kernels on a rayon thread
//! pool.
//!
//! [`Rayon<B>`] cuts each operation along outputs that are computed independently and
//! hands every piece to the inner backend `B`:
//!
//! | op | split along | pieces call |
//! |----|-------------|-------------|
//! | `gemv`, `gemv_q8` | output rows (`W.slice_rows`, contiguous `y`) | `inner.gemv`, `inner.gemv_q8` |
//! | `gemm` | output rows of `W`; each piece fills a `[n, rows_piece]` scratch that is copied into the columns of `Y` | `inner.gemm` |
//! | `attention` | chunks of new rows × KV-head groups; with too few of those (a decode step) and an inner backend that computes attention in parts (`attention_part_len`), KV groups × parts of the keys, folded by `merge_part` in part order as the inner backend folds them (flash-decoding); else single query heads | `inner.attention`, or `inner.attention_part`, on each piece's views |
//! | `attention_batch` (several sequences) | with at least 2 jobs per thread, none over `1/(2·threads)` of the work: whole jobs; else job by job as `attention` | `inner.attention` of each job, or `attention` above |
//! | `rope` | tokens | `inner.rope` |
//! | `rms_norm` | rows | `inner.rms_norm` |
//! | `swiglu`, `geglu`, `add` | element ranges | `inner.swiglu`, `inner.geglu`, `inner.add` |
//! | `softmax`, `embed_row`, `quantize_q8` | not split | the inner op |
//!
//! It never splits inside a reduction (a dot product, a softmax sum, a sum of squares),
//! so each output is computed by exactly the code and in exactly the order the inner
//! backend would use: results are bitwise identical to `inner` at any thread count.
//! GEMM is split over weight rows rather than tokens because the token count is what a
//! backend may dispatch on (a one-token GEMM may take its GEMV path): every piece sees the
//! caller's `n`. Small operations stay serial; the thresholds (measured) and the chunk
//! alignment are documented in `split.rs`: matmul and attention from 2^15 multiply-adds,
//! SwiGLU / RMSNorm / RoPE from 2^15 elements, the add from 2^18 elements; chunk
//! boundaries at multiples of 64 rows or elements.
//!
//! ## Keeping the workers awake
//! A decode step is ~250 small parallel kernels of 20–200 µs each, separated by serial
//! ops. Between two of them an idle rayon worker soon goes to sleep, and waking it again
//! (a futex, an inter-processor interrupt in a VM) cost about as much as the work it was
//! woken for: with plain fork-joins, 2 threads decoded SmolLM2 only 1.15× faster than 1.
//! So [`Backend::scope`] (one call per forward pass) runs the pass on one worker while
//! every other worker runs a *spinner*: a loop that executes any pending pool job
//! (`rayon::yield_now`) and otherwise pauses with `spin_loop`, until the pass returns,
//! as llama.cpp's threads spin for the length of a graph. The cost is that the other
//! cores stay busy for the length of the pass. The pass starts only once every spinner
//! runs, and one such scope runs at a time per backend (others wait on a mutex): both
//! rules keep a spinner from sitting on top of unfinished work that it would then wait
//! for. Spinning pays only while every worker has a core of its own: a pool with more
//! threads than the machine runs at once (`available_parallelism`) does not spin, its
//! scope is a plain `install` (an oversubscribed spinning pool waits at every pass for
//! threads the scheduler cannot run: 128 threads on 2 cores took 20× as long).
//! `tests/integration/rayon_scope.rs` checks nesting, concurrent callers and a panicking pass.
//!
//! Assumption on `inner`: each of its outputs does not depend on how many other rows,
//! elements or heads the same call holds beyond 64-aligned tiles (for attention: each
//! (row, query head) output depends only on that row, that head and its KV head's rows).
//! The scalar and SIMD backends meet it; `tests/integration/rayon_bitwise.rs` checks them at 1, 2
//! and 3 threads.
//!
//! ## Splitting one decode step's keys
//! A decode step is one query row over 3 KV groups (SmolLM2): whole groups would leave a
//! thread with two of three, single heads re-read each group's keys three times. When the
//! inner backend computes attention in parts of the keys (`attention_part_len`, `Simd`'s
//! 256 positions), `Rayon` runs each KV group × part as a piece (`inner.attention_part`)
//! and folds each row and head's parts in position order with `kvcore::backend::merge_part`
//! and `finish_part`, as the inner backend's own `attention` does serially: at depth 4096
//! that is 51 balanced pieces, and the same bits as `inner`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod split;

pub use error::RayonError;

use kvcore::backend::{
    AttnJob, AttnParams, Backend, PartStat, Q8Acts, Rope, ShapeError, Weights, check, finish_part,
    merge_part,
};
use kvcore::kv::KvView;
use kvcore::ndarray::{ArrayView2, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, Slice};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use split::{
    ALIGN, FEW_ALIGN, FEW_TOKENS, PAR_MIN_ELEMS, PAR_MIN_MACS, PAR_MIN_STREAM, TOKEN_SPLIT_MIN,
    chunk_len,
};

/// A backend running `B`'s kernels on its own pool of worker threads.
///
/// Results are bitwise identical to `B`'s (see the crate docs).
pub struct Rayon<B: Backend> {
    inner: B,
    pool: rayon::ThreadPool,
    threads: usize,
    /// Whether [`Backend::scope`] keeps the workers spinning: `threads` fit the cores.
    spins: bool,
    /// Held for the length of a [`Backend::scope`] call.
    scope_lock: Mutex<()>,
}

impl<B: Backend> Rayon<B> {
    /// Wrap `inner` with a pool of `threads` worker threads.
    ///
    /// Errors with [`RayonError::ZeroThreads`] for `threads == 0` and
    /// [`RayonError::Pool`] when the threads cannot be started.
    pub fn new(inner: B, threads: usize) -> Result<Self, RayonError> {
        if threads == 0 {
            return Err(RayonError::ZeroThreads);
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kvcore-rayon-{i}"))
            .build()
            .map_err(|source| RayonError::Pool { threads, source })?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Rayon {
            inner,
            pool,
            threads,
            spins: threads > 1 && threads <= cores,
            scope_lock: Mutex::new(()),
        })
    }

    /// Whether a forward pass keeps the other workers spinning (see "Keeping the workers
    /// awake" in the crate docs): only when the pool has a core per thread.
    pub fn spins(&self) -> bool {
        self.spins
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// A GEMV `y ← W ·` (shapes checked): `gemv` on aligned row chunks of `w` and the
    /// matching pieces of `y` in parallel, or on the whole when it is small.
    fn split_rows(
        &self,
        w: &Weights<'_>,
        y: &mut [f32],
        gemv: impl Fn(&Weights<'_>, &mut [f32]) -> Result<(), ShapeError> + Sync,
    ) -> Result<(), ShapeError> {
        if w.rows().saturating_mul(w.cols()) < PAR_MIN_MACS {
            return gemv(w, y);
        }
        let rc = self.chunk(w.rows(), ALIGN);
        self.pool.install(|| {
            y.par_chunks_mut(rc).enumerate().try_for_each(|(i, yc)| {
                let start = i * rc;
                gemv(&w.slice_rows(start..start + yc.len()), yc)
            })
        })
    }

    /// A GEMM `y: [n, rows]` split over weight rows: each piece runs `gemm` on its rows
    /// into its worker's `[n, len]` scratch (kept between calls: a prefill's activations
    /// are megabytes, which a fresh allocation per call would fault in page by page) and
    /// copies it into its own column block of `Y`. Small products run whole.
    fn split_columns(
        &self,
        w: &Weights<'_>,
        n: usize,
        y: &mut [f32],
        gemm: impl Fn(&Weights<'_>, &mut [f32]) -> Result<(), ShapeError> + Sync,
    ) -> Result<(), ShapeError> {
        let rows = w.rows();
        if n.saturating_mul(rows).saturating_mul(w.cols()) < PAR_MIN_MACS {
            return gemm(w, y);
        }
        let rc = self.chunk(rows, if n <= FEW_TOKENS { FEW_ALIGN } else { ALIGN });
        let mut y = ArrayViewMut2::from_shape((n, rows), y).expect("checked: y is [n, rows]");
        let blocks: Vec<(usize, ArrayViewMut2<'_, f32>)> = y
            .axis_chunks_iter_mut(Axis(1), rc)
            .enumerate()
            .map(|(i, block)| (i * rc, block))
            .collect();
        self.pool.install(|| {
            blocks.into_par_iter().try_for_each(|(start, mut block)| {
                let range = start..start + block.ncols();
                GEMM_PART.with_borrow_mut(|part| {
                    // `gemm` writes every output, so old contents may stay.
                    let len = n * range.len();
                    if part.len() < len {
                        part.resize(len, 0.0);
                    }
                    let part = &mut part[..len];
                    gemm(&w.slice_rows(range.clone()), part)?;
                    let part = ArrayView2::from_shape((n, range.len()), &part[..])
                        .expect("sized just above");
                    block.assign(&part);
                    Ok(())
                })
            })
        })
    }

    /// Pieces a parallel call aims for (several per worker, for balance).
    fn tasks(&self) -> usize {
        self.threads * split::TASKS_PER_THREAD
    }

    /// Chunk length for `total` units with boundaries at multiples of `align`.
    fn chunk(&self, total: usize, align: usize) -> usize {
        chunk_len(total, self.threads, align)
    }
}

thread_local! {
    /// A worker's piece of a GEMM output, `[n, len]`, reused by every call on that worker.
    static GEMM_PART: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };

    /// The parts of a split attention call, `[parts, n_kv_heads, n, group, head_dim]`, and
    /// their states `[parts, n_kv_heads, n, group]`, on the calling thread.
    static ATTN_PARTS: std::cell::RefCell<(Vec<f32>, Vec<PartStat>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl<B: Backend> Rayon<B> {
    /// Attention (shapes checked) as pieces of one KV group × one part of `part` slots
    /// of the view, each `inner.attention_part` on a worker, then folded per row and head
    /// in part order by `merge_part` and normalised by `finish_part`: what the inner
    /// backend's own `attention` does serially (its `attention_part_len` promise), so the
    /// result is the same bits.
    fn attention_in_parts(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        mut out: ArrayViewMut3<'_, f32>,
        part: usize,
    ) -> Result<(), ShapeError> {
        let (n, n_heads, hd) = q.dim();
        let n_kv = kv.n_kv_heads();
        let group = n_heads / n_kv;
        let span = kv.span();
        let (first, piece) = (span.start / part, n * group);
        let parts = span.end.div_ceil(part) - first;
        ATTN_PARTS.with_borrow_mut(|(outs, stats)| {
            outs.resize(parts * n_kv * piece * hd, 0.0);
            stats.resize(parts * n_kv * piece, PartStat::EMPTY);
            let pieces: Vec<_> = (outs.chunks_exact_mut(piece * hd))
                .zip(stats.chunks_exact_mut(piece))
                .enumerate()
                .map(|(idx, (o, st))| {
                    let (p, kvh) = (idx / n_kv, idx % n_kv);
                    let positions = (first + p) * part..(first + p + 1) * part;
                    let heads = kvh * group..(kvh + 1) * group;
                    (heads, kv.at_positions(positions).heads(kvh..kvh + 1), o, st)
                })
                .collect();
            self.pool.install(|| {
                pieces.into_par_iter().try_for_each(|(heads, kv, o, st)| {
                    let qp = q.slice_axis(Axis(1), Slice::from(heads));
                    let o = ArrayViewMut3::from_shape((n, group, hd), o)
                        .expect("a piece holds n · group · head_dim");
                    self.inner.attention_part(qp, q_pos, &kv, params, o, st)
                })
            })?;
            for i in 0..n {
                for h in 0..n_heads {
                    let (kvh, g) = (h / group, h % group);
                    let mut o = out.index_axis_mut(Axis(0), i).index_axis_move(Axis(0), h);
                    let o = o
                        .as_slice_mut()
                        .expect("the last axis is contiguous (checked)");
                    let mut acc = PartStat::EMPTY;
                    for p in 0..parts {
                        let at = (p * n_kv + kvh) * piece + i * group + g;
                        merge_part(&mut acc, o, stats[at], &outs[at * hd..(at + 1) * hd]);
                    }
                    finish_part(acc, o);
                }
            }
            Ok(())
        })
    }
}

impl<B: Backend> Backend for Rayon<B> {
    fn name(&self) -> &'static str {
        "rayon"
    }

    // What the inner backend's kernels decide alone: the kernel path, quantising one
    // token's activations, whether rows stand alone, and the attention parts (which
    // `attention` itself spreads over the threads).
    kvcore::forward_backend!(|r| &r.inner;
        kernel_path, quantize_q8, gemm_rows_alone_from, attention_part_len, attention_part,
        softmax);

    fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on a worker of this backend's pool while every other worker spins,
    /// waiting for the kernels' pieces (see "Keeping the workers awake" in the crate
    /// docs).
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // One worker, more workers than cores, or already on one of ours (a nested scope,
        // or `f` calling a kernel's own `install`): nothing to keep awake, spinning would
        // take the cores from the workers with work, or already awake.
        if !self.spins || self.pool.current_thread_index().is_some() {
            return self.pool.install(f);
        }
        // One spinning scope at a time: two scopes' spinners could each sit on top of
        // the other's unfinished work and wait for each other forever.
        let _one_at_a_time = self
            .scope_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let spinning = AtomicUsize::new(0);
        let done = AtomicBool::new(false);
        let (spinning, done) = (&spinning, &done);
        self.pool.scope(|s| {
            let owner = rayon::current_thread_index();
            s.spawn_broadcast(move |_, ctx| {
                if Some(ctx.index()) == owner {
                    return;
                }
                spinning.fetch_add(1, Ordering::AcqRel);
                let mut idle = 0;
                while !done.load(Ordering::Acquire) {
                    run_one_or_pause(&mut idle);
                }
            });
            // `f` starts only once every other worker sits in its spinner. A worker that
            // had first stolen a piece of `f`'s work could otherwise start its spinner
            // inside that piece's join and never return to finish it.
            let mut idle = 0;
            while spinning.load(Ordering::Acquire) < self.threads - 1 {
                run_one_or_pause(&mut idle);
            }
            let _done = SetOnDrop(done);
            f()
        })
    }

    /// `rayon::join` on this backend's pool: `b` waits on the calling worker's deque
    /// while it runs `a`, for the other workers to take (and each op's own pieces
    /// likewise), so the two ops share one region of work instead of two in a row.
    fn join<A: Send, C: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> C + Send,
    ) -> (A, C) {
        if self.threads == 1 {
            return (a(), b());
        }
        self.pool.install(|| rayon::join(a, b))
    }

    fn gemv(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemv(w, x, y)?;
        self.split_rows(w, y, |w, y| self.inner.gemv(w, x, y))
    }

    fn gemv_q8(&self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) -> Result<(), ShapeError> {
        check::gemv_q8(w, x, y)?;
        self.split_rows(w, y, |w, y| self.inner.gemv_q8(w, x, y))
    }

    fn gemm_q8(&self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) -> Result<(), ShapeError> {
        let n = check::gemm_q8(w, x, y)?;
        self.split_columns(w, n, y, |w, part| self.inner.gemm_q8(w, x, part))
    }

    /// A prefill's GEMM of at least 512 tokens (`split::TOKEN_SPLIT_MIN`), when the
    /// inner backend's rows stand alone ([`Backend::gemm_rows_alone_from`]), is split over
    /// tokens: each piece packs only its own activations and writes its own rows of `Y`
    /// in place. Any other GEMM is split over weight rows, as the other matmuls are.
    fn gemm(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        let n = check::gemm(w, x, y)?;
        let alone = self.inner.gemm_rows_alone_from();
        if let Some(chunk) = alone.and_then(|m| token_chunk(n, self.threads, m)) {
            let (cols, rows) = (w.cols(), w.rows());
            return self.pool.install(|| {
                (x.par_chunks(chunk * cols))
                    .zip(y.par_chunks_mut(chunk * rows))
                    .try_for_each(|(xc, yc)| self.inner.gemm(w, xc, yc))
            });
        }
        self.split_columns(w, n, y, |w, part| self.inner.gemm(w, x, part))
    }

    fn rope(
        &self,
        x: &mut [f32],
        head_dim: usize,
        positions: &[usize],
        rope: &Rope,
    ) -> Result<(), ShapeError> {
        check::rope(x, head_dim, positions)?;
        if x.len() < PAR_MIN_ELEMS {
            return self.inner.rope(x, head_dim, positions, rope);
        }
        // Non-empty and at least one position, by the check and the threshold.
        let row_len = x.len() / positions.len();
        let tc = self.chunk(positions.len(), 1);
        self.pool.install(|| {
            x.par_chunks_mut(tc * row_len)
                .zip(positions.par_chunks(tc))
                .try_for_each(|(xc, pc)| self.inner.rope(xc, head_dim, pc, rope))
        })
    }

    fn attention(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError> {
        check::attention(&q, q_pos, kv, &out)?;
        let (n, n_heads, hd) = q.dim();
        let macs = attention_macs(q_pos, kv, params, n_heads * hd);
        if macs < PAR_MIN_MACS {
            return self.inner.attention(q, q_pos, kv, params, out);
        }
        let rows = self.chunk(n, 1);
        let few = n.div_ceil(rows) * kv.n_kv_heads() < self.tasks();
        let span = kv.span();
        let parted = |p: usize| few && span.end > span.start / p * p + p;
        if let Some(part) = self.inner.attention_part_len().filter(|&p| parted(p)) {
            return self.attention_in_parts(q, q_pos, kv, params, out, part);
        }
        let pieces = attention_pieces(q, q_pos, kv, out, rows, self.tasks());
        self.pool.install(|| {
            pieces.into_par_iter().try_for_each(|(q, q_pos, kv, out)| {
                self.inner.attention(q, q_pos, &kv, params, out)
            })
        })
    }

    /// Many small sequences (a batched decode step: one row each over a short cache) go
    /// over the threads whole, each its inner backend's `attention` (the same bits as
    /// this backend's, see the crate docs): one dispatch for the batch instead of one per
    /// sequence, each of which would split a few hundred keys. A batch with few jobs, or
    /// with one large enough to leave a thread idle (more than `1/(2·threads)` of the
    /// work), runs job by job through [`Backend::attention`]'s own split.
    fn attention_batch(
        &self,
        jobs: &mut [AttnJob<'_>],
        params: &AttnParams,
    ) -> Result<(), ShapeError> {
        let mut macs = Vec::with_capacity(jobs.len());
        for j in jobs.iter() {
            check::attention(&j.q, j.q_pos, j.kv, &j.out)?;
            let (_, n_heads, hd) = j.q.dim();
            macs.push(attention_macs(j.q_pos, j.kv, params, n_heads * hd));
        }
        let total = macs.iter().fold(0usize, |a, &m| a.saturating_add(m));
        let largest = macs.iter().copied().max().unwrap_or(0);
        let spread = 2 * self.threads;
        if jobs.len() < spread || largest.saturating_mul(spread) > total {
            for j in jobs.iter_mut() {
                self.attention(j.q.view(), j.q_pos, j.kv, params, j.out.view_mut())?;
            }
            return Ok(());
        }
        self.pool.install(|| {
            jobs.par_iter_mut().try_for_each(|j| {
                (self.inner).attention(j.q.view(), j.q_pos, j.kv, params, j.out.view_mut())
            })
        })
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        check::rms_norm(x, weight, out)?;
        if x.len() < PAR_MIN_ELEMS {
            return self.inner.rms_norm(x, weight, eps, out);
        }
        let d = weight.len();
        let rc = self.chunk(x.len() / d, 1);
        self.pool.install(|| {
            x.par_chunks(rc * d)
                .zip(out.par_chunks_mut(rc * d))
                .try_for_each(|(xc, oc)| self.inner.rms_norm(xc, weight, eps, oc))
        })
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("swiglu up", gate.len(), up.len())?;
        check::same_len("swiglu out", gate.len(), out.len())?;
        if gate.len() < PAR_MIN_ELEMS {
            return self.inner.swiglu(gate, up, out);
        }
        let c = self.chunk(gate.len(), ALIGN);
        self.pool.install(|| {
            gate.par_chunks(c)
                .zip(up.par_chunks(c))
                .zip(out.par_chunks_mut(c))
                .try_for_each(|((g, u), o)| self.inner.swiglu(g, u, o))
        })
    }

    fn geglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        check::same_len("geglu up", gate.len(), up.len())?;
        check::same_len("geglu out", gate.len(), out.len())?;
        if gate.len() < PAR_MIN_ELEMS {
            return self.inner.geglu(gate, up, out);
        }
        let c = self.chunk(gate.len(), ALIGN);
        self.pool.install(|| {
            gate.par_chunks(c)
                .zip(up.par_chunks(c))
                .zip(out.par_chunks_mut(c))
                .try_for_each(|((g, u), o)| self.inner.geglu(g, u, o))
        })
    }

    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), ShapeError> {
        check::same_len("add x", acc.len(), x.len())?;
        if acc.len() < PAR_MIN_STREAM {
            return self.inner.add(acc, x);
        }
        let c = self.chunk(acc.len(), ALIGN);
        self.pool.install(|| {
            acc.par_chunks_mut(c)
                .zip(x.par_chunks(c))
                .try_for_each(|(a, b)| self.inner.add(a, b))
        })
    }

    fn embed_row(
        &self,
        table: &Weights<'_>,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        check::embed_row(table, row, out)?;
        self.inner.embed_row(table, row, out)
    }
}

/// Tokens per piece of a GEMM split over tokens, or `None` to split it over weight rows:
/// `n ≥ TOKEN_SPLIT_MIN` tokens (and `threads > 1`) are cut into `2 · threads` pieces of
/// `⌈n / pieces⌉` (fewer where a piece would fall under `TOKEN_SPLIT_MIN / 4` tokens), so
/// every piece, the last included, keeps at least `alone_from` tokens.
fn token_chunk(n: usize, threads: usize, alone_from: usize) -> Option<usize> {
    if threads < 2 || n < TOKEN_SPLIT_MIN {
        return None;
    }
    let pieces = (2 * threads).min(n / (TOKEN_SPLIT_MIN / 4)).max(1);
    let chunk = n.div_ceil(pieces);
    // The last piece holds `n − (k − 1)·chunk ≥ n/pieces − pieces` tokens.
    let last = n - (n.div_ceil(chunk) - 1) * chunk;
    (last >= alone_from.max(1)).then_some(chunk)
}

/// Idle polls of a spinner between two `sched_yield`s.
const SPINS_PER_YIELD: u32 = 64;

/// Multiply-adds of one attention call: over its rows, the slots each sees, times
/// `width` (heads × head_dim).
fn attention_macs(q_pos: &[usize], kv: &KvView<'_>, params: &AttnParams, width: usize) -> usize {
    let keys_seen: usize = (q_pos.iter())
        .map(|&p| {
            let seen = kv
                .segments()
                .iter()
                .map(|s| s.visible(p, params.mask).len());
            seen.sum::<usize>()
        })
        .fold(0, usize::saturating_add);
    keys_seen.saturating_mul(width)
}

/// Run one piece of pending pool work if there is any, else pause: a `spin_loop` hint,
/// and every [`SPINS_PER_YIELD`]-th idle poll a `sched_yield`, so that a pool with more
/// threads than free cores still lets the thread with the real work run.
fn run_one_or_pause(idle: &mut u32) {
    if rayon::yield_now() == Some(rayon::Yield::Executed) {
        *idle = 0;
        return;
    }
    *idle += 1;
    if idle.is_multiple_of(SPINS_PER_YIELD) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Sets its flag when dropped, also when `f` panics, so the spinners stop.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// One piece of an attention call: its query rows and heads, their positions, the KV
/// heads they read, and their part of the output.
type AttnPiece<'q, 'p, 'v, 'o> = (
    ArrayView3<'q, f32>,
    &'p [usize],
    KvView<'v>,
    ArrayViewMut3<'o, f32>,
);

/// Cuts an attention call (shapes checked) into pieces of `rows` query rows and a block
/// of query heads with the KV heads they read: whole groups when that gives at least
/// `tasks` pieces, else single query heads (one KV head each). Every piece is an
/// attention call of its own whose outputs are those of the whole call.
fn attention_pieces<'q, 'p, 'v, 'o>(
    q: ArrayView3<'q, f32>,
    q_pos: &'p [usize],
    kv: &KvView<'v>,
    out: ArrayViewMut3<'o, f32>,
    rows: usize,
    tasks: usize,
) -> Vec<AttnPiece<'q, 'p, 'v, 'o>> {
    let (n, n_heads, _) = q.dim();
    let group = n_heads / kv.n_kv_heads();
    let whole_groups = n.div_ceil(rows) * kv.n_kv_heads() >= tasks;
    let block = if whole_groups { group } else { 1 };
    let mut pieces = Vec::new();
    let mut out_rest = out;
    for r0 in (0..n).step_by(rows) {
        let r1 = (r0 + rows).min(n);
        let (mut out_rows, tail) = out_rest.split_at(Axis(0), r1 - r0);
        out_rest = tail;
        for h0 in (0..n_heads).step_by(block) {
            let (out_piece, tail) = out_rows.split_at(Axis(1), block);
            out_rows = tail;
            let kv_heads = h0 / group..(h0 + block).div_ceil(group);
            let q_piece = q
                .slice_axis_move(Axis(0), Slice::from(r0..r1))
                .slice_axis_move(Axis(1), Slice::from(h0..h0 + block));
            pieces.push((q_piece, &q_pos[r0..r1], kv.heads(kv_heads), out_piece));
        }
    }
    pieces
}
