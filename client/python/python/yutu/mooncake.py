"""Mooncake Store's Python API on Yutu: ``MooncakeDistributedStore``, ``ReplicateConfig``,
``SoftPinAction``.

Code written for ``mooncake.store`` (vLLM's MooncakeStoreConnector, SGLang HiCache's mooncake
backend, LMCache's mooncakestore backend) runs on a Yutu node by changing one import::

    from yutu.mooncake import MooncakeDistributedStore      # was: from mooncake.store import ...

or, without touching that code, by calling ``yutu.mooncake.install()`` first: it makes
``import mooncake.store`` resolve to this module.

The methods keep Mooncake's names, argument order and return conventions: ``0`` or a byte
count on success, Mooncake's negative ``ErrorCode`` values on failure (never an exception for
a failed operation), ``b""`` for a ``get`` that found nothing, ``1``/``0``/``-1`` from
``is_exist``. ``setup``'s ``master_server_addr`` names the Yutu node (``http://host:port``, or
``host:port``, or several separated by commas); ``tenant_id`` is the bucket. docs/python.md's
table lists every Mooncake method: supported, supported differently, or not.
"""

import ctypes
import enum
import importlib
import json
import os
import math
import numbers
import operator
import logging
import re
import sys
import threading
import time
import types
import urllib.parse
import weakref

from . import Store, _memory, _native
from ._errors import (
    AuthError,
    Busy,
    Closed,
    Error,
    InvalidArgument,
    NoSpace,
    NotFound,
    TransferError,
    Unavailable,
)

log = logging.getLogger("yutu.mooncake")


class ErrorCode(enum.IntEnum):
    """Mooncake's error codes (``mooncake-store/include/types.h``) that Yutu answers with."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    NO_AVAILABLE_HANDLE = -200
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_READ = -701
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    NOT_SUPPORTED = -1012


class SoftPinAction(enum.IntEnum):
    """What a put does to the soft pin of its object (Mooncake's ``SoftPinAction``)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


# Mooncake master's default soft-pin TTL (DEFAULT_KV_SOFT_PIN_TTL_MS in mooncake-store's
# types.h: 30 minutes), for a ReplicateConfig that enables a soft pin without a TTL.
DEFAULT_SOFT_PIN_TTL_MS = 30 * 60 * 1000
# Yutu's limits: copies per put (yutu_api::cluster::MAX_REPLICAS) and the longest soft pin
# (yutu_api::kv::MAX_SOFT_PIN_SECS).
MAX_REPLICAS = 7
MAX_SOFT_PIN_SECS = 30 * 24 * 3600
# How long a membership read for preferred segments is reused (the Rust client's refresh).
_MEMBERS_TTL = 2.0


class ReplicateConfig:
    """Mooncake's per-put placement options, accepted by every put. On Yutu: ``replica_num``
    above 1 is the number of nodes that get a copy (1, Mooncake's default, leaves the bucket's
    replica count); ``with_hard_pin`` pins the blocks hard; ``soft_pin_action=ENABLE`` pins
    them soft for ``soft_pin_ttl_ms`` (rounded up to seconds; Mooncake's 30 minutes when
    None); ``preferred_segments``/``preferred_segment`` naming a cluster member (its name, or
    its URL's or transfer engine's ``host:port``) give that node a copy too. The rest is
    accepted and ignored; docs/python.md has the details."""

    def __init__(self):
        self.replica_num = 1
        self.with_hard_pin = False
        self.soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms = None
        self.preferred_segment = ""
        self.preferred_segments = []
        self.prefer_alloc_in_same_node = False
        self.preferred_nof_segments = []
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.group_ids = None
        self.data_type = 0

    @property
    def soft_pin_ttl_ms(self):
        """The soft pin's TTL in milliseconds, or None (Mooncake's default, 30 minutes). As in
        Mooncake (an ``optional<uint64_t>``): an int from 0 to 2**64-1 or None, else
        ``TypeError``. Set without ``soft_pin_action=ENABLE``, a put fails with
        ``INVALID_PARAMS``; 0 with ENABLE stores the blocks unpinned."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value):
        if value is not None:
            n = _index(value)
            if n is None or not 0 <= n < 1 << 64:
                raise TypeError(
                    f"soft_pin_ttl_ms must be None or an int from 0 to 2**64-1, not {value!r}"
                )
            value = n
        self._soft_pin_ttl_ms = value

    def __str__(self):
        ttl = "default" if self.soft_pin_ttl_ms is None else self.soft_pin_ttl_ms
        return (
            f"ReplicateConfig: {{ replica_num: {self.replica_num}, soft_pin_action: "
            f"{SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: {ttl}, "
            f"with_hard_pin: {int(bool(self.with_hard_pin))}, preferred_segments: "
            f"{list(self.preferred_segments)}, prefer_alloc_in_same_node: "
            f"{int(bool(self.prefer_alloc_in_same_node))} }}"
        )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)?\s*$", re.IGNORECASE)


def parse_size(value):
    """A size as Mooncake's config takes it: an int, or text like ``"512MB"``/``"4 GiB"``
    (binary multiples either way, as Mooncake reads them)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"negative size: {value}")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r}")
    scale = 1024 ** " kmgtp".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


def _urls(master_server_addr):
    urls = []
    for part in str(master_server_addr).split(","):
        part = part.strip()
        if not part:
            continue
        if "://" not in part:
            part = "http://" + part
        urls.append(part)
    if not urls:
        raise ValueError("master_server_addr names no node")
    return urls


def _code(exc):
    """The Mooncake error code for a failure of a Yutu call."""
    if isinstance(exc, NotFound):
        return ErrorCode.OBJECT_NOT_FOUND
    if isinstance(exc, (InvalidArgument, Closed, ValueError, TypeError, OverflowError, re.error)):
        # Closed too: Mooncake's answer for a client that is not set up or was closed.
        return ErrorCode.INVALID_PARAMS
    if isinstance(exc, NoSpace):
        return ErrorCode.NO_AVAILABLE_HANDLE
    if isinstance(exc, AuthError):
        return ErrorCode.ILLEGAL_CLIENT
    if isinstance(exc, Busy):
        return ErrorCode.RPC_TIMEOUT
    if isinstance(exc, Unavailable):
        return ErrorCode.RPC_FAIL
    if isinstance(exc, TransferError):
        return ErrorCode.TRANSFER_FAIL
    return ErrorCode.INTERNAL_ERROR


_RECOVERABLE = (Error, ValueError, TypeError, OverflowError, re.error)
# batch_get_buffer allocates handles of the remembered block size only while a batch of them
# stays under this; above it, sizes are asked first.
_MAX_GUESSED_BYTES = 256 << 20


class Unsupported(NotImplementedError, AttributeError):
    """A Mooncake method Yutu does not offer: also an ``AttributeError``, so that
    ``hasattr(store, name)`` answers False as code probing for optional methods expects."""


class MooncakeDistributedStore:
    """A Yutu node behind Mooncake Store's client class."""

    def __init__(self):
        self._store = None
        self._hostname = ""
        self._closed = False
        self._members_lock = threading.Lock()
        self._members_cache = (0.0, None)
        # The largest block the last batch_get_buffer found (see there), the slab its
        # handles are carved from, and the size setup gave for it (Mooncake's local buffer).
        self._buffer_hint = 0
        self._slabs = None
        self._local_buffer_size = 16 << 20

    # --- setup and lifetime ------------------------------------------------------------

    def setup(
        self,
        local_hostname=None,
        metadata_server=None,
        global_segment_size=16 << 20,
        local_buffer_size=16 << 20,
        protocol="tcp",
        rdma_devices="",
        master_server_addr="127.0.0.1:9000",
        engine=None,
        enable_ssd_offload=False,
        ssd_offload_path="",
        tenant_id="default",
        enable_client_http_server=False,
        client_http_port=9300,
        **yutu_options,
    ):
        """Connects to the Yutu node ``master_server_addr``; returns 0, or a negative code.

        Also ``setup(config_dict)`` with Mooncake's keys. Yutu reads ``master_server_addr``,
        ``tenant_id`` (the bucket), ``local_hostname`` (``get_hostname``), and its own keys
        ``token`` (else ``YUTU_TOKEN``), ``access_key``/``secret_key``. The rest configure
        Mooncake's client segment and transports, which a Yutu node does not need: they are
        checked for type and otherwise ignored.
        """
        if isinstance(local_hostname, dict):
            cfg = _config(local_hostname)
            if not cfg.get("local_hostname") or not cfg.get("metadata_server"):
                log.error("setup: local_hostname and metadata_server are required")
                return int(ErrorCode.INVALID_PARAMS)
            return self.setup(**cfg)
        if not local_hostname:
            log.error("setup: local_hostname is required")
            return int(ErrorCode.INVALID_PARAMS)
        try:
            parse_size(global_segment_size)
            parse_size(local_buffer_size)
            urls = _urls(master_server_addr)
            unknown = set(yutu_options) - {"token", "access_key", "secret_key"}
            if unknown:
                raise ValueError(f"unknown setup arguments: {sorted(unknown)}")
            if self._store is not None:
                self._store.close()
            self._store = Store(
                urls,
                bucket=tenant_bucket(tenant_id),
                token=yutu_options.get("token"),
                access_key=yutu_options.get("access_key"),
                secret_key=yutu_options.get("secret_key"),
            )
        except _RECOVERABLE as e:
            log.error("setup failed: %s", e)
            return int(_code(e))
        self._hostname = _with_port(str(local_hostname), self._store._engine_port())
        self._local_buffer_size = parse_size(local_buffer_size)
        self._slabs = None
        self._closed = False
        with self._members_lock:
            self._members_cache = (0.0, None)
        return 0

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """Mooncake's setup from its configuration: the JSON file ``MOONCAKE_CONFIG_PATH``
        names, else the ``MOONCAKE_*`` environment (see :func:`config_from_env`); 0 or a
        negative code."""
        try:
            cfg = config_from_env()
        except (OSError, ValueError) as e:
            log.error("init_all: %s", e)
            return int(ErrorCode.INVALID_PARAMS)
        cfg.setdefault("protocol", protocol)
        return self.setup(cfg)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's standalone client, which forwards every call to a separate client
        process at ``server_address``. On Yutu the node is that process: ``server_address``
        names a Yutu node (or several, comma-separated) and the store talks to it directly
        (bucket ``default``, or ``MOONCAKE_TENANT_ID``); the sizes are checked and otherwise
        unused. 0, or -1 when the node does not answer (as Mooncake's)."""
        try:
            parse_size(mem_pool_size)
            parse_size(local_buffer_size)
        except ValueError as e:
            log.error("setup_dummy: %s", e)
            return -1
        ret = self.setup(
            "yutu-dummy-client",
            "P2PHANDSHAKE",
            0,
            local_buffer_size,
            "tcp",
            "",
            server_address,
            tenant_id=os.environ.get("MOONCAKE_TENANT_ID") or "default",
        )
        if ret != 0:
            return -1
        # A standalone client owns no segment: Mooncake's answers "".
        self._hostname = ""
        return 0

    def close(self):
        """Ends the session; returns 0. Calls after it fail."""
        if self._store is not None:
            self._store.close()
        self._closed = True
        self._hostname = ""
        return 0

    def health_check(self):
        """0: healthy; 1: not set up or closed; 2: the node does not answer."""
        if self._store is None or self._closed:
            return 1
        try:
            self._store.is_exist("yutu-health-check")
        except _RECOVERABLE:
            return 2
        return 0

    def get_hostname(self):
        """This client's ``host:port``, as Mooncake's (its transfer engine's address): the
        ``local_hostname`` given to setup with the client's transfer port added when it named
        none; ``""`` before setup, after close, and for a standalone (``setup_dummy``) client."""
        return "" if self._closed else self._hostname

    # --- plumbing -----------------------------------------------------------------------

    def _s(self):
        if self._store is None:
            raise Closed("setup() was not called")
        return self._store

    def _int(self, f):
        """Runs ``f``; its result, or the error code of its failure."""
        try:
            return f()
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return int(_code(e))

    def _each(self, n, f):
        """Runs a batch ``f``; on failure every key gets the error code."""
        try:
            return f()
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return [int(_code(e))] * n

    # --- buffers ------------------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size, device=None):
        """Registers ``size`` bytes at ``buffer_ptr`` for the ``*_from``/``*_into`` calls.

        ``device`` (Yutu's addition) says the range is GPU memory: ``"cuda:N"`` or an
        ordinal; pointers inside it are then moved as GPU memory (checked by the driver
        here). Mooncake's own ``register_buffer`` takes no such argument: a GPU pointer in a
        range registered without it is taken for host memory."""
        return self._int(lambda: self._s().register_buffer(buffer_ptr, size, device) or 0)

    def unregister_buffer(self, buffer_ptr):
        def run():
            if not self._s().unregister_buffer(buffer_ptr):
                raise InvalidArgument(f"no buffer registered at {buffer_ptr:#x}")
            return 0

        return self._int(run)

    # --- puts ---------------------------------------------------------------------------

    def _options(self, config):
        """The put's keyword arguments for ``yutu.Store`` from a ``ReplicateConfig``."""
        if config is None:
            return {}
        n = _index(getattr(config, "replica_num", 1))
        if n is None or n < 1:
            raise InvalidArgument("replica_num must be at least 1")
        opts = {}
        # Mooncake's replica_num is a copy count with 1 as its default, the value nearly
        # every caller leaves: 1 keeps the bucket's own count (so it never undoes a bucket
        # created with more copies); above it, that many nodes get a copy, at most
        # MAX_REPLICAS (Mooncake allocates replicas best effort too).
        if n > 1:
            opts["replicas"] = min(n, MAX_REPLICAS)
        action = _soft_pin_action(config)
        ttl_ms = getattr(config, "soft_pin_ttl_ms", None)
        if ttl_ms is not None and action != SoftPinAction.ENABLE:
            # Mooncake's master refuses this combination (INVALID_PARAMS) on every put.
            raise InvalidArgument("soft_pin_ttl_ms is set but soft_pin_action is not ENABLE")
        if getattr(config, "with_hard_pin", False):
            opts["pin"] = "hard"
        elif action == SoftPinAction.ENABLE:
            if ttl_ms is None:
                ttl_ms = DEFAULT_SOFT_PIN_TTL_MS
            ms = _index(ttl_ms)
            if ms is None or ms < 0 or math.ceil(ms / 1000) > MAX_SOFT_PIN_SECS:
                raise InvalidArgument(
                    f"soft_pin_ttl_ms must be 0 to {MAX_SOFT_PIN_SECS * 1000}, not {ttl_ms!r}"
                )
            if ms > 0:
                # 0 stores the blocks as ordinary cache, as Mooncake does.
                opts["pin"] = -(-ms // 1000)
        node = self._preferred_node(config)
        if node is not None:
            opts["preferred_node"] = node
        return opts

    def _preferred_node(self, config):
        """The member the config's preferred segments name first, or None."""
        segments = list(getattr(config, "preferred_segments", None) or [])
        one = getattr(config, "preferred_segment", "")
        if one:
            segments.append(one)
        segments = [str(s).strip() for s in segments if s and str(s).strip()]
        if not segments:
            return None
        members = self._members()
        for seg in segments:
            name = members.get(seg) or members.get(seg.lower())
            if name is not None:
                return name
        log.debug("preferred segments %s name no member of the cluster: ignored", segments)
        return None

    def _members(self):
        """What names a member: its name, and its URL's and transfer engine's ``host:port``
        (read from the node at most every ``_MEMBERS_TTL`` seconds; empty when the node is
        alone or does not answer)."""
        with self._members_lock:
            at, names = self._members_cache
            if names is not None and time.monotonic() - at < _MEMBERS_TTL:
                return names
        store = self._s()
        names = {}
        if store.cluster_nodes() > 0:
            try:
                members = store.cluster().get("members") or []
            except _RECOVERABLE as e:
                log.debug("cannot read the cluster's members: %s", e)
                members = []
            for m in members:
                name = m.get("name")
                if not name:
                    continue
                for alias in (_host_port(m.get("url")), m.get("transfer")):
                    if alias:
                        names.setdefault(alias.lower(), name)
            # A member's own name comes first, over another member's address.
            names.update({m["name"]: m["name"] for m in members if m.get("name")})
        with self._members_lock:
            self._members_cache = (time.monotonic(), names)
        return names

    def _send_put(self, put, opts):
        """``put(**opts)``; a preferred node that left the cluster since ``_members`` read it
        is dropped rather than failing the put (Mooncake ignores such a segment)."""
        try:
            put(**opts)
        except InvalidArgument as e:
            if "preferred_node" not in opts or "no member is named" not in str(e):
                raise
            with self._members_lock:
                self._members_cache = (0.0, None)
            put(**{k: v for k, v in opts.items() if k != "preferred_node"})

    def _put(self, keys, values, overwrite, config):
        """Stores values (bytes-like objects); 0 or a code for the whole batch."""
        opts = self._options(config)
        store = self._s()
        if _plain(values):
            self._send_put(
                lambda **o: store._put_bytes(keys, values, not overwrite, **o), opts)
            return 0
        if any(len(memoryview(v)) == 0 for v in values):
            raise InvalidArgument("a value of 0 bytes cannot be stored")
        self._send_put(
            lambda **o: store.batch_put_from(keys, values, None, if_absent=not overwrite, **o),
            opts,
        )
        return 0

    def put(self, key, value, config=None):
        """Stores ``value`` unless ``key`` is stored already (then 0, the old bytes kept)."""
        if config is None and type(value) is bytes and value:
            return self._put_plain([key], [value], False)
        return self._int(lambda: self._put([key], [value], False, config))

    def upsert(self, key, value, config=None):
        """Stores ``value``, replacing what ``key`` held."""
        if config is None and type(value) is bytes and value:
            return self._put_plain([key], [value], True)
        return self._int(lambda: self._put([key], [value], True, config))

    def _put_plain(self, keys, values, overwrite):
        """The common put (Mooncake's own tests, engines' small objects): values of ``bytes``,
        no options, handed to the native half as they are. 0 or the failure's code."""
        try:
            self._s()._put_bytes(keys, values, not overwrite)
            return 0
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return int(_code(e))

    def put_batch(self, keys, values, config=None):
        return self._int(lambda: self._put(_same(keys, values), list(values), False, config))

    def upsert_batch(self, keys, values, config=None):
        return self._int(lambda: self._put(_same(keys, values), list(values), True, config))

    def _put_parts(self, key, parts, overwrite, config):
        """Stores the concatenation of ``parts`` (bytes-like objects, tensors) under ``key``,
        gathered by the native half in one node call (no joined copy in Python)."""
        opts = self._options(config)
        store = self._s()
        ptrs, lens, checked, devices, keep = _memory.spans(list(parts), None, writable=False)
        try:
            nonempty = [i for i, n in enumerate(lens) if n > 0]
            if not nonempty:
                # Mooncake stores nothing for a total size of 0, and answers 0.
                return 0
            args = (
                [key],
                [[ptrs[i] for i in nonempty]],
                [[lens[i] for i in nonempty]],
                not overwrite,
            )
            dev = [[devices[i] for i in nonempty]]
            # Objects held here for the call (never raw pointers): the node reads them in
            # place through the client's own memory, with no staging copy.
            own = not any(checked)
            self._send_put(
                lambda **o: store._put_parts(*args, devices=dev, own=own, keep=keep, **o), opts)
        finally:
            del keep
        return 0

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of ``parts`` under ``key`` (kept when ``key`` is stored
        already, as ``put``)."""
        return self._int(lambda: self._put_parts(key, parts, False, config))

    def upsert_parts(self, key, *parts, config=None):
        """Stores the concatenation of ``parts`` under ``key``, replacing what it held."""
        return self._int(lambda: self._put_parts(key, parts, True, config))

    # --- scatter/gather: a key's value in several buffers ---------------------------------

    def _multi_args(self, keys, all_ptrs, all_sizes):
        """The keys and per-key pointer and size lists of a multi-buffer call, and the
        indices of the keys whose lists are usable; None when the shapes disagree (Mooncake
        then fails every key with INVALID_PARAMS)."""
        keys = list(keys)
        # Lists of plain positive ints, as engines pass them, are checked natively (per span
        # in Python it cost about 2 us, a third of a 512-span call).
        if _native.plain_spans(all_ptrs, all_sizes, len(keys)):
            return keys, all_ptrs, all_sizes, list(range(len(keys)))
        try:
            ptrs = [[_index(p) for p in ps] for ps in all_ptrs]
            sizes = [[_index(z) for z in zs] for zs in all_sizes]
        except TypeError:
            return keys, None, None, []
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return keys, None, None, []
        if any(len(p) != len(z) for p, z in zip(ptrs, sizes)):
            return keys, None, None, []
        todo = [
            i for i in range(len(keys))
            if ptrs[i] and all(_pointer(p, z) for p, z in zip(ptrs[i], sizes[i]))
        ]
        return keys, ptrs, sizes, todo

    def _parts_from(self, keys, all_ptrs, all_sizes, overwrite, config):
        if self._store is None or self._closed:
            # Mooncake's answer for a client that is not set up: an empty list.
            return []
        keys, ptrs, sizes, todo = self._multi_args(keys, all_ptrs, all_sizes)
        n = len(keys)
        if ptrs is None:
            return [int(ErrorCode.INVALID_PARAMS)] * n
        try:
            opts = self._options(config)
            store = self._s()
        except _RECOVERABLE as e:
            return [int(_code(e))] * n
        codes = [int(ErrorCode.INVALID_PARAMS)] * n

        def send(idx):
            args = ([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx],
                    not overwrite)
            self._send_put(lambda **o: store._put_parts(*args, **o), opts)

        _per_key(todo, send, codes, lambda i, _: 0)
        return codes

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores each ``keys[i]`` as the concatenation of the buffers ``all_buffer_ptrs[i]``
        (``all_sizes[i]`` bytes each), in one node call per batch: 0 per key, or a negative
        code. A key already stored keeps its bytes and answers 0, as Mooncake's. GPU buffers
        (registered GPU memory) are gathered through host memory."""
        return self._parts_from(keys, all_buffer_ptrs, all_sizes, False, config)

    def batch_upsert_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """As ``batch_put_from_multi_buffers``, replacing what the keys held (Yutu's addition:
        Mooncake binds no such method)."""
        return self._parts_from(keys, all_buffer_ptrs, all_sizes, True, config)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Reads each ``keys[i]`` into the buffers ``all_buffer_ptrs[i]`` in order (the first
        ``all_sizes[i][0]`` bytes into the first, and so on), in one node call per batch.
        Per key: the object's size, ``OBJECT_NOT_FOUND``, or ``INVALID_PARAMS`` when the
        buffers hold less than the object (nothing is written then, as Mooncake's)."""
        if self._store is None or self._closed:
            return [int(ErrorCode.INVALID_PARAMS)] * len(list(keys))
        keys, ptrs, sizes, todo = self._multi_args(keys, all_buffer_ptrs, all_sizes)
        n = len(keys)
        if ptrs is None:
            return [int(ErrorCode.INVALID_PARAMS)] * n
        store = self._s()
        codes = [int(ErrorCode.INVALID_PARAMS)] * n
        got = {}

        def send(idx):
            r = store._get_parts([keys[i] for i in idx], [ptrs[i] for i in idx],
                                 [sizes[i] for i in idx])
            got.update(zip(idx, r))

        def ok(i, _):
            return int(ErrorCode.OBJECT_NOT_FOUND) if got[i] is None else got[i]

        _per_key(todo, send, codes, ok)
        return codes

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Mooncake's ranged reads: fragment ``[i][j][k]`` copies bytes
        ``[src, src + size)`` of object ``all_keys[i][j]`` to ``buffer_ptrs[i] + dst``. The
        answer has the fragments' shape: ``size`` where copied, else a negative code
        (``OBJECT_NOT_FOUND`` for a missing key, ``INVALID_PARAMS`` for a range outside the
        object or outside the registered buffer holding ``buffer_ptrs[i]``,
        ``NOT_SUPPORTED`` for a buffer in GPU memory). Each distinct key is read once."""
        bad = int(ErrorCode.INVALID_PARAMS)

        def shape(fill):
            out = []
            for i, ks in enumerate(all_keys if isinstance(all_keys, (list, tuple)) else []):
                row = []
                for j in range(len(ks)):
                    # As Mooncake's: a key's row has a result per destination offset (none
                    # for a key asked no ranges), one when that list is missing.
                    try:
                        row.append([fill] * len(all_dst_offsets[i][j]))
                    except (IndexError, TypeError):
                        row.append([fill])
                out.append(row)
            return out

        try:
            store = self._s()
            n = len(buffer_ptrs)
            if not (len(all_keys) == len(all_dst_offsets) == len(all_src_offsets)
                    == len(all_sizes) == n):
                return shape(bad)
        except _RECOVERABLE as e:
            return shape(int(_code(e)))
        except TypeError:
            return shape(bad)
        out = shape(bad)
        wanted = sorted({k for ks in all_keys for k in ks})
        try:
            found = dict(zip(wanted, store._get_buffers(wanted, bytearray)))
        except _RECOVERABLE as e:
            return shape(int(_code(e)))
        for i in range(n):
            base = _index(buffer_ptrs[i])
            room = store._room(base) if base else 0
            if room == 0:
                continue
            if store._devices_of([base], [1])[0] is not None:
                out[i] = [[int(ErrorCode.NOT_SUPPORTED)] * len(r) for r in out[i]]
                continue
            for j, key in enumerate(all_keys[i]):
                try:
                    dsts, srcs, lens = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                except (IndexError, TypeError):
                    continue
                if not (len(dsts) == len(srcs) == len(lens)):
                    continue
                data = found.get(key)
                if data is None:
                    out[i][j] = [int(ErrorCode.OBJECT_NOT_FOUND)] * len(out[i][j])
                    continue
                for k, (d, src, z) in enumerate(zip(dsts, srcs, lens)):
                    d, src, z = _index(d), _index(src), _index(z)
                    if None in (d, src, z) or min(d, src, z) < 0:
                        continue
                    if src + z > len(data) or d + z > room:
                        continue
                    if z:
                        view = (ctypes.c_char * len(data)).from_buffer(data)
                        ctypes.memmove(base + d, ctypes.addressof(view) + src, z)
                        del view
                    out[i][j][k] = z
        return out

    # --- buffer handles -------------------------------------------------------------------

    def get_buffer(self, key):
        """The bytes of ``key`` in a :class:`BufferHandle` (memory of this client, freed with
        the handle), or None when it is absent or the call fails."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        """A :class:`BufferHandle` per key, None where it is absent or failed.

        The blocks move as one batch get. A handle's memory must be set aside before its
        block's size is known, so the store remembers the largest size its last batch found
        (engines' chunks are all one size) and sets that aside; a block larger than it makes
        the batch ask the sizes first (HEAD requests) and go again."""
        keys = list(keys)
        if not keys:
            return []
        try:
            store = self._s()
            hint = self._buffer_hint
            got = None
            if hint and hint * len(keys) <= _MAX_GUESSED_BYTES:
                got = self._get_handles(store, keys, [hint] * len(keys))
            if got is None:
                sizes = store._sizes(keys)
                found = [z for z in sizes if z]
                if found:
                    self._buffer_hint = max(found)
                todo = [i for i, z in enumerate(sizes) if z]
                got = [None] * len(keys)
                if todo:
                    part = self._get_handles(store, [keys[i] for i in todo],
                                             [sizes[i] for i in todo])
                    if part is None:
                        raise InvalidArgument("the blocks changed size while being read")
                    for i, h in zip(todo, part):
                        got[i] = h
            return got
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return [None] * len(keys)

    def _slab_pool(self, store):
        """The registered slab handles are carved from (made on first use, of Mooncake's
        ``local_buffer_size``, 16 MiB to 1 GiB)."""
        with self._members_lock:
            if self._slabs is None or self._slabs[0] is not store:
                size = min(max(self._local_buffer_size, 16 << 20), 1 << 30)
                self._slabs = (store, _SlabPool(store._slab(size)))
            return self._slabs[1]

    def _get_handles(self, store, keys, rooms):
        """Reads the keys into new handles of at most ``rooms`` bytes each; None when a block
        is larger than its room."""
        pool = self._slab_pool(store)
        offsets = []
        for n in rooms:
            off = pool.alloc(n)
            if off is None:
                break
            offsets.append(off)
        try:
            if len(offsets) < len(rooms):
                # The slab is full (handles held elsewhere): heap handles, one more copy.
                for off, n in zip(offsets, rooms):
                    pool.free(off, n)
                offsets = None
                handles = [_HeapHandle() for _ in rooms]
                lens = store._get_into_handles(keys, handles, rooms)
                return [None if n is None else h for h, n in zip(handles, lens)]
            lens = store._get_into_slab(pool.slab, keys, offsets, rooms)
        except InvalidArgument as e:
            if offsets is not None:
                for off, n in zip(offsets, rooms):
                    pool.free(off, n)
            if "bytes; block" in str(e) or "larger than" in str(e):
                return None
            raise
        except BaseException:
            if offsets is not None:
                # The call failed on this side (a timeout, say): the node may still write
                # into these ranges, so they are never lent again. The slab is retired (live
                # handles keep it mapped) and the next batch makes a new one.
                with self._members_lock:
                    if self._slabs is not None and self._slabs[1] is pool:
                        self._slabs = None
            raise
        out = []
        base = pool.slab.addr
        for off, room, n in zip(offsets, rooms, lens):
            if not n:
                pool.free(off, room)
                out.append(None if n is None else _HeapHandle())
                continue
            keep = _aligned(n)
            if keep < _aligned(room):
                pool.free(off + keep, _aligned(room) - keep)
            h = _slab_handle_type(n).from_address(base + off)
            h._slab = pool.slab  # the memory stays mapped while the handle lives
            weakref.finalize(h, pool.free, off, n)
            out.append(h)
        return out

    def _spans_from(self, keys, ptrs, sizes, overwrite, config):
        """batch put-from with Mooncake's per-key codes: a bad pointer or a size of 0 fails
        its key only; a failure of the node's batch fails every key sent, except that an
        argument error is retried key by key to find the one at fault."""
        keys = list(keys)
        n = len(keys)
        if n and _native.plain_flat(ptrs, sizes, n):
            # Lists of plain positive ints, as engines pass them, are checked natively and
            # sent as they are (the per-key checks below cost 2-4 us a key).
            try:
                opts = self._options(config)
                store = self._s()
                args = (keys, ptrs, sizes, [False] * n, not overwrite)
                devices = store._devices_of(ptrs, sizes)
                self._send_put(lambda **o: store._put_spans(*args, devices=devices, **o), opts)
                return [0] * n
            except InvalidArgument:
                pass  # key by key below, to find the one at fault
            except _RECOVERABLE as e:
                return [int(_code(e))] * n
        ptrs, sizes = [_index(p) for p in ptrs], [_index(z) for z in sizes]
        if len(ptrs) != n or len(sizes) != n:
            return [int(ErrorCode.INVALID_PARAMS)] * n
        try:
            opts = self._options(config)
            store = self._s()
        except _RECOVERABLE as e:
            return [int(_code(e))] * n
        codes = [0] * n
        todo = [i for i in range(n) if _pointer(ptrs[i], sizes[i])]
        for i in set(range(n)) - set(todo):
            codes[i] = int(ErrorCode.INVALID_PARAMS)

        def send(idx):
            p, z = [ptrs[i] for i in idx], [sizes[i] for i in idx]
            args = ([keys[i] for i in idx], p, z, [False] * len(idx), not overwrite)
            devices = store._devices_of(p, z)
            self._send_put(lambda **o: store._put_spans(*args, devices=devices, **o), opts)

        _per_key(todo, send, codes, lambda i, _: 0)
        return codes

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores ``size`` bytes at ``buffer_ptr``; 0 or a negative code. A size of 0 stores
        nothing and answers 0, as Mooncake does."""
        if _index(size) == 0 and self._store is not None:
            return 0
        return self._spans_from([key], [buffer_ptr], [size], False, config)[0]

    def upsert_from(self, key, buffer_ptr, size, config=None):
        if _index(size) == 0 and self._store is not None:
            return 0
        return self._spans_from([key], [buffer_ptr], [size], True, config)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """One code per key: 0, or what failed that key."""
        return self._spans_from(keys, buffer_ptrs, sizes, False, config)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._spans_from(keys, buffer_ptrs, sizes, True, config)

    # --- gets ---------------------------------------------------------------------------

    def get(self, key):
        """The bytes of ``key``; ``b""`` when it is absent or the call fails."""
        try:
            return self._s().get(key)
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return b""

    def get_batch(self, keys):
        keys = list(keys)
        try:
            return [b"" if v is None else v for v in self._s().get_batch(keys)]
        except _RECOVERABLE as e:
            log.debug("%s", e)
            return [b""] * len(keys)

    def get_into(self, key, buffer_ptr, size):
        """Reads ``key`` into ``size`` bytes at ``buffer_ptr``: its length, or a negative code
        (``INVALID_PARAMS`` when it does not fit)."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """Each key's length, or ``OBJECT_NOT_FOUND``, or what failed that key."""
        keys = list(keys)
        n = len(keys)
        if n and _native.plain_flat(buffer_ptrs, sizes, n):
            # As in `_spans_from`: plain lists go as they are.
            try:
                store = self._s()
                r = store._get_spans(keys, buffer_ptrs, sizes, [False] * n,
                                     devices=store._devices_of(buffer_ptrs, sizes))
                absent = int(ErrorCode.OBJECT_NOT_FOUND)
                return [absent if v is None else v for v in r]
            except InvalidArgument:
                pass  # key by key below, to find the one at fault
            except _RECOVERABLE as e:
                return [int(_code(e))] * n
        ptrs, sizes = [_index(p) for p in buffer_ptrs], [_index(z) for z in sizes]
        if len(ptrs) != n or len(sizes) != n:
            return [int(ErrorCode.INVALID_PARAMS)] * n
        try:
            store = self._s()
        except _RECOVERABLE as e:
            return [int(_code(e))] * n
        codes = [int(ErrorCode.INVALID_PARAMS)] * n
        todo = [i for i in range(n) if _pointer(ptrs[i], sizes[i]) and sizes[i] > 0]
        got = {}

        def send(idx):
            p, z = [ptrs[i] for i in idx], [sizes[i] for i in idx]
            r = store._get_spans([keys[i] for i in idx], p, z, [False] * len(idx),
                                 devices=store._devices_of(p, z))
            got.update(zip(idx, r))

        def ok(i, _):
            return int(ErrorCode.OBJECT_NOT_FOUND) if got[i] is None else got[i]

        _per_key(todo, send, codes, ok)
        return codes

    # --- queries and removal ------------------------------------------------------------

    def is_exist(self, key):
        """1 when stored, 0 when not, a negative code when the call fails."""
        return self._int(lambda: 1 if self._s().is_exist(key) else 0)

    def batch_is_exist(self, keys):
        keys = list(keys)
        return self._each(len(keys), lambda: [1 if e else 0 for e in self._s().batch_is_exist(keys)])

    def get_size(self, key):
        """The length of ``key``'s bytes, or a negative code."""
        return self._int(lambda: self._s().get_size(key))

    def remove(self, key, force=False):
        """0 when removed, ``OBJECT_NOT_FOUND`` when absent."""

        def run():
            if not self._s().remove(key):
                return int(ErrorCode.OBJECT_NOT_FOUND)
            return 0

        return self._int(run)

    def batch_remove(self, keys, force=False):
        keys = list(keys)

        def run():
            removed = self._s().batch_remove(keys)
            return [0 if r else int(ErrorCode.OBJECT_NOT_FOUND) for r in removed]

        return self._each(len(keys), run)

    def remove_by_regex(self, regex_pattern, force=False):
        """How many keys matching ``regex_pattern`` were removed, or a negative code."""
        return self._int(lambda: self._s().remove_by_regex(regex_pattern))

    def remove_all(self, force=False):
        """How many keys were removed, or a negative code."""
        return self._int(lambda: self._s().remove_all())

    def __getattr__(self, name):
        if name in NOT_SUPPORTED:
            raise Unsupported(
                f"MooncakeDistributedStore.{name} is not supported by Yutu: {NOT_SUPPORTED[name]}"
            )
        raise AttributeError(name)


def _soft_pin_action(config):
    try:
        return SoftPinAction(int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE)))
    except (TypeError, ValueError):
        raise InvalidArgument(f"not a SoftPinAction: {config.soft_pin_action!r}") from None


def _host_port(url):
    """``host:port`` of a URL (the scheme's port when it names none), lower case."""
    if not url:
        return None
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    except ValueError:
        return None
    if not u.hostname or port is None:
        return None
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{host}:{port}".lower()


def _plain(values):
    """Whether every value is a non-empty ``bytes`` object (not a subclass, not a buffer):
    what ``Store._put_bytes`` takes."""
    return all(type(v) is bytes and v for v in values)


def _same(keys, values):
    keys = list(keys)
    if len(keys) != len(values):
        raise InvalidArgument(f"{len(keys)} keys but {len(values)} values")
    return keys


def _index(x):
    """``x`` as an int when it is one (numpy integers too, as pybind11 takes them), else None."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    return operator.index(x)


def _pointer(ptr, size):
    """Whether a pointer and a size are ints a call can use. Mooncake does not check that a
    pointer was registered over tcp, and programs rely on it: neither does this class (the
    native ``yutu.Store`` does)."""
    ptr, size = _index(ptr), _index(size)
    return ptr is not None and ptr > 0 and size is not None and size > 0


def _per_key(idx, send, codes, ok):
    """Sends the keys ``idx`` as one batch; ``codes[i] = ok(i, ...)`` for each on success.
    When the batch fails for its arguments, each key is tried alone so that only the keys
    at fault get ``INVALID_PARAMS``; any other failure is every key's."""
    if not idx:
        return
    try:
        send(idx)
    except InvalidArgument as e:
        if len(idx) == 1:
            codes[idx[0]] = int(_code(e))
            return
        for i in idx:
            _per_key([i], send, codes, ok)
        return
    except _RECOVERABLE as e:
        for i in idx:
            codes[i] = int(_code(e))
        return
    for i in idx:
        codes[i] = ok(i, None)


def _config(cfg):
    """Mooncake's config dict as setup's keyword arguments."""
    cfg = dict(cfg)
    # The name SGLang's and vLLM's config files use for it.
    if "master_server_address" in cfg and "master_server_addr" not in cfg:
        cfg["master_server_addr"] = cfg.pop("master_server_address")
    cfg.pop("master_server_address", None)
    known = {
        "local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
        "protocol", "rdma_devices", "master_server_addr", "enable_ssd_offload",
        "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port",
        "token", "access_key", "secret_key",
    }
    # Mooncake's own extra keys, meaningless here.
    for k in ("ipc_socket_path", "device_name", "engine", "master_metrics_port",
              "check_server", "standalone_storage", "client_server_address"):
        cfg.pop(k, None)
    unknown = set(cfg) - known
    if unknown:
        log.warning("setup: ignoring unknown config keys %s", sorted(unknown))
        for k in unknown:
            cfg.pop(k)
    return cfg


_BUCKET_OK = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def tenant_bucket(tenant_id):
    """The bucket a Mooncake tenant's keys live in: the tenant itself when it is a valid
    bucket name (``default`` stays ``default``), else a valid name made from it and a hash of
    it, so that every tenant string maps to one bucket and two tenants never share one."""
    tenant = "default" if tenant_id is None else str(tenant_id).strip() or "default"
    if _BUCKET_OK.match(tenant) and ".." not in tenant and not re.match(r"^\d+\.\d+\.\d+\.\d+$", tenant):
        return tenant
    import hashlib

    digest = hashlib.blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    stem = re.sub(r"[^a-z0-9-]+", "-", tenant.lower()).strip("-")[:40] or "tenant"
    return f"mc-{stem}-{digest}"


def _with_port(hostname, port):
    """``hostname`` with ``:port`` added when it names no port (IPv6 in brackets)."""
    if not port:
        return hostname
    if hostname.startswith("["):
        return hostname if "]:" in hostname else f"{hostname}:{port}"
    if hostname.count(":") == 1:
        return hostname
    if ":" in hostname:
        return f"[{hostname}]:{port}"
    return f"{hostname}:{port}"


# The MOONCAKE_* environment variables engines document, and the setup key each sets.
_ENV_KEYS = {
    "MOONCAKE_LOCAL_HOSTNAME": "local_hostname",
    "MOONCAKE_TE_META_DATA_SERVER": "metadata_server",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": "global_segment_size",
    "MOONCAKE_LOCAL_BUFFER_SIZE": "local_buffer_size",
    "MOONCAKE_PROTOCOL": "protocol",
    "MOONCAKE_DEVICE": "rdma_devices",
    "MOONCAKE_MASTER": "master_server_addr",
    "MOONCAKE_TENANT_ID": "tenant_id",
    "YUTU_TOKEN": "token",
}


def config_from_env(environ=None):
    """Mooncake's client configuration as ``setup(dict)`` takes it: the JSON file named by
    ``MOONCAKE_CONFIG_PATH`` when set (its ``master_server_address`` or
    ``master_server_addr`` names the Yutu node(s)), else the ``MOONCAKE_*`` variables
    (``MOONCAKE_MASTER``, ``MOONCAKE_TENANT_ID``, ``MOONCAKE_LOCAL_HOSTNAME``...); the token
    from the file's ``token`` or ``YUTU_TOKEN``. Raises ``ValueError`` when neither names a
    node, ``OSError`` when the file cannot be read."""
    env = os.environ if environ is None else environ
    path = env.get("MOONCAKE_CONFIG_PATH")
    if path:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: the configuration is not a JSON object")
    else:
        cfg = {key: env[var] for var, key in _ENV_KEYS.items() if env.get(var)}
    if "master_server_address" in cfg:
        cfg.setdefault("master_server_addr", cfg.pop("master_server_address"))
    if not cfg.get("master_server_addr"):
        raise ValueError("no node named: set MOONCAKE_MASTER or MOONCAKE_CONFIG_PATH")
    if "token" not in cfg and env.get("YUTU_TOKEN"):
        cfg["token"] = env["YUTU_TOKEN"]
    cfg.setdefault("local_hostname", env.get("MOONCAKE_LOCAL_HOSTNAME") or "localhost")
    cfg.setdefault("metadata_server", "P2PHANDSHAKE")
    return cfg


class BufferHandle:
    """What ``get_buffer``/``batch_get_buffer`` answer, as Mooncake's ``BufferHandle``: an
    object's bytes in memory this client owns, freed when the handle is collected; ``ptr()``
    is their address, ``size()`` (and ``len``) their length, and the buffer protocol exposes
    them, writable (``memoryview``, ``torch.frombuffer``, ``numpy.frombuffer``).

    The memory is a range of a buffer registered with the store's transfer engine (the node
    writes the block straight into it, as Mooncake's handles live in its local buffer), or,
    when that buffer is full, ordinary heap memory."""

    __slots__ = ()

    def ptr(self):
        raise NotImplementedError

    def size(self):
        return len(self)

    def __repr__(self):
        return f"BufferHandle(ptr={self.ptr():#x}, size={self.size()})"


class _HeapHandle(BufferHandle, bytearray):
    """A handle in heap memory (a ``bytearray``)."""

    __slots__ = ()

    def ptr(self):
        if not self:
            return 0
        view = ctypes.c_char.from_buffer(self)
        try:
            return ctypes.addressof(view)
        finally:
            del view


_SLAB_TYPES = {}
_SLAB_TYPES_LOCK = threading.Lock()


def _slab_handle_type(n):
    """The handle class of ``n`` bytes over slab memory (a ctypes byte array; one per size)."""
    with _SLAB_TYPES_LOCK:
        t = _SLAB_TYPES.get(n)
        if t is None:
            if len(_SLAB_TYPES) > 4096:
                _SLAB_TYPES.clear()
            t = type("BufferHandle", (BufferHandle, ctypes.c_ubyte * n), {
                "ptr": lambda self: ctypes.addressof(self),
                "size": lambda self: ctypes.sizeof(self),
                "__module__": __name__,
            })
            _SLAB_TYPES[n] = t
        return t


_ALIGN = 64


def _aligned(n):
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


class _SlabPool:
    """First-fit allocation of ranges of one registered slab; a range goes back when the
    handle over it is collected."""

    def __init__(self, slab):
        self.slab = slab
        self.lock = threading.Lock()
        self.free_ranges = [(0, slab.size)]  # sorted, coalesced (offset, length)

    def alloc(self, n):
        n = _aligned(n)
        with self.lock:
            for i, (off, length) in enumerate(self.free_ranges):
                if length >= n:
                    if length == n:
                        del self.free_ranges[i]
                    else:
                        self.free_ranges[i] = (off + n, length - n)
                    return off
        return None

    def free(self, off, n):
        n = _aligned(n)
        if n == 0:
            return
        with self.lock:
            fr = self.free_ranges
            lo, hi = 0, len(fr)
            while lo < hi:
                mid = (lo + hi) // 2
                if fr[mid][0] < off:
                    lo = mid + 1
                else:
                    hi = mid
            fr.insert(lo, (off, n))
            # Coalesce with the neighbours.
            if lo + 1 < len(fr) and fr[lo][0] + fr[lo][1] == fr[lo + 1][0]:
                fr[lo] = (fr[lo][0], fr[lo][1] + fr[lo + 1][1])
                del fr[lo + 1]
            if lo > 0 and fr[lo - 1][0] + fr[lo - 1][1] == fr[lo][0]:
                fr[lo - 1] = (fr[lo - 1][0], fr[lo - 1][1] + fr[lo][1])
                del fr[lo]


class MooncakeHostMemAllocator:
    """Host memory for an engine's KV pool, as Mooncake's allocator: ``alloc(size)`` maps a
    memfd-backed shared region (populated up front) and returns its address, ``free(ptr)``
    unmaps it (0, or -1 for an address this allocator did not hand out). Register the region
    with ``register_buffer`` before moving blocks through it: a node on the same host then
    maps the memfd itself and copies blocks with ``memcpy`` (memory allocated otherwise is
    reached page by page through the process's memory file, at about half that speed). As
    Mooncake's (a process-wide singleton), a region lives until ``free``, not as long as the
    allocator object: engines keep the address, not the allocator."""

    def alloc(self, size):
        n = _index(size)
        if n is None or n <= 0:
            raise RuntimeError(f"MooncakeHostMemAllocator.alloc: bad size {size!r}")
        try:
            return _memory.alloc_host(n)
        except OSError as e:
            raise RuntimeError(f"MooncakeHostMemAllocator.alloc({n}): {e}") from None

    def free(self, ptr):
        return 0 if _memory.free_host(_index(ptr) or 0) else -1


def bind_to_numa_node(node):
    """Mooncake binds the calling thread's CPU and memory to a NUMA node; Yutu's client
    leaves placement to the OS (the node's shards bind themselves). Accepted and ignored."""
    log.debug("bind_to_numa_node(%s): ignored", node)


_TENSORS = "tensor methods need torch and Mooncake's tensor layout; store tensors as bytes with put_from/get_into"
_SEGMENTS = "a Yutu node owns its memory and disk; clients do not mount segments"
_TASKS = ("a cluster's nodes place and restore copies themselves; extra copies of a key are "
          "the admin API's POST /admin/v1/replicate")
NOT_SUPPORTED = {
    **{
        name: _TENSORS
        for name in (
            "put_tensor", "get_tensor", "batch_put_tensor", "batch_get_tensor",
            "put_tensor_from", "get_tensor_into", "batch_put_tensor_from", "batch_get_tensor_into",
            "pub_tensor", "batch_pub_tensor", "upsert_tensor", "batch_upsert_tensor",
            "upsert_pub_tensor", "batch_upsert_pub_tensor", "upsert_tensor_from",
            "batch_upsert_tensor_from", "put_tensor_with_tp", "get_tensor_with_tp",
            "batch_put_tensor_with_tp", "batch_get_tensor_with_tp", "put_tensor_with_tp_from",
            "get_tensor_with_tp_into", "batch_put_tensor_with_tp_from",
            "batch_get_tensor_with_tp_into", "pub_tensor_with_tp", "batch_pub_tensor_with_tp",
            "put_tensor_with_parallelism", "get_tensor_with_parallelism",
            "batch_put_tensor_with_parallelism", "batch_get_tensor_with_parallelism",
            "put_tensor_with_parallelism_from", "get_tensor_with_parallelism_into",
            "batch_put_tensor_with_parallelism_from", "batch_get_tensor_with_parallelism_into",
            "upsert_tensor_with_parallelism", "batch_upsert_tensor_with_parallelism",
            "upsert_tensor_with_parallelism_from", "batch_upsert_tensor_with_parallelism_from",
            "get_tensor_into_cuda", "batch_get_tensor_into_cuda",
            "load_tensor_from_safetensor", "save_tensor_to_safetensor",
        )
    },
    **{
        name: _SEGMENTS
        for name in (
            "mount_segment", "unmount_segment", "allocate_and_mount_segment",
            "unmount_and_free_segment", "unmount_local_disk_segment", "alloc_from_mem_pool",
        )
    },
    "batch_put_from_multi_buffer_ranges": "put sessions are not exposed: use batch_put_from_multi_buffers",
    "batch_get_into_multi_buffer_ranges": "get sessions are not exposed: use batch_get_into_multi_buffers or get_into_ranges",
    "put_from_with_metadata": "objects carry no separate metadata buffer in Yutu",
    "batch_put_session_start": "Yutu's put-from is one call; put sessions are not exposed",
    "batch_put_session_end": "Yutu's put-from is one call; put sessions are not exposed",
    "batch_put_session_revoke": "Yutu's put-from is one call; put sessions are not exposed",
    "batch_get_session_start": "Yutu's get-into is one call; get sessions are not exposed",
    "batch_get_session_end": "Yutu's get-into is one call; get sessions are not exposed",
    "get_replica_desc": "replica descriptors are Mooncake's placement metadata",
    "batch_get_replica_desc": "replica descriptors are Mooncake's placement metadata",
    "batch_replica_clear": "replicas are managed by the nodes",
    "create_copy_task": _TASKS,
    "create_move_task": _TASKS,
    "query_task": _TASKS,
    "get_offload_rpc_read_count": "no SSD offload RPCs in Yutu (the node tiers to NVMe itself)",
}


def install():
    """Makes ``import mooncake.store`` (and ``from mooncake.store import
    MooncakeDistributedStore``) resolve to this module, for code that cannot be edited.
    Call it before that code imports Mooncake. When the real ``mooncake`` package is
    installed, only its ``store`` module is replaced (``mooncake.engine`` and the rest stay
    Mooncake's)."""
    this = sys.modules[__name__]
    pkg = sys.modules.get("mooncake")
    if pkg is None:
        try:
            pkg = importlib.import_module("mooncake")
        except ImportError:
            pkg = types.ModuleType("mooncake")
            pkg.__path__ = []
            sys.modules["mooncake"] = pkg
    pkg.store = this
    sys.modules["mooncake.store"] = this
    return this


__all__ = [
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "BufferHandle",
    "bind_to_numa_node",
    "config_from_env",
    "tenant_bucket",
    "ReplicateConfig",
    "SoftPinAction",
    "ErrorCode",
    "install",
    "parse_size",
    "NOT_SUPPORTED",
    "Unsupported",
]
