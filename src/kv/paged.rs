//! [`KvPool`] and [`PagedKv`]: many sequences' K and V rows in fixed-size blocks of
//! positions from one pool, with a block table per sequence, blocks shared between
//! sequences (forks, and a prefix cache that finds full blocks again by their tokens)
//! and copy-on-write.
//!
//! ## Blocks
//! A block holds `block_len` consecutive positions of every layer: K and V typed row
//! buffers (`elem.rs`) of `[n_layers][block_len]` rows, row `layer · block_len + offset`.
//! Block `j` of a sequence holds its positions `j · block_len .. (j + 1) · block_len`, so
//! a layer's view is one segment per block, in table order (positions ascending), and
//! attention over it is bitwise attention over a [`DenseKv`](super::DenseKv) holding the
//! same rows (the seam's promise: reductions run in position order whatever the layout).
//!
//! A block is an `Arc`: a sequence's table holds one reference per block, the prefix
//! cache one more for each block it knows. A block is **written only while one table
//! holds the only reference** (`Arc::get_mut`); a block that is shared is never written
//! again, and an append into it writes a copy.
//!
//! ## Appends (the store's transaction)
//! [`begin`](super::KvStore::begin)`(at, n)` looks at every block the positions `at ..
//! at + n` fall in:
//! - a block the sequence does not have yet gets a new one;
//! - a block the sequence holds alone, none of whose committed positions are replaced
//!   (every position written is `≥ len`), is written **in place**: no reader can see
//!   those slots, so the rollback has nothing to undo;
//! - any other block — shared with a fork or with the cache, or holding committed rows
//!   the append replaces — gets a new block (its rows before `at` copied, every layer),
//!   which replaces the old one in the table at the commit. Until then readers of the
//!   committed state see the old block.
//!
//! Every block is allocated in `begin` (so a refused allocation changes nothing and a
//! commit cannot fail for memory); a rollback drops the new blocks, which gives their
//! bytes back to the pool. The commit swaps the new blocks into the table and drops the
//! table's references past the new end.
//!
//! ## The pool
//! A [`KvPool`] (a cheap `Clone` of one shared pool; `Send + Sync`) fixes the geometry,
//! the element types, the block length and a **byte budget**: the bytes of every block
//! alive, in any table or in the cache, never exceed it. A sequence asking for a block
//! beyond it first evicts cached blocks no table holds, least recently used first; when
//! that is not enough its `begin` fails with [`KvError::PoolFull`] and nothing changes
//! (no block is evicted for an append that cannot get all it needs). Neighbours are never
//! touched: their blocks are theirs.
//!
//! ## The prefix cache
//! Rows are a function of the tokens before them (for one model, backend and activation
//! choice: the pool's user keeps one pool per model). A sequence whose committed
//! positions are the tokens `ids` [`publish`](PagedKv::publish)es its full blocks: block
//! `j` is keyed by the chained hash `h_j = SHA-256(key ‖ h_{j−1} ‖ ids of block j as
//! little-endian u32)` (`h_{−1}` = 32 zero bytes), so a key names the whole prefix up to
//! the end of its block. [`KvPool::lookup`] walks the chain of a new prompt and returns a
//! sequence holding the longest run of cached blocks (shared, no copy); its caller runs
//! the rest of the prompt. The `key` is the pool's secret (32 random bytes from the
//! embedder; `kvcore-engine` draws them from the OS): with a predictable or collidable
//! hash one tenant's prompt could be answered from another's cache (vLLM's
//! GHSA-rm76-4mrf-v9r8), with a secret-keyed SHA-256 of fixed-length input nobody can aim
//! a collision.
//!
//! Cached blocks no table holds are evicted least recently used first (a lookup or a
//! publish refreshes every block of the chain it touches, the deepest oldest, so a
//! chain's tail goes before its head). [`KvPool::stats`] counts blocks alive, cached and
//! shared, bytes, lookups and the hit rate.
//!
//! ## Why blocks of 64 positions by default
//! Measured (`cargo bench --bench kernels -- attention_paged`): one decode step's
//! attention over 4096 cached positions, whose view is one segment per block, costs
//! clearly more than a single segment's with blocks of 16 or 32, a little more with 64
//! and the same from 128 up. Blocks of 64 keep that cost small while sharing prefixes at a
//! finer grain and wasting half what 128 would in each sequence's last, partial block
//! (SmolLM2 f32: 2.9 MB at most per sequence).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ndarray::{ArrayView2, Axis, Slice};
use sha2::{Digest, Sha256};

use super::elem::Buf;
use super::rows::checked_size;
use super::tier::{self, KvTier, TierKey, TierRecord, TierStats};
use super::{
    AllocGate, Gate, KeyOffsets, KvCodec, KvError, KvGeometry, KvRestore, KvRows, KvSegment,
    KvStore, KvType, KvView, check_begin, check_complete, check_rows, check_stored,
};

/// A chained block hash (see the header of `src/kv/paged.rs`).
pub type BlockHash = [u8; 32];

/// The settings of a [`KvPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Positions per block (≥ 1).
    pub block_len: usize,
    /// Most bytes of blocks alive at once.
    pub budget: usize,
    /// The secret the prefix cache's hashes are keyed with: 32 random bytes.
    pub key: [u8; 32],
}

impl PoolConfig {
    /// Positions per block by default (see the header of `src/kv/paged.rs`).
    pub const DEFAULT_BLOCK_LEN: usize = 64;
}

/// Counters of a pool, as [`KvPool::stats`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks alive (in some table or in the cache).
    pub blocks: usize,
    /// Bytes of the blocks alive.
    pub bytes: usize,
    /// The budget.
    pub budget: usize,
    /// Bytes of one block.
    pub block_bytes: usize,
    /// Blocks in the prefix cache.
    pub cached: usize,
    /// Cached blocks no table holds (evictable).
    pub cached_idle: usize,
    /// Blocks evicted from the cache since the pool was made.
    pub evicted: u64,
    /// Calls of [`KvPool::lookup`].
    pub lookups: u64,
    /// Full blocks lookups asked for.
    pub blocks_queried: u64,
    /// Of those, blocks found in the cache.
    pub blocks_hit: u64,
    /// Blocks past the cache's run found in the tier (loaded, and cached again).
    pub tier_hits: u64,
    /// Lookups whose chain went on past the cache and the tier did not have its next
    /// block.
    pub tier_misses: u64,
    /// Records the tier gave that were not whole, checksummed records of their key:
    /// skipped and removed from the tier.
    pub tier_rejected: u64,
    /// The tier's own counters, with a tier.
    pub tier: Option<TierStats>,
}

impl PoolStats {
    /// `blocks_hit / blocks_queried` (0 before any query).
    pub fn hit_rate(&self) -> f64 {
        if self.blocks_queried == 0 {
            0.0
        } else {
            self.blocks_hit as f64 / self.blocks_queried as f64
        }
    }
}

/// Bytes and blocks alive, shared by the pool and every block (a block gives its bytes
/// back when its last reference drops). Kept apart from the cache so that a block can be
/// dropped while the cache's lock is held.
#[derive(Debug, Default)]
struct Account {
    used: AtomicUsize,
    blocks: AtomicUsize,
    next_id: AtomicU64,
}

/// One block of positions: `[n_layers][block_len]` K rows and V rows.
pub(super) struct Block {
    id: u64,
    k: Buf,
    v: Buf,
    account: Arc<Account>,
}

impl Block {
    fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }

    /// Its `rows` K rows then V rows in the state file's little-endian layout (a tier
    /// record's payload, `tier.rs`).
    pub(super) fn bytes_le(
        &self,
        rows: usize,
        n_kv_heads: usize,
        codecs: &(KvCodec, KvCodec),
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes());
        for (buf, codec) in [(&self.k, &codecs.0), (&self.v, &codecs.1)] {
            let view = buf.view(0, rows, n_kv_heads);
            let done = codec.write_le(view, &mut out, usize::MAX, |_| Ok::<(), Infallible>(()));
            let Ok(()) = done;
        }
        out
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.account.used.fetch_sub(self.bytes(), Ordering::Relaxed);
        self.account.blocks.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Entry {
    block: Arc<Block>,
    tick: u64,
}

/// The prefix cache: blocks by chained hash, and their last use for LRU eviction.
#[derive(Default)]
struct Cache {
    map: HashMap<BlockHash, Entry>,
    /// tick → hash, oldest first.
    lru: BTreeMap<u64, BlockHash>,
    tick: u64,
    evicted: u64,
    lookups: u64,
    queried: u64,
    hit: u64,
    tier_hits: u64,
    tier_misses: u64,
    tier_rejected: u64,
}

impl Cache {
    fn touch(&mut self, hash: &BlockHash) {
        if let Some(e) = self.map.get_mut(hash) {
            self.lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            self.lru.insert(e.tick, *hash);
        }
    }

    /// Bytes of cached blocks only the cache holds.
    fn idle_bytes(&self) -> usize {
        self.map
            .values()
            .filter(|e| Arc::strong_count(&e.block) == 1)
            .map(|e| e.block.bytes())
            .sum()
    }

    /// Evicts the least recently used idle block; false when none is idle.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .lru
            .iter()
            .find(|(_, h)| Arc::strong_count(&self.map[*h].block) == 1)
            .map(|(&t, &h)| (t, h));
        match victim {
            Some((tick, hash)) => {
                self.lru.remove(&tick);
                // Dropping the block gives its bytes back (`Block::drop`, atomics only).
                self.map.remove(&hash);
                self.evicted += 1;
                true
            }
            None => false,
        }
    }
}

struct Shared {
    geometry: KvGeometry,
    kv_dim: usize,
    types: (KvType, KvType),
    block_len: usize,
    block_bytes: usize,
    budget: AtomicUsize,
    key: [u8; 32],
    account: Arc<Account>,
    cache: Mutex<Cache>,
    gate: Mutex<Gate>,
    /// The codecs of every sequence's K and V rows (`kv/codec.rs`).
    codecs: (KvCodec, KvCodec),
    tier: Option<TierLink>,
}

/// A pool's tier and what its records' keys start with.
struct TierLink {
    tier: Arc<dyn KvTier>,
    namespace: Vec<u8>,
    /// SHA-256 of the namespace and everything of the pool's rows depend on (see
    /// `tier.rs`), remade whenever the key codec changes.
    identity: [u8; 32],
}

impl Shared {
    /// The identity records are keyed by (see the header of `tier.rs`).
    fn identity(&self, namespace: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"kvcore kv tier v1");
        h.update((namespace.len() as u64).to_le_bytes());
        h.update(namespace);
        h.update([self.types.0.code(), self.types.1.code()]);
        let g = self.geometry;
        for n in [g.n_layers, g.n_kv_heads, g.head_dim, self.block_len] {
            h.update((n as u64).to_le_bytes());
        }
        let calibration = self.codecs.0.calibration();
        h.update((calibration.len() as u64).to_le_bytes());
        for x in calibration {
            h.update(x.to_le_bytes());
        }
        h.finalize().into()
    }

    fn tier_key(link: &TierLink, hash: &BlockHash) -> TierKey {
        let mut h = Sha256::new();
        h.update(link.identity);
        h.update(hash);
        h.finalize().into()
    }

    /// Bytes of a record's payload: every layer's K rows and V rows of one block.
    fn payload_len(&self) -> usize {
        let rows = self.geometry.n_layers * self.block_len;
        let row = |t: KvType| t.row_bytes(self.kv_dim).expect("checked by KvPool::new");
        (row(self.types.0) + row(self.types.1)) * rows
    }
}

/// A pool of KV blocks that many [`PagedKv`] sequences draw from, with a prefix cache
/// (the design is in the header of `src/kv/paged.rs`). Cloning gives another handle to
/// the same pool.
#[derive(Clone)]
pub struct KvPool {
    shared: Arc<Shared>,
}

impl KvPool {
    /// An empty pool for stores of `geometry` with K and V rows of `types`.
    ///
    /// # Errors
    /// [`KvError::ZeroBlockLen`] for `block_len == 0`, [`KvError::BlockShape`] when a
    /// type's blocks do not divide the head size, [`KvError::TooLarge`] when one block
    /// overflows memory's size.
    pub fn new(
        geometry: KvGeometry,
        types: (KvType, KvType),
        config: PoolConfig,
    ) -> Result<KvPool, KvError> {
        if config.block_len == 0 {
            return Err(KvError::ZeroBlockLen);
        }
        let kv_dim = checked_size(&geometry, config.block_len, types)?;
        // checked_size bounded 8 · kv_dim · block_len · n_layers, the f32 size; the
        // types' rows are at most that.
        let row = |t: KvType| {
            t.row_bytes(kv_dim)
                .expect("checked_size checked the blocks")
        };
        let block_bytes = (row(types.0) + row(types.1)) * config.block_len * geometry.n_layers;
        Ok(KvPool {
            shared: Arc::new(Shared {
                geometry,
                kv_dim,
                types,
                block_len: config.block_len,
                block_bytes,
                budget: AtomicUsize::new(config.budget),
                key: config.key,
                account: Arc::default(),
                cache: Mutex::default(),
                gate: Mutex::default(),
                codecs: (KvCodec::new(types.0), KvCodec::new(types.1)),
                tier: None,
            }),
        })
    }

    /// The same new pool encoding every sequence's keys through `codec` (a model's
    /// comes from [`Llama::key_codec`](crate::model::Llama::key_codec)); with a
    /// calibration, its sequences' `max_ctx` is at most the positions it covers.
    ///
    /// # Errors
    /// [`KvError::RowType`] when the codec's type is not the keys';
    /// [`KvError::Calibration`] when the pool has another handle already (a sequence or
    /// a clone) and another codec, or the calibration's geometry is not the pool's.
    pub fn with_key_codec(mut self, codec: &KvCodec) -> Result<KvPool, KvError> {
        if *codec == self.shared.codecs.0 {
            return Ok(self);
        }
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return Err(KvError::Calibration {
                reason: "a key codec is set on a new pool",
            });
        };
        codec.check_store(shared.geometry, 0, shared.types.0)?;
        shared.codecs.0 = codec.clone();
        if let Some(link) = &shared.tier {
            let identity = shared.identity(&link.namespace);
            shared.tier.as_mut().expect("just read").identity = identity;
        }
        Ok(self)
    }

    /// The same new pool with a second tier for its prefix cache (see `kv/tier.rs`):
    /// every block it newly caches is offered to `tier`, and a lookup whose chain runs
    /// past the cache asks `tier` for the next blocks. `namespace` names everything
    /// the rows depend on beyond the pool's own settings — the model (its fingerprint),
    /// the backend and kernel path, the activations — so that pools whose rows differ
    /// never share a record. Records are keyed with the pool's secret too: pools share
    /// them only with the same [`PoolConfig::key`].
    ///
    /// # Errors
    /// [`KvError::PoolShared`] when the pool has another handle already.
    pub fn with_tier(mut self, tier: Arc<dyn KvTier>, namespace: &[u8]) -> Result<KvPool, KvError> {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return Err(KvError::PoolShared { what: "tier" });
        };
        let identity = shared.identity(namespace);
        shared.tier = Some(TierLink {
            tier,
            namespace: namespace.to_vec(),
            identity,
        });
        Ok(self)
    }

    /// [`with_key_codec`](Self::with_key_codec) of the key codec kept less `offsets`
    /// ([`KvCodec::with_key_offsets`]).
    ///
    /// # Errors
    /// As `with_key_codec`, and [`KvError::Calibration`] when the keys' type does not
    /// calibrate.
    pub fn with_key_offsets(self, offsets: Arc<KeyOffsets>) -> Result<KvPool, KvError> {
        let codec = KvCodec::with_key_offsets(self.shared.types.0, offsets)?;
        self.with_key_codec(&codec)
    }

    /// An empty sequence of at most `max_ctx` positions drawing blocks from this pool.
    pub fn sequence(&self, max_ctx: usize) -> Result<PagedKv, KvError> {
        checked_size(&self.shared.geometry, max_ctx, self.shared.types)?;
        (self.shared.codecs.0).check_store(self.shared.geometry, max_ctx, self.shared.types.0)?;
        Ok(PagedKv {
            pool: self.clone(),
            max_ctx,
            len: 0,
            blocks: Vec::new(),
            pending: None,
        })
    }

    /// The store geometry.
    pub fn geometry(&self) -> KvGeometry {
        self.shared.geometry
    }

    /// The K and V element types.
    pub fn kv_types(&self) -> (KvType, KvType) {
        self.shared.types
    }

    /// Positions per block.
    pub fn block_len(&self) -> usize {
        self.shared.block_len
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.shared.block_bytes
    }

    /// Sets the byte budget. Lowering it below what is alive evicts idle cached blocks
    /// (least recently used first) as far as that goes; blocks in tables stay, and
    /// appends needing new blocks fail until enough is given back.
    pub fn set_budget(&self, budget: usize) {
        self.shared.budget.store(budget, Ordering::Relaxed);
        let mut cache = self.cache();
        while self.shared.account.used.load(Ordering::Relaxed) > budget && cache.evict_one() {}
    }

    /// Consults `gate` before every block allocation (see [`AllocGate`]); `None` admits
    /// all.
    pub fn set_alloc_gate(&self, gate: Option<Arc<dyn AllocGate>>) {
        *self.shared.gate.lock().unwrap_or_else(|e| e.into_inner()) = gate;
    }

    /// Drops every cached block no table holds; returns how many.
    pub fn evict_idle(&self) -> usize {
        let mut cache = self.cache();
        let mut n = 0;
        while cache.evict_one() {
            n += 1;
        }
        n
    }

    /// The pool's counters now.
    pub fn stats(&self) -> PoolStats {
        let cache = self.cache();
        let a = &self.shared.account;
        PoolStats {
            blocks: a.blocks.load(Ordering::Relaxed),
            bytes: a.used.load(Ordering::Relaxed),
            budget: self.shared.budget.load(Ordering::Relaxed),
            block_bytes: self.shared.block_bytes,
            cached: cache.map.len(),
            cached_idle: cache
                .map
                .values()
                .filter(|e| Arc::strong_count(&e.block) == 1)
                .count(),
            evicted: cache.evicted,
            lookups: cache.lookups,
            blocks_queried: cache.queried,
            blocks_hit: cache.hit,
            tier_hits: cache.tier_hits,
            tier_misses: cache.tier_misses,
            tier_rejected: cache.tier_rejected,
            tier: self.shared.tier.as_ref().map(|t| t.tier.stats()),
        }
    }

    /// The ids of the blocks in the prefix cache (for audits: see
    /// [`PagedKv::block_ids`]).
    pub fn cached_block_ids(&self) -> Vec<u64> {
        self.cache().map.values().map(|e| e.block.id).collect()
    }

    /// A new sequence of at most `max_ctx` positions holding the longest run of cached
    /// full blocks that starts `ids` (shared with the cache and whoever else holds them,
    /// copied only if written). Its `len` is a multiple of the block length, at most
    /// `ids.len()` and `max_ctx`; the caller runs `ids[len..]` through the model.
    /// Every block found is refreshed in the LRU order. With a tier, the run goes on
    /// with the blocks the tier holds (each loaded into a new block of the pool, as far
    /// as the budget allows, and cached again).
    pub fn lookup(&self, ids: &[u32], max_ctx: usize) -> Result<PagedKv, KvError> {
        let mut seq = self.sequence(max_ctx)?;
        let b = self.shared.block_len;
        let full = ids.len().min(max_ctx) / b;
        let hashes: Vec<BlockHash> = self.chain(&ids[..full * b]).collect();
        let mut cache = self.cache();
        cache.lookups += 1;
        cache.queried += full as u64;
        for h in &hashes {
            let Some(e) = cache.map.get(h) else { break };
            seq.blocks.push(e.block.clone());
        }
        let hit = seq.blocks.len();
        cache.hit += hit as u64;
        for h in hashes[..hit].iter().rev() {
            cache.touch(h);
        }
        drop(cache);
        if let Some(link) = &self.shared.tier {
            for h in &hashes[hit..] {
                match self.load_from_tier(link, h) {
                    Some(block) => seq.blocks.push(block),
                    None => break,
                }
            }
        }
        seq.len = seq.blocks.len() * b;
        Ok(seq)
    }

    /// The block of chained hash `hash` from the tier, loaded into a new block and
    /// cached; `None` when the tier lacks it, its record is unusable (then removed from
    /// the tier) or the budget has no room.
    fn load_from_tier(&self, link: &TierLink, hash: &BlockHash) -> Option<Arc<Block>> {
        let s = &*self.shared;
        let key = Shared::tier_key(link, hash);
        let Some(bytes) = link.tier.get(&key) else {
            self.cache().tier_misses += 1;
            return None;
        };
        let Some(payload) = tier::payload(&bytes, &key, s.payload_len()) else {
            link.tier.remove(&key);
            self.cache().tier_rejected += 1;
            return None;
        };
        let mut block = self.alloc_blocks(1).ok()?.pop()?;
        let rows = s.geometry.n_layers * s.block_len;
        let (kb, vb) = payload.split_at(rows * s.types.0.row_bytes(s.kv_dim)?);
        let fresh = Arc::get_mut(&mut block).expect("a new block is held once");
        for (buf, codec, bytes) in [
            (&mut fresh.k, &s.codecs.0, kb),
            (&mut fresh.v, &s.codecs.1, vb),
        ] {
            let mut stored = codec.stored_rows();
            let read = stored.read(rows, s.kv_dim, |out| {
                out.copy_from_slice(bytes);
                Ok::<(), Infallible>(())
            });
            let Ok(()) = read;
            buf.assign(
                0,
                stored.view(rows, s.geometry.n_kv_heads, s.geometry.head_dim),
            );
        }
        let mut cache = self.cache();
        cache.tier_hits += 1;
        let block = match cache.map.entry(*hash) {
            // Another lookup loaded it meanwhile: share that one.
            std::collections::hash_map::Entry::Occupied(e) => e.get().block.clone(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Entry {
                    block: block.clone(),
                    tick: 0,
                });
                block
            }
        };
        cache.touch(hash);
        Some(block)
    }

    /// Which of `appends` the pool can serve in one pass, asked before any compute:
    /// `appends[i]` is a sequence of this pool and the positions it would append at its
    /// end, in the order the pass begins them (a batch's order). Each is served when,
    /// after the blocks of those before it that are served, the budget covers its new
    /// blocks ([`PagedKv::blocks_to_append`]), idle cached blocks counted as free — the
    /// same rule as the appends' `begin`, which then cannot fail with
    /// [`KvError::PoolFull`] for a sequence this said fits (an [`AllocGate`] may still
    /// refuse an allocation). Nothing changes.
    pub fn plan(&self, appends: &[(&PagedKv, usize)]) -> Vec<bool> {
        let s = &*self.shared;
        let idle = self.cache().idle_bytes();
        let used = s.account.used.load(Ordering::Relaxed);
        let mut free = s
            .budget
            .load(Ordering::Relaxed)
            .saturating_sub(used.saturating_sub(idle));
        appends
            .iter()
            .map(|&(seq, n)| {
                let need = seq.blocks_to_append(n).saturating_mul(s.block_bytes);
                let fits = need <= free;
                if fits {
                    free -= need;
                }
                fits
            })
            .collect()
    }

    /// The chained hashes of the full blocks of `ids` (see the header of `src/kv/paged.rs`).
    fn chain<'i>(&self, ids: &'i [u32]) -> impl Iterator<Item = BlockHash> + 'i {
        let key = self.shared.key;
        let mut parent = [0u8; 32];
        ids.chunks_exact(self.shared.block_len).map(move |block| {
            let mut h = Sha256::new();
            h.update(key);
            h.update(parent);
            for id in block {
                h.update(id.to_le_bytes());
            }
            parent = h.finalize().into();
            parent
        })
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        // The cache's invariants hold between statements; a panic elsewhere cannot
        // leave it half-updated.
        self.shared.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `count` new zeroed blocks, all or none: evicts idle cached blocks as needed, but
    /// only when the budget can then cover all of them.
    fn alloc_blocks(&self, count: usize) -> Result<Vec<Arc<Block>>, KvError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let s = &*self.shared;
        let need = count.saturating_mul(s.block_bytes);
        let mut cache = self.cache();
        let budget = s.budget.load(Ordering::Relaxed);
        let used = s.account.used.load(Ordering::Relaxed);
        if used.saturating_sub(cache.idle_bytes()).saturating_add(need) > budget {
            return Err(KvError::PoolFull {
                needed: need,
                used,
                budget,
            });
        }
        while s.account.used.load(Ordering::Relaxed).saturating_add(need) > budget {
            if !cache.evict_one() {
                break;
            }
        }
        drop(cache);
        let gate = s.gate.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let rows = s.geometry.n_layers * s.block_len;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let k = Buf::zeroed(s.types.0, s.kv_dim, rows, &gate)?;
            let v = Buf::zeroed(s.types.1, s.kv_dim, rows, &gate)?;
            let block = Block {
                id: s.account.next_id.fetch_add(1, Ordering::Relaxed),
                k,
                v,
                account: s.account.clone(),
            };
            s.account.used.fetch_add(block.bytes(), Ordering::Relaxed);
            s.account.blocks.fetch_add(1, Ordering::Relaxed);
            out.push(Arc::new(block));
        }
        Ok(out)
    }
}

impl fmt::Debug for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvPool")
            .field("geometry", &self.shared.geometry)
            .field("types", &self.shared.types)
            .field("block_len", &self.shared.block_len)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// One sequence's store in a [`KvPool`]: a table of shared, copy-on-write blocks (see
/// the header of `src/kv/paged.rs`). Bitwise interchangeable with
/// [`DenseKv`](super::DenseKv) for every sequence of calls.
pub struct PagedKv {
    pool: KvPool,
    max_ctx: usize,
    len: usize,
    /// Block `j` holds positions `j · block_len ..`; `ceil(len / block_len)` of them
    /// outside an append.
    blocks: Vec<Arc<Block>>,
    pending: Option<Pending>,
}

/// An open append.
struct Pending {
    at: usize,
    n: usize,
    /// Index of the first block the append writes.
    first: usize,
    /// Per block `first ..`: a new block, or `None` to write the table's block in
    /// place.
    staged: Vec<Option<Arc<Block>>>,
    /// `[n_layers]`: whether the layer's rows have been written.
    written: Vec<bool>,
}

impl PagedKv {
    /// The pool this sequence draws from.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The ids of the blocks in the table, in order (for audits: a block shared by two
    /// tables or the cache appears in each).
    pub fn block_ids(&self) -> Vec<u64> {
        self.blocks.iter().map(|b| b.id).collect()
    }

    /// References to each table block (this table's, other tables', the cache's).
    pub fn block_refs(&self) -> Vec<usize> {
        self.blocks.iter().map(Arc::strong_count).collect()
    }

    /// Offers this sequence's full blocks to the prefix cache, `ids` being the tokens
    /// its positions `0 .. len` were computed from (the caller's word: the cache serves
    /// these rows to any later prompt starting with the same tokens); returns how many
    /// blocks were newly cached. A block whose prefix the cache already holds (from
    /// another sequence) is refreshed, not replaced.
    ///
    /// Errors, changing nothing: [`KvError::AppendOpen`], [`KvError::TokenCount`] when
    /// `ids.len() != len`.
    pub fn publish(&mut self, ids: &[u32]) -> Result<usize, KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        if ids.len() != self.len {
            return Err(KvError::TokenCount {
                ids: ids.len(),
                len: self.len,
            });
        }
        let hashes: Vec<BlockHash> = self.pool.chain(ids).collect();
        let mut cache = self.pool.cache();
        let mut added = Vec::new();
        for (h, block) in hashes.iter().zip(&self.blocks) {
            if let std::collections::hash_map::Entry::Vacant(slot) = cache.map.entry(*h) {
                slot.insert(Entry {
                    block: block.clone(),
                    tick: 0,
                });
                added.push((h, block));
            }
        }
        for h in hashes.iter().rev() {
            cache.touch(h);
        }
        drop(cache);
        let s = &*self.pool.shared;
        if let Some(link) = &s.tier {
            for &(h, block) in &added {
                link.tier.put(TierRecord::new(
                    Shared::tier_key(link, h),
                    block.clone(),
                    s.codecs.clone(),
                    s.geometry.n_layers * s.block_len,
                    s.geometry.n_kv_heads,
                ));
            }
        }
        Ok(added.len())
    }

    fn block_len(&self) -> usize {
        self.pool.shared.block_len
    }

    /// For each block that positions `at .. end` fall in, whether an append writing them
    /// needs a new block: all but those held alone whose written positions are all
    /// uncommitted (written in place).
    fn fresh_blocks(&self, at: usize, end: usize) -> impl Iterator<Item = bool> + '_ {
        let b = self.block_len();
        let first = at / b;
        let blocks = if end <= at {
            0
        } else {
            (end - 1) / b + 1 - first
        };
        (first..first + blocks).map(move |j| match self.blocks.get(j) {
            None => true,
            Some(block) => Arc::strong_count(block) > 1 || self.len > at.max(j * b),
        })
    }

    /// The new blocks an append of `n` positions at this sequence's end would take from
    /// the pool (see [`KvPool::plan`]).
    pub fn blocks_to_append(&self, n: usize) -> usize {
        let at = self.len;
        self.fresh_blocks(at, at + n).filter(|&f| f).count()
    }

    fn check_layer(&self, layer: usize) -> Result<(), KvError> {
        let n_layers = self.pool.shared.geometry.n_layers;
        if layer < n_layers {
            Ok(())
        } else {
            Err(KvError::NoSuchLayer { layer, n_layers })
        }
    }

    /// The open append's `(at, n)`, after checking `layer`.
    fn open_append(&self, layer: usize) -> Result<(usize, usize), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        self.check_layer(layer)?;
        Ok((p.at, p.n))
    }

    /// Writes rows `0 .. n` of the open append into layer `layer` of its blocks, one
    /// run of rows per block: `put(buf_k, buf_v, first_row_in_buf, rows t0..t1)`.
    fn write_runs(&mut self, layer: usize, mut put: impl FnMut(&mut Block, usize, usize, usize)) {
        let b = self.block_len();
        let p = self.pending.as_mut().expect("checked by open_append");
        p.written[layer] = true;
        let mut t = 0;
        while t < p.n {
            let pos = p.at + t;
            let j = pos / b;
            let off = pos - j * b;
            let run = (b - off).min(p.n - t);
            let block = match &mut p.staged[j - p.first] {
                Some(new) => new,
                None => &mut self.blocks[j],
            };
            let block = Arc::get_mut(block).expect("begin staged only private blocks to write");
            put(block, layer * b + off, t, t + run);
            t += run;
        }
    }
}

impl KvStore for PagedKv {
    fn geometry(&self) -> KvGeometry {
        self.pool.shared.geometry
    }

    fn codecs(&self) -> (KvCodec, KvCodec) {
        self.pool.shared.codecs.clone()
    }

    fn kv_types(&self) -> (KvType, KvType) {
        self.pool.shared.types
    }

    fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Positions held plus the free slots of the last block when the sequence holds it
    /// alone (an append into a shared block copies it first).
    fn capacity(&self) -> usize {
        let b = self.block_len();
        match self.blocks.last() {
            Some(last) if Arc::strong_count(last) == 1 => (self.blocks.len() * b).min(self.max_ctx),
            _ => self.len,
        }
    }

    /// Bytes of the blocks this sequence's table holds (shared ones included: see
    /// [`KvPool::stats`] for the pool's true total) and of an open append's new blocks.
    fn bytes(&self) -> usize {
        let staged = self
            .pending
            .as_ref()
            .map_or(0, |p| p.staged.iter().flatten().count());
        (self.blocks.len() + staged) * self.pool.shared.block_bytes
    }

    fn view(&self, layer: usize) -> Result<KvView<'_>, KvError> {
        self.check_layer(layer)?;
        let b = self.block_len();
        let g = self.pool.shared.geometry;
        let (end, pending) = match &self.pending {
            Some(p) if p.written[layer] => (p.at + p.n, Some(p)),
            _ => (self.len, None),
        };
        let mut segments = Vec::with_capacity(end.div_ceil(b));
        let mut start = 0;
        while start < end {
            let j = start / b;
            // A staged block, or the table's (written in place, or before the append).
            let staged = pending.and_then(|p| p.staged.get(j.checked_sub(p.first)?)?.as_ref());
            let block = staged.unwrap_or_else(|| &self.blocks[j]);
            let n = b.min(end - start);
            let row = layer * b;
            segments.push(KvSegment::new(
                start,
                block.k.view(row, n, g.n_kv_heads),
                block.v.view(row, n, g.n_kv_heads),
            )?);
            start += n;
        }
        let view = KvView::new(g.n_kv_heads, g.head_dim, segments)?;
        view.with_key_codec(&self.pool.shared.codecs.0, layer)
    }

    fn begin(&mut self, at: usize, n: usize) -> Result<(), KvError> {
        let end = check_begin(self.pending.is_some(), self.len, self.max_ctx, at, n)?;
        let b = self.block_len();
        let first = at / b;
        let fresh: Vec<bool> = self.fresh_blocks(at, end).collect();
        let mut new = self
            .pool
            .alloc_blocks(fresh.iter().filter(|&&f| f).count())?
            .into_iter();
        let n_layers = self.pool.shared.geometry.n_layers;
        let staged = fresh
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                if !f {
                    return None;
                }
                let mut block = new.next().expect("allocated one block per fresh slot");
                let j = first + i;
                // The rows before `at` of a replaced or shared block carry over.
                if let Some(old) = self.blocks.get(j) {
                    let keep = at.saturating_sub(j * b).min(b);
                    if keep > 0 {
                        let nb = Arc::get_mut(&mut block).expect("a new block is private");
                        for layer in 0..n_layers {
                            nb.k.copy_rows(layer * b, &old.k, layer * b, keep);
                            nb.v.copy_rows(layer * b, &old.v, layer * b, keep);
                        }
                    }
                }
                Some(block)
            })
            .collect();
        self.pending = Some(Pending {
            at,
            n,
            first,
            staged,
            written: vec![false; n_layers],
        });
        Ok(())
    }

    fn write(
        &mut self,
        layer: usize,
        k: ArrayView2<'_, f32>,
        v: ArrayView2<'_, f32>,
    ) -> Result<(), KvError> {
        let (_, n) = self.open_append(layer)?;
        check_rows(n, self.pool.shared.kv_dim, &k, &v)?;
        let head_dim = self.pool.shared.geometry.head_dim;
        let (pool, at) = (self.pool.clone(), self.pending.as_ref().map_or(0, |p| p.at));
        self.write_runs(layer, |block, row, t0, t1| {
            let s = Slice::from(t0..t1);
            let (kc, vc) = &pool.shared.codecs;
            let (kc, vc) = (kc.layer(layer), vc.layer(layer));
            block
                .k
                .encode(row, k.slice_axis(Axis(0), s), head_dim, kc, at + t0);
            block
                .v
                .encode(row, v.slice_axis(Axis(0), s), head_dim, vc, at + t0);
        });
        Ok(())
    }

    fn commit(&mut self) -> Result<(), KvError> {
        let p = self.pending.as_ref().ok_or(KvError::NoAppend)?;
        check_complete(p.n, &p.written)?;
        let p = self.pending.take().expect("checked above");
        let b = self.block_len();
        for (i, block) in p.staged.into_iter().enumerate() {
            if let Some(block) = block {
                let j = p.first + i;
                if j < self.blocks.len() {
                    self.blocks[j] = block;
                } else {
                    self.blocks.push(block);
                }
            }
        }
        self.len = p.at + p.n;
        self.blocks.truncate(self.len.div_ceil(b));
        Ok(())
    }

    fn rollback(&mut self) {
        // Dropping the staged blocks gives their bytes back; the table is untouched.
        self.pending = None;
    }

    /// Keeps positions `0 .. min(n, len)` and gives the blocks past them back (to the
    /// pool, or to the cache and other tables that still hold them).
    fn truncate(&mut self, n: usize) -> Result<(), KvError> {
        self.rollback();
        if n < self.len {
            let b = self.block_len();
            self.len = n;
            self.blocks.truncate(n.div_ceil(b));
        }
        Ok(())
    }

    /// A second sequence sharing every block (copy-on-write): no rows are copied.
    fn fork(&self) -> Result<Self, KvError> {
        if self.pending.is_some() {
            return Err(KvError::AppendOpen);
        }
        Ok(PagedKv {
            pool: self.pool.clone(),
            max_ctx: self.max_ctx,
            len: self.len,
            blocks: self.blocks.clone(),
            pending: None,
        })
    }

    fn fork_boxed(&self) -> Result<Box<dyn KvStore>, KvError> {
        Ok(Box::new(self.fork()?))
    }

    fn restorer(&mut self) -> Option<&mut dyn KvRestore> {
        Some(self)
    }
}

impl KvRestore for PagedKv {
    fn write_stored(&mut self, layer: usize, k: KvRows<'_>, v: KvRows<'_>) -> Result<(), KvError> {
        let (_, n) = self.open_append(layer)?;
        let s = &self.pool.shared;
        check_stored(n, &s.geometry, s.types, &k, &v)?;
        self.write_runs(layer, |block, row, t0, t1| {
            block.k.assign(row, k.slots(t0..t1));
            block.v.assign(row, v.slots(t0..t1));
        });
        Ok(())
    }
}

impl fmt::Debug for PagedKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PagedKv")
            .field("len", &self.len)
            .field("max_ctx", &self.max_ctx)
            .field("blocks", &self.block_ids())
            .field("append_open", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Append, DenseKv};
    use ndarray::Array2;

    const G: KvGeometry = KvGeometry {
        n_layers: 2,
        n_kv_heads: 1,
        head_dim: 3,
    };

    fn pool(block_len: usize, budget: usize) -> KvPool {
        let config = PoolConfig {
            block_len,
            budget,
            key: [7; 32],
        };
        KvPool::new(G, (KvType::F32, KvType::F32), config).unwrap()
    }

    /// The rows a token prefix "computes": a function of every id up to the position.
    fn rows(ids: &[u32], from: usize, layer: usize) -> (Array2<f32>, Array2<f32>) {
        let mut h: u32 = 17;
        let mut k = Vec::new();
        for (p, &id) in ids.iter().enumerate() {
            h = h.wrapping_mul(31).wrapping_add(id + 1);
            if p >= from {
                k.extend((0..3).map(|i| (h.wrapping_add(i + 10 * layer as u32) % 1000) as f32));
            }
        }
        let n = ids.len() - from;
        let k = Array2::from_shape_vec((n, 3), k).unwrap();
        let v = k.mapv(|x| -x);
        (k, v)
    }

    fn run<K: KvStore>(kv: &mut K, ids: &[u32], at: usize) -> Result<(), KvError> {
        let mut tx = Append::begin(kv, at, ids.len() - at)?;
        for layer in 0..G.n_layers {
            let (k, v) = rows(ids, at, layer);
            tx.write(layer, k.view(), v.view())?;
        }
        tx.commit()
    }

    fn bits<K: KvStore>(kv: &K) -> Vec<u32> {
        (0..G.n_layers)
            .flat_map(|l| {
                let view = kv.view(l).unwrap();
                let (mut ks, mut vs) = (Vec::new(), Vec::new());
                for s in view.segments() {
                    let (KvRows::F32(k), KvRows::F32(v)) = (s.keys(), s.values()) else {
                        panic!("f32 rows")
                    };
                    ks.extend(k.iter().map(|x| x.to_bits()));
                    vs.extend(v.iter().map(|x| x.to_bits()));
                }
                ks.extend(vs);
                ks
            })
            .collect()
    }

    #[test]
    fn prefix_is_found_again_shared_and_copied_on_write() {
        let pool = pool(4, 1 << 20);
        let ids: Vec<u32> = (0..10).collect();
        let mut a = pool.sequence(64).unwrap();
        run(&mut a, &ids, 0).unwrap();
        assert_eq!(a.publish(&ids).unwrap(), 2);
        assert_eq!(pool.stats().blocks, 3);

        // Same first 9 tokens, then another: two full blocks found, shared.
        let mut other: Vec<u32> = ids[..9].to_vec();
        other.push(99);
        let mut b = pool.lookup(&other, 64).unwrap();
        assert_eq!(b.len(), 8);
        assert_eq!(b.block_ids(), a.block_ids()[..2].to_vec());
        run(&mut b, &other, 8).unwrap();
        let mut dense = DenseKv::new(G, 64).unwrap();
        run(&mut dense, &other, 0).unwrap();
        assert_eq!(bits(&b), bits(&dense));
        assert_eq!(pool.stats().blocks, 4, "one new block for b's tail");

        // Rewriting inside a shared block copies it; a's rows stay.
        let a_bits = bits(&a);
        let mut c = ids[..5].to_vec();
        c.extend([50, 51]);
        run(&mut b, &c, 5).unwrap();
        assert_eq!(bits(&a), a_bits);
        let mut dense = DenseKv::new(G, 64).unwrap();
        run(&mut dense, &c, 0).unwrap();
        assert_eq!(bits(&b), bits(&dense));
        assert_ne!(b.block_ids()[1], a.block_ids()[1]);
    }

    /// `plan` counts the new blocks of each append (a shared block copied, a private
    /// partial one written in place, idle cached blocks free), in order, and the
    /// appends it says fit then begin in that order without `PoolFull`.
    #[test]
    fn plan_foretells_what_a_batch_of_appends_can_take() {
        let p = pool(4, 0);
        let bb = p.block_bytes();
        p.set_budget(6 * bb);
        let ids: Vec<u32> = (0..8).collect();
        let mut a = p.sequence(64).unwrap();
        run(&mut a, &ids[..6], 0).unwrap();
        let mut cached = p.sequence(64).unwrap();
        run(&mut cached, &ids, 0).unwrap();
        cached.publish(&ids).unwrap();
        drop(cached);
        // Blocks alive: a's 2, and 2 idle in the cache; free for a plan: 4.
        assert_eq!((p.stats().blocks, p.stats().cached_idle), (2 + 2, 2));
        let b = p.lookup(&ids, 64).unwrap(); // shares both cached blocks: none idle now
        assert_eq!(b.len(), 8);
        assert_eq!(
            a.blocks_to_append(1),
            0,
            "a's last block is private and partial"
        );
        assert_eq!(a.blocks_to_append(3), 1);
        assert_eq!(b.blocks_to_append(1), 1, "b's blocks are full");
        let c = p.sequence(64).unwrap();
        assert_eq!(c.blocks_to_append(9), 3);
        // Free: 6 − 4 alive, none idle = 2 blocks.
        assert_eq!(p.plan(&[(&a, 3), (&c, 9), (&b, 1)]), [true, false, true]);
        assert_eq!(p.plan(&[(&c, 9), (&a, 3)]), [false, true]);
        assert_eq!(p.plan(&[(&c, 5), (&a, 1), (&b, 4)]), [true, true, false]);
        // What it said fits begins; what it refused is PoolFull.
        let (mut a, mut b, mut c) = (a, b, c);
        a.begin(6, 3).unwrap();
        b.begin(8, 1).unwrap();
        assert!(matches!(c.begin(0, 9), Err(KvError::PoolFull { .. })));
        a.rollback();
        b.rollback();
        // b's blocks go back to the cache, idle again: free for the plan.
        drop(b);
        assert_eq!(p.plan(&[(&c, 9), (&a, 3)]), [true, true]);
        c.begin(0, 9).unwrap();
        a.begin(6, 3).unwrap();
    }

    #[test]
    fn budget_evicts_idle_cached_blocks_and_refuses_beyond() {
        let p = pool(4, 0);
        let bb = p.block_bytes();
        p.set_budget(3 * bb);
        let ids: Vec<u32> = (0..8).collect();
        let mut a = p.sequence(64).unwrap();
        run(&mut a, &ids, 0).unwrap();
        a.publish(&ids).unwrap();
        drop(a);
        assert_eq!(p.stats().cached_idle, 2);
        // 12 positions need 3 blocks: the two idle ones are evicted (LRU) as needed.
        let mut b = p.sequence(64).unwrap();
        let other: Vec<u32> = (100..112).collect();
        run(&mut b, &other, 0).unwrap();
        assert_eq!(p.stats().blocks, 3);
        assert_eq!(p.stats().evicted, 2);
        // A fourth block is beyond the budget: refused, nothing changes.
        let before = bits(&b);
        let mut more = other.clone();
        more.push(5);
        assert!(matches!(
            run(&mut b, &more, 12),
            Err(KvError::PoolFull { .. })
        ));
        assert_eq!(bits(&b), before);
        assert_eq!(b.len(), 12);
        assert_eq!(p.stats().bytes, 3 * bb);
    }
}
