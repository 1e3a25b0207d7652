//! What window checkpoints save on Gemma 3 270M: a conversation of POSITIONS ids
//! (default 6000) prefilled in one pass, then a new turn that keeps the first `d` of
//! them and replaces the rest (as many new ids), for `d` just behind the window
//! (`POSITIONS − window − 1`) and further back. Without checkpoints the session
//! re-prefills the whole turn from 0; with checkpoints every `K` (256, 512, 1024; 8
//! kept) it goes back to the last one at or before `d`. Prints, per setting, the
//! positions re-prefilled, the time to the turn's first logits (the median of REPS
//! rewinds, each on a fork of the session as the conversation left it), the one-pass
//! prefill's time (the checkpoints are taken inside it) and the KV bytes; then what
//! taking a checkpoint adds to a decode step (the store's part of the step that reaches
//! a multiple of 512, with and without checkpoints).
//!
//! Run: `cargo run --release --example window_rewind [-- POSITIONS [REPS]]`
//! (defaults 6000, 3).

use std::error::Error;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use kvcore::gguf::GgufFile;
use kvcore::kv::Checkpoints;
use kvcore::model::Llama;
use kvcore::ndarray::Array2;
use kvcore::{Backend, KvError, KvStore, Session, WindowKv};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn session<B: Backend>(model: &Llama<B>, ctx: usize, c: Checkpoints) -> Session<WindowKv> {
    let kv = WindowKv::new(model.kv_geometry(), ctx, &model.config().windows())
        .expect("a windowed store")
        .with_checkpoints(c);
    Session::new(kv)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let positions: usize = args.first().map_or(Ok(6000), |a| a.parse())?;
    let reps: usize = args.get(1).map_or(Ok(3), |a| a.parse())?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Llama::load(
        GgufFile::open(&kvcore_fetch::gemma3_path()?)?,
        Rayon::new(Simd::new(), threads)?,
    )?;
    let window = model
        .config()
        .windows()
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
    // Ids spread over the vocabulary (what they say does not change the time); a turn's
    // new ids differ from the conversation's at every position.
    let vocab = model.config().vocab_size as u64;
    let spread = |seed: u64| -> Vec<u32> {
        (0..positions as u64)
            .map(|i| ((i * 7919 + seed) % (vocab - 1000) + 1000) as u32)
            .collect()
    };
    let (ids, other) = (spread(1), spread(2));
    let ctx = positions + 1;
    println!(
        "Gemma 3 270M, {threads} threads ({}), window {window}, a conversation of {positions} positions",
        model.backend().kernel_path()
    );
    let settings = [
        ("none", Checkpoints::NONE),
        ("K=256", every(256)),
        ("K=512", every(512)),
        ("K=1024", every(1024)),
    ];
    let divergences = [positions - window - 1, positions - 2 * window];
    for (name, c) in settings {
        let mut s = session(&model, ctx, c);
        let t = Instant::now();
        s.prefill(&model, &ids)?;
        let prefill = t.elapsed();
        println!(
            "{name:<7} one-pass prefill {:>6.2} s, KV {:>6.1} MiB, checkpoints at {:?}",
            prefill.as_secs_f64(),
            s.kv().bytes() as f64 / (1 << 20) as f64,
            s.kv().checkpoint_positions()
        );
        for d in divergences {
            let mut turn = ids[..d].to_vec();
            turn.extend_from_slice(&other[d..]);
            let mut times = Vec::new();
            let mut prefilled = 0;
            for _ in 0..reps {
                let mut fork = s.fork()?;
                let t = Instant::now();
                prefilled = fork.prefill(&model, &turn)?.prefilled;
                times.push(t.elapsed());
            }
            println!(
                "        diverging at {d}: re-prefilled {prefilled:>5} positions, time to first logits {:>6.3} s (median of {reps})",
                median(times).as_secs_f64()
            );
        }
    }
    // The store's part of a decode step that takes a checkpoint (at 6144), against the
    // same step without checkpoints.
    let at = 12 * 512 - 1;
    for (name, c) in [("none", Checkpoints::NONE), ("K=512", every(512))] {
        let mut kv = session(&model, at + 1, c).into_kv();
        while kv.len() < at {
            let n = (at - kv.len()).min(512);
            append_zeros(&mut kv, n)?;
        }
        let mut times = Vec::new();
        for _ in 0..reps.max(5) {
            let mut fork = kv.fork()?;
            let t = Instant::now();
            append_zeros(&mut fork, 1)?;
            times.push(t.elapsed());
        }
        println!(
            "{name:<7} the store's part of the decode step to {}: {:.3} ms (median)",
            at + 1,
            median(times).as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Appends `n` positions of zero rows to every layer of `kv`.
fn append_zeros(kv: &mut WindowKv, n: usize) -> Result<(), KvError> {
    let g = kv.geometry();
    let rows = Array2::<f32>::zeros((n, g.kv_dim()));
    kv.begin(kv.len(), n)?;
    for layer in 0..g.n_layers {
        kv.write(layer, rows.view(), rows.view())?;
    }
    kv.commit()
}

fn every(k: usize) -> Checkpoints {
    Checkpoints {
        every: NonZeroUsize::new(k).expect("k > 0"),
        ..Checkpoints::DEFAULT
    }
}
