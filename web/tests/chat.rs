//! `Chat`, the page's model, natively: the reference chat case's greedy continuation
//! streamed through a `Host` with its stats in order, a second turn that reuses the
//! cache, the user's text kept literal, and clear errors.

use kvcore_web::{Activations, Chat, Host, Phase, Stats};
use serde_json::Value;
use std::cell::Cell;

/// A host that records what the page would show, on a fake clock (1 ms per reading).
#[derive(Default)]
struct Recorder {
    clock: Cell<f64>,
    text: String,
    stats: Vec<Stats>,
}

impl Host for Recorder {
    fn now_ms(&self) -> f64 {
        self.clock.set(self.clock.get() + 1.0);
        self.clock.get()
    }
    fn text(&mut self, piece: &str) {
        assert!(!piece.is_empty());
        self.text.push_str(piece);
    }
    fn stats(&mut self, stats: Stats) {
        self.stats.push(stats);
    }
}

/// `(user text, greedy ids, greedy text)` of the reference's chat case.
fn chat_hello() -> (String, Vec<u32>, String) {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("reference logits"))
        .expect("parse the reference");
    let case = v
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["name"] == "chat-hello")
        .expect("the chat-hello case");
    let ids = case["greedy_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect();
    let s = |k: &str| case[k].as_str().expect(k).to_string();
    (s("text"), ids, s("greedy_text"))
}

fn chat() -> Chat {
    let path = kvcore_fetch::smollm2_path().expect("the SmolLM2 model file is required");
    Chat::load(std::fs::read(path).expect("read SmolLM2"), Activations::F32).expect("load")
}

#[test]
fn streams_the_reference_reply_then_continues_the_conversation() {
    let (user, greedy, text) = chat_hello();
    let mut chat = chat();
    let mut host = Recorder::default();
    let reply = chat.send(&user, 64, &mut host).expect("reply");
    assert_eq!(reply.tokens, greedy);
    assert_eq!(reply.text, text);
    assert_eq!(host.text, text);

    // A prefill report, one per token, then the end; the KV cache only grows.
    let phases: Vec<Phase> = host.stats.iter().map(|s| s.phase).collect();
    assert_eq!(phases[0], Phase::Prefill);
    assert!(phases[1..=greedy.len()].iter().all(|&p| p == Phase::Decode));
    assert_eq!(phases[greedy.len() + 1..], [Phase::Done]);
    assert!(host.stats[0].tokens > 0 && host.stats[0].tok_per_s > 0.0);
    assert!(
        host.stats
            .windows(2)
            .all(|w| w[0].kv_bytes <= w[1].kv_bytes)
    );
    let done = host.stats.last().expect("done");
    assert_eq!(done.tokens as usize, greedy.len());
    assert!(done.tok_per_s > 0.0 && done.kv_bytes as usize == chat.kv_bytes());
    assert_eq!(chat.history().len(), 2);

    // The second turn prefills only its new part: the first turn's positions stay.
    let prompt_before = host.stats[0].tokens;
    let mut host = Recorder::default();
    chat.send("What is 2+2?", 8, &mut host)
        .expect("second reply");
    let prefilled = host.stats[0].tokens;
    assert!(
        prefilled > 0 && prefilled < prompt_before + 20,
        "{prefilled}"
    );
    assert_eq!(chat.history().len(), 4);

    let before = chat.kv_bytes();
    chat.reset().expect("reset");
    assert!(chat.history().is_empty());
    assert!(chat.kv_bytes() < before, "{} of {before}", chat.kv_bytes());
    let mut host = Recorder::default();
    assert_eq!(chat.send(&user, 64, &mut host).expect("again").text, text);
}

#[test]
fn user_text_is_data_and_errors_are_clear() {
    let mut chat = chat();
    let mut host = Recorder::default();
    // A typed control token is literal text: it does not end the user's turn.
    let ids = chat
        .engine()
        .chat_ids(&[kvcore_engine::kvcore::tokenizer::ChatMessage::new(
            "user",
            "<|im_end|>",
        )])
        .expect("ids");
    let im_end = chat.engine().tokenize("<|im_end|>", false, true);
    assert_eq!(im_end.len(), 1);
    let n_im_end = ids.iter().filter(|&&i| i == im_end[0]).count();
    // The system turn's and the user turn's ends, not a third from the text.
    assert_eq!(n_im_end, 2, "{ids:?}");

    let e = chat.send("   ", 8, &mut host).unwrap_err();
    assert!(e.contains("empty"), "{e}");
    let e = chat.send("Hello", 0, &mut host).unwrap_err();
    assert!(e.contains("max_tokens"), "{e}");
    assert!(chat.history().is_empty() && host.stats.is_empty());

    let e = Chat::load(b"GGUF but not really".to_vec(), Activations::F32)
        .err()
        .expect("not a model");
    assert!(e.contains("<memory>"), "{e}");
}
