//! `kvcore bench`: prompt-processing and token-generation throughput, in the spirit of
//! llama-bench.
//!
//! For every (backend, kernel path, threads) triple, every depth D and every test — `pp
//! N` (one batched forward pass of N prompt tokens) and `tg N` (N one-token decode steps)
//! — it runs a warm-up and then `reps` timed repetitions and reports the median and the
//! spread (min–max) in tokens per second. At depth D (llama-bench's `-d`) the cache first holds D
//! positions, prefilled once and untimed; each repetition starts from a fork of that
//! store (at depth 0, a fresh one). Token ids are a fixed pseudo-random sequence, as
//! llama-bench uses random tokens.
//!
//! With `--sequences S` (a list), each `tg N` runs once per `S` as `S` concurrent
//! sequences, each on its own fork of the store at depth D, decoded together by `N`
//! batched steps (`Llama::forward_batch`, one token per sequence per step): the
//! aggregate rate `S·N / time` is reported (test `tg N x S`). `S = 1` is the plain decode
//! loop.

use crate::backends::{self, BackendChoice, Job, KvChoice, SimdPath};
use crate::commands::peak_rss_bytes;
use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use kvcore::gguf::GgufFile;
use kvcore::model::{Activations, BatchSeq, Llama, Logits};
use kvcore::{Backend, KvStore, KvType};
use std::time::Instant;

/// One measured test.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRow {
    pub backend: String,
    /// The kernels that ran (`Backend::kernel_path`): `"simd/avx512"`, `"scalar"`, ...
    pub kernels: String,
    pub threads: usize,
    pub kv: String,
    /// The cache's element types: `"q8_0"`, or `"f16/q8_0"` (K/V) when they differ.
    pub kv_type: String,
    /// `"f32"` or `"q8"`.
    pub activations: String,
    /// `"pp64"`, `"tg128"`, `"tg128 @ d4096"`, `"tg32 x8 @ d64"` (8 sequences), ...
    pub test: String,
    /// Sequences decoded together (1 but for `tg` with `--sequences`).
    pub sequences: usize,
    /// Positions in the cache before the test.
    pub depth: usize,
    /// Tokens processed in one repetition (all sequences').
    pub tokens: usize,
    /// Tokens per second of each repetition, in run order.
    pub tok_s: Vec<f64>,
    pub median_tok_s: f64,
    pub min_tok_s: f64,
    pub max_tok_s: f64,
    /// `KvStore::bytes()` after the last repetition.
    pub kv_bytes: usize,
    /// Peak RSS of the process after this test.
    pub peak_rss_bytes: u64,
}

/// A depth and the (K, V) types of a prefilled store.
type Prefilled = (usize, (KvType, KvType));

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub prompt_sizes: Vec<usize>,
    pub gen_sizes: Vec<usize>,
    pub depths: Vec<usize>,
    pub reps: usize,
    pub kv: KvChoice,
    /// (K, V) element types, each measured.
    pub kv_types: Vec<(KvType, KvType)>,
    pub activations: Vec<Activations>,
    pub ctx: usize,
    /// Concurrent sequences of each `tg` test, each measured (`[1]`: plain decode).
    pub sequences: Vec<usize>,
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

struct BenchJob<'a> {
    file: GgufFile,
    plan: &'a Plan,
    bar: &'a ProgressBar,
}

impl Job for BenchJob<'_> {
    type Output = Vec<BenchRow>;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<Vec<BenchRow>> {
        let mut model = Llama::load(self.file, b)?;
        let c = model.config().clone();
        let ctx = self.plan.ctx.min(c.context_len);
        let mut rows = Vec::new();
        let sequences = &self.plan.sequences;
        let tests = self.plan.prompt_sizes.iter().map(|&n| (true, n, 1)).chain(
            self.plan
                .gen_sizes
                .iter()
                .flat_map(|&n| sequences.iter().map(move |&s| (false, n, s))),
        );
        let tests: Vec<_> =
            self.plan
                .depths
                .iter()
                .flat_map(|&d| {
                    let tests = tests.clone();
                    self.plan.kv_types.iter().flat_map(move |&kt| {
                        let tests = tests.clone();
                        self.plan.activations.iter().flat_map(move |&a| {
                            tests.clone().map(move |(p, n, s)| (d, kt, a, p, n, s))
                        })
                    })
                })
                .collect();
        // The store prefilled to a depth with a pair of types, reused by its tests.
        let mut at_depth: Option<(Prefilled, Box<dyn KvStore>)> = None;
        for (depth, types, acts, prefill, n, seqs) in tests {
            model = model.with_activations(acts);
            if seqs == 0 {
                bail!("--sequences must be at least 1");
            }
            if n == 0 || depth + n > ctx {
                bail!(
                    "test size {n} at depth {depth} must be between 1 and the context ({ctx}) minus the depth"
                );
            }
            // The store at this depth, prefilled once (untimed), in one pass.
            if at_depth.as_ref().map(|(d, _)| *d) != Some((depth, types)) {
                drop(at_depth.take()); // free the previous store before making the next
                let mut kv = self.plan.kv.new_store(&model, ctx, types)?;
                if depth > 0 {
                    model.forward(&mut kv, &tokens(depth, c.vocab_size), Logits::None)?;
                }
                at_depth = Some(((depth, types), kv));
            }
            let base = &at_depth.as_ref().expect("just set").1;
            // Each sequence its own ids: `[seqs][n]`.
            let ids = tokens(n * seqs, c.vocab_size);
            let mut tok_s = Vec::new();
            let mut kv_bytes = 0;
            // One warm-up repetition, then the timed ones.
            for rep in 0..=self.plan.reps {
                let (secs, bytes) = if seqs == 1 {
                    time_once(&model, base.fork_boxed()?, &ids, prefill)?
                } else {
                    let stores = (0..seqs)
                        .map(|_| base.fork_boxed())
                        .collect::<Result<Vec<_>, _>>()?;
                    time_batched(&model, stores, &ids)?
                };
                if rep > 0 {
                    tok_s.push((n * seqs) as f64 / secs);
                }
                kv_bytes = bytes;
                self.bar.inc(1);
            }
            rows.push(BenchRow {
                backend: model.backend().name().to_string(),
                kernels: model.backend().kernel_path().to_string(),
                threads: model.backend().threads(),
                kv: self.plan.kv.to_string(),
                kv_type: crate::commands::kv_types_name(types),
                activations: acts.name().to_string(),
                test: {
                    let kind = if prefill { "pp" } else { "tg" };
                    let x = match seqs {
                        1 => String::new(),
                        s => format!(" x{s}"),
                    };
                    match depth {
                        0 => format!("{kind}{n}{x}"),
                        d => format!("{kind}{n}{x} @ d{d}"),
                    }
                },
                sequences: seqs,
                depth,
                tokens: n * seqs,
                median_tok_s: median(&tok_s),
                min_tok_s: tok_s.iter().copied().fold(f64::INFINITY, f64::min),
                max_tok_s: tok_s.iter().copied().fold(0.0, f64::max),
                tok_s,
                kv_bytes,
                peak_rss_bytes: peak_rss_bytes(),
            });
        }
        Ok(rows)
    }
}

/// Seconds for one prefill of `ids` or one decode run over `ids`, and the KV bytes after.
fn time_once<B: Backend, K: KvStore>(
    model: &Llama<B>,
    mut kv: K,
    ids: &[u32],
    prefill: bool,
) -> anyhow::Result<(f64, usize)> {
    let t = Instant::now();
    if prefill {
        model.forward(&mut kv, ids, Logits::Last)?;
    } else {
        for &id in ids {
            model.forward(&mut kv, &[id], Logits::Last)?;
        }
    }
    Ok((t.elapsed().as_secs_f64(), kv.bytes()))
}

/// Seconds for `ids.len() / stores.len()` batched decode steps of every store together
/// (store `i` decodes `ids[i·n .. (i + 1)·n]`, one token per step), and the stores' KV
/// bytes after.
fn time_batched<B: Backend>(
    model: &Llama<B>,
    mut stores: Vec<Box<dyn KvStore>>,
    ids: &[u32],
) -> anyhow::Result<(f64, usize)> {
    let n = ids.len() / stores.len();
    let t = Instant::now();
    for step in 0..n {
        let mut seqs: Vec<BatchSeq<'_, dyn KvStore>> = stores
            .iter_mut()
            .zip(ids.chunks_exact(n))
            .map(|(kv, ids)| BatchSeq::new(kv.as_mut(), &ids[step..step + 1], Logits::Last))
            .collect();
        model.forward_batch(&mut seqs)?;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, stores.iter().map(|kv| kv.bytes()).sum()))
}

/// Runs the plan for every backend, kernel path (none given: the default one) and
/// thread count.
pub fn run(
    path: &std::path::Path,
    backends_list: &[BackendChoice],
    kernels_list: &[SimdPath],
    threads_list: &[usize],
    plan: &Plan,
) -> anyhow::Result<Vec<BenchRow>> {
    let kernels_list: Vec<Option<SimdPath>> = match kernels_list {
        [] => vec![None],
        list => list.iter().copied().map(Some).collect(),
    };
    let mut combos = Vec::new();
    for &b in backends_list {
        for &k in &kernels_list {
            for &t in threads_list {
                if t == 0 {
                    bail!("--threads must be at least 1");
                }
                // Only rayon uses more than one thread and only simd and rayon have
                // kernel paths; measure the others once.
                let t = if b == BackendChoice::Rayon { t } else { 1 };
                let k = if b == BackendChoice::Scalar { None } else { k };
                if !combos.contains(&(b, k, t)) {
                    combos.push((b, k, t));
                }
            }
        }
    }
    let per_combo = (plan.prompt_sizes.len() + plan.gen_sizes.len() * plan.sequences.len())
        * plan.activations.len()
        * plan.kv_types.len()
        * plan.depths.len()
        * (plan.reps + 1);
    let bar = ProgressBar::new((combos.len() * per_combo) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    let mut rows = Vec::new();
    for (b, k, t) in combos {
        let on = k.map_or(String::new(), |k| format!(" {k}"));
        bar.set_message(format!("{b}{on} x{t}"));
        let file = GgufFile::open(path)?;
        rows.extend(backends::dispatch(
            b,
            t,
            k,
            BenchJob {
                file,
                plan,
                bar: &bar,
            },
        )?);
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "| backend | kernels | threads | kv | kv type | acts | test | t/s (median) | min–max | kv MiB | peak RSS MiB |\n|---|---|---:|---|---|---|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2}–{:.2} | {:.2} | {:.1} |\n",
            r.backend,
            r.kernels,
            r.threads,
            r.kv,
            r.kv_type,
            r.activations,
            r.test,
            r.median_tok_s,
            r.min_tok_s,
            r.max_tok_s,
            r.kv_bytes as f64 / 1048576.0,
            r.peak_rss_bytes as f64 / 1048576.0
        );
    }
    s
}
