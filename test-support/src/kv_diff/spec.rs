//! [`SpecKv`], the specification store: the KV store contract in its plainest form,
//! sharing no code with the stores it checks. Its admission checks are its own, written
//! from the contract's list (`KvStore::begin`'s errors in their order, the rows' shapes,
//! every layer before a commit), and so are its encodings, written from `kv/elem.rs`'s
//! table: f16 and bf16 through `half`'s round-to-nearest-even conversions; `q8_0` by a
//! textbook Walsh–Hadamard transform (the butterflies of `h = 1, 2, 4, …` in order, so
//! each output is the same sum of the same terms as the store's transform) and the block
//! rule stated there (the scale `amax / 127` rounded to f16, up when rounding to nearest
//! went down to a positive scale, each quant rounded half to even against the stored
//! scale; a non-finite block a NaN scale, a block too small for a normal scale a zero
//! one; a scale that f16 rounds to zero or infinity stored so, with the quants against
//! the f32 scale); `q4_0` rotated and shifted as `q8_0`, then llama.cpp's reference
//! block rule (`d = m / −8` from the value `m` of largest magnitude, each quant
//! `min(15, ⌊x / d + 8.5⌋)` against the f32 `d`, the scale stored as f16).

use std::sync::Arc;

use half::{bf16, f16};
use kvcore::kv::{
    BlockQ4_0, BlockQ8_0, KeyOffsets, KvCodec, KvError, KvGeometry, KvRows, KvSegment, KvStore,
    KvType, KvView,
};
use kvcore::ndarray::{ArrayView2, ArrayView3};

use super::position_bytes;

/// The KV store contract in its plainest form: per layer one `Vec<f32>` of the committed
/// rows, and an open append held as each written layer's whole new contents. Its
/// capacity is its length; it never fails to allocate (an abort instead).
///
/// A window layer of `w` keeps every row but shows only the retained ones, `lo .. len`,
/// by the window rule: a commit of `at .. end` sets `lo = max(min(lo, at), end − w)`; a
/// truncate to `n` keeps `lo` (`0` when `n = 0`); a rewind to `0 < n < len` is refused
/// with [`KvError::BehindWindow`] unless `lo ≤ n + 1 − w` in every window layer.
#[derive(Debug)]
pub struct SpecKv {
    geometry: KvGeometry,
    kv_dim: usize,
    max_ctx: usize,
    len: usize,
    /// `[n_layers]`: `None` global, `Some(w)` a window.
    windows: Vec<Option<usize>>,
    /// `[n_layers]`: the first position shown (0 for a global layer).
    lo: Vec<usize>,
    /// K's and V's element types.
    types: (KvType, KvType),
    /// `[n_layers]` of `[len]` rows in K's type.
    k: Vec<SpecRows>,
    /// `[n_layers]` of `[len]` rows in V's type.
    v: Vec<SpecRows>,
    pending: Option<SpecAppend>,
    /// What `q8_0` keys are encoded less of (`kv/offsets.rs`).
    key_offsets: Option<Arc<KeyOffsets>>,
}

/// Rows of one element type, each encoded on its own (the module docs): `[rows][units
/// per row]`.
#[derive(Debug, Clone)]
enum SpecRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
}

macro_rules! each_rows {
    ($rows:expr, $v:ident => $body:expr) => {
        match $rows {
            SpecRows::F32($v) => $body,
            SpecRows::F16($v) => $body,
            SpecRows::BF16($v) => $body,
            SpecRows::Q8_0($v) => $body,
            SpecRows::Q4_0($v) => $body,
        }
    };
}

impl SpecRows {
    fn new(ty: KvType) -> SpecRows {
        match ty {
            KvType::F16 => SpecRows::F16(Vec::new()),
            KvType::BF16 => SpecRows::BF16(Vec::new()),
            KvType::Q8_0 => SpecRows::Q8_0(Vec::new()),
            KvType::Q4_0 => SpecRows::Q4_0(Vec::new()),
            _ => SpecRows::F32(Vec::new()),
        }
    }

    /// The first `units` units followed by `rows` encoded; `q8_0` keys at positions
    /// `shift.2 ..` of layer `shift.1` less the key offsets `shift.0`, as `kv/offsets.rs`
    /// states it (each head rotated, its block's rotated offset subtracted, quantised).
    fn prefix_then(
        &self,
        units: usize,
        rows: ArrayView2<'_, f32>,
        head_dim: usize,
        shift: Option<(&KeyOffsets, usize, usize)>,
    ) -> SpecRows {
        let mut out = self.clone();
        out.truncate(units);
        match &mut out {
            SpecRows::F32(v) => v.extend(rows.iter()),
            SpecRows::F16(v) => v.extend(rows.iter().map(|&x| f16::from_f32(x))),
            SpecRows::BF16(v) => v.extend(rows.iter().map(|&x| bf16::from_f32(x))),
            SpecRows::Q8_0(v) => blocks(v, rows, head_dim, shift, q8_0_block),
            SpecRows::Q4_0(v) => blocks(v, rows, head_dim, shift, q4_0_block),
        }
        out
    }

    fn truncate(&mut self, units: usize) {
        each_rows!(self, v => v.truncate(units))
    }

    /// Units `span` as `[rows, h, per_head]`.
    fn view(
        &self,
        span: std::ops::Range<usize>,
        rows: usize,
        h: usize,
        per_head: usize,
    ) -> KvRows<'_> {
        let shape = (rows, h, per_head);
        let err = "rows · units per row";
        match self {
            SpecRows::F32(v) => KvRows::F32(ArrayView3::from_shape(shape, &v[span]).expect(err)),
            SpecRows::F16(v) => KvRows::F16(ArrayView3::from_shape(shape, &v[span]).expect(err)),
            SpecRows::BF16(v) => KvRows::BF16(ArrayView3::from_shape(shape, &v[span]).expect(err)),
            SpecRows::Q8_0(v) => KvRows::Q8_0(ArrayView3::from_shape(shape, &v[span]).expect(err)),
            SpecRows::Q4_0(v) => KvRows::Q4_0(ArrayView3::from_shape(shape, &v[span]).expect(err)),
        }
    }
}

#[derive(Debug)]
struct SpecAppend {
    at: usize,
    n: usize,
    /// `[n_layers]`: once written, the layer's K and V rows `0 .. at + n`.
    layers: Vec<Option<(SpecRows, SpecRows)>>,
}

impl SpecKv {
    /// An empty store. The geometry's rows must not overflow (the real stores'
    /// constructors reject those).
    pub fn new(geometry: KvGeometry, max_ctx: usize) -> Self {
        SpecKv::with_windows(geometry, max_ctx, &vec![None; geometry.n_layers])
    }

    /// An empty store whose layer `l` has the window `windows[l]` (missing entries are
    /// global layers).
    pub fn with_windows(geometry: KvGeometry, max_ctx: usize, windows: &[Option<usize>]) -> Self {
        SpecKv::with_types(geometry, max_ctx, windows, (KvType::F32, KvType::F32))
    }

    /// [`with_windows`](SpecKv::with_windows) with K rows of `types.0` and V rows of
    /// `types.1` (the head size a whole number of the types' blocks).
    pub fn with_types(
        geometry: KvGeometry,
        max_ctx: usize,
        windows: &[Option<usize>],
        types: (KvType, KvType),
    ) -> Self {
        SpecKv {
            types,
            geometry,
            kv_dim: geometry.kv_dim(),
            max_ctx,
            len: 0,
            windows: (0..geometry.n_layers)
                .map(|l| windows.get(l).copied().flatten())
                .collect(),
            lo: vec![0; geometry.n_layers],
            k: vec![SpecRows::new(types.0); geometry.n_layers],
            v: vec![SpecRows::new(types.1); geometry.n_layers],
            pending: None,
            key_offsets: None,
        }
    }

    /// The same empty store encoding its `q8_0` keys less `offsets`.
    pub fn with_key_offsets(mut self, offsets: Option<Arc<KeyOffsets>>) -> Self {
        self.key_offsets = offsets;
        self
    }

    /// Units per K row and per V row.
    fn units(&self) -> (usize, usize) {
        (
            self.types.0.row_units(self.kv_dim),
            self.types.1.row_units(self.kv_dim),
        )
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

    /// `Err(BehindWindow)` for a rewind to `0 < n < len` that a window layer cannot serve.
    fn check_rewind(&self, n: usize) -> Result<(), KvError> {
        if n == 0 || n >= self.len || self.can_rewind_to(n) {
            return Ok(());
        }
        let earliest = (0..self.geometry.n_layers)
            .filter_map(|l| Some((self.windows[l]?, self.lo[l])))
            .filter(|&(_, lo)| lo > 0)
            .map(|(w, lo)| lo + w - 1)
            .max()
            .unwrap_or(0)
            .min(self.len);
        Err(KvError::BehindWindow { pos: n, earliest })
    }

    /// The first position layer `layer`'s view holds (its positions run from there to
    /// `len`, or to `at + n` once the open append has written it).
    pub fn shown_from(&self, layer: usize) -> usize {
        match &self.pending {
            Some(p) if p.layers[layer].is_some() => self.lo[layer].min(p.at),
            _ => self.lo[layer],
        }
    }

    /// The first position a query of the current state can see in layer `layer`: `0` for
    /// a global layer; for a window `w`, `len + 1 − w`, or `at + 1 − w` once the open
    /// append has written the layer (its earliest query is at `at`).
    pub fn needed_from(&self, layer: usize) -> usize {
        let Some(w) = self.windows.get(layer).copied().flatten() else {
            return 0;
        };
        let q = match &self.pending {
            Some(p) if p.layers[layer].is_some() => p.at,
            _ => self.len,
        };
        (q + 1).saturating_sub(w)
    }
}

impl KvStore for SpecKv {
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
    fn capacity(&self) -> usize {
        self.len
    }
    /// The bytes of the rows held (not of the vectors' spare capacity).
    fn bytes(&self) -> usize {
        self.geometry.n_layers * self.len * position_bytes(self.kv_dim, self.types)
    }
    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        self.check_layer(layer)?;
        let (k, v) = match self.pending.as_ref().and_then(|p| p.layers[layer].as_ref()) {
            Some((k, v)) => (k, v),
            None => (&self.k[layer], &self.v[layer]),
        };
        let (h, d) = (self.geometry.n_kv_heads, self.geometry.head_dim);
        let (rows, lo) = match &self.pending {
            Some(p) if p.layers[layer].is_some() => (p.at + p.n, self.lo[layer].min(p.at)),
            _ => (self.len, self.lo[layer]),
        };
        let (ku, vu) = self.units();
        let (kh, vh) = (d / self.types.0.block(), d / self.types.1.block());
        let (k, v) = (
            k.view(lo * ku..rows * ku, rows - lo, h, kh),
            v.view(lo * vu..rows * vu, rows - lo, h, vh),
        );
        KvView::new(h, d, vec![KvSegment::new(lo, k, v)?])
    }
    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        if at > self.len {
            return Err(KvError::StartPastEnd { at, len: self.len });
        }
        if n > 0 && at.checked_add(n).is_none_or(|end| end > self.max_ctx) {
            let pos = at.saturating_add(n - 1);
            let max_ctx = self.max_ctx;
            return Err(KvError::ContextOverflow { pos, max_ctx });
        }
        self.check_rewind(at)?;
        self.pending = Some(SpecAppend {
            at,
            n,
            layers: vec![None; self.geometry.n_layers],
        });
        Ok(())
    }
    fn write(
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
        for (what, found) in [("append keys", k.dim()), ("append values", v.dim())] {
            if found != (n, self.kv_dim) {
                let expected = (n, self.kv_dim);
                return Err(KvError::RowShape {
                    what,
                    expected,
                    found,
                });
            }
        }
        let (ku, vu) = self.units();
        let shift = self.key_offsets.as_deref().map(|o| (o, layer, at));
        let layer_rows = (
            self.k[layer].prefix_then(at * ku, k, self.geometry.head_dim, shift),
            self.v[layer].prefix_then(at * vu, v, self.geometry.head_dim, None),
        );
        if let Some(p) = &mut self.pending {
            p.layers[layer] = Some(layer_rows);
        }
        Ok(())
    }
    fn commit(&mut self) -> Result<(), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        if p.n > 0
            && let Some(layer) = p.layers.iter().position(Option::is_none)
        {
            return Err(KvError::Incomplete { layer });
        }
        let p = self.pending.take().expect("checked");
        let (ku, vu) = self.units();
        let end = p.at + p.n;
        for (layer, w) in self.windows.iter().enumerate() {
            if let Some(w) = w {
                self.lo[layer] = self.lo[layer].min(p.at).max(end.saturating_sub(*w));
            }
        }
        for (layer, rows) in p.layers.into_iter().enumerate() {
            match rows {
                Some((k, v)) => (self.k[layer], self.v[layer]) = (k, v),
                None => {
                    self.k[layer].truncate(p.at * ku);
                    self.v[layer].truncate(p.at * vu);
                }
            }
        }
        self.len = p.at + p.n;
        Ok(())
    }
    fn rollback(&mut self) {
        self.pending = None;
    }
    fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        self.check_rewind(n)?;
        self.rollback();
        self.len = self.len.min(n);
        for lo in &mut self.lo {
            *lo = (*lo).min(self.len);
        }
        let (ku, vu) = self.units();
        for rows in &mut self.k {
            rows.truncate(self.len * ku);
        }
        for rows in &mut self.v {
            rows.truncate(self.len * vu);
        }
        Ok(())
    }
    fn can_rewind_to(&self, n: usize) -> bool {
        n == self.len
            || n == 0
            || (n < self.len
                && (0..self.geometry.n_layers).all(|l| match self.windows[l] {
                    Some(w) => self.lo[l] <= (n + 1).saturating_sub(w),
                    None => true,
                }))
    }
    fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }
    fn fork(&self) -> Result<Self, KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        Ok(SpecKv {
            windows: self.windows.clone(),
            lo: self.lo.clone(),
            k: self.k.clone(),
            v: self.v.clone(),
            pending: None,
            key_offsets: self.key_offsets.clone(),
            ..*self
        })
    }
    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
        Ok(Box::new(self.fork()?))
    }
    fn codecs(&self) -> (KvCodec, KvCodec) {
        let k = match &self.key_offsets {
            Some(o) => KvCodec::with_key_offsets(self.types.0, o.clone())
                .expect("a scenario gives offsets to calibrating keys only"),
            None => KvCodec::new(self.types.0),
        };
        (k, KvCodec::new(self.types.1))
    }
}

/// `x ← H x` per head (`H` the ±1 Sylvester matrix of the head's rotation length, the
/// largest power of two dividing it): each stage `h = 1, 2, 4, …` replaces every pair
/// `(x_i, x_{i+h})` with `i & h = 0` by its sum and difference.
fn walsh_hadamard(x: &mut [f32]) {
    let n = 1usize << x.len().trailing_zeros();
    for run in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).filter(|i| i & h == 0) {
                (run[i], run[i + h]) = (run[i] + run[i + h], run[i] - run[i + h]);
            }
            h *= 2;
        }
    }
}

/// Appends `rows` encoded in a block type to `v`: each head rotated, less its block's
/// rotated key offset under `shift` (as [`SpecRows::prefix_then`] states), then `block`
/// of each 32 values.
fn blocks<B>(
    v: &mut Vec<B>,
    rows: ArrayView2<'_, f32>,
    head_dim: usize,
    shift: Option<(&KeyOffsets, usize, usize)>,
    block: fn(&[f32]) -> B,
) {
    for (t, row) in rows.rows().into_iter().enumerate() {
        // A row of heads of 0 values is empty.
        for (h, head) in row.to_vec().chunks_exact(head_dim.max(1)).enumerate() {
            let mut y = head.to_vec();
            walsh_hadamard(&mut y);
            if let Some((offsets, layer, at)) = shift {
                let t_b = offsets.rotated(layer, at + t, h).expect("covered");
                y.iter_mut().zip(t_b).for_each(|(y, &o)| *y -= o);
            }
            v.extend(y.chunks_exact(32).map(block));
        }
    }
}

/// One `q4_0` block of 32 values (the module docs).
fn q4_0_block(x: &[f32]) -> BlockQ4_0 {
    let m = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = m / -8.0;
    let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q = |v: f32| ((v * inv + 8.5).floor().clamp(0.0, 15.0)) as u8;
    let mut qs = [0u8; 16];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = q(x[j]) | q(x[j + 16]) << 4;
    }
    BlockQ4_0 {
        d: f16::from_f32(d).to_le_bytes(),
        qs,
    }
}

/// One `q8_0` block of 32 values (the module docs).
fn q8_0_block(x: &[f32]) -> BlockQ8_0 {
    let mut qs = [0i8; 32];
    if x.iter().any(|v| !v.is_finite()) {
        return BlockQ8_0 { d: f16::NAN, qs };
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    if d < f32::MIN_POSITIVE {
        return BlockQ8_0 { d: f16::ZERO, qs };
    }
    let mut stored = f16::from_f32(d);
    if stored.to_f32() > 0.0 && stored.to_f32() < d {
        stored = f16::from_bits(stored.to_bits() + 1);
    }
    let s = stored.to_f32();
    if s.is_finite() && s > 0.0 {
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v / s).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        return BlockQ8_0 { d: stored, qs };
    }
    // A scale f16 cannot hold (it overflows, or rounds to zero): stored as it rounds, the
    // quants against the f32 scale.
    let inv = 1.0 / d;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * inv).round_ties_even() as i8;
    }
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}
