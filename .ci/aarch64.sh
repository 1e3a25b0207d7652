#!/usr/bin/env bash
# Cross-compiles kvcore-simd's `simd_paths` test for aarch64 and runs it under qemu-user,
# so the NEON kernels are checked against the scalar reference on this x86_64 machine.
#
# Usage: .ci/aarch64.sh        (as root on Debian 12; installs what is missing)
#
# Recipe: shared/docs/aarch64.md. Debian's rustc (`rustc-web`, with the arm64 standard
# library) builds the test while rustup's cargo drives it; qemu-aarch64-static runs it.
# The test binary uses no threads (they hang under this qemu) and prints
# `simd: N passed, M failed`; this script fails unless the run passes and reports the
# NEON path. Build output goes to target/aarch64, apart from the host build.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. .ci/lib.sh

packages=(rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    qemu-user-static)
install_missing "${packages[@]}"

export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export CARGO_TARGET_DIR=target/aarch64
echo "=== $("$RUSTC" --version), target aarch64-unknown-linux-gnu"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --target aarch64-unknown-linux-gnu -p kvcore-simd --test simd_paths 2>&1 \
    | tee "$log" || status=$?

if [[ $status -ne 0 ]]; then
    echo "aarch64: simd_paths FAILED (exit $status)" >&2
    exit "$status"
fi
if ! grep -q -- "--- path Neon" "$log"; then
    echo "aarch64: the NEON path did not run" >&2
    exit 1
fi
grep -E '^simd: [0-9]+ passed, 0 failed$' "$log" >/dev/null || {
    echo "aarch64: no passing summary line" >&2
    exit 1
}
echo "aarch64: NEON path passed"
