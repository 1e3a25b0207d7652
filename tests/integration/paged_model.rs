//! The paged KV pool under the real models: a `PagedKv` sequence gives bit for bit the
//! logits of a `GrowKv` fed the same passes, on every backend and block size; a prompt
//! whose prefix the cache holds runs only its rest and still gives the bits of a fresh
//! store fed the same chunks; forks share their blocks and diverge by copying on write;
//! Gemma 3 (sliding-window layers, masks over a store that keeps every position) too.

use crate::common::*;
use kvcore::kv::{KvPool, PagedKv, PoolConfig};
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore::{Backend, GrowKv, KvStore, KvType};
use kvcore_simd::Simd;

const TEXT: &str = "/usr/share/common-licenses/GPL-3";

fn bits(a: &kvcore::ndarray::Array2<f32>) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// The first `n` tokens of Debian's GPL-3 text.
fn text_ids<B: Backend>(model: &Llama<B>, n: usize) -> Vec<u32> {
    let tok = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let text = std::fs::read_to_string(TEXT).expect("Debian's GPL-3 text (base-files)");
    let ids = tok.encode(&text, Special::Literal);
    assert!(ids.len() >= n, "{} tokens", ids.len());
    ids[..n].to_vec()
}

fn pool<B: Backend>(model: &Llama<B>, block_len: usize, types: (KvType, KvType)) -> KvPool {
    let config = PoolConfig {
        block_len,
        budget: 64 << 20,
        key: [3; 32],
    };
    KvPool::new(model.kv_geometry(), types, config).expect("pool")
}

/// Feeds `chunks` of ids to `kv`, returning every chunk's logits (all rows).
fn feed<B: Backend, K: KvStore>(model: &Llama<B>, kv: &mut K, chunks: &[&[u32]]) -> Vec<Vec<u32>> {
    chunks
        .iter()
        .map(|c| bits(&model.forward(kv, c, Logits::All).expect("forward")))
        .collect()
}

/// `n` tokens of text, a cached prefix of `p` (a multiple of 64), the K/V type pairs.
struct Paged {
    n: usize,
    p: usize,
    types: &'static [(KvType, KvType)],
}

const TYPES: &[(KvType, KvType)] = &[(KvType::F32, KvType::F32), (KvType::F16, KvType::Q8_0)];

impl PerBackend for Paged {
    fn run<B: Backend>(&self, backend: B) {
        let model = load_smollm2(backend);
        let ctx = model.config().context_len;
        let (n, p) = (self.n, self.p);
        let ids = text_ids(&model, n);
        let g = model.kv_geometry();
        for &types in self.types {
            let grow = || GrowKv::with_types(g, ctx, types).expect("grow");
            let chunks: [&[u32]; 3] = [&ids[..p - 56], &ids[p - 56..n - 1], &ids[n - 1..]];
            let mut reference = grow();
            let want = feed(&model, &mut reference, &chunks);
            for block_len in [16, 64] {
                let pool = pool(&model, block_len, types);
                let mut seq = pool.sequence(ctx).expect("sequence");
                assert_eq!(
                    feed(&model, &mut seq, &chunks),
                    want,
                    "{types:?} blocks of {block_len}"
                );
            }

            // The prefix cache: a second prompt sharing the first p tokens runs only
            // its own 20, bit for bit a fresh store fed p then 20.
            let pool = pool(&model, 64, types);
            let mut a = pool.sequence(ctx).expect("sequence");
            feed(&model, &mut a, &[&ids[..p], &ids[p..]]);
            a.publish(&ids).expect("publish");
            let blocks = n.div_ceil(64);
            assert_eq!(pool.stats().blocks, blocks);
            let mut other = ids[..p].to_vec();
            other.extend(ids[30..50].iter());
            let mut b: PagedKv = pool.lookup(&other, ctx).expect("lookup");
            assert_eq!(b.len(), p, "the cached blocks found");
            let got = feed(&model, &mut b, &[&other[p..]]);
            let mut fresh = grow();
            let want = feed(&model, &mut fresh, &[&other[..p], &other[p..]]);
            assert_eq!(got[0], want[1], "{types:?}: after the cached prefix");
            assert_eq!(pool.stats().blocks, blocks + 1, "b's own block only");

            // Forks share; their divergent decode steps copy the shared last block.
            let mut c = a.fork().expect("fork");
            let (x, y) = ([ids[5]], [ids[6]]);
            let (ga, gc) = (feed(&model, &mut a, &[&x]), feed(&model, &mut c, &[&y]));
            let mut ra = grow();
            let mut rc = grow();
            let want_a = feed(&model, &mut ra, &[&ids[..p], &ids[p..], &x]);
            let want_c = feed(&model, &mut rc, &[&ids[..p], &ids[p..], &y]);
            assert_eq!((&ga[0], &gc[0]), (&want_a[2], &want_c[2]));
            let last = n / 64;
            assert_ne!(
                a.block_ids()[last],
                c.block_ids()[last],
                "the last block was copied"
            );
            assert_eq!(
                a.block_ids()[..last],
                c.block_ids()[..last],
                "full blocks stay shared"
            );
        }
    }
}

#[test]
fn paged_equals_grow_on_smollm2_scalar() {
    // The scalar reference is slow: a shorter text, f32 rows.
    let job = Paged {
        n: 72,
        p: 64,
        types: &TYPES[..1],
    };
    with_backend("scalar", &job);
}

#[test]
fn paged_equals_grow_on_smollm2_simd() {
    with_backend(
        "simd",
        &Paged {
            n: 300,
            p: 256,
            types: TYPES,
        },
    );
}

#[test]
fn paged_equals_grow_on_smollm2_rayon() {
    with_backend(
        "rayon",
        &Paged {
            n: 300,
            p: 256,
            types: TYPES,
        },
    );
}

#[test]
fn paged_equals_window_store_on_gemma3() {
    let model = load_gemma3(Simd::new());
    let ids = text_ids(&model, 700);
    let chunks: [&[u32]; 2] = [&ids[..600], &ids[600..]];
    let mut window = model.new_kv(1024).expect("window store");
    let want = feed(&model, &mut window, &chunks);
    let pool = pool(&model, 64, (KvType::F32, KvType::F32));
    let mut seq = pool.sequence(1024).expect("sequence");
    assert_eq!(feed(&model, &mut seq, &chunks), want);
}
