//! `kvcore serve`: the OpenAI-compatible server (`kvcore-server`) on a loaded engine.

use crate::ServeArgs;
use crate::commands::model_path;
use anyhow::Context;
use kvcore_engine::{Engine, Options};
use kvcore_server::tier::{TierConfig, TierLocation};
use kvcore_server::{Access, HttpLimits, ServeConfig, Server};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Bytes from `256M`, `1G`, `65536`, `512K` (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                _ => {
                    return Err(format!(
                        "{s:?}: a size is bytes, or a number with K, M or G"
                    ));
                }
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?}: a size is bytes, or a number with K, M or G"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?}: too large"))
}

pub fn serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let threads = crate::commands::threads(&a.model)?;
    let path = model_path(&a.model.model)?;
    let options = Options {
        backend: a.model.backend,
        kernels: crate::backends::kernels(a.model.backend, a.model.kernels)?,
        threads: Some(threads),
        activations: a.activations,
        kv_types: a.kv_types.single()?,
        ..Options::default()
    };
    let engine = Engine::load(&path, options).map_err(|e| anyhow::anyhow!(e.message()))?;
    let model_id = a.model_id.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or("kvcore".into(), |s| s.to_string_lossy().into_owned())
    });
    let config = ServeConfig {
        parallel: a.parallel,
        queue: a.queue,
        kv_budget: a.kv_budget,
        block_len: a.block_len,
        ctx: a.ctx,
        prefill_chunk: a.prefill_chunk,
        batch_tokens: a.batch_tokens,
        shutdown_timeout: seconds("--shutdown-timeout", a.shutdown_timeout)?,
        model_id,
        http: HttpLimits {
            headers: seconds("--timeout-headers", a.timeout_headers)?,
            body: seconds("--timeout-body", a.timeout_body)?,
            ..HttpLimits::default()
        },
        access: Access {
            api_keys: api_keys(&a.api_key, a.api_key_file.as_deref())?,
            metrics_key: a.metrics_key.clone(),
            cors_origins: a.cors_origin.clone(),
        },
        kv_tier: a.kv_tier.as_deref().map(|t| TierConfig {
            location: TierLocation::parse(t),
            budget: a.kv_tier_budget as u64,
            secret_file: a.kv_tier_secret_file.clone(),
        }),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let engine = Arc::new(engine);
        let server = Server::new(engine.clone(), &config)?;
        let l = server.limits();
        eprintln!(
            "kvcore serve: the KV budget of {} bytes holds {} sequences of the whole context ({} positions) at once",
            l.kv_budget,
            l.full_sequences(),
            l.ctx
        );
        eprintln!(
            "kvcore serve: {} on {} ({} threads, {}), listening on http://{local}",
            engine.path().display(),
            engine.backend_name(),
            engine.threads(),
            engine.kernel_path()
        );
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
            eprintln!("kvcore serve: shutting down");
        };
        server.run(listener, shutdown).await?;
        eprintln!("kvcore serve: stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The keys of `--api-key` and those of `--api-key-file` (one per line, blank lines
/// ignored); an empty key or a file without any is refused.
fn api_keys(given: &[String], file: Option<&std::path::Path>) -> anyhow::Result<Vec<String>> {
    let mut keys = given.to_vec();
    if keys.iter().any(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key: an empty key");
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--api-key-file {}", path.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
        if keys.len() == before {
            anyhow::bail!("--api-key-file {}: no key in it", path.display());
        }
    }
    Ok(keys)
}

/// A duration from seconds, refused when negative, not finite or too large.
fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag} {s}: a number of seconds, 0 or more"))
}
