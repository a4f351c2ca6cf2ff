#!/usr/bin/env bash
# Runs every test: unit tests of each crate and the end-to-end tests, which start the real
# binaries on loopback (so the binaries are built first).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins
cargo nextest run --workspace --no-fail-fast "$@"
