#!/usr/bin/env bash
# Installs what `yutu-bench` needs besides the Rust toolchain, from Debian's packages:
#   fio, the reference of the nvme suite;
#   linux-perf: `perf record` for benches/python/node_profile.py --perf;
#   redis-server, redis-tools (redis-benchmark) and memcached: the 4 KiB references of the kv
#   suite. The bench starts its own servers on free loopback ports; the system services are
#   neither needed nor started here.
#   nginx, built with http_dav_module: the HTTP reference of the s3 suite (static files for
#   GET, WebDAV for PUT). The bench starts its own nginx with its own config; the system
#   service is neither needed nor started here.
#   .venv-bench, a Python virtual environment for benches/python/mooncake_compare.py (Yutu's
#   drop-in MooncakeDistributedStore against the real Mooncake Store): the PyPI package
#   mooncake-transfer-engine-non-cuda (mooncake.store and the mooncake_master binary), numpy,
#   maturin, and Yutu's own package from ./client/python. Mooncake's native libraries link
#   libibverbs, librdmacm and libnuma even when only TCP is used, so those come from Debian.
#
# Idempotent: does nothing (not even `apt-get update`) when everything is already there, except
# that Yutu's Python package is rebuilt and reinstalled on every run (see below).
# Usage: scripts/install-bench-deps.sh   (as root, or with sudo available)
#        BENCH_VENV=DIR puts the virtual environment somewhere other than ./.venv-bench.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH_VENV="${BENCH_VENV:-$ROOT/.venv-bench}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-bench-deps: run as root (or install sudo)" >&2
        exit 1
    fi
fi

find_nginx() {
    command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true
}

nginx_has_dav() {
    local bin
    bin="$(find_nginx)"
    [ -n "$bin" ] && "$bin" -V 2>&1 | grep -q -- 'http_dav_module'
}

# fio: the reference of the nvme suite (O_DIRECT io_uring on the same file system).
if ! command -v fio >/dev/null 2>&1; then
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y fio
fi

# perf: what benches/python/node_profile.py --perf records the node with.
if ! command -v perf >/dev/null 2>&1; then
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y linux-perf
fi

# etcd: the cluster suite's membership store (Debian's etcd-server; its service is not
# started, the suite runs its own on free ports).
if ! command -v etcd >/dev/null 2>&1; then
    ETCD_POLICY=/usr/sbin/policy-rc.d
    ETCD_POLICY_OURS=""
    if [ ! -e "$ETCD_POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$ETCD_POLICY" >/dev/null
        $SUDO chmod 755 "$ETCD_POLICY"
        ETCD_POLICY_OURS=1
    fi
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server
    if [ -n "$ETCD_POLICY_OURS" ]; then
        $SUDO rm -f "$ETCD_POLICY"
    fi
fi

# redis-server, redis-benchmark, memcached: the kv suite's 4 KiB references. Service starts are
# denied for the install (policy-rc.d, unless one exists) so no system redis/memcached stays up.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1 \
    || ! command -v memcached >/dev/null 2>&1; then
    KV_POLICY=/usr/sbin/policy-rc.d
    KV_POLICY_OURS=""
    if [ ! -e "$KV_POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$KV_POLICY" >/dev/null
        $SUDO chmod 755 "$KV_POLICY"
        KV_POLICY_OURS=1
    fi
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server redis-tools memcached \
        || echo "install-bench-deps: redis/memcached not installed; the kv suite's 4 KiB case will have no reference" >&2
    if [ -n "$KV_POLICY_OURS" ]; then
        $SUDO rm -f "$KV_POLICY"
    fi
fi

# nginx with WebDAV, the s3 suite's reference. A function whose status the script exits with at
# the end, so that a missing nginx does not stop the steps after it.
install_nginx() {
    if nginx_has_dav; then
        echo "install-bench-deps: nginx with http_dav_module already installed ($(find_nginx))"
        return 0
    fi

    # Installing nginx normally starts the system service on port 80; the bench needs none of it.
    # Deny service starts for the duration of the install, unless a policy is already in place.
    POLICY=/usr/sbin/policy-rc.d
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
        $SUDO chmod 755 "$POLICY"
        trap '$SUDO rm -f "$POLICY"' EXIT
    fi

    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update
    # Debian 12 and later build WebDAV into the `nginx` package itself; older releases ship it in
    # nginx-light/nginx-core/nginx-full, so fall back to the flavours that have it.
    for pkg in nginx nginx-full nginx-extras; do
        if apt-cache show "$pkg" >/dev/null 2>&1; then
            $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "$pkg"
            if nginx_has_dav; then
                echo "install-bench-deps: installed $pkg ($(find_nginx)) with http_dav_module"
                return 0
            fi
        fi
    done

    echo "install-bench-deps: no installable nginx with http_dav_module; the s3 suite's PUT cases will have no reference" >&2
    return 1
}

nginx_status=0
install_nginx || nginx_status=$?

# .venv-bench for benches/python/mooncake_compare.py. The Debian libraries first: without them
# `import mooncake.store` fails with a dynamic-linker error, long after the install looked fine.
bench_libs=()
for pkg in libibverbs1 librdmacm1 libnuma1 python3-venv; do
    dpkg -s "$pkg" >/dev/null 2>&1 || bench_libs+=("$pkg")
done
if [ ${#bench_libs[@]} -gt 0 ]; then
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${bench_libs[@]}"
fi
if [ ! -x "$BENCH_VENV/bin/python" ]; then
    python3 -m venv "$BENCH_VENV"
fi
# The PyPI packages only when something is missing: importing them is the test, since a
# half-finished earlier install can leave the directory without a working package.
if ! "$BENCH_VENV/bin/python" -c 'import mooncake.store, numpy' >/dev/null 2>&1 \
    || [ ! -x "$BENCH_VENV/bin/maturin" ] || [ ! -x "$BENCH_VENV/bin/mooncake_master" ]; then
    "$BENCH_VENV/bin/pip" install -q --upgrade pip
    "$BENCH_VENV/bin/pip" install -q --upgrade mooncake-transfer-engine-non-cuda numpy maturin
fi
# Yutu's package, rebuilt on every run: its sources change with the tree, and a stale build
# would benchmark old code. Built with the venv's maturin (no build isolation, so nothing is
# fetched) in release mode, the way a user's `pip install ./client/python` builds it. A failed
# build stops this script (set -e): a bench run without Yutu's side must not look like success.
echo "install-bench-deps: building Yutu's Python package into $BENCH_VENV (cargo, release)"
(cd "$ROOT" && PATH="$BENCH_VENV/bin:$PATH" "$BENCH_VENV/bin/pip" install -q --no-build-isolation \
    --no-deps --force-reinstall ./client/python)
"$BENCH_VENV/bin/python" -c 'import yutu.mooncake, mooncake.store' \
    || { echo "install-bench-deps: $BENCH_VENV cannot import yutu.mooncake and mooncake.store" >&2; exit 1; }
echo "install-bench-deps: $BENCH_VENV ready (mooncake $("$BENCH_VENV/bin/pip" show mooncake-transfer-engine-non-cuda 2>/dev/null | sed -n 's/^Version: //p'), yutu from ./client/python)"

exit "$nginx_status"
