//! Differential testing of the KV stores: one op sequence applied to a [`SpecKv`] (the
//! specification: plain vectors, obviously right), a [`DenseKv`] (the reference), a
//! [`GrowKv`] and a [`WindowKv`], which must agree bit for bit after every step.
//!
//! A scenario may give layers sliding windows ([`Scenario::windows`]). The spec and the
//! `WindowKv` then apply the window rule (a window layer of `w` retains its last `w`
//! committed positions; a rewind to `0 < n < len` that would need an evicted position is
//! [`KvError::BehindWindow`]), while the dense and growing stores keep every position,
//! as a dense store with the window applied as a mask does. For a window layer the
//! `WindowKv`'s view must equal the spec's exactly (the retained positions, ascending),
//! the spec must retain every position a future query can see (from `len + 1 − w`, or
//! during an open append from `at + 1 − w`, what the pass's own queries see), and the
//! dense and growing stores must hold the same bits at those positions. When the spec
//! refuses a rewind behind a window, the `WindowKv` must refuse it with the same error
//! and the dense and growing stores are not asked (an append's `begin` on them is rolled
//! back).
//!
//! A [`Scenario`] is a geometry plus a list of [`KvOp`]s over up to [`MAX_SEQS`]
//! sequences (forks add sequences). [`run`] replays it and returns the first
//! [`Divergence`]. An append is driven step by step on all three stores — `begin`, each
//! layer's `write`, then `commit` or `rollback` as its [`End`] says — and after the
//! begin and after every write it checks:
//! - the stores returned the same `Result` (same [`KvError`]), except that a store may
//!   fail with [`KvError::AllocFailed`] where the others succeed (each allocates at its
//!   own moments, and [`KvOp::RefuseNextAlloc`] makes the next allocation of the dense,
//!   growing and window stores fail): then the others' append is rolled back;
//! - every layer's view holds the same positions (`0 .. len`, or `0 .. at + n` for a
//!   layer written by the open append) and the same stored bytes in all three (f32 rows
//!   by `f32::to_bits`, NaN payloads and `-0.0` included; f16, bf16 and q8_0 rows, as the
//!   scenario's K and V types choose, by their encoded units);
//! - a failed or rolled-back op left each store exactly as it was (positions, bits,
//!   capacity, bytes);
//! - `len` is equal; with `P` a position's K and V row bytes in the scenario's types
//!   (`2 · kv_dim · 4` in f32), `DenseKv`'s capacity is `max_ctx` and its bytes
//!   `n_layers · max_ctx · P`; `GrowKv`'s capacity stays in `len..=max_ctx` and never
//!   shrinks, its bytes are exactly `n_layers · capacity · P` outside an append and at
//!   most the dense store's; `WindowKv`'s per-layer capacity is in `len..=max_ctx` for a
//!   global layer and in `retained..=min(w, max_ctx)` for a window layer, and its bytes
//!   are exactly `P · Σ layer capacity` outside an append (so a window layer costs at most
//!   `w` positions).
//!
//! Scenarios implement [`arbitrary::Arbitrary`] with bounded sizes so one run takes
//! microseconds to milliseconds (`1..=4` layers, `1..=3` KV heads of `0..=6`, `max_ctx`
//! `0..=600`, at most 64 ops, windows `1..=300`); every byte string decodes
//! ([`Scenario::from_bytes`], the `kv_growth` fuzz target's input format, whose windows
//! come last and mostly decode as none; [`Scenario::from_window_bytes`], the `kv_window`
//! target's, whose windows come first).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arbitrary::{Arbitrary, Unstructured};
use half::{bf16, f16};
use kvcore::kv::{
    AllocGate, BlockQ8_0, DenseKv, GrowKv, KeyOffsets, KvError, KvGeometry, KvRows, KvSegment,
    KvStore, KvType, KvView, Q8_0_BLOCK, WindowKv, check_begin, check_rows, encode_q8_0, hadamard,
    rotation_len,
};
use kvcore::ndarray::{Array2, ArrayView2, ArrayView3};

/// Most layers of an arbitrary [`Scenario`] (the fewest is 1).
pub const MAX_LAYERS: usize = 4;
/// Most KV heads of an arbitrary [`Scenario`] (the fewest is 1).
pub const MAX_KV_HEADS: usize = 3;
/// Largest `head_dim` of an arbitrary [`Scenario`] (the smallest is 0).
pub const MAX_HEAD_DIM: usize = 6;
/// Largest `max_ctx` of an arbitrary [`Scenario`] (the smallest is 0).
pub const MAX_CTX: usize = 600;
/// Largest explicit initial capacity (above [`MAX_CTX`], so clamping is exercised).
pub const MAX_INITIAL: usize = 700;
/// Most ops in an arbitrary [`Scenario`].
pub const MAX_OPS: usize = 64;
/// Most value words of an arbitrary append.
pub const MAX_BITS: usize = 32;
/// Most sequences alive at once.
pub const MAX_SEQS: usize = 4;
/// Small positions are `0..POS_RANGE`, past [`MAX_CTX`] so overflows occur.
pub const POS_RANGE: usize = 700;
/// Largest window of an arbitrary [`Scenario`] (the smallest is 1).
pub const MAX_WINDOW: usize = 300;

/// How an append ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum End {
    /// Every layer written, then committed.
    Commit,
    /// Every layer written, then rolled back.
    Rollback,
    /// Layers `0 .. k % (n_layers + 1)` written, then rolled back: a pass that failed
    /// part-way.
    FailAfter(u8),
    /// Every layer but `k % n_layers` written; the commit must fail with
    /// [`KvError::Incomplete`] (when the append has positions), then a rollback.
    SkipLayer(u8),
    /// Layer `k % n_layers` first gets rows one element too wide, which must fail with
    /// [`KvError::RowShape`] and change nothing; then every layer is written and
    /// committed.
    BadRow(u8),
}

/// Where an append starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Start {
    /// At `len`: a plain append.
    End,
    /// At `len − back` (saturating): replaces the last `back` positions, as a session
    /// does when a new turn diverges from the cached one.
    Back(u16),
    /// At an absolute position, possibly past `len` or near `usize::MAX`.
    At(#[arbitrary(with = arb_pos)] usize),
}

/// One operation on the sequences.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub enum KvOp {
    /// An append of `n` positions on sequence `seq % seqs` (see [`End`]). Row `t` of
    /// layer `l` gets K element `i` = `bits[(t·kv_dim + i + 3l) % bits.len()]` and V
    /// element `i` = `bits[(t·kv_dim + i + 3l + 1) % bits.len()]` (`f32::from_bits`,
    /// verbatim; no bits writes `+0.0`).
    Append {
        /// The sequence.
        seq: u8,
        /// Where it starts.
        start: Start,
        /// Positions appended.
        #[arbitrary(with = arb_count)]
        n: usize,
        /// The value words.
        #[arbitrary(with = arb_bits)]
        bits: Vec<u32>,
        /// How it ends.
        end: End,
    },
    /// `truncate(n)`.
    Truncate {
        /// The sequence.
        seq: u8,
        /// Positions kept.
        #[arbitrary(with = arb_pos)]
        n: usize,
    },
    /// `clear()`.
    Clear {
        /// The sequence.
        seq: u8,
    },
    /// `fork()`: a new sequence starting from this one (when fewer than [`MAX_SEQS`]).
    Fork {
        /// The sequence forked.
        seq: u8,
    },
    /// Drops a sequence (when more than one).
    Free {
        /// The sequence dropped.
        seq: u8,
    },
    /// The next allocation of the dense, growing and window stores during the next op
    /// fails.
    RefuseNextAlloc,
    /// `truncate(len − back)` (saturating): into a window (`back = 1` is always
    /// possible) or behind it.
    TruncateBack {
        /// The sequence.
        seq: u8,
        /// Positions dropped.
        back: u16,
    },
}

/// A geometry and the ops to replay on it.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct Scenario {
    /// Layers.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=MAX_LAYERS))]
    pub n_layers: usize,
    /// KV heads.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=MAX_KV_HEADS))]
    pub n_kv_heads: usize,
    /// Elements per head.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=MAX_HEAD_DIM))]
    pub head_dim: usize,
    /// Context ceiling.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=MAX_CTX))]
    pub max_ctx: usize,
    /// `None`: `GrowKv::new`; `Some(i)`: `GrowKv::with_initial_capacity(.., i)`.
    #[arbitrary(with = arb_initial)]
    pub initial: Option<usize>,
    /// The ops, applied in order.
    #[arbitrary(with = arb_ops)]
    pub ops: Vec<KvOp>,
    /// Per layer, the window of the spec's and the `WindowKv`'s layer (`None`: global);
    /// missing entries are `None`, extra ones ignored.
    #[arbitrary(with = arb_windows)]
    pub windows: Vec<Option<usize>>,
    /// The element types of K and V in every store (read last, so input that ends
    /// before it, as the older corpus files do, gets f32).
    #[arbitrary(with = arb_types)]
    pub types: (KvType, KvType),
}

/// The key offsets the differential runs keep `q8_0` keys less of: with `q8_0` keys, a
/// head of some size and an odd `max_ctx` (so half the `q8_0` scenarios run with offsets,
/// half without, from the same corpus), pseudo-random means of magnitude up to 4 under
/// RoPE base 10 000; else none.
pub fn key_offsets_for(
    g: KvGeometry,
    types: (KvType, KvType),
    max_ctx: usize,
) -> Option<Arc<KeyOffsets>> {
    if types.0 != KvType::Q8_0 || g.head_dim == 0 || g.n_layers == 0 || max_ctx.is_multiple_of(2) {
        return None;
    }
    let means = (0..g.n_layers * g.kv_dim())
        .map(|i| ((i * 7919 + max_ctx) % 17) as f32 * 0.5 - 4.0)
        .collect();
    let rope = kvcore::backend::Rope {
        base: 10_000.0,
        style: kvcore::backend::RopeStyle::Halves,
    };
    let offsets = KeyOffsets::new(g, means, vec![rope; g.n_layers], max_ctx);
    Some(Arc::new(offsets.expect("offsets of a q8_0 geometry")))
}

impl Scenario {
    /// Decodes a scenario from raw bytes (the fuzz input and corpus file format). Every
    /// byte string decodes; short input reads as zeros.
    pub fn from_bytes(data: &[u8]) -> arbitrary::Result<Scenario> {
        Scenario::arbitrary_take_rest(Unstructured::new(data))
    }

    /// Decodes a scenario whose windows come first (the `kv_window` fuzz target's
    /// format): [`MAX_LAYERS`] window bytes (each as [`window_of`]), then the rest as
    /// [`from_bytes`](Scenario::from_bytes) with its windows replaced. Every byte string
    /// decodes.
    pub fn from_window_bytes(data: &[u8]) -> arbitrary::Result<Scenario> {
        let (head, rest) = data.split_at(data.len().min(MAX_LAYERS));
        let mut scenario = Scenario::from_bytes(rest)?;
        scenario.windows = (0..MAX_LAYERS)
            .map(|l| window_of(head.get(l).copied().unwrap_or(1)))
            .collect();
        Ok(scenario)
    }

    /// Exactly `n_layers` windows: [`windows`](Scenario::windows) padded with `None`.
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        (0..self.n_layers)
            .map(|l| self.windows.get(l).copied().flatten())
            .collect()
    }

    /// The stores' geometry. With a `q8_0` type a head is one block of 32 values (0
    /// stays 0): a head of [`MAX_HEAD_DIM`] would not hold a block.
    pub fn geometry(&self) -> KvGeometry {
        let q8 = [self.types.0, self.types.1].contains(&KvType::Q8_0);
        KvGeometry {
            n_layers: self.n_layers,
            n_kv_heads: self.n_kv_heads,
            head_dim: match self.head_dim {
                d if q8 && d > 0 => Q8_0_BLOCK,
                d => d,
            },
        }
    }

    /// The key offsets every store of the scenario keeps its keys less of
    /// ([`key_offsets_for`]).
    pub fn key_offsets(&self) -> Option<Arc<KeyOffsets>> {
        key_offsets_for(self.geometry(), self.types, self.max_ctx)
    }
}

/// A window from one byte: 0 is none (global), 1..=160 windows `1..=40` (the small
/// windows appends cross often), 161..=255 windows up to [`MAX_WINDOW`].
pub fn window_of(b: u8) -> Option<usize> {
    match b {
        0 => None,
        1..=160 => Some(usize::from(b - 1) % 40 + 1),
        _ => Some((usize::from(b - 160) * 3).min(MAX_WINDOW)),
    }
}

fn arb_windows(u: &mut Unstructured) -> arbitrary::Result<Vec<Option<usize>>> {
    (0..MAX_LAYERS)
        .map(|_| u8::arbitrary(u).map(window_of))
        .collect()
}

/// K and V types from one byte: mostly f32 for both (the reference), else any pair.
pub(crate) fn arb_types(u: &mut Unstructured) -> arbitrary::Result<(KvType, KvType)> {
    let b = u8::arbitrary(u)?;
    let all = KvType::ALL;
    Ok(if b < 64 {
        (KvType::F32, KvType::F32)
    } else {
        let b = usize::from(b - 64);
        (all[b % all.len()], all[b / all.len() % all.len()])
    })
}

fn arb_bits(u: &mut Unstructured) -> arbitrary::Result<Vec<u32>> {
    let n = u.int_in_range(0..=MAX_BITS)?;
    (0..n).map(|_| u32::arbitrary(u)).collect()
}

fn arb_pos(u: &mut Unstructured) -> arbitrary::Result<usize> {
    let v = u.int_in_range(0..=u16::MAX)?;
    Ok(if v >= 0xff00 {
        usize::MAX - usize::from(v & 0xff)
    } else {
        usize::from(v) % POS_RANGE
    })
}

/// Mostly a few positions (decode steps, short prompts), sometimes a long prefill,
/// rarely an absurd count.
fn arb_count(u: &mut Unstructured) -> arbitrary::Result<usize> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=11 => u.int_in_range(0..=8)?,
        12..=14 => u.int_in_range(0..=160)?,
        _ => arb_pos(u)?,
    })
}

fn arb_initial(u: &mut Unstructured) -> arbitrary::Result<Option<usize>> {
    Ok(if bool::arbitrary(u)? {
        Some(u.int_in_range(0..=MAX_INITIAL)?)
    } else {
        None
    })
}

fn arb_ops(u: &mut Unstructured) -> arbitrary::Result<Vec<KvOp>> {
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && bool::arbitrary(u)? {
        ops.push(KvOp::arbitrary(u)?);
    }
    Ok(ops)
}

// ---------------------------------------------------------------------------------------
// The specification store
// ---------------------------------------------------------------------------------------

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

/// Rows of one element type, each encoded on its own (`kv::encode_q8_0`, `half`'s conversions): `[rows][units per row]`.
#[derive(Debug, Clone)]
enum SpecRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
}

macro_rules! each_rows {
    ($rows:expr, $v:ident => $body:expr) => {
        match $rows {
            SpecRows::F32($v) => $body,
            SpecRows::F16($v) => $body,
            SpecRows::BF16($v) => $body,
            SpecRows::Q8_0($v) => $body,
        }
    };
}

impl SpecRows {
    fn new(ty: KvType) -> SpecRows {
        match ty {
            KvType::F16 => SpecRows::F16(Vec::new()),
            KvType::BF16 => SpecRows::BF16(Vec::new()),
            KvType::Q8_0 => SpecRows::Q8_0(Vec::new()),
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
            SpecRows::Q8_0(v) => {
                for (t, row) in rows.rows().into_iter().enumerate() {
                    let Some((offsets, layer, at)) = shift else {
                        v.extend(encode_q8_0(&row.to_vec(), head_dim));
                        continue;
                    };
                    for (h, head) in row.to_vec().chunks_exact(head_dim).enumerate() {
                        let mut y = head.to_vec();
                        hadamard(&mut y, rotation_len(head_dim));
                        let t_b = offsets.rotated(layer, at + t, h).expect("covered");
                        y.iter_mut().zip(t_b).for_each(|(y, &o)| *y -= o);
                        v.extend(y.chunks_exact(Q8_0_BLOCK).map(BlockQ8_0::encode));
                    }
                }
            }
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
        check_begin(self.pending.is_some(), self.len, self.max_ctx, at, n)?;
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
        check_rows(n, self.kv_dim, &k, &v)?;
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
    /// Not part of the differential runs (state files are tested end to end): the spec
    /// refuses it.
    fn write_stored(
        &mut self,
        _layer: usize,
        _k: KvRows<'_>,
        _v: KvRows<'_>,
    ) -> Result<(), KvError> {
        Err(KvError::NoAppend)
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
    fn key_offsets(&self) -> Option<&Arc<KeyOffsets>> {
        self.key_offsets.as_ref()
    }
}

// ---------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------

/// The first disagreement of a [`run`]: after which op (none: at construction), on
/// which sequence, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Index and value of the op, or `None` at construction.
    pub op: Option<(usize, KvOp)>,
    /// What differed.
    pub detail: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            None => write!(f, "at construction: {}", self.detail),
            Some((i, op)) => write!(f, "after op {i} ({op:?}): {}", self.detail),
        }
    }
}

impl std::error::Error for Divergence {}

/// A gate that refuses one allocation once armed.
#[derive(Debug, Default)]
pub(crate) struct RefuseNext(pub(crate) AtomicBool);

impl AllocGate for RefuseNext {
    fn admit(&self, _bytes: usize) -> bool {
        !self.0.swap(false, Ordering::Relaxed)
    }
}

/// One sequence on the four stores.
struct Seq<G> {
    spec: SpecKv,
    dense: DenseKv,
    grow: G,
    window: WindowKv,
}

/// What a store looks like from outside: per layer, positions and bits of K and V, and
/// its sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    len: usize,
    capacity: usize,
    bytes: usize,
    layers: Vec<LayerBits>,
}

/// Positions, then the stored bytes of K and of V in view order.
pub(crate) type LayerBits = (Vec<usize>, Vec<u8>, Vec<u8>);

/// The bytes of K and V rows for one position of `kv_dim` values.
fn position_bytes(kv_dim: usize, types: (KvType, KvType)) -> usize {
    let row = |t: KvType| t.row_bytes(kv_dim).expect("a geometry the stores accept");
    row(types.0) + row(types.1)
}

/// Every stored byte of `rows`, in logical order.
fn rows_bytes(rows: KvRows<'_>) -> Vec<u8> {
    fn of<T: bytemuck::Pod>(a: ArrayView3<'_, T>) -> Vec<u8> {
        if let Some(s) = a.to_slice() {
            return bytemuck::cast_slice(s).to_vec();
        }
        let mut out = Vec::with_capacity(a.len() * std::mem::size_of::<T>());
        a.iter()
            .for_each(|x| out.extend_from_slice(bytemuck::bytes_of(x)));
        out
    }
    match rows {
        KvRows::F32(a) => of(a),
        KvRows::F16(a) => of(a),
        KvRows::BF16(a) => of(a),
        KvRows::Q8_0(a) => of(a),
        other => panic!("no byte view of {} rows", other.kv_type()),
    }
}

pub(crate) fn layer_bits(kv: &dyn KvStore, layer: usize) -> Result<LayerBits, String> {
    let view = kv
        .view(layer)
        .map_err(|e| format!("view({layer}) failed: {e}"))?;
    let positions: Vec<usize> = view.positions().collect();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for s in view.segments() {
        k.extend(rows_bytes(s.keys()));
        v.extend(rows_bytes(s.values()));
    }
    Ok((positions, k, v))
}

/// The stored bytes of a view's keys (or values), in view order.
fn view_bytes(view: &KvView<'_>, keys: bool) -> Vec<u8> {
    view.segments()
        .iter()
        .flat_map(|s| rows_bytes(if keys { s.keys() } else { s.values() }))
        .collect()
}

/// A one-segment view's keys (or values) as one contiguous run of bytes, if it is one.
fn contiguous_bytes<'v>(view: &KvView<'v>, keys: bool) -> Option<&'v [u8]> {
    fn of<'v, T: bytemuck::Pod>(a: ArrayView3<'v, T>) -> Option<&'v [u8]> {
        a.to_slice().map(bytemuck::cast_slice)
    }
    match view.segments() {
        [s] => match if keys { s.keys() } else { s.values() } {
            KvRows::F32(a) => of(a),
            KvRows::F16(a) => of(a),
            KvRows::BF16(a) => of(a),
            KvRows::Q8_0(a) => of(a),
            _ => None,
        },
        _ => None,
    }
}

/// Whether the keys (or values) of two views hold the same bytes.
fn same_bits(a: &KvView<'_>, b: &KvView<'_>, keys: bool) -> bool {
    match (contiguous_bytes(a, keys), contiguous_bytes(b, keys)) {
        (Some(x), Some(y)) => x == y,
        _ => view_bytes(a, keys) == view_bytes(b, keys),
    }
}

/// Layer `layer` of `kv` at positions `from ..` only.
fn layer_bits_from(kv: &dyn KvStore, layer: usize, from: usize) -> Result<LayerBits, String> {
    let (positions, k, v) = layer_bits(kv, layer)?;
    let skip = positions.iter().take_while(|&&p| p < from).count();
    let d = kv.geometry().kv_dim();
    let (kt, vt) = kv.kv_types();
    let row = |t: KvType| t.row_bytes(d).expect("a geometry the stores accept");
    Ok((
        positions[skip..].to_vec(),
        k[skip * row(kt)..].to_vec(),
        v[skip * row(vt)..].to_vec(),
    ))
}

/// The divergence message of a layer that differs from the spec's.
fn differs(layer: usize, name: &str, got: &LayerBits, want: &LayerBits) -> String {
    format!(
        "layer {layer}: {name} holds positions {:?} with K {:02x?} V {:02x?}, the spec {:?} with K {:02x?} V {:02x?}",
        got.0, got.1, got.2, want.0, want.1, want.2
    )
}

/// Whether layer `layer` of `a` and `b` holds the same positions and bits (compared
/// without copying).
pub(crate) fn same_layer(a: &dyn KvStore, b: &dyn KvStore, layer: usize) -> Result<bool, String> {
    let failed = |e: KvError| format!("view({layer}) failed: {e}");
    let (va, vb) = (
        a.view(layer).map_err(failed)?,
        b.view(layer).map_err(failed)?,
    );
    Ok(
        va.positions().eq(vb.positions())
            && same_bits(&va, &vb, true)
            && same_bits(&va, &vb, false),
    )
}

fn snapshot(kv: &dyn KvStore) -> Result<Snapshot, String> {
    Ok(Snapshot {
        len: kv.len(),
        capacity: kv.capacity(),
        bytes: kv.bytes(),
        layers: (0..kv.geometry().n_layers)
            .map(|l| layer_bits(kv, l))
            .collect::<Result<_, _>>()?,
    })
}

impl<G: KvStore> Seq<G> {
    fn stores(&mut self) -> [&mut dyn KvStore; 4] {
        [
            &mut self.spec,
            &mut self.dense,
            &mut self.grow,
            &mut self.window,
        ]
    }

    fn snapshots(&self) -> Result<[Snapshot; 4], String> {
        Ok([
            snapshot(&self.spec)?,
            snapshot(&self.dense)?,
            snapshot(&self.grow)?,
            snapshot(&self.window)?,
        ])
    }

    /// Every layer's positions and bits agree across the stores: exactly for a global
    /// layer and for the window store; at the positions the spec shows for a window
    /// layer of the dense and growing stores, after checking that the spec shows every
    /// position a query can see.
    fn same_views(&self) -> Result<(), String> {
        let spec = &self.spec;
        for layer in 0..spec.geometry().n_layers {
            let windowed = spec.window(layer).is_some();
            let mut exact: Vec<(&str, &dyn KvStore)> = vec![("WindowKv", &self.window)];
            if !windowed {
                exact.extend([
                    ("DenseKv", &self.dense as &dyn KvStore),
                    ("GrowKv", &self.grow),
                ]);
            }
            for (name, kv) in exact {
                if !same_layer(spec, kv, layer)? {
                    let (want, got) = (layer_bits(spec, layer)?, layer_bits(kv, layer)?);
                    return Err(differs(layer, name, &got, &want));
                }
            }
            if windowed {
                let want = layer_bits(spec, layer)?;
                let from = spec.shown_from(layer);
                if from > spec.needed_from(layer) {
                    return Err(format!(
                        "layer {layer}: the spec shows positions from {from}, a query sees from {}",
                        spec.needed_from(layer)
                    ));
                }
                for (name, kv) in [
                    ("DenseKv", &self.dense as &dyn KvStore),
                    ("GrowKv", &self.grow),
                ] {
                    let got = layer_bits_from(kv, layer, from)?;
                    if got != want {
                        return Err(differs(layer, name, &got, &want));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The results (spec, dense, growing, window) must agree: `Ok(false)`. `Ok(true)` when
/// the op is to be abandoned: an `AllocFailed` of a real store where the spec succeeded,
/// or the spec's [`KvError::BehindWindow`], which the window store must return too while
/// the stores without windows succeed (or fail to allocate).
fn agree(what: &str, results: &[Result<(), KvError>; 4]) -> Result<bool, String> {
    let alloc = |r: &Result<(), KvError>| matches!(r, Err(KvError::AllocFailed { .. }));
    let [spec, dense, grow, window] = results;
    if let Err(e @ KvError::BehindWindow { .. }) = spec {
        return if window.as_ref().err() == Some(e)
            && [dense, grow].iter().all(|r| r.is_ok() || alloc(r))
        {
            Ok(true)
        } else {
            Err(format!(
                "{what}: results {results:?} (the spec refused a rewind)"
            ))
        };
    }
    if results[1..].iter().any(alloc) {
        return match spec {
            Ok(()) if results[1..].iter().all(|r| r.is_ok() || alloc(r)) => Ok(true),
            _ => Err(format!(
                "{what}: results {results:?} (an allocation failed)"
            )),
        };
    }
    if results[1..].iter().any(|r| r != spec) {
        return Err(format!(
            "{what}: spec {spec:?}, DenseKv {dense:?}, GrowKv {grow:?}, WindowKv {window:?}"
        ));
    }
    Ok(false)
}

/// The rows an append writes on `layer`: `[n, kv_dim + extra]`.
fn rows(n: usize, kv_dim: usize, extra: usize, layer: usize, bits: &[u32], v: bool) -> Array2<f32> {
    let width = kv_dim + extra;
    Array2::from_shape_fn((n, width), |(t, i)| match bits.len() {
        0 => 0.0,
        len => f32::from_bits(bits[(t * width + i + 3 * layer + usize::from(v)) % len]),
    })
}

/// Replays `scenario` and checks the stores after construction and after every step
/// (see the [module docs](self)).
///
/// A geometry that no real store can be built for (the same error from every
/// constructor) passes trivially; any other constructor disagreement is a divergence.
///
/// # Errors
/// The first [`Divergence`].
pub fn run(scenario: &Scenario) -> Result<(), Divergence> {
    let types = scenario.types;
    let offsets = scenario.key_offsets();
    run_against(scenario, |g, max_ctx, initial, gate| {
        let mut kv = match initial {
            None => GrowKv::with_types(g, max_ctx, types),
            Some(initial) => GrowKv::with_capacity_and_types(g, max_ctx, initial, types),
        }?;
        if let Some(o) = offsets {
            kv = kv.with_key_offsets(o)?;
        }
        kv.set_alloc_gate(Some(gate));
        Ok(kv)
    })
}

/// [`run`] with the store under test built by `build(geometry, max_ctx, initial, gate)`
/// in the growing store's place (`gate` is the one [`KvOp::RefuseNextAlloc`] arms), so
/// the checker itself can be tested on faulty stores.
fn run_against<G: KvStore>(
    scenario: &Scenario,
    build: impl FnOnce(KvGeometry, usize, Option<usize>, Arc<dyn AllocGate>) -> Result<G, KvError>,
) -> Result<(), Divergence> {
    let g = scenario.geometry();
    let max_ctx = scenario.max_ctx;
    let at_start = |detail: String| Divergence { op: None, detail };
    let windows = scenario.layer_windows();
    let dense_gate = Arc::new(RefuseNext::default());
    let grow_gate = Arc::new(RefuseNext::default());
    let window_gate = Arc::new(RefuseNext::default());
    let built = build(g, max_ctx, scenario.initial, grow_gate.clone());
    let types = scenario.types;
    let offsets = scenario.key_offsets();
    let window = WindowKv::with_types(g, max_ctx, &windows, types).and_then(|w| match &offsets {
        Some(o) => w.with_key_offsets(o.clone()),
        None => Ok(w),
    });
    let dense = DenseKv::with_types(g, max_ctx, types).and_then(|d| match &offsets {
        Some(o) => d.with_key_offsets(o.clone()),
        None => Ok(d),
    });
    let (mut dense, grow, mut window) = match (dense, built, window) {
        (Ok(d), Ok(gr), Ok(w)) => (d, gr, w),
        (Err(a), Err(b), Err(c)) if a == b && b == c => return Ok(()),
        (a, b, c) => {
            return Err(at_start(format!(
                "constructors disagree: DenseKv {:?}, store {:?}, WindowKv {:?}",
                a.map(drop),
                b.map(drop),
                c.map(drop)
            )));
        }
    };
    dense.set_alloc_gate(Some(dense_gate.clone()));
    window.set_alloc_gate(Some(window_gate.clone()));
    let mut seqs = vec![Seq {
        spec: SpecKv::with_types(g, max_ctx, &windows, types).with_key_offsets(offsets),
        dense,
        grow,
        window,
    }];
    let mut grow_caps = vec![seqs[0].grow.capacity()];
    check(&seqs[0], grow_caps[0]).map_err(at_start)?;
    for (index, op) in scenario.ops.iter().enumerate() {
        let diverged = |detail: String| Divergence {
            op: Some((index, op.clone())),
            detail,
        };
        let gates = [&*dense_gate, &*grow_gate, &*window_gate];
        step(&mut seqs, &mut grow_caps, op, gates).map_err(diverged)?;
        // A refusal armed for this op that it did not use expires with it.
        if !matches!(op, KvOp::RefuseNextAlloc) {
            gates
                .iter()
                .for_each(|g| g.0.store(false, Ordering::Relaxed));
        }
        for (seq, &cap) in seqs.iter().zip(&grow_caps) {
            check(seq, cap).map_err(diverged)?;
        }
    }
    Ok(())
}

/// Applies one op; updates each sequence's last GrowKv capacity.
fn step<G: KvStore>(
    seqs: &mut Vec<Seq<G>>,
    grow_caps: &mut Vec<usize>,
    op: &KvOp,
    gates: [&RefuseNext; 3],
) -> Result<(), String> {
    let pick = |seq: u8, n: usize| usize::from(seq) % n;
    match op {
        KvOp::RefuseNextAlloc => {
            for g in gates {
                g.0.store(true, Ordering::Relaxed);
            }
        }
        KvOp::Append {
            seq,
            start,
            n,
            bits,
            end,
        } => {
            let i = pick(*seq, seqs.len());
            append(&mut seqs[i], *start, *n, bits, *end)?;
        }
        KvOp::Truncate { seq, .. } | KvOp::TruncateBack { seq, .. } => {
            let i = pick(*seq, seqs.len());
            let s = &mut seqs[i];
            let n = &match op {
                KvOp::TruncateBack { back, .. } => s.spec.len().saturating_sub(usize::from(*back)),
                KvOp::Truncate { n, .. } => *n,
                _ => unreachable!("matched above"),
            };
            let before = s.snapshots()?;
            let (spec, window) = (s.spec.truncate(*n), s.window.truncate(*n));
            if spec != window {
                return Err(format!("truncate: spec {spec:?}, WindowKv {window:?}"));
            }
            if spec.is_ok() {
                for kv in [&mut s.dense as &mut dyn KvStore, &mut s.grow] {
                    kv.truncate(*n)
                        .map_err(|e| format!("truncate failed on a store without windows: {e}"))?;
                }
            } else if s.snapshots()? != before {
                return Err("a refused truncate changed a store".into());
            }
        }
        KvOp::Clear { seq } => {
            let i = pick(*seq, seqs.len());
            seqs[i].stores().into_iter().for_each(|kv| kv.clear());
        }
        KvOp::Fork { seq } => {
            let i = pick(*seq, seqs.len());
            if seqs.len() < MAX_SEQS {
                let s = &seqs[i];
                let (spec, dense, grow, window) = (
                    s.spec.fork(),
                    s.dense.fork(),
                    s.grow.fork(),
                    s.window.fork(),
                );
                let outcome = |r: Result<(), &KvError>| r.map_err(Clone::clone);
                let results = [
                    outcome(spec.as_ref().map(drop)),
                    outcome(dense.as_ref().map(drop)),
                    outcome(grow.as_ref().map(drop)),
                    outcome(window.as_ref().map(drop)),
                ];
                if !agree("fork", &results)?
                    && let (Ok(spec), Ok(dense), Ok(grow), Ok(window)) = (spec, dense, grow, window)
                {
                    let fork = Seq {
                        spec,
                        dense,
                        grow,
                        window,
                    };
                    if fork.snapshots()? != seqs[i].snapshots()? {
                        return Err("a fork differs from its parent".into());
                    }
                    grow_caps.push(fork.grow.capacity());
                    seqs.push(fork);
                }
            }
        }
        KvOp::Free { seq } => {
            if seqs.len() > 1 {
                let i = pick(*seq, seqs.len());
                seqs.remove(i);
                grow_caps.remove(i);
            }
        }
    }
    for (seq, cap) in seqs.iter().zip(grow_caps.iter_mut()) {
        let now = seq.grow.capacity();
        if now < *cap {
            return Err(format!("GrowKv capacity shrank from {cap} to {now}"));
        }
        *cap = now;
    }
    Ok(())
}

/// One append driven step by step on the three stores of `seq`.
fn append<G: KvStore>(
    seq: &mut Seq<G>,
    start: Start,
    n: usize,
    bits: &[u32],
    end: End,
) -> Result<(), String> {
    let before = seq.snapshots()?;
    let len = seq.spec.len();
    let at = match start {
        Start::End => len,
        Start::Back(back) => len.saturating_sub(usize::from(back)),
        Start::At(at) => at,
    };
    let g = seq.spec.geometry();
    let kv_dim = g.kv_dim();
    let unchanged = |seq: &Seq<G>, what: &str| -> Result<(), String> {
        if seq.snapshots()? == before {
            Ok(())
        } else {
            Err(format!("{what} changed a store"))
        }
    };
    let results = seq.stores().map(|kv| kv.begin(at, n));
    if agree("begin", &results)? || results[0].is_err() {
        for (kv, r) in seq.stores().into_iter().zip(&results) {
            if r.is_ok() {
                kv.rollback();
            }
        }
        return unchanged(seq, "a failed begin");
    }
    // `n` fits in max_ctx ≤ MAX_CTX here, so the rows are small.
    let layers = g.n_layers;
    let (write_to, skip, bad) = match end {
        End::FailAfter(k) => (usize::from(k) % (layers + 1), None, None),
        End::SkipLayer(k) => (layers, Some(usize::from(k) % layers), None),
        End::BadRow(k) => (layers, None, Some(usize::from(k) % layers)),
        End::Commit | End::Rollback => (layers, None, None),
    };
    for layer in 0..write_to {
        if skip == Some(layer) {
            continue;
        }
        let (k, v) = (
            rows(n, kv_dim, 0, layer, bits, false),
            rows(n, kv_dim, 0, layer, bits, true),
        );
        if bad == Some(layer) {
            let wide = rows(n, kv_dim, 1, layer, bits, true);
            let results = seq
                .stores()
                .map(|kv| kv.write(layer, k.view(), wide.view()));
            agree("a write of rows too wide", &results)?;
            if results[0].is_ok() {
                return Err("rows one element too wide were accepted".into());
            }
            seq.same_views()?;
        }
        let results = seq.stores().map(|kv| kv.write(layer, k.view(), v.view()));
        agree(&format!("write({layer})"), &results)?;
        seq.same_views()?;
    }
    let commit = matches!(end, End::Commit | End::BadRow(_) | End::SkipLayer(_));
    if commit {
        let results = seq.stores().map(|kv| kv.commit());
        agree("commit", &results)?;
        if matches!(end, End::SkipLayer(_)) && n > 0 && results[0].is_ok() {
            return Err("a commit with a layer unwritten succeeded".into());
        }
        if results[0].is_ok() {
            seq.same_views()?;
            return Ok(());
        }
    }
    seq.stores().into_iter().for_each(|kv| kv.rollback());
    unchanged(seq, "a rolled-back append")
}

/// The invariants of one sequence outside an append: equal lengths and views, and each
/// store's capacity and footprint rules.
fn check<G: KvStore>(seq: &Seq<G>, grow_cap_before: usize) -> Result<(), String> {
    let (spec, dense, grow, window) = (&seq.spec, &seq.dense, &seq.grow, &seq.window);
    if dense.len() != spec.len() || grow.len() != spec.len() || window.len() != spec.len() {
        return Err(format!(
            "len differs: spec {}, DenseKv {}, GrowKv {}, WindowKv {}",
            spec.len(),
            dense.len(),
            grow.len(),
            window.len()
        ));
    }
    let g = spec.geometry();
    let means = |kv: &dyn KvStore| kv.key_offsets().map(|o| o.means().to_vec());
    let want = means(spec);
    for (name, kv) in [
        ("DenseKv", dense as &dyn KvStore),
        ("store", grow),
        ("WindowKv", window),
    ] {
        if means(kv) != want {
            return Err(format!("{name} has other key offsets than the spec"));
        }
        for layer in 0..g.n_layers {
            let view = kv.view(layer).map_err(|e| format!("{name} view: {e}"))?;
            let (has, end) = (view.has_key_offsets(), view.span().end.max(1));
            let same = (0..g.n_kv_heads).all(|h| {
                view.key_offset(end - 1, h)
                    == spec
                        .key_offsets
                        .as_ref()
                        .and_then(|o| o.rotated(layer, end - 1, h))
            });
            if has != want.is_some() || !same {
                return Err(format!(
                    "{name} layer {layer}: its view's key offsets are not the spec's"
                ));
            }
        }
    }
    let per_position = position_bytes(g.kv_dim(), spec.kv_types());
    let footprint = |cap: usize| g.n_layers * cap * per_position;
    if dense.capacity() != dense.max_ctx() || dense.bytes() != footprint(dense.max_ctx()) {
        return Err(format!(
            "DenseKv capacity {} bytes {}, expected {} and {}",
            dense.capacity(),
            dense.bytes(),
            dense.max_ctx(),
            footprint(dense.max_ctx())
        ));
    }
    let cap = grow.capacity();
    if !(grow.len()..=grow.max_ctx()).contains(&cap) || cap < grow_cap_before {
        return Err(format!(
            "GrowKv capacity {cap} invalid (len {}, max_ctx {}, before {grow_cap_before})",
            grow.len(),
            grow.max_ctx()
        ));
    }
    if grow.bytes() != footprint(cap) || grow.bytes() > dense.bytes() {
        return Err(format!(
            "GrowKv bytes {} for capacity {cap}: expected {}, at most DenseKv's {}",
            grow.bytes(),
            footprint(cap),
            dense.bytes()
        ));
    }
    let mut slots = 0;
    for layer in 0..g.n_layers {
        let (positions, _, _) = layer_bits(spec, layer)?;
        if positions != (spec.shown_from(layer)..spec.len()).collect::<Vec<_>>() {
            return Err(format!("layer {layer} holds positions {positions:?}"));
        }
        let cap = window
            .layer_capacity(layer)
            .ok_or(format!("WindowKv has no layer {layer}"))?;
        let fits = match spec.window(layer) {
            None => (window.len()..=window.max_ctx()).contains(&cap),
            Some(w) => (positions.len()..=w.min(window.max_ctx())).contains(&cap),
        };
        if !fits {
            return Err(format!(
                "WindowKv layer {layer} (window {:?}) has {cap} slots for {} positions",
                spec.window(layer),
                positions.len()
            ));
        }
        slots += cap;
    }
    if window.bytes() != slots * per_position || window.bytes() > dense.bytes() {
        return Err(format!(
            "WindowKv bytes {} for {slots} slots: expected {}, at most DenseKv's {}",
            window.bytes(),
            slots * per_position,
            dense.bytes()
        ));
    }
    seq.same_views()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `GrowKv` whose writes canonicalise one bit pattern (a lossy copy), or whose
    /// rollback forgets to undo a replaced tail.
    struct Faulty {
        inner: GrowKv,
        canonicalise: Option<u32>,
        lazy_rollback: bool,
    }

    impl KvStore for Faulty {
        fn geometry(&self) -> KvGeometry {
            self.inner.geometry()
        }
        fn kv_types(&self) -> (KvType, KvType) {
            self.inner.kv_types()
        }
        fn max_ctx(&self) -> usize {
            self.inner.max_ctx()
        }
        fn len(&self) -> usize {
            self.inner.len()
        }
        fn capacity(&self) -> usize {
            self.inner.capacity()
        }
        fn bytes(&self) -> usize {
            self.inner.bytes()
        }
        fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
            self.inner.view(layer)
        }
        fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
            self.inner.begin(at, n)
        }
        fn write(
            &mut self,
            layer: usize,
            k: ArrayView2<'_, f32>,
            v: ArrayView2<'_, f32>,
        ) -> Result<(), KvError> {
            let canonicalise = self.canonicalise;
            let fix = |a: ArrayView2<'_, f32>| {
                a.mapv(|x| match canonicalise {
                    Some(bits) if x.to_bits() == bits => f32::NAN,
                    _ => x,
                })
            };
            self.inner.write(layer, fix(k).view(), fix(v).view())
        }
        fn write_stored(
            &mut self,
            layer: usize,
            k: KvRows<'_>,
            v: KvRows<'_>,
        ) -> Result<(), KvError> {
            self.inner.write_stored(layer, k, v)
        }
        fn commit(&mut self) -> Result<(), KvError> {
            self.inner.commit()
        }
        fn rollback(&mut self) {
            if self.lazy_rollback {
                // Commits whatever was written: a rollback that forgets its undo.
                if self.inner.commit().is_err() {
                    self.inner.rollback();
                }
            } else {
                self.inner.rollback();
            }
        }
        fn truncate(&mut self, n: usize) -> Result<(), KvError> {
            self.inner.truncate(n)
        }
        fn fork(&self) -> Result<Self, KvError> {
            Ok(Faulty {
                inner: self.inner.fork()?,
                ..*self
            })
        }
        fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
            Ok(Box::new(self.fork()?))
        }
    }

    fn scenario(ops: Vec<KvOp>) -> Scenario {
        Scenario {
            n_layers: 2,
            n_kv_heads: 1,
            head_dim: 3,
            max_ctx: 100,
            initial: None,
            ops,
            windows: Vec::new(),
            types: (KvType::F32, KvType::F32),
        }
    }

    fn against(
        s: &Scenario,
        canonicalise: Option<u32>,
        lazy_rollback: bool,
    ) -> Result<(), Divergence> {
        run_against(s, |g, max_ctx, _, _| {
            Ok(Faulty {
                inner: GrowKv::new(g, max_ctx)?,
                canonicalise,
                lazy_rollback,
            })
        })
    }

    fn append(bits: Vec<u32>, start: Start, n: usize, end: End) -> KvOp {
        KvOp::Append {
            seq: 0,
            start,
            n,
            bits,
            end,
        }
    }

    #[test]
    fn a_nan_payload_change_is_a_divergence() {
        let payload = 0x7fc0_1234;
        let s = scenario(vec![append(vec![payload, 1], Start::End, 3, End::Commit)]);
        assert!(run(&s).is_ok());
        let d = against(&s, Some(payload), false).unwrap_err();
        assert!(d.detail.contains("GrowKv"), "{d}");
    }

    #[test]
    fn a_sign_of_zero_change_is_a_divergence() {
        let s = scenario(vec![append(
            vec![(-0.0f32).to_bits()],
            Start::End,
            1,
            End::Commit,
        )]);
        assert!(against(&s, Some((-0.0f32).to_bits()), false).is_err());
    }

    #[test]
    fn a_rollback_that_keeps_its_writes_is_a_divergence() {
        let s = scenario(vec![
            append(vec![1, 2, 3], Start::End, 5, End::Commit),
            append(vec![9], Start::Back(2), 4, End::Rollback),
        ]);
        assert!(run(&s).is_ok());
        assert!(against(&s, None, true).is_err());
    }

    #[test]
    fn every_end_of_an_append_passes_on_the_real_stores() {
        let mut ops = vec![KvOp::RefuseNextAlloc];
        for (i, end) in [
            End::Commit,
            End::Rollback,
            End::FailAfter(1),
            End::SkipLayer(1),
            End::BadRow(0),
        ]
        .into_iter()
        .enumerate()
        {
            ops.push(append(
                vec![i as u32 + 7, 0x7f80_0001],
                Start::Back(1),
                70,
                end,
            ));
            ops.push(KvOp::Fork { seq: 0 });
            ops.push(KvOp::RefuseNextAlloc);
        }
        ops.push(KvOp::Truncate { seq: 1, n: 3 });
        ops.push(append(vec![], Start::At(9), 1, End::Commit));
        ops.push(KvOp::Free { seq: 0 });
        ops.push(KvOp::Clear { seq: 0 });
        assert_eq!(run(&scenario(ops)), Ok(()));
    }

    #[test]
    fn empty_input_decodes_to_the_smallest_scenario() {
        let s = Scenario::from_bytes(&[]).unwrap();
        assert_eq!(
            (s.n_layers, s.n_kv_heads, s.max_ctx, s.ops.len()),
            (1, 1, 0, 0)
        );
        assert_eq!(run(&s), Ok(()));
    }
}
