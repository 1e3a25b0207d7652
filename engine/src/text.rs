//! From text to ids and back, as a chat or a completion sees it.

use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer, TokenizerError};

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
