//! Differential testing of the KV stores: one op sequence is applied to a [`GrowKv`] and
//! to the reference [`DenseKv`], and after every op the two must agree bit for bit.
//!
//! A [`Scenario`] is a store geometry plus a list of [`KvOp`]s; [`run`] replays it and
//! returns the first [`Divergence`], naming the op and what differed. After construction
//! and after every op it checks:
//! - both stores returned the same `Result` (same [`KvError`], same success);
//! - a failed op changed neither store (`seq_len`, `capacity`, `bytes`);
//! - `seq_len` is equal; GrowKv's capacity never shrinks and stays in
//!   `seq_len..=max_ctx`; DenseKv's is `max_ctx`; each `bytes()` is exactly
//!   `2 · n_layers · capacity · kv_dim · 4` and GrowKv's is at most DenseKv's;
//! - every readable row, through `k`/`v` and through `keys`/`values`, holds the same
//!   `f32::to_bits` in both stores (NaN payloads and `-0.0` included), and the reads left
//!   both footprints unchanged.
//!
//! Scenarios implement [`arbitrary::Arbitrary`] with bounded sizes so one run takes
//! microseconds to milliseconds: `1..=4` layers, `kv_dim` `0..=16`, `max_ctx` `0..=600`,
//! at most 64 ops of at most 32 value words each. The byte encoding, for hand-written
//! fuzz seeds ([`Scenario::from_bytes`]; multi-byte ranged integers are big-endian,
//! `u32`s little-endian, missing bytes read as zero):
//!
//! ```text
//! scenario = n_layers:u8 (1 + b % 4)  kv_dim:u8 (b % 17)  max_ctx:u16be (v % 601)
//!            initial:(u8 even → None | u8 odd, u16be (v % 701))  { u8 odd, op }*  u8 even
//! op       = tag:u32le, variant = top two bits of the 4th byte:
//!            0x00.. Append    layer:u8 plane bits
//!            0x40.. WriteAt   layer:u8 pos plane bits
//!            0x80.. SetSeqLen pos
//!            0xc0.. Clear
//! plane    = u8 (b % 3: K, V, Both)
//! bits     = count:u8 (b % 33), count × u32le
//! pos      = u16be v: v < 0xff00 → v % 700, else usize::MAX − (v & 0xff)
//! ```

use std::fmt;

use arbitrary::{Arbitrary, Unstructured};
use thiserror::Error;

use super::{DenseKv, GrowKv, KvError, KvStore};

/// Largest `n_layers` an arbitrary [`Scenario`] has (the smallest is 1).
pub const MAX_LAYERS: usize = 4;
/// Largest `kv_dim` an arbitrary [`Scenario`] has (the smallest is 0).
pub const MAX_KV_DIM: usize = 16;
/// Largest `max_ctx` an arbitrary [`Scenario`] has (the smallest is 0).
pub const MAX_CTX: usize = 600;
/// Largest explicit initial capacity an arbitrary [`Scenario`] asks for (above
/// [`MAX_CTX`], so clamping is exercised).
pub const MAX_INITIAL: usize = 700;
/// Most ops in an arbitrary [`Scenario`].
pub const MAX_OPS: usize = 64;
/// Most value words in an arbitrary write op.
pub const MAX_BITS: usize = 32;
/// Arbitrary small positions are `0..POS_RANGE`, past [`MAX_CTX`] so overflows occur.
pub const POS_RANGE: usize = 700;

/// Which buffers a write op writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// `k_mut` only.
    K,
    /// `v_mut` only.
    V,
    /// `k_mut`, then `v_mut` (skipped when `k_mut` fails).
    Both,
}

impl fmt::Display for Plane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Plane::K => "K",
            Plane::V => "V",
            Plane::Both => "K+V",
        })
    }
}

/// One operation on a KV store.
///
/// Write ops target layer `layer % n_layers` (skipped when `n_layers == 0`: there is
/// no layer to write, and writing one would be the documented panic). They fill a K row
/// with `bits[i % bits.len()]` and a V row with `bits[(kv_dim + i) % bits.len()]`
/// (`f32::from_bits`, verbatim; empty `bits` writes `+0.0`).
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub enum KvOp {
    /// Write at position `seq_len` (the next one), as a decode step does.
    Append {
        layer: u8,
        #[arbitrary(with = arb_plane)]
        plane: Plane,
        #[arbitrary(with = arb_bits)]
        bits: Vec<u32>,
    },
    /// Write at any position, including past `max_ctx` and near `usize::MAX`.
    WriteAt {
        layer: u8,
        #[arbitrary(with = arb_pos)]
        pos: usize,
        #[arbitrary(with = arb_plane)]
        plane: Plane,
        #[arbitrary(with = arb_bits)]
        bits: Vec<u32>,
    },
    /// `set_seq_len(n)`: grow ahead or truncate.
    SetSeqLen {
        #[arbitrary(with = arb_pos)]
        n: usize,
    },
    /// `clear()`.
    Clear,
}

/// A store geometry and the ops to replay on it.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct Scenario {
    /// Layers of both stores.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=MAX_LAYERS))]
    pub n_layers: usize,
    /// Floats per row.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=MAX_KV_DIM))]
    pub kv_dim: usize,
    /// Context ceiling.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=MAX_CTX))]
    pub max_ctx: usize,
    /// `None`: `GrowKv::new`; `Some(i)`: `GrowKv::with_initial_capacity(.., i)`.
    #[arbitrary(with = arb_initial)]
    pub initial: Option<usize>,
    /// The ops, applied in order.
    #[arbitrary(with = arb_ops)]
    pub ops: Vec<KvOp>,
}

impl Scenario {
    /// Decodes a scenario from raw bytes (the fuzz input and corpus file format, see
    /// the [module docs](self)). Every byte string decodes; short input reads as zeros.
    pub fn from_bytes(data: &[u8]) -> arbitrary::Result<Scenario> {
        Scenario::arbitrary_take_rest(Unstructured::new(data))
    }
}

fn arb_plane(u: &mut Unstructured) -> arbitrary::Result<Plane> {
    Ok(match u.int_in_range(0..=2u8)? {
        0 => Plane::K,
        1 => Plane::V,
        _ => Plane::Both,
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

/// Which store a [`Mismatch`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The reference, [`DenseKv`].
    Dense,
    /// [`GrowKv`].
    Grow,
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Store::Dense => "DenseKv",
            Store::Grow => "GrowKv",
        })
    }
}

/// How a row was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// `k(layer, pos)` / `v(layer, pos)`.
    Row,
    /// `keys(layer)` / `values(layer)`.
    Slice,
}

/// A store's size observables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// `seq_len()`.
    pub seq_len: usize,
    /// `capacity()`.
    pub capacity: usize,
    /// `bytes()`.
    pub bytes: usize,
}

impl Footprint {
    fn of<S: KvStore>(kv: &S) -> Footprint {
        Footprint {
            seq_len: kv.seq_len(),
            capacity: kv.capacity(),
            bytes: kv.bytes(),
        }
    }
}

/// When a [`Divergence`] was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Building the stores, before any op.
    Construct,
    /// After applying `ops[index]`.
    Op {
        /// Index into [`Scenario::ops`].
        index: usize,
        /// The op itself.
        op: KvOp,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Construct => f.write_str("at construction"),
            Step::Op { index, op } => write!(f, "after op {index} ({op:?})"),
        }
    }
}

/// What differed (or which invariant broke).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Mismatch {
    /// The constructors disagreed.
    #[error("constructors disagree: DenseKv {dense:?}, GrowKv {grow:?}")]
    Construct {
        dense: Result<(), KvError>,
        grow: Result<(), KvError>,
    },
    /// The op succeeded on one store and failed on the other, or failed differently.
    #[error("outcomes differ: DenseKv {dense:?}, GrowKv {grow:?}")]
    Outcome {
        dense: Result<(), KvError>,
        grow: Result<(), KvError>,
    },
    /// A failed op changed the store.
    #[error("{store} changed by a failed op: {before:?} -> {after:?}")]
    ChangedOnError {
        store: Store,
        before: Footprint,
        after: Footprint,
    },
    /// Reading changed the store (reads must never grow or allocate).
    #[error("{store} changed by reads: {before:?} -> {after:?}")]
    ChangedByRead {
        store: Store,
        before: Footprint,
        after: Footprint,
    },
    /// `seq_len()` differs.
    #[error("seq_len differs: DenseKv {dense}, GrowKv {grow}")]
    SeqLen { dense: usize, grow: usize },
    /// A capacity outside its allowed range (DenseKv: exactly `max_ctx`; GrowKv:
    /// `seq_len..=max_ctx`).
    #[error("{store} capacity {capacity} invalid for seq_len {seq_len}, max_ctx {max_ctx}")]
    Capacity {
        store: Store,
        capacity: usize,
        seq_len: usize,
        max_ctx: usize,
    },
    /// GrowKv's capacity went down.
    #[error("GrowKv capacity shrank from {before} to {after}")]
    Shrunk { before: usize, after: usize },
    /// `bytes()` is not the exact footprint of the capacity.
    #[error("{store} bytes() is {bytes}, not 2 * n_layers * capacity * kv_dim * 4 = {expected}")]
    Bytes {
        store: Store,
        bytes: usize,
        expected: usize,
    },
    /// GrowKv holds more than the dense store.
    #[error("GrowKv bytes() {grow} exceeds DenseKv's {dense}")]
    GrowLarger { grow: usize, dense: usize },
    /// `keys(layer)`/`values(layer)` has the wrong length.
    #[error("{store} {plane} slice of layer {layer} has {len} floats, expected {expected}")]
    SliceLen {
        store: Store,
        plane: Plane,
        layer: usize,
        len: usize,
        expected: usize,
    },
    /// `k(layer, pos)`/`v(layer, pos)` has the wrong length.
    #[error("{store} {plane} row of layer {layer} pos {pos} has {len} floats, expected {expected}")]
    RowLen {
        store: Store,
        plane: Plane,
        layer: usize,
        pos: usize,
        len: usize,
        expected: usize,
    },
    /// A float's bits differ from DenseKv's `keys`/`values` slice.
    #[error(
        "{store} {plane} ({read:?}) layer {layer} pos {pos} float {index}: bits {found:#010x}, DenseKv slice has {expected:#010x}"
    )]
    Bits {
        store: Store,
        read: Read,
        plane: Plane,
        layer: usize,
        pos: usize,
        index: usize,
        expected: u32,
        found: u32,
    },
}

/// The first disagreement of a [`run`]: when, and what.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{step}: {mismatch}")]
pub struct Divergence {
    /// When it was seen.
    pub step: Step,
    /// What differed.
    pub mismatch: Mismatch,
}

/// Replays `scenario` on a [`DenseKv`] and a [`GrowKv`] and checks them against each
/// other after construction and after every op (see the [module docs](self)).
///
/// A geometry that neither store can be built for (the same error from both
/// constructors) passes trivially; any other constructor disagreement is a divergence.
///
/// # Errors
/// The first [`Divergence`].
pub fn run(scenario: &Scenario) -> Result<(), Divergence> {
    run_against(
        scenario,
        |n_layers, kv_dim, max_ctx, initial| match initial {
            None => GrowKv::new(n_layers, kv_dim, max_ctx),
            Some(initial) => GrowKv::with_initial_capacity(n_layers, kv_dim, max_ctx, initial),
        },
    )
}

/// [`run`] with the store under test built by `build(n_layers, kv_dim, max_ctx,
/// initial)`, so the checker itself can be tested on deliberately faulty stores.
fn run_against<S: KvStore>(
    scenario: &Scenario,
    build: impl FnOnce(usize, usize, usize, Option<usize>) -> Result<S, KvError>,
) -> Result<(), Divergence> {
    let Scenario {
        n_layers,
        kv_dim,
        max_ctx,
        initial,
        ref ops,
    } = *scenario;
    let dense = DenseKv::new(n_layers, kv_dim, max_ctx);
    let grow = build(n_layers, kv_dim, max_ctx, initial);
    let (mut dense, mut grow) = match (dense, grow) {
        (Ok(dense), Ok(grow)) => (dense, grow),
        (Err(dense), Err(grow)) if dense == grow => return Ok(()),
        (dense, grow) => {
            return Err(Divergence {
                step: Step::Construct,
                mismatch: Mismatch::Construct {
                    dense: dense.map(drop),
                    grow: grow.map(drop),
                },
            });
        }
    };
    check(&dense, &grow).map_err(|mismatch| Divergence {
        step: Step::Construct,
        mismatch,
    })?;
    for (index, op) in ops.iter().enumerate() {
        step(&mut dense, &mut grow, op).map_err(|mismatch| Divergence {
            step: Step::Op {
                index,
                op: op.clone(),
            },
            mismatch,
        })?;
    }
    Ok(())
}

/// Applies `op` to both stores and checks them.
fn step<S: KvStore>(dense: &mut DenseKv, grow: &mut S, op: &KvOp) -> Result<(), Mismatch> {
    let before = (Footprint::of(dense), Footprint::of(grow));
    let outcome = (apply(dense, op), apply(grow, op));
    let after = (Footprint::of(dense), Footprint::of(grow));
    if outcome.0 != outcome.1 {
        return Err(Mismatch::Outcome {
            dense: outcome.0,
            grow: outcome.1,
        });
    }
    if outcome.0.is_err() {
        for (store, before, after) in [
            (Store::Dense, before.0, after.0),
            (Store::Grow, before.1, after.1),
        ] {
            if before != after {
                return Err(Mismatch::ChangedOnError {
                    store,
                    before,
                    after,
                });
            }
        }
    }
    if after.1.capacity < before.1.capacity {
        return Err(Mismatch::Shrunk {
            before: before.1.capacity,
            after: after.1.capacity,
        });
    }
    check(dense, grow)
}

/// Applies one op to one store.
fn apply<S: KvStore>(kv: &mut S, op: &KvOp) -> Result<(), KvError> {
    match op {
        KvOp::Append { layer, plane, bits } => write(kv, *layer, kv.seq_len(), *plane, bits),
        KvOp::WriteAt {
            layer,
            pos,
            plane,
            bits,
        } => write(kv, *layer, *pos, *plane, bits),
        KvOp::SetSeqLen { n } => kv.set_seq_len(*n),
        KvOp::Clear => {
            kv.clear();
            Ok(())
        }
    }
}

/// The write ops: rows filled from `bits` as documented on [`KvOp`].
fn write<S: KvStore>(
    kv: &mut S,
    layer: u8,
    pos: usize,
    plane: Plane,
    bits: &[u32],
) -> Result<(), KvError> {
    if kv.n_layers() == 0 {
        return Ok(());
    }
    let layer = usize::from(layer) % kv.n_layers();
    let kv_dim = kv.kv_dim();
    let fill = |row: &mut [f32], start: usize| {
        for (i, x) in row.iter_mut().enumerate() {
            *x = bits
                .get((start + i) % bits.len().max(1))
                .map_or(0.0, |&b| f32::from_bits(b));
        }
    };
    if matches!(plane, Plane::K | Plane::Both) {
        fill(kv.k_mut(layer, pos)?, 0);
    }
    if matches!(plane, Plane::V | Plane::Both) {
        fill(kv.v_mut(layer, pos)?, kv_dim);
    }
    Ok(())
}

/// The state checks run after construction and after every op.
fn check<S: KvStore>(dense: &DenseKv, grow: &S) -> Result<(), Mismatch> {
    let (d, g) = (Footprint::of(dense), Footprint::of(grow));
    if d.seq_len != g.seq_len {
        return Err(Mismatch::SeqLen {
            dense: d.seq_len,
            grow: g.seq_len,
        });
    }
    let max_ctx = dense.max_ctx();
    for (store, fp, ok) in [
        (Store::Dense, d, d.capacity == max_ctx),
        (Store::Grow, g, (g.seq_len..=max_ctx).contains(&g.capacity)),
    ] {
        if !ok {
            return Err(Mismatch::Capacity {
                store,
                capacity: fp.capacity,
                seq_len: fp.seq_len,
                max_ctx,
            });
        }
        let expected = 2 * dense.n_layers() * fp.capacity * dense.kv_dim() * 4;
        if fp.bytes != expected {
            return Err(Mismatch::Bytes {
                store,
                bytes: fp.bytes,
                expected,
            });
        }
    }
    if g.bytes > d.bytes {
        return Err(Mismatch::GrowLarger {
            grow: g.bytes,
            dense: d.bytes,
        });
    }
    compare_rows(dense, grow)?;
    for (store, before, after) in [
        (Store::Dense, d, Footprint::of(dense)),
        (Store::Grow, g, Footprint::of(grow)),
    ] {
        if before != after {
            return Err(Mismatch::ChangedByRead {
                store,
                before,
                after,
            });
        }
    }
    Ok(())
}

/// Every readable row of both stores, via both read paths, against DenseKv's slices.
fn compare_rows(dense: &DenseKv, grow: &dyn KvStore) -> Result<(), Mismatch> {
    let (seq_len, kv_dim) = (dense.seq_len(), dense.kv_dim());
    for layer in 0..dense.n_layers() {
        for plane in [Plane::K, Plane::V] {
            let reference = slice(dense, plane, layer);
            let stores: [(Store, &dyn KvStore); 2] = [(Store::Dense, dense), (Store::Grow, grow)];
            for (store, kv) in stores {
                let whole = slice(kv, plane, layer);
                if whole.len() != seq_len * kv_dim {
                    return Err(Mismatch::SliceLen {
                        store,
                        plane,
                        layer,
                        len: whole.len(),
                        expected: seq_len * kv_dim,
                    });
                }
                for pos in 0..seq_len {
                    let expected = &reference[pos * kv_dim..(pos + 1) * kv_dim];
                    let single = row(kv, plane, layer, pos);
                    if single.len() != kv_dim {
                        return Err(Mismatch::RowLen {
                            store,
                            plane,
                            layer,
                            pos,
                            len: single.len(),
                            expected: kv_dim,
                        });
                    }
                    for (read, found) in [
                        (Read::Slice, &whole[pos * kv_dim..(pos + 1) * kv_dim]),
                        (Read::Row, single),
                    ] {
                        let differs = expected
                            .iter()
                            .zip(found)
                            .position(|(e, f)| e.to_bits() != f.to_bits());
                        if let Some(index) = differs {
                            return Err(Mismatch::Bits {
                                store,
                                read,
                                plane,
                                layer,
                                pos,
                                index,
                                expected: expected[index].to_bits(),
                                found: found[index].to_bits(),
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// `keys(layer)` for [`Plane::K`], else `values(layer)`.
fn slice(kv: &dyn KvStore, plane: Plane, layer: usize) -> &[f32] {
    match plane {
        Plane::K => kv.keys(layer),
        _ => kv.values(layer),
    }
}

/// `k(layer, pos)` for [`Plane::K`], else `v(layer, pos)`.
fn row(kv: &dyn KvStore, plane: Plane, layer: usize, pos: usize) -> &[f32] {
    match plane {
        Plane::K => kv.k(layer, pos),
        _ => kv.v(layer, pos),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A faulty store: a `GrowKv` that canonicalises the row written last (NaN → the
    /// canonical quiet NaN, `-0.0` → `+0.0`) at its next mutating call, the way a
    /// value-based (rather than bitwise) copy would.
    struct Canonicalising {
        inner: GrowKv,
        last: Option<(Plane, usize, usize)>,
    }

    impl Canonicalising {
        fn settle(&mut self) {
            if let Some((plane, layer, pos)) = self.last.take() {
                let row = match plane {
                    Plane::K => self.inner.k_mut(layer, pos),
                    _ => self.inner.v_mut(layer, pos),
                };
                for x in row.expect("row written before") {
                    *x = if x.is_nan() { f32::NAN } else { *x + 0.0 };
                }
            }
        }
    }

    impl KvStore for Canonicalising {
        fn n_layers(&self) -> usize {
            self.inner.n_layers()
        }
        fn kv_dim(&self) -> usize {
            self.inner.kv_dim()
        }
        fn max_ctx(&self) -> usize {
            self.inner.max_ctx()
        }
        fn capacity(&self) -> usize {
            self.inner.capacity()
        }
        fn seq_len(&self) -> usize {
            self.inner.seq_len()
        }
        fn k_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
            self.settle();
            self.last = Some((Plane::K, layer, pos));
            self.inner.k_mut(layer, pos)
        }
        fn v_mut(&mut self, layer: usize, pos: usize) -> Result<&mut [f32], KvError> {
            self.settle();
            self.last = Some((Plane::V, layer, pos));
            self.inner.v_mut(layer, pos)
        }
        fn k(&self, layer: usize, pos: usize) -> &[f32] {
            self.inner.k(layer, pos)
        }
        fn v(&self, layer: usize, pos: usize) -> &[f32] {
            self.inner.v(layer, pos)
        }
        fn keys(&self, layer: usize) -> &[f32] {
            self.inner.keys(layer)
        }
        fn values(&self, layer: usize) -> &[f32] {
            self.inner.values(layer)
        }
        fn set_seq_len(&mut self, n: usize) -> Result<(), KvError> {
            self.settle();
            self.inner.set_seq_len(n)
        }
        fn clear(&mut self) {
            self.settle();
            self.inner.clear();
        }
        fn bytes(&self) -> usize {
            self.inner.bytes()
        }
    }

    /// Writes `[1.0, word, 1.0]` to one K row, clears (the faulty store canonicalises
    /// the row then) and makes the row readable again.
    fn against_canonicalising(word: u32) -> Result<(), Divergence> {
        let scenario = Scenario {
            n_layers: 2,
            kv_dim: 3,
            max_ctx: 10,
            initial: None,
            ops: vec![
                KvOp::WriteAt {
                    layer: 1,
                    pos: 4,
                    plane: Plane::K,
                    bits: vec![0x3f80_0000, word],
                },
                KvOp::Clear,
                KvOp::SetSeqLen { n: 5 },
            ],
        };
        run_against(&scenario, |n_layers, kv_dim, max_ctx, _| {
            Ok(Canonicalising {
                inner: GrowKv::new(n_layers, kv_dim, max_ctx)?,
                last: None,
            })
        })
    }

    #[test]
    fn a_nan_payload_change_is_a_divergence() {
        let d = against_canonicalising(0xff80_0001).unwrap_err();
        assert_eq!(
            d.mismatch,
            Mismatch::Bits {
                store: Store::Grow,
                read: Read::Slice,
                plane: Plane::K,
                layer: 1,
                pos: 4,
                index: 1,
                expected: 0xff80_0001,
                found: f32::NAN.to_bits(),
            }
        );
        assert!(matches!(d.step, Step::Op { index: 2, .. }), "{d}");
    }

    #[test]
    fn a_sign_of_zero_change_is_a_divergence() {
        let d = against_canonicalising(0x8000_0000).unwrap_err();
        assert!(
            matches!(
                d.mismatch,
                Mismatch::Bits {
                    expected: 0x8000_0000,
                    found: 0,
                    ..
                }
            ),
            "{d}"
        );
    }

    #[test]
    fn ordinary_values_survive_canonicalising() {
        assert_eq!(against_canonicalising(0x4000_0000), Ok(()));
    }

    #[test]
    fn empty_input_decodes_to_the_smallest_scenario() {
        let s = Scenario::from_bytes(&[]).unwrap();
        assert_eq!(
            s,
            Scenario {
                n_layers: 1,
                kv_dim: 0,
                max_ctx: 0,
                initial: None,
                ops: vec![],
            }
        );
        assert_eq!(run(&s), Ok(()));
    }
}
