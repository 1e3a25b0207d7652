//! The prefix cache's second tier for `kvcore serve` (`--kv-tier`): a directory
//! ([`DiskTier`], the library's) or a Redis server shared by replicas ([`RedisTier`]),
//! and the secret that keys its records, shared by the replicas of one deployment.
//!
//! The records and their checks are the library's (`kvcore::kv::tier`): the pool
//! accepts only whole, checksummed records of the key it asked for, so a tier here only
//! moves bytes.

use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use kvcore_engine::kvcore::kv::{DiskTier, KvTier, TierKey, TierRecord, TierStats};

use crate::ServeError;

/// Where the tier lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierLocation {
    /// A directory (created if missing).
    Dir(PathBuf),
    /// A Redis server, `redis://HOST:PORT[/DB]`.
    Redis(String),
}

impl TierLocation {
    /// `redis://…` (or `rediss://…`) names a Redis server; anything else a directory.
    pub fn parse(s: &str) -> TierLocation {
        if s.starts_with("redis://") || s.starts_with("rediss://") || s.starts_with("redis+unix://")
        {
            TierLocation::Redis(s.to_string())
        } else {
            TierLocation::Dir(PathBuf::from(s))
        }
    }
}

/// The tier's settings.
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// Where.
    pub location: TierLocation,
    /// Most bytes of records in a directory tier (a Redis tier is bounded by the Redis
    /// server's own `maxmemory` with an LRU policy).
    pub budget: u64,
    /// The file holding the 32-byte secret the records are keyed with (created, mode
    /// 0600, when absent); `None`: `secret` in the tier's directory (a Redis tier needs
    /// one named).
    pub secret_file: Option<PathBuf>,
}

/// Opens the tier and its secret.
pub fn open(config: &TierConfig) -> Result<(Arc<dyn KvTier>, [u8; 32]), ServeError> {
    let secret_file = match (&config.secret_file, &config.location) {
        (Some(f), _) => f.clone(),
        (None, TierLocation::Dir(dir)) => dir.join("secret"),
        (None, TierLocation::Redis(_)) => {
            return Err(ServeError::Config(
                "--kv-tier redis://… needs --kv-tier-secret-file (the replicas of one deployment share it)".into(),
            ));
        }
    };
    let tier: Arc<dyn KvTier> = match &config.location {
        TierLocation::Dir(dir) => Arc::new(
            DiskTier::open(dir, config.budget)
                .map_err(|e| ServeError::Config(format!("--kv-tier {}: {e}", dir.display())))?,
        ),
        TierLocation::Redis(url) => Arc::new(RedisTier::open(url)?),
    };
    let secret = secret(&secret_file)?;
    Ok((tier, secret))
}

/// The secret in `path`, or a new one from the operating system's random source written
/// there with mode 0600 (created exclusively: when two replicas start at once, one
/// writes it and the other reads it).
fn secret(path: &Path) -> Result<[u8; 32], ServeError> {
    let err =
        |e: io::Error| ServeError::Config(format!("--kv-tier-secret-file {}: {e}", path.display()));
    let read = |path: &Path| -> Result<[u8; 32], ServeError> {
        let mut bytes = Vec::new();
        fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(err)?;
        bytes.try_into().map_err(|b: Vec<u8>| {
            ServeError::Config(format!(
                "--kv-tier-secret-file {}: {} bytes, a secret is 32",
                path.display(),
                b.len()
            ))
        })
    };
    if path.exists() {
        return read(path);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(err)?;
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key)
        .map_err(|e| ServeError::Config(format!("no random secret for the KV tier: {e}")))?;
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(mut f) => {
            f.write_all(&key).map_err(err)?;
            Ok(key)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(path),
        Err(e) => Err(err(e)),
    }
}

/// Records waiting to be written to Redis; more are dropped.
const QUEUE: usize = 256;

/// A tier in a Redis server: `kvcore:kv:<key in hex>` → the record's bytes. Writes go
/// through a queue to a thread of their own; reads take a connection of their own.
pub struct RedisTier {
    url: String,
    reader: Mutex<redis::Connection>,
    queue: Mutex<Option<SyncSender<TierRecord>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    written: AtomicU64,
    read: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

fn redis_key(key: &TierKey) -> String {
    let mut s = String::with_capacity(10 + 64);
    s.push_str("kvcore:kv:");
    for b in key {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

impl RedisTier {
    /// Connects to `url` (twice: reads and writes), checking the server answers.
    pub fn open(url: &str) -> Result<RedisTier, ServeError> {
        let err = |e: redis::RedisError| ServeError::Config(format!("--kv-tier {url}: {e}"));
        let client = redis::Client::open(url).map_err(err)?;
        let mut reader = client.get_connection().map_err(err)?;
        redis::cmd("PING")
            .query::<String>(&mut reader)
            .map_err(err)?;
        let writer_conn = client.get_connection().map_err(err)?;
        let counts = Arc::new(Counts::default());
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = {
            let counts = counts.clone();
            std::thread::Builder::new()
                .name("kvcore-redis-tier".into())
                .spawn(move || write_loop(writer_conn, rx, &counts))
                .map_err(|e| ServeError::Config(format!("--kv-tier {url}: {e}")))?
        };
        Ok(RedisTier {
            url: url.to_string(),
            reader: Mutex::new(reader),
            queue: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            counts,
        })
    }
}

fn write_loop(mut conn: redis::Connection, rx: Receiver<TierRecord>, counts: &Counts) {
    for record in rx {
        let bytes = record.to_bytes();
        // NX: a record another replica wrote is the same bytes; keep its LRU age.
        let set = redis::cmd("SET")
            .arg(redis_key(record.key()))
            .arg(&bytes)
            .arg("NX")
            .query::<Option<String>>(&mut conn);
        match set {
            Ok(_) => {
                counts
                    .written
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvTier for RedisTier {
    fn put(&self, record: TierRecord) {
        if let Some(q) = &*lock(&self.queue)
            && let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = q.try_send(record)
        {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(&self, key: &TierKey) -> Option<Vec<u8>> {
        let got = redis::cmd("GET")
            .arg(redis_key(key))
            .query::<Option<Vec<u8>>>(&mut lock(&self.reader));
        match got {
            Ok(Some(bytes)) => {
                self.counts
                    .read
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Some(bytes)
            }
            Ok(None) => None,
            Err(_) => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn remove(&self, key: &TierKey) {
        let _ = redis::cmd("DEL")
            .arg(redis_key(key))
            .query::<i64>(&mut lock(&self.reader));
    }

    fn stats(&self) -> TierStats {
        TierStats {
            bytes_written: self.counts.written.load(Ordering::Relaxed),
            bytes_read: self.counts.read.load(Ordering::Relaxed),
            dropped: self.counts.dropped.load(Ordering::Relaxed),
            errors: self.counts.failed.load(Ordering::Relaxed),
            ..TierStats::default()
        }
    }
}

impl Drop for RedisTier {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has written what is queued.
        lock(&self.queue).take();
        if let Some(w) = lock(&self.writer).take() {
            let _ = w.join();
        }
    }
}

impl fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTier")
            .field("url", &self.url)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
