//! Samplers and embeddings: seeded sampling is reproducible and follows the softmax of
//! the logits, top-k/top-p restrict it, bad parameters are errors; `embed` returns a unit
//! vector and never disturbs a conversation's KV cache.

use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Logits, ModelError, Sampler, SamplerParams, Sampling};
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

/// The whole chain on six logits, against a distribution computed by hand (in float64,
/// outside kvcore), in llama.cpp's order: bias, penalties, top-k, top-p, min-p,
/// temperature.
///
/// logits `[1.0, 2.0, 3.0, 0.5, -1.0, 2.5]`, window `[2, 2, 4]`:
/// - bias `0 += 1.5`, `2 += 0.5`, `5 = -inf` → `[2.5, 2.0, 3.5, 0.5, -1.0, -inf]`;
/// - penalties (repeat 2, frequency 0.1, presence 0.2): id 2 (seen twice, positive):
///   `3.5 / 2 − 2·0.1 − 0.2 = 1.35`; id 4 (once, negative): `−1 · 2 − 0.1 − 0.2 = −2.3`;
/// - top-k 4 → ids 0, 1, 2, 3 (logits 2.5, 2.0, 1.35, 0.5);
/// - top-p 0.9 on their softmax (0.48579, 0.29465, 0.15382, 0.06574; cumulative 0.78044,
///   0.93426) → ids 0, 1, 2;
/// - min-p 0.2: relative probabilities 1, 0.60653, 0.31664 → all kept; min-p 0.35 drops
///   id 2;
/// - temperature 0.5: softmax of `(2.5, 2.0, 1.35) / 0.5` = 0.681135, 0.250575, 0.068290;
///   with id 2 dropped, `(2.5, 2.0) / 0.5` → 0.731059, 0.268941.
///
/// Any other order gives other numbers: temperature before top-p keeps only ids 0 and 1
/// (0.691, 0.254 cumulate past 0.9); penalties before the bias put id 2 at 1.6.
#[test]
fn the_chain_runs_in_llama_cpp_order() {
    let logits = [1.0, 2.0, 3.0, 0.5, -1.0, 2.5];
    for (min_p, expected) in [
        (0.2, vec![(0, 0.681135), (1, 0.250575), (2, 0.068290)]),
        (0.35, vec![(0, 0.731059), (1, 0.268941)]),
    ] {
        let mut params = SamplerParams::default();
        params.temperature = 0.5;
        params.top_k = 4;
        params.top_p = 0.9;
        params.min_p = min_p;
        params.repeat_penalty = 2.0;
        params.repeat_last_n = 3;
        params.frequency_penalty = 0.1;
        params.presence_penalty = 0.2;
        params.logit_bias = vec![(0, 1.5), (2, 0.5), (5, f32::NEG_INFINITY)];
        let mut s = Sampler::with_params(params).unwrap();
        // The window keeps the last 3 ids of the context.
        s.set_context(&[4, 4, 4, 2]);
        s.accept(2);
        s.accept(4);
        let dist = s.distribution(&logits).unwrap();
        let ids: Vec<u32> = dist.iter().map(|d| d.0).collect();
        let want: Vec<u32> = expected.iter().map(|d| d.0).collect();
        assert_eq!(ids, want, "min-p {min_p}");
        for ((_, p), (_, q)) in dist.iter().zip(&expected) {
            assert!((p - q).abs() < 1e-6, "min-p {min_p}: {dist:?}");
        }
        // Draws stay within the distribution.
        assert!((0..200).all(|_| want.contains(&s.sample(&logits).unwrap())));
    }
}

/// Greedy applies the bias and the penalties, then takes the largest.
#[test]
fn greedy_sees_bias_and_penalties() {
    let logits = [1.0, 3.0, 2.0];
    let mut params = SamplerParams::greedy();
    params.repeat_penalty = 2.0;
    let mut s = Sampler::with_params(params.clone()).unwrap();
    assert_eq!(s.sample(&logits).unwrap(), 1);
    s.accept(1); // 3.0 / 2 = 1.5 < 2.0
    assert_eq!(s.sample(&logits).unwrap(), 2);
    params.repeat_penalty = 1.0;
    params.logit_bias = vec![(0, 5.0)];
    assert_eq!(
        Sampler::with_params(params.clone())
            .unwrap()
            .sample(&logits)
            .unwrap(),
        0
    );
    params.logit_bias = vec![
        (0, f32::NEG_INFINITY),
        (1, f32::NEG_INFINITY),
        (2, f32::NEG_INFINITY),
    ];
    let mut banned = Sampler::with_params(params.clone()).unwrap();
    assert!(matches!(
        banned.sample(&logits),
        Err(ModelError::NonFinite { .. })
    ));
    params.logit_bias = vec![(3, 1.0)];
    let mut outside = Sampler::with_params(params).unwrap();
    assert!(matches!(
        outside.sample(&logits),
        Err(ModelError::Sampling { .. })
    ));
}

#[test]
fn bad_chain_parameters_are_named() {
    type Set = Box<dyn Fn(&mut SamplerParams)>;
    let cases: Vec<(&str, Set)> = vec![
        ("temperature", Box::new(|p| p.temperature = -0.1)),
        ("temperature", Box::new(|p| p.temperature = f32::INFINITY)),
        ("top-p", Box::new(|p| p.top_p = 0.0)),
        ("min-p", Box::new(|p| p.min_p = 1.5)),
        ("repeat-penalty", Box::new(|p| p.repeat_penalty = 0.0)),
        (
            "presence-penalty",
            Box::new(|p| p.presence_penalty = f32::NAN),
        ),
        (
            "frequency-penalty",
            Box::new(|p| p.frequency_penalty = f32::INFINITY),
        ),
        (
            "logit-bias",
            Box::new(|p| p.logit_bias = vec![(0, f32::INFINITY)]),
        ),
    ];
    for (name, set) in cases {
        let mut p = SamplerParams::default();
        set(&mut p);
        match Sampler::with_params(p) {
            Err(ModelError::Sampling { param, .. }) => assert_eq!(param, name),
            other => panic!("{name}: {other:?}"),
        }
    }
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
