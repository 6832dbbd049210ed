"""W8 of BENCHMARKS.md: W1's records written and read through Ray Data.

    python benches/python/w8.py [--n N] [--seed S] [--dir D] [--reps R] [--blocks B]

W1's records (``sample_{i}`` -> float32[512], element j of sample i a
function of i, j and the seed) as a Ray Dataset of ``--blocks`` blocks,
generated and materialized before any clock starts, on a local Ray of two
CPUs (two workers). Phases, in the same run, alternating per repetition:

- ``write_segments``: ``ds.write_datasink(cachex.ray.SegmentSink(...))``,
  timed until the commit has returned (every segment fsynced, the commit's
  renames and directory fsyncs done);
- ``write_parquet`` / ``write_numpy``: Ray's own writers of the same
  dataset, timed until they return (they do not fsync);
- ``read_segments`` / ``read_parquet``: ``cachex.ray.read_segments`` and
  ``ray.data.read_parquet`` of what the writes left, timed over one full
  pass of ``iter_batches(batch_format="numpy")`` (every value reaches the
  consumer as a numpy array); the read-back of the first repetition is
  checked value by value, outside the clock.

Prints one JSON object per line (``workload``, ``phase``, ``n``,
``items_per_s``, ``mb_per_s``, ``secs`` of every repetition, and the
medians' ratios ``write_vs_parquet`` and ``read_vs_parquet`` on the last
line). The goals: ``write_vs_parquet >= 1``, ``read_vs_parquet >= 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Ray's cluster on the loopback address (read when Ray is imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
import ray

import cachex.ray

DIM = 512


def features(seed: int, ids: np.ndarray) -> np.ndarray:
    """W1's values (``cachex.workload.w1_features``)."""
    base = ((ids.astype(np.uint64) + np.uint64(seed)) % np.uint64(65536)).astype(np.float32) * 0.25
    return base[:, None] + np.arange(DIM, dtype=np.float32)[None, :]


def emit(phase: str, n: int, secs: list[float], **extra: object) -> float:
    med = sorted(secs)[len(secs) // 2]
    line = {
        "workload": "w8",
        "phase": phase,
        "n": n,
        "items_per_s": n / med,
        "mb_per_s": n * DIM * 4 / med / 1e6,
        "secs": [round(s, 4) for s in secs],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "api": "cachex.ray",
        **extra,
    }
    print(json.dumps(line), flush=True)
    return med


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def consume(ds) -> int:
    rows = 0
    for batch in ds.iter_batches(batch_size=4096, batch_format="numpy"):
        rows += len(batch["value"])
    return rows


def check(ds, seed: int, n: int) -> None:
    got = 0
    for batch in ds.iter_batches(batch_size=4096, batch_format="numpy"):
        ids = np.array([int(k.split("_")[1]) for k in batch["key"]])
        if not np.array_equal(np.asarray(batch["value"]), features(seed, ids)):
            raise SystemExit("w8: a value read back differs from the one written")
        got += len(ids)
    if got != n:
        raise SystemExit(f"w8: read back {got} rows, wrote {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=8)
    args = ap.parse_args()
    n, seed = args.n, args.seed
    root = Path(tempfile.mkdtemp(prefix="w8-", dir=args.dir))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        progress(f"w8: generating {n} records in {args.blocks} blocks")
        ds = (
            ray.data.range(n, override_num_blocks=args.blocks)
            .map_batches(
                lambda b: {
                    "key": np.array([f"sample_{i}" for i in b["id"]], dtype=object),
                    "value": features(seed, b["id"]),
                }
            )
            .materialize()
        )
        writes = {
            "write_segments": lambda d: ds.write_datasink(
                cachex.ray.SegmentSink(d, key_column="key", columns="value"), concurrency=2
            ),
            "write_parquet": lambda d: ds.write_parquet(str(d), concurrency=2),
            "write_numpy": lambda d: ds.write_numpy(str(d), column="value", concurrency=2),
        }
        reads = {
            "read_segments": lambda d: cachex.ray.read_segments(d, concurrency=2),
            "read_parquet": lambda d: ray.data.read_parquet(str(d), concurrency=2),
        }
        out = {"write_segments": root / "segments", "write_parquet": root / "parquet"}
        secs: dict[str, list[float]] = {p: [] for p in [*writes, *reads]}
        for rep in range(args.reps):
            order = list(writes) if rep % 2 == 0 else list(reversed(writes))
            for phase in order:
                d = root / phase.removeprefix("write_")
                shutil.rmtree(d, ignore_errors=True)
                progress(f"w8: {phase} rep {rep}")
                t = time.perf_counter()
                writes[phase](d)
                secs[phase].append(time.perf_counter() - t)
            read_order = list(reads) if rep % 2 == 0 else list(reversed(reads))
            for phase in read_order:
                d = out["write_" + phase.removeprefix("read_")]
                progress(f"w8: {phase} rep {rep}")
                t = time.perf_counter()
                rows = consume(reads[phase](d))
                secs[phase].append(time.perf_counter() - t)
                if rows != n:
                    raise SystemExit(f"w8: {phase} read {rows} rows of {n}")
                if rep == 0:
                    check(reads[phase](d), seed, n)
        on_disk = sum(f.stat().st_size for f in (root / "segments").rglob("*") if f.is_file())
        med = {p: emit(p, n, s) for p, s in secs.items() if p != "write_segments"}
        med["write_segments"] = emit(
            "write_segments", n, secs["write_segments"], bytes_on_disk_per_item=on_disk / n
        )
        print(
            json.dumps(
                {
                    "workload": "w8",
                    "phase": "ratios",
                    "n": n,
                    "write_vs_parquet": med["write_parquet"] / med["write_segments"],
                    "write_vs_numpy": med["write_numpy"] / med["write_segments"],
                    "read_vs_parquet": med["read_parquet"] / med["read_segments"],
                    "api": "cachex.ray",
                }
            ),
            flush=True,
        )
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
