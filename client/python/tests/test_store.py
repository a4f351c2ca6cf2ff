"""yutu.Store against a real node: every method, bad input, threads, a killed client."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import yutu
from conftest import fresh_bucket, wait_until

MIB = 1 << 20


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def test_bytes_round_trip_and_missing_keys(store):
    store.put("a", b"hello")
    store.put_batch(["b", "c"], [bytearray(b"bee"), memoryview(b"sea")])
    # Values of `bytes` go to the native half as they are; the same answers.
    store.put_batch(("d", "e"), (b"dee", b"e" * (3 * MIB)))
    assert store.get_batch(["d", "e"]) == [b"dee", b"e" * (3 * MIB)]
    store.put_batch(["d", "e"], [b"kept", b"kept"], if_absent=True)
    assert store.get("d") == b"dee"
    with pytest.raises(yutu.InvalidArgument):
        store.put_batch(["f", "g"], [b"f"])
    with pytest.raises(yutu.InvalidArgument):
        store.put_batch(["f"], [b"f", b"g"])
    with pytest.raises(yutu.InvalidArgument):
        store.put_batch(["f", "g"], [bytearray(b"f")])
    assert not store.is_exist("f")
    assert store.get("a") == b"hello"
    assert store.get_batch(["a", "nope", "c"]) == [b"hello", None, b"sea"]
    assert store.get_size("b") == 3
    assert store.is_exist("a") and not store.is_exist("nope")
    assert store.batch_is_exist(["a", "nope", "b"]) == [True, False, True]
    with pytest.raises(yutu.NotFound) as e:
        store.get("nope")
    assert e.value.code == "NoSuchKey"
    with pytest.raises(yutu.NotFound):
        store.get_size("nope")


def test_put_if_absent_keeps_the_stored_bytes(store):
    store.put("k", b"first")
    store.put("k", b"second", if_absent=True)
    assert store.get("k") == b"first"
    store.put("k", b"third")
    assert store.get("k") == b"third"
    store.batch_put_from(["k", "new"], [b"xx", b"yy"], if_absent=True)
    assert store.get_batch(["k", "new"]) == [b"third", b"yy"]


def test_a_node_alone_takes_the_put_options(store):
    # Checked as in a cluster; a node alone stores one copy (test_cluster.py has the rest).
    assert store.cluster_nodes() == 0
    doc = store.cluster()
    assert doc["cluster"] == "" and doc["members"] == []
    store.put("pinned", b"p", replicas=3, preferred_node="anywhere", pin="hard")
    store.put_batch(["soft", "soft2"], [b"s", b"t"], pin=60, if_absent=True)
    assert store.get_batch(["pinned", "soft", "soft2"]) == [b"p", b"s", b"t"]
    with pytest.raises(yutu.InvalidArgument, match="replicas"):
        store.put("bad", b"v", replicas=0)
    with pytest.raises(yutu.InvalidArgument, match="pin"):
        store.put_from("bad", b"v", pin="forever")
    assert not store.is_exist("bad")


@pytest.mark.parametrize("chunk", [32 * MIB, 3 * MIB])
def test_registered_pointers_round_trip_byte_exact(node, bucket, chunk):
    # A staging chunk smaller than the batch makes the copies alternate between halves.
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token, staging_chunk=chunk) as s:
        n, size = 12, 2 * MIB
        src = pattern(n * size, 1)
        dst = np.zeros((n + 1) * size, dtype=np.uint8)
        s.register_buffer(src.ctypes.data, src.nbytes)
        s.register_buffer(dst.ctypes.data, dst.nbytes)
        keys = yutu.block_keys(list(range(16 * n)), 16)
        s.batch_put_from(keys, [src.ctypes.data + i * size for i in range(n)], [size] * n)
        got = s.batch_get_into(
            keys + ["absent"],
            [dst.ctypes.data + i * size for i in range(n + 1)],
            [size] * (n + 1),
        )
        assert got == [size] * n + [None]
        assert np.array_equal(src, dst[: n * size])
        assert not dst[n * size :].any()
        assert s.unregister_buffer(src.ctypes.data)
        assert not s.unregister_buffer(src.ctypes.data)
        with pytest.raises(yutu.InvalidArgument, match="not inside a registered buffer"):
            s.put_from("x", src.ctypes.data, 16)


def test_objects_need_no_registration(store):
    arr = np.arange(4096, dtype=np.float32).reshape(64, 64)
    store.put_from("f32", arr)
    out = np.zeros_like(arr)
    assert store.get_into("f32", out) == arr.nbytes
    assert np.array_equal(arr, out)
    ro = np.frombuffer(b"read-only bytes", dtype=np.uint8)
    store.put("ro", ro)
    target = bytearray(64)
    assert store.get_into("ro", target) == 15
    assert bytes(target[:15]) == b"read-only bytes"
    view = memoryview(bytearray(32))[8:24]
    assert store.get_into("ro", view, 15) == 15
    with pytest.raises(yutu.InvalidArgument, match="read-only"):
        store.get_into("ro", b"immutable bytes!")
    # numpy integers are pointers and sizes.
    store.register_buffer(out.ctypes.data, out.nbytes)
    assert store.get_into("f32", np.uint64(out.ctypes.data), np.int64(out.nbytes)) == arr.nbytes
    with pytest.raises(yutu.InvalidArgument, match="not C-contiguous"):
        store.put_from("x", arr[:, ::2])


class FakeTensor:
    """What the store reads of a torch tensor, without torch."""

    def __init__(self, arr, device="cpu"):
        self.arr = arr
        self.device = type("Device", (), {"type": device})()

    def data_ptr(self):
        return self.arr.ctypes.data

    def numel(self):
        return self.arr.size

    def element_size(self):
        return self.arr.itemsize

    def is_contiguous(self):
        return self.arr.flags["C_CONTIGUOUS"]


def test_tensors_through_data_ptr(store):
    t = FakeTensor(np.arange(1000, dtype=np.int64))
    store.put_from("t", t)
    out = FakeTensor(np.zeros(1000, dtype=np.int64))
    assert store.get_into("t", out) == 8000
    assert np.array_equal(t.arr, out.arr)
    # CUDA tensors are taken (test_gpu.py); other accelerators are not.
    with pytest.raises(yutu.InvalidArgument, match="on mps"):
        store.put_from("t", FakeTensor(np.zeros(4), device="mps"))


def test_bad_input_is_an_exception(store):
    buf = np.zeros(MIB, dtype=np.uint8)
    p = buf.ctypes.data
    with pytest.raises(yutu.InvalidArgument):
        store.register_buffer(0, 10)
    with pytest.raises(yutu.InvalidArgument):
        store.register_buffer(p, 0)
    store.register_buffer(p, buf.nbytes)
    with pytest.raises(yutu.InvalidArgument, match="overlap"):
        store.register_buffer(p + 10, 10)
    with pytest.raises(yutu.InvalidArgument, match="registered"):
        store.put_from("k", p + buf.nbytes - 4, 8)
    with pytest.raises(yutu.InvalidArgument, match="sizes"):
        store.batch_put_from(["a", "b"], [p, p + 8], [8])
    with pytest.raises(yutu.InvalidArgument, match="2 keys but 1"):
        store.batch_put_from(["a", "b"], [p], [8])
    with pytest.raises(yutu.InvalidArgument, match="needs a size"):
        store.put_from("k", p)
    with pytest.raises(yutu.InvalidArgument, match="negative"):
        store.put_from("k", -1, 8)
    with pytest.raises((yutu.InvalidArgument, OverflowError, TypeError)):
        store.batch_get_into(["k"], [p], [-5])
    with pytest.raises(yutu.InvalidArgument, match="larger than"):
        store.put_from("k", bytearray(4), 8)
    with pytest.raises(yutu.InvalidArgument, match="expected a pointer"):
        store.put_from("k", object())
    with pytest.raises(yutu.InvalidArgument, match="size of 0"):
        store.get_into("k", p, 0)
    # A block larger than the room given for it.
    store.put_from("big", p, 4096)
    with pytest.raises(yutu.InvalidArgument):
        store.get_into("big", p, 100)
    # Keys the node refuses.
    with pytest.raises(yutu.InvalidArgument):
        store.put("", b"x")
    with pytest.raises(yutu.InvalidArgument):
        store.put("k" * 2000, b"x")
    assert store.get("big") == bytes(4096)


def test_closed_store_and_context_manager(node, bucket):
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token) as s:
        s.put("k", b"v")
    assert s.closed
    with pytest.raises(yutu.Closed):
        s.get("k")
    with pytest.raises(yutu.Closed):
        s.register_buffer(1 << 20, 10)
    s.close()  # twice is harmless
    assert "closed" in repr(s)


def test_remove_by_regex_and_remove_all(store):
    store.put_batch([f"layer{i}/blk" for i in range(5)] + ["other"], [b"x"] * 6)
    assert store.remove("other")
    assert not store.remove("other")
    assert store.remove_by_regex(r"^layer[0-2]/") == 3
    assert sorted(store.list_keys()) == ["layer3/blk", "layer4/blk"]
    assert store.batch_remove(["layer3/blk", "gone"]) == [True, False]
    assert store.remove_all() == 1
    assert store.list_keys() == []


def test_authentication_errors(node, bucket):
    with pytest.raises(yutu.AuthError) as e:
        yutu.Store(node.url, bucket=bucket, token="not-a-token")
    assert e.value.code in ("InvalidToken", "AccessDenied")
    yutu.Store(node.url, bucket=bucket, token=node.admin_token).close()
    # bob may read and write his own buckets only.
    bob = node.token("bob", "bob-*:rwdl")
    with pytest.raises(yutu.AuthError) as e:
        yutu.Store(node.url, bucket=bucket, token=bob, create_bucket=False)
    with yutu.Store(node.url, bucket="bob-" + bucket, token=node.admin_token) as admin:
        admin.put("k", b"v")
    with yutu.Store(node.url, bucket="bob-" + bucket, token=bob, create_bucket=False) as s:
        assert s.get("k") == b"v"
    with pytest.raises(yutu.InvalidArgument):
        yutu.Store(node.url, bucket=bucket, access_key="only-one-half")
    with pytest.raises(yutu.BucketNotFound) as e:
        yutu.Store(node.url, bucket="never-made", token=node.admin_token, create_bucket=False)
    assert e.value.code == "NoSuchBucket"


def test_token_from_the_environment(node, bucket, monkeypatch):
    monkeypatch.setenv("YUTU_TOKEN", node.admin_token)
    with yutu.Store(node.url, bucket=bucket) as s:
        s.put("k", b"v")
    monkeypatch.delenv("YUTU_TOKEN")
    with pytest.raises(yutu.AuthError):
        yutu.Store(node.url, bucket=bucket)


def test_unreachable_node_and_url_lists(node, bucket):
    with pytest.raises(yutu.Unavailable):
        yutu.Store("http://127.0.0.1:1", bucket=bucket, token=node.admin_token)
    with yutu.Store(["http://127.0.0.1:1", node.url], bucket=bucket, token=node.admin_token) as s:
        assert s.url == node.url
    with pytest.raises(yutu.InvalidArgument):
        yutu.Store("not a url", bucket=bucket, token=node.admin_token)


def test_threads_share_one_store(node, bucket):
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token, staging_buffers=2) as s:
        errors = []

        def worker(t):
            try:
                for round_ in range(5):
                    src = pattern(8 * 256 * 1024, t * 100 + round_)
                    keys = [f"t{t}/r{round_}/{i}" for i in range(8)]
                    views = [src[i * 262144 : (i + 1) * 262144] for i in range(8)]
                    s.batch_put_from(keys, views)
                    out = np.zeros_like(src)
                    got = s.batch_get_into(keys, [out[i * 262144 : (i + 1) * 262144] for i in range(8)])
                    assert got == [262144] * 8
                    assert np.array_equal(src, out)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []


def test_block_keys_agree_with_the_node(node, store, tmp_path):
    tokens = list(range(1000, 1000 + 16 * 10 + 5))
    hasher = yutu.BlockHasher(16)
    keys = hasher.keys(tokens)
    assert len(keys) == 10 and all(len(k) == 64 for k in keys)
    assert hasher.keys(tokens[16 * 4 :], parent=keys[3]) == keys[4:]
    assert yutu.block_keys(tokens[:48], 16) == keys[:3]
    with pytest.raises(yutu.InvalidArgument):
        hasher.keys(tokens, parent="XYZ")
    with pytest.raises(yutu.InvalidArgument):
        yutu.BlockHasher(0)
    store.batch_put_from(keys[:6], [b"block"] * 6)
    f = tmp_path / "tokens"
    f.write_text(" ".join(map(str, tokens)))
    from conftest import bin_path

    out = subprocess.run(
        [bin_path("yutu"), "--url", node.url, "--token", node.admin_token, "kv", "prefix",
         "--block-tokens", "16", "--tokens", str(f), store.bucket],
        check=True, capture_output=True, text=True, timeout=30,
    )
    assert out.stdout.split()[0] == "6", out.stdout


KILLED_CLIENT = r"""
import sys, numpy as np, yutu
s = yutu.Store(sys.argv[1], bucket=sys.argv[2], token=sys.argv[3], staging_chunk=4 << 20)
buf = np.ones(64 << 20, dtype=np.uint8)
s.register_buffer(buf.ctypes.data, buf.nbytes)
print("ready", flush=True)
i = 0
while True:
    keys = [f"victim/{i}/{j}" for j in range(32)]
    s.batch_put_from(keys, [buf.ctypes.data + j * (2 << 20) for j in range(32)], [2 << 20] * 32)
    s.batch_get_into(keys, [buf.ctypes.data + j * (2 << 20) for j in range(32)], [2 << 20] * 32)
    i += 1
"""


def test_a_client_killed_mid_batch_leaves_the_node_serving(node):
    bucket = fresh_bucket()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, node.url, bucket, node.admin_token],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        with yutu.Store(node.url, bucket=bucket, token=node.admin_token) as watcher:
            wait_until(lambda: len(watcher.list_keys("victim/")) > 0, 30, "the client's first batch")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert node.alive()
    # The killed client could not remove its engine's socket directory; the next client on
    # this host does.
    import glob
    import tempfile

    left = os.path.join(tempfile.gettempdir(), f"yutu-kv-{proc.pid}-*")
    assert len(glob.glob(left)) == 1
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token) as s:
        assert glob.glob(left) == []
        data = pattern(4 * MIB, 9)
        s.put_from("after", data)
        out = np.zeros_like(data)
        assert s.get_into("after", out) == data.nbytes
        assert np.array_equal(data, out)


def test_the_engine_example_runs(node):
    example = Path(__file__).resolve().parents[1] / "examples" / "engine_kv.py"
    env = dict(os.environ, YUTU_TOKEN=node.admin_token, BLOCKS="32")
    out = subprocess.run(
        [sys.executable, str(example), node.url], env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "32 of 32 blocks cached and read back byte-exact" in out.stdout


def test_a_bucket_over_its_quota_raises_no_space(node):
    import urllib.request

    name = fresh_bucket()
    req = urllib.request.Request(
        f"{node.url}/{name}",
        method="PUT",
        headers={"Authorization": f"Bearer {node.admin_token}", "x-yutu-quota": "64KiB"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    with yutu.Store(node.url, bucket=name, token=node.admin_token) as s:
        s.put("a", bytes(40 << 10))
        with pytest.raises(yutu.NoSpace) as e:
            s.put("b", bytes(40 << 10))
        assert e.value.code == "QuotaExceeded"
        assert "quota" in str(e.value)
        assert not s.is_exist("b")
        # Rewriting a key nets out what it replaces; a delete frees room.
        s.put("a", bytes(50 << 10))
        s.remove("a")
        s.put("b", bytes(40 << 10))

