//! The subcommands: load what they need, run, print.

use crate::backends::{self, BackendChoice, Job};
use crate::{
    BenchArgs, EmbedArgs, GenerateArgs, KvTypeArgs, ModelArgs, ReplyArgs, SamplingArgs, StoreArgs,
    TokenizeArgs,
};
use anyhow::{Context, bail};
use kvcore::gguf::GgufFile;
use kvcore::kv::Checkpoints;
use kvcore::model::generate::GenerateError;
use kvcore::model::{
    self, Activations, Decoder, GenerateParams, Generation, Llama, ModelError, Sampler,
    SamplerParams,
};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer};
use kvcore::{Backend, KvError, KvStore, KvType, Session};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The model file: the argument (a path, or `smollm2` / `gemma3`:
/// [`kvcore_engine::resolve_model`]); without one, `smollm2` (`$KVCORE_MODEL`, else the
/// cached SmolLM2, fetched).
pub(crate) fn model_path(arg: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let name = arg.as_deref().unwrap_or(Path::new("smollm2"));
    Ok(kvcore_engine::resolve_model(name)?)
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
            Ok(clamp_threads(n))
        }
        None => Ok(cores()),
    }
}

/// `n`, or the machine's cores when `n` is more, said in one line: workers that
/// outnumber the cores spin waiting for each other and slow every step down many times.
fn clamp_threads(n: usize) -> usize {
    let c = cores();
    if n > c {
        eprintln!(
            "kvcore: --threads {n} is more than the {c} cores of this machine: using {c} \
             (threads that outnumber cores wait on each other's spinning and make decoding much slower)"
        );
        c
    } else {
        n
    }
}

/// The cores this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn tokenize(a: TokenizeArgs) -> anyhow::Result<ExitCode> {
    let (model, text) = a.input.split()?;
    // Only the vocabulary is needed, whatever formats the tensors are in.
    let path = model_path(&model)?;
    let file = GgufFile::open_metadata(&path)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&text, special_mode(a.parse_special));
    if a.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        let words: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", words.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn embed(a: EmbedArgs) -> anyhow::Result<ExitCode> {
    let (model, text) = a.input.split()?;
    let m = ModelArgs {
        model,
        backend: a.backend,
        threads: a.threads,
        kernels: a.kernels,
    };
    let threads = threads(&m)?;
    let file = open(&model_path(&m.model)?)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&text, Special::Literal);
    struct Embed {
        file: GgufFile,
        ids: Vec<u32>,
    }
    impl Job for Embed {
        type Output = Vec<f32>;
        fn run<B: Backend>(self, b: B) -> anyhow::Result<Vec<f32>> {
            let model = Llama::load(self.file, b)?;
            Ok(model.embed(&self.ids)?)
        }
    }
    let v = backends::dispatch(m.backend, threads, m.kernels, Embed { file, ids })?;
    println!("{}", serde_json::to_string(&v)?);
    Ok(ExitCode::SUCCESS)
}

/// `--parse-special` as the tokenizer's mode.
fn special_mode(parse_special: bool) -> Special {
    if parse_special {
        Special::Parse
    } else {
        Special::Literal
    }
}

impl SamplingArgs {
    /// The sampler chain the flags describe: greedy unless `--temp` > 0 is given, or a
    /// sampling filter (`--top-k`, `--top-p`, `--min-p`) is given without `--temp` (then
    /// at llama.cpp's default temperature, with a note). A filter that cannot act
    /// (`--temp 0`) is a warning, never silently ignored.
    pub fn sampling(&self) -> anyhow::Result<SamplerParams> {
        let defaults = SamplerParams::default();
        let filters: Vec<&str> = [
            ("--top-k", self.top_k.is_some()),
            ("--top-p", self.top_p.is_some()),
            ("--min-p", self.min_p.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect();
        let temperature = match self.temp {
            _ if self.greedy => 0.0,
            Some(t) if !(t.is_finite() && t >= 0.0) => {
                bail!("--temp must be a number >= 0 (0: greedy), got {t}")
            }
            Some(t) => {
                if t == 0.0 && !filters.is_empty() {
                    eprintln!(
                        "kvcore: warning: {} has no effect with --temp 0 (greedy picks the most likely token)",
                        filters.join(", ")
                    );
                }
                t
            }
            None if !filters.is_empty() => {
                eprintln!(
                    "kvcore: note: {} given without --temp: sampling at temperature {} (llama.cpp's default)",
                    filters.join(", "),
                    defaults.temperature
                );
                defaults.temperature
            }
            None => 0.0,
        };
        let repeat_last_n = match self.repeat_last_n {
            -1 => usize::MAX,
            n => usize::try_from(n).map_err(|_| {
                anyhow::anyhow!("--repeat-last-n must be -1 (the whole context) or >= 0, got {n}")
            })?,
        };
        let mut params = SamplerParams::greedy();
        params.temperature = temperature;
        params.top_k = self.top_k.unwrap_or(defaults.top_k);
        params.top_p = self.top_p.unwrap_or(defaults.top_p);
        params.min_p = self.min_p.unwrap_or(defaults.min_p);
        params.repeat_penalty = self.repeat_penalty;
        params.repeat_last_n = repeat_last_n;
        params.presence_penalty = self.presence_penalty;
        params.frequency_penalty = self.frequency_penalty;
        params.logit_bias = self.logit_bias.clone();
        params.seed = self.seed;
        Sampler::with_params(params.clone())?;
        Ok(params)
    }

    /// Refuses a `--logit-bias` id outside the vocabulary.
    pub fn check_vocab(&self, tok: &Tokenizer) -> anyhow::Result<()> {
        for &(id, _) in &self.logit_bias {
            if id as usize >= tok.vocab_size() {
                bail!(
                    "--logit-bias names token {id}, which is not in the vocabulary ({} tokens)",
                    tok.vocab_size()
                );
            }
        }
        Ok(())
    }
}

/// `-n`: `-1` or a count.
pub fn check_n(n: i64) -> anyhow::Result<()> {
    if n < -1 {
        bail!(
            "-n must be -1 (until an end-of-generation token or the end of the context) or >= 0, got {n}"
        );
    }
    Ok(())
}

/// What a generation asks for: the sampler chain, `-n` (`-1`: until the context is
/// full) and the `--stop` strings.
pub fn generate_params(sampling: &SamplerParams, n: i64, stop: &[String]) -> GenerateParams {
    let mut params = GenerateParams::new(sampling.clone());
    params.max_tokens = usize::try_from(n).ok();
    params.stop = stop.to_vec();
    params
}

/// A generation that asked for more tokens (`-n`) than the context had room for ends as
/// a failure at the full context, as it would have when the next token found no room.
pub fn context_full(decoder: &Decoder<'_>, n: i64, max_ctx: usize) -> Option<ModelError> {
    (n >= 0 && decoder.context_full()).then_some(ModelError::Kv(KvError::ContextOverflow {
        pos: max_ctx,
        max_ctx,
    }))
}

impl KvTypeArgs {
    /// Every (K, V) pair asked for: each `--kv-type` (default f32) with `--kv-type-k` and
    /// `--kv-type-v` overriding its K or V, without repeats.
    pub fn pairs(&self) -> Vec<(KvType, KvType)> {
        let both = if self.kv_type.is_empty() {
            vec![KvType::F32]
        } else {
            self.kv_type.clone()
        };
        let mut pairs = Vec::new();
        for t in both {
            let pair = (self.kv_type_k.unwrap_or(t), self.kv_type_v.unwrap_or(t));
            if !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
        pairs
    }

    /// The one (K, V) pair of a command that runs one store.
    pub fn single(&self) -> anyhow::Result<(KvType, KvType)> {
        match self.pairs()[..] {
            [pair] => Ok(pair),
            _ => bail!("--kv-type takes one type here (a list is for bench)"),
        }
    }
}

/// `"q8_0"` for a pair of one type, `"f16/q8_0"` (K/V) otherwise.
pub fn kv_types_name((k, v): (KvType, KvType)) -> String {
    if k == v {
        k.name().to_string()
    } else {
        format!("{}/{}", k.name(), v.name())
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
    /// positions (a trait object: the one place the store is chosen at run time), with
    /// the window checkpoints `--ctx-checkpoints` and `--checkpoint-every` ask for.
    pub fn new_store<B: Backend>(
        &self,
        model: &Llama<B>,
        max_ctx: usize,
    ) -> anyhow::Result<Box<dyn KvStore>> {
        let types = self.kv_types.single()?;
        let checkpoints = Checkpoints {
            every: self.checkpoint_every,
            count: self.ctx_checkpoints,
        };
        Ok(self
            .kv
            .new_session_store(model, max_ctx, types, checkpoints)?)
    }

    /// Refuses `--ctx 0` and a list of KV types before anything is loaded.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.ctx == Some(0) {
            bail!("--ctx must be at least 1");
        }
        self.kv_types.single()?;
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
        let template = self.template.context(
            "kvcore chat needs the model's chat template (tokenizer.chat_template) and this \
             model has none (a base model); use `kvcore generate` for plain-text completion",
        )?;
        Ok((self.file, self.tok, template))
    }
}

const NO_TEMPLATE: &str =
    "the model has no chat template (tokenizer.chat_template), which --system needs; use --raw";

pub use kvcore_engine::{chat_ids, peak_rss_bytes, prompt_ids};

/// Loads the weights onto backend `b` computing with `activations`.
pub fn load_model<B: Backend>(
    file: GgufFile,
    b: B,
    activations: Activations,
) -> anyhow::Result<Llama<B>> {
    Ok(Llama::load(file, b)?.with_activations(activations))
}

/// Prints a generation's text as it comes (unless quiet), keeping the first write error.
pub struct Printer {
    print: bool,
    printed: bool,
    error: Option<std::io::Error>,
}

impl Printer {
    /// A printer to stdout when `print`.
    pub fn new(print: bool) -> Self {
        Printer {
            print,
            printed: false,
            error: None,
        }
    }

    /// Prints `piece`.
    pub fn show(&mut self, piece: &str) {
        if !self.print || piece.is_empty() {
            return;
        }
        self.printed = true;
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            self.error.get_or_insert(e);
        }
    }

    /// Ends a printed text with a newline (nothing at all is printed for an empty
    /// text); the first write error, if any.
    pub fn finish(self) -> std::io::Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.printed {
            let mut out = std::io::stdout().lock();
            writeln!(out)?;
            out.flush()?;
        }
        Ok(())
    }
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

impl GenerateArgs {
    /// The prompt text: `-p TEXT`, `-p -` (stdin) or `-f FILE`; from stdin or a file,
    /// one final line break is dropped (as llama.cpp's `-f` does).
    fn prompt_text(&self) -> anyhow::Result<String> {
        let strip = |mut text: String| {
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            text
        };
        match (&self.prompt, &self.file) {
            (Some(p), _) if p == "-" => {
                let mut bytes = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut bytes)
                    .context("cannot read the prompt from stdin")?;
                let text = String::from_utf8(bytes).context("the prompt on stdin is not UTF-8")?;
                Ok(strip(text))
            }
            (Some(p), _) => Ok(p.clone()),
            (None, Some(path)) => {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read the prompt file {}", path.display()))?;
                let text = String::from_utf8(bytes)
                    .with_context(|| format!("the prompt file {} is not UTF-8", path.display()))?;
                Ok(strip(text))
            }
            (None, None) => bail!("no prompt: give -p TEXT, -p - (stdin) or -f FILE"),
        }
    }
}

/// The conversation `reply` starts from: its system message, if any.
pub fn system_messages(reply: &ReplyArgs) -> Vec<ChatMessage> {
    reply
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect()
}

pub fn generate(a: GenerateArgs) -> anyhow::Result<ExitCode> {
    a.store.check()?;
    check_n(a.n)?;
    let sampling = a.sampling.sampling()?;
    let threads = threads(&a.model)?;
    let text = a.prompt_text()?;
    let text_model = TextModel::open(&a.model)?;
    a.sampling.check_vocab(&text_model.tok)?;
    // A base model (Gemma 3 270M) has no chat template: its prompt is plain text, as
    // with --raw. A system prompt needs a template, so that stays an error.
    let raw = a.raw || (text_model.template.is_none() && a.reply.system.is_none());
    if raw && !a.raw && !a.json {
        eprintln!("note: the model has no chat template; the prompt is plain text (as with --raw)");
    }
    let prompt = if raw {
        prompt_ids(&text_model.tok, &text, special_mode(a.parse_special))
    } else {
        let mut messages = system_messages(&a.reply);
        messages.push(ChatMessage::new("user", text));
        chat_ids(&text_model.tok, text_model.template()?, &messages)?
    };
    let job = GenerateJob {
        text_model,
        prompt,
        sampling,
        args: a,
    };
    backends::dispatch(job.args.model.backend, threads, job.args.model.kernels, job)
}

struct GenerateJob {
    text_model: TextModel,
    prompt: Vec<u32>,
    sampling: SamplerParams,
    args: GenerateArgs,
}

impl Job for GenerateJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let GenerateJob {
            text_model: TextModel { file, tok, .. },
            prompt,
            sampling,
            args,
        } = self;
        let model = load_model(file, b, args.compute.activations)?;
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
        let params = generate_params(&sampling, args.n, &args.reply.stop);
        let mut decoder = Decoder::new(&tok, &params, &prompt, max_ctx)?;
        let mut printer = Printer::new(!args.json);
        let result = model::generate(&model, &mut session, &prompt, &mut decoder, |step| {
            printer.show(&step.text);
            true
        });
        let (generation, mut failure) = split_result(result);
        if failure.is_some() {
            printer.show(&decoder.release());
        }
        failure = failure.or_else(|| context_full(&decoder, args.n, max_ctx));
        if let (None, Some(path)) = (&failure, &args.session) {
            session
                .save(&model, path)
                .with_context(|| format!("cannot save session {}", path.display()))?;
        }
        printer.finish()?;
        if args.json {
            let json = serde_json::json!({
                "prompt_tokens": prompt,
                "tokens": generation.tokens,
                "text": decoder.text(),
                "stopped": generation.stopped(),
                "stop": decoder.stop_string(),
                "error": failure.as_ref().map(|e| e.to_string()),
                "stats": stats_json(&generation, session.kv(), model.activations()),
            });
            writeln!(std::io::stdout().lock(), "{json}")?;
        } else {
            print_stats(&generation, session.kv(), model.activations());
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
    let generated = s.generated_tokens > 0;
    serde_json::json!({
        "ttft_ms": generated.then_some(s.ttft.as_secs_f64() * 1e3),
        "prefill_tok_s": s.prefill_tok_s(),
        "decode_tok_s": s.decode_tok_s(),
        "kv_bytes": s.kv_bytes,
        "kv_capacity": s.kv_capacity,
        "kv_dense_bytes": dense_bytes(kv),
        "kv_type": kv_types_name(kv.kv_types()),
        "peak_rss_bytes": peak_rss_bytes(),
        "backend": s.backend,
        "kernels": s.kernels,
        "threads": s.threads,
        "activations": acts.name(),
        "prompt_token_count": s.prompt_tokens,
        "reused_tokens": s.reused_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "generated_token_count": s.generated_tokens,
    })
}

/// What a dense store of the same geometry and element types would hold: `layers ·
/// max_ctx · (K row bytes + V row bytes)`.
fn dense_bytes<K: KvStore + ?Sized>(kv: &K) -> usize {
    let g = kv.geometry();
    let (kt, vt) = kv.kv_types();
    let row = |t: KvType| t.row_bytes(g.kv_dim()).unwrap_or(0);
    g.n_layers * kv.max_ctx() * (row(kt) + row(vt))
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn print_stats<K: KvStore + ?Sized>(g: &Generation, kv: &K, acts: Activations) {
    let s = &g.stats;
    let timing = if s.generated_tokens == 0 {
        format!("prefill {:.1} tok/s", s.prefill_tok_s())
    } else {
        format!(
            "ttft {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s",
            s.ttft.as_secs_f64() * 1e3,
            s.prefill_tok_s(),
            s.decode_tok_s()
        )
    };
    eprintln!(
        "[{} prompt ({} reused, {} prefilled) + {} generated tokens | {timing}]",
        s.prompt_tokens, s.reused_tokens, s.prefilled_tokens, s.generated_tokens,
    );
    eprintln!(
        "[kv {} {:.2} MiB for {} positions resident (dense at ctx {}: {:.2} MiB) | peak RSS {:.1} MiB | backend {} x{} threads ({}), {} activations]",
        kv_types_name(kv.kv_types()),
        mib(s.kv_bytes),
        s.kv_capacity,
        kv.max_ctx(),
        mib(dense_bytes(kv)),
        peak_rss_bytes() as f64 / (1024.0 * 1024.0),
        s.backend,
        s.threads,
        s.kernels,
        acts.name()
    );
}

/// The per-turn stats line of `chat`.
pub fn print_turn_stats(turn: usize, g: &Generation) {
    let s = &g.stats;
    let ttft = if s.generated_tokens == 0 {
        "ttft n/a".to_string()
    } else {
        format!("ttft {:.1} ms", s.ttft.as_secs_f64() * 1e3)
    };
    eprintln!(
        "[turn {turn} | {} positions reused, {} prefilled | {ttft} | decode {:.1} tok/s | kv {:.2} MiB]",
        s.reused_tokens,
        s.prefilled_tokens,
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
        vec![cores()]
    } else {
        let mut t: Vec<usize> = a.threads.iter().map(|&n| clamp_threads(n)).collect();
        t.dedup();
        t
    };
    let plan = crate::bench::Plan {
        prompt_sizes: a.prompt.clone(),
        gen_sizes: a.gen_sizes.clone(),
        depths: a.depth.clone(),
        reps: a.reps,
        kv: a.kv,
        kv_types: a.kv_types.pairs(),
        activations: a.activations.clone(),
        ctx: a.ctx.unwrap_or(usize::MAX),
        sequences: a.sequences.clone(),
    };
    let rows = crate::bench::run(&path, &a.backend, &a.kernels, &threads, &plan)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", crate::bench::markdown(&rows));
    }
    Ok(ExitCode::SUCCESS)
}
