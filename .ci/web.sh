#!/usr/bin/env bash
# The web page (web/): builds kvcore_web.wasm for wasm32-unknown-unknown (SIMD128, Debian's
# rustc-web with build-std: see .ci/wasm/env.sh), then drives the page in headless
# Chromium with Selenium (web/tests/page_test.py): it loads the SmolLM2 GGUF, types the
# reference chat prompt and waits for the reference's greedy continuation, saves
# docs/web.png and prints the page's tok/s as a JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."

# rust-web-llvm holds /usr/bin/rust-lld (the wasm linker, a link to lld-22): rustc-web
# 1.96.0+dfsg1-1~deb12u2 only recommends it, and recommendations are not installed.
packages=(rustc-web cargo-web rust-web-src rust-web-llvm lld-22 llvm-22 chromium chromium-driver python3-venv)
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

# The model file, where the CLI resolves `smollm2` ($KVCORE_MODEL, else the cache,
# fetched on first use).
bash .ci/build-native.sh
model="$(target/release/kvcore info smollm2 | sed -n 's/^file: //p')"
[[ -f "$model" ]] || { echo "web: no SmolLM2 model file (kvcore info smollm2)" >&2; exit 1; }

(
    # shellcheck source=wasm/env.sh
    . .ci/wasm/env.sh simd
    echo "=== wasm32-unknown-unknown, simd: $("$RUSTC" --version)"
    wcargo build --release --target wasm32-unknown-unknown -p kvcore-web
)
# The wasm builds have no line tables (.ci/wasm/env.sh); strip any DWARF left from the
# standard library's objects: the page gets the module with its function names kept for
# stack traces.
built=target/wasm-simd/wasm32-unknown-unknown/release/kvcore_web.wasm
wasm=target/web/kvcore_web.wasm
mkdir -p target/web
/usr/lib/llvm-22/bin/llvm-strip --strip-debug "$built" -o "$wasm"
echo "=== kvcore_web.wasm: $(stat -c %s "$wasm") bytes"

venv=target/ci-web-venv
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
# 4.50.0: the newest whose dependencies (certifi) the package index here has.
"$venv/bin/python" -m pip install -q --disable-pip-version-check selenium==4.50.0

echo "=== web page in headless $(chromium --version 2>/dev/null | head -1)"
"$venv/bin/python" web/tests/page_test.py --wasm "$wasm" --model "$model" "$@"
