//! Property tests of the tokenizer with the real SmolLM2 vocabulary: encoding round-trips
//! any string the vocabulary can spell, streaming decode equals whole decode and never
//! splits a character, and any id sequence decodes without panicking.
//!
//! SmolLM2's byte-level vocabulary lacks 21 of the 256 single-byte tokens (`0xF1`, `0xF2`,
//! a few control bytes, ...); llama.cpp drops such bytes when encoding, and so does kvcore,
//! so exact round trips are checked on text whose every byte has a token, and the dropping
//! itself on arbitrary text.

use std::sync::OnceLock;

use kvcore::tokenizer::{Special, TokenType};
use proptest::prelude::*;

/// `has_token[b]`: whether byte `b` has a single-byte token, found from the vocabulary.
fn byte_has_token() -> &'static [bool; 256] {
    static HAS: OnceLock<[bool; 256]> = OnceLock::new();
    HAS.get_or_init(|| {
        let t = MODEL.tokenizer();
        let mut has = [false; 256];
        for id in 0..t.vocab_size() as u32 {
            if t.token_type(id) == Some(TokenType::Normal)
                && let [b] = t.token_bytes(id).unwrap()
            {
                has[usize::from(*b)] = true;
            }
        }
        has
    })
}

/// `s` with the bytes that have no token removed, read back as UTF-8 (lossily).
fn spellable_bytes(s: &str) -> String {
    let kept: Vec<u8> = s
        .bytes()
        .filter(|&b| byte_has_token()[usize::from(b)])
        .collect();
    String::from_utf8_lossy(&kept).into_owned()
}

use crate::common;
use crate::common::SMOLLM2 as MODEL;

/// Any string, or text built from pieces that stress the tokenizer: special tokens and
/// parts of them, whitespace runs, digits, contractions, words in several scripts.
fn any_text() -> impl Strategy<Value = String> {
    common::tokenizer_text(vec![
        "<|im_end|>",
        "<|endoftext|>",
        "<|im",
        "_end|>",
        "|>",
        "<|",
        "<repo_name>",
        "'s",
        "'ll",
        "'",
        "1,000",
        "こんにちは",
    ])
}

/// Any string, keeping only the characters whose bytes all have tokens.
fn spellable_text() -> impl Strategy<Value = String> {
    any_text().prop_map(|s| {
        s.chars()
            .filter(|c| {
                c.encode_utf8(&mut [0; 4])
                    .bytes()
                    .all(|b| byte_has_token()[usize::from(b)])
            })
            .collect()
    })
}

/// Decodes `ids` one at a time, returning the chunks and the final flush.
/// The case that showed SmolLM2 lacks some byte tokens: U+40000 is `F1 80 80 80` and
/// `0xF1` has no token, so only the three continuation bytes survive.
#[test]
fn a_character_with_an_untokenized_lead_byte_loses_that_byte() {
    let t = MODEL.tokenizer();
    let s = "a\u{40000}b";
    assert!(!byte_has_token()[0xF1]);
    let decoded = t.decode(&t.encode(s, Special::Literal)).unwrap();
    assert_eq!(decoded, spellable_bytes(s));
    assert_eq!(decoded, "a\u{fffd}\u{fffd}\u{fffd}b");
}

proptest! {
    #![proptest_config(common::tokenizer_proptest_config(0x6b76_636f_7265))]

    #[test]
    fn decode_inverts_encode(s in spellable_text()) {
        common::check_decode_inverts_encode(MODEL.tokenizer(), &s, &s)?;
    }

    /// User text never becomes a control token, whatever special-token texts it holds
    /// (the strategy splices them in); parsed, the same text does.
    #[test]
    fn literal_text_has_no_control_ids(s in spellable_text()) {
        common::check_literal_has_no_control_ids(MODEL.tokenizer(), &s)?;
    }

    #[test]
    fn encode_drops_only_bytes_without_tokens(s in any_text()) {
        let t = MODEL.tokenizer();
        for special in [Special::Parse, Special::Literal] {
            prop_assert_eq!(t.decode(&t.encode(&s, special)).unwrap(), spellable_bytes(&s));
        }
    }

    #[test]
    fn streaming_decode_concatenates_to_the_text(s in spellable_text()) {
        common::check_streaming_decode(MODEL.tokenizer(), &s, &s)?;
    }

    #[test]
    fn any_id_sequence_decodes_or_reports_unknown_id(
        ids in prop::collection::vec(
            prop_oneof![4 => 0u32..49_152, 1 => 49_000u32..49_300, 1 => any::<u32>()],
            0..40,
        )
    ) {
        common::check_id_sequence(MODEL.tokenizer(), &ids)?;
    }
}
