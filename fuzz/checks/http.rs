//! The `http` property: any request bytes (head and body) sent through `kvcore serve`'s
//! router (tower's `oneshot`, no socket), through the body checks and into the
//! scheduler's admission, get an answer: never a panic, never a 5xx other than a 503, and
//! every body JSON (an OpenAI error object when the status is an error; each event of a
//! stream JSON or `[DONE]`), `/metrics` aside (Prometheus text).
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/http.rs` and the stable replay test
//! `server/tests/http_corpus.rs` (both include this file with `#[path]`).
//!
//! Input format: the first line is `METHOD PATH`, then header lines `Name: value` up to
//! an empty line, then the body (every byte to the end). Inputs that do not make a
//! request (no first line, a method or header name the `http` crate refuses) are
//! skipped.
//!
//! The server runs SmolLM2 from the cache with a 32-position context (so an admitted
//! request ends within 32 tokens) and small limits. The fuzz target waits 50 ms for an
//! answer (an admitted request then counts as admitted and is cancelled, as when its
//! client goes away); the replay test waits for every answer and checks it.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use kvcore_engine::{Engine, Options};
use kvcore_server::{HttpLimits, ServeConfig, Server};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// A server without a socket: its runtime, its routes, and the server (whose scheduler
/// runs while it lives).
pub struct Target {
    /// How long an answer may take; past it the request counts as admitted and is
    /// dropped (the scheduler cancels it), so a slow build (the fuzzer's) does not wait
    /// for generations.
    patience: Option<Duration>,
    rt: tokio::runtime::Runtime,
    router: Router,
    _server: Server,
}

impl Target {
    /// The server on the model at `path` (SmolLM2), waiting for each answer at most
    /// `patience` (`None`: until it ends).
    pub fn new(path: &Path, patience: Option<Duration>) -> Result<Target, String> {
        let options = Options {
            threads: Some(1),
            ..Options::default()
        };
        let engine = Engine::load(path, options).map_err(|e| e.message())?;
        let config = ServeConfig {
            parallel: 2,
            queue: 2,
            kv_budget: 16 << 20,
            ctx: Some(32),
            http: HttpLimits {
                body: Duration::from_secs(1),
                max_body: 64 << 10,
                max_header_bytes: 1 << 10,
                ..HttpLimits::default()
            },
            ..ServeConfig::default()
        };
        let server = Server::new(Arc::new(engine), &config).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Target {
            patience,
            rt,
            router: server.router(),
            _server: server,
        })
    }

    /// The answer's status, content type and body.
    async fn answer(&self, req: Request<Body>) -> Result<(StatusCode, String, Vec<u8>), String> {
        let resp = self
            .router
            .clone()
            .oneshot(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let kind = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, kind, body.to_vec()))
    }

    /// Sends `raw` (when it makes a request) and checks the answer.
    pub fn run(&self, raw: &Raw) -> Result<(), String> {
        let Some(req) = raw.request() else {
            return Ok(());
        };
        let metrics = req.uri().path() == "/metrics";
        let answer = self.rt.block_on(async {
            let patience = self.patience.unwrap_or(Duration::MAX);
            tokio::time::timeout(patience, self.answer(req)).await
        });
        let Ok(answer) = answer else {
            return Ok(());
        };
        let (status, kind, body) = answer?;
        let text = String::from_utf8_lossy(&body);
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            return Err(format!("{status}: {text}"));
        }
        if metrics && status == StatusCode::OK {
            return Ok(());
        }
        if kind.starts_with("text/event-stream") {
            for line in text.lines() {
                if let Some(data) = line.strip_prefix("data: ")
                    && data != "[DONE]"
                {
                    serde_json::from_str::<serde_json::Value>(data)
                        .map_err(|e| format!("a stream event is not JSON ({e}): {data}"))?;
                }
            }
            return Ok(());
        }
        if kind != "application/json" {
            return Err(format!("{status} with Content-Type {kind:?}: {text}"));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{status}, not JSON ({e}): {text}"))?;
        if !status.is_success() && !v["error"]["message"].is_string() {
            return Err(format!("{status} without an OpenAI error object: {text}"));
        }
        Ok(())
    }
}

/// A request as the input spells it.
pub struct Raw {
    method: String,
    path: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
}

impl Raw {
    /// The request, or `None` when the `http` crate refuses its method, path or a
    /// header.
    fn request(&self) -> Option<Request<Body>> {
        let mut req = Request::builder()
            .method(self.method.as_str())
            .uri(self.path.as_str());
        for (name, value) in &self.headers {
            req = req.header(name.as_slice(), value.as_slice());
        }
        req.body(Body::from(self.body.clone())).ok()
    }
}

/// The request `data` spells, or why it spells none.
pub fn decode(data: &[u8]) -> Result<Raw, String> {
    let mut rest = data;
    let mut line = || {
        let end = rest.iter().position(|&b| b == b'\n')?;
        let l = &rest[..end];
        rest = &rest[end + 1..];
        Some(l.strip_suffix(b"\r").unwrap_or(l))
    };
    let first = line().ok_or("no first line")?;
    let first = std::str::from_utf8(first).map_err(|e| e.to_string())?;
    let (method, path) = first.split_once(' ').ok_or("no path")?;
    let (method, path) = (method.to_owned(), path.to_owned());
    let mut headers = Vec::new();
    while let Some(h) = line() {
        if h.is_empty() {
            break;
        }
        let colon = h
            .iter()
            .position(|&b| b == b':')
            .ok_or("a header without a colon")?;
        headers.push((
            h[..colon].to_vec(),
            h[colon + 1..].trim_ascii_start().to_vec(),
        ));
    }
    Ok(Raw {
        method,
        path,
        headers,
        body: rest.to_vec(),
    })
}
