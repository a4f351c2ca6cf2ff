"""yutu.Store and yutu.mooncake against a real cluster: a real etcd and three real
`yutu-server` nodes on loopback, authentication on (a shared cluster key, an admin token
signed with it).

Where a block lives is checked on each node itself: an S3 request with the header
`x-yutu-forwarded` and a node token (`sub` starting with `node:`, admin) is answered from that
node's own copy, never forwarded to an owner.

Skipped when the `etcd` binary (Debian's etcd-server, or $YUTU_ETCD) is missing.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import yutu
from conftest import bin_path, fresh_bucket, wait_until
from yutu.mooncake import ErrorCode, MooncakeDistributedStore, ReplicateConfig, SoftPinAction

ETCD = shutil.which(os.environ.get("YUTU_ETCD", "etcd"))
if ETCD is None:
    pytest.skip("the etcd binary is missing (Debian's etcd-server, or $YUTU_ETCD): "
                "no cluster to test against", allow_module_level=True)

# A test cluster key (64 hex digits: the secret is these 64 bytes, as every node reads it).
KEY = "c1a5e7c1a55e7c1a55ee7c1a55ee7c1a55ee7c1a55ee7c1a55ee7c1a55ee5ee7"
BLOCK = 64 << 10
# A user of every node (SigV4 access keys), besides the cluster key's tokens.
USERS = """
[[users]]
name = "alice"
access_key = "ALICEKEY"
secret_key = "alice-secret"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url, method="GET", headers=None, body=None, timeout=10):
    """(status, body) of one HTTP request; (0, b"") when nothing answers."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


class Etcd:
    """A one-member etcd on free loopback ports, with its own data directory."""

    def __init__(self, root):
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            [ETCD, "--data-dir", str(root / "etcd"), "--name", "test",
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"test={peer_url}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: b"true" in request(self.url + "/health", timeout=2)[1],
                   timeout=30, what="etcd to become healthy")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class ClusterNode:
    """One `yutu-server` of the cluster (named `node{i}`)."""

    def __init__(self, i, etcd, root, memory):
        self.name = f"node{i}"
        self.proc = subprocess.Popen(
            [bin_path("yutu-server"),
             "--listen", "127.0.0.1:0",
             "--etcd", etcd.url,
             "--node-name", self.name,
             "--cluster-key-file", str(root / "cluster.key"),
             "--config", str(root / "yutu.toml"),
             "--lease-ttl-secs", "3",
             "--data-dir", str(root / self.name),
             "--memory", memory,
             "--shards", "1",
             "--nvme-capacity", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
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
            raise RuntimeError(f"{self.name} did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL: the node leaves nothing behind and tells nobody."""
        self.proc.kill()
        self.proc.wait()


class Cluster:
    """etcd and three nodes, authentication on through the shared cluster key."""

    def __init__(self, n=3, memory="8MiB"):
        self.dir = tempfile.TemporaryDirectory(prefix="yutu-py-cluster-")
        root = Path(self.dir.name)
        (root / "cluster.key").write_text(KEY + "\n")
        (root / "yutu.toml").write_text(USERS)
        self.key_file = root / "cluster.key"
        self.etcd = Etcd(root)
        self.nodes = []
        try:
            self.admin_token = self.token("admin", admin=True)
            # A node's token: what nodes sign their calls to each other with.
            self.node_token = self.token("node:test", admin=True)
            for i in range(n):
                self.nodes.append(ClusterNode(i, self.etcd, root, memory))
            names = [f"node{i}" for i in range(n)]
            for node in self.nodes:
                wait_until(lambda node=node: self.members(node) == names, timeout=30,
                           what=f"{node.name} to see {names}")
        except BaseException:
            self.stop()
            raise

    def token(self, sub, admin=False):
        """A token every node accepts: HS256, signed with the cluster key (kid `cluster`)."""
        args = [bin_path("yutu"), "token", "issue", "--secret-file", str(self.key_file),
                "--kid", "cluster", "--sub", sub, "--ttl", "2h"]
        if admin:
            args.append("--admin")
        out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[-1]

    def admin(self):
        return {"authorization": f"Bearer {self.admin_token}"}

    def members(self, node):
        """The member names `node` sees, [] while it does not answer."""
        status, body = request(node.url + "/v1/cluster", headers=self.admin(), timeout=2)
        if status != 200:
            return []
        return [m["name"] for m in json.loads(body)["members"]]

    def settled(self, node):
        """Whether `node`'s rebalancer has worked through the membership it sees: until then
        a pass still to come may drop copies beyond a key's owners (a put's extra replicas,
        a preferred node's copy)."""
        status, body = request(node.url + "/admin/v1/local/stats", headers=self.admin(), timeout=2)
        return status == 200 and json.loads(body).get("settled") is True

    def create_bucket(self, replicas):
        for node in self.nodes:
            if node.alive():
                wait_until(lambda node=node: self.settled(node), timeout=30,
                           what=f"{node.name} to settle its membership")
        bucket = fresh_bucket()
        status, body = request(f"{self.nodes[0].url}/{bucket}", "PUT",
                               {**self.admin(), "x-yutu-replicas": str(replicas)}, b"")
        assert status == 200, body
        return bucket

    def local(self, i, bucket, key, method="HEAD"):
        """(status, body) of node `i`'s own copy of the key."""
        headers = {"authorization": f"Bearer {self.node_token}", "x-yutu-forwarded": "test"}
        return request(f"{self.nodes[i].url}/{bucket}/{key}", method, headers)

    def holders(self, bucket, key):
        """The nodes (indexes) that hold the key themselves."""
        return [i for i, n in enumerate(self.nodes)
                if n.alive() and self.local(i, bucket, key)[0] == 200]

    def evictions(self, i):
        _, text = request(self.nodes[i].url + "/metrics")
        total = 0.0
        for line in text.decode().splitlines():
            if line.startswith("yutu_evictions_total") and line[20:21] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def store(self, i, bucket, **kw):
        return yutu.Store(self.nodes[i].url, bucket=bucket, token=self.admin_token, **kw)

    def stop(self):
        for n in self.nodes:
            if n.alive():
                n.kill()
        self.etcd.stop()
        self.dir.cleanup()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def pattern(i, n=BLOCK):
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def flood(store, rounds=10, per_round=64):
    """40 MiB of unpinned blocks by default: more than the three nodes' 24 MiB of DRAM."""
    buf = np.zeros(per_round * BLOCK, dtype=np.uint8)
    store.register_buffer(buf.ctypes.data, buf.nbytes)
    try:
        for r in range(rounds):
            keys = [f"flood-{r}-{i}" for i in range(per_round)]
            store.batch_put_from(keys, [buf.ctypes.data + i * BLOCK for i in range(per_round)],
                                 [BLOCK] * per_round)
    finally:
        store.unregister_buffer(buf.ctypes.data)


def test_store_routes_blocks_to_their_owners_on_every_node(cluster):
    bucket = cluster.create_bucket(replicas=2)
    # A store on node1 only: it learns the other two and sends each block to its owners.
    with cluster.store(1, bucket) as store:
        assert store.cluster_nodes() == 3
        doc = store.cluster()
        assert [m["name"] for m in doc["members"]] == ["node0", "node1", "node2"]
        assert {"bucket": bucket, "replicas": 2} in doc["buckets"]
        n = 48
        src = np.concatenate([pattern(i, 8192) for i in range(n)])
        keys = [f"blk-{i}" for i in range(n)]
        store.batch_put_from(keys, [src[i * 8192:(i + 1) * 8192] for i in range(n)])
        per_node = [0, 0, 0]
        for i, k in enumerate(keys):
            holders = cluster.holders(bucket, k)
            assert len(holders) == 2, (k, holders)
            for h in holders:
                per_node[h] += 1
                status, body = cluster.local(h, bucket, k, "GET")
                assert status == 200 and body == pattern(i, 8192).tobytes(), (k, h)
        assert all(per_node), per_node
        dst = np.zeros_like(src)
        lens = store.batch_get_into(keys, [dst[i * 8192:(i + 1) * 8192] for i in range(n)])
        assert lens == [8192] * n and np.array_equal(src, dst)
        assert store.get_batch(keys[:3]) == [pattern(i, 8192).tobytes() for i in range(3)]
        assert store.batch_is_exist(keys[:2] + ["absent"]) == [True, True, False]
        # The bytes API routes the same way.
        store.put_batch(["b0", "b1"], [b"zero", b"one"])
        assert [len(cluster.holders(bucket, k)) for k in ("b0", "b1")] == [2, 2]
        assert store.get("b1") == b"one"


def test_replicas_preferred_node_and_argument_checks(cluster):
    bucket = cluster.create_bucket(replicas=1)
    with cluster.store(0, bucket) as store:
        store.put("one", b"x" * 1000)
        assert len(cluster.holders(bucket, "one")) == 1
        store.put("three", b"x" * 1000, replicas=3)
        assert cluster.holders(bucket, "three") == [0, 1, 2]
        data = pattern(7)
        store.put_from("three-from", data, replicas=3)
        assert cluster.holders(bucket, "three-from") == [0, 1, 2]
        for i in range(3):
            assert cluster.local(i, bucket, "three-from", "GET") == (200, data.tobytes())
        # Eight keys per node, so that none lands there by placement alone (1 in 3^8).
        for name in ("node0", "node1", "node2"):
            keys = [f"pref-{name}-{i}" for i in range(8)]
            store.put_batch(keys, [b"p"] * 8, preferred_node=name)
            assert all(int(name[-1]) in cluster.holders(bucket, k) for k in keys), name
        assert store.get("pref-node2-7") == b"p"
        # Bad values are refused before anything is sent (even with no keys to send).
        for kw in ({"replicas": 0}, {"replicas": 8}, {"replicas": True}, {"replicas": "2"},
                   {"replicas": 1.5}, {"pin": "soft"}, {"pin": 0}, {"pin": -5},
                   {"pin": 30 * 86400 + 1}, {"pin": True}, {"pin": 2.5},
                   {"preferred_node": ""}, {"preferred_node": 3}):
            with pytest.raises(yutu.InvalidArgument):
                store.put("bad", b"v", **kw)
            with pytest.raises(yutu.InvalidArgument):
                store.batch_put_from([], [], **kw)
        # A name that is no member's: refused by the routing, before any block moves.
        with pytest.raises(yutu.InvalidArgument, match="nowhere"):
            store.put_batch(["bad", "bad2"], [b"v", b"w"], preferred_node="nowhere")
        assert store.batch_is_exist(["bad", "bad2"]) == [False, False]
        # The limits themselves are taken.
        store.put("long-soft", b"v", pin=30 * 86400)
        store.put("seven", b"v", replicas=7)
        assert cluster.holders(bucket, "seven") == [0, 1, 2]


def test_hard_and_soft_pins_survive_a_flood(cluster):
    bucket = cluster.create_bucket(replicas=1)
    with cluster.store(0, bucket) as store:
        store.put("hard", pattern(1), pin="hard")
        store.put("soft", pattern(2), pin=3600)
        store.put("plain", pattern(3))
        hard_on, soft_on = cluster.holders(bucket, "hard"), cluster.holders(bucket, "soft")
        assert len(hard_on) == 1 and len(soft_on) == 1
        before = [cluster.evictions(i) for i in range(3)]
        flood(store)
        assert all(cluster.evictions(i) > before[i] for i in range(3)), "the flood evicts"
        assert cluster.holders(bucket, "hard") == hard_on
        assert cluster.holders(bucket, "soft") == soft_on
        assert store.get("hard") == pattern(1).tobytes()
        assert store.get("soft") == pattern(2).tobytes()
        assert cluster.holders(bucket, "plain") == [], "an unpinned block of then is gone"


def test_mooncake_replicate_config_maps_onto_put_options(cluster):
    bucket = cluster.create_bucket(replicas=1)
    mc = MooncakeDistributedStore()
    assert mc.setup("engine-0", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.nodes[0].url,
                    tenant_id=bucket, token=cluster.admin_token) == 0
    try:
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        cfg.with_hard_pin = True
        assert mc.put("pinned2", pattern(11).tobytes(), cfg) == 0
        pinned_on = cluster.holders(bucket, "pinned2")
        assert len(pinned_on) == 2
        soft = ReplicateConfig()
        soft.soft_pin_action = SoftPinAction.ENABLE
        soft.soft_pin_ttl_ms = 3_600_001  # rounded up to 3601 s
        buf = pattern(12)
        assert mc.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        assert mc.put_from("soft", buf.ctypes.data, buf.nbytes, soft) == 0
        # replica_num 1 (Mooncake's default) leaves the bucket's count; more than the
        # cluster has is best effort, as in Mooncake.
        assert mc.put("default", b"d", ReplicateConfig()) == 0
        assert len(cluster.holders(bucket, "default")) == 1
        many = ReplicateConfig()
        many.replica_num = 9
        assert mc.upsert("many", b"m", many) == 0
        assert cluster.holders(bucket, "many") == [0, 1, 2]
        # A preferred segment naming a member, by name or by its URL's host:port (eight keys
        # each, so that none lands there by placement alone).
        for i, seg in ((2, "node2"), (1, cluster.nodes[1].url.removeprefix("http://"))):
            pref = ReplicateConfig()
            pref.preferred_segment = seg
            keys = [f"pref{i}-{j}" for j in range(8)]
            assert mc.put_batch(keys, [b"p"] * 8, pref) == 0
            assert all(i in cluster.holders(bucket, k) for k in keys), seg
        pref = ReplicateConfig()
        pref.preferred_segments = ["10.9.9.9:12345", "node0"]
        keys = [f"pref0-{j}" for j in range(8)]
        assert mc.batch_put_from(keys, [buf.ctypes.data + 100 * j for j in range(8)],
                                 [100] * 8, pref) == [0] * 8
        assert all(0 in cluster.holders(bucket, k) for k in keys)
        # A segment that names no member is ignored, as before.
        other = ReplicateConfig()
        other.preferred_segment = "10.9.9.9:12345"
        assert mc.put("elsewhere", b"e", other) == 0 and mc.get("elsewhere") == b"e"
        bad = ReplicateConfig()
        bad.soft_pin_action = SoftPinAction.ENABLE
        # Longer than Yutu's longest soft pin (30 days); 0 is Mooncake's "no pin", accepted.
        bad.soft_pin_ttl_ms = 31 * 24 * 3600 * 1000
        assert mc.put("bad", b"b", bad) == int(ErrorCode.INVALID_PARAMS)
        # The flood: the hard-pinned block stays on both its nodes, the soft-pinned one too.
        soft_on = cluster.holders(bucket, "soft")
        before = [cluster.evictions(i) for i in pinned_on]
        with cluster.store(0, bucket) as store:
            flood(store)
        assert all(cluster.evictions(i) > b for i, b in zip(pinned_on, before))
        assert cluster.holders(bucket, "pinned2") == pinned_on
        assert cluster.holders(bucket, "soft") == soft_on
        assert mc.get("pinned2") == pattern(11).tobytes()
        out = np.zeros(BLOCK, dtype=np.uint8)
        assert mc.register_buffer(out.ctypes.data, out.nbytes) == 0
        assert mc.get_into("soft", out.ctypes.data, out.nbytes) == BLOCK
        assert np.array_equal(out, buf)
    finally:
        mc.close()


def test_access_keys_sign_the_membership_read(cluster):
    # A user's store (SigV4, no token): it reads the membership with signed requests, and a
    # Mooncake preferred segment is resolved with them.
    bucket = fresh_bucket()
    with yutu.Store(cluster.nodes[2].url, bucket=bucket, access_key="ALICEKEY",
                    secret_key="alice-secret") as store:
        assert store.cluster_nodes() == 3
        assert [m["name"] for m in store.cluster()["members"]] == ["node0", "node1", "node2"]
    mc = MooncakeDistributedStore()
    assert mc.setup("engine-1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.nodes[2].url,
                    tenant_id=bucket, access_key="ALICEKEY", secret_key="alice-secret") == 0
    try:
        cfg = ReplicateConfig()
        cfg.preferred_segment = cluster.nodes[0].url.removeprefix("http://")
        keys = [f"signed{i}" for i in range(8)]
        assert mc.put_batch(keys, [b"s"] * 8, cfg) == 0
        assert all(0 in cluster.holders(bucket, k) for k in keys)
        assert mc.get("signed7") == b"s"
    finally:
        mc.close()
    with pytest.raises(yutu.AuthError):
        yutu.Store(cluster.nodes[0].url, bucket=bucket, access_key="ALICEKEY",
                   secret_key="wrong")


def test_reads_survive_a_sigkilled_node():
    c = Cluster()
    try:
        bucket = c.create_bucket(replicas=2)
        with c.store(0, bucket) as store:
            n = 32
            keys = [f"k{i}" for i in range(n)]
            store.put_batch(keys, [pattern(i, 4096).tobytes() for i in range(n)])
            on_node2 = [k for k in keys if 2 in c.holders(bucket, k)]
            assert on_node2
            c.nodes[2].kill()
            # At once, before the cluster notices: every key from its other owner.
            assert store.get_batch(keys) == [pattern(i, 4096).tobytes() for i in range(n)]
            dst = np.zeros(n * 4096, dtype=np.uint8)
            got = store.batch_get_into(keys, [dst[i * 4096:(i + 1) * 4096] for i in range(n)])
            assert got == [4096] * n
            assert all(store.batch_is_exist(on_node2))

            # A key node2 owned takes writes again once node2's lease is gone (3 s) and the
            # membership no longer has it: then its owners are the two nodes left.
            key = on_node2[0]

            def put_works():
                try:
                    store.put(key, b"rewritten")
                except yutu.Error:
                    return False
                return True

            wait_until(put_works, timeout=30, what="puts after node2's lease expired")
            assert c.holders(bucket, key) == [0, 1]
            assert store.get(key) == b"rewritten"
            assert store.cluster_nodes() == 2
    finally:
        c.stop()
