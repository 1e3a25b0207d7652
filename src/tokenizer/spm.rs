//! SentencePiece-style merging by score (`tokenizer.ggml.model = llama`), as llama.cpp's
//! `llm_tokenizer_spm` does it.
//!
//! Each stretch of text between special tokens is encoded on its own, with no
//! pre-tokenizer and no merge list:
//! 1. Escape: every space becomes `▁` (U+2581), the vocabulary's word marker; with
//!    `add_space_prefix` a stretch that starts the text or follows a special token gets a
//!    `▁` in front as well. A `▁` already in the text is therefore indistinguishable from
//!    a space.
//! 2. Merge: the stretch starts as one symbol per character. Repeatedly, of all adjacent
//!    pairs whose concatenated text is a vocabulary token, the one whose token has the
//!    highest score (`tokenizer.ggml.scores`) is replaced by that token; among equal
//!    scores the leftmost pair goes first.
//! 3. Byte fallback: a symbol left as a single character without a token becomes the
//!    byte tokens `<0xNN>` of its UTF-8 bytes (a byte without one is dropped). Byte tokens
//!    decode to their bytes, so a vocabulary without a `▁` token would turn a space into
//!    a `▁` (as llama.cpp would); SentencePiece vocabularies have it.
//!
//! Merging only ever produces ordinary tokens (types normal, undefined and unused), and a
//! lone character only maps to one. llama.cpp looks any token up by its text, so a control
//! or byte token whose text merging could spell would differ; Gemma 3's vocabulary has
//! none (`tests/integration/tokenizer_gemma.rs` checks), and excluding them keeps literal text from
//! ever producing a control token.
//!
//! Layout: the symbols are a doubly linked list over a `Vec`, each a byte range of the
//! escaped text (length 0 once merged into its left neighbour). Candidate pairs wait in a
//! max-heap keyed by `(score, leftmost)`; an entry records the byte length of the pair,
//! and when popped it is used only if both symbols are alive and their lengths still add
//! up to it (the left symbol can only grow by absorbing the right one, the right one only
//! by absorbing its own right neighbour), so stale entries are skipped instead of removed.
//! Cost: O(n log n) for a stretch of n characters.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::{TokenType, TokenizerError};

/// Marks "no neighbour" in the symbol list.
const NONE: usize = usize::MAX;

/// The SentencePiece half of a tokenizer: what encoding needs beyond the vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Spm {
    /// `scores[id]`: the merge priority of token `id`, or `None` for a token merging must
    /// not produce (control, user-defined, unknown and byte tokens).
    scores: Vec<Option<f32>>,
    /// `byte_ids[b]`: the token that stands for byte `b` alone, if the vocabulary has one.
    byte_ids: [Option<u32>; 256],
    /// Whether a stretch at the start or after a special token gets a leading `▁`.
    add_space_prefix: bool,
}

/// A symbol of the stretch being merged: `text[start..start + len]`.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// 0 once merged into the symbol on its left.
    len: usize,
    prev: usize,
    next: usize,
    /// Its token, if it has one.
    id: Option<u32>,
}

/// A candidate merge of `left` and `right` (adjacent when queued) into token `id`.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text.
    len: usize,
    id: u32,
}

impl Ord for Candidate {
    /// Higher score first, then the leftmost pair (llama.cpp's `llm_bigram_spm`).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// A score as a heap key: `-0.0` equals `0.0` (as C++'s `<` has it, unlike `total_cmp`),
/// and NaN ranks below every number.
fn priority(score: f32) -> f32 {
    if score.is_nan() {
        f32::NEG_INFINITY
    } else if score == 0.0 {
        0.0
    } else {
        score
    }
}

/// Whether merging may produce a token of this type.
fn mergeable(ty: TokenType) -> bool {
    matches!(
        ty,
        TokenType::Normal | TokenType::Undefined | TokenType::Unused
    )
}

/// The text of an ordinary token with `▁` read as a space.
pub(crate) fn token_bytes(text: &str) -> Vec<u8> {
    text.replace('▁', " ").into_bytes()
}

impl Spm {
    /// Takes one score per token and finds the byte tokens: byte `b` is the byte-type
    /// token `<0xBB>` (upper-case hex, as llama.cpp spells it).
    ///
    /// # Errors
    /// [`TokenizerError::ScoreCountMismatch`] unless there is one score per token.
    pub(crate) fn new(
        scores: Vec<f32>,
        types: &[TokenType],
        token_to_id: &HashMap<String, u32>,
        add_space_prefix: bool,
    ) -> Result<Spm, TokenizerError> {
        if scores.len() != types.len() {
            return Err(TokenizerError::ScoreCountMismatch {
                tokens: types.len(),
                scores: scores.len(),
            });
        }
        let scores: Vec<Option<f32>> = scores
            .into_iter()
            .zip(types)
            .map(|(score, &ty)| mergeable(ty).then_some(priority(score)))
            .collect();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = token_to_id
                .get(&format!("<0x{b:02X}>"))
                .copied()
                .filter(|&id| types[id as usize] == TokenType::Byte);
        }
        Ok(Spm {
            scores,
            byte_ids,
            add_space_prefix,
        })
    }

    /// The token `piece` is and its score, if merging may produce it.
    fn piece(&self, token_to_id: &HashMap<String, u32>, piece: &str) -> Option<(u32, f32)> {
        let id = *token_to_id.get(piece)?;
        Some((id, self.scores[id as usize]?))
    }

    /// Encodes `text` (a stretch without special tokens; `first` if it starts the text or
    /// follows a special token), appending to `out`.
    pub(crate) fn encode(
        &self,
        text: &str,
        first: bool,
        token_to_id: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) {
        let mut escaped = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && first {
            escaped.push('▁');
        }
        escaped.push_str(&text.replace(' ', "▁"));
        let text = escaped.as_str();
        if text.is_empty() {
            return;
        }

        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: NONE,
                next: NONE,
                id: self
                    .piece(token_to_id, &text[start..start + c.len_utf8()])
                    .map(|(id, _)| id),
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = if i == 0 { NONE } else { i - 1 };
            s.next = if i + 1 == n { NONE } else { i + 1 };
        }

        let mut heap: BinaryHeap<Candidate> = BinaryHeap::with_capacity(n);
        let push = |heap: &mut BinaryHeap<Candidate>, syms: &[Symbol], left: usize| {
            if left == NONE || syms[left].next == NONE {
                return;
            }
            let right = syms[left].next;
            let (start, len) = (syms[left].start, syms[left].len + syms[right].len);
            if let Some((id, score)) = self.piece(token_to_id, &text[start..start + len]) {
                heap.push(Candidate {
                    score,
                    left,
                    right,
                    len,
                    id,
                });
            }
        };
        for i in 0..n - 1 {
            push(&mut heap, &syms, i);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left, c.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != c.len {
                continue;
            }
            syms[l].len = c.len;
            syms[l].id = Some(c.id);
            syms[r].len = 0;
            let after = syms[r].next;
            syms[l].next = after;
            if after != NONE {
                syms[after].prev = l;
            }
            push(&mut heap, &syms, syms[l].prev);
            push(&mut heap, &syms, l);
        }

        let mut i = 0;
        while i != NONE {
            let s = &syms[i];
            match s.id {
                Some(id) => out.push(id),
                None => out.extend(
                    text[s.start..s.start + s.len]
                        .bytes()
                        .filter_map(|b| self.byte_ids[usize::from(b)]),
                ),
            }
            i = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unoptimised twin: rescan the whole stretch for the best pair after every
    /// merge, then map what is left (escaping and byte fallback as in [`Spm::encode`]).
    fn encode_slow(
        spm: &Spm,
        text: &str,
        first: bool,
        token_to_id: &HashMap<String, u32>,
    ) -> Vec<u32> {
        let prefix = if spm.add_space_prefix && first {
            "▁"
        } else {
            ""
        };
        let escaped = format!("{prefix}{}", text.replace(' ', "▁"));
        let mut pieces: Vec<String> = escaped.chars().map(String::from).collect();
        loop {
            let mut best: Option<(f32, usize)> = None;
            for i in 0..pieces.len().saturating_sub(1) {
                let joined = format!("{}{}", pieces[i], pieces[i + 1]);
                if let Some((_, score)) = spm.piece(token_to_id, &joined)
                    && best.is_none_or(|(s, _)| score > s)
                {
                    best = Some((score, i));
                }
            }
            let Some((_, i)) = best else { break };
            let right = pieces.remove(i + 1);
            pieces[i].push_str(&right);
        }
        let mut out = Vec::new();
        for p in pieces {
            match spm.piece(token_to_id, &p) {
                Some((id, _)) => out.push(id),
                None => out.extend(p.bytes().filter_map(|b| spm.byte_ids[usize::from(b)])),
            }
        }
        out
    }

    /// A toy vocabulary: `a`, `b`, `c`, `▁`, merged pieces with chosen scores (ties
    /// included), a control token spelled by two ordinary ones, and byte tokens for
    /// `0x00`, `0x3E`, `0xC3` and `0xA9` (so `>` and `é` fall back to bytes).
    fn toy(add_space_prefix: bool) -> (Spm, HashMap<String, u32>, Vec<String>) {
        let vocab: [(&str, f32, TokenType); 17] = [
            ("a", -1.0, TokenType::Normal),
            ("b", -1.0, TokenType::Normal),
            ("c", -1.0, TokenType::Normal),
            ("▁", -1.0, TokenType::Normal),
            ("ab", -2.0, TokenType::Normal),
            ("bc", -2.0, TokenType::Normal),
            ("abc", -0.5, TokenType::Normal),
            ("ca", -3.0, TokenType::Normal),
            ("▁a", -0.0, TokenType::Normal),
            ("aa", 0.0, TokenType::Normal),
            ("<x>", 10.0, TokenType::Control),
            ("<x", -1.0, TokenType::Normal),
            ("x>", -1.0, TokenType::Normal),
            ("<0x00>", 0.0, TokenType::Byte),
            ("<0x3E>", 0.0, TokenType::Byte),
            ("<0xC3>", 0.0, TokenType::Byte),
            ("<0xA9>", 0.0, TokenType::Byte),
        ];
        let tokens: Vec<String> = vocab.iter().map(|(t, _, _)| t.to_string()).collect();
        let types: Vec<TokenType> = vocab.iter().map(|v| v.2).collect();
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let scores = vocab.iter().map(|v| v.1).collect();
        let spm = Spm::new(scores, &types, &token_to_id, add_space_prefix).unwrap();
        (spm, token_to_id, tokens)
    }

    fn texts(ids: &[u32], tokens: &[String]) -> Vec<String> {
        ids.iter().map(|&id| tokens[id as usize].clone()).collect()
    }

    #[test]
    fn merges_by_score_leftmost_first_with_byte_fallback() {
        let (spm, map, tokens) = toy(false);
        let run = |text: &str| {
            let mut out = Vec::new();
            spm.encode(text, true, &map, &mut out);
            texts(&out, &tokens)
        };
        // "ab" and "bc" tie at -2: the leftmost goes first, then nothing merges "ab"+"c"
        // ("abc" is reachable only through "ab", and it is: -0.5).
        assert_eq!(run("abc"), ["abc"]);
        // "ca" (-3) loses to "ab" (-2) in "cab".
        assert_eq!(run("cab"), ["c", "ab"]);
        // "aa" (0) and "▁a" (-0, equal to 0): leftmost first.
        assert_eq!(run(" aa"), ["▁a", "a"]);
        assert_eq!(run("aa a"), ["aa", "▁a"]);
        // The control token "<x>" is never produced, though its score is the highest:
        // "<x" wins the tie with "x>", and ">" falls back to its byte.
        assert_eq!(run("<x>"), ["<x", "<0x3E>"]);
        // "é" has no token: its two bytes; "d" has neither a token nor a byte token.
        assert_eq!(run("éd\0"), ["<0xC3>", "<0xA9>", "<0x00>"]);
        assert_eq!(run(""), Vec::<String>::new());
    }

    #[test]
    fn a_space_prefix_goes_before_the_first_stretch_only() {
        let (spm, map, tokens) = toy(true);
        let mut out = Vec::new();
        spm.encode("a", true, &map, &mut out);
        spm.encode("a", false, &map, &mut out);
        assert_eq!(texts(&out, &tokens), ["▁a", "a"]);
    }

    #[test]
    fn heap_merge_matches_rescan_on_all_short_texts() {
        let alphabet = ['a', 'b', 'c', ' ', '<', 'x', '>', 'é'];
        for prefix in [false, true] {
            let (spm, map, _) = toy(prefix);
            for len in 0..=5u32 {
                for code in 0..8u32.pow(len) {
                    let text: String = (0..len)
                        .map(|k| alphabet[((code / 8u32.pow(k)) % 8) as usize])
                        .collect();
                    let mut out = Vec::new();
                    spm.encode(&text, true, &map, &mut out);
                    assert_eq!(out, encode_slow(&spm, &text, true, &map), "text {text:?}");
                }
            }
        }
    }

    #[test]
    fn scores_must_match_the_vocabulary() {
        let types = [TokenType::Normal; 3];
        let err = Spm::new(vec![0.0; 2], &types, &HashMap::new(), false).unwrap_err();
        assert!(matches!(
            err,
            TokenizerError::ScoreCountMismatch {
                tokens: 3,
                scores: 2
            }
        ));
        assert!(Spm::new(vec![0.0; 3], &types, &HashMap::new(), false).is_ok());
    }
}
