#!/usr/bin/env bash
# Runs the kernels under AddressSanitizer: the backend conformance suite
# (kvcore-test-support's `conformance`, instantiated in tests/conformance.rs for scalar,
# simd and rayon), the simd crate's and the C ABI's tests, on nightly.
#
# Usage: .ci/asan.sh
#
# Recipe: `-Zsanitizer=address` with an explicit `--target`, so RUSTFLAGS reach only the
# target crates and not build scripts or proc macros (which would fail to load). The
# standard library is not rebuilt (no -Zbuild-std): ASan still checks every access that
# kvcore's own code and its kernels make. Doctests are skipped (--lib --tests). A
# separate target dir (target/asan) keeps the instrumented build apart from the normal
# one. Any ASan report aborts the test binary, so the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."

host=x86_64-unknown-linux-gnu
export RUSTFLAGS="-Zsanitizer=address"
export CARGO_TARGET_DIR=target/asan
# allocator_may_return_null: an allocation too large for ASan returns null, as malloc
# does, so the tests that ask for absurd sizes see their `try_reserve` errors.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
# One cargo invocation for the three crates: separate ones resolved features per crate
# and rebuilt the shared dependencies each time (about 2 of 6 minutes on 2 cores).
# - kvcore: the conformance suite and the unit tests;
# - kvcore-simd: simd_paths runs every kernel on each path the CPU has (AVX2+FMA and
#   scalar), and its unit tests;
# - kvcore-capi: the C ABI's boundary code (pointer reads, buffers, handles) driven on
#   the real model (abi), and its unit tests.
cargo +nightly test --target "$host" -p kvcore -p kvcore-simd -p kvcore-capi \
    --lib --test conformance --test simd_paths --test abi
