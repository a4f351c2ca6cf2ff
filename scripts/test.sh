#!/usr/bin/env bash
# Runs every test: unit tests of each crate, the end-to-end tests (which start the real
# binaries on loopback), and the S3 compatibility tests with real clients (boto3, aws-cli,
# s3cmd, rclone, curl). Installs the test dependencies first if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
cargo build --workspace --bins
cargo nextest run --workspace --no-fail-fast "$@"
.venv-s3/bin/python -m pytest -q -p no:cacheprovider tests/s3compat
