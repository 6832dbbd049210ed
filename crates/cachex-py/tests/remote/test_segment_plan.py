"""Plan-aware eviction for a segment store on ``s3://`` (the S3 test
server) larger than its local tier's budget: ``SegmentDataset`` registers
one plan over every segment its keys lie in (``SegmentStore.set_plan``),
which ``IterableBatches`` moves after every batch; over three epochs the
tier then fetches less than its LRU does, within its budget, every record
right; ``set_plan`` refuses what does not fit and is ``None`` for a
directory or a store the budget holds whole."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import cachex
from cachex.torch import datasets as data

N = 2000
DIM = 1024  # 4 KiB a record: 8 MiB of values in 8 segments of 256 records
BUDGET = 4 << 20  # half of them


def value(i: int) -> np.ndarray:
    return np.full(DIM, i, dtype=np.float32)


def write_store(url: str, **kw) -> list[str]:
    with cachex.SegmentStore(url, flush_every=256, **kw) as store:
        for start in range(0, N, 500):
            store.put_batch({f"k{i}": value(i) for i in range(start, start + 500)})
    return [f"k{i}" for i in range(N)]


def plans(tier: dict) -> list[Path]:
    found = Path(tier["tier_dir"]) / "plans"
    return sorted(found.glob("*.plan")) if found.exists() else []


def record_objects(record: Path) -> int:
    """The objects of a plan record (u64 at offset 32: remote-tier's plans/record.rs)."""
    return struct.unpack_from("<Q", record.read_bytes(), 32)[0]


def progress(record: Path) -> int:
    return struct.unpack_from("<Q", record.read_bytes(), 16)[0]


def epochs(url: str, keys: list[str], tier: dict, plan: bool) -> list[int]:
    """Bytes fetched in each of three epochs of 100-record batches, every
    record checked, the tier's count checked after every batch."""
    # No records kept in memory: every read goes to the tier.
    ds = data.SegmentDataset(url, keys, lru_bytes=0, **tier)
    it = ds.iterable(100, seed=7, plan_eviction=plan)
    fetched = []
    for epoch in range(3):
        it.set_epoch(epoch)
        before = cachex.tier_stats(tier["tier_dir"])["fetched_bytes"]
        for batch in it:
            first = batch[:, 0].astype(np.int64)
            assert np.array_equal(batch, np.repeat(first[:, None], DIM, axis=1).astype(np.float32))
            # The budget, plus the blocks one batch's reads lease at once.
            allocated = cachex.tier_stats(tier["tier_dir"])["allocated"]
            assert allocated <= BUDGET + (1 << 20), allocated
            if plan:
                (record,) = plans(tier)
                assert record_objects(record) == 8, "one plan over every segment"
        fetched.append(cachex.tier_stats(tier["tier_dir"])["fetched_bytes"] - before)
    return fetched


def test_a_segment_plan_fetches_less_than_the_lru_across_epochs(s3):
    url = s3.url("plan/segments")
    keys = write_store(url, **s3.tier("writer"))
    lru = epochs(url, keys, {**s3.tier("lru"), "tier_budget": BUDGET}, plan=False)
    planned = epochs(url, keys, {**s3.tier("plan"), "tier_budget": BUDGET}, plan=True)
    dataset = N * DIM * 4
    # Every record was fetched in the first epoch, once at least.
    assert lru[0] >= dataset and planned[0] >= dataset
    # Then the LRU refetches most of what it held (an order it cannot
    # foresee); the plan keeps what is read soonest. The floor is half
    # the dataset an epoch (the budget holds the other half).
    later_lru, later_plan = sum(lru[1:]), sum(planned[1:])
    # (Measured: 0.51 of the dataset an epoch under the plan, 0.74 and
    # 1.0 under the LRU.)
    assert dataset <= later_plan <= 1.1 * dataset, (planned, lru)
    assert later_plan <= 0.85 * later_lru, (planned, lru)


def test_the_plan_record_moves_with_the_batches(s3):
    url = s3.url("moves/segments")
    keys = write_store(url, **s3.tier("writer"))
    tier = {**s3.tier("reader"), "tier_budget": BUDGET}
    ds = data.SegmentDataset(url, keys, **tier)
    assert not ds.iterable(100, plan_eviction=False).plan_eviction
    it = ds.iterable(100, seed=3)
    assert it.plan_eviction, "on unless told otherwise"
    assert plans(tier) == []
    for j, _ in enumerate(it):
        (record,) = plans(tier)
        assert progress(record) == j
    assert progress(record) == len(it) == N // 100


def test_segment_blocks_on_a_url_read_the_index_alone(s3):
    url = s3.url("blocks/segments")
    keys = write_store(url, **s3.tier("writer"))
    tier = {**s3.tier("reader"), "tier_budget": BUDGET}
    ds = data.SegmentDataset(url, keys, **tier)
    before = cachex.tier_stats(tier["tier_dir"])["fetched_bytes"]
    # 8 segments of 256 records, in key order: one block each.
    assert ds.blocks().tolist() == [256] * 7 + [N - 7 * 256]
    assert ds.blocks(block_size=100).tolist() == [86, 85, 85] * 7 + [70, 69, 69]
    assert cachex.tier_stats(tier["tier_dir"])["fetched_bytes"] == before, "nothing fetched"


def test_set_plan_refuses_what_does_not_fit_and_is_none_for_a_directory(s3, tmp_path):
    url = s3.url("bad/segments")
    keys = write_store(url, **s3.tier("writer"))
    tier = {**s3.tier("reader"), "tier_budget": BUDGET}
    store = cachex.SegmentStore(url, read_only=True, **tier)
    with pytest.raises(cachex.InvalidInputError, match="2 keys but 1 positions"):
        store.set_plan(keys[:2], np.array([0], dtype=np.int64), 4)
    with pytest.raises(cachex.InvalidInputError, match="position 8 outside"):
        store.set_plan(keys[:1], np.array([8], dtype=np.int64), 4)
    with pytest.raises(cachex.InvalidInputError, match="position -1 < 0"):
        store.set_plan(keys[:1], np.array([-1], dtype=np.int64), 4)
    # Keys in no segment are left out: a plan of none of them is no plan.
    assert store.set_plan(["absent"], np.array([0], dtype=np.int64), 4) is None
    handle = store.set_plan(keys[:300], np.zeros(300, dtype=np.int64), 1)
    assert isinstance(handle, cachex.PlanHandle)
    (record,) = plans(tier)
    assert record_objects(record) == 2, "k0..k299 lie in two segments"
    handle.close()
    assert plans(tier) == []
    # A budget the whole store fits: its segments are mapped whole, which
    # no plan would evict, so none is registered.
    roomy = {**s3.tier("roomy"), "tier_budget": 4 * BUDGET}
    whole = cachex.SegmentStore(url, read_only=True, **roomy)
    assert whole.set_plan(keys[:300], np.zeros(300, dtype=np.int64), 1) is None
    assert plans(roomy) == []
    local = cachex.SegmentStore(str(tmp_path / "local"))
    local.put_batch({"a": value(0)})
    local.flush()
    assert local.set_plan(["a"], np.array([0], dtype=np.int64), 1) is None
