//! Token generation: samplers, the prefill/decode loop and its statistics.
//!
//! [`generate`] prefills the prompt into a [`Session`] (reusing what it already holds) in
//! one batched forward pass, then decodes one token at a time, feeding each sampled token
//! back, until a stop token, `max_new` tokens, or the KV store's `max_ctx`. Running out of
//! context is an error that still carries the tokens generated so far.

use super::{Llama, ModelError};
use crate::backend::Backend;
use crate::kv::KvStore;
use crate::session::Session;
use std::time::{Duration, Instant};

pub use super::sample::{Sampler, SamplerParams, Sampling};

/// Measurements of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct GenStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt positions the session already held and reused.
    pub reused_tokens: usize,
    /// Prompt positions run through the model (`prompt_tokens − reused_tokens`).
    pub prefilled_tokens: usize,
    /// Tokens generated (including a final stop token).
    pub generated_tokens: usize,
    /// Time from the start of prefill to the first generated token.
    pub ttft: Duration,
    /// Wall time of the prefill forward pass.
    pub prefill_time: Duration,
    /// Wall time of all decode forward passes and sampling after the first token.
    pub decode_time: Duration,
    /// `KvStore::bytes()` at the end.
    pub kv_bytes: usize,
    /// `KvStore::capacity()` at the end, in positions.
    pub kv_capacity: usize,
    /// Backend name.
    pub backend: String,
    /// The kernels that computed (`Backend::kernel_path`: `"simd/avx512"`, ...).
    pub kernels: String,
    /// Backend threads.
    pub threads: usize,
}

impl GenStats {
    /// Prefilled positions per second.
    pub fn prefill_tok_s(&self) -> f64 {
        per_second(self.prefilled_tokens, self.prefill_time)
    }

    /// Generated tokens per second after the first (each needs one decode step).
    pub fn decode_tok_s(&self) -> f64 {
        per_second(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

fn per_second(n: usize, t: Duration) -> f64 {
    if n == 0 || t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// The result of [`generate`]: the tokens and the measurements.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    /// Generated ids, in order (a stop token that ended the generation included).
    pub tokens: Vec<u32>,
    /// Whether a stop token ended it.
    pub stopped: bool,
    /// Measurements.
    pub stats: GenStats,
}

/// Generation that failed part-way: the error and what had been generated before it.
#[derive(Debug, thiserror::Error)]
#[error("generation stopped after {} generated tokens", partial.tokens.len())]
pub struct GenerateError {
    /// The cause (e.g. [`KvError::ContextOverflow`](crate::kv::KvError::ContextOverflow)).
    #[source]
    pub source: ModelError,
    /// Tokens generated before the error, with their statistics.
    pub partial: Generation,
}

/// Generates up to `max_new` tokens after `prompt` in `session`.
///
/// The session first holds `prompt` ([`Session::prefill`]: positions it already holds
/// are reused, the rest run in one batched pass); each new token then costs one decode
/// step. `on_token` sees every generated id as soon as it is sampled (for streaming).
/// Stops after a token for which `is_stop` is true, after `max_new` tokens, or with an
/// error; `max_new = 0` only prefills. The last sampled token is not run through the
/// model, so the session ends holding the prompt and every generated token but the last.
pub fn generate<B: Backend, K: KvStore>(
    model: &Llama<B>,
    session: &mut Session<K>,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    is_stop: impl Fn(u32) -> bool,
    mut on_token: impl FnMut(u32),
) -> Result<Generation, Box<GenerateError>> {
    let mut out = Generation {
        stats: GenStats {
            prompt_tokens: prompt.len(),
            backend: model.backend().name().to_string(),
            kernels: model.backend().kernel_path().to_string(),
            threads: model.backend().threads(),
            ..GenStats::default()
        },
        ..Generation::default()
    };
    let result = run(
        model,
        session,
        prompt,
        max_new,
        sampler,
        &is_stop,
        &mut on_token,
        &mut out,
    );
    out.stats.kv_bytes = session.kv().bytes();
    out.stats.kv_capacity = session.kv().capacity();
    match result {
        Ok(()) => Ok(out),
        Err(source) => Err(Box::new(GenerateError {
            source,
            partial: out,
        })),
    }
}

#[allow(clippy::too_many_arguments)]
fn run<B: Backend, K: KvStore>(
    model: &Llama<B>,
    session: &mut Session<K>,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    is_stop: &impl Fn(u32) -> bool,
    on_token: &mut impl FnMut(u32),
    out: &mut Generation,
) -> Result<(), ModelError> {
    let start = Instant::now();
    sampler.set_context(prompt);
    let prefill = session.prefill(model, prompt)?;
    out.stats.prefill_time = start.elapsed();
    out.stats.reused_tokens = prefill.reused;
    out.stats.prefilled_tokens = prefill.prefilled;
    if max_new == 0 {
        return Ok(());
    }
    let mut logits = prefill.logits; // [vocab]
    let mut decode_start = None;
    loop {
        let id = sampler.sample(&logits)?;
        if out.tokens.is_empty() {
            out.stats.ttft = start.elapsed();
            decode_start = Some(Instant::now());
        }
        sampler.accept(id);
        out.tokens.push(id);
        out.stats.generated_tokens = out.tokens.len();
        on_token(id);
        if is_stop(id) {
            out.stopped = true;
            break;
        }
        if out.tokens.len() == max_new {
            break;
        }
        let step = session.decode(model, id);
        out.stats.decode_time = decode_start.map(|t| t.elapsed()).unwrap_or_default();
        logits = step?;
    }
    out.stats.decode_time = decode_start.map(|t| t.elapsed()).unwrap_or_default();
    Ok(())
}
