//! The decoder: from a row of logits to the next token and the text a user sees.
//!
//! Every front end generates through one [`Decoder`]: [`generate`](super::generate())
//! for one session (the engine, and so the CLI, C and Python, on top of it), the server's
//! scheduler for each sequence of a batch, the web page with its host's clock. The
//! decoder owns what turns logits into text and decides when a generation ends; its
//! driver owns the model and the store, and feeds it one row of logits per step:
//!
//! ```text
//! logits ─▶ sampler chain ─▶ id ─▶ stop token? ─▶ UTF-8 stream ─▶ stop strings ─▶ text
//!                             └──▶ penalty window         budget ─▶ finish reason
//! ```
//!
//! - **The sampler chain** ([`Sampler`]), its penalty window starting from the prompt.
//! - **Text**: a stop token has no text; a token that ends in the middle of a UTF-8
//!   character is held back until the character completes (an incomplete one at the end
//!   is dropped, never shown as U+FFFD); a tail that may begin a stop string is held back
//!   until the next token decides, and a stop string found across tokens ends the text
//!   before it. The text of a step is what can be shown now.
//! - **The budget**: after a prompt of `p` tokens in a context of `c` positions, at most
//!   `c − p + 1` tokens ([`token_room`]): every generated token but the last is run
//!   through the model, so a generation that uses the whole budget leaves the cache
//!   holding `c` positions. `max_tokens` lowers it, never raises it.
//! - **The finish reason**: a stop token or string ([`FinishReason::Stop`]), the budget
//!   ([`FinishReason::Length`]; [`Decoder::context_full`] says whether the context
//!   rather than `max_tokens` set it), or the driver's [`cancel`](Decoder::cancel).
//!   On the step that ends a generation the text held back for a stop string that never
//!   came is released with that step's text, so the steps' texts are the whole reply.

use super::ModelError;
use super::sample::{Sampler, SamplerParams};
use crate::tokenizer::{StopMatcher, StreamDecoder, Tokenizer};

/// What a generation asks for: the sampler chain, stop strings and a token limit.
/// [`Default`]: greedy, 128 tokens, no stop strings.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GenerateParams {
    /// The most tokens to generate (`None`: until a stop token or the end of the
    /// context; `Some(0)`: none, the prompt is only prefilled). Never more than the
    /// context has room for ([`token_room`]).
    pub max_tokens: Option<usize>,
    /// The sampler chain (temperature 0: greedy).
    pub sampling: SamplerParams,
    /// Stop strings, matched across tokens and not part of the text; empty ones are
    /// ignored.
    pub stop: Vec<String>,
    /// Log-probabilities of each step's token and of this many most likely ones
    /// ([`Step::logprobs`]; `None`: not computed).
    pub logprobs: Option<usize>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams::new(SamplerParams::greedy())
    }
}

impl GenerateParams {
    /// `sampling`, 128 tokens at most, no stop strings.
    pub fn new(sampling: SamplerParams) -> Self {
        GenerateParams {
            max_tokens: Some(128),
            sampling,
            stop: Vec::new(),
            logprobs: None,
        }
    }
}

/// Why a generation ended. Exhaustive on purpose: a new reason must be mapped by every
/// front end (the C ABI's constants, the server's OpenAI names), not fall into a
/// wildcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (end of turn) or a stop string.
    Stop,
    /// The budget: `max_tokens`, or the end of the context.
    Length,
    /// The driver cancelled it (its client went away, a callback said stop).
    Cancelled,
}

impl FinishReason {
    /// `"stop"`, `"length"` or `"cancelled"` (OpenAI's names for the first two).
    pub const fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// The most tokens a generation can produce after a prompt of `prompt_len` tokens in a
/// context of `max_ctx` positions: `max_ctx − prompt_len + 1` (the last generated token
/// is never run through the model), or `None` when the prompt does not fit.
pub fn token_room(prompt_len: usize, max_ctx: usize) -> Option<usize> {
    max_ctx.checked_sub(prompt_len).map(|room| room + 1)
}

/// One step of a [`Decoder`]: the token chosen and the text it lets the user see.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Step {
    /// The token sampled (a final stop token included).
    pub id: u32,
    /// The text that can be shown now (possibly empty).
    pub text: String,
    /// `Some` when this step ended the generation: the driver runs nothing more.
    pub finish: Option<FinishReason>,
    /// The token's log-probability and the most likely tokens', when
    /// [`GenerateParams::logprobs`] asks for them.
    pub logprobs: Option<Logprobs>,
}

/// Log-probabilities of one step, from the raw logits: `log_softmax(logits)`, before
/// the sampler chain (no logit bias, penalties, truncation or temperature), as OpenAI's
/// `logprobs` are. Computed in f64, max-subtracted.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Logprobs {
    /// The chosen token's.
    pub logprob: f64,
    /// The most likely tokens with theirs, by descending logit (ties: lower id first).
    pub top: Vec<(u32, f64)>,
}

impl Logprobs {
    /// `id`'s log-probability under `log_softmax(logits)` and the `top` most likely
    /// tokens'. `logits` is a whole row without NaN (the sampler has checked it) and
    /// `id` is inside it.
    pub fn of(logits: &[f32], id: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let max = f64::from(max);
        let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
        let log_z = max + sum.ln();
        let lp = |i: u32| f64::from(logits[i as usize]) - log_z;
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        let top = top.min(ids.len());
        if top > 0 && top < ids.len() {
            ids.select_nth_unstable_by(top - 1, by_logit);
        }
        ids.truncate(top);
        ids.sort_unstable_by(by_logit);
        Logprobs {
            logprob: lp(id),
            top: ids.into_iter().map(|i| (i, lp(i))).collect(),
        }
    }
}

/// Turns rows of logits into tokens and text, and decides when the generation ends (see
/// the [module docs](self)). One per generation.
#[derive(Debug, Clone)]
pub struct Decoder<'t> {
    sampler: Sampler,
    /// The tokenizer's side: stop tokens and text (`None`: tokens only).
    text_of: Option<TextOf<'t>>,
    /// Tokens this generation may produce.
    budget: usize,
    /// Whether the context (not `max_tokens`) set the budget.
    context_bound: bool,
    /// Top log-probabilities each step reports (`None`: none).
    logprobs: Option<usize>,
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
}

/// Stop tokens and text: the tokenizer, its UTF-8 stream and the stop strings.
#[derive(Debug, Clone)]
struct TextOf<'t> {
    tok: &'t Tokenizer,
    stream: StreamDecoder<'t>,
    stops: StopMatcher,
}

impl<'t> Decoder<'t> {
    /// A decoder for a generation after `prompt` (the penalty window starts from it) in
    /// a context of `max_ctx` positions, with `tok`'s stop tokens and text.
    ///
    /// # Errors
    /// [`ModelError::Sampling`] for a sampling parameter out of range;
    /// [`ModelError::Kv`] with
    /// [`ContextOverflow`](crate::kv::KvError::ContextOverflow) when the prompt is longer
    /// than the context.
    pub fn new(
        tok: &'t Tokenizer,
        params: &GenerateParams,
        prompt: &[u32],
        max_ctx: usize,
    ) -> Result<Self, ModelError> {
        let mut d = Decoder::tokens_only(
            &GenerateParams {
                stop: Vec::new(),
                ..params.clone()
            },
            prompt,
            max_ctx,
        )?;
        d.text_of = Some(TextOf {
            tok,
            stream: tok.stream(),
            stops: StopMatcher::new(params.stop.iter().cloned()),
        });
        Ok(d)
    }

    /// A decoder of tokens without text: no token stops it but the budget, and its
    /// steps' texts are empty (a model without a tokenizer, a test).
    ///
    /// # Errors
    /// Those of [`new`](Self::new), and [`ModelError::Sampling`] for stop strings (they
    /// need text).
    pub fn tokens_only(
        params: &GenerateParams,
        prompt: &[u32],
        max_ctx: usize,
    ) -> Result<Self, ModelError> {
        let room = token_room(prompt.len(), max_ctx).ok_or(ModelError::Kv(
            crate::kv::KvError::ContextOverflow {
                pos: max_ctx,
                max_ctx,
            },
        ))?;
        let bad = |param, rule| {
            Err(ModelError::Sampling {
                param,
                rule,
                value: 0.0,
            })
        };
        if !params.stop.is_empty() {
            return bad("stop", "empty without a tokenizer");
        }
        let mut sampler = Sampler::with_params(params.sampling.clone())?;
        sampler.set_context(prompt);
        let budget = params.max_tokens.map_or(room, |n| n.min(room));
        Ok(Decoder {
            sampler,
            text_of: None,
            budget,
            context_bound: params.max_tokens.is_none_or(|n| n > room),
            logprobs: params.logprobs,
            tokens: Vec::new(),
            text: String::new(),
            // Nothing to generate: a driver only prefills.
            finish: (budget == 0).then_some(FinishReason::Length),
        })
    }

    /// Samples the next token from `logits` (`[vocab]`, the last position's) and returns
    /// it with its text and, if it ends the generation, why.
    ///
    /// # Errors
    /// The sampler's ([`Sampler::sample`]): a row of NaN, every token banned, a
    /// logit-bias id outside the row. The decoder is then unchanged.
    ///
    /// # Panics
    /// When the generation has already ended ([`finish`](Self::finish) is `Some`): the
    /// driver runs nothing after the step that ended it.
    pub fn step(&mut self, logits: &[f32]) -> Result<Step, ModelError> {
        assert!(
            self.finish.is_none(),
            "Decoder::step after the generation ended"
        );
        let id = self.sampler.sample(logits)?;
        let logprobs = self.logprobs.map(|top| Logprobs::of(logits, id, top));
        self.sampler.accept(id);
        self.tokens.push(id);
        let mut text = String::new();
        if let Some(t) = &mut self.text_of {
            if t.tok.is_stop(id) {
                self.finish = Some(FinishReason::Stop);
            } else {
                // A sampled id is inside the row, so inside the vocabulary: it has text.
                let piece = t.stream.push(id).unwrap_or_default();
                text = t.stops.push(&piece);
                if t.stops.stopped().is_some() {
                    self.finish = Some(FinishReason::Stop);
                }
            }
        }
        if self.finish.is_none() && self.tokens.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
        }
        if self.finish.is_some() {
            text.push_str(&self.held());
        }
        self.text.push_str(&text);
        Ok(Step {
            id,
            text,
            finish: self.finish,
            logprobs,
        })
    }

    /// Ends the generation now ([`FinishReason::Cancelled`]); text held back is dropped.
    /// Nothing changes when it has already ended.
    pub fn cancel(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
            self.held();
        }
    }

    /// The text held back for a stop string that never came, for a driver whose
    /// generation ended without a last step (the model failed): shown after it, it
    /// completes the text. Empty once the generation has ended.
    pub fn release(&mut self) -> String {
        let held = self.held();
        self.text.push_str(&held);
        held
    }

    /// Takes the text held back for a stop string.
    fn held(&mut self) -> String {
        self.text_of
            .as_mut()
            .map_or_else(String::new, |t| t.stops.flush())
    }

    /// Why the generation ended, or `None` while it goes on.
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Whether the generation ended (or will end) at the end of the context rather than
    /// at `max_tokens`: a [`FinishReason::Length`] the caller did not ask for.
    pub fn context_full(&self) -> bool {
        self.finish == Some(FinishReason::Length) && self.context_bound
    }

    /// The stop string that ended the generation, if one did.
    pub fn stop_string(&self) -> Option<&str> {
        self.text_of.as_ref().and_then(|t| t.stops.stopped())
    }

    /// The tokens generated so far (a final stop token included).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The text shown so far: every step's text, in order.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Tokens this generation may produce.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Continues `previous`'s random draws ([`Sampler::continue_draws`]): a chat's next
    /// turn draws on from where the last turn's decoder stopped. Call it before the
    /// first step.
    pub fn continue_draws(&mut self, previous: &Sampler) {
        self.sampler.continue_draws(previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::toy;

    const IM_END: u32 = 259;

    /// A row of logits whose largest is `id`'s.
    fn pick(id: u32) -> Vec<f32> {
        let mut row = vec![0.0; 261];
        row[id as usize] = 10.0;
        row
    }

    fn params(max_tokens: Option<usize>, stop: &[&str]) -> GenerateParams {
        GenerateParams {
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..GenerateParams::default()
        }
    }

    /// Steps through `ids`; each step's text and finish.
    fn run(d: &mut Decoder<'_>, ids: &[u32]) -> Vec<(String, Option<FinishReason>)> {
        ids.iter()
            .map(|&id| {
                let step = d.step(&pick(id)).unwrap();
                assert_eq!(step.id, id);
                (step.text, step.finish)
            })
            .collect()
    }

    fn texts(steps: &[(String, Option<FinishReason>)]) -> Vec<&str> {
        steps.iter().map(|(t, _)| t.as_str()).collect()
    }

    #[test]
    fn the_budget_is_the_room_left_plus_the_last_token() {
        assert_eq!(token_room(5, 10), Some(6));
        assert_eq!(token_room(10, 10), Some(1));
        assert_eq!(token_room(11, 10), None);
        let tok = toy();
        let prompt = [b'x' as u32; 7];
        assert!(matches!(
            Decoder::new(&tok, &params(None, &[]), &prompt, 6),
            Err(ModelError::Kv(crate::kv::KvError::ContextOverflow { .. }))
        ));
        let mut d = Decoder::new(&tok, &params(None, &[]), &prompt, 9).unwrap();
        assert_eq!(d.budget(), 3);
        let steps = run(&mut d, b"abc".map(u32::from).as_slice());
        assert_eq!(steps[2].1, Some(FinishReason::Length));
        assert!(steps[..2].iter().all(|s| s.1.is_none()));
        assert!(d.context_full());
        // max_tokens lowers the budget, never raises it.
        let d = Decoder::new(&tok, &params(Some(2), &[]), &prompt, 9).unwrap();
        assert_eq!(d.budget(), 2);
        let d = Decoder::new(&tok, &params(Some(50), &[]), &prompt, 9).unwrap();
        assert_eq!(d.budget(), 3);
        // Nothing to generate: ended before the first step.
        let d = Decoder::new(&tok, &params(Some(0), &[]), &prompt, 9).unwrap();
        assert_eq!(d.finish(), Some(FinishReason::Length));
        assert!(!d.context_full());
    }

    #[test]
    fn a_stop_string_across_tokens_ends_the_text_before_it() {
        let tok = toy();
        let mut d = Decoder::new(&tok, &params(None, &["ab"]), &[1], 100).unwrap();
        let steps = run(&mut d, b"xab".map(u32::from).as_slice());
        assert_eq!(texts(&steps), ["x", "", ""]);
        assert_eq!(steps[2].1, Some(FinishReason::Stop));
        assert_eq!((d.text(), d.stop_string()), ("x", Some("ab")));
        assert_eq!(d.tokens(), b"xab".map(u32::from));
    }

    #[test]
    fn held_text_is_released_on_the_step_that_ends_the_generation() {
        let tok = toy();
        // At the budget.
        let mut d = Decoder::new(&tok, &params(Some(2), &["ab"]), &[1], 100).unwrap();
        let steps = run(&mut d, b"xa".map(u32::from).as_slice());
        assert_eq!(texts(&steps), ["x", "a"]);
        assert_eq!(steps[1].1, Some(FinishReason::Length));
        assert_eq!((d.text(), d.stop_string()), ("xa", None));
        // At a stop token, which has no text of its own.
        let mut d = Decoder::new(&tok, &params(None, &["ab"]), &[1], 100).unwrap();
        let steps = run(&mut d, &[u32::from(b'a'), IM_END]);
        assert_eq!(texts(&steps), ["", "a"]);
        assert_eq!(steps[1].1, Some(FinishReason::Stop));
        assert_eq!(d.stop_string(), None);
    }

    #[test]
    fn utf8_is_held_until_the_character_completes() {
        let tok = toy();
        let mut d = Decoder::new(&tok, &params(None, &[]), &[1], 100).unwrap();
        // "é" is 0xC3 0xA9; an incomplete character at the end is dropped, not U+FFFD.
        let steps = run(&mut d, &[0xC3, 0xA9, 0xC3]);
        assert_eq!(texts(&steps), ["", "é", ""]);
        assert_eq!(d.release(), "");
        assert_eq!(d.text(), "é");
    }

    #[test]
    fn cancel_drops_held_text_and_release_completes_a_failed_one() {
        let tok = toy();
        let mut d = Decoder::new(&tok, &params(None, &["ab"]), &[1], 100).unwrap();
        run(&mut d, &[u32::from(b'a')]);
        d.cancel();
        assert_eq!(d.finish(), Some(FinishReason::Cancelled));
        assert_eq!((d.release(), d.text()), (String::new(), ""));
        // A driver whose model failed releases what was held.
        let mut d = Decoder::new(&tok, &params(None, &["ab"]), &[1], 100).unwrap();
        run(&mut d, b"xa".map(u32::from).as_slice());
        assert_eq!((d.release(), d.text()), ("a".to_string(), "xa"));
    }

    #[test]
    #[should_panic(expected = "after the generation ended")]
    fn a_step_after_the_end_is_a_programming_error() {
        let tok = toy();
        let mut d = Decoder::new(&tok, &params(Some(1), &[]), &[1], 100).unwrap();
        run(&mut d, &[1, 2]);
    }

    #[test]
    fn the_penalty_window_starts_from_the_prompt() {
        let tok = toy();
        let mut p = params(None, &[]);
        p.sampling.presence_penalty = 5.0;
        let mut row = vec![0.0; 261];
        row[b'x' as usize] = 2.0;
        row[b'y' as usize] = 1.0;
        let mut d = Decoder::new(&tok, &p, &[u32::from(b'x')], 100).unwrap();
        assert_eq!(d.step(&row).unwrap().id, u32::from(b'y'));
        let mut d = Decoder::new(&tok, &p, &[u32::from(b'z')], 100).unwrap();
        assert_eq!(d.step(&row).unwrap().id, u32::from(b'x'));
    }

    #[test]
    fn a_next_turn_continues_the_draws() {
        let tok = toy();
        let mut p = params(None, &[]);
        p.sampling = SamplerParams::default();
        p.sampling.seed = 7;
        let row: Vec<f32> = (0..261).map(|i| (i % 7) as f32 * 0.3).collect();
        let mut one = Decoder::new(&tok, &p, &[1], 1000).unwrap();
        let drawn: Vec<u32> = (0..20).map(|_| one.step(&row).unwrap().id).collect();
        let mut first = Decoder::new(&tok, &p, &[1], 1000).unwrap();
        let mut ids: Vec<u32> = (0..10).map(|_| first.step(&row).unwrap().id).collect();
        let mut second = Decoder::new(&tok, &p, &[1], 1000).unwrap();
        second.continue_draws(first.sampler());
        ids.extend((0..10).map(|_| second.step(&row).unwrap().id));
        assert_eq!(ids, drawn);
        assert!(drawn.iter().collect::<std::collections::HashSet<_>>().len() > 2);
    }

    #[test]
    fn tokens_only_has_no_text_and_refuses_stop_strings() {
        let mut d = Decoder::tokens_only(&params(Some(3), &[]), &[1], 100).unwrap();
        let steps = run(&mut d, &[IM_END, 5, 6]);
        assert_eq!(texts(&steps), ["", "", ""]);
        assert_eq!(steps[2].1, Some(FinishReason::Length));
        assert!(matches!(
            Decoder::tokens_only(&params(None, &["a"]), &[1], 100),
            Err(ModelError::Sampling { param: "stop", .. })
        ));
    }

    #[test]
    fn logprobs_are_the_raw_rows_log_softmax_whatever_the_sampler_does() {
        let tok = toy();
        let mut p = params(Some(4), &[]);
        p.logprobs = Some(3);
        // A bias the sampler applies and the log-probabilities do not see.
        p.sampling.logit_bias = vec![(b'z' as u32, 50.0)];
        let mut d = Decoder::new(&tok, &p, &[1], 100).unwrap();
        let mut row = vec![0.0f32; 261];
        row[b'a' as usize] = 3.0;
        row[b'b' as usize] = 2.0;
        row[b'c' as usize] = 2.0;
        let step = d.step(&row).unwrap();
        assert_eq!(step.id, u32::from(b'z'));
        let lp = step.logprobs.expect("asked for");
        let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((lp.logprob - (1.0 / z).ln()).abs() < 1e-12, "{lp:?}");
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [b'a', b'b', b'c'].map(u32::from));
        assert!((lp.top[0].1 - (3f64.exp() / z).ln()).abs() < 1e-12);
        // Not asked for: not computed.
        let mut d = Decoder::new(&tok, &params(Some(4), &[]), &[1], 100).unwrap();
        assert_eq!(d.step(&row).unwrap().logprobs, None);
    }
}
