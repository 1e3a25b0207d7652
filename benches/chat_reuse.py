#!/usr/bin/env python3
"""What prefix reuse buys a chat: a scripted 6-turn conversation on SmolLM2 through
`kvcore chat --json` (greedy, replies capped at -n tokens), once reusing the session's
cached positions (the default) and once with `--no-reuse` (every turn clears the session
and prefills the whole rendered conversation). Prints a markdown table per turn: the
rendered conversation, positions reused and prefilled, and TTFT for both runs with their
ratio. With reuse a turn's TTFT follows its new text; without, the whole conversation.

Usage: python3 benches/chat_reuse.py [-n TOKENS] [--bin PATH] [-- extra kvcore chat flags]
The binary defaults to target/release/kvcore (built with `cargo build --release -p
kvcore-cli` when missing); the model to kvcore's default (SmolLM2-135M-Instruct Q4_1).
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# User messages of varying length, as a person would type them.
TURNS = [
    "Hi! Can you help me plan a small vegetable garden?",
    "I have a sunny patch of about three by four metres behind the house. The soil is "
    "quite heavy clay and it stays wet for a few days after rain. What should I do to "
    "the soil before I plant anything, and when is the best time to start?",
    "Which vegetables are easiest for a beginner?",
    "Tomatoes sound good. How far apart should I plant them, do they need support, and "
    "how often should I water them in a hot summer when it does not rain for weeks?",
    "Thanks. What about pests?",
    "Could you summarise everything we discussed as a short checklist I can print and "
    "stick on the shed door, in the order I should do things over the season?",
]


def run_chat(binary, n, extra, no_reuse):
    args = [binary, "chat", "--json", "--greedy", "-n", str(n)] + extra
    if no_reuse:
        args.append("--no-reuse")
    stdin = "".join(t + "\n" for t in TURNS)
    out = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"kvcore chat failed ({out.returncode}): {out.stderr}")
    turns = [json.loads(line) for line in out.stdout.splitlines()]
    if len(turns) != len(TURNS):
        sys.exit(f"expected {len(TURNS)} turns, got {len(turns)}: {out.stderr}")
    for t in turns:
        if t["error"]:
            sys.exit(f"turn {t['turn']} failed: {t['error']}")
    return turns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=96, help="reply cap in tokens (default 96)")
    parser.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "kvcore"))
    parser.add_argument("extra", nargs="*", help="more kvcore chat flags (after --)")
    a = parser.parse_args()
    if not os.path.exists(a.bin):
        subprocess.run(["cargo", "build", "--release", "-p", "kvcore-cli"], cwd=ROOT, check=True)

    reuse = run_chat(a.bin, a.n, a.extra, no_reuse=False)
    fresh = run_chat(a.bin, a.n, a.extra, no_reuse=True)
    same = all(r["tokens"] == f["tokens"] for r, f in zip(reuse, fresh))

    s0 = reuse[0]["stats"]
    print(f"kvcore chat, {len(TURNS)} turns, greedy, replies ≤ {a.n} tokens, "
          f"backend {s0['backend']} x{s0['threads']}, {s0['activations']} activations")
    print()
    print("| turn | user words | conversation | reused | prefilled | TTFT reuse (ms) "
          "| prefilled, --no-reuse | TTFT --no-reuse (ms) | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, (r, f) in enumerate(zip(reuse, fresh)):
        rs, fs = r["stats"], f["stats"]
        ratio = fs["ttft_ms"] / rs["ttft_ms"] if rs["ttft_ms"] > 0 else float("nan")
        print(f"| {i + 1} | {len(TURNS[i].split())} | {rs['prompt_token_count']} "
              f"| {rs['reused_tokens']} | {rs['prefilled_tokens']} | {rs['ttft_ms']:.1f} "
              f"| {fs['prefilled_tokens']} | {fs['ttft_ms']:.1f} | {ratio:.1f}x |")
    print()
    print("replies identical with and without reuse:", "yes" if same else "NO")
    total_r = sum(t["stats"]["ttft_ms"] for t in reuse)
    total_f = sum(t["stats"]["ttft_ms"] for t in fresh)
    print(f"total TTFT: {total_r:.0f} ms with reuse, {total_f:.0f} ms without "
          f"({total_f / total_r:.1f}x)")


if __name__ == "__main__":
    main()
