//! The counters behind `GET /metrics`, in the Prometheus text format (version 0.0.4).

use kvcore_engine::kvcore::kv::KvPool;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters and gauges the HTTP side and the scheduler update.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests accepted into the queue.
    pub requests: AtomicU64,
    /// Requests answered 503 (queue full or shutting down).
    pub rejected: AtomicU64,
    /// Requests answered 400.
    pub bad: AtomicU64,
    /// Requests that ran to a stop or their length.
    pub completed: AtomicU64,
    /// Requests whose client went away before the end.
    pub cancelled: AtomicU64,
    /// Requests that ended with an error (shutdown deadline, KV pool exhausted).
    pub failed: AtomicU64,
    /// Times a running request gave its blocks back and went back to the queue (the
    /// request is counted once in the others).
    pub requeued: AtomicU64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Of those, tokens served from the prefix cache.
    pub cached_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Forward passes run.
    pub steps: AtomicU64,
    /// Tokens those passes ran (prefill and decode).
    pub step_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Sequences in the running batch.
    pub running: AtomicU64,
    /// Error responses by status, in the order of [`ERROR_STATUSES`].
    pub errors: [AtomicU64; ERROR_STATUSES.len()],
}

/// The statuses the server answers a request with when it does not serve it: a bad
/// body (400), no API key (401), no such route (404) or method (405), a body too slow (408) or too large
/// (413), not JSON (415), header fields too large (431), an internal error (500), busy,
/// draining or out of KV blocks (503).
pub const ERROR_STATUSES: [u16; 10] = [400, 401, 404, 405, 408, 413, 415, 431, 500, 503];

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a response by its status if it is one of [`ERROR_STATUSES`].
    pub fn count_status(&self, status: u16) {
        if let Some(i) = ERROR_STATUSES.iter().position(|&s| s == status) {
            Self::add(&self.errors[i], 1);
        }
    }

    /// The text `/metrics` serves.
    pub fn render(&self, pool: &KvPool) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = pool.stats();
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        let counters: [(&str, &str, &AtomicU64); 12] = [
            (
                "kvcore_requests_total",
                "Requests accepted.",
                &self.requests,
            ),
            (
                "kvcore_requests_rejected_total",
                "Requests answered 503 (queue full, shutting down).",
                &self.rejected,
            ),
            (
                "kvcore_requests_invalid_total",
                "Requests answered 400.",
                &self.bad,
            ),
            (
                "kvcore_requests_completed_total",
                "Requests that ran to a stop or their length.",
                &self.completed,
            ),
            (
                "kvcore_requests_cancelled_total",
                "Requests whose client disconnected first.",
                &self.cancelled,
            ),
            (
                "kvcore_requests_failed_total",
                "Requests that ended with an error.",
                &self.failed,
            ),
            (
                "kvcore_requests_requeued_total",
                "Times a running request went back to the queue for KV blocks.",
                &self.requeued,
            ),
            (
                "kvcore_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "kvcore_prompt_tokens_cached_total",
                "Prompt tokens served from the prefix cache.",
                &self.cached_tokens,
            ),
            (
                "kvcore_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "kvcore_steps_total",
                "Batched forward passes run.",
                &self.steps,
            ),
            (
                "kvcore_step_tokens_total",
                "Tokens those passes ran.",
                &self.step_tokens,
            ),
        ];
        for (name, help, c) in counters {
            one(name, "counter", help, get(c).to_string());
        }
        one(
            "kvcore_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            get(&self.queue_depth).to_string(),
        );
        one(
            "kvcore_running_sequences",
            "gauge",
            "Sequences in the running batch.",
            get(&self.running).to_string(),
        );
        one(
            "kvcore_kv_pool_blocks",
            "gauge",
            "KV blocks alive (in a sequence or the prefix cache).",
            s.blocks.to_string(),
        );
        one(
            "kvcore_kv_pool_blocks_cached",
            "gauge",
            "KV blocks in the prefix cache.",
            s.cached.to_string(),
        );
        one(
            "kvcore_kv_pool_blocks_cached_idle",
            "gauge",
            "Cached KV blocks no sequence holds (evictable).",
            s.cached_idle.to_string(),
        );
        one(
            "kvcore_kv_pool_blocks_in_use",
            "gauge",
            "KV blocks held by running sequences.",
            (s.blocks - s.cached_idle).to_string(),
        );
        one(
            "kvcore_kv_pool_bytes",
            "gauge",
            "Bytes of the KV blocks alive.",
            s.bytes.to_string(),
        );
        one(
            "kvcore_kv_pool_budget_bytes",
            "gauge",
            "The KV pool's byte budget.",
            s.budget.to_string(),
        );
        // The inference gateways' endpoint pickers read the KV cache's use as a
        // fraction of its blocks, vLLM's way: blocks held by running sequences, the
        // prefix cache's idle blocks counting as free (docs/scale-out.md).
        let total = (s.budget / s.block_bytes.max(1)).max(1);
        let usage = (s.blocks - s.cached_idle) as f64 / total as f64;
        one(
            "kvcore_kv_cache_usage_ratio",
            "gauge",
            "KV blocks held by running sequences over the blocks the budget holds (0-1).",
            format!("{usage:.6}"),
        );
        one(
            "kvcore_kv_pool_evicted_total",
            "counter",
            "Cached KV blocks evicted.",
            s.evicted.to_string(),
        );
        one(
            "kvcore_prefix_cache_lookups_total",
            "counter",
            "Prefix cache lookups.",
            s.lookups.to_string(),
        );
        one(
            "kvcore_prefix_cache_blocks_queried_total",
            "counter",
            "Full prompt blocks looked up.",
            s.blocks_queried.to_string(),
        );
        one(
            "kvcore_prefix_cache_blocks_hit_total",
            "counter",
            "Of those, blocks found.",
            s.blocks_hit.to_string(),
        );
        one(
            "kvcore_prefix_cache_hit_rate",
            "gauge",
            "blocks_hit / blocks_queried.",
            format!("{:.6}", s.hit_rate()),
        );
        if let Some(t) = s.tier {
            let tier = [
                (
                    "kvcore_kv_tier_hits_total",
                    "counter",
                    "Blocks past the RAM prefix cache found in the KV tier.",
                    s.tier_hits,
                ),
                (
                    "kvcore_kv_tier_misses_total",
                    "counter",
                    "Lookups that went on past the RAM cache and found nothing more in the KV tier.",
                    s.tier_misses,
                ),
                (
                    "kvcore_kv_tier_rejected_total",
                    "counter",
                    "Tier records skipped and removed (truncated, corrupt or under another key).",
                    s.tier_rejected,
                ),
                (
                    "kvcore_kv_tier_read_bytes_total",
                    "counter",
                    "Bytes read from the KV tier.",
                    t.bytes_read,
                ),
                (
                    "kvcore_kv_tier_written_bytes_total",
                    "counter",
                    "Bytes written to the KV tier.",
                    t.bytes_written,
                ),
                (
                    "kvcore_kv_tier_evicted_total",
                    "counter",
                    "Tier records removed to keep to its budget.",
                    t.evicted,
                ),
                (
                    "kvcore_kv_tier_dropped_total",
                    "counter",
                    "Blocks not written because the tier's write queue was full.",
                    t.dropped,
                ),
                (
                    "kvcore_kv_tier_errors_total",
                    "counter",
                    "Tier reads or writes that failed.",
                    t.errors,
                ),
                (
                    "kvcore_kv_tier_records",
                    "gauge",
                    "Records in the KV tier (as this process knows; a directory tier).",
                    t.records,
                ),
                (
                    "kvcore_kv_tier_bytes",
                    "gauge",
                    "Bytes of those records.",
                    t.bytes,
                ),
            ];
            for (name, kind, help, v) in tier {
                one(name, kind, help, v.to_string());
            }
        }
        let name = "kvcore_cache_config_info";
        let _ = writeln!(
            out,
            "# HELP {name} The KV cache's configuration in its labels (vLLM's label names)."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(
            out,
            "{name}{{block_size=\"{}\",num_gpu_blocks=\"{total}\",block_bytes=\"{}\"}} 1",
            pool.block_len(),
            s.block_bytes
        );
        let name = "kvcore_http_error_responses_total";
        let _ = writeln!(
            out,
            "# HELP {name} Responses by error status (400 bad body, 401 no API key, 404, 405, \
             408 body too slow, 413, 415, 431, 500, 503 busy or draining or out of KV blocks)."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (status, c) in ERROR_STATUSES.iter().zip(&self.errors) {
            let _ = writeln!(out, "{name}{{status=\"{status}\"}} {}", get(c));
        }
        out
    }
}
