//! A second tier below a [`KvPool`](super::KvPool)'s RAM for its prefix cache:
//! [`KvTier`], the small trait a pool stores its published blocks through and asks when a
//! prompt's chain runs past what RAM holds, the record format every tier stores, and
//! [`DiskTier`], a directory of records that outlives the process.
//!
//! ## What a tier holds
//! A pool with a tier ([`KvPool::with_tier`](super::KvPool::with_tier)) offers each block
//! it newly caches ([`PagedKv::publish`](super::PagedKv::publish)) to the tier as a
//! [`TierRecord`], under a [`TierKey`]: SHA-256 of the pool's *identity* (the embedder's
//! namespace — the model's fingerprint and everything else the rows depend on: backend,
//! kernel path, activations — the K/V types, the geometry, the block length and the key
//! codec's calibration) and the block's chained prefix hash (keyed with the pool's
//! secret). Two pools share records exactly when their identities and secrets agree, so
//! the replicas of one deployment share a tier by sharing the secret, and a record of
//! another model, type or calibration is never asked for.
//!
//! `put` must not block its caller on I/O (it runs in a scheduler's step): a tier queues
//! the record (which holds its block, immutable once cached, until it is written) and
//! drops it when the queue is full. The record's bytes are made by whoever writes them
//! ([`TierRecord::to_bytes`]), off the caller's thread.
//!
//! ## The record
//! `"KVTIER01"`, the key (32 bytes), the payload's length (u64 LE), the payload (the K
//! rows then the V rows of every layer, `[n_layers · block_len]` rows each, in the state
//! file's little-endian layout), then SHA-256 of everything before it. The pool accepts
//! a record only when its length is exactly the one its geometry and types give, its
//! checksum holds and its key is the one asked for; anything else (truncated, corrupt,
//! written under another key) is skipped, [`remove`](KvTier::remove)d and counted
//! (`PoolStats::tier_rejected`), never loaded.
//!
//! ## The disk tier
//! One file per record, named by the key in hex (`<key>.kvb`), written to a temporary
//! name and renamed into place, so a process killed in the middle of a write leaves at
//! most a stray temporary file (removed by a later start once it is a minute old) and
//! every complete record intact. Several processes may share a directory: a rename
//! replaces a record by the same bytes. The directory is bounded by a byte budget,
//! least recently used records removed first (use order survives restarts through the
//! files' modification times, refreshed on each read).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::KvCodec;
use super::paged::Block;

/// A record's key in a tier (see the module docs).
pub type TierKey = [u8; 32];

/// A second tier for a pool's prefix cache (see the module docs). `Send + Sync`: a pool
/// is shared between threads.
pub trait KvTier: Send + Sync + fmt::Debug {
    /// Keeps `record` under its key. Must not block on I/O: queue it or drop it.
    fn put(&self, record: TierRecord);
    /// The bytes stored under `key`, if any (the pool checks them).
    fn get(&self, key: &TierKey) -> Option<Vec<u8>>;
    /// Forgets `key` (the pool found its record unusable).
    fn remove(&self, key: &TierKey);
    /// The tier's counters now.
    fn stats(&self) -> TierStats;
}

/// A tier's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Records held (as far as this process knows).
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The byte budget.
    pub budget: u64,
    /// Bytes written since the tier was opened.
    pub bytes_written: u64,
    /// Bytes read since the tier was opened.
    pub bytes_read: u64,
    /// Records removed to stay within the budget.
    pub evicted: u64,
    /// Records not written because the write queue was full.
    pub dropped: u64,
    /// Reads or writes that failed (a read of a record that is not there is no error).
    pub errors: u64,
}

/// A block on its way to a tier: its key and its rows (see the module docs).
pub struct TierRecord {
    key: TierKey,
    block: Arc<Block>,
    codecs: (KvCodec, KvCodec),
    rows: usize,
    n_kv_heads: usize,
}

const MAGIC: &[u8; 8] = b"KVTIER01";
const HEADER: usize = 8 + 32 + 8;
const TRAILER: usize = 32;

impl TierRecord {
    pub(super) fn new(
        key: TierKey,
        block: Arc<Block>,
        codecs: (KvCodec, KvCodec),
        rows: usize,
        n_kv_heads: usize,
    ) -> TierRecord {
        TierRecord {
            key,
            block,
            codecs,
            rows,
            n_kv_heads,
        }
    }

    /// The record's key.
    pub fn key(&self) -> &TierKey {
        &self.key
    }

    /// The record's bytes (the layout in the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let payload = self
            .block
            .bytes_le(self.rows, self.n_kv_heads, &self.codecs);
        let mut out = Vec::with_capacity(HEADER + payload.len() + TRAILER);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&payload);
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }
}

impl fmt::Debug for TierRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierRecord")
            .field("key", &hex(&self.key))
            .finish_non_exhaustive()
    }
}

/// The payload of `bytes` when they are a whole record of `key` with a payload of
/// `payload_len` bytes and a checksum that holds; `None` otherwise.
pub(super) fn payload<'b>(bytes: &'b [u8], key: &TierKey, payload_len: usize) -> Option<&'b [u8]> {
    if bytes.len() != HEADER.checked_add(payload_len)?.checked_add(TRAILER)? {
        return None;
    }
    let (body, sum) = bytes.split_at(bytes.len() - TRAILER);
    let ok = body[..8] == MAGIC[..]
        && body[8..40] == key[..]
        && body[40..48] == (payload_len as u64).to_le_bytes()
        && Sha256::digest(body)[..] == sum[..];
    ok.then(|| &body[HEADER..])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<TierKey> {
    if s.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

/// Records written but not yet renamed into place are removed by a start once older
/// than this (another live process may be writing them).
const STALE_TEMP: Duration = Duration::from_secs(60);
/// Records waiting to be written; more are dropped.
const QUEUE: usize = 256;

/// A tier in a directory (see the module docs). Dropping it writes what is queued.
pub struct DiskTier {
    shared: Arc<DiskShared>,
    queue: Mutex<Option<SyncSender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

struct DiskShared {
    dir: PathBuf,
    budget: u64,
    index: Mutex<Index>,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    evicted: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
}

/// Records this process knows, with their sizes and use order.
#[derive(Default)]
struct Index {
    files: HashMap<TierKey, (u64, u64)>,
    lru: BTreeMap<u64, TierKey>,
    tick: u64,
    bytes: u64,
}

impl Index {
    fn insert(&mut self, key: TierKey, size: u64) {
        self.remove(&key);
        self.tick += 1;
        self.files.insert(key, (size, self.tick));
        self.lru.insert(self.tick, key);
        self.bytes += size;
    }

    fn remove(&mut self, key: &TierKey) -> bool {
        match self.files.remove(key) {
            Some((size, tick)) => {
                self.lru.remove(&tick);
                self.bytes -= size;
                true
            }
            None => false,
        }
    }
}

enum Job {
    Write(TierRecord),
    Flush(SyncSender<()>),
}

impl DiskTier {
    /// The tier in `dir` (created if missing) holding at most `budget` bytes of records:
    /// the records already there are indexed (oldest use first, by modification time),
    /// temporary files of writes that never finished are removed once a minute old, and
    /// the budget is applied.
    ///
    /// # Errors
    /// The directory cannot be created or read, or the writer thread cannot start.
    pub fn open(dir: impl AsRef<Path>, budget: u64) -> io::Result<DiskTier> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir)?;
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let meta = entry.metadata()?;
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(".tmp") {
                let age = SystemTime::now()
                    .duration_since(modified)
                    .unwrap_or_default();
                if age > STALE_TEMP {
                    let _ = fs::remove_file(entry.path());
                }
            } else if let Some(key) = name.strip_suffix(".kvb").and_then(unhex) {
                found.push((modified, key, meta.len()));
            }
        }
        found.sort();
        let mut index = Index::default();
        for (_, key, size) in found {
            index.insert(key, size);
        }
        let shared = Arc::new(DiskShared {
            dir,
            budget,
            index: Mutex::new(index),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        });
        shared.evict_to_budget();
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("kvcore-disk-tier".into())
                .spawn(move || shared.write_loop(rx))?
        };
        Ok(DiskTier {
            shared,
            queue: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Waits until every record queued before this call is written (or failed).
    pub fn flush(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = match &*lock(&self.queue) {
            Some(q) => q.send(Job::Flush(tx)).is_ok(),
            None => false,
        };
        if sent {
            let _ = rx.recv();
        }
    }
}

impl DiskShared {
    fn path(&self, key: &TierKey) -> PathBuf {
        self.dir.join(format!("{}.kvb", hex(key)))
    }

    fn write_loop(&self, rx: Receiver<Job>) {
        let mut n = 0u64;
        for job in rx {
            match job {
                Job::Write(record) => {
                    n += 1;
                    // A failed write loses one record of a cache; the tier goes on.
                    if self.write(&record, n).is_err() {
                        self.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn write(&self, record: &TierRecord, n: u64) -> io::Result<()> {
        let bytes = record.to_bytes();
        let path = self.path(record.key());
        let tmp = self.dir.join(format!(
            "{}.{}.{n}.tmp",
            hex(record.key()),
            std::process::id()
        ));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
            return written;
        }
        self.bytes_written
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        lock(&self.index).insert(*record.key(), bytes.len() as u64);
        self.evict_to_budget();
        Ok(())
    }

    fn evict_to_budget(&self) {
        let mut index = lock(&self.index);
        while index.bytes > self.budget {
            let Some((_, &key)) = index.lru.first_key_value() else {
                break;
            };
            index.remove(&key);
            let _ = fs::remove_file(self.path(&key));
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl KvTier for DiskTier {
    fn put(&self, record: TierRecord) {
        // The index alone decides (no file system call on the caller's thread); a record
        // that vanished leaves it at the next `get`.
        if lock(&self.shared.index).files.contains_key(record.key()) {
            return;
        }
        if let Some(q) = &*lock(&self.queue) {
            match q.try_send(Job::Write(record)) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn get(&self, key: &TierKey) -> Option<Vec<u8>> {
        let path = self.shared.path(key);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    lock(&self.shared.index).remove(key);
                } else {
                    self.shared.errors.fetch_add(1, Ordering::Relaxed);
                }
                return None;
            }
        };
        // Refresh the use order, here and (through the modification time) for the
        // next start. A record another process wrote is indexed now.
        if let Ok(f) = fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        self.shared
            .bytes_read
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        lock(&self.shared.index).insert(*key, bytes.len() as u64);
        Some(bytes)
    }

    fn remove(&self, key: &TierKey) {
        lock(&self.shared.index).remove(key);
        let _ = fs::remove_file(self.shared.path(key));
    }

    fn stats(&self) -> TierStats {
        let s = &self.shared;
        let index = lock(&s.index);
        TierStats {
            records: index.files.len() as u64,
            bytes: index.bytes,
            budget: s.budget,
            bytes_written: s.bytes_written.load(Ordering::Relaxed),
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
            evicted: s.evicted.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has written what is queued.
        lock(&self.queue).take();
        if let Some(w) = lock(&self.writer).take() {
            let _ = w.join();
        }
    }
}

impl fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.shared.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each guarded value's invariants hold between statements.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// Files and threads: native only.
#[cfg(all(test, not(target_family = "wasm")))]
mod tests;
