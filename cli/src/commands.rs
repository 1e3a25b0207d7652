//! The subcommands: load what they need, run, print.

use crate::backends::{self, BackendChoice, Job, KvChoice};
use crate::{BenchArgs, EmbedArgs, GenerateArgs, InfoArgs, ModelArgs, TokenizeArgs};
use anyhow::{Context, bail};
use kvcore::gguf::GgufFile;
use kvcore::model::generate::GenerateError;
use kvcore::model::{self, Activations, Generation, Llama, Sampler, Sampling};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use kvcore::{Backend, DenseKv, GrowKv, KvStore, Session};
use kvcore_fetch as fetch;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The model file: the argument, else `$KVCORE_MODEL`, else the cached SmolLM2 (fetched).
fn model_path(arg: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match arg {
        Some(p) => Ok(p.clone()),
        None => Ok(fetch::smollm2_path()?),
    }
}

fn open(path: &Path) -> anyhow::Result<GgufFile> {
    GgufFile::open(path).with_context(|| format!("cannot load model {}", path.display()))
}

fn threads(m: &ModelArgs) -> anyhow::Result<usize> {
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

pub fn info(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let path = model_path(&a.model)?;
    let file = open(&path)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "file: {}", path.display())?;
    writeln!(
        out,
        "GGUF v{}, {} metadata entries, {} tensors, alignment {}",
        file.version(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment()
    )?;
    writeln!(out, "\nmetadata:")?;
    for (key, value) in file.metadata() {
        writeln!(out, "  {key} = {}", summarize(value))?;
    }
    writeln!(out, "\ntensors:")?;
    writeln!(
        out,
        "  {:<32} {:<6} {:<16} {:>12}",
        "name", "type", "dims", "bytes"
    )?;
    for t in file.tensors() {
        writeln!(
            out,
            "  {:<32} {:<6} {:<16} {:>12}",
            t.name,
            t.dtype.name(),
            format!("{:?}", t.dims),
            t.n_bytes
        )?;
    }
    if let Ok(cfg) = model::LlamaConfig::from_gguf(&file) {
        writeln!(out, "\nconfig: {cfg:?}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A metadata value in one line: long arrays and strings are abbreviated.
fn summarize(v: &kvcore::gguf::Value) -> String {
    use kvcore::gguf::Value;
    match v {
        Value::Str(s) if s.chars().count() > 80 => {
            let head: String = s.chars().take(77).collect();
            format!("{head:?}... ({} chars)", s.chars().count())
        }
        Value::Str(s) => format!("{s:?}"),
        Value::Array(items) if items.len() > 8 => {
            let head: Vec<String> = items.iter().take(4).map(summarize).collect();
            format!("[{}, ...] ({} items)", head.join(", "), items.len())
        }
        Value::Array(items) => {
            let all: Vec<String> = items.iter().map(summarize).collect();
            format!("[{}]", all.join(", "))
        }
        other => format!("{other:?}"),
    }
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

pub fn generate(a: GenerateArgs) -> anyhow::Result<ExitCode> {
    if a.ctx == Some(0) {
        bail!("--ctx must be at least 1");
    }
    let sampling = match a.temp {
        Some(temperature) if !a.greedy => Sampling::Random {
            temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        _ => Sampling::Greedy,
    };
    let sampler = Sampler::new(sampling)?;
    let threads = threads(&a.model)?;
    let file = open(&model_path(&a.model.model)?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let text = if a.raw {
        a.prompt.clone()
    } else {
        let template = ChatTemplate::from_gguf(&file)?
            .context("the model has no chat template (tokenizer.chat_template); use --raw")?;
        template.render(
            &[ChatMessage {
                role: "user".into(),
                content: a.prompt.clone(),
            }],
            true,
        )?
    };
    let mut prompt = Vec::new();
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
        prompt.push(bos);
    }
    prompt.extend(tok.encode(&text));
    let job = GenerateJob {
        file,
        tok,
        prompt,
        sampler,
        args: a,
    };
    backends::dispatch(job.args.model.backend, threads, job)
}

struct GenerateJob {
    file: GgufFile,
    tok: Tokenizer,
    prompt: Vec<u32>,
    sampler: Sampler,
    args: GenerateArgs,
}

impl Job for GenerateJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let model = Llama::load(self.file, b)?.with_activations(self.args.model.activations);
        let trained = model.config().context_len;
        let max_ctx = self.args.ctx.unwrap_or(trained);
        if max_ctx > trained {
            bail!("--ctx {max_ctx} exceeds the model's trained context of {trained} positions");
        }
        if self.prompt.len() > max_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context of {max_ctx} positions (--ctx)",
                self.prompt.len()
            );
        }
        let geometry = model.kv_geometry();
        match self.args.kv {
            KvChoice::Grow => {
                let kv = GrowKv::new(geometry, max_ctx)?;
                run_generation(
                    &model,
                    kv,
                    &self.tok,
                    &self.prompt,
                    self.sampler,
                    &self.args,
                )
            }
            KvChoice::Dense => {
                let kv = DenseKv::new(geometry, max_ctx)?;
                run_generation(
                    &model,
                    kv,
                    &self.tok,
                    &self.prompt,
                    self.sampler,
                    &self.args,
                )
            }
        }
    }
}

fn run_generation<B: Backend, K: KvStore>(
    model: &Llama<B>,
    kv: K,
    tok: &Tokenizer,
    prompt: &[u32],
    mut sampler: Sampler,
    args: &GenerateArgs,
) -> anyhow::Result<ExitCode> {
    let mut session = Session::new(kv);
    let mut stream = tok.stream();
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let result = model::generate(
        model,
        &mut session,
        prompt,
        args.n,
        &mut sampler,
        |id| tok.is_stop(id),
        |id| {
            if args.json || tok.is_stop(id) {
                return;
            }
            // Stream only complete UTF-8; ids are in range (sampled from the vocabulary).
            if let Ok(piece) = stream.push(id) {
                if let Err(e) = stdout
                    .write_all(piece.as_bytes())
                    .and_then(|_| stdout.flush())
                {
                    write_err.get_or_insert(e);
                }
            }
        },
    );
    let (generation, failure) = match result {
        Ok(g) => (g, None),
        Err(e) => {
            let GenerateError { source, partial } = *e;
            (partial, Some(source))
        }
    };
    if !args.json {
        let tail = stream.finish();
        stdout.write_all(tail.as_bytes())?;
        writeln!(stdout)?;
        stdout.flush()?;
        if let Some(e) = write_err {
            return Err(e.into());
        }
        print_stats(&generation, session.kv(), model.activations());
    } else {
        let shown: Vec<u32> = generation
            .tokens
            .iter()
            .copied()
            .filter(|&id| !tok.is_stop(id))
            .collect();
        let s = &generation.stats;
        let json = serde_json::json!({
            "prompt_tokens": prompt,
            "tokens": generation.tokens,
            "text": tok.decode(&shown)?,
            "stopped": generation.stopped,
            "error": failure.as_ref().map(|e| e.to_string()),
            "stats": {
                "ttft_ms": s.ttft.as_secs_f64() * 1e3,
                "prefill_tok_s": s.prefill_tok_s(),
                "decode_tok_s": s.decode_tok_s(),
                "kv_bytes": s.kv_bytes,
                "kv_capacity": s.kv_capacity,
                "kv_dense_bytes": dense_bytes(session.kv()),
                "peak_rss_bytes": peak_rss_bytes(),
                "backend": s.backend,
                "threads": s.threads,
                "activations": model.activations().name(),
                "prompt_token_count": s.prompt_tokens,
                "reused_tokens": s.reused_tokens,
                "prefilled_tokens": s.prefilled_tokens,
                "generated_token_count": s.generated_tokens,
            }
        });
        writeln!(stdout, "{json}")?;
    }
    match failure {
        None => Ok(ExitCode::SUCCESS),
        Some(e) => Err(anyhow::Error::new(e).context(format!(
            "generation stopped after {} tokens",
            generation.tokens.len()
        ))),
    }
}

/// What a dense store of the same geometry would hold: `2 · layers · max_ctx · kv_dim · 4`.
fn dense_bytes<K: KvStore>(kv: &K) -> usize {
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

fn print_stats<K: KvStore>(g: &Generation, kv: &K, acts: Activations) {
    let s = &g.stats;
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "[{} prompt + {} generated tokens | ttft {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s]",
        s.prompt_tokens,
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
