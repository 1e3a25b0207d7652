//! `kvcore info` on SmolLM2, as text and as JSON: metadata values print as values (never
//! as `U32(30)`), and both forms agree with the model's published facts: 30 layers,
//! d_model 576, 9 query heads, 3 KV heads, context 8192, a 49152-token vocabulary, RMS
//! epsilon 1e-5 and tied embeddings (so 30 × 9 block tensors plus `token_embd.weight` and
//! `output_norm.weight`: 272 tensors).

mod common;

use common::{kvcore, smollm2, succeeds};
use serde_json::Value;

const LAYERS: u64 = 30;
const D_MODEL: u64 = 576;
const HEADS: u64 = 9;
const KV_HEADS: u64 = 3;
const CONTEXT: u64 = 8192;
const VOCAB: u64 = 49152;
/// Per block: attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
/// ffn_up, ffn_down.
const TENSORS: u64 = LAYERS * 9 + 2;

/// The `N tensors` of the text header `GGUF v3, 33 metadata entries, N tensors, ...`.
fn header_tensor_count(text: &str) -> u64 {
    let header = text
        .lines()
        .find(|l| l.starts_with("GGUF v"))
        .unwrap_or_else(|| panic!("no GGUF header line in {text}"));
    header
        .split(", ")
        .find_map(|part| part.strip_suffix(" tensors"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tensor count in {header:?}"))
}

/// The value text of metadata line `  key = value`.
fn text_value<'t>(text: &'t str, key: &str) -> &'t str {
    let prefix = format!("  {key} = ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no line for {key} in {text}"))
}

#[test]
fn text_prints_values_not_debug_forms() {
    let (text, _) = succeeds(&kvcore(&["info", &smollm2()], ""));
    for line in text.lines() {
        for debug in [
            "U32(", "I32(", "U64(", "F32(", "F64(", "Bool(", "Str(", "Array(",
        ] {
            assert!(!line.contains(debug), "{debug:?} in {line:?}");
        }
    }
    assert!(
        text.lines()
            .any(|l| l == format!("  llama.block_count = {LAYERS}")),
        "{text}"
    );
    for (key, want) in [
        ("llama.embedding_length", D_MODEL),
        ("llama.attention.head_count", HEADS),
        ("llama.attention.head_count_kv", KV_HEADS),
        ("llama.context_length", CONTEXT),
        ("llama.vocab_size", VOCAB),
    ] {
        assert_eq!(text_value(&text, key), want.to_string(), "{key}");
    }
    let eps: f64 = text_value(&text, "llama.attention.layer_norm_rms_epsilon")
        .parse()
        .expect("the epsilon prints as a plain number");
    assert!((eps - 1e-5).abs() < 1e-9, "epsilon {eps}");
    assert_eq!(text_value(&text, "tokenizer.ggml.add_bos_token"), "false");
    assert_eq!(text_value(&text, "general.architecture"), "\"llama\"");
    assert_eq!(text_value(&text, "general.languages"), "[\"en\"]");
    // Long arrays stay abbreviated, their elements printed as values too.
    let types = text_value(&text, "tokenizer.ggml.token_type");
    assert!(
        types.ends_with(&format!(", ...] ({VOCAB} items)")),
        "{types}"
    );
    assert_eq!(header_tensor_count(&text), TENSORS);
    // The parsed config, as values too.
    assert!(text.lines().any(|l| l == "config:"), "{text}");
    assert!(
        text.lines()
            .any(|l| l == format!("  n_kv_heads = {KV_HEADS}"))
    );
    assert!(text.lines().any(|l| l == "  tied_embeddings = true"));
}

#[test]
fn json_holds_the_metadata_as_json_values() {
    let model = smollm2();
    let (text, _) = succeeds(&kvcore(&["info", &model], ""));
    let (json, _) = succeeds(&kvcore(&["info", &model, "--json"], ""));
    assert_eq!(json.lines().count(), 1, "one JSON object on one line");
    let v: Value = serde_json::from_str(&json).expect("valid JSON");

    assert_eq!(v["file"], model.as_str());
    assert_eq!(v["version"], 3);
    assert!(
        text.contains(&format!("GGUF v{}, ", v["version"])),
        "{text}"
    );
    assert!(
        text.contains(&format!("alignment {}\n", v["alignment"])),
        "{text}"
    );

    let meta = &v["metadata"];
    assert!(meta.is_object(), "{meta}");
    assert_eq!(meta["llama.block_count"], LAYERS);
    assert_eq!(meta["llama.embedding_length"], D_MODEL);
    assert_eq!(meta["llama.attention.head_count"], HEADS);
    assert_eq!(meta["llama.attention.head_count_kv"], KV_HEADS);
    assert_eq!(meta["llama.context_length"], CONTEXT);
    let eps = meta["llama.attention.layer_norm_rms_epsilon"]
        .as_f64()
        .expect("the epsilon is a JSON number");
    assert!((eps - 1e-5).abs() < 1e-9, "epsilon {eps}");
    assert_eq!(meta["tokenizer.ggml.add_bos_token"], false);
    assert_eq!(meta["general.architecture"], "llama");
    assert_eq!(meta["general.languages"], serde_json::json!(["en"]));
    // The arrays are there in full.
    let tokens = meta["tokenizer.ggml.tokens"].as_array().expect("an array");
    assert_eq!(tokens.len() as u64, VOCAB);
    assert!(tokens.iter().all(Value::is_string));
    assert_eq!(tokens[1], "<|im_start|>");
    let types = meta["tokenizer.ggml.token_type"]
        .as_array()
        .expect("an array");
    assert_eq!(types.len() as u64, VOCAB);
    assert!(types.iter().all(|t| t.as_i64().is_some()));
    let entries = meta.as_object().map_or(0, |m| m.len());
    assert!(
        text.contains(&format!(", {entries} metadata entries, ")),
        "{entries} entries; {text}"
    );

    let tensors = v["tensors"].as_array().expect("a tensor array");
    assert_eq!(tensors.len() as u64, TENSORS);
    assert_eq!(tensors.len() as u64, header_tensor_count(&text));
    for t in tensors {
        assert!(t["name"].is_string() && t["type"].is_string(), "{t}");
        assert!(t["bytes"].as_u64().is_some_and(|b| b > 0), "{t}");
        assert!(t["dims"].as_array().is_some_and(|d| !d.is_empty()), "{t}");
    }
    let embd = tensors
        .iter()
        .find(|t| t["name"] == "token_embd.weight")
        .expect("token_embd.weight");
    assert_eq!(embd["dims"], serde_json::json!([D_MODEL, VOCAB]));
    assert!(!tensors.iter().any(|t| t["name"] == "output.weight"));

    let cfg = &v["config"];
    assert_eq!(cfg["n_layers"], LAYERS);
    assert_eq!(cfg["d_model"], D_MODEL);
    assert_eq!(cfg["n_heads"], HEADS);
    assert_eq!(cfg["n_kv_heads"], KV_HEADS);
    assert_eq!(cfg["head_dim"], D_MODEL / HEADS);
    assert_eq!(cfg["context_len"], CONTEXT);
    assert_eq!(cfg["vocab_size"], VOCAB);
    assert_eq!(cfg["tied_embeddings"], true);
    assert!(
        cfg["rms_eps"]
            .as_f64()
            .is_some_and(|e| (e - 1e-5).abs() < 1e-9)
    );
}
