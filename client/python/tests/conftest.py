"""Fixtures for the Python package's tests: a real yutu-server, authentication on.

The server binary comes from target/debug (or $YUTU_BIN_DIR); `scripts/test.sh` builds it and
installs the package into the test virtual environment. Each test module gets a fresh node
on an ephemeral loopback port; its admin token (written by the node at its first start) is
what the tests connect with, and `token(...)` issues narrower ones with the `yutu` CLI.
"""

import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def bin_path(name):
    d = os.environ.get("YUTU_BIN_DIR")
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    path = Path(d) / name if d else target / "debug" / name
    assert path.exists(), f"{path} is missing: run `cargo build --workspace --bins` first"
    return str(path)


class Node:
    """A yutu-server with its own data directory, killed by stop()."""

    def __init__(self, memory="512MiB"):
        self.dir = tempfile.TemporaryDirectory(prefix="yutu-py-")
        self.data = Path(self.dir.name) / "data"
        self.proc = subprocess.Popen(
            [
                bin_path("yutu-server"),
                "--listen", "127.0.0.1:0",
                "--data-dir", str(self.data),
                "--memory", memory,
                "--shards", "2",
                "--nvme-capacity", "256MiB",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        found = threading.Event()
        self.port = None

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
                if m and not found.is_set():
                    self.port = int(m.group(1))
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(30):
            self.proc.kill()
            raise RuntimeError("yutu-server did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = (self.data / "auth" / "admin-token").read_text().strip()

    def token(self, sub, *buckets, ttl="1h"):
        """A token for `sub` with the given `NAME:rwdl` bucket grants."""
        args = [bin_path("yutu"), "token", "issue", "--data-dir", str(self.data),
                "--sub", sub, "--ttl", ttl]
        for b in buckets:
            args += ["--bucket", b]
        out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[-1]

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.dir.cleanup()


@pytest.fixture(scope="module")
def node():
    n = Node()
    yield n
    n.stop()


_counter = [0]


def fresh_bucket():
    _counter[0] += 1
    return f"py{int(time.time() * 1000) % 10**9}-{_counter[0]}"


@pytest.fixture
def bucket():
    return fresh_bucket()


@pytest.fixture
def store(node, bucket):
    import yutu

    s = yutu.Store(node.url, bucket=bucket, token=node.admin_token)
    yield s
    s.close()


def wait_until(cond, timeout=10.0, what="condition"):
    """Polls `cond` until it is true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
