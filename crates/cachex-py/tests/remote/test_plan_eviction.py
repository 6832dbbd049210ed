"""Plan-aware eviction from Python: a page file on ``s3://`` (the S3 test
server) larger than its local tier's budget. ``IterableBatches`` registers
its worker's plan with the tier for the iteration and removes it at the
end (``plan_eviction=False`` registers nothing); ``cachex.tier_stats``
reports the tier's counters as they move; a ``sample()`` view stays right
while other reads evict pages around it; ``set_plan`` refuses what does
not fit and is ``None`` for a local file."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import pytest

import cachex
from cachex.torch import datasets as data

DIM = 4096  # 16 KiB a sample
N = 2400  # 37.5 MiB, more than the 20 MiB budget below
PAGE = 1 << 20
BUDGET = 20 << 20
STATS = {
    "allocated",
    "generation",
    "fetched_bytes",
    "get_requests",
    "head_requests",
    "evicted_bytes",
    "punched_blocks",
    "rebuilds",
    "over_budget",
    "hits",
    "misses",
}


def x_of(i: int) -> np.ndarray:
    return np.full(DIM, i, dtype=np.float32)


def write_pages(url: str, n: int = N, **kw) -> None:
    w = cachex.PageWriter(url, {"i": "int", "x": ("float32", (DIM,))}, page_size=PAGE, **kw)
    w.write_many({"i": i, "x": x_of(i)} for i in range(n))
    w.finalize()


def reader_tier(s3, name: str = "reader") -> dict:
    return {**s3.tier(name), "tier_budget": BUDGET}


def plans(tier: dict) -> list[Path]:
    found = Path(tier["tier_dir"]) / "plans"
    return sorted(found.glob("*.plan")) if found.exists() else []


def progress(record: Path) -> int:
    """The record's progress (8 bytes at offset 16: remote-tier's plans/record.rs)."""
    return int.from_bytes(record.read_bytes()[16:24], "little")


def check(batch: dict) -> None:
    i = batch["i"]
    assert np.array_equal(batch["x"], np.repeat(i.astype(np.float32)[:, None], DIM, axis=1))


def test_the_plan_record_moves_with_the_iteration_and_stays_until_the_next(s3):
    url = s3.url("plan/data.pages")
    write_pages(url, **s3.tier("writer"))
    tier = reader_tier(s3)
    ds = data.PageDataset(url, **tier)
    it = ds.iterable(64, seed=1)
    assert it.plan_eviction
    assert plans(tier) == []
    seen = []
    for j, batch in enumerate(it):
        check(batch)
        (record,) = plans(tier)
        seen.append(progress(record))
        assert seen[-1] == j, "advanced past every batch before the next"
        if j == 0:
            first = record
        assert record == first, "one record for the whole iteration"
    assert len(seen) == len(it) > 3
    # Kept past the iteration, at its end: its next-epoch part covers the
    # reads until the next iteration registers its own, which replaces it.
    assert plans(tier) == [first] and progress(first) == len(it)
    it.set_epoch(1)
    stopped = iter(it)
    check(next(stopped))
    (second,) = plans(tier)
    assert second != first and progress(second) == 0
    stopped.close()  # left half-way: kept too
    assert plans(tier) == [second]
    # A generator of the first iteration resumed after the second began
    # finds its plan gone and reads on without it.
    again = iter(it)
    check(next(again))
    (third,) = plans(tier)
    third_gen = iter(it)
    check(next(third_gen))
    assert plans(tier) != [third]
    check(next(again))
    del again, third_gen, stopped, it
    gc.collect()
    assert plans(tier) == [], "removed with the iterable"


def test_plan_eviction_false_registers_nothing(s3):
    url = s3.url("lru/data.pages")
    write_pages(url, **s3.tier("writer"))
    tier = reader_tier(s3)
    it = data.PageDataset(url, **tier).iterable(64, seed=2, plan_eviction=False)
    count = 0
    for batch in it:
        check(batch)
        assert plans(tier) == []
        count += 1
    assert count == len(it)
    assert not (Path(tier["tier_dir"]) / "plans").exists() or plans(tier) == []


def test_set_plan_by_hand_and_as_a_context_manager(s3):
    url = s3.url("hand/data.pages")
    write_pages(url, **s3.tier("writer"))
    tier = reader_tier(s3)
    ds = data.PageDataset(url, **tier)
    samples = np.arange(0, N, 7, dtype=np.int64)
    positions = np.arange(len(samples), dtype=np.int64) % 10
    with ds.set_plan(samples, positions, 10) as handle:
        assert isinstance(handle, cachex.PlanHandle)
        assert plans(tier) == [handle.path] and not handle.closed
        handle.advance(4)
        assert progress(handle.path) == 4
    assert handle.closed and plans(tier) == []
    handle.close()  # twice: nothing
    with pytest.raises(cachex.CacheError, match="closed"):
        handle.advance(5)
    with pytest.raises(cachex.InvalidInputError, match="position 20"):
        ds.set_plan(samples[:1], np.array([20]), 10)
    with pytest.raises(cachex.InvalidInputError, match="out of range"):
        ds.set_plan(np.array([N]), np.array([0]), 10)
    with pytest.raises(cachex.InvalidInputError, match="positions"):
        ds.set_plan(samples, positions[:-1], 10)
    assert plans(tier) == []


def test_set_plan_is_none_for_a_local_file(tmp_path):
    path = tmp_path / "data.pages"
    w = cachex.PageWriter(path, {"i": "int"})
    w.write_many({"i": i} for i in range(10))
    w.finalize()
    ds = data.PageDataset(path)
    assert ds.set_plan(np.arange(10), np.zeros(10, dtype=np.int64), 1) is None
    assert [int(b["i"][0]) for b in ds.iterable(1, shuffle=False)] == list(range(10))


#: A file of 32 pages (32 MiB) on a tier of half its size.
BIG_N = 2048
BIG_BUDGET = 16 << 20


def test_tier_stats_move_and_a_sample_view_stays_right_while_other_reads_evict(s3):
    # Half of the file fits: the header's and the tables' blocks stay
    # leased, and a process keeps its last few leases a while (remote-tier's
    # sticky release), so enough is left to evict.
    n = BIG_N
    url = s3.url("big/data.pages")
    write_pages(url, n=n, **s3.tier("writer"))
    tier = {**s3.tier("reader"), "tier_budget": BIG_BUDGET}
    reader = cachex.PageReader(url, **tier)
    before = cachex.tier_stats(tier["tier_dir"])
    assert set(before) == STATS and all(isinstance(v, int) for v in before.values())
    kept = reader.sample(n // 2)
    view = kept["x"]
    it = data.PageDataset(url, **tier).iterable(64, seed=5)
    most = 0
    for j, batch in enumerate(it):
        check(batch)
        most = max(most, cachex.tier_stats(Path(tier["tier_dir"]))["allocated"])
        if j == 24:  # 25 of its 32 pages: more than the budget holds
            break
    after = cachex.tier_stats(tier["tier_dir"])
    assert after["fetched_bytes"] > before["fetched_bytes"] + BIG_BUDGET
    assert after["get_requests"] > before["get_requests"]
    assert after["punched_blocks"] > 0 and after["evicted_bytes"] > 0
    assert after["generation"] > before["generation"]
    # Within the budget but for the run a read is fetching and the page
    # the view leases (reads that found everything leased went over).
    assert most <= BIG_BUDGET + 2 * PAGE, (most, after["over_budget"])
    assert np.array_equal(view, x_of(n // 2)), "the leased block was never punched"
    assert int(kept["i"]) == n // 2
    del kept, view
    assert np.array_equal(reader.sample(n // 2)["x"], x_of(n // 2))


class PeakAllocated:
    """The most bytes a tier counted while the ``with`` block ran, polled
    from a thread (the store's calls run without the GIL)."""

    def __init__(self, tier_dir: str) -> None:
        self.tier_dir = tier_dir
        self.most = 0
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            self.most = max(self.most, cachex.tier_stats(self.tier_dir)["allocated"])
            self.samples += 1
            if self._done.wait(0.002):
                return

    def __enter__(self) -> PeakAllocated:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the poller did not stop"


def test_verify_checks_a_file_twice_the_budget_one_run_at_a_time(s3):
    # Half of the file fits (as above). verify() reads every page: it
    # leases each run only while it hashes it, so the tier frees what it
    # checked before and never holds the whole file.
    n = BIG_N
    url = s3.url("verify/data.pages")
    write_pages(url, n=n, **s3.tier("writer"))
    tier = {**s3.tier("reader"), "tier_budget": BIG_BUDGET}
    reader = cachex.PageReader(url, **tier)
    before = cachex.tier_stats(tier["tier_dir"])
    peak = PeakAllocated(tier["tier_dir"])
    with peak:
        report = reader.verify()
    after = cachex.tier_stats(tier["tier_dir"])
    assert report == {"kind": "page-alloc", "path": report["path"], "problems": []}
    assert after["fetched_bytes"] >= n // 64 * PAGE, "every page was fetched to be checked"
    assert after["punched_blocks"] > before["punched_blocks"]
    # Never more than the budget and the run a read fetches when all else
    # is leased (the header, the run being checked, the blocks a process
    # keeps leased a while after their reads, read-ahead in flight: a
    # read that finds no room goes over and is counted in over_budget).
    assert peak.samples > 10, "the poller saw the verify"
    assert peak.most <= BIG_BUDGET + 2 * PAGE, (peak.most, after)
    assert after["allocated"] <= BIG_BUDGET + 2 * PAGE, after
    assert np.array_equal(reader.sample(n - 1)["x"], x_of(n - 1))
