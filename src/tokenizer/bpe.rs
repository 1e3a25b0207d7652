//! Byte-level BPE: pre-tokenize, then merge byte pairs by rank (`tokenizer.ggml.model =
//! gpt2`).
//!
//! Each stretch of text between special tokens is split into words by the pre-tokenizer
//! (`pretokenize`). A word starts as one symbol per byte: the token of that byte's
//! vocabulary char (`bytes`, the GPT-2 byte-to-unicode map); a byte without such a token is
//! dropped and, as in llama.cpp, its neighbours do not merge across the gap. Repeatedly,
//! the adjacent pair with the lowest merge rank (its index in `tokenizer.ggml.merges`) is
//! replaced by the merged token; among equal ranks the leftmost pair goes first. This is
//! llama.cpp's `llm_tokenizer_bpe_session` and Hugging Face's BPE.
//!
//! Layout: the symbols are a doubly linked list over a `Vec` (merging marks the right
//! symbol dead and relinks), and candidate pairs wait in a min-heap keyed by
//! `(rank, left index)`. A heap entry records the two ids it was made from; when popped it
//! is used only if both symbols are still alive, adjacent and unchanged, so stale entries
//! are skipped instead of removed. Cost: O(n log n) for a word of n bytes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;
use super::bytes::ByteMap;
use super::pretokenize::{PreTokenizer, PreTokenizerKind};

/// Marks "no neighbour" in the symbol list.
const NONE: usize = usize::MAX;

/// The byte-level BPE half of a tokenizer: what encoding needs beyond the vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    byte_map: ByteMap,
    merges: MergeTable,
    pre: PreTokenizer,
    /// `byte_ids[b]`: the token for the single byte `b`, if the vocabulary has one.
    byte_ids: [Option<u32>; 256],
}

impl Bpe {
    /// Parses the merge rules against the vocabulary `token_to_id`.
    ///
    /// # Errors
    /// [`TokenizerError::BadMerge`]: a side or the result is not a token, or there is no
    /// space separator.
    pub(crate) fn new(
        merges: &[String],
        pre: PreTokenizerKind,
        token_to_id: &HashMap<String, u32>,
    ) -> Result<Bpe, TokenizerError> {
        let byte_map = ByteMap::new();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let c = byte_map.char_of(b as u8);
            *slot = token_to_id.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
        }
        Ok(Bpe {
            merges: build_merges(merges, token_to_id)?,
            byte_map,
            pre: PreTokenizer::new(pre),
            byte_ids,
        })
    }

    /// The pre-tokenizer family in use.
    pub(crate) fn pre_kind(&self) -> PreTokenizerKind {
        self.pre.kind()
    }

    /// The bytes an ordinary token's text stands for (the byte map reversed).
    pub(crate) fn token_bytes(&self, text: &str) -> Vec<u8> {
        self.byte_map.decode(text)
    }

    /// Encodes `text` (a stretch without special tokens), appending to `out`.
    pub(crate) fn encode(
        &self,
        text: &str,
        token_to_id: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) {
        let mut scratch = Vec::new();
        for word in self.pre.split(text) {
            self.encode_word(&text[word], token_to_id, &mut scratch, out);
        }
    }

    /// Encodes one pre-tokenized word, appending to `out`; `scratch` is reused storage for
    /// the word's initial symbols.
    fn encode_word(
        &self,
        word: &str,
        token_to_id: &HashMap<String, u32>,
        scratch: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) {
        if self.pre.kind().ignore_merges() {
            let encoded = self.byte_map.encode(word.as_bytes());
            if let Some(&id) = token_to_id.get(&encoded) {
                out.push(id);
                return;
            }
        }
        scratch.clear();
        for b in word.bytes() {
            match self.byte_ids[usize::from(b)] {
                Some(id) => scratch.push(id),
                None => {
                    merge_word(&self.merges, scratch, out);
                    scratch.clear();
                }
            }
        }
        merge_word(&self.merges, scratch, out);
    }
}

/// Parses the merge list into a table keyed by token ids.
fn build_merges(
    merges: &[String],
    token_to_id: &HashMap<String, u32>,
) -> Result<MergeTable, TokenizerError> {
    let mut table = MergeTable::default();
    for (index, merge) in merges.iter().enumerate() {
        let bad = |reason: String| TokenizerError::BadMerge {
            index,
            merge: merge.clone(),
            reason,
        };
        // Split at the first space after the first character (llama.cpp searches from
        // index 1, so a left side of " " would survive).
        let first_len = merge.chars().next().map_or(0, char::len_utf8);
        let space = merge[first_len..]
            .find(' ')
            .map(|p| p + first_len)
            .ok_or_else(|| bad("no space between the two tokens".to_string()))?;
        let (left, right) = (&merge[..space], &merge[space + 1..]);
        let id_of = |t: &str| {
            token_to_id
                .get(t)
                .copied()
                .ok_or_else(|| bad(format!("{t:?} is not a token")))
        };
        let (l, r) = (id_of(left)?, id_of(right)?);
        let merged = id_of(&format!("{left}{right}"))?;
        let rank = u32::try_from(index).map_err(|_| bad("rank exceeds u32".to_string()))?;
        table.insert(l, r, rank, merged);
    }
    Ok(table)
}

/// The merge table: `(left id, right id) → (rank, merged id)`.
#[derive(Debug, Clone, Default)]
struct MergeTable {
    pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl MergeTable {
    /// Adds merge `left right → merged` with `rank`, keeping the first rank if the pair
    /// is listed twice (as llama.cpp does).
    fn insert(&mut self, left: u32, right: u32, rank: u32, merged: u32) {
        self.pairs.entry((left, right)).or_insert((rank, merged));
    }

    /// `(rank, merged id)` of the pair, if it can merge.
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.pairs.get(&(left, right)).copied()
    }
}

/// One symbol of the word being merged.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

/// A candidate merge: min-heap order is lowest rank, then leftmost.
type Candidate = Reverse<(u32, usize, u32, u32)>;

/// Merges the initial symbols `ids` (one token id per byte) and appends the resulting
/// token ids to `out`.
fn merge_word(table: &MergeTable, ids: &[u32], out: &mut Vec<u32>) {
    if ids.len() < 2 {
        out.extend_from_slice(ids);
        return;
    }
    let n = ids.len();
    let mut syms: Vec<Symbol> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            alive: true,
        })
        .collect();
    let mut heap: BinaryHeap<Candidate> = BinaryHeap::with_capacity(n);
    let push = |heap: &mut BinaryHeap<Candidate>, syms: &[Symbol], left: usize| {
        if left == NONE || syms[left].next == NONE {
            return;
        }
        let (l, r) = (syms[left].id, syms[syms[left].next].id);
        if let Some((rank, _)) = table.get(l, r) {
            heap.push(Reverse((rank, left, l, r)));
        }
    };
    for i in 0..n - 1 {
        push(&mut heap, &syms, i);
    }
    while let Some(Reverse((_, left, l, r))) = heap.pop() {
        let right = syms[left].next;
        if !syms[left].alive || right == NONE || syms[left].id != l || syms[right].id != r {
            continue;
        }
        let (_, merged) = table.get(l, r).expect("queued pairs are in the table");
        syms[left].id = merged;
        syms[right].alive = false;
        let after = syms[right].next;
        syms[left].next = after;
        if after != NONE {
            syms[after].prev = left;
        }
        push(&mut heap, &syms, syms[left].prev);
        push(&mut heap, &syms, left);
    }
    let mut i = 0;
    while i != NONE {
        out.push(syms[i].id);
        i = syms[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unoptimised twin: rescan the whole word for the best pair after every merge.
    fn merge_word_slow(table: &MergeTable, ids: &[u32]) -> Vec<u32> {
        let mut w = ids.to_vec();
        loop {
            let best = (0..w.len().saturating_sub(1))
                .filter_map(|i| table.get(w[i], w[i + 1]).map(|(rank, m)| (rank, i, m)))
                .min();
            let Some((_, i, m)) = best else { return w };
            w[i] = m;
            w.remove(i + 1);
        }
    }

    /// A small table over ids 0..4 with merges chained up to id 11.
    fn table() -> MergeTable {
        let mut t = MergeTable::default();
        let merges = [
            (0, 1, 4),
            (1, 1, 5),
            (4, 2, 6),
            (5, 5, 7),
            (2, 3, 8),
            (6, 8, 9),
            (3, 3, 10),
            (7, 0, 11),
        ];
        for (rank, (l, r, m)) in merges.into_iter().enumerate() {
            t.insert(l, r, rank as u32, m);
        }
        t
    }

    #[test]
    fn heap_merge_matches_rescan_on_all_short_words() {
        let t = table();
        let mut out = Vec::new();
        for len in 0..=7u32 {
            for code in 0..4u32.pow(len) {
                let ids: Vec<u32> = (0..len).map(|k| (code / 4u32.pow(k)) % 4).collect();
                out.clear();
                merge_word(&t, &ids, &mut out);
                assert_eq!(out, merge_word_slow(&t, &ids), "word {ids:?}");
            }
        }
    }

    #[test]
    fn equal_pairs_merge_leftmost_first() {
        let t = table();
        let mut out = Vec::new();
        merge_word(&t, &[1, 1, 1], &mut out);
        assert_eq!(out, [5, 1]);
    }
}
