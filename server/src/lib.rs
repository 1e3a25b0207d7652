//! `kvcore serve`: an OpenAI-compatible HTTP server over one [`Engine`], with
//! continuous batching over a paged KV pool and its prefix cache.
//!
//! ```text
//!  clients ── HTTP/1.1 ──▶ tokio + axum (one thread)          scheduler thread
//!                          parse, check, admit ── Job ──▶  waiting queue (bounded)
//!                          SSE / JSON  ◀── Event (text) ──  running batch (≤ parallel)
//!                                                           Engine::forward_batch
//!                                                           KvPool: blocks, prefix cache
//! ```
//!
//! - [`api`]: the OpenAI bodies, every field checked (a 400 names the field);
//! - [`http`]: routes, admission (503 with `Retry-After` when `parallel` run and the
//!   queue is full), JSON answers and server-sent events;
//! - [`scheduler`]: the one thread that runs the model, step by step over every running
//!   sequence (its docs say what a step does and why a request's tokens do not depend
//!   on what else is running);
//! - [`metrics`]: the Prometheus counters.
//!
//! The numerics run on the scheduler thread and the engine's own thread pool; the async
//! runtime parses, tokenizes and moves bytes.
//!
//! **Memory**: the KV pool never holds more than its budget (`--kv-budget`); beside it
//! and the weights (memory-mapped), each running sequence holds a logits row and its
//! ids, and each request in the queue its prompt's ids.
//!
//! **Shutdown**: when the `shutdown` future completes (the CLI: SIGTERM or Ctrl-C) the
//! server stops accepting connections and answers new requests on open ones with 503;
//! the requests already accepted run on, and those still running after
//! `shutdown_timeout` are cancelled (a streamed one gets an error event); `serve`
//! then returns.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod http;
pub mod metrics;
pub mod scheduler;

use kvcore_engine::Engine;
use kvcore_engine::kvcore::kv::PoolConfig;
use scheduler::{SchedConfig, State};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Most sequences decoded together.
    pub parallel: usize,
    /// Most requests waiting beyond those; one more is answered 503.
    pub queue: usize,
    /// Bytes of KV blocks alive at once (running sequences and the prefix cache).
    pub kv_budget: usize,
    /// Positions per KV block.
    pub block_len: usize,
    /// Positions per sequence (`None`: the model's trained context).
    pub ctx: Option<usize>,
    /// Prompt tokens per prefill chunk (rounded up to whole blocks).
    pub prefill_chunk: usize,
    /// Most tokens one forward pass runs (at least one prefill chunk).
    pub batch_tokens: usize,
    /// How long running requests may go on after the shutdown signal.
    pub shutdown_timeout: Duration,
    /// The model's name in `/v1/models` and the answers.
    pub model_id: String,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            parallel: 8,
            queue: 64,
            kv_budget: 256 << 20,
            block_len: PoolConfig::DEFAULT_BLOCK_LEN,
            ctx: None,
            prefill_chunk: PoolConfig::DEFAULT_BLOCK_LEN,
            batch_tokens: 512,
            shutdown_timeout: Duration::from_secs(10),
            model_id: "kvcore".into(),
        }
    }
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A setting out of range.
    #[error("{0}")]
    Config(String),
    /// The engine refused (the KV pool's shape).
    #[error(transparent)]
    Engine(#[from] kvcore_engine::Error),
    /// The socket failed.
    #[error("the server's socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves `engine` on `listener` until `shutdown` completes and the requests already
/// accepted have ended (or been cancelled `shutdown_timeout` later).
pub async fn serve(
    engine: Arc<Engine>,
    listener: tokio::net::TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let trained = engine.context_len();
    let ctx = config.ctx.unwrap_or(trained);
    if ctx == 0 || ctx > trained {
        return Err(ServeError::Config(format!(
            "a context of {ctx} positions: it must be between 1 and the model's trained context of {trained}"
        )));
    }
    if config.parallel == 0 {
        return Err(ServeError::Config("--parallel must be at least 1".into()));
    }
    if config.block_len == 0 {
        return Err(ServeError::Config("--block-len must be at least 1".into()));
    }
    let b = config.block_len;
    let chunk = config.prefill_chunk.max(1).div_ceil(b) * b;
    let pool = engine.kv_pool(config.kv_budget, b)?;
    let limits = api::Limits {
        ctx,
        kv_budget: config.kv_budget,
        block_len: b,
        block_bytes: pool.block_bytes(),
    };
    if limits.block_bytes > config.kv_budget {
        return Err(ServeError::Config(format!(
            "a KV budget of {} bytes holds no block of {} bytes",
            config.kv_budget, limits.block_bytes
        )));
    }
    let state = Arc::new(State::new(config.parallel.saturating_add(config.queue)));
    let (jobs, rx) = mpsc::channel();
    let sched = SchedConfig {
        parallel: config.parallel,
        ctx,
        prefill_chunk: chunk,
        batch_tokens: config.batch_tokens.max(1),
    };
    let scheduler = {
        let (engine, pool, state) = (engine.clone(), pool.clone(), state.clone());
        std::thread::Builder::new()
            .name("kvcore-scheduler".into())
            .spawn(move || scheduler::run(engine, pool, rx, state, sched))?
    };
    let app = Arc::new(http::App {
        engine,
        pool,
        state: state.clone(),
        jobs,
        limits,
        model_id: config.model_id.clone(),
        next_id: AtomicU64::new(1),
    });
    let drain = {
        let state = state.clone();
        let timeout = config.shutdown_timeout;
        async move {
            shutdown.await;
            state.draining.store(true, Ordering::SeqCst);
            *state.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Instant::now() + timeout);
        }
    };
    let served = axum::serve(listener, http::router(app))
        .with_graceful_shutdown(drain)
        .await;
    // The router and its job sender are gone: the scheduler ends once it is idle.
    let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
    Ok(served?)
}
