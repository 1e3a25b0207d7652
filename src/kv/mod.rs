//! The KV cache: per layer, the projected keys and values of every position a sequence
//! holds, behind one seam, [`KvStore`], that every store implements and attention reads.
//!
//! ## The seam
//! - **Reads** go through [`KvStore::view`]: a [`KvView`] of one layer, segments of slots
//!   with explicit positions and rows `[slots, n_kv_heads, head_dim]` in the store's
//!   element type ([`KvRows`]). The layout is the store's business; attention computes
//!   its mask from the positions ([`Mask`](crate::backend::Mask)).
//! - **Writes are transactional.** A forward pass opens an append of `n` positions at
//!   `at ≤ len` ([`KvStore::begin`]; `at < len` replaces the tail), writes every layer's
//!   rows ([`KvStore::write`]) and either commits (the store then holds positions
//!   `0 .. at + n`) or rolls back. Until the commit, [`len`](KvStore::len) and every
//!   committed row are unchanged; a layer's pending rows are visible only to
//!   [`view`](KvStore::view)s of that layer, for the pass's own attention. A rollback
//!   restores the store exactly: same `len`, same rows, same capacity and `bytes()`. All
//!   of an append's allocation happens in `begin`, so a refused allocation changes
//!   nothing and a commit cannot fail for lack of memory. [`Append`] is the guard that
//!   rolls back when a pass returns early.
//! - **Sequence operations**: [`truncate`](KvStore::truncate) (roll back to the first `n`
//!   positions; a store that evicts may refuse, [`KvError::BehindWindow`], and
//!   [`can_rewind_to`](KvStore::can_rewind_to) says so beforehand), [`clear`](KvStore::clear)
//!   and [`fork`](KvStore::fork) (a second store holding the same positions; a copy).
//! - **Restores** of state files are an extension, [`KvRestore`]: an append of all
//!   positions ([`begin_restore`](KvRestore::begin_restore)) in which a layer is given
//!   only the positions it keeps ([`restore_starts`], from [`window`](KvStore::window)),
//!   as rows already in the store's element types
//!   ([`write_stored`](KvRestore::write_stored)). A store that can load state files says
//!   so through [`KvStore::restorer`], so a `Box<dyn KvStore>` loads them too.
//!
//! Every store makes the same admission checks in the same order (no append open, the
//! start, the ceiling; the rows' shapes and types; every layer written before a commit),
//! so all stores fail the same calls with the same errors; they live in this module,
//! private to the stores (`check_begin` and its siblings).
//!
//! ## The stores
//! - [`DenseKv`] preallocates `max_ctx` positions: the reference.
//! - [`GrowKv`] starts at `min(64, max_ctx)` positions and doubles on demand, up to the
//!   hard `max_ctx` ceiling, re-laying out its rows with one memcpy per layer.
//! - [`PagedKv`] is one sequence in a [`KvPool`]: blocks of positions shared between
//!   sequences (forks, a prefix cache keyed by a chained hash of the tokens) and copied
//!   on write, under the pool's byte budget (`paged.rs`).
//! - [`WindowKv`] gives each layer a window or none: global layers grow as `GrowKv`,
//!   sliding-window layers keep a ring of their last `w` positions (growing on demand up
//!   to `w` slots), so a window layer costs at most `w` positions however long the
//!   sequence. Its views hold the retained positions (one or two ring segments) and the
//!   pending rows; attention with `Mask::SlidingWindow` over them is bitwise that over a
//!   dense store. Rewinding behind a window is [`KvError::BehindWindow`].
//!
//! - [`SinkKv`] keeps every layer's first `keep` positions (attention sinks) and its last
//!   `w` (a window) for a model trained without sliding windows, at most `keep + w`
//!   positions per layer however long the sequence; its view scores the sinks with the
//!   query at its position within the cache ([`Scoring`]), StreamingLLM's rule.
//!
//! Every store keeps K and V in an element type chosen for each ([`KvType`]: f32, the
//! reference, f16, bf16 or q8_0; `elem.rs`), encoded one row at a time when written, so
//! stores given the same rows hold the same bytes. What a type does to a row, and what
//! attention and state files must do about it, is its codec's ([`KvCodec`], `codec.rs`):
//! a q8_0 key store may keep its keys less the model's key offsets (`offsets.rs`), which
//! its views hand to attention.
//!
//! The first two keep K and V as `[n_layers][cap]` rows of those types with the live
//! capacity as the per-layer stride, share their implementation (`rows.rs`, which
//! `WindowKv` uses for its global layers) and differ only in when capacity is allocated,
//! so their views, and the attention computed from them, are bitwise identical. Positions
//! at or past `max_ctx` are a [`KvError::ContextOverflow`];
//! every size is computed with checked arithmetic ([`KvError::TooLarge`]) and every buffer
//! allocated fallibly ([`KvError::AllocFailed`]), optionally through an [`AllocGate`] that
//! may refuse.

mod checkpoint;
pub mod codec;
mod dense;
mod elem;
mod grow;
mod mem;
mod offsets;
mod paged;
mod rows;
mod sink;
pub mod tier;
mod view;
mod window;

pub use checkpoint::Checkpoints;
pub use codec::{KvCodec, LayerCodec};
pub use dense::DenseKv;
pub use elem::{BlockQ4_0, BlockQ8_0, Q8_0_BLOCK};
pub use grow::GrowKv;
pub use offsets::{KEY_OFFSET_BLOCK, KeyOffsets};
pub use paged::{BlockHash, KvPool, PagedKv, PoolConfig, PoolStats};
pub use sink::SinkKv;
pub use tier::{DiskTier, KvTier, TierKey, TierRecord, TierStats};
pub use view::{KvRows, KvSegment, KvView, Scoring};
pub use window::WindowKv;

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use ndarray::ArrayView2;
use thiserror::Error;

/// The shape of a store: layers, KV heads per position and elements per head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvGeometry {
    /// Transformer layers, each with its own K and V rows.
    pub n_layers: usize,
    /// Key/value heads per position.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl KvGeometry {
    /// Elements per K or V row: `n_kv_heads · head_dim` (saturating; the stores'
    /// constructors reject a geometry whose rows overflow, [`KvError::TooLarge`]).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads.saturating_mul(self.head_dim)
    }
}

/// The element type a store keeps its K or V rows in (see `kv/elem.rs` for each
/// encoding and its error). K and V choose theirs separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvType {
    /// 32-bit floats: exact copies of the projected rows. The reference.
    F32,
    /// IEEE half precision, rounded to nearest even: 2 bytes per value.
    F16,
    /// bfloat16, rounded to nearest even: 2 bytes per value (f32's range, 8 bits of
    /// precision).
    BF16,
    /// llama.cpp's `Q8_0`: blocks of 32 values within a head, an f16 scale and 32 signed
    /// bytes each ([`BlockQ8_0`]): 34 bytes per 32 values. Needs a head size that is a
    /// multiple of 32.
    Q8_0,
    /// llama.cpp's `Q4_0`: blocks of 32 values within a head, an f16 scale and 32
    /// 4-bit quants each ([`BlockQ4_0`]): 18 bytes per 32 values. Heads rotated and keys
    /// kept less their key offsets as in `q8_0`. Needs a head size that is a multiple
    /// of 32.
    Q4_0,
}

impl KvType {
    /// Every type, in code order.
    pub const ALL: [KvType; 5] = [
        KvType::F32,
        KvType::F16,
        KvType::BF16,
        KvType::Q8_0,
        KvType::Q4_0,
    ];

    /// `"f32"`, `"f16"`, `"bf16"`, `"q8_0"`, `"q4_0"`.
    pub const fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::BF16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The stable numeric code used in state files.
    pub const fn code(self) -> u8 {
        match self {
            KvType::F32 => 0,
            KvType::F16 => 1,
            KvType::BF16 => 2,
            KvType::Q8_0 => 3,
            KvType::Q4_0 => 4,
        }
    }

    /// The type of a code, or `None`.
    pub fn from_code(code: u8) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// Values per storage unit: 1, or 32 for a `q8_0` or `q4_0` block.
    pub const fn block(self) -> usize {
        match self {
            KvType::Q8_0 | KvType::Q4_0 => elem::Q8_0_BLOCK,
            _ => 1,
        }
    }

    /// Bytes per storage unit.
    pub const fn unit_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::BF16 => 2,
            KvType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            KvType::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
        }
    }

    /// Storage units in a row of `kv_dim` values (`kv_dim` a multiple of
    /// [`block`](KvType::block)).
    pub const fn row_units(self, kv_dim: usize) -> usize {
        kv_dim / self.block()
    }

    /// Bytes of one row of `kv_dim` elements, or `None` on overflow or when `kv_dim` is
    /// not a whole number of blocks.
    pub fn row_bytes(self, kv_dim: usize) -> Option<usize> {
        if !kv_dim.is_multiple_of(self.block()) {
            return None;
        }
        self.row_units(kv_dim).checked_mul(self.unit_bytes())
    }

    /// The weight format whose bytes are this type's (`F32`, `F16`, `BF16`, `Q8_0`,
    /// `Q4_0`): a
    /// stored row decodes exactly as a weight row of that format.
    pub const fn dtype(self) -> crate::backend::DType {
        use crate::backend::DType;
        match self {
            KvType::F32 => DType::F32,
            KvType::F16 => DType::F16,
            KvType::BF16 => DType::BF16,
            KvType::Q8_0 => DType::Q8_0,
            KvType::Q4_0 => DType::Q4_0,
        }
    }

    /// Checks that rows of heads of `head_dim` values can be stored in this type:
    /// [`KvError::BlockShape`] when a `q8_0` block would span two heads.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KvError> {
        if head_dim.is_multiple_of(self.block()) {
            Ok(())
        } else {
            Err(KvError::BlockShape {
                kv_type: self,
                head_dim,
            })
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the KV stores. A call that errors changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KvError {
    /// A codec's calibration that cannot be made or does not fit the store or view (the
    /// key offsets of calibrated keys, `kv/offsets.rs`).
    #[error("KV codec calibration: {reason}")]
    Calibration {
        /// What is wrong.
        reason: &'static str,
    },
    /// A position at or past the store's hard ceiling was asked for.
    #[error("context overflow: position {pos} does not fit in a context of {max_ctx} positions")]
    ContextOverflow {
        /// The highest position the call needed.
        pos: usize,
        /// The store's ceiling.
        max_ctx: usize,
    },
    /// The store at its full size, `2 · n_layers · max_ctx · kv_dim` elements, does not
    /// fit in memory's address range (`isize::MAX` bytes).
    #[error(
        "KV store of {n_layers} layers x {max_ctx} positions x {kv_dim} elements overflows memory size"
    )]
    TooLarge {
        /// Layers.
        n_layers: usize,
        /// Positions.
        max_ctx: usize,
        /// Elements per row (saturated if it overflows itself).
        kv_dim: usize,
    },
    /// The allocator (or the store's [`AllocGate`]) refused a buffer.
    #[error("KV store allocation of {bytes} bytes failed")]
    AllocFailed {
        /// The size asked for.
        bytes: usize,
    },
    /// A layer index past the store's layers.
    #[error("layer {layer} out of range for a KV store of {n_layers} layers")]
    NoSuchLayer {
        /// The index asked for.
        layer: usize,
        /// The store's layers.
        n_layers: usize,
    },
    /// Rows of the wrong shape, `(rows, elements per row)`.
    #[error("{what}: expected [{}, {}], got [{}, {}]", expected.0, expected.1, found.0, found.1)]
    RowShape {
        /// Which rows.
        what: &'static str,
        /// The shape the store needs.
        expected: (usize, usize),
        /// The shape given.
        found: (usize, usize),
    },
    /// An append that would start past the positions held, leaving a gap.
    #[error("an append at position {at} would leave a gap after the {len} positions held")]
    StartPastEnd {
        /// Where the append was to start.
        at: usize,
        /// Positions held.
        len: usize,
    },
    /// [`KvStore::begin`] while an append is open, or an operation that needs none open.
    #[error("an append is already open on this KV store")]
    AppendOpen,
    /// [`KvStore::write`] or [`KvStore::commit`] with no append open.
    #[error("no append is open on this KV store")]
    NoAppend,
    /// [`KvStore::commit`] before every layer's rows were written.
    #[error("cannot commit: layer {layer} of the append was not written")]
    Incomplete {
        /// The first layer not written.
        layer: usize,
    },
    /// Segments of a view whose positions overlap or are out of order.
    #[error("a segment starting at position {start} does not follow position {after}")]
    Positions {
        /// The segment's first position.
        start: usize,
        /// The first position after the previous segment.
        after: usize,
    },
    /// A rewind ([`KvStore::truncate`], or [`KvStore::begin`] at `pos < len`) to a
    /// position whose queries would see positions a sliding-window layer has already
    /// evicted: a ring cannot bring them back. Every position from `earliest` on (and 0,
    /// a clear) is still possible; a session re-prefills from 0 instead.
    #[error(
        "cannot rewind to position {pos}: a sliding-window layer no longer holds the positions a query there sees (the earliest position to rewind to, besides 0, is {earliest})"
    )]
    BehindWindow {
        /// The position asked for.
        pos: usize,
        /// The earliest position `> 0` the store can rewind to.
        earliest: usize,
    },
    /// [`WindowKv::new`] with a window list whose length is not the number of layers.
    #[error("{found} layer windows given for a KV store of {n_layers} layers")]
    WindowCount {
        /// Entries given.
        found: usize,
        /// The store's layers.
        n_layers: usize,
    },
    /// [`WindowKv::new`] with a window of 0 positions (a layer whose queries would see
    /// nothing, not even themselves).
    #[error("layer {layer} has a sliding window of 0 positions (the smallest is 1)")]
    ZeroWindow {
        /// The layer.
        layer: usize,
    },
    /// A head size that is not a whole number of the element type's blocks (`q8_0`
    /// blocks of 32 never span two heads).
    #[error("{kv_type} rows need a head size that is a multiple of {}, got {head_dim}", kv_type.block())]
    BlockShape {
        /// The element type asked for.
        kv_type: KvType,
        /// The model's head size.
        head_dim: usize,
    },
    /// [`KvRestore::write_stored`] with rows of another element type than the store's.
    #[error("{what}: the store keeps {expected} rows, got {found}")]
    RowType {
        /// Which rows.
        what: &'static str,
        /// The store's type.
        expected: KvType,
        /// The rows' type.
        found: KvType,
    },
    /// [`KvPool::new`] with blocks of 0 positions.
    #[error("a KV pool needs blocks of at least one position")]
    ZeroBlockLen,
    /// A setting of a [`KvPool`] that only a new pool takes, asked of a pool that already
    /// has another handle (a sequence or a clone).
    #[error("a KV pool's {what} is set before the pool is shared")]
    PoolShared {
        /// The setting.
        what: &'static str,
    },
    /// A [`PagedKv`] append needing blocks its pool's byte budget cannot give, even
    /// after evicting every idle cached block (none is evicted then).
    #[error(
        "KV pool full: {needed} more bytes of blocks needed, {used} of the {budget}-byte budget in use"
    )]
    PoolFull {
        /// Bytes of the blocks asked for.
        needed: usize,
        /// Bytes of blocks alive.
        used: usize,
        /// The pool's budget.
        budget: usize,
    },
    /// [`PagedKv::publish`] with token ids that are not one per position held.
    #[error("{ids} token ids given for a sequence of {len} positions")]
    TokenCount {
        /// Ids given.
        ids: usize,
        /// Positions held.
        len: usize,
    },
    /// An optional capability the store does not have (a `Box<dyn KvStore>` whose store
    /// has no [`KvStore::restorer`]).
    #[error("this KV store does not support {operation}")]
    Unsupported {
        /// What was asked.
        operation: &'static str,
    },
    /// A segment whose positions run past `usize::MAX`.
    #[error("a segment of {len} slots at position {start} overflows")]
    PositionOverflow {
        /// The first position.
        start: usize,
        /// Slots.
        len: usize,
    },
}

/// A policy consulted before a store allocates a buffer: it may refuse, and the store's
/// call then fails with [`KvError::AllocFailed`] and changes nothing.
///
/// Stores allocate only when they grow, when an append that replaces committed rows saves
/// them for its rollback, and when they fork. The default (no gate) admits every request,
/// which the system allocator may still refuse.
pub trait AllocGate: Send + Sync + fmt::Debug {
    /// Whether a buffer of `bytes` bytes may be allocated now.
    fn admit(&self, bytes: usize) -> bool;
}

/// A per-layer store of the K and V rows of positions `0 .. len`.
///
/// See the [module docs](self) for the contract: views for reads, transactional appends
/// for writes, sequence operations on committed state. Every method that takes outside
/// input returns a `Result`; no method panics on any input.
///
/// What every store does: its shape and sizes, views, the append transaction and the
/// sequence operations, each with the errors of the contract. Optional capabilities are
/// extension traits reached through this one ([`KvRestore`], via
/// [`restorer`](KvStore::restorer)). A store written outside kvcore is checked against
/// the contract by `kvcore-test-support`'s `kv_store_suite!`.
///
/// Object safe: `Box<dyn KvStore>` is itself a store (its [`fork`](KvStore::fork) goes
/// through [`fork_boxed`](KvStore::fork_boxed)).
pub trait KvStore: Send {
    /// Layers, KV heads and head size.
    fn geometry(&self) -> KvGeometry;

    /// Element types of the K rows and of the V rows.
    fn kv_types(&self) -> (KvType, KvType);

    /// Hard ceiling on positions.
    fn max_ctx(&self) -> usize;

    /// Positions held (committed): `0 .. len`.
    fn len(&self) -> usize;

    /// Whether no position is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions per layer the store can hold without allocating.
    fn capacity(&self) -> usize;

    /// True resident footprint of the store's buffers in bytes (during an append that
    /// grew the store, the old buffers kept for a rollback included).
    fn bytes(&self) -> usize;

    /// Layer `layer` as attention reads it: the committed positions `0 .. len`, or, once
    /// the open append has written this layer, `0 .. at + n` with the pending rows.
    ///
    /// Errors with [`KvError::NoSuchLayer`].
    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError>;

    /// Opens an append of `n` positions at `at ..` (`at ≤ len`; `at < len` replaces
    /// positions `at ..` when committed), making room for them.
    ///
    /// Errors, changing nothing: [`KvError::AppendOpen`], [`KvError::StartPastEnd`] when
    /// `at > len`, [`KvError::ContextOverflow`] when `at + n > max_ctx`,
    /// [`KvError::AllocFailed`] when room cannot be made.
    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError>;

    /// Writes the open append's rows of layer `layer`: `k`, `v`: `[n, kv_dim]`, row `t`
    /// at position `at + t`. Writing a layer again replaces its pending rows.
    ///
    /// Errors, changing nothing: [`KvError::NoAppend`], [`KvError::NoSuchLayer`],
    /// [`KvError::RowShape`].
    fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError>;

    /// Makes the open append visible: the store then holds positions `0 .. at + n`.
    ///
    /// Errors, leaving the append open: [`KvError::NoAppend`], and
    /// [`KvError::Incomplete`] when `n > 0` and a layer was not written.
    fn commit(&mut self) -> Result<(), KvError>;

    /// Discards the open append (if any), restoring the store exactly as it was before
    /// [`begin`](KvStore::begin).
    fn rollback(&mut self);

    /// Keeps positions `0 .. min(n, len)` and drops the rest; capacity is kept (a
    /// [`PagedKv`] gives the blocks past `n` back to its pool). Discards an open append
    /// first.
    ///
    /// Errors with [`KvError::BehindWindow`], changing nothing (an open append stays
    /// open), when `0 < n < len` and the store can no longer hold what a query at `n`
    /// sees ([`can_rewind_to`](KvStore::can_rewind_to) is false). `truncate(0)` and
    /// `truncate(n ≥ len)` always succeed.
    fn truncate(&mut self, n: usize) -> Result<(), KvError>;

    /// The codecs of the K rows and of the V rows ([`KvCodec`]: the element types and
    /// any calibration, which state files record). The default: the
    /// [`kv_types`](KvStore::kv_types) without calibration.
    fn codecs(&self) -> (KvCodec, KvCodec) {
        let (k, v) = self.kv_types();
        (KvCodec::new(k), KvCodec::new(v))
    }

    /// Drops every position; capacity is kept. Discards an open append first.
    fn clear(&mut self) {
        // `truncate(0)` cannot fail (see its contract).
        let _ = self.truncate(0);
    }

    /// Whether the store can go back to holding positions `0 .. n` and serve a query at
    /// `n`: the condition of [`truncate`](KvStore::truncate)`(n)` and of
    /// [`begin`](KvStore::begin)`(n, ..)` for `n ≤ len`. True for every `n ≤ len` in a
    /// store that keeps every position (the default); a sliding-window store
    /// ([`WindowKv`]) answers false once the positions a query at `n` sees are evicted.
    /// False for `n > len`.
    fn can_rewind_to(&self, n: usize) -> bool {
        n <= self.len()
    }

    /// The sliding window of layer `layer`: `Some(w)` when the layer keeps only the
    /// last `w` positions (a query at `p` then sees `p − w < k ≤ p`), `None` when it
    /// keeps every position (the default) or `layer` is out of range.
    fn window(&self, _layer: usize) -> Option<usize> {
        None
    }

    /// A new store of the same kind holding the same positions, element types, ceiling
    /// and capacity (a copy).
    ///
    /// Errors: [`KvError::AppendOpen`], [`KvError::AllocFailed`].
    fn fork(&self) -> Result<Self, KvError>
    where
        Self: Sized;

    /// [`fork`](KvStore::fork), boxed: the form a trait object can call.
    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError>;

    /// This store as a [`KvRestore`] (it can load state files), or `None`, the default.
    /// A store that implements [`KvRestore`] returns `Some(self)`, which is how a
    /// `Box<dyn KvStore>` reaches it.
    fn restorer(&mut self) -> Option<&mut dyn KvRestore> {
        None
    }
}

/// The restore plumbing of state files: an extension of [`KvStore`] for stores that can
/// take rows already in their element types. Every store of this module implements it.
pub trait KvRestore: KvStore {
    /// [`write`](KvStore::write) with rows already in the store's element types (a state
    /// file's, or another store's view): `k`, `v`: `[n, n_kv_heads, head_dim]`, stored as
    /// they are, without encoding again.
    ///
    /// Errors, changing nothing: as [`write`](KvStore::write), and [`KvError::RowType`]
    /// when a type is not the store's.
    fn write_stored(&mut self, layer: usize, k: KvRows<'_>, v: KvRows<'_>) -> Result<(), KvError>;

    /// Opens an append that will replace every position by `0 .. n` (a state file being
    /// loaded), in which layer `l`'s rows are only those of positions `start .. n` for a
    /// `start` in [`restore_starts`]`(window(l), n)`: `[n − start, kv_dim]`. The default,
    /// for stores that keep every position, is [`begin`](KvStore::begin)`(0, n)`.
    /// Committed and rolled back like any append; a window layer then holds exactly the
    /// rows given.
    ///
    /// Errors as [`begin`](KvStore::begin).
    fn begin_restore(&mut self, n: usize) -> Result<(), KvError> {
        self.begin(0, n)
    }
}

/// The first positions a restore of `n` positions may give a layer of sliding window
/// `window` ([`KvStore::window`]), `first ..= last` (rows `start .. n` for a `start` in
/// that range): `0 ..= 0` (every position) for a layer that keeps them all; for a window
/// of `w`, from `n − min(n, w)` (the last `w` positions, what a ring retains after an
/// append) to `n + 1 − w` (the `w − 1` positions a query at `n` sees, what remains after
/// the last position was truncated).
pub fn restore_starts(window: Option<usize>, n: usize) -> RangeInclusive<usize> {
    match window {
        None => 0..=0,
        Some(w) => {
            let first = n - n.min(w);
            first..=(n + 1).saturating_sub(w).max(first)
        }
    }
}

impl KvStore for Box<dyn KvStore> {
    fn geometry(&self) -> KvGeometry {
        (**self).geometry()
    }
    fn kv_types(&self) -> (KvType, KvType) {
        (**self).kv_types()
    }
    fn max_ctx(&self) -> usize {
        (**self).max_ctx()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
    fn bytes(&self) -> usize {
        (**self).bytes()
    }
    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        (**self).view(layer)
    }
    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        (**self).begin(at, n)
    }
    fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        (**self).write(layer, k, v)
    }
    fn codecs(&self) -> (KvCodec, KvCodec) {
        (**self).codecs()
    }
    fn commit(&mut self) -> Result<(), KvError> {
        (**self).commit()
    }
    fn rollback(&mut self) {
        (**self).rollback()
    }
    fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        (**self).truncate(n)
    }
    fn clear(&mut self) {
        (**self).clear()
    }
    fn can_rewind_to(&self, n: usize) -> bool {
        (**self).can_rewind_to(n)
    }
    fn window(&self, layer: usize) -> Option<usize> {
        (**self).window(layer)
    }
    fn fork(&self) -> Result<Self, KvError> {
        (**self).fork_boxed()
    }
    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
        (**self).fork_boxed()
    }
    fn restorer(&mut self) -> Option<&mut dyn KvRestore> {
        (**self).restorer()
    }
}

/// A boxed store restores through its [`restorer`](KvStore::restorer):
/// [`KvError::Unsupported`] when it has none.
impl KvRestore for Box<dyn KvStore> {
    fn write_stored(&mut self, layer: usize, k: KvRows<'_>, v: KvRows<'_>) -> Result<(), KvError> {
        restorer(self)?.write_stored(layer, k, v)
    }
    fn begin_restore(&mut self, n: usize) -> Result<(), KvError> {
        restorer(self)?.begin_restore(n)
    }
}

fn restorer(kv: &mut Box<dyn KvStore>) -> Result<&mut dyn KvRestore, KvError> {
    kv.restorer().ok_or(KvError::Unsupported {
        operation: "restoring a state file",
    })
}

/// An open append on a store: writes, views for the pass's own attention, and a commit.
/// Dropped without [`commit`](Append::commit) (a pass that returned early with an error),
/// it rolls the store back.
pub struct Append<'s, K: KvStore + ?Sized> {
    kv: &'s mut K,
    open: bool,
}

impl<'s, K: KvStore + ?Sized> Append<'s, K> {
    /// Opens an append of `n` positions at `at` on `kv` ([`KvStore::begin`]).
    pub fn begin(kv: &'s mut K, at: usize, n: usize) -> Result<Self, KvError> {
        kv.begin(at, n)?;
        Ok(Append { kv, open: true })
    }

    /// [`KvStore::window`] of the store.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.kv.window(layer)
    }

    /// [`KvStore::write`].
    pub fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        self.kv.write(layer, k, v)
    }

    /// [`KvStore::view`], including this append's rows of the layers written so far.
    pub fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        self.kv.view(layer)
    }

    /// [`KvStore::commit`]; on error the append is rolled back.
    pub fn commit(mut self) -> Result<(), KvError> {
        let result = self.kv.commit();
        self.open = result.is_err();
        result
    }
}

impl<'s, K: KvRestore + ?Sized> Append<'s, K> {
    /// Opens a restore of `n` positions on `kv` ([`KvRestore::begin_restore`]).
    pub fn begin_restore(kv: &'s mut K, n: usize) -> Result<Self, KvError> {
        kv.begin_restore(n)?;
        Ok(Append { kv, open: true })
    }

    /// [`KvRestore::write_stored`].
    pub fn write_stored(
        &mut self,
        layer: usize,
        k: KvRows<'_>,
        v: KvRows<'_>,
    ) -> Result<(), KvError> {
        self.kv.write_stored(layer, k, v)
    }
}

impl<K: KvStore + ?Sized> Drop for Append<'_, K> {
    fn drop(&mut self) {
        if self.open {
            self.kv.rollback();
        }
    }
}

impl<K: KvStore + ?Sized> fmt::Debug for Append<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Append")
            .field("len", &self.kv.len())
            .field("open", &self.open)
            .finish()
    }
}

/// The checks every store's [`KvStore::begin`] makes, in this order, so all stores fail
/// the same calls with the same errors: no append open ([`KvError::AppendOpen`]),
/// `at ≤ len` ([`KvError::StartPastEnd`]), `at + n ≤ max_ctx`
/// ([`KvError::ContextOverflow`] naming the highest position needed). Returns `at + n`.
pub(crate) fn check_begin(
    open: bool,
    len: usize,
    max_ctx: usize,
    at: usize,
    n: usize,
) -> Result<usize, KvError> {
    if open {
        return Err(KvError::AppendOpen);
    }
    if at > len {
        return Err(KvError::StartPastEnd { at, len });
    }
    at.checked_add(n)
        .filter(|&end| end <= max_ctx)
        .ok_or_else(|| KvError::ContextOverflow {
            // n ≥ 1 here: with n = 0, end = at ≤ len ≤ max_ctx.
            pos: at.saturating_add(n - 1),
            max_ctx,
        })
}

/// The check every store's [`KvStore::commit`] makes: an append of `n > 0` positions
/// whose layer `l` was not written (`written[l]` false) is [`KvError::Incomplete`]
/// naming the first such layer.
pub(crate) fn check_complete(n: usize, written: &[bool]) -> Result<(), KvError> {
    match written.iter().position(|w| !w) {
        Some(layer) if n > 0 => Err(KvError::Incomplete { layer }),
        _ => Ok(()),
    }
}

/// The shape check of [`KvStore::write`]: `k` and `v` are `[n, kv_dim]`
/// ([`KvError::RowShape`], keys first).
pub(crate) fn check_rows(
    n: usize,
    kv_dim: usize,
    k: &ArrayView2<'_, f32>,
    v: &ArrayView2<'_, f32>,
) -> Result<(), KvError> {
    for (what, dim) in [("append keys", k.dim()), ("append values", v.dim())] {
        if dim != (n, kv_dim) {
            return Err(KvError::RowShape {
                what,
                expected: (n, kv_dim),
                found: dim,
            });
        }
    }
    Ok(())
}

/// The checks of [`KvRestore::write_stored`]: `k` and `v` are `[n, n_kv_heads, head_dim]`
/// ([`KvError::RowShape`]) of the store's types `types` ([`KvError::RowType`]), keys
/// first.
pub(crate) fn check_stored(
    n: usize,
    geometry: &KvGeometry,
    types: (KvType, KvType),
    k: &KvRows<'_>,
    v: &KvRows<'_>,
) -> Result<(), KvError> {
    check_stored_rows("stored keys", n, geometry, types.0, k)?;
    check_stored_rows("stored values", n, geometry, types.1, v)
}

fn check_stored_rows(
    what: &'static str,
    n: usize,
    geometry: &KvGeometry,
    ty: KvType,
    rows: &KvRows<'_>,
) -> Result<(), KvError> {
    if rows.kv_type() != ty {
        return Err(KvError::RowType {
            what,
            expected: ty,
            found: rows.kv_type(),
        });
    }
    let (r, h, d) = rows.dim();
    if (r, h, d) != (n, geometry.n_kv_heads, geometry.head_dim) {
        return Err(KvError::RowShape {
            what,
            expected: (n, geometry.kv_dim()),
            found: (r, h.saturating_mul(d)),
        });
    }
    Ok(())
}

/// The gate a store consults, shared by its forks.
pub(crate) type Gate = Option<Arc<dyn AllocGate>>;
