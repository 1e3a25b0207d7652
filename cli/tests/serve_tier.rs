//! `kvcore serve --kv-tier DIR` on SmolLM2: a prompt's blocks survive a restart (clean,
//! or killed with SIGKILL once they are written) and the next server answers the same
//! prompt from them — `cached_tokens` counts them, the greedy continuation is the cold
//! one's — and the tier's counters are in `/metrics`.

mod common;

use common::server::Server;
use serde_json::json;
use std::time::Duration;

/// A prompt of about 700 tokens.
fn prompt() -> String {
    let line = "The archive of local newspapers goes back to 1871 and is on microfilm before \
                1990; staff will help with the readers, and the reading rooms stay silent. ";
    (0..20).map(|i| format!("{i}. {line}")).collect()
}

fn complete(server: &Server, prompt: &str) -> (String, u64, u64) {
    let (status, v) = server.post(
        "/v1/completions",
        &json!({"model": "kvcore", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    let usage = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

fn start(dir: &std::path::Path) -> Server {
    Server::start(&["--kv-tier", dir.to_str().unwrap(), "--kv-budget", "256M"])
}

#[test]
fn a_prompts_blocks_outlive_a_restart_and_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt();
    let mut first = start(dir.path());
    let (cold, n, cached) = complete(&first, &p);
    assert_eq!(cached, 0);
    assert!(n >= 600, "{n} prompt tokens");
    let full = n / 64 * 64;
    assert!(
        first.wait_metrics(Duration::from_secs(30), |m| {
            common::server::metric(m, "kvcore_kv_tier_written_bytes_total") > 0.0
        }),
        "the tier is written"
    );
    first.terminate();
    assert_eq!(first.wait_exit(Duration::from_secs(20)), Some(0));
    let secret = dir.path().join("secret");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&secret).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the secret is the owner's only");

    // A restart: the prompt's full blocks come from the tier.
    let second = start(dir.path());
    let (warm, _, cached) = complete(&second, &p);
    // The last position is always computed (its logits), so a prompt of whole blocks
    // keeps one block back.
    assert!(
        cached >= full - 64,
        "{cached} of {n} cached after a restart"
    );
    assert_eq!(
        warm, cold,
        "the same greedy continuation from the tier's rows"
    );
    let hits = second.metric("kvcore_kv_tier_hits_total");
    assert!(hits >= (full / 64 - 1) as f64, "{hits} tier hits");
    assert_eq!(second.metric("kvcore_kv_tier_rejected_total"), 0.0);

    // Another prompt, then SIGKILL once its blocks are written: what was written stays
    // usable and nothing is rejected.
    let other = format!("{p} And one more paragraph about the reading rooms. {p}");
    let written = second.metric("kvcore_kv_tier_written_bytes_total");
    let (cold2, n2, _) = complete(&second, &other);
    assert!(second.wait_metrics(Duration::from_secs(30), |m| {
        common::server::metric(m, "kvcore_kv_tier_written_bytes_total") > written
    }));
    drop(second); // SIGKILL
    let third = start(dir.path());
    let (warm2, _, cached2) = complete(&third, &other);
    assert!(cached2 > 0 && cached2 <= n2, "{cached2} of {n2}");
    assert_eq!(warm2, cold2);
    assert_eq!(third.metric("kvcore_kv_tier_rejected_total"), 0.0);
}

#[test]
fn a_redis_tier_without_a_secret_file_is_refused_by_name() {
    let out = common::kvcore(
        &[
            "serve",
            &common::smollm2(),
            "--port",
            "0",
            "--kv-tier",
            "redis://127.0.0.1:1",
        ],
        "",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kv-tier-secret-file"), "{err}");
}
