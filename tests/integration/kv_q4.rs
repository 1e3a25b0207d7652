//! The 4-bit KV type `q4_0` on the real models.
//!
//! **Error budget.** SmolLM2 and Gemma 3 with f32 activations score one chunk of 2048
//! tokens of English licence text Debian ships (the Apache 2.0, MPL 2.0 and Artistic
//! licences of `/usr/share/common-licenses`, joined; package `base-files`), from an empty
//! cache with its second half scored (`kvcore perplexity`'s rule), once with an f32 cache
//! (the base) and once with `q4_0` keys and values (and once with `q8_0` keys and `q4_0`
//! values); each run's distributions are compared with the base's position by position.
//! The two stores run in lockstep, the first half in one pass and the scored half in
//! passes of 128 tokens, so Gemma 3's 262 144-entry rows are held for 128 positions at a
//! time (both runs are cut alike).
//!
//! Measured (2048, this text, this build; `kvcore perplexity -c 4096` gives the issue's
//! 4096-token figures, BENCHMARKS.md):
//!
//! | model | K/V | mean KLD | top-1 | ΔPPL |
//! |---|---|---:|---:|---:|
//! | SmolLM2 | q4_0/q4_0 | 5.2e-2 | 88.8 % | +1.92 % |
//! | SmolLM2 | q8_0/q4_0 | 8.4e-3 | 94.9 % | +0.44 % |
//! | Gemma 3 | q4_0/q4_0 | 8.9e-2 | 85.5 % | +8.53 % |
//!
//! The budget for a 4-bit K and V cache is mean KLD ≤ 5e-3, top-1 ≥ 97 %,
//! |ΔPPL| ≤ 1 %: plain `q4_0` misses it about tenfold, and the keys carry most of the
//! error (with `q8_0` keys the divergence is six times smaller). The bounds below are
//! what plain `q4_0` holds now, so a regression fails here; a better 4-bit design is to
//! meet the issue's. The 4-bit layouts of the same kind measured against it (scales of
//! least squared error, a Lloyd-Max codebook, blocks of 16, the attention sink kept) and
//! where the keys' error comes from, layer by layer: `docs/bench-log/2026-12-07.md`.
//!
//! **State files.** A `q4_0` session with the model's key offsets round-trips bitwise
//! (its rows, and the next tokens' logits), and refuses to load into a store of another
//! calibration or another key type, leaving the target as it was.

use std::path::PathBuf;

use crate::common::{greedy_steps, load_gemma3, load_smollm2};
use kvcore::model::perplexity::{Divergence, Perplexity, log_softmax};
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore::{Backend, GrowKv, KvType, Session, SessionError};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;
use kvcore_test_support::session::{fails, rows, to_bytes};

const TEXTS: [&str; 3] = [
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/Artistic",
];
const CHUNK: usize = 2048;
/// Tokens per scoring pass of the second half.
const STEP: usize = 128;
const Q4: (KvType, KvType) = (KvType::Q4_0, KvType::Q4_0);

/// What a run of `types` gives against the f32 base.
struct Measured {
    kld: f64,
    top1: f64,
    dppl: f64,
}

/// The first [`CHUNK`] tokens of the joined licences scored under f32 and under `types`
/// (the module docs).
fn measure<B: Backend>(model: &Llama<B>, types: (KvType, KvType)) -> Measured {
    let tok = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let text: String = TEXTS
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("Debian's licence texts (base-files)"))
        .collect();
    let ids = tok.encode(&text, Special::Literal);
    assert!(ids.len() >= CHUNK, "{} tokens", ids.len());
    let ids = &ids[..CHUNK];
    let mut base = model
        .new_kv_with_types(CHUNK, (KvType::F32, KvType::F32))
        .expect("store");
    let mut other = model.new_kv_with_types(CHUNK, types).expect("store");
    let half = CHUNK / 2;
    for kv in [&mut base, &mut other] {
        model
            .forward(kv, &ids[..half], Logits::None)
            .expect("forward");
    }
    let (mut d, mut p_base, mut p_other) = (
        Divergence::default(),
        Perplexity::default(),
        Perplexity::default(),
    );
    for at in (half..CHUNK).step_by(STEP) {
        let run = &ids[at..(at + STEP).min(CHUNK)];
        let lb = model.forward(&mut base, run, Logits::All).expect("forward");
        let lo = model
            .forward(&mut other, run, Logits::All)
            .expect("forward");
        for i in 0..run.len() {
            let Some(&next) = ids.get(at + i + 1) else {
                break;
            };
            let b = log_softmax(lb.row(i).as_slice().expect("contiguous"));
            let o = log_softmax(lo.row(i).as_slice().expect("contiguous"));
            p_base.add(-f64::from(b[next as usize]));
            p_other.add(-f64::from(o[next as usize]));
            d.add(&b, &o);
        }
    }
    let m = Measured {
        kld: d.mean(),
        top1: d.top1_agreement(),
        dppl: (p_other.ppl() - p_base.ppl()) / p_base.ppl(),
    };
    eprintln!(
        "{}/{}: mean KLD {:.3e}, p99 {:.3e}, top-1 {:.2} %, ΔPPL {:+.3} % (base ppl {:.4})",
        types.0,
        types.1,
        m.kld,
        d.quantile(0.99),
        100.0 * m.top1,
        100.0 * m.dppl,
        p_base.ppl()
    );
    m
}

/// `m` within the bounds, else a failure naming them.
fn check(what: &str, m: &Measured, kld: f64, top1: f64, dppl: f64, failures: &mut Vec<String>) {
    if m.kld > kld {
        failures.push(format!("{what}: mean KLD {:.3e} > {kld:e}", m.kld));
    }
    if m.top1 < top1 {
        failures.push(format!("{what}: top-1 {:.4} < {top1}", m.top1));
    }
    if m.dppl.abs() > dppl {
        failures.push(format!("{what}: |ΔPPL| {:.4} > {dppl}", m.dppl.abs()));
    }
}

#[test]
fn kv_q4_stays_within_its_error_budget() {
    let mut failures = Vec::new();
    let smollm2 = load_smollm2(Rayon::new(Simd::new(), 2).expect("pool"));
    let m = measure(&smollm2, Q4);
    check(
        "SmolLM2 q4_0",
        &m,
        Q4_SMOLLM2.0,
        Q4_SMOLLM2.1,
        Q4_SMOLLM2.2,
        &mut failures,
    );
    let m = measure(&smollm2, (KvType::Q8_0, KvType::Q4_0));
    check(
        "SmolLM2 q8_0/q4_0",
        &m,
        K8_V4_SMOLLM2.0,
        K8_V4_SMOLLM2.1,
        K8_V4_SMOLLM2.2,
        &mut failures,
    );
    drop(smollm2);
    let gemma3 = load_gemma3(Rayon::new(Simd::new(), 2).expect("pool"));
    let m = measure(&gemma3, Q4);
    check(
        "Gemma 3 q4_0",
        &m,
        Q4_GEMMA3.0,
        Q4_GEMMA3.1,
        Q4_GEMMA3.2,
        &mut failures,
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// (mean KLD, top-1, |ΔPPL|) bounds of `q4_0` K and V on each model, and of `q8_0` K
/// with `q4_0` V on SmolLM2: the measured figures (module docs) with some room.
const Q4_SMOLLM2: (f64, f64, f64) = (6e-2, 0.87, 0.025);
const K8_V4_SMOLLM2: (f64, f64, f64) = (1e-2, 0.94, 0.006);
const Q4_GEMMA3: (f64, f64, f64) = (1e-1, 0.84, 0.1);

/// A file path in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn prompt<B: Backend>(model: &Llama<B>, n: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect()
}

#[test]
fn kv_q4_session_round_trips_and_refuses_another_codec() {
    let model = load_smollm2(Simd::new());
    // Past the first 256-position block of key offsets.
    let (ctx, n) = (512, 300);
    let mut never = Session::new(model.new_kv_with_types(ctx, Q4).expect("store"));
    assert!(
        !never.kv().codecs().0.calibration().is_empty(),
        "the model's q4_0 keys are calibrated"
    );
    let first = never
        .prefill(&model, &prompt(&model, n))
        .expect("prefill")
        .logits;
    let file =
        TempFile(std::env::temp_dir().join(format!("kvcore-kv-q4-{}.session", std::process::id())));
    never.save_with_meta(&model, &file.0, b"{}").expect("save");
    let bytes = std::fs::read(&file.0).expect("read");

    let mut loaded = Session::new(model.new_kv_with_types(ctx, Q4).expect("store"));
    loaded.prefill(&model, &[1, 2, 3]).expect("prefill");
    assert_eq!(loaded.restore(&model, &file.0).expect("restore"), b"{}");
    assert_eq!(loaded.tokens(), never.tokens());
    assert_eq!(rows(loaded.kv()), rows(never.kv()));
    assert_eq!(
        to_bytes(&loaded, &model, b"{}"),
        bytes,
        "writes back the same file"
    );
    let a = greedy_steps(&model, &mut never, first.clone(), 3);
    let b = greedy_steps(&model, &mut loaded, first, 3);
    assert_eq!(a, b, "the next tokens' logits differ after a restore");

    // Keys without the model's calibration: a named mismatch, the target unchanged.
    let mut plain = Session::new(GrowKv::with_types(model.kv_geometry(), ctx, Q4).expect("store"));
    plain.prefill(&model, &[5, 6, 7]).expect("prefill");
    let err = fails(&model, &mut plain, &bytes);
    assert!(
        matches!(
            err,
            SessionError::CalibrationMismatch {
                file: true,
                store: false
            }
        ),
        "{err}"
    );
    assert_eq!(plain.tokens(), [5, 6, 7]);
    plain.decode(&model, 8).expect("still usable");

    // q8_0 keys are another codec: refused by type, the target unchanged.
    let q8 = (KvType::Q8_0, KvType::Q4_0);
    let mut other = Session::new(model.new_kv_with_types(ctx, q8).expect("store"));
    other.prefill(&model, &[5, 6]).expect("prefill");
    let err = fails(&model, &mut other, &bytes);
    assert!(err.to_string().contains("q4_0"), "{err}");
    assert_eq!(other.tokens(), [5, 6]);
}
