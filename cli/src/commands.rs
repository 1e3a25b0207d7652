//! The subcommands: load what they need, run, print.

use crate::backends::{self, BackendChoice, Job, KvChoice};
use crate::{BenchArgs, EmbedArgs, GenerateArgs, ModelArgs, SamplingArgs, StoreArgs, TokenizeArgs};
use anyhow::{Context, bail};
use kvcore::gguf::GgufFile;
use kvcore::model::generate::GenerateError;
use kvcore::model::{self, Activations, Generation, Llama, Sampler, Sampling};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
use kvcore::{Backend, DenseKv, GrowKv, KvStore, Session};
use kvcore_fetch as fetch;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The model file: the argument, else `$KVCORE_MODEL`, else the cached SmolLM2 (fetched).
pub(crate) fn model_path(arg: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match arg {
        Some(p) => Ok(p.clone()),
        None => Ok(fetch::smollm2_path()?),
    }
}

pub(crate) fn open(path: &Path) -> anyhow::Result<GgufFile> {
    GgufFile::open(path).with_context(|| format!("cannot load model {}", path.display()))
}

pub fn threads(m: &ModelArgs) -> anyhow::Result<usize> {
    match m.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => {
            if m.backend != BackendChoice::Rayon && n != 1 {
                eprintln!(
                    "kvcore: warning: the {} backend runs on one thread; --threads {n} applies to --backend rayon",
                    m.backend
                );
            }
            Ok(n)
        }
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

pub fn tokenize(a: TokenizeArgs) -> anyhow::Result<ExitCode> {
    let file = open(&model_path(&a.model)?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text);
    if a.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        let words: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", words.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn embed(a: EmbedArgs) -> anyhow::Result<ExitCode> {
    let threads = threads(&a.model)?;
    let file = open(&model_path(&a.model.model)?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text);
    struct Embed {
        file: GgufFile,
        ids: Vec<u32>,
        activations: Activations,
    }
    impl Job for Embed {
        type Output = Vec<f32>;
        fn run<B: Backend>(self, b: B) -> anyhow::Result<Vec<f32>> {
            let model = Llama::load(self.file, b)?.with_activations(self.activations);
            Ok(model.embed(&self.ids)?)
        }
    }
    let v = backends::dispatch(
        a.model.backend,
        threads,
        Embed {
            file,
            ids,
            activations: a.model.activations,
        },
    )?;
    println!("{}", serde_json::to_string(&v)?);
    Ok(ExitCode::SUCCESS)
}

impl SamplingArgs {
    /// The sampler the flags describe: greedy unless `--temp` is given.
    pub fn sampler(&self) -> anyhow::Result<Sampler> {
        let sampling = match self.temp {
            Some(temperature) if !self.greedy => Sampling::Random {
                temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            _ => Sampling::Greedy,
        };
        Ok(Sampler::new(sampling)?)
    }
}

impl StoreArgs {
    /// `--ctx` checked against the model's trained context (the default).
    pub fn max_ctx<B: Backend>(&self, model: &Llama<B>) -> anyhow::Result<usize> {
        let trained = model.config().context_len;
        let max_ctx = self.ctx.unwrap_or(trained);
        if max_ctx > trained {
            bail!("--ctx {max_ctx} exceeds the model's trained context of {trained} positions");
        }
        Ok(max_ctx)
    }

    /// An empty store of the kind `--kv` names for `model`, holding up to `max_ctx`
    /// positions (a trait object: the one place the store is chosen at run time).
    pub fn new_store<B: Backend>(
        &self,
        model: &Llama<B>,
        max_ctx: usize,
    ) -> anyhow::Result<Box<dyn KvStore>> {
        let geometry = model.kv_geometry();
        Ok(match self.kv {
            KvChoice::Grow => Box::new(GrowKv::new(geometry, max_ctx)?),
            KvChoice::Dense => Box::new(DenseKv::new(geometry, max_ctx)?),
        })
    }

    /// Refuses `--ctx 0` before anything is loaded.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.ctx == Some(0) {
            bail!("--ctx must be at least 1");
        }
        Ok(())
    }
}

/// What `generate` and `chat` load before choosing a backend: the model file, its
/// tokenizer and its chat template.
pub struct TextModel {
    pub file: GgufFile,
    pub tok: Tokenizer,
    pub template: Option<ChatTemplate>,
}

impl TextModel {
    /// Opens the model `m` names and reads its tokenizer and chat template.
    pub fn open(m: &ModelArgs) -> anyhow::Result<TextModel> {
        let file = open(&model_path(&m.model)?)?;
        let tok = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        Ok(TextModel {
            file,
            tok,
            template,
        })
    }

    /// The chat template, or an error saying there is none.
    pub fn template(&self) -> anyhow::Result<&ChatTemplate> {
        self.template.as_ref().context(NO_TEMPLATE)
    }

    /// The chat template, owned, or an error saying there is none.
    pub fn into_template(self) -> anyhow::Result<(GgufFile, Tokenizer, ChatTemplate)> {
        let template = self.template.context(NO_TEMPLATE)?;
        Ok((self.file, self.tok, template))
    }
}

const NO_TEMPLATE: &str = "the model has no chat template (tokenizer.chat_template); use --raw";

/// The ids of `text` with the BOS the model asks for.
pub fn prompt_ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
        ids.push(bos);
    }
    ids.extend(tok.encode(text));
    ids
}

/// Loads the weights onto backend `b` with the activations `m` asks for.
pub fn load_model<B: Backend>(file: GgufFile, b: B, m: &ModelArgs) -> anyhow::Result<Llama<B>> {
    Ok(Llama::load(file, b)?.with_activations(m.activations))
}

/// Streams generated text to stdout as complete UTF-8, skipping stop tokens; the first
/// write error is kept for [`finish`](TextStream::finish).
pub struct TextStream<'t> {
    tok: &'t Tokenizer,
    stream: StreamDecoder<'t>,
    error: Option<std::io::Error>,
}

impl<'t> TextStream<'t> {
    pub fn new(tok: &'t Tokenizer) -> Self {
        TextStream {
            tok,
            stream: tok.stream(),
            error: None,
        }
    }

    /// Prints what token `id` completes.
    pub fn push(&mut self, id: u32) {
        if self.tok.is_stop(id) {
            return;
        }
        // Ids are in range (sampled from the vocabulary).
        if let Ok(piece) = self.stream.push(id) {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Prints the rest and a newline; the first write error, if any.
    pub fn finish(self) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(self.stream.finish().as_bytes())?;
        writeln!(out)?;
        out.flush()?;
        self.error.map_or(Ok(()), Err)
    }
}

/// The generated ids that are not stop tokens, and their text.
pub fn shown_text(tok: &Tokenizer, tokens: &[u32]) -> anyhow::Result<String> {
    let shown: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|&id| !tok.is_stop(id))
        .collect();
    Ok(tok.decode(&shown)?)
}

/// The outcome of [`model::generate`] as what was generated and the error that stopped
/// it, if any.
pub fn split_result(
    result: Result<Generation, Box<GenerateError>>,
) -> (Generation, Option<kvcore::model::ModelError>) {
    match result {
        Ok(g) => (g, None),
        Err(e) => {
            let GenerateError { source, partial } = *e;
            (partial, Some(source))
        }
    }
}

pub fn generate(a: GenerateArgs) -> anyhow::Result<ExitCode> {
    a.store.check()?;
    let sampler = a.sampling.sampler()?;
    let threads = threads(&a.model)?;
    let text_model = TextModel::open(&a.model)?;
    let text = if a.raw {
        a.prompt.clone()
    } else {
        text_model
            .template()?
            .render(&[ChatMessage::new("user", a.prompt.clone())], true)?
    };
    let prompt = prompt_ids(&text_model.tok, &text);
    let job = GenerateJob {
        text_model,
        prompt,
        sampler,
        args: a,
    };
    backends::dispatch(job.args.model.backend, threads, job)
}

struct GenerateJob {
    text_model: TextModel,
    prompt: Vec<u32>,
    sampler: Sampler,
    args: GenerateArgs,
}

impl Job for GenerateJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let GenerateJob {
            text_model: TextModel { file, tok, .. },
            prompt,
            mut sampler,
            args,
        } = self;
        let model = load_model(file, b, &args.model)?;
        let max_ctx = args.store.max_ctx(&model)?;
        if prompt.len() > max_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context of {max_ctx} positions (--ctx)",
                prompt.len()
            );
        }
        let mut session = Session::new(args.store.new_store(&model, max_ctx)?);
        if let Some(path) = args.session.as_deref().filter(|p| p.exists()) {
            session
                .restore(&model, path)
                .with_context(|| format!("cannot load session {}", path.display()))?;
        }
        let mut stream = (!args.json).then(|| TextStream::new(&tok));
        let result = model::generate(
            &model,
            &mut session,
            &prompt,
            args.n,
            &mut sampler,
            |id| tok.is_stop(id),
            |id| {
                if let Some(s) = stream.as_mut() {
                    s.push(id);
                }
            },
        );
        let (generation, failure) = split_result(result);
        if let (None, Some(path)) = (&failure, &args.session) {
            session
                .save(&model, path)
                .with_context(|| format!("cannot save session {}", path.display()))?;
        }
        if let Some(stream) = stream {
            stream.finish()?;
            print_stats(&generation, session.kv(), model.activations());
        } else {
            let json = serde_json::json!({
                "prompt_tokens": prompt,
                "tokens": generation.tokens,
                "text": shown_text(&tok, &generation.tokens)?,
                "stopped": generation.stopped,
                "error": failure.as_ref().map(|e| e.to_string()),
                "stats": stats_json(&generation, session.kv(), model.activations()),
            });
            writeln!(std::io::stdout().lock(), "{json}")?;
        }
        match failure {
            None => Ok(ExitCode::SUCCESS),
            Some(e) => Err(anyhow::Error::new(e).context(format!(
                "generation stopped after {} tokens",
                generation.tokens.len()
            ))),
        }
    }
}

/// The `stats` object of `--json` output (`generate` and every `chat` turn).
pub fn stats_json<K: KvStore + ?Sized>(
    g: &Generation,
    kv: &K,
    acts: Activations,
) -> serde_json::Value {
    let s = &g.stats;
    serde_json::json!({
        "ttft_ms": s.ttft.as_secs_f64() * 1e3,
        "prefill_tok_s": s.prefill_tok_s(),
        "decode_tok_s": s.decode_tok_s(),
        "kv_bytes": s.kv_bytes,
        "kv_capacity": s.kv_capacity,
        "kv_dense_bytes": dense_bytes(kv),
        "peak_rss_bytes": peak_rss_bytes(),
        "backend": s.backend,
        "threads": s.threads,
        "activations": acts.name(),
        "prompt_token_count": s.prompt_tokens,
        "reused_tokens": s.reused_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "generated_token_count": s.generated_tokens,
    })
}

/// What a dense store of the same geometry would hold: `2 · layers · max_ctx · kv_dim · 4`.
fn dense_bytes<K: KvStore + ?Sized>(kv: &K) -> usize {
    let g = kv.geometry();
    2 * g.n_layers * kv.max_ctx() * g.kv_dim() * std::mem::size_of::<f32>()
}

/// Peak resident set size of this process, from `getrusage(RUSAGE_SELF)` (Linux reports
/// `ru_maxrss` in KiB); 0 where the OS does not say.
pub fn peak_rss_bytes() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| u64::try_from(u.max_rss()).unwrap_or(0) * 1024)
        .unwrap_or(0)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn print_stats<K: KvStore + ?Sized>(g: &Generation, kv: &K, acts: Activations) {
    let s = &g.stats;
    eprintln!(
        "[{} prompt ({} reused, {} prefilled) + {} generated tokens | ttft {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s]",
        s.prompt_tokens,
        s.reused_tokens,
        s.prefilled_tokens,
        s.generated_tokens,
        s.ttft.as_secs_f64() * 1e3,
        s.prefill_tok_s(),
        s.decode_tok_s()
    );
    eprintln!(
        "[kv {:.2} MiB for {} positions resident (dense at ctx {}: {:.2} MiB) | peak RSS {:.1} MiB | backend {} x{} threads, {} activations]",
        mib(s.kv_bytes),
        s.kv_capacity,
        kv.max_ctx(),
        mib(dense_bytes(kv)),
        peak_rss_bytes() as f64 / (1024.0 * 1024.0),
        s.backend,
        s.threads,
        acts.name()
    );
}

/// The per-turn stats line of `chat`.
pub fn print_turn_stats(turn: usize, g: &Generation) {
    let s = &g.stats;
    eprintln!(
        "[turn {turn} | {} positions reused, {} prefilled | ttft {:.1} ms | decode {:.1} tok/s | kv {:.2} MiB]",
        s.reused_tokens,
        s.prefilled_tokens,
        s.ttft.as_secs_f64() * 1e3,
        s.decode_tok_s(),
        mib(s.kv_bytes)
    );
}

pub fn bench(a: BenchArgs) -> anyhow::Result<ExitCode> {
    if a.reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    if a.ctx == Some(0) {
        bail!("--ctx must be at least 1");
    }
    let path = model_path(&a.model)?;
    let threads = if a.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        a.threads.clone()
    };
    let plan = crate::bench::Plan {
        prompt_sizes: a.prompt.clone(),
        gen_sizes: a.gen_sizes.clone(),
        reps: a.reps,
        kv: a.kv,
        activations: a.activations.clone(),
        ctx: a.ctx.unwrap_or(usize::MAX),
    };
    let rows = crate::bench::run(&path, &a.backend, &threads, &plan)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", crate::bench::markdown(&rows));
    }
    Ok(ExitCode::SUCCESS)
}
