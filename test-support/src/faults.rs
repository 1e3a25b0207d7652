//! Fault injection for the transaction tests: a backend whose `k`-th kernel call fails
//! with a shape error ([`FailingBackend`]) and an allocation gate that refuses the `k`-th
//! allocation a store asks for ([`RefuseNth`]). Both count from 1; with `k = 0` nothing
//! fails and they only count, so a clean run tells how many calls there are to fail.

use std::sync::atomic::{AtomicUsize, Ordering};

use kvcore::backend::{Backend, ShapeError};
use kvcore::kv::AllocGate;

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
    kvcore::forward_backend!(|f| &f.inner;
        name, threads, kernel_path, scope, join, gemm_rows_alone_from, attention_part_len,
        softmax);
    // The fallible kernel calls, each counted (and the armed one failed) first.
    kvcore::forward_backend!(|f| { f.check()?; &f.inner };
        attention_part, gemv, quantize_q8, gemv_q8, gemm_q8, gemm, rope, attention, rms_norm,
        swiglu, geglu, add, embed_row);
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
