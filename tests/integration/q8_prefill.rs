//! A short prefill with 8-bit activations (`Activations::Q8`, at most `Q8_MAX_TOKENS`
//! tokens, `Backend::gemm_q8`) computes every position bit for bit as decoding its tokens
//! one by one (`gemv_q8`), on every backend:
//! - tiny random Llama and Gemma 3 files in each legacy block format, for every prompt
//!   length from 1 to `Q8_MAX_TOKENS`, every position's logits (`Logits::All`);
//! - the real SmolLM2 (`Q4_1`, `Q8_0`) and Gemma 3 (`Q5_0`, `Q8_0`, `Q4_K`, `Q6_K`) files
//!   on their README prompts, with the AVX2 kernels (`simd`, and `rayon` splitting them).
//!
//! A prompt one token longer takes the f32 GEMM, so its logits differ from the decoded
//! ones (by the 8-bit rounding): checked too, so that the test sees which path ran.

use crate::common::*;
use kvcore::Backend;
use kvcore::DType;
use kvcore::gguf::GgufFile;
use kvcore::model::{Activations, Llama, Logits, Q8_MAX_TOKENS};
use kvcore_test_support::tiny::TinyLlama;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every position's logits of `ids` through one forward pass, and through one pass per
/// token, as bit patterns.
fn prefill_and_decoded<B: Backend>(model: &Llama<B>, ids: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut kv = model.new_kv(64).unwrap();
    let all = model.forward(&mut kv, ids, Logits::All).unwrap();
    let mut kv = model.new_kv(64).unwrap();
    let mut decoded = Vec::new();
    for &id in ids {
        let row = model.forward(&mut kv, &[id], Logits::Last).unwrap();
        decoded.extend(bits(row.as_slice().unwrap()));
    }
    (bits(all.as_slice().unwrap()), decoded)
}

struct Tiny;

impl PerBackend for Tiny {
    fn run<B: Backend>(&self, backend: B) {
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0] {
            for gemma in [false, true] {
                let spec = TinyLlama {
                    n_layers: 2,
                    n_heads: 4,
                    n_kv_heads: 2,
                    head_dim: 16,
                    ffn_dim: 96,
                    vocab_size: 96,
                    context_len: 64,
                    dtype,
                    seed: 5,
                    untied_output: !gemma,
                };
                let bytes = if gemma {
                    spec.to_gemma3_gguf(4)
                } else {
                    spec.to_gguf()
                };
                let model = Llama::load(GgufFile::from_bytes(bytes).unwrap(), &backend)
                    .unwrap()
                    .with_activations(Activations::Q8);
                let ids: Vec<u32> = (0..Q8_MAX_TOKENS as u32 + 1)
                    .map(|i| (i * 37 + 3) % 96)
                    .collect();
                let what = format!("{} {dtype} gemma3={gemma}", model.backend().name());
                for n in 1..=Q8_MAX_TOKENS {
                    let (all, decoded) = prefill_and_decoded(&model, &ids[..n]);
                    assert!(
                        all == decoded,
                        "{what}: {n} tokens differ from their decode"
                    );
                }
                let (all, decoded) = prefill_and_decoded(&model, &ids);
                assert!(
                    all != decoded,
                    "{what}: a longer prefill took the 8-bit path"
                );
            }
        }
    }
}

#[test]
fn tiny_models_every_backend() {
    for name in BACKENDS {
        with_backend(name, &Tiny);
    }
}

struct Real;

impl PerBackend for Real {
    fn run<B: Backend>(&self, backend: B) {
        let smollm2 = load_smollm2(&backend).with_activations(Activations::Q8);
        let gemma3 = load_gemma3(&backend).with_activations(Activations::Q8);
        let name = smollm2.backend().name();
        for (model, dir) in [
            (&smollm2, "smollm2-135m-instruct-q4_1"),
            (&gemma3, "gemma3-270m-q4_k_m"),
        ] {
            let mut seen = 0;
            for p in prompts(dir) {
                let ids = ids(&p["prompt_ids"]);
                if ids.len() > Q8_MAX_TOKENS {
                    continue;
                }
                let (all, decoded) = prefill_and_decoded(model, &ids);
                assert!(
                    all == decoded,
                    "{name} {dir}: {ids:?} differs from its decode"
                );
                seen += 1;
            }
            assert!(
                seen > 0,
                "{dir} has a prompt of at most {Q8_MAX_TOKENS} tokens"
            );
        }
    }
}

#[test]
fn real_models_simd_and_rayon() {
    for name in ["simd", "rayon"] {
        with_backend(name, &Real);
    }
}
