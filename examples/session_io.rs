//! How long a long session takes to save and load, and how big its file is: prefills
//! SmolLM2-135M with 8192 positions (its whole trained context; 30 layers × kv_dim 192,
//! 46,080 bytes of f32 K and V rows a position), then times `Session::save` (write,
//! SHA-256, fsync, rename), `Session::load` (a new `GrowKv`) and `Session::restore` into
//! the session itself (which also saves the rows it replaces, for a rollback), each the
//! median of a few runs. The file is read back from the page cache.
//!
//! Run: `cargo run --release --example session_io [-- POSITIONS [REPS [DIR]]]`
//! (defaults 8192, 5, the system temp dir).

use std::error::Error;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvcore::gguf::GgufFile;
use kvcore::model::Llama;
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore::{KvStore, Session};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;

/// Text whose ids, repeated, fill the context.
const TEXT: &str = "The history of the printing press begins in the fifteenth century, when \
    movable metal type, oil-based inks and a screw press adapted from wine making came \
    together in Mainz. Within fifty years presses were at work in more than two hundred \
    European towns, and the price of a book fell to a fraction of what a copied manuscript \
    had cost. Scholars could compare identical copies of a text, errors were corrected in \
    later editions, and news, pamphlets and maps travelled faster than ever before. ";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let positions: usize = args.first().map_or(Ok(8192), |a| a.parse())?;
    let reps: usize = args.get(1).map_or(Ok(5), |a| a.parse())?;
    let dir = args.get(2).map_or_else(std::env::temp_dir, PathBuf::from);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    let model_path = kvcore_fetch::smollm2_path()?;
    let model = Llama::load(
        GgufFile::open(&model_path)?,
        Rayon::new(Simd::new(), threads)?,
    )?;
    let t = Instant::now();
    model.fingerprint();
    println!(
        "model fingerprint (SHA-256 of {} bytes, once per process): {:.1} ms",
        model.file().bytes().len(),
        ms(t.elapsed())
    );

    let tok = Tokenizer::from_gguf(model.file())?;
    let ids: Vec<u32> = tok
        .encode(TEXT, Special::Literal)
        .into_iter()
        .cycle()
        .take(positions)
        .collect();
    let mut session = Session::new(model.new_grow_kv(model.config().context_len)?);
    let t = Instant::now();
    for start in (0..positions).step_by(512) {
        // Each prefill reuses what the session holds and runs the next 512 ids.
        session.prefill(&model, &ids[..(start + 512).min(positions)])?;
    }
    println!(
        "prefilled {} positions in {:.1} s ({} threads); KV store {:.1} MB",
        session.len(),
        t.elapsed().as_secs_f64(),
        threads,
        session.kv().bytes() as f64 / 1e6
    );

    let file = dir.join(format!("kvcore-session-io-{}.session", std::process::id()));
    let mut save = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        session.save(&model, &file)?;
        save.push(t.elapsed());
    }
    let size = std::fs::metadata(&file)?.len();

    let mut load = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let loaded = Session::load(&file, &model)?;
        load.push(t.elapsed());
        assert_eq!(loaded.tokens(), session.tokens());
    }
    let mut restore = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        session.restore(&model, &file)?;
        restore.push(t.elapsed());
    }
    std::fs::remove_file(&file)?;

    let mb = size as f64 / 1e6;
    println!(
        "file: {size} bytes ({mb:.1} MB, {:.0} bytes a position)",
        size as f64 / positions as f64
    );
    for (what, times) in [
        ("save (write + SHA-256 + fsync + rename)", save),
        ("load (new GrowKv)", load),
        ("restore into the live session", restore),
    ] {
        let m = median(times.clone());
        let (lo, hi) = (times.iter().min().unwrap(), times.iter().max().unwrap());
        println!(
            "{what:<42} median {:>7.1} ms  ({:.1}–{:.1})  {:>6.0} MB/s",
            ms(m),
            ms(*lo),
            ms(*hi),
            mb / m.as_secs_f64()
        );
    }
    Ok(())
}
