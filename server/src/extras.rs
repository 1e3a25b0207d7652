//! The endpoints beside generation: llama-server's `POST /tokenize`, `/detokenize` and
//! `/apply-template`, and OpenAI's `POST /v1/embeddings`, their bodies checked as the
//! completions' are (a 400 names the field) and their answers in those servers' shapes.
//!
//! Embeddings run the model on tokio's blocking pool, beside the scheduler's batch (a
//! pass of their own over a KV store of their own, never the pool's): each input at
//! most the server's context, the request admitted like a completion (503 when the
//! slots and the queue are full).

use crate::api::{BadRequest, Limits, Messages, json_of, read};
use base64::Engine as _;
use kvcore_engine::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

type Checked<T> = Result<T, BadRequest>;

fn bad<T>(message: String, param: &str) -> Checked<T> {
    Err(BadRequest {
        message,
        param: Some(param.into()),
    })
}

fn yes() -> bool {
    true
}

/// `POST /tokenize`.
#[derive(Deserialize)]
struct Tokenize {
    content: String,
    /// The model's BOS first (when it asks for one).
    #[serde(default)]
    add_special: bool,
    /// Special-token texts become control tokens.
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each id with its text.
    #[serde(default)]
    with_pieces: bool,
}

/// `{"tokens": [ids]}`, or with `with_pieces` `[{"id", "piece"}]`: the piece a string
/// when its bytes are UTF-8, else the bytes.
pub(crate) fn tokenize(engine: &Engine, body: &[u8]) -> Checked<Value> {
    let t: Tokenize = read(&json_of(body)?)?;
    let ids = engine.tokenize(&t.content, t.add_special, t.parse_special);
    if !t.with_pieces {
        return Ok(json!({ "tokens": ids }));
    }
    let tok = engine.tokenizer();
    let pieces: Vec<Value> = ids
        .iter()
        .map(|&id| {
            // Every id comes from the tokenizer.
            let bytes = tok.token_bytes(id).unwrap_or_default();
            let piece = match std::str::from_utf8(bytes) {
                Ok(text) => json!(text),
                Err(_) => json!(bytes),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(json!({ "tokens": pieces }))
}

/// `POST /detokenize`.
#[derive(Deserialize)]
struct Detokenize {
    tokens: Vec<u32>,
}

/// `{"content": text}`.
pub(crate) fn detokenize(engine: &Engine, body: &[u8]) -> Checked<Value> {
    let d: Detokenize = read(&json_of(body)?)?;
    let vocab = engine.vocab_size();
    if let Some(&id) = d.tokens.iter().find(|&&id| id as usize >= vocab) {
        return bad(
            format!("token id {id} is outside the vocabulary of {vocab}"),
            "tokens",
        );
    }
    let content = engine
        .detokenize(&d.tokens)
        .or_else(|e| bad(e.message(), "tokens"))?;
    Ok(json!({ "content": content }))
}

/// `POST /apply-template`: `{"prompt": text}`, the messages rendered by the model's
/// chat template, ready for the assistant's reply.
pub(crate) fn apply_template(engine: &Engine, body: &[u8]) -> Checked<Value> {
    let m: Messages = read(&json_of(body)?)?;
    Ok(json!({ "prompt": m.render(engine)? }))
}

/// `POST /v1/embeddings`.
#[derive(Deserialize)]
struct Embeddings {
    input: Input,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    One(String),
    Many(Vec<String>),
    /// Token ids: recognised, to be refused by name.
    #[expect(dead_code, reason = "only recognised")]
    Ids(Vec<u32>),
    #[expect(dead_code, reason = "only recognised")]
    IdLists(Vec<Vec<u32>>),
}

/// OpenAI's embeddings list: each input's sentence embedding (the final hidden state
/// mean-pooled and L2-normalised), as floats or as base64 of little-endian f32s; usage
/// counts the inputs' tokens. `model` is echoed (`served` when absent).
pub(crate) fn embeddings(
    engine: &Engine,
    limits: Limits,
    served: &str,
    body: &[u8],
) -> Checked<Value> {
    let e: Embeddings = read(&json_of(body)?)?;
    let base64 = match e.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return bad(
                format!("encoding_format {other:?}: float or base64"),
                "encoding_format",
            );
        }
    };
    let texts = match e.input {
        Input::One(t) => vec![t],
        Input::Many(ts) => ts,
        Input::Ids(_) | Input::IdLists(_) => {
            return bad(
                "input as token ids is not supported: send the text".into(),
                "input",
            );
        }
    };
    if texts.is_empty() {
        return bad("input holds no text".into(), "input");
    }
    let mut data = Vec::with_capacity(texts.len());
    let mut tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        let n = engine.tokenize(text, false, false).len();
        if n == 0 || n > limits.ctx {
            return bad(
                format!(
                    "input {i} is {n} tokens: it must be between 1 and the context of {}",
                    limits.ctx
                ),
                "input",
            );
        }
        tokens += n;
        let v = engine.embed(text).or_else(|e| bad(e.message(), "input"))?;
        if let Some(d) = e.dimensions.filter(|&d| d as usize != v.len()) {
            return bad(
                format!("dimensions {d}: the model's embeddings have {}", v.len()),
                "dimensions",
            );
        }
        let embedding = if base64 {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            json!(v)
        };
        data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
    }
    Ok(json!({
        "object": "list",
        "data": data,
        "model": e.model.as_deref().unwrap_or(served),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}
