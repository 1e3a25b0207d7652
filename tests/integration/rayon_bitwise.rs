//! The rayon backend against its inner backend: bit for bit equal outputs (compared with
//! `to_bits`) at 1, 2 and 3 threads, for every kernel. The inputs span the serial and
//! parallel sides of every size threshold: SmolLM2's projections as GEMV and GEMM, the
//! `[49152, 576]` output GEMV, prefill and decode attention with GQA (9 query heads over
//! 3 KV heads), batched RMSNorm / SwiGLU / add / RoPE, and proptest sweeps over odd
//! sizes. Instantiated for the scalar and the SIMD inner backends (the SIMD one on its
//! best path, and on x86_64 on `avx2` too, the AVX2 kernels without their AVX-512F
//! twins).

use kvcore::backend::{Backend, DType, Mask, RopeStyle};
use kvcore_rayon::{Rayon, RayonError};
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use kvcore_test_support::conformance::cases::{
    Add, Attention, AttentionBatch, AttnShape, Case, Embed, Geglu, Gemm, Gemv, GemvQ8, RmsNorm,
    RopeCase, Softmax, Swiglu,
};
use kvcore_test_support::conformance::model::{GEMMA3_MATMULS, MATMUL_SHAPES};
use kvcore_test_support::conformance::oracle::bits;
use kvcore_test_support::conformance::strategy::*;
use proptest::prelude::*;

/// Thread counts every case runs at.
const THREADS: [usize; 3] = [1, 2, 3];

/// `case` on each pool bit for bit equal to `case` on `inner`.
fn same_bits<B: Backend>(inner: &B, pools: &[Rayon<B>], case: &impl Case) {
    let want = bits(&case.run(inner));
    for pool in pools {
        let got = bits(&case.run(pool));
        assert!(
            got == want,
            "rayon at {} threads differs from {}: {}",
            pool.threads(),
            inner.name(),
            case.label()
        );
    }
}

/// SmolLM2 attention geometry: 9 query heads over 3 KV heads of 64.
const SMOLLM2_ATTN: AttnShape = AttnShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
    pos0: 0,
};

fn model_matmul<B: Backend>(inner: &B, pools: &[Rayon<B>]) {
    for dtype in DType::ALL {
        let shapes = MATMUL_SHAPES.into_iter().enumerate();
        for (k, (rows, cols)) in shapes.filter(|s| s.1.1.is_multiple_of(dtype.block_len())) {
            let seed = 0x600d + k as u64;
            same_bits(inner, pools, &Gemv::new(dtype, rows, cols, seed));
            // A decode step, a batch of decode steps split at `FEW_ALIGN` rows, a prefill.
            for n in [1, 7, 16, 17] {
                same_bits(inner, pools, &Gemm::new(dtype, rows, cols, n, seed));
            }
        }
    }
    same_bits(inner, pools, &Gemv::new(DType::Q8_0, 49152, 576, 0xb16));
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        for (rows, cols) in MATMUL_SHAPES {
            same_bits(inner, pools, &GemvQ8::new(dtype, rows, cols, 0x98));
        }
    }
    same_bits(inner, pools, &GemvQ8::new(DType::Q8_0, 49152, 576, 0xb17));
    for (k, &(dtype, rows, cols)) in GEMMA3_MATMULS.iter().enumerate() {
        same_bits(
            inner,
            pools,
            &GemvQ8::new(dtype, rows, cols, 0x99 + k as u64),
        );
    }
}

fn model_ops<B: Backend>(inner: &B, pools: &[Rayon<B>]) {
    // A batched decode step of 8 sequences at depths 60..200 (the jobs spread whole over
    // the threads), and of 2 (job by job).
    for n_seqs in [8usize, 2] {
        let jobs = (0..n_seqs).map(|i| {
            let shape = AttnShape {
                pos0: 60 + 20 * i,
                ..SMOLLM2_ATTN
            };
            Attention::new(shape, 1, 0, 0xba7c + i as u64)
        });
        same_bits(
            inner,
            pools,
            &AttentionBatch {
                jobs: jobs.collect(),
            },
        );
    }
    // Decode (one new row after 300 cached) and prefill (64 rows, causal).
    let decode = AttnShape {
        pos0: 300,
        ..SMOLLM2_ATTN
    };
    same_bits(inner, pools, &Attention::new(decode, 1, 0, 0xa1));
    same_bits(inner, pools, &Attention::new(SMOLLM2_ATTN, 64, 3, 0xa2));
    same_bits(inner, pools, &Attention::heads(64, 3, 301, 0xa3));
    let windowed = Attention::new(SMOLLM2_ATTN, 64, 3, 0xa4).with_cuts(&[40, 130]);
    same_bits(
        inner,
        pools,
        &windowed.with_mask(Mask::SlidingWindow { window: 50 }),
    );
    same_bits(inner, pools, &RmsNorm::new(64, 576, 1e-5, 0xb1));
    same_bits(inner, pools, &RmsNorm::new(1, 576, 1e-5, 0xb2));
    for len in [576, 1536, 64 * 1536 + 17, 300_007] {
        same_bits(inner, pools, &Swiglu::new(len, 20.0, 0xc1));
        same_bits(inner, pools, &Geglu::new(len, 20.0, 0xc2));
        same_bits(inner, pools, &Add::new(len, 0xc2));
    }
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let positions: Vec<usize> = (8150..8214).collect();
        same_bits(
            inner,
            pools,
            &RopeCase::new(64, 9, positions, 100_000.0, style, 0xd1),
        );
        same_bits(
            inner,
            pools,
            &RopeCase::new(64, 3, vec![5], 100_000.0, style, 0xd2),
        );
    }
    same_bits(inner, pools, &Softmax::new(8192, 10.0, 3, 0xe1));
    same_bits(inner, pools, &Embed::new(DType::Q8_0, 64, 576, 0xe2));
}

#[test]
fn zero_threads_is_an_error() {
    assert!(matches!(
        Rayon::new(Scalar::new(), 0),
        Err(RayonError::ZeroThreads)
    ));
}

#[test]
fn reports_name_and_threads() {
    for t in THREADS {
        let r = Rayon::new(Scalar::new(), t).expect("pool");
        assert_eq!((r.name(), r.threads()), ("rayon", t));
    }
}

macro_rules! bitwise_suite {
    ($module:ident, $inner:ty, $make:expr) => {
        mod $module {
            use super::*;
            use std::sync::LazyLock;

            static INNER: LazyLock<$inner> = LazyLock::new(|| $make);
            static POOLS: LazyLock<Vec<Rayon<$inner>>> = LazyLock::new(|| {
                THREADS
                    .iter()
                    .map(|&t| Rayon::new($make, t).expect("thread pool"))
                    .collect()
            });

            #[test]
            fn model_matmul() {
                super::model_matmul(&*INNER, &POOLS);
            }

            #[test]
            fn model_ops() {
                super::model_ops(&*INNER, &POOLS);
            }

            proptest! {
                #![proptest_config(config(24))]

                #[test]
                fn gemv_gemm(
                    (dtype, cols) in dtype_cols(), rows in prop_oneof![dim(), 100usize..1200],
                    n in prop_oneof![0usize..5, 5usize..20], seed in any::<u64>()
                ) {
                    same_bits(&*INNER, &POOLS, &Gemv::new(dtype, rows, cols, seed));
                    if kvcore::backend::q8::supports(dtype) {
                        same_bits(&*INNER, &POOLS, &GemvQ8::new(dtype, rows, cols, seed));
                    }
                    let cols = cols.max(dtype.block_len());
                    same_bits(&*INNER, &POOLS, &Gemm::new(dtype, rows, cols, n, seed));
                }

                /// Long prefills: `Rayon` splits GEMMs of 512 tokens or more over tokens
                /// (when the inner backend's rows stand alone), the pieces of any size.
                #[test]
                fn gemm_long_prefill(
                    (dtype, cols) in dtype_cols(), rows in 1usize..80,
                    n in prop_oneof![500usize..530, 530usize..1100], seed in any::<u64>()
                ) {
                    let cols = cols.max(dtype.block_len());
                    same_bits(&*INNER, &POOLS, &Gemm::new(dtype, rows, cols, n, seed));
                }

                #[test]
                fn attention(
                    head_dim in head_dim(), n_kv in 1usize..4, group in 1usize..4,
                    pos0 in 0usize..200, n_new in 0usize..20, seed in any::<u64>()
                ) {
                    let shape = AttnShape { n_heads: n_kv * group, n_kv_heads: n_kv, head_dim, pos0 };
                    same_bits(&*INNER, &POOLS, &Attention::new(shape, n_new, 0, seed));
                }

                /// Prefill chunks over rows of every KV type: `Rayon` splits the query
                /// rows, so the inner backend sees tiles of other sizes (its weighted
                /// sums of more than 8 outputs convert the rows once for all passes; a
                /// call of more than one tile stages each part's rows as f32, a piece of
                /// fewer rows reads them in place), the rows cut into segments, causal
                /// or windowed.
                #[test]
                fn attention_prefill_kv_types(
                    case in kv_attention(vec![32, 64], 1..3, 0..600, 8usize..40, 0, 1..400, false)
                ) {
                    same_bits(&*INNER, &POOLS, &case.case());
                }

                /// Decode steps and short prefills over deep caches: with few rows,
                /// `Rayon` splits the keys into parts over its threads (when the inner
                /// backend computes attention in parts) and folds them as the inner
                /// backend does. Every KV type, causal and windowed, cut into segments.
                #[test]
                fn attention_at_depth(
                    case in kv_attention(vec![32, 64], 1..4, 200..1500, 1usize..3, 1, 1..900, true)
                ) {
                    same_bits(&*INNER, &POOLS, &case.case());
                }

                /// Several sequences in one `attention_batch` (a batched decode step or
                /// short prefills over caches of their own depths): `Rayon` runs many
                /// balanced ones whole on its threads, the others job by job; either way
                /// each job's bits are the inner backend's `attention` of it.
                #[test]
                fn attention_batch(
                    n_kv in 1usize..4, group in 1usize..4,
                    jobs in prop::collection::vec((0usize..400, 1usize..3, 0usize..2), 0..12),
                    k in prop::sample::select(kvcore::KvType::ALL.to_vec()),
                    seed in any::<u64>()
                ) {
                    let jobs = jobs.into_iter().enumerate().map(|(i, (pos0, n_new, extra))| {
                        let shape = AttnShape { n_heads: n_kv * group, n_kv_heads: n_kv, head_dim: 64, pos0 };
                        Attention::new(shape, n_new, extra, seed ^ i as u64).with_kv_types((k, k))
                    });
                    same_bits(&*INNER, &POOLS, &AttentionBatch { jobs: jobs.collect() });
                }

                #[test]
                fn elementwise(
                    len in prop_oneof![dim(), 30_000usize..70_000, 260_000usize..300_000], d in dim1(),
                    head_dim in head_dim_even(), seed in any::<u64>()
                ) {
                    same_bits(&*INNER, &POOLS, &Swiglu::new(len, 20.0, seed));
                    same_bits(&*INNER, &POOLS, &Add::new(len, seed));
                    same_bits(&*INNER, &POOLS, &RmsNorm::new(len / d, d, 1e-5, seed));
                    let positions: Vec<usize> = (0..len / (4 * head_dim)).collect();
                    same_bits(&*INNER, &POOLS, &RopeCase::new(
                        head_dim, 4, positions, 10_000.0, RopeStyle::Halves, seed,
                    ));
                }
            }
        }
    };
}

bitwise_suite!(scalar, Scalar, Scalar::new());
bitwise_suite!(simd, Simd, Simd::best());
#[cfg(target_arch = "x86_64")]
bitwise_suite!(
    simd_avx2,
    Simd,
    Simd::with_path(kvcore_simd::SimdPath::Avx2Fma).expect("AVX2, FMA and F16C")
);
