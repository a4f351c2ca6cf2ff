"""The inference engines' own Mooncake integrations, as they ship, against a real Yutu node.

Runs in `.venv-engines` (`scripts/install-engine-deps.sh`: CPU torch from PyPI; `sglang`,
`lmcache` and `vllm` installed with `--no-deps` plus their import-time dependencies; no
Mooncake), with `YUTU_MOONCAKE=1` set before the interpreter starts, so the engines'
`from mooncake.store import ...` resolves to `yutu.mooncake` through the package's `.pth`
hook: no engine code is edited or patched.

- SGLang 0.5.23 HiCache `MooncakeStore`: its shipped test module as a program; page-first and
  layer-first multi-buffer MLA layouts through `batch_set_v1`/`batch_get_v1`; its
  `check_server` against the node's `/get_all_segments`.
- LMCache 0.5.6: its `RemoteBackend` with the `mooncakestore://` connector, at its default
  settings (`put_parts` + `batch_get_buffer`) and with `save_chunk_meta: false`
  (`batch_put_from` + `batch_get_into`): 18 chunks of 1 KiB, 64 KiB and 2 MiB, stored 18,
  hit 18, bytes equal.
- vLLM 0.33.0: its own config loader and `setup_mooncake_store`
  (`vllm/distributed/mooncake_store.py`), then exactly the store calls its
  `MooncakeStoreWorker` makes (`vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/
  worker.py` of the 0.33.0 wheel: register_buffer of each KV tensor, batch_is_exist,
  batch_put_from_multi_buffers with a ReplicateConfig, batch_get_into_multi_buffers,
  remove_all(force=True), close). The worker itself needs a model config and process groups,
  which do not build without a model on CPU.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import wait_until

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    os.environ.get("YUTU_MOONCAKE") != "1",
    reason="run with YUTU_MOONCAKE=1 (scripts/test.sh does): the engines import mooncake.store",
)


def test_the_engines_get_yutu_for_mooncake_store():
    import mooncake.store
    import yutu.mooncake

    assert mooncake.store.MooncakeDistributedStore is yutu.mooncake.MooncakeDistributedStore


@pytest.fixture
def sglang_env(node, bucket, monkeypatch):
    host = node.url.removeprefix("http://")
    env = {
        "MOONCAKE_MASTER": host,
        "MOONCAKE_PROTOCOL": "tcp",
        "MOONCAKE_DEVICE": "",
        "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb",
        "MOONCAKE_TENANT_ID": bucket,
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        "YUTU_TOKEN": node.admin_token,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


# ------------------------------------------------------------------------------- SGLang


def test_sglang_shipped_test_module(sglang_env):
    """SGLang's own test program (single set/get, batches for MHA and MLA, TP ranks)."""
    env = {**os.environ, **sglang_env, "YUTU_MOONCAKE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "All tests passed" in out, out[-4000:]
    assert out.count("Batch operation passed") == 4, out[-4000:]


def _sglang_store(is_mla, tp_rank=0, tp_size=1):
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    from sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store import (
        make_hicache_storage_config,
    )

    return MooncakeStore(make_hicache_storage_config(is_mla_model=is_mla, tp_rank=tp_rank,
                                                     tp_size=tp_size))


@pytest.mark.parametrize("is_mla,entries", [(False, 2), (True, 1), (True, 4), (True, 61)])
def test_sglang_layouts(sglang_env, is_mla, entries):
    """Page-first (one buffer per key: MHA k/v, MLA) and layer-first MLA, where a page's key is
    gathered from one buffer per layer (batch_put_from_multi_buffers)."""
    from sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store import (
        create_mock_host_kv_cache,
    )

    store = _sglang_store(is_mla)
    elements, pages = 64, 12
    pool, buf = create_mock_host_kv_cache(8 << 20, entries_per_page=entries, page_elements=elements)
    store.register_mem_pool_host(pool)
    keys = [f"p-{uuid.uuid4()}" for _ in range(pages)]
    assert all(store.batch_set_v1(keys, torch.arange(pages)))
    assert store.batch_exists(keys) == pages
    assert all(store.batch_get_v1(keys, torch.arange(pages, 2 * pages)))
    n = pages * entries * elements
    assert torch.equal(buf[:n], buf[n:2 * n])
    # A second set of the same pages is a no-op (exists first), a miss stops the prefix.
    assert all(store.batch_set_v1(keys, torch.arange(pages)))
    assert store.batch_exists(keys[:3] + [f"absent-{uuid.uuid4()}"] + keys[3:]) == 3
    if is_mla and entries > 1:
        # The pages really were stored as one object each, gathered from `entries` buffers.
        size = store.store.get_size(f"{keys[0]}__k")
        assert size == entries * elements * buf.element_size()


def test_sglang_check_server(sglang_env, node, monkeypatch):
    """SGLang polls the master's /get_all_segments before setup; a Yutu node answers it."""
    monkeypatch.setenv("MOONCAKE_CHECK_SERVER", "true")
    monkeypatch.setenv("MOONCAKE_MASTER_METRICS_PORT", str(node.port))
    t0 = time.monotonic()
    store = _sglang_store(False)
    assert time.monotonic() - t0 < 30
    assert store.store.get_hostname().startswith("127.0.0.1:")


def test_sglang_host_allocator(sglang_env):
    """SGLang's MooncakeHostTensorAllocator (standalone-storage pools) on Yutu's allocator."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import (
        MooncakeHostTensorAllocator,
    )

    t = MooncakeHostTensorAllocator().allocate((4, 1024), torch.float16)
    assert t.shape == (4, 1024) and t.dtype == torch.float16
    t.fill_(3)
    assert float(t.sum()) == 3 * 4 * 1024


# ------------------------------------------------------------------------------- LMCache


def _lmcache_backend(node, bucket, kv_shape, chunk, save_meta):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    extra = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": node.url.removeprefix("http://"),
        "protocol": "tcp",
        "global_segment_size": 1 << 26,
        "local_buffer_size": 1 << 24,
        "mooncake_tenant_id": bucket,
        "mooncake_token": node.admin_token,
    }
    if save_meta is not None:
        extra["save_chunk_meta"] = save_meta
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=chunk, local_cpu=False, max_local_cpu_size=0.1,
        remote_url="mooncakestore://127.0.0.1:50051/", remote_serde="naive",
        extra_config=extra,
    )
    md = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=kv_shape,
                         chunk_size=chunk)
    cpu = LocalCPUBackend(cfg, md)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    rb = RemoteBackend(cfg, md, loop, cpu)
    # RemoteBackend swallows a failed connection (and then stores nothing).
    assert rb.connection is not None, "LMCache could not connect to the node"
    return rb, cpu, md, loop


# (kv_shape, chunk tokens) of 1 KiB, 64 KiB and 2 MiB chunks in bf16.
LMCACHE_SHAPES = [((2, 2, 16, 1, 8), 16), ((2, 2, 16, 8, 64), 16), ((8, 2, 256, 4, 64), 256)]


@pytest.mark.parametrize("save_meta", [None, False], ids=["defaults", "save_chunk_meta_false"])
def test_lmcache_remote_backend(node, bucket, save_meta):
    from lmcache.utils import CacheEngineKey

    stored = hit = 0
    for s, (shape, chunk) in enumerate(LMCACHE_SHAPES):
        rb, cpu, md, loop = _lmcache_backend(node, bucket, shape, chunk, save_meta)
        try:
            keys = [CacheEngineKey("m", 1, 0, s * 100 + i, torch.bfloat16) for i in range(6)]
            objs, want = [], []
            for i in range(6):
                o = cpu.allocate(md.get_shapes(), md.get_dtypes(), None)
                g = torch.Generator().manual_seed(s * 100 + i)
                o.tensor.copy_(torch.randn(o.tensor.shape, generator=g).to(o.tensor.dtype))
                objs.append(o)
                want.append(o.tensor.clone())
            assert want[0].numel() * 2 == [1 << 10, 64 << 10, 2 << 20][s]
            rb.batched_submit_put_task(keys, objs)
            wait_until(lambda: not rb.put_tasks, 30, "LMCache's put tasks")
            wait_until(lambda: all(rb.contains(k) for k in keys), 30, "contains")
            stored += sum(rb.contains(k) for k in keys)
            got = rb.batched_get_blocking(keys)
            for g, w in zip(got, want):
                if g is not None and torch.equal(g.tensor.view(torch.uint8), w.view(torch.uint8)):
                    hit += 1
            absent = CacheEngineKey("m", 1, 0, 999999, torch.bfloat16)
            assert not rb.contains(absent)
            n = asyncio.run_coroutine_threadsafe(
                rb.connection.batched_async_contains("x", keys + [absent]), loop).result(30)
            assert n == 6
        finally:
            rb.close()
            loop.call_soon_threadsafe(loop.stop)
    assert (stored, hit) == (18, 18)


# ------------------------------------------------------------------------------- vLLM


def test_vllm_store_worker_calls(node, bucket, tmp_path, monkeypatch):
    from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    # vLLM's config file (MOONCAKE_CONFIG_PATH), read by vLLM's own loader.
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": node.url.removeprefix("http://"),
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": "1GB",
        "local_buffer_size": "64MB",
        "tenant_id": bucket,
    }))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    monkeypatch.setenv("YUTU_TOKEN", node.admin_token)
    config = MooncakeStoreConfig.load_from_config()
    store = MooncakeDistributedStore()
    setup_mooncake_store(store, config, "127.0.0.1")
    # The worker registers each KV cache tensor (one per layer, K and V as halves) ...
    layers, blocks, block_len = 4, 32, 16 << 10
    kv = [torch.randn(2, blocks, block_len // 4, dtype=torch.float32) for _ in range(layers)]
    for t in kv:
        assert store.register_buffer(t.data_ptr(), t.numel() * t.element_size()) == 0
    rc = ReplicateConfig()
    rc.preferred_segment = store.get_hostname()

    def addrs(block):
        out, sizes = [], []
        for t in kv:
            for half in range(2):
                out.append(t[half, block].data_ptr())
                sizes.append(block_len)
        return out, sizes

    keys = [f"vllm@{uuid.uuid4().hex}" for _ in range(8)]
    # ... looks the blocks up, stores the missing ones from all their segments ...
    assert store.batch_is_exist(keys) == [0] * 8
    a = [addrs(b) for b in range(8)]
    assert store.batch_put_from_multi_buffers(keys, [x for x, _ in a], [z for _, z in a], rc) == [0] * 8
    assert store.batch_is_exist(keys) == [1] * 8
    # ... and loads them into other blocks.
    want = [torch.cat([t[:, b].reshape(-1) for t in kv]) for b in range(8)]
    b = [addrs(8 + i) for i in range(8)]
    got = store.batch_get_into_multi_buffers(keys, [x for x, _ in b], [z for _, z in b])
    assert got == [layers * 2 * block_len] * 8
    for i in range(8):
        assert torch.equal(torch.cat([t[:, 8 + i].reshape(-1) for t in kv]), want[i])
    assert store.remove_all(force=True) >= 8
    assert store.batch_is_exist(keys) == [0] * 8
    assert store.close() == 0
