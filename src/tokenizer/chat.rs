//! Chat templates: render a conversation into the prompt text a chat model was trained
//! on, from the Jinja template stored in the model file (`tokenizer.chat_template`).
//!
//! The template is compiled once with `minijinja`, configured like Hugging Face
//! `apply_chat_template` (`trim_blocks` and `lstrip_blocks` on, a trailing newline
//! dropped) and given the same variables: `messages` (a list of `{role, content}` maps),
//! `add_generation_prompt`, `bos_token`, `eos_token`, and a `raise_exception(message)`
//! function that aborts rendering with that message. Python string and dict methods that
//! templates call (`.strip()`, `.startswith()`, `.items()`, ...) come from
//! `minijinja-contrib`'s `pycompat`.

use minijinja::{Environment, Error, ErrorKind, Value};

use super::TokenizerError;

/// Name the template is stored under in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who speaks: `"system"`, `"user"`, `"assistant"`, ...
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with its BOS and EOS strings.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles template `source`; `bos` and `eos` are the texts of the BOS and EOS
    /// tokens, exposed to the template as `bos_token` and `eos_token`.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] with the syntax error and its line.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the header of
    /// an assistant turn, ready for generation.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] if rendering fails, including a `raise_exception`
    /// call from the template (its message is included).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let messages: Value = messages
            .iter()
            .map(|m| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let ctx = Value::from_iter([
            ("messages", messages),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos.as_str())),
            ("eos_token", Value::from(self.eos.as_str())),
        ]);
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(ctx))
            .map_err(template_error)
    }
}

/// The `raise_exception(message)` function templates use to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

/// Converts a minijinja error (with its cause chain) into [`TokenizerError::Template`].
fn template_error(e: Error) -> TokenizerError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    TokenizerError::Template(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + \
                          m['content'] + '<|im_end|>\n' }}{% endfor %}\
                          {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn block_whitespace_and_bos_follow_hugging_face() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {{ m.content }}\n{% endfor %}\n";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
            )
            .unwrap();
        assert_eq!(out, "<s>\n  a\n  b\n");
    }

    #[test]
    fn python_string_methods_work() {
        let src = "{% for m in messages %}{{ m.content.strip().upper() }}\
                   {% if m.role.startswith('us') %}!{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi ")], false)
            .unwrap();
        assert_eq!(out, "HI!");
    }

    #[test]
    fn errors_name_the_problem() {
        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        let err = t
            .render(&[ChatMessage::new("system", "x")], false)
            .unwrap_err();
        assert!(err.to_string().contains("user first"), "{err}");
    }
}
