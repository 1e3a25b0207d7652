//! The prefix cache's second tier (`kvcore::kv::tier`): blocks a pool published are
//! found again through a `DiskTier` after the pool, or the process, is gone, bit for bit
//! the rows a dense store computes; records that are truncated, corrupt or filed under
//! another key are skipped and removed, never loaded; pools of another namespace, type
//! or secret never see them; the directory keeps to its budget, least recently used
//! first; two tiers sharing a directory write the same blocks safely.

use std::path::{Path, PathBuf};

use super::*;
use crate::kv::{
    Append, DenseKv, KvError, KvGeometry, KvPool, KvStore, KvType, PagedKv, PoolConfig,
};
use ndarray::Array2;

const G: KvGeometry = KvGeometry {
    n_layers: 2,
    n_kv_heads: 2,
    head_dim: 32,
};
const BLOCK: usize = 4;
const CTX: usize = 64;

/// The rows a token prefix "computes": a function of every id up to the position.
fn rows(ids: &[u32], from: usize, layer: usize) -> (Array2<f32>, Array2<f32>) {
    let dim = G.kv_dim();
    let mut h: u32 = 17;
    let mut k = Vec::new();
    for (p, &id) in ids.iter().enumerate() {
        h = h.wrapping_mul(31).wrapping_add(id + 1);
        if p >= from {
            k.extend((0..dim as u32).map(|i| {
                let x = h.wrapping_add(i.wrapping_mul(7919) + 101 * layer as u32) % 2001;
                x as f32 / 250.0 - 4.0
            }));
        }
    }
    let k = Array2::from_shape_vec((ids.len() - from, dim), k).unwrap();
    let v = k.mapv(|x| 0.5 - x);
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

/// SHA-256 of every stored byte of every layer's K rows, then its V rows, in position
/// order (a digest, so that a mismatch prints two lines).
fn bytes<K: KvStore>(kv: &K) -> String {
    let mut h = Sha256::new();
    for layer in 0..G.n_layers {
        let view = kv.view(layer).unwrap();
        for values in [false, true] {
            for s in view.segments() {
                let rows = if values { s.values() } else { s.keys() };
                for t in 0..rows.len() {
                    for kvh in 0..G.n_kv_heads {
                        h.update(rows.head_bytes(t, kvh).unwrap());
                    }
                }
            }
        }
    }
    hex(&h.finalize())
}

fn dense(types: (KvType, KvType), ids: &[u32]) -> String {
    let mut d = DenseKv::with_types(G, CTX, types).unwrap();
    run(&mut d, ids, 0).unwrap();
    bytes(&d)
}

struct Setup {
    types: (KvType, KvType),
    key: [u8; 32],
    namespace: &'static [u8],
    budget: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            types: (KvType::F32, KvType::F32),
            key: [3; 32],
            namespace: b"model A",
            budget: 1 << 24,
        }
    }
}

impl Setup {
    fn pool(&self, tier: &Arc<DiskTier>) -> KvPool {
        let config = PoolConfig {
            block_len: BLOCK,
            budget: self.budget,
            key: self.key,
        };
        let tier: Arc<dyn KvTier> = tier.clone();
        KvPool::new(G, self.types, config)
            .unwrap()
            .with_tier(tier, self.namespace)
            .unwrap()
    }
}

fn tier(dir: &Path) -> Arc<DiskTier> {
    Arc::new(DiskTier::open(dir, 1 << 30).unwrap())
}

/// Runs `ids` in a new sequence of `pool`, publishes it and waits for the tier's writes.
fn publish(pool: &KvPool, tier: &DiskTier, ids: &[u32]) -> PagedKv {
    let mut seq = pool.sequence(CTX).unwrap();
    run(&mut seq, ids, 0).unwrap();
    seq.publish(ids).unwrap();
    tier.flush();
    seq
}

fn records(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kvb"))
        .collect();
    v.sort();
    v
}

#[test]
fn blocks_outlive_the_pool_and_come_back_bitwise_for_every_type() {
    let ids: Vec<u32> = (0..14).map(|i| i * 3 + 1).collect();
    for t in KvType::ALL {
        let types = (t, t);
        let dir = tempfile::tempdir().unwrap();
        let setup = Setup {
            types,
            ..Setup::default()
        };
        {
            let tier = tier(dir.path());
            let pool = setup.pool(&tier);
            publish(&pool, &tier, &ids);
            assert_eq!(
                tier.stats().records,
                3,
                "{t}: three full blocks of 14 positions"
            );
        }
        // A new process: a new tier over the same directory, a new pool.
        let tier = tier(dir.path());
        assert_eq!(tier.stats().records, 3);
        let pool = setup.pool(&tier);
        let mut seq = pool.lookup(&ids, CTX).unwrap();
        assert_eq!(seq.len(), 12, "{t}");
        let stats = pool.stats();
        assert_eq!((stats.blocks_hit, stats.tier_hits), (0, 3), "{t}");
        run(&mut seq, &ids, 12).unwrap();
        assert_eq!(bytes(&seq), dense(types, &ids), "{t}: rows from the tier");
        // Loaded blocks are cached in RAM again: the next lookup needs no tier.
        let again = pool.lookup(&ids, CTX).unwrap();
        assert_eq!(again.len(), 12);
        assert_eq!(pool.stats().tier_hits, 3);
        assert_eq!(pool.stats().blocks_hit, 3);
    }
}

#[test]
fn blocks_evicted_from_ram_are_found_in_the_tier() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path());
    let setup = Setup::default();
    let pool = setup.pool(&tier);
    let bb = pool.block_bytes();
    pool.set_budget(3 * bb);
    let a: Vec<u32> = (0..8).collect();
    drop(publish(&pool, &tier, &a));
    // Another prompt takes every block: a's two are evicted from RAM.
    let b: Vec<u32> = (100..112).collect();
    let seq_b = publish(&pool, &tier, &b);
    assert_eq!(pool.stats().evicted, 2);
    drop(seq_b);
    let mut seq = pool.lookup(&a, CTX).unwrap();
    assert_eq!(seq.len(), 8);
    assert_eq!(pool.stats().tier_hits, 2);
    run(&mut seq, &a, 8).unwrap();
    assert_eq!(bytes(&seq), dense(setup.types, &a));
}

#[test]
fn other_namespaces_types_and_secrets_never_see_the_records() {
    let ids: Vec<u32> = (0..8).collect();
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path());
    let base = Setup::default();
    publish(&base.pool(&tier), &tier, &ids);
    let others = [
        Setup {
            namespace: b"model B",
            ..Setup::default()
        },
        Setup {
            types: (KvType::F32, KvType::F16),
            ..Setup::default()
        },
        Setup {
            key: [4; 32],
            ..Setup::default()
        },
    ];
    for other in others {
        let pool = other.pool(&tier);
        assert_eq!(pool.lookup(&ids, CTX).unwrap().len(), 0);
        let stats = pool.stats();
        assert_eq!(
            (stats.tier_hits, stats.tier_misses, stats.tier_rejected),
            (0, 1, 0)
        );
    }
    assert_eq!(base.pool(&tier).lookup(&ids, CTX).unwrap().len(), 8);
}

/// Damage to the second of three records: the lookup keeps the first block, skips and
/// removes the damaged record, loads nothing of it, and the pool stays usable.
#[test]
fn truncated_corrupt_and_misfiled_records_are_skipped_and_removed() {
    let ids: Vec<u32> = (0..12).collect();
    type Damage = fn(&Path, &Path);
    let damages: [(&str, Damage); 4] = [
        ("truncated", |p, _| {
            let b = fs::read(p).unwrap();
            fs::write(p, &b[..b.len() - 1]).unwrap();
        }),
        ("one bit flipped", |p, _| {
            let mut b = fs::read(p).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
            fs::write(p, b).unwrap();
        }),
        ("empty", |p, _| fs::write(p, b"").unwrap()),
        ("another key's record", |p, other| {
            fs::copy(other, p).map(drop).unwrap()
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        let setup = Setup::default();
        let tier0 = tier(dir.path());
        drop(publish(&setup.pool(&tier0), &tier0, &ids));
        drop(tier0);
        // Which file holds block 1: the one a pool without block 1 in RAM asks for.
        let files = records(dir.path());
        assert_eq!(files.len(), 3);
        let second = (0..3)
            .find(|&i| {
                let saved = fs::read(&files[i]).unwrap();
                fs::remove_file(&files[i]).unwrap();
                let t = tier(dir.path());
                let n = setup.pool(&t).lookup(&ids, CTX).unwrap().len();
                fs::write(&files[i], saved).unwrap();
                n == BLOCK
            })
            .expect("one record is block 1");
        let other = files[(second + 1) % 3].clone();
        damage(&files[second], &other);

        let tier = tier(dir.path());
        let pool = setup.pool(&tier);
        let mut seq = pool.lookup(&ids, CTX).unwrap();
        assert_eq!(seq.len(), BLOCK, "{what}: only the block before the damage");
        assert_eq!(pool.stats().tier_rejected, 1, "{what}");
        assert!(!files[second].exists(), "{what}: the record is removed");
        run(&mut seq, &ids, BLOCK).unwrap();
        assert_eq!(bytes(&seq), dense(setup.types, &ids), "{what}");
    }
}

/// What a process killed in the middle of a write leaves (a temporary file, never
/// renamed into place) is ignored by the next start and removed once stale.
#[test]
fn a_write_cut_short_leaves_the_complete_records_usable() {
    let ids: Vec<u32> = (0..8).collect();
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::default();
    {
        let tier = tier(dir.path());
        publish(&setup.pool(&tier), &tier, &ids);
    }
    let full = fs::read(&records(dir.path())[0]).unwrap();
    let tmp = dir.path().join(format!("{}.4242.1.tmp", "ab".repeat(32)));
    fs::write(&tmp, &full[..full.len() / 3]).unwrap();
    let tier = tier(dir.path());
    assert_eq!(tier.stats().records, 2);
    assert!(
        tmp.exists(),
        "a fresh temporary file may be another process's write"
    );
    assert_eq!(setup.pool(&tier).lookup(&ids, CTX).unwrap().len(), 8);
    drop(tier);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
    fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let _tier = self::tier(dir.path());
    assert!(!tmp.exists(), "a stale temporary file is removed");
}

#[test]
fn the_directory_keeps_to_its_budget_least_recently_used_first() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::default();
    let probe = tier(dir.path());
    let one: Vec<u32> = (0..4).collect();
    publish(&setup.pool(&probe), &probe, &one);
    let record = probe.stats().bytes;
    drop(probe);
    fs::remove_file(&records(dir.path())[0]).unwrap();

    let tier = Arc::new(DiskTier::open(dir.path(), 2 * record).unwrap());
    let pool = setup.pool(&tier);
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|p| (0..4).map(|i| 1000 * p + i).collect())
        .collect();
    drop(publish(&pool, &tier, &prompts[0]));
    drop(publish(&pool, &tier, &prompts[1]));
    // Use prompt 0's record (through a fresh pool: RAM would answer otherwise).
    assert_eq!(setup.pool(&tier).lookup(&prompts[0], CTX).unwrap().len(), 4);
    drop(publish(&pool, &tier, &prompts[2]));
    let stats = tier.stats();
    assert_eq!((stats.records, stats.evicted), (2, 1));
    assert!(stats.bytes <= 2 * record);
    let fresh = setup.pool(&tier);
    assert_eq!(
        fresh.lookup(&prompts[1], CTX).unwrap().len(),
        0,
        "the oldest went"
    );
    assert_eq!(fresh.lookup(&prompts[0], CTX).unwrap().len(), 4);
    assert_eq!(fresh.lookup(&prompts[2], CTX).unwrap().len(), 4);
}

#[test]
fn two_tiers_on_one_directory_write_the_same_blocks_safely() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::default();
    let ids: Vec<u32> = (0..40).collect();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let tier = tier(dir.path());
                for round in 0..5 {
                    let n = 8 + 8 * round;
                    publish(&setup.pool(&tier), &tier, &ids[..n]);
                }
            });
        }
    });
    let tier = tier(dir.path());
    assert_eq!(tier.stats().records, 10);
    let pool = setup.pool(&tier);
    let seq = pool.lookup(&ids, CTX).unwrap();
    assert_eq!((seq.len(), pool.stats().tier_rejected), (40, 0));
    assert_eq!(bytes(&seq), dense(setup.types, &ids));
}

#[test]
fn a_tier_is_set_on_a_new_pool_only() {
    let dir = tempfile::tempdir().unwrap();
    let t: Arc<dyn KvTier> = tier(dir.path());
    let config = PoolConfig {
        block_len: BLOCK,
        budget: 1 << 20,
        key: [0; 32],
    };
    let pool = KvPool::new(G, (KvType::F32, KvType::F32), config).unwrap();
    let _seq = pool.sequence(CTX).unwrap();
    assert!(matches!(
        pool.with_tier(t, b"x"),
        Err(KvError::PoolShared { what: "tier" })
    ));
}
