//! The HTTP side: routes, admission, and turning the scheduler's events into OpenAI
//! bodies and server-sent events. Nothing here touches the model.

use crate::api::{self, BadRequest, ChatRequest, Common, CompletionRequest, Limits};
use crate::scheduler::{Event, Job, State, Summary};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvcore_engine::Engine;
use kvcore_engine::kvcore::kv::KvPool;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// What every handler sees.
pub(crate) struct App {
    pub(crate) engine: Arc<Engine>,
    pub(crate) pool: KvPool,
    pub(crate) state: Arc<State>,
    pub(crate) jobs: mpsc::Sender<Job>,
    pub(crate) limits: Limits,
    pub(crate) model_id: String,
    pub(crate) next_id: AtomicU64,
}

type Shared = Arc<App>;

/// The routes.
pub(crate) fn router(app: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app)
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
        b.param,
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

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such route: the server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /health and /metrics",
        "invalid_request_error",
        None,
        Some("not_found"),
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
    let req: ChatRequest = match api::parse(&body) {
        Ok(r) => r,
        Err(b) => return bad(&app, b),
    };
    match req.prompt_ids(&app.engine) {
        Ok(ids) => start(app, Kind::Chat, &req.common, ids).await,
        Err(b) => bad(&app, b),
    }
}

async fn completions(Extract(app): Extract<Shared>, body: Bytes) -> Response {
    let req: CompletionRequest = match api::parse(&body) {
        Ok(r) => r,
        Err(b) => return bad(&app, b),
    };
    match req.prompt_ids(&app.engine) {
        Ok(ids) => start(app, Kind::Text, &req.common, ids).await,
        Err(b) => bad(&app, b),
    }
}

/// Checks, admits and hands a request to the scheduler; answers as it asked.
async fn start(app: Shared, kind: Kind, common: &Common, prompt: Vec<u32>) -> Response {
    let job = match common.job(prompt, app.limits) {
        Ok(j) => j,
        Err(b) => return bad(&app, b),
    };
    if app.state.draining.load(Ordering::SeqCst) {
        api_metrics_add(&app.state.metrics.rejected);
        return unavailable("the server is shutting down");
    }
    if !app.state.admit() {
        api_metrics_add(&app.state.metrics.rejected);
        return unavailable("the server is busy: every slot and the queue are full; retry later");
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
        model: common.model.clone().unwrap_or_else(|| app.model_id.clone()),
        kind,
    };
    if common.stream == Some(true) {
        stream(head, rx, common.include_usage())
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

async fn whole(head: Head, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Text(t) => text.push_str(&t),
            Event::Done(s) => {
                let choice = head.choice(Some(&text), Some(api::finish_name(s.finish)), false);
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
    let events =
        futures_util::stream::unfold((head, rx, first), move |(head, mut rx, phase)| async move {
            match phase {
                Phase::Role => {
                    let mut choice = head.choice(None, None, true);
                    choice["delta"] = json!({"role": "assistant", "content": ""});
                    let e = data(head.body(vec![choice], None, true));
                    Some((e, (head, rx, Phase::Body)))
                }
                Phase::Body => match rx.recv().await {
                    Some(Event::Text(t)) => {
                        let e =
                            data(head.body(vec![head.choice(Some(&t), None, true)], None, true));
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
        });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
