//! The `tokenizer` property: encoding any string and decoding it gives the string back
//! (less the bytes the vocabulary cannot spell), and any id sequence decodes, or fails
//! with `UnknownId` naming its first id outside the vocabulary; streaming decode agrees
//! with whole decode. Nothing panics.
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/tokenizer.rs` and the stable replay test
//! `tests/fuzz_corpus_replay.rs` (both include this file with `#[path]`).
//!
//! Vocabularies: four synthetic byte-level BPE tokenizers (one per [`PreTokenizerKind`])
//! with all 256 byte tokens, a few merges (ASCII words, digits, a two-byte UTF-8 char)
//! and special tokens of every special type; and the real SmolLM2 one when the caller
//! has it. SmolLM2 lacks 21 single-byte tokens and the encoder drops those bytes (as
//! llama.cpp does), so the round trip is compared against the text with those bytes
//! removed (see tests/tokenizer_props.rs).
//!
//! Input format: byte 0 picks the mode (bit 0: text or ids), the synthetic pre-tokenizer
//! (bits 1–2) and whether to use the real vocabulary when given (bit 3). Text mode reads
//! the rest as UTF-8 (invalid sequences become U+FFFD). Id mode reads 3-byte
//! little-endian numbers `v`: below `0xF0_0000` the id is `v % (vocab_size + 4)` (mostly
//! valid, a few just past the end), otherwise `v << 8` (far outside).

use std::sync::OnceLock;

use kvcore::tokenizer::{
    PreTokenizerKind, Special, TokenType, Tokenizer, TokenizerError, TokenizerSpec,
};

/// A tokenizer and which single bytes it has tokens for.
pub struct Vocab {
    tok: Tokenizer,
    /// `has_byte[b]`: whether byte `b` has a single-byte ordinary token.
    has_byte: [bool; 256],
}

impl Vocab {
    /// Wraps `tok`, finding its single-byte tokens.
    pub fn new(tok: Tokenizer) -> Vocab {
        let mut has_byte = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if tok.token_type(id) == Some(TokenType::Normal)
                && let Ok([b]) = tok.token_bytes(id)
            {
                has_byte[usize::from(*b)] = true;
            }
        }
        Vocab { tok, has_byte }
    }
}

/// The GPT-2 byte-level char of byte `b`: printable non-space Latin-1 bytes stand for
/// themselves, the other 68 map in order to U+0100, U+0101, ….
fn byte_char(b: u8) -> char {
    let self_mapped = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if self_mapped(b) {
        char::from(b)
    } else {
        let k = (0..b).filter(|&x| !self_mapped(x)).count() as u32;
        char::from_u32(0x100 + k).expect("below U+0144")
    }
}

fn byte_level(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// Merges of the synthetic vocabulary, as raw byte pairs, in rank order.
const MERGES: [(&[u8], &[u8]); 10] = [
    (b" ", b"t"),
    (b"h", b"e"),
    (b" t", b"he"),
    (b"i", b"n"),
    (b" ", b"a"),
    (b"e", b"r"),
    (b"1", b"2"),
    (b"\n", b"\n"),
    (b"\xc3", b"\xa9"),
    (b"'", b"s"),
];

/// Special tokens of the synthetic vocabulary.
const SPECIALS: [(&str, TokenType); 5] = [
    ("<|im_start|>", TokenType::Control),
    ("<|im_end|>", TokenType::Control),
    ("<unk>", TokenType::Unknown),
    ("<|user|>", TokenType::UserDefined),
    ("<0x0A>", TokenType::Byte),
];

/// The synthetic tokenizer with pre-tokenizer `pre`.
fn synthetic(pre: PreTokenizerKind) -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_level(&[b])).collect();
    let mut merges = Vec::new();
    for (l, r) in MERGES {
        let (l, r) = (byte_level(l), byte_level(r));
        tokens.push(format!("{l}{r}"));
        merges.push(format!("{l} {r}"));
    }
    let mut token_types = vec![TokenType::Normal; tokens.len()];
    for (text, ty) in SPECIALS {
        tokens.push(text.to_string());
        token_types.push(ty);
    }
    let end = u32::try_from(tokens.len() - SPECIALS.len() + 1).expect("small vocabulary");
    Tokenizer::new(TokenizerSpec {
        tokens,
        token_types,
        merges,
        pre,
        bos: Some(end - 1),
        eos: Some(end),
        eot: None,
        eom: None,
        add_bos: false,
    })
    .expect("the synthetic vocabulary is consistent")
}

/// The synthetic vocabulary for pre-tokenizer number `k % 4`, built once.
fn synthetic_vocab(k: u8) -> &'static Vocab {
    static VOCABS: [OnceLock<Vocab>; 4] = [const { OnceLock::new() }; 4];
    let kinds = [
        PreTokenizerKind::Default,
        PreTokenizerKind::Gpt2,
        PreTokenizerKind::DigitsThenGpt2,
        PreTokenizerKind::Llama3,
    ];
    let k = usize::from(k % 4);
    VOCABS[k].get_or_init(|| Vocab::new(synthetic(kinds[k])))
}

/// Runs the input on the vocabulary it selects (`real` when bit 3 of byte 0 is set and
/// `real` is given, a synthetic one otherwise).
///
/// # Panics
/// When a round trip, a decode or a stream disagrees with the properties above, or the
/// tokenizer panics.
pub fn check_tokenizer(data: &[u8], real: Option<&Vocab>) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let vocab = match real {
        Some(real) if mode & 8 != 0 => real,
        _ => synthetic_vocab(mode >> 1),
    };
    if mode & 1 == 0 {
        check_text(vocab, &String::from_utf8_lossy(rest));
    } else {
        let n = vocab.tok.vocab_size() as u32;
        let ids: Vec<u32> = rest
            .chunks_exact(3)
            .map(|c| {
                let v = u32::from_le_bytes([c[0], c[1], c[2], 0]);
                if v < 0xF0_0000 { v % (n + 4) } else { v << 8 }
            })
            .collect();
        check_ids(vocab, &ids);
    }
}

/// `decode(encode(s))` is `s` without the bytes that have no token.
fn check_text(vocab: &Vocab, s: &str) {
    let t = &vocab.tok;
    let literal = t.encode(s, Special::Literal);
    assert!(
        literal.iter().all(|&id| !t.is_control(id)),
        "user text {s:?} became a control token: {literal:?}"
    );
    check_round_trip(vocab, s, &literal);
    check_round_trip(vocab, s, &t.encode(s, Special::Parse));
}

/// `ids` (an encoding of `s`) decode to `s` without its untokenized bytes, whole and
/// streamed.
fn check_round_trip(vocab: &Vocab, s: &str, ids: &[u32]) {
    let t = &vocab.tok;
    let ids = ids.to_vec();
    assert!(
        ids.iter().all(|&id| (id as usize) < t.vocab_size()),
        "{ids:?}"
    );
    let decoded = t.decode(&ids).expect("encoded ids are in the vocabulary");
    let kept: Vec<u8> = s
        .bytes()
        .filter(|&b| vocab.has_byte[usize::from(b)])
        .collect();
    assert_eq!(
        decoded,
        String::from_utf8_lossy(&kept),
        "round trip of {s:?}"
    );
    assert_eq!(stream(t, &ids), decoded, "stream decode of {s:?}");
}

/// Decodes `ids` whole and streamed; an id outside the vocabulary must be reported.
fn check_ids(vocab: &Vocab, ids: &[u32]) {
    let t = &vocab.tok;
    let n = t.vocab_size();
    let first_bad = ids.iter().copied().find(|&id| id as usize >= n);
    match (t.decode(ids), first_bad) {
        (Ok(text), None) => {
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| t.token_bytes(id).expect("checked id").to_vec())
                .collect();
            assert_eq!(text, String::from_utf8_lossy(&bytes));
            assert_eq!(stream(t, ids), text, "stream decode of {ids:?}");
        }
        (Err(TokenizerError::UnknownId { id, vocab_size }), Some(bad)) => {
            assert_eq!((id, vocab_size), (bad, n));
        }
        (result, bad) => panic!("decode({ids:?}) = {result:?}, first unknown id {bad:?}"),
    }
}

/// The concatenated chunks of a streaming decode, then its flush.
fn stream(t: &Tokenizer, ids: &[u32]) -> String {
    let mut s = t.stream();
    let mut out = String::new();
    for &id in ids {
        out.push_str(&s.push(id).expect("id in vocabulary"));
    }
    out + &s.finish()
}
