//! `kvcore perplexity`: llama-perplexity's measurement, and the KL divergence of one run
//! against another (how far a setting moves the model from a base run).
//!
//! The text is tokenized as literal text (no BOS) and cut into chunks of `-c` tokens;
//! each chunk runs from an empty cache in one pass (its first token replaced by BOS when
//! the model asks for one, as llama-perplexity does), and the second half of it is
//! scored: the logits at positions `c/2 … c−2` predict the tokens at `c/2+1 … c−1`.
//!
//! `--save-logits FILE` writes every scored position's log-probabilities; `--kl-base
//! FILE` reads them back in a later run (another KV type, `--activations q8`, another
//! backend) and reports the mean and 99th-percentile KL divergence and the top-1
//! agreement. The file:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `KVCORELP` |
//! | 4 | version, 1 (u32 LE, as every integer here) |
//! | 4 | vocabulary size V |
//! | 4 | chunk size c |
//! | 8 | number of token ids N, then N × 4 bytes of ids |
//! | 8 | number of rows R, then R × V × 2 bytes: f16 log-probabilities, row by row |
//! | 32 | SHA-256 of everything before |
//!
//! A base file that does not match the run (another text, vocabulary or chunk size), is
//! truncated or fails its checksum is an error that names the problem.

use crate::PerplexityArgs;
use crate::backends::{self, Job};
use crate::commands::{TextModel, load_model, threads};
use anyhow::{Context, bail};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use kvcore::Backend;
use kvcore::model::perplexity::{Divergence, Perplexity, log_softmax, score_stream};
use kvcore::model::{Llama, Logits};
use kvcore::tokenizer::Special;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::process::ExitCode;

const MAGIC: &[u8; 8] = b"KVCORELP";
const VERSION: u32 = 1;

pub fn perplexity(a: PerplexityArgs) -> anyhow::Result<ExitCode> {
    if a.ctx < 2 {
        bail!("-c must be at least 2 tokens (each chunk scores its second half)");
    }
    if a.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let threads = threads(&a.model)?;
    let bytes =
        std::fs::read(&a.file).with_context(|| format!("cannot read {}", a.file.display()))?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{} is not UTF-8 text", a.file.display()))?;
    let text_model = TextModel::open(&a.model)?;
    let trained = kvcore::model::LlamaConfig::from_gguf(&text_model.file)?.context_len;
    if a.ctx > trained {
        bail!(
            "-c {} exceeds the model's trained context of {trained} positions",
            a.ctx
        );
    }
    let ids = text_model.tok.encode(&text, Special::Literal);
    if a.stream {
        return stream(a, text_model, ids, threads);
    }
    let available = ids.len() / a.ctx;
    if available == 0 {
        bail!(
            "{} is {} tokens, fewer than one chunk of {} (-c)",
            a.file.display(),
            ids.len(),
            a.ctx
        );
    }
    let chunks = a.chunks.map_or(available, |n| n.min(available));
    let ids = ids[..chunks * a.ctx].to_vec();
    let job = PerplexityJob {
        text_model,
        ids,
        chunks,
        args: a,
    };
    backends::dispatch(job.args.model.backend, threads, job.args.model.kernels, job)
}

/// `--stream`: every token after the first scored once through a sink store of at most
/// `-c` positions (`--keep` sinks and a window), in passes of up to `-c / 2` tokens.
fn stream(
    args: PerplexityArgs,
    text_model: TextModel,
    mut ids: Vec<u32>,
    threads: usize,
) -> anyhow::Result<ExitCode> {
    if ids.len() < 2 {
        bail!(
            "{} is {} tokens; scoring needs at least 2",
            args.file.display(),
            ids.len()
        );
    }
    if args.ctx <= args.keep {
        bail!(
            "-c {} leaves no window beside --keep {} sinks",
            args.ctx,
            args.keep
        );
    }
    if let (true, Some(bos)) = (text_model.tok.add_bos(), text_model.tok.bos_id()) {
        ids[0] = bos;
    }
    let job = StreamJob {
        text_model,
        ids,
        args,
    };
    backends::dispatch(job.args.model.backend, threads, job.args.model.kernels, job)
}

struct StreamJob {
    text_model: TextModel,
    ids: Vec<u32>,
    args: PerplexityArgs,
}

impl Job for StreamJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let StreamJob {
            text_model: TextModel { file, .. },
            ids,
            args,
        } = self;
        let model = load_model(file, b, kvcore::model::Activations::F32)?;
        let types = args.kv_types.single()?;
        let (cache, keep) = (args.ctx, args.keep);
        let mut kv = kvcore_engine::sink_store(&model, cache, keep, ids.len(), types)
            .map_err(anyhow::Error::msg)?;
        let bar = ProgressBar::new(ids.len() as u64 - 1);
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:40} token {pos}/{len} {msg}")
                .expect("valid template"),
        );
        let mut ppl = Perplexity::default();
        score_stream(&model, &mut kv, &ids, (cache / 2).max(1), |nll| {
            ppl.add(nll);
            bar.inc(1);
            if ppl.count() % 256 == 0 {
                bar.set_message(format!("ppl {:.4} ± {:.4}", ppl.ppl(), ppl.stderr()));
            }
        })?;
        let bytes = kv.bytes();
        bar.finish_and_clear();
        if args.json {
            let json = serde_json::json!({
                "ppl": ppl.ppl(),
                "ppl_stderr": ppl.stderr(),
                "tokens_scored": ppl.count(),
                "stream": true,
                "ctx": cache,
                "keep": keep,
                "window": cache - keep,
                "kv_bytes": bytes,
            });
            println!("{json}");
        } else {
            println!(
                "PPL = {:.4} ± {:.4} over {} tokens (streamed through {keep} sinks and a window of {}; {bytes} KV bytes)",
                ppl.ppl(),
                ppl.stderr(),
                ppl.count(),
                cache - keep
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}

struct PerplexityJob {
    text_model: TextModel,
    ids: Vec<u32>,
    chunks: usize,
    args: PerplexityArgs,
}

impl Job for PerplexityJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let PerplexityJob {
            text_model: TextModel { file, tok, .. },
            ids,
            chunks,
            args,
        } = self;
        // One pass per chunk: the decode activations (`--activations`) never apply.
        let model = load_model(file, b, kvcore::model::Activations::F32)?;
        let vocab = model.config().vocab_size;
        let ctx = args.ctx;
        let first = ctx / 2;
        let mut save = match &args.save_logits {
            Some(path) => Some(LogitsWriter::create(path, vocab, ctx, &ids)?),
            None => None,
        };
        let mut base = match &args.kl_base {
            Some(path) => Some(LogitsReader::open(path, vocab, ctx, &ids)?),
            None => None,
        };

        let bar = ProgressBar::new(chunks as u64);
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:40} chunk {pos}/{len} {msg}")
                .expect("valid template"),
        );
        let mut ppl = Perplexity::default();
        let mut div = Divergence::default();
        let mut base_row = vec![0f32; vocab];
        for chunk in ids.chunks(ctx) {
            let mut tokens = chunk.to_vec();
            if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
                tokens[0] = bos;
            }
            let logits = score_chunk(&model, &args, &tokens)?; // [ctx, vocab]
            for j in first..ctx - 1 {
                let lp = log_softmax(logits.row(j).as_slice().expect("rows are contiguous"));
                ppl.add(-f64::from(lp[tokens[j + 1] as usize]));
                if let Some(w) = save.as_mut() {
                    w.row(&lp)?;
                }
                if let Some(r) = base.as_mut() {
                    r.row(&mut base_row)?;
                    // f16 rounding leaves the row a little off a distribution:
                    // renormalised, the divergence is a true KL (never negative).
                    div.add(&log_softmax(&base_row), &lp);
                }
            }
            bar.inc(1);
            bar.set_message(format!("ppl {:.4} ± {:.4}", ppl.ppl(), ppl.stderr()));
        }
        bar.finish_and_clear();
        if let Some(w) = save {
            w.finish()?;
        }
        if let Some(r) = base {
            r.finish()?;
        }

        let kl = args.kl_base.is_some();
        if args.json {
            let mut json = serde_json::json!({
                "ppl": ppl.ppl(),
                "ppl_stderr": ppl.stderr(),
                "tokens_scored": ppl.count(),
                "chunks": chunks,
                "ctx": ctx,
            });
            if kl {
                json["kld_mean"] = div.mean().into();
                json["kld_p99"] = div.quantile(0.99).into();
                json["top1_agree"] = div.top1_agreement().into();
            }
            println!("{json}");
        } else {
            println!(
                "PPL = {:.4} ± {:.4} over {} tokens ({chunks} chunks of {ctx}, the second half of each scored)",
                ppl.ppl(),
                ppl.stderr(),
                ppl.count()
            );
            if kl {
                println!(
                    "KL divergence from the base run: mean {:.3e}, 99th percentile {:.3e}; top-1 agreement {:.2} %",
                    div.mean(),
                    div.quantile(0.99),
                    100.0 * div.top1_agreement()
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Every position's logits of one chunk, from an empty store of the kind `--kv` names.
fn score_chunk<B: Backend>(
    model: &Llama<B>,
    args: &PerplexityArgs,
    tokens: &[u32],
) -> anyhow::Result<kvcore::ndarray::Array2<f32>> {
    let types = args.kv_types.single()?;
    let mut kv = args.kv.new_store(model, tokens.len(), types)?;
    Ok(model.forward(&mut kv, tokens, Logits::All)?)
}

/// Writes a `--save-logits` file, hashing as it goes.
struct LogitsWriter {
    out: BufWriter<File>,
    hash: Sha256,
    path: std::path::PathBuf,
    rows: u64,
    rows_at: u64,
    buf: Vec<u8>,
}

impl LogitsWriter {
    fn create(path: &Path, vocab: usize, ctx: usize, ids: &[u32]) -> anyhow::Result<Self> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = LogitsWriter {
            out: BufWriter::new(file),
            hash: Sha256::new(),
            path: path.to_path_buf(),
            rows: 0,
            rows_at: 0,
            buf: Vec::with_capacity(vocab * 2),
        };
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&u32::try_from(vocab)?.to_le_bytes());
        head.extend_from_slice(&u32::try_from(ctx)?.to_le_bytes());
        head.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        for id in ids {
            head.extend_from_slice(&id.to_le_bytes());
        }
        let chunks = ids.len() / ctx;
        let rows = (chunks * (ctx - 1 - ctx / 2)) as u64;
        w.rows_at = rows;
        head.extend_from_slice(&rows.to_le_bytes());
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.hash.update(bytes);
        self.out
            .write_all(bytes)
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    fn row(&mut self, lp: &[f32]) -> anyhow::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for &v in lp {
            buf.extend_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        self.write(&buf)?;
        self.buf = buf;
        self.rows += 1;
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<()> {
        debug_assert_eq!(self.rows, self.rows_at);
        let digest = self.hash.clone().finalize();
        self.out
            .write_all(&digest)
            .and_then(|_| self.out.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Reads a `--kl-base` file row by row, checking it against the run and its checksum.
struct LogitsReader {
    input: BufReader<File>,
    hash: Sha256,
    path: std::path::PathBuf,
    vocab: usize,
    buf: Vec<u8>,
}

impl LogitsReader {
    fn open(path: &Path, vocab: usize, ctx: usize, ids: &[u32]) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut r = LogitsReader {
            input: BufReader::new(file),
            hash: Sha256::new(),
            path: path.to_path_buf(),
            vocab,
            buf: vec![0; vocab * 2],
        };
        let mut magic = [0u8; 8];
        r.read(&mut magic)?;
        if &magic != MAGIC {
            bail!(
                "{} is not a kvcore logits file (no KVCORELP magic)",
                path.display()
            );
        }
        let version = r.u32()?;
        if version != VERSION {
            bail!(
                "{} is logits format version {version}; this kvcore reads version {VERSION}",
                path.display()
            );
        }
        let (file_vocab, file_ctx) = (r.u32()? as usize, r.u32()? as usize);
        if file_vocab != vocab {
            bail!(
                "{} was saved with a vocabulary of {file_vocab} tokens; this model has {vocab}",
                path.display()
            );
        }
        if file_ctx != ctx {
            bail!(
                "{} was saved with -c {file_ctx}; this run uses -c {ctx}",
                path.display()
            );
        }
        let n = r.u64()?;
        if n != ids.len() as u64 {
            bail!(
                "{} scored {n} tokens; this run scores {} (another text or --chunks)",
                path.display(),
                ids.len()
            );
        }
        for (i, &id) in ids.iter().enumerate() {
            let file_id = r.u32()?;
            if file_id != id {
                bail!(
                    "{} holds another text: token {i} is {file_id} there and {id} here",
                    path.display()
                );
            }
        }
        let rows = r.u64()?;
        let expected = ((ids.len() / ctx) * (ctx - 1 - ctx / 2)) as u64;
        if rows != expected {
            bail!(
                "{} claims {rows} rows; {expected} follow from its header",
                path.display()
            );
        }
        Ok(r)
    }

    fn read(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                anyhow::anyhow!("{} is truncated", self.path.display())
            }
            _ => anyhow::Error::new(e).context(format!("cannot read {}", self.path.display())),
        })?;
        self.hash.update(&*buf);
        Ok(())
    }

    fn u32(&mut self) -> anyhow::Result<u32> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> anyhow::Result<u64> {
        let mut b = [0u8; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn row(&mut self, out: &mut [f32]) -> anyhow::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        self.read(&mut buf)?;
        for (o, b) in out.iter_mut().zip(buf.chunks_exact(2)) {
            *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
        self.buf = buf;
        debug_assert_eq!(out.len(), self.vocab);
        Ok(())
    }

    /// Checks the trailing checksum and that nothing follows it.
    fn finish(mut self) -> anyhow::Result<()> {
        let digest = self.hash.clone().finalize();
        let mut stored = [0u8; 32];
        self.input
            .read_exact(&mut stored)
            .map_err(|_| anyhow::anyhow!("{} is truncated (no checksum)", self.path.display()))?;
        if stored[..] != digest[..] {
            bail!(
                "{} fails its SHA-256 checksum: the file is corrupt",
                self.path.display()
            );
        }
        let mut rest = [0u8; 1];
        if self.input.read(&mut rest)? != 0 {
            bail!("{} has bytes after its checksum", self.path.display());
        }
        Ok(())
    }
}
