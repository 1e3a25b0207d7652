//! kvcore in a web page.
//!
//! The page (`web/index.html`, `app.js`) runs this crate, built for
//! `wasm32-unknown-unknown`, in a Web Worker (`worker.js`): the worker hands it the bytes
//! of a GGUF file and a user's message, and it streams the assistant's reply back piece
//! by piece with the prefill and decode speeds and the KV cache's size.
//!
//! The crate is two layers:
//! - [`Chat`], ordinary safe Rust over [`kvcore_engine`]: a model, one session and the
//!   conversation so far. It reaches the page only through the [`Host`] trait (the clock
//!   and the callbacks), so the same code runs natively under `cargo test` against the
//!   reference continuations.
//! - `ffi` (wasm32 only): the `extern "C"` exports the worker calls and the functions it
//!   imports from JavaScript. No wasm-bindgen: the boundary is pointers and lengths into
//!   the module's memory, and every export returns a status code (0 = ok) with the last
//!   error's message readable through `kv_error_ptr` / `kv_error_len`. Nothing panics
//!   across it: every path returns a `Result`.
//!
//! The generation is the engine's [`Decoder`](kvcore_engine::Decoder) driven here with
//! the engine's prefill and decode steps, not `Engine::generate`, because that one times
//! itself with `std::time::Instant`, which panics on `wasm32-unknown-unknown` (there is
//! no clock without the host): here the host's clock (`performance.now()`) times it.

#![warn(missing_docs)]

#[cfg(target_arch = "wasm32")]
mod ffi;

pub use kvcore_engine::kvcore::model::Activations;
use kvcore_engine::kvcore::tokenizer::ChatMessage;
use kvcore_engine::{BackendChoice, Engine, EngineSession, GenerateParams, Options};

/// Which part of a reply a [`Stats`] report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// The prompt has been run through the model (once per reply).
    Prefill = 0,
    /// A token has been generated (once per token).
    Decode = 1,
    /// The reply is complete (once, last).
    Done = 2,
}

/// A progress report, sent after the prefill and after every generated token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// [`Phase::Prefill`]: prompt positions run through the model (those the session
    /// already held from the previous turns are not); otherwise tokens generated so far.
    pub tokens: u32,
    /// Tokens per second: of the prefill, or of the decode steps after the first token
    /// (`kvcore bench`'s and `GenStats`' convention; 0 until there are two tokens).
    pub tok_per_s: f64,
    /// Bytes the session's KV cache holds now.
    pub kv_bytes: f64,
    /// What the report is about.
    pub phase: Phase,
}

/// What [`Chat`] needs from its embedder: a clock and somewhere to send the reply.
pub trait Host {
    /// Milliseconds from an arbitrary origin (the page's `performance.now()`).
    fn now_ms(&self) -> f64;
    /// The next piece of the reply's text (whole UTF-8 characters, never empty).
    fn text(&mut self, piece: &str);
    /// A progress report.
    fn stats(&mut self, stats: Stats);
}

/// The reply [`Chat::send`] returns once it is complete.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The assistant's text (what [`Host::text`] saw, in order).
    pub text: String,
    /// The generated ids, a final stop token included.
    pub tokens: Vec<u32>,
    /// Prefill speed, tokens per second.
    pub prefill_tok_s: f64,
    /// Decode speed, tokens per second.
    pub decode_tok_s: f64,
    /// Bytes of the KV cache at the end.
    pub kv_bytes: usize,
}

/// How the page runs the model: the SIMD backend on the one thread a Web Worker has,
/// `activations` (f32, the reference's numerics, or the faster 8-bit path), an f32
/// cache that grows on demand.
pub fn options(activations: Activations) -> Options {
    Options {
        backend: BackendChoice::Simd,
        threads: Some(1),
        activations,
        ..Options::default()
    }
}

/// A conversation with one model: the engine, one session holding the conversation's
/// positions (each turn prefills only what the previous ones did not leave in the
/// cache), and the messages so far.
pub struct Chat {
    engine: Engine,
    session: EngineSession,
    history: Vec<ChatMessage>,
}

impl Chat {
    /// The chat of the GGUF file `bytes` (a chat model: it needs a chat template), run
    /// with `activations` (see [`options`]).
    pub fn load(bytes: Vec<u8>, activations: Activations) -> Result<Chat, String> {
        let engine = Engine::from_bytes(bytes, options(activations)).map_err(|e| e.message())?;
        if engine.template().is_none() {
            return Err("the model has no chat template (tokenizer.chat_template): \
                        a base model cannot chat"
                .to_string());
        }
        let session = engine.new_session(None).map_err(|e| e.message())?;
        Ok(Chat {
            engine,
            session,
            history: Vec::new(),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The messages so far (user and assistant, alternating).
    pub fn history(&self) -> &[ChatMessage] {
        &self.history
    }

    /// Bytes the KV cache holds now.
    pub fn kv_bytes(&self) -> usize {
        self.session.kv_bytes()
    }

    /// Forgets the conversation (the next [`send`](Self::send) starts a new one) and
    /// frees its KV cache: a new session replaces the old one. On error (there is no
    /// memory for the new session's first block) nothing changes.
    pub fn reset(&mut self) -> Result<(), String> {
        self.session = self.engine.new_session(None).map_err(|e| e.message())?;
        self.history.clear();
        Ok(())
    }

    /// Sends the user's message `user` and generates the assistant's reply greedily (so
    /// the page shows the model's reference continuation), at most `max_tokens` tokens,
    /// streaming it to `host`. The message is data: it is rendered by the model's chat
    /// template and tokenized as literal text, so a `<|im_end|>` typed by the user is
    /// text, never a control token. On error the conversation is as it was.
    pub fn send(
        &mut self,
        user: &str,
        max_tokens: usize,
        host: &mut impl Host,
    ) -> Result<Reply, String> {
        if user.trim().is_empty() {
            return Err("the message is empty".to_string());
        }
        if max_tokens == 0 {
            return Err("max_tokens must be at least 1".to_string());
        }
        let mut messages = self.history.clone();
        messages.push(ChatMessage::new("user", user));
        let engine = &self.engine;
        let prompt = engine.chat_ids(&messages).map_err(|e| e.message())?;
        let max_ctx = self.session.max_ctx();
        if prompt.len() > max_ctx {
            return Err(format!(
                "the conversation is {} tokens, the context holds {max_ctx}: start a new chat",
                prompt.len()
            ));
        }
        let mut params = GenerateParams::default();
        params.max_tokens = Some(max_tokens);
        let mut decoder = engine
            .decoder(&params, &prompt, max_ctx)
            .map_err(|e| e.message())?;

        let start = host.now_ms();
        let prefill = engine
            .prefill(&mut self.session, &prompt)
            .map_err(|e| e.message())?;
        let prefill_tok_s = per_second(prefill.prefilled, host.now_ms() - start);
        host.stats(Stats {
            tokens: saturate(prefill.prefilled),
            tok_per_s: prefill_tok_s,
            kv_bytes: self.session.kv_bytes() as f64,
            phase: Phase::Prefill,
        });

        let mut first_at = start;
        let mut decode_tok_s;
        loop {
            let logits = self.session.logits().unwrap_or_default();
            let step = decoder.step(logits).map_err(|e| e.to_string())?;
            let now = host.now_ms();
            let generated = decoder.tokens().len();
            if generated == 1 {
                first_at = now;
            }
            decode_tok_s = per_second(generated - 1, now - first_at);
            if !step.text.is_empty() {
                host.text(&step.text);
            }
            host.stats(Stats {
                tokens: saturate(generated),
                tok_per_s: decode_tok_s,
                kv_bytes: self.session.kv_bytes() as f64,
                phase: Phase::Decode,
            });
            if step.finish.is_some() {
                break;
            }
            engine
                .decode(&mut self.session, step.id)
                .map_err(|e| e.message())?;
        }
        let text = decoder.text().to_string();
        let tokens = decoder.tokens().to_vec();
        let kv_bytes = self.session.kv_bytes();
        host.stats(Stats {
            tokens: saturate(tokens.len()),
            tok_per_s: decode_tok_s,
            kv_bytes: kv_bytes as f64,
            phase: Phase::Done,
        });
        messages.push(ChatMessage::new("assistant", text.clone()));
        self.history = messages;
        Ok(Reply {
            text,
            tokens,
            prefill_tok_s,
            decode_tok_s,
            kv_bytes,
        })
    }
}

/// `n` events in `ms` milliseconds, per second (0 when either is 0 or the clock went
/// backwards).
fn per_second(n: usize, ms: f64) -> f64 {
    if n == 0 || ms <= 0.0 {
        0.0
    } else {
        n as f64 * 1000.0 / ms
    }
}

/// `n` as the `u32` the page's callback takes (a count of tokens: never that large).
fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::per_second;

    #[test]
    fn rates() {
        assert_eq!(per_second(0, 10.0), 0.0);
        assert_eq!(per_second(5, 0.0), 0.0);
        assert_eq!(per_second(5, -1.0), 0.0);
        assert_eq!(per_second(5, 500.0), 10.0);
    }
}
