//! Forward passes are transactions on the KV store: a pass that fails at any point — an
//! allocation the store is refused (an [`AllocGate`] refusing the `k`-th allocation),
//! a kernel's shape error at any of the pass's calls (a backend failing its `k`-th
//! call), a context overflow — returns the error and leaves the store exactly as it was:
//! same `len`, same capacity and `bytes()`, the same bits in every readable row. Retried
//! without the fault, the pass then gives bit for bit the logits of a run that never
//! failed. Also: the store as a trait object (`Box<dyn KvStore>`) runs the same passes
//! with the same bits, and a store refusal inside `GrowKv` changes nothing.

use std::sync::Arc;

use kvcore::gguf::GgufFile;
use kvcore::kv::AllocGate;
use kvcore::model::{Llama, Logits, ModelError};
use kvcore::{Backend, DType, DenseKv, GrowKv, KvError, KvStore, Session};
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::faults::{FailingBackend, INJECTED, RefuseNth};
use kvcore_test_support::tiny::TinyLlama;

use crate::common;
use crate::common::kv_snapshot as snapshot;

/// Four layers, so a fault can land in the middle of the pass.
fn tiny() -> TinyLlama {
    TinyLlama {
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        ffn_dim: 48,
        vocab_size: 80,
        context_len: 256,
        dtype: DType::Q8_0,
        seed: 11,
        untied_output: false,
    }
}

fn model<B: Backend>(backend: B) -> Llama<B> {
    let spec = TinyLlama {
        dtype: DType::F32,
        ..tiny()
    };
    Llama::load(GgufFile::from_bytes(spec.to_gguf()).unwrap(), backend).unwrap()
}

fn bits(a: &kvcore::ndarray::Array2<f32>) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// One pass of the scripted run: the tokens and where they start (`None`: at the end).
struct Pass {
    at: Option<usize>,
    tokens: Vec<u32>,
}

/// Prefill across the growth boundaries (initial capacity 4), decode steps, a tail
/// replacement that grows, a replacement inside the capacity, and one that starts at 0.
fn script() -> Vec<Pass> {
    let ids = |n: usize, salt: u32| (0..n as u32).map(|i| (i * 7 + salt) % 80).collect();
    vec![
        Pass {
            at: None,
            tokens: ids(6, 1),
        },
        Pass {
            at: None,
            tokens: vec![3],
        },
        Pass {
            at: None,
            tokens: vec![9],
        },
        Pass {
            at: Some(5),
            tokens: ids(20, 2),
        },
        Pass {
            at: Some(20),
            tokens: ids(3, 3),
        },
        Pass {
            at: None,
            tokens: ids(40, 4),
        },
        Pass {
            at: Some(0),
            tokens: ids(9, 5),
        },
    ]
}

fn run_pass<B: Backend, K: KvStore + ?Sized>(
    model: &Llama<B>,
    kv: &mut K,
    pass: &Pass,
) -> Result<kvcore::ndarray::Array2<f32>, ModelError> {
    let at = pass.at.unwrap_or(kv.len());
    model.forward_from(kv, at, &pass.tokens, Logits::All)
}

/// The logits of every pass of the script on a store that never fails.
fn clean_run<B: Backend>(model: &Llama<B>) -> Vec<Vec<u32>> {
    let mut kv = GrowKv::with_initial_capacity(model.kv_geometry(), 256, 4).unwrap();
    script()
        .iter()
        .map(|p| bits(&run_pass(model, &mut kv, p).unwrap()))
        .collect()
}

#[test]
fn a_refused_allocation_anywhere_leaves_the_store_as_it_was() {
    let model = model(Scalar::new());
    let want = clean_run(&model);
    // Count the allocations of a clean run, then refuse each in turn.
    let counting = Arc::new(RefuseNth::new(0));
    let mut kv = GrowKv::with_initial_capacity(model.kv_geometry(), 256, 4).unwrap();
    kv.set_alloc_gate(Some(counting.clone() as Arc<dyn AllocGate>));
    for p in &script() {
        run_pass(&model, &mut kv, p).unwrap();
    }
    let total = counting.calls();
    assert!(total >= 8, "the script allocates ({total} allocations)");
    for k in 1..=total {
        let gate = Arc::new(RefuseNth::new(k));
        let mut kv = GrowKv::with_initial_capacity(model.kv_geometry(), 256, 4).unwrap();
        kv.set_alloc_gate(Some(gate.clone() as Arc<dyn AllocGate>));
        let mut failures = 0;
        for (i, p) in script().iter().enumerate() {
            let before = snapshot(&kv);
            let logits = match run_pass(&model, &mut kv, p) {
                Ok(logits) => logits,
                Err(e) => {
                    assert!(
                        matches!(e, ModelError::Kv(KvError::AllocFailed { .. })),
                        "allocation {k}, pass {i}: {e}"
                    );
                    assert_eq!(snapshot(&kv), before, "allocation {k}, pass {i}");
                    failures += 1;
                    run_pass(&model, &mut kv, p).unwrap()
                }
            };
            assert_eq!(bits(&logits), want[i], "allocation {k}, pass {i}");
        }
        assert_eq!(failures, 1, "allocation {k} refused once");
    }
}

/// Fails every kernel call of every pass of the script in turn, on `inner`.
struct KernelFaults;

impl common::PerBackend for KernelFaults {
    fn run<B: Backend>(&self, inner: B) {
        let backend = FailingBackend::new(inner);
        let name = backend.name();
        let model = model(&backend);
        let want = clean_run(&model);
        let mut kv = GrowKv::with_initial_capacity(model.kv_geometry(), 256, 4).unwrap();
        for (i, p) in script().iter().enumerate() {
            // Count the pass's kernel calls on a copy, then fail each one in turn.
            let mut probe = kv.fork().unwrap();
            backend.arm(0);
            run_pass(&model, &mut probe, p).unwrap();
            let calls = backend.calls();
            for k in 1..=calls {
                backend.arm(k);
                let before = snapshot(&kv);
                let err = run_pass(&model, &mut kv, p).unwrap_err();
                assert!(
                    matches!(&err, ModelError::Shape(e) if *e == INJECTED),
                    "{name} pass {i} call {k}: {err}"
                );
                assert_eq!(
                    snapshot(&kv),
                    before,
                    "{name} pass {i}, call {k} of {calls}"
                );
            }
            backend.arm(0);
            let logits = run_pass(&model, &mut kv, p).unwrap();
            assert_eq!(bits(&logits), want[i], "{name} pass {i}");
        }
    }
}

#[test]
fn a_kernel_error_at_any_call_leaves_the_store_as_it_was() {
    common::scalar_and_simd(&KernelFaults);
}

/// SmolLM2: a decode step whose kernel fails in layer 17 of 30, and a prefill refused
/// its growth, leave a 100-position cache exactly as it was.
#[test]
fn smollm2_failed_passes_change_nothing() {
    let backend = FailingBackend::new(Simd::new());
    let model = Llama::load(common::smollm2_file(), &backend).unwrap();
    let prompt = common::ids(&common::reference_logits()[1]["prompt_ids"]);
    let mut kv = GrowKv::new(model.kv_geometry(), 8192).unwrap();
    let filler: Vec<u32> = (0..100).map(|i| prompt[i % prompt.len()]).collect();
    model.forward(&mut kv, &filler, Logits::None).unwrap();
    // Calls of one decode step: the embedding, 30 layers of the same calls, the head.
    let mut probe = kv.fork().unwrap();
    backend.arm(0);
    let want = model
        .forward(&mut probe, &[prompt[3]], Logits::Last)
        .unwrap();
    let calls = backend.calls();
    let per_layer = (calls - 1 - 2) / 30; // embed_row; final rms_norm and output gemv
    assert_eq!(1 + 30 * per_layer + 2, calls);
    let before = snapshot(&kv);
    backend.arm(1 + 17 * per_layer + per_layer / 2);
    let err = model
        .forward(&mut kv, &[prompt[3]], Logits::Last)
        .unwrap_err();
    assert!(
        matches!(&err, ModelError::Shape(e) if *e == INJECTED),
        "{err}"
    );
    assert_eq!(snapshot(&kv), before);
    // A prefill that needs 128 positions is refused its growth.
    kv.set_alloc_gate(Some(Arc::new(RefuseNth::new(2))));
    backend.arm(0);
    let err = model
        .forward(&mut kv, &filler[..40], Logits::Last)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Kv(KvError::AllocFailed { .. })),
        "{err}"
    );
    assert_eq!(snapshot(&kv), before);
    kv.set_alloc_gate(None);
    let got = model.forward(&mut kv, &[prompt[3]], Logits::Last).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn an_overflowing_or_out_of_vocabulary_pass_changes_nothing() {
    let model = model(Scalar::new());
    let mut kv = DenseKv::new(model.kv_geometry(), 10).unwrap();
    model
        .forward(&mut kv, &[1, 2, 3, 4, 5, 6], Logits::None)
        .unwrap();
    let before = snapshot(&kv);
    let err = model.forward(&mut kv, &[1; 5], Logits::Last).unwrap_err();
    common::assert_context_overflow(&err, 10, 10);
    let err = model.forward(&mut kv, &[1, 80], Logits::Last).unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { id: 80, .. }));
    let err = model
        .forward_from(&mut kv, 7, &[1], Logits::Last)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Kv(KvError::StartPastEnd { at: 7, len: 6 })),
        "{err}"
    );
    assert_eq!(snapshot(&kv), before);
}

/// A session on `Box<dyn KvStore>` (what an embedder behind a C ABI holds) computes
/// the same bits as one on the concrete store, and forks through the box.
#[test]
fn a_boxed_store_runs_the_same_passes() {
    let model = model(Simd::new());
    let g = model.kv_geometry();
    let mut concrete = Session::new(GrowKv::new(g, 256).unwrap());
    let boxed: Box<dyn KvStore> = Box::new(GrowKv::new(g, 256).unwrap());
    let mut boxed = Session::new(boxed);
    for (i, ids) in [&[1u32, 2, 3, 4][..], &[1, 2, 3, 4, 5, 6], &[1, 2, 7]]
        .iter()
        .enumerate()
    {
        let a = concrete.prefill(&model, ids).unwrap();
        let b = boxed.prefill(&model, ids).unwrap();
        assert_eq!(a, b, "turn {i}");
    }
    let fork = boxed.fork().unwrap();
    assert_eq!(fork.tokens(), boxed.tokens());
    assert_eq!(snapshot(fork.kv()), snapshot(boxed.kv()));
    assert_eq!(snapshot(concrete.kv()), snapshot(boxed.kv()));
}
