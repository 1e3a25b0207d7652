#!/usr/bin/env bash
# Same-run A/B of two kvcore binaries (e.g. main's and a branch's `cargo build --release
# -p kvcore-cli`), alternating base and new twice per setting, on both x86 kernel paths
# where the CPU has them. Prints one line per run: setting, binary, test=median tok/s.
#
# Usage: BASE=/path/to/kvcore-base NEW=/path/to/kvcore-new bash benches/ab.sh
#        KERNELS="avx2" to measure one path; ROUNDS=3 for more alternations;
#        DEPTH=4096 for the deep decode settings (default 2048).
set -euo pipefail
: "${BASE:?set BASE to the base binary}" "${NEW:?set NEW to the new binary}"
kernels=${KERNELS:-avx2 avx512}
rounds=${ROUNDS:-2}
depth=${DEPTH:-2048}

run() { # label, bench arguments
    local label=$1
    shift
    for ((r = 1; r <= rounds; r++)); do
        for bin in "$BASE" "$NEW"; do
            "$bin" bench "$@" --json 2>/dev/null | python3 -c '
import json, sys
rows = json.load(sys.stdin)
print(sys.argv[1], " ".join("%s=%.2f" % (r["test"].replace(" ", ""), r["median_tok_s"]) for r in rows))
' "$label $(basename "$bin") r$r"
        done
    done
}

for k in $kernels; do
    common=(--backend rayon -t 2 --kernels "$k" -r 3)
    run "smollm2-$k-f32" smollm2 "${common[@]}" -p 512 -n 32 -d 16
    run "smollm2-$k-q8act" smollm2 "${common[@]}" --activations q8 -p 64 -n 32 -d 16
    run "gemma3-$k-f32" gemma3 "${common[@]}" -p 64 -n 16 -d 16
    run "smollm2-$k-batch8" smollm2 "${common[@]}" -p 16 -n 16 -s 8 -d 16
    run "smollm2-$k-f32kv-deep" smollm2 "${common[@]}" -p 16 -n 16 -d "$depth"
    run "smollm2-$k-q8kv-deep" smollm2 "${common[@]}" --kv-type q8_0 -p 16 -n 16 -d "$depth"
done
