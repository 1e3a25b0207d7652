//! One forward pass over several sequences: [`Llama::forward_batch`].
//!
//! Each [`BatchSeq`] is a store, the tokens to append to it at its own end (`kv.len()`)
//! and the logits it wants back. The sequences may be at different depths and bring
//! different numbers of tokens — one-token decode steps and prefill chunks in the same
//! pass. Their new tokens are stacked into one `[N, d_model]` residual stream (`N` the
//! sum of their tokens, in batch order), and every step that does not mix positions runs
//! once over all `N` rows, through the same layer loop as [`Llama::forward`] (a single
//! sequence is a batch of one):
//!
//! ```text
//! x: [N, d_model] = embed(tokens of seq 0 ‖ seq 1 ‖ …)
//! per block:
//!   q, k, v = norm(x) W…ᵀ               one GEMM over N rows: each weight read once
//!   rope(q), rope(k)                     each row at its own sequence's position
//!   per sequence i (rows r_i):
//!     K/V rows of r_i → seq i's append   (its own open transaction)
//!   attention_batch: for every sequence i (one call; a parallel backend spreads them)
//!     att[r_i] = attention(q[r_i], view of seq i's store, its positions)
//!   x += att Woᵀ; x += FFN(norm(x))      one GEMM each over N rows
//! logits: the rows each sequence asked for (Last/All/None), one norm and one GEMM
//! ```
//!
//! With [`Activations::Q8`](super::Activations::Q8) each sequence's rows take the 8-bit
//! path when that sequence brings at most [`Q8_MAX_TOKENS`](super::Q8_MAX_TOKENS) tokens —
//! exactly when it would alone — so a batch of decode steps runs every block-quantised
//! matrix once through `gemm_q8` over all of them (each row bit for bit its token's
//! GEMV), whatever the batch size; a longer prefill chunk's rows take the f32 GEMM, and a
//! batch holding both reads such a matrix twice, once per path.
//!
//! ## What equals running each sequence alone
//! Every kernel but the matmuls computes a row from that row alone (RMSNorm, RoPE, the
//! GLU, the residual add, the 8-bit quantiser) and attention runs per sequence over its
//! own view, so a sequence's rows differ from its alone pass only where a matmul's row
//! depends on the other rows of its call:
//! - **bit for bit** when the matmuls' rows are — the scalar reference (GEMM row `t` is
//!   its GEMV bit for bit, documented), and 8-bit activations: the rows of sequences of
//!   at most `Q8_MAX_TOKENS` tokens go through `gemm_q8` (documented bit for bit their
//!   GEMVs); a longer chunk's rows go through the f32 GEMM with the other long chunks'
//!   rows only, and the SIMD `sgemm` (more than 8 rows) gave every row the bits of its
//!   alone call in every test (`tests/integration/batch.rs`), though no kernel documents it;
//! - **within rounding** otherwise: the SIMD f32 GEMV, the few-token GEMM and `sgemm`
//!   add their products in different orders, so a decode step in a batch (a GEMM row)
//!   and alone (a GEMV) differ in the last bits, held to the golden tolerance (0.01 on a
//!   logit; `tests/integration/batch.rs` measures it).
//!
//! ## Transactions
//! Every sequence's append is opened before any computation; an error anywhere — a bad
//! token id or a store of the wrong geometry in any sequence (checked before anything
//! is opened), a context overflow or refused allocation in one store, a kernel's error
//! in any layer — drops them all, so every store of the batch is exactly as before. The
//! commits come last, after every logit is computed; a store honouring the `KvStore`
//! contract cannot fail one (every layer is written, every allocation happened in
//! `begin`).

use super::llama::Span;
use super::{Llama, Logits, ModelError};
use crate::backend::Backend;
use crate::kv::{Append, KvStore};
use ndarray::Array2;

/// One sequence of a [`Llama::forward_batch`]: its store, the tokens to append at the
/// store's end, and which logits to return.
///
/// `K` may be `dyn KvStore` to batch stores of different kinds. Two entries cannot
/// share a store: each holds it by `&mut`.
#[derive(Debug)]
pub struct BatchSeq<'a, K: KvStore + ?Sized> {
    /// The sequence's KV store; the tokens go at positions `kv.len() ..`.
    pub kv: &'a mut K,
    /// The new tokens (may be empty: the sequence then takes no part and its store is
    /// not touched).
    pub tokens: &'a [u32],
    /// Which rows of logits to return for this sequence.
    pub logits: Logits,
}

impl<'a, K: KvStore + ?Sized> BatchSeq<'a, K> {
    /// `tokens` for `kv`, returning `logits`.
    pub fn new(kv: &'a mut K, tokens: &'a [u32], logits: Logits) -> Self {
        BatchSeq { kv, tokens, logits }
    }
}

impl<B: Backend> Llama<B> {
    /// Runs every sequence's tokens through the model in one pass, appending each
    /// sequence's K and V rows to its own store at positions `kv.len() ..`, and returns
    /// each sequence's requested logits (`[rows, vocab]`, in batch order) as
    /// [`forward`](Self::forward) would for it alone — bit for bit or within rounding,
    /// as the [module docs](self) state.
    ///
    /// The matmuls run once over all the sequences' new tokens; attention runs per
    /// sequence over its own store. A sequence with no tokens gets `[0, vocab]` and its
    /// store is not touched; an empty batch returns an empty vector.
    ///
    /// One transaction over every store: on any error, no store changes. Errors that
    /// belong to one sequence — its store's geometry or window
    /// ([`ModelError::KvGeometry`], [`ModelError::KvWindow`]), a token id outside the
    /// vocabulary ([`ModelError::TokenOutOfRange`]), its append refused
    /// ([`KvError::ContextOverflow`](crate::kv::KvError::ContextOverflow),
    /// [`KvError::AllocFailed`](crate::kv::KvError::AllocFailed), …) — come as
    /// [`ModelError::Sequence`] naming its index; the first such sequence is reported. A
    /// kernel's error comes as it is ([`ModelError::Shape`]).
    pub fn forward_batch<K: KvStore + ?Sized>(
        &self,
        seqs: &mut [BatchSeq<'_, K>],
    ) -> Result<Vec<Array2<f32>>, ModelError> {
        let in_seq = |index: usize| {
            move |error: ModelError| ModelError::Sequence {
                index,
                error: Box::new(error),
            }
        };
        for (index, seq) in seqs.iter().enumerate() {
            self.check_inputs(&*seq.kv, seq.tokens)
                .map_err(in_seq(index))?;
        }
        let vocab = self.config().vocab_size;
        // The sequences that bring tokens, their rows in the stacked batch.
        let mut active = Vec::new(); // batch indices
        let mut spans = Vec::new();
        let mut tokens = Vec::new(); // [N]
        for (index, seq) in seqs.iter().enumerate() {
            if seq.tokens.is_empty() {
                continue;
            }
            let start = tokens.len();
            tokens.extend_from_slice(seq.tokens);
            active.push(index);
            spans.push(Span {
                at: seq.kv.len(),
                rows: start..tokens.len(),
            });
        }
        let mut out: Vec<Array2<f32>> = seqs.iter().map(|_| Array2::zeros((0, vocab))).collect();
        if active.is_empty() {
            return Ok(out);
        }
        let logits: Vec<Logits> = active.iter().map(|&i| seqs[i].logits).collect();
        let results = self.backend().scope(|| {
            // Open every append before computing anything; an early return drops those
            // opened so far, rolling them back.
            let mut txs = Vec::with_capacity(active.len());
            for (seq_index, seq) in seqs.iter_mut().enumerate() {
                if seq.tokens.is_empty() {
                    continue;
                }
                let at = seq.kv.len();
                let tx = Append::begin(&mut *seq.kv, at, seq.tokens.len())
                    .map_err(|e| in_seq(seq_index)(e.into()))?;
                txs.push(tx);
            }
            self.pass(txs, &spans, &tokens, &logits)
        })?;
        for (index, result) in active.into_iter().zip(results) {
            out[index] = result;
        }
        Ok(out)
    }
}
