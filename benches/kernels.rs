//! Kernel throughput of the scalar, SIMD and rayon backends at SmolLM2-135M's shapes.
//!
//! Groups (each benchmark id is `backend/shape`):
//! - `gemv_<dtype>`: decode `y ← W x` for every weight format at `[rows, cols]` =
//!   `[576, 576]` (q/o projections), `[1536, 576]` (gate/up), `[576, 1536]` (down) and
//!   `[49152, 576]` (output projection). Throughput: the weight bytes read, so the figure
//!   compares directly with the memory bandwidth below.
//! - `gemv_q8_<dtype>` (block formats): the same GEMVs with 8-bit activations
//!   (`Backend::gemv_q8`, llama.cpp's integer dot products), beside the f32-activation
//!   GEMV of the same backend as `<backend>-f32acts`, so the ratio is read off one run;
//!   plus `quantize` of a 576- and a 1536-value activation vector.
//! - `gemm_<dtype>`: prefill `Y ← X Wᵀ` with `n = 64` tokens at `[1536, 576]`.
//!   Throughput: `2·n·rows·cols` flops. The `simd` F32 case is a single
//!   `matrixmultiply::sgemm` call on the stored weights (strides, no copy), so it is
//!   matrixmultiply's own figure at this shape.
//! - `attention`: one decode step of SmolLM2's attention (9 query heads, 3 KV heads,
//!   head_dim 64) against 64, 512 and 4096 cached positions, with the rows stored as
//!   f32, f16 and q8_0. Throughput: `4·heads·head_dim·positions` flops (scores and
//!   weighted sum).
//! - `attention_paged`: the same decode step at 4096 positions and a 64-query prefill
//!   chunk at 1024, over a `PagedKv` view of blocks of 16 … 256 positions (one segment per
//!   block) beside a `GrowKv` (one segment, `grow`): what a block size costs attention.
//! - `attention_prefill`: the last 256 queries of a causal prefill of 1024 positions
//!   (SmolLM2's heads; f32, f16 and q8_0 rows) on one thread of the `simd` backend: the
//!   tiled prefill kernels without the thread split. Throughput: `4·heads·head_dim` flops
//!   per visible (query, key) pair.
//! - `bandwidth`: a plain sum over a 256 MiB buffer (far beyond the caches), on 1 and 2
//!   threads: this machine's memory read limit.
//!
//! `simd` is `Simd::best()`, `rayon` is `Rayon<Simd>` on 2 threads. Where the best path
//! is `avx512`, the kernels with AVX-512F twins (`gemm_few`, `attention`,
//! `attention_prefill`) also run as `simd-avx2`, the AVX2 kernels alone, so the two
//! paths compare in one run. Short measurement settings: the machine is shared. Run:
//! `cargo bench --bench kernels`.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};
use kvcore::backend::{AttnParams, Backend, DType, Q8Acts, Q8Layout, Weights, q8};
use kvcore::kv::{
    Append, GrowKv, KvGeometry, KvPool, KvSegment, KvStore, KvType, KvView, PoolConfig,
};
use kvcore::ndarray::Array2;
use kvcore::ndarray::Array3;
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_scalar::quant::quantize_row;
use kvcore_simd::{Simd, SimdPath};
use kvcore_test_support::conformance::cases::Encoded;

/// GEMV shapes `[rows, cols]`.
const GEMV_SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
/// The GEMV shapes whose width holds whole blocks of `dtype` (SmolLM2's 576 holds no
/// 256-weight K super-blocks).
fn shapes_of(dtype: DType) -> impl Iterator<Item = (usize, usize)> {
    GEMV_SHAPES
        .into_iter()
        .filter(move |s| s.1.is_multiple_of(dtype.block_len()))
}

/// GEMM shape `[rows, cols]` and tokens.
const GEMM_SHAPE: (usize, usize) = (1536, 576);
const GEMM_TOKENS: usize = 64;
/// Attention geometry and cache lengths.
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const POSITIONS: [usize; 3] = [64, 512, 4096];
/// KV element types of the attention benches.
const KV_TYPES: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];
/// Bandwidth buffer: 256 MiB of u64.
const BANDWIDTH_WORDS: usize = 32 << 20;

/// Deterministic values in (−1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `[rows, cols]` random weights stored as `dtype`.
fn matrix(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows * dtype.row_bytes(cols).expect("whole blocks"));
    let v = values(cols * 64, 1);
    for r in 0..rows {
        // 64 distinct rows repeated: quantising 28 M values per format would dominate.
        bytes.extend(quantize_row(
            dtype,
            &v[(r % 64) * cols..(r % 64 + 1) * cols],
        ));
    }
    bytes
}

/// The three backends under comparison, and the AVX2 kernels alone where `simd` runs
/// their AVX-512F twins.
struct Backends {
    scalar: Scalar,
    simd: Simd,
    rayon: Rayon<Simd>,
    avx2: Option<Simd>,
}

impl Backends {
    fn new() -> Self {
        let simd = Simd::best();
        Backends {
            scalar: Scalar::new(),
            simd,
            rayon: Rayon::new(simd, 2).expect("rayon pool"),
            avx2: (simd.path() == SimdPath::Avx512)
                .then(|| Simd::with_path(SimdPath::Avx2Fma))
                .flatten(),
        }
    }

    fn each(&self) -> [&dyn Backend; 3] {
        [&self.scalar, &self.simd, &self.rayon]
    }

    /// `simd` by name, then `simd-avx2` where there is one.
    fn simds(&self) -> impl Iterator<Item = (&'static str, &Simd)> {
        [("simd", &self.simd)]
            .into_iter()
            .chain(self.avx2.as_ref().map(|s| ("simd-avx2", s)))
    }
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(900));
}

fn gemv(c: &mut Criterion) {
    let b = Backends::new();
    for dtype in DType::ALL {
        let mut group = c.benchmark_group(format!("gemv_{dtype}"));
        configure(&mut group);
        for (rows, cols) in shapes_of(dtype) {
            let bytes = matrix(dtype, rows, cols);
            let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
            let x = values(cols, 2);
            let mut y = vec![0.0f32; rows];
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            for be in b.each() {
                let id = BenchmarkId::new(be.name(), format!("{rows}x{cols}"));
                group.bench_function(id, |bench| {
                    bench.iter(|| be.gemv(&w, black_box(&x), &mut y).expect("gemv"))
                });
            }
        }
        group.finish();
    }
}

fn gemv_q8(c: &mut Criterion) {
    let b = Backends::new();
    for dtype in DType::ALL.into_iter().filter(|&d| q8::supports(d)) {
        let mut group = c.benchmark_group(format!("gemv_q8_{dtype}"));
        configure(&mut group);
        for (rows, cols) in shapes_of(dtype) {
            let bytes = matrix(dtype, rows, cols);
            let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
            let x = values(cols, 2);
            let layout = Q8Layout::of(dtype).expect("8-bit path");
            let xq = Q8Acts::from_f32(layout, &x).expect("whole blocks");
            let mut y = vec![0.0f32; rows];
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            for be in b.each() {
                let shape = format!("{rows}x{cols}");
                let id = BenchmarkId::new(be.name(), &shape);
                group.bench_function(id, |bench| {
                    bench.iter(|| be.gemv_q8(&w, black_box(&xq), &mut y).expect("gemv_q8"))
                });
                if be.name() != "scalar" {
                    let id = BenchmarkId::new(format!("{}-f32acts", be.name()), &shape);
                    group.bench_function(id, |bench| {
                        bench.iter(|| be.gemv(&w, black_box(&x), &mut y).expect("gemv"))
                    });
                }
            }
        }
        group.finish();
    }
    // A batch of decode steps: `gemm_q8` of n tokens (each row bit for bit its GEMV);
    // throughput in weight bytes per token, so n tokens at the GEMV's speed read flat.
    for dtype in [DType::Q4_1, DType::Q8_0] {
        let mut group = c.benchmark_group(format!("gemm_q8_{dtype}"));
        configure(&mut group);
        let (rows, cols) = (1536, 576);
        let bytes = matrix(dtype, rows, cols);
        let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
        let layout = Q8Layout::of(dtype).expect("8-bit path");
        for n in [1usize, 2, 4, 8, 16] {
            let xq: Vec<Q8Acts> = (0..n)
                .map(|t| Q8Acts::from_f32(layout, &values(cols, 2 + t as u64)).expect("blocks"))
                .collect();
            let mut y = vec![0.0f32; n * rows];
            group.throughput(Throughput::Bytes((n * bytes.len()) as u64));
            let id = BenchmarkId::new(b.simd.name(), format!("{rows}x{cols}/n{n}"));
            group.bench_function(id, |bench| {
                bench.iter(|| b.simd.gemm_q8(&w, black_box(&xq), &mut y).expect("gemm_q8"))
            });
        }
        group.finish();
    }
    let mut group = c.benchmark_group("quantize_q8");
    configure(&mut group);
    for (layout, n) in [
        (Q8Layout::Q8_0, 576),
        (Q8Layout::Q8_0, 1536),
        (Q8Layout::Q8_K, 1024),
        (Q8Layout::Q8_K, 2048),
    ] {
        let x = values(n, 3);
        let mut out = Q8Acts::new();
        group.throughput(Throughput::Elements(n as u64));
        for be in [&b.scalar as &dyn Backend, &b.simd] {
            let id = BenchmarkId::new(format!("{}-{layout:?}", be.name()), n);
            group.bench_function(id, |bench| {
                bench.iter(|| {
                    be.quantize_q8(layout, black_box(&x), &mut out)
                        .expect("quantize")
                })
            });
        }
    }
    group.finish();
}

fn gemm(c: &mut Criterion) {
    let b = Backends::new();
    let (rows, cols) = GEMM_SHAPE;
    let x = values(GEMM_TOKENS * cols, 3);
    let mut y = vec![0.0f32; GEMM_TOKENS * rows];
    for dtype in DType::ALL
        .into_iter()
        .filter(|d| cols.is_multiple_of(d.block_len()))
    {
        let mut group = c.benchmark_group(format!("gemm_{dtype}"));
        configure(&mut group);
        let bytes = matrix(dtype, rows, cols);
        let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
        group.throughput(Throughput::Elements((2 * GEMM_TOKENS * rows * cols) as u64));
        for be in b.each() {
            let id = BenchmarkId::new(be.name(), format!("n{GEMM_TOKENS}_{rows}x{cols}"));
            group.bench_function(id, |bench| {
                bench.iter(|| be.gemm(&w, black_box(&x), &mut y).expect("gemm"))
            });
        }
        group.finish();
    }
}

/// A batch of decode steps with f32 activations: the GEMM of a few tokens (`n ≤ 8`:
/// decoded panels dotted with each token; 16: `sgemm`), at both of SmolLM2's FFN shapes.
fn gemm_few(c: &mut Criterion) {
    let b = Backends::new();
    for dtype in [DType::Q4_1, DType::Q8_0, DType::F32] {
        let mut group = c.benchmark_group(format!("gemm_few_{dtype}"));
        configure(&mut group);
        for (rows, cols) in [(1536, 576), (576, 1536)] {
            let bytes = matrix(dtype, rows, cols);
            let w = Weights::new(dtype, rows, cols, &bytes).expect("shape");
            for n in [1usize, 2, 4, 8, 16] {
                let x = values(n * cols, 3);
                let mut y = vec![0.0f32; n * rows];
                group.throughput(Throughput::Elements((n * rows * cols) as u64));
                for (name, simd) in b.simds() {
                    let id = BenchmarkId::new(name, format!("{rows}x{cols}/n{n}"));
                    group.bench_function(id, |bench| {
                        bench.iter(|| simd.gemm(&w, black_box(&x), &mut y).expect("gemm"))
                    });
                }
            }
        }
        group.finish();
    }
}

/// `n` cached positions of random keys and values stored as `ty`.
fn cached(ty: KvType, n: usize) -> (Encoded, Encoded) {
    let kv_dim = KV_HEADS * HEAD_DIM;
    let shape = (n, KV_HEADS, HEAD_DIM);
    (
        Encoded::new(ty, &values(n * kv_dim, 4), shape),
        Encoded::new(ty, &values(n * kv_dim, 5), shape),
    )
}

/// The view of `keys` and `vals` as one segment from position 0.
fn one_segment<'a>(keys: &'a Encoded, vals: &'a Encoded) -> KvView<'a> {
    let seg = KvSegment::new(0, keys.rows(), vals.rows()).expect("segment");
    KvView::new(KV_HEADS, HEAD_DIM, vec![seg]).expect("view")
}

fn attention(c: &mut Criterion) {
    let b = Backends::new();
    let mut group = c.benchmark_group("attention");
    configure(&mut group);
    for n in POSITIONS {
        for ty in KV_TYPES {
            let (keys, vals) = cached(ty, n);
            let kv = one_segment(&keys, &vals);
            let q = Array3::from_shape_vec((1, HEADS, HEAD_DIM), values(HEADS * HEAD_DIM, 6))
                .expect("shape");
            let mut out = Array3::<f32>::zeros((1, HEADS, HEAD_DIM));
            let params = AttnParams::causal(HEAD_DIM);
            group.throughput(Throughput::Elements((4 * HEADS * HEAD_DIM * n) as u64));
            let avx2 = b.simds().skip(1).map(|(name, s)| (name, s as &dyn Backend));
            for (name, be) in b.each().map(|be| (be.name(), be)).into_iter().chain(avx2) {
                let id = BenchmarkId::new(format!("{name}/{ty}"), n);
                group.bench_function(id, |bench| {
                    bench.iter(|| {
                        be.attention(black_box(q.view()), &[n - 1], &kv, &params, out.view_mut())
                            .expect("attention")
                    })
                });
            }
        }
    }
    group.finish();
}

fn attention_prefill(c: &mut Criterion) {
    let b = Backends::new();
    let (n, rows) = (1024, 256);
    let mut group = c.benchmark_group("attention_prefill");
    configure(&mut group);
    for ty in KV_TYPES {
        let (keys, vals) = cached(ty, n);
        let kv = one_segment(&keys, &vals);
        let q = Array3::from_shape_vec((rows, HEADS, HEAD_DIM), values(rows * HEADS * HEAD_DIM, 6))
            .expect("shape");
        let mut out = Array3::<f32>::zeros((rows, HEADS, HEAD_DIM));
        let positions: Vec<usize> = (n - rows..n).collect();
        let params = AttnParams::causal(HEAD_DIM);
        let pairs: usize = positions.iter().map(|p| p + 1).sum();
        group.throughput(Throughput::Elements((4 * HEADS * HEAD_DIM * pairs) as u64));
        for (name, simd) in b.simds() {
            let id = BenchmarkId::new(format!("{name}/{ty}"), format!("{rows}q/{n}"));
            group.bench_function(id, |bench| {
                bench.iter(|| {
                    simd.attention(
                        black_box(q.view()),
                        &positions,
                        &kv,
                        &params,
                        out.view_mut(),
                    )
                    .expect("attention")
                })
            });
        }
    }
    group.finish();
}

/// Block sizes of the paged attention benches.
const BLOCK_LENS: [usize; 5] = [16, 32, 64, 128, 256];

/// `n` positions of random rows in `kv` (one append).
fn fill<K: KvStore>(kv: &mut K, n: usize) {
    let g = kv.geometry();
    let mut tx = Append::begin(kv, 0, n).expect("begin");
    for layer in 0..g.n_layers {
        let k = Array2::from_shape_vec((n, g.kv_dim()), values(n * g.kv_dim(), 7)).expect("k");
        let v = Array2::from_shape_vec((n, g.kv_dim()), values(n * g.kv_dim(), 8)).expect("v");
        tx.write(layer, k.view(), v.view()).expect("write");
    }
    tx.commit().expect("commit");
}

fn attention_paged(c: &mut Criterion) {
    let b = Backends::new();
    let g = KvGeometry {
        n_layers: 1,
        n_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
    };
    let mut group = c.benchmark_group("attention_paged");
    configure(&mut group);
    // (cached positions, queries): a decode step deep in the cache, a prefill chunk.
    for (n, rows) in [(4096, 1), (1024, 64)] {
        for ty in [KvType::F32, KvType::F16] {
            let types = (ty, ty);
            let mut stores: Vec<(String, Box<dyn KvStore>)> = Vec::new();
            let mut grow = GrowKv::with_types(g, n, types).expect("grow");
            fill(&mut grow, n);
            stores.push(("grow".into(), Box::new(grow)));
            for block_len in BLOCK_LENS {
                let config = PoolConfig {
                    block_len,
                    budget: usize::MAX,
                    key: [0; 32],
                };
                let pool = KvPool::new(g, types, config).expect("pool");
                let mut seq = pool.sequence(n).expect("sequence");
                fill(&mut seq, n);
                stores.push((format!("B{block_len}"), Box::new(seq)));
            }
            let q =
                Array3::from_shape_vec((rows, HEADS, HEAD_DIM), values(rows * HEADS * HEAD_DIM, 6))
                    .expect("shape");
            let mut out = Array3::<f32>::zeros((rows, HEADS, HEAD_DIM));
            let positions: Vec<usize> = (n - rows..n).collect();
            let params = AttnParams::causal(HEAD_DIM);
            group.throughput(Throughput::Elements(
                (4 * rows * HEADS * HEAD_DIM * n) as u64,
            ));
            for be in [&b.simd as &dyn Backend, &b.rayon] {
                for (name, kv) in &stores {
                    let view = kv.view(0).expect("view");
                    let id = BenchmarkId::new(format!("{}/{ty}/{rows}q/{name}", be.name()), n);
                    group.bench_function(id, |bench| {
                        bench.iter(|| {
                            be.attention(
                                black_box(q.view()),
                                &positions,
                                &view,
                                &params,
                                out.view_mut(),
                            )
                            .expect("attention")
                        })
                    });
                }
            }
        }
    }
    group.finish();
}

/// Wrapping sum of `words` (a plain streaming read).
fn sum(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

fn bandwidth(c: &mut Criterion) {
    let buf: Vec<u64> = (0..BANDWIDTH_WORDS as u64).collect();
    let mut group = c.benchmark_group("bandwidth");
    configure(&mut group);
    group.throughput(Throughput::Bytes((BANDWIDTH_WORDS * 8) as u64));
    group.bench_function("read/1thread", |bench| bench.iter(|| sum(black_box(&buf))));
    group.bench_function("read/2threads", |bench| {
        bench.iter(|| {
            let (a, b) = buf.split_at(BANDWIDTH_WORDS / 2);
            std::thread::scope(|s| {
                let other = s.spawn(|| sum(black_box(b)));
                sum(black_box(a)).wrapping_add(other.join().expect("reader thread"))
            })
        })
    });
    group.finish();
}

criterion_group!(
    kernels,
    bandwidth,
    gemv,
    gemv_q8,
    gemm,
    gemm_few,
    attention,
    attention_paged,
    attention_prefill
);
criterion_main!(kernels);
