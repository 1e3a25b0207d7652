//! Grow vs dense, end to end: the same model driven through `GrowKv` and `DenseKv` gives
//! bitwise-identical logits at every step, for every backend — on random tiny models
//! (property test) and on SmolLM2 for a 300-token greedy generation. Also the context
//! limit: running past `max_ctx` is a clean error that keeps what was generated.

use crate::common::*;
use kvcore::gguf::GgufFile;
use kvcore::model::{
    Decoder, FinishReason, GenerateParams, Generation, Llama, Logits, ModelError, Sampler,
    Sampling, Step, generate,
};
use kvcore::{Backend, DType, DenseKv, GrowKv, KvStore, Session};
use kvcore_test_support::tiny::TinyLlama;
use ndarray::Array2;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn bits(a: &Array2<f32>) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// One random scenario: a tiny model, a prompt, chunk sizes and decode steps.
#[derive(Clone, Debug)]
struct Case {
    model: TinyLlama,
    initial_cap: usize,
    prompt: Vec<u32>,
    /// The prompt is fed in chunks of these sizes (cycled), then `decode` greedy steps.
    chunks: Vec<usize>,
    decode: usize,
}

fn case() -> impl Strategy<Value = Case> {
    // Tiny models: the K formats' 256-weight super-blocks need widths they do not have.
    let dtypes = prop::sample::select(
        DType::ALL
            .into_iter()
            .filter(|d| d.block_len() <= 32)
            .collect::<Vec<_>>(),
    );
    (
        1usize..=3,
        1usize..=3,
        1usize..=4,
        dtypes,
        any::<u64>(),
        any::<bool>(),
    )
        .prop_flat_map(|(n_layers, n_kv_heads, group, dtype, seed, untied)| {
            let n_heads = n_kv_heads * group; // odd head counts arise from odd n_kv_heads
            // d_model must be a multiple of 32 for the block formats.
            // (float formats get small odd-width models: d_model = 6 · n_heads).
            let head_dim = if dtype.block_len() == 32 { 32 } else { 6 };
            let model = TinyLlama {
                n_layers,
                n_heads,
                n_kv_heads,
                head_dim,
                ffn_dim: if dtype.block_len() == 32 { 64 } else { 40 },
                vocab_size: 96,
                context_len: 160,
                dtype,
                seed,
                untied_output: untied,
            };
            (
                Just(model),
                1usize..=70,
                prop::collection::vec(0u32..96, 60..140),
                prop::collection::vec(1usize..=48, 1..4),
                0usize..12,
            )
        })
        .prop_map(|(model, initial_cap, prompt, chunks, decode)| Case {
            model,
            initial_cap,
            prompt,
            chunks,
            decode,
        })
}

/// Feeds the case to one model with both stores in lockstep and compares bits.
fn run_case<B: Backend>(model: &Llama<B>, case: &Case) -> Result<(), TestCaseError> {
    let c = model.config();
    let max_ctx = c.context_len;
    let mut grow =
        GrowKv::with_initial_capacity(c.kv_geometry(), max_ctx, case.initial_cap).unwrap();
    let mut dense = DenseKv::new(c.kv_geometry(), max_ctx).unwrap();
    let mut fed = 0;
    let mut last = None;
    for (i, size) in case.chunks.iter().cycle().enumerate() {
        if fed >= case.prompt.len() {
            break;
        }
        let end = (fed + size).min(case.prompt.len());
        let chunk = &case.prompt[fed..end];
        let a = model.forward(&mut grow, chunk, Logits::All).unwrap();
        let b = model.forward(&mut dense, chunk, Logits::All).unwrap();
        prop_assert_eq!(bits(&a), bits(&b), "prefill chunk {} at {}", i, fed);
        prop_assert!(a.iter().all(|v| v.is_finite()), "non-finite logits");
        fed = end;
        last = Some(a);
    }
    let mut logits = last.unwrap();
    for step in 0..case.decode {
        let row = logits.row(logits.nrows() - 1);
        let id = Sampler::new(Sampling::Greedy)
            .unwrap()
            .sample(row.as_slice().unwrap())
            .unwrap();
        let a = model.forward(&mut grow, &[id], Logits::Last).unwrap();
        let b = model.forward(&mut dense, &[id], Logits::Last).unwrap();
        prop_assert_eq!(bits(&a), bits(&b), "decode step {}", step);
        logits = a;
    }
    prop_assert_eq!(grow.len(), dense.len());
    prop_assert!(grow.bytes() <= dense.bytes());
    Ok(())
}

struct TinyProperty;

impl PerBackend for TinyProperty {
    fn run<B: Backend>(&self, backend: B) {
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 24,
                failure_persistence: None,
                ..Config::default()
            },
            proptest::test_runner::TestRng::deterministic_rng(
                proptest::test_runner::RngAlgorithm::ChaCha,
            ),
        );
        let backend = &backend;
        runner
            .run(&case(), |case| {
                let file = GgufFile::from_bytes(case.model.to_gguf()).unwrap();
                let model = Llama::load(file, backend).unwrap();
                run_case(&model, &case)
            })
            .unwrap();
    }
}

#[test]
fn tiny_models_grow_equals_dense_scalar() {
    with_backend("scalar", &TinyProperty);
}

crate::common::simd_and_rayon_tests!(
    tiny_models_grow_equals_dense_simd,
    tiny_models_grow_equals_dense_rayon => &TinyProperty
);

/// SmolLM2, 300 greedy tokens after a short prompt: bitwise-identical logits at every step.
#[test]
fn smollm2_300_tokens_grow_equals_dense() {
    struct Job;
    impl PerBackend for Job {
        fn run<B: Backend>(&self, backend: B) {
            let model = load_smollm2(backend);
            let c = model.config().clone();
            let mut grow = GrowKv::new(c.kv_geometry(), c.context_len).unwrap();
            let mut dense = DenseKv::new(c.kv_geometry(), c.context_len).unwrap();
            let prompt = ids(&reference_logits()[0]["prompt_ids"]);
            let mut a = model.forward(&mut grow, &prompt, Logits::Last).unwrap();
            let b = model.forward(&mut dense, &prompt, Logits::Last).unwrap();
            assert_eq!(bits(&a), bits(&b), "prefill");
            let mut sampler = Sampler::new(Sampling::Greedy).unwrap();
            for step in 0..300 {
                let id = sampler.sample(a.row(0).as_slice().unwrap()).unwrap();
                a = model.forward(&mut grow, &[id], Logits::Last).unwrap();
                let b = model.forward(&mut dense, &[id], Logits::Last).unwrap();
                assert_eq!(bits(&a), bits(&b), "decode step {step}");
            }
            assert_eq!(grow.len(), prompt.len() + 300);
            // 305 positions: capacity grew 64 -> 128 -> 256 -> 512, far below dense.
            assert_eq!(grow.capacity(), 512);
            assert!(
                grow.bytes() * 16 == dense.bytes(),
                "512 of 8192 positions resident"
            );
        }
    }
    with_backend("rayon", &Job);
}

fn tiny_model<B: Backend>(backend: B, context_len: usize) -> Llama<B> {
    let spec = TinyLlama {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 64,
        vocab_size: 64,
        context_len,
        dtype: DType::F32,
        seed: 7,
        untied_output: false,
    };
    Llama::load(GgufFile::from_bytes(spec.to_gguf()).unwrap(), backend).unwrap()
}

/// Generates up to `max_tokens` after `prompt` in a fresh session of `max_ctx` positions,
/// `on_step` as [`generate`]'s callback; returns the generation, the session and whether
/// the decoder found the context full.
fn generate_fresh<B: Backend>(
    model: &Llama<B>,
    max_ctx: usize,
    prompt: &[u32],
    max_tokens: usize,
    on_step: impl FnMut(&Step) -> bool,
) -> (Generation, Session<GrowKv>, bool) {
    let mut session = Session::new(GrowKv::new(model.kv_geometry(), max_ctx).unwrap());
    let mut params = GenerateParams::default();
    params.max_tokens = Some(max_tokens);
    let mut decoder = Decoder::tokens_only(&params, prompt, max_ctx).unwrap();
    let g = generate(model, &mut session, prompt, &mut decoder, on_step).unwrap();
    (g, session, decoder.context_full())
}

/// Generation that reaches `max_ctx` ends there (the decoder's budget: the last token
/// is never run), keeps its tokens and says the context, not `max_tokens`, ended it;
/// the cache keeps exactly the positions that were computed.
#[test]
fn generation_ends_at_the_full_context() {
    let model = tiny_model(kvcore_scalar::Scalar::new(), 64);
    let prompt: Vec<u32> = (0..12).collect();
    let mut streamed = Vec::new();
    let (g, session, context_full) = generate_fresh(&model, 20, &prompt, 50, |step| {
        streamed.push(step.id);
        true
    });
    // 12 prompt positions + 8 decoded = 20 positions; the 9th token is never run.
    assert_eq!(g.tokens.len(), 9);
    assert_eq!(g.finish, Some(FinishReason::Length));
    assert!(context_full);
    assert_eq!(g.tokens, streamed);
    assert_eq!(session.len(), 20);
    assert_eq!(session.tokens(), [&prompt[..], &g.tokens[..8]].concat());
    assert_eq!(g.stats.kv_capacity, 20);
    // One token fewer than the room: max_tokens ended it.
    let (g, session, context_full) = generate_fresh(&model, 20, &prompt, 8, |_| true);
    assert_eq!((g.tokens.len(), g.finish), (8, Some(FinishReason::Length)));
    assert!(!context_full);
    assert_eq!(session.len(), 19);
}

/// A callback that returns false cancels the generation after its step.
#[test]
fn a_callback_cancels_the_generation() {
    let model = tiny_model(kvcore_scalar::Scalar::new(), 64);
    let prompt: Vec<u32> = (0..5).collect();
    let mut steps = 0;
    let (g, session, _) = generate_fresh(&model, 64, &prompt, 20, |_| {
        steps += 1;
        steps < 3
    });
    assert_eq!(
        (g.tokens.len(), g.finish),
        (3, Some(FinishReason::Cancelled))
    );
    assert_eq!(session.len(), 5 + 2);
}

/// A prompt longer than the context fails before touching the cache.
#[test]
fn prompt_longer_than_context_leaves_cache_untouched() {
    let model = tiny_model(kvcore_scalar::Scalar::new(), 64);
    let c = model.config().clone();
    let mut kv = GrowKv::new(c.kv_geometry(), 8).unwrap();
    let err = model.forward(&mut kv, &[1; 9], Logits::Last).unwrap_err();
    assert_context_overflow(&err, 8, 8);
    assert_eq!(kv.len(), 0);
    let err = model.forward(&mut kv, &[64], Logits::Last).unwrap_err();
    assert!(matches!(
        err,
        ModelError::TokenOutOfRange {
            id: 64,
            vocab_size: 64
        }
    ));
}

/// `max_tokens: Some(0)` processes the prompt only.
#[test]
fn zero_new_tokens_fills_the_cache_only() {
    let model = tiny_model(kvcore_scalar::Scalar::new(), 64);
    let c = model.config().clone();
    let mut session = Session::new(DenseKv::new(c.kv_geometry(), 64).unwrap());
    let mut params = GenerateParams::default();
    params.max_tokens = Some(0);
    let mut decoder = Decoder::tokens_only(&params, &[1, 2, 3], 64).unwrap();
    let g = generate(&model, &mut session, &[1, 2, 3], &mut decoder, |_| true).unwrap();
    assert!(g.tokens.is_empty());
    assert_eq!(session.tokens(), [1, 2, 3]);
}
