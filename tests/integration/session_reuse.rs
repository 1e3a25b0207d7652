//! Sessions reuse their cached prefix across turns, and it costs no accuracy:
//! - on SmolLM2, for every backend, a conversation fed turn by turn (each turn the whole
//!   conversation so far) gives at every turn the logits of the float64 reference within
//!   the golden tolerance, and within that tolerance of a fresh session fed the same ids
//!   in one pass; only the suffix after the common prefix is prefilled;
//! - with the same chunking of the passes, reuse is bit for bit a fresh run: also when
//!   the session held a divergent tail (tokens the new rendering does not share) that the
//!   prefill replaced;
//! - an unchanged conversation re-runs its last token; a failed prefill (context
//!   overflow, a bad id) leaves the session exactly as it was; forks and truncation
//!   continue independently.

use crate::common::*;
use kvcore::gguf::GgufFile;
use kvcore::model::{Decoder, GenerateParams, Llama, Logits, ModelError, generate};
use kvcore::{Backend, DType, GrowKv, KvStore, Session};
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::tiny::TinyLlama;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The first `prompts` reference prompts as conversations of four turns.
struct Turns {
    prompts: usize,
}

impl PerBackend for Turns {
    fn run<B: Backend>(&self, backend: B) {
        let model = load_smollm2(backend);
        let c = model.config().clone();
        for prompt in reference_logits().iter().take(self.prompts) {
            let name = prompt["name"].as_str().unwrap();
            let positions = prompt["positions"].as_array().unwrap();
            let all: Vec<u32> = ids(&prompt["prompt_ids"])
                .into_iter()
                .chain(ids(&prompt["greedy_ids"]))
                .collect();
            let n = all.len();
            let mut session = Session::new(GrowKv::new(c.kv_geometry(), c.context_len).unwrap());
            let mut before = 0;
            for end in [n / 3, n / 2 + 1, n - 4, n] {
                let turn = session.prefill(&model, &all[..end]).unwrap();
                assert_eq!(
                    (turn.reused, turn.prefilled),
                    (before, end - before),
                    "{name}"
                );
                check_row(name, "session", &turn.logits, &positions[end - 1]);
                let mut fresh = Session::new(GrowKv::new(c.kv_geometry(), 512).unwrap());
                let one_pass = fresh.prefill(&model, &all[..end]).unwrap();
                let diff = max_diff(&turn.logits, &one_pass.logits);
                assert!(
                    diff <= TOL,
                    "{name} turn to {end}: {diff} from a fresh session"
                );
                before = end;
            }
            // The same conversation again: only its last position is run.
            let again = session.prefill(&model, &all).unwrap();
            assert_eq!((again.reused, again.prefilled), (n - 1, 1));
            check_row(name, "re-run", &again.logits, &positions[n - 1]);
        }
    }
}

/// The scalar reference is slow on the real model: one prompt.
#[test]
fn turns_match_the_reference_scalar() {
    with_backend("scalar", &Turns { prompts: 1 });
}

crate::common::simd_and_rayon_tests!(
    turns_match_the_reference_simd,
    turns_match_the_reference_rayon => &Turns { prompts: 3 }
);

fn tiny<B: Backend>(backend: B, dtype: DType) -> Llama<B> {
    let spec = TinyLlama {
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 64,
        vocab_size: 90,
        context_len: 200,
        dtype,
        seed: 5,
        untied_output: true,
    };
    Llama::load(GgufFile::from_bytes(spec.to_gguf()).unwrap(), backend).unwrap()
}

/// Reuse against fresh runs with the same passes, bit for bit: a session that held
/// `a ++ tail` (a divergent tail) and then takes `a ++ b` runs `b` only, and its logits
/// equal those of a fresh store fed `a`, then `b`. The rows of `a` were computed in a
/// longer pass than the fresh run's; each row of a pass depends only on its own token and
/// the rows before it, so the bits agree.
struct SameChunksSameBits;

impl PerBackend for SameChunksSameBits {
    fn run<B: Backend>(&self, backend: B) {
        let name = backend.name();
        for dtype in [DType::F32, DType::Q4_1] {
            let model = tiny(&backend, dtype);
            let g = model.kv_geometry();
            let a: Vec<u32> = (0..23).map(|i| (i * 11 + 3) % 90).collect();
            let b: Vec<u32> = (0..9).map(|i| (i * 5 + 1) % 90).collect();
            let tail = [7u32, 8, 9, 10, 11];
            let conversation: Vec<u32> = a.iter().chain(&b).copied().collect();

            let mut session = Session::new(GrowKv::new(g, 200).unwrap());
            session
                .prefill(&model, &[&a[..], &tail[..]].concat())
                .unwrap();
            let turn = session.prefill(&model, &conversation).unwrap();
            assert_eq!((turn.reused, turn.prefilled), (a.len(), b.len()));
            assert_eq!(session.tokens(), conversation);

            let mut fresh = GrowKv::new(g, 200).unwrap();
            model.forward(&mut fresh, &a, Logits::None).unwrap();
            let want = model.forward(&mut fresh, &b, Logits::Last).unwrap();
            assert_eq!(
                bits(&turn.logits),
                bits(want.row(0).as_slice().unwrap()),
                "{name} {dtype}"
            );
            // Decoding on from both gives the same bits too.
            let next = session.decode(&model, 4).unwrap();
            let want = model.forward(&mut fresh, &[4], Logits::Last).unwrap();
            assert_eq!(bits(&next), bits(want.row(0).as_slice().unwrap()), "{name}");
        }
    }
}

#[test]
fn reuse_with_the_same_chunks_is_bitwise_a_fresh_run() {
    scalar_and_simd(&SameChunksSameBits);
}

#[test]
fn a_failed_prefill_leaves_the_session_as_it_was() {
    let model = tiny(Scalar::new(), DType::F32);
    let mut session = Session::new(GrowKv::new(model.kv_geometry(), 24).unwrap());
    let ids: Vec<u32> = (0..20).collect();
    let first = session.prefill(&model, &ids).unwrap();
    let snapshot = |s: &Session| {
        let view = s.kv().view(2).unwrap();
        (s.tokens().to_vec(), s.kv().bytes(), format!("{view:?}"))
    };
    let before = snapshot(&session);
    // Shares 10 positions, then needs 25 in all: past the context of 24.
    let longer: Vec<u32> = (0..10).chain(50..65).collect();
    let err = session.prefill(&model, &longer).unwrap_err();
    assert_context_overflow(&err, 24, 24);
    assert_eq!(snapshot(&session), before);
    let bad: Vec<u32> = (0..15).chain([90]).collect();
    let err = session.prefill(&model, &bad).unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { id: 90, .. }));
    assert_eq!(snapshot(&session), before);
    assert!(matches!(
        session.prefill(&model, &[]),
        Err(ModelError::EmptyInput)
    ));
    // Still usable, and the same as before the failures.
    let again = session.prefill(&model, &ids).unwrap();
    assert_eq!((again.reused, again.prefilled), (19, 1));
    let diff = max_diff(&again.logits, &first.logits);
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn forks_and_truncation_continue_independently() {
    let model = tiny(Simd::new(), DType::Q8_0);
    let g = model.kv_geometry();
    let mut session = Session::new(GrowKv::new(g, 200).unwrap());
    let base: Vec<u32> = (0..30).map(|i| (i * 3) % 90).collect();
    session.prefill(&model, &base).unwrap();
    let mut fork = session.fork().unwrap();
    let a = session.decode(&model, 1).unwrap();
    let b = fork.decode(&model, 2).unwrap();
    assert_ne!(bits(&a), bits(&b));
    assert_eq!(&session.tokens()[..30], fork.tokens().get(..30).unwrap());
    // The fork's decode equals a fresh store's.
    let mut fresh = GrowKv::new(g, 200).unwrap();
    model.forward(&mut fresh, &base, Logits::None).unwrap();
    let want = model.forward(&mut fresh, &[2], Logits::Last).unwrap();
    assert_eq!(bits(&b), bits(want.row(0).as_slice().unwrap()));
    // Truncate the session back into the shared prefix and take the fork's token.
    session.truncate(30).unwrap();
    assert_eq!(session.tokens(), base);
    let c = session.decode(&model, 2).unwrap();
    assert_eq!(bits(&c), bits(&b));
    session.clear();
    assert!(session.is_empty() && session.kv().is_empty());
}

/// `generate` on a session: the second call's prompt extends the first conversation, so
/// it reuses the prompt and the generated tokens the session holds.
#[test]
fn generate_reports_reused_positions() {
    let model = tiny(Scalar::new(), DType::F32);
    let mut session = Session::new(GrowKv::new(model.kv_geometry(), 200).unwrap());
    let prompt: Vec<u32> = (10..30).collect();
    let mut params = GenerateParams::default();
    params.max_tokens = Some(6);
    let mut decoder = Decoder::tokens_only(&params, &prompt, 200).unwrap();
    let first = generate(&model, &mut session, &prompt, &mut decoder, |_| true).unwrap();
    assert_eq!(first.stats.reused_tokens, 0);
    assert_eq!(first.stats.prefilled_tokens, 20);
    // The session holds the prompt and all generated tokens but the last.
    assert_eq!(session.len(), 20 + 5);
    let next: Vec<u32> = [&prompt[..], &first.tokens[..], &[40, 41, 42]].concat();
    params.max_tokens = Some(3);
    let mut decoder = Decoder::tokens_only(&params, &next, 200).unwrap();
    let second = generate(&model, &mut session, &next, &mut decoder, |_| true).unwrap();
    assert_eq!(second.stats.reused_tokens, 25);
    assert_eq!(second.stats.prefilled_tokens, 4);
    assert_eq!(second.stats.prompt_tokens, next.len());
}
