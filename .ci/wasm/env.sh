# Source this to build kvcore for wasm32 with Debian's rustc-web (see ../shared/docs and
# README "Platforms"): `. .ci/wasm/env.sh [simd|relaxed|nosimd]`, then `wcargo build …`.
# rustup's toolchain has no wasm32 target here; Debian's rustc 1.96 builds std from
# rust-web-src with -Z build-std. The target dir depends on the SIMD choice, because a
# change of flags rebuilds std.
W="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:-simd}"
case "$mode" in
  simd) feat="-C target-feature=+simd128" ;;
  nosimd) feat="-C target-feature=-simd128" ;;
  # SIMD128 and the relaxed-SIMD proposal (Chrome 114+, wasmtime; Node 20 behind
  # --experimental-wasm-relaxed-simd): the integer dots of the 4- and 5-bit formats.
  relaxed) feat="-C target-feature=+simd128,+relaxed-simd" ;;
  *) echo "env.sh: simd, relaxed or nosimd, not $mode" >&2; return 2 ;;
esac
[ -f "$W/pthread_stubs.o" ] && [ "$W/pthread_stubs.o" -nt "$W/pthread_stubs.s" ] ||
  /usr/lib/llvm-22/bin/llvm-mc -triple=wasm32-wasi -filetype=obj "$W/pthread_stubs.s" -o "$W/pthread_stubs.o"
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1
WASI="$feat -C link-self-contained=no -L native=/usr/lib/wasm32-wasi -C link-arg=/usr/lib/wasm32-wasi/crt1-command.o -C link-arg=$W/pthread_stubs.o"
export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="$WASI" RUSTDOCFLAGS="$WASI"
# getrandom (the engine's prefix-cache key) has no browser backend without wasm-bindgen:
# the "custom" one calls __getrandom_v03_custom, which kvcore-web defines.
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="$feat --cfg getrandom_backend=\"custom\""
# wasmtime (PyPI) runs the test modules: run-wasi.py; its virtual environment is made on
# first use.
_wasm_venv="$(cd "$W/../.." && pwd)/target/wasm-venv"
if [ ! -x "$_wasm_venv/bin/python" ] || ! "$_wasm_venv/bin/python" -c "import wasmtime" 2>/dev/null; then
  python3 -m venv "$_wasm_venv" && "$_wasm_venv/bin/python" -m pip install -q --disable-pip-version-check wasmtime==50.0.1
fi
export CARGO_TARGET_WASM32_WASIP1_RUNNER="$_wasm_venv/bin/python $W/run-wasi.py"
export CARGO_TARGET_DIR="$(cd "$W/../.." && pwd)/target/wasm-$mode"
unset RUSTFLAGS
# No line tables in the wasm builds (the native release profile keeps them for perf):
# nothing reads them on wasm, and leaving them out saved ~25 s of each mode's build in
# .ci/wasm.sh on 2 cores (3m03 → 2m40).
export CARGO_PROFILE_RELEASE_DEBUG=false
wcargo() { /usr/bin/cargo "$1" -Z build-std=std,panic_abort "${@:2}"; }
