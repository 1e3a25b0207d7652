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

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Sampling {
    /// The highest logit (the lowest id among equal maxima).
    Greedy,
    /// Sample from `softmax(logits / temperature)` restricted to the `top_k` most likely
    /// tokens (0 = no limit) and then to the smallest set whose probability reaches
    /// `top_p` (1.0 = no limit), with a seeded generator: the same seed gives the same
    /// tokens.
    Random {
        /// Divides the logits before the softmax; finite and > 0.
        temperature: f32,
        /// Candidates kept by rank (0: all).
        top_k: usize,
        /// Probability mass kept, in (0, 1].
        top_p: f32,
        /// Seed of the generator.
        seed: u64,
    },
}

/// A sampler: [`Sampling`] plus the state of its random generator.
#[derive(Clone, Debug)]
pub struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    /// Checks the parameters: temperature finite and > 0, `top_p` in (0, 1].
    pub fn new(sampling: Sampling) -> Result<Self, ModelError> {
        let seed = match sampling {
            Sampling::Greedy => 0,
            Sampling::Random {
                temperature,
                top_p,
                seed,
                ..
            } => {
                if !(temperature.is_finite() && temperature > 0.0) {
                    return Err(ModelError::Sampling {
                        param: "temperature",
                        rule: "finite and > 0",
                        value: temperature,
                    });
                }
                if !(top_p > 0.0 && top_p <= 1.0) {
                    return Err(ModelError::Sampling {
                        param: "top-p",
                        rule: "in (0, 1]",
                        value: top_p,
                    });
                }
                seed
            }
        };
        Ok(Sampler {
            sampling,
            rng: SplitMix64(seed),
        })
    }

    /// Picks a token from one row of logits, `[vocab]`.
    ///
    /// Errors when the row is empty or holds a NaN (a NaN logit has no order, so no
    /// token can be said to be the most likely).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        if logits.is_empty() || logits.iter().any(|v| v.is_nan()) {
            return Err(ModelError::NonFinite { what: "logits" });
        }
        match self.sampling {
            Sampling::Greedy => Ok(argmax(logits)),
            Sampling::Random {
                temperature,
                top_k,
                top_p,
                ..
            } => {
                // Candidates by descending logit (ties: lower id first), truncated to top-k.
                let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
                idx.sort_by(|&a, &b| {
                    logits[b as usize]
                        .total_cmp(&logits[a as usize])
                        .then(a.cmp(&b))
                });
                if top_k > 0 {
                    idx.truncate(top_k);
                }
                // Softmax in f64 over the candidates, max-subtracted.
                let max = f64::from(logits[idx[0] as usize]);
                let t = f64::from(temperature);
                let mut probs: Vec<f64> = idx
                    .iter()
                    .map(|&i| ((f64::from(logits[i as usize]) - max) / t).exp())
                    .collect();
                let total: f64 = probs.iter().sum();
                probs.iter_mut().for_each(|p| *p /= total);
                // Nucleus: keep the smallest prefix whose mass reaches top_p.
                let mut mass = 0.0;
                let mut keep = probs.len();
                for (i, p) in probs.iter().enumerate() {
                    mass += p;
                    if mass >= f64::from(top_p) {
                        keep = i + 1;
                        break;
                    }
                }
                let kept: f64 = probs[..keep].iter().sum();
                let mut r = self.rng.next_f64() * kept;
                for (i, p) in probs[..keep].iter().enumerate() {
                    if r < *p {
                        return Ok(idx[i]);
                    }
                    r -= p;
                }
                Ok(idx[keep - 1])
            }
        }
    }
}

/// Index of the largest value; the first one among equals.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, seedable generator. Sampling
/// needs reproducibility, not cryptographic strength.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

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
