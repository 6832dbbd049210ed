"""W5 (``BENCHMARKS.md``), variable-size samples, through ``cachex.PageWriter``
and ``cachex.PageReader``: a two-thread write, then random reads per sample
and in batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import cachex
from report import WrongValueError, emit, progress

GOLDEN = np.uint64(0x9E3779B97F4A7C15)

W5_REPS, W5_BATCH = 3, 256


def w5_start_word(seed: int, i: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (i.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9))
        z = (z ^ (z >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(29))


def w5_pattern(seed: int, i: int, size: int) -> np.ndarray:
    base = w5_start_word(seed, np.array([i]))[0]
    words = (size + 7) // 8
    with np.errstate(over="ignore"):
        w = base + np.arange(words, dtype=np.uint64) * GOLDEN
    return w.view(np.uint8)[:size]


def w5(root: Path, n: int, seed: int) -> None:
    sizes = np.random.default_rng(seed).integers(1024, 65537, n)
    total = int(sizes.sum())
    path = root / "w5.pages"
    progress(f"w5: {n} samples, {total / 1e6:.1f} MB")
    samples = [{"id": i, "data": w5_pattern(seed, i, int(sizes[i]))} for i in range(n)]
    write_secs = []
    for _ in range(W5_REPS):
        if path.exists():
            path.unlink()
        t = time.perf_counter()
        writer = cachex.PageWriter(path, {"id": "int", "data": "bytes"})
        writer.write_many(samples, threads=2)
        writer.finalize()
        write_secs.append(time.perf_counter() - t)
    write_secs.sort()
    emit("w5", "write", n, total, write_secs[len(write_secs) // 2], threads=2)
    del samples

    reader = cachex.PageReader(path)
    order = np.random.default_rng(seed ^ 0xF00D).permutation(n).tolist()

    def timed(read: Callable[[], int]) -> float:
        secs = []
        for _ in range(W5_REPS):
            t = time.perf_counter()
            got = read()
            secs.append(time.perf_counter() - t)
            if got != total:
                raise WrongValueError(f"w5: read {got} bytes, wrote {total}")
        return sorted(secs)[len(secs) // 2]

    def per_sample() -> int:
        nbytes, sink = 0, 0
        for i in order:
            data = reader.sample(i)["data"]
            sink ^= int(data.max(initial=0))  # touches every byte
            nbytes += data.size
        return nbytes

    emit("w5", "read_random", n, total, timed(per_sample))

    width = int(reader.max_sizes["data"])
    out = {"data": np.empty((W5_BATCH, width), np.uint8)}

    def batches() -> int:
        nbytes = 0
        for k in range(0, n, W5_BATCH):
            batch = order[k : k + W5_BATCH]
            nxt = order[k + W5_BATCH : k + 2 * W5_BATCH]
            if nxt:
                reader.prefetch(nxt)
            lengths = reader.fill_batch(batch, out)["data"]
            out["data"][: len(batch)].max()  # touches every byte of the batch
            nbytes += sum(lengths)
        return nbytes

    emit("w5", "read_batches", n, total, timed(batches), batch=W5_BATCH)
    for i in order:  # every value, outside the timed region
        if reader.sample(i)["data"].tobytes() != w5_pattern(seed, i, int(sizes[i])).tobytes():
            raise WrongValueError(f"w5: sample {i} differs from its pattern")
