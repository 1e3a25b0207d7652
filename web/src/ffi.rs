//! The WebAssembly boundary: what `web/worker.js` calls and what it provides.
//!
//! Exports (status codes: [`OK`] or an error, whose message `kv_error_ptr` /
//! `kv_error_len` then give as UTF-8 in the module's memory, valid until the next call):
//! - `kv_alloc(len) -> ptr` / `kv_free(ptr, len)`: a zeroed buffer of `len` bytes for the
//!   caller to write into (null when memory is exhausted), and its release.
//! - `kv_load(ptr, len)`: takes the buffer (a GGUF file) from `kv_alloc`, whatever the
//!   outcome, and makes it the model.
//! - `kv_chat(ptr, len, max_tokens)`: the user's message (UTF-8, borrowed: the caller
//!   frees it), its reply streamed through `on_text` and `on_stats`.
//! - `kv_reset()`: forgets the conversation.
//!
//! Imports (module `env`): `on_text(ptr, len)`, `on_stats(tokens, tok_per_s, kv_bytes,
//! phase)`, `now_ms() -> f64` and `fill_random(ptr, len) -> i32` (0 when
//! `crypto.getRandomValues` filled the buffer). The callbacks must not call back into
//! the module (a nested `kv_chat` gets [`BUSY`]).
//!
//! The module is single-threaded (a Web Worker's instance), so the state is a
//! thread-local.

use crate::{Activations, Chat, Host, Stats};
use std::cell::RefCell;

/// Success.
const OK: i32 = 0;
/// The call failed: `kv_error_ptr` says why.
const ERROR: i32 = 1;
/// `kv_chat` before a model was loaded.
const NO_MODEL: i32 = 2;
/// A call from inside a callback of `kv_chat`.
const BUSY: i32 = 3;

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    /// Shows `len` bytes of UTF-8 at `ptr` (read during the call, not kept).
    fn on_text(ptr: *const u8, len: usize);
    /// A progress report (`phase`: 0 prefill, 1 decode, 2 done).
    safe fn on_stats(tokens: u32, tok_per_s: f64, kv_bytes: f64, phase: u32);
    /// `performance.now()`.
    safe fn now_ms() -> f64;
    /// Fills `len` bytes at `ptr` from `crypto.getRandomValues`; 0 on success.
    fn fill_random(ptr: *mut u8, len: usize) -> i32;
}

thread_local! {
    /// The model and its conversation, once `kv_load` succeeded.
    static CHAT: RefCell<Option<Chat>> = const { RefCell::new(None) };
    /// The last failure's message.
    static ERROR_TEXT: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `message` as the last error and returns `code`.
fn fail(code: i32, message: impl Into<String>) -> i32 {
    let message = message.into();
    // Only a read of the message in progress could hold it: none can be (one thread, and
    // the readers return before anything else runs).
    ERROR_TEXT.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = message;
        }
    });
    code
}

/// The page: the JavaScript imports.
struct Page;

impl Host for Page {
    fn now_ms(&self) -> f64 {
        now_ms()
    }

    fn text(&mut self, piece: &str) {
        // SAFETY: `piece` is a live &str for the duration of the call; `on_text` only
        // reads `len` bytes at `ptr` before it returns and keeps no pointer.
        unsafe { on_text(piece.as_ptr(), piece.len()) }
    }

    fn stats(&mut self, s: Stats) {
        on_stats(s.tokens, s.tok_per_s, s.kv_bytes, s.phase as u32);
    }
}

/// A zeroed buffer of `len` bytes, owned by the caller until `kv_free(ptr, len)` or
/// `kv_load(ptr, len)`; null when there is not enough memory.
#[unsafe(no_mangle)]
pub extern "C" fn kv_alloc(len: usize) -> *mut u8 {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        fail(ERROR, format!("out of memory: cannot allocate {len} bytes"));
        return std::ptr::null_mut();
    }
    v.resize(len, 0u8);
    Box::into_raw(v.into_boxed_slice()).cast::<u8>()
}

/// The buffer `kv_alloc(len)` returned as `ptr`, owned again.
///
/// # Safety
/// `ptr` came from `kv_alloc(len)` with this `len` and has not been freed or loaded.
unsafe fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    let slice = std::ptr::slice_from_raw_parts_mut(ptr, len);
    // SAFETY: the caller guarantees `ptr`/`len` are a `Box<[u8]>` that `kv_alloc` leaked
    // with `Box::into_raw` and nobody has reclaimed, so it is rebuilt exactly once.
    unsafe { Box::from_raw(slice) }.into_vec()
}

/// Frees a buffer of `kv_alloc` (a null `ptr` is ignored).
#[unsafe(no_mangle)]
pub extern "C" fn kv_free(ptr: *mut u8, len: usize) {
    if !ptr.is_null() {
        // SAFETY: the caller passes back a pointer and length `kv_alloc` returned, once
        // (the contract of this export).
        drop(unsafe { take(ptr, len) });
    }
}

/// Loads the GGUF file in the `kv_alloc` buffer `ptr`/`len` (taking it, whether or not
/// it loads), replacing any model loaded before; `acts` 0 runs it with f32 activations,
/// 1 with 8-bit ones.
#[unsafe(no_mangle)]
pub extern "C" fn kv_load(ptr: *mut u8, len: usize, acts: u32) -> i32 {
    if ptr.is_null() {
        return fail(ERROR, "kv_load: null buffer");
    }
    // SAFETY: the caller hands over a buffer `kv_alloc(len)` returned, once (the
    // contract of this export); from here Rust owns it.
    let bytes = unsafe { take(ptr, len) };
    let activations = match acts {
        0 => Activations::F32,
        1 => Activations::Q8,
        other => {
            return fail(
                ERROR,
                format!("kv_load: activations {other}: 0 (f32) or 1 (8-bit)"),
            );
        }
    };
    CHAT.with(|c| {
        let Ok(mut slot) = c.try_borrow_mut() else {
            return fail(BUSY, "kv_load: called while a reply is being generated");
        };
        // Free the previous model before parsing the next: two at once may not fit.
        *slot = None;
        match Chat::load(bytes, activations) {
            Ok(chat) => {
                *slot = Some(chat);
                OK
            }
            Err(e) => fail(ERROR, e),
        }
    })
}

/// Sends the user's message (`len` bytes of UTF-8 at `ptr`, borrowed) and streams the
/// reply of at most `max_tokens` tokens through `on_text` / `on_stats`.
#[unsafe(no_mangle)]
pub extern "C" fn kv_chat(ptr: *const u8, len: usize, max_tokens: u32) -> i32 {
    if ptr.is_null() {
        return fail(ERROR, "kv_chat: null message");
    }
    // SAFETY: the caller passes `len` readable bytes at `ptr` (a `kv_alloc` buffer it
    // wrote the message into) and does not touch them until this call returns.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    let Ok(user) = std::str::from_utf8(bytes) else {
        return fail(ERROR, "kv_chat: the message is not UTF-8");
    };
    CHAT.with(|c| {
        let Ok(mut slot) = c.try_borrow_mut() else {
            return fail(BUSY, "kv_chat: called while a reply is being generated");
        };
        let Some(chat) = slot.as_mut() else {
            return fail(NO_MODEL, "no model is loaded");
        };
        let max_tokens = usize::try_from(max_tokens).unwrap_or(usize::MAX);
        match chat.send(user, max_tokens, &mut Page) {
            Ok(_) => OK,
            Err(e) => fail(ERROR, e),
        }
    })
}

/// Forgets the conversation (the model stays loaded).
#[unsafe(no_mangle)]
pub extern "C" fn kv_reset() -> i32 {
    CHAT.with(|c| match c.try_borrow_mut() {
        Ok(mut slot) => match slot.as_mut().map(Chat::reset) {
            Some(Err(e)) => fail(ERROR, e),
            _ => OK,
        },
        Err(_) => fail(BUSY, "kv_reset: called while a reply is being generated"),
    })
}

/// Bytes the KV cache holds now (0 without a model or during a reply).
#[unsafe(no_mangle)]
pub extern "C" fn kv_kv_bytes() -> f64 {
    CHAT.with(|c| match c.try_borrow() {
        Ok(slot) => slot.as_ref().map_or(0.0, |chat| chat.kv_bytes() as f64),
        Err(_) => 0.0,
    })
}

/// The last error's message: its address (read `kv_error_len()` bytes there).
#[unsafe(no_mangle)]
pub extern "C" fn kv_error_ptr() -> *const u8 {
    ERROR_TEXT.with(|e| e.try_borrow().map_or(std::ptr::null(), |e| e.as_ptr()))
}

/// The last error's message: its length in bytes.
#[unsafe(no_mangle)]
pub extern "C" fn kv_error_len() -> usize {
    ERROR_TEXT.with(|e| e.try_borrow().map_or(0, |e| e.len()))
}

/// getrandom's "custom" backend (`--cfg getrandom_backend="custom"`): the page's
/// `crypto.getRandomValues`. The engine asks for random bytes only for a KV pool's
/// prefix-cache key, which the page never makes, but the symbol must exist to link.
///
/// # Safety
/// getrandom passes `len` writable (possibly uninitialised) bytes at `dest`.
#[unsafe(no_mangle)]
unsafe extern "Rust" fn __getrandom_v03_custom(
    dest: *mut u8,
    len: usize,
) -> Result<(), getrandom::Error> {
    // SAFETY: `dest`/`len` are writable as getrandom guarantees; `fill_random` writes
    // only within them (crypto.getRandomValues on a view of exactly that range).
    match unsafe { fill_random(dest, len) } {
        0 => Ok(()),
        _ => Err(getrandom::Error::UNSUPPORTED),
    }
}
