//! [`DenseKv`], the reference KV store: both buffers are allocated at the full context
//! up front and never move.
//!
//! Layout: K and V are each one `Vec<f32>` of `[n_layers][max_ctx][kv_dim]`, so
//! `offset(layer, pos) = (layer · max_ctx + pos) · kv_dim`. `capacity()` is always
//! `max_ctx` and `bytes()` always `2 · n_layers · max_ctx · kv_dim · 4`. Deliberately
//! the plainest possible implementation: [`GrowKv`](super::GrowKv) is tested against it.

use std::fmt;

use super::{KvError, KvStore, buffer_len, zeroed};

/// The reference KV store: `n_layers · max_ctx · kv_dim` f32 for K and the same for V,
/// allocated and zero-filled by [`DenseKv::new`].
///
/// Layout `[layer][pos][kv_dim]`, per-layer stride `max_ctx` rows. No method after
/// construction allocates.
#[derive(Clone)]
pub struct DenseKv {
    n_layers: usize,
    kv_dim: usize,
    max_ctx: usize,
    seq_len: usize,
    /// `[n_layers][max_ctx][kv_dim]`
    k: Vec<f32>,
    /// `[n_layers][max_ctx][kv_dim]`
    v: Vec<f32>,
}

impl DenseKv {
    /// An empty store (`seq_len` 0) holding `max_ctx` zeroed positions per layer.
    ///
    /// Allocates exactly `2 · n_layers · max_ctx · kv_dim · 4` bytes and writes them all
    /// (the whole footprint is resident on return). `max_ctx == 0` gives an empty store
    /// where every write is a [`KvError::ContextOverflow`].
    ///
    /// # Errors
    /// [`KvError::TooLarge`] when that byte count exceeds `isize::MAX` (checked before
    /// allocating), [`KvError::AllocFailed`] when the allocator refuses it.
    pub fn new(n_layers: usize, kv_dim: usize, max_ctx: usize) -> Result<Self, KvError> {
        let len = buffer_len(n_layers, max_ctx, kv_dim)?;
        let k = zeroed(len)?;
        let v = zeroed(len)?;
        Ok(Self {
            n_layers,
            kv_dim,
            max_ctx,
            seq_len: 0,
            k,
            v,
        })
    }

    /// Panics on a bad layer: the documented programming error of every accessor.
    fn check_layer(&self, layer: usize) {
        assert!(
            layer < self.n_layers,
            "layer {layer} out of range for a KV store of {} layers",
            self.n_layers
        );
    }

    /// Float offset of row `(layer, pos)`, for `pos ≤ max_ctx` (no overflow then).
    fn offset(&self, layer: usize, pos: usize) -> usize {
        layer * (self.max_ctx * self.kv_dim) + pos * self.kv_dim
    }

    /// Offset of a readable row: `layer < n_layers`, `pos < seq_len`, else panics.
    fn read_offset(&self, layer: usize, pos: usize) -> usize {
        self.check_layer(layer);
        assert!(
            pos < self.seq_len,
            "position {pos} is not filled (seq_len {})",
            self.seq_len
        );
        self.offset(layer, pos)
    }

    /// Offset of a row about to be written; fills `seq_len` up to `pos + 1`.
    fn write_offset(&mut self, layer: usize, pos: usize) -> Result<usize, KvError> {
        self.check_layer(layer);
        if pos >= self.max_ctx {
            return Err(KvError::ContextOverflow {
                pos,
                max_ctx: self.max_ctx,
            });
        }
        self.seq_len = self.seq_len.max(pos + 1);
        Ok(self.offset(layer, pos))
    }

    /// Rows `0..seq_len` of `layer` in `buf`, `[seq_len, kv_dim]`.
    fn filled<'a>(&self, buf: &'a [f32], layer: usize) -> &'a [f32] {
        self.check_layer(layer);
        let at = self.offset(layer, 0);
        &buf[at..at + self.seq_len * self.kv_dim]
    }
}

impl fmt::Debug for DenseKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenseKv")
            .field("n_layers", &self.n_layers)
            .field("kv_dim", &self.kv_dim)
            .field("max_ctx", &self.max_ctx)
            .field("seq_len", &self.seq_len)
            .finish_non_exhaustive()
    }
}

/// Growth behaviour: none. Every method is O(1) except the initial allocation in
/// [`DenseKv::new`]; `capacity()` is `max_ctx` throughout.
impl KvStore for DenseKv {
    fn n_layers(&self) -> usize {
        self.n_layers
    }

    fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Always `max_ctx`.
    fn capacity(&self) -> usize {
        self.max_ctx
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The K row of `(layer, pos)`. O(1), never allocates.
    ///
    /// # Errors
    /// [`KvError::ContextOverflow`] if `pos ≥ max_ctx` (nothing changes).
    ///
    /// # Panics
    /// If `layer ≥ n_layers`, checked before `pos`.
    fn k_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
        let at = self.write_offset(layer, pos)?;
        Ok(&mut self.k[at..at + self.kv_dim])
    }

    /// The V row of `(layer, pos)`; as [`k_mut`](KvStore::k_mut).
    fn v_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
        let at = self.write_offset(layer, pos)?;
        Ok(&mut self.v[at..at + self.kv_dim])
    }

    /// The K row of `(layer, pos)`, `[kv_dim]`.
    ///
    /// # Panics
    /// If `layer ≥ n_layers` or `pos ≥ seq_len`.
    fn k(&self, layer: usize, pos: usize) -> &[f32] {
        let at = self.read_offset(layer, pos);
        &self.k[at..at + self.kv_dim]
    }

    /// The V row of `(layer, pos)`; as [`k`](KvStore::k).
    fn v(&self, layer: usize, pos: usize) -> &[f32] {
        let at = self.read_offset(layer, pos);
        &self.v[at..at + self.kv_dim]
    }

    /// Layer `layer`'s keys, `[seq_len, kv_dim]` contiguous.
    ///
    /// # Panics
    /// If `layer ≥ n_layers`.
    fn keys(&self, layer: usize) -> &[f32] {
        self.filled(&self.k, layer)
    }

    /// Layer `layer`'s values; as [`keys`](KvStore::keys).
    fn values(&self, layer: usize) -> &[f32] {
        self.filled(&self.v, layer)
    }

    /// Sets `seq_len` to `n`; rows keep their contents either way.
    ///
    /// # Errors
    /// [`KvError::ContextOverflow`] `{ pos: n - 1, .. }` if `n > max_ctx` (nothing
    /// changes).
    fn set_seq_len(&mut self, n: usize) -> Result<(), KvError> {
        if n > self.max_ctx {
            return Err(KvError::ContextOverflow {
                pos: n - 1,
                max_ctx: self.max_ctx,
            });
        }
        self.seq_len = n;
        Ok(())
    }

    /// Sets `seq_len` to 0; keeps the rows.
    fn clear(&mut self) {
        self.seq_len = 0;
    }

    /// The buffers' allocated size, exactly `2 · n_layers · max_ctx · kv_dim · 4`.
    fn bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_the_full_context_exactly() {
        let kv = DenseKv::new(30, 192, 8192).unwrap();
        assert_eq!(kv.bytes(), 377_487_360);
        assert_eq!((kv.capacity(), kv.seq_len()), (8192, 0));
        let kv = DenseKv::new(3, 5, 7).unwrap();
        assert_eq!(kv.bytes(), 2 * 3 * 7 * 5 * 4);
    }

    #[test]
    fn rows_start_zero_and_writes_land_at_their_offset() {
        let mut kv = DenseKv::new(2, 2, 4).unwrap();
        kv.k_mut(1, 2).unwrap().copy_from_slice(&[1.0, -0.0]);
        kv.v_mut(0, 1).unwrap().copy_from_slice(&[3.0, 4.0]);
        assert_eq!(kv.seq_len(), 3);
        assert_eq!(kv.keys(1), [0.0, 0.0, 0.0, 0.0, 1.0, -0.0]);
        assert_eq!(kv.values(0), [0.0, 0.0, 3.0, 4.0, 0.0, 0.0]);
        assert_eq!(kv.k(1, 2)[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(kv.keys(0), [0.0; 6]);
    }

    #[test]
    fn positions_past_max_ctx_are_errors() {
        let mut kv = DenseKv::new(1, 2, 3).unwrap();
        assert_eq!(
            kv.k_mut(0, 3),
            Err(KvError::ContextOverflow { pos: 3, max_ctx: 3 })
        );
        assert_eq!(
            kv.v_mut(0, usize::MAX),
            Err(KvError::ContextOverflow {
                pos: usize::MAX,
                max_ctx: 3
            })
        );
        assert_eq!(
            kv.set_seq_len(4),
            Err(KvError::ContextOverflow { pos: 3, max_ctx: 3 })
        );
        assert_eq!(kv.seq_len(), 0);
        let mut empty = DenseKv::new(2, 2, 0).unwrap();
        assert_eq!(empty.bytes(), 0);
        assert_eq!(
            empty.k_mut(0, 0),
            Err(KvError::ContextOverflow { pos: 0, max_ctx: 0 })
        );
    }

    #[test]
    fn truncation_and_clear_keep_rows() {
        let mut kv = DenseKv::new(1, 1, 8).unwrap();
        kv.k_mut(0, 5).unwrap()[0] = 9.0;
        kv.clear();
        assert_eq!((kv.seq_len(), kv.capacity()), (0, 8));
        kv.set_seq_len(6).unwrap();
        assert_eq!(kv.k(0, 5), [9.0]);
    }

    #[test]
    fn absurd_sizes_are_errors_not_aborts() {
        assert_eq!(
            DenseKv::new(2, 3, usize::MAX / 4).unwrap_err(),
            KvError::TooLarge {
                n_layers: 2,
                max_ctx: usize::MAX / 4,
                kv_dim: 3
            }
        );
        // 2^52 floats (2^54 bytes) fits isize but no allocator grants it.
        assert_eq!(
            DenseKv::new(1 << 2, 1 << 10, 1 << 40).unwrap_err(),
            KvError::AllocFailed { bytes: 1 << 54 }
        );
    }

    #[test]
    #[should_panic(expected = "layer 1 out of range")]
    fn a_missing_layer_panics() {
        let mut kv = DenseKv::new(1, 1, 8).unwrap();
        let _ = kv.v_mut(1, 0);
    }
}
