#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20), starting from the seed inputs kept in
# the repository (fuzz/seeds/TARGET) and from what earlier runs found (fuzz/corpus/TARGET,
# not tracked). Needs cargo-fuzz; the stable toolchain is allowed the sanitizer flags with
# RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
    echo "== fuzz $target for ${seconds}s"
    mkdir -p "fuzz/corpus/$target"
    seeds=()
    [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
    cargo fuzz run "$target" "fuzz/corpus/$target" "${seeds[@]}" -- -max_total_time="$seconds" 2>&1 | grep -E '^(Done|SUMMARY)|panicked' || true
    # libFuzzer writes an artifact only when a target fails.
    if compgen -G "fuzz/artifacts/$target/*" >/dev/null; then
        echo "fuzz target $target failed; inputs in fuzz/artifacts/$target" >&2
        exit 1
    fi
done
