"""The workloads of ``BENCHMARKS.md`` through the Python API.

Run ``python -m cachex.workload <w1|w3|w4|w5|all> [--n N] [--seed S] [--dir D] [--api A]``
(``--api torchcachex`` / ``torchcachex-original``: W1 through
:mod:`cachex._workload_torchcachex`; ``--api loadit`` / ``loadit-original``:
W3 through :mod:`cachex._workload_loadit`).
It prints one JSON object per line, as the Rust runner (``benches/``) does,
with ``"api": "python"``: ``workload``, ``phase``, ``n``, ``items_per_s``,
``mb_per_s``, ``peak_rss_bytes``. The machine limits (``limit``,
``fraction_of_limit``) are the Rust runner's job and are not repeated here.

Every value read is checked (a wrong value exits non-zero). Reads are batch
calls returning numpy views; as in the Rust runner, W1 checks a sample of
its batches outside the timed region, and the other workloads check every
value.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import cachex

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class WrongValueError(Exception):
    """A read returned something other than what was written."""


def emit(workload: str, phase: str, n: int, nbytes: int, secs: float, **extra: object) -> None:
    secs = max(secs, 1e-9)
    line = {
        "workload": workload,
        "phase": phase,
        "n": n,
        "items_per_s": n / secs,
        "mb_per_s": nbytes / secs / 1e6,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "api": "python",
        **extra,
    }
    print(json.dumps(line), flush=True)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# W1: keyed tensor cache (segment-store).
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


# W3: random access over an iterable (shard-store).
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


# W4: fixed-shape rows (memmap-array).
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


# W5: variable-size samples (page-alloc).
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


WORKLOADS: dict[str, tuple[Callable[[Path, int, int], None], int]] = {
    "w1": (w1, 200_000),
    "w3": (w3, 1_000_000),
    "w4": (w4, 20_000),
    "w5": (w5, 50_000),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cachex.workload", description=__doc__)
    parser.add_argument("which", choices=[*WORKLOADS, "all"])
    parser.add_argument("--n", type=int, default=0, help="item count (default: each workload's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument(
        "--api",
        choices=["python", "torchcachex", "torchcachex-original", "loadit", "loadit-original"],
        default="python",
        help="python: cachex's own API; torchcachex / torchcachex-original: W1 through "
        "cachex.torchcachex / the real torchcachex (see cachex._workload_torchcachex); "
        "loadit / loadit-original: W3 through cachex.loadit / the real loadit "
        "(see cachex._workload_loadit)",
    )
    args = parser.parse_args(argv)
    workloads = dict(WORKLOADS)
    if args.api in ("torchcachex", "torchcachex-original"):
        if args.which != "w1":
            parser.error(f"--api {args.api} drives w1 only")
        from cachex._workload_torchcachex import w1_torchcachex

        def run_w1(root: Path, n: int, seed: int) -> None:
            w1_torchcachex(root, n, seed, args.api)

        workloads["w1"] = (run_w1, WORKLOADS["w1"][1])
    elif args.api in ("loadit", "loadit-original"):
        if args.which != "w3":
            parser.error(f"--api {args.api} drives w3 only")
        from cachex import _workload_loadit

        workloads["w3"] = (
            functools.partial(_workload_loadit.w3, api=args.api),
            WORKLOADS["w3"][1],
        )
    base = args.dir or Path(tempfile.mkdtemp(prefix="cachex-workload-py-"))
    names = list(WORKLOADS) if args.which == "all" else [args.which]
    try:
        for name in names:
            run, default_n = workloads[name]
            root = base / name
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            run(root, args.n or default_n, args.seed)
            shutil.rmtree(root, ignore_errors=True)
    except WrongValueError as e:
        print(f"wrong value: {e}", file=sys.stderr)
        return 1
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
