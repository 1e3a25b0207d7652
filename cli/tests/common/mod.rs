//! Shared by the CLI tests that drive the real binary (on SmolLM2, and on Gemma 3 for its
//! tokenizer): the SmolLM2 path, temp directories, and running `kvcore` with arguments and
//! piped stdin.

#![allow(dead_code)]

pub mod server;

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

/// The SmolLM2 file (fetched into the cache on first use; never skipped).
pub fn smollm2() -> String {
    let p = kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required");
    p.to_str().expect("a UTF-8 model path").to_string()
}

/// A fresh directory for one test under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kvcore-cli-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory, as a string argument.
    pub fn file(&self, name: &str) -> String {
        self.0
            .join(name)
            .to_str()
            .expect("a UTF-8 path")
            .to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `kvcore args…` (without `RUST_BACKTRACE`, so a panic prints as users see it)
/// with its stdin and stdout as given and its stderr piped.
pub fn spawn_kvcore<S: AsRef<OsStr>>(
    args: impl IntoIterator<Item = S>,
    stdin: Stdio,
    stdout: Stdio,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the kvcore binary")
}

/// Runs `kvcore args…` with `stdin` piped in (then closed: end of input).
pub fn kvcore(args: &[&str], stdin: &str) -> Output {
    let mut child = spawn_kvcore(args, Stdio::piped(), Stdio::piped());
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait for kvcore")
}

/// Asserts exit status 0 and returns (stdout, stderr).
pub fn succeeds(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "kvcore failed ({:?}): {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

/// One JSON object per line of stdout.
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// `v[key]` as an unsigned integer.
pub fn uint(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}

/// The negative log-likelihood, in f64, of the second half of one chunk scored by every
/// position's logits (positions `ctx/2 .. ctx − 1` predicting the next id), as
/// llama-perplexity counts it: `(Σ nll, positions)`.
pub fn second_half_nll(logits: &kvcore::ndarray::Array2<f32>, chunk: &[u32]) -> (f64, usize) {
    let ctx = chunk.len();
    let (mut nll, mut n) = (0.0f64, 0usize);
    for j in ctx / 2..ctx - 1 {
        let row = logits.row(j);
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let z: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
        nll += max + z.ln() - f64::from(row[chunk[j + 1] as usize]);
        n += 1;
    }
    (nll, n)
}
