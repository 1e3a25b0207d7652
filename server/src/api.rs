//! The OpenAI bodies: what a request may hold, how it becomes a [`Job`] for the
//! scheduler, and the JSON of the answers and stream chunks.
//!
//! A field the server does not know is ignored (clients send many); a known field of
//! the wrong type, a value out of range, or a feature the server does not have (`n > 1`,
//! log-probabilities, tools) is refused with a 400 whose `param` is the field's path
//! (`max_tokens`, `messages[2].content`), never silently dropped.

use crate::scheduler::{Job, Summary};
use kvcore_engine::kvcore::model::{GenerateParams, SamplerParams, token_room};
use kvcore_engine::kvcore::tokenizer::ChatMessage;
use kvcore_engine::{Engine, FinishReason};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// A request the server refuses, with the OpenAI error's `param` when one field is at
/// fault.
#[derive(Debug)]
pub struct BadRequest {
    /// What is wrong.
    pub message: String,
    /// The field's path, if one is at fault.
    pub param: Option<String>,
}

impl BadRequest {
    fn new(message: impl Into<String>, param: Option<&str>) -> Self {
        BadRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }
}

type Checked<T> = Result<T, BadRequest>;

/// The fields `/v1/chat/completions` and `/v1/completions` share.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    /// Ignored beyond echoing: the server serves one model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<Stop>,
    /// Server-sent events instead of one body.
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    echo: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug)]
pub struct ChatRequest {
    messages: Vec<Message>,
    /// The shared fields.
    pub common: Common,
}

#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Vec<Message>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug)]
pub struct CompletionRequest {
    prompt: Prompt,
    /// The shared fields.
    pub common: Common,
}

#[derive(Debug, Deserialize)]
struct CompletionFields {
    prompt: Prompt,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// A request body: its endpoint's own fields and the shared ones, each read from the
/// same JSON object (not with `#[serde(flatten)]`, which would hide a field's path).
pub trait Body: Sized {
    /// The field that holds the prompt (`messages`, `prompt`).
    const PROMPT: &'static str;
    /// Reads the body from its JSON.
    fn from_json(v: &Value) -> Result<Self, PathError>;
}

type PathError = serde_path_to_error::Error<serde_json::Error>;

/// An endpoint's own fields and the shared ones, from one JSON object.
fn fields<F: DeserializeOwned>(v: &Value) -> Result<(F, Common), PathError> {
    Ok((
        serde_path_to_error::deserialize(v)?,
        serde_path_to_error::deserialize(v)?,
    ))
}

impl Body for ChatRequest {
    const PROMPT: &'static str = "messages";
    fn from_json(v: &Value) -> Result<Self, PathError> {
        let (ChatFields { messages }, common) = fields(v)?;
        Ok(ChatRequest { messages, common })
    }
}

impl Body for CompletionRequest {
    const PROMPT: &'static str = "prompt";
    fn from_json(v: &Value) -> Result<Self, PathError> {
        let (CompletionFields { prompt }, common) = fields(v)?;
        Ok(CompletionRequest { prompt, common })
    }
}

/// Parses a body, naming what serde found wrong and where: "invalid request body:
/// max_tokens: invalid type: string \"ten\", expected u64" with `param` `max_tokens`.
pub fn parse<T: Body>(body: &[u8]) -> Checked<T> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| BadRequest::new(format!("invalid request body: {e}"), None))?;
    T::from_json(&v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            BadRequest::new(format!("invalid request body: {inner}"), None)
        } else {
            BadRequest::new(
                format!("invalid request body: {path}: {inner}"),
                Some(&path),
            )
        }
    })
}

/// The limits a request is checked against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Positions one sequence may hold.
    pub ctx: usize,
    /// Bytes of the KV pool.
    pub kv_budget: usize,
    /// Positions per block.
    pub block_len: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

impl Limits {
    /// Positions the KV budget holds (whole blocks).
    pub fn budget_positions(&self) -> usize {
        (self.kv_budget / self.block_bytes.max(1)).saturating_mul(self.block_len)
    }

    /// Sequences of the whole context the KV budget holds at once.
    pub fn full_sequences(&self) -> usize {
        let per_seq = self.ctx.div_ceil(self.block_len.max(1)).max(1);
        (self.kv_budget / self.block_bytes.max(1)) / per_seq
    }
}

impl ChatRequest {
    /// The prompt's ids: the messages rendered by the model's chat template (their text
    /// literal: a message cannot write control tokens).
    pub fn prompt_ids(&self, engine: &Engine) -> Checked<Vec<u32>> {
        if self.messages.is_empty() {
            return Err(BadRequest::new(
                "messages must hold at least one message",
                Some("messages"),
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant"
            ) {
                return Err(BadRequest::new(
                    format!(
                        "unknown role {:?}: system, developer, user or assistant",
                        m.role
                    ),
                    Some("messages"),
                ));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(BadRequest::new(
                                    format!(
                                        "content parts of type {kind:?} are not supported: text only"
                                    ),
                                    Some("messages"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            // The templates know system, user and assistant.
            let role = if m.role == "developer" {
                "system"
            } else {
                &m.role
            };
            messages.push(ChatMessage::new(role, content));
        }
        engine
            .chat_ids(&messages)
            .map_err(|e| BadRequest::new(e.message(), Some("messages")))
    }
}

impl CompletionRequest {
    /// The prompt's ids: text with the model's BOS (literal: no control tokens), or the
    /// ids as given (each checked against the vocabulary).
    pub fn prompt_ids(&self, engine: &Engine) -> Checked<Vec<u32>> {
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(BadRequest::new(
                    format!("{n} prompts in one request: this server takes one"),
                    Some("prompt"),
                ))
            }
        };
        let ids = match &self.prompt {
            Prompt::Text(t) => engine.tokenize(t, true, false),
            Prompt::Texts(ts) => {
                one(ts.len())?;
                engine.tokenize(&ts[0], true, false)
            }
            Prompt::Ids(ids) => ids.clone(),
            Prompt::IdLists(lists) => {
                one(lists.len())?;
                lists[0].clone()
            }
        };
        let vocab = engine.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(BadRequest::new(
                format!("token id {id} is outside the vocabulary of {vocab}"),
                Some("prompt"),
            ));
        }
        Ok(ids)
    }
}

impl Common {
    /// Whether the stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// Checks every field and makes the scheduler's job (without its channel); a
    /// prompt at fault is named `prompt_field`. Without `max_tokens` the request
    /// generates up to what the context and the KV budget hold (ending with "length").
    pub fn job(&self, prompt: Vec<u32>, limits: Limits, prompt_field: &str) -> Checked<Job> {
        let bad = |m: String, p: &str| Err(BadRequest::new(m, Some(p)));
        if self.n.is_some_and(|n| n != 1) {
            return bad("n must be 1: one choice per request".into(), "n");
        }
        match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Number(n)) if n.as_u64() == Some(0) => {}
            Some(_) => return bad("logprobs are not supported".into(), "logprobs"),
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return bad("tools are not supported".into(), "tools");
        }
        if self.echo == Some(true) {
            return bad("echo is not supported".into(), "echo");
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return bad(
                format!("temperature {temperature}: it must be between 0 and 2"),
                "temperature",
            );
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return bad(format!("top_p {top_p}: it must be in (0, 1]"), "top_p");
        }
        let penalty = |v: Option<f32>, name: &'static str| match v.unwrap_or(0.0) {
            p if (-2.0..=2.0).contains(&p) => Ok(p),
            p => Err(BadRequest::new(
                format!("{name} {p}: it must be between -2 and 2"),
                Some(name),
            )),
        };
        let presence = penalty(self.presence_penalty, "presence_penalty")?;
        let frequency = penalty(self.frequency_penalty, "frequency_penalty")?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return bad("stop: at most 4 strings, none of them empty".into(), "stop");
        }
        let ctx = limits.ctx;
        if prompt.is_empty() {
            return bad("the prompt is empty".into(), prompt_field);
        }
        // The decoder's budget rule (`kvcore::model::token_room`): every generated token
        // but the last is run, so a prompt of the whole context still gets one token.
        let Some(room) = token_room(prompt.len(), ctx) else {
            return bad(
                format!(
                    "the prompt is {} tokens, longer than the context of {ctx} positions",
                    prompt.len()
                ),
                prompt_field,
            );
        };
        // The positions the KV budget holds: the last generated token is never run.
        let held = limits.budget_positions();
        if prompt.len() > held {
            return bad(
                format!(
                    "the prompt is {} tokens, more than the {held} positions the server's KV budget of {} bytes holds",
                    prompt.len(),
                    limits.kv_budget
                ),
                prompt_field,
            );
        }
        // Both names are checked; the newer one wins when both are given.
        for (asked, name) in [
            (self.max_tokens, "max_tokens"),
            (self.max_completion_tokens, "max_completion_tokens"),
        ] {
            match asked {
                Some(0) => return bad(format!("{name} must be at least 1"), name),
                Some(n) if n > room as u64 => {
                    return bad(
                        format!(
                            "{name} {n} with a prompt of {} tokens exceeds the context of {ctx} positions (at most {room})",
                            prompt.len()
                        ),
                        name,
                    );
                }
                _ => {}
            }
        }
        let max_new = self
            .max_completion_tokens
            .or(self.max_tokens)
            .map_or(room.min(held + 1 - prompt.len()), |n| n as usize);
        // The positions the cache holds at the end: the last token is never run.
        let positions = prompt.len() + max_new - 1;
        let bytes = positions.div_ceil(limits.block_len) * limits.block_bytes;
        if bytes > limits.kv_budget {
            return bad(
                format!(
                    "{positions} positions need {bytes} bytes of KV cache, more than the server's budget of {} bytes; ask for fewer max_tokens",
                    limits.kv_budget
                ),
                if self.max_completion_tokens.is_some() {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                },
            );
        }
        let seed = match self.seed {
            Some(s) => s as u64,
            None => {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).map_err(|e| {
                    BadRequest::new(format!("no random seed: {e}; pass a seed"), Some("seed"))
                })?;
                u64::from_le_bytes(b)
            }
        };
        let mut sampling = if temperature == 0.0 {
            SamplerParams::greedy()
        } else {
            let mut p = SamplerParams::greedy();
            p.temperature = temperature;
            p.top_p = top_p;
            p
        };
        sampling.presence_penalty = presence;
        sampling.frequency_penalty = frequency;
        sampling.seed = seed;
        let mut params = GenerateParams::new(sampling);
        params.max_tokens = Some(max_new);
        params.stop = stop;
        Ok(Job::new(prompt, params))
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// OpenAI's finish reason: `"stop"` or `"length"`.
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// The `usage` object.
pub fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// An OpenAI error object.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}
