//! [`SinkKv`], attention sinks beside a sliding window (StreamingLLM) for models trained
//! without one: every layer keeps its first `keep` positions (the sinks) and its last
//! `w` (the window), evicting the rest as the sequence goes on, so a layer costs at most
//! `keep + w` positions however long the sequence.
//!
//! ## Positions within the cache
//! StreamingLLM scores a query with the positions the cache holds counted from 0: the
//! sinks at `0 .. keep`, the window after them. Keys here stay stored rotated to their
//! own positions and nothing is re-rotated; instead the view says how each segment is
//! scored ([`Scoring`]):
//! - the sinks (positions `j < keep`) with the query placed at its position within the
//!   cache, `min(p, keep + w − 1)` (`query_cap`), through the causal mask;
//! - the window with the query at its own position `p`, through a sliding window of `w`
//!   (a prefill longer than the window: each of its queries sees its own last `w`).
//!
//! RoPE makes a score depend only on the difference of the two rotations, so a query at
//! `p` sees a sink `j` at distance `min(p, keep + w − 1) − j` and a window key `k` at
//! `p − k`: exactly the distances between their slots in a cache of the sinks followed
//! by the window, which StreamingLLM re-rotates to (`tests/integration/sink_store.rs`
//! checks both). Until `keep + w` positions are held nothing is evicted and a query sees
//! every position at its true distance: the store is then a dense one, scored in two
//! parts. The model computes the two as attention parts folded by the exact merge
//! (`Llama`'s attention over a view whose segments differ in scoring).
//!
//! ## Design
//! Two stores of this module: a [`GrowKv`] of at most `keep` positions holds the sinks
//! and a [`WindowKv`] whose every layer is a window of `w` holds the rest (its ring
//! retains the last `w` committed positions; the sinks' positions are hidden from its
//! part of the view). An append goes to both (the sinks take the rows of positions below
//! `keep`), and every check, allocation and error is theirs: `begin` opens the window's
//! append, then the sinks' (rolling the window's back if that fails); a commit first
//! checks that every layer was written, so neither half can fail after the other
//! committed. Rewinding is the window's rule ([`KvError::BehindWindow`]).
//!
//! ## Memory
//! `bytes()` is the two stores' bytes: outside an append at most `(keep + min(w,
//! max_ctx))` positions' K and V rows per layer.

use std::fmt;
use std::sync::Arc;

use ndarray::{ArrayView2, s};

use super::Scoring;
use super::{
    AllocGate, GrowKv, KvCodec, KvError, KvGeometry, KvStore, KvType, KvView, WindowKv,
    check_complete,
};
use crate::backend::Mask;

/// Sinks and a window: every layer keeps its first `keep` positions and its last `w`;
/// its view scores the sinks with the query at its position within the cache
/// (`min(p, keep + w − 1)`) and the window through a sliding window of `w` (see the
/// module docs). Memory: at most `keep + min(w, max_ctx)` positions per layer.
///
/// Appends are transactional, `truncate` and `can_rewind_to` follow [`WindowKv`]'s rule
/// (a rewind needs every window position a query there sees), `fork` copies. State files
/// do not restore into it (no [`KvRestore`](super::KvRestore)).
///
/// `W` holds what is not a sink: a [`WindowKv`] whose every layer is a window of `w`
/// (what the constructors build), or, for a reference that scores the same positions
/// while evicting nothing, any store keeping every position ([`over`](SinkKv::over)).
pub struct SinkKv<W = WindowKv> {
    keep: usize,
    window: usize,
    /// Positions `0 .. min(len, keep)`.
    sinks: GrowKv,
    /// Every layer a window of `window`: the last `window` positions.
    rest: W,
    /// The open append: its start, length and the layers written.
    pending: Option<(usize, usize, Vec<bool>)>,
}

impl SinkKv {
    /// An empty store of `geometry` keeping `keep` sinks and a window of `window`
    /// positions per layer, positions below `max_ctx`, in f32.
    ///
    /// # Errors
    /// [`KvError::ZeroWindow`] for a window of 0, as [`WindowKv::new`] otherwise.
    pub fn new(
        geometry: KvGeometry,
        max_ctx: usize,
        keep: usize,
        window: usize,
    ) -> Result<Self, KvError> {
        Self::with_types(geometry, max_ctx, keep, window, (KvType::F32, KvType::F32))
    }

    /// [`new`](SinkKv::new) with K rows of type `types.0` and V rows of `types.1`.
    ///
    /// # Errors
    /// As [`new`](SinkKv::new), and [`KvError::BlockShape`] when a type's blocks do not
    /// divide the head size.
    pub fn with_types(
        geometry: KvGeometry,
        max_ctx: usize,
        keep: usize,
        window: usize,
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        let windows = vec![Some(window); geometry.n_layers];
        SinkKv::over(
            WindowKv::with_types(geometry, max_ctx, &windows, types)?,
            keep,
            window,
        )
    }

    /// The same empty store encoding its keys through `codec`, as
    /// [`WindowKv::with_key_codec`].
    ///
    /// # Errors
    /// As [`WindowKv::with_key_codec`].
    pub fn with_key_codec(self, codec: &KvCodec) -> Result<Self, KvError> {
        Ok(SinkKv {
            rest: self.rest.with_key_codec(codec)?,
            sinks: self.sinks.with_key_codec(codec)?,
            ..self
        })
    }

    /// Consults `gate` before every later allocation (see [`AllocGate`]); forks inherit
    /// it.
    pub fn set_alloc_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.sinks.set_alloc_gate(gate.clone());
        self.rest.set_alloc_gate(gate);
    }
}

impl<W: KvStore> SinkKv<W> {
    /// Sinks `keep` and window `window` over `rest`, an empty store holding what is not
    /// a sink, its view scored as this store's: with a store that keeps every position
    /// (a [`DenseKv`](super::DenseKv)), the reference that scores the same positions as
    /// a sink store without evicting any. The sinks take `rest`'s geometry, types and
    /// key codec.
    ///
    /// Whatever `rest` holds is dropped (cleared) first.
    ///
    /// # Errors
    /// [`KvError::ZeroWindow`] for a window of 0; the sinks' allocation errors.
    pub fn over(mut rest: W, keep: usize, window: usize) -> Result<Self, KvError> {
        if window == 0 {
            return Err(KvError::ZeroWindow { layer: 0 });
        }
        rest.clear();
        let (g, max_ctx) = (rest.geometry(), rest.max_ctx());
        let sinks = GrowKv::with_types(g, keep.min(max_ctx), rest.kv_types())?
            .with_key_codec(&rest.codecs().0)?;
        Ok(SinkKv {
            keep,
            window,
            sinks,
            rest,
            pending: None,
        })
    }

    /// The sinks kept: the first `keep` positions.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// The window: the last `w` positions.
    pub fn window_len(&self) -> usize {
        self.window
    }

    /// How a query scores the sinks: at `min(p, keep + w − 1)`, its position within a
    /// cache of the sinks and the window, causally.
    pub fn sink_scoring(&self) -> Scoring {
        Scoring {
            query_cap: Some((self.keep + self.window).saturating_sub(1)),
            mask: Some(Mask::Causal),
        }
    }

    /// How a query scores the window: at its own position, through a sliding window of
    /// `w`.
    pub fn window_scoring(&self) -> Scoring {
        Scoring {
            query_cap: None,
            mask: Some(Mask::SlidingWindow {
                window: self.window,
            }),
        }
    }

    /// The sink rows of an append of `n` at `at`: how many of its first rows fall below
    /// `keep`.
    fn sink_rows(&self, at: usize, n: usize) -> usize {
        self.keep.saturating_sub(at).min(n)
    }
}

impl<W: KvStore + 'static> KvStore for SinkKv<W> {
    fn geometry(&self) -> KvGeometry {
        self.rest.geometry()
    }

    fn kv_types(&self) -> (KvType, KvType) {
        self.rest.kv_types()
    }

    fn max_ctx(&self) -> usize {
        self.rest.max_ctx()
    }

    fn len(&self) -> usize {
        self.rest.len()
    }

    fn capacity(&self) -> usize {
        self.sinks.capacity() + self.rest.capacity()
    }

    fn bytes(&self) -> usize {
        self.sinks.bytes() + self.rest.bytes()
    }

    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        let rest = self.rest.view(layer)?.at_positions(self.keep..usize::MAX);
        let sinks = self.sinks.view(layer)?.at_positions(0..self.keep);
        let sinks = sinks.with_scoring(self.sink_scoring());
        sinks.join(rest.with_scoring(self.window_scoring()))
    }

    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        self.rest.begin(at, n)?;
        // An append below `keep` replaces the sinks from `at` on (with no rows when
        // `n = 0`: a rewind).
        if at < self.keep
            && let Err(e) = self.sinks.begin(at, self.sink_rows(at, n))
        {
            self.rest.rollback();
            return Err(e);
        }
        self.pending = Some((at, n, vec![false; self.geometry().n_layers]));
        Ok(())
    }

    fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        self.rest.write(layer, k, v)?;
        let (at, n, written) = self.pending.as_mut().ok_or(KvError::NoAppend)?;
        written[layer] = true;
        if *at < self.keep {
            let m = self.keep.saturating_sub(*at).min(*n);
            self.sinks
                .write(layer, k.slice(s![..m, ..]), v.slice(s![..m, ..]))?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), KvError> {
        let (at, n, written) = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        check_complete(*n, written)?;
        // Every layer written: neither commit can fail.
        if *at < self.keep {
            self.sinks.commit()?;
        }
        self.rest.commit()?;
        self.pending = None;
        Ok(())
    }

    fn rollback(&mut self) {
        self.sinks.rollback();
        self.rest.rollback();
        self.pending = None;
    }

    fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        self.rest.truncate(n)?;
        self.pending = None;
        self.sinks.truncate(n)
    }

    fn codecs(&self) -> (KvCodec, KvCodec) {
        self.rest.codecs()
    }

    fn can_rewind_to(&self, n: usize) -> bool {
        self.rest.can_rewind_to(n)
    }

    fn fork(&self) -> Result<Self, KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        Ok(SinkKv {
            sinks: self.sinks.fork()?,
            rest: self.rest.fork()?,
            pending: None,
            keep: self.keep,
            window: self.window,
        })
    }

    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
        Ok(Box::new(self.fork()?))
    }
}

impl<W> fmt::Debug for SinkKv<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkKv")
            .field("keep", &self.keep)
            .field("window", &self.window)
            .field("append_open", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}
