//! [`GrowKv`], the grow-on-demand KV store: resident memory follows the positions held
//! instead of the context ceiling.
//!
//! It starts with `min(64, max_ctx)` slots per layer; an append that needs more doubles
//! the capacity (clamped to `max_ctx`) and copies each layer's rows to the new stride
//! with one memcpy (the growth rule and its rollback are in `rows.rs`). `bytes()` is
//! exactly `n_layers · capacity · (K row bytes + V row bytes)` outside an open append
//! (`2 · n_layers · capacity · kv_dim · 4` for f32; rows in any element type, `elem.rs`).

use std::sync::Arc;

use super::rows::{Rows, forward_store};
use super::{AllocGate, KvError, KvGeometry, KvType};

/// The grow-on-demand KV store, bitwise interchangeable with
/// [`DenseKv`](super::DenseKv) for every sequence of calls.
///
/// Starts with `min(initial, max_ctx)` slots per layer (`initial` defaults to
/// [`GrowKv::DEFAULT_INITIAL_CAPACITY`]) and doubles on demand up to `max_ctx`; it never
/// shrinks. Only [`begin`](super::KvStore::begin) grows, and a rollback undoes it.
#[derive(Debug)]
pub struct GrowKv(Rows);

impl GrowKv {
    /// Slots per layer that [`GrowKv::new`] starts with (clamped to `max_ctx`).
    pub const DEFAULT_INITIAL_CAPACITY: usize = 64;

    /// An empty store with `min(64, max_ctx)` slots per layer; as
    /// [`with_initial_capacity`](GrowKv::with_initial_capacity) with
    /// [`DEFAULT_INITIAL_CAPACITY`](GrowKv::DEFAULT_INITIAL_CAPACITY).
    ///
    /// # Errors
    /// As [`with_initial_capacity`](GrowKv::with_initial_capacity).
    pub fn new(geometry: KvGeometry, max_ctx: usize) -> Result<Self, KvError> {
        Self::with_initial_capacity(geometry, max_ctx, Self::DEFAULT_INITIAL_CAPACITY)
    }

    /// An empty store with `min(initial, max_ctx)` zeroed slots per layer (allocated
    /// exactly: `bytes() == 2 · n_layers · cap · kv_dim · 4`).
    ///
    /// `initial == 0` allocates nothing until the first append, which then allocates
    /// the smallest power of two covering it (clamped to `max_ctx`). `max_ctx == 0`
    /// gives a store that never allocates, where every append of one or more positions
    /// is a [`KvError::ContextOverflow`].
    ///
    /// # Errors
    /// [`KvError::TooLarge`] when the store at full size, `2 · n_layers · max_ctx ·
    /// kv_dim · 4` bytes, would exceed `isize::MAX` (checked up front, so no later growth
    /// can overflow), [`KvError::AllocFailed`] when the allocator refuses the initial
    /// buffers.
    pub fn with_initial_capacity(
        geometry: KvGeometry,
        max_ctx: usize,
        initial: usize,
    ) -> Result<Self, KvError> {
        Self::with_capacity_and_types(geometry, max_ctx, initial, (KvType::F32, KvType::F32))
    }

    /// [`new`](GrowKv::new) with K rows of type `types.0` and V rows of `types.1`.
    ///
    /// # Errors
    /// As [`with_capacity_and_types`](GrowKv::with_capacity_and_types).
    pub fn with_types(
        geometry: KvGeometry,
        max_ctx: usize,
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        Self::with_capacity_and_types(geometry, max_ctx, Self::DEFAULT_INITIAL_CAPACITY, types)
    }

    /// [`with_initial_capacity`](GrowKv::with_initial_capacity) with K rows of type
    /// `types.0` and V rows of `types.1`.
    ///
    /// # Errors
    /// As [`with_initial_capacity`](GrowKv::with_initial_capacity), and
    /// [`KvError::BlockShape`] when a type's blocks do not divide the head size.
    pub fn with_capacity_and_types(
        geometry: KvGeometry,
        max_ctx: usize,
        initial: usize,
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        Ok(GrowKv(Rows::new(geometry, max_ctx, initial, types)?))
    }

    /// Consults `gate` before every later allocation (see [`AllocGate`]); `None` admits
    /// all. Forks inherit the gate.
    pub fn set_alloc_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.0.set_gate(gate);
    }
}

forward_store!(GrowKv);

/// The store tests' rows, shared with `window.rs`'s.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kv::{Append, KvRows, KvStore};
    use ndarray::Array2;

    /// `n_layers` layers of one head of `kv_dim`.
    pub(in crate::kv) fn geometry(n_layers: usize, kv_dim: usize) -> KvGeometry {
        KvGeometry {
            n_layers,
            n_kv_heads: 1,
            head_dim: kv_dim,
        }
    }

    /// `2 · n_layers · cap · kv_dim · 4`: the exact footprint outside an append.
    fn footprint(kv: &GrowKv) -> usize {
        let g = kv.geometry();
        2 * g.n_layers * kv.capacity() * g.kv_dim() * 4
    }

    /// The row every test writes for `(layer, pos)`: distinct bits per element.
    pub(in crate::kv) fn row(layer: usize, pos: usize, kv_dim: usize, v: bool) -> Vec<f32> {
        (0..kv_dim)
            .map(|i| {
                let tag = (layer * 100_000 + pos * 10 + i) as u32 + u32::from(v) * 5_000_000;
                f32::from_bits(0x7fc0_0000 | tag)
            })
            .collect()
    }

    /// [`row`]'s rows of `layer` for positions `at .. at + n`: `[n, kv_dim]`.
    pub(in crate::kv) fn rows(
        layer: usize,
        at: usize,
        n: usize,
        kv_dim: usize,
        v: bool,
    ) -> Array2<f32> {
        let flat: Vec<f32> = (at..at + n)
            .flat_map(|p| row(layer, p, kv_dim, v))
            .collect();
        Array2::from_shape_vec((n, kv_dim), flat).unwrap()
    }

    /// Appends positions `at .. at + n` with [`row`]'s values on every layer.
    pub(in crate::kv) fn append<K: KvStore>(
        kv: &mut K,
        at: usize,
        n: usize,
    ) -> Result<(), KvError> {
        let g = kv.geometry();
        let d = g.kv_dim();
        let mut tx = Append::begin(kv, at, n)?;
        for layer in 0..g.n_layers {
            let (k, v) = (rows(layer, at, n, d, false), rows(layer, at, n, d, true));
            tx.write(layer, k.view(), v.view())?;
        }
        tx.commit()
    }

    /// Every readable row, as bits: `[layer] → (keys, values)`.
    fn contents(kv: &GrowKv) -> Vec<(Vec<u32>, Vec<u32>)> {
        (0..kv.geometry().n_layers)
            .map(|layer| {
                let view = kv.view(layer).unwrap();
                let bits = |r: KvRows<'_>| match r {
                    KvRows::F32(a) => a.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
                    other => panic!("f32 rows expected, got {}", other.kv_type()),
                };
                let (mut k, mut v) = (Vec::new(), Vec::new());
                for s in view.segments() {
                    k.extend(bits(s.keys()));
                    v.extend(bits(s.values()));
                }
                (k, v)
            })
            .collect()
    }

    /// Checks the rows hold [`row`]'s values for positions `0..len`.
    fn check_rows(kv: &GrowKv) {
        let g = kv.geometry();
        for (layer, (k, v)) in contents(kv).into_iter().enumerate() {
            let want = |v: bool| -> Vec<u32> {
                (0..kv.len())
                    .flat_map(|p| row(layer, p, g.kv_dim(), v))
                    .map(f32::to_bits)
                    .collect()
            };
            assert_eq!(k, want(false), "layer {layer} keys");
            assert_eq!(v, want(true), "layer {layer} values");
        }
    }

    /// Appends positions one at a time up to `n`, recording each new capacity.
    fn append_capacities(kv: &mut GrowKv, n: usize) -> Vec<usize> {
        let mut caps = vec![kv.capacity()];
        for pos in kv.len()..n {
            append(kv, pos, 1).unwrap();
            if kv.capacity() != *caps.last().unwrap() {
                caps.push(kv.capacity());
            }
            assert_eq!(kv.bytes(), footprint(kv));
            assert_eq!(kv.len(), pos + 1);
        }
        caps
    }

    #[test]
    fn doubles_from_64_to_a_power_of_two_ceiling() {
        let mut kv = GrowKv::new(geometry(2, 3), 8192).unwrap();
        assert_eq!(kv.bytes(), 2 * 2 * 64 * 3 * 4);
        let caps = append_capacities(&mut kv, 8192);
        assert_eq!(caps, [64, 128, 256, 512, 1024, 2048, 4096, 8192]);
        check_rows(&kv);
        assert_eq!(
            append(&mut kv, 8192, 1),
            Err(KvError::ContextOverflow {
                pos: 8192,
                max_ctx: 8192
            })
        );
    }

    #[test]
    fn clamps_to_a_ceiling_that_is_not_a_power_of_two() {
        let mut kv = GrowKv::new(geometry(3, 4), 100).unwrap();
        assert_eq!(append_capacities(&mut kv, 100), [64, 100]);
        let mut kv = GrowKv::new(geometry(1, 2), 8000).unwrap();
        assert_eq!(
            append_capacities(&mut kv, 8000),
            [64, 128, 256, 512, 1024, 2048, 4096, 8000]
        );
        assert!(append(&mut kv, 8000, 1).is_err());
        check_rows(&kv);
    }

    #[test]
    fn small_ceilings_start_at_max_ctx() {
        let mut kv = GrowKv::new(geometry(2, 5), 10).unwrap();
        assert_eq!(kv.capacity(), 10);
        assert_eq!(append_capacities(&mut kv, 10), [10]);
        assert_eq!(
            append(&mut kv, 10, 1),
            Err(KvError::ContextOverflow {
                pos: 10,
                max_ctx: 10
            })
        );
        let mut one = GrowKv::new(geometry(1, 4), 1).unwrap();
        assert_eq!(append_capacities(&mut one, 1), [1]);
    }

    #[test]
    fn zero_context_never_allocates_and_rejects_every_append() {
        let mut kv = GrowKv::new(geometry(4, 8), 0).unwrap();
        assert_eq!((kv.capacity(), kv.bytes()), (0, 0));
        assert_eq!(
            append(&mut kv, 0, 1),
            Err(KvError::ContextOverflow { pos: 0, max_ctx: 0 })
        );
        assert_eq!(append(&mut kv, 0, 0), Ok(()));
        assert_eq!((kv.len(), kv.capacity(), kv.bytes()), (0, 0, 0));
        assert!(kv.view(3).unwrap().is_empty());
    }

    #[test]
    fn a_batch_jumps_straight_to_the_covering_power_of_two() {
        let mut kv = GrowKv::new(geometry(2, 3), 4096).unwrap();
        append(&mut kv, 0, 5).unwrap();
        append(&mut kv, 5, 996).unwrap();
        assert_eq!((kv.len(), kv.capacity()), (1001, 1024));
        assert_eq!(kv.bytes(), footprint(&kv));
        check_rows(&kv);
    }

    #[test]
    fn initial_capacity_zero_allocates_on_first_append() {
        let mut kv = GrowKv::with_initial_capacity(geometry(2, 2), 100, 0).unwrap();
        assert_eq!((kv.capacity(), kv.bytes()), (0, 0));
        assert_eq!(
            append_capacities(&mut kv, 100),
            [0, 1, 2, 4, 8, 16, 32, 64, 100]
        );
        let mut kv = GrowKv::with_initial_capacity(geometry(1, 2), 100, 0).unwrap();
        append(&mut kv, 0, 6).unwrap();
        assert_eq!(kv.capacity(), 8);
        let kv = GrowKv::with_initial_capacity(geometry(2, 2), 100, 1000).unwrap();
        assert_eq!(kv.capacity(), 100);
    }

    #[test]
    fn a_rolled_back_growth_restores_buffers_capacity_and_bytes() {
        let mut kv = GrowKv::new(geometry(3, 4), 1000).unwrap();
        append(&mut kv, 0, 60).unwrap();
        let before = (kv.len(), kv.capacity(), kv.bytes(), contents(&kv));
        kv.begin(60, 10).unwrap();
        assert_eq!(kv.capacity(), 128);
        assert_eq!(kv.len(), 60, "an open append is not visible");
        assert!(
            kv.bytes() > before.2,
            "old buffers are kept until the commit"
        );
        let rows = Array2::from_elem((10, 4), 9.0f32);
        kv.write(1, rows.view(), rows.view()).unwrap();
        assert_eq!(
            kv.view(1).unwrap().len(),
            70,
            "the written layer sees its rows"
        );
        assert_eq!(kv.view(0).unwrap().len(), 60, "an unwritten layer does not");
        kv.rollback();
        assert_eq!((kv.len(), kv.capacity(), kv.bytes(), contents(&kv)), before);
        check_rows(&kv);
    }

    #[test]
    fn replacing_the_tail_commits_or_rolls_back_exactly() {
        let mut kv = GrowKv::new(geometry(2, 3), 200).unwrap();
        append(&mut kv, 0, 50).unwrap();
        let before = (kv.len(), kv.capacity(), kv.bytes(), contents(&kv));
        // Replace positions 40.. with 5 positions of other values, then roll back.
        kv.begin(40, 5).unwrap();
        let other = Array2::from_elem((5, 3), -1.0f32);
        kv.write(0, other.view(), other.view()).unwrap();
        kv.write(0, other.view(), other.view()).unwrap();
        assert_eq!(
            kv.commit(),
            Err(KvError::Incomplete { layer: 1 }),
            "commit needs every layer"
        );
        kv.rollback();
        assert_eq!((kv.len(), kv.capacity(), kv.bytes(), contents(&kv)), before);
        // The same replacement committed: positions 40..45 rewritten, 45..50 dropped.
        append(&mut kv, 40, 5).unwrap();
        assert_eq!(kv.len(), 45);
        check_rows(&kv);
        // A replacement that also grows.
        append(&mut kv, 10, 150).unwrap();
        assert_eq!((kv.len(), kv.capacity()), (160, 200));
        check_rows(&kv);
    }

    #[test]
    fn sequence_ops_keep_capacity_and_discard_an_open_append() {
        let mut kv = GrowKv::new(geometry(2, 4), 1000).unwrap();
        append(&mut kv, 0, 130).unwrap();
        kv.truncate(500).unwrap();
        assert_eq!(kv.len(), 130, "truncating past the end keeps everything");
        kv.truncate(3).unwrap();
        assert_eq!((kv.len(), kv.capacity()), (3, 256));
        check_rows(&kv);
        kv.begin(3, 1).unwrap();
        kv.truncate(2).unwrap();
        assert_eq!(kv.len(), 2);
        assert_eq!(kv.commit(), Err(KvError::NoAppend));
        let fork = kv.fork().unwrap();
        assert_eq!(
            (fork.len(), fork.capacity(), fork.bytes()),
            (2, 256, kv.bytes())
        );
        assert_eq!(contents(&fork), contents(&kv));
        kv.clear();
        assert_eq!(
            (kv.len(), kv.capacity(), kv.bytes()),
            (0, 256, footprint(&kv))
        );
        assert_eq!(fork.len(), 2, "a fork is independent");
        kv.begin(0, 1).unwrap();
        assert_eq!(kv.fork().unwrap_err(), KvError::AppendOpen);
        assert_eq!(kv.begin(0, 1), Err(KvError::AppendOpen));
    }

    #[test]
    fn misuse_is_an_error_that_changes_nothing() {
        let mut kv = GrowKv::new(geometry(2, 3), 10).unwrap();
        append(&mut kv, 0, 2).unwrap();
        let r = Array2::<f32>::zeros((1, 3));
        assert_eq!(kv.write(0, r.view(), r.view()), Err(KvError::NoAppend));
        assert_eq!(kv.commit(), Err(KvError::NoAppend));
        assert_eq!(kv.begin(3, 1), Err(KvError::StartPastEnd { at: 3, len: 2 }));
        assert_eq!(
            kv.begin(usize::MAX, 2),
            Err(KvError::StartPastEnd {
                at: usize::MAX,
                len: 2
            })
        );
        assert_eq!(
            kv.begin(2, usize::MAX),
            Err(KvError::ContextOverflow {
                pos: usize::MAX,
                max_ctx: 10
            })
        );
        kv.begin(2, 1).unwrap();
        assert_eq!(
            kv.write(2, r.view(), r.view()),
            Err(KvError::NoSuchLayer {
                layer: 2,
                n_layers: 2
            })
        );
        let wide = Array2::<f32>::zeros((1, 4));
        assert_eq!(
            kv.write(0, r.view(), wide.view()),
            Err(KvError::RowShape {
                what: "append values",
                expected: (1, 3),
                found: (1, 4)
            })
        );
        assert!(kv.view(2).is_err());
        assert_eq!(kv.view(0).unwrap().len(), 2, "failed writes wrote nothing");
        kv.rollback();
        check_rows(&kv);
    }

    #[test]
    fn strided_rows_are_written_element_by_element() {
        let mut kv = GrowKv::new(geometry(1, 2), 10).unwrap();
        let m = Array2::from_shape_vec((2, 2), vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        kv.begin(0, 2).unwrap();
        kv.write(0, m.t(), m.view()).unwrap();
        kv.commit().unwrap();
        let c = contents(&kv);
        let f = |v: &[u32]| v.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>();
        assert_eq!(f(&c[0].0), [1.0, 3.0, 2.0, 4.0]);
        assert_eq!(f(&c[0].1), [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn sizes_past_isize_max_are_too_large() {
        let err = |n_layers, kv_dim, max_ctx| KvError::TooLarge {
            n_layers,
            max_ctx,
            kv_dim,
        };
        let g = |l, d| geometry(l, d);
        assert_eq!(
            GrowKv::new(g(usize::MAX, 2), 2).unwrap_err(),
            err(usize::MAX, 2, 2)
        );
        assert_eq!(
            GrowKv::new(g(1, 1), usize::MAX).unwrap_err(),
            err(1, 1, usize::MAX)
        );
        // 2 · 4 · 2^60 = 2^63 bytes exceeds isize::MAX; 2 · 4 · 2^59 = 2^62 fits.
        assert_eq!(
            GrowKv::new(g(1, 1 << 30), 1 << 30).unwrap_err(),
            err(1, 1 << 30, 1 << 30)
        );
        assert!(GrowKv::with_initial_capacity(g(1, 1 << 29), 1 << 30, 0).is_ok());
        let huge_heads = KvGeometry {
            n_layers: 1,
            n_kv_heads: usize::MAX,
            head_dim: 2,
        };
        assert_eq!(
            GrowKv::new(huge_heads, 1).unwrap_err(),
            err(1, usize::MAX, 1)
        );
        // Zero-sized rows: any max_ctx whose rows, n_layers · max_ctx, stay within
        // isize::MAX (the row indices) is fine, and growth allocates nothing. (Past it,
        // the indices overflowed: a debug build panicked here.)
        let huge = isize::MAX as usize / 30;
        assert_eq!(
            GrowKv::new(g(30, 0), huge + 1).unwrap_err(),
            err(30, 0, huge + 1)
        );
        assert_eq!(
            GrowKv::new(g(1, 0), isize::MAX as usize + 1).unwrap_err(),
            err(1, 0, isize::MAX as usize + 1)
        );
        assert!(GrowKv::new(g(1, 0), isize::MAX as usize).is_ok());
        let mut empty_rows = GrowKv::new(g(30, 0), huge).unwrap();
        empty_rows.begin(0, huge - 1).unwrap();
        let none = Array2::<f32>::zeros((huge - 1, 0));
        for layer in 0..30 {
            empty_rows.write(layer, none.view(), none.view()).unwrap();
        }
        empty_rows.commit().unwrap();
        assert_eq!(
            (empty_rows.len(), empty_rows.capacity(), empty_rows.bytes()),
            (huge - 1, huge, 0)
        );
        assert_eq!(empty_rows.view(29).unwrap().len(), huge - 1);
        // No layers: one layer's stride must still fit.
        assert_eq!(
            GrowKv::new(g(0, 192), usize::MAX).unwrap_err(),
            err(0, 192, usize::MAX)
        );
        let mut no_layers = GrowKv::new(g(0, 192), 1 << 40).unwrap();
        no_layers.begin(0, 1 << 40).unwrap();
        no_layers.commit().unwrap();
        assert_eq!((no_layers.capacity(), no_layers.bytes()), (1 << 40, 0));
    }

    #[test]
    fn refused_growth_is_an_error_and_changes_nothing() {
        // 2^43 positions of 2^10 floats: a 2^55-byte buffer no allocator grants.
        let mut kv = GrowKv::new(geometry(1, 1 << 10), 1 << 43).unwrap();
        append(&mut kv, 0, 4).unwrap();
        let before = (kv.len(), kv.capacity(), kv.bytes(), contents(&kv));
        assert_eq!(
            kv.begin(4, (1 << 43) - 4),
            Err(KvError::AllocFailed { bytes: 1 << 55 })
        );
        assert_eq!((kv.len(), kv.capacity(), kv.bytes(), contents(&kv)), before);
        append(&mut kv, 4, 1).unwrap();
    }
}
