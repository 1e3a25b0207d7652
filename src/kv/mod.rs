//! The KV cache: a `[layer][pos][kv_dim]` fp32 store of each position's projected keys
//! and values.
//!
//! Two stores implement [`KvStore`]:
//! - [`DenseKv`] preallocates `n_layers · max_ctx · kv_dim` floats for K and for V. It is
//!   the reference.
//! - [`GrowKv`] keeps the same layout with the per-layer stride equal to its live capacity
//!   `cap`, `offset(layer, pos) = (layer · cap + pos) · kv_dim`, starting at
//!   `min(64, max_ctx)` positions and doubling (clamped to `max_ctx`) when a write needs
//!   more. Its results are bitwise identical to [`DenseKv`]'s.
//!
//! Positions at or beyond `max_ctx` are a [`KvError::ContextOverflow`], never a panic or
//! a silent clamp.

mod dense;
mod grow;

pub use dense::DenseKv;
pub use grow::GrowKv;

use thiserror::Error;

/// Errors of the KV stores.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// A position at or past the store's hard ceiling was written or made resident.
    #[error("context overflow: position {pos} does not fit in a context of {max_ctx} positions")]
    ContextOverflow { pos: usize, max_ctx: usize },
    /// The store's size in bytes does not fit in `usize`.
    #[error("KV store of {n_layers} layers x {max_ctx} positions x {kv_dim} floats overflows memory size")]
    TooLarge {
        n_layers: usize,
        max_ctx: usize,
        kv_dim: usize,
    },
}

/// A per-layer store of K and V rows, `[layer][pos][kv_dim]`, f32.
///
/// `seq_len` positions are *filled*: `keys(layer)`/`values(layer)` return rows
/// `0..seq_len`. `capacity` positions per layer are *resident* (allocated). Rows that are
/// resident but were never written read as `0.0`.
pub trait KvStore {
    /// Number of layers.
    fn n_layers(&self) -> usize;
    /// Floats per row (`n_kv_heads · head_dim`).
    fn kv_dim(&self) -> usize;
    /// Hard ceiling on positions.
    fn max_ctx(&self) -> usize;
    /// Positions resident per layer.
    fn capacity(&self) -> usize;
    /// Positions filled.
    fn seq_len(&self) -> usize;
    /// The K row of `(layer, pos)` for writing; grows the store so `pos` is resident and
    /// sets `seq_len` to `max(seq_len, pos + 1)`.
    ///
    /// Errors with [`KvError::ContextOverflow`] when `pos >= max_ctx`.
    ///
    /// # Panics
    /// If `layer >= n_layers` (a programming error).
    fn k_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError>;
    /// The V row of `(layer, pos)` for writing; as [`k_mut`](KvStore::k_mut).
    fn v_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError>;
    /// The K row of `(layer, pos)`. Never grows or allocates.
    ///
    /// # Panics
    /// If `layer >= n_layers` or `pos >= seq_len` (programming errors).
    fn k(&self, layer: usize, pos: usize) -> &[f32];
    /// The V row of `(layer, pos)`; as [`k`](KvStore::k).
    fn v(&self, layer: usize, pos: usize) -> &[f32];
    /// Rows `0..seq_len` of one layer's keys, contiguous: `[seq_len, kv_dim]`.
    ///
    /// # Panics
    /// If `layer >= n_layers`.
    fn keys(&self, layer: usize) -> &[f32];
    /// Rows `0..seq_len` of one layer's values, contiguous: `[seq_len, kv_dim]`.
    fn values(&self, layer: usize) -> &[f32];
    /// Sets the filled length to `n`, growing ahead so rows `0..n` are resident. A
    /// smaller `n` truncates (the rows stay resident). Errors when `n > max_ctx`.
    fn set_seq_len(&mut self, n: usize) -> Result<(), KvError>;
    /// Sets `seq_len` to 0 and keeps the capacity.
    fn clear(&mut self);
    /// True resident footprint of the K and V buffers in bytes.
    fn bytes(&self) -> usize;
}
