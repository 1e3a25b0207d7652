//! The HTTP side: routes, the request guard (header size, content type, body size and
//! time), admission, and turning the scheduler's events into OpenAI bodies and
//! server-sent events. Every error, whatever its status, is an OpenAI error object.
//!
//! The runtime thread only moves bytes: parsing a body, rendering the chat template and
//! tokenizing run on tokio's blocking pool (`prepare`), so `/health` and `/metrics`
//! answer at once whatever the requests hold.

use crate::HttpLimits;
use crate::api::{self, BadRequest, Body, ChatRequest, CompletionRequest, Limits};
use crate::extras;
use crate::scheduler::{Event, Job, State, Summary, TokenLogprobs};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State as Extract};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvcore_engine::Engine;
use kvcore_engine::kvcore::kv::KvPool;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// What every handler sees.
pub(crate) struct App {
    pub(crate) engine: Arc<Engine>,
    pub(crate) pool: KvPool,
    pub(crate) state: Arc<State>,
    pub(crate) jobs: mpsc::Sender<Job>,
    pub(crate) limits: Limits,
    pub(crate) http: HttpLimits,
    pub(crate) parallel: usize,
    pub(crate) model_id: String,
    pub(crate) next_id: AtomicU64,
    /// See [`Access`](crate::Access).
    pub(crate) api_keys: Vec<String>,
    pub(crate) metrics_key: Option<String>,
    /// The CORS layer (`None`: no CORS headers).
    pub(crate) cors: Option<CorsLayer>,
}

type Shared = Arc<App>;

/// The routes.
pub(crate) fn router(app: Shared) -> Router {
    let cors = app.cors.clone();
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/props", get(props))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/v1/embeddings", post(embeddings))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app);
    // Outermost: preflights are answered before the guard, and every answer (a 401
    // too) carries the CORS headers a browser needs to read it.
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// The CORS layer for `origins` (`*`: any), or `None` for none; an origin that is not
/// a header value is named.
pub(crate) fn cors(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o).map_err(|_| format!("--cors-origin {o:?}: not an origin"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(std::time::Duration::from_secs(600)),
    ))
}

/// The 401 to answer, unless `req`'s path asks for no key or it presents one of them
/// as `Authorization: Bearer KEY` (compared in constant time).
fn refuse_key(app: &App, req: &Request) -> Option<Response> {
    let keys = match req.uri().path() {
        "/health" | "/metrics" => app.metrics_key.as_slice(),
        _ => app.api_keys.as_slice(),
    };
    if keys.is_empty() {
        return None;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let message = match presented {
        None => "no API key: send it as Authorization: Bearer KEY",
        Some(p)
            if keys
                .iter()
                .any(|k| bool::from(k.as_bytes().ct_eq(p.as_bytes()))) =>
        {
            return None;
        }
        Some(_) => "the API key is not valid",
    };
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        message,
        "invalid_request_error",
        None,
        Some("invalid_api_key"),
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

/// Before any route: refuses header fields beyond their limit (431), a request without
/// its key (401: `/health` and `/metrics` ask for the metrics key, every other path for
/// an API key, when the server has them), a body that is not JSON (415), too large
/// (413) or too slow (408); reads the body whole; and while the server drains, asks the
/// client to close the connection.
async fn guard(Extract(app): Extract<Shared>, req: Request, next: Next) -> Response {
    let limits = app.http;
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    let mut response = if header_bytes > limits.max_header_bytes {
        error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            &format!(
                "the request's header fields are {header_bytes} bytes, more than the server's {}",
                limits.max_header_bytes
            ),
            "invalid_request_error",
            None,
            Some("headers_too_large"),
        )
    } else if let Some(refused) = refuse_key(&app, &req) {
        refused
    } else if let Some(refused) = refuse_content_type(&req) {
        refused
    } else {
        let (parts, body) = req.into_parts();
        match read_body(body, limits, &parts.headers).await {
            Ok(bytes) => {
                next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                    .await
            }
            Err(refused) => refused,
        }
    };
    app.state.metrics.count_status(response.status().as_u16());
    if app.state.draining.load(Ordering::SeqCst) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A POST whose body says it is not JSON: 415 (no `Content-Type` is read as JSON).
fn refuse_content_type(req: &Request) -> Option<Response> {
    if req.method() != Method::POST {
        return None;
    }
    let value = req.headers().get(header::CONTENT_TYPE)?;
    let kind = value.to_str().unwrap_or("");
    let essence = kind
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        return None;
    }
    Some(error(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        &format!("Content-Type {kind:?}: the server reads application/json bodies"),
        "invalid_request_error",
        None,
        Some("unsupported_media_type"),
    ))
}

/// The whole body, within the byte limit (413) and the time limit (408).
async fn read_body(
    body: axum::body::Body,
    limits: HttpLimits,
    headers: &axum::http::HeaderMap,
) -> Result<Bytes, Response> {
    let too_large = |what: String| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the request body is {what}, more than the server's limit of {} bytes",
                limits.max_body
            ),
            "invalid_request_error",
            None,
            Some("body_too_large"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limits.max_body as u64) {
        return Err(too_large(format!("{n} bytes")));
    }
    match tokio::time::timeout(limits.body, axum::body::to_bytes(body, limits.max_body)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let inner = e.into_inner();
            if inner.is::<http_body_util::LengthLimitError>() {
                Err(too_large("larger".into()))
            } else {
                Err(error(
                    StatusCode::BAD_REQUEST,
                    &format!("the request body could not be read: {inner}"),
                    "invalid_request_error",
                    None,
                    None,
                ))
            }
        }
        Err(_) => {
            let mut r = error(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the request body did not arrive within {:?}", limits.body),
                "invalid_request_error",
                None,
                Some("timeout"),
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(r)
        }
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    json_response(status, api::error_body(message, kind, param, code))
}

fn bad(app: &App, b: BadRequest) -> Response {
    api_metrics_add(&app.state.metrics.bad);
    error(
        StatusCode::BAD_REQUEST,
        &b.message,
        "invalid_request_error",
        b.param.as_deref(),
        None,
    )
}

fn api_metrics_add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn unavailable(message: &str) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        message,
        "server_error",
        None,
        Some("overloaded"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

const ROUTES: &str = "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET /v1/models, POST /tokenize, POST /detokenize, POST /apply-template, GET /props, GET /health and GET /metrics";

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no such route: the server has {ROUTES}"),
        "invalid_request_error",
        None,
        Some("not_found"),
    )
}

async fn method_not_allowed(method: Method) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method {method} is not allowed here: the server has {ROUTES}"),
        "invalid_request_error",
        None,
        Some("method_not_allowed"),
    )
}

/// The server's settings, as llama-server's `/props` names them where it has them.
async fn props(Extract(app): Extract<Shared>) -> Response {
    let l = app.limits;
    json_response(
        StatusCode::OK,
        json!({
            "model_alias": app.model_id,
            "total_slots": app.parallel,
            "default_generation_settings": {"n_ctx": l.ctx},
            "kv_budget_bytes": l.kv_budget,
            "kv_block_len": l.block_len,
            "kv_block_bytes": l.block_bytes,
            "kv_budget_full_context_sequences": l.full_sequences(),
        }),
    )
}

async fn health(Extract(app): Extract<Shared>) -> Response {
    if app.state.draining.load(Ordering::SeqCst) {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting down"}),
        )
    } else {
        json_response(StatusCode::OK, json!({"status": "ok"}))
    }
}

async fn models(Extract(app): Extract<Shared>) -> Response {
    json_response(
        StatusCode::OK,
        json!({"object": "list", "data": [{
            "id": app.model_id, "object": "model", "created": 0, "owned_by": "kvcore",
            "meta": {"n_ctx": app.limits.ctx, "n_vocab": app.engine.vocab_size()},
        }]}),
    )
}

async fn metrics(Extract(app): Extract<Shared>) -> Response {
    let mut r = app.state.metrics.render(&app.pool).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

async fn chat(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    start::<ChatRequest>(app, Kind::Chat, body).await
}

async fn completions(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    start::<CompletionRequest>(app, Kind::Text, body).await
}

/// A request's prompt ids, for either endpoint.
trait Prompted: Body + Send + 'static {
    fn ids(&self, engine: &Engine) -> Result<Vec<u32>, BadRequest>;
    fn common(&self) -> &api::Common;
}

impl Prompted for ChatRequest {
    fn ids(&self, engine: &Engine) -> Result<Vec<u32>, BadRequest> {
        self.prompt_ids(engine)
    }
    fn common(&self) -> &api::Common {
        &self.common
    }
}

impl Prompted for CompletionRequest {
    fn ids(&self, engine: &Engine) -> Result<Vec<u32>, BadRequest> {
        self.prompt_ids(engine)
    }
    fn common(&self) -> &api::Common {
        &self.common
    }
}

/// Runs `work` on tokio's blocking pool: its result, or the 400 (or 500) to answer.
async fn off_runtime<T: Send + 'static>(
    app: &Shared,
    work: impl FnOnce(&App) -> Result<T, BadRequest> + Send + 'static,
) -> Result<T, Response> {
    let shared = app.clone();
    match tokio::task::spawn_blocking(move || work(&shared)).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(b)) => Err(bad(app, b)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the request could not be prepared: {e}"),
            "server_error",
            None,
            None,
        )),
    }
}

/// The 503 to answer when the server drains or every slot and the queue are full;
/// otherwise the request holds a place until [`State::release`].
fn refuse_admission(app: &App) -> Option<Response> {
    let refused = if app.state.draining.load(Ordering::SeqCst) {
        "the server is shutting down"
    } else if !app.state.admit() {
        "the server is busy: every slot and the queue are full; retry later"
    } else {
        return None;
    };
    api_metrics_add(&app.state.metrics.rejected);
    Some(unavailable(refused))
}

/// Answers the JSON `work` makes off the runtime thread.
async fn answer(
    app: Shared,
    work: impl FnOnce(&App) -> Result<Value, BadRequest> + Send + 'static,
) -> Response {
    match off_runtime(&app, work).await {
        Ok(v) => json_response(StatusCode::OK, v),
        Err(refused) => refused,
    }
}

async fn tokenize(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    answer(app, move |app| extras::tokenize(&app.engine, &body)).await
}

async fn detokenize(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    answer(app, move |app| extras::detokenize(&app.engine, &body)).await
}

async fn apply_template(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    answer(app, move |app| extras::apply_template(&app.engine, &body)).await
}

/// Embeddings hold a place like a completion while they run.
async fn embeddings(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    if let Some(refused) = refuse_admission(&app) {
        return refused;
    }
    let r = answer(app.clone(), move |app| {
        extras::embeddings(&app.engine, app.limits, &app.model_id, &body)
    })
    .await;
    app.state.release();
    r
}

/// What the answer repeats of the request.
struct Asked {
    model: Option<String>,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
}

/// Parses, renders, tokenizes and checks a body: the CPU-bound part of a request.
fn prepare<R: Prompted>(app: &App, body: &[u8]) -> Result<(Job, Asked), BadRequest> {
    let req: R = api::parse(body)?;
    let ids = req.ids(&app.engine)?;
    let common = req.common();
    let job = common.job(ids, app.limits, R::ENDPOINT)?;
    let asked = Asked {
        model: common.model.clone(),
        stream: common.stream == Some(true),
        include_usage: common.include_usage(),
        logprobs: job.logprobs(),
    };
    Ok((job, asked))
}

/// Checks (off the runtime thread), admits and hands a request to the scheduler;
/// answers as it asked.
async fn start<R: Prompted>(app: Shared, kind: Kind, body: Bytes) -> Response {
    let (job, asked) = match off_runtime(&app, move |app| prepare::<R>(app, &body)).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if let Some(refused) = refuse_admission(&app) {
        return refused;
    }
    let (tx, rx) = unbounded_channel();
    if app.jobs.send(job.with_events(tx)).is_err() {
        app.state.release();
        return unavailable("the server is shutting down");
    }
    api_metrics_add(&app.state.metrics.requests);
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let head = Head {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{n}"),
            Kind::Text => format!("cmpl-{n}"),
        },
        created: api::now(),
        model: asked.model.unwrap_or_else(|| app.model_id.clone()),
        kind,
        logprobs: asked.logprobs,
        offset: 0,
    };
    if asked.stream {
        stream(head, rx, asked.include_usage)
    } else {
        whole(head, rx).await
    }
}

/// What every body of one response repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    /// Whether the choices report log-probabilities.
    logprobs: bool,
    /// Characters of text the completion's `text_offset`s have counted so far.
    offset: usize,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn choice(&self, text: Option<&str>, finish: Option<&str>, chunk: bool) -> Value {
        match (self.kind, chunk) {
            (Kind::Chat, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text.unwrap_or("")}, "logprobs": null, "finish_reason": finish})
            }
            (Kind::Chat, true) => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            (Kind::Text, _) => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        }
    }

    /// A choice's `logprobs` for `tokens`: `null` when the request did not ask.
    fn logprobs(&mut self, tokens: &[TokenLogprobs]) -> Value {
        match (self.logprobs, self.kind) {
            (false, _) => Value::Null,
            (true, Kind::Chat) => api::chat_logprobs(tokens),
            (true, Kind::Text) => api::text_logprobs(tokens, &mut self.offset),
        }
    }

    fn body(&self, choices: Vec<Value>, usage: Option<&Summary>, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": choices,
        });
        if let Some(s) = usage {
            v["usage"] = api::usage(s);
        }
        v
    }
}

async fn whole(mut head: Head, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Text(t, lp) => {
                text.push_str(&t);
                logprobs.extend(lp);
            }
            Event::Done(s) => {
                let mut choice = head.choice(Some(&text), Some(api::finish_name(s.finish)), false);
                choice["logprobs"] = head.logprobs(&logprobs);
                return json_response(StatusCode::OK, head.body(vec![choice], Some(&s), false));
            }
            Event::Failed(msg) => return unavailable(&msg),
        }
    }
    unavailable("the request was dropped by the scheduler")
}

enum Phase {
    Role,
    Body,
    Usage(Summary),
    Done,
    End,
}

fn stream(head: Head, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let first = if head.kind == Kind::Chat {
        Phase::Role
    } else {
        Phase::Body
    };
    let data = |v: Value| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()));
    let events = futures_util::stream::unfold(
        (head, rx, first),
        move |(mut head, mut rx, phase)| async move {
            match phase {
                Phase::Role => {
                    let mut choice = head.choice(None, None, true);
                    choice["delta"] = json!({"role": "assistant", "content": ""});
                    let e = data(head.body(vec![choice], None, true));
                    Some((e, (head, rx, Phase::Body)))
                }
                Phase::Body => match rx.recv().await {
                    Some(Event::Text(t, lp)) => {
                        let mut choice = head.choice(Some(&t), None, true);
                        choice["logprobs"] = head.logprobs(&Vec::from_iter(lp));
                        let e = data(head.body(vec![choice], None, true));
                        Some((e, (head, rx, Phase::Body)))
                    }
                    Some(Event::Done(s)) => {
                        let finish = api::finish_name(s.finish);
                        let choice = head.choice(None, Some(finish), true);
                        let e = data(head.body(vec![choice], None, true));
                        let next = if include_usage {
                            Phase::Usage(s)
                        } else {
                            Phase::Done
                        };
                        Some((e, (head, rx, next)))
                    }
                    Some(Event::Failed(msg)) => {
                        let e = data(api::error_body(
                            &msg,
                            "server_error",
                            None,
                            Some("overloaded"),
                        ));
                        Some((e, (head, rx, Phase::End)))
                    }
                    None => None,
                },
                Phase::Usage(s) => {
                    let e = data(head.body(Vec::new(), Some(&s), true));
                    Some((e, (head, rx, Phase::Done)))
                }
                Phase::Done => Some((
                    Ok(SseEvent::default().data("[DONE]")),
                    (head, rx, Phase::End),
                )),
                Phase::End => None,
            }
        },
    );
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
