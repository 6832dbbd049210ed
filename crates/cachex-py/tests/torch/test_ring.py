"""The workers' batch ring (``ResumableDataLoader(..., ring=True)``): each
DataLoader worker fills shared-memory slots allocated once, only the slot
and lengths cross the queue, a batch stays intact until the loop takes the
next one; nothing is allocated or mapped per batch once every slot was
used (counted over epochs); resume, fork and spawn, a worker that waits too
long or dies raises cachex.WorkerError without hanging."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import cachex

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs it)")

import procs  # noqa: E402
from cachex.torch import PageDataset, ResumableDataLoader, keep  # noqa: E402
from cachex.torch._ring import RingConfig, WorkerRing  # noqa: E402

N = 480
BATCH = 16
WORKERS = 2
DEPTH = 2 + 2  # prefetch_factor + 2


def blob(i: int) -> bytes:
    """Sample ``i``'s value: 900 to 999 bytes, so no batch after the first
    of a slot outgrows the slot's 1.25x headroom."""
    return np.random.default_rng(i).integers(0, 256, 900 + (i * 31) % 100, np.uint8).tobytes()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("ring") / "r.pages"
    w = cachex.PageWriter(path, {"i": "int", "blob": "bytes", "x": ("float32", (3,))})
    w.write_many([{"i": i, "blob": blob(i), "x": np.full(3, i, np.float32)} for i in range(N)])
    w.finalize()
    return path


def check(batch, ragged: bool) -> list[int]:
    """Every byte of ``batch`` against the source; its sample indices."""
    ids = np.asarray(batch["i"]).tolist()
    assert np.array_equal(
        np.asarray(batch["x"]), np.repeat(np.asarray(ids, np.float32), 3).reshape(-1, 3)
    )
    if ragged:
        got = [bytes(np.asarray(batch["blob"][k])) for k in range(len(ids))]
    else:
        rows, lengths = np.asarray(batch["blob"]), np.asarray(batch["blob_lengths"])
        got = [rows[k, : lengths[k]].tobytes() for k in range(len(ids))]
        assert all(not rows[k, lengths[k] :].any() for k in range(len(ids)))
    assert got == [blob(i) for i in ids]
    return ids


def data_ptr(batch, ragged: bool) -> int:
    part = batch["blob"].values if ragged else batch["blob"]
    return part.data_ptr()


def loader_over(page, ragged: bool, output: str = "torch", **kw) -> ResumableDataLoader:
    ds = PageDataset(page, ragged=ragged, output=output)
    return ResumableDataLoader(
        ds.iterable(BATCH, seed=3, rank=0, world_size=1), num_workers=WORKERS, ring=True, **kw
    )


@pytest.mark.parametrize(
    ("ragged", "output", "method"),
    [
        (True, "torch", "fork"),
        (False, "torch", "fork"),
        (True, "numpy", "fork"),
        (True, "torch", "spawn"),
    ],
)
def test_an_epoch_through_the_ring_allocates_and_maps_nothing_per_batch(
    page, ragged, output, method
):
    loader = loader_over(
        page, ragged, output, multiprocessing_context=method, persistent_workers=True
    )
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen, ptrs, stats = [], set(), []
        for k, batch in enumerate(loader):
            if k % 5 == 0:
                # The workers run ahead meanwhile: none may touch a slot
                # the loop still holds.
                time.sleep(0.05)
            seen += check(batch, ragged)
            ptrs.add(data_ptr(batch, ragged))
            stats.append(loader.ring_stats())
        assert sorted(seen) == list(range(N)), epoch
        # One set of buffers a slot, mapped once: counted after the first
        # slot of each worker's ring was used, they no longer change.
        warm = WORKERS * DEPTH
        assert len(stats) == N // BATCH and len(ptrs) <= warm
        assert all(s == stats[-1] for s in stats[warm:]), stats
        assert stats[-1]["mapped"] == warm
        # i, x and blob (a ragged blob's values buffer grown once more).
        assert stats[-1]["allocations"] == warm * (4 if ragged else 3)
        if epoch == 0:
            first = stats[-1]
        else:
            assert stats[-1] == first  # the persistent workers' rings carry over


def test_state_dict_resumes_through_the_ring(page):
    first = loader_over(page, ragged=True)
    read = []
    for k, batch in enumerate(first, 1):
        read += check(batch, ragged=True)
        if k == 7:
            state = first.state_dict()
            break
    again = loader_over(page, ragged=True)
    again.load_state_dict(state)
    rest = [i for batch in again for i in check(batch, ragged=True)]
    assert sorted(read + rest) == list(range(N))


def test_a_kept_batch_survives_the_slots_reuse(page):
    loader = loader_over(page, ragged=True)
    kept, last = [], None
    for batch in loader:
        kept.append(keep(batch))
        last = batch
    assert last is not None
    assert sorted(i for b in kept for i in check(b, ragged=True)) == list(range(N))
    assert all(not np.shares_memory(b["i"].numpy(), last["i"].numpy()) for b in kept)


def test_ring_needs_a_buffered_iterable(page):
    ds = PageDataset(page)
    with pytest.raises(cachex.InvalidInputError, match="ring=True needs an IterableBatches"):
        ResumableDataLoader(ds, sampler=ds.sampler(8), num_workers=2, ring=True)
    # Without workers there is no boundary to cross: batches as always.
    loader = ResumableDataLoader(ds.iterable(BATCH, rank=0, world_size=1), ring=True)
    assert sorted(i for b in loader for i in check(b, ragged=False)) == list(range(N))
    assert loader.ring_stats() == {}


def test_a_worker_waits_boundedly_for_a_held_slot(page):
    acks = torch.zeros((1, 2), dtype=torch.int64).share_memory_()
    ds = PageDataset(page, ragged=True)
    ring = WorkerRing(RingConfig(depth=2, acks=acks, timeout=0.3), 0, ds, BATCH)
    ring.start()
    first = ring.put(list(range(BATCH)))
    ring.put(list(range(BATCH, 2 * BATCH)))
    assert first.buffers is not None and first.slot == 0
    started = time.monotonic()
    with pytest.raises(cachex.WorkerError, match=r"waited 0\.3 s for the loop to release batch 0"):
        ring.put(list(range(2 * BATCH, 3 * BATCH)))
    assert time.monotonic() - started < 5
    acks[0, 1] = 1  # the loop moved past batch 0
    third = ring.put(list(range(2 * BATCH, 3 * BATCH)))
    assert third.slot == 0 and third.buffers is None  # the slot reused, not sent again


class DiesAtBatch(PageDataset):
    """A page dataset whose DataLoader worker exits at its third batch."""

    def batch(self, indices, out=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3:
            os._exit(3)
        return super().batch(indices, out)


def test_a_dead_worker_is_a_typed_error_not_a_hang(page):
    ds = DiesAtBatch(page, ragged=True, output="torch")
    loader = ResumableDataLoader(
        ds.iterable(BATCH, rank=0, world_size=1), num_workers=WORKERS, ring=True
    )
    before = set(procs.tree(os.getpid()))
    started = time.monotonic()
    workers = []
    with pytest.raises(cachex.WorkerError, match="exited unexpectedly"):
        for _ in loader:
            workers = workers or [p for p in procs.tree(os.getpid()) if p not in before]
    assert workers
    assert time.monotonic() - started < 60
    assert not procs.left_alive(workers)
    # The loader starts new workers after the error (dying the same way).
    with pytest.raises(cachex.WorkerError, match="exited unexpectedly"):
        for _ in loader:
            pass
