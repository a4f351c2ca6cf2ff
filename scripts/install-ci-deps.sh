#!/usr/bin/env bash
# System packages the build and the tests need. Idempotent; run as root (CI runs as root).
set -euo pipefail
need=()
for pkg in pkg-config ca-certificates curl; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
fi
