//! Golden tests against the independent float64 reference (`../shared/reference`):
//! logits at every position within 0.01 of the reference, through the batched prefill path
//! and through the one-token decode path, and the greedy continuations reproduced exactly,
//! for every backend.
//!
//! Tolerance: [`common::TOL`], 0.01 (see there).

mod common;

use common::*;
use kvcore::model::{Decoder, GenerateParams, Logits, generate};
use kvcore::tokenizer::Tokenizer;
use kvcore::{Backend, GrowKv, Session};

const EOS_IM_END: u32 = 2;

struct Golden;

impl PerBackend for Golden {
    fn run<B: Backend>(&self, backend: B) {
        let tok = Tokenizer::from_gguf(&smollm2_file()).unwrap();
        let model = load_smollm2(backend);
        let c = model.config().clone();
        let backend_name = model.backend().name();
        let mut worst = 0.0f32;
        for prompt in reference_logits() {
            let ReferencePrompt {
                name,
                prompt_ids,
                greedy_ids,
                positions,
            } = ReferencePrompt::of(prompt);
            let all = [&prompt_ids[..], &greedy_ids].concat();

            // Prefill path: every position in one batched pass.
            let mut kv = GrowKv::new(c.kv_geometry(), c.context_len).unwrap();
            let logits = model.forward(&mut kv, &all, Logits::All).unwrap();
            assert_eq!(logits.dim(), (all.len(), c.vocab_size));
            for (p, reference) in positions.iter().enumerate() {
                let row = logits.row(p);
                worst = worst.max(check_row(
                    name,
                    "prefill",
                    row.as_slice().unwrap(),
                    reference,
                ));
            }

            // Decode path: the prompt, then one token at a time.
            let mut kv = GrowKv::new(c.kv_geometry(), c.context_len).unwrap();
            let mut last = model.forward(&mut kv, &prompt_ids, Logits::Last).unwrap();
            let n_prompt = prompt_ids.len();
            for (i, &id) in greedy_ids.iter().enumerate() {
                let reference = &positions[n_prompt - 1 + i];
                check_row(name, "decode", last.row(0).as_slice().unwrap(), reference);
                last = model.forward(&mut kv, &[id], Logits::Last).unwrap();
            }

            // Greedy generation through the decoder: the sampler and the stop rule.
            let mut session = Session::new(GrowKv::new(c.kv_geometry(), c.context_len).unwrap());
            let mut params = GenerateParams::default();
            params.max_tokens = Some(24);
            let mut decoder = Decoder::new(&tok, &params, &prompt_ids, c.context_len).unwrap();
            let g = generate(&model, &mut session, &prompt_ids, &mut decoder, |_| true).unwrap();
            assert!(tok.is_stop(EOS_IM_END));
            assert_eq!(
                g.tokens, greedy_ids,
                "{name}: greedy continuation ({backend_name})"
            );
        }
        eprintln!("{backend_name}: worst |logit - reference| over all prompts: {worst:.2e}");
    }
}

#[test]
fn golden_scalar() {
    with_backend("scalar", &Golden);
}

common::simd_and_rayon_tests!(golden_simd, golden_rayon => &Golden);
