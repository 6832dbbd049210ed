"""W3 (``BENCHMARKS.md``), random access over an iterable, through
``cachex.ShardStore``: a first pass, sequential and random reads, and random
reads under a disk budget (evicted shards regenerated from the source)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import cachex
from report import WrongValueError, emit, progress

W3_PAYLOAD, W3_SHARD_ITEMS, W3_RANDOM_READS, W3_BUDGET_BATCH = 200, 8192, 100_000, 10_000


def w3_record(i: int, seed: int) -> tuple[int, bytes]:
    base = ((i * 0x9E3779B97F4A7C15) ^ seed) & 0xFFFFFFFFFFFFFFFF
    j = np.arange(W3_PAYLOAD, dtype=np.uint64)
    payload = ((np.uint64(base) + j * np.uint64(131)) >> np.uint64(7)).astype(np.uint8)
    return (i, payload.tobytes())


class W3Source:
    """The deterministic source: N records ``(id, payload)`` (picklable)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __call__(self):
        return (w3_record(i, self.seed) for i in range(self.n))


def w3(root: Path, n: int, seed: int) -> None:
    item_bytes = 8 + W3_PAYLOAD
    source = W3Source(n, seed)
    progress(f"w3: first pass over {n} records")
    t = time.perf_counter()
    store = cachex.ShardStore(root / "w3", source, max_shard_length=W3_SHARD_ITEMS)
    got = store.get_many(list(range(n)))
    secs = time.perf_counter() - t
    emit("w3", "first_pass", n, n * item_bytes, secs)
    for i in range(0, n, max(1, n // 1000)):
        if got[i] != w3_record(i, seed):
            raise WrongValueError(f"w3: record {i} differs")
    del store, got

    samples = []
    for _ in range(3):
        cached = cachex.ShardStore(root / "w3")
        t = time.perf_counter()
        ids = [r[0] for r in cached.get_many(list(range(n)))]
        samples.append(time.perf_counter() - t)
        if ids != list(range(n)):
            raise WrongValueError("w3: sequential pass out of order")
    samples.sort()
    emit("w3", "read_sequential", n, n * item_bytes, samples[1])

    reads = min(W3_RANDOM_READS, 10 * n)
    idx = np.random.default_rng(seed).integers(0, n, reads).tolist()
    cached = cachex.ShardStore(root / "w3")
    t = time.perf_counter()
    got = []
    for k in range(0, reads, W3_BUDGET_BATCH):
        got.extend(cached.get_many(idx[k : k + W3_BUDGET_BATCH]))
    emit("w3", "read_random", reads, reads * item_bytes, time.perf_counter() - t)
    for i, g in zip(idx, got, strict=True):
        if g[0] != i:
            raise WrongValueError(f"w3: random read {i} got {g[0]}")

    disk = sum(f.stat().st_size for f in (root / "w3" / "shards").iterdir())
    budget = max(disk // 4, 1)
    bstore = cachex.ShardStore(
        root / "w3-budget",
        source,
        max_shard_length=W3_SHARD_ITEMS,
        memory_limit=budget,
        max_cache_size=8,
    )
    t = time.perf_counter()
    got = []
    for k in range(0, reads, W3_BUDGET_BATCH):
        got.extend(bstore.get_many(idx[k : k + W3_BUDGET_BATCH]))
    emit(
        "w3",
        "read_random_budget",
        reads,
        reads * item_bytes,
        time.perf_counter() - t,
        memory_limit=budget,
    )
    for i, g in zip(idx, got, strict=True):
        if g != w3_record(i, seed):
            raise WrongValueError(f"w3: budget read {i} differs")
