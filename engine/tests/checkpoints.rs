//! Sessions' stores keep window checkpoints (`KvChoice::new_session_store`): on a model
//! with sliding-window layers the growing store can then rewind to a checkpoint behind
//! the window, its bytes counting them; a count of 0, the dense store and a model
//! without windows are `new_store`'s stores.

use kvcore::gguf::GgufFile;
use kvcore::kv::Checkpoints;
use kvcore::model::Llama;
use kvcore::{DType, KvError, KvType, Session};
use kvcore_engine::KvChoice;
use kvcore_scalar::Scalar;
use kvcore_test_support::tiny::TinyLlama;
use std::num::NonZeroUsize;

const F32: (KvType, KvType) = (KvType::F32, KvType::F32);

fn tiny(gemma: bool) -> Llama<Scalar> {
    let spec = TinyLlama {
        n_layers: 6,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 4,
        ffn_dim: 24,
        vocab_size: 50,
        context_len: 64,
        dtype: DType::F32,
        seed: 11,
        untied_output: true,
    };
    let bytes = if gemma {
        spec.to_gemma3_gguf(5)
    } else {
        spec.to_gguf()
    };
    Llama::load(GgufFile::from_bytes(bytes).unwrap(), Scalar::new()).unwrap()
}

#[test]
fn a_session_store_of_a_windowed_model_rewinds_to_its_checkpoints() {
    let ids: Vec<u32> = (0..21).map(|i| (i * 7 + 1) % 50).collect();
    let every4 = Checkpoints {
        every: NonZeroUsize::new(4).unwrap(),
        count: 2,
    };
    let run = |model: &Llama<Scalar>, kv: KvChoice, c: Checkpoints| {
        let mut s = Session::new(kv.new_session_store(model, 64, F32, c).unwrap());
        s.prefill(model, &ids).unwrap();
        s
    };
    let gemma = tiny(true);
    let with = run(&gemma, KvChoice::Grow, every4);
    let without = run(&gemma, KvChoice::Grow, Checkpoints::NONE);
    // Window 5: behind position 17 only the checkpoints (16 and 20) can be rewound to.
    assert!(with.kv().can_rewind_to(16) && !with.kv().can_rewind_to(12));
    assert!(!without.kv().can_rewind_to(16));
    assert!(with.kv().bytes() > without.kv().bytes());
    assert_eq!(with.rewind_point(18), 16);
    assert_eq!(without.rewind_point(18), 0);
    let mut with = with;
    with.truncate(16).unwrap();
    assert_eq!(with.tokens(), &ids[..16]);
    let mut without = without;
    assert!(matches!(
        without.truncate(16),
        Err(KvError::BehindWindow { .. })
    ));
    // The dense store and a model without windows keep every position.
    let dense = run(&gemma, KvChoice::Dense, every4);
    assert!(dense.kv().can_rewind_to(12));
    let llama = tiny(false);
    let grow = run(&llama, KvChoice::Grow, every4);
    let plain = run(&llama, KvChoice::Grow, Checkpoints::NONE);
    assert_eq!(grow.kv().bytes(), plain.kv().bytes());
}
