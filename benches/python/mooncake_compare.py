#!/usr/bin/env python3
"""Side-by-side benchmark of Mooncake Store and Yutu through the same Python code.

Both systems are driven by the *same* functions calling `MooncakeDistributedStore` methods:
Mooncake's from `mooncake.store` (PyPI `mooncake-transfer-engine-non-cuda`), Yutu's drop-in
from `yutu.mooncake` (`client/python`). So a row measures the store, not the harness. The
script starts everything itself, on free loopback ports and in a scratch directory, and
tears it all down on exit (also on Ctrl-C or SIGTERM). Mooncake runs in its two modes on one
host, each with its own `mooncake_master` (embedded HTTP metadata server), and each row is
compared with the better of the two:

  mooncake          TCP holder: one process holds the global segment (--memory bytes); the
                    clients mount nothing, so every get and put crosses loopback TCP to it.
  mooncake-inproc   in-process: the client mounts the global segment itself (--memory bytes;
                    in the 4-process row each of the 4 clients mounts --memory/4 and reads
                    keys it put), and puts name its own segment (ReplicateConfig
                    preferred_segment = get_hostname()), so its gets and puts are local
                    memcpys (the transfer engine's memcpy path, on by itself with TCP only).
                    No holder process.
  yutu              `yutu-server` with authentication on, --memory of DRAM and no NVMe tier;
                    the first start's admin token (DATA_DIR/auth/admin-token) goes to the
                    clients as YUTU_TOKEN.

Rows (each measured on every system, in alternating order, median of --reps repetitions):
  batch_put_from / batch_get_into of 2 MiB blocks in batches of 16      (GB/s)
  batch_put_from / batch_get_into of 4 KiB blocks in batches of 256     (ops/s)
  get (bytes API) of a 4 KiB value, p50 and p99                          (us)
  is_exist of a present key, p50 and p99                                 (us)
  batch_is_exist of 64 present keys, p50 and p99                         (us)
  4 client processes at once, each batch_get_into 2 MiB x 16             (aggregate GB/s)
  the 2 MiB rows again in memory from MooncakeHostMemAllocator (_hostalloc) and in plain
  posix_memalign memory, as torch's CPU tensors have (_malloc), and one
  thread's numpy memcpy of the same bytes in the client process (the memcpy reference), and
  two threads' (what two cores copy: the ceiling of a store that copies each block once)
  batch_is_exist of 1 present key, p50 and p99                           (us)
  Mooncake's concurrent stress test: 8 threads put (bytes) then get 1 MiB values (ops/s)
Each client owns one numpy array registered with register_buffer. Every case checks the
bytes once, outside the timing. Before the first put row, each client writes --memory of
2 MiB blocks and then removes them, untimed (not with --quick or --no-warm): neither store
prefaults its memory by default (`--yutu-arg=--prefault` makes Yutu's node do it at start),
so without this the put rows mostly measure first-touch page faults. All of it: the read
sets take about 530 MiB and a put row 544 MiB more, so with half of it written (as this
bench did before) the rows kept reaching memory neither store had touched, and both
systems' 2 MiB puts moved 3-25 GB/s between repetitions on a VM whose first touch of a page
runs at about 1.7 GB/s. Keys are distinct per
system and per run. The table has one column per Mooncake mode; its ratio is against
Mooncake's better mode in that row (marked *): yutu/mooncake for throughputs and
mooncake/yutu for latencies, so > 1 always means Yutu is ahead of Mooncake at its best. In
--json, a row's `reference` is that better mode (`reference.mode`: "tcp" or "inproc"), and
`reference.modes` has each mode's numbers.

Setup (scripts/install-bench-deps.sh creates .venv-bench with both packages):
  cargo build --release -p yutu-server
  .venv-bench/bin/python benches/python/mooncake_compare.py [--quick] [--json FILE]
  .venv-bench/bin/python benches/python/mooncake_compare.py --only mooncake   # one system
  .venv-bench/bin/python benches/python/mooncake_compare.py --only mooncake-inproc --only yutu

The clients run as worker processes of this same script (`--worker`), with the interpreter
running it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

REPO = Path(__file__).resolve().parents[2]
SYSTEMS = ("mooncake", "mooncake-inproc", "yutu")
# Mooncake's modes: system -> the mode's name in the table and the JSON report.
MOONCAKE_MODES = {"mooncake": "tcp", "mooncake-inproc": "inproc"}

# The two block shapes of the batch rows: (block size, blocks per batch).
BIG = (2 * MiB, 16)
SMALL = (4 * KiB, 256)
LAT_SIZE = 4 * KiB  # value size of the single-key get latency row
EXIST_BATCH = 64  # keys per batch_is_exist in its latency row
MP_PROCS = 4  # client processes of the multi-process row
# Mooncake's concurrent stress test: (threads, value size); each thread puts and gets its
# values (`stress_per_thread` of them, 100 in Mooncake's test).
STRESS = (8, 1 * MiB)
# The groups of rows `--case` picks: each repetition runs them in this order.
CASES = ("put", "get", "alloc", "latency", "stress", "engines", "mp")
SEED = 20240611  # every client fills its source region from this seed: same bytes everywhere


# The engines' shapes: (keys per batch, buffers per key, bytes per buffer), and the memory
# the engine hands the store.
ENGINE_SHAPES = {
    # vLLM's MooncakeStoreConnector: a block's K/V segments, one per registered KV tensor
    # (GPU memory in a real deployment; ordinary host memory, numpy, stands in here).
    "vllm": ((16, 8, 256 * KiB), "numpy"),
    # SGLang HiCache, layer-first MLA pool: a page's slice of every layer's buffer. With the
    # mooncake storage backend SGLang allocates its host pools from the store's
    # MooncakeHostMemAllocator (sglang 0.5.23: mem_cache/pool_host/common.py,
    # get_allocator_type and get_allocator_from_storage), so both systems run it there.
    "sglang_mla": ((16, 32, 32 * KiB), "alloc"),
}
LMCACHE_CHUNK = 2 * MiB  # LMCache's chunk (256 tokens) at its default save_chunk_meta
LMCACHE_BATCH = 8


def plan(quick: bool) -> dict:
    """How much each case does. --quick only checks that everything works end to end."""
    if quick:
        return dict(
            reps=1,
            big_prepared=2, big_put=2, big_get=4,
            small_prepared=2, small_put=2, small_get=4,
            lat_keys=64, lat_iters=200,
            mp_iters=2, stress_per_thread=4,
            multi_prepared=1, multi_put=1, multi_get=2, lmcache_keys=8, lmcache_get=2,
        )
    return dict(
        # Counts sized so that each timed case runs for tens of milliseconds or more at
        # memory speed (at 8-14 GB/s a 2 MiB x 16 batch takes 2-4 ms).
        reps=5,
        big_prepared=4, big_put=16, big_get=64,  # 128 MiB read set; 512 MiB written per rep
        small_prepared=16, small_put=32, small_get=96,  # 4096 keys read set
        lat_keys=64, lat_iters=2000,
        mp_iters=16, stress_per_thread=100,
        multi_prepared=2, multi_put=8, multi_get=32, lmcache_keys=16, lmcache_get=32,
    )


# --------------------------------------------------------------------------------------------
# Worker side: a client (or Mooncake's segment holder) in its own process, driven over stdin.
# --------------------------------------------------------------------------------------------


class Workload:
    """One client: the store, its registered buffer, and the operations the cases time."""

    def __init__(self, conf: dict):
        import numpy as np

        self.np = np
        self.conf = conf
        self.system = conf["system"]
        if self.system in MOONCAKE_MODES:
            from mooncake.store import MooncakeDistributedStore
        else:
            from yutu.mooncake import MooncakeDistributedStore
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(
            "127.0.0.1",
            conf["metadata_server"],
            conf["global_segment_size"],
            conf["local_buffer_size"],
            "tcp",
            "",
            conf["master_server_addr"],
        )
        if rc != 0:
            raise RuntimeError(f"{self.system}: setup returned {rc}")
        if conf.get("holder"):
            return
        # Extra arguments of every put: in Mooncake's in-process mode, the replica goes to
        # this client's own segment (the master's allocation otherwise picks any mounted
        # segment at random, and with several clients most reads would cross TCP).
        self.put_kw: dict = {}
        if conf.get("prefer_local_segment"):
            from mooncake.store import ReplicateConfig

            cfg = ReplicateConfig()
            cfg.preferred_segment = self.store.get_hostname()
            self.put_kw = {"config": cfg}
        # One array per client: [source region | destination region], both BIG[0]*BIG[1].
        self.region = BIG[0] * BIG[1]
        self.buf = np.empty(2 * self.region, dtype=np.uint8)
        self.buf[: self.region] = np.random.default_rng(SEED).integers(
            0, 256, size=self.region, dtype=np.uint8
        )
        self.buf[self.region :] = 0
        self.base = self.buf.ctypes.data
        rc = self.store.register_buffer(self.base, self.buf.nbytes)
        if rc != 0:
            raise RuntimeError(f"{self.system}: register_buffer returned {rc}")
        # The same layout in memory from the system's own MooncakeHostMemAllocator (what
        # SGLang's host pools use): Yutu hands it to the node as its memfd.
        if self.system in MOONCAKE_MODES:
            from mooncake.store import MooncakeHostMemAllocator
        else:
            from yutu.mooncake import MooncakeHostMemAllocator
        import ctypes

        n = self.buf.nbytes
        self.alloc_base = MooncakeHostMemAllocator().alloc(n)
        self.alloc_buf = self.copy_and_register(self.alloc_base, n, "allocator")
        # The same layout once more in plain `posix_memalign` memory, the way torch's CPU
        # allocator gets a tensor's storage: unlike numpy, which advises its large arrays to
        # use transparent huge pages, it leaves the kernel's default (4 KiB pages where
        # transparent_hugepage is `madvise`, as on most distributions).
        libc = ctypes.CDLL(None)
        libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                        ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        self.libc = libc
        p = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(p), 64, n) != 0:
            raise MemoryError(f"posix_memalign of {n} bytes")
        self.malloc_base = p.value
        self.malloc_buf = self.copy_and_register(self.malloc_base, n, "malloc")
        self.numpy = (self.buf, self.base)
        self.prefix = conf["key_prefix"]

    def copy_and_register(self, base: int, n: int, what: str):
        """A numpy view of the `n` bytes at `base`, filled with the numpy array's layout and
        registered with the store."""
        import ctypes

        import numpy as np

        view = np.frombuffer((ctypes.c_ubyte * n).from_address(base), dtype=np.uint8)
        view[:] = self.buf
        rc = self.store.register_buffer(base, n)
        if rc != 0:
            raise RuntimeError(f"{self.system}: register_buffer of {what} memory returned {rc}")
        return view

    def use(self, mem: str) -> None:
        """Points the next operations at the numpy array, the allocator's memory or the
        malloc'd memory."""
        self.buf, self.base = {"numpy": self.numpy, "alloc": (self.alloc_buf, self.alloc_base),
                               "malloc": (self.malloc_buf, self.malloc_base)}[mem]

    # Keys and pointers. Key j of batch g holds source block (j + g) % batch, so that a
    # mixed-up key or batch shows up in the check.
    def keys(self, tag: str, g: int, batch: int) -> list[str]:
        return [f"{self.prefix}{tag}-{g}-{j}" for j in range(batch)]

    def src_ptrs(self, g: int, size: int, batch: int) -> list[int]:
        return [self.base + ((j + g) % batch) * size for j in range(batch)]

    def dst_ptrs(self, size: int, batch: int) -> list[int]:
        return [self.base + self.region + j * size for j in range(batch)]

    def check_batch(self, tag: str, g: int, size: int, batch: int) -> None:
        """Reads batch g back into the destination region and compares every byte."""
        dst = self.buf[self.region :]
        dst[: size * batch] = 0
        rcs = self.store.batch_get_into(self.keys(tag, g, batch), self.dst_ptrs(size, batch), [size] * batch)
        if list(rcs) != [size] * batch:
            raise RuntimeError(f"check of {tag} batch {g}: batch_get_into returned {list(rcs)[:8]}...")
        for j in range(batch):
            s = ((j + g) % batch) * size
            if not self.np.array_equal(dst[j * size : (j + 1) * size], self.buf[s : s + size]):
                raise RuntimeError(f"check of {tag} batch {g}: block {j} differs from what was put")

    def remove_keys(self, keys: list[str]) -> int:
        """Removes keys, leases or not (Mooncake leases a key for 10 s after a read)."""
        try:
            rcs = self.store.batch_remove(keys, True)
        except TypeError:
            rcs = self.store.batch_remove(keys)
        return sum(1 for r in rcs if r != 0)

    # ---- operations -----------------------------------------------------------------------

    def op_prepare(self, tag: str, size: int, batch: int, batches: int, mem: str = "numpy") -> dict:
        self.use(mem)
        sizes = [size] * batch
        for g in range(batches):
            rcs = self.store.batch_put_from(self.keys(tag, g, batch), self.src_ptrs(g, size, batch), sizes,
                                            **self.put_kw)
            if any(r != 0 for r in rcs):
                raise RuntimeError(f"prepare {tag}: batch_put_from returned {list(rcs)[:8]}...")
        self.check_batch(tag, batches - 1, size, batch)
        return {}

    def op_warm(self, size: int, batch: int, batches: int) -> dict:
        """Writes `batches` batches (all of --memory), then removes them, untimed: a store that
        has not touched its memory yet pays page faults on the first writes, and the put rows
        should measure the steady state of every system, not which one prefaults its arena.
        All are written before any is removed: Mooncake's allocator gives a removed batch's
        space to the next one, so removing each batch right away touches one batch's worth of
        the segment, not all of it."""
        sizes = [size] * batch
        groups = [self.keys("warm", g, batch) for g in range(batches)]
        for g, keys in enumerate(groups):
            self.store.batch_put_from(keys, self.src_ptrs(g, size, batch), sizes, **self.put_kw)
        for keys in groups:
            self.remove_keys(keys)
        return {}

    def op_put(self, tag: str, size: int, batch: int, batches: int, verify: bool,
               mem: str = "numpy") -> dict:
        self.use(mem)
        sizes = [size] * batch
        keys = [self.keys(tag, g, batch) for g in range(batches)]
        ptrs = [self.src_ptrs(g, size, batch) for g in range(batch)]
        warm = self.keys(tag + "w", 0, batch)
        self.store.batch_put_from(warm, ptrs[0], sizes, **self.put_kw)  # first-touch costs, untimed
        errors = 0
        t0 = time.perf_counter()
        for g in range(batches):
            rcs = self.store.batch_put_from(keys[g], ptrs[g % batch], sizes, **self.put_kw)
            for r in rcs:
                if r != 0:
                    errors += 1
        elapsed = time.perf_counter() - t0
        if verify:
            self.check_batch(tag, 0, size, batch)
        self.remove_keys(warm)
        for ks in keys:
            self.remove_keys(ks)
        return {"elapsed": elapsed, "ops": batches * batch - errors, "bytes": (batches * batch - errors) * size, "errors": errors}

    def op_get(self, tag: str, size: int, batch: int, prepared: int, iters: int, verify: bool,
               offset: int = 0, start_at: float | None = None, warm: bool = True,
               mem: str = "numpy") -> dict:
        self.use(mem)
        sizes = [size] * batch
        keys = [self.keys(tag, g, batch) for g in range(prepared)]
        dst = self.dst_ptrs(size, batch)
        if verify:
            self.check_batch(tag, offset % prepared, size, batch)
        elif warm:
            self.store.batch_get_into(keys[offset % prepared], dst, sizes)  # warm-up, untimed
        if start_at is not None:
            while time.monotonic() < start_at:
                time.sleep(min(0.01, max(0.0, start_at - time.monotonic())))
        errors = 0
        m0 = time.monotonic()
        t0 = time.perf_counter()
        for i in range(iters):
            rcs = self.store.batch_get_into(keys[(i + offset) % prepared], dst, sizes)
            for r in rcs:
                if r != size:
                    errors += 1
        elapsed = time.perf_counter() - t0
        m1 = time.monotonic()
        ok = iters * batch - errors
        return {"elapsed": elapsed, "ops": ok, "bytes": ok * size, "errors": errors, "t0": m0, "t1": m1}

    def op_prepare_values(self, tag: str, n: int, size: int) -> dict:
        for i in range(n):
            s = (i * size) % (self.region - size)
            rc = self.store.put(f"{self.prefix}{tag}-{i}", self.buf[s : s + size], **self.put_kw)
            if rc != 0:
                raise RuntimeError(f"prepare {tag}: put returned {rc}")
        got = self.store.get(f"{self.prefix}{tag}-{n - 1}")
        s = ((n - 1) * size) % (self.region - size)
        if bytes(got) != self.buf[s : s + size].tobytes():
            raise RuntimeError(f"prepare {tag}: get returned {len(got)} bytes that differ from the put")
        return {}

    def _latency(self, fn, keys: list[str], iters: int, ok) -> dict:
        clock = time.perf_counter_ns
        lat = [0] * iters
        errors = 0
        for i in range(min(iters, len(keys))):  # warm-up, untimed
            fn(keys[i])
        for i in range(iters):
            k = keys[i % len(keys)]
            t = clock()
            v = fn(k)
            lat[i] = clock() - t
            if not ok(v):
                errors += 1
        lat.sort()
        return {
            "p50_us": lat[len(lat) // 2] / 1e3,
            "p99_us": lat[min(len(lat) - 1, (len(lat) * 99) // 100)] / 1e3,
            "errors": errors,
        }

    def op_get_latency(self, tag: str, n: int, size: int, iters: int) -> dict:
        keys = [f"{self.prefix}{tag}-{i}" for i in range(n)]
        # The check: every value once, outside the timing.
        for i, k in enumerate(keys):
            s = (i * size) % (self.region - size)
            if bytes(self.store.get(k)) != self.buf[s : s + size].tobytes():
                raise RuntimeError(f"get({k}) returned bytes that differ from the put")
        return self._latency(self.store.get, keys, iters, lambda v: len(v) == size)

    def op_exist_latency(self, tag: str, n: int, iters: int) -> dict:
        keys = [f"{self.prefix}{tag}-{i}" for i in range(n)]
        rcs = self.store.batch_is_exist(keys)
        if list(rcs) != [1] * n:
            raise RuntimeError(f"batch_is_exist of present keys returned {list(rcs)[:8]}...")
        return self._latency(self.store.is_exist, keys, iters, lambda v: v == 1)

    def op_batch_exist_latency(self, tag: str, n: int, batch: int, iters: int) -> dict:
        keys = [f"{self.prefix}{tag}-{i}" for i in range(n)]
        batches = [keys[i:i + batch] for i in range(0, n - batch + 1, batch)]
        if not batches:
            raise RuntimeError(f"{n} keys make no batch of {batch}")
        return self._latency(self.store.batch_is_exist, batches, iters,
                             lambda v: list(v) == [1] * batch)

    # ---- the engines' shapes --------------------------------------------------------------
    # vLLM's MooncakeStoreConnector and SGLang's layer-first MLA pools store one key from
    # several buffers (batch_put_from_multi_buffers); LMCache at its defaults stores
    # metadata + chunk with put_parts and loads with batch_get_buffer.

    def _multi(self, tag: str, g: int, shape: tuple) -> tuple:
        """Keys, per-key source spans and per-key destination spans of multi-buffer batch g:
        segment j of key i is block (i + g) % keys of buffer j."""
        keys, segs, seg = shape
        stride = keys * seg
        src = [[self.base + j * stride + ((i + g) % keys) * seg for j in range(segs)] for i in range(keys)]
        dst = [[self.base + self.region + j * stride + i * seg for j in range(segs)] for i in range(keys)]
        names = [f"{self.prefix}{tag}-{g}-{i}" for i in range(keys)]
        return names, src, dst, [[seg] * segs for _ in range(keys)]

    def op_multi_put(self, tag: str, shape: list, batches: int, verify: bool,
                     mem: str = "numpy") -> dict:
        self.use(mem)
        shape = tuple(shape)
        keys, segs, seg = shape
        batch = [self._multi(tag, g, shape) for g in range(batches)]
        errors = 0
        t0 = time.perf_counter()
        for names, src, _dst, sizes in batch:
            rcs = self.store.batch_put_from_multi_buffers(names, src, sizes, **self.put_kw)
            errors += sum(1 for r in rcs if r != 0)
        elapsed = time.perf_counter() - t0
        if verify:
            self.op_multi_get(tag, list(shape), 1, 1, True, mem)
        for names, *_ in batch:
            self.remove_keys(names)
        ok = batches * keys - errors
        return {"elapsed": elapsed, "ops": ok, "bytes": ok * segs * seg, "errors": errors}

    def op_multi_get(self, tag: str, shape: list, prepared: int, iters: int, verify: bool,
                     mem: str = "numpy") -> dict:
        self.use(mem)
        shape = tuple(shape)
        keys, segs, seg = shape
        batch = [self._multi(tag, g, shape) for g in range(prepared)]
        if verify:
            names, src, dst, sizes = batch[0]
            self.buf[self.region:] = 0
            rcs = self.store.batch_get_into_multi_buffers(names, dst, sizes)
            if list(rcs) != [segs * seg] * keys:
                raise RuntimeError(f"multi get {tag}: returned {list(rcs)[:8]}")
            for i in range(keys):
                for j in range(segs):
                    a = src[i][j] - self.base
                    b = dst[i][j] - self.base
                    if not self.np.array_equal(self.buf[a:a + seg], self.buf[b:b + seg]):
                        raise RuntimeError(f"multi get {tag}: key {i} segment {j} differs")
        errors = 0
        t0 = time.perf_counter()
        for it in range(iters):
            names, _src, dst, sizes = batch[it % prepared]
            rcs = self.store.batch_get_into_multi_buffers(names, dst, sizes)
            errors += sum(1 for r in rcs if r != segs * seg)
        elapsed = time.perf_counter() - t0
        ok = iters * keys - errors
        return {"elapsed": elapsed, "ops": ok, "bytes": ok * segs * seg, "errors": errors}

    def op_multi_prepare(self, tag: str, shape: list, batches: int, mem: str = "numpy") -> dict:
        self.use(mem)
        shape = tuple(shape)
        for g in range(batches):
            names, src, _dst, sizes = self._multi(tag, g, shape)
            rcs = self.store.batch_put_from_multi_buffers(names, src, sizes, **self.put_kw)
            if any(r != 0 for r in rcs):
                raise RuntimeError(f"multi prepare {tag}: returned {list(rcs)[:8]}")
        return {}

    META = 28  # LMCache's RemoteMetadata

    def op_parts_put(self, tag: str, size: int, n: int, verify: bool) -> dict:
        meta = bytes(range(self.META))
        chunks = [memoryview(self.buf[(i * size) % (self.region - size):][:size]) for i in range(n)]
        errors = 0
        t0 = time.perf_counter()
        for i in range(n):
            if self.store.put_parts(f"{self.prefix}{tag}-{i}", meta, chunks[i], **self.put_kw) != 0:
                errors += 1
        elapsed = time.perf_counter() - t0
        if verify:
            h = self.store.get_buffer(f"{self.prefix}{tag}-0")
            if h is None or bytes(memoryview(h)[self.META:]) != bytes(chunks[0]):
                raise RuntimeError(f"put_parts {tag}: get_buffer does not give the bytes back")
        ok = n - errors
        return {"elapsed": elapsed, "ops": ok, "bytes": ok * size, "errors": errors}

    def op_buffers_get(self, tag: str, size: int, n: int, batch: int, iters: int) -> dict:
        keys = [f"{self.prefix}{tag}-{i}" for i in range(n)]
        errors = 0
        t0 = time.perf_counter()
        for it in range(iters):
            part = [keys[(it * batch + j) % n] for j in range(batch)]
            hs = self.store.batch_get_buffer(part)
            errors += sum(1 for h in hs if h is None or h.size() != size + self.META)
            del hs
        elapsed = time.perf_counter() - t0
        ok = iters * batch - errors
        return {"elapsed": elapsed, "ops": ok, "bytes": ok * size, "errors": errors}

    def op_memcpy(self, size: int, batch: int, iters: int, threads: int = 1) -> dict:
        """The reference of the 2 MiB rows: one thread copying the same bytes (a batch's
        source region onto its destination region) with numpy, in this client process. With
        `threads`, that many threads each copy their share of every batch at once (numpy
        releases the GIL while it copies): what the cores together move, the ceiling of any
        store that copies a block once."""
        import threading

        n = size * batch
        src, dst = self.buf[:n], self.buf[self.region:self.region + n]
        self.np.copyto(dst, src)  # warm-up, untimed
        if threads <= 1:
            t0 = time.perf_counter()
            for _ in range(iters):
                self.np.copyto(dst, src)
            elapsed = time.perf_counter() - t0
            return {"elapsed": elapsed, "ops": iters * batch, "bytes": iters * n, "errors": 0}
        cut = [n * i // threads for i in range(threads + 1)]
        go, done = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

        def share(i: int) -> None:
            a, b = cut[i], cut[i + 1]
            go.wait()
            for _ in range(iters):
                self.np.copyto(dst[a:b], src[a:b])
            done.wait()

        workers = [threading.Thread(target=share, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        go.wait()
        t0 = time.perf_counter()
        done.wait()
        elapsed = time.perf_counter() - t0
        for w in workers:
            w.join()
        return {"elapsed": elapsed, "ops": iters * batch, "bytes": iters * n, "errors": 0}

    def op_stress(self, tag: str, threads: int, per_thread: int, size: int) -> dict:
        """Mooncake's own concurrent stress test (test_distributed_object_store.py,
        test_concurrent_stress_with_barrier): `threads` threads each put `per_thread` values
        of `size` bytes (bytes objects, `put`), then, after a barrier, get them all back
        (`get`, bytes) and compare; put and get throughput are timed between barriers."""
        import threading

        values = [os.urandom(size) for _ in range(threads)]
        start, put_done, get_done = (threading.Barrier(threads + 1) for _ in range(3))
        failures: list[str] = []

        def worker(t: int) -> None:
            keys = [f"{self.prefix}{tag}-{t}-{i}" for i in range(per_thread)]
            try:
                start.wait()
                for k in keys:
                    if self.store.put(k, values[t], **self.put_kw) != 0:
                        failures.append(f"put {k}")
                put_done.wait()
                for k in keys:
                    if self.store.get(k) != values[t]:
                        failures.append(f"get {k}")
                get_done.wait()
            except threading.BrokenBarrierError:
                pass
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(f"{type(e).__name__}: {e}")
                for b in (start, put_done, get_done):
                    b.abort()

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        put_done.wait()
        t1 = time.perf_counter()
        get_done.wait()
        t2 = time.perf_counter()
        for th in pool:
            th.join()
        for t in range(threads):
            self.remove_keys([f"{self.prefix}{tag}-{t}-{i}" for i in range(per_thread)])
        n = threads * per_thread
        return {"put_elapsed": t1 - t0, "get_elapsed": t2 - t1, "ops": n, "errors": len(failures),
                "first_failure": failures[0] if failures else None}

    def close(self) -> None:
        try:
            self.store.close()
        except Exception:
            pass
        # Only once the store is closed: until then a transfer may still name the memory.
        self.malloc_buf = None
        self.buf = None
        self.libc.free(self.malloc_base)
        self.malloc_base = 0


def worker_main(conf: dict) -> int:
    # Replies go over the original stdout; anything the native code prints to fd 1 goes to
    # the log (stderr) instead, so it cannot corrupt the protocol.
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator decides when we stop

    def send(obj: dict) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    try:
        w = Workload(conf)
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        send({"error": f"{type(e).__name__}: {e}"})
        return 1
    send({"ready": True})
    if conf.get("holder"):
        sys.stdin.read()  # hold the segment until the orchestrator closes our stdin
        w.close()
        return 0
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            break
        try:
            w.use("numpy")  # the ops that take `mem` choose for themselves
            send({"ok": getattr(w, "op_" + op)(**cmd)})
        except BaseException as e:  # noqa: BLE001
            send({"error": f"{type(e).__name__}: {e}"})
    w.close()
    return 0


# --------------------------------------------------------------------------------------------
# Orchestrator side: processes, the case loop, the report.
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in each child before exec: SIGKILL it if this script dies without cleaning up."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class Proc:
    """A child process with its output in a log file; stopped by stop()."""

    def __init__(self, name: str, argv: list[str], logdir: Path, env: dict | None = None,
                 stdin=subprocess.DEVNULL, stdout_pipe: bool = False):
        self.name = name
        self.log = logdir / f"{name}.log"
        self._logf = open(self.log, "wb")
        self.p = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE if stdout_pipe else self._logf,
            stderr=self._logf,
            env=env,
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        if self.p.poll() is None:
            try:
                self.p.terminate()
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._logf.close()


class Worker(Proc):
    """A client process of this script, spoken to in JSON lines."""

    def __init__(self, name: str, conf: dict, logdir: Path, env: dict, timeout: float):
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(conf)]
        super().__init__(name, argv, logdir, env=env, stdin=subprocess.PIPE, stdout_pipe=True)
        self.timeout = timeout
        self._buf = b""
        try:
            self._expect_ready()
        except BaseException:
            self.stop()
            raise

    def _read_line(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.name}: no answer within {timeout:.0f} s; log:\n{tail(self.log)}")
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.p.wait(5)
                    raise RuntimeError(f"{self.name}: exited ({self.p.returncode}); log:\n{tail(self.log)}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _expect_ready(self) -> None:
        msg = self._read_line(120)
        if "error" in msg:
            raise RuntimeError(f"{self.name}: {msg['error']}; log:\n{tail(self.log)}")

    def send(self, op: str, **args) -> None:
        self.p.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.p.stdin.flush()

    def recv(self) -> dict:
        msg = self._read_line(self.timeout)
        if "error" in msg:
            raise RuntimeError(f"{self.name}: {msg['error']}")
        return msg["ok"]

    def call(self, op: str, **args) -> dict:
        self.send(op, **args)
        return self.recv()

    def stop(self, grace: float = 5.0) -> None:
        try:
            if self.p.poll() is None and not self.p.stdin.closed:
                self.p.stdin.write(b'{"op": "quit"}\n')
                self.p.stdin.flush()
                self.p.stdin.close()
                self.p.wait(grace)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        super().stop(grace)


def wait_port(port: int, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.p.returncode}); log:\n{tail(proc.log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: port {port} not open within {timeout:.0f} s; log:\n{tail(proc.log)}")


class System:
    """One store under test: its server processes and how its clients reach it."""

    def __init__(self, name: str):
        self.name = name
        self.procs: list[Proc] = []
        self.client_conf: dict = {}
        self.client_env: dict = dict(os.environ)
        self.main: Worker | None = None
        self.failed: str | None = None
        # The multi-process row's clients: None, each runs with client_conf and reads the
        # read set the main client wrote; else each runs with mp_conf(i) and writes its own
        # read set first (Mooncake in-process: each client mounts a segment of its own).
        self.mp_conf = None

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()


def start_mooncake(sysm: System, args, tmp: Path, run_id: str, timeout: float) -> None:
    """Starts a master of sysm's own and, in TCP holder mode (system "mooncake"), the segment
    holder; each goes into sysm.procs as it starts. In-process mode ("mooncake-inproc") starts
    no holder: its clients mount the segment themselves."""
    inproc = MOONCAKE_MODES[sysm.name] == "inproc"
    master_bin = args.mooncake_master
    rpc, http, metrics = free_port(), free_port(), free_port()
    master = Proc(f"{sysm.name}-master", [
        master_bin,
        f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
        "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http}",
        f"--metrics_port={metrics}", "--metrics_host=127.0.0.1", "--enable_metric_reporting=false",
    ], tmp)
    sysm.procs.append(master)
    wait_port(rpc, master)
    wait_port(http, master)
    # Without MC_TCP_BIND_ADDRESS the transfer engine advertises the first non-loopback
    # interface's address; glog at WARNING keeps the logs small.
    env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="1")
    common = {
        "system": sysm.name,
        "metadata_server": f"http://127.0.0.1:{http}/metadata",
        "master_server_addr": f"127.0.0.1:{rpc}",
    }
    prefix = f"mcb-{run_id}-{sysm.name}-"
    sysm.client_env = env
    if inproc:
        client = {**common, "local_buffer_size": 64 * MiB, "prefer_local_segment": True}
        sysm.client_conf = {**client, "global_segment_size": args.memory_bytes, "key_prefix": prefix}
        sysm.mp_conf = lambda i: {**client, "global_segment_size": args.memory_bytes // MP_PROCS,
                                  "key_prefix": f"{prefix}mp{i}-"}
        return
    holder = Worker(f"{sysm.name}-holder", {**common, "holder": True, "global_segment_size": args.memory_bytes,
                                            "local_buffer_size": 16 * MiB}, tmp, env, timeout)
    sysm.procs.append(holder)
    sysm.client_conf = {**common, "global_segment_size": 0, "local_buffer_size": 64 * MiB,
                        "key_prefix": prefix}


LISTENING = re.compile(r"listening on [\"'= ]*([0-9a-fA-F.:\[\]]+)")


def start_yutu(sysm: System, args, tmp: Path, run_id: str) -> None:
    """Starts yutu-server (into sysm.procs) and reads its address and first admin token."""
    server_bin = Path(args.yutu_server)
    data_dir = tmp / "yutu-data"
    server = Proc("yutu-server", [
        str(server_bin), "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
        "--memory", args.memory, "--nvme-capacity", args.yutu_nvme_capacity, *args.yutu_arg,
    ], tmp, env=dict(os.environ, NO_COLOR="1"))
    sysm.procs.append(server)
    deadline = time.monotonic() + 30
    addr = None
    while addr is None:
        if not server.alive():
            raise RuntimeError(f"yutu-server exited ({server.p.returncode}); log:\n{tail(server.log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"yutu-server did not log 'listening on ADDR' within 30 s; log:\n{tail(server.log)}")
        m = LISTENING.search(server.log.read_text(errors="replace"))
        if m:
            addr = m.group(1)
        else:
            time.sleep(0.1)
    if "--prefault" in args.yutu_arg:
        # Until every shard has faulted its arena in, that work competes with the cases.
        given = [a.split("=", 1)[1] for a in args.yutu_arg if a.startswith("--shards=")]
        shards = int(given[0]) if given else (os.cpu_count() or 1)
        deadline = time.monotonic() + 120
        while server.log.read_text(errors="replace").count("DRAM arena prefaulted") < shards:
            if not server.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"yutu-server did not finish prefaulting; log:\n{tail(server.log)}")
            time.sleep(0.1)
    token_file = data_dir / "auth" / "admin-token"
    while not token_file.is_file():
        if time.monotonic() > deadline:
            raise RuntimeError(f"yutu-server wrote no {token_file}; log:\n{tail(server.log)}")
        time.sleep(0.1)
    url = f"http://{addr}"
    sysm.client_conf = {
        "system": "yutu",
        "metadata_server": url,  # ignored by Yutu
        "master_server_addr": url,
        "global_segment_size": 0,
        "local_buffer_size": 64 * MiB,
        "key_prefix": f"mcb-{run_id}-yutu-",
    }
    sysm.client_env = dict(os.environ, YUTU_TOKEN=token_file.read_text().strip())


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class Row:
    def __init__(self, name: str, unit: str, lower_is_better: bool = False, mb_per_s: bool = False):
        self.name, self.unit, self.lower, self.mbps = name, unit, lower_is_better, mb_per_s
        self.samples: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        self.mb: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        self.errors: dict[str, int] = {s: 0 for s in SYSTEMS}

    def value(self, s: str) -> float | None:
        return median(self.samples[s]) if self.samples[s] else None

    def best_mooncake(self) -> str | None:
        """The system of Mooncake's better mode in this row (higher throughput, lower latency)."""
        ms = [(self.value(s), s) for s in MOONCAKE_MODES if self.value(s) is not None]
        if not ms:
            return None
        return (min if self.lower else max)(ms)[1]

    def ratio(self) -> float | None:
        best = self.best_mooncake()
        m, y = (self.value(best) if best else None), self.value("yutu")
        if m is None or y is None or m <= 0 or y <= 0:
            return None
        return m / y if self.lower else y / m


def run_cases(systems: list[System], args, pl: dict, tmp: Path, timeout: float) -> list[Row]:
    bs, bb = BIG
    ss, sb = SMALL
    rows = {
        "put_big": Row(f"batch_put_from_2MiB_x{bb}", "GB/s", mb_per_s=True),
        "get_big": Row(f"batch_get_into_2MiB_x{bb}", "GB/s", mb_per_s=True),
        "put_small": Row(f"batch_put_from_4KiB_x{sb}", "ops/s", mb_per_s=True),
        "get_small": Row(f"batch_get_into_4KiB_x{sb}", "ops/s", mb_per_s=True),
        "get_p50": Row("get_4KiB_p50", "us", lower_is_better=True),
        "get_p99": Row("get_4KiB_p99", "us", lower_is_better=True),
        "exist_p50": Row("is_exist_p50", "us", lower_is_better=True),
        "exist_p99": Row("is_exist_p99", "us", lower_is_better=True),
        "bexist_p50": Row(f"batch_is_exist_{EXIST_BATCH}_p50", "us", lower_is_better=True),
        "bexist_p99": Row(f"batch_is_exist_{EXIST_BATCH}_p99", "us", lower_is_better=True),
        "mp": Row(f"batch_get_into_2MiB_x{bb}_{MP_PROCS}proc", "GB/s", mb_per_s=True),
        "put_alloc": Row(f"batch_put_from_2MiB_x{bb}_hostalloc", "GB/s", mb_per_s=True),
        "get_alloc": Row(f"batch_get_into_2MiB_x{bb}_hostalloc", "GB/s", mb_per_s=True),
        "put_malloc": Row(f"batch_put_from_2MiB_x{bb}_malloc", "GB/s", mb_per_s=True),
        "get_malloc": Row(f"batch_get_into_2MiB_x{bb}_malloc", "GB/s", mb_per_s=True),
        "memcpy": Row(f"memcpy_2MiB_x{bb}_one_thread", "GB/s", mb_per_s=True),
        "memcpy2": Row(f"memcpy_2MiB_x{bb}_two_threads", "GB/s", mb_per_s=True),
        "exist1_p50": Row("batch_is_exist_1_p50", "us", lower_is_better=True),
        "exist1_p99": Row("batch_is_exist_1_p99", "us", lower_is_better=True),
        "stress_put": Row(f"stress_put_1MiB_{STRESS[0]}threads", "ops/s", mb_per_s=True),
        "stress_get": Row(f"stress_get_1MiB_{STRESS[0]}threads", "ops/s", mb_per_s=True),
    }
    for name, ((k, n, z), mem) in ENGINE_SHAPES.items():
        at = "" if mem == "numpy" else f"_{mem}"
        rows[f"{name}_put"] = Row(f"{name}_put_multi_{k}x{n}x{z // KiB}KiB{at}", "GB/s",
                                  mb_per_s=True)
        rows[f"{name}_get"] = Row(f"{name}_get_multi_{k}x{n}x{z // KiB}KiB{at}", "GB/s",
                                  mb_per_s=True)
    rows["lmcache_put"] = Row(f"lmcache_put_parts_{LMCACHE_CHUNK // MiB}MiB", "GB/s", mb_per_s=True)
    rows["lmcache_get"] = Row(f"lmcache_batch_get_buffer_{LMCACHE_CHUNK // MiB}MiB_x{LMCACHE_BATCH}",
                              "GB/s", mb_per_s=True)

    def live() -> list[System]:
        return [s for s in systems if s.failed is None]

    def guarded(s: System, what: str, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one side failing must not hide the other
            s.failed = f"{what}: {e}"
            log(f"!! {s.name} failed in {what}: {e}")
            return None

    # Clients and the data the read cases read.
    for s in systems:
        log(f"[{s.name}] starting the client and writing the read sets")
        def prep(s=s):
            s.main = Worker(f"{s.name}-client", s.client_conf, tmp, s.client_env, timeout)
            s.procs.append(s.main)
            if pl["warm_bytes"]:
                s.main.call("warm", size=bs, batch=bb, batches=max(1, pl["warm_bytes"] // (bs * bb)))
            s.main.call("prepare", tag="big", size=bs, batch=bb, batches=pl["big_prepared"])
            s.main.call("prepare", tag="small", size=ss, batch=sb, batches=pl["small_prepared"])
            s.main.call("prepare", tag="abig", size=bs, batch=bb, batches=pl["big_prepared"],
                        mem="alloc")
            s.main.call("prepare", tag="mbig", size=bs, batch=bb, batches=pl["big_prepared"],
                        mem="malloc")
            s.main.call("prepare_values", tag="lat", n=pl["lat_keys"], size=LAT_SIZE)
            for name, (shape, mem) in ENGINE_SHAPES.items():
                s.main.call("multi_prepare", tag=name, shape=list(shape), batches=pl["multi_prepared"],
                            mem=mem)
            s.main.call("parts_put", tag="lmc", size=LMCACHE_CHUNK, n=pl["lmcache_keys"], verify=True)
        guarded(s, "setup", prep)

    def order(rep: int) -> list[System]:
        xs = live()
        return xs if rep % 2 == 0 else list(reversed(xs))

    for rep in range(pl["reps"]):
        log(f"-- repetition {rep + 1}/{pl['reps']}")
        for s in order(rep):
            def puts(s=s):
                for key, (size, batch, n, tag) in (("put_big", (bs, bb, pl["big_put"], "pb")),
                                                   ("put_small", (ss, sb, pl["small_put"], "ps"))):
                    r = s.main.call("put", tag=f"{tag}{rep}", size=size, batch=batch, batches=n, verify=rep == 0)
                    record(rows[key], s.name, r, size)
            if "put" in args.cases:
                guarded(s, "batch_put_from", puts)
        for s in order(rep):
            def gets(s=s):
                for key, (size, batch, n, tag, prepared) in (
                        ("get_big", (bs, bb, pl["big_get"], "big", pl["big_prepared"])),
                        ("get_small", (ss, sb, pl["small_get"], "small", pl["small_prepared"]))):
                    r = s.main.call("get", tag=tag, size=size, batch=batch, prepared=prepared,
                                    iters=n, verify=rep == 0)
                    record(rows[key], s.name, r, size)
            if "get" in args.cases:
                guarded(s, "batch_get_into", gets)
        for s in order(rep):
            def allocs(s=s):
                r = s.main.call("put", tag=f"pa{rep}", size=bs, batch=bb, batches=pl["big_put"],
                                verify=rep == 0, mem="alloc")
                record(rows["put_alloc"], s.name, r, bs)
                r = s.main.call("get", tag="abig", size=bs, batch=bb, prepared=pl["big_prepared"],
                                iters=pl["big_get"], verify=rep == 0, mem="alloc")
                record(rows["get_alloc"], s.name, r, bs)
                r = s.main.call("put", tag=f"pm{rep}", size=bs, batch=bb, batches=pl["big_put"],
                                verify=rep == 0, mem="malloc")
                record(rows["put_malloc"], s.name, r, bs)
                r = s.main.call("get", tag="mbig", size=bs, batch=bb, prepared=pl["big_prepared"],
                                iters=pl["big_get"], verify=rep == 0, mem="malloc")
                record(rows["get_malloc"], s.name, r, bs)
                r = s.main.call("memcpy", size=bs, batch=bb, iters=pl["big_get"])
                record(rows["memcpy"], s.name, r, bs)
                r = s.main.call("memcpy", size=bs, batch=bb, iters=pl["big_get"], threads=2)
                record(rows["memcpy2"], s.name, r, bs)
            if "alloc" in args.cases:
                guarded(s, "allocator memory", allocs)
        for s in order(rep):
            def lats(s=s):
                r = s.main.call("get_latency", tag="lat", n=pl["lat_keys"], size=LAT_SIZE, iters=pl["lat_iters"])
                rows["get_p50"].samples[s.name].append(r["p50_us"])
                rows["get_p99"].samples[s.name].append(r["p99_us"])
                rows["get_p50"].errors[s.name] += r["errors"]
                r = s.main.call("exist_latency", tag="lat", n=pl["lat_keys"], iters=pl["lat_iters"])
                rows["exist_p50"].samples[s.name].append(r["p50_us"])
                rows["exist_p99"].samples[s.name].append(r["p99_us"])
                rows["exist_p50"].errors[s.name] += r["errors"]
                r = s.main.call("batch_exist_latency", tag="lat", n=pl["lat_keys"],
                                batch=EXIST_BATCH, iters=pl["lat_iters"])
                rows["bexist_p50"].samples[s.name].append(r["p50_us"])
                rows["bexist_p99"].samples[s.name].append(r["p99_us"])
                rows["bexist_p50"].errors[s.name] += r["errors"]
                r = s.main.call("batch_exist_latency", tag="lat", n=pl["lat_keys"],
                                batch=1, iters=pl["lat_iters"])
                rows["exist1_p50"].samples[s.name].append(r["p50_us"])
                rows["exist1_p99"].samples[s.name].append(r["p99_us"])
                rows["exist1_p50"].errors[s.name] += r["errors"]
            if "latency" in args.cases:
                guarded(s, "latency", lats)
        for s in order(rep):
            def stress(s=s):
                threads, per = STRESS[0], pl["stress_per_thread"]
                r = s.main.call("stress", tag=f"st{rep}", threads=threads, per_thread=per,
                                size=STRESS[1])
                if r["first_failure"]:
                    log(f"{s.name} stress: {r['errors']} failures, first: {r['first_failure']}")
                for key, el in (("stress_put", r["put_elapsed"]), ("stress_get", r["get_elapsed"])):
                    rows[key].samples[s.name].append(r["ops"] / el)
                    rows[key].mb[s.name].append(r["ops"] * STRESS[1] / el / 1e6)
                    rows[key].errors[s.name] += r["errors"]
            if "stress" in args.cases:
                guarded(s, "stress", stress)
        for s in order(rep):
            def engines(s=s):
                for name, (shape, mem) in ENGINE_SHAPES.items():
                    k, n, z = shape
                    r = s.main.call("multi_put", tag=f"{name}p{rep}", shape=list(shape),
                                    batches=pl["multi_put"], verify=rep == 0, mem=mem)
                    record(rows[f"{name}_put"], s.name, r, n * z)
                    r = s.main.call("multi_get", tag=name, shape=list(shape),
                                    prepared=pl["multi_prepared"], iters=pl["multi_get"],
                                    verify=rep == 0, mem=mem)
                    record(rows[f"{name}_get"], s.name, r, n * z)
                r = s.main.call("parts_put", tag=f"lmcp{rep}", size=LMCACHE_CHUNK,
                                n=pl["lmcache_keys"], verify=rep == 0)
                record(rows["lmcache_put"], s.name, r, LMCACHE_CHUNK)
                r = s.main.call("buffers_get", tag="lmc", size=LMCACHE_CHUNK, n=pl["lmcache_keys"],
                                batch=LMCACHE_BATCH, iters=pl["lmcache_get"])
                record(rows["lmcache_get"], s.name, r, LMCACHE_CHUNK)
            if "engines" in args.cases:
                guarded(s, "engine shapes", engines)

    # The multi-process row: MP_PROCS fresh clients per system, started together.
    for s in live() if "mp" in args.cases else []:
        log(f"[{s.name}] {MP_PROCS} client processes, batch_get_into 2 MiB x {bb}")
        workers: list[Worker] = []
        def mp(s=s):
            if s.mp_conf is not None and s.main is not None:
                # Its segment goes too: the clients below mount --memory between them.
                s.main.stop()
                s.procs.remove(s.main)
                s.main = None
            for i in range(MP_PROCS):
                conf = s.client_conf if s.mp_conf is None else s.mp_conf(i)
                w = Worker(f"{s.name}-mp{i}", conf, tmp, s.client_env, timeout)
                workers.append(w)
                s.procs.append(w)
            if s.mp_conf is not None:
                # Each client writes the read set it reads, into its own segment, untimed.
                for w in workers:
                    w.send("prepare", tag="big", size=bs, batch=bb, batches=pl["big_prepared"])
                for w in workers:
                    w.recv()
            for rep in range(pl["reps"]):
                # The check (first rep) or a warm-up batch, in every process, before the clock.
                for i, w in enumerate(workers):
                    w.send("get", tag="big", size=bs, batch=bb, prepared=pl["big_prepared"],
                           iters=0, verify=rep == 0, offset=i)
                for w in workers:
                    w.recv()
                # Then all start at the same instant (CLOCK_MONOTONIC is system-wide).
                start_at = time.monotonic() + 0.2
                for i, w in enumerate(workers):
                    w.send("get", tag="big", size=bs, batch=bb, prepared=pl["big_prepared"],
                           iters=pl["mp_iters"], verify=False, warm=False, offset=i, start_at=start_at)
                rs = [w.recv() for w in workers]
                span = max(r["t1"] for r in rs) - min(r["t0"] for r in rs)
                total = sum(r["bytes"] for r in rs)
                rows["mp"].samples[s.name].append(total / span / 1e9)
                rows["mp"].mb[s.name].append(total / span / 1e6)
                rows["mp"].errors[s.name] += sum(r["errors"] for r in rs)
        guarded(s, "multi-process", mp)
        for w in workers:
            w.stop()
            if w in s.procs:
                s.procs.remove(w)

    return list(rows.values())


def record(row: Row, system: str, r: dict, size: int) -> None:
    el = r["elapsed"]
    if row.unit == "GB/s":
        row.samples[system].append(r["bytes"] / el / 1e9)
    else:
        row.samples[system].append(r["ops"] / el)
    row.mb[system].append(r["bytes"] / el / 1e6)
    row.errors[system] += r["errors"]


def machine() -> dict:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    except OSError:
        kernel = "unknown"
    return {"cores": cores, "kernel": kernel}


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}"


def report(rows: list[Row], systems: list[System], args) -> dict:
    results = []
    memcpy = next((r.value("yutu") for r in rows if r.name.startswith("memcpy_")), None)
    for row in rows:
        y = row.value("yutu")
        res: dict = {"name": row.name, "value": y, "unit": row.unit}
        if row.mbps and row.mb["yutu"]:
            res["mb_per_s"] = median(row.mb["yutu"])
        if y is not None:
            res["errors"] = row.errors["yutu"]
            # Every repetition's number, in order: a row whose first repetitions differ from
            # its last says the run had not reached a steady state.
            res["samples"] = list(row.samples["yutu"])
        if row.lower:
            res["lower_is_better"] = True  # ratio is reference/value here, so > 1 = Yutu ahead
        # Each Mooncake mode's numbers; the reference is the better mode's.
        modes: dict = {}
        for s, mode in MOONCAKE_MODES.items():
            v = row.value(s)
            if v is None:
                continue
            modes[mode] = {"value": v, "samples": list(row.samples[s])}
            if row.mbps and row.mb[s]:
                modes[mode]["mb_per_s"] = median(row.mb[s])
            modes[mode]["errors"] = row.errors[s]
        ref = None
        best = row.best_mooncake()
        if best is not None:
            mode = MOONCAKE_MODES[best]
            ref = {"name": f"mooncake_{row.name}", **modes[mode], "mode": mode, "modes": modes}
        res["reference"] = ref
        res["ratio"] = row.ratio()
        res["target"] = 1.0
        if memcpy and y is not None and row.unit == "GB/s" and "2MiB" in row.name:
            # The rows that move 2 MiB blocks, against one thread's memcpy of the same bytes
            # measured in Yutu's client process in the same repetitions.
            res["memcpy_ratio"] = y / memcpy
        results.append(res)
    out = {"suite": "mooncake", "machine": machine(), "results": results}

    mc = machine()
    lines = [f"suite mooncake on {mc['cores']} cores, kernel {mc['kernel']}"
             + ("  (--quick)" if args.quick else "")]
    cols = [f"mooncake_{mode}" for mode in MOONCAKE_MODES.values()]
    table = [["case", *cols, "yutu", "unit", "ratio"]]
    for row in rows:
        r = row.ratio()
        best = row.best_mooncake()
        marked = any(row.value(s) is not None for s in MOONCAKE_MODES if s != best)
        mcells = [fmt(row.value(s)) + ("*" if s == best and marked else "") for s in MOONCAKE_MODES]
        cells = [row.name, *mcells, fmt(row.value("yutu")), row.unit, "-" if r is None else f"{r:.3f}"]
        errs = [f"{s} errors {row.errors[s]}" for s in SYSTEMS if row.errors[s]]
        if errs:
            cells[-1] += "  (" + ", ".join(errs) + ")"
        table.append(cells)
    # case left-aligned, the numbers right-aligned, then the unit left-aligned and the ratio.
    n = len(table[0])
    widths = [max(len(t[c]) for t in table) for c in range(n)]
    for t in table:
        cells = [t[c].ljust(widths[c]) if c in (0, n - 2) else t[c].rjust(widths[c]) for c in range(n - 1)]
        lines.append("  ".join([*cells, t[-1]]).rstrip())
    lines.append("ratio: yutu/mooncake for throughput, mooncake/yutu for latency (> 1: Yutu ahead), "
                 "against Mooncake's better mode in the row (* where both ran)")
    vs = [(r["name"], r["memcpy_ratio"]) for r in results if "memcpy_ratio" in r
          and not r["name"].startswith("memcpy_")]
    if vs:
        lines.append("yutu / one-thread memcpy (same client process, same run): "
                     + ", ".join(f"{n} {v:.2f}" for n, v in vs))
    for s in systems:
        if s.failed:
            lines.append(f"{s.name} FAILED: {s.failed}")
    print("\n".join(lines), flush=True)
    return out


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]i?B?)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB)")
    mult = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": GiB * KiB}[(m.group(2) or "")[:1].upper()]
    return int(m.group(1)) * mult


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker_main(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (small counts), for CI")
    ap.add_argument("--only", choices=SYSTEMS, action="append",
                    help="run only this system; repeat it for several (default: all of " + ", ".join(SYSTEMS) + ")")
    ap.add_argument("--json", metavar="FILE", help="also write the report as JSON (benches/src/report.rs shape)")
    ap.add_argument("--yutu-server", default=str(REPO / "target" / "release" / "yutu-server"),
                    help="the yutu-server binary (default: target/release/yutu-server)")
    ap.add_argument("--yutu-nvme-capacity", default="0",
                    help="yutu-server --nvme-capacity (default 0: DRAM only, like Mooncake)")
    ap.add_argument("--mooncake-master", help="the mooncake_master binary (default: on PATH or next to python)")
    ap.add_argument("--memory", default="2GiB",
                    help="memory for data on each side: Mooncake's global segment (the holder's, or the "
                         "in-process client's), Yutu's --memory (default 2GiB)")
    ap.add_argument("--reps", type=int, help="repetitions per case (default 5, --quick 1)")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the scratch directory (logs) after the run")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip writing --memory before the first put row (the put rows then "
                         "include first-touch page faults, as on a fresh store)")
    ap.add_argument("--yutu-arg", action="append", default=[], metavar="ARG",
                    help="an extra yutu-server argument (repeatable), e.g. --yutu-arg=--prefault")
    ap.add_argument("--case", dest="cases", action="append", choices=CASES, metavar="GROUP",
                    help="run only this group of rows (repeatable): " + ", ".join(CASES))
    args = ap.parse_args()
    args.cases = args.cases or list(CASES)
    args.memory_bytes = parse_size(args.memory)
    pl = plan(args.quick)
    if args.reps:
        pl["reps"] = args.reps
    pl["warm_bytes"] = 0 if args.quick or args.no_warm else args.memory_bytes
    timeout = 120.0 if args.quick else 600.0

    wanted = [s for s in SYSTEMS if s in args.only] if args.only else list(SYSTEMS)
    for names, module in ((tuple(MOONCAKE_MODES), "mooncake"), (("yutu",), "yutu")):
        if any(name in wanted for name in names):
            import importlib.util

            if importlib.util.find_spec(module) is None:
                log(f"python package {module} is not importable from {sys.executable}; "
                    f"run scripts/install-bench-deps.sh, use .venv-bench/bin/python, or pass --only")
                return 2

    # The binaries, before anything starts.
    if "yutu" in wanted and not Path(args.yutu_server).is_file():
        log(f"{args.yutu_server} not found: cargo build --release -p yutu-server, or pass --yutu-server")
        return 2
    if any(name in wanted for name in MOONCAKE_MODES):
        args.mooncake_master = (args.mooncake_master or shutil.which("mooncake_master")
                                or str(Path(sys.executable).parent / "mooncake_master"))
        if not Path(args.mooncake_master).is_file():
            log("mooncake_master not found: pass --mooncake-master, or install mooncake-transfer-engine-non-cuda")
            return 2

    # SIGTERM (and SIGHUP) unwind like Ctrl-C, so the finally below stops every process.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    tmp = Path(tempfile.mkdtemp(prefix="yutu-mooncake-bench-"))
    run_id = f"{int(time.time())}{os.getpid()}"
    systems: list[System] = []
    rc = 0
    try:
        for name in wanted:
            log(f"[{name}] starting")
            sysm = System(name)
            systems.append(sysm)  # before its processes start, so the finally stops them
            if name in MOONCAKE_MODES:
                start_mooncake(sysm, args, tmp, run_id, timeout)
            else:
                start_yutu(sysm, args, tmp, run_id)
        rows = run_cases(systems, args, pl, tmp, timeout)
        out = report(rows, systems, args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
            log(f"wrote {args.json}")
        if any(s.failed for s in systems) or any(row.errors[s] for row in rows for s in SYSTEMS):
            rc = 1
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        rc = 130
    except Exception as e:  # noqa: BLE001
        log(f"error: {e}")
        rc = 1
    finally:
        for s in systems:
            s.stop()
        if args.keep_tmp or rc not in (0, 130):
            log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
