#!/usr/bin/env bash
# kvcore's KV element types beside llama.cpp's caches, decode and prefill at depth, in one
# run, alternating: kvcore, llama.cpp (f16 cache, flash attention off; f16 on; q8_0 K and
# V on), kvcore again. Writes one JSON file per run to OUT (default /tmp/kv-types-bench).
#
# Usage: benches/kv_types_vs_llamacpp.sh [MODEL.gguf] [OUT]
# DEPTHS (default 0,256,1024,4096,8000), PP (prompt test size, default 128: 8000 + PP
# must fit SmolLM2's 8192 positions), TG (default 32) and REPS (default 3) override the
# tests. CHART=path.svg then draws decode against depth from OUT
# (`cargo run --release --example depth_chart`).
# ACTS=q8 runs kvcore with 8-bit activations (llama.cpp's CPU matmuls always quantise
# theirs, to q8_1 blocks): ACTS=f32,q8 runs both in each kvcore run.
# Needs target/release/kvcore and the llama-cpp-python venv benches/compare_llamacpp.sh
# builds (~/.cache/kvcore/llama-cpp-venv-avx2). The current figures are in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-${KVCORE_MODEL:-$HOME/.cache/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf}}
out=${2:-/tmp/kv-types-bench}
py=${LLAMA_CPP_PYTHON:-$HOME/.cache/kvcore/llama-cpp-venv-avx2/bin/python}
mkdir -p "$out"
args=(-p "${PP:-128}" -n "${TG:-32}" -d "${DEPTHS:-0,256,1024,4096,8000}" -r "${REPS:-3}" -t 2)
acts=${ACTS:-f32}
target/release/kvcore bench "$model" "${args[@]}" --kv-type f32,f16,q8_0 --activations "$acts" --json > "$out/kvcore_a.json"
"$py" benches/llamacpp_driver.py bench "$model" "${args[@]}" -c 8192 > "$out/llamacpp_f16.json"
"$py" benches/llamacpp_driver.py bench "$model" "${args[@]}" -c 8192 --flash-attn on > "$out/llamacpp_f16_fa.json"
"$py" benches/llamacpp_driver.py bench "$model" "${args[@]}" -c 8192 --type-k q8_0 --type-v q8_0 --flash-attn on > "$out/llamacpp_q8_0_fa.json"
target/release/kvcore bench "$model" "${args[@]}" --kv-type f32,f16,q8_0 --activations "$acts" --json > "$out/kvcore_b.json"
echo "results in $out"
if [[ -n ${CHART:-} ]]; then
    cargo run -q --release -p kvcore-cli --example depth_chart -- "$out" "$CHART"
fi
