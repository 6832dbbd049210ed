"""W1 (``BENCHMARKS.md``), a keyed tensor cache, through ``cachex.SegmentStore``:
writes, then random batch reads with ``get_batch`` and ``get_stacked``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import cachex
from report import WrongValueError, emit, progress

W1_DIM, W1_LOGITS, W1_BATCH, W1_READ_BATCHES, W1_PASSES = 512, 10, 256, 200, 5


def w1_features(seed: int, ids: np.ndarray) -> np.ndarray:
    base = ((ids.astype(np.uint64) + np.uint64(seed)) % np.uint64(65536)).astype(np.float32) * 0.25
    return base[:, None] + np.arange(W1_DIM, dtype=np.float32)[None, :]


def w1_logits(seed: int, ids: np.ndarray) -> np.ndarray:
    j = np.arange(W1_LOGITS, dtype=np.uint64)[None, :]
    v = (ids.astype(np.uint64)[:, None] + np.uint64(seed) + j) % np.uint64(1024)
    return v.astype(np.float16)


def w1(root: Path, n: int, seed: int) -> None:
    for as_dict in (False, True):
        suffix = "_dict" if as_dict else ""
        d = root / f"w1{suffix}"
        item_bytes = W1_DIM * 4 + (W1_LOGITS * 2 if as_dict else 0)
        progress(f"w1{suffix}: writing {n} samples")
        secs = 0.0
        t = time.perf_counter()
        store = cachex.SegmentStore(d)
        secs += time.perf_counter() - t
        for start in range(0, n, W1_BATCH):
            ids = np.arange(start, min(start + W1_BATCH, n))
            feats = w1_features(seed, ids)
            if as_dict:
                logits = w1_logits(seed, ids)
                batch = {
                    f"sample_{i}": {"features": feats[k], "logits": logits[k]}
                    for k, i in enumerate(ids)
                }
            else:
                batch = {f"sample_{i}": feats[k] for k, i in enumerate(ids)}
            t = time.perf_counter()
            store.put_batch(batch)
            secs += time.perf_counter() - t
        t = time.perf_counter()
        store.close()
        secs += time.perf_counter() - t
        on_disk = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        emit("w1", f"write{suffix}", n, n * item_bytes, secs, bytes_on_disk_per_item=on_disk / n)

        # get_batch (a view per value, np.stack here), then get_stacked.
        for stacked in (False, True):
            rng = np.random.default_rng(seed ^ 0x5EED)
            passes = []
            for _ in range(W1_PASSES):
                t = time.perf_counter()
                reader = cachex.SegmentStore(d, lru_bytes=0, read_only=True)
                open_ms = (time.perf_counter() - t) * 1e3
                lat, secs, sink, to_check = [], 0.0, 0.0, []
                for b in range(W1_READ_BATCHES):
                    ids = rng.integers(0, n, W1_BATCH)
                    keys = [f"sample_{i}" for i in ids]
                    t = time.perf_counter()
                    if stacked:  # one array per batch
                        values, missing = reader.get_stacked(keys)
                        feats = values["features"] if as_dict else values
                    else:  # one view per value, stacked here
                        values, missing = reader.get_batch(keys)
                        feats = np.stack([v["features"] for v in values] if as_dict else values)
                    sink += float(feats.sum())  # touches every element
                    dt = time.perf_counter() - t
                    secs += dt
                    lat.append(dt * 1e3)
                    if missing:
                        raise WrongValueError(f"w1: {len(missing)} keys missing")
                    if b % 10 == 0 or n <= 10_000:
                        to_check.append((ids, values))
                for ids, values in to_check:
                    if stacked:
                        values = (
                            [
                                dict(zip(values, row, strict=True))
                                for row in zip(*values.values(), strict=True)
                            ]
                            if as_dict
                            else list(values)
                        )
                    got = np.stack([v["features"] for v in values] if as_dict else values)
                    if not np.array_equal(got, w1_features(seed, ids)):
                        raise WrongValueError("w1: features differ")
                    if as_dict:
                        got = np.stack([v["logits"] for v in values])
                        if not np.array_equal(got, w1_logits(seed, ids)):
                            raise WrongValueError("w1: logits differ")
                passes.append((secs, lat, open_ms))
                reader.close()
            passes.sort(key=lambda p: p[0])
            secs, lat, open_ms = passes[len(passes) // 2]
            lat.sort()
            reads = W1_READ_BATCHES * W1_BATCH
            emit(
                "w1",
                f"read_random{suffix}{'_stacked' if stacked else ''}",
                reads,
                reads * item_bytes,
                secs,
                p50_ms=lat[len(lat) // 2],
                p99_ms=lat[min(len(lat) * 99 // 100, len(lat) - 1)],
                open_ms=open_ms,
            )
