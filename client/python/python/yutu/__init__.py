"""Yutu's KV-cache store for inference engines.

``yutu.Store`` reads and writes the blocks of one bucket of a Yutu node: batches of blocks
move between the node and the caller's memory (registered pointers, numpy arrays, bytearrays,
CPU tensors), and every call releases the GIL while it waits. ``yutu.BlockHasher`` names
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

import re

from . import _memory
from ._errors import (
    AuthError,
    BucketNotFound,
    Busy,
    Closed,
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
    (buffers and CPU tensors, size optional).
    """

    def put(self, key, value, *, if_absent=False):
        """Stores the bytes of ``value`` (bytes or any buffer) under ``key``."""
        self.batch_put_from([key], [value], None, if_absent=if_absent)

    def put_batch(self, keys, values, *, if_absent=False):
        """Stores ``values[i]`` under ``keys[i]``."""
        self.batch_put_from(keys, values, None, if_absent=if_absent)

    def put_from(self, key, buffer, size=None, *, if_absent=False):
        """Stores ``size`` bytes of ``buffer`` (a registered pointer, or an object) under ``key``."""
        self.batch_put_from([key], [buffer], None if size is None else [size], if_absent=if_absent)

    def get_into(self, key, buffer, size=None):
        """Reads ``key`` into ``buffer`` (at most ``size`` bytes); returns its length.

        Raises :class:`NotFound` when the key is absent."""
        got = self.batch_get_into([key], [buffer], None if size is None else [size])
        if got[0] is None:
            raise NotFound(f"the key {key!r} does not exist")
        return got[0]

    def batch_put_from(self, keys, buffers, sizes=None, *, if_absent=False):
        """Stores each ``keys[i]`` from ``buffers[i]`` (``sizes[i]`` bytes).

        With ``if_absent``, keys already stored keep their bytes."""
        keys = list(keys)
        ptrs, lens, checked, keep = _memory.spans(buffers, sizes, writable=False)
        try:
            self._put_spans(keys, ptrs, lens, checked, if_absent)
        finally:
            del keep

    def batch_get_into(self, keys, buffers, sizes=None):
        """Reads each ``keys[i]`` into ``buffers[i]`` (at most ``sizes[i]`` bytes).

        Returns each block's length, ``None`` where the key is absent."""
        keys = list(keys)
        ptrs, lens, checked, keep = _memory.spans(buffers, sizes, writable=True)
        try:
            return self._get_spans(keys, ptrs, lens, checked)
        finally:
            del keep

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
