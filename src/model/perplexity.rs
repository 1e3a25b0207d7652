//! Scoring text: log-probabilities, perplexity with its standard error, and the KL
//! divergence between two runs' distributions (how far a quantised cache or activation
//! path moves the model from its f32 reference).
//!
//! The definitions follow llama.cpp's `llama-perplexity`: a token's negative
//! log-likelihood is `−ln p(token | what precedes it)`; perplexity is `exp` of their
//! mean, and its uncertainty is `ppl · sqrt(var(nll) / (N − 1))` (the standard error of
//! the mean, carried through `exp`). Everything is accumulated in f64.

use super::{Llama, Logits, ModelError};
use crate::backend::Backend;
use crate::kv::KvStore;

/// Streams `ids` through `kv` in passes of at most `batch` tokens and hands `score`, in
/// order, the negative log-likelihood of every token after the first given the logits
/// of the one before it: each token is scored once, with whatever the store keeps of
/// what precedes it (a [`SinkKv`](crate::kv::SinkKv): its sinks and its window).
///
/// # Errors
/// `batch == 0` is [`ModelError::EmptyInput`]; a failed pass returns its error (the
/// tokens before it stay in `kv`, scored).
pub fn score_stream<B: Backend, K: KvStore + ?Sized>(
    model: &Llama<B>,
    kv: &mut K,
    ids: &[u32],
    batch: usize,
    mut score: impl FnMut(f64),
) -> Result<(), ModelError> {
    if batch == 0 {
        return Err(ModelError::EmptyInput);
    }
    for (c, chunk) in ids.chunks(batch).enumerate() {
        let logits = model.forward(kv, chunk, Logits::All)?; // [chunk, vocab]
        for (j, row) in logits.rows().into_iter().enumerate() {
            if let Some(&next) = ids.get(c * batch + j + 1) {
                let lp = log_softmax(row.as_slice().expect("rows are contiguous"));
                score(-f64::from(lp[next as usize]));
            }
        }
    }
    Ok(())
}

/// `ln softmax(logits)`, computed in f64 (max-subtracted) and returned as f32.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let log_z = max + sum.ln();
    logits
        .iter()
        .map(|&v| (f64::from(v) - log_z) as f32)
        .collect()
}

/// Running perplexity over scored tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Perplexity {
    nll: f64,
    nll2: f64,
    count: usize,
}

impl Perplexity {
    /// Adds one token's negative log-likelihood.
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// Tokens scored so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// `exp(mean nll)` (NaN before any token).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The standard error of [`Perplexity::ppl`]: `ppl · sqrt(var / (N − 1))`, 0 for
    /// fewer than two tokens.
    pub fn stderr(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = (self.nll2 / n - mean * mean).max(0.0);
        self.ppl() * (var / (n - 1.0)).sqrt()
    }
}

/// `KL(P ‖ Q) = Σ p·(ln p − ln q)` of two log-probability rows (`base` is P), in f64.
/// Terms where `p` is 0 contribute nothing.
pub fn kl_divergence(base: &[f32], other: &[f32]) -> f64 {
    base.iter()
        .zip(other)
        .map(|(&lp, &lq)| {
            let p = f64::from(lp).exp();
            if p == 0.0 {
                0.0
            } else {
                p * (f64::from(lp) - f64::from(lq))
            }
        })
        .sum()
}

/// Index of the largest value (the first among equals).
pub fn top1(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// KL divergences and top-1 agreement of one run against a base run, token by token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Divergence {
    klds: Vec<f64>,
    agree: usize,
}

impl Divergence {
    /// Adds one position: the base run's and this run's log-probabilities.
    pub fn add(&mut self, base: &[f32], other: &[f32]) {
        self.klds.push(kl_divergence(base, other));
        if top1(base) == top1(other) {
            self.agree += 1;
        }
    }

    /// Positions compared.
    pub fn count(&self) -> usize {
        self.klds.len()
    }

    /// Mean KL divergence (NaN before any position).
    pub fn mean(&self) -> f64 {
        self.klds.iter().sum::<f64>() / self.klds.len() as f64
    }

    /// The `q`-quantile of the KL divergences (nearest rank; `q` in [0, 1]); NaN before
    /// any position.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.klds.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.klds.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    /// The fraction of positions whose most likely token is the base run's.
    pub fn top1_agreement(&self) -> f64 {
        self.agree as f64 / self.klds.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_a_hand_computed_row() {
        // softmax([0, ln 3]) = [1/4, 3/4].
        let l = log_softmax(&[0.0, 3f32.ln()]);
        assert!((f64::from(l[0]) - 0.25f64.ln()).abs() < 1e-7, "{l:?}");
        assert!((f64::from(l[1]) - 0.75f64.ln()).abs() < 1e-7, "{l:?}");
        // Shifting every logit changes nothing; huge logits do not overflow.
        let shifted = log_softmax(&[1000.0, 1000.0 + 3f32.ln()]);
        assert!((shifted[0] - l[0]).abs() < 1e-4, "{shifted:?}");
    }

    #[test]
    fn perplexity_and_its_error_by_hand() {
        // nll 1 and 3: mean 2, ppl e²; var = (1 + 9)/2 − 4 = 1, stderr = e² · sqrt(1/1).
        let mut p = Perplexity::default();
        p.add(1.0);
        p.add(3.0);
        assert_eq!(p.count(), 2);
        assert!((p.ppl() - 2f64.exp()).abs() < 1e-12);
        assert!((p.stderr() - 2f64.exp()).abs() < 1e-12);
        let mut one = Perplexity::default();
        one.add(0.5);
        assert_eq!(one.stderr(), 0.0);
    }

    #[test]
    fn kl_divergence_by_hand() {
        // P = [1/2, 1/2], Q = [1/4, 3/4]: ½ ln 2 + ½ ln(2/3).
        let p = [0.5f32.ln(), 0.5f32.ln()];
        let q = [0.25f32.ln(), 0.75f32.ln()];
        let want = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-7);
        assert!(kl_divergence(&p, &p).abs() < 1e-12);
        // A zero-probability base token contributes nothing.
        assert_eq!(kl_divergence(&[0.0, f32::NEG_INFINITY], &[0.0, -5.0]), 0.0);
    }

    #[test]
    fn divergence_quantiles_and_agreement() {
        let mut d = Divergence::default();
        let same = [0.0f32, -1.0];
        let flipped = [-1.0f32, 0.0];
        d.add(&same, &same);
        d.add(&same, &flipped);
        assert_eq!(d.count(), 2);
        assert_eq!(d.top1_agreement(), 0.5);
        assert_eq!(d.quantile(0.0), d.quantile(0.5));
        assert!(d.quantile(0.99) > 0.0);
        assert!((d.mean() - d.quantile(0.99) / 2.0).abs() < 1e-12);
    }
}
