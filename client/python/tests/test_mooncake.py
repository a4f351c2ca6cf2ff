"""yutu.mooncake.MooncakeDistributedStore: Mooncake's method names, argument order and return
codes, against a real node."""

import sys
from pathlib import Path

import numpy as np
import pytest

import yutu
from yutu import mooncake
from yutu.mooncake import ErrorCode, MooncakeDistributedStore, ReplicateConfig, SoftPinAction

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
INVALID = int(ErrorCode.INVALID_PARAMS)


@pytest.fixture
def mc(node, bucket):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "http://unused:8080/metadata", 512 << 20, 16 << 20, "tcp", "",
                 node.url, tenant_id=bucket, token=node.admin_token)
    assert rc == 0
    yield s
    s.close()


def test_install_makes_mooncake_store_resolve_to_yutu():
    saved = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.store")}
    try:
        mooncake.install()
        from mooncake.store import MooncakeDistributedStore as Imported  # noqa: PLC0415
        import mooncake.store as module  # noqa: PLC0415

        assert Imported is MooncakeDistributedStore
        assert module.ReplicateConfig is ReplicateConfig
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_setup_forms(node, bucket, monkeypatch):
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    monkeypatch.setenv("YUTU_TOKEN", node.admin_token)
    cfg = {
        "local_hostname": "engine-7",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": "512MB",
        "local_buffer_size": "16 MiB",
        "protocol": "tcp",
        "master_server_addr": node.url.removeprefix("http://"),
        "tenant_id": bucket,
        "ipc_socket_path": "/tmp/unused",
    }
    assert s.setup(cfg) == 0
    # Mooncake's answer is the client's transfer address, host:port.
    host, _, port = s.get_hostname().rpartition(":")
    assert host == "engine-7" and int(port) > 0
    assert s.health_check() == 0
    assert s.put("k", b"v") == 0
    assert s.close() == 0
    assert s.health_check() == 1
    assert mooncake.parse_size("512MB") == 512 << 20
    assert mooncake.parse_size("4 GiB") == 4 << 30
    assert mooncake.parse_size(1234) == 1234
    with pytest.raises(ValueError):
        mooncake.parse_size("lots")
    # A node that does not answer, a bad size, a token that is refused: codes, not exceptions.
    assert MooncakeDistributedStore().setup("h", "m", 1, 1, "tcp", "", "127.0.0.1:1") < 0
    assert MooncakeDistributedStore().setup("h", "m", "big", 1, "tcp", "", node.url) == INVALID
    assert MooncakeDistributedStore().setup("", "m", 1, 1, "tcp", "", node.url) == INVALID
    assert MooncakeDistributedStore().setup({"metadata_server": "m"}) == INVALID
    bad = MooncakeDistributedStore()
    assert bad.setup("h", "m", 1, 1, "tcp", "", node.url, token="forged") == int(
        ErrorCode.ILLEGAL_CLIENT
    )


def test_bytes_api_put_keeps_and_upsert_replaces(mc):
    assert mc.put("a", b"one") == 0
    assert mc.put("a", b"two") == 0
    assert mc.get("a") == b"one"
    assert mc.upsert("a", b"three") == 0
    assert mc.get("a") == b"three"
    assert mc.put_batch(["b", "c"], [b"bee", b"sea"]) == 0
    assert mc.get_batch(["b", "missing", "c"]) == [b"bee", b"", b"sea"]
    assert mc.upsert_batch(["b"], [b"B"]) == 0
    assert mc.put_parts("p", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert mc.get("p") == b"abcdef"
    assert mc.upsert_parts("p", b"x", b"y") == 0
    assert mc.get("p") == b"xy"
    assert mc.get("missing") == b""
    assert mc.put("cfg", b"v", ReplicateConfig()) == 0


def test_puts_of_bytes_and_of_other_buffers(mc):
    """Values of `bytes` go to the native half as they are (`Store._put_bytes`); subclasses,
    bytearrays, memoryviews and numpy arrays through their spans: every form stores its bytes,
    with or without a config, alone and in batches."""

    class Sub(bytes):
        pass

    big = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8)
    forms = {
        "bytes": big.tobytes(),
        "sub": Sub(b"subclassed"),
        "bytearray": bytearray(b"mutable"),
        "view": memoryview(b"a view")[2:],
        "numpy": big[: 5000],
    }
    for name, value in forms.items():
        assert mc.put(f"f-{name}", value) == 0, name
        assert mc.get(f"f-{name}") == bytes(value), name
        assert mc.upsert(f"f-{name}", value, ReplicateConfig()) == 0, name
        assert mc.get(f"f-{name}") == bytes(value), name
    assert mc.put_batch(["m0", "m1", "m2"], [b"x" * 70000, Sub(b"y"), b"z"]) == 0
    assert mc.get_batch(["m0", "m1", "m2"]) == [b"x" * 70000, b"y", b"z"]
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    assert mc.upsert_batch(["m0", "m1"], [b"0" * 9, b"1"], cfg) == 0
    assert mc.get_batch(["m0", "m1"]) == [b"0" * 9, b"1"]
    # Bad input: codes, nothing stored.
    assert mc.put("f-empty", b"") == INVALID
    assert mc.put_batch(["e0", "e1"], [b"x", b""]) == INVALID
    assert mc.put_batch(["e0"], [b"x", b"y"]) == INVALID
    assert mc.is_exist("e0") == 0 and mc.is_exist("f-empty") == 0
    assert mc.put_batch([], []) == 0


def test_native_put_of_bytes_refuses_other_objects(node, bucket):
    """`Store._put_bytes` takes `bytes` objects only and as many as keys; a list changed by
    another thread while it runs cannot take an object from under it (it holds each one)."""
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token) as s:
        with pytest.raises(yutu.InvalidArgument, match="value 1 is not bytes"):
            s._put_bytes(["a", "b"], [b"x", bytearray(b"y")], False)
        with pytest.raises(yutu.InvalidArgument, match="2 keys but 1 values"):
            s._put_bytes(["a", "b"], [b"x"], False)
        with pytest.raises(yutu.InvalidArgument):
            s._put_bytes(["a"], [b"x"], False, replicas=0)
        assert not s.is_exist("a") and not s.is_exist("b")
        values = [bytes([i]) * (1 << 20) for i in range(4)]
        s._put_bytes([f"k{i}" for i in range(4)], values, False)
        assert [s.get(f"k{i}") for i in range(4)] == values
        s.put("plain", b"via put")
        assert s.get("plain") == b"via put"
        s.put("plain", b"kept?", if_absent=True)
        assert s.get("plain") == b"via put"


def test_registered_buffers_and_return_codes(mc):
    buf = np.zeros(8 << 20, dtype=np.uint8)
    p = buf.ctypes.data
    assert mc.register_buffer(p, buf.nbytes) == 0
    buf[: 1 << 20] = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    keys = [f"blk{i}" for i in range(256)]
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.soft_pin_action = SoftPinAction.ENABLE
    rc = mc.batch_put_from(keys, [p + i * 4096 for i in range(256)], [4096] * 256, cfg)
    assert rc == [0] * 256
    got = mc.batch_get_into(keys + ["absent"], [p + (4 << 20) + i * 4096 for i in range(257)],
                            [4096] * 257)
    assert got == [4096] * 256 + [NOT_FOUND]
    assert np.array_equal(buf[: 1 << 20], buf[4 << 20 : 5 << 20])
    assert mc.put_from("one", p, 100) == 0
    assert mc.upsert_from("one", p + 1, 50) == 0
    assert mc.batch_upsert_from(["one"], [p], [60]) == [0]
    assert mc.get_into("one", p + (7 << 20), 4096) == 60
    assert mc.get_into("absent", p, 4096) == NOT_FOUND
    # Per-key codes: a destination too small, a size of 0, a null pointer fail their key only.
    got = mc.batch_get_into(["one", "blk0", "blk1", "blk2"], [p, p + 8192, 0, p + 16384],
                            [10, 4096, 4096, 0])
    assert got == [INVALID, 4096, INVALID, INVALID]
    # The same with lists of plain ints (sent as they are, then key by key when refused).
    assert mc.batch_get_into(["one", "blk0"], [p, p + 8192], [10, 4096]) == [INVALID, 4096]
    assert mc.get_into("one", p, 0) == INVALID
    assert mc.batch_put_from(["z0", "z1"], [p, p], [0, 8]) == [INVALID, 0]
    assert mc.put_from("empty", p, 0) == 0 and mc.is_exist("empty") == 0
    assert mc.put("empty", b"") == INVALID
    # Lists of different lengths fail every key.
    assert mc.batch_put_from(["x", "y"], [p], [1, 2]) == [INVALID, INVALID]
    assert mc.batch_get_into(["x"], [p, p], [1]) == [INVALID]
    # As in Mooncake, a pointer need not be registered (the native yutu.Store insists).
    other = np.arange(64, dtype=np.uint8)
    assert mc.put_from("unreg", other.ctypes.data, 64) == 0
    # numpy integers are pointers and sizes too, as pybind11 takes them.
    assert mc.put_from("np", np.uint64(other.ctypes.data), np.int64(64)) == 0
    assert mc.get_size("np") == 64
    back = np.zeros(64, dtype=np.uint8)
    assert mc.get_into("unreg", back.ctypes.data, 64) == 64 and np.array_equal(other, back)
    assert mc.register_buffer(0, 10) == INVALID
    assert mc.register_buffer(p, buf.nbytes) == INVALID
    assert mc.unregister_buffer(p) == 0
    assert mc.unregister_buffer(p) == INVALID
    bad = ReplicateConfig()
    bad.replica_num = 0
    assert mc.put("r0", b"x", bad) == INVALID
    assert "replica_num: 1" in str(ReplicateConfig())


def test_exists_size_remove(mc):
    mc.put_batch(["layer0/a", "layer0/b", "layer1/a", "x"], [b"1", b"22", b"333", b"4444"])
    assert mc.is_exist("x") == 1
    assert mc.is_exist("nope") == 0
    assert mc.batch_is_exist(["x", "nope"]) == [1, 0]
    assert mc.get_size("layer1/a") == 3
    assert mc.get_size("nope") == NOT_FOUND
    assert mc.remove("x") == 0
    assert mc.remove("x") == NOT_FOUND
    assert mc.batch_remove(["layer1/a", "nope"]) == [0, NOT_FOUND]
    assert mc.remove_by_regex("^layer0/") == 2
    assert mc.remove_by_regex("[") == INVALID
    mc.put_batch(["y", "z"], [b"y", b"z"])
    assert mc.remove_all() == 2
    assert mc.batch_is_exist(["y", "z"]) == [0, 0]


def test_closed_store_answers_codes(mc):
    mc.close()
    assert mc.get("k") == b""
    # Mooncake's codes for a client that is closed (where Mooncake itself often crashes).
    assert mc.put("k", b"v") == INVALID
    assert mc.is_exist("k") == INVALID
    assert mc.batch_get_into(["k"], [1 << 20], [10]) == [INVALID]
    assert mc.remove_all() == INVALID
    assert mc.health_check() == 1


def test_unsupported_methods_say_so(mc):
    with pytest.raises(NotImplementedError, match="not supported by Yutu"):
        mc.get_tensor("k")
    with pytest.raises(AttributeError):
        mc.no_such_method()
    assert not hasattr(mc, "batch_get_into_multi_buffer_ranges")
    assert getattr(mc, "mount_segment", None) is None


def test_the_native_errors_are_reachable_too():
    assert issubclass(yutu.InvalidArgument, ValueError)
    assert issubclass(yutu.BucketNotFound, yutu.NotFound)


# Every public method of mooncake-transfer-engine-non-cuda 0.3.13.post1's
# MooncakeDistributedStore (the table in docs/python.md lists each).
MOONCAKE_METHODS = """
alloc_from_mem_pool allocate_and_mount_segment batch_get_buffer batch_get_into
batch_get_into_multi_buffer_ranges batch_get_into_multi_buffers batch_get_replica_desc
batch_get_session_end batch_get_session_start batch_get_tensor batch_get_tensor_into
batch_get_tensor_into_cuda batch_get_tensor_with_parallelism
batch_get_tensor_with_parallelism_into batch_get_tensor_with_tp batch_get_tensor_with_tp_into
batch_is_exist batch_pub_tensor batch_pub_tensor_with_tp batch_put_from
batch_put_from_multi_buffer_ranges batch_put_from_multi_buffers batch_put_session_end
batch_put_session_revoke batch_put_session_start batch_put_tensor batch_put_tensor_from
batch_put_tensor_with_parallelism batch_put_tensor_with_parallelism_from
batch_put_tensor_with_tp batch_put_tensor_with_tp_from batch_remove batch_replica_clear
batch_upsert_from batch_upsert_pub_tensor batch_upsert_tensor batch_upsert_tensor_from
batch_upsert_tensor_with_parallelism batch_upsert_tensor_with_parallelism_from close
create_copy_task create_move_task get get_batch get_buffer get_hostname get_into
get_into_ranges get_offload_rpc_read_count get_replica_desc get_size get_tensor
get_tensor_into get_tensor_into_cuda get_tensor_with_parallelism
get_tensor_with_parallelism_into get_tensor_with_tp get_tensor_with_tp_into health_check
init_all is_exist load_tensor_from_safetensor mount_segment pub_tensor pub_tensor_with_tp put
put_batch put_from put_from_with_metadata put_parts put_tensor put_tensor_from
put_tensor_with_parallelism put_tensor_with_parallelism_from put_tensor_with_tp
put_tensor_with_tp_from query_task register_buffer remove remove_all remove_by_regex
save_tensor_to_safetensor setup setup_dummy unmount_and_free_segment
unmount_local_disk_segment unmount_segment unregister_buffer upsert upsert_batch upsert_from
upsert_parts upsert_pub_tensor upsert_tensor upsert_tensor_from
upsert_tensor_with_parallelism upsert_tensor_with_parallelism_from
""".split()


def test_every_mooncake_method_is_implemented_or_refused_by_name():
    assert len(MOONCAKE_METHODS) == 97
    readme = (Path(__file__).resolve().parents[3] / "docs" / "python.md").read_text()
    for name in MOONCAKE_METHODS:
        implemented = name in vars(MooncakeDistributedStore)
        assert implemented != (name in mooncake.NOT_SUPPORTED), name
        assert f"`{name}`" in readme, f"{name} is missing from the table in docs/python.md"
