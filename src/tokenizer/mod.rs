//! The tokenizer: the two algorithms llama.cpp runs on GGUF vocabularies, byte-level BPE
//! (`tokenizer.ggml.model = gpt2`, SmolLM2) and SentencePiece merging by score (`llama`,
//! Gemma 3), built from a GGUF file's own vocabulary; its chat template; and streaming
//! detokenization.
//!
//! Encoding follows llama.cpp (`llama_tokenize`, no BOS) step by step, so ids match it
//! exactly:
//! 1. `special`: cut the text at special tokens, longest first; those become their ids
//!    directly. User-defined tokens (type 4, e.g. Gemma's runs of newlines, spaces and tabs
//!    and its HTML tags) are cut in every mode, control and unknown tokens only with
//!    [`Special::Parse`].
//! 2. Every stretch of text between them is encoded by the file's algorithm:
//!    - `bpe`: split into words with the regex list that `tokenizer.ggml.pre` names
//!      (`pretokenize`), write each word's bytes as their vocabulary chars (`bytes`, the
//!      GPT-2 byte-to-unicode map) and merge adjacent pairs by rank
//!      (`tokenizer.ggml.merges`);
//!    - `spm`: write every space as `▁` (U+2581), then merge adjacent pieces by score
//!      (`tokenizer.ggml.scores`); a character left without a token becomes the byte
//!      tokens `<0xNN>` of its UTF-8 bytes.
//!
//! Decoding maps each id to bytes (ordinary tokens through the byte map reversed, or with
//! `▁` read as a space; byte tokens `<0xNN>` as their byte; control, user-defined and
//! unknown tokens as their literal text), concatenates, and replaces invalid UTF-8 only once
//! at the end; [`StreamDecoder`] does the same incrementally, so a character spelled by
//! several tokens (BPE pieces or byte-fallback tokens) comes out whole.
//! [`ChatTemplate`] renders the file's Jinja chat template with `minijinja`.
//!
//! Layout: the vocabulary is a `Vec` indexed by token id (`u32`), with a text → id map and
//! each token's decoded bytes precomputed; beside it, the algorithm's own tables (BPE
//! merges keyed by the pair of token ids, SentencePiece scores by id) in an enum.

mod bpe;
mod bytes;
mod chat;
mod metadata;
mod pretokenize;
mod special;
mod spm;
mod stream;

use std::collections::HashMap;

pub use chat::{ChatMessage, ChatPart, ChatTemplate, PartKind, RenderedChat};
pub use pretokenize::PreTokenizerKind;
pub use stream::{StopMatcher, StreamDecoder};

use bpe::Bpe;
use special::Fragment;
use spm::Spm;

/// Errors from building a tokenizer, decoding, or rendering a chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A token id that is not below the vocabulary size.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// `tokenizer.ggml.model` names a tokenizer kvcore does not implement.
    #[error(
        "unsupported tokenizer model {0:?}: supported are \"gpt2\" (byte-level BPE) and \
         \"llama\" (SentencePiece)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer kvcore does not implement.
    #[error(
        "unsupported pre-tokenizer {0:?}: supported are default, gpt-2/gpt2, smollm \
         (and starcoder, refact, command-r, ...), llama3/llama-bpe"
    )]
    UnsupportedPre(String),
    /// The vocabulary has no tokens, or more than `u32` ids can address.
    #[error("vocabulary size {size} is unusable (need 1..=2^32 tokens)")]
    BadVocabSize {
        /// Number of tokens given.
        size: usize,
    },
    /// The token-type list does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TypeCountMismatch {
        /// Number of tokens.
        tokens: usize,
        /// Number of token types.
        types: usize,
    },
    /// The score list does not have one entry per token.
    #[error("{scores} token scores for {tokens} tokens")]
    ScoreCountMismatch {
        /// Number of tokens.
        tokens: usize,
        /// Number of scores.
        scores: usize,
    },
    /// A token type code outside llama.cpp's `0..=6`.
    #[error("token {index} has unknown token type {code}")]
    BadTokenType {
        /// The token id.
        index: usize,
        /// The code found.
        code: i64,
    },
    /// A merge rule that is not two vocabulary tokens whose concatenation is a token.
    #[error("merge {index} ({merge:?}) is invalid: {reason}")]
    BadMerge {
        /// Rank (index) of the merge.
        index: usize,
        /// The merge text, `"left right"`.
        merge: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A special-token id from the metadata (BOS, EOS, ...) outside the vocabulary.
    #[error("{name} token id {id} is outside the vocabulary (size {vocab_size})")]
    SpecialIdOutOfRange {
        /// Which special token (`"bos"`, `"eos"`, `"eot"`, `"eom"`).
        name: &'static str,
        /// The id found.
        id: u64,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// Reading the tokenizer metadata from the GGUF file failed (a missing key, a value of
    /// the wrong type; an array element is named `key[index]`). The message includes the
    /// [`GgufError`](crate::gguf::GgufError)'s, so it is not also the `source`.
    #[error("tokenizer metadata: {0}")]
    Gguf(crate::gguf::GgufError),
    /// The chat template failed to compile or to render; the message names the problem.
    #[error("chat template: {0}")]
    Template(String),
}

/// Whether special-token texts in the input of [`Tokenizer::encode`] become control
/// tokens (llama.cpp's `parse_special`). There is no default: every call says whose
/// text it encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// Control-token texts become their ids: for markup the program wrote.
    Parse,
    /// Control-token texts stay literal text: for anything a user wrote.
    Literal,
}

impl From<crate::gguf::GgufError> for TokenizerError {
    fn from(e: crate::gguf::GgufError) -> Self {
        TokenizerError::Gguf(e)
    }
}

/// A token's type, as stored in `tokenizer.ggml.token_type` (llama.cpp's
/// `llama_token_type` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// Code 0: no type recorded; treated like [`TokenType::Normal`].
    Undefined,
    /// Code 1: an ordinary vocabulary token, text in byte-level form (BPE) or with `▁` for
    /// a space (SentencePiece).
    Normal,
    /// Code 2: the unknown token; matched and printed as literal text.
    Unknown,
    /// Code 3: a control token (`<|im_start|>`); matched and printed as literal text.
    Control,
    /// Code 4: a user-defined added token; matched and printed as literal text.
    UserDefined,
    /// Code 5: an unused slot; treated like [`TokenType::Normal`].
    Unused,
    /// Code 6: a byte token `<0xHH>`; prints as that single byte.
    Byte,
}

impl TokenType {
    /// The type for a llama.cpp code, or `None` for a code outside `0..=6`.
    pub fn from_code(code: i64) -> Option<TokenType> {
        Some(match code {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether tokens of this type are matched verbatim in input text and printed as
    /// their literal text.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenType::Unknown | TokenType::Control | TokenType::UserDefined
        )
    }
}

/// Texts of end-of-generation tokens that llama.cpp recognises by name in any vocabulary.
const STOP_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];

/// The encoding algorithm and its own data (`tokenizer.ggml.model` and what it needs).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TokenizerModel {
    /// Byte-level BPE (`gpt2`): pre-tokenize, then merge by rank.
    Bpe {
        /// Merge rules `"left right"`, rank = index (`tokenizer.ggml.merges`).
        merges: Vec<String>,
        /// The pre-tokenizer family (`tokenizer.ggml.pre`).
        pre: PreTokenizerKind,
    },
    /// SentencePiece (`llama`): spaces as `▁`, merge by score, byte fallback.
    Spm {
        /// One score per token, higher merges first (`tokenizer.ggml.scores`).
        scores: Vec<f32>,
        /// Whether a `▁` goes before text at the start and after each special token
        /// (`tokenizer.ggml.add_space_prefix`; false for Gemma 3).
        add_space_prefix: bool,
    },
}

/// Everything needed to build a [`Tokenizer`], as plain data (what the GGUF metadata
/// holds, already decoded).
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// Token texts indexed by id (`tokenizer.ggml.tokens`), ordinary tokens in the model's
    /// form: GPT-2 byte-level for BPE (`"Ġthe"` is `" the"`), `▁` for a space for
    /// SentencePiece (`"▁the"`).
    pub tokens: Vec<String>,
    /// One type per token (`tokenizer.ggml.token_type`); empty means all
    /// [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// The algorithm and its data.
    pub model: TokenizerModel,
    /// Beginning-of-sequence id (`tokenizer.ggml.bos_token_id`).
    pub bos: Option<u32>,
    /// End-of-sequence id (`tokenizer.ggml.eos_token_id`).
    pub eos: Option<u32>,
    /// End-of-turn id (`tokenizer.ggml.eot_token_id`), a stop token.
    pub eot: Option<u32>,
    /// End-of-message id (`tokenizer.ggml.eom_token_id`), a stop token.
    pub eom: Option<u32>,
    /// Whether callers should put BOS before a prompt (`tokenizer.ggml.add_bos_token`);
    /// [`Tokenizer::encode`] itself never adds it.
    pub add_bos: bool,
}

/// A byte-level BPE or SentencePiece tokenizer (see the module doc for the algorithms).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Token texts by id, as stored in the file.
    tokens: Vec<String>,
    /// Token types by id.
    types: Vec<TokenType>,
    /// The bytes each token decodes to, by id.
    token_bytes: Vec<Box<[u8]>>,
    /// Exact text → id (the last id wins for a repeated text, as in llama.cpp).
    token_to_id: HashMap<String, u32>,
    algorithm: Algorithm,
    /// Special tokens `(id, text)` matched in input with [`Special::Parse`], longest
    /// text first.
    specials: Vec<(u32, String)>,
    /// The user-defined ones among them, matched in every mode (as llama.cpp does).
    user_defined: Vec<(u32, String)>,
    /// End-of-generation ids, sorted.
    stops: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

/// The encoding algorithm with its tables (boxed: both hold 256-entry byte tables).
#[derive(Debug, Clone)]
enum Algorithm {
    Bpe(Box<Bpe>),
    Spm(Box<Spm>),
}

impl Tokenizer {
    /// Builds a tokenizer from plain data.
    ///
    /// # Errors
    /// [`TokenizerError::BadVocabSize`], [`TokenizerError::TypeCountMismatch`],
    /// [`TokenizerError::BadMerge`] (a side or the result is not a token, or no space
    /// separator), [`TokenizerError::ScoreCountMismatch`],
    /// [`TokenizerError::SpecialIdOutOfRange`].
    pub fn new(spec: TokenizerSpec) -> Result<Tokenizer, TokenizerError> {
        let TokenizerSpec {
            tokens,
            token_types,
            model,
            bos,
            eos,
            eot,
            eom,
            add_bos,
        } = spec;
        let n = tokens.len();
        if n == 0 || u32::try_from(n - 1).is_err() {
            return Err(TokenizerError::BadVocabSize { size: n });
        }
        let types = if token_types.is_empty() {
            vec![TokenType::Normal; n]
        } else if token_types.len() == n {
            token_types
        } else {
            return Err(TokenizerError::TypeCountMismatch {
                tokens: n,
                types: token_types.len(),
            });
        };
        for (name, id) in [("bos", bos), ("eos", eos), ("eot", eot), ("eom", eom)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TokenizerError::SpecialIdOutOfRange {
                    name,
                    id: u64::from(id),
                    vocab_size: n,
                });
            }
        }

        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let algorithm = match model {
            TokenizerModel::Bpe { merges, pre } => {
                Algorithm::Bpe(Box::new(Bpe::new(&merges, pre, &token_to_id)?))
            }
            TokenizerModel::Spm {
                scores,
                add_space_prefix,
            } => Algorithm::Spm(Box::new(Spm::new(
                scores,
                &types,
                &token_to_id,
                add_space_prefix,
            )?)),
        };
        let token_bytes = tokens
            .iter()
            .zip(&types)
            .map(|(text, &ty)| algorithm.token_to_bytes(text, ty))
            .collect();

        let mut specials: Vec<(u32, String)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (text, ty))| ty.is_special() && !text.is_empty())
            .map(|(i, (text, _))| (i as u32, text.clone()))
            .collect();
        specials.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let user_defined = specials
            .iter()
            .filter(|(id, _)| types[*id as usize] == TokenType::UserDefined)
            .cloned()
            .collect();

        let mut stops: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        stops.extend(
            STOP_TEXTS
                .iter()
                .filter_map(|t| token_to_id.get(*t).copied()),
        );
        stops.sort_unstable();
        stops.dedup();

        Ok(Tokenizer {
            tokens,
            types,
            token_bytes,
            token_to_id,
            algorithm,
            specials,
            user_defined,
            stops,
            bos,
            eos,
            add_bos,
        })
    }

    /// Encodes `text` into token ids; no BOS is added (see [`Tokenizer::add_bos`]).
    ///
    /// `special` says whose text this is. [`Special::Parse`] is for text the program
    /// wrote, such as a chat template's markup: control-token texts (`<|im_start|>`)
    /// become their ids. [`Special::Literal`] is for text a user wrote: control-token
    /// texts stay text, encoded as ordinary pieces, so a message cannot end its own turn.
    /// User-defined tokens (type 4) are matched in both modes, as in llama.cpp.
    ///
    /// BPE: a byte whose single-byte token is missing from the vocabulary is dropped, as in
    /// llama.cpp (SmolLM2's lacks 21 bytes, among them `0xF1` and `0xF2`, the lead bytes of
    /// planes 4 to 11). Whenever every byte of `text` has a token, decoding gives `text`
    /// back. SentencePiece: a character without a token falls back to its byte tokens
    /// (Gemma 3 has all 256), and decoding gives `text` back with every `▁` as a space.
    pub fn encode(&self, text: &str, special: Special) -> Vec<u32> {
        let specials = match special {
            Special::Parse => &self.specials,
            Special::Literal => &self.user_defined,
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut after_special = true;
        for frag in special::partition(text, specials) {
            match frag {
                Fragment::Special(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    let part = &text[range];
                    match &self.algorithm {
                        Algorithm::Bpe(bpe) => bpe.encode(part, &self.token_to_id, &mut out),
                        Algorithm::Spm(spm) => {
                            spm.encode(part, after_special, &self.token_to_id, &mut out)
                        }
                    }
                    after_special = false;
                }
            }
        }
        out
    }

    /// Whether `id` is a control token: one that [`Special::Literal`] text never
    /// produces.
    pub fn is_control(&self, id: u32) -> bool {
        matches!(
            self.types.get(id as usize),
            Some(TokenType::Control | TokenType::Unknown)
        )
    }

    /// Decodes ids to text: the tokens' bytes concatenated, then read as UTF-8 with each
    /// invalid sequence replaced by U+FFFD (only an id sequence that does not come from
    /// [`Tokenizer::encode`] can produce one).
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id not below [`Tokenizer::vocab_size`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The raw bytes token `id` decodes to (possibly part of a UTF-8 character).
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.token_bytes
            .get(id as usize)
            .map(|b| &b[..])
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.tokens.len(),
            })
    }

    /// A decoder for streaming output one token at a time.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// Number of tokens; valid ids are `0..vocab_size`.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence id, if the file names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the file names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model expects BOS before a prompt (`tokenizer.ggml.add_bos_token`,
    /// false for SmolLM2). [`Tokenizer::encode`] never adds it; callers do.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generation should stop after `id`: EOS, the metadata's end-of-turn and
    /// end-of-message ids, and any token named `<|im_end|>`, `<|endoftext|>`,
    /// `<|eot_id|>`, `<|eom_id|>`, `<|end|>`, `<end_of_turn>`, `<|end_of_text|>`,
    /// `<EOT>`, `_<EOT>` or `<end_of_utterance>` (llama.cpp's end-of-generation set).
    pub fn is_stop(&self, id: u32) -> bool {
        self.stops.binary_search(&id).is_ok()
    }

    /// The id of the token whose stored text is exactly `text` (`"<|im_end|>"`, or an
    /// ordinary token in the vocabulary's form, such as `"Ġthe"` or `"▁the"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The stored text of token `id`, or `None` outside the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The type of token `id`, or `None` outside the vocabulary.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The pre-tokenizer family in use; `None` for SentencePiece, which has none.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizerKind> {
        match &self.algorithm {
            Algorithm::Bpe(bpe) => Some(bpe.pre_kind()),
            Algorithm::Spm(_) => None,
        }
    }
}

impl Algorithm {
    /// The bytes a token stands for: special tokens are their literal text, byte tokens
    /// `<0xHH>` their byte, ordinary ones go through the algorithm's own spelling.
    fn token_to_bytes(&self, text: &str, ty: TokenType) -> Box<[u8]> {
        if ty.is_special() {
            return text.as_bytes().into();
        }
        if ty == TokenType::Byte
            && let Some(b) = parse_byte_token(text)
        {
            return Box::new([b]);
        }
        match self {
            Algorithm::Bpe(bpe) => bpe.token_bytes(text),
            Algorithm::Spm(_) => spm::token_bytes(text),
        }
        .into_boxed_slice()
    }
}

/// `"<0x41>"` → `0x41`.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::bytes::ByteMap;
    use super::*;

    /// A toy vocabulary: the 256 byte chars (id `b` is byte `b`), then merged tokens and
    /// two specials, `<|im_end|>` (259, the end of generation) and `<|x|>` (260).
    pub(crate) fn toy() -> Tokenizer {
        let map = ByteMap::new();
        let mut tokens: Vec<String> = (0..=255u8).map(|b| map.char_of(b).to_string()).collect();
        let extra = ["Ġh", "Ġhi", "hi", "<|im_end|>", "<|x|>"];
        tokens.extend(extra.iter().map(|s| s.to_string()));
        let mut types = vec![TokenType::Normal; tokens.len()];
        let n = types.len();
        types[n - 2] = TokenType::Control;
        types[n - 1] = TokenType::UserDefined;
        Tokenizer::new(TokenizerSpec {
            tokens,
            token_types: types,
            model: TokenizerModel::Bpe {
                merges: vec!["Ġ h".into(), "Ġh i".into(), "h i".into()],
                pre: PreTokenizerKind::Gpt2,
            },
            bos: None,
            eos: Some(256 + 3),
            eot: None,
            eom: None,
            add_bos: false,
        })
        .unwrap()
    }

    #[test]
    fn encodes_merges_and_specials() {
        let t = toy();
        let im_end = t.token_id("<|im_end|>").unwrap();
        let x = t.token_id("<|x|>").unwrap();
        let ids = t.encode("hi hi<|im_end|>!<|x|>", Special::Parse);
        assert_eq!(
            ids,
            [
                t.token_id("hi").unwrap(),
                t.token_id("Ġhi").unwrap(),
                im_end,
                t.token_id("!").unwrap(),
                x
            ]
        );
        assert_eq!(t.decode(&ids).unwrap(), "hi hi<|im_end|>!<|x|>");
        let literal = t.encode("hi hi<|im_end|>!<|x|>", Special::Literal);
        assert!(!literal.contains(&im_end), "{literal:?}");
        assert_eq!(t.decode(&literal).unwrap(), "hi hi<|im_end|>!<|x|>");
        assert!(t.is_control(im_end));
        assert!(t.is_stop(im_end));
        assert!(!t.is_stop(x));
    }

    #[test]
    fn unknown_ids_and_bad_merges_are_errors() {
        let t = toy();
        let n = t.vocab_size() as u32;
        assert!(matches!(
            t.decode(&[0, n]),
            Err(TokenizerError::UnknownId { id, vocab_size }) if id == n && vocab_size == n as usize
        ));
        let spec = TokenizerSpec {
            tokens: vec!["a".into(), "b".into()],
            token_types: vec![],
            model: TokenizerModel::Bpe {
                merges: vec!["a b".into()],
                pre: PreTokenizerKind::Gpt2,
            },
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            add_bos: false,
        };
        let err = Tokenizer::new(spec).unwrap_err();
        assert!(err.to_string().contains("\"ab\" is not a token"), "{err}");
    }

    /// A toy SentencePiece vocabulary in Gemma's shape: a control turn marker, a
    /// user-defined run of two spaces, ordinary pieces with `▁`, and every byte token.
    fn toy_spm() -> Tokenizer {
        let mut tokens: Vec<String> = ["<eos>", "<turn>", "  ", "▁", "h", "i", "▁h", "▁hi", "hi"]
            .map(String::from)
            .to_vec();
        let mut types = [3, 3, 4, 1, 1, 1, 1, 1, 1]
            .map(|c| TokenType::from_code(c).unwrap())
            .to_vec();
        let mut scores = vec![0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -3.0, -2.0, -4.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(TokenType::Byte);
            scores.push(0.0);
        }
        Tokenizer::new(TokenizerSpec {
            tokens,
            token_types: types,
            model: TokenizerModel::Spm {
                scores,
                add_space_prefix: false,
            },
            bos: None,
            eos: Some(0),
            eot: None,
            eom: None,
            add_bos: true,
        })
        .unwrap()
    }

    #[test]
    fn sentencepiece_cuts_user_defined_always_and_control_only_when_parsing() {
        let t = toy_spm();
        let id = |s: &str| t.token_id(s).unwrap();
        let text = "hi  hi<turn> é";
        // "  " is user-defined: the "hi" after it gets no ▁. The ▁ before "é" stays
        // alone, and "é" (no token) is its two bytes.
        let parsed = t.encode(text, Special::Parse);
        assert_eq!(
            parsed,
            [
                id("hi"),
                id("  "),
                id("hi"),
                id("<turn>"),
                id("▁"),
                id("<0xC3>"),
                id("<0xA9>")
            ]
        );
        let literal = t.encode(text, Special::Literal);
        assert!(!literal.iter().any(|&i| t.is_control(i)), "{literal:?}");
        assert_eq!(&literal[..3], &parsed[..3]);
        for ids in [&parsed, &literal] {
            assert_eq!(t.decode(ids).unwrap(), text);
            let mut stream = t.stream();
            let chunks: Vec<String> = ids.iter().map(|&i| stream.push(i).unwrap()).collect();
            assert_eq!(stream.finish(), "");
            assert!(chunks.iter().all(|c| !c.contains('\u{fffd}')), "{chunks:?}");
            assert_eq!(chunks.concat(), text);
        }
        // " hi": "▁h" (-3) beats "hi" (-4), and then "▁hi" (-2) forms.
        assert_eq!(t.encode(" hi", Special::Literal), [id("▁hi")]);
        assert!(t.is_stop(id("<eos>")) && t.is_control(id("<turn>")));
        assert_eq!(t.pre_tokenizer(), None);
    }

    #[test]
    fn tokenizer_and_template_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
        shareable::<ChatTemplate>();
    }

    #[test]
    fn byte_tokens_decode_to_their_byte() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token("<0x0A"), None);
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }
}
