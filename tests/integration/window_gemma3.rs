//! The proof that the sliding-window store is exact: Gemma 3 on a `WindowKv` (window
//! layers keep only their last `window` positions) gives bitwise the logits of a
//! `DenseKv` (every position kept, the window applied only as attention's mask).
//!
//! - Real model (`long-gpl2`: 697 prompt positions, past the 512 window): one-pass
//!   prefill of every position, 24 decode steps after it, a prefill in three chunks that
//!   cross the window edge, and a save/restore of the windowed session in the middle;
//!   the windowed cache is a fraction of the dense one, and a rewind behind the window
//!   is refused.
//! - Tiny random Gemma 3 (window 5, six layers: five window layers and a global one):
//!   random sequences of prefills of any length, decode steps, truncations within the
//!   rewind limit and diverging turns through `Session`, bitwise after every step.
//! - The model refuses a store whose window is smaller than what a layer sees.

use crate::common::*;
use kvcore::gguf::GgufFile;
use kvcore::kv::{Checkpoints, KvGeometry};
use kvcore::model::{Llama, Logits, ModelError};
use kvcore::ndarray::Array2;
use kvcore::{DType, DenseKv, KvError, KvStore, Session, WindowKv};
use kvcore_simd::Simd;
use kvcore_test_support::tiny::TinyLlama;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

pub(crate) fn bits(a: &[f32]) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

fn same_rows(a: &Array2<f32>, b: &Array2<f32>, what: &str) {
    assert_eq!(a.dim(), b.dim(), "{what}: shapes");
    for (p, (ra, rb)) in a.rows().into_iter().zip(b.rows()).enumerate() {
        assert!(
            ra.iter().zip(rb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: row {p} differs"
        );
    }
}

pub(crate) fn windowed<B: kvcore::Backend>(m: &Llama<B>, ctx: usize) -> WindowKv {
    WindowKv::new(m.kv_geometry(), ctx, &m.config().windows()).unwrap()
}

#[test]
fn gemma3_on_a_window_store_is_bitwise_the_dense_store() {
    let model = load_gemma3(Simd::new());
    let c = model.config().clone();
    let window = c.layers[0].window.expect("layer 0 is a window layer");
    let (ids, greedy) = long_prompt();
    assert!(ids.len() > window + 100);
    let ctx = 1024;

    // One-pass prefill of every position, then decode steps.
    let mut win = windowed(&model, ctx);
    let mut dense = DenseKv::new(model.kv_geometry(), ctx).unwrap();
    let a = model.forward(&mut win, &ids, Logits::All).unwrap();
    let b = model.forward(&mut dense, &ids, Logits::All).unwrap();
    same_rows(&a, &b, "prefill");
    for (i, &id) in greedy.iter().enumerate() {
        let a = model.forward(&mut win, &[id], Logits::Last).unwrap();
        let b = model.forward(&mut dense, &[id], Logits::Last).unwrap();
        same_rows(&a, &b, &format!("decode step {i}"));
    }
    // 15 window layers hold 512 positions, 3 global layers all 721 (in a capacity of
    // 1024, as GrowKv's growth rule gives), against 18 × 1024 for the dense store.
    let row = 2 * c.kv_dim() * 4;
    assert_eq!(win.bytes(), (15 * window + 3 * 1024) * row);
    assert_eq!(dense.bytes(), 18 * ctx * row);

    // Rewinding behind the window: refused, nothing changes; the last position can be
    // replaced.
    let len = win.len();
    assert!(matches!(
        win.truncate(len - 2),
        Err(KvError::BehindWindow { .. })
    ));
    assert_eq!(win.len(), len);
    let a = model
        .forward_from(&mut win, len - 1, &[greedy[0]], Logits::Last)
        .unwrap();
    let b = model
        .forward_from(&mut dense, len - 1, &[greedy[0]], Logits::Last)
        .unwrap();
    same_rows(&a, &b, "the last position replaced");

    // A prefill in chunks that cross the window edge, with a save and restore of the
    // windowed session between chunks.
    let dir = std::env::temp_dir().join(format!("kvcore-window-gemma3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("win.session");
    let mut ws = Session::new(windowed(&model, ctx));
    let mut ds = Session::new(DenseKv::new(model.kv_geometry(), ctx).unwrap());
    for (k, end) in [300, 600, ids.len()].into_iter().enumerate() {
        let a = ws.prefill(&model, &ids[..end]).unwrap();
        let b = ds.prefill(&model, &ids[..end]).unwrap();
        assert_eq!(bits(&a.logits), bits(&b.logits), "chunk {k}");
        assert_eq!(a.reused, b.reused);
        if k == 1 {
            ws.save(&model, &file).unwrap();
            let mut restored = Session::new(windowed(&model, ctx));
            restored.restore(&model, &file).unwrap();
            assert_eq!(restored.tokens(), ws.tokens());
            ws = restored;
        }
    }
    let saved = std::fs::metadata(&file).unwrap().len() as usize;
    // The file holds 600 ids, 15 layers × 512 rows and 3 × 600 (plus headers).
    assert!(
        saved < (15 * window + 3 * 600) * row + 600 * 4 + 4096,
        "{saved} bytes"
    );
    for &id in &greedy[..4] {
        let a = ws.decode(&model, id).unwrap();
        let b = ds.decode(&model, id).unwrap();
        assert_eq!(bits(&a), bits(&b));
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The ids of Gemma 3's long reference prompt (`long-gpl2`, 697 positions, past the
/// 512 window) and of its greedy continuation.
pub(crate) fn long_prompt() -> (Vec<u32>, Vec<u32>) {
    let prompt = prompts("gemma3-270m-q4_k_m")
        .into_iter()
        .find(|p| p["name"] == "long-gpl2")
        .expect("the long reference prompt");
    (ids(&prompt["prompt_ids"]), ids(&prompt["greedy_ids"]))
}

/// The cache of Gemma 3 270M's geometry at 512, 4096 and 32 768 positions: a `WindowKv`
/// holds 15 layers × min(n, 512) + 3 layers × capacity(n); a store keeping every layer's
/// positions 18 × capacity(n). BENCHMARKS.md quotes the figures this prints.
#[test]
fn window_store_bytes_at_depth() {
    let g = KvGeometry {
        n_layers: 18,
        n_kv_heads: 1,
        head_dim: 256,
    };
    let windows: Vec<Option<usize>> = (0..18).map(|l| (l % 6 < 5).then_some(512)).collect();
    let max_ctx = 32_768;
    let mut kv = WindowKv::new(g, max_ctx, &windows).unwrap();
    let row = 2 * 256 * 4;
    let chunk = Array2::<f32>::zeros((512, 256));
    let mut reported = Vec::new();
    for target in [512usize, 4096, 32_768] {
        while kv.len() < target {
            let at = kv.len();
            kv.begin(at, 512).unwrap();
            for layer in 0..18 {
                kv.write(layer, chunk.view(), chunk.view()).unwrap();
            }
            kv.commit().unwrap();
        }
        let full = 18 * target * row; // GrowKv's capacity is `target` here (a power of two)
        assert_eq!(kv.bytes(), (15 * 512 + 3 * target) * row, "at {target}");
        reported.push(format!(
            "{target}: window {:.1} MiB, all layers {:.1} MiB, ratio {:.3}",
            kv.bytes() as f64 / (1 << 20) as f64,
            full as f64 / (1 << 20) as f64,
            kv.bytes() as f64 / full as f64
        ));
    }
    eprintln!("{}", reported.join("\n"));
}

#[test]
fn a_store_window_smaller_than_the_layers_is_refused() {
    let model = tiny_model();
    let c = model.config();
    let mut small: Vec<Option<usize>> = c.windows();
    small[0] = Some(4); // the model's window is 5
    let mut kv = WindowKv::new(model.kv_geometry(), 64, &small).unwrap();
    let err = model
        .forward(&mut kv, &[1, 2, 3], Logits::Last)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::KvWindow {
                layer: 0,
                store: 4,
                model: Some(5)
            }
        ),
        "{err}"
    );
    // A window on the global layer (5) is refused too: it sees every past position.
    let mut on_global = c.windows();
    on_global[5] = Some(1000);
    let mut kv = WindowKv::new(model.kv_geometry(), 64, &on_global).unwrap();
    let err = model.forward(&mut kv, &[1], Logits::Last).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::KvWindow {
                layer: 5,
                model: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(kv.is_empty());
}

pub(crate) fn tiny_model() -> Llama<Simd> {
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
pub(crate) enum Op {
    /// Prefill the conversation so far plus `n` new ids (one pass of the new part).
    Turn(usize, u32),
    /// Decode one id.
    Decode(u32),
    /// Go back `k` positions (when the windowed store can; the dense one always can).
    Back(usize),
    /// A turn that rewrites the conversation from `keep` positions on with `n` new ids.
    Diverge(usize, usize, u32),
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..14, 0u32..50).prop_map(|(n, s)| Op::Turn(n, s)),
        (0u32..50).prop_map(Op::Decode),
        (1usize..4).prop_map(Op::Back),
        (0usize..40, 1usize..6, 0u32..50).prop_map(|(k, n, s)| Op::Diverge(k, n, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_conversations_are_bitwise_the_dense_store(ops in prop::collection::vec(op(), 1..24)) {
        replay(&ops, Checkpoints::NONE)?;
    }
}

/// What a refused call must leave as it was.
pub(crate) fn state(s: &Session<WindowKv>) -> (Vec<u32>, usize, Vec<usize>) {
    (
        s.tokens().to_vec(),
        s.kv().bytes(),
        s.kv().checkpoint_positions(),
    )
}

/// Replays `ops` on a session of the tiny model over a windowed store keeping
/// `checkpoints` and on one over a dense store given the same passes: bitwise alike after
/// every step; every refused call changes nothing; at most `checkpoints.count` are kept,
/// each at a multiple of `checkpoints.every`.
pub(crate) fn replay(ops: &[Op], checkpoints: Checkpoints) -> Result<(), TestCaseError> {
    let model = tiny_model();
    let ctx = 64;
    let mut ws = Session::new(windowed(&model, ctx).with_checkpoints(checkpoints));
    let mut ds = Session::new(DenseKv::new(model.kv_geometry(), ctx).unwrap());
    let fresh = |n: usize, s: u32| (0..n as u32).map(|i| (i * 13 + s) % 50).collect::<Vec<_>>();
    for op in ops.iter().cloned() {
        match op {
            Op::Turn(n, _) | Op::Diverge(_, n, _) if ds.len() + n > ctx => {}
            Op::Turn(n, s) => {
                let mut all = ds.tokens().to_vec();
                all.extend(fresh(n, s));
                let a = ws.prefill(&model, &all).unwrap();
                let b = ds.prefill(&model, &all).unwrap();
                prop_assert_eq!(bits(&a.logits), bits(&b.logits));
            }
            Op::Diverge(keep, n, s) => {
                let keep = keep.min(ds.len());
                let mut all = ds.tokens()[..keep].to_vec();
                all.extend(fresh(n, s + 1));
                // Behind the rewind limit the windowed session goes back to its rewind
                // point (a checkpoint, or 0) and prefills from there; the dense one is
                // made to do the same, so both run the same passes (a different split
                // would change the matmuls' rounding).
                let common = ws.common_prefix(&all).min(all.len() - 1);
                let behind = !ws.kv().can_rewind_to(common);
                let m = ws.rewind_point(common);
                prop_assert!(ws.kv().can_rewind_to(m) && m <= common);
                // The same turn with an id outside the vocabulary fails, changing nothing.
                let before = state(&ws);
                let mut bad = all.clone();
                *bad.last_mut().unwrap() = 50;
                prop_assert!(ws.prefill(&model, &bad).is_err());
                prop_assert_eq!(state(&ws), before);
                ds.truncate(m).unwrap();
                let a = ws.prefill(&model, &all).unwrap();
                let b = ds.prefill(&model, &all).unwrap();
                prop_assert_eq!(bits(&a.logits), bits(&b.logits));
                prop_assert_eq!(ws.tokens(), ds.tokens());
                prop_assert_eq!(a.reused, b.reused);
                prop_assert_eq!(a.reused, m);
                prop_assert!(!behind || a.reused == 0 || checkpoints.count > 0);
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
                    let refused = matches!(ws.truncate(n), Err(KvError::BehindWindow { .. }));
                    prop_assert!(refused, "truncate({}) behind the window", n);
                    prop_assert_eq!(state(&ws), before);
                }
            }
        }
        prop_assert_eq!(ws.tokens(), ds.tokens());
        let kept = ws.kv().checkpoint_positions();
        prop_assert!(kept.len() <= checkpoints.count);
        let every = checkpoints.every.get();
        prop_assert!(kept.iter().all(|&p| p % every == 0 && p <= ws.len()));
    }
    Ok(())
}
