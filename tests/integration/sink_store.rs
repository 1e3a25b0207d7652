//! The sink store, `SinkKv` (attention sinks beside a window, StreamingLLM's rule):
//! - its contract against a `DenseKv` over the differential scenarios
//!   (`kv_diff::sink::run`: every position a query sees, the dense store's bytes, scored
//!   right, bounded memory, transactions, rewinds, forks);
//! - the distances RoPE sees: for every query and every key it sees, the scored query
//!   position less the key's stored position is their distance in StreamingLLM's
//!   re-rotated cache (the sinks, then the window, counted from 0);
//! - the model over it equals, bit for bit, the model over a dense reference that keeps
//!   every position and scores the same positions (`SinkKv::over` a `DenseKv`, whose
//!   window part evicts nothing), on the scalar and SIMD
//!   backends, for random chunkings and element types;
//! - before anything is evicted it is the dense model (within rounding: the attention is
//!   folded from two parts), and its bytes stop growing once full.

use kvcore::backend::{Backend, DType, Mask};
use kvcore::gguf::GgufFile;
use kvcore::kv::{DenseKv, KvGeometry, KvStore, KvType, SinkKv};
use kvcore::model::{Llama, Logits};
use kvcore::ndarray::Array2;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::kv_diff::sink;
use kvcore_test_support::kv_diff::suite::{Family, check, config};
use kvcore_test_support::tiny::TinyLlama;
use proptest::prelude::*;

/// Every family of the differential scenarios (plain, windowed, typed, key offsets).
#[test]
fn sink_store_matches_the_dense_store_on_every_family() {
    for family in Family::ALL {
        check(family, config(128), sink::run);
    }
}

/// The reference: a `DenseKv` keeping every position, scored as a sink store's view.
type DenseSinks = SinkKv<DenseKv>;

/// StreamingLLM's cache for a query at `p`: the sinks it sees, then its window, each
/// key's index in it being its re-rotated position.
fn streaming_cache(p: usize, keep: usize, w: usize) -> Vec<usize> {
    (0..keep.min(p + 1))
        .chain(keep.max((p + 1).saturating_sub(w))..=p)
        .collect()
}

/// Every query of every append sees exactly StreamingLLM's cache, each key at the
/// distance the re-rotated cache puts it.
#[test]
fn a_query_sees_streaming_llms_cache_at_its_distances() {
    let g = KvGeometry {
        n_layers: 1,
        n_kv_heads: 1,
        head_dim: 2,
    };
    for (keep, w) in [(4, 8), (0, 5), (1, 1), (3, 20), (6, 2)] {
        let mut kv = SinkKv::new(g, 10_000, keep, w).unwrap();
        for (i, n) in [1, 3, 17, 1, 1, 40, 2, 1, 9, 1]
            .into_iter()
            .cycle()
            .take(30)
            .enumerate()
        {
            let at = kv.len();
            let rows = Array2::from_elem((n, 2), i as f32);
            kv.begin(at, n).unwrap();
            kv.write(0, rows.view(), rows.view()).unwrap();
            let view = kv.view(0).unwrap();
            for p in at..at + n {
                let cache = streaming_cache(p, keep, w);
                let (mut seen, mut distances) = (Vec::new(), Vec::new());
                for s in view.segments() {
                    let scoring = s.scoring();
                    let q = scoring.query_pos(p);
                    let mask = scoring.mask.unwrap_or(Mask::Causal);
                    for slot in s.visible(q, mask) {
                        let k = s.start() + slot;
                        seen.push(k);
                        distances.push(q - k);
                    }
                }
                assert_eq!(seen, cache, "keep {keep} w {w}: query {p} sees");
                let want: Vec<usize> = (0..cache.len()).map(|i| cache.len() - 1 - i).collect();
                assert_eq!(distances, want, "keep {keep} w {w}: query {p}'s distances");
            }
            kv.commit().unwrap();
        }
        assert!(kv.bytes() <= (keep + w) * 2 * 2 * 4, "keep {keep} w {w}");
    }
}

fn tiny(seed: u64) -> TinyLlama {
    TinyLlama {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
        ffn_dim: 64,
        vocab_size: 64,
        context_len: 4096,
        dtype: DType::F32,
        seed,
        untied_output: false,
    }
}

fn model<B: Backend>(seed: u64, backend: B) -> Llama<B> {
    Llama::load(GgufFile::from_bytes(tiny(seed).to_gguf()).unwrap(), backend).unwrap()
}

fn bits(a: &Array2<f32>) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// The logits of every chunk, run one after another on `kv`.
fn feed<B: Backend, K: KvStore>(
    model: &Llama<B>,
    kv: &mut K,
    chunks: &[Vec<u32>],
) -> Vec<Array2<f32>> {
    chunks
        .iter()
        .map(|c| model.forward(kv, c, Logits::All).expect("forward"))
        .collect()
}

/// The sink store and its dense reference for `model`, sinks `keep`, window `w`, K/V
/// types `types` (keys through the model's codec).
fn stores<B: Backend>(
    model: &Llama<B>,
    keep: usize,
    w: usize,
    types: (KvType, KvType),
) -> (SinkKv, DenseSinks) {
    let max_ctx = 1024;
    let codec = model.key_codec(types.0, max_ctx).unwrap();
    let g = model.kv_geometry();
    let sink = SinkKv::with_types(g, max_ctx, keep, w, types)
        .unwrap()
        .with_key_codec(&codec)
        .unwrap();
    let dense = DenseKv::with_types(g, max_ctx, types)
        .unwrap()
        .with_key_codec(&codec)
        .unwrap();
    (sink, SinkKv::over(dense, keep, w).unwrap())
}

fn compare<B: Backend>(
    backend: B,
    seed: u64,
    keep: usize,
    w: usize,
    types: (KvType, KvType),
    chunks: &[Vec<u32>],
) {
    let model = model(seed, backend);
    let (mut sink, mut dense) = stores(&model, keep, w, types);
    let (got, want) = (
        feed(&model, &mut sink, chunks),
        feed(&model, &mut dense, chunks),
    );
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            bits(a),
            bits(b),
            "{} keep {keep} w {w} {types:?}: chunk {i} of {:?}",
            model.backend().name(),
            chunks.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
}

fn kv_types() -> impl Strategy<Value = (KvType, KvType)> {
    prop_oneof![
        3 => Just((KvType::F32, KvType::F32)),
        1 => Just((KvType::F16, KvType::BF16)),
        1 => Just((KvType::Q8_0, KvType::Q8_0)),
    ]
}

fn chunks() -> impl Strategy<Value = Vec<Vec<u32>>> {
    let chunk = prop_oneof![
        3 => prop::collection::vec(0u32..64, 1..=2),
        1 => prop::collection::vec(0u32..64, 3..=40),
    ];
    prop::collection::vec(chunk, 1..=12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The model over a sink store equals, bit for bit, the model over a store keeping
    /// every position and scoring the same positions.
    #[test]
    fn the_model_over_sinks_is_the_dense_reference_bitwise(
        seed in 0u64..1000,
        keep in 0usize..=6,
        w in 1usize..=24,
        types in kv_types(),
        chunks in chunks(),
    ) {
        compare(Scalar, seed, keep, w, types, &chunks);
        compare(Simd::best(), seed, keep, w, types, &chunks);
    }
}

/// Until `keep + w` positions are held nothing is evicted: the sink store's model is the
/// dense model (its attention folded from two parts: within rounding).
#[test]
fn before_eviction_the_sink_store_is_the_dense_model() {
    let model = model(3, Simd::best());
    let (mut sink, _) = stores(&model, 4, 60, (KvType::F32, KvType::F32));
    let mut dense = model.new_grow_kv(1024).unwrap();
    let chunks: Vec<Vec<u32>> = vec![
        (0..20).collect(),
        vec![7],
        (20..50).map(|t| t % 64).collect(),
    ];
    let (got, want) = (
        feed(&model, &mut sink, &chunks),
        feed(&model, &mut dense, &chunks),
    );
    for (a, b) in got.iter().zip(&want) {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "logits differ by {worst}");
    }
}

/// Once full, decoding more positions allocates nothing: the bytes stay those of
/// `keep + w` positions per layer.
#[test]
fn the_bytes_stop_growing_once_the_cache_is_full() {
    let model = model(5, Simd::best());
    let (mut sink, _) = stores(&model, 4, 28, (KvType::F16, KvType::F16));
    let mut full = None;
    for t in 0..300u32 {
        model.forward(&mut sink, &[t % 64], Logits::Last).unwrap();
        if t == 40 {
            full = Some(sink.bytes());
        }
    }
    let g = model.kv_geometry();
    let position = 2 * KvType::F16.row_bytes(g.kv_dim()).unwrap();
    assert_eq!(Some(sink.bytes()), full);
    assert!(sink.bytes() <= g.n_layers * (4 + 28) * position);
    assert_eq!(sink.len(), 300);
}
