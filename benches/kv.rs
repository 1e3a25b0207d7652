//! KV store append cost: `GrowKv` against the reference `DenseKv`, SmolLM2-135M geometry
//! (30 layers, `kv_dim` 192, `max_ctx` 8192).
//!
//! One iteration builds a store (DenseKv: its full 377.5 MB allocation; GrowKv: 64
//! positions) and appends `n` positions, writing the K and V row of every layer, the way
//! decoding fills the cache (one committed append per position); dropping the store is
//! included. Two lengths, 1024 and 8192,
//! show the scaling: amortised O(1) appends make GrowKv's time linear in `n`, with the
//! doubling copies adding at most about one extra write per float. Throughput is the K
//! and V bytes appended, `2 · 30 · n · 192 · 4`.
//!
//! Run: `cargo bench --bench kv`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvcore::ndarray::{Array2, ArrayView2};
use kvcore::{Append, DenseKv, GrowKv, KvError, KvGeometry, KvStore};

/// SmolLM2-135M: 30 layers of 3 KV heads of 64 (`kv_dim` 192).
const GEOMETRY: KvGeometry = KvGeometry {
    n_layers: 30,
    n_kv_heads: 3,
    head_dim: 64,
};
const N_LAYERS: usize = GEOMETRY.n_layers;
const KV_DIM: usize = 192;
const MAX_CTX: usize = 8192;

/// Appends positions `0..n` one at a time, as decoding does: each append writes every
/// layer's K and V row and commits.
fn append<K: KvStore>(
    kv: &mut K,
    n: usize,
    k_row: ArrayView2<'_, f32>,
    v_row: ArrayView2<'_, f32>,
) -> Result<(), KvError> {
    for pos in 0..n {
        let mut tx = Append::begin(kv, pos, 1)?;
        for layer in 0..N_LAYERS {
            tx.write(layer, k_row, v_row)?;
        }
        tx.commit()?;
    }
    Ok(())
}

fn kv_append(c: &mut Criterion) {
    let k_row = Array2::from_shape_fn((1, KV_DIM), |(_, i)| i as f32 * 0.25); // [1, kv_dim]
    let v_row = Array2::from_shape_fn((1, KV_DIM), |(_, i)| -(i as f32) * 0.5);
    let mut group = c.benchmark_group("kv_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in [1024, MAX_CTX] {
        group.throughput(Throughput::Bytes((2 * N_LAYERS * n * KV_DIM * 4) as u64));
        group.bench_with_input(BenchmarkId::new("dense", n), &n, |b, &n| {
            b.iter(|| {
                let mut kv = DenseKv::new(GEOMETRY, MAX_CTX).expect("dense store");
                append(&mut kv, n, black_box(k_row.view()), black_box(v_row.view()))
                    .expect("append");
                kv
            })
        });
        group.bench_with_input(BenchmarkId::new("grow", n), &n, |b, &n| {
            b.iter(|| {
                let mut kv = GrowKv::new(GEOMETRY, MAX_CTX).expect("grow store");
                append(&mut kv, n, black_box(k_row.view()), black_box(v_row.view()))
                    .expect("append");
                kv
            })
        });
    }
    group.finish();
}

criterion_group!(benches, kv_append);
criterion_main!(benches);
