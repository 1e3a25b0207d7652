//! Window checkpoints: a session over a sliding-window store that keeps snapshots of its
//! rings every `K` positions rewinds behind the window to the nearest one and
//! re-prefills only from there, bitwise as a full re-prefill with the same passes.
//!
//! - Real Gemma 3 (`long-gpl2`, 697 positions, window 512): the prompt in one pass takes
//!   checkpoints inside it; a new turn diverging behind the window goes back to the last
//!   checkpoint before the divergence; its logits and the decode steps after it are
//!   bitwise those of a fresh session prefilling the same ids in the same two passes,
//!   and of a dense session given the same calls. The checkpoints' bytes are in the
//!   store's, bounded by their count. A failed pass after such a rewind leaves the
//!   session as it was.
//! - Tiny random Gemma 3 (window 5): random conversations of prefills, decode steps,
//!   truncations and diverging turns on a session keeping checkpoints every 4 positions,
//!   bitwise a dense session given the same passes after every step; every failed
//!   prefill leaves it unchanged.

use crate::common::*;
use kvcore::gguf::GgufFile;
use kvcore::kv::Checkpoints;
use kvcore::model::Llama;
use kvcore::{DType, DenseKv, KvStore, Session, WindowKv};
use kvcore_simd::Simd;
use kvcore_test_support::tiny::TinyLlama;
use proptest::prelude::*;
use std::num::NonZeroUsize;

fn bits(a: &[f32]) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

fn every(k: usize, count: usize) -> Checkpoints {
    Checkpoints {
        every: NonZeroUsize::new(k).unwrap(),
        count,
    }
}

fn windowed<B: kvcore::Backend>(m: &Llama<B>, ctx: usize, c: Checkpoints) -> WindowKv {
    WindowKv::new(m.kv_geometry(), ctx, &m.config().windows())
        .unwrap()
        .with_checkpoints(c)
}

/// What a failed call must leave as it was.
fn state(s: &Session<WindowKv>) -> (Vec<u32>, usize, Vec<usize>) {
    (
        s.tokens().to_vec(),
        s.kv().bytes(),
        s.kv().checkpoint_positions(),
    )
}

#[test]
fn gemma3_rewinds_behind_its_window_to_a_checkpoint_bitwise() {
    let model = load_gemma3(Simd::new());
    let c = model.config().clone();
    let window = c.layers[0].window.expect("layer 0 is a window layer");
    let prompt = prompts("gemma3-270m-q4_k_m")
        .into_iter()
        .find(|p| p["name"] == "long-gpl2")
        .expect("the long reference prompt");
    let greedy = ids(&prompt["greedy_ids"]);
    let ids = ids(&prompt["prompt_ids"]);
    assert!(ids.len() > window + 170);
    let ctx = 1024;
    let k = 128;

    // The prompt in one pass: checkpoints at the multiples of 128 inside it.
    let mut ws = Session::new(windowed(&model, ctx, every(k, 8)));
    let mut ds = Session::new(DenseKv::new(model.kv_geometry(), ctx).unwrap());
    let a = ws.prefill(&model, &ids).unwrap();
    let b = ds.prefill(&model, &ids).unwrap();
    assert_eq!(bits(&a.logits), bits(&b.logits));
    assert_eq!(ws.kv().checkpoint_positions(), [128, 256, 384, 512, 640]);
    let plain = windowed(&model, ctx, Checkpoints::NONE);
    let row = 2 * c.kv_dim() * 4;
    let n_window = c.windows().iter().flatten().count();
    let held = n_window * window + 3 * 1024; // as in `window_gemma3.rs`
    // A checkpoint at p holds min(p, window − 1) positions of every window layer.
    let checkpoints = n_window * (128 + 256 + 384 + 511 + 511);
    assert_eq!(ws.kv().bytes(), (held + checkpoints) * row);
    assert!(plain.bytes() < ws.kv().bytes());

    // A new turn diverging at 170, behind the window (a query there sees 0..=170, which
    // the rings evicted): the session goes back to the checkpoint at 128.
    let mut turn = ids[..170].to_vec();
    turn.extend_from_slice(&ids[400..600]);
    let m = ws.rewind_point(ws.common_prefix(&turn));
    assert_eq!(m, 128);
    assert!(!ws.kv().can_rewind_to(170));

    // A failed pass from there (an id outside the vocabulary) changes nothing.
    let before = state(&ws);
    let mut bad = turn.clone();
    bad[300] = c.vocab_size as u32;
    assert!(ws.prefill(&model, &bad).is_err());
    assert_eq!(state(&ws), before);

    let a = ws.prefill(&model, &turn).unwrap();
    assert_eq!((a.reused, a.prefilled), (128, turn.len() - 128));
    assert_eq!(ws.kv().checkpoint_positions(), [128, 256]);
    // A fresh session given the same passes (0 .. 128, then the rest) and the dense
    // session given the same calls.
    let mut fresh = Session::new(windowed(&model, ctx, Checkpoints::NONE));
    fresh.prefill(&model, &turn[..128]).unwrap();
    let f = fresh.prefill(&model, &turn).unwrap();
    ds.truncate(128).unwrap();
    let d = ds.prefill(&model, &turn).unwrap();
    assert_eq!(
        bits(&a.logits),
        bits(&f.logits),
        "a fresh session, same passes"
    );
    assert_eq!(bits(&a.logits), bits(&d.logits), "the dense session");
    for &id in &greedy[..6] {
        let (x, y, z) = (
            ws.decode(&model, id).unwrap(),
            fresh.decode(&model, id).unwrap(),
            ds.decode(&model, id).unwrap(),
        );
        assert_eq!(bits(&x), bits(&y));
        assert_eq!(bits(&x), bits(&z));
    }
}

fn tiny_model() -> Llama<Simd> {
    let spec = TinyLlama {
        n_layers: 6,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        ffn_dim: 32,
        vocab_size: 50,
        context_len: 64,
        dtype: DType::F32,
        seed: 3,
        untied_output: false,
    };
    Llama::load(
        GgufFile::from_bytes(spec.to_gemma3_gguf(5)).unwrap(),
        Simd::new(),
    )
    .unwrap()
}

/// One step of a conversation.
#[derive(Clone, Debug)]
enum Op {
    /// Prefill the conversation so far plus `n` new ids (one pass of the new part).
    Turn(usize, u32),
    /// Decode one id.
    Decode(u32),
    /// Go back `k` positions (when the windowed store can; the dense one always can).
    Back(usize),
    /// A turn that rewrites the conversation from `keep` positions on with `n` new ids,
    /// or fails (an id outside the vocabulary) when `fail`.
    Diverge(usize, usize, u32, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..14, 0u32..50).prop_map(|(n, s)| Op::Turn(n, s)),
        (0u32..50).prop_map(Op::Decode),
        (1usize..4).prop_map(Op::Back),
        (0usize..40, 1usize..6, 0u32..50, prop::bool::weighted(0.2))
            .prop_map(|(k, n, s, f)| Op::Diverge(k, n, s, f)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_conversations_with_checkpoints_are_bitwise_the_dense_store(
        ops in prop::collection::vec(op(), 1..24),
        count in 1usize..4,
    ) {
        let model = tiny_model();
        let ctx = 64;
        let mut ws = Session::new(windowed(&model, ctx, every(4, count)));
        let mut ds = Session::new(DenseKv::new(model.kv_geometry(), ctx).unwrap());
        let fresh = |n: usize, s: u32| (0..n as u32).map(|i| (i * 13 + s) % 50).collect::<Vec<_>>();
        for op in ops {
            match op {
                Op::Turn(n, _) | Op::Diverge(_, n, _, _) if ds.len() + n > ctx => {}
                Op::Turn(n, s) => {
                    let mut all = ds.tokens().to_vec();
                    all.extend(fresh(n, s));
                    let a = ws.prefill(&model, &all).unwrap();
                    let b = ds.prefill(&model, &all).unwrap();
                    prop_assert_eq!(bits(&a.logits), bits(&b.logits));
                }
                Op::Diverge(keep, n, s, fail) => {
                    let keep = keep.min(ds.len());
                    let mut all = ds.tokens()[..keep].to_vec();
                    all.extend(fresh(n, s + 1));
                    // The windowed session goes back to its rewind point (a checkpoint
                    // behind the window, or 0); the dense one is made to do the same,
                    // so both run the same passes.
                    let m = ws.rewind_point(ws.common_prefix(&all).min(all.len() - 1));
                    prop_assert!(ws.kv().can_rewind_to(m));
                    if fail {
                        let before = state(&ws);
                        *all.last_mut().unwrap() = 50;
                        prop_assert!(ws.prefill(&model, &all).is_err());
                        prop_assert_eq!(state(&ws), before);
                        continue;
                    }
                    ds.truncate(m).unwrap();
                    let a = ws.prefill(&model, &all).unwrap();
                    let b = ds.prefill(&model, &all).unwrap();
                    prop_assert_eq!(bits(&a.logits), bits(&b.logits));
                    prop_assert_eq!(a.reused, m);
                    prop_assert_eq!(a.reused, b.reused);
                }
                Op::Decode(id) if ds.len() < ctx && !ds.is_empty() => {
                    let a = ws.decode(&model, id).unwrap();
                    let b = ds.decode(&model, id).unwrap();
                    prop_assert_eq!(bits(&a), bits(&b));
                }
                Op::Decode(_) => {}
                Op::Back(k) => {
                    let n = ds.len().saturating_sub(k);
                    if ws.kv().can_rewind_to(n) {
                        ws.truncate(n).unwrap();
                        ds.truncate(n).unwrap();
                    } else {
                        let before = state(&ws);
                        prop_assert!(ws.truncate(n).is_err());
                        prop_assert_eq!(state(&ws), before);
                    }
                }
            }
            prop_assert_eq!(ws.tokens(), ds.tokens());
            let kept = ws.kv().checkpoint_positions();
            prop_assert!(kept.len() <= count);
            prop_assert!(kept.iter().all(|p| p % 4 == 0 && *p <= ws.len()));
        }
    }
}
