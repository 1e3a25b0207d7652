//! The GGUF reader on the real SmolLM2-135M-Instruct Q4_1 file.
//!
//! Expected values were read from the same file by the independent `gguf` Python package
//! (`GGUFReader`), and the raw row bytes come from `quant-blocks.json` in the shared
//! reference data; none of them were produced by kvcore.

use kvcore::DType;
use kvcore::gguf::{GgufError, GgufFile, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_path() -> PathBuf {
    kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required")
}

fn file() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| GgufFile::open(&model_path()).expect("open SmolLM2"))
}

#[test]
fn header_and_counts() {
    let f = file();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.metadata().len(), 33);
    let mut by_type: HashMap<DType, usize> = HashMap::new();
    for t in f.tensors() {
        *by_type.entry(t.dtype).or_default() += 1;
    }
    assert_eq!(by_type.len(), 3, "{by_type:?}");
    assert_eq!(by_type[&DType::Q4_1], 210);
    assert_eq!(by_type[&DType::F32], 61);
    assert_eq!(by_type[&DType::Q8_0], 1);
}

#[test]
fn tensor_infos() {
    let f = file();
    // (name, dtype, dims, absolute data offset as gguf-py's `ReaderTensor.data_offset`,
    // which is the data section start plus the tensor's relative offset).
    let cases: [(&str, DType, &[u64], usize); 3] = [
        ("token_embd.weight", DType::Q8_0, &[576, 49152], 1_785_664),
        ("blk.0.attn_norm.weight", DType::F32, &[576], 31_866_688),
        (
            "blk.0.ffn_down.weight",
            DType::Q4_1,
            &[1536, 576],
            31_868_992,
        ),
    ];
    for (name, dtype, dims, abs) in cases {
        let t = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.dtype, dtype, "{name}");
        assert_eq!(t.dims, dims, "{name}");
        assert_eq!(f.data_start() + t.offset as usize, abs, "{name}");
        let data = f.tensor_data(t);
        assert_eq!(data.len(), t.n_bytes);
        assert_eq!(
            data.as_ptr(),
            f.bytes()[abs..].as_ptr(),
            "{name}: data is borrowed in place"
        );
        let w = f.weights(t).expect("weights view");
        assert_eq!(w.cols() as u64, dims[0], "{name}");
        assert_eq!(w.rows() as u64, dims.get(1).copied().unwrap_or(1), "{name}");
        assert_eq!(w.dtype(), dtype);
    }
    // token_embd is the first tensor: the data section starts at its absolute offset.
    assert_eq!(f.tensors()[0].name, "token_embd.weight");
    assert_eq!(f.tensors()[0].offset, 0);
}

#[test]
fn every_tensor_is_a_valid_weights_view() {
    let f = file();
    let mut end = 0;
    for t in f.tensors() {
        let w = f.weights(t).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(w.data().len(), t.n_bytes);
        assert_eq!(t.offset % f.alignment() as u64, 0);
        end = end.max(f.data_start() + t.offset as usize + t.n_bytes);
        assert!(f.tensor(&t.name).is_some_and(|u| u == t));
    }
    assert!(end <= f.bytes().len());
}

#[test]
fn metadata_values() {
    let f = file();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    for (key, want) in [
        ("llama.block_count", 30),
        ("llama.context_length", 8192),
        ("llama.embedding_length", 576),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
        ("llama.vocab_size", 49152),
        ("tokenizer.ggml.bos_token_id", 1),
        ("tokenizer.ggml.eos_token_id", 2),
    ] {
        assert_eq!(f.get_u64(key).unwrap(), want, "{key}");
    }
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(
        f.get("llama.attention.layer_norm_rms_epsilon"),
        Some(&Value::F32(1e-5))
    );
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let tokens = f.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    assert_eq!(
        f.get_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    let merges = f.get_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len(), 48900);
    assert!(merges.iter().all(|m| m.as_str().is_some()));
    // File order is kept, and every key is found by name.
    for (i, (key, value)) in f.metadata().iter().enumerate() {
        assert_eq!(f.get(key), Some(value), "entry {i} {key}");
    }
}

#[test]
fn typed_getters_report_missing_and_wrong_types() {
    let f = file();
    assert!(matches!(
        f.get_str("no.such.key"),
        Err(GgufError::MissingKey(k)) if k == "no.such.key"
    ));
    assert!(matches!(
        f.get_u64("general.architecture"),
        Err(GgufError::WrongType {
            found: "string",
            ..
        })
    ));
    assert!(matches!(
        f.get_str("llama.block_count"),
        Err(GgufError::WrongType {
            expected: "string",
            ..
        })
    ));
    assert!(matches!(
        f.get_array("llama.rope.freq_base"),
        Err(GgufError::WrongType { found: "f32", .. })
    ));
    assert!(matches!(
        f.get_bool("tokenizer.ggml.tokens"),
        Err(GgufError::WrongType { found: "array", .. })
    ));
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

#[test]
fn first_rows_match_reference_bytes() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/reference/quant-blocks.json"
    );
    let text = std::fs::read_to_string(path).expect("read quant-blocks.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse quant-blocks.json");
    let rows = json["smollm2_rows"].as_array().expect("smollm2_rows list");
    assert_eq!(rows.len(), 3);
    let f = file();
    for case in rows {
        let name = case["tensor"].as_str().expect("tensor name");
        let t = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(
            t.dtype.name(),
            case["type"].as_str().expect("type"),
            "{name}"
        );
        assert_eq!(
            t.dims[0],
            case["row_len"].as_u64().expect("row_len"),
            "{name}"
        );
        let w = f.weights(t).unwrap();
        let want = case["bytes"].as_array().expect("bytes list");
        let idx = case["rows"].as_array().expect("rows list");
        assert_eq!(want.len(), idx.len());
        for (r, bytes) in idx.iter().zip(want) {
            let r = r.as_u64().expect("row index") as usize;
            assert_eq!(
                w.row(r),
                hex(bytes.as_str().expect("hex string")).as_slice(),
                "{name} row {r}"
            );
        }
    }
}

#[test]
fn open_errors_name_the_path() {
    let dir = std::env::temp_dir();
    match GgufFile::open(&dir) {
        Err(e @ GgufError::NotAFile(_)) => {
            assert!(e.to_string().contains(&*dir.to_string_lossy()), "{e}")
        }
        other => panic!("expected NotAFile, got {other:?}"),
    }
    let missing = dir.join("kvcore-no-such-file.gguf");
    match GgufFile::open(&missing) {
        Err(e @ GgufError::Io { .. }) => {
            assert!(e.to_string().contains("kvcore-no-such-file.gguf"), "{e}")
        }
        other => panic!("expected Io, got {other:?}"),
    }
}
