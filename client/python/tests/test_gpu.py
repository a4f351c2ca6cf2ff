"""GPU memory through the package: CUDA tensors, ``__cuda_array_interface__`` arrays, and
pointers registered with ``device="cuda:N"``.

Most tests run on any machine: with ``YUTU_TEST_DEVICE=host`` set when the store is created,
its "GPUs" are stand-ins whose device addresses are host addresses, so fake CUDA tensors over
numpy arrays take the GPU path (the KV client's device staging pipeline) end to end against a
real node. ``test_real_gpu_*`` use torch on a real GPU and skip without one; the
``test_no_driver_*`` tests check what a host without a CUDA driver answers.
"""

import ctypes

import numpy as np
import pytest

import yutu
from yutu.mooncake import ErrorCode, MooncakeDistributedStore

KiB, MiB = 1 << 10, 1 << 20


class FakeCudaTensor:
    """What the store reads of a torch CUDA tensor; its "device memory" is a numpy array."""

    def __init__(self, arr, index=0):
        self.arr = arr
        self.device = type("Device", (), {"type": "cuda", "index": index})()

    def data_ptr(self):
        return self.arr.ctypes.data

    def numel(self):
        return self.arr.size

    def element_size(self):
        return self.arr.itemsize

    def is_contiguous(self):
        return self.arr.flags["C_CONTIGUOUS"]


class FakeCudaArray:
    """A CuPy/Numba-like array: only ``__cuda_array_interface__`` (and CuPy's ``device.id``)."""

    def __init__(self, arr, readonly=False, device_id=None, strides=False):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "shape": arr.shape,
            "typestr": arr.dtype.str,
            "data": (arr.ctypes.data, readonly),
            "strides": arr.strides if strides else None,
            "version": 3,
        }
        if device_id is not None:
            self.device = type("Device", (), {"id": device_id})()


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def gpu_store(node, bucket, monkeypatch):
    """A store whose GPUs are stand-ins over host memory."""
    monkeypatch.setenv("YUTU_TEST_DEVICE", "host")
    s = yutu.Store(node.url, bucket=bucket, token=node.admin_token)
    yield s
    s.close()


@pytest.mark.parametrize("size", [4 * KiB, 4 * MiB])
def test_host_to_gpu_and_gpu_to_host(gpu_store, size):
    src = pattern(size, 1)
    gpu_store.put_from("h2g", src)
    gpu = np.zeros(size, dtype=np.uint8)
    assert gpu_store.get_into("h2g", FakeCudaTensor(gpu)) == size
    assert gpu.tobytes() == src.tobytes()

    gsrc = pattern(size, 2)
    gpu_store.put_from("g2h", FakeCudaTensor(gsrc))
    host = np.zeros(size, dtype=np.uint8)
    assert gpu_store.get_into("g2h", host) == size
    assert host.tobytes() == gsrc.tobytes()
    assert gpu_store.get("g2h") == gsrc.tobytes()


def test_many_blocks_per_batch(gpu_store):
    n, block = 64, 64 * KiB
    src = pattern(n * block, 3)
    keys = [f"blk-{i}" for i in range(n)]
    gpu_store.batch_put_from(keys, [FakeCudaTensor(src[i * block:(i + 1) * block]) for i in range(n)])
    dst = np.zeros(n * block, dtype=np.uint8)
    got = gpu_store.batch_get_into(keys, [FakeCudaTensor(dst[i * block:(i + 1) * block]) for i in range(n)])
    assert got == [block] * n
    assert dst.tobytes() == src.tobytes()


def test_large_blocks_span_several_chunks(gpu_store):
    # 40 blocks of 4 MiB: three chunks of a 64 MiB staging half, so both halves alternate.
    n, block = 40, 4 * MiB
    src = pattern(n * block, 4)
    keys = [f"big-{i}" for i in range(n)]
    gpu_store.batch_put_from(keys, [FakeCudaTensor(src[i * block:(i + 1) * block]) for i in range(n)])
    dst = np.zeros(n * block, dtype=np.uint8)
    got = gpu_store.batch_get_into(keys, [FakeCudaTensor(dst[i * block:(i + 1) * block]) for i in range(n)])
    assert got == [block] * n
    assert dst.tobytes() == src.tobytes()


def test_typed_tensors_and_sizes(gpu_store):
    src = np.arange(4096, dtype=np.float32)
    gpu_store.put_from("f32", FakeCudaTensor(src))
    out = np.zeros(4096, dtype=np.float32)
    assert gpu_store.get_into("f32", FakeCudaTensor(out)) == src.nbytes
    assert np.array_equal(out, src)
    # A size below the tensor's: that many bytes; above it: refused.
    gpu_store.put_from("part", FakeCudaTensor(src), 100)
    assert gpu_store.get_size("part") == 100
    with pytest.raises(yutu.InvalidArgument, match="larger than"):
        gpu_store.put_from("x", FakeCudaTensor(src), src.nbytes + 1)
    # A room smaller than the block: the node's refusal, as on the host.
    small = np.zeros(10, dtype=np.uint8)
    with pytest.raises(yutu.Error) as gpu_err:
        gpu_store.get_into("f32", FakeCudaTensor(small))
    with pytest.raises(yutu.Error) as host_err:
        gpu_store.get_into("f32", small)
    assert type(gpu_err.value) is type(host_err.value)


def test_cuda_array_interface(gpu_store):
    src = pattern(256 * KiB, 5).reshape(256, KiB)
    gpu_store.put_from("cai", FakeCudaArray(src, readonly=True))
    out = np.zeros_like(src)
    assert gpu_store.get_into("cai", FakeCudaArray(out, device_id=0, strides=True)) == src.nbytes
    assert np.array_equal(out, src)
    with pytest.raises(yutu.InvalidArgument, match="read-only"):
        gpu_store.get_into("cai", FakeCudaArray(out, readonly=True))
    with pytest.raises(yutu.InvalidArgument, match="not C-contiguous"):
        gpu_store.put_from("cai2", FakeCudaArray(src[:, ::2], strides=True))
    # An empty array stores an empty block.
    gpu_store.put_from("empty", FakeCudaArray(np.zeros(0, dtype=np.uint8)))
    assert gpu_store.get_size("empty") == 0


def test_registered_device_pointers(gpu_store):
    n, block = 16, 64 * KiB
    src = pattern(n * block, 6)
    dst = np.zeros(n * block, dtype=np.uint8)
    gpu_store.register_buffer(src.ctypes.data, src.nbytes, device="cuda:0")
    gpu_store.register_buffer(dst.ctypes.data, dst.nbytes, device=0)
    try:
        # Registered with the client as GPU memory; without an RDMA device, staged, and why.
        path = gpu_store.buffer_path(src.ctypes.data)
        assert path.startswith("staged: no RDMA path"), path
        assert gpu_store.buffer_path(src.ctypes.data + 1) is None
        keys = [f"reg-{i}" for i in range(n)]
        gpu_store.batch_put_from(keys, [src.ctypes.data + i * block for i in range(n)], [block] * n)
        got = gpu_store.batch_get_into(keys, [dst.ctypes.data + i * block for i in range(n)], [block] * n)
        assert got == [block] * n
        assert dst.tobytes() == src.tobytes()
        # Outside every registered range: refused, as for host pointers.
        with pytest.raises(yutu.InvalidArgument, match="not inside a registered buffer"):
            gpu_store.get_into("reg-0", dst.ctypes.data + dst.nbytes - 10, block)
    finally:
        assert gpu_store.unregister_buffer(src.ctypes.data)
        assert gpu_store.unregister_buffer(dst.ctypes.data)
    assert gpu_store.buffer_path(src.ctypes.data) is None


def test_device_arguments(gpu_store):
    buf = np.zeros(4096, dtype=np.uint8)
    p = buf.ctypes.data
    torch_like = type("device", (), {"type": "cuda", "index": 1})()
    gpu_store.register_buffer(p, 1024, device=torch_like)
    gpu_store.register_buffer(p + 1024, 1024, device="cpu")
    gpu_store.register_buffer(p + 2048, 1024, device=None)
    for bad in ["cuda", "gpu:0", "cuda:x", -1, True, 1.5]:
        with pytest.raises(yutu.InvalidArgument):
            gpu_store.register_buffer(p + 3072, 1024, device=bad)
    with pytest.raises(yutu.InvalidArgument, match="null"):
        gpu_store.register_buffer(0, 1024, device="cuda:0")


def test_absent_keys_answer_as_on_the_host(gpu_store):
    gpu_store.put("present", b"x" * 1000)
    gpu = np.zeros(4096, dtype=np.uint8)
    host = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(yutu.NotFound):
        gpu_store.get_into("absent", FakeCudaTensor(gpu))
    keys = ["absent", "present", "absent-too"]
    on_gpu = gpu_store.batch_get_into(keys, [FakeCudaTensor(np.zeros(4096, dtype=np.uint8)) for _ in keys])
    on_host = gpu_store.batch_get_into(keys, [np.zeros(4096, dtype=np.uint8) for _ in keys])
    assert on_gpu == on_host == [None, 1000, None]
    assert gpu_store.get_into("present", FakeCudaTensor(gpu)) == 1000
    assert gpu[:1000].tobytes() == b"x" * 1000
    # A size of 0 is refused for a get, on the GPU as on the host.
    for target in (FakeCudaTensor(gpu), host):
        with pytest.raises(yutu.InvalidArgument, match="size of 0"):
            gpu_store.batch_get_into(["present"], [target], [0])


def test_mixed_batch_in_order(gpu_store):
    block = 32 * KiB
    kinds = ["host", "gpu0", "gpu1", "host", "gpu1", "cai", "gpu0", "host"]
    srcs = [pattern(block + i, 10 + i) for i in range(len(kinds))]

    def wrap(kind, arr):
        return {
            "host": lambda a: a,
            "gpu0": FakeCudaTensor,
            "gpu1": lambda a: FakeCudaTensor(a, index=1),
            "cai": FakeCudaArray,
        }[kind](arr)

    keys = [f"mix-{i}" for i in range(len(kinds))]
    gpu_store.batch_put_from(keys, [wrap(k, a) for k, a in zip(kinds, srcs)])
    # Read back with the places rotated, and one absent key in the middle.
    dsts = [np.zeros(block + 64, dtype=np.uint8) for _ in kinds]
    rotated = kinds[3:] + kinds[:3]
    got = gpu_store.batch_get_into(keys[:4] + ["nope"] + keys[4:],
                                   [wrap(k, d) for k, d in zip(rotated[:4], dsts[:4])]
                                   + [FakeCudaTensor(np.zeros(8, dtype=np.uint8))]
                                   + [wrap(k, d) for k, d in zip(rotated[4:], dsts[4:])])
    assert got == [block + i for i in range(4)] + [None] + [block + i for i in range(4, len(kinds))]
    for i, (s, d) in enumerate(zip(srcs, dsts)):
        assert d[: s.nbytes].tobytes() == s.tobytes(), i


def test_non_contiguous_cuda_tensor_is_refused(gpu_store):
    arr = np.zeros((64, 64), dtype=np.uint8)
    with pytest.raises(yutu.InvalidArgument, match="not contiguous"):
        gpu_store.put_from("nc", FakeCudaTensor(arr[:, ::2]))
    with pytest.raises(yutu.InvalidArgument, match="buffer 1: the tensor is not contiguous"):
        gpu_store.batch_get_into(["a", "b"], [FakeCudaTensor(arr[0]), FakeCudaTensor(arr.T)])
    no_index = FakeCudaTensor(arr)
    no_index.device.index = None
    with pytest.raises(yutu.InvalidArgument, match="no ordinal"):
        gpu_store.put_from("ni", no_index)


def test_partial_failure_names_the_blocks(gpu_store):
    # 160 blocks of 1 MiB run in chunks of one 64 MiB staging half (yutu_client's
    # STAGING_HALF); the room of block 100 is too small, so the chunk holding it fails on the
    # node and the chunks after it are not tried, while the chunk before it was moved.
    n, block = 160, MiB
    src = pattern(n * block, 7)
    keys = [f"part-{i}" for i in range(n)]
    gpu_store.batch_put_from(keys, [src[i * block:(i + 1) * block] for i in range(n)])
    dst = np.zeros(n * block, dtype=np.uint8)
    rooms = [block] * n
    rooms[100] = block // 2
    with pytest.raises(yutu.TransferError) as err:
        gpu_store.batch_get_into(keys, [FakeCudaTensor(dst[i * block:(i + 1) * block]) for i in range(n)], rooms)
    failed = err.value.failed
    assert 100 in failed and failed == sorted(failed) and failed[-1] == n - 1
    assert failed[0] > 0, "the chunks before the failing one were moved"
    assert f"{len(failed)} of {n} blocks failed (blocks {failed[0]}-{n - 1}: " in str(err.value)
    assert dst[: failed[0] * block].tobytes() == src[: failed[0] * block].tobytes()
    # With a host block after them: the GPU's blocks go first (they come first in the
    # batch), and the host block, never tried, is listed as failed too.
    host = np.zeros(block, dtype=np.uint8)
    with pytest.raises(yutu.TransferError) as err:
        gpu_store.batch_get_into(keys + ["part-0"],
                                 [FakeCudaTensor(dst[i * block:(i + 1) * block]) for i in range(n)]
                                 + [host], rooms + [block])
    assert err.value.failed == failed + [n]
    assert f"block {n}: not attempted" in str(err.value)
    assert not host.any()


def test_mooncake_on_gpu_memory(node, bucket, monkeypatch):
    monkeypatch.setenv("YUTU_TEST_DEVICE", "host")
    mc = MooncakeDistributedStore()
    assert mc.setup("gpu-client", "unused", 0, 16 << 20, "tcp", "", node.url,
                    tenant_id=bucket, token=node.admin_token) == 0
    try:
        n, block = 8, 128 * KiB
        src = pattern(n * block, 8)
        dst = np.zeros(n * block, dtype=np.uint8)
        assert mc.register_buffer(src.ctypes.data, src.nbytes, device="cuda:0") == 0
        assert mc.register_buffer(dst.ctypes.data, dst.nbytes, "cuda:0") == 0
        keys = [f"mc-{i}" for i in range(n)]
        assert mc.batch_put_from(keys, [src.ctypes.data + i * block for i in range(n)], [block] * n) == [0] * n
        ptrs = [dst.ctypes.data + i * block for i in range(n)] + [dst.ctypes.data]
        got = mc.batch_get_into(keys + ["mc-absent"], ptrs, [block] * (n + 1))
        assert got == [block] * n + [int(ErrorCode.OBJECT_NOT_FOUND)]
        assert dst.tobytes() == src.tobytes()
        assert mc.get_into("mc-3", dst.ctypes.data, block) == block
        assert mc.register_buffer(src.ctypes.data + src.nbytes, 10, device="gpu") == int(ErrorCode.INVALID_PARAMS)
    finally:
        mc.close()


def test_unknown_test_device_value_is_refused(node, bucket, monkeypatch):
    monkeypatch.setenv("YUTU_TEST_DEVICE", "gpu")
    with pytest.raises(yutu.InvalidArgument, match="YUTU_TEST_DEVICE"):
        yutu.Store(node.url, bucket=bucket, token=node.admin_token)


def test_device_path_says_staged(store):
    assert store.device_path().startswith("staged:")


# --- a host without a CUDA driver ------------------------------------------------------

def _has_cuda_driver():
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


no_driver = pytest.mark.skipif(_has_cuda_driver(), reason="this host has a CUDA driver")


@no_driver
def test_no_driver_raises_device_error(node, bucket, monkeypatch):
    monkeypatch.delenv("YUTU_TEST_DEVICE", raising=False)
    with yutu.Store(node.url, bucket=bucket, token=node.admin_token) as s:
        arr = np.zeros(4096, dtype=np.uint8)
        with pytest.raises(yutu.DeviceError, match="no CUDA driver") as err:
            s.put_from("k", FakeCudaTensor(arr))
        assert "cuda:0" in str(err.value) and err.value.code is None
        s.put("k", b"abc")
        with pytest.raises(yutu.DeviceError, match="no CUDA driver"):
            s.get_into("k", FakeCudaArray(arr))
        with pytest.raises(yutu.DeviceError, match="no CUDA driver"):
            s.batch_get_into(["k", "k"], [arr, FakeCudaTensor(arr)])
        with pytest.raises(yutu.DeviceError, match="no CUDA driver"):
            s.register_buffer(arr.ctypes.data, arr.nbytes, device="cuda:0")
        # Nothing was registered, and host memory still works.
        s.register_buffer(arr.ctypes.data, arr.nbytes)
        assert s.get_into("k", arr.ctypes.data, arr.nbytes) == 3


@no_driver
def test_no_driver_in_mooncake_is_a_code(node, bucket, monkeypatch):
    monkeypatch.delenv("YUTU_TEST_DEVICE", raising=False)
    mc = MooncakeDistributedStore()
    assert mc.setup("c", "unused", 0, 16 << 20, "tcp", "", node.url,
                    tenant_id=bucket, token=node.admin_token) == 0
    try:
        arr = np.zeros(4096, dtype=np.uint8)
        assert mc.register_buffer(arr.ctypes.data, arr.nbytes, device="cuda:0") < 0
    finally:
        mc.close()


# --- a real GPU (torch) ------------------------------------------------------------------

def _torch_cuda():
    try:
        import torch
    except ImportError:
        pytest.skip("no CUDA GPU: torch is not installed (the GPU tests use torch tensors)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch.cuda.is_available() is False on this host")
    return torch


@pytest.fixture
def real_store(node, bucket, monkeypatch):
    monkeypatch.delenv("YUTU_TEST_DEVICE", raising=False)
    s = yutu.Store(node.url, bucket=bucket, token=node.admin_token)
    yield s
    s.close()


@pytest.mark.parametrize("size", [4 * KiB, 4 * MiB])
def test_real_gpu_round_trips(real_store, size):
    torch = _torch_cuda()
    src = torch.from_numpy(pattern(size, 20))
    real_store.put_from("to-gpu", src)
    gpu = torch.zeros(size, dtype=torch.uint8, device="cuda:0")
    assert real_store.get_into("to-gpu", gpu) == size
    assert gpu.cpu().numpy().tobytes() == src.numpy().tobytes()

    gsrc = torch.from_numpy(pattern(size, 21)).to("cuda:0")
    torch.cuda.synchronize()
    real_store.put_from("from-gpu", gsrc)
    host = np.zeros(size, dtype=np.uint8)
    assert real_store.get_into("from-gpu", host) == size
    assert host.tobytes() == gsrc.cpu().numpy().tobytes()


def test_real_gpu_batches_and_registered_pointers(real_store):
    torch = _torch_cuda()
    n, block = 64, 64 * KiB
    src = torch.from_numpy(pattern(n * block, 22)).to("cuda:0")
    dst = torch.zeros(n * block, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    keys = [f"rg-{i}" for i in range(n)]
    real_store.batch_put_from(keys, [src[i * block:(i + 1) * block] for i in range(n)])
    real_store.register_buffer(dst.data_ptr(), dst.numel(), device=dst.device)
    try:
        got = real_store.batch_get_into(keys, [dst.data_ptr() + i * block for i in range(n)], [block] * n)
    finally:
        real_store.unregister_buffer(dst.data_ptr())
    assert got == [block] * n
    assert torch.equal(src, dst)


@pytest.fixture
def real_mc(node, bucket, monkeypatch):
    """The Mooncake class on real GPUs (no stand-in)."""
    monkeypatch.delenv("YUTU_TEST_DEVICE", raising=False)
    mc = MooncakeDistributedStore()
    assert mc.setup("c", "unused", 0, 16 << 20, "tcp", "", node.url,
                    tenant_id=bucket, token=node.admin_token) == 0
    yield mc
    mc.close()


def test_real_gpu_register_buffer_asks_the_driver(real_mc):
    """Mooncake's register_buffer(ptr, size) has no device argument: vLLM registers its GPU KV
    tensors through it. The driver says which ranges are GPU memory."""
    torch = _torch_cuda()
    mc = real_mc
    size = 4 * MiB
    gpu = torch.from_numpy(pattern(size, 30)).to("cuda:0")
    out = torch.zeros(size, dtype=torch.uint8, device="cuda:0")
    host = torch.zeros(size, dtype=torch.uint8)
    pinned = torch.zeros(size, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    for t in (gpu, out, host, pinned):
        assert mc.register_buffer(t.data_ptr(), t.numel()) == 0
    devs = mc._s()._devices_of([gpu.data_ptr(), out.data_ptr(), host.data_ptr(),
                                pinned.data_ptr()], [1] * 4)
    assert devs == [0, 0, None, None]
    assert mc.put_from("g", gpu.data_ptr(), size) == 0
    assert mc.get_into("g", out.data_ptr(), size) == size
    assert torch.equal(gpu, out)
    assert mc.get_into("g", pinned.data_ptr(), size) == size
    assert torch.equal(pinned, gpu.cpu())


def test_real_gpu_multi_buffers(real_mc):
    """vLLM's shape: a block's K/V segments in several GPU tensors, one key per block."""
    torch = _torch_cuda()
    mc = real_mc
    layers, blocks, seg = 4, 16, 64 * KiB
    kv = [torch.from_numpy(pattern(2 * blocks * seg, 40 + i)).to("cuda:0").view(2, blocks, seg)
          for i in range(layers)]
    torch.cuda.synchronize()
    for t in kv:
        assert mc.register_buffer(t.data_ptr(), t.numel()) == 0

    def addrs(b):
        return [t[h, b].data_ptr() for t in kv for h in range(2)]

    keys = [f"vb{i}" for i in range(8)]
    assert mc.batch_put_from_multi_buffers(keys, [addrs(b) for b in range(8)],
                                           [[seg] * 2 * layers] * 8) == [0] * 8
    got = mc.batch_get_into_multi_buffers(keys, [addrs(8 + b) for b in range(8)],
                                          [[seg] * 2 * layers] * 8)
    assert got == [2 * layers * seg] * 8
    for t in kv:
        assert torch.equal(t[:, :8], t[:, 8:])
