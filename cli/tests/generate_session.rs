//! `kvcore generate --session FILE` end to end on SmolLM2 (greedy): the first run creates
//! the file; a second run with a longer prompt sharing its prefix reuses the cached
//! positions and prints exactly what a run without a session prints; a file that does
//! not load is an error exit that leaves its bytes untouched.

mod common;

use common::*;
use serde_json::Value;

const FIRST: &str = "What is the capital of France?";
const LONGER: &str = "What is the capital of France? Answer in one short sentence.";

/// `kvcore generate` on SmolLM2, greedy on simd, 16 tokens unless `extra` has `-n`.
fn generate(prompt: &str, extra: &[&str]) -> std::process::Output {
    let model = smollm2();
    let mut args = vec![
        "generate",
        &model,
        "-p",
        prompt,
        "--greedy",
        "--backend",
        "simd",
    ];
    if !extra.contains(&"-n") {
        args.extend(["-n", "16"]);
    }
    args.extend_from_slice(extra);
    kvcore(&args, "")
}

fn generate_json(prompt: &str, extra: &[&str]) -> Value {
    let mut args = extra.to_vec();
    args.push("--json");
    let (stdout, _) = succeeds(&generate(prompt, &args));
    serde_json::from_str(&stdout).expect("one JSON object")
}

#[test]
fn a_session_file_is_created_then_reused() {
    let dir = TempDir::new("generate-session");
    let file = dir.file("prompt.session");
    let first = generate_json(FIRST, &["--session", &file]);
    assert_eq!(uint(&first["stats"], "reused_tokens"), 0);
    let saved = std::fs::read(&file).expect("the first run writes the session file");
    assert_eq!(&saved[..8], b"KVCSESS\0");

    let plain = generate_json(LONGER, &[]);
    let second = generate_json(LONGER, &["--session", &file]);
    let s = &second["stats"];
    assert!(uint(s, "reused_tokens") > 0, "{s}");
    assert_eq!(
        uint(s, "reused_tokens") + uint(s, "prefilled_tokens"),
        uint(s, "prompt_token_count")
    );
    assert!(uint(s, "prefilled_tokens") < uint(&plain["stats"], "prefilled_tokens"));
    assert_eq!(second["tokens"], plain["tokens"]);
    assert_eq!(second["text"], plain["text"]);
    assert_ne!(
        std::fs::read(&file).unwrap(),
        saved,
        "the second run saved its session"
    );

    // The human stats line reports the reuse: the file now holds the whole prompt, so
    // only its last position runs again (for its logits).
    let (stdout, stderr) = succeeds(&generate(LONGER, &["--session", &file]));
    assert!(!stdout.trim().is_empty());
    let all = uint(&second["stats"], "prompt_token_count");
    let line = format!("[{all} prompt ({} reused, 1 prefilled) + ", all - 1);
    assert!(stderr.contains(&line), "{line:?} not in {stderr}");
}

/// Asserts an error exit whose last stderr line names the file and contains `needle`.
fn refused(out: &std::process::Output, file: &str, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("kvcore: error: cannot load session"),
        "{stderr}"
    );
    assert!(last.contains(file) && last.contains(needle), "{last}");
}

#[test]
fn a_file_that_does_not_load_is_an_error_and_stays_untouched() {
    let dir = TempDir::new("generate-session-bad");
    let file = dir.file("prompt.session");
    succeeds(&generate(FIRST, &["--session", &file, "-n", "2"]));
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    let out = generate(FIRST, &["--session", &file]);
    refused(&out, &file, "checksum mismatch");
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "the file was changed");
    assert!(out.stdout.is_empty());

    let text = dir.file("notes.txt");
    std::fs::write(&text, "not a session\n").unwrap();
    refused(
        &generate(FIRST, &["--session", &text]),
        &text,
        "not a kvcore session file",
    );
    assert_eq!(std::fs::read(&text).unwrap(), b"not a session\n");

    // A file saved with a larger context than this run's --ctx.
    let good = dir.file("good.session");
    succeeds(&generate(FIRST, &["--session", &good, "-n", "8"]));
    let before = std::fs::read(&good).unwrap();
    refused(
        &generate(FIRST, &["--session", &good, "--ctx", "20", "--raw"]),
        &good,
        "context overflow",
    );
    assert_eq!(std::fs::read(&good).unwrap(), before);
}
