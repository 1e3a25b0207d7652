"""Time to first token of a ~4,000-token prompt after `kvcore serve --kv-tier DIR` restarts
(issue 51's restart target: ≤ 10 % of a cold prefill, cached_tokens ≥ 3,968).

Usage: python3 benches/tier_restart.py KVCORE_BINARY [MODEL] [--reps 3]

Each rep: a fresh tier directory; server 1 answers the prompt cold (TTFT measured), is
stopped with SIGTERM (its tier written), server 2 starts on the same directory and
answers the same prompt (TTFT measured, its blocks from the tier). The prompt is Debian's
GPL-3 text, cut to about 4,000 tokens, with the rep's number first (so no rep shares
another's blocks). Prints one JSON object: medians of cold and restarted TTFT, their
ratio, and the cached tokens the restarted server reported.
"""

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request


def start(binary, model, tier):
    proc = subprocess.Popen(
        [binary, "serve", model, "--port", "0", "-t", "2", "--kv-budget", "512M", "-c", "8192",
         "--kv-tier", tier],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, ready = [None], threading.Event()

    def read():
        for line in proc.stderr:
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                url[0] = m.group(1)
                ready.set()
        ready.set()
    threading.Thread(target=read, daemon=True).start()
    ready.wait(120)
    if url[0] is None:
        raise SystemExit("kvcore serve did not start")
    return proc, url[0]


def ttft(url, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, usage = None, None
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                first = time.perf_counter() - t0
            if ev.get("usage"):
                usage = ev["usage"]
    return first if first is not None else time.perf_counter() - t0, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    words = open("/usr/share/common-licenses/GPL-3").read().split()
    cold, warm, cached, prompt_tokens = [], [], [], []
    for rep in range(a.reps):
        prompt = f"Copy {rep}. " + " ".join(words[:2900])
        with tempfile.TemporaryDirectory() as tier:
            proc, url = start(a.binary, a.model, tier)
            t, usage = ttft(url, prompt)
            cold.append(t)
            prompt_tokens.append(usage["prompt_tokens"])
            proc.terminate()
            proc.wait(60)
            proc, url = start(a.binary, a.model, tier)
            t, usage = ttft(url, prompt)
            warm.append(t)
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            proc.terminate()
            proc.wait(60)
    print(json.dumps({
        "prompt_tokens": prompt_tokens, "cached_tokens_after_restart": cached,
        "cold_ttft_s": statistics.median(cold), "restart_ttft_s": statistics.median(warm),
        "ratio": statistics.median(warm) / statistics.median(cold),
        "cold_all": cold, "restart_all": warm,
    }, indent=1))


if __name__ == "__main__":
    main()
