//! [`WindowKv`], the sliding-window KV store: layers that attend through a sliding window
//! keep only their most recent positions in a ring; the others (global layers) keep every
//! position and grow on demand, exactly as [`GrowKv`](super::GrowKv).
//!
//! ## Design
//! Each layer is either *global* (`None` in the window list) or a *window layer* of `w`
//! positions (`Some(w)`: a query at `p` sees the keys at `p − w < k ≤ p`,
//! [`Mask::SlidingWindow`](crate::backend::Mask)).
//! - The global layers live in one inner `Rows` (`rows.rs`, the code of `GrowKv`) over
//!   those layers only, with a map from layer index to its index there.
//! - A window layer is a ring of slots, `[cap]` rows of K's and of V's element type
//!   (`elem.rs`), position `p` in slot `p mod cap`. It holds the committed positions
//!   `lo .. len`, at most `w` of them: after every commit it retains the last `w` committed
//!   positions (so the last one can
//!   always be replaced, as a session re-running its last token does, with the `w − 1`
//!   before it still visible). The ring grows on demand like `GrowKv`: it starts at
//!   `min(64, w, max_ctx)` slots and doubles, clamped to `min(w, max_ctx)`, re-laying
//!   out its positions in the new buffers; it only evicts once it is at that size.
//! - Its [`view`](super::KvStore::view) is the retained positions in ascending order (one
//!   segment, or two when they wrap around the ring's end), positions explicit, then,
//!   once the open append has written the layer, the pending rows.
//!
//! ## Transactions
//! `begin` allocates everything the append needs through the [`AllocGate`]: the global
//! layers' growth (as `GrowKv`), each ring's growth (new buffers holding a copy of the
//! retained positions; the old ones stay in use until the commit) and a staging buffer of
//! all `n` pending rows per window layer: every pending row must be visible to the pass's
//! own attention, since the early queries of a prefill longer than the window see their
//! own window of the same pass. A `write` fills the staging buffer; the committed ring is
//! untouched, so a rollback only drops the pending buffers, and `capacity()` and `bytes()`
//! are restored exactly. `commit` swaps in the grown ring and copies the last
//! `min(n, retained)` pending rows into it, which cannot fail. During an append at
//! `at < len` a window layer's view hides its committed positions `≥ at`.
//!
//! ## Memory
//! Outside an append, `bytes()` is `(K row bytes + V row bytes) · (n_global · c +
//! Σ_window cap)` (a row pair is `2 · kv_dim · 4` bytes in f32), where `c` is the global
//! layers' capacity and each ring's `cap ≤ min(w, max_ctx)`: a window layer costs at most
//! `w` positions however long the sequence. During an append add the staging buffers (`n`
//! rows per window layer) and any grown buffers.
//!
//! ## Rewinding behind the window
//! A ring cannot bring back what it evicted. Going back to position `n` (a
//! [`truncate`](super::KvStore::truncate)`(n)` or an append at `n < len`) needs every
//! position a query at `n` sees, `n + 1 − w .. n`, still in every window layer; when one
//! is gone the call fails with [`KvError::BehindWindow`] and changes nothing
//! ([`can_rewind_to`](super::KvStore::can_rewind_to) answers beforehand). After a run
//! longer than the window that leaves only the last position replaceable (once), and
//! `0` (a clear). A [`Session`](crate::Session) whose new turn diverges behind that limit
//! re-prefills from position 0.
//!
//! ## Checkpoints
//! A store made [`with_checkpoints`](WindowKv::with_checkpoints) keeps snapshots of its
//! rings every `K` positions (`checkpoint.rs`): a truncation to a checkpoint's position,
//! or an append starting there, is then possible behind the windows too, and a session
//! re-prefills only from the nearest checkpoint before a divergence. An append at a
//! checkpoint behind the windows views, commits and rolls back as any other: until its
//! commit the checkpoint's rows stand in for the ring's in the written layers' views,
//! and the commit copies them into the ring before the pending rows.

use std::fmt;
use std::sync::Arc;

use ndarray::ArrayView2;

use super::checkpoint::{Checkpoints, Kept, RingRows, Snapshot};
use super::elem::Buf;
use super::rows::{Rows, checked_size, grown_capacity};
use super::{
    AllocGate, Gate, KeyOffsets, KvCodec, KvError, KvGeometry, KvRestore, KvRows, KvSegment,
    KvStore, KvType, KvView, check_begin, check_complete, check_rows, check_stored, restore_starts,
};

/// The sliding-window KV store: global layers grow on demand as in
/// [`GrowKv`](super::GrowKv), window layers keep a ring of their last `w` positions.
///
/// - **Views**: a window layer's view is its retained positions, ascending (one segment,
///   or two when they wrap around the ring's end), then, once the open append has
///   written the layer, all `n` pending rows (staged in `begin`, so the early queries of
///   a prefill longer than the window see their own window).
/// - **Memory**: outside an append a window layer holds at most `min(w, max_ctx)` slots
///   (it starts at `min(64, w, max_ctx)` and doubles on demand), a global layer as many
///   as `GrowKv` would; `bytes()` is a slot's K and V row bytes (`2 · kv_dim · 4` in f32)
///   times the slots of every layer, plus, during an append, the staging of `n` rows per
///   window layer and any grown buffers.
///   Every allocation of an append happens in `begin`, and a rollback restores
///   `capacity()` and `bytes()` exactly.
/// - **Rewinding**: after every commit a window layer retains its last `w` committed
///   positions, so the last position can always be replaced. Going back to `0 < n <
///   len` (`truncate(n)` or `begin(n, ..)`) needs every position a query at `n` sees,
///   `n + 1 − w .. n`, in every window layer; when one was evicted the call fails with
///   [`KvError::BehindWindow`] and changes nothing
///   ([`can_rewind_to`](KvStore::can_rewind_to) tells beforehand). `0` (a clear) and
///   `len` are always possible, and so is every window checkpoint's position when the
///   store keeps them ([`with_checkpoints`](Self::with_checkpoints)). A
///   [`Session`](crate::Session) then re-prefills from the nearest of these before the
///   divergence.
///
/// For every sequence of calls that does not rewind behind a window (other than to a
/// checkpoint), its views hold,
/// for every position a query can still see, bitwise the rows of a
/// [`DenseKv`](super::DenseKv) given the same calls, so attention with the window as a
/// mask gives bitwise the same result.
pub struct WindowKv {
    geometry: KvGeometry,
    /// K's and V's element types.
    types: (KvType, KvType),
    kv_dim: usize,
    max_ctx: usize,
    /// Committed positions, `0 .. len`.
    len: usize,
    /// `[n_layers]`: `None` global, `Some(w)` a window of `w` positions.
    windows: Vec<Option<usize>>,
    /// `[n_layers]`: the layer's index in `global` or in `rings`.
    map: Vec<Layer>,
    /// The global layers.
    global: Rows,
    /// The window layers, in layer order.
    rings: Vec<Ring>,
    gate: Gate,
    pending: Option<Pending>,
    /// The codecs of K and V (`kv/codec.rs`), the key codec also given to `global`.
    codecs: (KvCodec, KvCodec),
    /// The window checkpoints (`checkpoint.rs`).
    checkpoints: Kept,
}

/// Where a layer's rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer {
    Global(usize),
    Window(usize),
}

/// A window layer: positions `lo .. len` in slots `p mod cap`.
struct Ring {
    window: usize,
    /// Slots, `≤ min(window, max_ctx)`; `len − lo ≤ cap`.
    cap: usize,
    /// The first retained position.
    lo: usize,
    /// `[cap]` rows of K's type
    k: Buf,
    /// `[cap]` rows of V's type
    v: Buf,
}

/// An open append.
struct Pending {
    at: usize,
    n: usize,
    /// A restore ([`KvRestore::begin_restore`]): window layers are given rows `start .. n`.
    restore: bool,
    /// `[n_layers]`: whether the layer's rows have been written.
    written: Vec<bool>,
    /// `[rings]`
    rings: Vec<Staged>,
    /// The checkpoint behind the windows this append starts at, by its position.
    from: Option<usize>,
    /// The checkpoints this append takes, filled by the commit.
    snaps: Vec<Snapshot>,
}

/// The pending state of one window layer.
struct Staged {
    /// The grown ring (its `k`, `v`, `cap`; `lo` unused), holding a copy of the retained
    /// positions, swapped in at the commit.
    grown: Option<Ring>,
    /// The first pending position: `at`, or in a restore the `start` written.
    first: usize,
    /// `[rows]`: the pending rows of positions `first ..`, in K's type.
    k: Buf,
    /// `[rows]`, in V's type.
    v: Buf,
    /// Rows written.
    rows: usize,
}

impl Ring {
    fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }

    /// The slot ranges holding positions `a .. b` (`b − a ≤ cap`), in position order:
    /// `(first position, first slot, slots)`, one or two runs.
    fn runs(&self, a: usize, b: usize) -> impl Iterator<Item = (usize, usize, usize)> + use<> {
        let count = b.saturating_sub(a);
        let (slot, first) = if count == 0 {
            (0, 0)
        } else {
            let slot = a % self.cap;
            (slot, count.min(self.cap - slot))
        };
        [(a, slot, first), (a + first, 0, count - first)]
            .into_iter()
            .filter(|r| r.2 > 0)
    }
}

impl WindowKv {
    /// Slots a ring or the global layers start with (clamped to the window and
    /// `max_ctx`), as [`GrowKv::DEFAULT_INITIAL_CAPACITY`](super::GrowKv).
    pub const INITIAL_CAPACITY: usize = 64;

    /// An empty store of `geometry` with the hard ceiling `max_ctx` and one entry of
    /// `windows` per layer: `None` for a global layer (keeps every position), `Some(w)`
    /// for a sliding-window layer of `w ≥ 1` positions. Global layers start with
    /// `min(64, max_ctx)` slots, rings with `min(64, w, max_ctx)`.
    ///
    /// # Errors
    /// [`KvError::WindowCount`] when `windows.len() != n_layers`, [`KvError::ZeroWindow`]
    /// for a window of 0, [`KvError::TooLarge`] when the store at full dense size would
    /// not fit in `isize::MAX` bytes (the same rule as the other stores, checked up
    /// front), [`KvError::AllocFailed`] when the initial buffers are refused.
    pub fn new(
        geometry: KvGeometry,
        max_ctx: usize,
        windows: &[Option<usize>],
    ) -> Result<Self, KvError> {
        Self::with_types(geometry, max_ctx, windows, (KvType::F32, KvType::F32))
    }

    /// [`new`](WindowKv::new) with K rows of type `types.0` and V rows of `types.1`.
    ///
    /// # Errors
    /// As [`new`](WindowKv::new), and [`KvError::BlockShape`] when a type's blocks do not
    /// divide the head size.
    pub fn with_types(
        geometry: KvGeometry,
        max_ctx: usize,
        windows: &[Option<usize>],
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        if windows.len() != geometry.n_layers {
            return Err(KvError::WindowCount {
                found: windows.len(),
                n_layers: geometry.n_layers,
            });
        }
        if let Some(layer) = windows.iter().position(|w| *w == Some(0)) {
            return Err(KvError::ZeroWindow { layer });
        }
        let kv_dim = checked_size(&geometry, max_ctx, types)?;
        let (mut n_global, mut n_rings) = (0, 0);
        let map = windows
            .iter()
            .map(|w| match w {
                None => (Layer::Global(n_global), n_global += 1).0,
                Some(_) => (Layer::Window(n_rings), n_rings += 1).0,
            })
            .collect();
        let global = Rows::new(
            KvGeometry {
                n_layers: n_global,
                ..geometry
            },
            max_ctx,
            Self::INITIAL_CAPACITY,
            types,
        )?;
        let rings = windows
            .iter()
            .flatten()
            .map(|&window| {
                let cap = Self::INITIAL_CAPACITY.min(window).min(max_ctx);
                Ok(Ring {
                    window,
                    cap,
                    lo: 0,
                    k: Buf::zeroed(types.0, kv_dim, cap, &None)?,
                    v: Buf::zeroed(types.1, kv_dim, cap, &None)?,
                })
            })
            .collect::<Result<_, KvError>>()?;
        Ok(WindowKv {
            geometry,
            types,
            kv_dim,
            max_ctx,
            len: 0,
            windows: windows.to_vec(),
            map,
            global,
            rings,
            gate: None,
            pending: None,
            codecs: (KvCodec::new(types.0), KvCodec::new(types.1)),
            checkpoints: Kept::new(Checkpoints::NONE),
        })
    }

    /// The same store keeping window checkpoints as `setting` says (see
    /// [`Checkpoints`]; a new store keeps none, [`Checkpoints::NONE`]): from then on a
    /// truncation to a checkpoint, or an append starting at one, is possible behind the
    /// windows. Checkpoints past the new count are dropped, the oldest first.
    pub fn with_checkpoints(mut self, setting: Checkpoints) -> Self {
        self.checkpoints.setting = setting;
        self.checkpoints.trim();
        self
    }

    /// The checkpoint setting.
    pub fn checkpoints(&self) -> Checkpoints {
        self.checkpoints.setting
    }

    /// The positions of the checkpoints kept, ascending.
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.snaps.iter().map(|s| s.pos).collect()
    }

    /// The same empty store encoding its keys through `codec` (a model's comes from
    /// [`Llama::key_codec`](crate::model::Llama::key_codec)), calibration and all.
    ///
    /// # Errors
    /// [`KvError::RowType`] when the codec's type is not the keys';
    /// [`KvError::Calibration`] when the store holds positions (and another codec) or the
    /// calibration does not fit its geometry or cover its `max_ctx`.
    pub fn with_key_codec(mut self, codec: &KvCodec) -> Result<Self, KvError> {
        let changes = *codec != self.codecs.0;
        if changes && (self.len > 0 || self.pending.is_some() || self.global.is_open()) {
            return Err(KvError::Calibration {
                reason: "a key codec is set on an empty store",
            });
        }
        codec.check_store(self.geometry, self.max_ctx, self.types.0)?;
        let layers = (self.map.iter().enumerate())
            .filter(|(_, l)| matches!(l, Layer::Global(_)))
            .map(|(layer, _)| layer)
            .collect();
        self.global.set_key_codec(codec.clone(), layers);
        self.codecs.0 = codec.clone();
        Ok(self)
    }

    /// [`with_key_codec`](Self::with_key_codec) of the key codec kept less `offsets`
    /// ([`KvCodec::with_key_offsets`]).
    ///
    /// # Errors
    /// As `with_key_codec`, and [`KvError::Calibration`] when the keys' type does not
    /// calibrate.
    pub fn with_key_offsets(self, offsets: Arc<KeyOffsets>) -> Result<Self, KvError> {
        let codec = KvCodec::with_key_offsets(self.types.0, offsets)?;
        self.with_key_codec(&codec)
    }

    /// Consults `gate` before every later allocation (see [`AllocGate`]); `None` admits
    /// all. Forks inherit the gate.
    pub fn set_alloc_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.global.set_gate(gate.clone());
        self.gate = gate;
    }

    /// The window of every layer, as given to [`new`](WindowKv::new).
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// Slots allocated for layer `layer` (for a window layer at most `min(w, max_ctx)`),
    /// or `None` when out of range. During an append that grows the layer, the grown
    /// size.
    pub fn layer_capacity(&self, layer: usize) -> Option<usize> {
        Some(match *self.map.get(layer)? {
            Layer::Global(_) => self.global.capacity(),
            Layer::Window(r) => self.ring_cap(r),
        })
    }

    /// Ring `r`'s slots, counting a growth of the open append.
    fn ring_cap(&self, r: usize) -> usize {
        let grown = self
            .pending
            .as_ref()
            .and_then(|p| p.rings[r].grown.as_ref());
        grown.map_or(self.rings[r].cap, |g| g.cap)
    }

    fn check_layer(&self, layer: usize) -> Result<Layer, KvError> {
        self.map.get(layer).copied().ok_or(KvError::NoSuchLayer {
            layer,
            n_layers: self.geometry.n_layers,
        })
    }

    /// Whether a query at `n` sees only positions every ring still holds.
    fn rings_hold(&self, n: usize) -> bool {
        self.rings
            .iter()
            .all(|r| r.lo <= (n + 1).saturating_sub(r.window))
    }

    /// The error of a rewind to `pos` behind a window.
    fn behind(&self, pos: usize) -> KvError {
        let earliest = self
            .rings
            .iter()
            .filter(|r| r.lo > 0)
            .map(|r| r.lo.saturating_add(r.window - 1))
            .max()
            .unwrap_or(0)
            .min(self.len);
        KvError::BehindWindow { pos, earliest }
    }

    /// The pending state of every ring for an append of positions `at .. end` whose
    /// window layers receive up to `rows` rows each: grown rings and staging, allocated
    /// through the gate.
    fn stage(
        &self,
        at: usize,
        end: usize,
        restore: bool,
        from: Option<&Snapshot>,
    ) -> Result<Vec<Staged>, KvError> {
        let buf = |ty, rows| Buf::zeroed(ty, self.kv_dim, rows, &self.gate);
        let (kt, vt) = self.types;
        self.rings
            .iter()
            .enumerate()
            .map(|(r, ring)| {
                let limit = ring.window.min(self.max_ctx);
                let needed = ring.window.min(end);
                let grown = if needed > ring.cap {
                    let cap = grown_capacity(ring.cap, needed, limit);
                    let mut grown = Ring {
                        window: ring.window,
                        cap,
                        lo: 0,
                        k: buf(kt, cap)?,
                        v: buf(vt, cap)?,
                    };
                    // The retained positions a commit keeps: `lo .. min(len, at)`, or
                    // the checkpoint's.
                    if let Some(snap) = from {
                        copy_snapshot(&mut grown, &snap.rings[r], 0, at);
                    } else if !restore {
                        for p in ring.lo..self.len.min(at) {
                            let (src, dst) = (p % ring.cap, p % cap);
                            grown.k.copy_rows(dst, &ring.k, src, 1);
                            grown.v.copy_rows(dst, &ring.v, src, 1);
                        }
                    }
                    Some(grown)
                } else {
                    None
                };
                let rows = if restore { needed } else { end - at };
                Ok(Staged {
                    grown,
                    first: at,
                    k: buf(kt, rows)?,
                    v: buf(vt, rows)?,
                    rows: 0,
                })
            })
            .collect()
    }

    /// Opens an append of `at .. at + n`, or a restore of `0 .. n`.
    fn open(&mut self, at: usize, n: usize, restore: bool) -> Result<(), KvError> {
        let end = check_begin(self.pending.is_some(), self.len, self.max_ctx, at, n)?;
        let from = if at < self.len && at > 0 && !self.rings_hold(at) {
            Some(self.checkpoints.at(at).ok_or_else(|| self.behind(at))?)
        } else {
            None
        };
        let rings = self.stage(at, end, restore, from)?;
        self.global.begin(at, n)?;
        // Last, so that a refused checkpoint leaves the append as it would be without.
        let snaps = if restore {
            Vec::new()
        } else {
            (self.checkpoints.setting.due(at, end))
                .filter_map(|pos| {
                    let windows = self.rings.iter().map(|r| r.window);
                    Snapshot::alloc(pos, windows, self.types, self.kv_dim, &self.gate).ok()
                })
                .collect()
        };
        self.pending = Some(Pending {
            at,
            n,
            restore,
            written: vec![false; self.geometry.n_layers],
            rings,
            from: from.map(|s| s.pos),
            snaps,
        });
        Ok(())
    }

    /// The rows of `ring` (or the staging of the open append) for positions `a .. b`, as
    /// view segments.
    fn push_segments<'a>(
        &self,
        segments: &mut Vec<KvSegment<'a>>,
        k: &'a Buf,
        v: &'a Buf,
        runs: impl Iterator<Item = (usize, usize, usize)>,
    ) -> Result<(), KvError> {
        let h = self.geometry.n_kv_heads;
        for (start, slot, slots) in runs {
            let (keys, values) = (k.view(slot, slots, h), v.view(slot, slots, h));
            segments.push(KvSegment::new(start, keys, values)?);
        }
        Ok(())
    }

    fn ring_view(&self, layer: usize, r: usize) -> Result<KvView<'_>, KvError> {
        let ring = &self.rings[r];
        let staged = match &self.pending {
            Some(p) if p.written[layer] => Some((p, &p.rings[r])),
            _ => None,
        };
        let end = staged.map_or(self.len, |(p, _)| if p.restore { 0 } else { p.at });
        let end = end.min(self.len);
        let mut segments = Vec::with_capacity(3);
        let from = staged.and_then(|(p, _)| self.checkpoints.at(p.from?));
        if let Some(snap) = from {
            let rows = &snap.rings[r];
            let run = (rows.first, 0, end - rows.first);
            self.push_segments(&mut segments, &rows.k, &rows.v, [run].into_iter())?;
        } else {
            self.push_segments(
                &mut segments,
                &ring.k,
                &ring.v,
                ring.runs(ring.lo.min(end), end),
            )?;
        }
        if let Some((_, s)) = staged {
            let run = (s.first, 0, s.rows);
            self.push_segments(&mut segments, &s.k, &s.v, [run].into_iter())?;
        }
        let (h, d) = (self.geometry.n_kv_heads, self.geometry.head_dim);
        let view = KvView::new(h, d, segments)?;
        view.with_key_codec(&self.codecs.0, layer)
    }

    /// [`KvStore::write`] and [`KvRestore::write_stored`]: a global layer's rows go to the
    /// inner store, a window layer's to its staging.
    fn write_rows(&mut self, layer: usize, rows: Incoming<'_, '_>) -> Result<(), KvError> {
        if self.pending.is_none() {
            return Err(KvError::NoAppend);
        }
        match self.check_layer(layer)? {
            Layer::Global(g) => {
                match rows {
                    Incoming::F32(k, v) => self.global.write(g, k, v)?,
                    Incoming::Stored(k, v) => self.global.write_stored(g, k, v)?,
                }
                if let Some(p) = &mut self.pending {
                    p.written[layer] = true;
                }
                Ok(())
            }
            Layer::Window(r) => self.write_ring(layer, r, rows),
        }
    }

    fn write_ring(
        &mut self,
        layer: usize,
        r: usize,
        rows_in: Incoming<'_, '_>,
    ) -> Result<(), KvError> {
        let (kv_dim, geometry, types) = (self.kv_dim, self.geometry, self.types);
        let window = self.rings[r].window;
        let p = self.pending.as_mut().expect("checked by the caller");
        let rows = if p.restore {
            // A restore gives rows `start .. n` for a start the window allows; any other
            // count is refused as a shape error naming the most rows allowed.
            let starts = restore_starts(Some(window), p.n);
            let allowed = p.n - starts.end()..=p.n - starts.start();
            if allowed.contains(&rows_in.len()) {
                rows_in.len()
            } else {
                *allowed.end()
            }
        } else {
            p.n
        };
        let n = rows;
        match &rows_in {
            Incoming::F32(k, v) => check_rows(n, kv_dim, k, v)?,
            Incoming::Stored(k, v) => check_stored(n, &geometry, types, k, v)?,
        }
        let s = &mut p.rings[r];
        if p.restore {
            s.first = p.n - n;
        }
        match rows_in {
            Incoming::F32(k, v) => {
                let (kc, vc) = (self.codecs.0.layer(layer), self.codecs.1.layer(layer));
                s.k.encode(0, k, geometry.head_dim, kc, s.first);
                s.v.encode(0, v, geometry.head_dim, vc, s.first);
            }
            Incoming::Stored(k, v) => {
                s.k.assign(0, k);
                s.v.assign(0, v);
            }
        }
        s.rows = n;
        p.written[layer] = true;
        Ok(())
    }
}

/// Copies the rows of `rows` (a checkpoint's) for positions `max(a, first) .. b` into
/// `ring`'s slots.
fn copy_snapshot(ring: &mut Ring, rows: &RingRows, a: usize, b: usize) {
    let a = a.max(rows.first);
    debug_assert!(b - a.min(b) <= ring.cap, "a checkpoint fits its ring");
    for (pos, slot, slots) in ring.runs(a, b) {
        ring.k.copy_rows(slot, &rows.k, pos - rows.first, slots);
        ring.v.copy_rows(slot, &rows.v, pos - rows.first, slots);
    }
}

/// Rows given to a window layer: f32 to encode, or already in the store's types.
enum Incoming<'k, 'v> {
    F32(ArrayView2<'k, f32>, ArrayView2<'v, f32>),
    Stored(KvRows<'k>, KvRows<'v>),
}

impl Incoming<'_, '_> {
    /// Rows of the keys.
    fn len(&self) -> usize {
        match self {
            Incoming::F32(k, _) => k.nrows(),
            Incoming::Stored(k, _) => k.len(),
        }
    }
}

impl KvStore for WindowKv {
    fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    fn kv_types(&self) -> (KvType, KvType) {
        self.types
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The fewest positions any layer holds without allocating: the global layers'
    /// capacity, and for a ring not yet at its full `min(w, max_ctx)` slots its slots (a
    /// full ring holds any number of positions, `max_ctx`).
    fn capacity(&self) -> usize {
        let global = if self.rings.len() == self.geometry.n_layers {
            self.max_ctx
        } else {
            self.global.capacity()
        };
        (0..self.rings.len())
            .map(|r| {
                let cap = self.ring_cap(r);
                if cap >= self.rings[r].window.min(self.max_ctx) {
                    self.max_ctx
                } else {
                    cap
                }
            })
            .fold(global, usize::min)
    }

    fn bytes(&self) -> usize {
        let rings: usize = self.rings.iter().map(Ring::bytes).sum();
        let pending = self.pending.as_ref().map_or(0, |p| {
            p.rings
                .iter()
                .map(|s| {
                    let staging = s.k.bytes() + s.v.bytes();
                    staging + s.grown.as_ref().map_or(0, Ring::bytes)
                })
                .sum::<usize>()
                + p.snaps.iter().map(Snapshot::bytes).sum::<usize>()
        });
        self.global.bytes() + rings + pending + self.checkpoints.bytes()
    }

    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        match self.check_layer(layer)? {
            Layer::Global(g) => self.global.view(g),
            Layer::Window(r) => self.ring_view(layer, r),
        }
    }

    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        self.open(at, n, false)
    }

    fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        self.write_rows(layer, Incoming::F32(k, v))
    }

    fn commit(&mut self) -> Result<(), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        check_complete(p.n, &p.written)?;
        self.global.commit()?;
        let mut p = self.pending.take().expect("checked above");
        let (at, end) = (p.at, p.at + p.n);
        let from = p.from.and_then(|pos| self.checkpoints.at(pos));
        // The new checkpoints, from the rows held before (the ring's, or those of the
        // checkpoint the append starts at) and the pending ones, before any ring changes.
        for snap in &mut p.snaps {
            for (r, rows) in snap.rings.iter_mut().enumerate() {
                let (ring, staged) = (&self.rings[r], &p.rings[r]);
                let split = at.clamp(rows.first, snap.pos);
                match from {
                    Some(from) if split > rows.first => {
                        let old = &from.rings[r];
                        let (src, n) = (rows.first - old.first, split - rows.first);
                        rows.k.copy_rows(0, &old.k, src, n);
                        rows.v.copy_rows(0, &old.v, src, n);
                    }
                    Some(_) => {} // every row is pending
                    None => {
                        for (pos, slot, slots) in ring.runs(rows.first, split) {
                            rows.k.copy_rows(pos - rows.first, &ring.k, slot, slots);
                            rows.v.copy_rows(pos - rows.first, &ring.v, slot, slots);
                        }
                    }
                }
                let (dst, src, n) = (split - rows.first, split - staged.first, snap.pos - split);
                rows.k.copy_rows(dst, &staged.k, src, n);
                rows.v.copy_rows(dst, &staged.v, src, n);
            }
        }
        for (r, (ring, staged)) in self.rings.iter_mut().zip(p.rings).enumerate() {
            if let Some(grown) = staged.grown {
                (ring.k, ring.v, ring.cap) = (grown.k, grown.v, grown.cap);
            }
            // Held after the commit: `base .. at` from before (or from the checkpoint)
            // and `first .. end` pending (contiguous unless a restore), the last `cap` of
            // them retained.
            let base = match from {
                _ if p.restore => staged.first,
                Some(from) => from.rings[r].first,
                None => ring.lo.min(at),
            };
            let lo = base.max(end.saturating_sub(ring.cap));
            if let Some(from) = from {
                copy_snapshot(ring, &from.rings[r], lo, at);
            }
            for pos in lo.max(staged.first)..end {
                let (src, dst) = (pos - staged.first, pos % ring.cap);
                ring.k.copy_rows(dst, &staged.k, src, 1);
                ring.v.copy_rows(dst, &staged.v, src, 1);
            }
            ring.lo = lo;
        }
        self.checkpoints.drop_after(at);
        self.checkpoints.push(p.snaps);
        self.len = end;
        Ok(())
    }

    fn rollback(&mut self) {
        self.global.rollback();
        self.pending = None;
    }

    fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        let behind = n > 0 && n < self.len && !self.rings_hold(n);
        if behind && self.checkpoints.at(n).is_none() {
            return Err(self.behind(n));
        }
        self.rollback();
        self.global.truncate(n);
        if n < self.len {
            self.len = n;
            let from = self.checkpoints.at(n).filter(|_| behind);
            for (r, ring) in self.rings.iter_mut().enumerate() {
                match from {
                    Some(from) => {
                        copy_snapshot(ring, &from.rings[r], 0, n);
                        ring.lo = from.rings[r].first;
                    }
                    None => ring.lo = ring.lo.min(n),
                }
            }
        }
        self.checkpoints.drop_after(n);
        Ok(())
    }

    fn can_rewind_to(&self, n: usize) -> bool {
        n == self.len
            || n == 0
            || (n < self.len && (self.rings_hold(n) || self.checkpoints.at(n).is_some()))
    }

    fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }

    fn fork(&self) -> Result<Self, KvError> {
        if self.pending.is_some() || self.global.is_open() {
            return Err(KvError::AppendOpen);
        }
        let (kt, vt) = self.types;
        let rings = self
            .rings
            .iter()
            .map(|r| {
                let mut k = Buf::zeroed(kt, self.kv_dim, r.k.rows(), &self.gate)?;
                let mut v = Buf::zeroed(vt, self.kv_dim, r.v.rows(), &self.gate)?;
                for (_, slot, slots) in r.runs(r.lo, self.len) {
                    k.copy_rows(slot, &r.k, slot, slots);
                    v.copy_rows(slot, &r.v, slot, slots);
                }
                Ok(Ring { k, v, ..*r })
            })
            .collect::<Result<_, KvError>>()?;
        let snaps = (self.checkpoints.snaps.iter())
            .map(|s| s.copy(self.types, self.kv_dim, &self.gate))
            .collect::<Result<_, KvError>>()?;
        Ok(WindowKv {
            windows: self.windows.clone(),
            map: self.map.clone(),
            global: self.global.fork()?,
            rings,
            gate: self.gate.clone(),
            pending: None,
            codecs: self.codecs.clone(),
            checkpoints: Kept {
                setting: self.checkpoints.setting,
                snaps,
            },
            ..*self
        })
    }

    fn codecs(&self) -> (KvCodec, KvCodec) {
        self.codecs.clone()
    }

    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
        Ok(Box::new(self.fork()?))
    }

    fn restorer(&mut self) -> Option<&mut dyn KvRestore> {
        Some(self)
    }
}

impl KvRestore for WindowKv {
    fn write_stored(&mut self, layer: usize, k: KvRows<'_>, v: KvRows<'_>) -> Result<(), KvError> {
        self.write_rows(layer, Incoming::Stored(k, v))
    }

    fn begin_restore(&mut self, n: usize) -> Result<(), KvError> {
        self.open(0, n, true)
    }
}

impl fmt::Debug for WindowKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowKv")
            .field("geometry", &self.geometry)
            .field("max_ctx", &self.max_ctx)
            .field("len", &self.len)
            .field("windows", &self.windows)
            .field("global", &self.global)
            .field(
                "rings",
                &self
                    .rings
                    .iter()
                    .map(|r| (r.window, r.cap, r.lo))
                    .collect::<Vec<_>>(),
            )
            .field("checkpoints", &self.checkpoint_positions())
            .field("append_open", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::DenseKv;
    use crate::kv::grow::tests::{append, geometry, row, rows};
    use ndarray::Array2;

    /// The length, capacity, bytes and the rows layers 0 and 1 hold.
    fn state(kv: &WindowKv) -> (usize, usize, usize, Held, Held) {
        (
            kv.len(),
            kv.capacity(),
            kv.bytes(),
            held(kv, 0),
            held(kv, 1),
        )
    }

    /// A layer's positions, its keys' bits in view order and its number of segments.
    type Held = (Vec<usize>, Vec<u32>, usize);

    fn held(kv: &impl KvStore, layer: usize) -> Held {
        let view = kv.view(layer).unwrap();
        let bits = view
            .segments()
            .iter()
            .flat_map(|s| match s.keys() {
                KvRows::F32(a) => a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                other => panic!("f32 rows expected, got {}", other.kv_type()),
            })
            .collect();
        (view.positions().collect(), bits, view.segments().len())
    }

    /// Checks that every layer holds [`row`]'s keys for exactly `positions`.
    fn check(kv: &WindowKv, layer: usize, positions: std::ops::Range<usize>) {
        let d = kv.geometry().kv_dim();
        let (got, bits, _) = held(kv, layer);
        assert_eq!(got, positions.clone().collect::<Vec<_>>(), "layer {layer}");
        let want: Vec<u32> = positions
            .flat_map(|p| row(layer, p, d, false))
            .map(f32::to_bits)
            .collect();
        assert_eq!(bits, want, "layer {layer} keys");
    }

    fn ring_bytes(slots: usize, kv_dim: usize) -> usize {
        2 * slots * kv_dim * 4
    }

    #[test]
    fn rejects_bad_window_lists() {
        let g = geometry(3, 2);
        assert_eq!(
            WindowKv::new(g, 10, &[None, Some(4)]).unwrap_err(),
            KvError::WindowCount {
                found: 2,
                n_layers: 3
            }
        );
        assert_eq!(
            WindowKv::new(g, 10, &[None, Some(0), Some(1)]).unwrap_err(),
            KvError::ZeroWindow { layer: 1 }
        );
        assert!(matches!(
            WindowKv::new(g, usize::MAX / 4, &[None, None, Some(2)]),
            Err(KvError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_ring_grows_by_doubling_to_its_window_then_wraps() {
        let mut kv = WindowKv::new(geometry(2, 3), 10_000, &[Some(300), None]).unwrap();
        assert_eq!(kv.layer_capacity(0), Some(64));
        let mut caps = vec![64];
        for pos in 0..1000 {
            append(&mut kv, pos, 1).unwrap();
            let cap = kv.layer_capacity(0).unwrap();
            if cap != *caps.last().unwrap() {
                caps.push(cap);
            }
            check(&kv, 0, (pos + 1).saturating_sub(300)..pos + 1);
        }
        assert_eq!(caps, [64, 128, 256, 300]);
        assert_eq!(
            kv.layer_capacity(1),
            Some(1024),
            "the global layer grows as GrowKv"
        );
        check(&kv, 1, 0..1000);
        // 1000 mod 300 = 100: positions 700..1000 sit in slots 100..300 then 0..100.
        let (positions, _, segments) = held(&kv, 0);
        assert_eq!((positions[0], segments), (700, 2));
    }

    #[test]
    fn window_layers_cost_the_same_at_512_and_at_30000_positions() {
        let g = geometry(3, 4);
        let windows = [Some(512), Some(512), None];
        let mut kv = WindowKv::new(g, 32_768, &windows).unwrap();
        append(&mut kv, 0, 512).unwrap();
        let global = |kv: &WindowKv| ring_bytes(kv.layer_capacity(2).unwrap(), 4);
        assert_eq!(kv.bytes(), 2 * ring_bytes(512, 4) + global(&kv));
        let at_512 = kv.bytes() - global(&kv);
        for at in (512..30_000).step_by(700) {
            append(&mut kv, at, 700).unwrap();
        }
        assert_eq!(kv.bytes() - global(&kv), at_512, "the rings did not grow");
        assert_eq!(kv.layer_capacity(2), Some(32_768));
        let len = kv.len();
        assert_eq!(len, 30_612);
        check(&kv, 0, len - 512..len);
        check(&kv, 1, len - 512..len);
        check(&kv, 2, 0..len);
        let dense = DenseKv::new(g, 32_768).unwrap();
        assert!(kv.bytes() < dense.bytes());
    }

    #[test]
    fn a_prefill_longer_than_the_window_is_visible_until_the_commit() {
        let mut kv = WindowKv::new(geometry(1, 2), 1000, &[Some(8)]).unwrap();
        append(&mut kv, 0, 5).unwrap();
        let before = (kv.capacity(), kv.bytes(), held(&kv, 0));
        kv.begin(5, 40).unwrap();
        kv.write(
            0,
            rows(0, 5, 40, 2, false).view(),
            rows(0, 5, 40, 2, true).view(),
        )
        .unwrap();
        let (positions, _, _) = held(&kv, 0);
        assert_eq!(positions, (0..45).collect::<Vec<_>>(), "every pending row");
        kv.rollback();
        assert_eq!((kv.capacity(), kv.bytes(), held(&kv, 0)), before);
        append(&mut kv, 5, 40).unwrap();
        check(&kv, 0, 37..45);
        assert_eq!(kv.bytes(), ring_bytes(8, 2));
    }

    #[test]
    fn rewinding_behind_the_window_is_refused_and_changes_nothing() {
        let mut kv = WindowKv::new(geometry(2, 2), 1000, &[Some(4), None]).unwrap();
        append(&mut kv, 0, 10).unwrap();
        // Positions 6..10 retained: a query at 9 sees 6..=9, one at 8 would need 5.
        assert!(kv.can_rewind_to(9) && kv.can_rewind_to(10) && kv.can_rewind_to(0));
        assert!(!kv.can_rewind_to(8) && !kv.can_rewind_to(11));
        let before = state(&kv);
        let refused = KvError::BehindWindow {
            pos: 8,
            earliest: 9,
        };
        assert_eq!(kv.truncate(8), Err(refused.clone()));
        assert_eq!(kv.begin(8, 2), Err(refused));
        assert_eq!(state(&kv), before);
        // An open append survives a refused truncate.
        kv.begin(10, 1).unwrap();
        assert!(kv.truncate(3).is_err());
        assert_eq!(kv.commit(), Err(KvError::Incomplete { layer: 0 }));
        kv.rollback();
        // Replacing the last position works; afterwards only 3 positions remain.
        append(&mut kv, 9, 1).unwrap();
        check(&kv, 0, 6..10);
        kv.truncate(9).unwrap();
        check(&kv, 0, 6..9);
        assert_eq!(
            kv.truncate(8),
            Err(KvError::BehindWindow {
                pos: 8,
                earliest: 9
            })
        );
        assert_eq!(
            kv.begin(8, 1),
            Err(KvError::BehindWindow {
                pos: 8,
                earliest: 9
            })
        );
        append(&mut kv, 9, 3).unwrap();
        check(&kv, 0, 8..12);
        check(&kv, 1, 0..12);
        // Clearing is always possible and keeps capacity.
        let cap = kv.capacity();
        kv.truncate(0).unwrap();
        assert_eq!((kv.len(), kv.capacity()), (0, cap));
        append(&mut kv, 0, 3).unwrap();
        check(&kv, 0, 0..3);
        assert!(kv.can_rewind_to(1));
    }

    #[test]
    fn a_tail_replacement_hides_the_replaced_positions() {
        let mut kv = WindowKv::new(geometry(1, 2), 1000, &[Some(6)]).unwrap();
        append(&mut kv, 0, 4).unwrap();
        kv.begin(2, 3).unwrap();
        let (k, v) = (
            Array2::from_elem((3, 2), 7.0f32),
            Array2::from_elem((3, 2), 8.0),
        );
        kv.write(0, k.view(), v.view()).unwrap();
        let (positions, bits, _) = held(&kv, 0);
        assert_eq!(positions, [0, 1, 2, 3, 4]);
        assert_eq!(bits[4..], [7.0f32.to_bits(); 6]);
        kv.commit().unwrap();
        assert_eq!(kv.len(), 5);
    }

    #[test]
    fn refused_allocations_change_nothing() {
        #[derive(Debug)]
        struct Refuse;
        impl AllocGate for Refuse {
            fn admit(&self, _: usize) -> bool {
                false
            }
        }
        let mut kv = WindowKv::new(geometry(2, 2), 1000, &[Some(100), None]).unwrap();
        append(&mut kv, 0, 60).unwrap();
        kv.set_alloc_gate(Some(Arc::new(Refuse)));
        let before = state(&kv);
        assert!(matches!(kv.begin(60, 1), Err(KvError::AllocFailed { .. })));
        assert!(matches!(kv.fork(), Err(KvError::AllocFailed { .. })));
        assert_eq!(state(&kv), before);
        kv.set_alloc_gate(None);
        let fork = kv.fork().unwrap();
        assert_eq!(
            (held(&fork, 0), held(&fork, 1)),
            (held(&kv, 0), held(&kv, 1))
        );
        assert_eq!((fork.bytes(), fork.capacity()), (kv.bytes(), kv.capacity()));
    }

    #[test]
    fn a_restore_takes_only_the_retained_rows() {
        let mut kv = WindowKv::new(geometry(2, 2), 1000, &[Some(5), None]).unwrap();
        append(&mut kv, 0, 3).unwrap();
        assert_eq!(restore_starts(kv.window(0), 20), 15..=16);
        assert_eq!(restore_starts(kv.window(0), 3), 0..=0);
        assert_eq!(restore_starts(kv.window(1), 20), 0..=0);
        kv.begin_restore(20).unwrap();
        let wrong = rows(0, 0, 20, 2, false);
        assert!(matches!(
            kv.write(0, wrong.view(), wrong.view()),
            Err(KvError::RowShape {
                expected: (5, 2),
                ..
            })
        ));
        kv.write(
            0,
            rows(0, 16, 4, 2, false).view(),
            rows(0, 16, 4, 2, true).view(),
        )
        .unwrap();
        kv.write(
            1,
            rows(1, 0, 20, 2, false).view(),
            rows(1, 0, 20, 2, true).view(),
        )
        .unwrap();
        assert_eq!(held(&kv, 0).0, [16, 17, 18, 19]);
        kv.commit().unwrap();
        check(&kv, 0, 16..20);
        check(&kv, 1, 0..20);
        assert!(!kv.can_rewind_to(19) && kv.can_rewind_to(20));
        append(&mut kv, 20, 2).unwrap();
        check(&kv, 0, 17..22);
    }

    /// Appends `n` rows at `at` whose values depend on `tag` as well as on the layer and
    /// position, so a rewritten history differs from the one it replaced.
    fn append_tagged(kv: &mut impl KvStore, at: usize, n: usize, tag: u32) -> Result<(), KvError> {
        let g = kv.geometry();
        let d = g.kv_dim();
        let mut tx = crate::kv::Append::begin(kv, at, n)?;
        for layer in 0..g.n_layers {
            let k = Array2::from_shape_fn((n, d), |(t, j)| {
                (tag * 100_000 + (layer * 10_000 + (at + t) * 10 + j) as u32) as f32
            });
            let v = k.mapv(|x| -x);
            tx.write(layer, k.view(), v.view())?;
        }
        tx.commit()
    }

    /// Per position of a layer's view, the bits of its key and value rows.
    fn by_position(kv: &impl KvStore, layer: usize) -> Vec<(usize, Vec<u32>)> {
        let bits = |rows: KvRows<'_>| match rows {
            KvRows::F32(a) => a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            other => panic!("f32 rows expected, got {}", other.kv_type()),
        };
        let view = kv.view(layer).unwrap();
        let mut out = Vec::new();
        for s in view.segments() {
            let (k, v) = (bits(s.keys()), bits(s.values()));
            let per = k.len() / s.len().max(1);
            for (i, pos) in s.positions().enumerate() {
                let mut row = k[i * per..(i + 1) * per].to_vec();
                row.extend_from_slice(&v[i * per..(i + 1) * per]);
                out.push((pos, row));
            }
        }
        out
    }

    /// Every row a window layer holds is the dense store's at that position, and it holds
    /// every position a query at `len` sees; global layers hold all of them.
    fn same_as_dense(kv: &WindowKv, dense: &DenseKv, what: &str) {
        assert_eq!(kv.len(), dense.len(), "{what}: len");
        for layer in 0..kv.geometry().n_layers {
            let want = by_position(dense, layer);
            let got = by_position(kv, layer);
            let seen = match kv.window(layer) {
                Some(w) => (kv.len() + 1).saturating_sub(w),
                None => 0,
            };
            assert!(
                got.first().map_or(kv.len(), |r| r.0) <= seen,
                "{what}: layer {layer} misses positions from {seen}"
            );
            for (pos, row) in got {
                assert_eq!(row, want[pos].1, "{what}: layer {layer} position {pos}");
            }
        }
    }

    fn checkpointed(windows: &[Option<usize>], every: usize, count: usize) -> WindowKv {
        let g = geometry(windows.len(), 2);
        let every = std::num::NonZeroUsize::new(every).unwrap();
        WindowKv::new(g, 1000, windows)
            .unwrap()
            .with_checkpoints(Checkpoints { every, count })
    }

    #[test]
    fn checkpoints_are_taken_inside_appends_and_bounded() {
        let mut kv = checkpointed(&[Some(5), None, Some(3)], 4, 3);
        let plain = {
            let mut p = WindowKv::new(kv.geometry(), 1000, kv.windows()).unwrap();
            append_tagged(&mut p, 0, 30, 1).unwrap();
            p
        };
        append_tagged(&mut kv, 0, 30, 1).unwrap();
        assert_eq!(
            kv.checkpoint_positions(),
            [20, 24, 28],
            "the last 3 of one pass"
        );
        // A checkpoint at p holds min(p, w − 1) rows per window layer: 4 + 2 row pairs.
        let snap = 2 * (4 + 2) * 2 * 4;
        assert_eq!(kv.bytes(), plain.bytes() + 3 * snap);
        // Decode steps take one at each multiple; the oldest go.
        for pos in 30..41 {
            append_tagged(&mut kv, pos, 1, 1).unwrap();
        }
        assert_eq!(kv.checkpoint_positions(), [32, 36, 40]);
        assert_eq!(kv.bytes(), plain.bytes() + 3 * snap);
        // A fork keeps them; none is kept with a count of 0.
        let fork = kv.fork().unwrap();
        assert_eq!(fork.checkpoint_positions(), kv.checkpoint_positions());
        assert_eq!(fork.bytes(), kv.bytes());
        let none = kv.fork().unwrap().with_checkpoints(Checkpoints::NONE);
        assert_eq!(none.checkpoint_positions(), [0usize; 0]);
        assert_eq!(none.bytes(), plain.bytes());
    }

    #[test]
    fn a_rewind_behind_the_windows_goes_to_a_checkpoint_and_nowhere_else() {
        let mut kv = checkpointed(&[Some(5), None, Some(3)], 4, 8);
        let mut dense = DenseKv::new(kv.geometry(), 1000).unwrap();
        for (at, n) in [(0, 9), (9, 10), (19, 1), (20, 3)] {
            append_tagged(&mut kv, at, n, 1).unwrap();
            append_tagged(&mut dense, at, n, 1).unwrap();
        }
        assert_eq!(kv.checkpoint_positions(), [4, 8, 12, 16, 20]);
        // Behind the windows only the checkpoints can be rewound to.
        for n in 1..19 {
            assert_eq!(kv.can_rewind_to(n), n % 4 == 0, "{n}");
        }
        let before = (kv.bytes(), kv.checkpoint_positions(), by_position(&kv, 0));
        assert!(matches!(kv.truncate(10), Err(KvError::BehindWindow { .. })));
        assert!(matches!(kv.begin(10, 2), Err(KvError::BehindWindow { .. })));
        // An append at a checkpoint, rolled back: nothing changed.
        kv.begin(12, 3).unwrap();
        for layer in 0..3 {
            let rows = Array2::from_elem((3, 2), 9.0f32);
            kv.write(layer, rows.view(), rows.view()).unwrap();
            let (positions, _, _) = held(&kv, layer);
            let from = kv.window(layer).map_or(0, |w| 13 - w);
            assert_eq!(positions, (from..15).collect::<Vec<_>>(), "layer {layer}");
        }
        kv.rollback();
        assert_eq!(
            (kv.bytes(), kv.checkpoint_positions(), by_position(&kv, 0)),
            before
        );
        same_as_dense(&kv, &dense, "after the rollback");
        // Committed: a new history from 12 on; the checkpoints past 12 are gone.
        append_tagged(&mut kv, 12, 2, 2).unwrap();
        append_tagged(&mut dense, 12, 2, 2).unwrap();
        same_as_dense(&kv, &dense, "an append at a checkpoint");
        assert_eq!(kv.checkpoint_positions(), [4, 8, 12]);
        for pos in 14..30 {
            append_tagged(&mut kv, pos, 1, 3).unwrap();
            append_tagged(&mut dense, pos, 1, 3).unwrap();
            same_as_dense(&kv, &dense, "decoding after it");
        }
        assert_eq!(kv.checkpoint_positions(), [4, 8, 12, 16, 20, 24, 28]);
        // A truncation to a checkpoint, then a new history.
        kv.truncate(8).unwrap();
        dense.truncate(8).unwrap();
        same_as_dense(&kv, &dense, "truncated to a checkpoint");
        assert_eq!(kv.checkpoint_positions(), [4, 8]);
        append_tagged(&mut kv, 8, 30, 4).unwrap();
        append_tagged(&mut dense, 8, 30, 4).unwrap();
        same_as_dense(&kv, &dense, "a pass after the truncation");
        assert_eq!(kv.checkpoint_positions(), [8, 12, 16, 20, 24, 28, 32, 36]);
        kv.truncate(0).unwrap();
        assert_eq!(kv.checkpoint_positions(), [0usize; 0]);
    }

    /// Random appends and truncations, wherever the store says it can rewind to, against
    /// a dense store given the same calls; rings starting small, so appends at a
    /// checkpoint also grow them.
    #[test]
    fn random_rewinds_to_checkpoints_are_the_dense_store() {
        for seed in 1..40u64 {
            let mut rng = seed;
            let mut next = |m: usize| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((rng >> 33) % m as u64) as usize
            };
            let every = 1 + next(7);
            let mut kv = checkpointed(&[Some(70), None, Some(3 + next(9))], every, 1 + next(5));
            let mut dense = DenseKv::new(kv.geometry(), 1000).unwrap();
            for step in 0..60u32 {
                let len = kv.len();
                let what = format!("seed {seed} step {step}");
                let at = len.saturating_sub(next(len.min(40) + 1));
                if next(3) == 0 {
                    if kv.can_rewind_to(at) {
                        kv.truncate(at).unwrap();
                        dense.truncate(at).unwrap();
                    } else {
                        assert!(kv.truncate(at).is_err(), "{what}");
                    }
                } else {
                    let n = 1 + next(12);
                    if at + n > 1000 {
                        continue;
                    }
                    let allowed = kv.can_rewind_to(at);
                    let r = append_tagged(&mut kv, at, n, step);
                    assert_eq!(r.is_ok(), allowed, "{what}: {r:?}");
                    if r.is_ok() {
                        append_tagged(&mut dense, at, n, step).unwrap();
                    }
                }
                same_as_dense(&kv, &dense, &what);
                let kept = kv.checkpoint_positions();
                assert!(kept.len() <= kv.checkpoints().count, "{what}");
                assert!(
                    kept.iter().all(|p| p % every == 0 && *p <= kv.len()),
                    "{what}"
                );
            }
        }
    }
}
