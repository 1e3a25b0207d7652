//! Reading the tokenizer and chat template from a GGUF file's metadata.
//!
//! Keys (llama.cpp names):
//! - `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece);
//! - `tokenizer.ggml.tokens` (string array) and `tokenizer.ggml.token_type` (integer
//!   array, optional: all normal);
//! - BPE only: `tokenizer.ggml.merges` (string array) and `tokenizer.ggml.pre`
//!   (pre-tokenizer; absent means llama.cpp's `default`);
//! - SentencePiece only: `tokenizer.ggml.scores` (float or integer array, optional: all 0)
//!   and `tokenizer.ggml.add_space_prefix` (optional bool, default true as in llama.cpp);
//! - `tokenizer.ggml.{bos,eos,eot,eom}_token_id` (optional integers; for SentencePiece
//!   BOS and EOS default to llama.cpp's 1 and 2);
//! - `tokenizer.ggml.add_bos_token` (optional bool; the default is true for
//!   SentencePiece and the Llama 3 pre-tokenizer, false otherwise);
//! - `tokenizer.chat_template` (optional string).

use crate::gguf::{GgufError, GgufFile, Value};

use super::{
    ChatTemplate, PreTokenizerKind, TokenType, Tokenizer, TokenizerError, TokenizerModel,
    TokenizerSpec,
};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const MERGES: &str = "tokenizer.ggml.merges";
const SCORES: &str = "tokenizer.ggml.scores";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const BOS: &str = "tokenizer.ggml.bos_token_id";
const EOS: &str = "tokenizer.ggml.eos_token_id";
const EOT: &str = "tokenizer.ggml.eot_token_id";
const EOM: &str = "tokenizer.ggml.eom_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

impl Tokenizer {
    /// Builds the tokenizer described by the file's `tokenizer.*` metadata.
    ///
    /// # Errors
    /// [`TokenizerError::UnsupportedModel`] unless `tokenizer.ggml.model` is `gpt2` or
    /// `llama`; [`TokenizerError::UnsupportedPre`] naming an unknown `tokenizer.ggml.pre`
    /// (BPE);
    /// [`TokenizerError::Gguf`] for a missing key or a value of the wrong type (an array
    /// element is named `key[index]`); [`TokenizerError::BadTokenType`]; and the errors
    /// of [`Tokenizer::new`].
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let name = f.get_str(MODEL)?;
        let tokens = strings(f, TOKENS)?;
        // The model, whether BOS is added without an add_bos_token key, and llama.cpp's
        // BOS and EOS ids for a file that names none.
        let (model, default_add_bos, default_ids) = match name {
            "gpt2" => {
                let pre = PreTokenizerKind::from_name(optional(f, PRE, GgufFile::get_str)?)?;
                let merges = strings(f, MERGES)?;
                (
                    TokenizerModel::Bpe { merges, pre },
                    pre.default_add_bos(),
                    (None, None),
                )
            }
            "llama" => {
                let scores = match f.get(SCORES) {
                    None => vec![0.0; tokens.len()],
                    Some(_) => floats(f, SCORES)?,
                };
                let add_space_prefix =
                    optional(f, ADD_SPACE_PREFIX, GgufFile::get_bool)?.unwrap_or(true);
                let model = TokenizerModel::Spm {
                    scores,
                    add_space_prefix,
                };
                (model, true, (Some(1), Some(2)))
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let token_types = match f.get(TOKEN_TYPE) {
            None => Vec::new(),
            Some(_) => f
                .get_array(TOKEN_TYPE)?
                .iter()
                .enumerate()
                .map(|(index, v)| {
                    let code = v
                        .as_i64()
                        .ok_or_else(|| wrong_element(TOKEN_TYPE, index, v, "integer"))?;
                    TokenType::from_code(code).ok_or(TokenizerError::BadTokenType { index, code })
                })
                .collect::<Result<_, _>>()?,
        };
        let add_bos = optional(f, ADD_BOS, GgufFile::get_bool)?.unwrap_or(default_add_bos);
        let n = tokens.len();
        let or_default =
            |id: Option<u32>, default: Option<u32>| id.or(default.filter(|&d| (d as usize) < n));
        Tokenizer::new(TokenizerSpec {
            bos: or_default(special_id(f, BOS, "bos", n)?, default_ids.0),
            eos: or_default(special_id(f, EOS, "eos", n)?, default_ids.1),
            eot: special_id(f, EOT, "eot", n)?,
            eom: special_id(f, EOM, "eom", n)?,
            tokens,
            token_types,
            model,
            add_bos,
        })
    }
}

impl ChatTemplate {
    /// Compiles the file's `tokenizer.chat_template`, with the texts of its BOS and EOS
    /// tokens (empty strings where the file names none); `Ok(None)` if the file has no
    /// template.
    ///
    /// # Errors
    /// [`TokenizerError::Gguf`] for a value of the wrong type,
    /// [`TokenizerError::SpecialIdOutOfRange`], and the errors of [`ChatTemplate::new`].
    pub fn from_gguf(f: &GgufFile) -> Result<Option<ChatTemplate>, TokenizerError> {
        let Some(source) = optional(f, CHAT_TEMPLATE, GgufFile::get_str)? else {
            return Ok(None);
        };
        let tokens = match f.get(TOKENS) {
            None => &[][..],
            Some(_) => f.get_array(TOKENS)?,
        };
        let text_of = |key: &str, name: &'static str| -> Result<&str, TokenizerError> {
            let Some(id) = special_id(f, key, name, tokens.len())? else {
                return Ok("");
            };
            let v = &tokens[id as usize];
            v.as_str()
                .ok_or_else(|| wrong_element(TOKENS, id as usize, v, "string"))
        };
        ChatTemplate::new(source, text_of(BOS, "bos")?, text_of(EOS, "eos")?).map(Some)
    }
}

/// The value of an optional key: `None` if absent, an error if present with a wrong type.
fn optional<'f, T>(
    f: &'f GgufFile,
    key: &str,
    get: impl Fn(&'f GgufFile, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, GgufError> {
    f.get(key).map(|_| get(f, key)).transpose()
}

/// A string-array key as owned strings.
fn strings(f: &GgufFile, key: &str) -> Result<Vec<String>, TokenizerError> {
    f.get_array(key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| wrong_element(key, i, v, "string"))
        })
        .collect()
}

/// A number-array key as `f32`s (float elements, or integers as llama.cpp also accepts).
fn floats(f: &GgufFile, key: &str) -> Result<Vec<f32>, TokenizerError> {
    f.get_array(key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f32()
                .or_else(|| v.as_i64().map(|x| x as f32))
                .ok_or_else(|| wrong_element(key, i, v, "number"))
        })
        .collect()
}

/// An optional special-token id, checked against the vocabulary size.
fn special_id(
    f: &GgufFile,
    key: &str,
    name: &'static str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(id) = optional(f, key, GgufFile::get_u64)? else {
        return Ok(None);
    };
    match u32::try_from(id) {
        Ok(small) if (small as usize) < vocab_size => Ok(Some(small)),
        _ => Err(TokenizerError::SpecialIdOutOfRange {
            name,
            id,
            vocab_size,
        }),
    }
}

/// The error for array element `key[index]` holding `v` instead of `expected`.
fn wrong_element(key: &str, index: usize, v: &Value, expected: &'static str) -> TokenizerError {
    TokenizerError::Gguf(GgufError::WrongType {
        key: format!("{key}[{index}]"),
        expected,
        found: v.type_name(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;
    use crate::tokenizer::Special;

    /// A file with a four-token vocabulary and one merge, with `changes` replacing (or
    /// adding) metadata entries.
    fn file(changes: Vec<(&str, Value)>) -> GgufFile {
        let strs =
            |xs: &[&str]| Value::Array(xs.iter().map(|s| Value::Str(s.to_string())).collect());
        let entries = vec![
            (MODEL, Value::Str("gpt2".into())),
            (PRE, Value::Str("smollm".into())),
            (TOKENS, strs(&["a", "b", "ab", "<|im_end|>"])),
            (
                TOKEN_TYPE,
                Value::Array([1, 1, 1, 3].map(Value::I32).to_vec()),
            ),
            (MERGES, strs(&["a b"])),
            (EOS, Value::U32(3)),
            (CHAT_TEMPLATE, Value::Str("{{ eos_token }}".into())),
        ];
        build(entries, changes)
    }

    /// A file holding `entries`, with `changes` replacing (or adding) some.
    fn build<'k>(mut entries: Vec<(&'k str, Value)>, changes: Vec<(&'k str, Value)>) -> GgufFile {
        for (key, value) in changes {
            entries.retain(|(k, _)| *k != key);
            entries.push((key, value));
        }
        let mut w = GgufWriter::new();
        for (key, value) in entries {
            w.metadata(key, value);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn reads_a_small_vocabulary() {
        let f = file(vec![]);
        let t = Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(t.encode("ab<|im_end|>", Special::Parse), [2, 3]);
        assert_eq!(t.eos_id(), Some(3));
        assert!(t.is_stop(3));
        assert!(!t.add_bos());
        assert_eq!(t.pre_tokenizer(), Some(PreTokenizerKind::DigitsThenGpt2));
        let tpl = ChatTemplate::from_gguf(&f).unwrap().unwrap();
        assert_eq!(tpl.render(&[], false).unwrap(), "<|im_end|>");
    }

    #[test]
    fn bad_metadata_is_named() {
        let err =
            Tokenizer::from_gguf(&file(vec![(PRE, Value::Str("no-such-pre".into()))])).unwrap_err();
        assert!(err.to_string().contains("no-such-pre"), "{err}");

        let err = Tokenizer::from_gguf(&file(vec![(EOS, Value::U32(4))])).unwrap_err();
        assert!(
            matches!(
                err,
                TokenizerError::SpecialIdOutOfRange {
                    name: "eos",
                    id: 4,
                    ..
                }
            ),
            "{err}"
        );

        let tokens = Value::Array(vec![Value::U8(7), Value::U8(1)]);
        let err = Tokenizer::from_gguf(&file(vec![(TOKENS, tokens)])).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.tokens[0]"),
            "{err}"
        );

        let err = Tokenizer::from_gguf(&file(vec![(MODEL, Value::Str("t5".into()))])).unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedModel(m) if m == "t5"));

        let scores = Value::Array(vec![Value::Str("x".into()); 4]);
        let err = Tokenizer::from_gguf(&spm_file(vec![(SCORES, scores)])).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.scores[0]"),
            "{err}"
        );
        let err =
            Tokenizer::from_gguf(&spm_file(vec![(SCORES, Value::Array(vec![]))])).unwrap_err();
        assert!(matches!(
            err,
            TokenizerError::ScoreCountMismatch {
                tokens: 4,
                scores: 0
            }
        ));
    }

    /// A SentencePiece file: `"▁"`, `"a"`, `"▁a"`, `"<eos>"` with scores, and no EOS id,
    /// `add_bos_token` or `add_space_prefix`; `changes` as for [`file`].
    fn spm_file(changes: Vec<(&str, Value)>) -> GgufFile {
        let strs =
            |xs: &[&str]| Value::Array(xs.iter().map(|s| Value::Str(s.to_string())).collect());
        let entries = vec![
            (MODEL, Value::Str("llama".into())),
            (TOKENS, strs(&["▁", "a", "▁a", "<eos>"])),
            (
                TOKEN_TYPE,
                Value::Array([1, 1, 1, 3].map(Value::I32).to_vec()),
            ),
            (
                SCORES,
                Value::Array([-1, -1, 0, 0].map(Value::I32).to_vec()),
            ),
        ];
        build(entries, changes)
    }

    #[test]
    fn reads_a_sentencepiece_vocabulary_with_llama_cpp_defaults() {
        let t = Tokenizer::from_gguf(&spm_file(vec![])).unwrap();
        // The space prefix is on by default: " a" and "a" both start with "▁a".
        assert_eq!(t.encode("a", Special::Parse), [2]);
        assert_eq!(t.encode(" a", Special::Parse), [0, 2]);
        assert_eq!(t.decode(&[0, 2]).unwrap(), "  a");
        assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
        assert!(t.add_bos());
        assert_eq!(t.pre_tokenizer(), None);

        let f = spm_file(vec![
            (ADD_SPACE_PREFIX, Value::Bool(false)),
            (ADD_BOS, Value::Bool(false)),
            (EOS, Value::U32(3)),
        ]);
        let t = Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(t.encode("a", Special::Parse), [1]);
        assert_eq!(t.eos_id(), Some(3));
        assert!(!t.add_bos());
    }
}
