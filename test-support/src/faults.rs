//! Fault injection for the transaction tests: a backend whose `k`-th kernel call fails
//! with a shape error ([`FailingBackend`]) and an allocation gate that refuses the `k`-th
//! allocation a store asks for ([`RefuseNth`]). Both count from 1; with `k = 0` nothing
//! fails and they only count, so a clean run tells how many calls there are to fail.

use std::sync::atomic::{AtomicUsize, Ordering};

use kvcore::backend::{AttnParams, Backend, PartStat, Q8Acts, Q8Layout, Rope, ShapeError, Weights};
use kvcore::kv::{AllocGate, KvView};
use kvcore::ndarray::{ArrayView3, ArrayViewMut3};

/// The shape error a [`FailingBackend`] injects.
pub const INJECTED: ShapeError = ShapeError::Geometry("injected fault");

/// A call counter that fails call number `fail_at` (from 1; 0: never).
#[derive(Debug, Default)]
struct Counter {
    fail_at: AtomicUsize,
    calls: AtomicUsize,
}

impl Counter {
    /// Counts a call; `true` when it is the one to fail.
    fn fails(&self) -> bool {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        n == self.fail_at.load(Ordering::Relaxed)
    }

    fn reset(&self, fail_at: usize) {
        self.calls.store(0, Ordering::Relaxed);
        self.fail_at.store(fail_at, Ordering::Relaxed);
    }
}

/// Wraps a backend and fails its `k`-th fallible kernel call with [`INJECTED`] (before
/// touching any output), as a shape error in the middle of a forward pass would. Every
/// other method forwards to the inner backend (its threads, kernel path and attention
/// parts), so the wrapped backend computes exactly as the inner one; `attention_batch`
/// keeps the default, one checked `attention` per job.
#[derive(Debug)]
pub struct FailingBackend<B> {
    inner: B,
    counter: Counter,
}

impl<B: Backend> FailingBackend<B> {
    /// `inner`, counting calls and failing none until [`arm`](Self::arm).
    pub fn new(inner: B) -> Self {
        FailingBackend {
            inner,
            counter: Counter::default(),
        }
    }

    /// Restarts the count; the `k`-th call from now fails (`k = 0`: none).
    pub fn arm(&self, k: usize) {
        self.counter.reset(k);
    }

    /// Fallible kernel calls since the last [`arm`](Self::arm).
    pub fn calls(&self) -> usize {
        self.counter.calls.load(Ordering::Relaxed)
    }

    fn check(&self) -> Result<(), ShapeError> {
        if self.counter.fails() {
            Err(INJECTED)
        } else {
            Ok(())
        }
    }
}

impl<B: Backend> Backend for FailingBackend<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    fn kernel_path(&self) -> &'static str {
        self.inner.kernel_path()
    }
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.inner.scope(f)
    }
    fn join<A: Send, C: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> C + Send,
    ) -> (A, C) {
        self.inner.join(a, b)
    }
    fn gemm_rows_alone_from(&self) -> Option<usize> {
        self.inner.gemm_rows_alone_from()
    }
    fn attention_part_len(&self) -> Option<usize> {
        self.inner.attention_part_len()
    }
    fn attention_part(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
        stats: &mut [PartStat],
    ) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.attention_part(q, q_pos, kv, params, out, stats)
    }
    fn gemv(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.gemv(w, x, y)
    }
    fn quantize_q8(&self, layout: Q8Layout, x: &[f32], out: &mut Q8Acts) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.quantize_q8(layout, x, out)
    }
    fn gemv_q8(&self, w: &Weights<'_>, x: &Q8Acts, y: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.gemv_q8(w, x, y)
    }
    fn gemm_q8(&self, w: &Weights<'_>, x: &[Q8Acts], y: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.gemm_q8(w, x, y)
    }
    fn gemm(&self, w: &Weights<'_>, x: &[f32], y: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.gemm(w, x, y)
    }
    fn rope(
        &self,
        x: &mut [f32],
        head_dim: usize,
        positions: &[usize],
        rope: &Rope,
    ) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.rope(x, head_dim, positions, rope)
    }
    fn attention(
        &self,
        q: ArrayView3<'_, f32>,
        q_pos: &[usize],
        kv: &KvView<'_>,
        params: &AttnParams,
        out: ArrayViewMut3<'_, f32>,
    ) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.attention(q, q_pos, kv, params, out)
    }
    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.rms_norm(x, weight, eps, out)
    }
    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.swiglu(gate, up, out)
    }
    fn geglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.geglu(gate, up, out)
    }
    fn add(&self, acc: &mut [f32], x: &[f32]) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.add(acc, x)
    }
    fn softmax(&self, x: &mut [f32]) {
        self.inner.softmax(x)
    }
    fn embed_row(
        &self,
        table: &Weights<'_>,
        row: usize,
        out: &mut [f32],
    ) -> Result<(), ShapeError> {
        self.check()?;
        self.inner.embed_row(table, row, out)
    }
}

/// An [`AllocGate`] that refuses the `k`-th allocation it is asked about.
#[derive(Debug, Default)]
pub struct RefuseNth {
    counter: Counter,
}

impl RefuseNth {
    /// A gate refusing the `k`-th allocation from now (`k = 0`: none).
    pub fn new(k: usize) -> Self {
        let gate = RefuseNth::default();
        gate.arm(k);
        gate
    }

    /// Restarts the count; the `k`-th allocation from now is refused (`k = 0`: none).
    pub fn arm(&self, k: usize) {
        self.counter.reset(k);
    }

    /// Allocations asked for since the last [`arm`](Self::arm).
    pub fn calls(&self) -> usize {
        self.counter.calls.load(Ordering::Relaxed)
    }
}

impl AllocGate for RefuseNth {
    fn admit(&self, _bytes: usize) -> bool {
        !self.counter.fails()
    }
}
