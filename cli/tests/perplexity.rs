//! `kvcore perplexity` through the binary on SmolLM2 and Debian's GPL-3 text: the
//! perplexity it prints is the definition computed here from the library's logits, a run
//! against its own saved base diverges by no more than the f16 storage of the base, and a
//! base file that does not belong to the run is refused with a message naming why.

mod common;

use common::{TempDir, json_lines, kvcore, second_half_nll, smollm2, succeeds};
use kvcore::GrowKv;
use kvcore::gguf::GgufFile;
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::{Special, Tokenizer};
use kvcore_simd::Simd;
use serde_json::Value;
use std::path::Path;

/// The text every test scores: Debian's copy of the GPL version 3.
const TEXT: &str = "/usr/share/common-licenses/GPL-3";

fn perplexity(args: &[&str]) -> Value {
    let model = smollm2();
    let mut all = vec!["perplexity", model.as_str(), "-f", TEXT, "--json"];
    all.extend_from_slice(args);
    let (stdout, _) = succeeds(&kvcore(&all, ""));
    json_lines(&stdout).remove(0)
}

fn fails(args: &[&str], needle: &str) {
    let model = smollm2();
    let mut all = vec!["perplexity", model.as_str()];
    all.extend_from_slice(args);
    let out = kvcore(&all, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// exp(mean NLL) of the second half of each chunk, from every position's logits, with
/// the log-softmax in f64 here.
#[test]
fn the_printed_perplexity_is_the_definition() {
    let (ctx, chunks) = (128, 2);
    let v = perplexity(&["-c", "128", "--chunks", "2"]);
    let file = GgufFile::open(Path::new(&smollm2())).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let text = std::fs::read_to_string(TEXT).unwrap();
    let ids = tok.encode(&text, Special::Literal);
    assert!(
        !tok.add_bos(),
        "SmolLM2 adds no BOS: chunks are used as they are"
    );
    let model = Llama::load(file, Simd::new()).unwrap();
    let (mut nll, mut n) = (0.0f64, 0usize);
    for chunk in ids.chunks(ctx).take(chunks) {
        let mut kv = GrowKv::new(model.kv_geometry(), ctx).unwrap();
        let logits = model.forward(&mut kv, chunk, Logits::All).unwrap();
        let (chunk_nll, chunk_n) = second_half_nll(&logits, chunk);
        nll += chunk_nll;
        n += chunk_n;
    }
    let want = (nll / n as f64).exp();
    assert_eq!(v["tokens_scored"], n);
    assert_eq!(v["chunks"], 2);
    let got = v["ppl"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-4 * want,
        "ppl {got}, definition {want}"
    );
    let err = v["ppl_stderr"].as_f64().unwrap();
    assert!(err > 0.0 && err < got, "stderr {err}");
}

#[test]
fn a_run_against_its_own_base_diverges_only_by_the_f16_storage() {
    let dir = TempDir::new("ppl-base");
    let base = dir.file("base.lp");
    let saved = perplexity(&["-c", "128", "--chunks", "2", "--save-logits", &base]);
    let vocab = 49152u64;
    let rows = 2 * (128 - 1 - 64);
    let ids = 2 * 128;
    let size = std::fs::metadata(&base).unwrap().len();
    assert_eq!(size, 8 + 4 * 3 + 8 + 4 * ids + 8 + rows * vocab * 2 + 32);

    let same = perplexity(&["-c", "128", "--chunks", "2", "--kl-base", &base]);
    assert_eq!(same["ppl"], saved["ppl"]);
    assert_eq!(same["top1_agree"], 1.0);
    let kld = same["kld_mean"].as_f64().unwrap();
    assert!((0.0..1e-6).contains(&kld), "self KLD {kld}");

    // The scalar reference: a different summation order, the same model.
    let scalar = perplexity(&[
        "-c",
        "128",
        "--chunks",
        "2",
        "--kl-base",
        &base,
        "--backend",
        "scalar",
    ]);
    assert!(scalar["kld_mean"].as_f64().unwrap() < 1e-5, "{scalar}");
    assert!(scalar["top1_agree"].as_f64().unwrap() >= 0.99, "{scalar}");

    // A base that does not belong to the run.
    fails(
        &["-f", TEXT, "-c", "64", "--chunks", "2", "--kl-base", &base],
        "-c 128",
    );
    fails(
        &["-f", TEXT, "-c", "128", "--chunks", "1", "--kl-base", &base],
        "another text or --chunks",
    );
    let mut bytes = std::fs::read(&base).unwrap();
    let flipped = dir.file("flipped.lp");
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&flipped, &bytes).unwrap();
    fails(
        &[
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "2",
            "--kl-base",
            &flipped,
        ],
        "checksum",
    );
    let cut = dir.file("cut.lp");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails(
        &["-f", TEXT, "-c", "128", "--chunks", "2", "--kl-base", &cut],
        "truncated",
    );
    let junk = dir.file("junk.lp");
    std::fs::write(&junk, b"not a logits file at all").unwrap();
    fails(
        &["-f", TEXT, "-c", "128", "--chunks", "2", "--kl-base", &junk],
        "KVCORELP",
    );
}

#[test]
fn bad_arguments_are_named() {
    let dir = TempDir::new("ppl-args");
    let short = dir.file("short.txt");
    std::fs::write(&short, "Only a few words.").unwrap();
    fails(&["-f", &short], "fewer than one chunk of 512");
    fails(&["-f", TEXT, "-c", "1"], "-c must be at least 2");
    fails(
        &["-f", TEXT, "--chunks", "0"],
        "--chunks must be at least 1",
    );
    fails(
        &["-f", TEXT, "-c", "9000"],
        "exceeds the model's trained context",
    );
    fails(&["-f", &dir.file("missing.txt")], "cannot read");
    let (text, _) = succeeds(&kvcore(
        &[
            "perplexity",
            &smollm2(),
            "-f",
            TEXT,
            "-c",
            "64",
            "--chunks",
            "1",
        ],
        "",
    ));
    assert!(
        text.starts_with("PPL = ") && text.contains("over 31 tokens"),
        "{text}"
    );
}
