//! The OpenAI bodies: what a request may hold, how it becomes a [`Job`] for the
//! scheduler, and the JSON of the answers and stream chunks.
//!
//! Every field of OpenAI's chat-completions and completions requests and of
//! llama-server's extensions is in one table, [`FIELDS`], with what the server does
//! with it: honoured, accepted without effect on the tokens (an end-user id, a cache
//! hint), or refused with a 400 naming it unless its value asks for nothing (`null`,
//! the default: `"tools": []`, `"echo": false`). A field outside those specifications
//! is ignored (clients send many). A known field of the wrong type or a value out of
//! range is refused too, with the field's path as `param` (`max_tokens`,
//! `messages[2].content`): nothing a client asks for is silently dropped.
//!
//! **Log-probabilities** (`logprobs`, `top_logprobs`) are those of the model's raw
//! logits, `log_softmax(logits)`, before the sampler chain: no logit bias, penalties,
//! truncation or temperature, as OpenAI's are.

use crate::scheduler::{Job, Summary, TokenLogprobs};
use kvcore_engine::kvcore::model::{GenerateParams, SamplerParams, token_room};
use kvcore_engine::kvcore::tokenizer::ChatMessage;
use kvcore_engine::{Engine, FinishReason};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Where a request field is specified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// OpenAI's `POST /v1/chat/completions`.
    OpenAiChat,
    /// OpenAI's `POST /v1/completions`.
    OpenAiCompletions,
    /// Both of OpenAI's.
    OpenAiBoth,
    /// llama-server's extensions, which it reads on both endpoints.
    LlamaServer,
}

/// What the server does with a field.
#[derive(Clone, Copy, Debug)]
pub enum Support {
    /// Read and acted on.
    Honoured,
    /// Accepted; it cannot change the tokens (why).
    NoEffect(&'static str),
    /// A 400 naming the field unless its value is `null` or one of `inert` (JSON texts
    /// of the values that ask for nothing).
    Refused {
        /// What the server does not do.
        why: &'static str,
        /// Values accepted: they ask for nothing.
        inert: &'static [&'static str],
    },
}

/// One request field.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// Its name in the body.
    pub name: &'static str,
    /// Where it is specified.
    pub spec: Spec,
    /// What the server does with it.
    pub support: Support,
    /// A JSON object of fields that uses it (asking for something): the tests' case.
    pub example: &'static str,
}

const fn honoured(name: &'static str, spec: Spec, example: &'static str) -> Field {
    Field {
        name,
        spec,
        support: Support::Honoured,
        example,
    }
}

const fn no_effect(
    name: &'static str,
    spec: Spec,
    why: &'static str,
    example: &'static str,
) -> Field {
    Field {
        name,
        spec,
        support: Support::NoEffect(why),
        example,
    }
}

const fn refused(
    name: &'static str,
    spec: Spec,
    why: &'static str,
    inert: &'static [&'static str],
    example: &'static str,
) -> Field {
    Field {
        name,
        spec,
        support: Support::Refused { why, inert },
        example,
    }
}

use Spec::{
    LlamaServer as Llama, OpenAiBoth as Both, OpenAiChat as Chat, OpenAiCompletions as Text,
};

const TOOLS: &str = "tools and function calling are not implemented yet";
const STRUCTURED: &str =
    "structured output (JSON mode, JSON schemas, grammars) is not implemented yet";
const END_USER: &str = "an end-user identifier: the server keeps no record per user";
const DRY: &str = "read only with dry_multiplier, which is refused";

/// Every field of OpenAI's chat-completions and completions requests and of
/// llama-server's extensions, with what the server does with it.
#[rustfmt::skip]
pub const FIELDS: &[Field] = &[
    // OpenAI, chat completions.
    honoured("messages", Chat, r#"{"messages": [{"role": "user", "content": "hello"}]}"#),
    refused("audio", Chat, "audio output: the server generates text", &[], r#"{"audio": {"voice": "alloy", "format": "wav"}}"#),
    refused("function_call", Chat, TOOLS, &[r#""none""#], r#"{"function_call": "auto"}"#),
    refused("functions", Chat, TOOLS, &["[]"], r#"{"functions": [{"name": "f", "parameters": {}}]}"#),
    honoured("logprobs", Chat, r#"{"logprobs": true}"#),
    honoured("top_logprobs", Chat, r#"{"logprobs": true, "top_logprobs": 5}"#),
    honoured("max_completion_tokens", Chat, r#"{"max_completion_tokens": 8}"#),
    no_effect("metadata", Chat, "tags for stored completions: the server stores none", r#"{"metadata": {"k": "v"}}"#),
    refused("modalities", Chat, "output modalities other than text", &[r#"["text"]"#], r#"{"modalities": ["text", "audio"]}"#),
    refused("parallel_tool_calls", Chat, TOOLS, &[], r#"{"parallel_tool_calls": true}"#),
    refused("prediction", Chat, "predicted outputs", &[], r#"{"prediction": {"type": "content", "content": "x"}}"#),
    no_effect("prompt_cache_key", Chat, "the prefix cache finds shared prompts by their tokens", r#"{"prompt_cache_key": "k"}"#),
    refused("reasoning_effort", Chat, "reasoning control", &[], r#"{"reasoning_effort": "low"}"#),
    refused("response_format", Chat, STRUCTURED, &[r#"{"type": "text"}"#], r#"{"response_format": {"type": "json_object"}}"#),
    no_effect("safety_identifier", Chat, END_USER, r#"{"safety_identifier": "u1"}"#),
    refused("service_tier", Chat, "processing tiers: the server has one", &[r#""auto""#, r#""default""#], r#"{"service_tier": "flex"}"#),
    refused("store", Chat, "storing completions", &["false"], r#"{"store": true}"#),
    refused("tool_choice", Chat, TOOLS, &[r#""none""#], r#"{"tool_choice": "auto"}"#),
    refused("tools", Chat, TOOLS, &["[]"], r#"{"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}"#),
    refused("verbosity", Chat, "verbosity control", &[], r#"{"verbosity": "low"}"#),
    refused("web_search_options", Chat, "web search", &[], r#"{"web_search_options": {}}"#),
    // OpenAI, completions.
    honoured("prompt", Text, r#"{"prompt": "Once upon a time"}"#),
    refused("best_of", Text, "several candidates ranked on the server", &["1"], r#"{"best_of": 3}"#),
    refused("echo", Text, "echoing the prompt", &["false"], r#"{"echo": true}"#),
    honoured("logprobs", Text, r#"{"logprobs": 3}"#),
    refused("suffix", Text, "insertion (fill in the middle)", &[r#""""#], r#"{"suffix": " the end."}"#),
    // OpenAI, both.
    honoured("model", Both, r#"{"model": "any"}"#),
    honoured("frequency_penalty", Both, r#"{"frequency_penalty": 0.5}"#),
    honoured("logit_bias", Both, r#"{"logit_bias": {"42": -100}}"#),
    honoured("max_tokens", Both, r#"{"max_tokens": 8}"#),
    honoured("n", Both, r#"{"n": 1}"#),
    honoured("presence_penalty", Both, r#"{"presence_penalty": 0.5}"#),
    honoured("seed", Both, r#"{"seed": 7, "temperature": 0.8}"#),
    honoured("stop", Both, r#"{"stop": ["\n\n", "END"]}"#),
    honoured("stream", Both, r#"{"stream": true}"#),
    honoured("stream_options", Both, r#"{"stream": true, "stream_options": {"include_usage": true}}"#),
    honoured("temperature", Both, r#"{"temperature": 0.7}"#),
    honoured("top_p", Both, r#"{"top_p": 0.9, "temperature": 0.7}"#),
    no_effect("user", Both, END_USER, r#"{"user": "u1"}"#),
    // llama-server's extensions (its own names for OpenAI's fields are above).
    honoured("top_k", Llama, r#"{"top_k": 5, "temperature": 0.7}"#),
    honoured("min_p", Llama, r#"{"min_p": 0.1, "temperature": 0.7}"#),
    honoured("repeat_penalty", Llama, r#"{"repeat_penalty": 1.3}"#),
    honoured("repeat_last_n", Llama, r#"{"repeat_penalty": 1.3, "repeat_last_n": 16}"#),
    honoured("n_predict", Llama, r#"{"n_predict": 8}"#),
    no_effect("cache_prompt", Llama, "a prompt served from the prefix cache gives the same tokens as one prefilled anew (aligned prefill chunks)", r#"{"cache_prompt": false}"#),
    no_effect("id_slot", Llama, "the scheduler places requests; a request's tokens do not depend on where it runs", r#"{"id_slot": 1}"#),
    no_effect("sse_ping_interval", Llama, "the server sends its own keep-alive comments", r#"{"sse_ping_interval": 5}"#),
    no_effect("speculative.n_max", Llama, "the server does not draft tokens", r#"{"speculative.n_max": 8}"#),
    no_effect("speculative.n_min", Llama, "the server does not draft tokens", r#"{"speculative.n_min": 1}"#),
    no_effect("speculative.p_min", Llama, "the server does not draft tokens", r#"{"speculative.p_min": 0.5}"#),
    refused("dynatemp_range", Llama, "dynamic temperature", &["0"], r#"{"dynatemp_range": 0.5}"#),
    no_effect("dynatemp_exponent", Llama, "read only with dynatemp_range, which is refused", r#"{"dynatemp_exponent": 2}"#),
    refused("typical_p", Llama, "locally typical sampling", &["1"], r#"{"typical_p": 0.9}"#),
    refused("dry_multiplier", Llama, "the DRY repetition penalty", &["0"], r#"{"dry_multiplier": 0.8}"#),
    no_effect("dry_base", Llama, DRY, r#"{"dry_base": 2}"#),
    no_effect("dry_allowed_length", Llama, DRY, r#"{"dry_allowed_length": 3}"#),
    no_effect("dry_penalty_last_n", Llama, DRY, r#"{"dry_penalty_last_n": 128}"#),
    no_effect("dry_sequence_breakers", Llama, DRY, r#"{"dry_sequence_breakers": ["\n"]}"#),
    refused("xtc_probability", Llama, "the XTC sampler", &["0"], r#"{"xtc_probability": 0.5}"#),
    no_effect("xtc_threshold", Llama, "read only with xtc_probability, which is refused", r#"{"xtc_threshold": 0.2}"#),
    refused("mirostat", Llama, "Mirostat sampling", &["0"], r#"{"mirostat": 2}"#),
    no_effect("mirostat_tau", Llama, "read only with mirostat, which is refused", r#"{"mirostat_tau": 4}"#),
    no_effect("mirostat_eta", Llama, "read only with mirostat, which is refused", r#"{"mirostat_eta": 0.2}"#),
    refused("top_n_sigma", Llama, "top-n-sigma sampling", &["-1"], r#"{"top_n_sigma": 1.5}"#),
    refused("samplers", Llama, "a sampler order of the request's own: the server runs llama.cpp's default chain", &[], r#"{"samplers": ["top_k", "temperature"]}"#),
    refused("min_keep", Llama, "a floor on the candidates the samplers keep", &["0"], r#"{"min_keep": 5}"#),
    refused("grammar", Llama, STRUCTURED, &[r#""""#], r#"{"grammar": "root ::= \"yes\""}"#),
    refused("json_schema", Llama, STRUCTURED, &[], r#"{"json_schema": {"type": "object"}}"#),
    refused("ignore_eos", Llama, "generating past the end-of-turn token", &["false"], r#"{"ignore_eos": true}"#),
    refused("n_probs", Llama, "llama-server's probabilities: use logprobs (and top_logprobs)", &["0"], r#"{"n_probs": 5}"#),
    refused("post_sampling_probs", Llama, "probabilities after the sampler chain: logprobs are before it", &["false"], r#"{"post_sampling_probs": true}"#),
    refused("n_indent", Llama, "a minimum indentation", &["0"], r#"{"n_indent": 4}"#),
    refused("n_keep", Llama, "context shifting: a request that does not fit is refused", &["0"], r#"{"n_keep": -1}"#),
    refused("n_cmpl", Llama, "several completions of one prompt", &["1"], r#"{"n_cmpl": 2}"#),
    refused("n_cache_reuse", Llama, "reusing cache chunks by shifting them", &["0"], r#"{"n_cache_reuse": 256}"#),
    refused("t_max_predict_ms", Llama, "a time limit on generation", &["0"], r#"{"t_max_predict_ms": 1000}"#),
    refused("image_data", Llama, "images: the server runs text models", &["[]"], r#"{"image_data": [{"data": "AAAA", "id": 1}]}"#),
    refused("return_tokens", Llama, "token ids in the answer", &["false"], r#"{"return_tokens": true}"#),
    refused("timings_per_token", Llama, "timings in the answer", &["false"], r#"{"timings_per_token": true}"#),
    refused("return_progress", Llama, "prompt progress events", &["false"], r#"{"return_progress": true}"#),
    refused("response_fields", Llama, "choosing the answer's fields", &["[]"], r#"{"response_fields": ["content"]}"#),
    refused("lora", Llama, "LoRA adapters", &["[]"], r#"{"lora": [{"id": 0, "scale": 0.5}]}"#),
    refused("chat_template_kwargs", Llama, "arguments for the chat template: the built-in templates take none", &["{}"], r#"{"chat_template_kwargs": {"enable_thinking": false}}"#),
    refused("reasoning_format", Llama, "parsing reasoning out of the text: the text is returned as generated", &[r#""none""#], r#"{"reasoning_format": "deepseek"}"#),
    refused("reasoning_control", Llama, "reasoning control", &["false"], r#"{"reasoning_control": true}"#),
    refused("parse_tool_calls", Llama, TOOLS, &["false"], r#"{"parse_tool_calls": true}"#),
];

/// Whether two JSON values are equal, numbers by value (`0` and `0.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// The first field of `body` the server refuses: a 400 naming it.
fn refuse_unsupported(body: &Value) -> Checked<()> {
    let Value::Object(fields) = body else {
        return Ok(());
    };
    for f in FIELDS {
        let Support::Refused { why, inert } = f.support else {
            continue;
        };
        let Some(v) = fields.get(f.name) else {
            continue;
        };
        let asks_nothing = v.is_null()
            || inert
                .iter()
                .any(|i| serde_json::from_str::<Value>(i).is_ok_and(|i| same(&i, v)));
        if !asks_nothing {
            return Err(BadRequest::new(
                format!("{} is not supported: {why}", f.name),
                Some(f.name),
            ));
        }
    }
    Ok(())
}

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

/// The fields `/v1/chat/completions` and `/v1/completions` share, llama-server's
/// sampling fields among them.
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
    n_predict: Option<i64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    repeat_last_n: Option<i64>,
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
    logit_bias: Option<Value>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<u64>,
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

/// Which endpoint a body is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl Endpoint {
    /// The field that holds the prompt (`messages`, `prompt`).
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// A request body: its endpoint's own fields and the shared ones, each read from the
/// same JSON object (not with `#[serde(flatten)]`, which would hide a field's path).
pub trait Body: Sized {
    /// Its endpoint.
    const ENDPOINT: Endpoint;
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
    const ENDPOINT: Endpoint = Endpoint::Chat;
    fn from_json(v: &Value) -> Result<Self, PathError> {
        let (ChatFields { messages }, common) = fields(v)?;
        Ok(ChatRequest { messages, common })
    }
}

impl Body for CompletionRequest {
    const ENDPOINT: Endpoint = Endpoint::Completions;
    fn from_json(v: &Value) -> Result<Self, PathError> {
        let (CompletionFields { prompt }, common) = fields(v)?;
        Ok(CompletionRequest { prompt, common })
    }
}

/// Parses a body, naming what serde found wrong and where: "invalid request body:
/// max_tokens: invalid type: string \"ten\", expected u64" with `param` `max_tokens`;
/// or the first field the server refuses ([`FIELDS`]).
pub fn parse<T: Body>(body: &[u8]) -> Checked<T> {
    let v = json_of(body)?;
    refuse_unsupported(&v)?;
    T::from_json(&v).map_err(path_error)
}

/// A body's JSON, or a 400 saying why it is not JSON.
pub(crate) fn json_of(body: &[u8]) -> Checked<Value> {
    serde_json::from_slice(body)
        .map_err(|e| BadRequest::new(format!("invalid request body: {e}"), None))
}

/// `T` from a body's JSON, naming the field at fault (see [`parse`]).
pub(crate) fn read<T: DeserializeOwned>(v: &Value) -> Checked<T> {
    serde_path_to_error::deserialize(v).map_err(path_error)
}

/// A 400 naming where serde found the body wrong.
fn path_error(e: PathError) -> BadRequest {
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
    /// Tokens in the model's vocabulary (`logit_bias` ids are below it).
    pub vocab: usize,
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
        engine
            .chat_ids(&chat_messages(&self.messages)?)
            .map_err(|e| BadRequest::new(e.message(), Some("messages")))
    }
}

/// A body of chat messages alone (`/apply-template`).
#[derive(Debug, Deserialize)]
pub(crate) struct Messages {
    messages: Vec<Message>,
}

impl Messages {
    /// The messages rendered by the model's chat template as text, ready for the
    /// assistant's reply.
    pub(crate) fn render(&self, engine: &Engine) -> Checked<String> {
        let messages = chat_messages(&self.messages)?;
        let template = engine
            .template()
            .ok_or_else(|| BadRequest::new("the model has no chat template", Some("messages")))?;
        template
            .render(&messages, true)
            .map_err(|e| BadRequest::new(e.to_string(), Some("messages")))
    }
}

/// The messages as the chat template takes them: the roles the server knows, text
/// content only.
fn chat_messages(given: &[Message]) -> Checked<Vec<ChatMessage>> {
    if given.is_empty() {
        return Err(BadRequest::new(
            "messages must hold at least one message",
            Some("messages"),
        ));
    }
    let mut messages = Vec::with_capacity(given.len());
    for m in given {
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
    Ok(messages)
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

/// Most `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// A logit bias's magnitude limit (OpenAI's: -100 bans a token in practice).
const MAX_BIAS: f64 = 100.0;

/// `logit_bias`: OpenAI's object of token ids (as strings) to biases in [-100, 100], or
/// llama-server's list of `[id, bias]` pairs where a bias of `false` bans the token.
fn logit_bias(v: &Value, vocab: usize) -> Checked<Vec<(u32, f32)>> {
    let bad = |m: String| BadRequest::new(format!("logit_bias: {m}"), Some("logit_bias"));
    let id = |v: Option<u64>, shown: &dyn std::fmt::Display| match v {
        Some(id) if (id as usize) < vocab => Ok(id as u32),
        _ => Err(bad(format!(
            "{shown} is not a token id of the vocabulary of {vocab}"
        ))),
    };
    let bias = |b: &Value| match b {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        Value::Number(n) => match n.as_f64() {
            Some(x) if (-MAX_BIAS..=MAX_BIAS).contains(&x) => Ok(x as f32),
            _ => Err(bad(format!("the bias {n} is outside [-100, 100]"))),
        },
        other => Err(bad(format!(
            "the bias {other} is not a number (or false, to ban the token)"
        ))),
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Object(m) => m
            .iter()
            .map(|(k, b)| Ok((id(k.parse().ok(), &format!("{k:?}"))?, bias(b)?)))
            .collect(),
        Value::Array(pairs) => pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([i, b]) => Ok((id(i.as_u64(), i)?, bias(b)?)),
                _ => Err(bad(format!("{p} is not an [id, bias] pair"))),
            })
            .collect(),
        other => Err(bad(format!(
            "{other} is neither an object of token ids to biases nor a list of [id, bias] pairs"
        ))),
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

    /// How many top log-probabilities each token reports (`None`: none asked for).
    /// Chat: `logprobs: true` with `top_logprobs` (0 to 20); completions: `logprobs: N`
    /// (0 to 20).
    fn logprobs(&self, endpoint: Endpoint) -> Checked<Option<usize>> {
        let bad = |m: &str, p: &str| Err(BadRequest::new(m, Some(p)));
        let top = match self.top_logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => {
                return bad(&format!("top_logprobs {n}: at most 20"), "top_logprobs");
            }
            top => top.map(|n| n as usize),
        };
        match (endpoint, &self.logprobs) {
            (Endpoint::Chat, None | Some(Value::Null) | Some(Value::Bool(false))) => {
                if top.is_some() {
                    return bad("top_logprobs needs logprobs: true", "top_logprobs");
                }
                Ok(None)
            }
            (Endpoint::Chat, Some(Value::Bool(true))) => Ok(Some(top.unwrap_or(0))),
            (Endpoint::Chat, Some(_)) => bad("logprobs: true or false", "logprobs"),
            (Endpoint::Completions, _) if top.is_some() => bad(
                "top_logprobs is a chat field: completions take logprobs: N",
                "top_logprobs",
            ),
            (Endpoint::Completions, None | Some(Value::Null)) => Ok(None),
            (Endpoint::Completions, Some(v)) => match v.as_u64() {
                Some(n) if n <= MAX_TOP_LOGPROBS => Ok(Some(n as usize)),
                _ => bad(
                    &format!("logprobs {v}: the number of top log-probabilities, 0 to 20"),
                    "logprobs",
                ),
            },
        }
    }

    /// The sampler chain the request asks for: OpenAI's defaults (temperature 1, no
    /// top-k or min-p, no penalties) where it says nothing; temperature 0 is greedy
    /// (logit bias and penalties still apply).
    fn sampling(&self, limits: Limits) -> Checked<SamplerParams> {
        let bad = |m: String, p: &str| Err(BadRequest::new(m, Some(p)));
        let mut s = SamplerParams::greedy();
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
        s.presence_penalty = penalty(self.presence_penalty, "presence_penalty")?;
        s.frequency_penalty = penalty(self.frequency_penalty, "frequency_penalty")?;
        // llama-server's: -1 and 0 keep every candidate.
        s.top_k = match self.top_k.unwrap_or(0) {
            k if k >= -1 => k.max(0) as usize,
            k => return bad(format!("top_k {k}: 0 (or -1) for all, or more"), "top_k"),
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_p) {
            return bad(format!("min_p {min_p}: it must be in [0, 1]"), "min_p");
        }
        let repeat = self.repeat_penalty.unwrap_or(1.0);
        if !(repeat.is_finite() && repeat > 0.0) {
            return bad(
                format!("repeat_penalty {repeat}: it must be above 0 (1: off)"),
                "repeat_penalty",
            );
        }
        // llama-server's: -1 is the whole context, 0 turns the penalties off.
        s.repeat_last_n = match self.repeat_last_n {
            None => s.repeat_last_n,
            Some(-1) => limits.ctx,
            Some(n) if n >= 0 => n as usize,
            Some(n) => {
                return bad(
                    format!("repeat_last_n {n}: 0 or more, or -1 for the whole context"),
                    "repeat_last_n",
                );
            }
        };
        s.temperature = temperature;
        s.top_p = top_p;
        s.min_p = min_p;
        s.repeat_penalty = repeat;
        s.logit_bias = match &self.logit_bias {
            Some(v) => logit_bias(v, limits.vocab)?,
            None => Vec::new(),
        };
        // llama-server's -1: a random seed.
        s.seed = match self.seed {
            Some(seed) if seed != -1 => seed as u64,
            _ => {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).map_err(|e| {
                    BadRequest::new(format!("no random seed: {e}; pass a seed"), Some("seed"))
                })?;
                u64::from_le_bytes(b)
            }
        };
        Ok(s)
    }

    /// Checks every field and makes the scheduler's job (without its channel) for
    /// `endpoint`. Without a token limit (`max_completion_tokens`, `max_tokens`,
    /// llama-server's `n_predict`) the request generates up to what the context and the
    /// KV budget hold (ending with "length").
    pub fn job(&self, prompt: Vec<u32>, limits: Limits, endpoint: Endpoint) -> Checked<Job> {
        let bad = |m: String, p: &str| Err(BadRequest::new(m, Some(p)));
        let prompt_field = endpoint.prompt_field();
        if self.n.is_some_and(|n| n != 1) {
            return bad("n must be 1: one choice per request".into(), "n");
        }
        let logprobs = self.logprobs(endpoint)?;
        let sampling = self.sampling(limits)?;
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
        // llama-server's -1: no limit.
        let n_predict = match self.n_predict {
            None | Some(-1) => None,
            Some(n) if n >= 1 => Some(n as u64),
            Some(n) => {
                return bad(
                    format!("n_predict {n}: at least 1, or -1 for no limit"),
                    "n_predict",
                );
            }
        };
        // Every name is checked; the newest one given wins.
        let limits_asked = [
            (self.max_completion_tokens, "max_completion_tokens"),
            (self.max_tokens, "max_tokens"),
            (n_predict, "n_predict"),
        ];
        for (asked, name) in limits_asked {
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
        let asked = limits_asked.iter().find(|(n, _)| n.is_some());
        let max_new = asked
            .and_then(|a| a.0)
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
                asked.map_or("max_tokens", |a| a.1),
            );
        }
        let mut params = GenerateParams::new(sampling);
        params.max_tokens = Some(max_new);
        params.stop = stop;
        params.logprobs = logprobs;
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

/// A log-probability as JSON: OpenAI's -9999 for a token the model rules out.
fn logprob_json(lp: f64) -> Value {
    json!(if lp.is_finite() { lp } else { -9999.0 })
}

/// A token's text as the answers show it: its bytes as UTF-8, a part of a character
/// as U+FFFD (the chat answer's `bytes` hold it exactly).
fn token_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A chat choice's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`,
/// one entry per generated token (the end-of-turn token excepted).
pub fn chat_logprobs(tokens: &[TokenLogprobs]) -> Value {
    let entry = |b: &[u8], lp: f64| json!({"token": token_text(b), "logprob": logprob_json(lp), "bytes": b});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.bytes, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(b, lp)| entry(b, *lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// A completion choice's `logprobs`: `tokens`, `token_logprobs`, `top_logprobs` (an
/// object of token text to log-probability per token) and `text_offset` (characters
/// into the completion's text, counted on from `offset`, which it advances).
pub fn text_logprobs(tokens: &[TokenLogprobs], offset: &mut usize) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        let text = token_text(&t.bytes);
        offsets.push(*offset);
        *offset += text.chars().count();
        texts.push(text);
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let by_text: serde_json::Map<String, Value> = t
                .top
                .iter()
                .map(|(b, lp)| (token_text(b), logprob_json(*lp)))
                .collect();
            Value::Object(by_text)
        })
        .collect();
    json!({
        "tokens": texts,
        "token_logprobs": tokens.iter().map(|t| logprob_json(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
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
