#!/usr/bin/env bash
# The web page (web/): builds kvcore_web.wasm and kvcore_web_relaxed.wasm for
# wasm32-unknown-unknown (SIMD128, and SIMD128 with relaxed SIMD; Debian's rustc-web with
# build-std: see .ci/wasm/env.sh), then drives the page in headless
# Chromium with Selenium (web/tests/page_test.py): it loads the SmolLM2 GGUF, types the
# reference chat prompt and waits for the reference's greedy continuation, saves
# docs/web.png and prints the page's tok/s as a JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. .ci/lib.sh

# rust-web-llvm holds /usr/bin/rust-lld (the wasm linker, a link to lld-22): rustc-web
# 1.96.0+dfsg1-1~deb12u2 only recommends it, and recommendations are not installed.
packages=(rustc-web cargo-web rust-web-src rust-web-llvm lld-22 llvm-22 chromium chromium-driver python3-venv)
install_missing "${packages[@]}"

# The model file, where the CLI resolves `smollm2` ($KVCORE_MODEL, else the cache,
# fetched on first use).
bash .ci/build-native.sh
model="$(target/release/kvcore info smollm2 | sed -n 's/^file: //p')"
[[ -f "$model" ]] || { echo "web: no SmolLM2 model file (kvcore info smollm2)" >&2; exit 1; }

# Two modules: SIMD128 (every browser with SIMD), and SIMD128 with relaxed SIMD (Chrome
# 114+: the integer dots of 8-bit activations), which the worker takes where it validates.
mkdir -p target/web
for mode in simd relaxed; do
    (
        # shellcheck source=wasm/env.sh
        . .ci/wasm/env.sh "$mode"
        echo "=== wasm32-unknown-unknown, $mode: $("$RUSTC" --version)"
        wcargo build --release --target wasm32-unknown-unknown -p kvcore-web
    )
    # The wasm builds have no line tables (.ci/wasm/env.sh); strip any DWARF left from
    # the standard library's objects: the page gets the module with its function names
    # kept for stack traces.
    built="target/wasm-$mode/wasm32-unknown-unknown/release/kvcore_web.wasm"
    out=target/web/kvcore_web.wasm
    if [[ $mode == relaxed ]]; then out=target/web/kvcore_web_relaxed.wasm; fi
    /usr/lib/llvm-22/bin/llvm-strip --strip-debug "$built" -o "$out"
    echo "=== $(basename "$out"): $(stat -c %s "$out") bytes"
done

venv=target/ci-web-venv
make_venv "$venv"
# 4.50.0: the newest whose dependencies (certifi) the package index here has.
"$venv/bin/python" -m pip install -q --disable-pip-version-check selenium==4.50.0

echo "=== web page in headless $(chromium --version 2>/dev/null | head -1)"
"$venv/bin/python" web/tests/page_test.py --wasm target/web/kvcore_web.wasm \
    --wasm-relaxed target/web/kvcore_web_relaxed.wasm --model "$model" "$@"
