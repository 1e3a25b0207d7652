//! What attention reads: a [`KvView`] of one layer, handed out by the store.
//!
//! A view is a list of [`KvSegment`]s in ascending position order. A segment is a run of
//! slots holding consecutive positions `start .. start + len`, its keys and values as
//! [`KvRows`] of shape `[slots, n_kv_heads, head_dim]` in the store's element type. The
//! layout is the store's business: the dense and growing stores hand out one segment
//! (their rows `0..len`, contiguous); a ring of window slots hands out two (the tail of
//! the ring, then its head); a page table one per page. The position of every slot is
//! explicit (`start + i`), so attention computes its masks from positions, never from
//! slot indices (see [`Mask`](crate::backend::Mask)).
//!
//! Positions are unique across a view and increase from slot to slot and from segment
//! to segment ([`KvView::new`] checks it), so "the visible slots in view order" is the
//! same order as "the visible positions, ascending": a reduction over a view adds its
//! terms in position order whatever the store's layout, which is what lets two stores
//! holding the same rows give bitwise identical attention.

use std::ops::Range;

use ndarray::{ArrayView3, Axis, Slice};

use super::{KvError, KvType};
use crate::backend::Mask;

/// One layer's keys or values for a run of slots, `[slots, n_kv_heads, head_dim]`, in
/// the store's element type.
///
/// Views may be strided along the first two axes (a head range of a layer is); kernels
/// require the last axis to be contiguous, which every store's rows are.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum KvRows<'a> {
    /// 32-bit floats.
    F32(ArrayView3<'a, f32>),
}

impl<'a> KvRows<'a> {
    /// The element type.
    pub fn kv_type(&self) -> KvType {
        match self {
            KvRows::F32(_) => KvType::F32,
        }
    }

    /// `[slots, n_kv_heads, head_dim]`.
    pub fn dim(&self) -> (usize, usize, usize) {
        match self {
            KvRows::F32(a) => a.dim(),
        }
    }

    /// Slots (positions) held.
    pub fn len(&self) -> usize {
        self.dim().0
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// KV heads `heads` of every slot.
    ///
    /// # Panics
    /// If `heads` is not within `0..n_kv_heads` (a programming error).
    pub fn heads(self, heads: Range<usize>) -> KvRows<'a> {
        match self {
            KvRows::F32(a) => KvRows::F32(a.slice_axis_move(Axis(1), Slice::from(heads))),
        }
    }

    /// Slots `slots` of this run.
    ///
    /// # Panics
    /// If `slots` is not within `0..len` (a programming error).
    pub fn slots(self, slots: Range<usize>) -> KvRows<'a> {
        match self {
            KvRows::F32(a) => KvRows::F32(a.slice_axis_move(Axis(0), Slice::from(slots))),
        }
    }
}

/// A run of slots holding consecutive positions `start .. start + len`.
#[derive(Clone, Copy, Debug)]
pub struct KvSegment<'a> {
    start: usize,
    keys: KvRows<'a>,
    values: KvRows<'a>,
}

impl<'a> KvSegment<'a> {
    /// The slots of `keys` and `values` (same shape) at positions `start ..`.
    ///
    /// Errors with [`KvError::RowShape`] when the two shapes differ and with
    /// [`KvError::PositionOverflow`] when `start + len` overflows.
    pub fn new(start: usize, keys: KvRows<'a>, values: KvRows<'a>) -> Result<Self, KvError> {
        if keys.dim() != values.dim() {
            let (k, v) = (keys.dim(), values.dim());
            return Err(KvError::RowShape {
                what: "segment values",
                expected: (k.0, k.1 * k.2),
                found: (v.0, v.1 * v.2),
            });
        }
        if start.checked_add(keys.len()).is_none() {
            return Err(KvError::PositionOverflow {
                start,
                len: keys.len(),
            });
        }
        Ok(KvSegment {
            start,
            keys,
            values,
        })
    }

    /// Position of the first slot.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The positions held, `start .. start + len`: slot `i` holds `start + i`.
    pub fn positions(&self) -> Range<usize> {
        self.start..self.start + self.len()
    }

    /// The keys, `[len, n_kv_heads, head_dim]`.
    pub fn keys(&self) -> KvRows<'a> {
        self.keys
    }

    /// The values, `[len, n_kv_heads, head_dim]`.
    pub fn values(&self) -> KvRows<'a> {
        self.values
    }

    /// The slots a query at `q_pos` sees under `mask`: a range of slot indices (the
    /// positions this segment holds that `mask` lets through, which are consecutive).
    pub fn visible(&self, q_pos: usize, mask: Mask) -> Range<usize> {
        let seen = mask.visible_positions(q_pos);
        let lo = seen.start.max(self.start);
        let hi = seen.end.min(self.start + self.len());
        if lo >= hi {
            0..0
        } else {
            lo - self.start..hi - self.start
        }
    }

    /// The same slots restricted to KV heads `heads`.
    ///
    /// # Panics
    /// If `heads` is not within `0..n_kv_heads`.
    pub fn heads(&self, heads: Range<usize>) -> KvSegment<'a> {
        KvSegment {
            start: self.start,
            keys: self.keys.heads(heads.clone()),
            values: self.values.heads(heads),
        }
    }
}

/// A segment whose keys and values are f32 rows ([`KvView::f32_segments`]).
#[derive(Clone, Copy, Debug)]
pub struct F32Segment<'a> {
    /// The segment (positions, and the rows as [`KvRows`]).
    pub segment: KvSegment<'a>,
    /// Its keys, `[len, n_kv_heads, head_dim]`.
    pub keys: ArrayView3<'a, f32>,
    /// Its values, `[len, n_kv_heads, head_dim]`.
    pub values: ArrayView3<'a, f32>,
}

/// One layer of a store as attention reads it: segments in ascending position order.
#[derive(Clone, Debug)]
pub struct KvView<'a> {
    n_kv_heads: usize,
    head_dim: usize,
    segments: Vec<KvSegment<'a>>,
}

impl<'a> KvView<'a> {
    /// A view of `segments`, each `[len, n_kv_heads, head_dim]`.
    ///
    /// Errors with [`KvError::RowShape`] when a segment's heads or head size differ, and
    /// with [`KvError::Positions`] when a segment does not start after the previous one
    /// ends (positions must be unique and ascending).
    pub fn new(
        n_kv_heads: usize,
        head_dim: usize,
        segments: Vec<KvSegment<'a>>,
    ) -> Result<Self, KvError> {
        let mut next = 0;
        for s in &segments {
            let (len, h, d) = s.keys.dim();
            if (h, d) != (n_kv_heads, head_dim) {
                return Err(KvError::RowShape {
                    what: "segment keys",
                    expected: (len, n_kv_heads * head_dim),
                    found: (len, h * d),
                });
            }
            if s.start < next {
                return Err(KvError::Positions {
                    start: s.start,
                    after: next,
                });
            }
            next = s.start + len;
        }
        Ok(KvView {
            n_kv_heads,
            head_dim,
            segments,
        })
    }

    /// One segment of f32 rows at positions `0 .. len`: `keys`, `values`:
    /// `[len, n_kv_heads, head_dim]` (the layout of a dense cache, and the simplest way to
    /// hand attention rows held elsewhere).
    ///
    /// Errors with [`KvError::RowShape`] when the two shapes differ.
    pub fn from_f32(
        keys: ArrayView3<'a, f32>,
        values: ArrayView3<'a, f32>,
    ) -> Result<Self, KvError> {
        let (_, h, d) = keys.dim();
        let segment = KvSegment::new(0, KvRows::F32(keys), KvRows::F32(values))?;
        KvView::new(h, d, vec![segment])
    }

    /// KV heads per slot.
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The segments, in ascending position order.
    pub fn segments(&self) -> &[KvSegment<'a>] {
        &self.segments
    }

    /// Slots held, over all segments.
    pub fn len(&self) -> usize {
        self.segments.iter().map(KvSegment::len).sum()
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments with their rows as f32 arrays, for a kernel that reads f32 rows;
    /// errors with the first other element type met (keys before values).
    pub fn f32_segments(&self) -> Result<Vec<F32Segment<'a>>, KvType> {
        self.segments
            .iter()
            .map(|&segment| match (segment.keys, segment.values) {
                (KvRows::F32(keys), KvRows::F32(values)) => Ok(F32Segment {
                    segment,
                    keys,
                    values,
                }),
                // Reachable once `KvRows` has a second element type.
                #[allow(unreachable_patterns)]
                (KvRows::F32(_), other) | (other, _) => Err(other.kv_type()),
            })
            .collect()
    }

    /// Every position held, ascending.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().flat_map(KvSegment::positions)
    }

    /// The same slots restricted to KV heads `heads`.
    ///
    /// # Panics
    /// If `heads` is not within `0..n_kv_heads` (a programming error).
    pub fn heads(&self, heads: Range<usize>) -> KvView<'a> {
        assert!(
            heads.start <= heads.end && heads.end <= self.n_kv_heads,
            "kv heads {heads:?} out of range for {}",
            self.n_kv_heads
        );
        KvView {
            n_kv_heads: heads.len(),
            head_dim: self.head_dim,
            segments: self
                .segments
                .iter()
                .map(|s| s.heads(heads.clone()))
                .collect(),
        }
    }
}
