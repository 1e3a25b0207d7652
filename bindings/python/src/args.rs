//! Python arguments to engine types: the checks a Python caller expects
//! (`InvalidArgumentError` for a value out of range, `TypeError` for a wrong type).

use crate::errors::invalid;
use kvcore_engine::kvcore::model::SamplerParams;
use kvcore_engine::kvcore::tokenizer::ChatMessage;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyString, PyTuple};
use std::collections::HashMap;

/// A count or an index: `value` as a `usize`, refusing a negative one.
pub fn count(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| invalid(format!("{name} must be >= 0, got {value}")))
}

/// One token id.
pub fn token_id(value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| invalid(format!("token id {value} is outside the vocabulary")))
}

/// A sequence of token ids (a list, a tuple, a NumPy array of integers).
pub fn token_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "expected a sequence of token ids (int), not str",
        ));
    }
    let ids: Vec<i64> = obj.extract()?;
    ids.into_iter().map(token_id).collect()
}

/// A prompt: text (`str`) or token ids.
pub enum Prompt {
    /// Plain text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

impl Prompt {
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Prompt> {
        match obj.cast::<PyString>() {
            Ok(s) => Ok(Prompt::Text(s.extract()?)),
            Err(_) => token_ids(obj).map(Prompt::Ids),
        }
    }
}

/// Stop strings: `None`, one `str`, or a sequence of them.
pub fn stop_strings(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    match obj {
        None => Ok(Vec::new()),
        Some(o) if o.is_none() => Ok(Vec::new()),
        Some(o) => match o.cast::<PyString>() {
            Ok(s) => Ok(vec![s.extract()?]),
            Err(_) => o.extract(),
        },
    }
}

/// A conversation: a sequence of `{"role": ..., "content": ...}` mappings or
/// `(role, content)` pairs.
pub fn messages(obj: &Bound<'_, PyAny>) -> PyResult<Vec<ChatMessage>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(
            "messages must be a list of {\"role\": ..., \"content\": ...} dicts or (role, content) tuples",
        ));
    }
    let items: Vec<Bound<'_, PyAny>> = obj.extract()?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

fn message(i: usize, m: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let field = |v: Bound<'_, PyAny>, name: &str| -> PyResult<String> {
        v.extract()
            .map_err(|_| PyTypeError::new_err(format!("message {i}: {name} must be a str")))
    };
    if let Ok(map) = m.cast::<PyMapping>() {
        let get = |name: &str| -> PyResult<String> {
            let v = map
                .get_item(name)
                .map_err(|_| PyValueError::new_err(format!("message {i} has no {name:?} key")))?;
            field(v, name)
        };
        return Ok(ChatMessage::new(get("role")?, get("content")?));
    }
    if let Ok(t) = m.cast::<PyTuple>()
        && t.len() == 2
    {
        return Ok(ChatMessage::new(
            field(t.get_item(0)?, "role")?,
            field(t.get_item(1)?, "content")?,
        ));
    }
    Err(PyTypeError::new_err(format!(
        "message {i} must be a {{\"role\": ..., \"content\": ...}} dict or a (role, content) tuple"
    )))
}

/// The sampling keywords shared by `Sampler(...)`, `Model.generate` and `Model.chat`.
pub struct Sampling {
    pub temperature: f32,
    pub top_k: i64,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i64,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Option<HashMap<i64, f32>>,
    pub seed: i128,
}

impl Sampling {
    /// The engine's parameters (its own checks run when a sampler is made of them).
    pub fn params(self) -> PyResult<SamplerParams> {
        let mut p = SamplerParams::default();
        p.temperature = self.temperature;
        p.top_k = count("top_k", self.top_k)?;
        p.top_p = self.top_p;
        p.min_p = self.min_p;
        p.repeat_penalty = self.repeat_penalty;
        // -1: the whole context, as in llama.cpp and the CLI.
        p.repeat_last_n = match self.repeat_last_n {
            -1 => usize::MAX,
            n => count("repeat_last_n (or -1)", n)?,
        };
        p.presence_penalty = self.presence_penalty;
        p.frequency_penalty = self.frequency_penalty;
        let mut bias = self
            .logit_bias
            .unwrap_or_default()
            .into_iter()
            .map(|(id, b)| Ok((token_id(id)?, b)))
            .collect::<PyResult<Vec<_>>>()?;
        bias.sort_by_key(|&(id, _)| id);
        p.logit_bias = bias;
        p.seed = u64::try_from(self.seed)
            .map_err(|_| invalid(format!("seed must be in [0, 2**64), got {}", self.seed)))?;
        Ok(p)
    }
}
