//! The implementation [`DenseKv`](super::DenseKv) and [`GrowKv`](super::GrowKv) share:
//! f32 rows in `[n_layers][cap][kv_dim]` buffers with transactional appends.
//!
//! Layout: K and V are each one `Vec<f32>` of `[n_layers][cap][kv_dim]`, the per-layer
//! stride being the capacity `cap`: `offset(layer, pos) = (layer · cap + pos) · kv_dim`.
//! Slot `i` of a layer holds position `i`, so a layer's view is one segment, rows
//! `0 .. len` (or `0 .. at + n` once the open append has written the layer).
//!
//! An append of `n` positions at `at` that needs `at + n > cap` grows the store in
//! [`Rows::begin`]: the capacity doubles until it covers `at + n`, clamped to `max_ctx`
//! (from 0 the doubling starts at 1), both buffers are allocated at the new size
//! (zero-filled, so every page is resident) and each layer's committed rows are copied
//! from the old stride to the new with one `copy_from_slice`. The rows copied over a run
//! of appends sum to less than twice the final size. The old buffers are kept until the
//! commit, so a rollback restores them. An append with `at < len` that does not grow
//! overwrites committed rows `at .. min(len, at + n)` in place; `begin` allocates room
//! for them and `write` saves each layer's before overwriting it, for the rollback.
//! Otherwise an append writes only slots no reader can see (`≥ len`). Either way every
//! allocation of an append happens in `begin`.

use std::fmt;
use std::mem;
use std::sync::Arc;

use ndarray::{ArrayView2, ArrayView3, ArrayViewMut2};

use super::{
    AllocGate, Gate, KvError, KvGeometry, KvRows, KvSegment, KvType, KvView, check_begin,
    check_rows,
};

/// f32 K and V rows of every layer with a live capacity; see the module docs.
pub(super) struct Rows {
    geometry: KvGeometry,
    /// `n_kv_heads · head_dim`, checked at construction.
    kv_dim: usize,
    max_ctx: usize,
    /// Slots per layer, the per-layer stride; `len ≤ cap ≤ max_ctx`.
    cap: usize,
    /// Committed positions.
    len: usize,
    /// `[n_layers][cap][kv_dim]`
    k: Vec<f32>,
    /// `[n_layers][cap][kv_dim]`
    v: Vec<f32>,
    gate: Gate,
    pending: Option<Pending>,
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
    Grown {
        k: Vec<f32>,
        v: Vec<f32>,
        cap: usize,
    },
    /// The append overwrites committed rows `at .. at + m` in place: their values,
    /// `[n_layers][m][kv_dim]`, saved when each layer is first written.
    Replaced { m: usize, k: Vec<f32>, v: Vec<f32> },
}

impl Undo {
    fn bytes(&self) -> usize {
        match self {
            Undo::Nothing => 0,
            Undo::Grown { k, v, .. } | Undo::Replaced { k, v, .. } => {
                (k.capacity() + v.capacity()) * mem::size_of::<f32>()
            }
        }
    }
}

impl Rows {
    /// An empty store with `min(cap, max_ctx)` zeroed slots per layer.
    ///
    /// Errors with [`KvError::TooLarge`] when the store at `max_ctx` would not fit in
    /// `isize::MAX` bytes (checked first, so no later growth can overflow) and with
    /// [`KvError::AllocFailed`] when the initial buffers are refused.
    pub(super) fn new(geometry: KvGeometry, max_ctx: usize, cap: usize) -> Result<Self, KvError> {
        let kv_dim = checked_size(&geometry, max_ctx)?;
        let cap = cap.min(max_ctx);
        let mut rows = Rows {
            geometry,
            kv_dim,
            max_ctx,
            cap,
            len: 0,
            k: Vec::new(),
            v: Vec::new(),
            gate: None,
            pending: None,
        };
        rows.k = rows.zeroed(rows.buffer_len(cap))?;
        rows.v = rows.zeroed(rows.buffer_len(cap))?;
        Ok(rows)
    }

    pub(super) fn set_gate(&mut self, gate: Option<Arc<dyn AllocGate>>) {
        self.gate = gate;
    }

    /// Floats in one buffer at capacity `cap ≤ max_ctx` (no overflow: `checked_size`).
    fn buffer_len(&self, cap: usize) -> usize {
        self.geometry.n_layers * (cap * self.kv_dim)
    }

    /// Float offset of slot `pos` of `layer` at capacity `cap`, for `pos ≤ cap`.
    fn offset(&self, cap: usize, layer: usize, pos: usize) -> usize {
        layer * (cap * self.kv_dim) + pos * self.kv_dim
    }

    /// A zero-filled buffer of exactly `len` floats, through the gate and a fallible
    /// reservation: a refusal is [`KvError::AllocFailed`], never an abort.
    fn zeroed(&self, len: usize) -> Result<Vec<f32>, KvError> {
        zeroed(&self.gate, len)
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
        (KvType::F32, KvType::F32)
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
        (self.k.capacity() + self.v.capacity()) * mem::size_of::<f32>() + undo
    }

    pub(super) fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        self.check_layer(layer)?;
        let rows = match &self.pending {
            Some(p) if p.written[layer] => p.at + p.n,
            _ => self.len,
        };
        let (h, d) = (self.geometry.n_kv_heads, self.geometry.head_dim);
        let at = self.offset(self.cap, layer, 0);
        let span = at..at + rows * self.kv_dim;
        let keys = ArrayView3::from_shape((rows, h, d), &self.k[span.clone()]);
        let values = ArrayView3::from_shape((rows, h, d), &self.v[span]);
        let (keys, values) = match (keys, values) {
            (Ok(k), Ok(v)) => (KvRows::F32(k), KvRows::F32(v)),
            _ => unreachable!("the span holds rows · kv_dim floats"),
        };
        KvView::new(h, d, vec![KvSegment::new(0, keys, values)?])
    }

    pub(super) fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        let open = self.pending.is_some();
        let end = check_begin(open, self.len, self.max_ctx, at, n)?;
        let replaced = self.len.min(end) - at;
        let undo = if end > self.cap {
            let cap = grown_capacity(self.cap, end, self.max_ctx);
            let mut k = self.zeroed(self.buffer_len(cap))?;
            let mut v = self.zeroed(self.buffer_len(cap))?;
            let rows = self.len * self.kv_dim;
            for layer in 0..self.geometry.n_layers {
                let (src, dst) = (self.offset(self.cap, layer, 0), self.offset(cap, layer, 0));
                k[dst..dst + rows].copy_from_slice(&self.k[src..src + rows]);
                v[dst..dst + rows].copy_from_slice(&self.v[src..src + rows]);
            }
            Undo::Grown {
                k: mem::replace(&mut self.k, k),
                v: mem::replace(&mut self.v, v),
                cap: mem::replace(&mut self.cap, cap),
            }
        } else if replaced > 0 {
            let len = self.geometry.n_layers * (replaced * self.kv_dim);
            Undo::Replaced {
                m: replaced,
                k: self.zeroed(len)?,
                v: self.zeroed(len)?,
            }
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

    pub(super) fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        let (at, n) = match &self.pending {
            Some(p) => (p.at, p.n),
            None => return Err(KvError::NoAppend),
        };
        self.check_layer(layer)?;
        check_rows(n, self.kv_dim, &k, &v)?;
        let dst = self.offset(self.cap, layer, at);
        let span = dst..dst + n * self.kv_dim;
        let kv_dim = self.kv_dim;
        let Rows {
            pending,
            k: kbuf,
            v: vbuf,
            ..
        } = self;
        let p = pending.as_mut().expect("checked above");
        if let Undo::Replaced { m, k: sk, v: sv } = &mut p.undo {
            if !p.written[layer] {
                let saved = layer * (*m * kv_dim)..(layer + 1) * (*m * kv_dim);
                let live = dst..dst + *m * kv_dim;
                sk[saved.clone()].copy_from_slice(&kbuf[live.clone()]);
                sv[saved].copy_from_slice(&vbuf[live]);
            }
        }
        assign_rows(&mut kbuf[span.clone()], kv_dim, k);
        assign_rows(&mut vbuf[span], kv_dim, v);
        p.written[layer] = true;
        Ok(())
    }

    pub(super) fn commit(&mut self) -> Result<(), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        if p.n > 0 {
            if let Some(layer) = p.written.iter().position(|w| !w) {
                return Err(KvError::Incomplete { layer });
            }
        }
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
                let stride = m * self.kv_dim;
                for layer in (0..self.geometry.n_layers).filter(|&l| p.written[l]) {
                    let dst = self.offset(self.cap, layer, p.at);
                    let saved = layer * stride..(layer + 1) * stride;
                    self.k[dst..dst + stride].copy_from_slice(&k[saved.clone()]);
                    self.v[dst..dst + stride].copy_from_slice(&v[saved]);
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
        let mut k = self.zeroed(self.k.len())?;
        let mut v = self.zeroed(self.v.len())?;
        let rows = self.len * self.kv_dim;
        for layer in 0..self.geometry.n_layers {
            let at = self.offset(self.cap, layer, 0);
            k[at..at + rows].copy_from_slice(&self.k[at..at + rows]);
            v[at..at + rows].copy_from_slice(&self.v[at..at + rows]);
        }
        Ok(Rows {
            k,
            v,
            gate: self.gate.clone(),
            pending: None,
            ..*self
        })
    }
}

/// A zero-filled buffer of exactly `len` floats, through `gate` (consulted only when
/// `len > 0`) and a fallible reservation: a refusal is [`KvError::AllocFailed`], never an
/// abort.
pub(super) fn zeroed(gate: &Gate, len: usize) -> Result<Vec<f32>, KvError> {
    let bytes = len.saturating_mul(mem::size_of::<f32>());
    let refused = KvError::AllocFailed { bytes };
    if len > 0 && gate.as_ref().is_some_and(|g| !g.admit(bytes)) {
        return Err(refused);
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|_| refused)?;
    buf.resize(len, 0.0);
    Ok(buf)
}

/// `kv_dim`, or [`KvError::TooLarge`] when `max_ctx` exceeds `isize::MAX` (the longest
/// axis an array view may have), or a row, one layer at `max_ctx` positions (which
/// matters when `n_layers` is 0) or the two buffers together at `max_ctx` would exceed
/// `isize::MAX` bytes. Checking the full size once makes every offset and buffer length
/// at a capacity `≤ max_ctx` overflow-free, whichever factor is 0.
pub(super) fn checked_size(g: &KvGeometry, max_ctx: usize) -> Result<usize, KvError> {
    let fits = |floats: usize| {
        floats
            .checked_mul(2 * mem::size_of::<f32>())
            .is_some_and(|bytes| bytes <= isize::MAX as usize)
    };
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
    max_ctx
        .checked_mul(kv_dim)
        .filter(|&stride| fits(stride))
        .and_then(|stride| stride.checked_mul(g.n_layers))
        .filter(|&floats| fits(floats))
        .map(|_| kv_dim)
        .ok_or(too_large)
}

/// Copies `rows: [n, kv_dim]` (any strides) into `buf`, `n · kv_dim` floats row-major.
pub(super) fn assign_rows(buf: &mut [f32], kv_dim: usize, rows: ArrayView2<'_, f32>) {
    ArrayViewMut2::from_shape((rows.nrows(), kv_dim), buf)
        .expect("the span holds n · kv_dim floats")
        .assign(&rows);
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

/// Implements [`KvStore`](super::KvStore) for a newtype over [`Rows`] by forwarding.
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
        }
    };
}
pub(super) use forward_store;
