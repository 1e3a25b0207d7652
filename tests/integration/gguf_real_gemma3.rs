//! The GGUF reader and the reference decoders on the real Gemma 3 270M Q4_K_M file,
//! the first file kvcore reads with K-format tensors.
//!
//! - the file opens (every tensor's type is one kvcore supports) and holds the tensor
//!   types the issue lists: F32 norms and `Q5_0`, `Q4_K`, `Q6_K`, `Q8_0` matrices;
//! - every tensor's first and last row decode with the scalar reference, to finite
//!   values, and the SIMD backend's GEMV of those rows runs;
//! - the first two rows of the four tensors in `quant-blocks-k.json` are stored in the
//!   file byte for byte as the reference lists them and decode to its values bit for
//!   bit (the bytes and values come from the `gguf` Python package, not from kvcore).

use kvcore::backend::{Backend, Weights};
use kvcore::gguf::GgufFile;
use kvcore_scalar::quant::dequantize_row;
use kvcore_simd::Simd;
use kvcore_test_support::conformance::oracle::bits;
use kvcore_test_support::conformance::reference_data;
use std::collections::BTreeSet;
use std::sync::OnceLock;

fn file() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = kvcore_fetch::gemma3_path().expect("the Gemma 3 model file is required");
        GgufFile::open(&path).expect("open Gemma 3")
    })
}

#[test]
fn opens_with_the_listed_tensor_types() {
    let types: BTreeSet<&str> = file().tensors().iter().map(|t| t.dtype.name()).collect();
    let want: BTreeSet<&str> = ["F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"].into();
    assert_eq!(types, want);
}

#[test]
fn every_tensor_decodes_its_first_and_last_row() {
    let f = file();
    for t in f.tensors() {
        let w = f.weights(t).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(w.rows() > 0, "{}: no rows", t.name);
        let mut out = vec![f32::NAN; w.cols()];
        for r in [0, w.rows() - 1] {
            dequantize_row(&w, r, &mut out);
            assert!(out.iter().all(|v| v.is_finite()), "{} row {r}", t.name);
            // The SIMD GEMV accepts the format (exact agreement is the conformance
            // suite's job; here: it runs and gives a finite value).
            let row = Weights::new(w.dtype(), 1, w.cols(), w.row(r)).expect("one row");
            let mut y = [f32::NAN];
            Simd::new().gemv(&row, &out, &mut y).expect("simd gemv");
            assert!(y[0].is_finite(), "{} row {r}: simd gemv", t.name);
        }
    }
}

#[test]
fn reference_rows_are_the_files_bytes_and_decode_bitwise() {
    let f = file();
    for rt in reference_data::load_gemma3_rows() {
        let t = f
            .tensor(&rt.tensor)
            .unwrap_or_else(|| panic!("{} missing", rt.tensor));
        assert_eq!(t.dtype, rt.dtype, "{}", rt.tensor);
        let w = f.weights(t).expect("weights");
        assert_eq!(w.cols(), rt.row_len, "{}", rt.tensor);
        for (r, (bytes, values)) in rt.bytes.iter().zip(&rt.values).enumerate() {
            assert_eq!(w.row(r), bytes.as_slice(), "{} row {r}: bytes", rt.tensor);
            let mut out = vec![f32::NAN; w.cols()];
            dequantize_row(&w, r, &mut out);
            assert_eq!(bits(&out), bits(values), "{} row {r}: values", rt.tensor);
        }
    }
}
