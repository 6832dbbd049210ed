"""cachex.torch.ThreadedLoader: native threads fill a ring of batch buffers
allocated once, in the plan's order; every byte against the file, resume
mid-epoch, equal batches per rank, errors from a fill, close and fork."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cachex
from cachex._cachex import ThreadedFill
from cachex.torch import PageDataset, ThreadedLoader

N = 203
BATCH = 16


def x_of(i: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) + i


def blob_of(i: int) -> bytes:
    return bytes((i * 7 + k) % 256 for k in range(i % 300))


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("threaded") / "train.pages"
    w = cachex.PageWriter(path, {"i": "int", "x": ("float32", (4,)), "blob": "bytes"})
    w.write_many([{"i": i, "x": x_of(i), "blob": blob_of(i)} for i in range(N)])
    w.finalize()
    return str(path)


def check_batch(batch, indices) -> None:
    """Every byte of ``batch`` against samples ``indices`` as written."""
    ids = np.asarray(batch["i"])
    assert ids.tolist() == list(indices)
    lengths = np.asarray(batch["blob_lengths"])
    blob = np.asarray(batch["blob"])
    for row, i in enumerate(indices):
        assert np.array_equal(np.asarray(batch["x"])[row], x_of(i))
        assert lengths[row] == len(blob_of(i))
        assert blob[row, : lengths[row]].tobytes() == blob_of(i)
        assert not blob[row, lengths[row] :].any()


def ids_of(loader) -> list[list[int]]:
    return [np.asarray(b["i"]).tolist() for b in loader]


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_every_byte_in_the_plans_order(page, output):
    if output == "torch":
        pytest.importorskip("torch", reason="torch is not installed")
    it = PageDataset(page, output=output).iterable(BATCH, seed=3, rank=0, world_size=1)
    order = it.rank_order(num_workers=0).tolist()
    loader = ThreadedLoader(it, threads=3, depth=3)
    seen: list[int] = []
    for batch in loader:
        indices = order[len(seen) : len(seen) + len(np.asarray(batch["i"]))]
        check_batch(batch, indices)
        seen += indices
    assert seen == order and sorted(seen) == list(range(N))
    assert loader.steps == len(loader) == -(-N // BATCH)


def test_batches_are_the_rings_buffers_reused(page):
    loader = ThreadedLoader(PageDataset(page).iterable(BATCH, world_size=1), depth=3)
    buffers = {
        (b["x"].__array_interface__["data"][0], b["blob"].__array_interface__["data"][0])
        for b in loader
    }
    assert len(buffers) == loader.depth == 3  # no allocation per batch
    assert len(list(loader)) == len(loader)  # a second epoch reuses them again


def test_resume_mid_epoch_reads_what_the_uninterrupted_epoch_does(page):
    def loader():
        return ThreadedLoader(PageDataset(page).iterable(BATCH, seed=5, world_size=1))

    whole = ids_of(loader())
    first = loader()
    stopped = []
    for batch in first:
        stopped.append(np.asarray(batch["i"]).tolist())
        if len(stopped) == 4:
            state = first.state_dict()
            break
    first.close()
    again = loader()
    again.load_state_dict(state)
    assert stopped + ids_of(again) == whole


def test_two_ranks_yield_equal_batch_counts_and_every_sample(page):
    got = []
    for rank in (0, 1):
        it = PageDataset(page).iterable(BATCH, seed=1, rank=rank, world_size=2)
        loader = ThreadedLoader(it)
        batches = ids_of(loader)
        assert len(batches) == len(loader)
        got.append(batches)
    assert len(got[0]) == len(got[1])
    assert {i for batch in got[0] + got[1] for i in batch} == set(range(N))


def test_a_damaged_file_is_a_corrupt_error_naming_it(tmp_path, page):
    path = tmp_path / "bad.pages"
    raw = bytearray(open(page, "rb").read())
    raw[-8:] = b"\0" * 8
    path.write_bytes(bytes(raw))
    with pytest.raises(cachex.CorruptError, match=r"bad\.pages"):
        ThreadedLoader(PageDataset(path).iterable(BATCH))


def test_a_failed_fill_is_raised_at_its_batch_naming_the_file(page):
    # A page file that opened is read without a failure; a row too narrow
    # for a value is a fill that fails (in a fill thread) all the same.
    reader = cachex.PageReader(page)
    narrow = [{"blob": np.zeros((4, 10), np.uint8)} for _ in range(2)]
    indices = np.array([1, 2, 3, 4, 5, 6, 11, 7, 8, 9], dtype=np.int64)
    offsets = np.array([0, 4, 8, 10], dtype=np.int64)
    fill = ThreadedFill(reader, indices, offsets, narrow, [{}, {}], threads=2)
    assert fill.next_batch(timeout=30) == (0, 4)  # samples 1..4 fit in 10 bytes
    with pytest.raises(cachex.InvalidInputError, match=r"train\.pages.*sample 11"):
        fill.next_batch(timeout=30)
    with pytest.raises(cachex.CacheError, match="failed"):
        fill.next_batch(timeout=30)
    assert fill.close(timeout=30) and fill.finished


def test_close_joins_the_threads_and_ends_the_iteration(page):
    loader = ThreadedLoader(PageDataset(page).iterable(BATCH, world_size=1), threads=2)
    batches = iter(loader)
    next(batches)
    fill = loader._fill
    assert loader.close(timeout=30)
    assert fill is not None and fill.finished
    with pytest.raises(cachex.CacheError, match="closed"):
        next(batches)
    assert len(ids_of(loader)) == len(loader)  # a new iteration starts new threads


def test_bad_arguments_are_typed_errors(page):
    ds = PageDataset(page)
    with pytest.raises(cachex.InvalidInputError, match="PageDataset"):
        ThreadedLoader(ds)  # not an iterable
    with pytest.raises(cachex.InvalidInputError, match="depth"):
        ThreadedLoader(ds.iterable(BATCH), depth=1)
    with pytest.raises(cachex.InvalidInputError, match="pin_memory"):
        ThreadedLoader(ds.iterable(BATCH), pin_memory=True)  # numpy output
    reader = cachex.PageReader(page)
    slot = [{"i": np.zeros(4, np.int64)}, {"i": np.zeros(4, np.int64)}]
    with pytest.raises(IndexError, match="out of range"):
        ThreadedFill(reader, np.array([N], np.int64), np.array([0, 1], np.int64), slot, [{}, {}])
    with pytest.raises(cachex.InvalidInputError, match="offsets"):
        ThreadedFill(reader, np.array([0], np.int64), np.array([0, 2], np.int64), slot, [{}, {}])
    with pytest.raises(cachex.InvalidInputError, match="hold"):
        ThreadedFill(
            reader, np.array([0], np.int64), np.array([0, 1], np.int64), slot, [{}, {}], hold=2
        )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_refuses_the_parents_threads_and_starts_its_own(page):
    loader = ThreadedLoader(PageDataset(page).iterable(BATCH, world_size=1))
    batches = iter(loader)
    next(batches)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            try:
                next(batches)
            except cachex.CacheError as e:
                if "forked" in str(e):
                    code = 2
            if code == 2:
                loader._fill = None  # the parent's: nothing of it to close here
                code = 0 if len(ids_of(loader)) == len(loader) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(list(batches)) == len(loader) - 1  # the parent's iteration goes on
    loader.close()


def test_pinned_buffers_are_allocated_once(page):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs a CUDA device; this machine has none")
    it = PageDataset(page, output="torch").iterable(BATCH, world_size=1)
    loader = ThreadedLoader(it, depth=4, pin_memory=True)
    order = it.rank_order(num_workers=0).tolist()
    pointers, seen = set(), 0
    for batch in loader:
        assert batch["x"].is_pinned() and batch["blob"].is_pinned()
        n = len(batch["i"])
        check_batch({k: v.numpy() for k, v in batch.items()}, order[seen : seen + n])
        seen += n
        pointers.add(batch["blob"].data_ptr())
    assert len(pointers) == loader.depth


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_ragged_fields_come_as_values_and_offsets(page, output):
    if output == "torch":
        pytest.importorskip("torch", reason="torch is not installed")
    pages = PageDataset(page, output=output, ragged=True)
    it = pages.iterable(BATCH, seed=2, world_size=1)
    order = it.rank_order(num_workers=0).tolist()
    seen = 0
    for batch in ThreadedLoader(it, depth=3):
        blob = batch["blob"]
        assert isinstance(blob, cachex.Ragged) and "blob_lengths" not in batch
        ids = np.asarray(batch["i"]).tolist()
        assert ids == order[seen : seen + len(ids)]
        offsets = np.asarray(blob.offsets).tolist()
        assert offsets[0] == 0 and len(np.asarray(blob.values)) == offsets[-1]
        for r, i in enumerate(ids):
            assert np.asarray(blob.values)[offsets[r] : offsets[r + 1]].tobytes() == blob_of(i)
        seen += len(ids)
    assert seen == N
