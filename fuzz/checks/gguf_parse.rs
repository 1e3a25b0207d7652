//! The `gguf_parse` property: any byte string given to `GgufFile::from_bytes` either fails
//! with a `GgufError` or yields a file whose every accessor works.
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/gguf_parse.rs` and the stable replay test
//! `tests/integration/fuzz_corpus_replay.rs` (both include this file with `#[path]`), so a corpus
//! input means the same check in both places. On a file that parses, every metadata key
//! is read through each typed getter (a getter may refuse the type, never panic), the
//! model config and tokenizer are read from it (ditto), every tensor's `tensor_data` has
//! `n_bytes` bytes, `weights` gives the `[rows, cols]` view the dims describe, and its
//! first and last rows dequantise through the scalar backend.

use kvcore::Backend;
use kvcore::gguf::GgufFile;
use kvcore::model::LlamaConfig;
use kvcore::tokenizer::{ChatTemplate, Tokenizer};
use kvcore_scalar::Scalar;

/// Parses `data` and exercises everything a parsed file offers.
///
/// # Panics
/// When an accessor contradicts the parse (a tensor view of the wrong size, a key that
/// `metadata()` lists but `get` cannot find), or anything below panics.
pub fn check_gguf_parse(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    assert!(matches!(file.version(), 2 | 3));
    assert!(file.alignment().is_power_of_two());
    assert!(file.data_start() <= data.len());
    for (key, value) in file.metadata() {
        // Compared through `Debug`, not `==`: a value holding a NaN float is not `==`
        // to itself, yet `get` must still return it.
        assert_eq!(
            format!("{:?}", file.get(key)),
            format!("{:?}", Some(value)),
            "get({key:?})"
        );
        let _ = file.get_str(key);
        let _ = file.get_u64(key);
        let _ = file.get_f32(key);
        let _ = file.get_bool(key);
        let _ = file.get_array(key);
        let _ = (
            value.as_str(),
            value.as_u64(),
            value.as_i64(),
            value.as_f32(),
        );
        let _ = value.type_name();
    }
    let _ = LlamaConfig::from_gguf(&file);
    let _ = Tokenizer::from_gguf(&file);
    let _ = ChatTemplate::from_gguf(&file);
    let scalar = Scalar::new();
    for t in file.tensors() {
        assert_eq!(file.tensor(&t.name), Some(t), "tensor({:?})", t.name);
        assert_eq!(file.tensor_data(t).len(), t.n_bytes, "tensor {:?}", t.name);
        let w = file
            .weights(t)
            .unwrap_or_else(|e| panic!("a parsed tensor must view as a matrix: {e}"));
        let rows: u64 = t.dims.iter().skip(1).product();
        assert_eq!(w.rows() as u64, rows, "rows of {:?}", t.name);
        assert_eq!(w.cols() as u64, t.dims.first().copied().unwrap_or(1));
        assert_eq!(w.data().len(), t.n_bytes);
        if w.rows() > 0 {
            let mut row = vec![0.0f32; w.cols()];
            for r in [0, w.rows() - 1] {
                scalar
                    .embed_row(&w, r, &mut row)
                    .unwrap_or_else(|e| panic!("row {r} of {:?}: {e}", t.name));
            }
        }
    }
}
