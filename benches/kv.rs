//! KV store append cost: `GrowKv` against the reference `DenseKv`, SmolLM2-135M geometry
//! (30 layers, `kv_dim` 192, `max_ctx` 8192).
//!
//! One iteration builds a store (DenseKv: its full 377.5 MB allocation; GrowKv: 64
//! positions) and appends `n` positions, writing the K and V row of every layer, the way
//! decoding fills the cache; dropping the store is included. Two lengths, 1024 and 8192,
//! show the scaling: amortised O(1) appends make GrowKv's time linear in `n`, with the
//! doubling copies adding at most about one extra write per float. Throughput is the K
//! and V bytes appended, `2 · 30 · n · 192 · 4`.
//!
//! Run: `cargo bench --bench kv`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvcore::{DenseKv, GrowKv, KvError, KvStore};

const N_LAYERS: usize = 30;
const KV_DIM: usize = 192;
const MAX_CTX: usize = 8192;

/// Writes positions `0..n` of every layer, K then V.
fn append<K: KvStore>(kv: &mut K, n: usize, k_row: &[f32], v_row: &[f32]) -> Result<(), KvError> {
    for pos in 0..n {
        for layer in 0..N_LAYERS {
            kv.k_mut(layer, pos)?.copy_from_slice(k_row);
            kv.v_mut(layer, pos)?.copy_from_slice(v_row);
        }
    }
    Ok(())
}

fn kv_append(c: &mut Criterion) {
    let k_row: Vec<f32> = (0..KV_DIM).map(|i| i as f32 * 0.25).collect();
    let v_row: Vec<f32> = (0..KV_DIM).map(|i| -(i as f32) * 0.5).collect();
    let mut group = c.benchmark_group("kv_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in [1024, MAX_CTX] {
        group.throughput(Throughput::Bytes((2 * N_LAYERS * n * KV_DIM * 4) as u64));
        group.bench_with_input(BenchmarkId::new("dense", n), &n, |b, &n| {
            b.iter(|| {
                let mut kv = DenseKv::new(N_LAYERS, KV_DIM, MAX_CTX).expect("dense store");
                append(&mut kv, n, black_box(&k_row), black_box(&v_row)).expect("append");
                kv
            })
        });
        group.bench_with_input(BenchmarkId::new("grow", n), &n, |b, &n| {
            b.iter(|| {
                let mut kv = GrowKv::new(N_LAYERS, KV_DIM, MAX_CTX).expect("grow store");
                append(&mut kv, n, black_box(&k_row), black_box(&v_row)).expect("append");
                kv
            })
        });
    }
    group.finish();
}

criterion_group!(benches, kv_append);
criterion_main!(benches);
