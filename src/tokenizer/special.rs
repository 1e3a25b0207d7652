//! Special-token partition: cut the text at every occurrence of a special token's text
//! before any pre-tokenization, as llama.cpp `tokenizer_st_partition` does with
//! `parse_special = true`.
//!
//! Algorithm: the special tokens are taken longest text first; each one splits every
//! still-unclaimed text fragment at its non-overlapping occurrences, left to right. So
//! where two special texts overlap, the longer one wins. The result is a list of fragments
//! in text order: plain byte ranges of the input, or special token ids.

use std::ops::Range;

/// A piece of the partitioned text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Ordinary text, `text[range]`, to be pre-tokenized and merged.
    Text(Range<usize>),
    /// A special token matched verbatim.
    Special(u32),
}

/// Splits `text` at the special tokens `specials` (`(id, text)`, longest text first, no
/// empty texts).
pub(crate) fn partition(text: &str, specials: &[(u32, String)]) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(0..text.len()));
    for (id, special) in specials {
        if !text.contains(special.as_str()) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for frag in frags {
            let Fragment::Text(range) = frag else {
                next.push(frag);
                continue;
            };
            let mut last = range.start;
            for (pos, _) in text[range.clone()].match_indices(special.as_str()) {
                let at = range.start + pos;
                if at > last {
                    next.push(Fragment::Text(last..at));
                }
                next.push(Fragment::Special(*id));
                last = at + special.len();
            }
            if last < range.end {
                next.push(Fragment::Text(last..range.end));
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_special_wins_and_text_between_is_kept() {
        let specials = vec![(7, "<|im_end|>".to_string()), (3, "<|im".to_string())];
        let text = "a<|im_end|>b<|imc";
        assert_eq!(
            partition(text, &specials),
            [
                Fragment::Text(0..1),
                Fragment::Special(7),
                Fragment::Text(11..12),
                Fragment::Special(3),
                Fragment::Text(16..17),
            ]
        );
        assert_eq!(partition("", &specials), []);
        assert_eq!(partition("<|im", &specials), [Fragment::Special(3)]);
    }
}
