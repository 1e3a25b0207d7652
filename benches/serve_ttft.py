"""Time to first token of `kvcore serve` with a cached vs a cold system prompt.

Usage: python3 benches/serve_ttft.py BASE_URL [--reps 7]

The system prompt is the first 220 words of Debian's Apache-2.0 licence text (about 300
tokens with the chat template). A cold request starts with a different first word each
time (so no block of its prompt is cached); a cached request has the same system prompt
as the one before it and a new user question. Requests alternate cold / cached, one at a
time (nothing else runs), streamed, greedy, max_tokens 1; TTFT is from sending the
request to the first content chunk. Prints one JSON object: medians, minima and their
ratio, and the prompt and cached token counts the server reported.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server", "tests"))
import kvserve  # noqa: E402


def ttft(base, system, question):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    t, usage, _ = kvserve.stream(base, "/v1/chat/completions",
                                 {"messages": messages, "max_tokens": 2, "temperature": 0})
    return t, usage


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    words = open("/usr/share/common-licenses/Apache-2.0").read().split()[:220]
    system = " ".join(words)
    cold, cached, usages = [], [], {}
    ttft(a.base, system, "Warm-up question?")  # the model's pages in memory
    for i in range(a.reps):
        t, u = ttft(a.base, f"Variant{i}x " + system, f"Question number {i}?")
        cold.append(t)
        usages["cold"] = u
        t, u = ttft(a.base, system, f"Another question, number {i}?")
        cached.append(t)
        usages["cached"] = u
    out = {
        "cold_ms_median": 1000 * statistics.median(cold),
        "cached_ms_median": 1000 * statistics.median(cached),
        "cold_ms_min": 1000 * min(cold),
        "cached_ms_min": 1000 * min(cached),
        "ratio_median": statistics.median(cold) / statistics.median(cached),
        "usage": usages,
        "reps": a.reps,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
