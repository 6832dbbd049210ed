"""W1 (``BENCHMARKS.md``) through a torchcachex-style backend.

``python benches/python/workload.py w1 --api torchcachex`` drives
:mod:`cachex.torchcachex` (lines with ``"api": "cachex.torchcachex"``);
``--api torchcachex-original`` drives the real torchcachex 0.2.0 on the
same workload (lines with ``"api": "torchcachex"``), imported from wherever
it is on ``PYTHONPATH`` (it needs torch, pyarrow and cachetools).

Both run the same calls with the constructors' defaults: ``put_batch`` of
256 samples, then ``flush()`` (for torchcachex also a wait for its queued
async writes, which its ``flush`` does not wait for, so that both write
phases end with every sample on disk); reads reopen the cache and call
``get_batch`` on 200 batches of 256 random keys, stacking each batch's
features (touching every element). Values are torch tensors when torch is
importable (the real torchcachex needs it), numpy arrays otherwise; torch
runs on one intra-op thread (as numpy does), because on a busy machine its
thread pool's waits swamp a 0.1 ms reduction and measure the scheduler, not
the cache.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from report import WrongValueError, emit, progress
from w1 import W1_BATCH, W1_DIM, W1_LOGITS, W1_PASSES, W1_READ_BATCHES, w1_features, w1_logits

try:
    import torch
except ImportError:
    torch = None

API_NAMES = {"torchcachex": "cachex.torchcachex", "torchcachex-original": "torchcachex"}


def _backend_class(api: str) -> Any:
    if api == "torchcachex-original":
        try:
            from torchcachex import ArrowIPCCacheBackend
        except ImportError as e:
            raise SystemExit(
                f"--api torchcachex-original needs the real torchcachex on PYTHONPATH ({e})"
            ) from e
        return ArrowIPCCacheBackend
    from cachex.torchcachex import ArrowIPCCacheBackend

    return ArrowIPCCacheBackend


def _finish_writes(backend: Any, api: str) -> None:
    backend.flush()
    if api == "torchcachex-original":
        # torchcachex's flush returns with commits still queued in its pool.
        if backend.executor is not None:
            backend.executor.shutdown(wait=True)
        backend.flush()
        backend._save_index()
    else:
        backend.close()


def _as_array(v: Any) -> np.ndarray:
    return v.numpy() if torch is not None and isinstance(v, torch.Tensor) else np.asarray(v)


def w1_torchcachex(root: Path, n: int, seed: int, api: str) -> None:
    """W1's write and read phases through a torchcachex-style backend."""
    cls = _backend_class(api)
    if torch is not None:
        torch.set_num_threads(1)
    name = API_NAMES[api]
    wrap = torch.from_numpy if torch is not None else (lambda a: a)
    stack = torch.stack if torch is not None else np.stack
    for as_dict in (False, True):
        suffix = "_dict" if as_dict else ""
        module_id = f"w1{suffix}"
        item_bytes = W1_DIM * 4 + (W1_LOGITS * 2 if as_dict else 0)
        progress(f"w1{suffix} ({name}): writing {n} samples")
        secs = 0.0
        t = time.perf_counter()
        backend = cls(str(root), module_id)
        secs += time.perf_counter() - t
        for start in range(0, n, W1_BATCH):
            ids = np.arange(start, min(start + W1_BATCH, n))
            feats = w1_features(seed, ids)
            if as_dict:
                logits = w1_logits(seed, ids)
                batch = {
                    f"sample_{i}": {"features": wrap(feats[k]), "logits": wrap(logits[k])}
                    for k, i in enumerate(ids)
                }
            else:
                batch = {f"sample_{i}": wrap(feats[k]) for k, i in enumerate(ids)}
            t = time.perf_counter()
            backend.put_batch(batch)
            secs += time.perf_counter() - t
        t = time.perf_counter()
        _finish_writes(backend, api)
        secs += time.perf_counter() - t
        del backend
        d = root / module_id
        on_disk = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        emit(
            "w1",
            f"write{suffix}",
            n,
            n * item_bytes,
            secs,
            api=name,
            bytes_on_disk_per_item=on_disk / n,
        )

        rng = np.random.default_rng(seed ^ 0x5EED)
        passes = []
        for _ in range(W1_PASSES):
            t = time.perf_counter()
            reader = cls(str(root), module_id)
            open_ms = (time.perf_counter() - t) * 1e3
            lat, secs, sink, to_check = [], 0.0, 0.0, []
            for b in range(W1_READ_BATCHES):
                ids = rng.integers(0, n, W1_BATCH)
                keys = [f"sample_{i}" for i in ids]
                t = time.perf_counter()
                values, missing = reader.get_batch(keys)
                if missing:
                    raise WrongValueError(f"w1 ({name}): {len(missing)} keys missing")
                feats = [v["features"] for v in values] if as_dict else values
                sink += float(stack(feats).sum())  # touches every element
                dt = time.perf_counter() - t
                secs += dt
                lat.append(dt * 1e3)
                if b % 10 == 0 or n <= 10_000:
                    to_check.append((ids, values))
            for ids, values in to_check:
                got = np.stack([_as_array(v["features"] if as_dict else v) for v in values])
                if not np.array_equal(got, w1_features(seed, ids)):
                    raise WrongValueError(f"w1 ({name}): features differ")
                if as_dict:
                    got = np.stack([_as_array(v["logits"]) for v in values])
                    if not np.array_equal(got, w1_logits(seed, ids)):
                        raise WrongValueError(f"w1 ({name}): logits differ")
            passes.append((secs, lat, open_ms))
            if api == "torchcachex-original":
                reader.executor.shutdown(wait=True)
            else:
                reader.close()
            del reader
        passes.sort(key=lambda p: p[0])
        secs, lat, open_ms = passes[len(passes) // 2]
        lat.sort()
        reads = W1_READ_BATCHES * W1_BATCH
        emit(
            "w1",
            f"read_random{suffix}",
            reads,
            reads * item_bytes,
            secs,
            api=name,
            p50_ms=lat[len(lat) // 2],
            p99_ms=lat[min(len(lat) * 99 // 100, len(lat) - 1)],
            open_ms=open_ms,
        )
