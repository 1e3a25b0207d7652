//! Incremental decoding for streaming generation.
//!
//! A token can end in the middle of a UTF-8 sequence (byte-level BPE splits a 4-byte emoji
//! over several tokens), so [`StreamDecoder`] keeps the bytes it cannot print yet. After
//! each token it emits the longest prefix of its buffer that is valid UTF-8; a sequence that
//! can no longer become valid is replaced by U+FFFD (one per maximal invalid subpart, as
//! [`String::from_utf8_lossy`] does), while an incomplete sequence at the end of the buffer
//! waits for the next token. Concatenating every chunk and [`StreamDecoder::finish`] gives
//! exactly [`Tokenizer::decode`] of the whole sequence.

use super::{Tokenizer, TokenizerError};

/// Turns token ids into text one at a time, never splitting a UTF-8 character.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes received but not yet emitted: at most an incomplete UTF-8 sequence (≤ 3 bytes)
    /// between calls.
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing buffered.
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty).
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`] if `id` is not in the vocabulary; the decoder is then
    /// unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self.tokenizer.token_bytes(id)?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..valid])
                            .expect("prefix reported valid"),
                    );
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + bad;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Ends the stream: returns what is still buffered, an incomplete UTF-8 sequence that
    /// no further token will complete, as U+FFFD (empty if nothing is buffered).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// Finds stop strings in streamed text, across token boundaries (llama.cpp's
/// `--reverse-prompt`/server `stop`).
///
/// Text goes in as it is decoded; what comes out is safe to show: text that cannot be
/// the start of a stop string is passed on at once, a tail that could still become one
/// is held back until the next piece decides. When a stop string completes, the text
/// before it is passed on, the stop string and everything after it are dropped, and
/// [`StopMatcher::stopped`] names it. Concatenating every output and
/// [`StopMatcher::finish`] gives the input up to (not including) the first stop string.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> StopMatcher {
        StopMatcher {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            held: String::new(),
            stopped: None,
        }
    }

    /// The stop string that was found, if one was.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.map(|i| self.stops[i].as_str())
    }

    /// Adds `text` and returns what can be shown now (empty once stopped).
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        // The earliest stop string (the longest among those starting there).
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                self.held
                    .find(s.as_str())
                    .map(|at| (at, usize::MAX - s.len(), i))
            })
            .min();
        if let Some((at, _, i)) = first {
            self.stopped = Some(i);
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Hold back the longest tail that some stop string starts with.
        let keep = self
            .held
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let tail = &self.held[at..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep].to_string();
        self.held.drain(..keep);
        out
    }

    /// Ends the stream: the text still held back (no stop string completed it).
    pub fn finish(mut self) -> String {
        self.flush()
    }

    /// The text still held back (no stop string completed it yet), now; what comes
    /// after is matched afresh.
    pub fn flush(&mut self) -> String {
        if self.stopped.is_some() {
            String::new()
        } else {
            std::mem::take(&mut self.held)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds `pieces`; returns the concatenated output and the stop found.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Vec<String>, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut outs = Vec::new();
        for p in pieces {
            outs.push(m.push(p));
        }
        let stopped = m.stopped().map(str::to_string);
        let tail = m.finish();
        let all = outs.concat() + &tail;
        (all, outs, stopped)
    }

    #[test]
    fn a_stop_split_over_pieces_is_found_and_not_shown() {
        let (all, outs, stopped) = run(&["\nUser:"], &["Hello", " there\n", "Us", "er: hi", "!"]);
        assert_eq!(all, "Hello there");
        assert_eq!(stopped.as_deref(), Some("\nUser:"));
        // "\n" and "Us" are held until "er:" decides.
        assert_eq!(outs, ["Hello", " there", "", "", ""]);
    }

    #[test]
    fn a_false_start_is_released() {
        let (all, outs, stopped) = run(&["STOP"], &["ST", "OP?", "x"]);
        assert_eq!((all.as_str(), stopped.as_deref()), ("", Some("STOP")));
        assert_eq!(outs, ["", "", ""]);
        let (all, outs, stopped) = run(&["STOP"], &["ST", "ART", " now S"]);
        assert_eq!((all.as_str(), stopped), ("START now S", None));
        assert_eq!(outs, ["", "START", " now "]);
    }

    #[test]
    fn the_earliest_stop_wins_and_text_after_it_is_dropped() {
        let (all, _, stopped) = run(&["b", "abc"], &["xxabcd"]);
        assert_eq!((all.as_str(), stopped.as_deref()), ("xx", Some("abc")));
        let (all, _, stopped) = run(&["c", "ab"], &["xabc"]);
        assert_eq!((all.as_str(), stopped.as_deref()), ("x", Some("ab")));
        let (all, _, stopped) = run(&[], &["a", "b"]);
        assert_eq!((all.as_str(), stopped), ("ab", None));
        let (all, _, _) = run(&["é!"], &["café", " ok"]);
        assert_eq!(all, "café ok");
    }
}
