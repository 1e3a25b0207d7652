//! Golden tests of the tokenizer on the real SmolLM2-135M-Instruct file, against
//! llama.cpp's tokenization and the reference prompts in /work/shared/reference
//! (`tokenizer.jsonl`, `logits.json`; see the README there). A failure prints the text,
//! the expected ids and the actual ids.

use std::time::Instant;

use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special};
use serde_json::Value;

use crate::common;
use crate::common::SMOLLM2 as MODEL;

/// The reference data of this model, under `../shared/reference`.
const DIR: &str = "smollm2-135m-instruct-q4_1";

/// `(text, ids)` for every line of tokenizer.jsonl.
fn tokenizer_cases() -> Vec<(String, Vec<u32>)> {
    common::tokenizer_cases(DIR, 30)
}

/// The prompts of logits.json.
fn prompts() -> Vec<Value> {
    common::prompts(DIR)
}

#[test]
fn encode_matches_llama_cpp_on_every_reference_line() {
    common::check_reference_encodings(MODEL.tokenizer(), &tokenizer_cases());
}

#[test]
fn decode_restores_every_reference_line() {
    common::check_reference_decodings(MODEL.tokenizer(), &tokenizer_cases(), str::to_string);
}

#[test]
fn rendered_prompts_encode_to_prompt_ids() {
    let prompts = prompts();
    common::check_encodings(
        MODEL.tokenizer(),
        prompts.iter().map(|p| {
            let rendered = p["rendered"].as_str().expect("prompt has rendered text");
            (rendered, common::ids(&p["prompt_ids"]))
        }),
    );
}

#[test]
fn chat_template_reproduces_rendered_prompts() {
    let template = ChatTemplate::from_gguf(MODEL.file())
        .expect("chat template compiles")
        .expect("the SmolLM2 file has a chat template");
    let mut chats = 0;
    for p in prompts() {
        if !p["chat"].as_bool().expect("prompt has a chat flag") {
            continue;
        }
        chats += 1;
        let text = p["text"].as_str().expect("prompt has a text");
        let rendered = template
            .render(&[ChatMessage::new("user", text)], true)
            .expect("template renders");
        assert_eq!(
            rendered,
            p["rendered"].as_str().unwrap(),
            "chat prompt {text:?}"
        );
        // Markup parsed, content literal: for ordinary content exactly llama.cpp's ids
        // of the whole rendered text with special tokens parsed.
        let t = MODEL.tokenizer();
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (t.add_bos(), t.bos_id()) {
            ids.push(bos);
        }
        ids.extend(
            template
                .render_chat(&[ChatMessage::new("user", text)], true)
                .expect("template renders")
                .encode(t),
        );
        assert_eq!(ids, common::ids(&p["prompt_ids"]), "chat prompt {text:?}");
    }
    assert!(chats > 0, "logits.json has no chat prompt");
}

#[test]
fn greedy_ids_decode_to_greedy_text() {
    let t = MODEL.tokenizer();
    let prompts = prompts();
    for (name, ids, expected) in common::greedy_texts(&prompts) {
        // Generation stops at a stop token and does not print it.
        let end = ids
            .iter()
            .position(|&id| t.is_stop(id))
            .unwrap_or(ids.len());
        assert!(
            end + 1 >= ids.len(),
            "prompt {name}: a stop token before the end of {ids:?}"
        );
        let text = t
            .decode(&ids[..end])
            .expect("greedy ids are in the vocabulary");
        assert_eq!(text, expected, "prompt {name}: decoding {ids:?}");

        let mut stream = t.stream();
        let mut streamed = String::new();
        for &id in &ids[..end] {
            streamed.push_str(&stream.push(id).expect("id in vocabulary"));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, expected, "prompt {name}: streaming {ids:?}");
    }
}

#[test]
fn special_tokens_follow_the_metadata() {
    let t = MODEL.tokenizer();
    let f = MODEL.file();
    common::check_metadata_ids(t, f);
    assert_eq!(
        t.add_bos(),
        f.get_bool("tokenizer.ggml.add_bos_token").unwrap()
    );
    for name in ["<|im_end|>", "<|endoftext|>"] {
        common::check_stop_token(t, name);
    }
    let im_start = t
        .token_id("<|im_start|>")
        .expect("<|im_start|> is in the vocabulary");
    assert!(!t.is_stop(im_start));
}

#[test]
fn encoding_is_fast_and_linear() {
    let t = MODEL.tokenizer();
    let mut text = String::new();
    for (line, _) in tokenizer_cases().iter().cycle() {
        if text.len() >= 100_000 {
            break;
        }
        text.push_str(line);
        text.push('\n');
    }
    let start = Instant::now();
    let ids = t.encode(&text, Special::Parse);
    let elapsed = start.elapsed();
    assert_eq!(t.decode(&ids).unwrap(), text);
    // ~10 ms on one core; the bound only catches a quadratic or regex-backtracking blowup.
    assert!(elapsed.as_secs_f64() < 2.0, "100 kB took {elapsed:?}");

    common::check_one_long_word(t);
}
