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
//!   truncations and diverging turns (`window_gemma3.rs`'s) on a session keeping
//!   checkpoints every 4 positions, bitwise a dense session given the same passes after
//!   every step; a failed prefill of each diverging turn leaves it unchanged.

use crate::common::*;
use crate::window_gemma3::{bits, long_prompt, op, replay, state, windowed};
use kvcore::kv::Checkpoints;
use kvcore::{DenseKv, KvStore, Session};
use kvcore_simd::Simd;
use proptest::prelude::*;
use std::num::NonZeroUsize;

fn every(k: usize, count: usize) -> Checkpoints {
    Checkpoints {
        every: NonZeroUsize::new(k).unwrap(),
        count,
    }
}

#[test]
fn gemma3_rewinds_behind_its_window_to_a_checkpoint_bitwise() {
    let model = load_gemma3(Simd::new());
    let c = model.config().clone();
    let window = c.layers[0].window.expect("layer 0 is a window layer");
    let (ids, greedy) = long_prompt();
    assert!(ids.len() > window + 170);
    let ctx = 1024;
    let k = 128;

    // The prompt in one pass: checkpoints at the multiples of 128 inside it.
    let mut ws = Session::new(windowed(&model, ctx).with_checkpoints(every(k, 8)));
    let mut ds = Session::new(DenseKv::new(model.kv_geometry(), ctx).unwrap());
    let a = ws.prefill(&model, &ids).unwrap();
    let b = ds.prefill(&model, &ids).unwrap();
    assert_eq!(bits(&a.logits), bits(&b.logits));
    assert_eq!(ws.kv().checkpoint_positions(), [128, 256, 384, 512, 640]);
    let plain = windowed(&model, ctx);
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
    let mut fresh = Session::new(windowed(&model, ctx));
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_conversations_with_checkpoints_are_bitwise_the_dense_store(
        ops in prop::collection::vec(op(), 1..24),
        count in 1usize..4,
    ) {
        replay(&ops, every(4, count))?;
    }
}
