//! Byte-pair merging by rank, the core of byte-level BPE.
//!
//! A word starts as one symbol per byte (the token id of that byte's vocabulary char).
//! Repeatedly, the adjacent pair with the lowest merge rank (its index in
//! `tokenizer.ggml.merges`) is replaced by the merged token; among equal ranks the leftmost
//! pair goes first. This is llama.cpp's `llm_tokenizer_bpe_session` and Hugging Face's BPE.
//!
//! Layout: the symbols are a doubly linked list over a `Vec` (merging marks the right
//! symbol dead and relinks), and candidate pairs wait in a min-heap keyed by
//! `(rank, left index)`. A heap entry records the two ids it was made from; when popped it
//! is used only if both symbols are still alive, adjacent and unchanged, so stale entries
//! are skipped instead of removed. Cost: O(n log n) for a word of n bytes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Marks "no neighbour" in the symbol list.
const NONE: usize = usize::MAX;

/// The merge table: `(left id, right id) → (rank, merged id)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct MergeTable {
    pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl MergeTable {
    /// Adds merge `left right → merged` with `rank`, keeping the first rank if the pair
    /// is listed twice (as llama.cpp does).
    pub(crate) fn insert(&mut self, left: u32, right: u32, rank: u32, merged: u32) {
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
pub(crate) fn merge_word(table: &MergeTable, ids: &[u32], out: &mut Vec<u32>) {
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
