//! Differential testing of the KV stores: one op sequence applied to a [`SpecKv`] (the
//! specification: plain vectors, obviously right, sharing no code with the stores;
//! `spec.rs`), a [`DenseKv`] (the reference), a [`WindowKv`] and a store under test —
//! kvcore's [`GrowKv`] ([`run`]) or any [`KvStore`] a constructor builds ([`run_store`];
//! [`suite`] runs it over the property-test scenarios) — which must agree bit for bit
//! after every step.
//!
//! A scenario may give layers sliding windows ([`Scenario::windows`]). The spec and the
//! `WindowKv` then apply the window rule (a window layer of `w` retains its last `w`
//! committed positions; a rewind to `0 < n < len` that would need an evicted position is
//! [`KvError::BehindWindow`]), while the dense store keeps every position, as a dense
//! store with the window applied as a mask does; the store under test does either (its
//! [`KvStore::window`] says which). For a window layer a store that applies the window
//! must show exactly the spec's view (the retained positions, ascending), the spec must
//! retain every position a future query can see (from `len + 1 − w`, or during an open
//! append from `at + 1 − w`, what the pass's own queries see), and the stores that keep
//! every position must hold the same bits at those positions. When the spec refuses a
//! rewind behind a window, the stores that apply windows must refuse it with the same
//! error and the others are not asked (an append's `begin` on them is rolled back).
//!
//! A [`Scenario`] is a geometry plus a list of [`KvOp`]s over up to [`MAX_SEQS`]
//! sequences (forks add sequences). [`run`] replays it and returns the first
//! [`Divergence`]. An append is driven step by step on all four stores — `begin`, each
//! layer's `write`, then `commit` or `rollback` as its [`End`] says — and after the
//! begin and after every write it checks:
//! - the stores returned the same `Result` (same [`KvError`]), except that a store may
//!   fail with [`KvError::AllocFailed`] where the others succeed (each allocates at its
//!   own moments, and [`KvOp::RefuseNextAlloc`] makes the next allocation of the dense
//!   and window stores fail, and of the store under test if it takes the gate): then
//!   the others' append is rolled back;
//! - every layer's view holds the same positions (`0 .. len`, or `0 .. at + n` for a
//!   layer written by the open append) and the same stored bytes in all four (f32 rows
//!   by `f32::to_bits`, NaN payloads and `-0.0` included; f16, bf16 and q8_0 rows, as the
//!   scenario's K and V types choose, by their encoded units);
//! - a failed or rolled-back op left each store exactly as it was (positions, bits,
//!   capacity, bytes);
//! - `len` is equal; with `P` a position's K and V row bytes in the scenario's types
//!   (`2 · kv_dim · 4` in f32), `DenseKv`'s capacity is `max_ctx` and its bytes
//!   `n_layers · max_ctx · P`; `WindowKv`'s per-layer capacity is in `len..=max_ctx` for
//!   a global layer and in `retained..=min(w, max_ctx)` for a window layer, and its bytes
//!   are exactly `P · Σ layer capacity` outside an append (so a window layer costs at
//!   most `w` positions); under [`run`], `GrowKv`'s capacity stays in `len..=max_ctx` and
//!   never shrinks, its bytes are exactly `n_layers · capacity · P` outside an append and
//!   at most the dense store's.
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
use kvcore::kv::{
    AllocGate, DenseKv, GrowKv, KeyOffsets, KvCodec, KvError, KvGeometry, KvRows, KvStore, KvType,
    KvView, Q8_0_BLOCK, WindowKv,
};
use kvcore::ndarray::{Array2, ArrayView3};

pub mod sink;
mod spec;
pub mod suite;

pub use spec::SpecKv;

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
    if !KvCodec::calibrates(types.0)
        || g.head_dim == 0
        || g.n_layers == 0
        || max_ctx.is_multiple_of(2)
    {
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
        let q8 = self.types.0.block() > 1 || self.types.1.block() > 1;
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

/// The first disagreement of a [`run`] (or of another differential runner over ops of
/// type `Op`, such as `pool_diff`'s): after which op (none: at construction), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence<Op = KvOp> {
    /// Index and value of the op, or `None` at construction.
    pub op: Option<(usize, Op)>,
    /// What differed.
    pub detail: String,
}

impl<Op: fmt::Debug> fmt::Display for Divergence<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            None => write!(f, "at construction: {}", self.detail),
            Some((i, op)) => write!(f, "after op {i} ({op:?}): {}", self.detail),
        }
    }
}

impl<Op: fmt::Debug> std::error::Error for Divergence<Op> {}

/// A gate that refuses one allocation once armed.
#[derive(Debug, Default)]
pub(crate) struct RefuseNext(pub(crate) AtomicBool);

impl AllocGate for RefuseNext {
    fn admit(&self, _bytes: usize) -> bool {
        !self.0.swap(false, Ordering::Relaxed)
    }
}

/// One sequence on the four stores: the spec, the dense store, the store under test
/// and the window store.
struct Seq<S> {
    spec: SpecKv,
    dense: DenseKv,
    store: S,
    window: WindowKv,
    /// Whether the store under test applies the scenario's windows (as `WindowKv`) or
    /// keeps every position (as `DenseKv`).
    windowed: bool,
}

/// A store and its name in divergence messages.
type Named<'a> = (&'a str, &'a dyn KvStore);

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
        KvRows::Q4_0(a) => of(a),
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
            KvRows::Q4_0(a) => of(a),
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

impl<S: KvStore> Seq<S> {
    fn stores(&mut self) -> [&mut dyn KvStore; 4] {
        [
            &mut self.spec,
            &mut self.dense,
            &mut self.store,
            &mut self.window,
        ]
    }

    fn snapshots(&self) -> Result<[Snapshot; 4], String> {
        Ok([
            snapshot(&self.spec)?,
            snapshot(&self.dense)?,
            snapshot(&self.store)?,
            snapshot(&self.window)?,
        ])
    }

    /// The stores that apply the windows, and those that keep every position.
    fn by_role(&self) -> (Vec<Named<'_>>, Vec<Named<'_>>) {
        let mut windowed: Vec<Named<'_>> = vec![("WindowKv", &self.window)];
        let mut keep_all: Vec<Named<'_>> = vec![("DenseKv", &self.dense)];
        if self.windowed {
            windowed.push(("the store", &self.store));
        } else {
            keep_all.push(("the store", &self.store));
        }
        (windowed, keep_all)
    }

    /// Every layer's positions and bits agree across the stores: exactly for a global
    /// layer and for the window store; at the positions the spec shows for a window
    /// layer of the dense and growing stores, after checking that the spec shows every
    /// position a query can see.
    fn same_views(&self) -> Result<(), String> {
        let spec = &self.spec;
        let (windowed_stores, keep_all) = self.by_role();
        for layer in 0..spec.geometry().n_layers {
            let windowed = spec.window(layer).is_some();
            let mut exact = windowed_stores.clone();
            if !windowed {
                exact.extend(keep_all.iter().copied());
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
                for &(name, kv) in &keep_all {
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

/// The results (spec, dense, the store under test, window) must agree: `Ok(false)`.
/// `Ok(true)` when the op is to be abandoned: an `AllocFailed` of a real store where the
/// spec succeeded, or the spec's [`KvError::BehindWindow`], which the stores that apply
/// windows must return too while those that keep every position succeed (or fail to
/// allocate). `windowed`: whether the store under test applies windows.
fn agree(what: &str, results: &[Result<(), KvError>; 4], windowed: bool) -> Result<bool, String> {
    let alloc = |r: &Result<(), KvError>| matches!(r, Err(KvError::AllocFailed { .. }));
    let [spec, dense, store, window] = results;
    if let Err(e @ KvError::BehindWindow { .. }) = spec {
        let (refusing, keep_all) = if windowed {
            (vec![window, store], vec![dense])
        } else {
            (vec![window], vec![dense, store])
        };
        return if refusing.iter().all(|r| r.as_ref().err() == Some(e))
            && keep_all.iter().all(|r| r.is_ok() || alloc(r))
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
            "{what}: spec {spec:?}, DenseKv {dense:?}, the store {store:?}, WindowKv {window:?}"
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

/// What a store under test is built for: one scenario's store (see [`run_store`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreParams {
    /// Layers, KV heads and head size.
    pub geometry: KvGeometry,
    /// The ceiling on positions.
    pub max_ctx: usize,
    /// The element types of K and V.
    pub types: (KvType, KvType),
    /// Each layer's sliding window (`None`: global). A store may apply them (its
    /// [`KvStore::window`] then answers them, and it is held to the window rule) or keep
    /// every position (it then answers `None` for every layer).
    pub windows: Vec<Option<usize>>,
    /// The key offsets `q8_0` keys are kept less of (the scenario's
    /// [`key_offsets`](Scenario::key_offsets)), which the store must use.
    pub key_offsets: Option<Arc<KeyOffsets>>,
    /// An initial capacity, for a store that takes one.
    pub initial: Option<usize>,
    /// The gate [`KvOp::RefuseNextAlloc`] arms, for a store that takes an [`AllocGate`].
    pub gate: Arc<dyn AllocGate>,
}

/// Replays `scenario` with kvcore's `GrowKv` as the store under test ([`run_store`]),
/// also holding it to its growth rules: capacity in `len ..= max_ctx`, never shrinking,
/// and bytes exactly `n_layers · capacity` positions outside an append.
///
/// # Errors
/// The first [`Divergence`].
pub fn run(scenario: &Scenario) -> Result<(), Divergence> {
    run_with(scenario, true, |p| {
        let mut kv = match p.initial {
            None => GrowKv::with_types(p.geometry, p.max_ctx, p.types),
            Some(initial) => {
                GrowKv::with_capacity_and_types(p.geometry, p.max_ctx, initial, p.types)
            }
        }?;
        if let Some(o) = &p.key_offsets {
            kv = kv.with_key_offsets(o.clone())?;
        }
        kv.set_alloc_gate(Some(p.gate.clone()));
        Ok(kv)
    })
}

/// Replays `scenario` on the specification store, a `DenseKv`, a `WindowKv` and the
/// store `build` makes for the scenario's [`StoreParams`], and checks them after
/// construction and after every step (see the [module docs](self)): the store under
/// test must return the spec's results and hold the spec's positions and bytes, and a
/// failed or rolled-back op must leave it exactly as it was (its `len`, `capacity` and
/// `bytes` included). [`suite`] runs it over kvcore's property-test scenarios.
///
/// A geometry that no real store can be built for (the same error from every
/// constructor) passes trivially; any other constructor disagreement is a divergence.
///
/// # Errors
/// The first [`Divergence`].
pub fn run_store<S: KvStore>(
    scenario: &Scenario,
    build: impl FnOnce(&StoreParams) -> Result<S, KvError>,
) -> Result<(), Divergence> {
    run_with(scenario, false, build)
}

/// [`run_store`], with `GrowKv`'s growth rules on the store under test if `grow_rules`.
fn run_with<S: KvStore>(
    scenario: &Scenario,
    grow_rules: bool,
    build: impl FnOnce(&StoreParams) -> Result<S, KvError>,
) -> Result<(), Divergence> {
    let g = scenario.geometry();
    let max_ctx = scenario.max_ctx;
    let at_start = |detail: String| Divergence { op: None, detail };
    let windows = scenario.layer_windows();
    let dense_gate = Arc::new(RefuseNext::default());
    let store_gate = Arc::new(RefuseNext::default());
    let window_gate = Arc::new(RefuseNext::default());
    let types = scenario.types;
    let offsets = scenario.key_offsets();
    let built = build(&StoreParams {
        geometry: g,
        max_ctx,
        types,
        windows: windows.clone(),
        key_offsets: offsets.clone(),
        initial: scenario.initial,
        gate: store_gate.clone(),
    });
    let window = WindowKv::with_types(g, max_ctx, &windows, types).and_then(|w| match &offsets {
        Some(o) => w.with_key_offsets(o.clone()),
        None => Ok(w),
    });
    let dense = DenseKv::with_types(g, max_ctx, types).and_then(|d| match &offsets {
        Some(o) => d.with_key_offsets(o.clone()),
        None => Ok(d),
    });
    let (mut dense, store, mut window) = match (dense, built, window) {
        (Ok(d), Ok(s), Ok(w)) => (d, s, w),
        (Err(a), Err(b), Err(c)) if a == b && b == c => return Ok(()),
        (a, b, c) => {
            return Err(at_start(format!(
                "constructors disagree: DenseKv {:?}, the store {:?}, WindowKv {:?}",
                a.map(drop),
                b.map(drop),
                c.map(drop)
            )));
        }
    };
    dense.set_alloc_gate(Some(dense_gate.clone()));
    window.set_alloc_gate(Some(window_gate.clone()));
    let store_windows: Vec<Option<usize>> = (0..g.n_layers).map(|l| store.window(l)).collect();
    let windowed = store_windows.iter().any(Option::is_some);
    if windowed && store_windows != windows {
        return Err(at_start(format!(
            "the store's windows {store_windows:?} are neither the scenario's {windows:?} nor none"
        )));
    }
    let mut seqs = vec![Seq {
        spec: SpecKv::with_types(g, max_ctx, &windows, types).with_key_offsets(offsets),
        dense,
        store,
        window,
        windowed,
    }];
    let mut caps = vec![seqs[0].store.capacity()];
    check(&seqs[0], caps[0], grow_rules).map_err(at_start)?;
    for (index, op) in scenario.ops.iter().enumerate() {
        let diverged = |detail: String| Divergence {
            op: Some((index, op.clone())),
            detail,
        };
        let gates = [&*dense_gate, &*store_gate, &*window_gate];
        step(&mut seqs, &mut caps, op, gates, grow_rules).map_err(diverged)?;
        // A refusal armed for this op that it did not use expires with it.
        if !matches!(op, KvOp::RefuseNextAlloc) {
            gates
                .iter()
                .for_each(|g| g.0.store(false, Ordering::Relaxed));
        }
        for (seq, &cap) in seqs.iter().zip(&caps) {
            check(seq, cap, grow_rules).map_err(diverged)?;
        }
    }
    Ok(())
}

/// Applies one op; updates each sequence's last capacity of the store under test (which
/// must not shrink under `grow_rules`).
fn step<S: KvStore>(
    seqs: &mut Vec<Seq<S>>,
    caps: &mut Vec<usize>,
    op: &KvOp,
    gates: [&RefuseNext; 3],
    grow_rules: bool,
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
            if s.windowed {
                let store = s.store.truncate(*n);
                if store != spec {
                    return Err(format!("truncate: spec {spec:?}, the store {store:?}"));
                }
            }
            if spec.is_ok() {
                let mut keep_all: Vec<&mut dyn KvStore> = vec![&mut s.dense];
                if !s.windowed {
                    keep_all.push(&mut s.store);
                }
                for kv in keep_all {
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
                let (spec, dense, store, window) = (
                    s.spec.fork(),
                    s.dense.fork(),
                    s.store.fork(),
                    s.window.fork(),
                );
                let outcome = |r: Result<(), &KvError>| r.map_err(Clone::clone);
                let results = [
                    outcome(spec.as_ref().map(drop)),
                    outcome(dense.as_ref().map(drop)),
                    outcome(store.as_ref().map(drop)),
                    outcome(window.as_ref().map(drop)),
                ];
                if !agree("fork", &results, s.windowed)?
                    && let (Ok(spec), Ok(dense), Ok(store), Ok(window)) =
                        (spec, dense, store, window)
                {
                    let fork = Seq {
                        spec,
                        dense,
                        store,
                        window,
                        windowed: s.windowed,
                    };
                    if fork.snapshots()? != seqs[i].snapshots()? {
                        return Err("a fork differs from its parent".into());
                    }
                    caps.push(fork.store.capacity());
                    seqs.push(fork);
                }
            }
        }
        KvOp::Free { seq } => {
            if seqs.len() > 1 {
                let i = pick(*seq, seqs.len());
                seqs.remove(i);
                caps.remove(i);
            }
        }
    }
    for (seq, cap) in seqs.iter().zip(caps.iter_mut()) {
        let now = seq.store.capacity();
        if grow_rules && now < *cap {
            return Err(format!("GrowKv capacity shrank from {cap} to {now}"));
        }
        *cap = now;
    }
    Ok(())
}

/// One append driven step by step on the four stores of `seq`.
fn append<S: KvStore>(
    seq: &mut Seq<S>,
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
    let unchanged = |seq: &Seq<S>, what: &str| -> Result<(), String> {
        if seq.snapshots()? == before {
            Ok(())
        } else {
            Err(format!("{what} changed a store"))
        }
    };
    let results = seq.stores().map(|kv| kv.begin(at, n));
    let windowed = seq.windowed;
    if agree("begin", &results, windowed)? || results[0].is_err() {
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
            agree("a write of rows too wide", &results, windowed)?;
            if results[0].is_ok() {
                return Err("rows one element too wide were accepted".into());
            }
            seq.same_views()?;
        }
        let results = seq.stores().map(|kv| kv.write(layer, k.view(), v.view()));
        agree(&format!("write({layer})"), &results, windowed)?;
        seq.same_views()?;
    }
    let commit = matches!(end, End::Commit | End::BadRow(_) | End::SkipLayer(_));
    if commit {
        let results = seq.stores().map(|kv| kv.commit());
        agree("commit", &results, windowed)?;
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

/// The invariants of one sequence outside an append: equal lengths and views, and the
/// capacity and footprint rules of the dense and window stores (and of `GrowKv` on the
/// store under test when `grow_rules`).
fn check<S: KvStore>(seq: &Seq<S>, cap_before: usize, grow_rules: bool) -> Result<(), String> {
    let (spec, dense, grow, window) = (&seq.spec, &seq.dense, &seq.store, &seq.window);
    if dense.len() != spec.len() || grow.len() != spec.len() || window.len() != spec.len() {
        return Err(format!(
            "len differs: spec {}, DenseKv {}, the store {}, WindowKv {}",
            spec.len(),
            dense.len(),
            grow.len(),
            window.len()
        ));
    }
    let g = spec.geometry();
    let codec = |kv: &dyn KvStore| kv.codecs().0;
    let want_codec = codec(spec);
    let means = |kv: &dyn KvStore| Some(codec(kv).calibration().to_vec()).filter(|m| !m.is_empty());
    let want = means(spec);
    for (name, kv) in [
        ("DenseKv", dense as &dyn KvStore),
        ("the store", grow),
        ("WindowKv", window),
    ] {
        if means(kv) != want {
            return Err(format!("{name} has other key offsets than the spec"));
        }
        for layer in 0..g.n_layers {
            let view = kv.view(layer).map_err(|e| format!("{name} view: {e}"))?;
            let keys = view.codecs().0;
            let (has, end) = (keys.offset_block().is_some(), view.span().end.max(1));
            let same = (0..g.n_kv_heads).all(|h| {
                keys.key_offset(end - 1, h)
                    == want_codec
                        .key_offsets()
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
    if grow_rules && (!(grow.len()..=grow.max_ctx()).contains(&cap) || cap < cap_before) {
        return Err(format!(
            "GrowKv capacity {cap} invalid (len {}, max_ctx {}, before {cap_before})",
            grow.len(),
            grow.max_ctx()
        ));
    }
    if grow_rules && (grow.bytes() != footprint(cap) || grow.bytes() > dense.bytes()) {
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
    use kvcore::ndarray::ArrayView2;

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
        run_store(s, |p| {
            Ok(Faulty {
                inner: GrowKv::new(p.geometry, p.max_ctx)?,
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
        assert!(d.detail.contains("the store"), "{d}");
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
