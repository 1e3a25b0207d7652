//! The `kvcore` binary on bad input: every mistake gives a one-line error on stderr that
//! names the problem and a non-zero exit status, never a panic or a backtrace.
//!
//! Commands that need no tokenizer run on a TinyLlama file written to a temp directory;
//! those that need one run on the real SmolLM2 file (`fetch::smollm2_path`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvcore::DType;
use kvcore_test_support::tiny::TinyLlama;

fn kvcore(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the kvcore binary")
}

/// `kvcore` with string arguments.
fn run(args: &[&str]) -> Output {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    kvcore(&args)
}

fn smollm2() -> String {
    let p = kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required");
    p.to_str().expect("a UTF-8 model path").to_string()
}

/// A fresh directory for one test under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(test: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("kvcore-cli-errors-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    TempDir(dir)
}

/// A TinyLlama GGUF (no tokenizer metadata) in `dir`.
fn tiny_model(dir: &TempDir) -> String {
    let tiny = TinyLlama {
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        ffn_dim: 8,
        vocab_size: 16,
        context_len: 32,
        dtype: DType::F32,
        seed: 1,
        untied_output: false,
    };
    let path = dir.path().join("tiny.gguf");
    std::fs::write(&path, tiny.to_gguf()).expect("write the tiny model");
    path.to_str().expect("a UTF-8 temp path").to_string()
}

/// Asserts a failure: non-zero exit (not a signal), and stderr ends in one error line
/// that contains every one of `needles`; no panic or backtrace anywhere. Returns stdout.
fn fails_with(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(
        code.is_some_and(|c| c != 0),
        "exit status {:?}, stderr: {stderr}",
        out.status
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(bad), "stderr mentions {bad:?}: {stderr}");
    }
    let last = stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("kvcore: "), "stderr: {stderr}");
    for n in needles {
        assert!(last.contains(n), "{n:?} not in the error line {last:?}");
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts a failure whose whole stderr is the one error line.
fn fails_in_one_line(out: &Output, needles: &[&str]) {
    fails_with(out, needles);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
}

#[test]
fn a_missing_file_is_named() {
    let out = run(&["info", "/nonexistent/dir/model.gguf"]);
    fails_in_one_line(&out, &["/nonexistent/dir/model.gguf", "No such file"]);
}

#[test]
fn a_directory_is_not_a_model() {
    let dir = temp_dir("directory");
    let dir = dir.path().to_str().unwrap();
    let out = run(&["info", dir]);
    fails_in_one_line(&out, &[dir, "not a regular file"]);
}

#[test]
fn a_non_gguf_file_is_refused() {
    let dir = temp_dir("non_gguf");
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "just some text, not a model\n").unwrap();
    let out = run(&["info", path.to_str().unwrap()]);
    fails_in_one_line(&out, &["notes.txt", "not a GGUF file"]);
}

#[test]
fn a_truncated_gguf_file_is_refused() {
    let dir = temp_dir("truncated");
    let model = tiny_model(&dir);
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let out = run(&["info", &model]);
    fails_in_one_line(&out, &["tiny.gguf", "run past the data section"]);
}

#[test]
fn ctx_zero_is_refused() {
    let dir = temp_dir("ctx0");
    let out = run(&["generate", &tiny_model(&dir), "--ctx", "0", "-p", "hi"]);
    fails_in_one_line(&out, &["--ctx"]);
}

#[test]
fn threads_zero_is_refused() {
    let dir = temp_dir("threads0");
    let out = run(&["generate", &tiny_model(&dir), "--threads", "0", "-p", "hi"]);
    fails_in_one_line(&out, &["--threads"]);
    let out = run(&["embed", "--threads", "0", &tiny_model(&dir), "hi"]);
    fails_in_one_line(&out, &["--threads"]);
}

/// An unknown `--backend` or `--activations` value is refused, naming the value and
/// the flag (and, for `--activations`, the choices).
#[test]
fn an_unknown_backend_or_activations_is_refused() {
    let dir = temp_dir("choices");
    for (flag, value, says) in [
        ("--backend", "gpu", &["gpu", "--backend"][..]),
        (
            "--activations",
            "int4",
            &["int4", "--activations", "f32, q8"],
        ),
    ] {
        let out = run(&["generate", &tiny_model(&dir), flag, value, "-p", "hi"]);
        fails_in_one_line(&out, says);
    }
}

#[test]
fn a_model_without_a_tokenizer_is_refused() {
    let dir = temp_dir("no_tokenizer");
    let out = run(&["tokenize", &tiny_model(&dir), "hi"]);
    fails_in_one_line(&out, &["tokenizer.ggml"]);
}

#[test]
fn invalid_utf8_in_a_text_argument_is_refused() {
    let text = OsStr::from_bytes(b"caf\xe9");
    let model = smollm2();
    let out = kvcore(&[OsStr::new("tokenize"), OsStr::new(&model), text]);
    fails_in_one_line(&out, &["UTF-8"]);
    let args = ["generate", &model, "-p"].map(OsStr::new);
    let out = kvcore(&[&args[..], &[text]].concat());
    fails_in_one_line(&out, &["UTF-8"]);
}

#[test]
fn an_invalid_utf8_path_is_reported_as_missing() {
    let path = OsStr::from_bytes(b"/nonexistent/\xff\xfe.gguf");
    let out = kvcore(&[OsStr::new("info"), path]);
    fails_in_one_line(&out, &["/nonexistent/", "No such file"]);
}

#[test]
fn tokenize_takes_the_text_alone_when_the_model_is_defaulted() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["tokenize", "hi"])
        .env("KVCORE_MODEL", smollm2())
        .output()
        .expect("run the kvcore binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let long = "word ".repeat(64);
    let out = run(&[
        "generate",
        &smollm2(),
        "--ctx",
        "8",
        "-p",
        &long,
        "--backend",
        "simd",
    ]);
    fails_in_one_line(&out, &["longer than the context of 8"]);
}

#[test]
fn ctx_above_the_trained_context_is_refused() {
    let out = run(&["generate", &smollm2(), "--ctx", "100000000", "-p", "hi"]);
    fails_in_one_line(&out, &["--ctx 100000000", "trained context"]);
}

#[test]
fn n_zero_processes_the_prompt_only() {
    let out = run(&[
        "generate",
        &smollm2(),
        "-n",
        "0",
        "-p",
        "hi",
        "--backend",
        "simd",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
    assert!(stderr.contains("0 generated tokens"), "stderr: {stderr}");
}

#[test]
fn running_into_the_context_prints_the_tokens_then_the_error() {
    let model = smollm2();
    let prompt = "The capital of France is";
    let ids = run(&["tokenize", &model, prompt]);
    assert!(ids.status.success());
    let n_prompt = String::from_utf8_lossy(&ids.stdout)
        .split_whitespace()
        .count();
    let ctx = (n_prompt + 3).to_string();
    let out = run(&[
        "generate",
        &model,
        "--raw",
        "-p",
        prompt,
        "--ctx",
        &ctx,
        "-n",
        "20",
        "--backend",
        "simd",
    ]);
    let stdout = fails_with(&out, &["generation stopped after 4 tokens", "context"]);
    assert!(
        !stdout.trim().is_empty(),
        "no tokens printed before the error"
    );
}

#[test]
fn embedding_empty_text_is_refused() {
    let out = run(&["embed", &smollm2(), "", "--backend", "simd"]);
    fails_in_one_line(&out, &["empty"]);
}
