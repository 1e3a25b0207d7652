#!/usr/bin/env bash
# kvcore against llama.cpp on the same GGUF file, prompt, thread count and token counts.
#
# llama.cpp comes from PyPI as llama-cpp-python (pinned below), which compiles llama.cpp
# from source into a virtualenv cached under ~/.cache/kvcore/ (built once, reused).
# Two builds are compared, each its own venv:
#   avx2    -DGGML_NATIVE=OFF with AVX2/FMA/F16C only: the instruction set kvcore-simd
#           uses, the like-for-like comparison;
#   native  -DGGML_NATIVE=ON (-march=native): llama.cpp at its best on this CPU, which
#           may include AVX-512 and VNNI that kvcore does not use.
#
# What it measures (every process wrapped in /usr/bin/time -v for its peak RSS):
#  1. generate: RUNS alternating rounds of `kvcore generate --raw --greedy --json` (once
#     per activation mode in KV_ACTS: f32, and q8 = llama.cpp's 8-bit activations) and
#     benches/llamacpp_driver.py generate with the same prompt token ids (llama.cpp's own
#     tokenizer is checked against `kvcore tokenize --json` first) and the same number
#     of generated tokens; the order of the systems rotates each round. Figures:
#     prefill tok/s, decode tok/s, time to first token, peak RSS.
#  2. chat: RUNS rounds of a 16-token chat (`kvcore generate -p Hello -n 16 --greedy`)
#     with --kv grow and --kv dense, and llama.cpp on the same chat-templated ids: peak
#     RSS (and, as a floor for the Python driver, the RSS of `import llama_cpp` alone).
#  3. bench: `kvcore bench` over scalar, simd and rayon at 1 and 2 threads (each
#     activation mode of KV_ACTS), and the
#     driver's mirror of it (same xorshift token ids, warm-up + RUNS repetitions, fresh
#     cache each) for each llama.cpp build at 1 and 2 threads.
# Then it prints the medians and the kvcore/llama.cpp ratios (markdown), writes
# $OUT/results.json (everything) and $OUT/charts.json, and draws docs/kv_memory.svg
# and docs/decode_speed.svg with `cargo run --example bench_charts`.
#
# Usage: benches/compare_llamacpp.sh [MODEL.gguf]     (default: what `kvcore info` resolves)
# Environment: THREADS (2), RUNS (5), N_GEN (128), BENCH_PP (64), BENCH_TG (64),
#   BENCH_BACKENDS (scalar,simd,rayon), VARIANTS ("avx2 native"), KV_ACTS ("f32 q8"),
#   OUT (target/bench-e2e),
#   CHARTS (1: draw the charts into docs/), SETUP_ONLY (1: build the venvs and stop).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
THREADS=${THREADS:-2}
RUNS=${RUNS:-5}
N_GEN=${N_GEN:-128}
CHAT_PROMPT=Hello
CHAT_N=16
BENCH_PP=${BENCH_PP:-64}
BENCH_TG=${BENCH_TG:-64}
BENCH_BACKENDS=${BENCH_BACKENDS:-scalar,simd,rayon}
VARIANTS=${VARIANTS:-avx2 native}
KV_ACTS=${KV_ACTS:-f32 q8}
CHARTS=${CHARTS:-1}
# A raw (untemplated) prompt of about a hundred tokens, so prefill is measured on a batch.
PROMPT="The history of computing is a story of abstraction. Early machines were programmed \
by rewiring panels, then by punching cards, then by writing assembly for a single \
processor. Compilers let programmers describe what they wanted instead of how the \
hardware should do it, and operating systems hid the differences between devices. \
Today a language model running on an ordinary laptop can summarise a paper, translate \
a letter or explain a proof. To understand how that became possible, we begin with"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvcore
OUT=${OUT:-$ROOT/target/bench-e2e}
DRIVER=$ROOT/benches/llamacpp_driver.py
BIN=$ROOT/target/release/kvcore

log() { printf '[compare %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

venv_dir() { if [ "$1" = native ]; then echo "$CACHE/llama-cpp-venv"; else echo "$CACHE/llama-cpp-venv-$1"; fi; }

cmake_args() {
    local common="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
    case $1 in
        native) echo "-DGGML_NATIVE=ON $common" ;;
        avx2) echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF $common" ;;
        *) die "unknown llama.cpp variant $1 (avx2 or native)" ;;
    esac
}

# Builds llama-cpp-python into the variant's venv unless the pinned version is there.
setup_venv() {
    local venv
    venv=$(venv_dir "$1")
    if "$venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON_VERSION')" 2>/dev/null; then
        return
    fi
    log "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION ($1) into $venv: several minutes"
    mkdir -p "$CACHE"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    CMAKE_ARGS=$(cmake_args "$1") CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        nice -n 19 "$venv/bin/pip" install -q --no-cache-dir \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" cmake ninja
}

# timed NAME CMD...: runs CMD under /usr/bin/time -v, stdout to $RAW/NAME.json.
timed() {
    local name=$1
    shift
    /usr/bin/time -v -o "$RAW/$name.time" "$@" >"$RAW/$name.json" 2>"$RAW/$name.err" ||
        die "$name failed: $(tail -3 "$RAW/$name.err")"
}

[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
for v in $VARIANTS; do setup_venv "$v"; done
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0

log "building kvcore (release)"
(cd "$ROOT" && nice -n 10 cargo build --release -q -p kvcore-cli)
MODEL=${1:-$("$BIN" info | sed -n 's/^file: //p')}
[ -f "$MODEL" ] || die "no model file: $MODEL"
CTX=$("$BIN" info "$MODEL" | sed -n 's/.*context_len: \([0-9]*\).*/\1/p')
[ -n "$CTX" ] || die "cannot read context_len from kvcore info"
RAW=$OUT/raw
rm -rf "$RAW" && mkdir -p "$RAW"
log "model $MODEL (context $CTX), threads $THREADS, runs $RUNS, out $OUT, load $(cut -d' ' -f1-3 /proc/loadavg)"

# --- same prompt ids ---------------------------------------------------------------
"$BIN" tokenize "$MODEL" "$PROMPT" --json >"$RAW/tokenize-kvcore.json"
for v in $VARIANTS; do
    "$(venv_dir "$v")/bin/python" "$DRIVER" tokenize "$MODEL" "$PROMPT" \
        >"$RAW/tokenize-llama-$v.json" 2>"$RAW/tokenize-llama-$v.err"
    python3 - "$RAW/tokenize-kvcore.json" "$RAW/tokenize-llama-$v.json" <<'PY' || die "tokenizers disagree ($v)"
import json, sys
k = json.load(open(sys.argv[1]))
l = json.load(open(sys.argv[2]))
if k != l["ids"] or not l["roundtrip_ok"]:
    sys.exit(f"kvcore {k}\nllama.cpp {l['ids']}")
PY
done
log "prompt: $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$RAW/tokenize-kvcore.json") tokens, identical ids from both tokenizers"

# Warm-ups (page cache, and the ids and token counts the llama.cpp runs replay).
kv_gen=("$BIN" generate "$MODEL" -p "$PROMPT" -n "$N_GEN" --greedy --json --raw -t "$THREADS" -c "$CTX" --kv grow)
timed warm-gen-kvcore "${kv_gen[@]}"
kv_chat=("$BIN" generate "$MODEL" -p "$CHAT_PROMPT" -n "$CHAT_N" --greedy --json -t "$THREADS" -c "$CTX")
timed warm-chat-kvcore "${kv_chat[@]}" --kv grow
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(eval(sys.argv[2], {}, d)))' "$@"; }
GEN_IDS=$(field "$RAW/warm-gen-kvcore.json" prompt_tokens)
GEN_N=$(field "$RAW/warm-gen-kvcore.json" 'stats["generated_token_count"]')
CHAT_IDS=$(field "$RAW/warm-chat-kvcore.json" prompt_tokens)
CHAT_GEN=$(field "$RAW/warm-chat-kvcore.json" 'stats["generated_token_count"]')
[ "$GEN_N" = "$N_GEN" ] || log "note: kvcore stopped after $GEN_N tokens; llama.cpp generates as many"
# llama_generate NAME VARIANT IDS N: the driver's greedy generation, timed.
llama_generate() {
    timed "$1" "$(venv_dir "$2")/bin/python" "$DRIVER" generate "$MODEL" --ids "$3" -n "$4" \
        -t "$THREADS" -c "$CTX"
}
for v in $VARIANTS; do llama_generate "warm-gen-llama-$v" "$v" "$GEN_IDS" "$GEN_N"; done

# --- 1 and 2: alternating rounds ---------------------------------------------------
systems=()
for a in $KV_ACTS; do systems+=("kvcore-$a"); done
for v in $VARIANTS; do systems+=("llama-$v"); done
for ((run = 1; run <= RUNS; run++)); do
    n=${#systems[@]}
    for ((i = 0; i < n; i++)); do
        s=${systems[$(((i + run - 1) % n))]}
        log "round $run/$RUNS: $s"
        if [ "${s%-*}" = kvcore ]; then
            timed "gen-$s-$run" "${kv_gen[@]}" --activations "${s#kvcore-}"
            # The chat's peak RSS, with the first activation mode only.
            if [ "$s" = "${systems[0]}" ]; then
                timed "chat-kvcore-grow-$run" "${kv_chat[@]}" --kv grow --activations "${s#kvcore-}"
                timed "chat-kvcore-dense-$run" "${kv_chat[@]}" --kv dense --activations "${s#kvcore-}"
            fi
        else
            llama_generate "gen-$s-$run" "${s#llama-}" "$GEN_IDS" "$GEN_N"
            llama_generate "chat-$s-$run" "${s#llama-}" "$CHAT_IDS" "$CHAT_GEN"
        fi
    done
done
for v in $VARIANTS; do
    for ((run = 1; run <= RUNS; run++)); do
        timed "import-llama-$v-$run" "$(venv_dir "$v")/bin/python" -c "import llama_cpp, numpy"
    done
done

# --- 3: bench ----------------------------------------------------------------------
log "kvcore bench ($BENCH_BACKENDS, threads 1,$THREADS)"
timed bench-kvcore "$BIN" bench "$MODEL" -p "$BENCH_PP" -n "$BENCH_TG" -r "$RUNS" \
    --backend "$BENCH_BACKENDS" -t "1,$THREADS" -c "$CTX" --activations "${KV_ACTS// /,}" --json
for v in $VARIANTS; do
    for t in 1 "$THREADS"; do
        log "llama.cpp bench ($v, $t threads)"
        timed "bench-llama-$v-t$t" "$(venv_dir "$v")/bin/python" "$DRIVER" bench "$MODEL" \
            -p "$BENCH_PP" -n "$BENCH_TG" -r "$RUNS" -t "$t" -c "$CTX"
    done
done

# --- machine -----------------------------------------------------------------------
first=${VARIANTS%% *}
"$(venv_dir "$first")/bin/python" - >"$RAW/machine.json" <<'PY'
import json, os, subprocess, time
import numpy as np
lscpu = dict(
    (k.strip(), v.strip())
    for k, v in (l.split(":", 1) for l in subprocess.check_output(["lscpu"], text=True).splitlines() if ":" in l)
)
mem_kib = int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")))
# Single-thread copy bandwidth: 512 MiB read + 512 MiB written, best of 5.
a = np.ones(64 << 20)
b = np.empty_like(a)
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    np.copyto(b, a)
    best = min(best, time.perf_counter() - t)
json.dump(
    {
        "cpu": lscpu.get("Model name"),
        "cores": os.cpu_count(),
        "flags_avx512f": "avx512f" in lscpu.get("Flags", ""),
        "l2": lscpu.get("L2 cache"),
        "l3": lscpu.get("L3 cache"),
        "mem_gib": round(mem_kib / 2**20, 1),
        "copy_gb_s": round(2 * a.nbytes / best / 1e9, 1),
        "kernel": os.uname().release,
        "loadavg_at_end": os.getloadavg(),
    },
    __import__("sys").stdout,
)
PY

# --- summary -----------------------------------------------------------------------
python3 - "$RAW" "$OUT" "$RUNS" "$VARIANTS" "$THREADS" "$LLAMA_CPP_PYTHON_VERSION" "$MODEL" "$KV_ACTS" <<'PY'
import json, re, statistics, sys
from pathlib import Path

raw, out, runs, variants, threads, version, model, acts = sys.argv[1:]
raw, out, runs, variants, threads = Path(raw), Path(out), int(runs), variants.split(), int(threads)
kvs = [f"kvcore-{a}" for a in acts.split()]
MIB = 1024 * 1024

def load(name):
    return json.loads((raw / f"{name}.json").read_text())

def rss(name):
    """Peak RSS in bytes from /usr/bin/time -v (it reports KiB)."""
    text = (raw / f"{name}.time").read_text()
    return int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) * 1024

def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}

systems = kvs + [f"llama-{v}" for v in variants]
gen, chat = {}, {}
agree = {}
for s in systems:
    docs = [load(f"gen-{s}-{r}") for r in range(1, runs + 1)]
    gen[s] = {
        "prefill_tok_s": spread([d["stats"]["prefill_tok_s"] for d in docs]),
        "decode_tok_s": spread([d["stats"]["decode_tok_s"] for d in docs]),
        "ttft_ms": spread([d["stats"]["ttft_ms"] for d in docs]),
        "peak_rss_mib": spread([rss(f"gen-{s}-{r}") / MIB for r in range(1, runs + 1)]),
    }
    toks = docs[0]["tokens"]
    if s != kvs[0]:
        k = load(f"gen-{kvs[0]}-1")["tokens"]
        agree[s] = next((i for i, (a, b) in enumerate(zip(k, toks)) if a != b), min(len(k), len(toks)))
chat_names = {"kvcore --kv grow": "chat-kvcore-grow", "kvcore --kv dense": "chat-kvcore-dense"}
for v in variants:
    chat_names[f"llama.cpp {v}"] = f"chat-llama-{v}"
    chat_names[f"python + import llama_cpp ({v})"] = f"import-llama-{v}"
for label, stem in chat_names.items():
    chat[label] = spread([rss(f"{stem}-{r}") / MIB for r in range(1, runs + 1)])
kv_stats = load("chat-kvcore-grow-1")["stats"]
kv_stats_dense = load("chat-kvcore-dense-1")["stats"]
bench = load("bench-kvcore")
for v in variants:
    for t in sorted({1, threads}):
        for row in load(f"bench-llama-{v}-t{t}"):
            row["backend"] = f"llama.cpp {v}"
            bench.append(row)

lines = []
p = lines.append
first = load(f"gen-{kvs[0]}-1")["stats"]
p(f"## generate: {first['prompt_token_count']}-token prompt, "
  f"{first['generated_token_count']} generated, {threads} threads, medians of {runs} alternating runs\n")
p("| figure | kvcore activations | kvcore | " + " | ".join(f"llama.cpp {v} | kvcore/llama.cpp {v}" for v in variants) + " |")
p("|---|---|---:|" + "---:|---:|" * len(variants))
for key, name, better in [
    ("prefill_tok_s", "prefill tok/s", "higher"),
    ("decode_tok_s", "decode tok/s", "higher"),
    ("ttft_ms", "time to first token (ms)", "lower"),
    ("peak_rss_mib", "peak RSS (MiB)", "lower"),
]:
    for s in kvs:
        k = gen[s][key]["median"]
        cells = []
        for v in variants:
            l = gen[f"llama-{v}"][key]["median"]
            cells.append(f"{l:.1f} | {k / l:.2f}x")
        p(f"| {name} ({better} is better) | {s[len('kvcore-'):]} | {k:.1f} | " + " | ".join(cells) + " |")
p("")
p("min–max: " + "; ".join(
    f"{s} " + ", ".join(f"{key} {gen[s][key]['min']:.1f}–{gen[s][key]['max']:.1f}" for key in gen[s])
    for s in systems))
p("llama.cpp re-tokenizes kvcore's prompt ids (generate, chat) to the same ids: " + ", ".join(
    f"{v} {load(f'gen-llama-{v}-1')['stats']['prompt_roundtrip_ok']}, {load(f'chat-llama-{v}-1')['stats']['prompt_roundtrip_ok']}"
    for v in variants))
p(f"greedy tokens identical to {kvs[0]}'s for the first: " + ", ".join(f"{s} {n}" for s, n in agree.items()))
p("")
p(f"## peak RSS of a 16-token chat (MiB, medians of {runs})\n")
p("| process | median | min–max |")
p("|---|---:|---:|")
for label, r in chat.items():
    p(f"| {label} | {r['median']:.1f} | {r['min']:.1f}–{r['max']:.1f} |")
p("")
p(f"kvcore KV bytes in that chat: grow {kv_stats['kv_bytes'] / MIB:.2f} MiB ({kv_stats['kv_capacity']} positions), "
  f"dense {kv_stats_dense['kv_bytes'] / MIB:.2f} MiB ({kv_stats_dense['kv_capacity']} positions)")
p("")
p(f"## bench (tokens/s, median of {runs} after a warm-up)\n")
p("| backend | threads | activations | test | median | min–max |")
p("|---|---:|---|---|---:|---:|")
for r in bench:
    p(f"| {r['backend']} | {r['threads']} | {r.get('activations', 'q8')} | {r['test']} | {r['median_tok_s']:.1f} | {r['min_tok_s']:.1f}–{r['max_tok_s']:.1f} |")
summary = "\n".join(lines)
print(summary)
(out / "summary.md").write_text(summary + "\n")

machine = load("machine")
(out / "results.json").write_text(json.dumps({
    "machine": machine, "llama_cpp_python": version, "model": model, "threads": threads, "runs": runs,
    "generate": gen, "tokens_agree": agree, "chat_peak_rss_mib": chat, "bench": bench,
    "llama_system_info": {v: load(f"gen-llama-{v}-1")["stats"]["system_info"] for v in variants},
}, indent=1))

def bars(test):
    out = []
    for r in bench:
        if r["test"] != test:
            continue
        kv = not r["backend"].startswith("llama.cpp")
        acts = f" {r['activations']}" if kv else ""
        out.append({"label": f"{'kvcore ' if kv else ''}{r['backend']}{acts} ×{r['threads']}",
                    "system": "kvcore" if kv else "llama.cpp",
                    "median": r["median_tok_s"], "min": r["min_tok_s"], "max": r["max_tok_s"]})
    return out

tg = next(r["test"] for r in bench if r["test"].startswith("tg"))
pp = next(r["test"] for r in bench if r["test"].startswith("pp"))
(out / "charts.json").write_text(json.dumps({
    "chat_peak_rss_mib": [
        {"label": label, "system": "kvcore" if label.startswith("kvcore") else "llama.cpp",
         "median": r["median"], "min": r["min"], "max": r["max"]}
        for label, r in chat.items() if not label.startswith("python")],
    "decode_tok_s": bars(tg),
    "prefill_tok_s": bars(pp),
}, indent=1))
PY

if [ "$CHARTS" = 1 ]; then
    log "charts"
    (cd "$ROOT" && nice -n 10 cargo run --release -q -p kvcore-cli --example bench_charts -- \
        "$OUT/charts.json" "$ROOT/docs" "$MODEL")
fi
log "done: $OUT/summary.md, $OUT/results.json"
