//! The implementation [`DenseKv`](super::DenseKv) and [`GrowKv`](super::GrowKv) share:
//! rows in `[n_layers][cap][kv_dim]` buffers with transactional appends.
//!
//! Layout: K and V are each one typed row buffer (`elem.rs`: f32, f16, bf16 or q8_0
//! blocks, chosen separately) of `[n_layers][cap]` rows, the per-layer stride being the
//! capacity `cap`: row `layer · cap + pos`. Rows are encoded when written, one row at a
//! time, so a row's bytes do not depend on the store.
//! Slot `i` of a layer holds position `i`, so a layer's view is one segment, rows
//! `0 .. len` (or `0 .. at + n` once the open append has written the layer).
//!
//! An append of `n` positions at `at` that needs `at + n > cap` grows the store in
//! [`Rows::begin`]: the capacity doubles until it covers `at + n`, clamped to `max_ctx`
//! (from 0 the doubling starts at 1), both buffers are allocated at the new size
//! (zero-filled: `mem.rs`) and each layer's committed rows are copied from the old stride
//! to the new with one `copy_from_slice`. The rows copied over a run of appends sum to less
//! than twice the final size. The old buffers are kept until the
//! commit, so a rollback restores them. An append with `at < len` that does not grow
//! overwrites committed rows `at .. min(len, at + n)` in place; `begin` allocates room
//! for them and `write` saves each layer's before overwriting it, for the rollback.
//! Otherwise an append writes only slots no reader can see (`≥ len`). Either way every
//! allocation of an append happens in `begin`.

use std::fmt;
use std::sync::Arc;

use ndarray::ArrayView2;

use super::elem::Buf;
use super::{
    AllocGate, Gate, KvCodec, KvError, KvGeometry, KvRows, KvSegment, KvType, KvView, check_begin,
    check_complete, check_rows, check_stored,
};

/// K and V rows of every layer with a live capacity; see the module docs.
pub(super) struct Rows {
    geometry: KvGeometry,
    /// `n_kv_heads · head_dim`, checked at construction.
    kv_dim: usize,
    max_ctx: usize,
    /// Slots per layer, the per-layer stride; `len ≤ cap ≤ max_ctx`.
    cap: usize,
    /// Committed positions.
    len: usize,
    /// `[n_layers][cap]` rows of K's type
    k: Buf,
    /// `[n_layers][cap]` rows of V's type
    v: Buf,
    gate: Gate,
    pending: Option<Pending>,
    /// The codecs of K and of V (`kv/codec.rs`), which encode every row written.
    codecs: (KvCodec, KvCodec),
    /// `[n_layers]`: the model layer of each of these layers (what a calibrated codec
    /// is indexed by).
    model_layers: Vec<usize>,
}

/// An open append.
struct Pending {
    at: usize,
    n: usize,
    /// `[n_layers]`: whether the layer's rows have been written.
    written: Vec<bool>,
    undo: Undo,
}

/// What a rollback needs besides `len`, which an append never changes before its commit.
enum Undo {
    /// Nothing committed is overwritten: the append writes only slots `≥ len`.
    Nothing,
    /// The append grew the store: the buffers and capacity before it.
    Grown { k: Buf, v: Buf, cap: usize },
    /// The append overwrites committed rows `at .. at + m` in place: their values,
    /// `[n_layers][m]` rows, saved when each layer is first written.
    Replaced { m: usize, k: Buf, v: Buf },
}

impl Undo {
    fn bytes(&self) -> usize {
        match self {
            Undo::Nothing => 0,
            Undo::Grown { k, v, .. } | Undo::Replaced { k, v, .. } => k.bytes() + v.bytes(),
        }
    }
}

impl Rows {
    /// An empty store of K and V types `types` with `min(cap, max_ctx)` zeroed slots per
    /// layer.
    ///
    /// Errors with [`KvError::BlockShape`] when a type's blocks do not divide the head
    /// size, [`KvError::TooLarge`] when the store at `max_ctx` would not fit in
    /// `isize::MAX` bytes (checked first, so no later growth can overflow) and with
    /// [`KvError::AllocFailed`] when the initial buffers are refused.
    pub(super) fn new(
        geometry: KvGeometry,
        max_ctx: usize,
        cap: usize,
        types: (KvType, KvType),
    ) -> Result<Self, KvError> {
        let kv_dim = checked_size(&geometry, max_ctx, types)?;
        let cap = cap.min(max_ctx);
        let rows = geometry.n_layers * cap;
        Ok(Rows {
            geometry,
            kv_dim,
            max_ctx,
            cap,
            len: 0,
            k: Buf::zeroed(types.0, kv_dim, rows, &None)?,
            v: Buf::zeroed(types.1, kv_dim, rows, &None)?,
            gate: None,
            pending: None,
            codecs: (KvCodec::new(types.0), KvCodec::new(types.1)),
            model_layers: (0..geometry.n_layers).collect(),
        })
    }

    /// Encodes keys through `codec` from now on, layer `l` of this store being the
    /// model's layer `layers[l]` (checked by the caller against the store).
    pub(super) fn set_key_codec(&mut self, codec: KvCodec, layers: Vec<usize>) {
        self.codecs.0 = codec;
        self.model_layers = layers;
    }

    pub(super) fn codecs(&self) -> (KvCodec, KvCodec) {
        self.codecs.clone()
    }

    pub(super) fn set_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.gate = gate;
    }

    /// Row index of slot `pos` of `layer` at capacity `cap`, for `pos ≤ cap` (no
    /// overflow: `checked_size`).
    fn offset(&self, cap: usize, layer: usize, pos: usize) -> usize {
        layer * cap + pos
    }

    /// Zeroed K and V buffers of `rows` rows each, through the gate.
    fn zeroed(&self, rows: usize) -> Result<(Buf, Buf), KvError> {
        let (kt, vt) = self.kv_types();
        Ok((
            Buf::zeroed(kt, self.kv_dim, rows, &self.gate)?,
            Buf::zeroed(vt, self.kv_dim, rows, &self.gate)?,
        ))
    }

    fn check_layer(&self, layer: usize) -> Result<(), KvError> {
        if layer < self.geometry.n_layers {
            Ok(())
        } else {
            Err(KvError::NoSuchLayer {
                layer,
                n_layers: self.geometry.n_layers,
            })
        }
    }

    pub(super) fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    pub(super) fn kv_types(&self) -> (KvType, KvType) {
        (self.k.kv_type(), self.v.kv_type())
    }

    pub(super) fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn capacity(&self) -> usize {
        self.cap
    }

    pub(super) fn bytes(&self) -> usize {
        let undo = self.pending.as_ref().map_or(0, |p| p.undo.bytes());
        self.k.bytes() + self.v.bytes() + undo
    }

    pub(super) fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        self.check_layer(layer)?;
        let rows = match &self.pending {
            Some(p) if p.written[layer] => p.at + p.n,
            _ => self.len,
        };
        let (h, d) = (self.geometry.n_kv_heads, self.geometry.head_dim);
        let at = self.offset(self.cap, layer, 0);
        let keys = self.k.view(at, rows, h);
        let values = self.v.view(at, rows, h);
        let view = KvView::new(h, d, vec![KvSegment::new(0, keys, values)?])?;
        view.with_key_codec(&self.codecs.0, self.model_layers[layer])
    }

    pub(super) fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        let open = self.pending.is_some();
        let end = check_begin(open, self.len, self.max_ctx, at, n)?;
        let replaced = self.len.min(end) - at;
        let undo = if end > self.cap {
            let cap = grown_capacity(self.cap, end, self.max_ctx);
            let (mut k, mut v) = self.zeroed(self.geometry.n_layers * cap)?;
            for layer in 0..self.geometry.n_layers {
                let (src, dst) = (self.offset(self.cap, layer, 0), self.offset(cap, layer, 0));
                k.copy_rows(dst, &self.k, src, self.len);
                v.copy_rows(dst, &self.v, src, self.len);
            }
            Undo::Grown {
                k: std::mem::replace(&mut self.k, k),
                v: std::mem::replace(&mut self.v, v),
                cap: std::mem::replace(&mut self.cap, cap),
            }
        } else if replaced > 0 {
            let (k, v) = self.zeroed(self.geometry.n_layers * replaced)?;
            Undo::Replaced { m: replaced, k, v }
        } else {
            Undo::Nothing
        };
        self.pending = Some(Pending {
            at,
            n,
            written: vec![false; self.geometry.n_layers],
            undo,
        });
        Ok(())
    }

    /// The open append's `(at, n)`, after checking `layer`.
    fn open_append(&self, layer: usize) -> Result<(usize, usize), KvError> {
        let (at, n) = match &self.pending {
            Some(p) => (p.at, p.n),
            None => return Err(KvError::NoAppend),
        };
        self.check_layer(layer)?;
        Ok((at, n))
    }

    /// Saves the committed rows a first write of `layer` overwrites (an append that
    /// replaces rows), then marks the layer written; returns the first row to write.
    fn prepare_write(&mut self, layer: usize) -> usize {
        let Rows {
            pending,
            k: kbuf,
            v: vbuf,
            cap,
            ..
        } = self;
        let p = pending.as_mut().expect("checked by open_append");
        let dst = layer * *cap + p.at;
        if let Undo::Replaced { m, k: sk, v: sv } = &mut p.undo
            && !p.written[layer]
        {
            sk.copy_rows(layer * *m, kbuf, dst, *m);
            sv.copy_rows(layer * *m, vbuf, dst, *m);
        }
        p.written[layer] = true;
        dst
    }

    pub(super) fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        let (at, n) = self.open_append(layer)?;
        check_rows(n, self.kv_dim, &k, &v)?;
        let dst = self.prepare_write(layer);
        let head_dim = self.geometry.head_dim;
        let model_layer = self.model_layers[layer];
        let (kc, vc) = (
            self.codecs.0.layer(model_layer),
            self.codecs.1.layer(model_layer),
        );
        self.k.encode(dst, k, head_dim, kc, at);
        self.v.encode(dst, v, head_dim, vc, at);
        Ok(())
    }

    pub(super) fn write_stored(
        &mut self,
        layer: usize,
        k: KvRows<'_>,
        v: KvRows<'_>,
    ) -> Result<(), KvError> {
        let (_, n) = self.open_append(layer)?;
        check_stored(n, &self.geometry, self.kv_types(), &k, &v)?;
        let dst = self.prepare_write(layer);
        self.k.assign(dst, k);
        self.v.assign(dst, v);
        Ok(())
    }

    pub(super) fn commit(&mut self) -> Result<(), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        check_complete(p.n, &p.written)?;
        self.len = p.at + p.n;
        self.pending = None;
        Ok(())
    }

    pub(super) fn rollback(&mut self) {
        let Some(p) = self.pending.take() else {
            return;
        };
        match p.undo {
            Undo::Nothing => {}
            Undo::Grown { k, v, cap } => {
                self.k = k;
                self.v = v;
                self.cap = cap;
            }
            Undo::Replaced { m, k, v } => {
                for layer in (0..self.geometry.n_layers).filter(|&l| p.written[l]) {
                    let dst = self.offset(self.cap, layer, p.at);
                    self.k.copy_rows(dst, &k, layer * m, m);
                    self.v.copy_rows(dst, &v, layer * m, m);
                }
            }
        }
    }

    pub(super) fn truncate(&mut self, n: usize) {
        self.rollback();
        self.len = self.len.min(n);
    }

    pub(super) fn is_open(&self) -> bool {
        self.pending.is_some()
    }

    pub(super) fn fork(&self) -> Result<Self, KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        let (mut k, mut v) = self.zeroed(self.k.rows())?;
        for layer in 0..self.geometry.n_layers {
            let at = self.offset(self.cap, layer, 0);
            k.copy_rows(at, &self.k, at, self.len);
            v.copy_rows(at, &self.v, at, self.len);
        }
        Ok(Rows {
            k,
            v,
            gate: self.gate.clone(),
            pending: None,
            codecs: self.codecs.clone(),
            model_layers: self.model_layers.clone(),
            geometry: self.geometry,
            kv_dim: self.kv_dim,
            max_ctx: self.max_ctx,
            cap: self.cap,
            len: self.len,
        })
    }
}

/// `kv_dim`, after checking that the types' blocks divide the head size
/// ([`KvError::BlockShape`]); or [`KvError::TooLarge`] when `max_ctx` exceeds
/// `isize::MAX` (the longest axis an array view may have), or one position's K and V
/// rows, one layer at `max_ctx` positions (which matters when `n_layers` is 0) or the
/// store at `max_ctx` would exceed `isize::MAX` bytes, or its `n_layers · max_ctx` rows
/// `isize::MAX` rows. Checking the full size once makes
/// every offset and buffer length at a capacity `≤ max_ctx` overflow-free, whichever
/// factor is 0.
pub(super) fn checked_size(
    g: &KvGeometry,
    max_ctx: usize,
    types: (KvType, KvType),
) -> Result<usize, KvError> {
    types.0.check_head_dim(g.head_dim)?;
    types.1.check_head_dim(g.head_dim)?;
    let too_large = KvError::TooLarge {
        n_layers: g.n_layers,
        max_ctx,
        kv_dim: g.kv_dim(),
    };
    let kv_dim = g
        .n_kv_heads
        .checked_mul(g.head_dim)
        .ok_or(too_large.clone())?;
    if max_ctx > isize::MAX as usize {
        return Err(too_large);
    }
    let fits = |bytes: usize| bytes <= isize::MAX as usize;
    // An f32 row is the widest of the types, so the f32 bound covers any pair.
    kv_dim
        .checked_mul(2 * 4)
        .filter(|&row| fits(row))
        .and_then(|row| row.checked_mul(max_ctx))
        .filter(|&layer| fits(layer))
        .and_then(|layer| layer.checked_mul(g.n_layers))
        .filter(|&bytes| fits(bytes))
        // The row indices too (`layer · cap + pos`), which the bytes do not bound when
        // rows are empty (`kv_dim == 0`).
        .filter(|_| g.n_layers.checked_mul(max_ctx).is_some_and(fits))
        .map(|_| kv_dim)
        .ok_or(too_large)
}

/// The growth rule: `cap` (or 1 when `cap == 0`) doubled until it covers `needed`,
/// clamped to `max_ctx`. Saturating, so `max_ctx` near `usize::MAX` cannot overflow.
pub(super) fn grown_capacity(cap: usize, needed: usize, max_ctx: usize) -> usize {
    let mut grown = cap.max(1);
    while grown < needed {
        grown = grown.saturating_mul(2);
    }
    grown.min(max_ctx)
}

impl fmt::Debug for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rows")
            .field("geometry", &self.geometry)
            .field("max_ctx", &self.max_ctx)
            .field("capacity", &self.cap)
            .field("len", &self.len)
            .field("append_open", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

/// Implements [`KvStore`](super::KvStore) and [`KvRestore`](super::KvRestore) for a
/// newtype over [`Rows`] by forwarding.
macro_rules! forward_store {
    ($store:ty) => {
        impl $crate::kv::KvStore for $store {
            fn geometry(&self) -> $crate::kv::KvGeometry {
                self.0.geometry()
            }
            fn kv_types(&self) -> ($crate::kv::KvType, $crate::kv::KvType) {
                self.0.kv_types()
            }
            fn max_ctx(&self) -> usize {
                self.0.max_ctx()
            }
            fn len(&self) -> usize {
                self.0.len()
            }
            fn capacity(&self) -> usize {
                self.0.capacity()
            }
            fn bytes(&self) -> usize {
                self.0.bytes()
            }
            fn view(&self, layer: usize) -> Result<$crate::kv::KvView<'_>, $crate::kv::KvError> {
                self.0.view(layer)
            }
            fn begin(&mut self, at: usize, n: usize) -> Result<(), $crate::kv::KvError> {
                self.0.begin(at, n)
            }
            fn write(
                &mut self,
                layer: usize,
                k: ndarray::ArrayView2<'_, f32>,
                v: ndarray::ArrayView2<'_, f32>,
            ) -> Result<(), $crate::kv::KvError> {
                self.0.write(layer, k, v)
            }
            fn commit(&mut self) -> Result<(), $crate::kv::KvError> {
                self.0.commit()
            }
            fn rollback(&mut self) {
                self.0.rollback()
            }
            fn truncate(&mut self, n: usize) -> Result<(), $crate::kv::KvError> {
                self.0.truncate(n);
                Ok(())
            }
            fn fork(&self) -> Result<Self, $crate::kv::KvError> {
                Ok(Self(self.0.fork()?))
            }
            fn fork_boxed(&self) -> Result<Box<dyn $crate::kv::KvStore>, $crate::kv::KvError> {
                Ok(Box::new(Self(self.0.fork()?)))
            }
            fn codecs(&self) -> ($crate::kv::KvCodec, $crate::kv::KvCodec) {
                self.0.codecs()
            }
            fn restorer(&mut self) -> Option<&mut dyn $crate::kv::KvRestore> {
                Some(self)
            }
        }

        impl $crate::kv::KvRestore for $store {
            fn write_stored(
                &mut self,
                layer: usize,
                k: $crate::kv::KvRows<'_>,
                v: $crate::kv::KvRows<'_>,
            ) -> Result<(), $crate::kv::KvError> {
                self.0.write_stored(layer, k, v)
            }
        }

        impl $store {
            /// The same empty store encoding its keys through `codec` (a model's comes
            /// from [`Llama::key_codec`](crate::model::Llama::key_codec)), calibration
            /// and all.
            ///
            /// # Errors
            /// [`KvError::RowType`](crate::kv::KvError::RowType) when the codec's type
            /// is not the keys'; [`KvError::Calibration`](crate::kv::KvError::Calibration)
            /// when the store holds positions (and another codec) or the calibration does not fit its
            /// geometry or cover its `max_ctx`.
            pub fn with_key_codec(
                mut self,
                codec: &$crate::kv::KvCodec,
            ) -> Result<Self, $crate::kv::KvError> {
                use $crate::kv::KvStore;
                let changes = *codec != self.0.codecs().0;
                if changes && (!self.is_empty() || self.0.is_open()) {
                    return Err($crate::kv::KvError::Calibration {
                        reason: "a key codec is set on an empty store",
                    });
                }
                codec.check_store(self.geometry(), self.max_ctx(), self.kv_types().0)?;
                let layers = (0..self.geometry().n_layers).collect();
                self.0.set_key_codec(codec.clone(), layers);
                Ok(self)
            }

            /// [`with_key_codec`](Self::with_key_codec) of the key codec kept less
            /// `offsets` ([`KvCodec::with_key_offsets`](crate::kv::KvCodec::with_key_offsets)).
            ///
            /// # Errors
            /// As `with_key_codec`, and
            /// [`KvError::Calibration`](crate::kv::KvError::Calibration) when the keys'
            /// type does not calibrate.
            pub fn with_key_offsets(
                self,
                offsets: std::sync::Arc<$crate::kv::KeyOffsets>,
            ) -> Result<Self, $crate::kv::KvError> {
                use $crate::kv::KvStore;
                let codec = $crate::kv::KvCodec::with_key_offsets(self.kv_types().0, offsets)?;
                self.with_key_codec(&codec)
            }
        }
    };
}
pub(super) use forward_store;
