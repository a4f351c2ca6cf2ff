"""Fixtures for the S3 compatibility tests: a real yutu-server with two users.

The server binary comes from target/debug (or $YUTU_BIN_DIR); `scripts/test.sh` builds it.
Each test module gets a fresh server on an ephemeral loopback port.
"""

import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import boto3
from botocore import UNSIGNED
import pytest
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[2]
ALICE = ("AKIAALICE0000000001", "alice-secret-key-00000000000000000000")
BOB = ("AKIABOB00000000000002", "bob-secret-key-000000000000000000000000")


def server_bin():
    d = os.environ.get("YUTU_BIN_DIR")
    # Where cargo put it: CARGO_TARGET_DIR when set (as cargo itself honours it).
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    path = Path(d) / "yutu-server" if d else target / "debug" / "yutu-server"
    assert path.exists(), f"{path} is missing: run `cargo build --workspace --bins` first"
    return str(path)


class Server:
    def __init__(self, extra_config=""):
        self.dir = tempfile.TemporaryDirectory(prefix="yutu-s3compat-")
        cfg = Path(self.dir.name) / "yutu.toml"
        cfg.write_text(
            f"""
listen = "127.0.0.1:0"
memory = "512MiB"
shards = 2
multipart_timeout_secs = 3600
nvme_capacity = "256MiB"
{extra_config}

[[users]]
name = "alice"
access_key = "{ALICE[0]}"
secret_key = "{ALICE[1]}"

[[users]]
name = "bob"
access_key = "{BOB[0]}"
secret_key = "{BOB[1]}"
read = ["shared-*", "alice-shared"]
"""
        )
        self.cfg = cfg
        self._start()

    def _start(self):
        cfg = self.cfg
        self.proc = subprocess.Popen(
            [server_bin(), "--config", str(cfg), "--data-dir", str(Path(self.dir.name) / "data")],
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

    def client(self, creds=ALICE, **config):
        return boto3.client(
            "s3",
            endpoint_url=config.pop("endpoint_url", self.url),
            region_name="us-east-1",
            aws_access_key_id=creds[0],
            aws_secret_access_key=creds[1],
            config=Config(**config) if config else None,
        )

    def anonymous(self):
        """A boto3 client that signs nothing, as a browser or plain curl asks."""
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED),
        )

    def restart(self):
        """Kills the node and starts it again on the same data directory (on a new port)."""
        self.proc.kill()
        self.proc.wait()
        self._start()

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.dir.cleanup()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def s3(server):
    return server.client()


_counter = [0]


def fresh_bucket(s3, prefix="t", **create):
    """Creates a bucket of a name no other test uses (`create`: CreateBucket's arguments)."""
    _counter[0] += 1
    name = f"{prefix}{int(time.time() * 1000) % 10**9}-{_counter[0]}"
    s3.create_bucket(Bucket=name, **create)
    return name


@pytest.fixture
def bucket(s3):
    """A fresh bucket owned by alice."""
    return fresh_bucket(s3)
