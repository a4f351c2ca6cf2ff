"""What an inference engine does with Yutu: KV blocks named by chained token hashes, written
from and read back into one registered 1 GiB buffer.

    python engine_kv.py http://127.0.0.1:9000        # token from YUTU_TOKEN

Copy it: the three steps below are the whole integration.
"""

import os
import sys

import numpy as np

import yutu

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9000"
BUFFER = 1 << 30  # the engine's host-side KV buffer
BLOCK = 2 << 20  # one KV block: 2 MiB
BLOCK_TOKENS = 16  # tokens per block, as the engine pages its cache
BLOCKS = int(os.environ.get("BLOCKS", "64"))  # blocks of one prompt's prefix

with yutu.Store(URL, bucket="llama-3-8b") as store:
    # 1. Register the engine's buffer once (here a numpy array; a pinned torch tensor's
    #    data_ptr() works the same way).
    kv = np.zeros(BUFFER, dtype=np.uint8)
    store.register_buffer(kv.ctypes.data, kv.nbytes)

    # 2. Name the blocks of a prompt by its tokens: block i's key is the hash of every token
    #    up to the end of block i, so two prompts share exactly the blocks of their common prefix.
    tokens = list(range(BLOCKS * BLOCK_TOKENS))
    keys = yutu.block_keys(tokens, BLOCK_TOKENS)

    # The engine computed these blocks into the first half of its buffer.
    half = BUFFER // 2
    rng = np.random.default_rng(0)
    kv[: BLOCKS * BLOCK] = rng.integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
    store.batch_put_from(
        keys, [kv.ctypes.data + i * BLOCK for i in range(BLOCKS)], [BLOCK] * BLOCKS
    )

    # 3. Later (or on another engine): how much of the prefix is cached, then load it.
    cached = store.batch_is_exist(keys)
    hit = cached.index(False) if False in cached else len(keys)
    got = store.batch_get_into(
        keys[:hit], [kv.ctypes.data + half + i * BLOCK for i in range(hit)], [BLOCK] * hit
    )
    assert got == [BLOCK] * hit
    assert np.array_equal(kv[: hit * BLOCK], kv[half : half + hit * BLOCK]), "bytes differ"
    print(f"{hit} of {len(keys)} blocks cached and read back byte-exact")
