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
