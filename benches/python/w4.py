"""W4 (``BENCHMARKS.md``), fixed-shape rows, through ``cachex.MemmapWriter``
and ``cachex.MemmapArray``: a write, then random row reads."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import cachex
from report import WrongValueError, emit, progress

W4_L = 4096


def w4_row(i: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, i])
    return {
        "data": rng.integers(-30000, 30000, (3, W4_L), dtype=np.int16),
        "annotation": rng.integers(-100, 100, (3, W4_L), dtype=np.int8),
        "scaler": rng.random(W4_L, dtype=np.float32),
    }


def w4(root: Path, n: int, seed: int) -> None:
    arrays = {
        "data": ("int16", (3, W4_L)),
        "annotation": ("int8", (3, W4_L)),
        "scaler": ("float32", (W4_L,)),
    }
    row_bytes = 3 * W4_L * 2 + 3 * W4_L + 4 * W4_L
    progress(f"w4: writing {n} rows")
    rows = [w4_row(i, seed) for i in range(min(n, 64))]
    sums = [sum(float(a.astype(np.float64).sum()) for a in r.values()) for r in rows]
    secs = 0.0
    t = time.perf_counter()
    writer = cachex.MemmapWriter(root / "w4", arrays, fingerprint={"w4": seed})
    secs += time.perf_counter() - t
    for i in range(n):
        row = rows[i % len(rows)]
        t = time.perf_counter()
        writer.write(f"sample_{i}", row)
        secs += time.perf_counter() - t
    t = time.perf_counter()
    writer.finalize()
    secs += time.perf_counter() - t
    emit("w4", "write", n, n * row_bytes, secs)

    cache = cachex.MemmapArray(root / "w4")
    order = np.random.default_rng(seed).permutation(n)
    pass_secs = []
    for _ in range(4):
        t = time.perf_counter()
        for i in order:
            row = cache.get_row(int(i))
            total = (
                float(row["data"].sum(dtype=np.int64))
                + float(row["annotation"].sum(dtype=np.int64))
                + float(row["scaler"].sum(dtype=np.float64))
            )
            want = sums[int(i) % len(rows)]
            if abs(total - want) > 1e-3 * max(1.0, abs(want)):
                raise WrongValueError(f"w4: row {i} checksum differs")
        pass_secs.append(time.perf_counter() - t)
    emit("w4", "read_random_first_pass", n, n * row_bytes, pass_secs[0])
    steady = sorted(pass_secs[1:])[1]
    emit("w4", "read_random", n, n * row_bytes, steady)
