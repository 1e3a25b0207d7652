//! Golden tests of the second architecture: Gemma 3 270M (Q4_K_M: Q5_0, Q4_K, Q6_K and
//! Q8_0 matrices) against the independent float64 reference
//! (`../shared/reference/gemma3-270m-q4_k_m/logits.json`), for every backend:
//! - every listed logit at every position within [`TOL_GEMMA3`]: the prompt's through the
//!   batched prefill path, the continuation's through the one-token decode path on the
//!   same cache, including `long-gpl2` (697 prompt positions and 24 more: positions
//!   512–720 depend on the sliding window of the 15 window layers, so both paths cross
//!   it);
//! - the greedy continuations reproduced: each decode row's argmax is the reference's
//!   next token, and the short prompts' continuations come out of `generate` with the
//!   greedy sampler.
//!
//! Each position is computed once (not once per path) so the scalar reference backend
//! runs the 721-position prompt in a few minutes.

mod common;

use common::*;
use kvcore::gguf::GgufFile;
use kvcore::model::{Decoder, GenerateParams, Logits, generate};
use kvcore::tokenizer::Tokenizer;
use kvcore::{Backend, GrowKv, Session};

/// The reference README: "every listed logit within 0.005 of the reference at every
/// position", about 35× the distance of a plain float32 forward pass (7.4e-5 at most);
/// every common slip it lists (a window off by one: 0.10, erf GELU: 0.040, one RoPE base
/// for every layer: 14.7) exceeds it many times over, and the smallest margin along a
/// greedy continuation is 0.012, so it also fixes the greedy choices.
const TOL_GEMMA3: f32 = 0.005;

/// `<eos>` and `<end_of_turn>`: either ends a continuation (neither comes first here).
const STOPS: [u32; 2] = [1, 106];

/// The first index of the largest value.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

struct Golden;

impl PerBackend for Golden {
    fn run<B: Backend>(&self, backend: B) {
        let tok = Tokenizer::from_gguf(&GgufFile::open(&gemma3_path()).unwrap()).unwrap();
        let model = load_gemma3(backend);
        let c = model.config().clone();
        let backend_name = model.backend().name();
        let mut worst = 0.0f32;
        let prompts = prompts("gemma3-270m-q4_k_m");
        assert!(
            prompts
                .iter()
                .any(|p| p["positions"].as_array().unwrap().len() > 512 + 100),
            "the reference set has a prompt well past the window"
        );
        for prompt in &prompts {
            let ReferencePrompt {
                name,
                prompt_ids,
                greedy_ids,
                positions,
            } = ReferencePrompt::of(prompt);

            // Prefill path: every prompt position in one batched pass (the early queries
            // of a prompt longer than the window see their own window).
            let n_prompt = prompt_ids.len();
            let mut kv = GrowKv::new(c.kv_geometry(), c.context_len).unwrap();
            let logits = model.forward(&mut kv, &prompt_ids, Logits::All).unwrap();
            assert_eq!(logits.dim(), (n_prompt, c.vocab_size));
            for (p, reference) in positions[..n_prompt].iter().enumerate() {
                worst = worst.max(check_row_within(
                    name,
                    "prefill",
                    logits.row(p).as_slice().unwrap(),
                    reference,
                    TOL_GEMMA3,
                ));
            }

            // Decode path: the continuation one token at a time on the same cache. Each
            // row's argmax is the reference's next greedy token, so greedy decoding
            // reproduces the continuation (the sampler's path is checked below).
            let mut last = logits.row(n_prompt - 1).to_vec();
            for (i, &id) in greedy_ids.iter().enumerate() {
                let reference = &positions[n_prompt + i];
                assert_eq!(
                    argmax(&last),
                    id,
                    "{name}: greedy token {i} ({backend_name})"
                );
                last = model
                    .forward(&mut kv, &[id], Logits::Last)
                    .unwrap()
                    .row(0)
                    .to_vec();
                worst = worst.max(check_row_within(
                    name, "decode", &last, reference, TOL_GEMMA3,
                ));
            }

            // Greedy generation through the sampler and the stop rule (the short prompts:
            // the long one's continuation is fixed by the argmax checks above).
            if n_prompt > 64 {
                continue;
            }
            let mut session = Session::new(GrowKv::new(c.kv_geometry(), c.context_len).unwrap());
            let mut params = GenerateParams::default();
            params.max_tokens = Some(24);
            let mut decoder = Decoder::new(&tok, &params, &prompt_ids, c.context_len).unwrap();
            let g = generate(&model, &mut session, &prompt_ids, &mut decoder, |_| true).unwrap();
            assert!(STOPS.iter().all(|&id| tok.is_stop(id)));
            assert_eq!(
                g.tokens, greedy_ids,
                "{name}: greedy continuation ({backend_name})"
            );
        }
        eprintln!("{backend_name}: worst |logit - reference| over all prompts: {worst:.2e}");
    }
}

#[test]
fn golden_gemma3_scalar() {
    // The scalar reference on two threads: `Rayon<Scalar>` gives `Scalar`'s results bit
    // for bit (tests/integration/rayon_bitwise.rs, its scalar suite), and one thread made
    // this the slowest test of all (~3.5 min on 2 cores). wasm32 has no threads (and
    // .ci/wasm.sh runs only the simd test of this file).
    #[cfg(not(target_family = "wasm"))]
    Golden.run(kvcore_rayon::Rayon::new(kvcore_scalar::Scalar::new(), 2).expect("rayon pool"));
    #[cfg(target_family = "wasm")]
    with_backend("scalar", &Golden);
}

common::simd_and_rayon_tests!(golden_gemma3_simd, golden_gemma3_rayon => &Golden);
