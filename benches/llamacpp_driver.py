"""llama.cpp side of benches/compare_llamacpp.sh, through llama-cpp-python.

Six subcommands, each printing one JSON object on stdout:

  tokenize  MODEL TEXT
      {"ids": [...], "ids_with_special": [...], "roundtrip_ok": bool}: TEXT tokenized by
      llama.cpp's own tokenizer with special tokens parsed, without ("ids", comparable
      to `kvcore tokenize --json`) and with ("ids_with_special") the BOS the model asks
      for. Loads the vocabulary only.

  generate  MODEL --ids JSON -n N -t THREADS -c CTX [KV OPTIONS]
      Greedy generation of exactly N tokens after the prompt ids, timed like kvcore's
      `model::generate`: prefill is one llama_decode of the whole prompt (logits of the
      last position only) up to the logits being available; time to first token adds
      the arg-max; decode covers the N - 1 one-token steps after it, each a
      llama_decode plus an arg-max. Stop tokens do not stop it, so both systems do the
      same amount of work (the caller passes the count kvcore generated). The stats
      record "type_k", "type_v" and "flash_attn".

  bench     MODEL -p 64,512 -n 128 -d 0,4096 -r 5 -t THREADS -c CTX [KV OPTIONS]
      Mirror of `kvcore bench`: `ppN` is one pass over N prompt tokens, `tgN` is N
      one-token steps; one warm-up and R timed repetitions each. -d/--depth (default 0)
      is llama-bench's and `kvcore bench`'s: for each depth D the cache first holds D
      positions (prefilled once, untimed, in batches of n_batch), and every repetition
      of every test starts from exactly those D positions (the ones after D removed
      with llama_memory_seq_rm; re-prefilled, untimed, should that fail), so `ppN` is
      one batch at positions D .. D+N-1 and `tgN` N steps from D. Token ids are the
      same xorshift64 sequence kvcore uses, for the D prefilled positions and for the
      test (llama-bench also feeds random tokens). n_ctx is raised to the largest depth
      plus the largest test when CTX is smaller. Rows: "test" ("tg64" at depth 0,
      "tg64 @ d4096" otherwise, as `kvcore bench` names them), "depth", "n_ctx",
      "type_k", "type_v", "flash_attn", and the tok/s figures.

  kld       MODEL --ids-file FILE -c CTX [--chunks N] [--base-out NPY | --base NPY]
            [KV OPTIONS]
      llama-perplexity's rule, as `kvcore perplexity`: the token ids (a JSON array in
      FILE) are cut into chunks of CTX tokens (the first --chunks of them, default all;
      the first token of each replaced by BOS when the model asks for one); each chunk
      runs from an empty cache in one llama_decode, and positions CTX/2 .. CTX-2 are
      scored, each predicting the next token (logits are requested from CTX/2 on,
      as llama-perplexity does). {"ppl", "ppl_stderr", "tokens_scored", "chunks", "ctx",
      "type_k", "type_v", "flash_attn"}: ppl = exp(mean NLL), ppl_stderr =
      ppl * sqrt(var(nll) / (N - 1)), log-softmax computed in float64. --base-out NPY
      writes the scored rows' log-probabilities (float32 .npy, [tokens_scored, vocab],
      written through a memory map); --base NPY reads such a file (memory-mapped) and
      adds "kld_mean", "kld_p99" (nearest rank) and "top1_agree" (the fraction of
      positions whose arg-max is the base's): KL(base || this run) per position in
      float64, both rows renormalised first.

  batch     MODEL -s 1,2,4,8,16 -d 64 -n 32 -r 5 -t THREADS [--unified] [KV OPTIONS]
      Mirror of `kvcore bench -s`: S sequences in one llama.cpp context (n_seq_max = S),
      each starting from the same D positions (prefilled into sequence 0, untimed, then
      llama_memory_seq_cp to the others), decoded together by N steps, each one
      llama_decode of a batch of S tokens (one per sequence id, at position D + step,
      logits requested for each); sequence i decodes ids[i·N .. (i+1)·N] of the xorshift
      sequence, as kvcore does. tok/s = S·N / time. The KV cache is llama.cpp's default
      (one stream per sequence, n_ctx = S · (D + N + 16)); --unified makes it one shared
      cache (kv_unified). Rows: "test" ("tg32 x 8"), "sequences", "kv_unified", and the
      tok/s figures.

  reference-error  MODEL [--reference LOGITS_JSON]
      How far llama.cpp's logits are from the float64 reference logits
      (../shared/reference/.../logits.json): every prompt's prompt + greedy ids fed one
      token at a time (the decode path), every listed top-20 logit compared.
      {"worst": ..., "mean": ..., "top1_agree": k, "positions": n}. The yardstick for
      the tolerances of kvcore's 8-bit activation golden test (tests/golden_q8.rs).

KV OPTIONS (generate, bench, kld): --type-k and --type-v, the KV cache's element types
(f32, f16 (default), bf16, q8_0, q4_0; llama.cpp's context parameters type_k/type_v),
and --flash-attn on|off (default off). llama.cpp needs flash attention for a quantized
V cache: a combination it refuses is reported on stderr with exit status 2.

The context is created with n_ctx = CTX (kvcore's max_ctx), n_batch = n_ubatch =
max(512, longest batch), n_threads = n_threads_batch = THREADS and llama-cpp-python's
other defaults (mmap on; f16 KV cache and flash attention off unless the KV options say
otherwise). The batch API is used directly (llama_batch_get_one / llama_batch_init,
llama_decode, llama_get_logits_ith) so no Python-side per-token copying of logits is
timed; the arg-max is numpy's.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time

import llama_cpp
import numpy as np


# --type-k / --type-v names -> ggml_type ids (llama_context_params.type_k / type_v).
# llama-cpp-python 0.3.36 does not export GGML_TYPE_BF16; ggml.h has it as 30.
KV_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": getattr(llama_cpp, "GGML_TYPE_BF16", 30),
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
QUANTIZED = ("q8_0", "q4_0")


def rate_record(tok_s):
    """The fields of a result row that report the timed repetitions' rates: each, and
    their median, least and greatest."""
    return {
        "tok_s": tok_s,
        "median_tok_s": statistics.median(tok_s),
        "min_tok_s": min(tok_s),
        "max_tok_s": max(tok_s),
    }


def kv_record(a):
    """The KV options as the output records them."""
    return {"type_k": a.type_k, "type_v": a.type_v, "flash_attn": a.flash_attn == "on"}


def load(path, threads, ctx, batch, kv=None):
    """A Llama with its context; kv is the parsed arguments of the KV options, or None
    for llama-cpp-python's defaults (f16 K and V, flash attention off)."""
    extra = {}
    if kv is not None:
        extra = {
            "type_k": KV_TYPES[kv.type_k],
            "type_v": KV_TYPES[kv.type_v],
            "flash_attn": kv.flash_attn == "on",
        }
    try:
        return llama_cpp.Llama(
            model_path=path,
            n_ctx=ctx,
            n_batch=batch,
            n_ubatch=batch,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            **extra,
        )
    except ValueError as e:  # llama-cpp-python's "Failed to create llama_context"
        if kv is None:
            raise
        hint = ""
        if kv.type_v in QUANTIZED and kv.flash_attn != "on":
            hint = "; llama.cpp needs --flash-attn on for a quantized V cache"
        print(
            f"llama.cpp refused the context (type_k={kv.type_k}, type_v={kv.type_v}, "
            f"flash_attn={kv.flash_attn}): {e}{hint}",
            file=sys.stderr,
        )
        sys.exit(2)


class Session:
    """One llama.cpp context fed token batches in sequence (one sequence, id 0)."""

    def __init__(self, llm):
        self.llm = llm
        self.ctx = llm.ctx
        self.n_vocab = llm.n_vocab()

    def clear(self):
        mem = llama_cpp.llama_get_memory(self.ctx)
        llama_cpp.llama_memory_clear(mem, False)

    def decode(self, ids):
        """Runs ids through the model; returns the last position's logits, [n_vocab]."""
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        rc = llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(arr, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)
        )

    def fill(self, ids, batch):
        """An empty cache, then ids prefilled in batches of at most batch tokens."""
        self.clear()
        for i in range(0, len(ids), batch):
            self.decode(ids[i : i + batch])

    def restore(self, ids, batch):
        """Back to a cache holding exactly the positions of ids (filled before with
        fill(ids, batch)): the positions after them are removed, or, should llama.cpp
        not manage that, the cache is filled again."""
        if not ids:
            self.clear()
            return
        mem = llama_cpp.llama_get_memory(self.ctx)
        removed = llama_cpp.llama_memory_seq_rm(mem, 0, len(ids), -1)
        if not removed or llama_cpp.llama_memory_seq_pos_max(mem, 0) != len(ids) - 1:
            self.fill(ids, batch)


def cmd_tokenize(a):
    llm = llama_cpp.Llama(model_path=a.model, vocab_only=True, verbose=False)
    text = a.text.encode("utf-8")
    ids = llm.tokenize(text, add_bos=False, special=True)
    with_special = llm.tokenize(text, add_bos=True, special=True)
    back = llm.detokenize(ids, special=True)
    json.dump(
        {"ids": ids, "ids_with_special": with_special, "roundtrip_ok": back == text},
        sys.stdout,
    )
    print()


def cmd_generate(a):
    prompt = json.loads(a.ids)
    if not prompt or a.n < 1:
        sys.exit("generate needs a non-empty prompt and -n >= 1")
    t_load = time.perf_counter()
    s = Session(load(a.model, a.threads, a.ctx, max(512, len(prompt)), a))
    load_ms = (time.perf_counter() - t_load) * 1e3

    start = time.perf_counter()
    logits = s.decode(prompt)
    prefill = time.perf_counter() - start
    tokens = [int(np.argmax(logits))]
    ttft = time.perf_counter() - start
    decode_start = time.perf_counter()
    while len(tokens) < a.n:
        logits = s.decode([tokens[-1]])
        tokens.append(int(np.argmax(logits)))
    decode = time.perf_counter() - decode_start

    # The prompt ids came from kvcore; check llama.cpp tokenizes their text back to them.
    text = s.llm.detokenize(prompt, special=True)
    roundtrip_ok = s.llm.tokenize(text, add_bos=False, special=True) == prompt

    json.dump(
        {
            "prompt_tokens": prompt,
            "tokens": tokens,
            "stats": {
                "ttft_ms": ttft * 1e3,
                "prefill_tok_s": len(prompt) / prefill,
                "decode_tok_s": (len(tokens) - 1) / decode if len(tokens) > 1 else 0.0,
                "load_ms": load_ms,
                "threads": a.threads,
                "n_ctx": a.ctx,
                **kv_record(a),
                "prompt_roundtrip_ok": roundtrip_ok,
                "prompt_token_count": len(prompt),
                "generated_token_count": len(tokens),
                "llama_cpp_python": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode(),
            },
        },
        sys.stdout,
    )
    print()


def xorshift_tokens(n, vocab):
    """kvcore bench's token ids: xorshift64 (13, 7, 17) from a fixed seed, mod vocab."""
    mask = (1 << 64) - 1
    s = 0x2545_F491_4F6C_DD1D
    out = []
    for _ in range(n):
        s ^= (s << 13) & mask
        s ^= s >> 7
        s ^= (s << 17) & mask
        out.append(s % vocab)
    return out


def cmd_bench(a):
    tests = [("pp", n) for n in a.pp] + [("tg", n) for n in a.tg]
    if not tests or not a.depth or any(n < 1 for _, n in tests) or min(a.depth) < 0:
        sys.exit("bench needs at least one test, test sizes >= 1 and depths >= 0")
    n_ctx = max([a.ctx, max(a.depth) + max(n for _, n in tests)])
    batch = max([512] + a.pp)
    s = Session(load(a.model, a.threads, n_ctx, batch, a))
    rows = []
    for depth in a.depth:
        prefix = xorshift_tokens(depth, s.n_vocab)
        s.fill(prefix, batch)  # untimed, once per depth
        for kind, n in tests:
            ids = xorshift_tokens(n, s.n_vocab)
            tok_s = []
            for rep in range(a.reps + 1):
                s.restore(prefix, batch)
                start = time.perf_counter()
                if kind == "pp":
                    s.decode(ids)
                else:
                    for i in ids:
                        s.decode([i])
                secs = time.perf_counter() - start
                if rep > 0:
                    tok_s.append(n / secs)
            rows.append(
                {
                    "backend": "llama.cpp",
                    "threads": a.threads,
                    "test": f"{kind}{n}" if depth == 0 else f"{kind}{n} @ d{depth}",
                    "depth": depth,
                    "tokens": n,
                    "n_ctx": n_ctx,
                    **kv_record(a),
                    **rate_record(tok_s),
                }
            )
    json.dump(rows, sys.stdout)
    print()


def cmd_batch(a):
    if not a.seqs or min(a.seqs) < 1 or a.tg < 1 or a.depth < 1:
        sys.exit("batch needs sequences >= 1, -n >= 1 and a depth >= 1")
    # The low-level API logs every tensor to stderr unless a callback takes the lines.
    quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(a.model.encode(), mparams)
    if not model:
        sys.exit(f"llama.cpp cannot load {a.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    prefix = xorshift_tokens(a.depth, n_vocab)
    rows = []
    for S in a.seqs:
        cparams = llama_cpp.llama_context_default_params()
        per_seq = a.depth + a.tg + 16
        cparams.n_ctx = per_seq * S if not a.unified else a.depth + S * (a.tg + 16)
        cparams.n_batch = cparams.n_ubatch = max(512, S)
        cparams.n_seq_max = S
        cparams.n_threads = cparams.n_threads_batch = a.threads
        cparams.type_k = KV_TYPES[a.type_k]
        cparams.type_v = KV_TYPES[a.type_v]
        cparams.flash_attn_type = 1 if a.flash_attn == "on" else 0
        cparams.kv_unified = a.unified
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            sys.exit(f"llama.cpp refused the context for {S} sequences")
        mem = llama_cpp.llama_get_memory(ctx)
        batch = llama_cpp.llama_batch_init(max(512, S), 0, 1)

        def submit(items):
            batch.n_tokens = len(items)
            for k, (tok, pos, seq, want) in enumerate(items):
                batch.token[k] = tok
                batch.pos[k] = pos
                batch.n_seq_id[k] = 1
                batch.seq_id[k][0] = seq
                batch.logits[k] = want
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

        ids = xorshift_tokens(a.tg * S, n_vocab)
        tok_s = []
        for rep in range(a.reps + 1):
            llama_cpp.llama_memory_clear(mem, False)
            for i in range(0, a.depth, 512):
                end = min(a.depth, i + 512)
                submit([(prefix[j], j, 0, j == a.depth - 1) for j in range(i, end)])
            for seq in range(1, S):
                llama_cpp.llama_memory_seq_cp(mem, 0, seq, -1, -1)
            start = time.perf_counter()
            for step in range(a.tg):
                submit([(ids[q * a.tg + step], a.depth + step, q, True) for q in range(S)])
            secs = time.perf_counter() - start
            if rep > 0:
                tok_s.append(S * a.tg / secs)
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        rows.append(
            {
                "backend": "llama.cpp",
                "threads": a.threads,
                "test": f"tg{a.tg} x {S}",
                "sequences": S,
                "depth": a.depth,
                "kv_unified": a.unified,
                **kv_record(a),
                **rate_record(tok_s),
            }
        )
    json.dump(rows, sys.stdout)
    print()


def log_softmax32(x):
    """ln softmax of each row of x (float32 [rows, vocab]), in float64, returned as
    float32 (as kvcore's model::perplexity::log_softmax)."""
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    x -= m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return x.astype(np.float32)


def renormalised(rows):
    """float32 log-probability rows, renormalised in float64 (float32 rounding leaves
    them a little off a distribution)."""
    r = rows.astype(np.float64)
    m = r.max(axis=1, keepdims=True)
    r -= m + np.log(np.exp(r - m).sum(axis=1, keepdims=True))
    return r


def kl_rows(base, lp):
    """KL(base || lp) of each row, in float64, both (float32 log-probabilities, as
    saved) renormalised first, so it is a true KL: never negative, 0 for equal rows.
    Terms where the base probability is 0 add nothing."""
    b = renormalised(base)
    p = np.exp(b)
    return np.where(p > 0, p * (b - renormalised(lp)), 0.0).sum(axis=1)


def cmd_kld(a):
    with open(a.ids_file) as f:
        ids = json.load(f)
    ctx = a.ctx
    if ctx < 4:
        sys.exit("kld needs -c >= 4 (each chunk scores positions c/2 .. c-2)")
    available = len(ids) // ctx
    chunks = available if a.chunks is None else min(a.chunks, available)
    if chunks < 1:
        sys.exit(f"{a.ids_file} has {len(ids)} ids, fewer than one chunk of {ctx} (-c)")
    s = Session(load(a.model, a.threads, ctx, max(512, ctx), a))
    vocab = s.n_vocab
    if any(not 0 <= t < vocab for t in ids[: chunks * ctx]):
        sys.exit(f"{a.ids_file} has ids outside the vocabulary (0 .. {vocab - 1})")
    add_bos = s.llm._model.add_bos_token()
    bos = s.llm.token_bos()
    first = ctx // 2
    per_chunk = ctx - 1 - first  # positions first .. ctx-2
    n_rows = chunks * per_chunk

    save = base = None
    if a.base_out:
        save = np.lib.format.open_memmap(
            a.base_out, mode="w+", dtype=np.float32, shape=(n_rows, vocab)
        )
    if a.base:
        base = np.load(a.base, mmap_mode="r")
        if base.dtype != np.float32 or base.shape != (n_rows, vocab):
            sys.exit(
                f"{a.base} holds {base.dtype} {list(base.shape)}; this run scores "
                f"float32 [{n_rows}, {vocab}] (another text, -c, --chunks or model?)"
            )

    batch = llama_cpp.llama_batch_init(ctx, 0, 1)
    nll = np.empty(n_rows)
    klds = np.empty(n_rows) if base is not None else None
    agree = 0
    block = 64  # rows converted at a time: a few float64 [64, vocab] temporaries
    row = 0
    try:
        for c in range(chunks):
            tokens = ids[c * ctx : (c + 1) * ctx]
            if add_bos and bos >= 0:
                tokens[0] = bos
            s.clear()
            batch.n_tokens = ctx
            for k, t in enumerate(tokens):
                batch.token[k] = t
                batch.pos[k] = k
                batch.n_seq_id[k] = 1
                batch.seq_id[k][0] = 0
                batch.logits[k] = 1 if k >= first else 0  # llama-perplexity's request
            rc = llama_cpp.llama_decode(s.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for j0 in range(first, ctx - 1, block):
                js = range(j0, min(j0 + block, ctx - 1))
                x = np.empty((len(js), vocab), dtype=np.float32)
                for i, j in enumerate(js):
                    ptr = llama_cpp.llama_get_logits_ith(s.ctx, j)
                    x[i] = np.ctypeslib.as_array(
                        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(vocab,)
                    )
                lp = log_softmax32(x)
                rows = slice(row, row + len(js))
                nxt = np.array([tokens[j + 1] for j in js])
                nll[rows] = -lp[np.arange(len(js)), nxt].astype(np.float64)
                if save is not None:
                    save[rows] = lp
                if base is not None:
                    b = np.asarray(base[rows])
                    klds[rows] = kl_rows(b, lp)
                    agree += int((b.argmax(axis=1) == lp.argmax(axis=1)).sum())
                row += len(js)
    finally:
        llama_cpp.llama_batch_free(batch)
    if save is not None:
        save.flush()
        del save

    n = len(nll)
    mean = nll.mean()
    var = max(float((nll * nll).mean() - mean * mean), 0.0)
    ppl = float(np.exp(mean))
    out = {
        "ppl": ppl,
        "ppl_stderr": ppl * np.sqrt(var / (n - 1)) if n > 1 else 0.0,
        "tokens_scored": n,
        "chunks": chunks,
        "ctx": ctx,
        **kv_record(a),
    }
    if klds is not None:
        ranked = np.sort(klds)
        out["kld_mean"] = float(klds.mean())
        out["kld_p99"] = float(ranked[min(max(int(np.ceil(0.99 * n)), 1), n) - 1])
        out["top1_agree"] = agree / n
    print(json.dumps(out))


def cmd_reference_error(a):
    with open(a.reference) as f:
        prompts = json.load(f)
    llm = load(a.model, a.threads, 512, 512)
    s = Session(llm)
    worst, total, count, agree, positions = 0.0, 0.0, 0, 0, 0
    for p in prompts:
        s.clear()
        for tok, ref in zip(p["prompt_ids"] + p["greedy_ids"], p["positions"]):
            row = s.decode([tok])
            for tid, want in ref["top"]:
                d = abs(float(row[tid]) - want)
                worst, total, count = max(worst, d), total + d, count + 1
            agree += int(int(np.argmax(row)) == ref["top"][0][0])
            positions += 1
    print(json.dumps({"worst": worst, "mean": total / count, "top1_agree": agree,
                      "positions": positions}))


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def kv_options(p):
    p.add_argument("--type-k", choices=list(KV_TYPES), default="f16")
    p.add_argument("--type-v", choices=list(KV_TYPES), default="f16")
    p.add_argument("--flash-attn", choices=["on", "off"], default="off")


def command(sub, name, func):
    """The subcommand `name`, run by `func`, with its `model` argument."""
    c = sub.add_parser(name)
    c.add_argument("model")
    c.set_defaults(func=func)
    return c


def run_options(p, ctx=True):
    """The options of a model run: threads, the context (when `ctx`) and the KV cache."""
    p.add_argument("-t", "--threads", type=int, default=2)
    if ctx:
        p.add_argument("-c", "--ctx", type=int, required=True)
    kv_options(p)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    t = command(sub, "tokenize", cmd_tokenize)
    t.add_argument("text")

    g = command(sub, "generate", cmd_generate)
    g.add_argument("--ids", required=True, help="prompt token ids, a JSON array")
    g.add_argument("-n", type=int, required=True)
    run_options(g)

    b = command(sub, "bench", cmd_bench)
    b.add_argument("-p", "--pp", type=int_list, default=[64])
    b.add_argument("-n", "--tg", type=int_list, default=[128])
    b.add_argument("-d", "--depth", type=int_list, default=[0])
    b.add_argument("-r", "--reps", type=int, default=5)
    run_options(b)

    bt = command(sub, "batch", cmd_batch)
    bt.add_argument("-s", "--seqs", type=int_list, default=[1, 2, 4, 8, 16])
    bt.add_argument("-d", "--depth", type=int, default=64)
    bt.add_argument("-n", "--tg", type=int, default=32)
    bt.add_argument("-r", "--reps", type=int, default=5)
    bt.add_argument("--unified", action="store_true")
    run_options(bt, ctx=False)

    k = command(sub, "kld", cmd_kld)
    k.add_argument("--ids-file", required=True, help="token ids, a JSON array")
    k.add_argument("-c", "--ctx", type=int, required=True, help="chunk size")
    k.add_argument("--chunks", type=int, help="chunks scored (default: all)")
    k.add_argument("-t", "--threads", type=int, default=2)
    kv_options(k)
    bo = k.add_mutually_exclusive_group()
    bo.add_argument("--base-out", help="write the scored log-probabilities (.npy)")
    bo.add_argument("--base", help="compare against a --base-out file")

    r = command(sub, "reference-error", cmd_reference_error)
    r.add_argument(
        "--reference",
        default="../shared/reference/smollm2-135m-instruct-q4_1/logits.json",
    )
    r.add_argument("-t", "--threads", type=int, default=2)

    a = p.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
