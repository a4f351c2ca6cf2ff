#!/usr/bin/env bash
# The Python package's GPU tests on a host with a CUDA GPU and torch, from artifacts built on
# another machine (the GPU host needs no Rust toolchain and no network):
#   scripts/gpu-check.sh build    # here: .gpu/ with a stripped release yutu-server and wheel
#   scripts/gpu-check.sh run      # there: installs the wheel beside the host's torch, runs
#                                 # test_gpu.py (test_real_gpu_* need the GPU) and the Mooncake
#                                 # API tests against a local node
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    rm -rf .gpu && mkdir -p .gpu
    cargo build --release -p yutu-server -p yutu-client --bin yutu-server --bin yutu
    cp target/release/yutu-server target/release/yutu .gpu/
    strip .gpu/yutu-server .gpu/yutu
    maturin=${MATURIN:-.venv-py/bin/maturin}
    "$maturin" build --release --strip -m client/python/Cargo.toml -o .gpu
    ls -la .gpu
    ;;
run)
    nvidia-smi -L
    site=/tmp/yutu-site
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu/*.whl
    export PYTHONPATH="$site" YUTU_BIN_DIR="$PWD/.gpu" PYTHONUNBUFFERED=1
    # The opt-in import hook needs a site directory (.pth files are not read from
    # PYTHONPATH): its test runs in CI.
    python3 -m pytest -q -p no:cacheprovider -rs client/python/tests/test_gpu.py \
        client/python/tests/test_mooncake_api.py -k "not hook"
    ;;
*)
    echo "usage: scripts/gpu-check.sh build|run" >&2
    exit 2
    ;;
esac
