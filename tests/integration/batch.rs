//! The batched forward pass (`Llama::forward_batch`): several sequences at their own
//! depths, with one-token decode steps and prefill chunks mixed, give each sequence what
//! running it alone with `forward` gives, and the batch is one transaction.
//!
//! - **SmolLM2**, for `scalar`, `simd` and `rayon` (2 threads over `simd`), f32 and q8
//!   activations: four stores at depths 0, 17, 17 and 130 go through batched steps
//!   (a 12-token chunk beside decode steps and a 5-token chunk; two long chunks beside
//!   decode steps; a step of decode only), each step's logits (Last, All, None) and, at
//!   the end, every KV row compared with the same steps run alone on forks:
//!   - bit for bit with the scalar reference (its GEMM rows are its GEMVs) and with q8
//!     activations on every backend (a sequence of at most `Q8_MAX_TOKENS` tokens takes
//!     `gemm_q8`, each row bit for bit its GEMV; a longer chunk's rows the f32 GEMM, as
//!     alone — and `sgemm`'s rows do not depend on the other rows of the call);
//!   - with f32 activations on `simd` and `rayon`, within the golden tolerance (0.01 on a
//!     logit; the measured worst is printed), and the KV rows within 1e-3: a decode row
//!     is a GEMV alone and a row of a GEMM in a batch, which add in other orders.
//! - **tiny random models** (llama and gemma3 with windowed stores), proptest: random
//!   batch compositions (1–5 sequences, depths 0–40, 0–12 tokens each, any `Logits`) bit
//!   for bit their alone runs on `scalar` with f32 and q8 and on `simd` with q8.
//! - **transactions**: a bad token id, a context overflow, a refused allocation, a store
//!   of the wrong geometry in one sequence, or a kernel error at any call of a batched
//!   pass leave every store of the batch bit for bit as it was; retried without the
//!   fault, the batch gives the clean run's bits. Empty batches and sequences without
//!   tokens are no-ops.

use std::sync::Arc;

use crate::common::*;
use kvcore::gguf::GgufFile;
use kvcore::kv::{AllocGate, KvGeometry};
use kvcore::model::{Activations, BatchSeq, Llama, Logits, ModelError};
use kvcore::ndarray::Array2;
use kvcore::{Backend, DType, DenseKv, GrowKv, KvError, KvStore, WindowKv};
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::faults::{FailingBackend, INJECTED, RefuseNth};
use kvcore_test_support::tiny::TinyLlama;
use proptest::prelude::*;

use crate::common::{KvSnapshot as Snapshot, kv_snapshot as snapshot};

fn bits(v: impl IntoIterator<Item = f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}

/// The same positions, and every K/V element bit for bit.
fn same_rows(a: &Snapshot, b: &Snapshot) -> bool {
    a.len == b.len && a.rows == b.rows
}

/// The largest `|a − b|` over two equally long lists.
fn max_diff<'a>(a: impl IntoIterator<Item = &'a f32>, b: impl IntoIterator<Item = &'a f32>) -> f32 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The worst K/V element difference of two snapshots holding the same positions.
fn rows_diff(a: &Snapshot, b: &Snapshot) -> f32 {
    assert_eq!(a.len, b.len);
    a.rows
        .iter()
        .zip(&b.rows)
        .map(|(x, y)| {
            assert_eq!(x.0, y.0, "positions");
            let f32s = |b: &[u32]| b.iter().map(|&b| f32::from_bits(b)).collect::<Vec<f32>>();
            max_diff(&f32s(&x.1), &f32s(&y.1)).max(max_diff(&f32s(&x.2), &f32s(&y.2)))
        })
        .fold(0.0, f32::max)
}

/// One sequence's share of a batched step.
#[derive(Clone, Debug)]
struct Step {
    tokens: Vec<u32>,
    logits: Logits,
}

/// Runs one batched step on `stores` (one `Step` per store).
fn batch<B: Backend, K: KvStore + ?Sized>(
    model: &Llama<B>,
    stores: &mut [&mut K],
    steps: &[Step],
) -> Result<Vec<Array2<f32>>, ModelError> {
    let mut seqs: Vec<BatchSeq<'_, K>> = stores
        .iter_mut()
        .zip(steps)
        .map(|(kv, s)| BatchSeq::new(&mut **kv, &s.tokens, s.logits))
        .collect();
    model.forward_batch(&mut seqs)
}

/// How a batch must relate to the alone runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Logits and KV rows bit for bit.
    Bitwise,
    /// Logits within `logits`, KV elements within `kv`.
    Within { logits: f32, kv: f32 },
}

/// The SmolLM2 scenario: four stores at depths 0, 17, 17 and 130 and three batched
/// steps, each checked against the same steps run alone.
struct Mixed {
    activations: Activations,
    expect: Expect,
}

/// Real token ids (the reference prompts and their continuations), cycled to `n` from
/// `offset`.
fn text_ids(n: usize, offset: usize) -> Vec<u32> {
    let all: Vec<u32> = reference_logits()
        .iter()
        .flat_map(|p| {
            ids(&p["prompt_ids"])
                .into_iter()
                .chain(ids(&p["greedy_ids"]))
        })
        .collect();
    (0..n).map(|i| all[(offset + i) % all.len()]).collect()
}

fn step(n: usize, offset: usize, logits: Logits) -> Step {
    Step {
        tokens: text_ids(n, offset),
        logits,
    }
}

impl PerBackend for Mixed {
    fn run<B: Backend>(&self, backend: B) {
        let model = load_smollm2(backend).with_activations(self.activations);
        let name = format!("{} {}", model.backend().name(), self.activations.name());
        let g = model.kv_geometry();
        let depths = [(0, 0), (17, 40), (17, 90), (130, 7)];
        let mut batched: Vec<GrowKv> = depths
            .iter()
            .map(|&(depth, offset)| {
                let mut kv = GrowKv::new(g, 1024).unwrap();
                model
                    .forward(&mut kv, &text_ids(depth, offset), Logits::None)
                    .unwrap();
                kv
            })
            .collect();
        let mut alone: Vec<GrowKv> = batched.iter().map(|kv| kv.fork().unwrap()).collect();
        let steps = [
            // A 12-token chunk (f32 rows with q8), decode steps, a 5-token chunk.
            vec![
                step(12, 300, Logits::All),
                step(1, 301, Logits::Last),
                step(1, 302, Logits::Last),
                step(5, 303, Logits::None),
            ],
            // Two long chunks beside decode steps.
            vec![
                step(1, 310, Logits::Last),
                step(9, 311, Logits::All),
                step(1, 312, Logits::Last),
                step(20, 313, Logits::Last),
            ],
            // Decode only.
            vec![
                step(1, 320, Logits::Last),
                step(1, 321, Logits::All),
                step(1, 322, Logits::Last),
                step(1, 323, Logits::Last),
            ],
        ];
        let mut worst_logit = 0.0f32;
        for (i, steps) in steps.iter().enumerate() {
            let mut refs: Vec<&mut GrowKv> = batched.iter_mut().collect();
            let got = batch(&model, &mut refs, steps).unwrap();
            assert_eq!(got.len(), steps.len());
            for (s, ((kv, st), got)) in alone.iter_mut().zip(steps).zip(&got).enumerate() {
                let want = model.forward(kv, &st.tokens, st.logits).unwrap();
                assert_eq!(got.dim(), want.dim(), "{name} step {i} sequence {s}");
                match self.expect {
                    Expect::Bitwise => assert_eq!(
                        bits(got.iter().copied()),
                        bits(want.iter().copied()),
                        "{name} step {i} sequence {s}: logits differ from the alone run"
                    ),
                    Expect::Within { logits, .. } => {
                        let d = max_diff(got, &want);
                        assert!(d <= logits, "{name} step {i} sequence {s}: {d} > {logits}");
                        worst_logit = worst_logit.max(d);
                    }
                }
            }
        }
        let mut worst_kv = 0.0f32;
        for (s, (b, a)) in batched.iter().zip(&alone).enumerate() {
            let (b, a) = (snapshot(b), snapshot(a));
            match self.expect {
                Expect::Bitwise => assert!(same_rows(&b, &a), "{name} sequence {s}: KV rows"),
                Expect::Within { kv, .. } => {
                    let d = rows_diff(&b, &a);
                    assert!(d <= kv, "{name} sequence {s}: KV rows differ by {d} > {kv}");
                    worst_kv = worst_kv.max(d);
                }
            }
        }
        eprintln!(
            "{name}: {:?}; worst logit difference {worst_logit}, worst KV difference {worst_kv}",
            self.expect
        );
    }
}

const WITHIN: Expect = Expect::Within {
    logits: TOL,
    kv: 1e-3,
};

#[test]
fn smollm2_batch_is_each_sequence_alone_scalar_f32() {
    with_backend(
        "scalar",
        &Mixed {
            activations: Activations::F32,
            expect: Expect::Bitwise,
        },
    );
}

#[test]
fn smollm2_batch_is_each_sequence_alone_scalar_q8() {
    with_backend(
        "scalar",
        &Mixed {
            activations: Activations::Q8,
            expect: Expect::Bitwise,
        },
    );
}

#[test]
fn smollm2_batch_is_each_sequence_alone_simd_f32() {
    with_backend(
        "simd",
        &Mixed {
            activations: Activations::F32,
            expect: WITHIN,
        },
    );
}

#[test]
fn smollm2_batch_is_each_sequence_alone_simd_q8() {
    with_backend(
        "simd",
        &Mixed {
            activations: Activations::Q8,
            expect: Expect::Bitwise,
        },
    );
}

#[test]
fn smollm2_batch_is_each_sequence_alone_rayon_f32() {
    with_backend(
        "rayon",
        &Mixed {
            activations: Activations::F32,
            expect: WITHIN,
        },
    );
}

#[test]
fn smollm2_batch_is_each_sequence_alone_rayon_q8() {
    with_backend(
        "rayon",
        &Mixed {
            activations: Activations::Q8,
            expect: Expect::Bitwise,
        },
    );
}

/// With f32 activations, a batched decode step differs from the alone one (GEMM rows vs
/// a GEMV), so the `Within` expectation above is not vacuous: the batch must really
/// differ somewhere, else the f32 tests could be `Bitwise`.
#[test]
fn smollm2_simd_f32_batch_is_not_bitwise() {
    let model = load_smollm2(Simd::new());
    let g = model.kv_geometry();
    let mut a = GrowKv::new(g, 64).unwrap();
    let mut b = GrowKv::new(g, 64).unwrap();
    let mut alone = GrowKv::new(g, 64).unwrap();
    let t = text_ids(2, 0);
    let got = batch(
        &model,
        &mut [&mut a, &mut b],
        &[step(1, 0, Logits::Last), step(1, 1, Logits::Last)],
    )
    .unwrap();
    let want = model.forward(&mut alone, &t[..1], Logits::Last).unwrap();
    let d = max_diff(&got[0], &want);
    assert!(d > 0.0 && d <= TOL, "batched vs alone decode: {d}");
}

// ---- tiny models -------------------------------------------------------------------

fn tiny(dtype: DType, seed: u64) -> TinyLlama {
    TinyLlama {
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 64,
        vocab_size: 90,
        context_len: 256,
        dtype,
        seed,
        untied_output: seed % 2 == 1,
    }
}

fn tiny_llama<B: Backend>(spec: &TinyLlama, b: B) -> Llama<B> {
    Llama::load(GgufFile::from_bytes(spec.to_gguf()).unwrap(), b).unwrap()
}

/// Gemma 3 shapes with a window of 8 on its window layers.
fn tiny_gemma3<B: Backend>(spec: &TinyLlama, b: B) -> Llama<B> {
    Llama::load(GgufFile::from_bytes(spec.to_gemma3_gguf(8)).unwrap(), b).unwrap()
}

/// One sequence of a random batch: its depth (prefilled alone, in one pass), its tokens
/// and the logits it asks for.
#[derive(Clone, Debug)]
struct SeqCase {
    depth: Vec<u32>,
    tokens: Vec<u32>,
    logits: Logits,
}

fn seq_case(max_tokens: usize) -> impl Strategy<Value = SeqCase> {
    (
        prop::collection::vec(0u32..90, 0..40),
        prop::collection::vec(0u32..90, 0..=max_tokens),
        prop_oneof![Just(Logits::Last), Just(Logits::All), Just(Logits::None)],
    )
        .prop_map(|(depth, tokens, logits)| SeqCase {
            depth,
            tokens,
            logits,
        })
}

/// Runs `cases` as one batch on stores made by `new_store` and each alone on forks;
/// asserts every logit and every KV row bit for bit.
fn check_bitwise<B: Backend, K: KvStore>(
    model: &Llama<B>,
    cases: &[SeqCase],
    new_store: impl Fn() -> K,
) -> Result<(), TestCaseError> {
    let mut batched: Vec<K> = cases
        .iter()
        .map(|c| {
            let mut kv = new_store();
            model.forward(&mut kv, &c.depth, Logits::None).unwrap();
            kv
        })
        .collect();
    let mut alone: Vec<K> = batched.iter().map(|kv| kv.fork().unwrap()).collect();
    let steps: Vec<Step> = cases
        .iter()
        .map(|c| Step {
            tokens: c.tokens.clone(),
            logits: c.logits,
        })
        .collect();
    let mut refs: Vec<&mut K> = batched.iter_mut().collect();
    let got = batch(model, &mut refs, &steps).unwrap();
    prop_assert_eq!(got.len(), cases.len());
    for (s, (kv, (c, got))) in alone.iter_mut().zip(cases.iter().zip(&got)).enumerate() {
        let want = model.forward(kv, &c.tokens, c.logits).unwrap();
        prop_assert_eq!(got.dim(), want.dim(), "sequence {}", s);
        prop_assert_eq!(
            bits(got.iter().copied()),
            bits(want.iter().copied()),
            "sequence {} logits",
            s
        );
    }
    for (s, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let (b, a) = (snapshot(b), snapshot(a));
        prop_assert!(same_rows(&b, &a), "sequence {} KV rows", s);
        prop_assert_eq!(b.capacity, a.capacity, "sequence {} capacity", s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::persisted_proptest_config(
        48,
        0x0062_6174_6368,
        "proptest-regressions/batch.txt"
    ))]

    /// The scalar reference, f32 and q8 activations, any composition: bit for bit.
    #[test]
    fn tiny_llama_batches_are_bitwise_alone_scalar(
        cases in prop::collection::vec(seq_case(12), 1..=5),
        q8 in any::<bool>(),
        seed in 0u64..4,
    ) {
        let acts = if q8 { Activations::Q8 } else { Activations::F32 };
        let model = tiny_llama(&tiny(DType::Q8_0, seed), Scalar::new()).with_activations(acts);
        let g = model.kv_geometry();
        check_bitwise(&model, &cases, || GrowKv::with_initial_capacity(g, 256, 4).unwrap())?;
    }

    /// SIMD with q8 activations: every sequence of at most 8 tokens takes `gemm_q8`
    /// (each row its GEMV), one longer chunk its own f32 GEMM, as alone.
    #[test]
    fn tiny_llama_batches_are_bitwise_alone_simd_q8(
        mut cases in prop::collection::vec(seq_case(8), 1..=5),
        long in prop::collection::vec(0u32..90, 9..=20),
        with_long in any::<bool>(),
        dtype in prop_oneof![Just(DType::Q8_0), Just(DType::Q4_0), Just(DType::Q4_1)],
    ) {
        if with_long {
            cases[0].tokens = long;
        }
        let model = tiny_llama(&tiny(dtype, 5), Simd::new()).with_activations(Activations::Q8);
        let g = model.kv_geometry();
        check_bitwise(&model, &cases, || DenseKv::new(g, 256).unwrap())?;
    }

    /// Gemma 3's shape (q/k norms, post norms, GeGLU, sliding windows) on its windowed
    /// stores, the scalar reference: bit for bit.
    #[test]
    fn tiny_gemma3_batches_are_bitwise_alone_scalar(
        cases in prop::collection::vec(seq_case(12), 1..=4),
        q8 in any::<bool>(),
    ) {
        let acts = if q8 { Activations::Q8 } else { Activations::F32 };
        let model = tiny_gemma3(&tiny(DType::Q8_0, 2), Scalar::new()).with_activations(acts);
        let windows = model.config().windows();
        let g = model.kv_geometry();
        check_bitwise(&model, &cases, || WindowKv::new(g, 256, &windows).unwrap())?;
    }
}

// ---- transactions and edge cases -----------------------------------------------------

/// Four tiny-model stores at depths 0, 4, 9 and 31, growing from 4 positions (to 4, 8,
/// 16 and 32), so each grows in [`four_steps`].
fn four_stores<B: Backend>(model: &Llama<B>, max_ctx: usize) -> Vec<GrowKv> {
    [0usize, 4, 9, 31]
        .iter()
        .map(|&d| {
            let mut kv = GrowKv::with_initial_capacity(model.kv_geometry(), max_ctx, 4).unwrap();
            let ids: Vec<u32> = (0..d as u32).map(|i| (i * 11 + 5) % 90).collect();
            model.forward(&mut kv, &ids, Logits::None).unwrap();
            kv
        })
        .collect()
}

/// A batch of prefill chunks and decode steps for four stores; every store grows.
fn four_steps() -> Vec<Step> {
    vec![
        Step {
            tokens: (0..7).collect(),
            logits: Logits::All,
        },
        Step {
            tokens: vec![4],
            logits: Logits::Last,
        },
        Step {
            tokens: (10..22).collect(),
            logits: Logits::Last,
        },
        Step {
            tokens: vec![8, 9],
            logits: Logits::None,
        },
    ]
}

fn all_bits(out: &[Array2<f32>]) -> Vec<Vec<u32>> {
    out.iter().map(|a| bits(a.iter().copied())).collect()
}

/// Asserts `err` is `Sequence { index, .. }` and returns the inner error.
fn in_sequence(err: ModelError, index: usize) -> ModelError {
    match err {
        ModelError::Sequence { index: i, error } if i == index => *error,
        other => panic!("expected an error of sequence {index}, got {other}"),
    }
}

/// Runs `steps` on [`four_stores`] of `max_ctx` positions, which must fail; asserts that
/// no store changed and returns the error.
fn fails_changing_no_store<B: Backend>(
    model: &Llama<B>,
    max_ctx: usize,
    steps: &[Step],
) -> ModelError {
    let mut stores = four_stores(model, max_ctx);
    let before: Vec<Snapshot> = stores.iter().map(snapshot).collect();
    let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
    let err = batch(model, &mut refs, steps).unwrap_err();
    let after: Vec<Snapshot> = stores.iter().map(snapshot).collect();
    assert_eq!(after, before);
    err
}

#[test]
fn a_bad_token_in_one_sequence_changes_no_store() {
    let model = tiny_llama(&tiny(DType::F32, 0), Scalar::new());
    let mut steps = four_steps();
    steps[2].tokens[5] = 90; // the vocabulary is 0..90
    let err = fails_changing_no_store(&model, 256, &steps);
    assert!(
        matches!(
            in_sequence(err, 2),
            ModelError::TokenOutOfRange {
                id: 90,
                vocab_size: 90
            }
        ),
        "bad token"
    );
}

#[test]
fn an_overflow_in_the_last_sequence_rolls_back_the_others() {
    let model = tiny_llama(&tiny(DType::F32, 0), Scalar::new());
    // 41 positions: the last store (31 held) cannot take 12 more; the three before it
    // are begun (and grow) before its append is refused.
    let mut steps = four_steps();
    steps[3].tokens = (10..22).collect(); // 31 held + 12 > 41
    let err = fails_changing_no_store(&model, 41, &steps);
    assert!(
        matches!(
            in_sequence(err, 3),
            ModelError::Kv(KvError::ContextOverflow {
                pos: 42,
                max_ctx: 41
            })
        ),
        "overflow"
    );
}

#[test]
fn a_refused_allocation_in_one_store_changes_no_store() {
    let model = tiny_llama(&tiny(DType::F32, 0), Scalar::new());
    let clean = {
        let mut stores = four_stores(&model, 256);
        let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
        all_bits(&batch(&model, &mut refs, &four_steps()).unwrap())
    };
    for victim in 0..4 {
        let mut stores = four_stores(&model, 256);
        let before: Vec<Snapshot> = stores.iter().map(snapshot).collect();
        // Every store grows in this batch: refuse the victim's first allocation.
        stores[victim].set_alloc_gate(Some(Arc::new(RefuseNth::new(1)) as Arc<dyn AllocGate>));
        let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
        let err = batch(&model, &mut refs, &four_steps()).unwrap_err();
        assert!(
            matches!(
                in_sequence(err, victim),
                ModelError::Kv(KvError::AllocFailed { .. })
            ),
            "victim {victim}"
        );
        let after: Vec<Snapshot> = stores.iter().map(snapshot).collect();
        assert_eq!(after, before, "victim {victim}");
        // Retried with the gate open: the clean run's bits.
        stores[victim].set_alloc_gate(None);
        let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
        let got = all_bits(&batch(&model, &mut refs, &four_steps()).unwrap());
        assert_eq!(got, clean, "victim {victim} retried");
    }
}

#[test]
fn a_store_of_another_geometry_is_refused() {
    let model = tiny_llama(&tiny(DType::F32, 0), Scalar::new());
    let g = model.kv_geometry();
    let mut good = GrowKv::new(g, 64).unwrap();
    let other = KvGeometry {
        n_layers: g.n_layers + 1,
        ..g
    };
    let mut bad = GrowKv::new(other, 64).unwrap();
    let before = snapshot(&good);
    let mut seqs: Vec<BatchSeq<'_, GrowKv>> = vec![
        BatchSeq::new(&mut good, &[1, 2, 3], Logits::Last),
        BatchSeq::new(&mut bad, &[1], Logits::Last),
    ];
    let err = model.forward_batch(&mut seqs).unwrap_err();
    assert!(matches!(
        in_sequence(err, 1),
        ModelError::KvGeometry { found, .. } if found == other
    ));
    assert_eq!(snapshot(&good), before);
    assert!(bad.is_empty());
}

/// Fails every kernel call of a batched pass in turn: every store unchanged each time,
/// then the clean bits.
struct BatchKernelFaults;

impl PerBackend for BatchKernelFaults {
    fn run<B: Backend>(&self, inner: B) {
        let backend = FailingBackend::new(inner);
        let model = tiny_llama(&tiny(DType::Q8_0, 1), &backend).with_activations(Activations::Q8);
        let mut stores = four_stores(&model, 256);
        let clean = {
            let mut probe: Vec<GrowKv> = stores.iter().map(|kv| kv.fork().unwrap()).collect();
            let mut refs: Vec<&mut GrowKv> = probe.iter_mut().collect();
            backend.arm(0);
            all_bits(&batch(&model, &mut refs, &four_steps()).unwrap())
        };
        let calls = backend.calls();
        assert!(calls > 40, "{calls} kernel calls");
        let before: Vec<Snapshot> = stores.iter().map(snapshot).collect();
        for k in 1..=calls {
            backend.arm(k);
            let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
            let err = batch(&model, &mut refs, &four_steps()).unwrap_err();
            assert!(
                matches!(&err, ModelError::Shape(e) if *e == INJECTED),
                "call {k}: {err}"
            );
            let after: Vec<Snapshot> = stores.iter().map(snapshot).collect();
            assert_eq!(after, before, "call {k} of {calls}");
        }
        backend.arm(0);
        let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
        assert_eq!(
            all_bits(&batch(&model, &mut refs, &four_steps()).unwrap()),
            clean
        );
    }
}

#[test]
fn a_kernel_error_at_any_call_of_a_batch_changes_no_store() {
    scalar_and_simd(&BatchKernelFaults);
}

#[test]
fn empty_batches_and_empty_sequences_change_nothing() {
    let model = tiny_llama(&tiny(DType::F32, 0), Scalar::new());
    let none: &mut [BatchSeq<'_, GrowKv>] = &mut [];
    assert!(model.forward_batch(none).unwrap().is_empty());
    let mut stores = four_stores(&model, 256);
    let before: Vec<Snapshot> = stores.iter().map(snapshot).collect();
    // No sequence brings tokens: nothing runs.
    let steps: Vec<Step> = [Logits::All, Logits::Last, Logits::None, Logits::Last]
        .into_iter()
        .map(|logits| Step {
            tokens: vec![],
            logits,
        })
        .collect();
    let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
    let out = batch(&model, &mut refs, &steps).unwrap();
    assert!(out.iter().all(|a| a.dim() == (0, 90)));
    let after: Vec<Snapshot> = stores.iter().map(snapshot).collect();
    assert_eq!(after, before);
    // One sequence without tokens beside others: it is untouched, the others run.
    let mut steps = four_steps();
    steps[1].tokens.clear();
    let mut refs: Vec<&mut GrowKv> = stores.iter_mut().collect();
    let out = batch(&model, &mut refs, &steps).unwrap();
    assert_eq!(out[1].dim(), (0, 90));
    assert_eq!(out[0].dim(), (7, 90));
    assert_eq!(out[2].dim(), (1, 90));
    assert_eq!(out[3].dim(), (0, 90));
    assert_eq!(snapshot(&stores[1]), before[1]);
    assert_eq!(stores[2].len(), before[2].len + 12);
    assert_eq!(stores[3].len(), before[3].len + 2);
}

/// Stores of different kinds in one batch, as trait objects.
#[test]
fn a_batch_of_boxed_stores_of_different_kinds() {
    let model = tiny_llama(&tiny(DType::Q8_0, 3), Scalar::new());
    let g = model.kv_geometry();
    let mut stores: Vec<Box<dyn KvStore>> = vec![
        Box::new(GrowKv::new(g, 128).unwrap()),
        Box::new(DenseKv::new(g, 128).unwrap()),
        model.new_kv(128).unwrap(),
    ];
    let mut alone: Vec<Box<dyn KvStore>> =
        stores.iter().map(|kv| kv.fork_boxed().unwrap()).collect();
    let steps = &four_steps()[..3];
    let mut seqs: Vec<BatchSeq<'_, dyn KvStore>> = stores
        .iter_mut()
        .zip(steps)
        .map(|(kv, s)| BatchSeq::new(kv.as_mut(), &s.tokens, s.logits))
        .collect();
    let got = model.forward_batch(&mut seqs).unwrap();
    for ((kv, s), got) in alone.iter_mut().zip(steps).zip(&got) {
        let want = model.forward(kv.as_mut(), &s.tokens, s.logits).unwrap();
        assert_eq!(got.dim(), want.dim());
        assert_eq!(bits(got.iter().copied()), bits(want.iter().copied()));
    }
    for (b, a) in stores.iter().zip(&alone) {
        assert!(same_rows(&snapshot(b.as_ref()), &snapshot(a.as_ref())));
    }
}
