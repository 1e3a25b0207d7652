//! The C ABI driven as a C program would drive it, through the exported functions, on
//! the real SmolLM2: the golden greedy continuation through prefill/sample/decode,
//! generation with a callback, fork, truncate, session files (a corrupt one refused
//! with the session untouched), the buffer protocol, re-entrancy (`KVCORE_ERR_BUSY`)
//! and the errors a caller meets.

use kvcore_c::*;
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;
use std::ptr;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(kvcore_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn ok(status: kvcore_status) {
    assert_eq!(status, kvcore_status::KVCORE_OK, "{}", last_error());
}

/// The model on `backend` (a new handle; freed by the caller).
fn load(backend: &CStr) -> *mut kvcore_model {
    let path = CString::new(kvcore_fetch::smollm2_path().unwrap().to_str().unwrap()).unwrap();
    let mut params = kvcore_model_default_params();
    params.backend = backend.as_ptr();
    let mut model = ptr::null_mut();
    // SAFETY: valid strings, params and out pointer.
    ok(unsafe { kvcore_model_load(path.as_ptr(), &params, &mut model) });
    assert!(!model.is_null());
    model
}

fn session(model: *const kvcore_model, max_ctx: u32) -> *mut kvcore_session {
    let mut s = ptr::null_mut();
    // SAFETY: a live model and a valid out pointer.
    ok(unsafe { kvcore_session_new(model, max_ctx, &mut s) });
    s
}

fn logits(s: *const kvcore_session) -> Vec<f32> {
    let mut n = 0;
    // SAFETY: a live session; the pointer is read before the session changes.
    unsafe {
        let p = kvcore_session_logits(s, &mut n);
        assert!(!p.is_null(), "the session has logits");
        std::slice::from_raw_parts(p, n).to_vec()
    }
}

fn reference() -> Vec<serde_json::Value> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/smollm2-135m-instruct-q4_1/logits.json"
    ));
    assert!(p.exists(), "reference data {} is missing", p.display());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn golden_greedy_continuation_through_prefill_sample_decode() {
    let model = load(c"simd");
    // SAFETY: a live model; the string lives as long as it.
    let kernels = unsafe { CStr::from_ptr(kvcore_model_kernels(model)) };
    assert!(kernels.to_bytes().starts_with(b"simd/"), "{kernels:?}");
    let mut sp = kvcore_sampler_default_params();
    sp.temperature = 0.0;
    let mut sampler = ptr::null_mut();
    // SAFETY: valid params and out pointer.
    ok(unsafe { kvcore_sampler_new(&sp, &mut sampler) });
    for prompt in reference() {
        let prompt_ids = ids(&prompt["prompt_ids"]);
        let greedy = ids(&prompt["greedy_ids"]);
        let s = session(model, 0);
        let mut info = kvcore_prefill_info::default();
        // SAFETY: live handles, a valid id array.
        ok(unsafe { kvcore_session_prefill(s, prompt_ids.as_ptr(), prompt_ids.len(), &mut info) });
        assert_eq!(info.prefilled as usize, prompt_ids.len());
        let mut got = Vec::new();
        for _ in 0..greedy.len() {
            let mut id = 0;
            // SAFETY: live handles.
            ok(unsafe { kvcore_session_sample(s, sampler, &mut id) });
            got.push(id);
            if id == 2 {
                break;
            }
            // SAFETY: a live session.
            ok(unsafe { kvcore_session_decode(s, id) });
        }
        assert_eq!(got, greedy, "{}", prompt["name"]);
        // SAFETY: freed once.
        unsafe { kvcore_session_free(s) };
    }
    // SAFETY: freed once.
    unsafe {
        kvcore_sampler_free(sampler);
        kvcore_model_free(model);
    }
}

/// Collects the streamed text; `limit` pieces, then asks to stop.
struct Collect {
    text: String,
    pieces: usize,
    limit: usize,
    session: *const kvcore_session,
    reentry: Option<kvcore_status>,
}

unsafe extern "C" fn collect(piece: *const c_char, len: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the &mut Collect the test passed; `piece` has `len` bytes + NUL.
    let c = unsafe { &mut *(user as *mut Collect) };
    let bytes = unsafe { std::slice::from_raw_parts(piece.cast::<u8>(), len) };
    // SAFETY: NUL-terminated.
    assert_eq!(unsafe { *piece.add(len) }, 0);
    c.text.push_str(std::str::from_utf8(bytes).unwrap());
    c.pieces += 1;
    if c.reentry.is_none() && !c.session.is_null() {
        // A callback touching its own session gets BUSY, not undefined behaviour.
        // SAFETY: a live session.
        c.reentry = Some(unsafe { kvcore_session_decode(c.session, 1) });
    }
    c.pieces < c.limit
}

fn generate(
    s: *const kvcore_session,
    prompt: &[u32],
    max_tokens: i32,
    c: &mut Collect,
) -> (kvcore_status, kvcore_gen_stats) {
    let mut gp = kvcore_generate_default_params();
    gp.max_tokens = max_tokens;
    // SAFETY: zeroed is a valid (all-integer/float, finish 0) stats value.
    let mut stats: kvcore_gen_stats = unsafe { std::mem::zeroed() };
    // SAFETY: live handles; the callback and its data outlive the call.
    let status = unsafe {
        kvcore_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            &gp,
            Some(collect),
            (c as *mut Collect).cast(),
            &mut stats,
        )
    };
    (status, stats)
}

#[test]
fn generation_streams_the_reference_text_and_sessions_fork_truncate_save_and_load() {
    let model = load(c"rayon");
    let first = &reference()[0];
    let prompt = ids(&first["prompt_ids"]);
    let greedy = ids(&first["greedy_ids"]);
    let s = session(model, 0);
    let mut c = Collect {
        text: String::new(),
        pieces: 0,
        limit: usize::MAX,
        session: s,
        reentry: None,
    };
    let (status, stats) = generate(s, &prompt, greedy.len() as i32, &mut c);
    ok(status);
    assert_eq!(c.reentry, Some(kvcore_status::KVCORE_ERR_BUSY));
    assert_eq!(stats.generated_tokens as usize, greedy.len());
    assert_eq!(
        stats.finish_reason,
        kvcore_finish_reason::KVCORE_FINISH_LENGTH
    );
    // The reference's text, decoded by the same ABI: first into 4 bytes, too small on
    // purpose, then with the room it asked for.
    let detokenize = |buf: &mut [c_char], len: &mut usize| {
        // SAFETY: a live model, `greedy.len()` ids and a buffer of `buf.len()` bytes.
        unsafe {
            kvcore_detokenize(
                model,
                greedy.as_ptr(),
                greedy.len(),
                buf.as_mut_ptr(),
                buf.len(),
                len,
            )
        }
    };
    let (mut buf, mut len) = (vec![0 as c_char; 4], 0);
    let status = detokenize(&mut buf, &mut len);
    assert_eq!(status, kvcore_status::KVCORE_ERR_BUFFER_TOO_SMALL);
    buf = vec![0; len + 1];
    ok(detokenize(&mut buf, &mut len));
    // SAFETY: NUL-terminated by kvcore_detokenize.
    let reference_text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(c.text, reference_text);
    assert_eq!(first["greedy_text"].as_str().unwrap(), reference_text);

    // The session holds the prompt and all generated tokens but the last.
    let held = prompt.len() + greedy.len() - 1;
    // SAFETY: a live session.
    assert_eq!(unsafe { kvcore_session_len(s) }, held);
    let mut tokens = vec![0u32; held];
    let mut n = 0;
    // SAFETY: a live session and a buffer of `held` ids.
    ok(unsafe { kvcore_session_tokens(s, tokens.as_mut_ptr(), held, &mut n) });
    assert_eq!(n, held);
    assert_eq!(&tokens[..prompt.len()], &prompt[..]);
    assert_eq!(&tokens[prompt.len()..], &greedy[..greedy.len() - 1]);

    // Fork, then decode the last token in both: bitwise equal logits.
    let mut f = ptr::null_mut();
    // SAFETY: live session, valid out.
    ok(unsafe { kvcore_session_fork(s, &mut f) });
    let last = *greedy.last().unwrap();
    // SAFETY: live sessions.
    unsafe {
        ok(kvcore_session_decode(s, last));
        ok(kvcore_session_decode(f, last));
    }
    let want = logits(s);
    assert_eq!(logits(f), want);

    // Save, load, and the loaded session continues bit for bit.
    let dir = std::env::temp_dir().join(format!("kvcore-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = CString::new(dir.join("s.kvs").to_str().unwrap()).unwrap();
    // SAFETY: live session, valid path.
    ok(unsafe { kvcore_session_save(s, file.as_ptr()) });
    let mut loaded = ptr::null_mut();
    // SAFETY: live model, valid path and out.
    ok(unsafe { kvcore_session_load(model, file.as_ptr(), 0, &mut loaded) });
    // SAFETY: live sessions.
    unsafe {
        assert_eq!(kvcore_session_len(loaded), held + 1);
        ok(kvcore_session_decode(s, 13));
        ok(kvcore_session_decode(loaded, 13));
    }
    assert_eq!(logits(loaded), logits(s));

    // A corrupted file is refused and leaves no session behind.
    let bytes = std::fs::read(dir.join("s.kvs")).unwrap();
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    let bad_path = CString::new(dir.join("bad.kvs").to_str().unwrap()).unwrap();
    std::fs::write(dir.join("bad.kvs"), &bad).unwrap();
    let mut none = ptr::null_mut();
    // SAFETY: live model, valid path and out.
    let status = unsafe { kvcore_session_load(model, bad_path.as_ptr(), 0, &mut none) };
    assert_eq!(
        status,
        kvcore_status::KVCORE_ERR_SESSION_FILE,
        "{}",
        last_error()
    );
    assert!(none.is_null(), "no output on failure");
    std::fs::write(dir.join("short.kvs"), &bytes[..bytes.len() - 7]).unwrap();
    let short = CString::new(dir.join("short.kvs").to_str().unwrap()).unwrap();
    // SAFETY: as above.
    let status = unsafe { kvcore_session_load(model, short.as_ptr(), 0, &mut none) };
    assert_eq!(
        status,
        kvcore_status::KVCORE_ERR_SESSION_FILE,
        "{}",
        last_error()
    );

    // Truncate back to the prompt: the logits are gone, the ids are the prompt.
    // SAFETY: a live session.
    unsafe {
        ok(kvcore_session_truncate(s, prompt.len()));
        assert_eq!(kvcore_session_len(s), prompt.len());
        assert!(kvcore_session_logits(s, ptr::null_mut()).is_null());
    }

    // A callback that stops after 3 pieces cancels the generation there.
    let mut c3 = Collect {
        text: String::new(),
        pieces: 0,
        limit: 3,
        session: ptr::null(),
        reentry: None,
    };
    let (status, stats) = generate(f, &prompt, 20, &mut c3);
    ok(status);
    assert_eq!(c3.pieces, 3);
    assert_eq!(
        stats.finish_reason,
        kvcore_finish_reason::KVCORE_FINISH_CANCELLED
    );

    std::fs::remove_dir_all(&dir).ok();
    // SAFETY: each freed once; the model first (sessions keep it alive).
    unsafe {
        kvcore_model_free(model);
        kvcore_session_free(loaded);
        kvcore_session_free(f);
        kvcore_session_free(s);
    }
}

#[test]
fn errors_name_the_problem_and_leave_the_session_unchanged() {
    let model = load(c"simd");
    let s = session(model, 8);
    let ten: Vec<u32> = (100..110).collect();
    // SAFETY: live handles, valid arrays.
    unsafe {
        let status = kvcore_session_prefill(s, ten.as_ptr(), ten.len(), ptr::null_mut());
        assert_eq!(status, kvcore_status::KVCORE_ERR_CONTEXT_OVERFLOW);
        assert!(last_error().contains("10 tokens"), "{}", last_error());
        assert_eq!(kvcore_session_len(s), 0);

        ok(kvcore_session_prefill(s, ten.as_ptr(), 8, ptr::null_mut()));
        let status = kvcore_session_decode(s, 7);
        assert_eq!(
            status,
            kvcore_status::KVCORE_ERR_CONTEXT_OVERFLOW,
            "{}",
            last_error()
        );
        assert_eq!(kvcore_session_len(s), 8);

        let big = [1_000_000u32];
        ok(kvcore_session_truncate(s, 4));
        let status = kvcore_session_decode(s, big[0]);
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("1000000"), "{}", last_error());
        assert_eq!(kvcore_session_len(s), 4);

        let status = kvcore_session_prefill(s, ptr::null(), 0, ptr::null_mut());
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        let status = kvcore_session_prefill(s, ptr::null(), 3, ptr::null_mut());
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("ids is NULL"), "{}", last_error());

        // A sampler with a bad parameter is refused by name.
        let mut sp = kvcore_sampler_default_params();
        sp.top_p = 1.5;
        let mut sampler = ptr::null_mut();
        let status = kvcore_sampler_new(&sp, &mut sampler);
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("top-p"), "{}", last_error());
        assert!(sampler.is_null());

        // Sampling needs logits: a fresh session has none.
        let fresh = session(model, 0);
        let mut ok_sampler = ptr::null_mut();
        let sp = kvcore_sampler_default_params();
        ok(kvcore_sampler_new(&sp, &mut ok_sampler));
        let mut id = 12345;
        let status = kvcore_session_sample(fresh, ok_sampler, &mut id);
        assert_eq!(status, kvcore_status::KVCORE_ERR_INVALID_ARGUMENT);
        assert_eq!(id, 12345, "no output on failure");

        // The embedding: d_model floats of unit length.
        let d = kvcore_model_embedding_size(model);
        assert_eq!(d, 576);
        let mut e = vec![0f32; d];
        let mut n = 0;
        ok(kvcore_embed(
            model,
            c"Hello".as_ptr(),
            e.as_mut_ptr(),
            d,
            &mut n,
        ));
        assert_eq!(n, d);
        let norm: f32 = e.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");

        // User text is data: "<|im_start|>" typed by a user is not a control token.
        let mut toks = vec![0u32; 64];
        ok(kvcore_tokenize(
            model,
            c"<|im_start|>".as_ptr(),
            false,
            false,
            toks.as_mut_ptr(),
            64,
            &mut n,
        ));
        assert!(n > 1, "literal text, several tokens");
        ok(kvcore_tokenize(
            model,
            c"<|im_start|>".as_ptr(),
            false,
            true,
            toks.as_mut_ptr(),
            64,
            &mut n,
        ));
        assert_eq!(n, 1, "parsed: one control token");

        kvcore_sampler_free(ok_sampler);
        kvcore_session_free(fresh);
        kvcore_session_free(s);
        kvcore_model_free(model);
    }
}

/// A pointer that crosses threads in this test (the header says a `const kvcore_model *`
/// may be shared, and a session used from any thread one call at a time).
struct Shared<T>(*const T);
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}
// SAFETY: the C API's thread-safety contract, which this test checks.
unsafe impl<T> Send for Shared<T> {}

#[test]
fn one_model_serves_threads_and_a_busy_session_is_refused() {
    let model = load(c"simd");
    let prompt = ids(&reference()[1]["prompt_ids"]);
    let greedy = ids(&reference()[1]["greedy_ids"]);
    let m = Shared(model.cast_const());
    // Two threads, one model, a session each: both reproduce the reference.
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (prompt, n) = (prompt.clone(), greedy.len());
            std::thread::spawn(move || {
                let m = m;
                let s = session(m.0, 0);
                let mut c = Collect {
                    text: String::new(),
                    pieces: 0,
                    limit: usize::MAX,
                    session: ptr::null(),
                    reentry: None,
                };
                let (status, stats) = generate(s, &prompt, n as i32, &mut c);
                let mut held = vec![0u32; prompt.len() + n];
                let mut len = 0;
                // SAFETY: a live session and a buffer of its capacity.
                unsafe {
                    ok(kvcore_session_tokens(
                        s,
                        held.as_mut_ptr(),
                        held.len(),
                        &mut len,
                    ));
                    kvcore_session_free(s);
                }
                (
                    status,
                    stats.generated_tokens,
                    held[prompt.len()..len].to_vec(),
                )
            })
        })
        .collect();
    for h in handles {
        let (status, generated, tail) = h.join().unwrap();
        ok(status);
        let n = generated as usize;
        assert_eq!(
            &tail[..],
            &greedy[..n - 1],
            "the generated ids are the reference's"
        );
    }

    // A session generating on one thread refuses a call from another: BUSY, not UB.
    let s = session(model, 0);
    let sh = Shared(s.cast_const());
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    struct Signal {
        tx: std::sync::mpsc::Sender<()>,
        wait: std::sync::mpsc::Receiver<()>,
    }
    unsafe extern "C" fn hold(_: *const c_char, _: usize, user: *mut c_void) -> bool {
        // SAFETY: `user` is the test's Signal.
        let sig = unsafe { &*(user as *const Signal) };
        sig.tx.send(()).ok();
        sig.wait.recv().ok(); // wait until the other thread has tried
        false
    }
    let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
    let sig = Signal { tx, wait: back_rx };
    let p = prompt.clone();
    let worker = std::thread::spawn(move || {
        let sh = sh;
        let sig = sig;
        let gp = kvcore_generate_default_params();
        // SAFETY: a live session; the callback's data outlives the call.
        unsafe {
            kvcore_session_generate(
                sh.0,
                p.as_ptr(),
                p.len(),
                &gp,
                Some(hold),
                (&sig as *const Signal).cast_mut().cast(),
                ptr::null_mut(),
            )
        }
    });
    rx.recv().unwrap(); // the generation is inside its callback
    // SAFETY: a live session, in use by the worker.
    let status = unsafe { kvcore_session_decode(s, 5) };
    assert_eq!(status, kvcore_status::KVCORE_ERR_BUSY);
    assert!(last_error().contains("in use"), "{}", last_error());
    back_tx.send(()).unwrap();
    ok(worker.join().unwrap());
    // Free again afterwards: usable.
    // SAFETY: a live session.
    unsafe {
        ok(kvcore_session_decode(s, 5));
        kvcore_session_free(s);
        kvcore_model_free(model);
    }
}
