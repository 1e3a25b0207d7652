//! [`DenseKv`], the reference KV store: `max_ctx` positions allocated up front, never
//! moved.
//!
//! Layout `[n_layers][max_ctx][kv_dim]` for K and for V (f32 unless other element types
//! are chosen), so `capacity()` is always `max_ctx` and `bytes()` is `n_layers · max_ctx
//! · (K row bytes + V row bytes)`, `2 · n_layers · max_ctx · kv_dim · 4` for f32 (plus, while an
//! append that replaces committed rows is open, the copy of those rows kept for its
//! rollback). The plainest store: every other store is tested against it.

use std::sync::Arc;

use super::rows::{Rows, forward_store};
use super::{AllocGate, KvError, KvGeometry, KvType};

/// The reference KV store: every position up to `max_ctx` allocated and zero-filled by
/// [`DenseKv::new`]. It allocates again only for the rollback copy of an append that
/// replaces committed rows, and to fork.
#[derive(Debug)]
pub struct DenseKv(Rows);

impl DenseKv {
    /// An empty store holding `max_ctx` zeroed positions per layer (the whole footprint
    /// is resident on return). `max_ctx == 0` gives a store where every append of one or
    /// more positions is a [`KvError::ContextOverflow`].
    ///
    /// # Errors
    /// [`KvError::TooLarge`] when `2 · n_layers · max_ctx · kv_dim · 4` bytes exceeds
    /// `isize::MAX` (checked before allocating), [`KvError::AllocFailed`] when the
    /// allocator refuses it.
    pub fn new(geometry: KvGeometry, max_ctx: usize) -> Result<Self, KvError> {
        Self::with_types(geometry, max_ctx, (KvType::F32, KvType::F32))
    }

    /// [`new`](DenseKv::new) with K rows of type `types.0` and V rows of `types.1`.
    ///
    /// # Errors
    /// As [`new`](DenseKv::new), and [`KvError::BlockShape`] when a type's blocks do not
    /// divide the head size.
    pub fn with_types(
        geometry: KvGeometry,
        max_ctx: usize,
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        Ok(DenseKv(Rows::new(geometry, max_ctx, max_ctx, types)?))
    }

    /// Consults `gate` before every later allocation (see [`AllocGate`]); `None` admits
    /// all. Forks inherit the gate.
    pub fn set_alloc_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.0.set_gate(gate);
    }
}

forward_store!(DenseKv);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvRows, KvStore};
    use ndarray::Array2;

    const G: KvGeometry = KvGeometry {
        n_layers: 2,
        n_kv_heads: 1,
        head_dim: 2,
    };

    /// Appends `n` positions whose every element is `x`.
    fn append(kv: &mut DenseKv, n: usize, x: f32) -> Result<(), KvError> {
        kv.begin(kv.len(), n)?;
        let rows = Array2::from_elem((n, 2), x);
        for layer in 0..2 {
            kv.write(layer, rows.view(), (-&rows).view())?;
        }
        kv.commit()
    }

    fn keys(kv: &DenseKv, layer: usize) -> Vec<f32> {
        let view = kv.view(layer).unwrap();
        match view.segments()[0].keys() {
            KvRows::F32(a) => a.iter().copied().collect(),
            other => panic!("f32 rows expected, got {}", other.kv_type()),
        }
    }

    #[test]
    fn allocates_the_full_context_exactly() {
        let smollm2 = KvGeometry {
            n_layers: 30,
            n_kv_heads: 3,
            head_dim: 64,
        };
        let kv = DenseKv::new(smollm2, 8192).unwrap();
        assert_eq!(kv.bytes(), 377_487_360);
        assert_eq!((kv.capacity(), kv.len()), (8192, 0));
        assert_eq!(DenseKv::new(G, 7).unwrap().bytes(), 2 * 2 * 7 * 2 * 4);
    }

    #[test]
    fn appends_fill_up_to_max_ctx_and_no_further() {
        let mut kv = DenseKv::new(G, 4).unwrap();
        append(&mut kv, 3, 1.5).unwrap();
        assert_eq!(
            append(&mut kv, 2, 2.5),
            Err(KvError::ContextOverflow { pos: 4, max_ctx: 4 })
        );
        assert_eq!(kv.len(), 3);
        append(&mut kv, 1, 2.5).unwrap();
        assert_eq!(keys(&kv, 1), [1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 2.5, 2.5]);
        assert_eq!(kv.bytes(), 2 * 2 * 4 * 2 * 4);
        let mut empty = DenseKv::new(G, 0).unwrap();
        assert_eq!(empty.bytes(), 0);
        assert_eq!(
            append(&mut empty, 1, 0.0),
            Err(KvError::ContextOverflow { pos: 0, max_ctx: 0 })
        );
    }

    #[test]
    fn absurd_sizes_are_errors_not_aborts() {
        let g = KvGeometry {
            n_layers: 2,
            n_kv_heads: 3,
            head_dim: 1,
        };
        assert_eq!(
            DenseKv::new(g, usize::MAX / 4).unwrap_err(),
            KvError::TooLarge {
                n_layers: 2,
                max_ctx: usize::MAX / 4,
                kv_dim: 3
            }
        );
        // 2^52 floats (2^54 bytes) fits isize but no allocator grants it.
        let g = KvGeometry {
            n_layers: 4,
            n_kv_heads: 1,
            head_dim: 1 << 10,
        };
        assert_eq!(
            DenseKv::new(g, 1 << 40).unwrap_err(),
            KvError::AllocFailed { bytes: 1 << 54 }
        );
    }
}
