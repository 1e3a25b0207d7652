//! Pre-tokenizers: split text into words before BPE, as llama.cpp does for each
//! `tokenizer.ggml.pre` value.
//!
//! A pre-tokenizer is a list of regular expressions applied in sequence (llama.cpp
//! `unicode_regex_split`): the text starts as one piece; each regex splits every piece
//! produced by the previous one into its matches *and* the unmatched stretches between
//! them, so nothing is dropped and the pieces always concatenate back to the input. A
//! regex sees only its piece, so a lookahead such as `(?!\S)` treats the piece's end as the
//! end of text. The lists are the ones in llama.cpp `src/llama-vocab.cpp`
//! (`llm_tokenizer_bpe`); the look-ahead needs `fancy-regex`.
//!
//! Pieces are byte ranges into the input, `[start, end)`, in order.

use std::ops::Range;

use fancy_regex::Regex;
use std::sync::OnceLock;

use super::TokenizerError;

/// The GPT-2 word pattern (llama.cpp's spelling, without GPT-2's trailing `|\s+`: a lone
/// whitespace character before a non-space stays an unmatched piece of its own, which
/// splits the same way).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// The Llama 3 word pattern, with the case-insensitive contractions spelled out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families kvcore supports, named by the regex list they use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback list (`pre = "default"` or no `pre` key): runs of punctuation,
    /// then GPT-2 words, then runs of digits, then triples of ASCII digits.
    Default,
    /// The GPT-2 pattern alone (`gpt-2`, `gpt2`, `phi-2`, `mpt`, `olmo`, `jais`).
    Gpt2,
    /// Every digit alone (`\p{N}`), then the GPT-2 pattern (`smollm`, `starcoder`,
    /// `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`).
    DigitsThenGpt2,
    /// The Llama 3 pattern: digits in groups of up to three, letters with one leading
    /// non-letter (`llama3`, `llama-v3`, `llama-bpe`). A word that is itself a token is
    /// not merged further (llama.cpp's `ignore_merges`).
    Llama3,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value to its family; `None` means the key is absent.
    ///
    /// # Errors
    /// [`TokenizerError::UnsupportedPre`] for any other name.
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizerKind, TokenizerError> {
        Ok(match name {
            None | Some("default") => PreTokenizerKind::Default,
            Some("gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais") => PreTokenizerKind::Gpt2,
            Some(
                "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
                | "minerva-7b",
            ) => PreTokenizerKind::DigitsThenGpt2,
            Some("llama3" | "llama-v3" | "llama-bpe") => PreTokenizerKind::Llama3,
            Some(other) => return Err(TokenizerError::UnsupportedPre(other.to_string())),
        })
    }

    /// The regex list, applied in order.
    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Default => {
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
            }
            PreTokenizerKind::Gpt2 => &[GPT2],
            PreTokenizerKind::DigitsThenGpt2 => &[r"\p{N}", GPT2],
            PreTokenizerKind::Llama3 => &[LLAMA3],
        }
    }

    /// Whether a word that is already a vocabulary token skips BPE (llama.cpp
    /// `ignore_merges`, set for the Llama 3 family).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizerKind::Llama3
    }

    /// Whether a BOS token is added by default when the file has no
    /// `tokenizer.ggml.add_bos_token` key (llama.cpp sets it for the Llama 3 family).
    pub(crate) fn default_add_bos(self) -> bool {
        self == PreTokenizerKind::Llama3
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct PreTokenizer {
    kind: PreTokenizerKind,
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    /// The regex list of `kind`, compiled once per process and shared (a `Regex` clone
    /// shares the compiled program): building a tokenizer is then cheap, which matters
    /// to the fuzzers that build one per input.
    pub(crate) fn new(kind: PreTokenizerKind) -> PreTokenizer {
        static COMPILED: [OnceLock<Vec<Regex>>; 4] = [const { OnceLock::new() }; 4];
        let slot = match kind {
            PreTokenizerKind::Default => 0,
            PreTokenizerKind::Gpt2 => 1,
            PreTokenizerKind::DigitsThenGpt2 => 2,
            PreTokenizerKind::Llama3 => 3,
        };
        let regexes = COMPILED[slot]
            .get_or_init(|| {
                kind.patterns()
                    .iter()
                    .map(|p| Regex::new(p).expect("built-in pre-tokenizer patterns compile"))
                    .collect()
            })
            .clone();
        PreTokenizer { kind, regexes }
    }

    /// The family this pre-tokenizer implements.
    pub(crate) fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Splits `text` into word ranges that tile it exactly (see the module doc).
    pub(crate) fn split(&self, text: &str) -> Vec<Range<usize>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut pieces: Vec<Range<usize>> = std::iter::once(0..text.len()).collect();
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in &pieces {
                split_piece(re, text, piece.clone(), &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// Splits `text[piece]` by `re` into matches and the gaps between them, appending the
/// absolute ranges to `out`. If the regex engine gives up (its backtracking limit, which
/// these patterns do not approach), the rest of the piece is kept whole.
fn split_piece(re: &Regex, text: &str, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let base = piece.start;
    let mut last = 0;
    for m in re.find_iter(&text[piece.clone()]) {
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(base + last..base + m.start());
        }
        if m.end() > m.start() {
            out.push(base + m.start()..base + m.end());
        }
        last = m.end();
    }
    if base + last < piece.end {
        out.push(base + last..piece.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<&str> {
        let p = PreTokenizer::new(kind);
        p.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn smollm_splits_digits_then_gpt2_words() {
        assert_eq!(
            words(PreTokenizerKind::DigitsThenGpt2, "12345 and 3.1"),
            ["1", "2", "3", "4", "5", " and", " ", "3", ".", "1"]
        );
        assert_eq!(
            words(PreTokenizerKind::DigitsThenGpt2, "It's  a\n\nb   "),
            ["It", "'s", " ", " a", "\n", "\n", "b", "   "]
        );
    }

    #[test]
    fn gpt2_keeps_number_runs() {
        assert_eq!(
            words(PreTokenizerKind::Gpt2, "x 2024!"),
            ["x", " 2024", "!"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(
            words(PreTokenizerKind::Llama3, "12345 HELLO'S\n\n x"),
            ["123", "45", " HELLO", "'S", "\n\n", " x"]
        );
    }

    #[test]
    fn unknown_pre_is_named_in_the_error() {
        let err = PreTokenizerKind::from_name(Some("qwen9")).unwrap_err();
        assert!(err.to_string().contains("qwen9"), "{err}");
    }
}
