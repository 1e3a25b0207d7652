//! Continuous batching: one thread that owns every running sequence and runs the
//! model, step after step, over all of them at once.
//!
//! [`run`] repeats four phases:
//! 1. **admit**: takes the requests that arrived; drops those whose client went away (a
//!    closed channel), freeing their blocks; admits waiting requests into free slots (at
//!    most `parallel` run): each prompt is looked up in the prefix cache and starts with
//!    the cached blocks it finds;
//! 2. **plan**: every decoding sequence's next token, then prefill chunks of the prompts
//!    still being read, in order of arrival, up to `batch_tokens` tokens (at least one
//!    chunk); the pool says which of them its budget can serve
//!    ([`KvPool::plan`](kvcore_engine::kvcore::kv::KvPool::plan)), and the others wait;
//! 3. **execute**: `Engine::forward_batch` over the planned sequences (the matmuls once
//!    for all, attention per sequence);
//! 4. **emit**: each sequence that produced logits hands them to its
//!    [`Decoder`] (the sampler chain, stop tokens and strings, the budget) and sends its
//!    text; a sequence that ends publishes its blocks to the prefix cache, leaves the
//!    batch and frees its slot.
//!
//! When the pool can serve nobody, the youngest sequence gives its blocks back (requeued
//! if it has streamed nothing, failed otherwise).
//!
//! **Prefill chunks are aligned**: a prompt is read in chunks `[k·C, (k+1)·C)` (C =
//! `prefill_chunk`, a multiple of the block length) whatever the cache held, the cached
//! run being cut to a multiple of C, and a prompt found whole keeping its last chunk to
//! run. Every position's K/V rows and the prompt's logits are therefore computed by the
//! same passes — with the cache or without, alone or beside others — and with 8-bit
//! activations (each decode row's matmuls are its GEMV bit for bit, `forward_batch`'s
//! docs) a request gives the same tokens whatever else the server is doing.
//!
//! The thread is the only one that touches the model; the async runtime only moves
//! bytes.

use crate::metrics::Metrics;
use kvcore_engine::kvcore::KvStore;
use kvcore_engine::kvcore::kv::{KvPool, PagedKv};
use kvcore_engine::kvcore::model::{
    BatchSeq, Decoder, GenerateParams, Logits, Logprobs, ModelError,
};
use kvcore_engine::kvcore::ndarray::Array2;
use kvcore_engine::kvcore::tokenizer::Tokenizer;
use kvcore_engine::{Engine, Error, FinishReason};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// The next piece of text (possibly empty), and the log-probabilities of the token
    /// that produced it when the request asked for them.
    Text(String, Option<TokenLogprobs>),
    /// The generation ended.
    Done(Summary),
    /// The request failed after it was accepted.
    Failed(String),
}

/// One generated token's log-probability and the most likely tokens', each with its
/// bytes (a token may hold part of a UTF-8 character).
#[derive(Clone, Debug)]
pub struct TokenLogprobs {
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f64,
    /// The most likely tokens' bytes and log-probabilities, most likely first.
    pub top: Vec<(Vec<u8>, f64)>,
}

impl TokenLogprobs {
    fn new(tok: &Tokenizer, id: u32, lp: &Logprobs) -> Self {
        // Every id comes from a row of the vocabulary's size.
        let bytes = |id: u32| tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
        TokenLogprobs {
            bytes: bytes(id),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(i, l)| (bytes(i), l)).collect(),
        }
    }
}

/// How a generation ended.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    /// Stop token or string, or length.
    pub finish: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (a final stop token included).
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// A checked request on its way to the scheduler.
#[derive(Debug)]
pub struct Job {
    prompt: Vec<u32>,
    params: GenerateParams,
    events: Option<UnboundedSender<Event>>,
    /// Admitted before (and requeued since): its prompt is counted once.
    admitted: bool,
}

impl Job {
    /// A job generating after `prompt` as `params` say.
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Job {
            prompt,
            params,
            events: None,
            admitted: false,
        }
    }

    /// Its prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Whether its tokens report log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.params.logprobs.is_some()
    }

    /// Sends its events to `tx`.
    pub fn with_events(mut self, tx: UnboundedSender<Event>) -> Self {
        self.events = Some(tx);
        self
    }

    fn send(&self, e: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(e);
        }
    }

    fn closed(&self) -> bool {
        self.events.as_ref().is_none_or(|tx| tx.is_closed())
    }
}

/// The scheduler's settings.
#[derive(Clone, Copy, Debug)]
pub struct SchedConfig {
    /// Most sequences in the running batch.
    pub parallel: usize,
    /// Positions per sequence.
    pub ctx: usize,
    /// Prompt tokens per prefill chunk (a multiple of the block length).
    pub prefill_chunk: usize,
    /// Most tokens one pass runs (at least one chunk runs).
    pub batch_tokens: usize,
}

/// What the HTTP side and the scheduler share.
#[derive(Debug)]
pub struct State {
    /// Requests accepted and not yet ended (waiting or running).
    pub in_system: AtomicUsize,
    /// Most requests in the system: `parallel` running + the queue's bound.
    pub capacity: usize,
    /// Set on SIGTERM: no new request is accepted.
    pub draining: AtomicBool,
    /// When draining, the moment every request still running is cancelled.
    pub deadline: Mutex<Option<Instant>>,
    /// The counters.
    pub metrics: Metrics,
}

impl State {
    /// Shared state for at most `capacity` requests at once.
    pub fn new(capacity: usize) -> Self {
        State {
            in_system: AtomicUsize::new(0),
            capacity,
            draining: AtomicBool::new(false),
            deadline: Mutex::new(None),
            metrics: Metrics::default(),
        }
    }

    /// Takes a place for one request, or says the server is full.
    pub fn admit(&self) -> bool {
        if self.draining.load(Ordering::SeqCst) {
            return false;
        }
        let mut n = self.in_system.load(Ordering::SeqCst);
        loop {
            if n >= self.capacity {
                return false;
            }
            match self
                .in_system
                .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
    }

    /// Gives a place back.
    pub fn release(&self) {
        self.in_system.fetch_sub(1, Ordering::SeqCst);
    }

    fn past_deadline(&self) -> bool {
        let d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        d.is_some_and(|d| Instant::now() >= d)
    }
}

/// A sequence in the running batch.
struct Active<'t> {
    job: Job,
    kv: PagedKv,
    decoder: Decoder<'t>,
    /// The ids of the positions `kv` holds.
    tokens: Vec<u32>,
    /// Prompt tokens found in the cache.
    cached: usize,
    /// The sampled token the next decode step runs.
    next: Option<u32>,
}

impl Active<'_> {
    /// The tokens this sequence runs next: a prefill chunk or its last sampled token.
    fn input(&self, chunk: usize) -> Vec<u32> {
        let at = self.kv.len();
        let prompt = &self.job.prompt;
        if at < prompt.len() {
            let end = prompt.len().min((at / chunk + 1) * chunk);
            prompt[at..end].to_vec()
        } else {
            self.next.into_iter().collect()
        }
    }

    fn prefilling(&self) -> bool {
        self.kv.len() < self.job.prompt.len()
    }

    /// Tokens generated so far.
    fn generated(&self) -> usize {
        self.decoder.tokens().len()
    }

    /// Offers the blocks computed so far to the prefix cache.
    fn publish(&mut self) {
        // Cannot fail: no append is open between steps and `tokens` matches `kv`.
        let _ = self.kv.publish(&self.tokens);
    }
}

/// One pass: which running sequences run which tokens, and which wait for blocks.
#[derive(Default)]
struct Plan {
    /// Indices into `active`, ascending, each with the tokens it runs.
    runs: Vec<(usize, Vec<u32>)>,
    /// Sequences that had tokens to run but no blocks for them.
    stalled: Vec<usize>,
}

/// How a sequence leaves the batch.
enum Exit {
    Finished(FinishReason),
    Failed(String),
}

/// The scheduler's state between steps.
struct Scheduler<'e> {
    engine: &'e Engine,
    pool: KvPool,
    state: Arc<State>,
    cfg: SchedConfig,
    waiting: VecDeque<Job>,
    active: Vec<Active<'e>>,
    /// Whether new jobs can still arrive.
    open: bool,
    /// A sequence waited for blocks in the last step: admit nobody new until one ends.
    starved: bool,
}

/// Runs the scheduler until `rx` is closed and nothing is left to run.
pub fn run(
    engine: Arc<Engine>,
    pool: KvPool,
    rx: Receiver<Job>,
    state: Arc<State>,
    cfg: SchedConfig,
) {
    let mut s = Scheduler {
        engine: &engine,
        pool,
        state,
        cfg,
        waiting: VecDeque::new(),
        active: Vec::new(),
        open: true,
        starved: false,
    };
    while s.receive(&rx) {
        if s.state.past_deadline() {
            s.cancel_all();
            continue;
        }
        s.admit();
        if s.active.is_empty() {
            continue;
        }
        let mut plan = s.plan();
        let (outputs, failed) = s.execute(&mut plan);
        s.emit(plan, outputs, failed);
    }
}

impl<'e> Scheduler<'e> {
    /// Takes the jobs that arrived (waiting for one when idle); false once `rx` is
    /// closed and nothing is left to run.
    fn receive(&mut self, rx: &Receiver<Job>) -> bool {
        if self.active.is_empty() && self.waiting.is_empty() {
            if !self.open {
                return false;
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => self.waiting.push_back(job),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.open = false,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.open = false;
                    break;
                }
            }
        }
        true
    }

    /// Past the shutdown deadline: every request ends; the sequences and their blocks go
    /// before the clients hear it.
    fn cancel_all(&mut self) {
        let m = &self.state.metrics;
        let cancelled: Vec<Job> = self
            .active
            .drain(..)
            .map(|a| a.job)
            .chain(self.waiting.drain(..))
            .collect();
        for _ in &cancelled {
            Metrics::add(&m.failed, 1);
            self.state.release();
        }
        self.publish_gauges();
        for job in cancelled {
            job.send(Event::Failed(
                "the server is shutting down: the request was cancelled".into(),
            ));
        }
    }

    /// Drops the requests whose client went away, then admits waiting ones into free
    /// slots.
    fn admit(&mut self) {
        let m = &self.state.metrics;
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].job.closed() {
                let mut a = self.active.swap_remove(i);
                a.publish();
                Metrics::add(&m.cancelled, 1);
                self.state.release();
                self.starved = false;
            } else {
                i += 1;
            }
        }
        let state = &self.state;
        self.waiting.retain(|job| {
            let gone = job.closed();
            if gone {
                Metrics::add(&m.cancelled, 1);
                state.release();
            }
            !gone
        });
        while self.active.len() < self.cfg.parallel && (!self.starved || self.active.is_empty()) {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            match self.prepare(&job) {
                Ok((decoder, kv, keep)) => {
                    if !job.admitted {
                        Metrics::add(&m.prompt_tokens, job.prompt.len() as u64);
                    }
                    Metrics::add(&m.cached_tokens, keep as u64);
                    self.active.push(Active {
                        tokens: job.prompt[..keep].to_vec(),
                        cached: keep,
                        kv,
                        decoder,
                        job,
                        next: None,
                    });
                }
                Err(e) => {
                    job.send(Event::Failed(e));
                    Metrics::add(&m.failed, 1);
                    self.state.release();
                }
            }
        }
        self.publish_gauges();
    }

    /// A job's decoder and sequence: the longest cached run of its prompt's blocks, cut
    /// to whole prefill chunks and never the whole prompt (its last chunk runs, for the
    /// logits); with the positions kept. Or why it cannot start.
    fn prepare(&self, job: &Job) -> Result<(Decoder<'e>, PagedKv, usize), String> {
        let msg = |e: Error| e.message();
        let decoder = self
            .engine
            .decoder(&job.params, &job.prompt, self.cfg.ctx)
            .map_err(msg)?;
        let mut kv = self
            .pool
            .lookup(&job.prompt, self.cfg.ctx)
            .map_err(|e| msg(e.into()))?;
        let c = self.cfg.prefill_chunk;
        let mut keep = kv.len() / c * c;
        if keep >= job.prompt.len() {
            keep -= c;
        }
        kv.truncate(keep).map_err(|e| msg(e.into()))?;
        Ok((decoder, kv, keep))
    }

    /// The next pass: decode steps first, then prefill chunks up to the token budget,
    /// less what the pool cannot serve.
    fn plan(&self) -> Plan {
        let active = &self.active;
        let inputs: Vec<Vec<u32>> = active
            .iter()
            .map(|a| a.input(self.cfg.prefill_chunk))
            .collect();
        let mut chosen: Vec<usize> = (0..active.len())
            .filter(|&i| !active[i].prefilling())
            .collect();
        let mut budget = self.cfg.batch_tokens.saturating_sub(chosen.len());
        let mut any_chunk = false;
        for i in 0..active.len() {
            if active[i].prefilling() && (!any_chunk || inputs[i].len() <= budget) {
                budget = budget.saturating_sub(inputs[i].len());
                any_chunk = true;
                chosen.push(i);
            }
        }
        chosen.sort_unstable();
        let appends: Vec<(&PagedKv, usize)> = chosen
            .iter()
            .map(|&i| (&active[i].kv, inputs[i].len()))
            .collect();
        let fits = self.pool.plan(&appends);
        let mut plan = Plan::default();
        for (i, fits) in chosen.into_iter().zip(fits) {
            if fits {
                plan.runs.push((i, inputs[i].clone()));
            } else {
                plan.stalled.push(i);
            }
        }
        plan
    }

    /// Runs the planned pass. A sequence the pass refuses (its error names it) leaves
    /// the plan with its message and the others run; the outputs are those of
    /// `plan.runs` as it is then, in order.
    fn execute(&mut self, plan: &mut Plan) -> (Vec<Array2<f32>>, Vec<(usize, String)>) {
        let mut failed = Vec::new();
        loop {
            if plan.runs.is_empty() {
                return (Vec::new(), failed);
            }
            let result = {
                let mut seqs: Vec<BatchSeq<'_, PagedKv>> = Vec::with_capacity(plan.runs.len());
                let mut runs = plan.runs.iter().peekable();
                for (i, a) in self.active.iter_mut().enumerate() {
                    let Some((_, input)) = runs.next_if(|(j, _)| *j == i) else {
                        continue;
                    };
                    let logits = if input.len() + a.kv.len() >= a.job.prompt.len() {
                        Logits::Last
                    } else {
                        Logits::None
                    };
                    seqs.push(BatchSeq::new(&mut a.kv, input, logits));
                }
                self.engine.forward_batch(&mut seqs)
            };
            match result {
                Ok(out) => return (out, failed),
                Err(Error::Model(ModelError::Sequence { index, error })) => {
                    let (i, _) = plan.runs.remove(index);
                    failed.push((i, Error::Model(*error).message()));
                }
                Err(e) => {
                    let msg = e.message();
                    failed.extend(plan.runs.drain(..).map(|(i, _)| (i, msg.clone())));
                }
            }
        }
    }

    /// Hands each sequence's logits to its decoder and sends its text. Sequences that
    /// ended or failed leave the batch, free their blocks and update the gauges and
    /// counters before their clients hear the end (a client that reads `[DONE]` and
    /// then `/metrics` sees its sequence gone). When nobody could run, the youngest
    /// sequence gives its blocks back.
    fn emit(&mut self, plan: Plan, outputs: Vec<Array2<f32>>, failed: Vec<(usize, String)>) {
        let m = &self.state.metrics;
        let mut exits: Vec<(usize, Exit)> = failed
            .into_iter()
            .map(|(i, e)| (i, Exit::Failed(e)))
            .collect();
        self.starved = !plan.stalled.is_empty();
        if self.starved && outputs.is_empty() && exits.is_empty() {
            // One that has shown nothing yet goes back to the head of the queue; one that
            // has streamed text cannot be replayed and ends with an error.
            let youngest = *plan.stalled.iter().max().expect("stalled");
            if self.active[youngest].generated() == 0 {
                let mut a = self.active.swap_remove(youngest);
                // Its cached tokens are counted again, as found, when it is admitted anew.
                m.cached_tokens
                    .fetch_sub(a.cached as u64, Ordering::Relaxed);
                Metrics::add(&m.requeued, 1);
                a.job.admitted = true;
                self.waiting.push_front(a.job);
            } else {
                let e = "the KV cache budget is exhausted by the running requests";
                exits.push((youngest, Exit::Failed(e.into())));
            }
        }
        if !outputs.is_empty() {
            Metrics::add(&m.steps, 1);
            let tokens = plan.runs.iter().map(|(_, t)| t.len() as u64).sum();
            Metrics::add(&m.step_tokens, tokens);
        }
        let tok = self.engine.tokenizer();
        for ((i, input), logits) in plan.runs.into_iter().zip(&outputs) {
            let a = &mut self.active[i];
            a.tokens.extend_from_slice(&input);
            if logits.nrows() == 0 || a.generated() == 0 {
                a.publish();
            }
            if logits.nrows() == 0 {
                continue;
            }
            let row = logits.row(0);
            match a
                .decoder
                .step(row.as_slice().expect("a logits row is contiguous"))
            {
                Err(e) => exits.push((i, Exit::Failed(Error::Model(e).message()))),
                Ok(step) => {
                    Metrics::add(&m.generated_tokens, 1);
                    // The end-of-turn token has no text and no log-probability entry.
                    let logprobs = step
                        .logprobs
                        .as_ref()
                        .filter(|_| !tok.is_stop(step.id))
                        .map(|lp| TokenLogprobs::new(tok, step.id, lp));
                    if !step.text.is_empty() || logprobs.is_some() {
                        a.job.send(Event::Text(step.text, logprobs));
                    }
                    match step.finish {
                        Some(finish) => exits.push((i, Exit::Finished(finish))),
                        None => a.next = Some(step.id),
                    }
                }
            }
        }
        exits.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        exits.dedup_by_key(|e| e.0);
        let mut ends = Vec::with_capacity(exits.len());
        for (i, exit) in exits {
            let mut a = self.active.swap_remove(i);
            a.publish();
            let event = match exit {
                Exit::Finished(finish) => {
                    Metrics::add(&m.completed, 1);
                    Event::Done(Summary {
                        finish,
                        prompt_tokens: a.job.prompt.len(),
                        completion_tokens: a.generated(),
                        cached_tokens: a.cached,
                    })
                }
                Exit::Failed(e) => {
                    Metrics::add(&m.failed, 1);
                    Event::Failed(e)
                }
            };
            self.state.release();
            ends.push((a.job, event));
            self.starved = false;
        }
        self.publish_gauges();
        for (job, event) in ends {
            job.send(event);
        }
    }

    fn publish_gauges(&self) {
        let m = &self.state.metrics;
        m.queue_depth
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        m.running.store(self.active.len() as u64, Ordering::Relaxed);
    }
}
