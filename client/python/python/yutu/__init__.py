"""Yutu's KV-cache store for inference engines.

``yutu.Store`` reads and writes the blocks of one bucket of a Yutu node: batches of blocks
move between the node and the caller's memory (registered pointers, numpy arrays, bytearrays,
CPU and CUDA tensors, ``__cuda_array_interface__`` arrays), and every call releases the GIL
while it waits. ``yutu.BlockHasher`` names
blocks by chained token hashes, the same keys the node's conductor routes by.
``yutu.mooncake.MooncakeDistributedStore`` is a drop-in for Mooncake Store's Python class.

    import numpy as np, yutu
    with yutu.Store("http://127.0.0.1:9000", bucket="llama") as store:
        buf = np.zeros(64 << 20, dtype=np.uint8)
        store.register_buffer(buf.ctypes.data, buf.nbytes)
        keys = yutu.BlockHasher(16).keys(list(range(64)))
        store.batch_put_from(keys, [buf.ctypes.data + i * (1 << 20) for i in range(4)], [1 << 20] * 4)
        store.batch_get_into(keys, [buf.ctypes.data + i * (1 << 20) for i in range(4)], [1 << 20] * 4)
"""

import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request

from . import _memory
from ._errors import (
    AuthError,
    BucketNotFound,
    Busy,
    Closed,
    DeviceError,
    Error,
    InvalidArgument,
    NoSpace,
    NotFound,
    TransferError,
    Unavailable,
)
from ._native import MAX_BATCH, BlockHasher, __version__
from ._native import Store as _NativeStore

__all__ = [
    "Store",
    "BlockHasher",
    "block_keys",
    "MAX_BATCH",
    "Error",
    "NotFound",
    "BucketNotFound",
    "NoSpace",
    "AuthError",
    "InvalidArgument",
    "Busy",
    "Unavailable",
    "TransferError",
    "DeviceError",
    "Closed",
    "__version__",
]


def block_keys(tokens, block_tokens, parent=None):
    """The keys of every full block of ``tokens`` (see :class:`BlockHasher`)."""
    return BlockHasher(block_tokens).keys(tokens, parent)


class Store(_NativeStore):
    """One bucket of a Yutu node.

    ``Store(url, *, bucket="default", token=None, access_key=None, secret_key=None,
    create_bucket=True, staging_chunk=32 MiB, staging_buffers=4)``: ``url`` is a node's URL
    or a list of them (the first that answers is used). Credentials: a bearer ``token``
    (``yutu token issue``), or an access/secret key pair, or the ``YUTU_TOKEN`` environment
    variable. Memory arguments are registered pointers (``int``, with a size) or objects
    (buffers, CPU and CUDA tensors, ``__cuda_array_interface__`` arrays; size optional).

    GPU memory is taken exactly like host memory: a CUDA tensor, a CuPy/Numba array, or a
    pointer inside a range registered with ``register_buffer(ptr, size, device="cuda:N")``.
    Blocks inside a range registered with ``device=`` move by GPUDirect RDMA (the node's NIC
    reads and writes GPU memory) where this host's engine runs RDMA with a peer-memory module
    loaded and the node offers RDMA (``buffer_path(ptr)`` says what a range got,
    ``device_path()`` what this host allows). All other GPU blocks are staged through pinned
    host buffers (double-buffered: the GPU copies one chunk while the node moves the next).
    A batch may mix host and GPU memory. The GPU's copies run on the store's own
    streams: make sure the kernels writing a tensor have finished before putting it (e.g.
    ``torch.cuda.current_stream().synchronize()``); a get's copies have finished when it
    returns. Without a CUDA driver such calls raise :class:`DeviceError`. When some blocks
    of a GPU batch fail and others do not, :class:`TransferError` names them and lists
    their indices in ``.failed``.

    When the node is a member of a cluster, the store routes every key to its owners itself
    (``cluster_nodes()`` says over how many nodes). Every put takes these keyword arguments,
    checked before anything is sent (a bad value raises :class:`InvalidArgument`):

    - ``if_absent=False``: with True, keys already stored keep their bytes.
    - ``replicas=None``: how many nodes get a copy, 1 to 7: the first ``replicas`` nodes of
      each key's placement order (``None``: the bucket's replica count). Copies beyond the
      bucket's own owners serve reads and last until the next membership change.
    - ``preferred_node=None``: a member's name (``--node-name``) that gets a copy besides the
      owners; a name that is not a member is refused.
    - ``pin=None``: ``"hard"`` keeps the blocks in the DRAM of every node that stores them
      until they are unpinned (the admin API's ``POST /admin/v1/unpin``); an integer is a
      soft pin of that many seconds (1 to 30 days), under which the blocks are evicted only
      when nothing unpinned is left. Pins are by key and outlive overwrites.

    A node alone stores one copy whatever ``replicas`` and ``preferred_node`` say, and pins it.
    """

    def put(self, key, value, *, if_absent=False, replicas=None, preferred_node=None, pin=None):
        """Stores the bytes of ``value`` (bytes or any buffer) under ``key``."""
        if type(value) is bytes and value:
            # The common case, handed to the native half as it is (no span to resolve).
            self._put_bytes([key], [value], if_absent, replicas, preferred_node, pin)
            return
        self.batch_put_from([key], [value], None, if_absent=if_absent, replicas=replicas,
                            preferred_node=preferred_node, pin=pin)

    def put_batch(self, keys, values, *, if_absent=False, replicas=None, preferred_node=None,
                  pin=None):
        """Stores ``values[i]`` under ``keys[i]``."""
        values = list(values)
        if values and all(type(v) is bytes and v for v in values):
            self._put_bytes(list(keys), values, if_absent, replicas, preferred_node, pin)
            return
        self.batch_put_from(keys, values, None, if_absent=if_absent, replicas=replicas,
                            preferred_node=preferred_node, pin=pin)

    def put_from(self, key, buffer, size=None, *, if_absent=False, replicas=None,
                 preferred_node=None, pin=None):
        """Stores ``size`` bytes of ``buffer`` (a registered pointer, or an object) under ``key``."""
        self.batch_put_from([key], [buffer], None if size is None else [size],
                            if_absent=if_absent, replicas=replicas,
                            preferred_node=preferred_node, pin=pin)

    def get_into(self, key, buffer, size=None):
        """Reads ``key`` into ``buffer`` (at most ``size`` bytes); returns its length.

        Raises :class:`NotFound` when the key is absent."""
        got = self.batch_get_into([key], [buffer], None if size is None else [size])
        if got[0] is None:
            raise NotFound(f"the key {key!r} does not exist")
        return got[0]

    def register_buffer(self, ptr, size, device=None):
        """Declares ``size`` bytes at ``ptr`` as memory the store may read and write; raw
        pointers passed to the other calls must lie inside a registered range.

        ``device`` says the range is GPU memory: ``"cuda:N"``, an ordinal ``N``, or a
        ``torch.device``; ``None`` or ``"cpu"`` is host memory. The GPU checks that the range
        is its memory, inside one allocation (:class:`DeviceError` when it is not, or when
        there is no CUDA driver)."""
        ordinal = _memory.device_ordinal(device)
        memfd = None
        if ordinal is None:
            # Memory from MooncakeHostMemAllocator: the node maps its memfd (memcpy speed).
            # Under the pools' lock, so that a concurrent free cannot close the fd first.
            with _memory._pools_lock:
                memfd = _memory.host_memfd_locked(ptr, size)
                return super().register_buffer(ptr, size, ordinal, memfd)
        return super().register_buffer(ptr, size, ordinal, memfd)

    def batch_put_from(self, keys, buffers, sizes=None, *, if_absent=False, replicas=None,
                       preferred_node=None, pin=None):
        """Stores each ``keys[i]`` from ``buffers[i]`` (``sizes[i]`` bytes).

        With ``if_absent``, keys already stored keep their bytes; ``replicas``,
        ``preferred_node`` and ``pin`` as the class describes them."""
        keys = list(keys)
        ptrs, lens, checked, devices, keep = _memory.spans(buffers, sizes, writable=False)
        try:
            # Spans of objects held here (raw pointers are checked, and keep a call off this):
            # the node reaches them in place through the client's own memory (and `keep` is
            # never freed if the call ends without the node's answer).
            self._put_spans(keys, ptrs, lens, checked, if_absent, replicas, preferred_node, pin,
                            devices=devices, own=True, keep=keep)
        finally:
            del keep

    def batch_get_into(self, keys, buffers, sizes=None):
        """Reads each ``keys[i]`` into ``buffers[i]`` (at most ``sizes[i]`` bytes).

        Returns each block's length, ``None`` where the key is absent."""
        keys = list(keys)
        ptrs, lens, checked, devices, keep = _memory.spans(buffers, sizes, writable=True)
        try:
            return self._get_spans(keys, ptrs, lens, checked, devices=devices, own=True,
                                   keep=keep)
        finally:
            del keep

    def cluster(self, timeout=5.0):
        """The node's membership document (``GET /v1/cluster``) as a dict: ``cluster`` (empty
        for a node alone), ``node``, ``members`` (each with ``name``, ``url``, ``transfer``,
        ``zone``...), ``buckets`` (replica counts). Raises :class:`Unavailable` when the node
        does not answer, :class:`AuthError` when it refuses the credentials."""
        return _http_json(self, "/v1/cluster", timeout)

    def remove_by_regex(self, pattern):
        """Deletes every key that ``re.search`` matches; returns how many were deleted."""
        rx = re.compile(pattern)
        return self._remove_keys([k for k in self.list_keys() if rx.search(k)])

    def remove_all(self):
        """Deletes every key of the bucket; returns how many were deleted."""
        return self._remove_keys(self.list_keys())

    def _remove_keys(self, keys):
        removed = 0
        for i in range(0, len(keys), MAX_BATCH):
            removed += sum(self.batch_remove(keys[i : i + MAX_BATCH]))
        return removed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _http_json(store, path, timeout):
    """``GET`` of one of the node's JSON endpoints, authenticated as the store's own calls."""
    base = urllib.parse.urlsplit(store.url)
    host = base.netloc.rpartition("@")[2]
    default = {"http": ":80", "https": ":443"}.get(base.scheme, "")
    if default and host.endswith(default):
        host = host[: -len(default)]
    req = urllib.request.Request(store.url.rstrip("/") + path, method="GET")
    req.add_header("Host", host)
    for name, value in store._auth_headers("GET", host, path, ""):
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read(16 << 20)
    except urllib.error.HTTPError as e:
        body = e.read(64 << 10).decode("utf-8", "replace")
        cls = AuthError if e.code in (401, 403) else (Busy if e.code in (429, 503) else Error)
        raise cls(f"GET {path}: {e.code} {body.strip()[:500]}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise Unavailable(f"GET {path} from {store.url}: {e}") from None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise Error(f"GET {path}: the answer is not JSON ({e})") from None
