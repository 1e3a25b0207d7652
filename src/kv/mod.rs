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
//! a silent clamp. Both constructors check the full-size byte count
//! `2 · n_layers · max_ctx · kv_dim · 4` with checked arithmetic ([`KvError::TooLarge`])
//! and allocate fallibly ([`KvError::AllocFailed`]), so no geometry aborts the process.
//!
//! [`diff`] holds the differential runner that drives both stores with one op sequence
//! and compares them bit for bit (used by the property tests and the `kv_growth` fuzz
//! target).

mod dense;
pub mod diff;
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
    /// The store's full size, `2 · n_layers · max_ctx · kv_dim · 4` bytes (K and V at
    /// `max_ctx` positions), or one layer's `2 · max_ctx · kv_dim · 4`, exceeds
    /// `isize::MAX`, the largest allocation Rust allows.
    #[error(
        "KV store of {n_layers} layers x {max_ctx} positions x {kv_dim} floats overflows memory size"
    )]
    TooLarge {
        n_layers: usize,
        max_ctx: usize,
        kv_dim: usize,
    },
    /// The allocator refused a K or V buffer of `bytes` bytes (the store is unchanged).
    #[error("KV store allocation of {bytes} bytes failed")]
    AllocFailed { bytes: usize },
}

/// Floats in one of the K/V buffers of `n_layers · ctx · kv_dim`, or
/// [`KvError::TooLarge`] when the two buffers together (`2 ·` that `· 4` bytes), or one
/// layer of them (`ctx · kv_dim`, which matters when `n_layers` is 0), would exceed
/// `isize::MAX` bytes. Checking the full `max_ctx` size once at construction makes every
/// offset `layer · (cap · kv_dim) + pos · kv_dim` and buffer length
/// `n_layers · (cap · kv_dim)` with `cap ≤ max_ctx` overflow-free, whichever factor is 0.
fn buffer_len(n_layers: usize, ctx: usize, kv_dim: usize) -> Result<usize, KvError> {
    let fits = |floats: usize| {
        floats
            .checked_mul(2 * std::mem::size_of::<f32>())
            .is_some_and(|bytes| bytes <= isize::MAX as usize)
    };
    ctx.checked_mul(kv_dim)
        .filter(|&stride| fits(stride))
        .and_then(|stride| stride.checked_mul(n_layers))
        .filter(|&floats| fits(floats))
        .ok_or(KvError::TooLarge {
            n_layers,
            max_ctx: ctx,
            kv_dim,
        })
}

/// A zero-filled buffer of exactly `len` floats (`capacity() == len`), allocated
/// fallibly: a refused allocation is [`KvError::AllocFailed`], not an abort. Every page
/// is written (resident) on return.
fn zeroed(len: usize) -> Result<Vec<f32>, KvError> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| KvError::AllocFailed {
            bytes: len * std::mem::size_of::<f32>(),
        })?;
    buf.resize(len, 0.0);
    Ok(buf)
}

/// A per-layer store of K and V rows, `[layer][pos][kv_dim]`, f32.
///
/// `seq_len` positions are *filled*: `keys(layer)`/`values(layer)` return rows
/// `0..seq_len`. `capacity` positions per layer are *resident* (allocated). Rows that are
/// resident but were never written read as `0.0`. Rows past `seq_len` (after a
/// truncating [`set_seq_len`](KvStore::set_seq_len) or [`clear`](KvStore::clear)) keep
/// their contents: raising `seq_len` again exposes them unchanged.
///
/// Invariant: `seq_len ≤ capacity ≤ max_ctx`. Only `k_mut`, `v_mut` and `set_seq_len`
/// may grow the store; a call that errors changes nothing.
pub trait KvStore: Send {
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
    /// Errors with [`KvError::ContextOverflow`] when `pos >= max_ctx`, and with
    /// [`KvError::AllocFailed`] when growing is refused by the allocator; either way the
    /// store is unchanged.
    ///
    /// # Panics
    /// If `layer >= n_layers` (a programming error), checked before `pos`.
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
    /// smaller `n` truncates (the rows stay resident, contents kept).
    ///
    /// Errors with [`KvError::ContextOverflow`] `{ pos: n - 1, max_ctx }` (the highest
    /// position it would make resident) when `n > max_ctx`, and with
    /// [`KvError::AllocFailed`] when growing is refused; either way nothing changes.
    fn set_seq_len(&mut self, n: usize) -> Result<(), KvError>;
    /// Sets `seq_len` to 0 and keeps the capacity (and the rows' contents).
    fn clear(&mut self);
    /// True resident footprint of the K and V buffers in bytes: the allocated capacity of
    /// both, `2 · n_layers · capacity · kv_dim · 4` for the stores here.
    fn bytes(&self) -> usize;
}
