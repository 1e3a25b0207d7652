//! `kvcore serve`'s request fields through the binary on SmolLM2: every field the
//! server refuses is a 400 naming it in OpenAI's error object; the sampling fields
//! (`seed`, `logit_bias`, `top_k`, `min_p`, the penalties) act, whole and streamed; and
//! `logprobs` agree with the reference's logits (`../shared/reference`, an independent
//! float64 implementation).

mod common;

use common::server::{Server, stream_text};
use kvcore_server::api::{FIELDS, Spec, Support};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const TEXT: &str = "/v1/completions";

fn reference(name: &str) -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    );
    let text = std::fs::read_to_string(path).expect("the reference logits");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("a list of prompts");
    cases
        .into_iter()
        .find(|c| c["name"] == name)
        .expect("the case")
}

fn tokenizer() -> kvcore::tokenizer::Tokenizer {
    let file = kvcore::gguf::GgufFile::open(std::path::Path::new(&common::smollm2()))
        .expect("open SmolLM2");
    kvcore::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer")
}

fn merged(base: &Value, fields: &Value) -> Value {
    let mut b = base.clone();
    for (k, v) in fields.as_object().expect("fields") {
        b[k] = v.clone();
    }
    b
}

fn chat_body(fields: Value) -> Value {
    merged(
        &json!({"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12}),
        &fields,
    )
}

fn text_body(fields: Value) -> Value {
    merged(
        &json!({"prompt": "The capital of France is", "max_tokens": 12}),
        &fields,
    )
}

/// The whole answer's text (chat or completion).
fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

fn post_ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, v) = server.post(path, body);
    assert_eq!(status, 200, "{body} -> {v}");
    v
}

#[test]
fn every_refused_field_is_a_400_naming_it_on_both_endpoints() {
    let server = Server::start(&[]);
    let mut walked = 0;
    for f in FIELDS {
        let Support::Refused { why, .. } = f.support else {
            continue;
        };
        let example: Value = serde_json::from_str(f.example).expect("an example");
        let paths: &[&str] = match f.spec {
            Spec::OpenAiChat => &[CHAT],
            Spec::OpenAiCompletions => &[TEXT],
            _ => &[CHAT, TEXT],
        };
        for &path in paths {
            let body = if path == CHAT {
                chat_body(example.clone())
            } else {
                text_body(example.clone())
            };
            let (status, v) = server.post(path, &body);
            assert_eq!(status, 400, "{path} {body}: {v}");
            let e = &v["error"];
            assert_eq!(e["param"], f.name, "{v}");
            assert_eq!(e["type"], "invalid_request_error", "{v}");
            assert_eq!(
                e["message"],
                format!("{} is not supported: {why}", f.name),
                "{v}"
            );
            walked += 1;
        }
    }
    assert!(walked > 40, "{walked} refusals walked");
    // The values that ask for nothing pass.
    for fields in [
        json!({"tools": [], "tool_choice": "none", "response_format": {"type": "text"}}),
        json!({"store": false, "service_tier": "auto", "user": "u", "metadata": {"a": "b"}}),
        json!({"mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0, "dry_base": 1.75}),
        json!({"unknown_vendor_field": {"x": 1}}),
    ] {
        post_ok(&server, CHAT, &chat_body(fields));
    }
}

#[test]
fn sampling_fields_act_whole_and_streamed() {
    let server = Server::start(&["--parallel", "2"]);
    for (path, body) in [(CHAT, chat_body(json!({}))), (TEXT, text_body(json!({})))] {
        let object = if path == CHAT {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let ask = |fields: Value| text_of(&post_ok(&server, path, &merged(&body, &fields)));
        let streamed = |fields: Value| {
            let b = merged(&body, &merged(&fields, &json!({"stream": true})));
            let mut st = server.stream(path, &b).expect("200");
            let (chunks, done) = st.read_all();
            assert!(done);
            stream_text(&chunks, object).0
        };
        let greedy = ask(json!({"temperature": 0}));
        // A seed repeats itself, whole and streamed; another seed at a high
        // temperature draws other tokens.
        let hot = json!({"temperature": 1.5, "seed": 11});
        let a = ask(hot.clone());
        assert_eq!(a, ask(hot.clone()), "{path}");
        assert_eq!(a, streamed(hot), "{path}");
        assert_ne!(a, ask(json!({"temperature": 1.5, "seed": 12})), "{path}");
        // top_k 1 and min_p 1 keep only the most likely token: greedy at any
        // temperature, whatever the seed.
        for cut in [json!({"top_k": 1}), json!({"min_p": 1.0})] {
            let f = merged(&cut, &json!({"temperature": 1.9, "seed": 5}));
            assert_eq!(ask(f.clone()), greedy, "{path} {cut}");
            assert_eq!(streamed(f), greedy, "{path} {cut}");
        }
        // Penalties on the tokens seen change a greedy reply.
        for penalty in [
            json!({"repeat_penalty": 3.0}),
            json!({"presence_penalty": 2.0}),
            json!({"frequency_penalty": 2.0}),
        ] {
            let f = merged(&penalty, &json!({"temperature": 0}));
            let got = ask(f.clone());
            assert_ne!(got, greedy, "{path} {penalty}");
            assert_eq!(streamed(f), got, "{path} {penalty}");
        }
    }
}

#[test]
fn logit_bias_moves_the_greedy_token() {
    let server = Server::start(&[]);
    let france = reference("raw-france");
    let first = france["greedy_ids"][0].as_u64().unwrap();
    let tok = tokenizer();
    let piece = String::from_utf8_lossy(tok.token_bytes(first as u32).unwrap()).into_owned();
    let body = json!({"prompt": france["text"], "max_tokens": 1, "temperature": 0});
    let greedy = text_of(&post_ok(&server, TEXT, &body));
    assert_eq!(greedy, piece);
    // OpenAI's object and llama-server's pairs (false bans the token).
    for bias in [
        json!({ first.to_string(): -100 }),
        json!([[first, false]]),
        json!([[first, -100.0]]),
    ] {
        let v = post_ok(&server, TEXT, &merged(&body, &json!({"logit_bias": bias})));
        assert_ne!(text_of(&v), greedy, "{bias}");
    }
    // A bias up makes a token the greedy one.
    let second = france["positions"][4]["top"][1][0].as_u64().unwrap();
    let v = post_ok(
        &server,
        TEXT,
        &merged(&body, &json!({"logit_bias": { second.to_string(): 10 }})),
    );
    let want = String::from_utf8_lossy(tok.token_bytes(second as u32).unwrap()).into_owned();
    assert_eq!(text_of(&v), want);
    // An id outside the vocabulary is named.
    let (status, v) = server.post(TEXT, &merged(&body, &json!({"logit_bias": {"4000000": 1}})));
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("logit_bias")),
        "{v}"
    );
}

/// The log-probabilities of a chat answer's tokens, and the tokens.
fn chat_entries(logprobs: &Value) -> &Vec<Value> {
    logprobs["content"].as_array().expect("content")
}

#[test]
fn logprobs_are_the_raw_logits_log_softmax_whole_and_streamed() {
    let server = Server::start(&[]);
    let france = reference("raw-france");
    let tok = tokenizer();
    let bytes_of = |id: &Value| {
        tok.token_bytes(id.as_u64().unwrap() as u32)
            .unwrap()
            .to_vec()
    };
    // Completions: the first token's top 5 are the reference's top 5 at the last
    // prompt position, and their differences are the reference's logit differences.
    let n = france["greedy_ids"].as_array().unwrap().len();
    let body = json!({"prompt": france["text"], "max_tokens": n, "temperature": 0, "logprobs": 5});
    let v = post_ok(&server, TEXT, &body);
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), n, "{lp}");
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text_of(&v));
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    let top0 = lp["top_logprobs"][0].as_object().unwrap();
    let reference_top = france["positions"][4]["top"].as_array().unwrap();
    let logit = |i: usize| reference_top[i][1].as_f64().unwrap();
    let text_of_ref =
        |i: usize| String::from_utf8_lossy(&bytes_of(&reference_top[i][0])).into_owned();
    for i in 0..5 {
        let got = top0[&text_of_ref(i)]
            .as_f64()
            .unwrap_or_else(|| panic!("{i}: {top0:?}"));
        let want = top0[&text_of_ref(0)].as_f64().unwrap() - (logit(0) - logit(i));
        assert!((got - want).abs() < 0.05, "top {i}: {got} vs {want}");
    }
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs[0], top0[&text_of_ref(0)]);
    // Greedy: each token is its step's most likely, and the top's mass is at most 1.
    for (i, t) in tokens.iter().enumerate() {
        let top = lp["top_logprobs"][i].as_object().unwrap();
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert_eq!(token_logprobs[i].as_f64().unwrap(), best, "{i} {t}");
        let mass: f64 = top.values().map(|x| x.as_f64().unwrap().exp()).sum();
        assert!(mass <= 1.0 + 1e-9, "{mass}");
    }
    // Streamed: the same entries, chunk by chunk.
    let mut st = server
        .stream(TEXT, &merged(&body, &json!({"stream": true})))
        .expect("200");
    let (chunks, _) = st.read_all();
    let mut streamed = Vec::new();
    let mut streamed_offsets = Vec::new();
    for c in &chunks {
        let l = &c["choices"][0]["logprobs"];
        if l.is_object() {
            streamed.extend(l["token_logprobs"].as_array().unwrap().iter().cloned());
            streamed_offsets.extend(
                l["text_offset"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_u64().unwrap()),
            );
        }
    }
    assert_eq!(&streamed, token_logprobs);
    assert_eq!(streamed_offsets, offsets);

    // Chat: entries with token, logprob, bytes and top_logprobs; the token is the top
    // one (greedy); bytes rebuild the text.
    let body = chat_body(json!({"temperature": 0, "logprobs": true, "top_logprobs": 3}));
    let v = post_ok(&server, CHAT, &body);
    let entries = chat_entries(&v["choices"][0]["logprobs"]).clone();
    assert!(!entries.is_empty());
    let mut bytes = Vec::new();
    for e in &entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        let mass: f64 = top
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap().exp())
            .sum();
        assert!(mass <= 1.0 + 1e-9);
        bytes.extend(
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text_of(&v));
    let mut st = server
        .stream(CHAT, &merged(&body, &json!({"stream": true})))
        .expect("200");
    let (chunks, _) = st.read_all();
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"].get("content"))
        .flat_map(|c| c.as_array().unwrap().clone())
        .collect();
    assert_eq!(streamed, entries);
    // Not asked: null.
    let v = post_ok(&server, CHAT, &chat_body(json!({"temperature": 0})));
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
}

/// A request with headers: status, the headers asked for, and the body's JSON (if any).
fn call(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    want: &[&str],
) -> (u16, Vec<Option<String>>, Value) {
    let mut req = ureq::request(method, &format!("{}{path}", server.url));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let resp = match if method == "POST" {
        req.set("Content-Type", "application/json")
            .send_string(&chat_body(json!({"max_tokens": 2})).to_string())
    } else {
        req.call()
    } {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = resp.status();
    let got = want
        .iter()
        .map(|h| resp.header(h).map(str::to_owned))
        .collect();
    let text = resp.into_string().expect("a body");
    (
        status,
        got,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

#[test]
fn api_keys_guard_the_api_and_cors_answers_the_origins_given() {
    let dir = common::TempDir::new("api-keys");
    let file = dir.file("keys");
    std::fs::write(&file, "\n  second-key \n").unwrap();
    let origin = "https://app.example";
    let server = Server::start(&[
        "--api-key",
        "first-key",
        "--api-key-file",
        &file,
        "--cors-origin",
        origin,
    ]);
    let bearer = |k: &str| format!("Bearer {k}");
    for (path, method) in [(CHAT, "POST"), ("/v1/models", "GET"), ("/props", "GET")] {
        for auth in [None, Some(bearer("wrong")), Some("first-key".to_string())] {
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("Authorization", a.as_str())).collect();
            let (status, h, v) = call(&server, method, path, &headers, &["WWW-Authenticate"]);
            assert_eq!(status, 401, "{path} {auth:?}: {v}");
            assert_eq!(h[0].as_deref(), Some("Bearer"));
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        }
        for key in ["first-key", "second-key"] {
            let (status, _, v) = call(
                &server,
                method,
                path,
                &[("Authorization", &bearer(key))],
                &[],
            );
            assert_eq!(status, 200, "{path} {key}: {v}");
        }
    }
    // Probes and scrapers need no key without --metrics-key; the 401s are counted.
    for path in ["/health", "/metrics"] {
        assert_eq!(call(&server, "GET", path, &[], &[]).0, 200, "{path}");
    }
    assert_eq!(
        server.metric("kvcore_http_error_responses_total{status=\"401\"}"),
        9.0
    );
    let acao = "Access-Control-Allow-Origin";
    // A preflight from the origin is answered without a key; one from elsewhere gets
    // no CORS header, so the browser refuses.
    let preflight = |from: &str| {
        call(
            &server,
            "OPTIONS",
            CHAT,
            &[
                ("Origin", from),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization,content-type",
                ),
            ],
            &[acao, "Access-Control-Allow-Headers"],
        )
    };
    let (status, h, _) = preflight(origin);
    assert_eq!((status, h[0].as_deref()), (200, Some(origin)));
    assert!(
        h[1].as_deref().is_some_and(|v| v.contains("authorization")),
        "{h:?}"
    );
    assert_eq!(preflight("https://elsewhere.example").1[0], None);
    // A 401 carries the header too, so a page can read why.
    let (status, h, _) = call(&server, "POST", CHAT, &[("Origin", origin)], &[acao]);
    assert_eq!((status, h[0].as_deref()), (401, Some(origin)));
}

#[test]
fn a_metrics_key_guards_health_and_metrics_and_cors_is_off_by_default() {
    let server = Server::start(&["--metrics-key", "scrape"]);
    for path in ["/health", "/metrics"] {
        let (status, _, v) = call(&server, "GET", path, &[], &[]);
        assert_eq!(status, 401, "{path}: {v}");
        let ok = call(
            &server,
            "GET",
            path,
            &[("Authorization", "Bearer scrape")],
            &[],
        );
        assert_eq!(ok.0, 200, "{path}");
    }
    // No API key: the API is open.
    assert_eq!(call(&server, "POST", CHAT, &[], &[]).0, 200);
    let (_, h, _) = call(
        &server,
        "POST",
        CHAT,
        &[("Origin", "https://app.example")],
        &["Access-Control-Allow-Origin"],
    );
    assert_eq!(h[0], None);
}

#[test]
fn bad_access_settings_are_refused_at_start_up() {
    let model = common::smollm2();
    for (args, needle) in [
        (
            vec!["--api-key-file", "/nonexistent/keys"],
            "--api-key-file",
        ),
        (vec!["--api-key", ""], "--api-key"),
        (vec!["--cors-origin", "bad\u{7f}origin"], "--cors-origin"),
    ] {
        let mut all = vec!["serve", model.as_str(), "--port", "0"];
        all.extend(&args);
        let out = common::kvcore(&all, "");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn tokenize_detokenize_and_apply_template_match_the_reference() {
    let server = Server::start(&[]);
    let hello = reference("chat-hello");
    let france = reference("raw-france");
    // The template renders the reference's conversation; its text tokenizes to the
    // reference's prompt ids, special tokens parsed.
    let v = post_ok(
        &server,
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hello"}]}),
    );
    assert_eq!(v["prompt"], hello["rendered"]);
    let v = post_ok(&server, "/tokenize", &json!({"content": hello["rendered"]}));
    assert_eq!(v["tokens"], hello["prompt_ids"]);
    // Literal: the markup is text.
    let v = post_ok(
        &server,
        "/tokenize",
        &json!({"content": hello["rendered"], "parse_special": false}),
    );
    assert_ne!(v["tokens"], hello["prompt_ids"]);
    let v = post_ok(
        &server,
        "/tokenize",
        &json!({"content": france["text"], "with_pieces": true}),
    );
    let pieces = v["tokens"].as_array().unwrap();
    let ids: Vec<Value> = pieces.iter().map(|p| p["id"].clone()).collect();
    assert_eq!(Value::from(ids), france["prompt_ids"]);
    let text: String = pieces
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(text, france["text"].as_str().unwrap());
    let v = post_ok(
        &server,
        "/detokenize",
        &json!({"tokens": france["greedy_ids"]}),
    );
    assert_eq!(v["content"], france["greedy_text"]);
    // Bad bodies name the field.
    for (path, body, param) in [
        ("/detokenize", json!({"tokens": [4_000_000]}), "tokens"),
        ("/detokenize", json!({"tokens": "x"}), "tokens"),
        ("/tokenize", json!({"content": 5}), "content"),
        (
            "/apply-template",
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages",
        ),
    ] {
        let (status, v) = server.post(path, &body);
        assert_eq!(
            (status, &v["error"]["param"]),
            (400, &json!(param)),
            "{path} {body}: {v}"
        );
    }
}

#[test]
fn embeddings_are_the_engines_in_openais_shape_as_floats_or_base64() {
    use base64::Engine as _;
    let server = Server::start(&[]);
    let engine = kvcore_engine::Engine::load(
        std::path::Path::new(&common::smollm2()),
        kvcore_engine::Options::default(),
    )
    .expect("the engine");
    let texts = ["The capital of France is Paris.", "def fib(n):"];
    let v = post_ok(
        &server,
        "/v1/embeddings",
        &json!({"input": texts, "model": "m"}),
    );
    assert_eq!((&v["object"], &v["model"]), (&json!("list"), &json!("m")));
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let mut tokens = 0;
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (&d["object"], &d["index"]),
            (&json!("embedding"), &json!(i))
        );
        // f32s written as their shortest decimals.
        let got: Vec<f32> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let want = engine.embed(texts[i]).unwrap();
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-4, "{i}: {worst}");
        tokens += engine.tokenize(texts[i], false, false).len();
        // Base64: the same floats, little-endian.
        let b = post_ok(
            &server,
            "/v1/embeddings",
            &json!({"input": texts[i], "encoding_format": "base64"}),
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b["data"][0]["embedding"].as_str().unwrap())
            .unwrap();
        let floats: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(floats, got);
    }
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    for (fields, param) in [
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": [1, 2, 3]}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
    ] {
        let (status, v) = server.post("/v1/embeddings", &fields);
        assert_eq!(
            (status, &v["error"]["param"]),
            (400, &json!(param)),
            "{fields}: {v}"
        );
    }
}
