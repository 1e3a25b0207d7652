//! [`GrowKv`], the grow-on-demand KV store: resident memory follows the sequence length
//! instead of the context ceiling.
//!
//! Layout: K and V are each one `Vec<f32>` of `[n_layers][cap][kv_dim]`, the per-layer
//! stride being the live capacity `cap`: `offset(layer, pos) = (layer · cap + pos) ·
//! kv_dim`. `bytes()` is exactly `2 · n_layers · cap · kv_dim · 4`.
//!
//! Growth rule: when a write (or [`set_seq_len`](KvStore::set_seq_len)) needs position
//! `p ≥ cap`, `cap` doubles until it covers `p + 1`, clamped to `max_ctx` (from
//! `cap == 0` the doubling starts at 1). Both buffers are reallocated at the new size
//! (zero-filled) and each layer's `cap_old` rows are copied verbatim from the old stride
//! to the new with one `copy_from_slice` per layer and buffer, so an append costs
//! amortised O(1): the rows copied over a run of `n` appends sum to less than `2n`.
//! A position `≥ max_ctx` is a [`KvError::ContextOverflow`] and changes nothing.

use std::fmt;

use super::{KvError, KvStore, buffer_len, zeroed};

/// The grow-on-demand KV store, bitwise interchangeable with
/// [`DenseKv`](super::DenseKv) for every sequence of calls.
///
/// Starts with `min(initial, max_ctx)` resident positions per layer (`initial` defaults
/// to [`GrowKv::DEFAULT_INITIAL_CAPACITY`]) and doubles on demand up to `max_ctx`; it
/// never shrinks. Only [`k_mut`](KvStore::k_mut), [`v_mut`](KvStore::v_mut) and
/// [`set_seq_len`](KvStore::set_seq_len) may grow (and so allocate); reads never do.
#[derive(Clone)]
pub struct GrowKv {
    n_layers: usize,
    kv_dim: usize,
    max_ctx: usize,
    /// Resident positions per layer, the per-layer stride; `cap ≤ max_ctx`.
    cap: usize,
    seq_len: usize,
    /// `[n_layers][cap][kv_dim]`
    k: Vec<f32>,
    /// `[n_layers][cap][kv_dim]`
    v: Vec<f32>,
}

impl GrowKv {
    /// Resident positions per layer that [`GrowKv::new`] starts with (clamped to
    /// `max_ctx`).
    pub const DEFAULT_INITIAL_CAPACITY: usize = 64;

    /// An empty store with `min(64, max_ctx)` resident positions per layer; as
    /// [`with_initial_capacity`](GrowKv::with_initial_capacity) with
    /// [`DEFAULT_INITIAL_CAPACITY`](GrowKv::DEFAULT_INITIAL_CAPACITY).
    ///
    /// # Errors
    /// As [`with_initial_capacity`](GrowKv::with_initial_capacity).
    pub fn new(n_layers: usize, kv_dim: usize, max_ctx: usize) -> Result<Self, KvError> {
        Self::with_initial_capacity(n_layers, kv_dim, max_ctx, Self::DEFAULT_INITIAL_CAPACITY)
    }

    /// An empty store with `min(initial, max_ctx)` resident, zeroed positions per layer
    /// (allocated exactly: `bytes() == 2 · n_layers · cap · kv_dim · 4`).
    ///
    /// `initial == 0` allocates nothing until the first write, which then allocates the
    /// smallest power of two covering it (clamped to `max_ctx`). `max_ctx == 0` gives a
    /// store that never allocates and where every write is a
    /// [`KvError::ContextOverflow`].
    ///
    /// # Errors
    /// [`KvError::TooLarge`] when the store at full size, `2 · n_layers · max_ctx ·
    /// kv_dim · 4` bytes, would exceed `isize::MAX` (checked up front, so no later growth
    /// can overflow), [`KvError::AllocFailed`] when the allocator refuses the initial
    /// buffers.
    pub fn with_initial_capacity(
        n_layers: usize,
        kv_dim: usize,
        max_ctx: usize,
        initial: usize,
    ) -> Result<Self, KvError> {
        buffer_len(n_layers, max_ctx, kv_dim)?;
        let cap = initial.min(max_ctx);
        let len = n_layers * (cap * kv_dim);
        let k = zeroed(len)?;
        let v = zeroed(len)?;
        Ok(Self {
            n_layers,
            kv_dim,
            max_ctx,
            cap,
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

    /// Float offset of row `(layer, pos)`, for `pos ≤ cap` (no overflow then, see
    /// `buffer_len`).
    fn offset(&self, layer: usize, pos: usize) -> usize {
        layer * (self.cap * self.kv_dim) + pos * self.kv_dim
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

    /// Offset of a row about to be written: grows so `pos` is resident and fills
    /// `seq_len` up to `pos + 1`.
    fn write_offset(&mut self, layer: usize, pos: usize) -> Result<usize, KvError> {
        self.check_layer(layer);
        if pos >= self.max_ctx {
            return Err(KvError::ContextOverflow {
                pos,
                max_ctx: self.max_ctx,
            });
        }
        self.reserve(pos + 1)?;
        self.seq_len = self.seq_len.max(pos + 1);
        Ok(self.offset(layer, pos))
    }

    /// Rows `0..seq_len` of `layer` in `buf`, `[seq_len, kv_dim]`.
    fn filled<'a>(&self, buf: &'a [f32], layer: usize) -> &'a [f32] {
        self.check_layer(layer);
        let at = self.offset(layer, 0);
        &buf[at..at + self.seq_len * self.kv_dim]
    }

    /// Makes positions `0..needed` resident (`needed ≤ max_ctx`) by the growth rule.
    /// Both new buffers are allocated before anything is replaced, so a refused
    /// allocation leaves the store as it was.
    fn reserve(&mut self, needed: usize) -> Result<(), KvError> {
        debug_assert!(needed <= self.max_ctx);
        if needed <= self.cap {
            return Ok(());
        }
        let cap = grown_capacity(self.cap, needed, self.max_ctx);
        let old_stride = self.cap * self.kv_dim;
        let new_stride = cap * self.kv_dim;
        let mut k = zeroed(self.n_layers * new_stride)?;
        let mut v = zeroed(self.n_layers * new_stride)?;
        for layer in 0..self.n_layers {
            let (src, dst) = (layer * old_stride, layer * new_stride);
            k[dst..dst + old_stride].copy_from_slice(&self.k[src..src + old_stride]);
            v[dst..dst + old_stride].copy_from_slice(&self.v[src..src + old_stride]);
        }
        self.k = k;
        self.v = v;
        self.cap = cap;
        Ok(())
    }
}

/// The growth rule: `cap` (or 1 when `cap == 0`) doubled until it covers `needed`,
/// clamped to `max_ctx`. Saturating, so `max_ctx` near `usize::MAX` cannot overflow.
fn grown_capacity(cap: usize, needed: usize, max_ctx: usize) -> usize {
    let mut grown = cap.max(1);
    while grown < needed {
        grown = grown.saturating_mul(2);
    }
    grown.min(max_ctx)
}

impl fmt::Debug for GrowKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrowKv")
            .field("n_layers", &self.n_layers)
            .field("kv_dim", &self.kv_dim)
            .field("max_ctx", &self.max_ctx)
            .field("capacity", &self.cap)
            .field("seq_len", &self.seq_len)
            .finish_non_exhaustive()
    }
}

/// Growth behaviour per method: `k_mut`/`v_mut` grow when `pos ≥ capacity()`;
/// `set_seq_len(n)` grows when `n > capacity()`; `clear` and a truncating `set_seq_len`
/// keep the capacity; every other method is O(1) and never allocates.
impl KvStore for GrowKv {
    fn n_layers(&self) -> usize {
        self.n_layers
    }

    fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Resident positions per layer: starts at `min(initial, max_ctx)`, only grows.
    fn capacity(&self) -> usize {
        self.cap
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The K row of `(layer, pos)`. Grows when `pos ≥ capacity()`: doubles the capacity
    /// until it covers `pos + 1` (clamped to `max_ctx`), reallocating and copying both
    /// buffers; otherwise O(1) without allocating.
    ///
    /// # Errors
    /// [`KvError::ContextOverflow`] if `pos ≥ max_ctx`, [`KvError::AllocFailed`] if the
    /// growth is refused; the store is unchanged.
    ///
    /// # Panics
    /// If `layer ≥ n_layers`, checked before `pos`.
    fn k_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
        let at = self.write_offset(layer, pos)?;
        Ok(&mut self.k[at..at + self.kv_dim])
    }

    /// The V row of `(layer, pos)`; grows, errors and panics as
    /// [`k_mut`](KvStore::k_mut).
    fn v_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
        let at = self.write_offset(layer, pos)?;
        Ok(&mut self.v[at..at + self.kv_dim])
    }

    /// The K row of `(layer, pos)`, `[kv_dim]`. Never grows or allocates.
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

    /// Layer `layer`'s keys, `[seq_len, kv_dim]` contiguous. Never grows or allocates.
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

    /// Sets `seq_len` to `n`. Grows ahead (as a write at `n - 1` would) when
    /// `n > capacity()`; a smaller `n` keeps the capacity and the rows.
    ///
    /// # Errors
    /// [`KvError::ContextOverflow`] `{ pos: n - 1, .. }` if `n > max_ctx`,
    /// [`KvError::AllocFailed`] if the growth is refused; the store is unchanged.
    fn set_seq_len(&mut self, n: usize) -> Result<(), KvError> {
        if n > self.max_ctx {
            return Err(KvError::ContextOverflow {
                pos: n - 1,
                max_ctx: self.max_ctx,
            });
        }
        self.reserve(n)?;
        self.seq_len = n;
        Ok(())
    }

    /// Sets `seq_len` to 0; keeps the capacity, the allocation and the rows.
    fn clear(&mut self) {
        self.seq_len = 0;
    }

    /// The buffers' allocated size, exactly `2 · n_layers · capacity · kv_dim · 4`.
    fn bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `2 · n_layers · cap · kv_dim · 4`: the exact footprint the issue specifies.
    fn footprint(n_layers: usize, cap: usize, kv_dim: usize) -> usize {
        2 * n_layers * cap * kv_dim * 4
    }

    /// Appends positions `0..n` on every layer of both planes and returns the capacity
    /// after each growth, checking `bytes()` after every append.
    fn append_capacities(kv: &mut GrowKv, n: usize) -> Vec<usize> {
        let mut caps = vec![kv.capacity()];
        for pos in 0..n {
            for layer in 0..kv.n_layers() {
                kv.k_mut(layer, pos).unwrap().fill(pos as f32);
                kv.v_mut(layer, pos).unwrap().fill(-(pos as f32));
            }
            if kv.capacity() != *caps.last().unwrap() {
                caps.push(kv.capacity());
            }
            assert_eq!(
                kv.bytes(),
                footprint(kv.n_layers(), kv.capacity(), kv.kv_dim())
            );
            assert_eq!(kv.seq_len(), pos + 1);
        }
        caps
    }

    #[test]
    fn doubles_from_64_to_a_power_of_two_ceiling() {
        let mut kv = GrowKv::new(2, 3, 8192).unwrap();
        assert_eq!(kv.bytes(), footprint(2, 64, 3));
        let caps = append_capacities(&mut kv, 8192);
        assert_eq!(caps, [64, 128, 256, 512, 1024, 2048, 4096, 8192]);
        assert_eq!(
            kv.k_mut(0, 8192),
            Err(KvError::ContextOverflow {
                pos: 8192,
                max_ctx: 8192
            })
        );
    }

    #[test]
    fn clamps_to_a_ceiling_that_is_not_a_power_of_two() {
        let mut kv = GrowKv::new(3, 4, 100).unwrap();
        assert_eq!(append_capacities(&mut kv, 100), [64, 100]);
        let mut kv = GrowKv::new(1, 2, 8000).unwrap();
        assert_eq!(
            append_capacities(&mut kv, 8000),
            [64, 128, 256, 512, 1024, 2048, 4096, 8000]
        );
        assert!(kv.v_mut(0, 8000).is_err());
    }

    #[test]
    fn small_ceilings_start_at_max_ctx() {
        let mut kv = GrowKv::new(2, 5, 10).unwrap();
        assert_eq!(kv.capacity(), 10);
        assert_eq!(kv.bytes(), footprint(2, 10, 5));
        assert_eq!(append_capacities(&mut kv, 10), [10]);
        assert_eq!(
            kv.k_mut(1, 10),
            Err(KvError::ContextOverflow {
                pos: 10,
                max_ctx: 10
            })
        );

        let mut one = GrowKv::new(1, 4, 1).unwrap();
        assert_eq!(append_capacities(&mut one, 1), [1]);
        assert!(one.k_mut(0, 1).is_err());
    }

    #[test]
    fn zero_context_never_allocates_and_rejects_every_write() {
        let mut kv = GrowKv::new(4, 8, 0).unwrap();
        assert_eq!((kv.capacity(), kv.bytes()), (0, 0));
        assert_eq!(
            kv.k_mut(0, 0),
            Err(KvError::ContextOverflow { pos: 0, max_ctx: 0 })
        );
        assert_eq!(
            kv.v_mut(3, 5),
            Err(KvError::ContextOverflow { pos: 5, max_ctx: 0 })
        );
        assert_eq!(kv.set_seq_len(0), Ok(()));
        assert_eq!(
            kv.set_seq_len(1),
            Err(KvError::ContextOverflow { pos: 0, max_ctx: 0 })
        );
        assert_eq!((kv.seq_len(), kv.capacity(), kv.bytes()), (0, 0, 0));
        assert!(kv.keys(3).is_empty());
    }

    #[test]
    fn kv_dim_one() {
        let mut kv = GrowKv::new(2, 1, 300).unwrap();
        assert_eq!(append_capacities(&mut kv, 300), [64, 128, 256, 300]);
        assert_eq!(kv.bytes(), 2 * 2 * 300 * 4);
        let keys: Vec<f32> = (0..300).map(|p| p as f32).collect();
        assert_eq!(kv.keys(1), &keys[..]);
    }

    #[test]
    fn a_far_write_jumps_straight_to_the_covering_power_of_two() {
        let mut kv = GrowKv::new(2, 3, 4096).unwrap();
        kv.k_mut(1, 0).unwrap().copy_from_slice(&[1.0, 2.0, 3.0]);
        kv.v_mut(1, 0).unwrap().copy_from_slice(&[4.0, 5.0, 6.0]);
        kv.k_mut(0, 1000).unwrap().copy_from_slice(&[7.0, 8.0, 9.0]);
        assert_eq!(kv.capacity(), 1024);
        assert_eq!(kv.bytes(), footprint(2, 1024, 3));
        assert_eq!(kv.seq_len(), 1001);
        assert_eq!(kv.k(1, 0), [1.0, 2.0, 3.0]);
        assert_eq!(kv.v(1, 0), [4.0, 5.0, 6.0]);
        assert_eq!(kv.k(0, 1000), [7.0, 8.0, 9.0]);
        assert_eq!(kv.v(0, 1000), [0.0; 3]);
        assert_eq!(kv.k(0, 500), [0.0; 3]);
    }

    #[test]
    fn initial_capacity_zero_allocates_on_first_write() {
        let mut kv = GrowKv::with_initial_capacity(2, 2, 100, 0).unwrap();
        assert_eq!((kv.capacity(), kv.bytes()), (0, 0));
        assert_eq!(
            append_capacities(&mut kv, 100),
            [0, 1, 2, 4, 8, 16, 32, 64, 100]
        );
        let mut kv = GrowKv::with_initial_capacity(1, 2, 100, 0).unwrap();
        kv.v_mut(0, 5).unwrap();
        assert_eq!(kv.capacity(), 8);
    }

    #[test]
    fn initial_capacity_is_clamped_to_max_ctx() {
        let kv = GrowKv::with_initial_capacity(2, 2, 100, 1000).unwrap();
        assert_eq!((kv.capacity(), kv.bytes()), (100, footprint(2, 100, 2)));
        let kv = GrowKv::with_initial_capacity(2, 2, 100, 7).unwrap();
        assert_eq!(kv.capacity(), 7);
    }

    #[test]
    fn growth_copies_every_layer_verbatim() {
        let (n_layers, kv_dim) = (3, 2);
        let mut kv = GrowKv::with_initial_capacity(n_layers, kv_dim, 64, 2).unwrap();
        let value = |layer: usize, pos: usize, i: usize, v: bool| {
            f32::from_bits(0x7fc0_0001 + (layer * 1000 + pos * 10 + i) as u32 + u32::from(v) * 500)
        };
        for pos in 0..40 {
            for layer in 0..n_layers {
                for (i, x) in kv.k_mut(layer, pos).unwrap().iter_mut().enumerate() {
                    *x = value(layer, pos, i, false);
                }
                for (i, x) in kv.v_mut(layer, pos).unwrap().iter_mut().enumerate() {
                    *x = if i == 0 {
                        -0.0
                    } else {
                        value(layer, pos, i, true)
                    };
                }
            }
        }
        assert_eq!(kv.capacity(), 64);
        for layer in 0..n_layers {
            for pos in 0..40 {
                let k: Vec<u32> = kv.k(layer, pos).iter().map(|x| x.to_bits()).collect();
                let v: Vec<u32> = kv.v(layer, pos).iter().map(|x| x.to_bits()).collect();
                assert_eq!(k, [0, 1].map(|i| value(layer, pos, i, false).to_bits()));
                assert_eq!(
                    v,
                    [(-0.0f32).to_bits(), value(layer, pos, 1, true).to_bits()]
                );
                assert_eq!(
                    kv.keys(layer)[pos * kv_dim..][..kv_dim].as_ptr(),
                    kv.k(layer, pos).as_ptr()
                );
            }
        }
    }

    #[test]
    fn set_seq_len_grows_ahead_truncates_and_clear_keeps_capacity() {
        let mut kv = GrowKv::new(2, 4, 1000).unwrap();
        kv.set_seq_len(65).unwrap();
        assert_eq!((kv.seq_len(), kv.capacity()), (65, 128));
        assert_eq!(kv.keys(1), &[0.0; 65 * 4][..]);
        kv.k_mut(1, 3).unwrap().fill(2.5);
        kv.set_seq_len(2).unwrap();
        assert_eq!((kv.seq_len(), kv.capacity()), (2, 128));
        kv.set_seq_len(4).unwrap();
        assert_eq!(kv.k(1, 3), [2.5; 4], "truncated rows keep their contents");
        assert_eq!(
            kv.set_seq_len(1001),
            Err(KvError::ContextOverflow {
                pos: 1000,
                max_ctx: 1000
            })
        );
        assert_eq!(kv.seq_len(), 4);
        kv.set_seq_len(1000).unwrap();
        assert_eq!(kv.capacity(), 1000);
        kv.clear();
        assert_eq!(
            (kv.seq_len(), kv.capacity(), kv.bytes()),
            (0, 1000, footprint(2, 1000, 4))
        );
        assert!(kv.values(0).is_empty());
    }

    #[test]
    fn overflow_is_an_error_even_near_usize_max() {
        let mut kv = GrowKv::new(1, 1, 10).unwrap();
        for pos in [10, 11, usize::MAX - 1, usize::MAX] {
            assert_eq!(
                kv.k_mut(0, pos),
                Err(KvError::ContextOverflow { pos, max_ctx: 10 })
            );
        }
        assert_eq!(
            kv.set_seq_len(usize::MAX),
            Err(KvError::ContextOverflow {
                pos: usize::MAX - 1,
                max_ctx: 10
            })
        );
        assert_eq!((kv.seq_len(), kv.capacity()), (0, 10));
    }

    #[test]
    fn sizes_past_isize_max_are_too_large() {
        let err = |n_layers, kv_dim, max_ctx| KvError::TooLarge {
            n_layers,
            max_ctx,
            kv_dim,
        };
        assert_eq!(
            GrowKv::new(usize::MAX, 2, 2).unwrap_err(),
            err(usize::MAX, 2, 2)
        );
        assert_eq!(
            GrowKv::new(1, 1, usize::MAX).unwrap_err(),
            err(1, 1, usize::MAX)
        );
        // 2 · 4 · 2^60 = 2^63 bytes exceeds isize::MAX; 2 · 4 · 2^59 = 2^62 fits.
        assert_eq!(
            GrowKv::new(1, 1 << 30, 1 << 30).unwrap_err(),
            err(1, 1 << 30, 1 << 30)
        );
        assert!(GrowKv::with_initial_capacity(1, 1 << 29, 1 << 30, 0).is_ok());
        // Zero-sized rows: any max_ctx is fine, and growth allocates nothing.
        let mut empty_rows = GrowKv::new(30, 0, usize::MAX).unwrap();
        empty_rows.set_seq_len(usize::MAX).unwrap();
        assert_eq!(empty_rows.k_mut(29, usize::MAX - 1).unwrap(), &[] as &[f32]);
        assert_eq!((empty_rows.capacity(), empty_rows.bytes()), (usize::MAX, 0));
        // No layers: one layer's stride must still fit.
        assert_eq!(
            GrowKv::new(0, 192, usize::MAX).unwrap_err(),
            err(0, 192, usize::MAX)
        );
        let mut no_layers = GrowKv::new(0, 192, 1 << 40).unwrap();
        no_layers.set_seq_len(1 << 40).unwrap();
        assert_eq!((no_layers.capacity(), no_layers.bytes()), (1 << 40, 0));
    }

    #[test]
    fn refused_growth_is_an_error_and_changes_nothing() {
        // 2^43 positions of 2^10 floats: a 2^55-byte buffer no allocator grants.
        let mut kv = GrowKv::new(1, 1 << 10, 1 << 43).unwrap();
        kv.k_mut(0, 3).unwrap().fill(1.5);
        let err = kv.k_mut(0, (1 << 43) - 1).unwrap_err();
        assert_eq!(err, KvError::AllocFailed { bytes: 1 << 55 });
        assert_eq!((kv.seq_len(), kv.capacity()), (4, 64));
        assert_eq!(kv.bytes(), footprint(1, 64, 1 << 10));
        assert_eq!(kv.k(0, 3), &[1.5; 1 << 10][..]);
        assert_eq!(kv.set_seq_len(1 << 43).unwrap_err(), err);
    }

    #[test]
    fn reads_never_grow() {
        let mut kv = GrowKv::new(2, 3, 500).unwrap();
        kv.k_mut(0, 63).unwrap();
        let before = (kv.capacity(), kv.bytes(), kv.seq_len());
        for layer in 0..2 {
            assert_eq!(kv.keys(layer).len(), 64 * 3);
            assert_eq!(kv.values(layer).len(), 64 * 3);
            for pos in 0..64 {
                assert_eq!(kv.k(layer, pos).len(), 3);
                assert_eq!(kv.v(layer, pos).len(), 3);
            }
        }
        assert_eq!((kv.capacity(), kv.bytes(), kv.seq_len()), before);
    }

    #[test]
    #[should_panic(expected = "layer 2 out of range")]
    fn write_to_a_missing_layer_panics_before_the_position_check() {
        let mut kv = GrowKv::new(2, 3, 10).unwrap();
        let _ = kv.k_mut(2, 99);
    }

    #[test]
    #[should_panic(expected = "not filled")]
    fn reading_past_seq_len_panics() {
        let mut kv = GrowKv::new(2, 3, 10).unwrap();
        kv.k_mut(0, 1).unwrap();
        let _ = kv.v(1, 2);
    }

    #[test]
    #[should_panic(expected = "layer 2 out of range")]
    fn keys_of_a_missing_layer_panics() {
        let kv = GrowKv::new(2, 3, 10).unwrap();
        let _ = kv.keys(2);
    }
}
