//! The generation loop of one session: prefill, then one decode step per token, a
//! [`Decoder`] choosing each token and deciding when to stop.
//!
//! [`generate`] prefills the prompt into a [`Session`] (reusing what it already holds) in
//! one batched forward pass, then hands each row of logits to the decoder and runs the
//! token it chose, until the decoder's step ends the generation (a stop token or string,
//! the budget, a cancel). A failed pass is an error that still carries the tokens
//! generated so far.

use super::decoder::{Decoder, FinishReason, Step};
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

/// The result of [`generate`]: the tokens, why they ended, and the measurements. The
/// text is the decoder's ([`Decoder::text`]).
#[derive(Clone, Debug, Default)]
pub struct Generation {
    /// Generated ids, in order (a stop token that ended the generation included).
    pub tokens: Vec<u32>,
    /// Why it ended (`None`: an error ended it, or it only prefilled).
    pub finish: Option<FinishReason>,
    /// Measurements.
    pub stats: GenStats,
}

impl Generation {
    /// Whether a stop token or string ended it.
    pub fn stopped(&self) -> bool {
        self.finish == Some(FinishReason::Stop)
    }
}

/// Generation that failed part-way: the error and what had been generated before it.
#[derive(Debug, thiserror::Error)]
#[error("generation stopped after {} generated tokens", partial.tokens.len())]
pub struct GenerateError {
    /// The cause (e.g. a kernel's or the store's error).
    #[source]
    pub source: ModelError,
    /// Tokens generated before the error, with their statistics.
    pub partial: Generation,
}

/// Generates after `prompt` in `session`, `decoder` choosing each token (its budget,
/// stop tokens and strings end the generation).
///
/// The session first holds `prompt` ([`Session::prefill`]: positions it already holds
/// are reused, the rest run in one batched pass); each new token then costs one decode
/// step. `on_step` sees every step as soon as it is sampled (for streaming); returning
/// false cancels the generation after it. The last sampled token is not run through the
/// model, so the session ends holding the prompt and every generated token but the last.
/// A decoder whose budget is 0 (`max_tokens: Some(0)`) only prefills.
pub fn generate<B: Backend, K: KvStore>(
    model: &Llama<B>,
    session: &mut Session<K>,
    prompt: &[u32],
    decoder: &mut Decoder<'_>,
    mut on_step: impl FnMut(&Step) -> bool,
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
    let result = run(model, session, prompt, decoder, &mut on_step, &mut out);
    out.tokens = decoder.tokens().to_vec();
    out.stats.generated_tokens = out.tokens.len();
    out.finish = decoder.finish();
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

fn run<B: Backend, K: KvStore>(
    model: &Llama<B>,
    session: &mut Session<K>,
    prompt: &[u32],
    decoder: &mut Decoder<'_>,
    on_step: &mut impl FnMut(&Step) -> bool,
    out: &mut Generation,
) -> Result<(), ModelError> {
    let start = Instant::now();
    let prefill = session.prefill(model, prompt)?;
    out.stats.prefill_time = start.elapsed();
    out.stats.reused_tokens = prefill.reused;
    out.stats.prefilled_tokens = prefill.prefilled;
    if decoder.finish().is_some() {
        return Ok(());
    }
    let mut logits = prefill.logits; // [vocab]
    let mut decode_start = None;
    loop {
        let step = decoder.step(&logits)?;
        if decode_start.is_none() {
            out.stats.ttft = start.elapsed();
            decode_start = Some(Instant::now());
        }
        if !on_step(&step) {
            decoder.cancel();
        }
        if decoder.finish().is_some() {
            break;
        }
        let next = session.decode(model, step.id);
        out.stats.decode_time = decode_start.map(|t| t.elapsed()).unwrap_or_default();
        logits = next?;
    }
    out.stats.decode_time = decode_start.map(|t| t.elapsed()).unwrap_or_default();
    Ok(())
}
