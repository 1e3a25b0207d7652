#!/usr/bin/env python3
"""kvcore beside llama.cpp on Gemma 3 270M Q4_K_M, at several prompt depths.

For each prompt (the README's 6-token prompt, the first 63 lines of Debian's GPL-2 text
(697 tokens, past the 512-position window) and the whole GPL-2 text (3 950 tokens)),
ROUNDS alternating rounds (the order rotates each round) of:
  - `kvcore generate gemma3 -f PROMPT --raw --greedy --json -n N` for each activation mode
    (f32, q8), default backend (rayon, all cores);
  - `benches/llamacpp_driver.py generate MODEL --ids IDS -n N` with the same prompt ids
    (kvcore's, BOS included) and threads, in llama-cpp-python's venv (f16 KV cache,
    flash attention off: its defaults; its SWA cache for the window layers).
Each process runs under /usr/bin/time for its peak RSS. Prints medians of prefill tok/s,
decode tok/s, TTFT and peak RSS, and the kvcore / llama.cpp ratios, as markdown.

Usage: python3 benches/gemma3_vs_llamacpp.py [ROUNDS] [N]   (defaults 3, 64)
Environment: KVCORE (target/release/kvcore), LLAMA_PY (the avx2 venv's python),
THREADS (2).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVCORE = os.environ.get("KVCORE", os.path.join(ROOT, "target/release/kvcore"))
LLAMA_PY = os.environ.get(
    "LLAMA_PY", os.path.expanduser("~/.cache/kvcore/llama-cpp-venv-avx2/bin/python")
)
DRIVER = os.path.join(ROOT, "benches/llamacpp_driver.py")
THREADS = os.environ.get("THREADS", "2")
GPL2 = "/usr/share/common-licenses/GPL-2"


def timed(cmd):
    """Runs cmd under /usr/bin/time; returns (stdout, peak RSS in MiB)."""
    with tempfile.NamedTemporaryFile("r") as t:
        out = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", t.name] + cmd,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out, int(t.read().split()[-1]) / 1024


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    model = subprocess.run(
        [KVCORE, "info", "gemma3", "--json"], check=True, capture_output=True, text=True
    )
    model = json.loads(model.stdout)["file"]
    with open(GPL2) as f:
        lines = f.read().split("\n")
    prompts = {
        "france": "The capital of France is",
        "gpl2-63": "\n".join(lines[:63]),
        "gpl2-all": "\n".join(lines),
    }
    rows = []
    for name, text in prompts.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
            path = f.name
        ctx = "8192"
        systems = {
            f"kvcore {acts}": [
                KVCORE, "generate", "gemma3", "-f", path, "--raw", "--greedy",
                "--json", "-n", str(n), "--activations", acts, "-c", ctx,
            ]
            for acts in ("f32", "q8")
        }
        first, _ = timed(systems["kvcore f32"])
        ids = json.loads(first)["prompt_tokens"]
        systems["llama.cpp"] = [
            LLAMA_PY, DRIVER, "generate", model, "--ids", json.dumps(ids), "-n", str(n),
            "-t", THREADS, "-c", ctx,
        ]
        results = {k: [] for k in systems}
        order = list(systems)
        for r in range(rounds):
            for k in order[r % len(order):] + order[: r % len(order)]:
                out, rss = timed(systems[k])
                s = json.loads(out)["stats"]
                results[k].append(
                    (s["prefill_tok_s"], s["decode_tok_s"], s["ttft_ms"], rss)
                )
        os.unlink(path)
        for k, v in results.items():
            med = [statistics.median(x[i] for x in v) for i in range(4)]
            rows.append((name, len(ids), k, med))
    print("| prompt | tokens | system | prefill tok/s | decode tok/s | TTFT ms | peak RSS MiB |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, d, k, m in rows:
        print(f"| {name} | {d} | {k} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]:.0f} |")
    print()
    print("| prompt | kvcore acts | decode kvcore/llama.cpp | prefill kvcore/llama.cpp |")
    print("|---|---|---:|---:|")
    by = {(r[0], r[2]): r[3] for r in rows}
    for name in prompts:
        base = by[(name, "llama.cpp")]
        for acts in ("f32", "q8"):
            m = by[(name, f"kvcore {acts}")]
            print(f"| {name} | {acts} | {m[1] / base[1]:.2f} | {m[0] / base[0]:.2f} |")


if __name__ == "__main__":
    main()
