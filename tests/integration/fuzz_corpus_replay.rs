//! Replays the committed corpora of the `gguf_parse`, `gguf_model`, `tokenizer` and
//! `session_load` fuzz targets on stable Rust, through the very check functions the targets run (the files
//! under `fuzz/checks/`, included here with `#[path]`). An empty or missing corpus
//! directory fails, and so does a missing SmolLM2 or Gemma 3 file (the tokenizer corpus
//! runs on both).
//!
//! `write_seed_corpora` (ignored) regenerates the synthetic seeds; FUZZING.md says when.

#[path = "../../fuzz/checks/gguf_model.rs"]
mod gguf_model;
#[path = "../../fuzz/checks/gguf_parse.rs"]
mod gguf_parse;
#[path = "../../fuzz/checks/session_load.rs"]
mod session_load;
#[path = "../../fuzz/checks/tokenizer.rs"]
mod tokenizer;

use std::fs;
use std::path::PathBuf;

use kvcore::gguf::GgufFile;
use kvcore::gguf::{GgufWriter, Value};
use kvcore::model::Llama;
use kvcore::tokenizer::Tokenizer;
use kvcore::{DType, GrowKv, Session};
use kvcore_scalar::Scalar;
use kvcore_test_support::tiny::TinyLlama;

use crate::common;

/// Runs `check` on every input, naming the file of the first failure.
fn replay(target: &str, check: impl Fn(&[u8])) {
    for (path, bytes) in common::fuzz_corpus(target) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&bytes)));
        assert!(outcome.is_ok(), "{target} input {} failed", path.display());
    }
}

#[test]
fn gguf_parse_corpus_replays() {
    replay("gguf_parse", gguf_parse::check_gguf_parse);
}

#[test]
fn gguf_model_corpus_replays() {
    replay("gguf_model", gguf_model::check_gguf_model);
}

#[test]
fn tokenizer_corpus_replays() {
    let vocab = |path: Result<PathBuf, kvcore_fetch::FetchError>| {
        let path = path.expect("the SmolLM2 and Gemma 3 model files are required");
        let file = GgufFile::open_metadata(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        tokenizer::Vocab::new(Tokenizer::from_gguf(&file).expect("a tokenizer"))
    };
    let bpe = vocab(kvcore_fetch::smollm2_path());
    let spm = vocab(kvcore_fetch::gemma3_path());
    let real = tokenizer::Real {
        bpe: Some(&bpe),
        spm: Some(&spm),
    };
    replay("tokenizer", |data| tokenizer::check_tokenizer(data, real));
}

#[test]
fn session_load_corpus_replays() {
    let fixture = session_load::Fixture::build();
    replay("session_load", |data| {
        session_load::check_session_load(data, &fixture)
    });
}

/// A one-layer TinyLlama small enough for a seed.
fn tiny(dtype: DType, untied: bool) -> TinyLlama {
    let block = dtype.block_len() > 1;
    TinyLlama {
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: if block { 16 } else { 4 },
        ffn_dim: if block { 32 } else { 8 },
        vocab_size: 8,
        context_len: 16,
        dtype,
        seed: 7,
        untied_output: untied,
    }
}

/// A GGUF holding a small byte-level tokenizer and a chat template, no tensors.
fn tokenizer_gguf() -> Vec<u8> {
    let strs = |v: &[&str]| Value::Array(v.iter().map(|s| Value::Str((*s).into())).collect());
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::Str("smollm".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            strs(&["a", "b", "ab", "Ġ", "<|im_end|>"]),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            Value::Array([1, 1, 1, 1, 3].iter().map(|&t| Value::I32(t)).collect()),
        )
        .metadata("tokenizer.ggml.merges", strs(&["a b"]))
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(4))
        .metadata(
            "tokenizer.chat_template",
            Value::Str("{% for m in messages %}{{ m.content }}{% endfor %}".into()),
        );
    w.to_bytes()
}

/// Overwrites `bytes[at..]` with `with`.
fn patched(mut bytes: Vec<u8>, at: usize, with: &[u8]) -> Vec<u8> {
    bytes[at..at + with.len()].copy_from_slice(with);
    bytes
}

fn gguf_parse_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    // A seed's model is tiny: the K formats' 256-weight super-blocks do not fit it.
    for dtype in DType::ALL.into_iter().filter(|d| d.block_len() <= 32) {
        let bytes = tiny(dtype, dtype == DType::F16).to_gguf();
        let name = format!("tiny_{dtype:?}").to_lowercase();
        if dtype == DType::F32 {
            let data_start = GgufFile::from_bytes(bytes.clone())
                .expect("valid")
                .data_start();
            for (what, at) in [
                ("header", 20),
                ("metadata", 100),
                ("infos", data_start - 40),
                ("data", data_start + 100),
            ] {
                seeds.push((format!("{name}_truncated_in_{what}"), bytes[..at].to_vec()));
            }
            seeds.push((
                format!("{name}_bad_magic"),
                patched(bytes.clone(), 0, b"GGUG"),
            ));
            seeds.push((format!("{name}_version_1"), patched(bytes.clone(), 4, &[1])));
            seeds.push((
                format!("{name}_huge_tensor_count"),
                patched(bytes.clone(), 8, &[0xff; 8]),
            ));
            seeds.push((
                format!("{name}_huge_key_length"),
                patched(bytes.clone(), 24, &[0xff, 0xff, 0xff, 0x7f]),
            ));
        }
        seeds.push((name, bytes));
    }
    let mut w = GgufWriter::new();
    w.alignment(64)
        .metadata(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::U8(1), Value::U8(2)])]),
        )
        .metadata("flag", Value::Bool(true))
        .metadata("neg", Value::I64(-3))
        .metadata("pi", Value::F64(std::f64::consts::PI))
        .tensor("v", DType::F32, &[4], vec![0; 16])
        .tensor("empty", DType::Q8_0, &[32, 0], Vec::new());
    seeds.push(("values_and_alignment_64".into(), w.to_bytes()));
    seeds.push(("tokenizer_and_template".into(), tokenizer_gguf()));
    seeds
}

fn gguf_model_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for d in 0..6u8 {
        seeds.push((format!("plain_dtype_{d}"), vec![d, 4, 1, 4, 12, 3, 2, 1, 5]));
    }
    let base = [0u8, 1, 2, 1, 12, 3, 2, 1, 2, 3];
    let edits: [(&str, &[u8]); 12] = [
        (
            "block_count_huge",
            &[0, 2, 10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        ),
        ("head_count_zero", &[0, 6, 4, 0, 0, 0, 0]),
        ("eps_nan", &[0, 9, 6, 0, 0, 0xc0, 0x7f]),
        ("arch_gpt2", &[0, 0, 8, 2]),
        ("remove_key", &[1, 5]),
        ("remove_tensor", &[2, 3]),
        ("retype_q8", &[3, 1, 3]),
        ("redim", &[4, 0, 1, 8, 12]),
        ("offset_huge", &[5, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0x80]),
        ("poison_nan", &[6, 0, 3, 0, 0]),
        ("poison_inf_norm", &[6, 14, 1, 0, 1]),
        ("truncate", &[7, 0x00, 0x02, 0xff]),
    ];
    for (name, edit) in edits {
        seeds.push((name.into(), [&base[..], edit].concat()));
    }
    seeds
}

fn tokenizer_seeds() -> Vec<(String, Vec<u8>)> {
    let texts = [
        "Hello, world! The cat's 1234 hats.",
        "<|im_start|>user\nhi<|im_end|>\n<|user|><unk>",
        "  tabs\tand\r\nnewlines\n\n\n  ",
        "café Straße 你好 こんにちは Привет مرحبا 🙂 👍🏽 e\u{301}",
        "\u{40000}\u{a0}\u{200b}\u{0}\u{7f}",
        "<|im_end",
        "<start_of_turn>user\nHi <b>there</b>▁▁ a▁b<end_of_turn>\n<eos>𠜎 🦩",
        "aaaaaaaa abababab   the the the <x> <x>> <<x>",
    ];
    // Modes 16 and 17 (synthetic SentencePiece) read a seed byte first.
    let mut seeds = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        for header in [
            &[0u8][..],
            &[2],
            &[4],
            &[6],
            &[8],
            &[16, 0],
            &[16, 1],
            &[24],
        ] {
            let mode = header[0];
            let seed = header
                .get(1)
                .map_or(String::new(), |s| format!("_seed_{s}"));
            seeds.push((
                format!("text_{i}_mode_{mode}{seed}"),
                [header, text.as_bytes()].concat(),
            ));
        }
    }
    seeds.push(("invalid_utf8".into(), vec![0, 0xc3, 0x28, 0xf1, 0x80, 0xff]));
    let ids = [
        0u8, 0, 0, 0x0e, 0x01, 0, 0x05, 0x01, 0, 0xff, 0xff, 0xff, 0x41, 0, 0, 0xee, 0x01, 0,
    ];
    for header in [&[1u8][..], &[9], &[17, 3], &[25]] {
        seeds.push((
            format!("ids_mode_{}", header[0]),
            [header, &ids[..]].concat(),
        ));
    }
    seeds
}

/// Session files for the `session_load` fixture model: valid ones (empty, short, long
/// enough to grow the store, with a blob, one past the context), one file of another
/// model, and edits of a valid one that hit each check.
fn session_load_seeds() -> Vec<(String, Vec<u8>)> {
    use kvcore_test_support::session::reseal;
    let fx = session_load::Fixture::build();
    let model = &fx.model;
    let file = |ids: &[u32], meta: &[u8]| {
        let mut s = Session::new(
            GrowKv::new(model.kv_geometry(), model.config().context_len).expect("a store"),
        );
        if !ids.is_empty() {
            s.prefill(model, ids).expect("a prefill");
        }
        let mut out = Vec::new();
        s.write_to(model, meta, &mut out).expect("a session file");
        out
    };
    let ids: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 16).collect();
    let mut seeds = vec![
        ("empty".to_string(), file(&[], b"")),
        ("one_token".into(), file(&[9], b"")),
        (
            "five_tokens_meta".into(),
            file(&ids[..5], b"{\"messages\":[]}"),
        ),
        ("twenty_tokens".into(), file(&ids, b"")),
        ("rejected_meta".into(), file(&ids[..3], b"!no")),
    ];
    let full: Vec<u32> = (0..40).map(|i| i % 16).collect();
    seeds.push(("full_context".into(), file(&full, b"")));
    let other = {
        let mut tiny = session_load::model_config();
        tiny.seed += 1;
        let m = Llama::load(
            GgufFile::from_bytes(tiny.to_gguf()).expect("valid"),
            Scalar::new(),
        )
        .expect("loadable");
        let mut s = Session::new(m.new_grow_kv(40).expect("a store"));
        s.prefill(&m, &ids[..4]).expect("a prefill");
        let mut out = Vec::new();
        s.write_to(&m, b"", &mut out).expect("a session file");
        out
    };
    seeds.push(("other_model".into(), other));
    let good = file(&ids[..6], b"meta");
    let put = |at: usize, bytes: &[u8]| reseal(patched(good.clone(), at, bytes));
    // Offsets from docs/session-format.md; the first layer starts after 6 ids and 4
    // bytes of blob.
    let layer0 = 88 + 4 * 6 + 4 + 8;
    let edits: Vec<(&str, Vec<u8>)> = vec![
        ("bad_magic", put(0, b"GGUF")),
        ("version_4", put(8, &[4])),
        ("version_2", put(8, &[2])),
        ("n_means_huge", put(88 + 4 * 6 + 4, &[0xff; 8])),
        ("version_1", put(8, &[1])),
        ("reserved_flags", put(12, &[1])),
        ("reserved_tail", put(62, &[0, 1])),
        ("geometry_reshaped", put(52, &[2, 0, 0, 0, 2, 0, 0, 0])),
        ("geometry_layers", put(48, &[3])),
        ("unknown_k_type", put(60, &[5])),
        ("n_tokens_huge", put(64, &[0xff; 8])),
        ("n_tokens_large", put(64, &[0, 0, 0, 0, 0, 4, 0, 0])),
        ("n_tokens_one_more", put(64, &[7])),
        ("meta_len_huge", put(72, &[0xff; 8])),
        ("n_rows_huge", put(80, &[0xff; 8])),
        ("n_rows_one_more", put(80, &[13])),
        ("token_out_of_vocab", put(88, &[16])),
        ("layer_start_shifted", put(layer0, &[1])),
        ("layer_count_short", put(layer0 + 8, &[5])),
        ("layer_windowed", put(layer0 + 16, &[4])),
        ("truncated_header", good[..50].to_vec()),
        ("truncated_rows", good[..good.len() - 40].to_vec()),
        ("trailing_byte", [&good[..], &[0]].concat()),
        (
            "row_byte_changed",
            patched(good.clone(), layer0 + 28, &[0x40]),
        ),
    ];
    seeds.extend(edits.into_iter().map(|(n, b)| (n.to_string(), b)));
    seeds
}

/// Regenerates the synthetic seeds of the four corpora (files libFuzzer added, named
/// by their hash, are left alone).
#[test]
#[ignore = "writes fuzz/corpus; run by hand, see FUZZING.md"]
fn write_seed_corpora() {
    for (target, seeds) in [
        ("gguf_parse", gguf_parse_seeds()),
        ("gguf_model", gguf_model_seeds()),
        ("tokenizer", tokenizer_seeds()),
        ("session_load", session_load_seeds()),
    ] {
        let dir = common::fuzz_corpus_dir(target);
        fs::create_dir_all(&dir).expect("create the corpus directory");
        for (name, bytes) in seeds {
            fs::write(dir.join(format!("seed_{name}")), bytes).expect("write a seed");
        }
    }
}
