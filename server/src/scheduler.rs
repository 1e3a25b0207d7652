//! Continuous batching: one thread that owns every running sequence and runs the
//! model, step after step, over all of them at once.
//!
//! Each step:
//! 1. takes the requests that arrived; drops those whose client went away (a closed
//!    channel), freeing their blocks before the pass;
//! 2. admits waiting requests into free slots (at most `parallel` run): each prompt is
//!    looked up in the prefix cache, and starts with the cached blocks it finds;
//! 3. builds one batch: every decoding sequence's next token, then prefill chunks of
//!    the prompts still being read, in order of arrival, up to `batch_tokens` tokens
//!    (at least one chunk);
//! 4. runs `Engine::forward_batch` (the matmuls once for all, attention per sequence);
//!    a sequence whose pool cannot give it a block waits and the others run;
//! 5. samples each sequence that produced logits and sends its text; a sequence that
//!    ends publishes its blocks to the prefix cache, leaves the batch and frees its slot.
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
use kvcore_engine::kvcore::kv::{KvPool, PagedKv};
use kvcore_engine::kvcore::model::{BatchSeq, Logits, ModelError, Sampler, SamplerParams};
use kvcore_engine::kvcore::tokenizer::Tokenizer;
use kvcore_engine::kvcore::{KvError, KvStore};
use kvcore_engine::{Engine, Error, FinishReason, TextPieces};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What the scheduler tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// The next piece of text.
    Text(String),
    /// The generation ended.
    Done(Summary),
    /// The request failed after it was accepted.
    Failed(String),
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
    max_new: usize,
    sampling: SamplerParams,
    stop: Vec<String>,
    events: Option<UnboundedSender<Event>>,
}

impl Job {
    /// A job for `prompt`, generating at most `max_new` tokens.
    pub fn new(
        prompt: Vec<u32>,
        max_new: usize,
        sampling: SamplerParams,
        stop: Vec<String>,
    ) -> Self {
        Job {
            prompt,
            max_new,
            sampling,
            stop,
            events: None,
        }
    }

    /// Its prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
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
    sampler: Sampler,
    pieces: TextPieces<'t>,
    /// The ids of the positions `kv` holds.
    tokens: Vec<u32>,
    /// Prompt tokens found in the cache.
    cached: usize,
    /// Tokens sampled so far.
    generated: usize,
    /// The sampled token the next decode step runs.
    next: Option<u32>,
}

impl Active<'_> {
    /// The tokens this sequence runs next: a prefill chunk or its last sampled token.
    fn input(&self, chunk: usize) -> Vec<u32> {
        let at = self.kv_len();
        let prompt = &self.job.prompt;
        if at < prompt.len() {
            let end = prompt.len().min((at / chunk + 1) * chunk);
            prompt[at..end].to_vec()
        } else {
            self.next.into_iter().collect()
        }
    }

    fn kv_len(&self) -> usize {
        self.kv.len()
    }

    fn prefilling(&self) -> bool {
        self.kv_len() < self.job.prompt.len()
    }

    /// Offers the blocks computed so far to the prefix cache.
    fn publish(&mut self) {
        // Cannot fail: no append is open between steps and `tokens` matches `kv`.
        let _ = self.kv.publish(&self.tokens);
    }
}

/// Runs the scheduler until `rx` is closed and nothing is left to run.
pub fn run(
    engine: Arc<Engine>,
    pool: KvPool,
    rx: Receiver<Job>,
    state: Arc<State>,
    cfg: SchedConfig,
) {
    let engine = &*engine;
    let tok = engine.tokenizer();
    let m = &state.metrics;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut active: Vec<Active<'_>> = Vec::new();
    let mut open = true;
    // A sequence waited for a block in the last step: admit nobody new until one ends.
    let mut starved = false;
    let end = |_: &Job, state: &State| state.release();
    loop {
        // 1. Arrivals.
        if active.is_empty() && waiting.is_empty() {
            if !open {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => waiting.push_back(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    continue;
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if state.past_deadline() {
            // As below: the sequences and their blocks go before the clients hear it.
            let cancelled: Vec<Job> = active
                .drain(..)
                .map(|a| a.job)
                .chain(waiting.drain(..))
                .collect();
            for job in &cancelled {
                Metrics::add(&m.failed, 1);
                end(job, &state);
            }
            publish_gauges(m, &waiting, &active);
            for job in cancelled {
                job.send(Event::Failed(
                    "the server is shutting down: the request was cancelled".into(),
                ));
            }
            continue;
        }
        // Clients that went away: their sequences and blocks go now.
        let mut i = 0;
        while i < active.len() {
            if active[i].job.closed() {
                let mut a = active.swap_remove(i);
                a.publish();
                Metrics::add(&m.cancelled, 1);
                end(&a.job, &state);
                starved = false;
            } else {
                i += 1;
            }
        }
        waiting.retain(|job| {
            let gone = job.closed();
            if gone {
                Metrics::add(&m.cancelled, 1);
                end(job, &state);
            }
            !gone
        });
        // 2. Admission.
        while active.len() < cfg.parallel && (!starved || active.is_empty()) {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            match admit(&pool, job, &cfg, tok) {
                Admitted::Running(a) => {
                    Metrics::add(&m.prompt_tokens, a.job.prompt.len() as u64);
                    Metrics::add(&m.cached_tokens, a.cached as u64);
                    active.push(*a);
                }
                Admitted::Refused(job, e) => {
                    job.send(Event::Failed(e));
                    Metrics::add(&m.failed, 1);
                    end(&job, &state);
                }
            }
        }
        publish_gauges(m, &waiting, &active);
        if active.is_empty() {
            continue;
        }
        // 3. The batch: decode steps first, then prefill chunks up to the token budget.
        let inputs: Vec<Vec<u32>> = active.iter().map(|a| a.input(cfg.prefill_chunk)).collect();
        let mut chosen: Vec<usize> = (0..active.len())
            .filter(|&i| !active[i].prefilling())
            .collect();
        let mut budget = cfg.batch_tokens.saturating_sub(chosen.len());
        let mut any_chunk = false;
        for i in 0..active.len() {
            if active[i].prefilling() && (!any_chunk || inputs[i].len() <= budget) {
                budget = budget.saturating_sub(inputs[i].len());
                any_chunk = true;
                chosen.push(i);
            }
        }
        chosen.sort_unstable();
        // 4. The pass; sequences the pool cannot serve wait and the others retry.
        let mut stalled = Vec::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        let outputs = loop {
            if chosen.is_empty() {
                break Vec::new();
            }
            let result = {
                let mut seqs: Vec<BatchSeq<'_, PagedKv>> = Vec::with_capacity(chosen.len());
                let mut next = chosen.iter().peekable();
                for (i, a) in active.iter_mut().enumerate() {
                    if next.peek() == Some(&&i) {
                        next.next();
                        let logits = if inputs[i].len() + a.kv_len() >= a.job.prompt.len() {
                            Logits::Last
                        } else {
                            Logits::None
                        };
                        seqs.push(BatchSeq::new(&mut a.kv, &inputs[i], logits));
                    }
                }
                engine.forward_batch(&mut seqs)
            };
            match result {
                Ok(out) => break out,
                Err(Error::Model(ModelError::Sequence { index, error })) => {
                    let i = chosen.remove(index);
                    if matches!(*error, ModelError::Kv(KvError::PoolFull { .. })) {
                        stalled.push(i);
                    } else {
                        failed.push((i, Error::Model(*error).message()));
                    }
                }
                Err(e) => {
                    let msg = e.message();
                    failed.extend(chosen.drain(..).map(|i| (i, msg.clone())));
                }
            }
        };
        starved = !stalled.is_empty();
        if starved && outputs.is_empty() && failed.is_empty() {
            // Nobody could run: the youngest sequence gives its blocks back. One that has
            // shown nothing yet goes back to the head of the queue; one that has
            // streamed text cannot be replayed and ends with an error.
            let youngest = *stalled.iter().max().expect("stalled");
            if active[youngest].generated == 0 {
                let a = active.swap_remove(youngest);
                waiting.push_front(a.job);
            } else {
                failed.push((
                    youngest,
                    "the KV cache budget is exhausted by the running requests".into(),
                ));
            }
        }
        if !outputs.is_empty() {
            Metrics::add(&m.steps, 1);
            Metrics::add(
                &m.step_tokens,
                chosen.iter().map(|&i| inputs[i].len() as u64).sum(),
            );
        }
        // 5. Sampling and text.
        let mut finished: Vec<(usize, Option<FinishReason>, Option<String>)> = Vec::new();
        for (&i, logits) in chosen.iter().zip(&outputs) {
            let a = &mut active[i];
            a.tokens.extend_from_slice(&inputs[i]);
            if logits.nrows() == 0 {
                a.publish();
                continue;
            }
            if a.generated == 0 {
                a.publish();
            }
            let row = logits.row(0);
            let id = match a
                .sampler
                .sample(row.as_slice().expect("a logits row is contiguous"))
            {
                Ok(id) => id,
                Err(e) => {
                    finished.push((i, None, Some(Error::Model(e).message())));
                    continue;
                }
            };
            a.sampler.accept(id);
            a.generated += 1;
            Metrics::add(&m.generated_tokens, 1);
            if tok.is_stop(id) {
                finished.push((i, Some(FinishReason::Stop), None));
                continue;
            }
            let piece = a.pieces.push(id);
            if !piece.is_empty() {
                a.job.send(Event::Text(piece));
            }
            if a.pieces.stopped().is_some() {
                finished.push((i, Some(FinishReason::Stop), None));
            } else if a.generated >= a.job.max_new {
                finished.push((i, Some(FinishReason::Length), None));
            } else {
                a.next = Some(id);
            }
        }
        finished.extend(failed.into_iter().map(|(i, msg)| (i, None, Some(msg))));
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        finished.dedup_by_key(|f| f.0);
        // The finished sequences leave the batch and free their blocks, and the gauges and
        // counters say so, before their clients hear the end: a client that reads
        // `[DONE]` and then `/metrics` sees its sequence gone.
        let mut ends: Vec<(Job, Vec<Event>)> = Vec::with_capacity(finished.len());
        for (i, finish, error) in finished {
            let mut a = active.swap_remove(i);
            a.publish();
            let mut events = Vec::with_capacity(2);
            match (finish, error) {
                (Some(finish), _) => {
                    let (held, _) = a.pieces.finish();
                    if !held.is_empty() {
                        events.push(Event::Text(held));
                    }
                    events.push(Event::Done(Summary {
                        finish,
                        prompt_tokens: a.job.prompt.len(),
                        completion_tokens: a.generated,
                        cached_tokens: a.cached,
                    }));
                    Metrics::add(&m.completed, 1);
                }
                (None, error) => {
                    events.push(Event::Failed(error.unwrap_or_default()));
                    Metrics::add(&m.failed, 1);
                }
            }
            let Active { job, .. } = a;
            end(&job, &state);
            ends.push((job, events));
            starved = false;
        }
        publish_gauges(m, &waiting, &active);
        for (job, events) in ends {
            for e in events {
                job.send(e);
            }
        }
    }
}

fn publish_gauges(m: &Metrics, waiting: &VecDeque<Job>, active: &[Active<'_>]) {
    m.queue_depth.store(waiting.len() as u64, Ordering::Relaxed);
    m.running.store(active.len() as u64, Ordering::Relaxed);
}

/// A job's sequence: the longest cached run of its prompt's blocks, cut to whole
/// prefill chunks, and never the whole prompt (its last chunk runs, for the logits).
fn admit<'t>(pool: &KvPool, job: Job, cfg: &SchedConfig, tok: &'t Tokenizer) -> Admitted<'t> {
    let msg = |e: Error| e.message();
    let prepared = Sampler::with_params(job.sampling.clone())
        .map_err(|e| msg(e.into()))
        .and_then(|mut sampler| {
            sampler.set_context(&job.prompt);
            let mut kv = pool
                .lookup(&job.prompt, cfg.ctx)
                .map_err(|e| msg(e.into()))?;
            let c = cfg.prefill_chunk;
            let mut keep = kv.len() / c * c;
            if keep >= job.prompt.len() {
                keep -= c;
            }
            kv.truncate(keep).map_err(|e| msg(e.into()))?;
            Ok((sampler, kv, keep))
        });
    match prepared {
        Ok((sampler, kv, keep)) => Admitted::Running(Box::new(Active {
            tokens: job.prompt[..keep].to_vec(),
            cached: keep,
            kv,
            sampler,
            pieces: TextPieces::new(tok, &job.stop),
            job,
            generated: 0,
            next: None,
        })),
        Err(e) => Admitted::Refused(job, e),
    }
}

/// What [`admit`] made of a job.
enum Admitted<'t> {
    Running(Box<Active<'t>>),
    Refused(Job, String),
}
