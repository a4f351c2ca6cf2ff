#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20), starting from the seed inputs kept in
# the repository (fuzz/seeds/TARGET) and from what earlier runs found (fuzz/corpus/TARGET,
# not tracked). Targets run JOBS at a time (default: one per core), each for its full
# SECONDS, so CI spends SECONDS x targets / cores. Needs cargo-fuzz; the stable toolchain is
# allowed the sanitizer flags with RUSTC_BOOTSTRAP=1. Fails if any target finds a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
jobs="${FUZZ_JOBS:-$(nproc)}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build
mkdir -p fuzz/logs

run_one() {
    local target=$1 seeds=()
    mkdir -p "fuzz/corpus/$target"
    [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
    cargo fuzz run "$target" "fuzz/corpus/$target" "${seeds[@]}" -- \
        -max_total_time="$seconds" >"fuzz/logs/$target.log" 2>&1 || true
    echo "== fuzz $target for ${seconds}s: $(grep -E '^Done' "fuzz/logs/$target.log" || echo 'no summary')"
}

running=0
for target in $(cargo fuzz list); do
    run_one "$target" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

failed=0
for target in $(cargo fuzz list); do
    # libFuzzer writes an artifact only when a target fails.
    if compgen -G "fuzz/artifacts/$target/*" >/dev/null; then
        echo "fuzz target $target failed; inputs in fuzz/artifacts/$target" >&2
        grep -E 'panicked|SUMMARY|ERROR' "fuzz/logs/$target.log" | head -5 >&2 || true
        failed=1
    fi
done
exit "$failed"
