//! Sessions: a KV store and the token ids it holds, so that a conversation's next turn
//! reuses every cached position it shares with the last.
//!
//! [`Session::prefill`] takes the whole conversation so far (not just the new turn),
//! finds the longest common prefix with the ids the session holds and runs the model on
//! the rest only, replacing the session's tail from the first difference in one
//! transaction ([`Llama::forward_from`]): a failed prefill leaves the session as it was.
//! When the new ids add nothing, the last of them is run again, so the logits of the
//! last position are always produced (as llama.cpp's server does). Given the same ids in
//! the same passes, a session's logits are bitwise those of a fresh one; a different
//! split into passes changes only the matmuls' rounding.
//!
//! A store that evicts (a sliding-window [`WindowKv`](crate::WindowKv)) may not be able
//! to go back to the first difference: the session then goes back to the nearest
//! position before it the store can rewind to ([`Session::rewind_point`]): a window
//! checkpoint ([`Checkpoints`](crate::kv::Checkpoints)) when the store keeps them, else
//! 0, and runs the model from there. The logits are then bitwise those of a fresh
//! session given the same passes (the original ones up to that position, then the
//! re-prefill).
//!
//! Invariant: the store holds exactly positions `0 .. tokens().len()`, position `i`
//! holding the rows of `tokens()[i]`.
//!
//! A session survives the process in a file ([`file`](mod@file)): [`Session::save`] writes it,
//! [`Session::load`] and [`Session::restore`] read it back, checking all of it first.

pub mod file;

pub use file::SessionError;

use crate::backend::Backend;
use crate::kv::{GrowKv, KvError, KvStore};
use crate::model::{Llama, Logits, ModelError};

/// A KV store plus the token ids whose rows it holds.
#[derive(Debug)]
pub struct Session<K: KvStore = GrowKv> {
    kv: K,
    tokens: Vec<u32>,
}

/// What one [`Session::prefill`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefill {
    /// The logits of the last position, `[vocab]`.
    pub logits: Vec<f32>,
    /// Positions kept from before (the common prefix, less one when the new ids added
    /// nothing).
    pub reused: usize,
    /// Positions run through the model.
    pub prefilled: usize,
}

impl<K: KvStore> Session<K> {
    /// An empty session on `kv` (cleared first).
    pub fn new(mut kv: K) -> Self {
        kv.clear();
        Session {
            kv,
            tokens: Vec::new(),
        }
    }

    /// The ids held, one per cached position.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The store (read-only: its contents must stay in step with the ids).
    pub fn kv(&self) -> &K {
        &self.kv
    }

    /// The store, giving up the session.
    pub fn into_kv(self) -> K {
        self.kv
    }

    /// Length of the longest common prefix of `ids` and the ids held.
    pub fn common_prefix(&self, ids: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Makes the session hold `ids` and returns the logits of their last position,
    /// running the model only on what follows the longest common prefix (see the
    /// [module docs](self)).
    ///
    /// Errors with [`ModelError::EmptyInput`] for no ids, and with any error of the
    /// forward pass (a context overflow, an id outside the vocabulary); the session is
    /// then unchanged.
    pub fn prefill<B: Backend>(
        &mut self,
        model: &Llama<B>,
        ids: &[u32],
    ) -> Result<Prefill, ModelError> {
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        let reused = self.rewind_point(self.common_prefix(ids).min(ids.len() - 1));
        let suffix = &ids[reused..];
        let logits = model.forward_from(&mut self.kv, reused, suffix, Logits::Last)?;
        self.tokens.truncate(reused);
        self.tokens.extend_from_slice(suffix);
        Ok(Prefill {
            logits: logits.row(0).to_vec(),
            reused,
            prefilled: suffix.len(),
        })
    }

    /// The latest position `m ≤ min(n, len)` the session can go back to and run the model
    /// from, keeping positions `0 .. m`: `min(n, len)` itself unless the store evicted
    /// what a query there sees (a sliding window); then the latest window checkpoint
    /// before it the store keeps, or 0.
    pub fn rewind_point(&self, n: usize) -> usize {
        // Stores answer `can_rewind_to` from their windows and checkpoints in a few
        // comparisons; behind a window the walk back ends within one checkpoint spacing,
        // or at 0 after at most `n` of them (against a re-prefill of `n` positions).
        (0..=n.min(self.len()))
            .rev()
            .find(|&m| self.kv.can_rewind_to(m))
            .unwrap_or(0)
    }

    /// Appends one token and returns the logits of its position, `[vocab]` (a decode
    /// step). On error the session is unchanged.
    pub fn decode<B: Backend>(
        &mut self,
        model: &Llama<B>,
        id: u32,
    ) -> Result<Vec<f32>, ModelError> {
        let logits = model.forward(&mut self.kv, &[id], Logits::Last)?;
        self.tokens.push(id);
        Ok(logits.row(0).to_vec())
    }

    /// Keeps the first `min(n, len)` positions (rolling back speculative or regenerated
    /// tokens).
    ///
    /// Errors with [`KvError::BehindWindow`] when the store cannot rewind to `n` (a
    /// sliding-window store that evicted what a query at `n` sees and keeps no window
    /// checkpoint at `n`; see [`KvStore::can_rewind_to`]); the session is then
    /// unchanged. `truncate(0)` always succeeds. [`prefill`](Self::prefill) of the kept
    /// ids goes back to the nearest [`rewind_point`](Self::rewind_point) instead.
    pub fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        self.kv.truncate(n)?;
        self.tokens.truncate(n);
        Ok(())
    }

    /// Drops every position; the store keeps its capacity.
    pub fn clear(&mut self) {
        self.kv.clear();
        self.tokens.clear();
    }

    /// A second session starting from this one's positions (a copy of the store).
    ///
    /// Errors with [`KvError::AllocFailed`] when the copy is refused.
    pub fn fork(&self) -> Result<Self, KvError> {
        Ok(Session {
            kv: self.kv.fork()?,
            tokens: self.tokens.clone(),
        })
    }
}
