//! What attention reads: a [`KvView`] of one layer, handed out by the store.
//!
//! A view is a list of [`KvSegment`]s in ascending position order. A segment is a run of
//! slots holding consecutive positions `start .. start + len`, its keys and values as
//! [`KvRows`] of shape `[slots, n_kv_heads, head_dim]` in the store's element types (q8_0:
//! `head_dim / 32` blocks per head). A view also carries the store's codecs for its layer
//! ([`KvView::codecs`]): what attention must do to read the rows (a rotation, a key
//! offset to add back). The layout is the store's business: the dense and growing
//! stores hand out one segment (their rows `0..len`, contiguous); a ring of window slots
//! hands out two (the tail of the ring, then its head); a page table one per page. The
//! position of every slot is explicit (`start + i`), so attention computes its masks from
//! positions, never from slot indices (see [`Mask`](crate::backend::Mask)).
//!
//! Positions are unique across a view and increase from slot to slot and from segment
//! to segment ([`KvView::new`] checks it), so "the visible slots in view order" is the
//! same order as "the visible positions, ascending": a reduction over a view adds its
//! terms in position order whatever the store's layout, which is what lets two stores
//! holding the same rows give bitwise identical attention.
//!
//! A segment may also say how a query scores it ([`Scoring`]): a sink store
//! ([`SinkKv`](super::SinkKv)) scores its first positions with the query placed at its
//! position within the cache, and its window through a sliding window. Kernels read
//! every segment alike; the model computes attention over a view whose segments differ
//! in scoring one group of segments at a time ([`KvView::groups`]), each an attention
//! part, folded by the exact merge of `backend/part.rs`.

use std::ops::Range;

use ndarray::{ArrayView3, Axis, Slice};

use half::{bf16, f16};

use super::codec::LayerCodec;
use super::{BlockQ4_0, BlockQ8_0, KvCodec, KvError, KvType, Q8_0_BLOCK};
use crate::backend::Mask;

/// One layer's keys or values for a run of slots, `[slots, n_kv_heads, units per head]`,
/// in the store's element type: a unit is one value for the plain types and one block
/// of 32 for `q8_0` (so a `q8_0` head of 64 values is 2 [`BlockQ8_0`]s).
///
/// Views may be strided along the first two axes (a head range of a layer is); kernels
/// require the last axis to be contiguous, which every store's rows are.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum KvRows<'a> {
    /// 32-bit floats.
    F32(ArrayView3<'a, f32>),
    /// IEEE half floats.
    F16(ArrayView3<'a, f16>),
    /// bfloat16.
    BF16(ArrayView3<'a, bf16>),
    /// `q8_0` blocks, `[slots, n_kv_heads, head_dim / 32]`.
    Q8_0(ArrayView3<'a, BlockQ8_0>),
    /// `q4_0` blocks, `[slots, n_kv_heads, head_dim / 32]`.
    Q4_0(ArrayView3<'a, BlockQ4_0>),
}

/// Applies `$body` to the array inside a `KvRows`, rewrapping it in the same variant.
macro_rules! map_rows {
    ($rows:expr, $a:ident => $body:expr) => {
        match $rows {
            KvRows::F32($a) => KvRows::F32($body),
            KvRows::F16($a) => KvRows::F16($body),
            KvRows::BF16($a) => KvRows::BF16($body),
            KvRows::Q8_0($a) => KvRows::Q8_0($body),
            KvRows::Q4_0($a) => KvRows::Q4_0($body),
        }
    };
}

impl<'a> KvRows<'a> {
    /// The element type.
    pub fn kv_type(&self) -> KvType {
        match self {
            KvRows::F32(_) => KvType::F32,
            KvRows::F16(_) => KvType::F16,
            KvRows::BF16(_) => KvType::BF16,
            KvRows::Q8_0(_) => KvType::Q8_0,
            KvRows::Q4_0(_) => KvType::Q4_0,
        }
    }

    /// `[slots, n_kv_heads, head_dim]` in values (a `q8_0` head of `b` blocks is
    /// `32 · b` values).
    pub fn dim(&self) -> (usize, usize, usize) {
        match self {
            KvRows::F32(a) => a.dim(),
            KvRows::F16(a) => a.dim(),
            KvRows::BF16(a) => a.dim(),
            KvRows::Q8_0(a) => {
                let (s, h, b) = a.dim();
                (s, h, b * Q8_0_BLOCK)
            }
            KvRows::Q4_0(a) => {
                let (s, h, b) = a.dim();
                (s, h, b * Q8_0_BLOCK)
            }
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
        map_rows!(self, a => a.slice_axis_move(Axis(1), Slice::from(heads)))
    }

    /// Slots `slots` of this run.
    ///
    /// # Panics
    /// If `slots` is not within `0..len` (a programming error).
    pub fn slots(self, slots: Range<usize>) -> KvRows<'a> {
        map_rows!(self, a => a.slice_axis_move(Axis(0), Slice::from(slots)))
    }

    /// Whether the last axis is contiguous (what the kernels require).
    pub fn last_axis_contiguous(&self) -> bool {
        fn ok<T>(a: &ArrayView3<'_, T>) -> bool {
            a.shape().contains(&0) || a.shape()[2] <= 1 || a.strides()[2] == 1
        }
        match self {
            KvRows::F32(a) => ok(a),
            KvRows::F16(a) => ok(a),
            KvRows::BF16(a) => ok(a),
            KvRows::Q8_0(a) => ok(a),
            KvRows::Q4_0(a) => ok(a),
        }
    }

    /// The stored bytes of slot `t`, KV head `kvh`, in the type's GGUF layout (`F32`,
    /// `F16`, `BF16`, `Q8_0`, `Q4_0` little-endian), or `None` when the last axis is not
    /// contiguous.
    ///
    /// # Panics
    /// If `t` or `kvh` is out of range (a programming error).
    pub fn head_bytes(&self, t: usize, kvh: usize) -> Option<&'a [u8]> {
        fn row<'a, T: bytemuck::Pod>(
            a: ArrayView3<'a, T>,
            t: usize,
            kvh: usize,
        ) -> Option<&'a [u8]> {
            let r = a.index_axis_move(Axis(0), t).index_axis_move(Axis(0), kvh);
            r.to_slice().map(bytemuck::cast_slice)
        }
        match *self {
            KvRows::F32(a) => row(a, t, kvh),
            KvRows::F16(a) => row(a, t, kvh),
            KvRows::BF16(a) => row(a, t, kvh),
            KvRows::Q8_0(a) => row(a, t, kvh),
            KvRows::Q4_0(a) => row(a, t, kvh),
        }
    }
}

/// How a query scores a segment's keys. The default, [`Scoring::PLAIN`], is at the
/// query's own position through the layer's mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scoring {
    /// `Some(c)`: a query at position `p` scores these keys as if it sat at `min(p, c)`:
    /// rotated there (RoPE) and masked from there. A sink store's sinks are scored so,
    /// with `c` the last position within its cache. `None`: at `p`.
    pub query_cap: Option<usize>,
    /// The mask these keys are seen through instead of the layer's, or `None` (the
    /// layer's).
    pub mask: Option<Mask>,
}

impl Scoring {
    /// At the query's own position, through the layer's mask.
    pub const PLAIN: Scoring = Scoring {
        query_cap: None,
        mask: None,
    };

    /// The position a query at `q_pos` is scored at: `min(q_pos, query_cap)`.
    pub fn query_pos(&self, q_pos: usize) -> usize {
        self.query_cap.map_or(q_pos, |c| q_pos.min(c))
    }
}

/// A run of slots holding consecutive positions `start .. start + len`.
#[derive(Clone, Copy, Debug)]
pub struct KvSegment<'a> {
    start: usize,
    keys: KvRows<'a>,
    values: KvRows<'a>,
    scoring: Scoring,
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
            scoring: Scoring::PLAIN,
        })
    }

    /// The same slots, scored by `scoring`.
    pub fn with_scoring(self, scoring: Scoring) -> Self {
        KvSegment { scoring, ..self }
    }

    /// How a query scores these keys ([`Scoring::PLAIN`] unless
    /// [`with_scoring`](Self::with_scoring) said otherwise).
    pub fn scoring(&self) -> Scoring {
        self.scoring
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
            scoring: self.scoring,
        }
    }
}

/// One layer of a store as attention reads it: segments in ascending position order.
#[derive(Clone, Debug)]
pub struct KvView<'a> {
    n_kv_heads: usize,
    head_dim: usize,
    segments: Vec<KvSegment<'a>>,
    /// The codecs of the keys and of the values ([`codecs`](Self::codecs)).
    codecs: (LayerCodec<'a>, LayerCodec<'a>),
}

impl<'a> KvView<'a> {
    /// A view of `segments`, each `[len, n_kv_heads, head_dim]`.
    ///
    /// Errors with [`KvError::RowShape`] when a segment's heads or head size differ, with
    /// [`KvError::RowType`] when a segment's keys (or values) are of another element type
    /// than the first segment's, and with [`KvError::Positions`] when a segment does not
    /// start after the previous one ends (positions must be unique and ascending).
    pub fn new(
        n_kv_heads: usize,
        head_dim: usize,
        segments: Vec<KvSegment<'a>>,
    ) -> Result<Self, KvError> {
        let mut next = 0;
        let first = segments
            .first()
            .map(|s| (s.keys.kv_type(), s.values.kv_type()));
        for s in &segments {
            for (what, ty, want) in [
                ("segment keys", s.keys.kv_type(), first.map(|t| t.0)),
                ("segment values", s.values.kv_type(), first.map(|t| t.1)),
            ] {
                if let Some(expected) = want.filter(|&w| w != ty) {
                    return Err(KvError::RowType {
                        what,
                        expected,
                        found: ty,
                    });
                }
            }
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
        let (k, v) = first.unwrap_or((KvType::F32, KvType::F32));
        Ok(KvView {
            n_kv_heads,
            head_dim,
            segments,
            codecs: (LayerCodec::plain(k), LayerCodec::plain(v)),
        })
    }

    /// The same view with its keys read through `codec`, the store's key codec, as of
    /// model layer `layer` ([`KvCodec::layer`]): calibrated keys lack a key offset
    /// attention adds back ([`LayerCodec::key_offset`]).
    ///
    /// Errors with [`KvError::RowType`] when the keys are of another type than the
    /// codec's, and with [`KvError::Calibration`] when the codec's calibration does not
    /// cover the view (its heads, `layer`, a position held).
    pub fn with_key_codec(mut self, codec: &'a KvCodec, layer: usize) -> Result<Self, KvError> {
        if let Some((k, _)) = self.kv_types() {
            super::codec::check_key_codec(codec, k)?;
        }
        let keys = codec.layer(layer);
        keys.check_covers(self.n_kv_heads, self.head_dim, self.span().end)?;
        self.codecs.0 = keys;
        Ok(self)
    }

    /// The codecs of the keys and of the values as attention reads this view: whether
    /// each rotates heads ([`LayerCodec::rotated`]: the query matched against such keys,
    /// the output of such values rotated back) and the key offsets calibrated keys lack
    /// ([`LayerCodec::key_offset`]). Plain codecs of the f32 type for a view without
    /// segments made by [`new`](Self::new).
    pub fn codecs(&self) -> (LayerCodec<'a>, LayerCodec<'a>) {
        self.codecs
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

    /// The element types of the keys and of the values (every segment's), or `None` for a
    /// view without segments.
    pub fn kv_types(&self) -> Option<(KvType, KvType)> {
        let s = self.segments.first()?;
        Some((s.keys.kv_type(), s.values.kv_type()))
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

    /// Every position held, ascending.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().flat_map(KvSegment::positions)
    }

    /// The slots whose positions lie in `positions`, segments left empty dropped: what a
    /// backend computing attention in parts hands each part. Parts cut by positions, not
    /// by slot indices, are the same for every store holding the same rows.
    pub fn at_positions(&self, positions: Range<usize>) -> KvView<'a> {
        let mut segments = Vec::new();
        for s in &self.segments {
            let lo = positions.start.clamp(s.start, s.start + s.len());
            let hi = positions.end.clamp(s.start, s.start + s.len());
            if lo < hi {
                let r = lo - s.start..hi - s.start;
                segments.push(KvSegment {
                    start: lo,
                    keys: s.keys.slots(r.clone()),
                    values: s.values.slots(r),
                    scoring: s.scoring,
                });
            }
        }
        KvView {
            segments,
            ..self.clone_empty()
        }
    }

    /// The segments of `tail` after this view's, with `tail`'s codecs (two parts of one
    /// store's layer, such as a sink store's sinks and window).
    ///
    /// Errors as [`new`](Self::new) when the segments do not fit together.
    pub fn join(self, tail: KvView<'a>) -> Result<KvView<'a>, KvError> {
        let mut segments = self.segments;
        segments.extend(tail.segments);
        let codecs = tail.codecs;
        let view = KvView::new(tail.n_kv_heads, tail.head_dim, segments)?;
        Ok(KvView { codecs, ..view })
    }

    /// The same view with every segment scored by `scoring`.
    pub fn with_scoring(mut self, scoring: Scoring) -> KvView<'a> {
        for s in &mut self.segments {
            s.scoring = scoring;
        }
        self
    }

    /// Whether every segment is scored plainly ([`Scoring::PLAIN`]): attention over the
    /// view is one call.
    pub fn is_plain(&self) -> bool {
        self.segments.iter().all(|s| s.scoring == Scoring::PLAIN)
    }

    /// The runs of consecutive segments scored alike, each with its scoring, in position
    /// order: one per attention part of a view that is not [plain](Self::is_plain).
    pub fn groups(&self) -> Vec<(Scoring, KvView<'a>)> {
        let mut groups: Vec<(Scoring, KvView<'a>)> = Vec::new();
        for s in &self.segments {
            match groups.last_mut() {
                Some((scoring, view)) if *scoring == s.scoring => view.segments.push(*s),
                _ => groups.push((
                    s.scoring,
                    KvView {
                        segments: vec![*s],
                        ..self.clone_empty()
                    },
                )),
            }
        }
        groups
    }

    /// This view's shape and codecs without segments.
    fn clone_empty(&self) -> KvView<'a> {
        KvView {
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            segments: Vec::new(),
            codecs: self.codecs,
        }
    }

    /// The positions from the first held to one past the last (`0..0` when empty).
    pub fn span(&self) -> Range<usize> {
        match (self.segments.first(), self.segments.last()) {
            (Some(a), Some(b)) => a.start..b.start + b.len(),
            _ => 0..0,
        }
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
            codecs: (
                self.codecs.0.heads(heads.clone()),
                self.codecs.1.heads(heads),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    /// A view of positions 3..7 and 10..13 (a ring's tail and head), one head of 2.
    fn two_segments<'a>(a: &'a Array3<f32>, b: &'a Array3<f32>) -> KvView<'a> {
        let s1 = KvSegment::new(3, KvRows::F32(a.view()), KvRows::F32(a.view())).unwrap();
        let s2 = KvSegment::new(10, KvRows::F32(b.view()), KvRows::F32(b.view())).unwrap();
        KvView::new(1, 2, vec![s1, s2]).unwrap()
    }

    #[test]
    fn at_positions_cuts_by_position_and_drops_empty_segments() {
        let a = Array3::from_shape_fn((4, 1, 2), |(t, _, j)| (10 * t + j) as f32);
        let b = Array3::from_shape_fn((3, 1, 2), |(t, _, j)| (100 + 10 * t + j) as f32);
        let view = two_segments(&a, &b);
        assert_eq!(view.span(), 3..13);
        let positions = |v: &KvView<'_>| v.positions().collect::<Vec<_>>();
        assert_eq!(positions(&view.at_positions(0..5)), [3, 4]);
        assert_eq!(positions(&view.at_positions(5..12)), [5, 6, 10, 11]);
        assert_eq!(view.at_positions(7..10).segments().len(), 0);
        assert_eq!(positions(&view.at_positions(12..99)), [12]);
        let cut = view.at_positions(5..12);
        let KvRows::F32(first) = cut.segments()[0].keys() else {
            panic!("f32 rows")
        };
        assert_eq!(
            first[[0, 0, 1]],
            21.0,
            "slot of position 5 is row 2 of the first run"
        );
        assert_eq!(KvView::new(1, 2, vec![]).unwrap().span(), 0..0);
    }
}
