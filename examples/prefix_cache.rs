//! Time to first token of a request whose system prompt the paged pool's prefix cache
//! holds, against the same request cold: SmolLM2, `Rayon<Simd>` on 2 threads, a shared
//! "system prompt" of the first 300 tokens of Debian's GPL-3 text, then a 24-token
//! "user turn" different for every request (later tokens of the same text).
//!
//! Each round runs one cold request (a fresh pool, the whole prompt prefilled) and one
//! warm request (a pool that served one earlier request with the same system prompt and
//! published its blocks: `KvPool::lookup` finds the cached blocks, only the rest is
//! prefilled), alternating; prints the medians and their ratio, and checks that the warm
//! request's logits are those of a fresh store fed the same two chunks, bit for bit.
//!
//! Run: `cargo run --release --example prefix_cache [ROUNDS]`.

use std::time::Instant;

use kvcore::gguf::GgufFile;
use kvcore::kv::{KvPool, PoolConfig};
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore::{GrowKv, KvStore, KvType};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;

const SYSTEM: usize = 300;
const USER: usize = 24;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(7), |s| s.parse())?;
    let path = kvcore_fetch::smollm2_path()?;
    let model = Llama::load(GgufFile::open(&path)?, Rayon::new(Simd::new(), 2)?)?;
    let tok = Tokenizer::from_gguf(model.file())?;
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")?;
    let ids = tok.encode(&text, Special::Literal);
    let system = &ids[..SYSTEM];
    let request = |r: usize| -> Vec<u32> {
        let user = &ids[SYSTEM + r * USER..SYSTEM + (r + 1) * USER];
        system.iter().chain(user).copied().collect()
    };
    let f32s = (KvType::F32, KvType::F32);
    let new_pool = || {
        let config = PoolConfig {
            block_len: PoolConfig::DEFAULT_BLOCK_LEN,
            budget: 256 << 20,
            key: [0x11; 32],
        };
        KvPool::new(model.kv_geometry(), f32s, config)
    };
    let ctx = 1024;

    // The warm pool serves request 0 once and publishes it.
    let warm_pool = new_pool()?;
    let first = request(0);
    let mut seq = warm_pool.sequence(ctx)?;
    model.forward(&mut seq, &first, Logits::Last)?;
    seq.publish(&first)?;
    drop(seq);

    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut cached = 0;
    for r in 1..=rounds {
        let prompt = request(r);

        let t = Instant::now();
        let pool = new_pool()?;
        let mut seq = pool.sequence(ctx)?;
        model.forward(&mut seq, &prompt, Logits::Last)?;
        cold.push(t.elapsed().as_secs_f64());

        let t = Instant::now();
        // Leave at least one token to run: its logits are the first token's.
        let mut seq = warm_pool.lookup(&prompt[..prompt.len() - 1], ctx)?;
        cached = seq.len();
        let logits = model.forward(&mut seq, &prompt[cached..], Logits::Last)?;
        warm.push(t.elapsed().as_secs_f64());

        let mut fresh = GrowKv::new(model.kv_geometry(), ctx)?;
        model.forward(&mut fresh, &prompt[..cached], Logits::None)?;
        let want = model.forward(&mut fresh, &prompt[cached..], Logits::Last)?;
        assert_eq!(
            logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "the cached prefix gives a fresh store's bits"
        );
        assert_eq!(fresh.len(), seq.len());
    }
    let stats = warm_pool.stats();
    let (c, w) = (median(cold), median(warm));
    println!(
        "prompt {} tokens ({SYSTEM} shared + {USER}), {cached} found cached (blocks of {})",
        SYSTEM + USER,
        warm_pool.block_len()
    );
    println!(
        "TTFT cold {:.1} ms, cached {:.1} ms (medians of {rounds}): {:.2}x lower",
        c * 1e3,
        w * 1e3,
        c / w
    );
    println!(
        "pool: {} blocks alive ({} cached), hit rate {:.3}",
        stats.blocks,
        stats.cached,
        stats.hit_rate()
    );
    Ok(())
}
