//! Differential testing of the paged KV pool: random multi-sequence op sequences on
//! [`PagedKv`] sequences of one [`KvPool`], each beside its own [`DenseKv`] (the
//! reference), compared bit for bit after every step, with the pool's books audited.
//!
//! The rows are those of a fake model: the K and V rows of position `p` are a hash of the
//! token ids `0 ..= p` (and the layer), so rows found by the prefix cache are right only
//! if they were computed for the same tokens, and a block served to the wrong prefix, or
//! written while another sequence holds it, shows up as different bits in some
//! sequence's view.
//!
//! After every op (and every layer's write of an append) [`run`] checks:
//! - every sequence's `len` is its token count and every layer's view holds the same
//!   positions and bytes as its dense reference (pending rows included);
//! - a `begin` refused by the pool ([`KvError::PoolFull`], or [`KvError::AllocFailed`]
//!   from a refused allocation) changed nothing; any other result equals the dense
//!   store's;
//! - outside appends, the pool's books: blocks alive = the distinct blocks of all tables
//!   and the cache (none leaked), each block's reference count = its table occurrences
//!   plus one if cached (refcounts exact), `bytes = blocks · block_bytes`, each table
//!   holds `ceil(len / block_len)` blocks, and no op grows the pool past its budget;
//! - a lookup returns a block-aligned prefix no longer than the prompt or `max_ctx`, one
//!   that some sequence published (never a false hit), and, while nothing has been
//!   evicted, the longest published one.
//!
//! [`PoolScenario`] implements [`arbitrary::Arbitrary`] with small bounds (1–3 layers,
//! 1–2 KV heads of 0–4, blocks of 1–8 positions, `max_ctx` ≤ 120, ≤ 48 ops, token ids
//! from a vocabulary of 3 so prompts share prefixes often); every byte string decodes
//! ([`PoolScenario::from_bytes`], the `kv_pool` fuzz target's input format).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arbitrary::{Arbitrary, Unstructured};
use kvcore::kv::{
    DenseKv, KeyOffsets, KvError, KvGeometry, KvPool, KvStore, KvType, PagedKv, PoolConfig,
    Q8_0_BLOCK,
};
use kvcore::ndarray::Array2;

use crate::kv_diff::{LayerBits, RefuseNext, arb_types, layer_bits, same_layer};

/// Most sequences alive at once.
pub const MAX_SEQS: usize = 6;
/// Largest `max_ctx` of a sequence.
pub const MAX_CTX: usize = 120;
/// Largest block.
pub const MAX_BLOCK: usize = 8;
/// Most ops.
pub const MAX_OPS: usize = 48;
/// Token ids are `0 .. VOCAB`.
pub const VOCAB: u8 = 3;

/// How an append ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum PoolEnd {
    /// Every layer written, then committed.
    Commit,
    /// Every layer written, then rolled back.
    Rollback,
    /// Layers `0 .. k % (n_layers + 1)` written, then rolled back.
    FailAfter(u8),
}

/// One operation on the pool's sequences (`seq` picks `seq % alive`).
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub enum PoolOp {
    /// Replaces the last `back` positions (0: appends at `len`) by `tokens` (each
    /// `% VOCAB`), rows from the fake model.
    Append {
        /// The sequence.
        seq: u8,
        /// Positions replaced.
        #[arbitrary(with = arb_back)]
        back: u8,
        /// The new tokens.
        #[arbitrary(with = arb_tokens)]
        tokens: Vec<u8>,
        /// How it ends.
        end: PoolEnd,
    },
    /// `publish` the sequence's tokens.
    Publish {
        /// The sequence.
        seq: u8,
    },
    /// A new sequence from the prefix cache, for the prompt of `seq`'s first
    /// `keep % (len + 1)` tokens then `extra`.
    Lookup {
        /// Whose tokens.
        seq: u8,
        /// How many of them.
        keep: u8,
        /// Tokens after them.
        #[arbitrary(with = arb_extra)]
        extra: Vec<u8>,
    },
    /// `fork()`.
    Fork {
        /// The sequence.
        seq: u8,
    },
    /// `truncate(len − back)`.
    Truncate {
        /// The sequence.
        seq: u8,
        /// Positions dropped.
        #[arbitrary(with = arb_back)]
        back: u8,
    },
    /// Drops a sequence.
    Free {
        /// The sequence.
        seq: u8,
    },
    /// `evict_idle()`.
    EvictIdle,
    /// `set_budget(blocks · block_bytes)`.
    SetBudget {
        /// Blocks.
        blocks: u8,
    },
    /// The pool's next block allocation during the next op fails.
    RefuseNextAlloc,
}

/// A pool, its sequences' ceiling and the ops to replay.
#[derive(Debug, Clone, PartialEq, Eq, Arbitrary)]
pub struct PoolScenario {
    /// Layers.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=3))]
    pub n_layers: usize,
    /// KV heads.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=2))]
    pub n_kv_heads: usize,
    /// Elements per head (with a `q8_0` type a head is one block of 32).
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=4))]
    pub head_dim: usize,
    /// Positions per block.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(1..=MAX_BLOCK))]
    pub block_len: usize,
    /// The budget in blocks.
    pub budget_blocks: u8,
    /// Every sequence's `max_ctx`.
    #[arbitrary(with = |u: &mut Unstructured| u.int_in_range(0..=MAX_CTX))]
    pub max_ctx: usize,
    /// The ops.
    #[arbitrary(with = arb_ops)]
    pub ops: Vec<PoolOp>,
    /// K and V types (read last).
    #[arbitrary(with = arb_types)]
    pub types: (KvType, KvType),
}

impl PoolScenario {
    /// Decodes a scenario from raw bytes (the fuzz input format); every byte string
    /// decodes, short input reading as zeros.
    pub fn from_bytes(data: &[u8]) -> arbitrary::Result<PoolScenario> {
        PoolScenario::arbitrary_take_rest(Unstructured::new(data))
    }

    /// The pool's geometry.
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
}

fn arb_tokens(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let n = match u.int_in_range(0..=7u8)? {
        0..=5 => u.int_in_range(0..=6)?,
        _ => u.int_in_range(0..=40)?,
    };
    (0..n).map(|_| u8::arbitrary(u)).collect()
}

/// Half the time 0, often a few, sometimes anything.
fn arb_back(u: &mut Unstructured) -> arbitrary::Result<u8> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=4 => 0,
        5..=7 => u.int_in_range(1..=6)?,
        _ => u8::arbitrary(u)?,
    })
}

fn arb_extra(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let n = u.int_in_range(0..=4)?;
    (0..n).map(|_| u8::arbitrary(u)).collect()
}

fn arb_ops(u: &mut Unstructured) -> arbitrary::Result<Vec<PoolOp>> {
    let n = u.int_in_range(0..=MAX_OPS)?;
    (0..n).map(|_| PoolOp::arbitrary(u)).collect()
}

/// The first disagreement of a [`run`].
pub type PoolDivergence = crate::kv_diff::Divergence<PoolOp>;

/// The fake model's rows for positions `from .. ids.len()` of layer `layer`: element `i`
/// of K at position `p` is the bits of a hash of `ids[..=p]`, `layer`, `i` (any bit
/// pattern, NaNs included), V the same hash of another seed.
pub fn fake_rows(
    ids: &[u32],
    from: usize,
    layer: usize,
    kv_dim: usize,
) -> (Array2<f32>, Array2<f32>) {
    let n = ids.len() - from;
    let mut k = Vec::with_capacity(n * kv_dim);
    let mut v = Vec::with_capacity(n * kv_dim);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (p, &id) in ids.iter().enumerate() {
        h = (h ^ u64::from(id)).wrapping_mul(0x0000_0100_0000_01b3);
        if p >= from {
            for i in 0..kv_dim {
                let x = mix(h ^ ((layer as u64) << 40) ^ ((i as u64) << 20));
                k.push(value(x));
                v.push(value(mix(x ^ 0x9e37_79b9_7f4a_7c15)));
            }
        }
    }
    (
        Array2::from_shape_vec((n, kv_dim), k).expect("n · kv_dim values"),
        Array2::from_shape_vec((n, kv_dim), v).expect("n · kv_dim values"),
    )
}

/// Mostly ordinary floats in `[-10, 10)`, one in 16 any bit pattern.
fn value(y: u64) -> f32 {
    if y & 0xf == 0 {
        f32::from_bits((y >> 32) as u32)
    } else {
        ((y >> 40) % 2000) as f32 / 100.0 - 10.0
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One sequence: the paged store, its reference and its tokens.
struct Seq {
    paged: PagedKv,
    dense: DenseKv,
    ids: Vec<u32>,
}

struct World {
    pool: KvPool,
    gate: Arc<RefuseNext>,
    seqs: Vec<Seq>,
    max_ctx: usize,
    types: (KvType, KvType),
    /// Every block-aligned token prefix ever published.
    published: HashSet<Vec<u32>>,
    /// The key offsets of the pool and of every reference store.
    key_offsets: Option<Arc<KeyOffsets>>,
}

/// Replays `scenario` (see the [module docs](self)).
///
/// # Errors
/// The first [`PoolDivergence`].
pub fn run(scenario: &PoolScenario) -> Result<(), PoolDivergence> {
    let at_start = |detail: String| PoolDivergence { op: None, detail };
    let g = scenario.geometry();
    let config = PoolConfig {
        block_len: scenario.block_len,
        budget: 0,
        key: [0x5a; 32],
    };
    let key_offsets = crate::kv_diff::key_offsets_for(g, scenario.types, scenario.max_ctx);
    let pool = KvPool::new(g, scenario.types, config)
        .and_then(|p| match &key_offsets {
            Some(o) => p.with_key_offsets(o.clone()),
            None => Ok(p),
        })
        .map_err(|e| at_start(format!("KvPool::new failed: {e}")))?;
    pool.set_budget(usize::from(scenario.budget_blocks) * pool.block_bytes());
    let gate = Arc::new(RefuseNext::default());
    pool.set_alloc_gate(Some(gate.clone()));
    let mut w = World {
        pool,
        gate,
        seqs: Vec::new(),
        max_ctx: scenario.max_ctx,
        types: scenario.types,
        published: HashSet::new(),
        key_offsets,
    };
    w.push_empty().map_err(at_start)?;
    w.check().map_err(at_start)?;
    for (index, op) in scenario.ops.iter().enumerate() {
        let diverged = |detail: String| PoolDivergence {
            op: Some((index, op.clone())),
            detail,
        };
        let bytes_before = w.pool.stats().bytes;
        w.step(op).map_err(diverged)?;
        if !matches!(op, PoolOp::RefuseNextAlloc) {
            w.gate.0.store(false, Ordering::Relaxed);
        }
        w.check().map_err(diverged)?;
        let s = w.pool.stats();
        if s.bytes > s.budget && s.bytes > bytes_before {
            return Err(diverged(format!(
                "the pool grew to {} bytes past its budget of {} (from {bytes_before})",
                s.bytes, s.budget
            )));
        }
    }
    Ok(())
}

impl World {
    fn geometry(&self) -> KvGeometry {
        self.pool.geometry()
    }

    fn dense(&self) -> Result<DenseKv, String> {
        DenseKv::with_types(self.geometry(), self.max_ctx, self.types)
            .and_then(|d| match &self.key_offsets {
                Some(o) => d.with_key_offsets(o.clone()),
                None => Ok(d),
            })
            .map_err(|e| format!("DenseKv::with_types failed: {e}"))
    }

    fn push_empty(&mut self) -> Result<(), String> {
        let paged = self
            .pool
            .sequence(self.max_ctx)
            .map_err(|e| format!("KvPool::sequence failed: {e}"))?;
        let dense = self.dense()?;
        self.seqs.push(Seq {
            paged,
            dense,
            ids: Vec::new(),
        });
        Ok(())
    }

    fn step(&mut self, op: &PoolOp) -> Result<(), String> {
        let pick = |seq: u8, n: usize| usize::from(seq) % n;
        if self.seqs.is_empty() {
            self.push_empty()?;
        }
        let n = self.seqs.len();
        match op {
            PoolOp::RefuseNextAlloc => self.gate.0.store(true, Ordering::Relaxed),
            PoolOp::EvictIdle => {
                self.pool.evict_idle();
            }
            PoolOp::SetBudget { blocks } => {
                self.pool
                    .set_budget(usize::from(*blocks) * self.pool.block_bytes());
            }
            PoolOp::Append {
                seq,
                back,
                tokens,
                end,
            } => {
                let i = pick(*seq, n);
                self.append(i, usize::from(*back), tokens, *end)?;
            }
            PoolOp::Publish { seq } => {
                let s = &mut self.seqs[pick(*seq, n)];
                s.paged
                    .publish(&s.ids)
                    .map_err(|e| format!("publish failed: {e}"))?;
                let b = self.pool.block_len();
                for j in 1..=s.ids.len() / b {
                    self.published.insert(s.ids[..j * b].to_vec());
                }
            }
            PoolOp::Lookup { seq, keep, extra } => {
                let src = &self.seqs[pick(*seq, n)].ids;
                let keep = usize::from(*keep) % (src.len() + 1);
                let mut query = src[..keep].to_vec();
                query.extend(extra.iter().map(|&t| u32::from(t % VOCAB)));
                self.lookup(&query)?;
            }
            PoolOp::Fork { seq } => {
                let s = &self.seqs[pick(*seq, n)];
                let paged = s.paged.fork().map_err(|e| format!("fork failed: {e}"))?;
                let dense = s.dense.fork().map_err(|e| format!("dense fork: {e}"))?;
                let ids = s.ids.clone();
                if self.seqs.len() < MAX_SEQS {
                    self.seqs.push(Seq { paged, dense, ids });
                }
            }
            PoolOp::Truncate { seq, back } => {
                let s = &mut self.seqs[pick(*seq, n)];
                let keep = s.ids.len().saturating_sub(usize::from(*back));
                s.paged
                    .truncate(keep)
                    .map_err(|e| format!("truncate failed: {e}"))?;
                s.dense
                    .truncate(keep)
                    .map_err(|e| format!("dense truncate: {e}"))?;
                s.ids.truncate(keep);
            }
            PoolOp::Free { seq } => {
                self.seqs.remove(pick(*seq, n));
            }
        }
        Ok(())
    }

    fn append(&mut self, i: usize, back: usize, tokens: &[u8], end: PoolEnd) -> Result<(), String> {
        let g = self.geometry();
        let s = &mut self.seqs[i];
        let at = s.ids.len().saturating_sub(back);
        let mut ids = s.ids[..at].to_vec();
        ids.extend(tokens.iter().map(|&t| u32::from(t % VOCAB)));
        let n = tokens.len();
        // The pool's plan, asked first, foretells an append at the end: refused for
        // blocks exactly when it says the append does not fit.
        let planned = (back == 0 && at + n <= s.paged.max_ctx())
            .then(|| s.paged.pool().plan(&[(&s.paged, n)])[0]);
        let (pr, dr) = (s.paged.begin(at, n), s.dense.begin(at, n));
        if let Some(fits) = planned
            && matches!(&pr, Ok(()) | Err(KvError::PoolFull { .. }))
            && fits == matches!(&pr, Err(KvError::PoolFull { .. }))
        {
            if pr.is_ok() {
                s.paged.rollback();
            }
            if dr.is_ok() {
                s.dense.rollback();
            }
            return Err(format!(
                "begin({at}, {n}): plan said fits={fits}, begin {pr:?}"
            ));
        }
        match (&pr, &dr) {
            (Ok(()), Ok(())) => {}
            (Err(p), Err(d)) if p == d => return Ok(()),
            (Err(KvError::PoolFull { .. } | KvError::AllocFailed { .. }), Ok(())) => {
                s.dense.rollback();
                return Ok(()); // `check` then compares with the unchanged reference.
            }
            _ => {
                if pr.is_ok() {
                    s.paged.rollback();
                }
                if dr.is_ok() {
                    s.dense.rollback();
                }
                return Err(format!("begin({at}, {n}): paged {pr:?}, dense {dr:?}"));
            }
        }
        let layers = match end {
            PoolEnd::FailAfter(k) => usize::from(k) % (g.n_layers + 1),
            _ => g.n_layers,
        };
        for layer in 0..layers {
            let (k, v) = fake_rows(&ids, at, layer, g.kv_dim());
            let s = &mut self.seqs[i];
            let (pw, dw) = (
                s.paged.write(layer, k.view(), v.view()),
                s.dense.write(layer, k.view(), v.view()),
            );
            if pw != dw {
                return Err(format!("write({layer}): paged {pw:?}, dense {dw:?}"));
            }
            self.same_views()?;
        }
        let s = &mut self.seqs[i];
        if end == PoolEnd::Commit {
            let (pc, dc) = (s.paged.commit(), s.dense.commit());
            if pc != dc {
                return Err(format!("commit: paged {pc:?}, dense {dc:?}"));
            }
            if pc.is_ok() {
                s.ids = ids;
                return Ok(());
            }
        }
        s.paged.rollback();
        s.dense.rollback();
        Ok(())
    }

    fn lookup(&mut self, query: &[u32]) -> Result<(), String> {
        let b = self.pool.block_len();
        let paged = self
            .pool
            .lookup(query, self.max_ctx)
            .map_err(|e| format!("lookup failed: {e}"))?;
        let m = paged.len();
        if !m.is_multiple_of(b) || m > query.len() || m > self.max_ctx {
            return Err(format!(
                "lookup of {} tokens (max_ctx {}) found {m} positions, blocks of {b}",
                query.len(),
                self.max_ctx
            ));
        }
        if m > 0 && !self.published.contains(&query[..m]) {
            return Err(format!("lookup found {m} positions nobody published"));
        }
        if self.pool.stats().evicted == 0 {
            let longest = (1..=query.len().min(self.max_ctx) / b)
                .rev()
                .map(|j| j * b)
                .find(|&l| self.published.contains(&query[..l]))
                .unwrap_or(0);
            if m != longest {
                return Err(format!(
                    "lookup found {m} positions with nothing evicted; {longest} are published"
                ));
            }
        }
        let ids = query[..m].to_vec();
        let mut dense = self.dense()?;
        let g = self.geometry();
        dense.begin(0, m).map_err(|e| format!("dense begin: {e}"))?;
        for layer in 0..g.n_layers {
            let (k, v) = fake_rows(&ids, 0, layer, g.kv_dim());
            dense
                .write(layer, k.view(), v.view())
                .map_err(|e| format!("dense write: {e}"))?;
        }
        dense.commit().map_err(|e| format!("dense commit: {e}"))?;
        let seq = Seq { paged, dense, ids };
        if self.seqs.len() < MAX_SEQS {
            self.seqs.push(seq);
        } else {
            // Checked against its reference, then dropped.
            same_seq(&seq)?;
        }
        Ok(())
    }

    fn same_views(&self) -> Result<(), String> {
        self.seqs.iter().try_for_each(same_seq)
    }

    /// Every sequence against its reference, and the pool's books.
    fn check(&self) -> Result<(), String> {
        self.same_views()?;
        let b = self.pool.block_len();
        let stats = self.pool.stats();
        let cached: HashSet<u64> = self.pool.cached_block_ids().into_iter().collect();
        let mut alive = cached.clone();
        let mut occurrences = std::collections::HashMap::<u64, usize>::new();
        for s in &self.seqs {
            for id in s.paged.block_ids() {
                *occurrences.entry(id).or_default() += 1;
                alive.insert(id);
            }
        }
        if alive.len() != stats.blocks {
            return Err(format!(
                "{} blocks alive, {} reachable from the tables and the cache",
                stats.blocks,
                alive.len()
            ));
        }
        if stats.bytes != stats.blocks * stats.block_bytes {
            return Err(format!(
                "pool bytes {} for {} blocks of {}",
                stats.bytes, stats.blocks, stats.block_bytes
            ));
        }
        if stats.cached != cached.len() {
            return Err(format!(
                "{} cached, {} cache ids",
                stats.cached,
                cached.len()
            ));
        }
        for (si, s) in self.seqs.iter().enumerate() {
            let ids = s.paged.block_ids();
            if ids.len() != s.ids.len().div_ceil(b) {
                return Err(format!(
                    "sequence {si} of {} positions has {} blocks of {b}",
                    s.ids.len(),
                    ids.len()
                ));
            }
            if s.paged.bytes() != ids.len() * stats.block_bytes {
                return Err(format!("sequence {si}: bytes {}", s.paged.bytes()));
            }
            for (id, refs) in ids.iter().zip(s.paged.block_refs()) {
                let want = occurrences[id] + usize::from(cached.contains(id));
                if refs != want {
                    return Err(format!(
                        "block {id} has {refs} references, {want} holders (sequence {si})"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A sequence against its reference: lengths, then every layer's positions and bytes.
fn same_seq(s: &Seq) -> Result<(), String> {
    if s.paged.len() != s.ids.len() || s.dense.len() != s.ids.len() {
        return Err(format!(
            "len: paged {}, dense {}, tokens {}",
            s.paged.len(),
            s.dense.len(),
            s.ids.len()
        ));
    }
    for layer in 0..s.paged.geometry().n_layers {
        if !same_layer(&s.paged, &s.dense, layer)? {
            let (p, d): (LayerBits, LayerBits) =
                (layer_bits(&s.paged, layer)?, layer_bits(&s.dense, layer)?);
            return Err(format!(
                "layer {layer}: paged positions {:?} K {:02x?}, dense positions {:?} K {:02x?}",
                p.0, p.1, d.0, d.1
            ));
        }
    }
    Ok(())
}
