"""llama.cpp side of benches/compare_llamacpp.sh, through llama-cpp-python.

Three subcommands, each printing one JSON object on stdout:

  tokenize  MODEL TEXT
      {"ids": [...], "ids_with_special": [...], "roundtrip_ok": bool}: TEXT tokenized by
      llama.cpp's own tokenizer with special tokens parsed, without ("ids", comparable
      to `kvcore tokenize --json`) and with ("ids_with_special") the BOS the model asks
      for. Loads the vocabulary only.

  generate  MODEL --ids JSON -n N -t THREADS -c CTX
      Greedy generation of exactly N tokens after the prompt ids, timed like kvcore's
      `model::generate`: prefill is one llama_decode of the whole prompt (logits of the
      last position only) up to the logits being available; time to first token adds
      the arg-max; decode covers the N - 1 one-token steps after it, each a
      llama_decode plus an arg-max. Stop tokens do not stop it, so both systems do the
      same amount of work (the caller passes the count kvcore generated).

  bench     MODEL -p 64,512 -n 128 -r 5 -t THREADS -c CTX
      Mirror of `kvcore bench`: `ppN` is one pass over N prompt tokens, `tgN` is N
      one-token steps from an empty cache; one warm-up and R timed repetitions each,
      the cache cleared before each; token ids are the same xorshift64 sequence kvcore
      uses (llama-bench also feeds random tokens).

  reference-error  MODEL [--reference LOGITS_JSON]
      How far llama.cpp's logits are from the float64 reference logits
      (../shared/reference/.../logits.json): every prompt's prompt + greedy ids fed one
      token at a time (the decode path), every listed top-20 logit compared.
      {"worst": ..., "mean": ..., "top1_agree": k, "positions": n}. The yardstick for
      the tolerances of kvcore's 8-bit activation golden test (tests/golden_q8.rs).

The context is created with n_ctx = CTX (kvcore's max_ctx), n_batch = n_ubatch =
max(512, longest batch), n_threads = n_threads_batch = THREADS and llama-cpp-python's
other defaults (f16 KV cache, flash attention off, mmap on). The batch API is used
directly (llama_batch_get_one, llama_decode, llama_get_logits_ith) so no Python-side
per-token copying of logits is timed; the arg-max is numpy's.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time

import llama_cpp
import numpy as np


def load(path, threads, ctx, batch):
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=ctx,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


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
    s = Session(load(a.model, a.threads, a.ctx, max(512, len(prompt))))
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
    s = Session(load(a.model, a.threads, a.ctx, max([512] + a.pp)))
    rows = []
    for kind, n in tests:
        ids = xorshift_tokens(n, s.n_vocab)
        tok_s = []
        for rep in range(a.reps + 1):
            s.clear()
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
                "test": f"{kind}{n}",
                "tokens": n,
                "tok_s": tok_s,
                "median_tok_s": statistics.median(tok_s),
                "min_tok_s": min(tok_s),
                "max_tok_s": max(tok_s),
            }
        )
    json.dump(rows, sys.stdout)
    print()


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tokenize")
    t.add_argument("model")
    t.add_argument("text")
    t.set_defaults(func=cmd_tokenize)

    g = sub.add_parser("generate")
    g.add_argument("model")
    g.add_argument("--ids", required=True, help="prompt token ids, a JSON array")
    g.add_argument("-n", type=int, required=True)
    g.add_argument("-t", "--threads", type=int, default=2)
    g.add_argument("-c", "--ctx", type=int, required=True)
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench")
    b.add_argument("model")
    b.add_argument("-p", "--pp", type=int_list, default=[64])
    b.add_argument("-n", "--tg", type=int_list, default=[128])
    b.add_argument("-r", "--reps", type=int, default=5)
    b.add_argument("-t", "--threads", type=int, default=2)
    b.add_argument("-c", "--ctx", type=int, required=True)
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("reference-error")
    r.add_argument("model")
    r.add_argument(
        "--reference",
        default="../shared/reference/smollm2-135m-instruct-q4_1/logits.json",
    )
    r.add_argument("-t", "--threads", type=int, default=2)
    r.set_defaults(func=cmd_reference_error)

    a = p.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
