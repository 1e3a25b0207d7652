#!/usr/bin/env bash
# The native release build that the other .ci scripts run from (target/release/kvcore,
# libkvcore_c.a, the examples): the targets of the test step (`cargo test --workspace
# --release`), so after it this only copies the C library out. A narrower selection
# (`cargo build -p kvcore-cli`, `cargo run --example`) resolves the dependencies'
# features without the dev-dependencies and rebuilt them all (1.5 min a time on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --workspace --lib --bins --tests --examples
