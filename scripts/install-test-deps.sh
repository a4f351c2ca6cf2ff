#!/usr/bin/env bash
# What the test suite needs besides Rust: curl, rclone, etcd-server (the cluster tests'
# etcd) and chromium with chromium-driver (the browser test) from Debian, and three Python
# virtual environments (boto3 + pytest + selenium in .venv-s3;
# aws-cli v1 + s3cmd in .venv-cli, apart because aws-cli v1 pins an older botocore than the
# current boto3; maturin + pytest + numpy in .venv-py for the `yutu` Python package). Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in curl openssl rclone python3-venv pkg-config ca-certificates libibverbs-dev librdmacm-dev clang etcd-server chromium chromium-driver; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    # No package's service is started by the install (etcd-server's would take port 2379;
    # the tests run their own etcd on free ports).
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod 755 "$policy"
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
fi

venv() {
    local dir=$1 reqs=$2 stamp
    stamp="$dir/.requirements"
    if [ -x "$dir/bin/python" ] && cmp -s "$reqs" "$stamp"; then
        return
    fi
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip
    "$dir/bin/pip" install -q --upgrade -r "$reqs"
    cp "$reqs" "$stamp"
}
venv .venv-s3 tests/s3compat/requirements.txt
venv .venv-cli tests/s3compat/requirements-cli.txt
# The Python package's tests: maturin (its build backend, so pip builds it without fetching
# one each time), pytest and numpy.
venv .venv-py client/python/tests/requirements.txt
echo "test dependencies: $(.venv-s3/bin/python -c 'import boto3; print("boto3", boto3.__version__)'), $(.venv-cli/bin/aws --version 2>&1 | cut -d' ' -f1), $(.venv-cli/bin/s3cmd --version), $(rclone version | head -1)"
