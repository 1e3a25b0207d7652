//! The load test of `kvcore serve` (bounded, loopback only, it stops by itself): 32
//! concurrent streaming clients send 96 chat requests that share a ~300-token system
//! prompt, and one in five disconnects mid-stream. Every completed response must be a
//! well-formed stream whose text is exactly that of the same request served alone
//! (greedy; 8-bit activations, with which a request's tokens do not depend on what runs
//! beside it: `kvcore_server::scheduler`'s docs); no status but 200 and the queue's 503;
//! every sequence and block freed at the end; the server's peak RSS within the weights
//! plus the KV budget plus a stated overhead. It prints requests per second, latency
//! percentiles and the prefix cache's hit rate (BENCHMARKS.md quotes them).

mod common;

use common::server::{Server, metric, stream_text};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const CLIENTS: usize = 32;
const REQUESTS: usize = 96;
const MAX_TOKENS: usize = 24;
const KV_BUDGET_MIB: u64 = 256;
/// Beside the mapped weights and the KV budget: the runtime, 32 connections, logits
/// rows and scratch of 8 sequences, the allocator's slack.
const OVERHEAD_MIB: u64 = 160;

/// The questions the clients ask in turn (server/tests/load_hostile.py asks them too).
const QUESTIONS_TEXT: &str = include_str!("../../server/tests/load_questions.txt");

fn questions() -> Vec<&'static str> {
    QUESTIONS_TEXT.lines().collect()
}

/// About 300 tokens of a text every Debian system ships (base-files).
fn system_prompt() -> String {
    let text = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0")
        .expect("/usr/share/common-licenses/Apache-2.0 (Debian's base-files)");
    let words: Vec<&str> = text.split_whitespace().collect();
    words[..220].join(" ")
}

fn body(system: &str, q: usize) -> Value {
    json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": questions()[q]}],
        "max_tokens": MAX_TOKENS, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[derive(Default)]
struct Tally {
    latencies: Vec<f64>,
    ttfts: Vec<f64>,
    disconnected: usize,
    rejected: usize,
    mismatches: Vec<String>,
}

#[test]
fn thirty_two_streaming_clients_with_a_shared_system_prompt_and_disconnects() {
    let server = Server::start(&[
        "--parallel",
        "8",
        "--queue",
        "64",
        "--activations",
        "q8",
        "--kv-budget",
        &format!("{KV_BUDGET_MIB}M"),
    ]);
    let system = system_prompt();

    // Each distinct request served alone first: the answers the batch must give.
    let mut alone = Vec::new();
    let mut prompt_tokens = 0;
    for q in 0..questions().len() {
        let mut st = server
            .stream("/v1/chat/completions", &body(&system, q))
            .expect("200");
        let (chunks, done) = st.read_all();
        assert!(done);
        let (text, _) = stream_text(&chunks, "chat.completion.chunk");
        assert!(!text.is_empty());
        prompt_tokens = chunks.last().unwrap()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap();
        alone.push(text);
    }
    assert!(
        (280..=340).contains(&prompt_tokens),
        "the prompt is {prompt_tokens} tokens"
    );

    let rss_peak = std::sync::atomic::AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let running = std::sync::atomic::AtomicBool::new(true);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while running.load(Ordering::Relaxed) {
                rss_peak.fetch_max(server.rss().0, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= REQUESTS {
                            break;
                        }
                        let q = i % questions().len();
                        let leave = i % 5 == 2;
                        let t0 = Instant::now();
                        let mut st = loop {
                            match server.stream("/v1/chat/completions", &body(&system, q)) {
                                Ok(st) => break st,
                                Err((503, retry, _)) => {
                                    assert_eq!(retry.as_deref(), Some("1"));
                                    tally.lock().unwrap().rejected += 1;
                                    std::thread::sleep(Duration::from_secs(1));
                                }
                                Err((status, _, v)) => panic!("request {i}: {status} {v}"),
                            }
                        };
                        if leave {
                            assert!(st.next_data().is_some());
                            assert!(st.next_data().is_some());
                            drop(st);
                            tally.lock().unwrap().disconnected += 1;
                            continue;
                        }
                        let first = st.next_data().expect("a first event");
                        let mut ttft = None;
                        let mut chunks = vec![serde_json::from_str::<Value>(&first).unwrap()];
                        let mut done = false;
                        while let Some(d) = st.next_data() {
                            if d == "[DONE]" {
                                done = true;
                                break;
                            }
                            if ttft.is_none() {
                                ttft = Some(t0.elapsed().as_secs_f64());
                            }
                            chunks.push(
                                serde_json::from_str(&d).unwrap_or_else(|e| panic!("{d:?}: {e}")),
                            );
                        }
                        assert!(done, "request {i}: no [DONE]");
                        let (text, _) = stream_text(&chunks, "chat.completion.chunk");
                        let mut t = tally.lock().unwrap();
                        t.latencies.push(t0.elapsed().as_secs_f64());
                        t.ttfts.push(ttft.unwrap_or(0.0));
                        if text != alone[q] {
                            t.mismatches.push(format!(
                                "request {i} (question {q}): {text:?} alone: {:?}",
                                alone[q]
                            ));
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().expect("a client thread");
        }
        running.store(false, Ordering::Relaxed);
    });
    let elapsed = start.elapsed().as_secs_f64();
    let t = tally.into_inner().unwrap();
    assert!(
        t.mismatches.is_empty(),
        "{} responses differ from alone:\n{}",
        t.mismatches.len(),
        t.mismatches.join("\n")
    );
    assert_eq!(t.latencies.len() + t.disconnected, REQUESTS);
    assert_eq!(t.disconnected, REQUESTS / 5 + usize::from(REQUESTS % 5 > 2));

    // Everything is freed within a few steps; the cache keeps the shared prompt.
    assert!(
        server.wait_freed(),
        "sequences or blocks left after the load"
    );
    let (_, m) = server.get("/metrics");
    let total = (REQUESTS + questions().len()) as f64;
    let (completed, cancelled) = (
        metric(&m, "kvcore_requests_completed_total"),
        metric(&m, "kvcore_requests_cancelled_total"),
    );
    assert_eq!(
        completed + cancelled,
        total,
        "completed {completed} + cancelled {cancelled}"
    );
    assert!(cancelled >= 1.0 && cancelled <= t.disconnected as f64);
    assert_eq!(metric(&m, "kvcore_requests_failed_total"), 0.0);
    let hit_rate = metric(&m, "kvcore_prefix_cache_hit_rate");
    assert!(hit_rate > 0.5, "prefix cache hit rate {hit_rate}");

    let weights = std::fs::metadata(common::smollm2()).unwrap().len();
    let (_, hwm) = server.rss();
    let peak = hwm.max(rss_peak.into_inner());
    let bound = weights + (KV_BUDGET_MIB + OVERHEAD_MIB) * (1 << 20);
    assert!(
        peak <= bound,
        "peak RSS {} MiB > {} MiB",
        peak >> 20,
        bound >> 20
    );
    assert!(!server.log.lock().unwrap().contains("panicked"));

    let mut lat = t.latencies.clone();
    lat.sort_by(f64::total_cmp);
    let mut ttft = t.ttfts.clone();
    ttft.sort_by(f64::total_cmp);
    eprintln!(
        "load: {REQUESTS} requests ({} completed, {} disconnected, {} answered 503 and retried) by {CLIENTS} clients in {elapsed:.1} s: \
         {:.2} requests/s, {:.1} tokens/s generated; latency p50 {:.2} s p99 {:.2} s; TTFT p50 {:.3} s p99 {:.3} s; \
         prefix cache hit rate {hit_rate:.3}, cached prompt tokens {}/{}; peak RSS {} MiB (bound {} MiB)",
        t.latencies.len(),
        t.disconnected,
        t.rejected,
        REQUESTS as f64 / elapsed,
        metric(&m, "kvcore_generated_tokens_total") / elapsed,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        metric(&m, "kvcore_prompt_tokens_cached_total"),
        metric(&m, "kvcore_prompt_tokens_total"),
        peak >> 20,
        bound >> 20,
    );
}
