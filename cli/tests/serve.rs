//! `kvcore serve` end to end on SmolLM2, over loopback HTTP: the reference's greedy
//! continuations from several requests batched together, chat and completions whole and
//! streamed, the prefix cache across requests, every 400 the issue lists, the queue's
//! 503, a client that disconnects mid-stream, and SIGTERM.

mod common;

use common::server::{Server, Stream, metric, stream_text};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The reference prompts of `../shared/reference` (float64 logits from an independent
/// implementation; not produced by kvcore).
fn reference() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    );
    let text = std::fs::read_to_string(path).expect("the reference logits");
    serde_json::from_str::<Vec<Value>>(&text).expect("a list of prompts")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The text of reference ids, by the model's tokenizer (the ids are the reference's).
fn text_of(ids: &[u32]) -> String {
    let file = kvcore::gguf::GgufFile::open(std::path::Path::new(&common::smollm2()))
        .expect("open SmolLM2");
    let tok = kvcore::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let shown: Vec<u32> = ids.iter().copied().filter(|&id| !tok.is_stop(id)).collect();
    tok.decode(&shown).expect("decode")
}

const SYSTEM: &str = "You are a careful assistant for a public library. You answer questions about \
opening hours, borrowing rules, late fees, the reading rooms, the children's section, \
interlibrary loans, printing and scanning, the archive of local newspapers, events, and \
membership. Keep every answer short, polite and factual. If you do not know an answer, say \
so and suggest asking at the front desk. Members may borrow up to twelve items at a time, \
for three weeks, renewable twice unless someone else has reserved the item. Late fees are \
ten cents a day per item, capped at five dollars. The library opens at nine in the morning \
on weekdays and at ten on weekends, and closes at eight in the evening except on Sundays, \
when it closes at five. The reading rooms are silent zones. Group study rooms can be booked \
for two hours a day. Printing costs fifteen cents a page in black and white, and fifty \
cents in colour; scanning is free. Interlibrary loans take one to two weeks and cost two \
dollars each. The archive of local newspapers goes back to 1871 and is on microfilm before \
1990; staff will help with the readers. The children's section has story time on Tuesday \
and Thursday mornings at ten thirty, and a homework club after school on weekdays. Events \
are listed on the board by the entrance and in the monthly newsletter. Membership is free \
for residents of the county; others pay twenty dollars a year. A lost card costs one dollar \
to replace. Food is not allowed in the reading rooms, but covered drinks are. Wireless \
internet is free for everyone, with no password. Public computers can be booked for one \
hour at a time, twice a day.";

#[test]
fn reference_prompts_batched_together_give_the_reference_greedy_continuations() {
    // f32 activations (the default): each logit within rounding of the request served
    // alone, far inside the reference's margins (0.05), so the same greedy tokens.
    let server = Server::start(&["--parallel", "4"]);
    let cases = reference();
    let url = &server;
    std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, case)| {
                s.spawn(move || {
                    let prompt = ids(&case["prompt_ids"]);
                    let greedy = ids(&case["greedy_ids"]);
                    let body = json!({
                        "prompt": prompt, "max_tokens": greedy.len(), "temperature": 0,
                        "stream": i == 0,
                    });
                    let (text, finish, usage) = if i == 0 {
                        let mut st = url.stream("/v1/completions", &body).expect("200");
                        let (chunks, done) = st.read_all();
                        assert!(done, "the stream ends with [DONE]");
                        let (text, finish) = stream_text(&chunks, "text_completion");
                        (text, finish, None)
                    } else {
                        let (status, v) = url.post("/v1/completions", &body);
                        assert_eq!(status, 200, "{v}");
                        assert_eq!(v["object"], "text_completion");
                        let c = &v["choices"][0];
                        let text = c["text"].as_str().expect("text").to_string();
                        (
                            text,
                            c["finish_reason"].as_str().unwrap().to_string(),
                            Some(v["usage"].clone()),
                        )
                    };
                    let name = case["name"].as_str().unwrap();
                    assert_eq!(text, text_of(&greedy), "{name}");
                    let want_finish = if greedy.last() == Some(&2) {
                        "stop"
                    } else {
                        "length"
                    };
                    assert_eq!(finish, want_finish, "{name}");
                    if let Some(u) = usage {
                        assert_eq!(u["prompt_tokens"], prompt.len(), "{name}");
                        assert_eq!(u["completion_tokens"], greedy.len(), "{name}");
                        assert_eq!(u["total_tokens"], prompt.len() + greedy.len(), "{name}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a request thread");
        }
    });
    let (_, m) = server.get("/metrics");
    assert_eq!(
        metric(&m, "kvcore_requests_completed_total"),
        cases.len() as f64
    );
    // They ran together: fewer passes than tokens generated.
    let (steps, generated) = (
        metric(&m, "kvcore_steps_total"),
        metric(&m, "kvcore_generated_tokens_total"),
    );
    assert!(
        steps < 0.8 * generated,
        "{steps} passes for {generated} tokens: not batched"
    );
}

#[test]
fn chat_whole_and_streamed_agree_and_later_requests_reuse_the_cached_system_prompt() {
    let server = Server::start(&[]);
    let body = |stream: bool| {
        json!({
            "model": "anything", "temperature": 0, "max_tokens": 20, "stream": stream,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "How much are late fees?"},
            ],
        })
    };
    let (status, whole) = server.post("/v1/chat/completions", &body(false));
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "anything");
    let msg = &whole["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let text = msg["content"].as_str().expect("content").to_string();
    assert!(!text.trim().is_empty());
    let usage = &whole["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens > 256,
        "a system prompt of several blocks: {prompt_tokens}"
    );
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "a cold cache"
    );

    // The same conversation again, streamed: the same text, and its whole blocks of 64
    // come from the prefix cache (all but the last, which runs for the logits, when the
    // prompt is whole blocks).
    let blocks = prompt_tokens.div_ceil(64) - 1;
    let mut st = server
        .stream("/v1/chat/completions", &body(true))
        .expect("200");
    let (chunks, done) = st.read_all();
    assert!(done);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""}),
        "the first chunk names the role"
    );
    let (streamed, finish) = stream_text(&chunks, "chat.completion.chunk");
    assert_eq!(streamed, text, "streamed and whole replies differ");
    assert_eq!(
        finish,
        whole["choices"][0]["finish_reason"].as_str().unwrap()
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], prompt_tokens);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], blocks * 64);

    let (_, metrics) = server.get("/metrics");
    assert_eq!(
        metric(&metrics, "kvcore_prompt_tokens_cached_total"),
        (blocks * 64) as f64
    );
    assert!(metric(&metrics, "kvcore_prefix_cache_blocks_hit_total") >= blocks as f64);
    assert!(metric(&metrics, "kvcore_prefix_cache_hit_rate") > 0.0);
    assert_eq!(metric(&metrics, "kvcore_running_sequences"), 0.0);
    assert_eq!(metric(&metrics, "kvcore_kv_pool_blocks_in_use"), 0.0);
    assert!(metric(&metrics, "kvcore_kv_pool_blocks_cached") > 0.0);

    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");
    let (status, health) = server.get("/health");
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
}

/// Asserts an OpenAI error object with `status` whose message contains `needle`.
fn assert_error(got: (u16, Value), status: u16, needle: &str) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let e = &v["error"];
    let message = e["message"]
        .as_str()
        .unwrap_or_else(|| panic!("an error object: {v}"));
    assert!(
        message.contains(needle),
        "the message {message:?} does not say {needle:?}"
    );
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

#[test]
fn bad_requests_get_a_400_with_an_openai_error_that_names_the_problem() {
    let server = Server::start(&["--ctx", "256"]);
    let chat = "/v1/chat/completions";
    let user = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let raw = |path: &str, body: &str| {
        let (s, _, v) = server.post_raw(path, body);
        (s, v)
    };
    assert_error(raw(chat, "{\"messages\": ["), 400, "invalid request body");
    assert_error(raw(chat, "not json"), 400, "invalid request body");
    assert_error(raw(chat, "{}"), 400, "missing field `messages`");
    assert_error(
        server.post(chat, &user(json!({"temperature": "hot"}))),
        400,
        "invalid type: string \"hot\"",
    );
    assert_error(
        server.post(chat, &user(json!({"max_tokens": -3}))),
        400,
        "invalid value",
    );
    assert_error(
        server.post(chat, &user(json!({"stream": "yes"}))),
        400,
        "expected a boolean",
    );
    assert_error(
        server.post(chat, &json!({"messages": []})),
        400,
        "at least one message",
    );
    assert_error(
        server.post(
            chat,
            &json!({"messages": [{"role": "wizard", "content": "x"}]}),
        ),
        400,
        "unknown role",
    );
    assert_error(
        server.post(chat, &user(json!({"temperature": 3.5}))),
        400,
        "temperature",
    );
    assert_error(server.post(chat, &user(json!({"top_p": 0}))), 400, "top_p");
    assert_error(
        server.post(chat, &user(json!({"n": 2}))),
        400,
        "n must be 1",
    );
    assert_error(
        server.post(chat, &user(json!({"max_tokens": 0}))),
        400,
        "at least 1",
    );
    assert_error(
        server.post(chat, &user(json!({"stop": ["a", "b", "c", "d", "e"]}))),
        400,
        "at most 4",
    );
    // The context is 256 positions.
    let long = "word ".repeat(400);
    assert_error(
        server.post(
            chat,
            &json!({"messages": [{"role": "user", "content": long}]}),
        ),
        400,
        "longer than the context of 256",
    );
    assert_error(
        server.post(chat, &user(json!({"max_tokens": 1000}))),
        400,
        "exceeds the context of 256",
    );
    let (status, v) = server.post(chat, &user(json!({"max_tokens": 1000})));
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("max_tokens"))
    );
    // The decoder's budget, as in every front end: a prompt of the whole context still
    // gets its one token (the last token is never run), and no more.
    let whole = vec![28u32; 256];
    assert_error(
        server.post(
            "/v1/completions",
            &json!({"prompt": whole, "max_tokens": 2, "temperature": 0}),
        ),
        400,
        "(at most 1)",
    );
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"prompt": whole, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 1, "{v}");
    assert_error(
        server.post(
            "/v1/completions",
            &json!({"prompt": vec![28u32; 257], "max_tokens": 1}),
        ),
        400,
        "longer than the context of 256",
    );
    assert_error(
        server.post("/v1/completions", &json!({"prompt": [1, 2, 999999]})),
        400,
        "outside the vocabulary",
    );
    assert_error(
        server.post("/v1/completions", &json!({"prompt": ["a", "b"]})),
        400,
        "2 prompts",
    );
    assert_error(
        server.post("/v1/completions", &json!({"prompt": ""})),
        400,
        "empty",
    );
    assert_error(server.post("/v1/nothing", &json!({})), 404, "no such route");
    // None of that disturbed the server: a good request still runs.
    let (status, v) = server.post(chat, &user(json!({"max_tokens": 4, "temperature": 0})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert!(server.metric("kvcore_requests_invalid_total") >= 19.0);
    assert!(server.log.lock().unwrap().find("panicked").is_none());
}

/// A streamed request that runs long, its first event read (so it has been admitted).
fn long_stream(server: &Server, max_tokens: usize) -> Stream {
    let body = json!({
        "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0.8,
        "seed": 7, "stream": true,
    });
    let mut st = server.stream("/v1/completions", &body).expect("200");
    assert!(st.next_data().is_some(), "a first event");
    st
}

#[test]
fn beyond_the_running_batch_and_the_queue_requests_get_503_with_retry_after_at_once() {
    let server = Server::start(&["--parallel", "1", "--queue", "1"]);
    let running = long_stream(&server, 400);
    let body = json!({"prompt": "Hello", "max_tokens": 8, "stream": true});
    let url = server.url.clone();
    // The second waits in the queue.
    let waiter = std::thread::spawn(move || {
        ureq::post(&format!("{url}/v1/completions"))
            .send_string(&json!({"prompt": "Hello", "max_tokens": 8, "temperature": 0}).to_string())
            .map(|r| r.status())
            .map_err(|e| e.to_string())
    });
    assert!(
        server.wait_metrics(Duration::from_secs(10), |m| metric(m, "kvcore_queue_depth")
            == 1.0),
        "the second request waits in the queue"
    );
    let t = Instant::now();
    let (status, retry, v) = server.post_raw("/v1/completions", &body.to_string());
    let took = t.elapsed();
    assert_eq!(status, 503, "{v}");
    assert_eq!(retry.as_deref(), Some("1"), "Retry-After");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("busy"),
        "{v}"
    );
    assert!(took < Duration::from_secs(1), "the 503 came after {took:?}");
    assert_eq!(server.metric("kvcore_requests_rejected_total"), 1.0);
    drop(running);
    // The queued request then runs to its end.
    assert_eq!(waiter.join().unwrap(), Ok(200));
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_sequence_and_blocks() {
    let server = Server::start(&[]);
    let mut st = long_stream(&server, 2000);
    for _ in 0..3 {
        assert!(st.next_data().is_some());
    }
    let (_, m) = server.get("/metrics");
    assert_eq!(metric(&m, "kvcore_running_sequences"), 1.0);
    assert!(metric(&m, "kvcore_kv_pool_blocks_in_use") >= 1.0);
    let steps_before = metric(&m, "kvcore_steps_total");
    drop(st);
    assert!(server.wait_freed(), "the sequence was not freed");
    let (_, m) = server.get("/metrics");
    assert_eq!(metric(&m, "kvcore_requests_cancelled_total"), 1.0);
    assert_eq!(metric(&m, "kvcore_requests_completed_total"), 0.0);
    // The server notices when a write to the closed socket fails: within a few steps.
    let steps = metric(&m, "kvcore_steps_total") - steps_before;
    assert!(steps <= 4.0, "freed {steps} steps after the disconnect");
    // Its full blocks stay in the prefix cache; nothing else is held.
    assert_eq!(
        metric(&m, "kvcore_kv_pool_blocks"),
        metric(&m, "kvcore_kv_pool_blocks_cached_idle")
    );
}

#[test]
fn sigterm_lets_running_requests_finish_refuses_new_ones_and_exits_0() {
    let mut server = Server::start(&[]);
    let mut st = long_stream(&server, 48);
    server.terminate();
    let (chunks, done) = st.read_all();
    assert!(done, "the running request finishes");
    let (_, finish) = stream_text(&chunks, "text_completion");
    assert_eq!(finish, "length");
    assert_eq!(
        server.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        server.log.lock().unwrap()
    );
    assert!(
        ureq::get(&format!("{}/health", server.url)).call().is_err(),
        "the port is closed"
    );
    assert!(server.log.lock().unwrap().contains("shutting down"));
}

#[test]
fn sigterm_cancels_what_outlives_the_shutdown_timeout_and_exits_0() {
    let mut server = Server::start(&["--shutdown-timeout", "0.5"]);
    let mut st = long_stream(&server, 4000);
    let t = Instant::now();
    server.terminate();
    let mut last = String::new();
    while let Some(d) = st.next_data() {
        last = d;
    }
    let v: Value = serde_json::from_str(&last).expect("a JSON event");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "the stream ends with an error event: {v}"
    );
    assert_eq!(server.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "exit took {:?}",
        t.elapsed()
    );
}
