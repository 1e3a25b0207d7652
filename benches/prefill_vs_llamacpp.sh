#!/usr/bin/env bash
# Prefill of a short and a long prompt from an empty cache, kvcore per KV type beside
# llama.cpp's caches, in one run, alternating: kvcore, llama.cpp (f16 cache, flash
# attention off; f16 on; q8_0 K and V on), kvcore again. Writes one JSON file per run to
# OUT (default /tmp/prefill-bench). The issue's goals: pp4096 ≥ 1.2× llama.cpp's best,
# and pp4096 ≥ 0.5 × pp256 (see BENCHMARKS.md).
#
# Usage: benches/prefill_vs_llamacpp.sh [MODEL.gguf] [OUT]
# PROMPTS (default 256,4096) and REPS (default 2) override the sizes and repetitions.
# Needs target/release/kvcore and the llama-cpp-python venv benches/compare_llamacpp.sh
# builds (~/.cache/kvcore/llama-cpp-venv-avx2).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-${KVCORE_MODEL:-$HOME/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf}}
out=${2:-/tmp/prefill-bench}
py=${LLAMA_CPP_PYTHON:-$HOME/.cache/kvcore/llama-cpp-venv-avx2/bin/python}
mkdir -p "$out"
args=(-p "${PROMPTS:-256,4096}" -n 1 -r "${REPS:-2}" -t 2)
kvcore() {
    target/release/kvcore bench "$model" "${args[@]}" --kv-type f32,f16,q8_0 --json > "$out/$1"
}
llama() {
    "$py" benches/llamacpp_driver.py bench "$model" "${args[@]}" -c 8192 "${@:2}" > "$out/$1"
}
kvcore kvcore_a.json
llama llamacpp_f16.json
llama llamacpp_f16_fa.json --flash-attn on
llama llamacpp_q8_0_fa.json --type-k q8_0 --type-v q8_0 --flash-attn on
kvcore kvcore_b.json
echo "results in $out"
