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
//! - [`metrics`]: the Prometheus counters;
//! - `extras`: llama-server's `/tokenize`, `/detokenize` and `/apply-template`, and
//!   OpenAI's `/v1/embeddings`.
//!
//! The numerics run on the scheduler thread and the engine's own thread pool; parsing,
//! the chat template and tokenizing run on tokio's blocking pool; the async runtime
//! only moves bytes.
//!
//! **Connections**: served by hyper with the limits of [`HttpLimits`] (a head's time,
//! which also bounds an idle keep-alive connection; a body's time, answered 408; body
//! and header sizes, 413 and 431).
//!
//! **Memory**: the KV pool never holds more than its budget (`--kv-budget`); beside it
//! and the weights (memory-mapped), each running sequence holds a logits row and its
//! ids, and each request in the queue its prompt's ids.
//!
//! **Shutdown**: when the `shutdown` future completes (the CLI: SIGTERM or Ctrl-C) the
//! server stops accepting connections and answers new requests on open ones with 503
//! and `Connection: close`; the requests already accepted run on, and those still
//! running after `shutdown_timeout` are cancelled (a streamed one gets an error event);
//! every connection is then closed within a second (`CLOSE_GRACE`) whatever its client does, and
//! `serve` returns.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
mod extras;
pub mod http;
pub mod metrics;
pub mod scheduler;
pub mod tier;

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
    /// Positions per sequence (`None`: the model's trained context, or the positions
    /// the KV budget holds when fewer).
    pub ctx: Option<usize>,
    /// Prompt tokens per prefill chunk (rounded up to whole blocks).
    pub prefill_chunk: usize,
    /// Most tokens one forward pass runs (at least one prefill chunk).
    pub batch_tokens: usize,
    /// How long running requests may go on after the shutdown signal.
    pub shutdown_timeout: Duration,
    /// The model's name in `/v1/models` and the answers.
    pub model_id: String,
    /// The connection limits.
    pub http: HttpLimits,
    /// Who may call it.
    pub access: Access,
    /// A second tier for the prefix cache (`None`: RAM only).
    pub kv_tier: Option<tier::TierConfig>,
}

/// Who may call the server: API keys and the browser origins CORS lets in.
#[derive(Clone, Default)]
pub struct Access {
    /// Keys a request must present as `Authorization: Bearer KEY` (empty: no key is
    /// asked for). A request without one of them is answered 401.
    pub api_keys: Vec<String>,
    /// The key `/health` and `/metrics` ask for (`None`: they are open, whatever
    /// `api_keys` holds, for probes and scrapers).
    pub metrics_key: Option<String>,
    /// Origins a browser may call the server from (CORS): `*` for any; empty: no CORS
    /// headers, so browsers refuse pages from other origins.
    pub cors_origins: Vec<String>,
}

/// Keys are not printed.
impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("api_keys", &format_args!("{} keys", self.api_keys.len()))
            .field("metrics_key", &self.metrics_key.is_some())
            .field("cors_origins", &self.cors_origins)
            .finish()
    }
}

/// What one connection and one request may take.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// From the moment the server waits for a request's head (a new connection, or the
    /// next request on a keep-alive one) until the head is complete; past it the
    /// connection is closed (no answer is possible mid-head). This also bounds an idle
    /// keep-alive connection.
    pub headers: Duration,
    /// From a head to the end of its body; past it the answer is a 408.
    pub body: Duration,
    /// Most bytes of a body (413 beyond).
    pub max_body: usize,
    /// Most bytes of a request's header fields, names and values (431 beyond).
    pub max_header_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            headers: Duration::from_secs(10),
            body: Duration::from_secs(30),
            max_body: 2 << 20,
            max_header_bytes: 16 << 10,
        }
    }
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
            http: HttpLimits::default(),
            access: Access::default(),
            kv_tier: None,
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
    Engine(Box<kvcore_engine::Error>),
    /// The socket failed.
    #[error("the server's socket: {0}")]
    Io(#[from] std::io::Error),
}

impl From<kvcore_engine::Error> for ServeError {
    fn from(e: kvcore_engine::Error) -> Self {
        ServeError::Engine(Box::new(e))
    }
}

/// How long connections may finish their last answers once every request has ended
/// (or been cancelled) at shutdown; past it they are closed whatever the client does.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A configured server: its routes and its scheduler thread, before it listens.
pub struct Server {
    app: Arc<http::App>,
    scheduler: std::thread::JoinHandle<()>,
    shutdown_timeout: Duration,
}

impl Server {
    /// Checks `config` against `engine` (a budget that cannot hold one sequence of the
    /// whole context is refused) and starts the scheduler.
    pub fn new(engine: Arc<Engine>, config: &ServeConfig) -> Result<Self, ServeError> {
        if config.block_len == 0 {
            return Err(ServeError::Config("--block-len must be at least 1".into()));
        }
        let b = config.block_len;
        let pool = match &config.kv_tier {
            Some(t) => {
                let (tier, secret) = tier::open(t)?;
                engine.kv_pool_tiered(config.kv_budget, b, secret, tier)?
            }
            None => engine.kv_pool(config.kv_budget, b)?,
        };
        let trained = engine.context_len();
        // Without a context asked for: the model's, or what the budget holds when less.
        let held = (config.kv_budget / pool.block_bytes().max(1)).saturating_mul(b);
        let ctx = config.ctx.unwrap_or(trained.min(held.max(1)));
        if ctx == 0 || ctx > trained {
            return Err(ServeError::Config(format!(
                "a context of {ctx} positions: it must be between 1 and the model's trained context of {trained}"
            )));
        }
        if config.parallel == 0 {
            return Err(ServeError::Config("--parallel must be at least 1".into()));
        }
        let cors = http::cors(&config.access.cors_origins).map_err(ServeError::Config)?;
        let access = &config.access;
        if access
            .api_keys
            .iter()
            .chain(&access.metrics_key)
            .any(String::is_empty)
        {
            return Err(ServeError::Config("an API key is empty".into()));
        }
        let chunk = config.prefill_chunk.max(1).div_ceil(b) * b;
        let limits = api::Limits {
            ctx,
            kv_budget: config.kv_budget,
            block_len: b,
            block_bytes: pool.block_bytes(),
            vocab: engine.vocab_size(),
        };
        if limits.full_sequences() == 0 {
            return Err(ServeError::Config(format!(
                "a KV budget of {} bytes cannot hold one sequence of the whole context ({ctx} positions need {} bytes): raise --kv-budget or lower --ctx",
                config.kv_budget,
                ctx.div_ceil(b) * limits.block_bytes
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
            state,
            jobs,
            limits,
            http: config.http,
            parallel: config.parallel,
            model_id: config.model_id.clone(),
            next_id: AtomicU64::new(1),
            api_keys: access.api_keys.clone(),
            metrics_key: access.metrics_key.clone(),
            cors,
        });
        Ok(Server {
            app,
            scheduler,
            shutdown_timeout: config.shutdown_timeout,
        })
    }

    /// The limits requests are checked against (`full_sequences` says how many
    /// sequences of the whole context the KV budget holds).
    pub fn limits(&self) -> api::Limits {
        self.app.limits
    }

    /// The routes, as a tower service (for a caller with its own connections, or
    /// `ServiceExt::oneshot` without any).
    pub fn router(&self) -> axum::Router {
        http::router(self.app.clone())
    }

    /// Serves on `listener` until `shutdown` completes, then drains: no new connection
    /// is accepted, open ones are answered 503 (with `Connection: close`), the requests
    /// already accepted run on until they end or `shutdown_timeout` passes (then they
    /// are cancelled), and every connection is closed at most a second (`CLOSE_GRACE`) later,
    /// whatever its client is doing.
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            app,
            scheduler,
            shutdown_timeout,
        } = self;
        let router = http::router(app.clone());
        let (close, closing) = tokio::sync::watch::channel(false);
        let mut conns = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(app.http.headers);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        // Out of file descriptors and the like: wait rather than spin.
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let service = hyper_util::service::TowerToHyperService::new(router.clone());
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    let mut closing = closing.clone();
                    conns.spawn(async move {
                        let mut conn = std::pin::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = closing.wait_for(|c| *c) => conn.as_mut().graceful_shutdown(),
                        }
                        let _ = conn.await;
                    });
                }
            }
        }
        drop(listener);
        let deadline = Instant::now() + shutdown_timeout;
        app.state.draining.store(true, Ordering::SeqCst);
        *app.state.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        // The accepted requests end, or the scheduler cancels them at the deadline (a
        // step it is in finishes first: the grace covers it).
        let cancelled_by = deadline + CLOSE_GRACE;
        while app.state.in_system.load(Ordering::SeqCst) > 0 && Instant::now() < cancelled_by {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        let _ = close.send(true);
        let closed = tokio::time::timeout(CLOSE_GRACE, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if closed.is_err() {
            conns.shutdown().await;
        }
        drop((router, app));
        // The job senders are gone: the scheduler ends once it is idle.
        let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
        Ok(())
    }
}

/// Serves `engine` on `listener` until `shutdown` completes and the requests already
/// accepted have ended (or been cancelled `shutdown_timeout` later): [`Server::new`]
/// then [`Server::run`].
pub async fn serve(
    engine: Arc<Engine>,
    listener: tokio::net::TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    Server::new(engine, &config)?.run(listener, shutdown).await
}
