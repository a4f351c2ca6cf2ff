"""The parts of Mooncake's current Python API that engines call (SGLang HiCache, vLLM's
MooncakeStoreConnector, LMCache's mooncakestore connector): scatter/gather puts and gets,
buffer handles, ranged reads, the soft-pin rules, ``get_hostname``, ``setup_dummy``, the host
allocator, tenants and configuration, against a real node. Semantics as in Mooncake's
``store_py.cpp`` / ``real_client.cpp``."""

import ctypes
import json

import numpy as np
import pytest

from yutu import mooncake
from yutu.mooncake import (
    BufferHandle,
    ErrorCode,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicateConfig,
    SoftPinAction,
)

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
INVALID = int(ErrorCode.INVALID_PARAMS)


def _setup(node, bucket):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 16 << 20, "tcp", "", node.url,
                 tenant_id=bucket, token=node.admin_token)
    assert rc == 0
    return s


@pytest.fixture
def mc(node, bucket):
    s = _setup(node, bucket)
    yield s
    s.close()


@pytest.fixture
def pool(mc):
    buf = np.zeros(16 << 20, dtype=np.uint8)
    assert mc.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    return buf


def test_multi_buffers_gather_and_scatter(mc, pool):
    p = pool.ctypes.data
    rng = np.random.default_rng(11)
    # An MLA-style layout: each key's value is one slice of each of 3 layer buffers.
    layers, block, n = 3, 4096, 40
    src = [p + i * (n * block) for i in range(layers)]
    pool[: layers * n * block] = rng.integers(0, 256, layers * n * block, dtype=np.uint8)
    keys = [f"page{i}" for i in range(n)]
    ptrs = [[src[j] + i * block for j in range(layers)] for i in range(n)]
    sizes = [[block] * layers for _ in range(n)]
    assert mc.batch_put_from_multi_buffers(keys, ptrs, sizes, ReplicateConfig()) == [0] * n
    # Each value is the concatenation of its buffers.
    first = mc.get("page7")
    want = b"".join(bytes(pool[(src[j] - p) + 7 * block:(src[j] - p) + 8 * block]) for j in range(layers))
    assert first == want
    # Scatter into other buffers, different split sizes than the put's (sum equal).
    out = p + (8 << 20)
    dst = [[out + i * layers * block, out + i * layers * block + 1000] for i in range(n)]
    dsz = [[1000, layers * block - 1000] for _ in range(n)]
    got = mc.batch_get_into_multi_buffers(keys + ["absent"], dst + [[out]], dsz + [[10]])
    assert got == [layers * block] * n + [NOT_FOUND]
    for i in range(n):
        a = bytes(pool[(out - p) + i * layers * block:(out - p) + (i + 1) * layers * block])
        assert a == mc.get(keys[i])
    # A key already stored keeps its bytes and answers 0 (Mooncake's put).
    other = [[p + (12 << 20)] for _ in range(1)]
    assert mc.batch_put_from_multi_buffers(["page0"], other, [[block * layers]]) == [0]
    assert mc.get("page0") == b"".join(
        bytes(pool[(src[j] - p):(src[j] - p) + block]) for j in range(layers))
    # Buffers smaller than the value: INVALID_PARAMS for that key only.
    got = mc.batch_get_into_multi_buffers(["page1", "page2"], [[out, out + 10], [out]],
                                          [[10, 10], [layers * block]])
    assert got == [INVALID, layers * block]


def test_registered_host_memory_moves_in_place(mc, pool):
    """A registered numpy array is registered with the client's engine as it is: the node on
    this host writes blocks straight into it and reads them straight out of it (its
    ``buffer_path`` says "in place"), scattered and gathered, with no staging buffer."""
    p = pool.ctypes.data
    assert mc._store.buffer_path(p) == "in place"
    rng = np.random.default_rng(5)
    layers, block, n = 4, 8192, 16
    pool[: layers * n * block] = rng.integers(0, 256, layers * n * block, dtype=np.uint8)
    keys = [f"inplace{i}" for i in range(n)]
    ptrs = [[p + j * n * block + i * block for j in range(layers)] for i in range(n)]
    assert mc.batch_put_from_multi_buffers(keys, ptrs, [[block] * layers] * n) == [0] * n
    out = p + (8 << 20)
    got = mc.batch_get_into(keys, [out + i * layers * block for i in range(n)],
                            [layers * block] * n)
    assert got == [layers * block] * n
    for i in range(n):
        want = b"".join(bytes(pool[j * n * block + i * block:j * n * block + (i + 1) * block])
                        for j in range(layers))
        assert bytes(pool[(out - p) + i * layers * block:(out - p) + (i + 1) * layers * block]) == want
    # Memory outside every registered range still works, through staging.
    other = np.zeros(layers * block, dtype=np.uint8)
    assert mc.get_into(keys[3], other.ctypes.data, other.nbytes) == layers * block
    assert bytes(other) == mc.get(keys[3])
    assert mc.unregister_buffer(p) == 0
    assert mc._store.buffer_path(p) is None


def test_large_values_are_read_through_located_slots_without_a_call(mc, node, bucket,
                                                                     monkeypatch):
    """The node notes where each large KV block lies in its arena as it stores it (a located
    slot of the bucket's table), and a client with an arena view copies a ``get`` of it
    straight out of the view, checked against the slot, without a call. Every overwrite and
    remove shows at the next get; a client without views asks the node, same bytes."""
    rng = np.random.default_rng(47)
    values = [rng.integers(0, 256, (1 << 20) + 4096 * i, dtype=np.uint8).tobytes()
              for i in range(4)]
    keys = [f"located{i}" for i in range(4)]
    for k, v in zip(keys, values):
        assert mc.put(k, v) == 0
    # The first get of a large value asks the node (it learns the size); the others copy.
    for _ in range(2):
        for k, v in zip(keys, values):
            assert mc.get(k) == v
    hits = mc._s()._located_hits()
    assert hits >= len(keys), hits
    # A put over a key keeps the old value (Mooncake's put is "if absent"); a remove and a
    # put of a value of another size, and a remove: the next get shows each.
    newer = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    assert mc.put(keys[0], newer) == 0
    assert mc.get(keys[0]) == values[0]
    assert mc.remove(keys[0]) == 0
    assert mc.put(keys[0], newer) == 0
    assert mc.get(keys[0]) == newer
    assert mc.remove(keys[1]) == 0
    assert mc.get(keys[1]) == b""
    assert mc.get(keys[2]) == values[2]
    assert mc._s()._located_hits() > hits
    monkeypatch.setenv("YUTU_ARENA_VIEWS", "0")
    off = _setup(node, bucket)
    try:
        for k, v in zip(keys[2:], values[2:]):
            assert off.get(k) == v
            assert off.get(k) == v
        assert off.get(keys[0]) == newer
        assert off._s()._located_hits() == 0
    finally:
        off.close()


def test_puts_of_large_values_from_threads_are_one_call_each_through_rooms(mc):
    """Mooncake's concurrent stress shape (threads each ``put`` 1 MiB values as bytes, then
    ``get`` them back): a put writes its value into a room (a range the node reserved for this
    client before the key was known) and publishes it in one call that also asks for the
    next room, so every put after a thread's first on a shard takes a room. Every value
    comes back; Mooncake's ``put`` keeps a stored key's bytes through a room too."""
    import threading

    threads, per = 4, 6
    values = [np.random.default_rng(60 + t).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
              for t in range(threads)]
    taken = mc._s()._rooms()[0]
    failures = []

    def worker(t):
        try:
            for i in range(per):
                assert mc.put(f"stress-{t}-{i}", values[t]) == 0
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not failures, failures
    used, held = mc._s()._rooms()
    # A put finds no room only while every room of its shard is taken by another thread's
    # put, and its publish adds one: at most `threads` such puts per shard (the node has 2),
    # and the very first put, which asks for none (its length had not come before).
    assert used - taken >= threads * per - 2 * threads - 1, (used, taken)
    assert 0 < held <= 2 * threads
    for t in range(threads):
        for i in range(per):
            assert mc.get(f"stress-{t}-{i}") == values[t]
    assert mc.put("stress-0-0", values[1]) == 0
    assert mc.get("stress-0-0") == values[0]


def test_large_gets_are_copied_by_the_client_through_arena_views(mc, pool, node, bucket,
                                                                 monkeypatch):
    """The tests run the node and the client as one user, so the client can read the node's
    memory, proves it, and maps the shards' arenas (arena views): a large get into a numpy
    array or a new ``bytes`` is then copied by this process, under the node's leases, and so
    is a large put; batches of small blocks are still copied by the node, and every byte comes back
    either way. With ``YUTU_ARENA_VIEWS=0`` nothing goes through a view."""
    p = pool.ctypes.data
    rng = np.random.default_rng(31)
    block, n = 1 << 20, 6
    pool[: n * block] = rng.integers(0, 256, n * block, dtype=np.uint8)
    keys = [f"viewed{i}" for i in range(n)]
    assert mc._s()._arena_views() == (0, 0)
    assert mc.batch_put_from(keys, [p + i * block for i in range(n)], [block] * n) == [0] * n
    # The put went through views: the node populates the room it reserves before answering.
    put = mc._s()._arena_views()[1]
    assert put == n * block
    out = n * block
    got = mc.batch_get_into(keys + ["absent"], [p + out + i * block for i in range(n + 1)],
                            [block] * (n + 1))
    assert got[:n] == [block] * n and got[n] < 0
    assert np.array_equal(pool[out:2 * out], pool[:out])
    views, copied = mc._s()._arena_views()
    assert views >= 1 and copied == put + n * block
    # A value of bytes: the get copies it into the new object.
    value = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    assert mc.put("viewed-bytes", value) == 0
    before = mc._s()._arena_views()[1]
    assert before - copied in (0, len(value))
    assert mc.get("viewed-bytes") == value
    copied = mc._s()._arena_views()[1]
    assert copied == before + len(value)
    # Small blocks: the node copies.
    small = [f"small{i}" for i in range(64)]
    assert mc.batch_put_from(small, [p + i * 4096 for i in range(64)], [4096] * 64) == [0] * 64
    assert mc.batch_get_into(small, [p + out + i * 4096 for i in range(64)], [4096] * 64) == [4096] * 64
    assert np.array_equal(pool[out:out + 64 * 4096], pool[:64 * 4096])
    assert mc._s()._arena_views()[1] == copied
    monkeypatch.setenv("YUTU_ARENA_VIEWS", "0")
    off = _setup(node, bucket)
    try:
        other = np.zeros(n * block, dtype=np.uint8)
        assert off.register_buffer(other.ctypes.data, other.nbytes) == 0
        got = off.batch_get_into(keys, [other.ctypes.data + i * block for i in range(n)],
                                 [block] * n)
        assert got == [block] * n
        assert np.array_equal(other, pool[:out])
        assert off._s()._arena_views() == (0, 0)
    finally:
        off.close()


def test_a_long_batch_is_read_out_of_engine_memory_in_runs(mc, pool):
    """A put-from longer than one run (the node reserves room for up to 256 blocks and reads
    them out of the engine's memory in one copy), with every key three times, within a run
    and across runs: each key holds its last block, byte for byte."""
    p = pool.ctypes.data
    rng = np.random.default_rng(11)
    n, distinct, stride = 600, 200, 4096
    pool[: n * stride] = rng.integers(0, 256, n * stride, dtype=np.uint8)
    sizes = [1000 + (i % 7) * 300 for i in range(n)]
    keys = [f"runs{i % distinct}" for i in range(n)]
    assert mc.batch_upsert_from(keys, [p + i * stride for i in range(n)], sizes) == [0] * n
    last = {k: i for i, k in enumerate(keys)}
    names = sorted(last)
    out = 8 << 20
    got = mc.batch_get_into(names, [p + out + j * stride for j in range(len(names))],
                            [stride] * len(names))
    assert got == [sizes[last[k]] for k in names]
    for j, k in enumerate(names):
        i = last[k]
        assert bytes(pool[out + j * stride: out + j * stride + sizes[i]]) == \
            bytes(pool[i * stride: i * stride + sizes[i]]), k


def test_small_calls_go_in_frames_and_answer_as_over_http(mc, node, bucket, monkeypatch):
    """With a token, the control calls go in binary frames to the owning shard
    (``control_path``); with ``YUTU_FRAMES=0`` over HTTP. Both answer the same."""
    assert mc._store.control_path() == "frames: unix"
    monkeypatch.setenv("YUTU_FRAMES", "0")
    plain = _setup(node, bucket)
    try:
        assert plain._store.control_path() == "http"
        values = {f"f{i}": bytes([i]) * (100 * i + 1) for i in range(12)}
        for i, (k, v) in enumerate(values.items()):
            assert (mc if i % 2 else plain).put(k, v) == 0
        keys = list(values) + ["absent"]
        for s in (mc, plain):
            assert s.batch_is_exist(keys) == [1] * 12 + [0]
            assert [s.is_exist(k) for k in keys] == [1] * 12 + [0]
            assert [s.get(k) for k in keys] == list(values.values()) + [b""]
        assert mc.remove("f3") == 0
        assert plain.is_exist("f3") == 0 and mc.is_exist("f3") == 0
    finally:
        plain.close()


def test_frame_polling_is_set_by_the_environment_and_checked(node, bucket, monkeypatch, caplog):
    """``YUTU_FRAME_SPIN_US`` bounds how long a call polls for its answer (0: never); a value
    that is not 0 to 10,000 microseconds fails setup with the variable named."""
    monkeypatch.setenv("YUTU_FRAME_SPIN_US", "0")
    quiet = _setup(node, bucket)
    try:
        assert quiet._store.control_path() == "frames: unix"
        assert quiet.put("spin", b"x" * 100) == 0
        assert quiet.get("spin") == b"x" * 100
        assert quiet.is_exist("spin") == 1
    finally:
        quiet.close()
    for bad in ("abc", "-1", "10001"):
        monkeypatch.setenv("YUTU_FRAME_SPIN_US", bad)
        s = MooncakeDistributedStore()
        caplog.clear()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 16 << 20, "tcp", "", node.url,
                     tenant_id=bucket, token=node.admin_token)
        assert rc == INVALID, bad
        assert "YUTU_FRAME_SPIN_US" in caplog.text, caplog.text


def _presence_grants(node):
    """The node's ``yutu_presence_grants_total`` (over its shards)."""
    import urllib.request
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("yutu_presence_grants_total"))


def test_is_exist_is_looked_up_in_presence_tables_unless_turned_off(node, bucket, monkeypatch):
    """On the node's host, ``is_exist`` and ``batch_is_exist`` are answered from the node's
    presence tables (granted once per shard), right after every put and remove;
    ``YUTU_PRESENCE=0`` asks the node instead, with the same answers."""
    before = _presence_grants(node)
    s = _setup(node, bucket)
    try:
        keys = [f"presence-{i}" for i in range(40)]
        for i, k in enumerate(keys):
            assert s.put(k, b"v" * (i + 1)) == 0
            assert s.is_exist(k) == 1
        assert s.batch_is_exist(keys + ["presence-none"]) == [1] * 40 + [0]
        assert _presence_grants(node) > before
        assert s.remove(keys[0]) == 0
        assert s.is_exist(keys[0]) == 0
    finally:
        s.close()
    monkeypatch.setenv("YUTU_PRESENCE", "0")
    plain = _setup(node, bucket)
    try:
        granted = _presence_grants(node)
        assert plain.batch_is_exist(keys + ["presence-none"]) == [0] + [1] * 39 + [0]
        assert plain.is_exist(keys[1]) == 1
        assert _presence_grants(node) == granted
    finally:
        plain.close()


def _metric(node, name):
    """The sum of a node metric over its shards and labels."""
    import urllib.request
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def test_get_of_a_small_value_is_read_from_the_value_mirror(node, bucket, monkeypatch):
    """On the node's host, once the node has served a ``get`` of a small value it mirrors it,
    and later ``get``s of it are copies out of the mirror (the node's DRAM reads stay put);
    every put, upsert and remove is seen by the next ``get``, the same as with
    ``YUTU_PRESENCE=0`` (no tables, no mirror)."""
    s = _setup(node, bucket)
    try:
        keys = [f"mirror-{i}" for i in range(20)]
        for i, k in enumerate(keys):
            assert s.put(k, bytes([i]) * (100 + i)) == 0
            assert bytes(s.get(k)) == bytes([i]) * (100 + i)
        stores = _metric(node, "yutu_value_mirror_stores_total")
        assert stores >= len(keys)
        reads = _metric(node, "yutu_tier_hits_total")
        for _ in range(5):
            for i, k in enumerate(keys):
                assert bytes(s.get(k)) == bytes([i]) * (100 + i)
        assert _metric(node, "yutu_tier_hits_total") == reads, "read from the mirror"
        # After a large value (which the client then expects again), still from the mirror.
        assert s.put("mirror-large", b"L" * (1 << 20)) == 0
        assert bytes(s.get("mirror-large")) == b"L" * (1 << 20)
        reads = _metric(node, "yutu_tier_hits_total")
        assert bytes(s.get(keys[5])) == bytes([5]) * 105
        assert _metric(node, "yutu_tier_hits_total") == reads, "read from the mirror"
        # Changes are seen at once.
        assert s.upsert(keys[0], b"new value") == 0
        assert bytes(s.get(keys[0])) == b"new value"
        assert bytes(s.get(keys[0])) == b"new value"
        assert s.upsert(keys[1], b"x" * 8192) == 0  # too large to mirror
        assert bytes(s.get(keys[1])) == b"x" * 8192
        assert bytes(s.get(keys[1])) == b"x" * 8192
        assert s.remove(keys[2]) == 0
        assert bytes(s.get(keys[2])) == b""
    finally:
        s.close()
    monkeypatch.setenv("YUTU_PRESENCE", "0")
    plain = _setup(node, bucket)
    try:
        reads = _metric(node, "yutu_tier_hits_total")
        assert bytes(plain.get(keys[0])) == b"new value"
        assert bytes(plain.get(keys[3])) == bytes([3]) * 103
        assert _metric(node, "yutu_tier_hits_total") == reads + 2, "asked the node"
    finally:
        plain.close()


def test_multi_buffers_bad_shapes(mc, pool, node, bucket):
    p = pool.ctypes.data
    # Shapes that disagree fail every key.
    assert mc.batch_put_from_multi_buffers(["a", "b"], [[p]], [[1], [1]]) == [INVALID] * 2
    assert mc.batch_put_from_multi_buffers(["a"], [[p, p]], [[1]]) == [INVALID]
    assert mc.batch_get_into_multi_buffers(["a"], [[p]], [[1], [2]]) == [INVALID]
    # A null pointer or an empty buffer fails its key only.
    assert mc.batch_put_from_multi_buffers(["a", "b", "c"], [[p, 0], [p], [p]],
                                           [[1, 1], [0], [8]]) == [INVALID, INVALID, 0]
    assert mc.get_size("c") == 8
    # Lists of plain ints are checked natively, anything else in Python, with one answer:
    # numpy integers and tuples are taken, a bool or a float fails its key only.
    assert mc.batch_put_from_multi_buffers(
        ["d", "e", "f", "g"], [(np.uint64(p),), [np.int64(p)], [True], [p]],
        [[np.int32(4)], (4,), [4], [4.0]]) == [0, 0, INVALID, INVALID]
    assert mc.batch_get_into_multi_buffers(
        ["d", "e", "c"], [[p + 100], (np.uint64(p + 200),), [p, False]],
        [[4], [np.int64(4)], [4, 4]]) == [4, 4, INVALID]
    # Not set up: Mooncake answers an empty list.
    assert MooncakeDistributedStore().batch_put_from_multi_buffers(["a"], [[p]], [[1]]) == []


def test_multi_buffers_from_gpu_ranges(node, bucket, monkeypatch):
    # YUTU_TEST_DEVICE=host: ranges registered as "cuda:0" are a stand-in over host memory,
    # so the GPU bounce path is exercised without a GPU.
    monkeypatch.setenv("YUTU_TEST_DEVICE", "host")
    s = _setup(node, bucket)
    try:
        gpu = np.arange(1 << 16, dtype=np.uint8)
        host = np.zeros(1 << 16, dtype=np.uint8)
        store = s._s()
        store.register_buffer(gpu.ctypes.data, gpu.nbytes, device="cuda:0")
        assert s.register_buffer(host.ctypes.data, host.nbytes) == 0
        g, h = gpu.ctypes.data, host.ctypes.data
        host[:100] = 7
        # A key gathered from a GPU span and a host span.
        assert s.batch_put_from_multi_buffers(["mix"], [[g + 10, h]], [[500, 100]]) == [0]
        assert s.get("mix") == bytes(gpu[10:510]) + bytes([7]) * 100
        # Scattered back into two GPU spans.
        out = g + 30000
        assert s.batch_get_into_multi_buffers(["mix"], [[out, out + 300]], [[300, 300]]) == [600]
        assert bytes(gpu[30000:30600]) == bytes(gpu[10:510]) + bytes([7]) * 100
    finally:
        s.close()


def test_put_parts_and_buffer_handles(mc):
    meta = b"M" * 28
    kv = np.arange(4096, dtype=np.uint8)
    assert mc.put_parts("chunk", meta, memoryview(kv)) == 0
    assert mc.put_parts("empty", b"", b"") == 0 and mc.is_exist("empty") == 0
    h = mc.get_buffer("chunk")
    assert isinstance(h, BufferHandle)
    assert h.size() == len(h) == 28 + 4096
    view = memoryview(h)
    assert bytes(view[:28]) == meta and bytes(view[28:]) == kv.tobytes()
    # ptr() is the address of the bytes the buffer protocol exposes.
    assert ctypes.string_at(h.ptr(), 28) == meta
    assert np.frombuffer(h, dtype=np.uint8, offset=28).tobytes() == kv.tobytes()
    assert mc.get_buffer("absent") is None
    hs = mc.batch_get_buffer(["chunk", "absent", "chunk"])
    assert hs[1] is None and bytes(hs[0]) == bytes(hs[2]) == bytes(h)
    assert hs[0].ptr() != hs[2].ptr()
    # A block larger than the size the last batch found: asked again with its size.
    assert mc.put("big", bytes(range(256)) * 40) == 0
    hs = mc.batch_get_buffer(["chunk", "big", "absent"])
    assert bytes(hs[0]) == bytes(h) and bytes(hs[1]) == bytes(range(256)) * 40 and hs[2] is None
    # And smaller ones are cut to their length.
    hs = mc.batch_get_buffer(["chunk", "big"])
    assert [len(x) for x in hs] == [28 + 4096, 10240]
    # upsert_parts replaces; put_parts keeps.
    assert mc.put_parts("chunk", b"x") == 0 and mc.get_size("chunk") == 28 + 4096
    assert mc.upsert_parts("chunk", b"x", b"y") == 0 and mc.get("chunk") == b"xy"


def test_get_into_ranges(mc, pool):
    p = pool.ctypes.data
    assert mc.put("obj", bytes(range(256)) * 4) == 0
    res = mc.get_into_ranges(
        [p, p + 4096],
        [["obj", "absent"], ["obj"]],
        [[[0, 100], [0]], [[10]]],
        [[[5, 1000], [0]], [[0]]],
        [[[10, 24], [4]], [[2000]]],
    )
    assert res == [[[10, 24], [NOT_FOUND]], [[INVALID]]]
    assert bytes(pool[:10]) == bytes(range(5, 15))
    assert bytes(pool[100:124]) == (bytes(range(256)) * 4)[1000:1024]
    # A buffer outside every registered range: its fragments stay INVALID_PARAMS.
    other = np.zeros(64, dtype=np.uint8)
    assert mc.get_into_ranges([other.ctypes.data], [["obj"]], [[[0]]], [[[0]]], [[[8]]]) == [[[INVALID]]]
    assert not other.any()
    # A key asked no ranges has an empty row (Mooncake's shape follows the offsets).
    assert mc.get_into_ranges([p], [["obj", "absent"]], [[[0], []]], [[[0], []]], [[[4], []]]) == [[[4], []]]
    assert mc.get_into_ranges([p], [["obj"]], [[[]]], [[[]]], [[[]]]) == [[[]]]
    # Lists of different lengths.
    assert mc.get_into_ranges([p], [["obj"], ["obj"]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID]], [[INVALID]]]


def test_soft_pin_ttl_rules(mc):
    cfg = ReplicateConfig()
    assert cfg.soft_pin_ttl_ms is None
    cfg.soft_pin_ttl_ms = 1000
    assert cfg.soft_pin_ttl_ms == 1000
    cfg.soft_pin_ttl_ms = None
    for bad in (-1, 1 << 64, 1.5, "10"):
        with pytest.raises(TypeError):
            cfg.soft_pin_ttl_ms = bad
    cfg.soft_pin_ttl_ms = (1 << 64) - 1
    # A TTL without ENABLE: INVALID_PARAMS on every put path.
    cfg.soft_pin_ttl_ms = 1000
    assert mc.upsert("k", b"v", cfg) == INVALID
    cfg.soft_pin_action = SoftPinAction.DISABLE
    assert mc.put("k", b"v", cfg) == INVALID
    assert mc.batch_put_from_multi_buffers(["k"], [[1]], [[1]], cfg) == [INVALID]
    assert mc.is_exist("k") == 0
    cfg.soft_pin_action = SoftPinAction.ENABLE
    assert mc.put("k", b"v", cfg) == 0
    # TTL 0 with ENABLE: stored as ordinary cache.
    cfg.soft_pin_ttl_ms = 0
    assert mc.upsert("k0", b"v", cfg) == 0 and mc.get("k0") == b"v"
    assert mc.upsert("k1", b"w") == 0


def test_setup_dummy_and_hostname(node, bucket, monkeypatch):
    s = MooncakeDistributedStore()
    assert s.get_hostname() == ""
    monkeypatch.setenv("YUTU_TOKEN", node.admin_token)
    monkeypatch.setenv("MOONCAKE_TENANT_ID", bucket)
    assert s.setup_dummy(1 << 30, 16 << 20, node.url.removeprefix("http://")) == 0
    assert s.get_hostname() == ""
    assert s.put("d", b"dummy") == 0
    assert s.get("d") == b"dummy"
    s.close()
    assert MooncakeDistributedStore().setup_dummy(1 << 30, 16 << 20, "127.0.0.1:1") == -1
    t = _setup(node, bucket)
    assert t.get_hostname().startswith("127.0.0.1:")
    t.close()
    assert t.get_hostname() == ""


def test_host_allocator(mc):
    alloc = MooncakeHostMemAllocator()
    n = 4 << 20
    ptr = alloc.alloc(n)
    assert ptr
    arr = (ctypes.c_ubyte * n).from_address(ptr)
    arr[0:5] = list(b"hello")
    assert mc.register_buffer(ptr, n) == 0
    assert mc.put_from("pool", ptr, 5) == 0
    assert mc.get_into("pool", ptr + 100, 16) == 5
    assert bytes(arr[100:105]) == b"hello"
    assert mc.unregister_buffer(ptr) == 0
    assert alloc.free(ptr) == 0
    assert alloc.free(ptr) == -1
    with pytest.raises(RuntimeError):
        alloc.alloc(0)


def test_allocator_memory_is_handed_to_the_node_as_its_memfd(mc):
    """Memory from MooncakeHostMemAllocator is registered as its memfd, which the node maps
    (``buffer_path`` says so), also when only a part of a region is registered: blocks are
    scattered into and gathered out of it at the right offsets, byte for byte, and a region
    freed while registered leaves the node's copies harmless (the store keeps its own
    mapping until it unregisters)."""
    alloc = MooncakeHostMemAllocator()
    n = 8 << 20
    ptr = alloc.alloc(n)
    view = np.frombuffer((ctypes.c_ubyte * n).from_address(ptr), dtype=np.uint8)
    # Register from 1 MiB in: offsets into the memfd are not offsets into the range.
    reg = ptr + (1 << 20)
    assert mc.register_buffer(reg, n - (1 << 20)) == 0
    assert mc._store.buffer_path(reg) == "in place: memfd"
    rng = np.random.default_rng(11)
    layers, block, keys = 3, 64 << 10, 8
    view[1 << 20:(1 << 20) + layers * keys * block] = rng.integers(
        0, 256, layers * keys * block, dtype=np.uint8)
    names = [f"memfd{i}" for i in range(keys)]
    src = [[reg + (j * keys + i) * block for j in range(layers)] for i in range(keys)]
    assert mc.batch_put_from_multi_buffers(names, src, [[block] * layers] * keys) == [0] * keys
    for i in range(keys):
        want = b"".join(bytes(view[s - ptr:s - ptr + block]) for s in src[i])
        assert mc.get(names[i]) == want
    out = reg + (4 << 20)
    got = mc.batch_get_into(names, [out + i * layers * block for i in range(keys)],
                            [layers * block] * keys)
    assert got == [layers * block] * keys
    for i in range(keys):
        a = (out - ptr) + i * layers * block
        assert bytes(view[a:a + layers * block]) == mc.get(names[i])
    # A pointer before the registered part is no registered range's: staged, as Mooncake
    # takes unregistered pointers.
    assert mc.get_into(names[0], ptr, layers * block) == layers * block
    assert bytes(view[:layers * block]) == mc.get(names[0])
    del view
    # Freed while registered: the store's own mapping keeps the node's copies in memory the
    # store still owns; the calls go on working until it unregisters.
    assert alloc.free(ptr) == 0
    assert mc.batch_put_from(["after-free"], [reg], [4096]) == [0]
    assert mc.get_into(names[1], reg, layers * block) == layers * block
    assert mc.unregister_buffer(reg) == 0


def test_tenants_map_to_valid_buckets(node, monkeypatch):
    assert mooncake.tenant_bucket(None) == mooncake.tenant_bucket("") == "default"
    assert mooncake.tenant_bucket("team-a") == "team-a"
    odd = mooncake.tenant_bucket("Team_A/prod")
    assert odd == mooncake.tenant_bucket("Team_A/prod")
    assert odd != mooncake.tenant_bucket("team_a/prod")
    assert mooncake.tenant_bucket("x" * 300).startswith("mc-") and len(mooncake.tenant_bucket("x" * 300)) <= 63
    s = MooncakeDistributedStore()
    assert s.setup("h", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "", node.url,
                   tenant_id="Team_A/prod", token=node.admin_token) == 0
    assert s.put("t", b"tenant") == 0
    assert s._s().bucket == odd
    s.close()


def test_config_from_file_and_env(node, bucket, tmp_path, monkeypatch):
    for var in list(mooncake._ENV_KEYS) + ["MOONCAKE_CONFIG_PATH"]:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError):
        mooncake.config_from_env({})
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "engine-1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": node.url.removeprefix("http://"),
        "global_segment_size": "4GB",
        "protocol": "tcp",
        "tenant_id": bucket,
        "token": node.admin_token,
        "check_server": False,
    }))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "", 1 << 20) == 0
    assert s.put("cfg", b"file") == 0
    s.close()
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH")
    monkeypatch.setenv("MOONCAKE_MASTER", node.url.removeprefix("http://"))
    monkeypatch.setenv("MOONCAKE_TENANT_ID", bucket)
    monkeypatch.setenv("YUTU_TOKEN", node.admin_token)
    cfg = mooncake.config_from_env()
    assert cfg["tenant_id"] == bucket and cfg["token"] == node.admin_token
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "", 1 << 20) == 0
    assert s.get("cfg") == b"file"
    s.close()


HOOK_CHILD = """
import multiprocessing as mp, sys

def worker(q):
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    import yutu.mooncake
    q.put(MooncakeDistributedStore is yutu.mooncake.MooncakeDistributedStore
          and ReplicateConfig is yutu.mooncake.ReplicateConfig)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=worker, args=(q,))
    p.start()
    ok = q.get(timeout=60)
    p.join(60)
    print("worker-ok" if ok else "worker-wrong")
"""


def test_opt_in_hook_reaches_worker_processes(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "engine.py"
    script.write_text(HOOK_CHILD)
    env = dict(os.environ)
    env.pop("YUTU_MOONCAKE", None)
    # Without the opt-in, `mooncake` is not Yutu's: not importable at all (the test venv
    # has no Mooncake), or the real Mooncake wheel's (as in the bench venv).
    probe = ("try:\n"
             "    import mooncake.store as m\n"
             "except ModuleNotFoundError as e:\n"
             "    print('absent' if e.name == 'mooncake' else 'broken')\n"
             "else:\n"
             "    print('yutu' if m.__name__.startswith('yutu') else 'other')\n")
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() in ("absent", "other"), off.stdout
    env["YUTU_MOONCAKE"] = "1"
    on = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                        text=True, timeout=120)
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == "worker-ok"


def test_host_allocator_regions_outlive_the_allocator():
    """SGLang calls MooncakeHostMemAllocator().alloc() on a temporary and keeps the address."""
    import gc

    ptr = MooncakeHostMemAllocator().alloc(1 << 20)
    gc.collect()
    arr = (ctypes.c_ubyte * (1 << 20)).from_address(ptr)
    arr[(1 << 20) - 1] = 9
    assert arr[(1 << 20) - 1] == 9
    del arr

    def mapped():
        with open("/proc/self/maps") as f:
            return any(line.startswith(f"{ptr:x}-") for line in f)

    assert mapped()
    assert MooncakeHostMemAllocator().free(ptr) == 0
    assert not mapped(), "free unmaps the region"


def test_buffer_handles_live_in_a_registered_slab(node, bucket):
    """Handles are ranges of a registered slab (the node writes the blocks there); a full slab
    gives heap handles instead, and a collected handle's range is used again."""
    import gc

    s = MooncakeDistributedStore()
    assert s.setup("h", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", node.url,
                   tenant_id=bucket, token=node.admin_token) == 0
    n = (2 << 20) - 100
    keys = [f"s{i}" for i in range(10)]
    vals = [bytes([i]) * n for i in range(10)]
    for k, v in zip(keys, vals):
        assert s.put(k, v) == 0
    hs = s.batch_get_buffer(keys[:8])
    assert [bytes(h) for h in hs] == vals[:8]
    assert not any(isinstance(h, mooncake._HeapHandle) for h in hs)
    more = s.batch_get_buffer(keys[8:])
    assert all(isinstance(h, mooncake._HeapHandle) for h in more)
    assert [bytes(h) for h in more] == vals[8:]
    first = hs[0].ptr()
    del hs
    gc.collect()
    again = s.batch_get_buffer(keys[8:])
    assert not any(isinstance(h, mooncake._HeapHandle) for h in again)
    assert again[0].ptr() == first
    assert [bytes(h) for h in again] == vals[8:]
    s.close()
    # The slab stays mapped while a handle over it lives.
    assert bytes(again[1][:4]) == bytes([9]) * 4


def test_get_of_bytes_at_every_size(mc):
    """``get`` answers small values from the call itself and larger ones (past 64 KiB) written
    by the node straight into the new ``bytes`` (the client's own memory; ``put`` of bytes
    is read from the object the same way): byte for byte at and around the boundary, for
    several values at once, and for a key replaced by a value of another size."""
    rng = np.random.default_rng(21)
    sizes = [1, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, 1 << 20, (3 << 20) + 7]
    values = {f"size{n}": rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes}
    assert not mc._s()._own_memory()
    for k, v in values.items():
        assert mc.put(k, v) == 0
    # The puts of bytes went through the client's own memory, registered on first use.
    assert mc._s()._own_memory()
    for k, v in values.items():
        assert mc.get(k) == v
    # Parts of several objects, one key: gathered from each in place, in order.
    parts = [values[f"size{n}"] for n in sizes]
    assert mc.put_parts("joined", *parts) == 0
    assert mc.get("joined") == b"".join(parts)
    assert mc.get_batch(list(values) + ["absent"]) == list(values.values()) + [b""]
    # get_size asks the owning shard in a frame that carries no bytes.
    assert [mc.get_size(k) for k in values] == sizes
    assert mc.get_size("absent") == NOT_FOUND
    # Replaced by a larger and then a smaller value: each get answers the current bytes.
    for n in (2 << 20, 100 << 10, 10):
        v = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert mc.upsert("size1048576", v) == 0
        assert mc.get("size1048576") == v
