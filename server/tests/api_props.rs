//! Request bodies the server parses and checks, at random: whatever the bytes, parsing
//! and checking return a job or a 400 whose message says what is wrong, never a panic;
//! and a field of the wrong type or out of range is always refused, never dropped.

use kvcore_server::api::{
    ChatRequest, CompletionRequest, Endpoint, FIELDS as TABLE, Support, parse,
};
use proptest::prelude::*;
use serde_json::{Value, json};

mod common;
use common::LIMITS;

/// A JSON value of any shape (depth ≤ 3).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z \\\\\"\u{e9}\u{1F600}]{0,12}".prop_map(Value::String),
        // Around every bound the server checks.
        prop::sample::select(vec![
            -3.0, -2.0, -1.5, -0.0, 1e-50, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0
        ])
        .prop_map(|f| json!(f)),
        prop::sample::select(vec![-1i64, 0, 1, 2, 4, 5, 509, 510, 511, 1000])
            .prop_map(|n| json!(n)),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field's value: mostly numbers around the bounds, or any JSON.
fn field_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::sample::select(vec![-3.0, -2.0, -0.5, 0.0, 1e-50, 0.5, 1.0, 2.0, 2.5, 3.0])
            .prop_map(|f| json!(f)),
        3 => prop::sample::select(vec![-1i64, 0, 1, 2, 5, 508, 509, 510, 1000]).prop_map(|n| json!(n)),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => any_json(),
    ]
}

const FIELDS: [&str; 24] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "echo",
    "top_logprobs",
    "logit_bias",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "n_predict",
    "tools",
    "response_format",
    "mirostat",
];

/// `logit_bias` as the server reads it: an object of token ids (below the vocabulary)
/// to biases in [-100, 100] or `false`, or a list of such `[id, bias]` pairs.
fn valid_bias(v: &Value) -> bool {
    let id = |i: Option<u64>| i.is_some_and(|i| i < u64::from(LIMITS.vocab as u32));
    let bias =
        |b: &Value| b == &json!(false) || b.as_f64().is_some_and(|x| (-100.0..=100.0).contains(&x));
    match v {
        Value::Object(m) => m.iter().all(|(k, b)| id(k.parse().ok()) && bias(b)),
        Value::Array(a) => a.iter().all(|p| match p.as_array().map(Vec::as_slice) {
            Some([i, b]) => id(i.as_u64()) && bias(b),
            _ => false,
        }),
        _ => false,
    }
}

/// A plausible body: a valid base with known fields set to arbitrary values.
fn body() -> impl Strategy<Value = Value> {
    (
        any::<bool>(),
        prop::collection::vec((prop::sample::select(FIELDS.to_vec()), field_value()), 0..3),
    )
        .prop_map(|(chat, fields)| {
            let mut b = if chat {
                json!({"messages": [{"role": "user", "content": "hi"}]})
            } else {
                json!({"prompt": [1, 2, 3]})
            };
            for (k, v) in fields {
                b[k] = v;
            }
            b
        })
}

fn check(bytes: &[u8]) {
    let prompt = vec![1u32, 2, 3];
    if let Ok(r) = parse::<ChatRequest>(bytes)
        && let Err(e) = r.common.job(prompt.clone(), LIMITS, Endpoint::Chat)
    {
        assert!(!e.message.is_empty());
    }
    if let Ok(r) = parse::<CompletionRequest>(bytes)
        && let Err(e) = r.common.job(prompt, LIMITS, Endpoint::Completions)
    {
        assert!(!e.message.is_empty());
    }
    // A body serde cannot read, or a field the server refuses, by name.
    if let Err(e) = parse::<ChatRequest>(bytes) {
        let refused = e.param.as_ref().is_some_and(|p| {
            e.message.starts_with(&format!("{p} is not supported: "))
                && TABLE
                    .iter()
                    .any(|f| f.name == p && matches!(f.support, Support::Refused { .. }))
        });
        assert!(
            refused || e.message.starts_with("invalid request body: "),
            "{}",
            e.message
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        check(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(v in any_json()) {
        check(v.to_string().as_bytes());
    }

    #[test]
    fn bodies_with_any_field_values_are_accepted_only_when_every_field_is_valid(b in body()) {
        let text = b.to_string();
        check(text.as_bytes());
        // Each check the server makes, restated from the OpenAI reference: a job only
        // when every known field it reads is of its type and in range.
        let num = |k: &str| b.get(k).filter(|v| !v.is_null());
        // As serde reads an f32: the f64 rounded.
        let f = |k: &str| num(k).map(|v| v.as_f64().map(|x| f64::from(x as f32)));
        let valid = f("temperature").is_none_or(|t| t.is_some_and(|t| (0.0..=2.0).contains(&t)))
            && f("top_p").is_none_or(|p| p.is_some_and(|p| p > 0.0 && p <= 1.0))
            && f("presence_penalty").is_none_or(|p| p.is_some_and(|p| (-2.0..=2.0).contains(&p)))
            && f("frequency_penalty").is_none_or(|p| p.is_some_and(|p| (-2.0..=2.0).contains(&p)))
            && num("n").is_none_or(|n| n.as_u64() == Some(1))
            // The decoder's budget after 3 prompt tokens in 512 positions: 512 − 3 + 1
            // (the last token is never run).
            && ["max_tokens", "max_completion_tokens"].iter().all(|k| {
                num(k).is_none_or(|n| n.as_u64().is_some_and(|n| (1..=510).contains(&n)))
            })
            && num("seed").is_none_or(|s| s.as_i64().is_some())
            && num("stream").is_none_or(Value::is_boolean)
            && num("echo").is_none_or(|e| e == &json!(false))
            && num("model").is_none_or(Value::is_string)
            // Chat: a boolean, and top_logprobs (0 to 20) only with true; completions:
            // 0 to 20 top log-probabilities, and no top_logprobs.
            && if b.get("messages").is_some() {
                match num("logprobs") {
                    None | Some(Value::Bool(false)) => num("top_logprobs").is_none(),
                    Some(Value::Bool(true)) => num("top_logprobs").is_none_or(|n| n.as_u64().is_some_and(|n| n <= 20)),
                    Some(_) => false,
                }
            } else {
                num("logprobs").is_none_or(|l| l.as_u64().is_some_and(|n| n <= 20))
                    && num("top_logprobs").is_none()
            }
            && num("logit_bias").is_none_or(valid_bias)
            // llama-server's: -1 turns top-k off, and the penalty window is the context.
            && num("top_k").is_none_or(|k| k.as_i64().is_some_and(|k| k >= -1))
            && f("min_p").is_none_or(|p| p.is_some_and(|p| (0.0..=1.0).contains(&p)))
            && f("repeat_penalty").is_none_or(|p| p.is_some_and(|p| p.is_finite() && p > 0.0))
            && num("repeat_last_n").is_none_or(|n| n.as_i64().is_some_and(|n| n >= -1))
            && num("n_predict").is_none_or(|n| n.as_i64().is_some_and(|n| n == -1 || (1..=510).contains(&n)))
            // Refused unless they ask for nothing.
            && num("tools").is_none_or(|t| t == &json!([]))
            && num("response_format").is_none_or(|r| r == &json!({"type": "text"}))
            && num("mirostat").is_none_or(|m| m.as_f64() == Some(0.0))
            // llama-server's -1: a random seed; any other integer seeds.
            && num("stop").is_none_or(|s| match s {
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => a.len() <= 4 && a.iter().all(|x| x.as_str().is_some_and(|x| !x.is_empty())),
                _ => false,
            })
            && num("stream_options").is_none_or(|o| match o {
                Value::Object(o) => o.get("include_usage").is_none_or(|u| u.is_null() || u.is_boolean()),
                // serde reads a struct from a sequence of its fields too.
                Value::Array(a) => a.len() <= 1 && a.iter().all(|u| u.is_null() || u.is_boolean()),
                _ => false,
            });
        let got = if b.get("messages").is_some() {
            parse::<ChatRequest>(text.as_bytes()).and_then(|r| r.common.job(vec![1, 2, 3], LIMITS, Endpoint::Chat))
        } else {
            parse::<CompletionRequest>(text.as_bytes()).and_then(|r| r.common.job(vec![1, 2, 3], LIMITS, Endpoint::Completions))
        };
        prop_assert_eq!(got.is_ok(), valid, "{} -> {:?}", text, got.err().map(|e| e.message));
    }
}
