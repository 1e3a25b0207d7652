//! Window checkpoints: snapshots of a [`WindowKv`](super::WindowKv)'s rings that let it
//! go back behind its windows (llama.cpp's context checkpoints, `--ctx-checkpoints`).
//!
//! A ring cannot bring back what it evicted, so a rewind to a position `p` whose queries
//! see evicted positions is refused ([`KvError::BehindWindow`](super::KvError)). A
//! checkpoint at `p` holds, for every window layer of window `w`, the rows of the
//! positions a query at `p` sees besides itself, `p + 1 − w .. p` (at most `w − 1` rows):
//! what the ring needs to be rebuilt as it was holding `0 .. p`. Global layers keep
//! every position and truncate normally, so they need no snapshot. With a checkpoint at
//! `p` the store can rewind to `p` (a truncation, or an append starting there, as a
//! session re-prefilling from the nearest checkpoint before a divergence does); the
//! rows are those the store held, so every later pass computes what it would have
//! computed on a store that never evicted them.
//!
//! ## When checkpoints are taken, and how many are kept
//! [`Checkpoints`]: one at every multiple of `every` positions that an append commits
//! (at most the last `count` of one append), taken in the commit from the ring and the
//! append's staged rows, so where passes begin and end does not matter and nothing is
//! recomputed. The store keeps the latest `count`; a checkpoint past a truncation or
//! past the start of an append that replaces the tail holds rows of a discarded
//! history and is dropped. Their buffers are allocated in the append's `begin`, after
//! everything the append itself needs, through the store's gate; a checkpoint whose
//! buffers are refused is not taken (the append goes on: a checkpoint saves work, it is
//! never needed for a result). A restore of a state file takes none.
//!
//! ## Memory
//! A checkpoint costs `Σ_window min(p, w − 1)` rows of K and of V: for Gemma 3 270M
//! (15 window layers of 512, rows of 256 values) 15 × 511 row pairs, 15.0 MiB in f32,
//! about one set of rings. [`KvStore::bytes`](super::KvStore::bytes) counts them.

use std::num::NonZeroUsize;

use super::elem::Buf;
use super::{Gate, KvError, KvType};

/// How many window checkpoints a [`WindowKv`](super::WindowKv) keeps, and how far apart
/// they are.
///
/// A checkpoint at `p` holds every window layer's rows of the positions a query at `p`
/// sees besides itself (at most `w − 1` per layer), taken when an append commits
/// position `p` (from the ring and the append's own rows, wherever passes begin and
/// end); with it the store can rewind to `p` behind its windows, and a session
/// re-prefills from there. The latest `count` are kept, their bytes counted in the
/// store's; one past a truncation or a replaced tail is dropped; one whose buffers are
/// refused is not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Checkpoints {
    /// One checkpoint at every multiple of `every` positions.
    pub every: NonZeroUsize,
    /// The most kept (the latest ones); 0 keeps none.
    pub count: usize,
}

impl Checkpoints {
    /// The default spacing, 512 positions: a rewind behind the window re-prefills at
    /// most 511 positions before the divergence (`examples/window_rewind.rs` measures it
    /// against the spacings around it).
    pub const DEFAULT_EVERY: NonZeroUsize = NonZeroUsize::new(512).expect("512 > 0");

    /// The default count, llama.cpp's (`--ctx-checkpoints 8`): with the default spacing
    /// the last 4096 positions can be rewound to.
    pub const DEFAULT_COUNT: usize = 8;

    /// The default: [`DEFAULT_COUNT`](Self::DEFAULT_COUNT) checkpoints every
    /// [`DEFAULT_EVERY`](Self::DEFAULT_EVERY) positions.
    pub const DEFAULT: Checkpoints = Checkpoints {
        every: Self::DEFAULT_EVERY,
        count: Self::DEFAULT_COUNT,
    };

    /// None: the store refuses every rewind behind its windows. A new store's setting.
    pub const NONE: Checkpoints = Checkpoints {
        every: Self::DEFAULT_EVERY,
        count: 0,
    };

    /// The positions an append of `at .. end` takes checkpoints at: the multiples of
    /// `every` in `at + 1 ..= end`, the last `count` of them, ascending.
    pub(super) fn due(&self, at: usize, end: usize) -> impl Iterator<Item = usize> + use<> {
        let e = self.every.get();
        let (first, last) = (at / e + 1, end / e);
        let skip = (last + 1).saturating_sub(first).saturating_sub(self.count);
        (first + skip..=last).map(move |k| k * e)
    }
}

impl Default for Checkpoints {
    /// [`Checkpoints::DEFAULT`].
    fn default() -> Self {
        Checkpoints::DEFAULT
    }
}

/// One checkpoint: every window layer's rows as they were when the store held `0 .. pos`.
pub(super) struct Snapshot {
    /// The position it rewinds to.
    pub(super) pos: usize,
    /// `[rings]`, in the store's ring order.
    pub(super) rings: Vec<RingRows>,
}

/// A window layer's rows of positions `first .. pos` (`first = pos + 1 − w`, saturating),
/// row `q − first` holding position `q`.
pub(super) struct RingRows {
    pub(super) first: usize,
    /// `[pos − first]` rows of K's type.
    pub(super) k: Buf,
    /// `[pos − first]` rows of V's type.
    pub(super) v: Buf,
}

impl Snapshot {
    /// Empty buffers for a checkpoint at `pos` of rings of `windows`, allocated through
    /// `gate`.
    pub(super) fn alloc(
        pos: usize,
        windows: impl Iterator<Item = usize>,
        types: (KvType, KvType),
        kv_dim: usize,
        gate: &Gate,
    ) -> Result<Snapshot, KvError> {
        let rings = windows
            .map(|w| {
                let first = (pos + 1).saturating_sub(w);
                let rows = pos - first;
                Ok(RingRows {
                    first,
                    k: Buf::zeroed(types.0, kv_dim, rows, gate)?,
                    v: Buf::zeroed(types.1, kv_dim, rows, gate)?,
                })
            })
            .collect::<Result<_, KvError>>()?;
        Ok(Snapshot { pos, rings })
    }

    /// A copy, allocated through `gate`.
    pub(super) fn copy(
        &self,
        types: (KvType, KvType),
        kv_dim: usize,
        gate: &Gate,
    ) -> Result<Snapshot, KvError> {
        let rings = self
            .rings
            .iter()
            .map(|r| {
                let rows = r.k.rows();
                let mut k = Buf::zeroed(types.0, kv_dim, rows, gate)?;
                let mut v = Buf::zeroed(types.1, kv_dim, rows, gate)?;
                k.copy_rows(0, &r.k, 0, rows);
                v.copy_rows(0, &r.v, 0, rows);
                Ok(RingRows { k, v, ..*r })
            })
            .collect::<Result<_, KvError>>()?;
        Ok(Snapshot {
            pos: self.pos,
            rings,
        })
    }

    pub(super) fn bytes(&self) -> usize {
        self.rings.iter().map(|r| r.k.bytes() + r.v.bytes()).sum()
    }
}

/// A store's checkpoints: its setting and the snapshots it keeps, ascending by position.
pub(super) struct Kept {
    pub(super) setting: Checkpoints,
    pub(super) snaps: Vec<Snapshot>,
}

impl Kept {
    pub(super) fn new(setting: Checkpoints) -> Self {
        Kept {
            setting,
            snaps: Vec::new(),
        }
    }

    /// The snapshot at `pos`, if one is kept.
    pub(super) fn at(&self, pos: usize) -> Option<&Snapshot> {
        let i = self.snaps.binary_search_by_key(&pos, |s| s.pos).ok()?;
        Some(&self.snaps[i])
    }

    pub(super) fn bytes(&self) -> usize {
        self.snaps.iter().map(Snapshot::bytes).sum()
    }

    /// Drops the snapshots past `pos` (their rows are of a discarded history).
    pub(super) fn drop_after(&mut self, pos: usize) {
        self.snaps.retain(|s| s.pos <= pos);
    }

    /// Adds `new` (ascending, every one past those kept) and keeps the latest `count`.
    pub(super) fn push(&mut self, new: Vec<Snapshot>) {
        self.snaps.extend(new);
        self.trim();
    }

    /// Keeps the latest `count`.
    pub(super) fn trim(&mut self) {
        let surplus = self.snaps.len().saturating_sub(self.setting.count);
        self.snaps.drain(..surplus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(e: usize, count: usize) -> Checkpoints {
        Checkpoints {
            every: NonZeroUsize::new(e).unwrap(),
            count,
        }
    }

    #[test]
    fn due_positions_are_the_last_multiples_within_the_append() {
        let due = |c: Checkpoints, at, end| c.due(at, end).collect::<Vec<_>>();
        assert_eq!(due(every(4, 8), 0, 13), [4, 8, 12]);
        assert_eq!(due(every(4, 8), 4, 8), [8], "`at` itself is not due");
        assert_eq!(due(every(4, 8), 5, 7), [0usize; 0]);
        assert_eq!(due(every(4, 2), 0, 20), [16, 20]);
        assert_eq!(due(every(4, 0), 0, 20), [0usize; 0]);
        assert_eq!(due(every(512, 8), 6000, 6144), [6144]);
        assert_eq!(due(every(1, 3), 10, 10), [0usize; 0], "an empty append");
    }
}
