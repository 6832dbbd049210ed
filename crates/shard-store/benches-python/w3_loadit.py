"""W3 of BENCHMARKS.md measured on loadit 0.0.8, for comparison with
`cargo run --release -p benches --bin workload -- w3`.

Same shape as the Rust workload: N records (id, 200-byte payload), shards of
8192 records, 100,000 uniform random reads (cold handle, then warm), a
sequential pass from the cache, the bare `pickle.load` of every shard's bytes,
and random reads under a disk budget of 25% of the full cache (few reads:
each miss replays the iterator). Prints one JSON line per phase.

    $CACHEX_PYTHON crates/shard-store/benches-python/w3_loadit.py [--n 200000] [--dir D]

Needs loadit 0.0.8 with watchdog 4.0.2 (the interop venv).
"""

import argparse
import json
import os
import pickle
import random
import shutil
import statistics
import tempfile
import time

from loadit import LoadIt

SHARD_ITEMS = 8192
PAYLOAD = 200
TABLE = bytes((k * 131 >> 3) & 0xFF for k in range(256 + PAYLOAD))


def record(i):
    # A cheap deterministic payload (slicing a table), so the source costs
    # Python as little as possible.
    o = i % 256
    return (i, TABLE[o : o + PAYLOAD])


def emit(phase, n, secs, **extra):
    line = {"workload": "w3-loadit", "phase": phase, "n": n, "items_per_s": n / secs, "secs": secs}
    line.update(extra)
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--reads", type=int, default=100_000)
    ap.add_argument("--budget-reads", type=int, default=40)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    n = args.n
    base = args.dir or tempfile.mkdtemp(prefix="w3-loadit")
    root = os.path.join(base, "root")
    shutil.rmtree(root, ignore_errors=True)

    def items():
        for i in range(n):
            yield record(i)

    # First pass: every item through a fresh loader (writes every shard).
    loader = LoadIt(root, create_iter=items, max_shard_length=SHARD_ITEMS)
    t = time.perf_counter()
    for i in range(n):
        x = loader[i]
    secs = time.perf_counter() - t
    assert x == record(n - 1)
    assert len(loader) == n
    shard_dir = os.path.join(root, "shards")
    disk = sum(os.path.getsize(os.path.join(shard_dir, f)) for f in os.listdir(shard_dir))
    emit("first_pass", n, secs, bytes_on_disk_per_item=disk / n)
    del loader

    # The floor: pickle.load of every shard's bytes.
    blobs = []
    for f in os.listdir(shard_dir):
        with open(os.path.join(shard_dir, f), "rb") as fp:
            blobs.append(fp.read())
    t = time.perf_counter()
    count = sum(len(pickle.loads(b)) for b in blobs)
    secs = time.perf_counter() - t
    assert count == n
    emit("decode_only", n, secs)
    del blobs

    # Sequential pass from the cache: a new loader without a source.
    cached = LoadIt(root)
    t = time.perf_counter()
    for i in range(n):
        x = cached[i]
    secs = time.perf_counter() - t
    assert x == record(n - 1)
    emit("read_sequential_cached", n, secs)
    del cached

    # Random reads: cold handle, then warm (median of 3).
    rng = random.Random(0)
    idx = [rng.randrange(n) for _ in range(args.reads)]
    fresh = LoadIt(root)
    t = time.perf_counter()
    got = [fresh[i] for i in idx]
    secs = time.perf_counter() - t
    assert all(g == record(i) for g, i in zip(got, idx))
    emit("read_random_cold", len(idx), secs)
    samples = []
    for _ in range(3):
        t = time.perf_counter()
        got = [fresh[i] for i in idx]
        samples.append(time.perf_counter() - t)
    assert all(g == record(i) for g, i in zip(got, idx))
    emit("read_random", len(idx), statistics.median(samples), repetitions=3)
    del fresh

    # Random reads under a disk budget of 25% of the full cache.
    broot = os.path.join(base, "budget")
    shutil.rmtree(broot, ignore_errors=True)
    bl = LoadIt(broot, create_iter=items, max_shard_length=SHARD_ITEMS, memory_limit=disk // 4, max_cache_size=8)
    few = idx[: args.budget_reads]
    t = time.perf_counter()
    got = [bl[i] for i in few]
    secs = time.perf_counter() - t
    assert all(g == record(i) for g, i in zip(got, few))
    emit("read_random_budget_single", len(few), secs, memory_limit=disk // 4)

    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
