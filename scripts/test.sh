#!/usr/bin/env bash
# Runs every test: unit tests of each crate, the end-to-end tests (which start the real
# binaries on loopback), the S3 compatibility tests with real clients (boto3, aws-cli,
# s3cmd, rclone, curl), and the Python package's tests (built and installed with pip, as a
# user would). Installs the test dependencies first if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
cargo build --workspace --bins
cargo nextest run --workspace --no-fail-fast "$@"
.venv-s3/bin/python -m pytest -q -p no:cacheprovider tests/s3compat
# `pip install ./client/python`, with the dev profile: the crates are already built by the
# `cargo build` above, so this only links the extension.
# maturin runs from PATH inside pip.
# The distribution was named `yutu` before (a name PyPI gives to another project).
.venv-py/bin/pip uninstall -q -y yutu >/dev/null 2>&1 || true
PATH="$PWD/.venv-py/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" .venv-py/bin/pip install -q --no-build-isolation --no-deps \
    --force-reinstall ./client/python
.venv-py/bin/python -m pytest -q -p no:cacheprovider --ignore=client/python/tests/engines client/python/tests
# The engines' own code (SGLang, LMCache, vLLM) against a real node, in their own venv, with
# the engines' `import mooncake.store` resolved to Yutu's by the opt-in hook.
scripts/install-engine-deps.sh
PATH="$PWD/.venv-engines/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" .venv-engines/bin/pip install -q --no-build-isolation \
    --no-deps --force-reinstall ./client/python
YUTU_MOONCAKE=1 .venv-engines/bin/python -m pytest -q -p no:cacheprovider client/python/tests/engines
