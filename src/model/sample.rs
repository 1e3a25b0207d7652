//! Samplers: how the next token is chosen from a row of logits.
//!
//! A [`Sampler`] runs llama.cpp's default sampler chain, in llama.cpp's order
//! (`common_sampler_init` with the default `samplers` list):
//!
//! 1. **logit bias**: `logit[id] += bias` for every `(id, bias)` given;
//! 2. **repetition penalties** over the last `repeat_last_n` ids of the context (the
//!    prompt and what was generated): for a token seen `c > 0` times, a logit `l` becomes
//!    `l · repeat_penalty` if `l ≤ 0` and `l / repeat_penalty` otherwise, then
//!    `− c · frequency_penalty − presence_penalty`;
//! 3. **top-k**: the `k` largest logits (ties: the lower id first);
//! 4. **top-p**: the smallest prefix, by descending probability under
//!    `softmax(logits)` (no temperature yet), whose mass reaches `p`;
//! 5. **min-p**: the tokens whose probability is at least `min_p` times the largest
//!    (`l ≥ l_max + ln min_p`);
//! 6. **temperature**: the logits divided by `t`; `t = 0` keeps only the largest (greedy);
//! 7. **draw** from `softmax` of what is left, with a seeded generator.
//!
//! llama.cpp's chain also holds DRY, typical-p and XTC, whose defaults do nothing; they
//! are not implemented. Probabilities are computed in f64, max-subtracted.

use super::ModelError;

/// How the next token is chosen: the two common cases. [`SamplerParams`] has every knob.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Sampling {
    /// The highest logit (the lowest id among equal maxima).
    Greedy,
    /// Sample from `softmax(logits / temperature)` restricted to the `top_k` most likely
    /// tokens (0 = no limit) and then to the smallest set whose probability (before the
    /// temperature, as in llama.cpp) reaches `top_p` (1.0 = no limit), with a seeded
    /// generator: the same seed gives the same tokens.
    Random {
        /// Divides the logits before the draw; finite and > 0.
        temperature: f32,
        /// Candidates kept by rank (0: all).
        top_k: usize,
        /// Probability mass kept, in (0, 1].
        top_p: f32,
        /// Seed of the generator.
        seed: u64,
    },
}

/// Every parameter of the sampler chain (see the [module docs](self) for the order).
/// [`Default`] gives llama.cpp's defaults; [`SamplerParams::greedy`] turns everything off.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SamplerParams {
    /// Divides the logits before the draw; 0 picks the largest (greedy). Finite, ≥ 0.
    pub temperature: f32,
    /// Candidates kept by rank (0: all).
    pub top_k: usize,
    /// Probability mass kept, in (0, 1] (1: all).
    pub top_p: f32,
    /// Minimum probability relative to the most likely token, in [0, 1] (0: off).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the window;
    /// finite, > 0 (1: off).
    pub repeat_penalty: f32,
    /// How many of the context's last ids the penalties look at (0: off).
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window; finite.
    pub presence_penalty: f32,
    /// Subtracted from a seen token's logit once per occurrence in the window; finite.
    pub frequency_penalty: f32,
    /// `(id, bias)` added to the logits first; a bias is finite or `-inf` (never pick).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
    /// penalties (window 64), no bias, seed 0.
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Greedy with every other stage off.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerParams::default()
        }
    }

    /// Checks every range (see the field docs).
    fn check(&self) -> Result<(), ModelError> {
        let bad = |param, rule, value| Err(ModelError::Sampling { param, rule, value });
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", "finite and >= 0 (0: greedy)", t);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top-p", "in (0, 1]", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min-p", "in [0, 1]", self.min_p);
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad("repeat-penalty", "finite and > 0 (1: off)", r);
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence-penalty", "finite", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency-penalty", "finite", self.frequency_penalty);
        }
        for &(_, bias) in &self.logit_bias {
            if !(bias.is_finite() || bias == f32::NEG_INFINITY) {
                return bad("logit-bias", "finite or -inf", bias);
            }
        }
        Ok(())
    }

    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

impl From<Sampling> for SamplerParams {
    fn from(s: Sampling) -> Self {
        match s {
            Sampling::Greedy => SamplerParams::greedy(),
            Sampling::Random {
                temperature,
                top_k,
                top_p,
                seed,
            } => SamplerParams {
                temperature,
                top_k,
                top_p,
                seed,
                ..SamplerParams::greedy()
            },
        }
    }
}

/// A sampler: [`SamplerParams`], the state of its random generator, and the window of
/// recent ids the repetition penalties look at.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: SplitMix64,
    /// The last `repeat_last_n` ids of the context, oldest first.
    recent: std::collections::VecDeque<u32>,
}

impl Sampler {
    /// A sampler for `sampling`; the temperature of [`Sampling::Random`] must be > 0.
    ///
    /// # Errors
    /// [`ModelError::Sampling`] naming the parameter out of range.
    pub fn new(sampling: Sampling) -> Result<Self, ModelError> {
        if let Sampling::Random { temperature, .. } = sampling
            && (temperature.is_nan() || temperature <= 0.0)
        {
            return Err(ModelError::Sampling {
                param: "temperature",
                rule: "finite and > 0",
                value: temperature,
            });
        }
        Sampler::with_params(sampling.into())
    }

    /// A sampler running the whole chain with `params`.
    ///
    /// # Errors
    /// [`ModelError::Sampling`] naming the parameter out of range.
    pub fn with_params(params: SamplerParams) -> Result<Self, ModelError> {
        params.check()?;
        Ok(Sampler {
            rng: SplitMix64(params.seed),
            recent: std::collections::VecDeque::with_capacity(params.repeat_last_n.min(4096)),
            params,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Whether this sampler always picks the largest (biased, penalised) logit.
    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0
    }

    /// Sets the penalty window to the last `repeat_last_n` of `context` (the prompt, at
    /// the start of a generation; llama.cpp's CLI does the same).
    pub fn set_context(&mut self, context: &[u32]) {
        self.recent.clear();
        let n = self.params.repeat_last_n;
        self.recent
            .extend(&context[context.len().saturating_sub(n)..]);
    }

    /// Continues `previous`'s random draws: this sampler's next draw is the one
    /// `previous` would make next (a chat's next turn, as llama.cpp's CLI keeps one
    /// sampler for a conversation). The parameters and the penalty window stay.
    pub fn continue_draws(&mut self, previous: &Sampler) {
        self.rng = previous.rng.clone();
    }

    /// Adds `id` to the penalty window (call it for every sampled token).
    pub fn accept(&mut self, id: u32) {
        let n = self.params.repeat_last_n;
        if n == 0 {
            return;
        }
        if self.recent.len() == n {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
    }

    /// Picks a token from one row of logits, `[vocab]` (it does not [`accept`] it).
    ///
    /// # Errors
    /// [`ModelError::NonFinite`] when the row is empty, holds a NaN (a NaN logit has no
    /// order) or every token is banned (`-inf`); [`ModelError::Sampling`] for a
    /// logit-bias id outside the row.
    ///
    /// [`accept`]: Sampler::accept
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        let dist = self.distribution(logits)?;
        if dist.len() == 1 {
            return Ok(dist[0].0);
        }
        let mut r = self.rng.next_f64();
        for &(id, p) in &dist {
            if r < p {
                return Ok(id);
            }
            r -= p;
        }
        Ok(dist[dist.len() - 1].0)
    }

    /// The distribution the draw samples from: the candidates that survive the chain,
    /// by descending probability (ties: lower id first), with probabilities summing to 1.
    /// Greedy gives one candidate with probability 1. Consumes no randomness.
    ///
    /// # Errors
    /// As [`Sampler::sample`].
    pub fn distribution(&self, logits: &[f32]) -> Result<Vec<(u32, f64)>, ModelError> {
        if logits.is_empty() || logits.iter().any(|v| v.is_nan()) {
            return Err(ModelError::NonFinite { what: "logits" });
        }
        let p = &self.params;
        let mut l = logits.to_vec();
        for &(id, bias) in &p.logit_bias {
            let Some(v) = l.get_mut(id as usize) else {
                return Err(ModelError::Sampling {
                    param: "logit-bias id",
                    rule: "below the vocabulary size",
                    value: id as f32,
                });
            };
            *v += bias;
        }
        if p.penalties_on() {
            let mut seen: Vec<u32> = self.recent.iter().copied().collect();
            seen.sort_unstable();
            for run in seen.chunk_by(|a, b| a == b) {
                let Some(v) = l.get_mut(run[0] as usize) else {
                    continue;
                };
                *v = if *v <= 0.0 {
                    *v * p.repeat_penalty
                } else {
                    *v / p.repeat_penalty
                };
                *v -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
        if l.iter().any(|v| v.is_nan()) {
            return Err(ModelError::NonFinite {
                what: "logits after bias and penalties",
            });
        }
        if self.is_greedy() {
            let best = argmax(&l);
            if l[best as usize] == f32::NEG_INFINITY {
                return Err(ModelError::NonFinite {
                    what: "logits (every token is banned)",
                });
            }
            return Ok(vec![(best, 1.0)]);
        }

        // Candidates by descending logit (ties: lower id first), banned ones dropped.
        let by_logit = |a: &u32, b: &u32| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b));
        let mut idx: Vec<u32> = (0..l.len() as u32)
            .filter(|&i| l[i as usize] > f32::NEG_INFINITY)
            .collect();
        if idx.is_empty() {
            return Err(ModelError::NonFinite {
                what: "logits (every token is banned)",
            });
        }
        if p.top_k > 0 && p.top_k < idx.len() {
            idx.select_nth_unstable_by(p.top_k - 1, by_logit);
            idx.truncate(p.top_k);
        }
        idx.sort_unstable_by(by_logit);

        // top-p on softmax(logits), before the temperature.
        if p.top_p < 1.0 {
            let probs = softmax(&idx, &l, 1.0);
            let mut mass = 0.0;
            for (i, q) in probs.iter().enumerate() {
                mass += q;
                if mass >= f64::from(p.top_p) {
                    idx.truncate(i + 1);
                    break;
                }
            }
        }
        // min-p: p_i ≥ min_p · p_max, i.e. l_i ≥ l_max + ln(min_p).
        if p.min_p > 0.0 {
            let floor = f64::from(l[idx[0] as usize]) + f64::from(p.min_p).ln();
            idx.retain(|&i| f64::from(l[i as usize]) >= floor);
        }
        let probs = softmax(&idx, &l, f64::from(p.temperature));
        Ok(idx.into_iter().zip(probs).collect())
    }
}

/// `softmax(l[ids] / t)` in f64, max-subtracted (`ids[0]` holds the maximum).
fn softmax(ids: &[u32], l: &[f32], t: f64) -> Vec<f64> {
    let max = f64::from(l[ids[0] as usize]);
    let mut probs: Vec<f64> = ids
        .iter()
        .map(|&i| ((f64::from(l[i as usize]) - max) / t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    probs
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
