#!/usr/bin/env bash
# Runs one cargo-fuzz target for a fixed time and fails on any crash.
#
# Usage: .ci/fuzz.sh TARGET SECONDS
#
# Installs cargo-fuzz if it is missing (needs the nightly toolchain). The committed seed
# corpus fuzz/corpus/TARGET is copied to a scratch directory first, so the inputs
# libFuzzer adds never pile up in the repository; crashes are written to
# fuzz/artifacts/TARGET (git-ignored). Prints libFuzzer's final stats, including the
# number of executions.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 TARGET SECONDS" >&2
    exit 2
fi
target=$1
seconds=$2
fuzz_dir="$(cd "$(dirname "$0")/../fuzz" && pwd)"

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/corpus"
if [[ -d "$fuzz_dir/corpus/$target" ]]; then
    cp -R "$fuzz_dir/corpus/$target/." "$scratch/corpus/"
fi

cd "$fuzz_dir"
status=0
cargo +nightly fuzz run "$target" "$scratch/corpus" -- \
    -max_total_time="$seconds" -print_final_stats=1 2>&1 | tee "$scratch/log" || status=$?

echo "--- fuzz $target: $seconds s, $(ls "$scratch/corpus" | wc -l) corpus inputs at the end"
grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
    "$scratch/log" || true
if [[ $status -ne 0 ]]; then
    echo "fuzz $target FAILED (exit $status); crash inputs, if any, are in $fuzz_dir/artifacts/$target" >&2
fi
exit "$status"
