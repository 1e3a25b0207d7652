//! Every field of OpenAI's chat-completions and completions requests and of
//! llama-server's extensions, listed here from their documentation (not from the
//! server's table): each is in the server's table [`FIELDS`], and its example is either
//! taken (a job) or refused with a 400 naming the field, as the table says. A value that
//! asks for nothing (`null`, the default) is taken whatever the field, and a field
//! outside the specifications is ignored.

use kvcore_server::api::{
    ChatRequest, CompletionRequest, Endpoint, FIELDS, Field, Spec, Support, parse,
};
use serde_json::{Value, json};

mod common;
use common::LIMITS;

/// OpenAI's `POST /v1/chat/completions` request body.
const OPENAI_CHAT: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

/// OpenAI's `POST /v1/completions` request body.
const OPENAI_COMPLETIONS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

/// llama-server's `/completion` options and its chat extensions, which it reads on the
/// OpenAI endpoints too.
const LLAMA_SERVER: &[&str] = &[
    "prompt",
    "temperature",
    "dynatemp_range",
    "dynatemp_exponent",
    "top_k",
    "top_p",
    "min_p",
    "n_predict",
    "n_indent",
    "n_keep",
    "n_cmpl",
    "n_cache_reuse",
    "stream",
    "stop",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "xtc_probability",
    "xtc_threshold",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "grammar",
    "json_schema",
    "seed",
    "ignore_eos",
    "logit_bias",
    "n_probs",
    "min_keep",
    "t_max_predict_ms",
    "image_data",
    "id_slot",
    "cache_prompt",
    "return_tokens",
    "samplers",
    "timings_per_token",
    "return_progress",
    "sse_ping_interval",
    "post_sampling_probs",
    "response_fields",
    "lora",
    "top_n_sigma",
    "speculative.n_max",
    "speculative.n_min",
    "speculative.p_min",
    "chat_template_kwargs",
    "reasoning_format",
    "reasoning_control",
    "parse_tool_calls",
    "reasoning_effort",
    "parallel_tool_calls",
];

fn base(endpoint: Endpoint) -> Value {
    match endpoint {
        Endpoint::Chat => json!({"messages": [{"role": "user", "content": "hi"}]}),
        Endpoint::Completions => json!({"prompt": [1, 2, 3]}),
    }
}

/// Parses and checks `body` as the server does: a job, or the 400's message and param.
fn run(endpoint: Endpoint, body: &Value) -> Result<(), (String, Option<String>)> {
    let text = body.to_string();
    let prompt = vec![1u32, 2, 3];
    let r = match endpoint {
        Endpoint::Chat => parse::<ChatRequest>(text.as_bytes())
            .and_then(|r| r.common.job(prompt, LIMITS, endpoint)),
        Endpoint::Completions => parse::<CompletionRequest>(text.as_bytes())
            .and_then(|r| r.common.job(prompt, LIMITS, endpoint)),
    };
    r.map(drop).map_err(|e| (e.message, e.param))
}

fn with(endpoint: Endpoint, fields: &Value) -> Value {
    let mut b = base(endpoint);
    for (k, v) in fields.as_object().expect("an object of fields") {
        b[k] = v.clone();
    }
    b
}

/// The table's entry for `name` on `endpoint`.
fn entry(name: &str, endpoint: Endpoint) -> &'static Field {
    let applies = |s: Spec| {
        !matches!(
            (s, endpoint),
            (Spec::OpenAiChat, Endpoint::Completions) | (Spec::OpenAiCompletions, Endpoint::Chat)
        )
    };
    FIELDS
        .iter()
        .find(|f| f.name == name && applies(f.spec))
        .or_else(|| FIELDS.iter().find(|f| f.name == name))
        .unwrap_or_else(|| panic!("{name} is not in the server's table"))
}

fn walk(names: &[&str], endpoint: Endpoint) {
    for name in names {
        let f = entry(name, endpoint);
        let example: Value =
            serde_json::from_str(f.example).unwrap_or_else(|e| panic!("{name}'s example: {e}"));
        assert!(example.get(name).is_some(), "{name}'s example uses it");
        let got = run(endpoint, &with(endpoint, &example));
        match f.support {
            Support::Honoured | Support::NoEffect(_) => {
                assert_eq!(got, Ok(()), "{name} on {endpoint:?}: {example}")
            }
            Support::Refused { inert, .. } => {
                let (message, param) = got.expect_err(name);
                assert_eq!(param.as_deref(), Some(*name), "{message}");
                assert!(
                    message.starts_with(&format!("{name} is not supported: ")),
                    "{message}"
                );
                for v in inert.iter().chain(&["null"]) {
                    let fields = json!({ *name: serde_json::from_str::<Value>(v).unwrap() });
                    assert_eq!(
                        run(endpoint, &with(endpoint, &fields)),
                        Ok(()),
                        "{name}: {v} asks for nothing"
                    );
                }
            }
        }
    }
}

#[test]
fn every_field_of_openais_chat_request_is_honoured_or_refused_by_name() {
    walk(OPENAI_CHAT, Endpoint::Chat);
}

#[test]
fn every_field_of_openais_completions_request_is_honoured_or_refused_by_name() {
    walk(OPENAI_COMPLETIONS, Endpoint::Completions);
}

#[test]
fn every_llama_server_extension_is_honoured_or_refused_by_name_on_both_endpoints() {
    walk(LLAMA_SERVER, Endpoint::Chat);
    walk(LLAMA_SERVER, Endpoint::Completions);
}

#[test]
fn the_table_holds_nothing_outside_the_specifications() {
    for f in FIELDS {
        assert!(
            [OPENAI_CHAT, OPENAI_COMPLETIONS, LLAMA_SERVER]
                .iter()
                .any(|spec| spec.contains(&f.name)),
            "{} is in no specification",
            f.name
        );
    }
}

#[test]
fn fields_outside_the_specifications_are_ignored() {
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        let body = with(
            endpoint,
            &json!({"x_custom": {"a": 1}, "tool_choice_v2": true}),
        );
        assert_eq!(run(endpoint, &body), Ok(()));
    }
}

#[test]
fn sampling_fields_out_of_range_are_refused_by_name() {
    let cases = [
        (json!({"top_k": -2}), "top_k"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"repeat_penalty": 0}), "repeat_penalty"),
        (json!({"repeat_last_n": -2}), "repeat_last_n"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"logit_bias": {"42": 101}}), "logit_bias"),
        (json!({"logit_bias": {"49152": 1}}), "logit_bias"),
        (json!({"logit_bias": {"the": 1}}), "logit_bias"),
        (json!({"logit_bias": [[42]]}), "logit_bias"),
        (json!({"logit_bias": 3}), "logit_bias"),
        (json!({"n_predict": 0}), "n_predict"),
        (json!({"n_predict": 600}), "n_predict"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"seed": "x"}), "seed"),
    ];
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        for (fields, name) in &cases {
            let (message, param) = run(endpoint, &with(endpoint, fields)).expect_err(name);
            assert_eq!(param.as_deref(), Some(*name), "{fields}: {message}");
        }
    }
    // llama-server's forms.
    for fields in [
        json!({"logit_bias": [[42, false], [7, -3.5]]}),
        json!({"top_k": -1, "repeat_last_n": -1, "seed": -1, "n_predict": -1}),
    ] {
        assert_eq!(
            run(Endpoint::Completions, &with(Endpoint::Completions, &fields)),
            Ok(())
        );
    }
}

#[test]
fn logprobs_follow_each_endpoints_shape() {
    let chat = |f: Value| run(Endpoint::Chat, &with(Endpoint::Chat, &f));
    let text = |f: Value| run(Endpoint::Completions, &with(Endpoint::Completions, &f));
    assert_eq!(chat(json!({"logprobs": true, "top_logprobs": 20})), Ok(()));
    assert_eq!(
        chat(json!({"logprobs": true, "top_logprobs": 21}))
            .unwrap_err()
            .1
            .as_deref(),
        Some("top_logprobs")
    );
    assert_eq!(
        chat(json!({"top_logprobs": 2})).unwrap_err().1.as_deref(),
        Some("top_logprobs")
    );
    assert_eq!(
        chat(json!({"logprobs": 2})).unwrap_err().1.as_deref(),
        Some("logprobs")
    );
    assert_eq!(text(json!({"logprobs": 0})), Ok(()));
    assert_eq!(
        text(json!({"logprobs": 21})).unwrap_err().1.as_deref(),
        Some("logprobs")
    );
    assert_eq!(
        text(json!({"logprobs": true})).unwrap_err().1.as_deref(),
        Some("logprobs")
    );
    assert_eq!(
        text(json!({"top_logprobs": 2})).unwrap_err().1.as_deref(),
        Some("top_logprobs")
    );
}
