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
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server", "tests"))
import kvserve  # noqa: E402


def start(binary, model, tier):
    return kvserve.Replica(binary, model, "-t", "2", "--kv-budget", "512M", "-c", "8192",
                           "--kv-tier", tier)


def ttft(server, prompt):
    t, usage, _ = kvserve.stream(server.url, "/v1/completions",
                                 {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    return t, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    words = open("/usr/share/common-licenses/GPL-3").read().split()
    cold, warm, cached, prompt_tokens = [], [], [], []
    for rep in range(a.reps):
        prompt = f"Copy {rep}. " + " ".join(words[:3335])
        with tempfile.TemporaryDirectory() as tier:
            server = start(a.binary, a.model, tier)
            t, usage = ttft(server, prompt)
            cold.append(t)
            prompt_tokens.append(usage["prompt_tokens"])
            server.restart()
            t, usage = ttft(server, prompt)
            warm.append(t)
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            server.stop()
    print(json.dumps({
        "prompt_tokens": prompt_tokens, "cached_tokens_after_restart": cached,
        "cold_ttft_s": statistics.median(cold), "restart_ttft_s": statistics.median(warm),
        "ratio": statistics.median(warm) / statistics.median(cold),
        "cold_all": cold, "restart_all": warm,
    }, indent=1))


if __name__ == "__main__":
    main()
