//! Gemma 3 270M through the real binary: the README's command prints the reference
//! continuation, a base model without a chat template is plain-text completion for
//! `generate` and a clear refusal for `chat`, `perplexity` is the definition (with the
//! BOS the file asks for), and a session file is reused across runs.

mod common;

use common::*;
use kvcore::GrowKv;
use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore_simd::Simd;
use serde_json::Value;

const REFERENCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/gemma3-270m-q4_k_m/logits.json"
);

/// The reference prompt named `name`.
fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(REFERENCE).expect("the Gemma 3 reference logits");
    let all: Vec<Value> = serde_json::from_str(&text).expect("logits.json is a list");
    all.into_iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no reference prompt {name}"))
}

#[test]
fn the_readme_command_prints_the_reference_continuation() {
    let r = reference("raw-france");
    let prompt = r["text"].as_str().unwrap();
    assert_eq!(prompt, "The capital of France is");
    let out = kvcore(
        &["generate", "gemma3", "-p", prompt, "-n", "24", "--greedy"],
        "",
    );
    let (stdout, stderr) = succeeds(&out);
    assert_eq!(
        stdout.trim_end_matches('\n'),
        r["greedy_text"].as_str().unwrap()
    );
    assert!(
        stderr.contains("no chat template; the prompt is plain text"),
        "{stderr}"
    );

    // The ids too, through --json, on every backend.
    for backend in ["scalar", "simd", "rayon"] {
        let (stdout, _) = succeeds(&kvcore(
            &[
                "generate",
                "gemma3",
                "-p",
                prompt,
                "-n",
                "24",
                "--greedy",
                "--json",
                "--backend",
                backend,
            ],
            "",
        ));
        let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
        assert_eq!(v["tokens"], r["greedy_ids"], "{backend}");
        assert_eq!(
            v["prompt_tokens"], r["prompt_ids"],
            "{backend}: BOS and ids"
        );
    }
}

#[test]
fn chat_refuses_a_model_without_a_template() {
    let out = kvcore(&["chat", "gemma3"], "Hello\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("kvcore chat needs the model's chat template")
            && stderr.contains("kvcore generate"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = kvcore(
        &[
            "generate", "gemma3", "-p", "Hi", "--system", "Be brief", "-n", "1",
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("which --system needs"), "{stderr}");
}

/// exp(mean NLL) of the second half of each chunk, each chunk's first token replaced by
/// the BOS Gemma expects (as llama-perplexity does), computed here from the library.
#[test]
fn perplexity_is_the_definition_with_bos() {
    const TEXT: &str = "/usr/share/common-licenses/GPL-3";
    let ctx = 128;
    let (stdout, _) = succeeds(&kvcore(
        &[
            "perplexity",
            "gemma3",
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "1",
            "--json",
        ],
        "",
    ));
    let v = json_lines(&stdout).remove(0);
    let path = kvcore_fetch::gemma3_path().expect("the Gemma 3 model file is required");
    let file = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert!(tok.add_bos());
    let mut chunk = tok.encode(&std::fs::read_to_string(TEXT).unwrap(), Special::Literal);
    chunk.truncate(ctx);
    chunk[0] = tok.bos_id().unwrap();
    let model = Llama::load(file, Simd::new()).unwrap();
    let mut kv = GrowKv::new(model.kv_geometry(), ctx).unwrap();
    let logits = model.forward(&mut kv, &chunk, Logits::All).unwrap();
    let (nll, n) = second_half_nll(&logits, &chunk);
    let want = (nll / n as f64).exp();
    assert_eq!(v["tokens_scored"], n);
    let got = v["ppl"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-4 * want,
        "ppl {got}, definition {want}"
    );
}

#[test]
fn a_session_file_is_reused() {
    let dir = TempDir::new("gemma-session");
    let file = dir.file("gemma.session");
    let run = |prompt: &str, session: bool| -> Value {
        let mut args = vec![
            "generate", "gemma3", "-p", prompt, "-n", "8", "--greedy", "--json",
        ];
        if session {
            args.extend(["--session", file.as_str()]);
        }
        let (stdout, _) = succeeds(&kvcore(&args, ""));
        serde_json::from_str(&stdout).expect("one JSON object")
    };
    let first = run("The capital of France is", true);
    assert_eq!(uint(&first["stats"], "reused_tokens"), 0);
    let longer = "The capital of France is Paris. The capital of Italy is";
    let second = run(longer, true);
    assert!(
        uint(&second["stats"], "reused_tokens") >= 6,
        "{}",
        second["stats"]
    );
    let plain = run(longer, false);
    assert_eq!(second["tokens"], plain["tokens"]);
}

/// `kvcore bench gemma3` at a depth past the window: the default store is the windowed
/// one, holding 15 window layers × 512 positions and 3 global layers × their capacity
/// (1024 for 601 positions, GrowKv's doubling), rows of 2 × 256 f32.
#[test]
fn bench_at_depth_uses_the_windowed_store() {
    let (stdout, _) = succeeds(&kvcore(
        &[
            "bench", "gemma3", "-d", "600", "-p", "1", "-n", "1", "-r", "1", "-c", "2048", "--json",
        ],
        "",
    ));
    let runs: Vec<Value> = serde_json::from_str(&stdout).expect("a JSON list");
    assert_eq!(runs.len(), 2, "{stdout}");
    let row = 2 * 256 * 4;
    for r in &runs {
        assert_eq!(r["depth"], 600);
        assert!(r["median_tok_s"].as_f64().unwrap() > 0.0);
        assert_eq!(
            uint(r, "kv_bytes"),
            ((15 * 512 + 3 * 1024) * row) as u64,
            "{r}"
        );
    }
}
