//! The `tokenizer` property: encoding any string and decoding it gives the string back
//! (less the bytes the vocabulary cannot spell, and with SentencePiece's `▁` read as a
//! space), user text never yields a control token, and any id sequence decodes, or fails
//! with `UnknownId` naming its first id outside the vocabulary; streaming decode agrees
//! with whole decode. Nothing panics.
//!
//! Shared by the fuzz target `fuzz/fuzz_targets/tokenizer.rs` and the stable replay test
//! `tests/integration/fuzz_corpus_replay.rs` (both include this file with `#[path]`).
//!
//! Vocabularies:
//! - four synthetic byte-level BPE tokenizers (one per [`PreTokenizerKind`]) with all 256
//!   byte tokens, a few merges (ASCII words, digits, a two-byte UTF-8 char) and special
//!   tokens of every special type;
//! - a synthetic SentencePiece tokenizer built from the input itself: all 256 byte tokens,
//!   `▁`, Gemma-like control and user-defined tokens, and pieces of one to three characters cut
//!   from the input's own text (spaces as `▁`), some single characters left out so they
//!   fall back to bytes, with scores from a hash of the piece and a seed byte in a small
//!   range, so ties (leftmost first) and stale heap entries are common;
//! - the real SmolLM2 (BPE) and Gemma 3 (SentencePiece) ones when the caller has them.
//!   SmolLM2 lacks 21 single-byte tokens and the encoder drops those bytes (as llama.cpp
//!   does), so the round trip is compared against the text with those bytes removed (see
//!   tests/integration/tokenizer_props.rs); the SentencePiece vocabularies have every byte token.
//!
//! Input format: byte 0 picks the mode (bit 0: text or ids), the synthetic pre-tokenizer
//! (bits 1–2), whether to use a real vocabulary when given (bit 3) and which family
//! (bit 4: SentencePiece). The synthetic SentencePiece vocabulary takes byte 1 as its
//! seed. Text mode reads the rest as UTF-8 (invalid sequences become U+FFFD). Id mode
//! reads 3-byte little-endian numbers `v`: below `0xF0_0000` the id is
//! `v % (vocab_size + 4)` (mostly valid, a few just past the end), otherwise `v << 8` (far
//! outside).

use std::sync::OnceLock;

use std::collections::HashSet;

use kvcore::tokenizer::{
    PreTokenizerKind, Special, TokenType, Tokenizer, TokenizerError, TokenizerModel, TokenizerSpec,
};

/// A tokenizer and which single bytes it can spell.
pub struct Vocab {
    tok: Tokenizer,
    /// `has_byte[b]`: whether byte `b` has a single-byte token the encoder uses (an
    /// ordinary one for BPE, a byte token `<0xNN>` for SentencePiece).
    has_byte: [bool; 256],
    /// Whether this is SentencePiece, which reads a `▁` in the text as a space.
    sentencepiece: bool,
}

impl Vocab {
    /// Wraps `tok`, finding its single-byte tokens.
    ///
    /// # Panics
    /// For a SentencePiece vocabulary without all 256 byte tokens or without `▁` (the
    /// expected round trip below assumes them: a `▁` spelled by byte tokens decodes as
    /// itself, not as a space).
    pub fn new(tok: Tokenizer) -> Vocab {
        let sentencepiece = tok.pre_tokenizer().is_none();
        let byte_type = if sentencepiece {
            TokenType::Byte
        } else {
            TokenType::Normal
        };
        let mut has_byte = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if tok.token_type(id) == Some(byte_type)
                && let Ok([b]) = tok.token_bytes(id)
            {
                has_byte[usize::from(*b)] = true;
            }
        }
        assert!(
            !sentencepiece || (has_byte.iter().all(|&h| h) && tok.token_id("▁").is_some()),
            "a SentencePiece vocabulary without every byte token or without ▁"
        );
        Vocab {
            tok,
            has_byte,
            sentencepiece,
        }
    }

    /// What decoding an encoding of `s` gives.
    fn round_trip_of(&self, s: &str) -> String {
        let kept: Vec<u8> = s
            .bytes()
            .filter(|&b| self.has_byte[usize::from(b)])
            .collect();
        let text = String::from_utf8_lossy(&kept);
        if self.sentencepiece {
            text.replace('▁', " ")
        } else {
            text.into_owned()
        }
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
        model: TokenizerModel::Bpe { merges, pre },
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

/// Special tokens of the synthetic SentencePiece vocabulary, Gemma-like, and `<x>`, short
/// enough that merging the pieces `<x` and `>` cut from a text would spell it.
const SPM_SPECIALS: [(&str, TokenType); 7] = [
    ("<x>", TokenType::Control),
    ("<start_of_turn>", TokenType::Control),
    ("<end_of_turn>", TokenType::Control),
    ("<eos>", TokenType::Control),
    ("<unk>", TokenType::Unknown),
    ("  ", TokenType::UserDefined),
    ("<b>", TokenType::UserDefined),
];

/// The most pieces the synthetic SentencePiece vocabulary cuts from the input.
const MAX_PIECES: usize = 256;

/// FNV-1a of `seed` and `bytes`.
fn hash(seed: u8, bytes: &[u8]) -> u32 {
    std::iter::once(seed)
        .chain(bytes.iter().copied())
        .fold(0x811c_9dc5, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        })
}

/// The synthetic SentencePiece tokenizer for `text` (see the module doc).
fn synthetic_spm(seed: u8, text: &str) -> Tokenizer {
    let mut tokens: Vec<String> = SPM_SPECIALS.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<TokenType> = SPM_SPECIALS.iter().map(|&(_, ty)| ty).collect();
    let mut scores = vec![0.0; tokens.len()];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte);
        scores.push(0.0);
    }
    tokens.push("▁".to_string());
    types.push(TokenType::Normal);
    scores.push(-1.0);
    let base = tokens.len();
    let escaped: Vec<char> = text
        .chars()
        .map(|c| if c == ' ' { '▁' } else { c })
        .collect();
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    'cut: for start in 0..escaped.len() {
        for len in 1..=3 {
            let Some(chars) = escaped.get(start..start + len) else {
                continue 'cut;
            };
            let piece: String = chars.iter().collect();
            let h = hash(seed, piece.as_bytes());
            if (len == 1 && h.is_multiple_of(4)) || !seen.insert(piece.clone()) {
                continue;
            }
            tokens.push(piece);
            types.push(TokenType::Normal);
            // Scores 0, -1, ..., -7; with seed bit 0, -0.0 instead of 0.0 (they are equal).
            let score = -(((h >> 8) % 8) as f32);
            scores.push(if score == 0.0 && seed & 1 != 0 {
                -0.0
            } else {
                score
            });
            if tokens.len() - base == MAX_PIECES {
                break 'cut;
            }
        }
    }
    Tokenizer::new(TokenizerSpec {
        tokens,
        token_types: types,
        model: TokenizerModel::Spm {
            scores,
            add_space_prefix: false,
        },
        bos: None,
        eos: Some(3),
        eot: None,
        eom: None,
        add_bos: true,
    })
    .expect("the synthetic SentencePiece vocabulary is consistent")
}

/// The real vocabularies a caller may have.
#[derive(Clone, Copy, Default)]
pub struct Real<'a> {
    /// SmolLM2's byte-level BPE.
    pub bpe: Option<&'a Vocab>,
    /// Gemma 3's SentencePiece.
    pub spm: Option<&'a Vocab>,
}

/// Runs the input on the vocabulary it selects (a real one when bit 3 of byte 0 is set
/// and the caller has it, a synthetic one otherwise).
///
/// # Panics
/// When a round trip, a decode or a stream disagrees with the properties above, or the
/// tokenizer panics.
pub fn check_tokenizer(data: &[u8], real: Real<'_>) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let sentencepiece = mode & 16 != 0;
    let chosen_real = match (mode & 8 != 0, sentencepiece) {
        (true, false) => real.bpe,
        (true, true) => real.spm,
        (false, _) => None,
    };
    let built;
    let (vocab, rest) = match chosen_real {
        Some(real) => (real, rest),
        None if sentencepiece => {
            let Some((&seed, rest)) = rest.split_first() else {
                return;
            };
            built = Vocab::new(synthetic_spm(seed, &String::from_utf8_lossy(rest)));
            (&built, rest)
        }
        None => (synthetic_vocab(mode >> 1), rest),
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

/// `decode(encode(s))` is `s` without the bytes that have no token (and `▁` as a space
/// for SentencePiece), and literal text has no control token.
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

/// `ids` (an encoding of `s`) decode to what [`Vocab::round_trip_of`] says, whole and
/// streamed.
fn check_round_trip(vocab: &Vocab, s: &str, ids: &[u32]) {
    let t = &vocab.tok;
    let ids = ids.to_vec();
    assert!(
        ids.iter().all(|&id| (id as usize) < t.vocab_size()),
        "{ids:?}"
    );
    let decoded = t.decode(&ids).expect("encoded ids are in the vocabulary");
    assert_eq!(decoded, vocab.round_trip_of(s), "round trip of {s:?}");
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
