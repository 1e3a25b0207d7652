//! Samplers and embeddings: seeded sampling is reproducible and follows the softmax of
//! the logits, top-k/top-p restrict it, bad parameters are errors; `embed` returns a unit
//! vector and never disturbs a conversation's KV cache.

use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Logits, ModelError, Sampler, Sampling};
use kvcore::{DType, GrowKv};
use kvcore_scalar::Scalar;
use kvcore_test_support::tiny::TinyLlama;

fn random(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
    Sampler::new(Sampling::Random {
        temperature,
        top_k,
        top_p,
        seed,
    })
    .unwrap()
}

fn draw(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<u32> {
    (0..n).map(|_| s.sample(logits).unwrap()).collect()
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let a = draw(&mut random(0.8, 0, 1.0, 42), &logits, 200);
    let b = draw(&mut random(0.8, 0, 1.0, 42), &logits, 200);
    let c = draw(&mut random(0.8, 0, 1.0, 43), &logits, 200);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// Logits `[0, ln 3]` at temperature 1 give probabilities 1/4 and 3/4; at temperature
/// `ln 3 / ln 9 = 1/2` they give 1/10 and 9/10. 4000 draws: the standard error of the
/// frequency is under 0.007, so ±0.03 is more than four of them.
#[test]
fn sampling_follows_the_tempered_softmax() {
    let logits = [0.0, 3f32.ln()];
    for (temperature, p1) in [(1.0, 0.75), (0.5, 0.9)] {
        let draws = draw(&mut random(temperature, 0, 1.0, 7), &logits, 4000);
        let freq = draws.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!(
            (freq - p1).abs() < 0.03,
            "temperature {temperature}: frequency {freq}, expected {p1}"
        );
    }
}

#[test]
fn top_k_and_top_p_restrict_the_candidates() {
    let logits = [1.0, 3.0, 2.9, -1.0, 2.8];
    // top-k 1 is greedy.
    assert!(
        draw(&mut random(5.0, 1, 1.0, 1), &logits, 300)
            .iter()
            .all(|&t| t == 1)
    );
    // top-k 3 never leaves the three largest.
    let k3 = draw(&mut random(5.0, 3, 1.0, 2), &logits, 600);
    assert!(k3.iter().all(|t| [1, 2, 4].contains(t)));
    assert!([1, 2, 4].iter().all(|t| k3.contains(t)));
    // A tiny top-p keeps only the most likely token.
    assert!(
        draw(&mut random(5.0, 0, 1e-6, 3), &logits, 300)
            .iter()
            .all(|&t| t == 1)
    );
    // Greedy: the first of equal maxima.
    let mut g = Sampler::new(Sampling::Greedy).unwrap();
    assert_eq!(g.sample(&[0.5, 2.0, 2.0]).unwrap(), 1);
}

#[test]
fn bad_parameters_and_bad_logits_are_errors() {
    for (t, p) in [
        (0.0, 0.9),
        (-1.0, 0.9),
        (f32::NAN, 0.9),
        (f32::INFINITY, 0.9),
        (1.0, 0.0),
        (1.0, 1.5),
    ] {
        let s = Sampler::new(Sampling::Random {
            temperature: t,
            top_k: 0,
            top_p: p,
            seed: 0,
        });
        assert!(
            matches!(s, Err(ModelError::Sampling { .. })),
            "temp {t} top-p {p}"
        );
    }
    let mut g = Sampler::new(Sampling::Greedy).unwrap();
    assert!(matches!(g.sample(&[]), Err(ModelError::NonFinite { .. })));
    assert!(matches!(
        g.sample(&[1.0, f32::NAN]),
        Err(ModelError::NonFinite { .. })
    ));
}

fn tiny() -> Llama<Scalar> {
    let spec = TinyLlama {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 48,
        vocab_size: 80,
        context_len: 64,
        dtype: DType::F16,
        seed: 11,
        untied_output: true,
    };
    Llama::load(GgufFile::from_bytes(spec.to_gguf()).unwrap(), Scalar::new()).unwrap()
}

#[test]
fn embeddings_are_unit_vectors_and_leave_the_conversation_alone() {
    let model = tiny();
    let c = model.config().clone();
    let e = model.embed(&[3, 1, 4, 1, 5]).unwrap();
    assert_eq!(e.len(), c.d_model);
    let norm: f64 = e.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    assert_eq!(e, model.embed(&[3, 1, 4, 1, 5]).unwrap());
    assert_ne!(e, model.embed(&[2, 7, 1, 8]).unwrap());
    assert!(matches!(model.embed(&[]), Err(ModelError::EmptyInput)));

    // A conversation with and without an embedding computed in the middle.
    let run = |embed_between: bool| {
        let mut kv = GrowKv::new(c.kv_geometry(), 64).unwrap();
        model.forward(&mut kv, &[9, 8, 7], Logits::Last).unwrap();
        if embed_between {
            model.embed(&[1, 2, 3, 4, 5, 6]).unwrap();
        }
        let l = model.forward(&mut kv, &[6], Logits::Last).unwrap();
        l.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(false), run(true));
}
