//! `kvcore info`: a GGUF file's header, metadata, tensor table and Llama config.
//!
//! As text, one `key = value` line per metadata entry (strings over 80 characters and
//! arrays over 8 items abbreviated); with `--json`, one object holding everything in
//! full, metadata values as JSON numbers, bools, strings and arrays.

use crate::InfoArgs;
use crate::commands::{model_path, open};
use kvcore::RopeStyle;
use kvcore::gguf::{GgufFile, Value};
use kvcore::model::LlamaConfig;
use serde_json::{Value as Json, json};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

pub fn info(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let path = model_path(&a.model)?;
    let file = open(&path)?;
    let config = LlamaConfig::from_gguf(&file).ok();
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", info_json(&path, &file, config.as_ref()))?;
    } else {
        write_text(&mut out, &path, &file, config.as_ref())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn write_text(
    out: &mut impl Write,
    path: &Path,
    file: &GgufFile,
    config: Option<&LlamaConfig>,
) -> std::io::Result<()> {
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
    if let Some(cfg) = config {
        writeln!(out, "\nconfig:")?;
        for (name, value) in config_fields(cfg) {
            writeln!(out, "  {name} = {value}")?;
        }
    }
    Ok(())
}

/// A metadata value in one line: strings over 80 characters and arrays over 8 items are
/// abbreviated.
fn summarize(v: &Value) -> String {
    match v {
        Value::Str(s) if s.chars().count() > 80 => {
            let head: String = s.chars().take(77).collect();
            format!("{head:?}... ({} chars)", s.chars().count())
        }
        Value::Array(items) if items.len() > 8 => {
            let head: Vec<String> = items.iter().take(4).map(summarize).collect();
            format!("[{}, ...] ({} items)", head.join(", "), items.len())
        }
        Value::Array(items) => {
            let all: Vec<String> = items.iter().map(summarize).collect();
            format!("[{}]", all.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// The `--json` object: `file`, `version`, `alignment`, `metadata` (key to value, in
/// full), `tensors` (`name`, `type`, `dims`, `bytes`) and `config` (null when the file
/// is not a Llama model kvcore can load).
fn info_json(path: &Path, file: &GgufFile, config: Option<&LlamaConfig>) -> Json {
    let metadata: serde_json::Map<String, Json> = file
        .metadata()
        .iter()
        .map(|(key, value)| (key.clone(), value_json(value)))
        .collect();
    let tensors: Vec<Json> = file
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.dtype.name(),
                "dims": t.dims,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    let config = config.map(|cfg| {
        let fields: serde_json::Map<String, Json> = config_fields(cfg)
            .into_iter()
            .map(|(name, value)| (name.to_string(), value_json(&value)))
            .collect();
        Json::Object(fields)
    });
    json!({
        "file": path.display().to_string(),
        "version": file.version(),
        "alignment": file.alignment(),
        "metadata": metadata,
        "tensors": tensors,
        "config": config,
    })
}

/// A metadata value as JSON; a NaN or infinite float (which JSON cannot hold) is null.
fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => f32_json(*x),
        Value::F64(x) => float_json(*x),
        Value::Bool(x) => json!(x),
        Value::Str(s) => json!(s),
        Value::Array(items) => Json::Array(items.iter().map(value_json).collect()),
    }
}

/// An `f32` as the `f64` of its shortest decimal form, so `1e-5` prints as `1e-5`, not
/// as the widened `9.999999747378752e-6`.
fn f32_json(x: f32) -> Json {
    float_json(x.to_string().parse().unwrap_or(f64::from(x)))
}

fn float_json(x: f64) -> Json {
    serde_json::Number::from_f64(x).map_or(Json::Null, Json::Number)
}

/// The parsed config, field by field, as metadata values (so the text and JSON forms
/// print them as they print the metadata).
fn config_fields(c: &LlamaConfig) -> [(&'static str, Value); 12] {
    let count = |n: usize| Value::U64(n as u64);
    let rope_style = match c.rope_style {
        RopeStyle::Interleaved => "interleaved",
        RopeStyle::Halves => "halves",
    };
    [
        ("n_layers", count(c.n_layers)),
        ("d_model", count(c.d_model)),
        ("n_heads", count(c.n_heads)),
        ("n_kv_heads", count(c.n_kv_heads)),
        ("head_dim", count(c.head_dim)),
        ("ffn_dim", count(c.ffn_dim)),
        ("vocab_size", count(c.vocab_size)),
        ("context_len", count(c.context_len)),
        ("rope_base", Value::F32(c.rope_base)),
        ("rope_style", Value::Str(rope_style.to_string())),
        ("rms_eps", Value::F32(c.rms_eps)),
        ("tied_embeddings", Value::Bool(c.tied_embeddings)),
    ]
}
