//! `kvcore chat` end to end on SmolLM2, greedy, with stdin piped: later turns reuse the
//! cached conversation and prefill only what is new, and say the same as a run that
//! re-prefills everything (`--no-reuse`); `/reset`; `/save` and `/load` across processes
//! (with full reuse, and a corrupt file that keeps the conversation); a context that
//! runs out mid-conversation.

mod common;

use common::*;
use serde_json::Value;

const TURNS: [&str; 3] = [
    "What is the capital of France?",
    "And what is the capital of Italy?",
    "Which of the two cities is larger?",
];

/// `kvcore chat --json` on SmolLM2 (greedy, simd) with `extra` flags and the lines of
/// `input`; returns the turns' JSON objects and stderr.
fn chat(extra: &[&str], input: &[&str]) -> (Vec<Value>, String) {
    let model = smollm2();
    let mut args = vec!["chat", &model, "--json", "--greedy", "--backend", "simd"];
    args.extend_from_slice(extra);
    let stdin: String = input.iter().map(|l| format!("{l}\n")).collect();
    let (stdout, stderr) = succeeds(&kvcore(&args, &stdin));
    (json_lines(&stdout), stderr)
}

fn stats(turn: &Value) -> &Value {
    &turn["stats"]
}

#[test]
fn later_turns_reuse_the_conversation_and_say_what_a_fresh_prefill_says() {
    let (reuse, _) = chat(&["-n", "24"], &TURNS);
    let (fresh, _) = chat(&["-n", "24", "--no-reuse"], &TURNS);
    assert_eq!(reuse.len(), 3);
    assert_eq!(fresh.len(), 3);
    for (i, (r, f)) in reuse.iter().zip(&fresh).enumerate() {
        let (rs, fs) = (stats(r), stats(f));
        let rendered = uint(rs, "prompt_token_count");
        assert_eq!(rendered, uint(fs, "prompt_token_count"), "turn {i}");
        assert_eq!(
            r["text"], f["text"],
            "turn {i}: reuse and re-prefill disagree"
        );
        assert_eq!(r["tokens"], f["tokens"], "turn {i}");
        assert!(!r["text"].as_str().unwrap().trim().is_empty(), "turn {i}");
        assert_eq!(r["turn"], i as u64 + 1);
        assert!(r["error"].is_null());
        for key in ["ttft_ms", "decode_tok_s"] {
            assert!(rs[key].as_f64().unwrap() > 0.0, "turn {i}: {key}");
        }
        assert!(uint(rs, "kv_bytes") > 0);
        // Without reuse every turn prefills its whole rendering.
        assert_eq!(uint(fs, "reused_tokens"), 0, "turn {i}");
        assert_eq!(uint(fs, "prefilled_tokens"), rendered, "turn {i}");
        assert_eq!(
            uint(rs, "reused_tokens") + uint(rs, "prefilled_tokens"),
            rendered,
            "turn {i}"
        );
        if i == 0 {
            assert_eq!(uint(rs, "reused_tokens"), 0);
        } else {
            // The previous rendering and reply are cached: only the new turn is prefilled.
            let before = uint(stats(&reuse[i - 1]), "prompt_token_count");
            assert!(uint(rs, "reused_tokens") >= before, "turn {i}: {rs}");
            assert!(
                uint(rs, "prefilled_tokens") < rendered - before,
                "turn {i}: {rs}"
            );
        }
    }
}

#[test]
fn text_streams_and_stats_go_to_stderr() {
    let (json, _) = chat(&["-n", "16"], &TURNS[..2]);
    let model = smollm2();
    let out = kvcore(
        &["chat", &model, "--greedy", "--backend", "simd", "-n", "16"],
        &format!("{}\n{}\n", TURNS[0], TURNS[1]),
    );
    let (stdout, stderr) = succeeds(&out);
    let replies: Vec<&str> = stdout.lines().collect();
    assert_eq!(replies.len(), 2, "{stdout}");
    for (line, turn) in replies.iter().zip(&json) {
        assert_eq!(*line, turn["text"].as_str().unwrap());
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[turn")).collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    let second = stats(&json[1]);
    for needle in [
        "[turn 2 |".to_string(),
        format!("{} positions reused", uint(second, "reused_tokens")),
        format!("{} prefilled", uint(second, "prefilled_tokens")),
        "ttft".to_string(),
        "decode".to_string(),
        "tok/s".to_string(),
        "kv".to_string(),
    ] {
        assert!(
            lines[1].contains(&needle),
            "{needle:?} not in {:?}",
            lines[1]
        );
    }
}

#[test]
fn reset_starts_a_new_conversation() {
    let (turns, stderr) = chat(&["-n", "16"], &[TURNS[0], TURNS[1], "/reset", TURNS[0]]);
    assert_eq!(turns.len(), 3);
    assert!(stderr.contains("[conversation reset]"), "{stderr}");
    assert_eq!(uint(stats(&turns[2]), "reused_tokens"), 0);
    assert_eq!(turns[2]["text"], turns[0]["text"]);
    assert_eq!(turns[2]["tokens"], turns[0]["tokens"]);
    assert_eq!(
        uint(stats(&turns[2]), "prompt_token_count"),
        uint(stats(&turns[0]), "prompt_token_count")
    );
}

#[test]
fn save_then_load_in_a_new_process_continues_with_full_reuse() {
    let dir = TempDir::new("chat-save-load");
    let file = dir.file("chat.session");
    let save = format!("/save {file}");
    let load = format!("/load {file}");
    let (first, stderr) = chat(&["-n", "16"], &[TURNS[0], TURNS[1], &save, TURNS[2]]);
    assert!(stderr.contains("[saved 4 messages"), "{stderr}");
    let (second, stderr) = chat(&["-n", "16"], &[&load, TURNS[2]]);
    assert!(stderr.contains("[loaded 4 messages"), "{stderr}");
    assert_eq!(second.len(), 1);
    let (a, b) = (&first[2], &second[0]);
    // The same cached positions as the process that never stopped, the same reply.
    assert!(uint(stats(b), "reused_tokens") > uint(stats(&first[1]), "prompt_token_count"));
    for key in ["reused_tokens", "prefilled_tokens", "prompt_token_count"] {
        assert_eq!(uint(stats(a), key), uint(stats(b), key), "{key}");
    }
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["text"], b["text"]);

    // A corrupt file: the error is printed and the conversation goes on as it was.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    let corrupt = dir.file("corrupt.session");
    std::fs::write(&corrupt, &bytes).unwrap();
    let bad = format!("/load {corrupt}");
    let (kept, stderr) = chat(&["-n", "16"], &[TURNS[0], TURNS[1], &bad, TURNS[2]]);
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    assert!(stderr.contains("the conversation is unchanged"), "{stderr}");
    assert_eq!(kept.len(), 3);
    assert_eq!(kept[2]["tokens"], a["tokens"]);
    assert_eq!(
        uint(stats(&kept[2]), "reused_tokens"),
        uint(stats(a), "reused_tokens")
    );
    // A file of another kind, and a missing one.
    let (_, stderr) = chat(
        &["-n", "4"],
        &[
            &format!("/load {}", smollm2()),
            "/load /nonexistent/x.session",
            "/load",
        ],
    );
    assert!(stderr.contains("not a kvcore session file"), "{stderr}");
    assert!(stderr.contains("/nonexistent/x.session"), "{stderr}");
    assert!(stderr.contains("usage: /load FILE"), "{stderr}");
}

#[test]
fn running_into_the_context_keeps_the_conversation_usable() {
    // The first exchange takes about 46 positions; a request for a long story then runs
    // into the context of 80, and a message longer than the context cannot even start.
    let long = "Please describe, in great detail, ".repeat(12);
    let (turns, stderr) = chat(
        &["--ctx", "80", "-n", "200"],
        &[
            TURNS[0],
            "Write a long story about a dragon who learns to fly.",
            &long,
            "/reset",
            TURNS[0],
        ],
    );
    assert_eq!(turns.len(), 4, "{stderr}");
    let overflow = &turns[1];
    let error = overflow["error"]
        .as_str()
        .expect("the overflow turn reports an error");
    assert!(error.contains("context of 80 positions"), "{error}");
    assert!(error.contains("/reset"), "{error}");
    assert!(
        stderr.contains("context of 80 positions (--ctx) is full"),
        "{stderr}"
    );
    assert!(
        stderr.contains("more than the context of 80 positions"),
        "{stderr}"
    );
    let too_long = &turns[2];
    assert!(too_long["stats"].is_null() && too_long["text"] == "");
    let error = too_long["error"]
        .as_str()
        .expect("the long message reports an error");
    assert!(
        error.contains("more than the context of 80 positions"),
        "{error}"
    );
    // After /reset the first question gets the first answer again.
    assert_eq!(turns[3]["text"], turns[0]["text"]);
    assert!(turns[3]["error"].is_null());
    assert_eq!(turns[3]["turn"], 4);
}

#[test]
fn commands_and_bad_lines_do_not_end_the_chat() {
    let (turns, stderr) = chat(
        &["-n", "4"],
        &["/help", "/frobnicate", "", "   ", "//slash message"],
    );
    assert!(stderr.contains("/save FILE"), "{stderr}");
    assert!(stderr.contains("unknown command /frobnicate"), "{stderr}");
    assert_eq!(turns.len(), 1, "blank lines are not turns");
    // Only the one turn ran, and its message started with '/'.
    assert_eq!(uint(stats(&turns[0]), "reused_tokens"), 0);
}
