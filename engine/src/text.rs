//! From text to ids and back, as a chat or a completion sees it.

use kvcore::tokenizer::{
    ChatMessage, ChatTemplate, Special, StopMatcher, StreamDecoder, Tokenizer, TokenizerError,
};

/// The ids of raw `text` with the BOS the model asks for (when `add_bos`).
pub fn prompt_ids(tok: &Tokenizer, text: &str, special: Special) -> Vec<u32> {
    let mut ids = Vec::new();
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
        ids.push(bos);
    }
    ids.extend(tok.encode(text, special));
    ids
}

/// The ids of `messages` rendered by `template` for a reply: the markup's special
/// tokens parsed, the messages' text literal; the BOS the model asks for first unless
/// the template writes it.
pub fn chat_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
) -> Result<Vec<u32>, TokenizerError> {
    let body = template.render_chat(messages, true)?.encode(tok);
    let mut ids = Vec::with_capacity(body.len() + 1);
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id())
        && body.first() != Some(&bos)
    {
        ids.push(bos);
    }
    ids.extend(body);
    Ok(ids)
}

/// Turns generated ids into the text a user sees, piece by piece: stop tokens are
/// skipped, UTF-8 is never split, stop strings are found across tokens and not shown.
/// An incomplete UTF-8 character at the end (generation cut in the middle of one) is
/// held back, not shown as U+FFFD.
pub struct TextPieces<'t> {
    tok: &'t Tokenizer,
    stream: StreamDecoder<'t>,
    stops: StopMatcher,
}

impl<'t> TextPieces<'t> {
    /// Pieces of `tok`'s text, ending at the first of `stops`.
    pub fn new(tok: &'t Tokenizer, stops: &[String]) -> Self {
        TextPieces {
            tok,
            stream: tok.stream(),
            stops: StopMatcher::new(stops.iter().cloned()),
        }
    }

    /// Adds token `id` and returns the text that can be shown now (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        if self.tok.is_stop(id) {
            return String::new();
        }
        // An id outside the vocabulary has no text (sampled ids are in range).
        match self.stream.push(id) {
            Ok(piece) => self.stops.push(&piece),
            Err(_) => String::new(),
        }
    }

    /// The stop string found, if one was (generation should end).
    pub fn stopped(&self) -> Option<&str> {
        self.stops.stopped()
    }

    /// Ends the text: what was held back for a stop string that never came, and the
    /// stop string that ended it, if one did.
    pub fn finish(self) -> (String, Option<String>) {
        let stop = self.stops.stopped().map(str::to_string);
        // The decoder's leftover is an incomplete character: dropped, not U+FFFD.
        (self.stops.finish(), stop)
    }
}
