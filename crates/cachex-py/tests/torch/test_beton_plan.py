"""FFCV ``.beton`` files through the sampling plan: the plan's blocks are
the file's pages (hypothesis: random sample sizes, world sizes, worker
counts, batch sizes, resume points), the map-style and iterable datasets,
DataLoader workers reading every sample once and resuming from a state,
locally and over ``s3://``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cachex
from cachex.torch import datasets as data

TORCH_REASON = "torch is not installed (scripts/test installs it)"
PAGE = 1 << 21  # FFCV's smallest page
FIELDS = {"i": "int", "blob": "bytes", "x": ("float32", (3,))}


def write(path, sizes, **kw) -> None:
    samples = [
        {"i": i, "blob": bytes([i % 251]) * n, "x": np.full(3, i, np.float32)}
        for i, n in enumerate(sizes)
    ]
    cachex.write_beton(path, FIELDS, samples, page_size=PAGE, **kw)


def ids_of(batches) -> list[list[int]]:
    return [np.asarray(b["i"]).reshape(-1).tolist() for b in batches]


sizes_st = st.lists(st.integers(0, 700_000), min_size=0, max_size=24)


@settings(max_examples=25, deadline=None)
@given(
    sizes=sizes_st,
    seed=st.integers(0, 2**32),
    world=st.integers(1, 4),
    bs=st.integers(1, 7),
    policy=st.sampled_from(["pad", "drop_last"]),
    stop=st.floats(0, 1),
    later=st.tuples(st.integers(1, 3), st.integers(1, 3)),
)
def test_beton_plan_covers_the_file_in_equal_batches_and_resumes(
    tmp_path_factory, sizes, seed, world, bs, policy, stop, later
):
    path = tmp_path_factory.mktemp("b") / "p.beton"
    write(path, sizes)
    reader = cachex.BetonReader(path)
    pages, blocks = reader.sample_pages(), reader.page_blocks()
    n = len(sizes)
    assert pages.dtype == np.int64 and pages.shape == (n,)
    assert blocks.dtype == np.int64 and int(blocks.sum()) == n
    # A block is a run of samples of one page; consecutive blocks differ.
    starts = np.cumsum(blocks) - blocks
    for lo, size in zip(starts.tolist(), blocks.tolist(), strict=True):
        assert len(set(pages[lo : lo + size].tolist())) == 1
    assert np.all(pages[starts[1:]] != pages[starts[1:] - 1]) if n else True
    assert np.all(np.diff(pages) >= 0)  # one writer fills pages in order

    ds = data.BetonDataset(path, fields=["i"])
    assert np.array_equal(ds.blocks(), blocks)
    ranks = [
        ds.iterable(bs, seed=seed, policy=policy, rank=r, world_size=world) for r in range(world)
    ]
    got = [ids_of(it) for it in ranks]
    assert len({len(g) for g in got}) == 1 and len(got[0]) == len(ranks[0])
    assert len({tuple(len(b) for b in g) for g in got}) == 1
    counts = Counter(i for g in got for b in g for i in b)
    deal = ranks[0].deal()
    if policy == "pad":
        assert set(counts) == set(range(n)) and sum(counts.values()) == n + deal.padded
    else:
        assert max(counts.values(), default=1) == 1 and n - len(counts) == deal.dropped

    # Every rank stops after ``k`` batches; a job of another size finishes.
    k = round(stop * len(ranks[0]))
    read = Counter(i for g in got for b in g[:k] for i in b)
    state = ranks[0].state_dict(steps=k)
    new_world, workers = later
    rest = [
        ds.iterable(bs, seed=seed, policy=policy, rank=r, world_size=new_world)
        for r in range(new_world)
    ]
    for it in rest:
        it.load_state_dict(state)
        for w in range(workers):
            read.update(it.order(w, workers))
    padding = (deal.padded if k else 0) + rest[0].deal(workers).padded
    if policy == "pad":
        assert set(read) == set(range(n))
        assert sum(read.values()) - n <= padding
    else:
        assert max(read.values(), default=1) == 1


def test_inline_fields_only_make_one_block(tmp_path):
    path = tmp_path / "inline.beton"
    cachex.write_beton(path, {"i": "int"}, [{"i": i} for i in range(10)])
    reader = cachex.BetonReader(path)
    assert reader.sample_pages().tolist() == [-1] * 10
    assert reader.page_blocks().tolist() == [10]
    it = data.BetonDataset(path).iterable(4, seed=1)
    assert sorted(i for b in ids_of(it) for i in b) == list(range(10))


def test_beton_dataset_batches_every_field(tmp_path):
    path = tmp_path / "a.beton"
    fields = {"i": "int", "f": "float", "blob": "bytes", "meta": "json", "x": ("float32", (3,))}
    samples = [
        {
            "i": i,
            "f": i / 2,
            "blob": bytes([i]) * (i % 4),
            "meta": f'{{"i": {i}}}',
            "x": np.full(3, i, np.float32),
        }
        for i in range(9)
    ]
    cachex.write_beton(path, fields, samples)
    ds = data.BetonDataset(path)
    assert len(ds) == 9 and ds[4]["i"] == 4
    batch = ds[[3, 1, 2]]
    assert batch["i"].tolist() == [3, 1, 2] and batch["f"].tolist() == [1.5, 0.5, 1.0]
    assert batch["blob_lengths"].tolist() == [3, 1, 2]
    assert batch["blob"].tolist() == [[3, 3, 3], [1, 0, 0], [2, 2, 0]]
    assert batch["meta"] == ['{"i": 3}', '{"i": 1}', '{"i": 2}']
    np.testing.assert_array_equal(batch["x"], np.array([[3] * 3, [1] * 3, [2] * 3], np.float32))
    out = {"i": np.zeros(5, np.int64), "blob": np.zeros((5, 8), np.uint8)}
    small = data.BetonDataset(path, fields=["i", "blob"]).batch([0, 7], out=out)
    assert small["i"].tolist() == [0, 7] and out["blob"][1, :3].tolist() == [7, 7, 7]
    with pytest.raises(cachex.InvalidInputError, match="no fields"):
        data.BetonDataset(path, fields=["nope"])
    reader = cachex.BetonReader(path)
    assert reader.max_sizes == {"blob": 3, "x": 12}
    with pytest.raises(cachex.InvalidInputError, match="sample"):
        reader.fill_batch([0], {"meta": np.zeros((1, 16), np.uint8)})
    with pytest.raises(cachex.InvalidInputError, match="does not fit"):
        reader.fill_batch([0, 1], {"i": np.zeros(1, np.int64)})
    with pytest.raises(cachex.CacheError, match="holds 3 bytes"):
        reader.fill_batch([3], {"blob": np.zeros((1, 2), np.uint8)})
    with pytest.raises(IndexError, match="sample 9 out of range"):
        reader.fill_batch([9], {"i": np.zeros(1, np.int64)})
    reused = data.BetonDataset(path, fields=["i", "x"])
    buffers = reused.empty_batch(4)
    assert np.shares_memory(reused.batch([5, 6], out=buffers)["x"], buffers["x"])
    assert buffers["i"][:2].tolist() == [5, 6]


def test_beton_over_a_url_reads_every_sample_through_the_plan(s3):
    url = s3.url("ffcv/data.beton")
    write(url, [300_000] * 20, **s3.tier("writer"))
    it = data.BetonDataset(url, fields=["i", "x"], **s3.tier("reader")).iterable(4, seed=2)
    assert len(it.dataset.blocks()) > 1 and it.dataset.reader.url == url
    seen = [i for b in ids_of(it) for i in b]
    assert sorted(seen) == list(range(20))
    # The order keeps each page's samples together.
    pages = it.dataset.reader.sample_pages()[np.asarray(it.order())]
    assert np.count_nonzero(np.diff(pages)) + 1 == len(set(pages.tolist()))


def test_dataloader_workers_read_a_beton_once_and_resume(tmp_path):
    pytest.importorskip("torch", reason=TORCH_REASON)
    from cachex.torch import ResumableDataLoader

    path = tmp_path / "a.beton"
    n = 40
    write(path, [200_000] * n)
    ds = data.BetonDataset(path, fields=["i", "x"], output="torch").iterable(3, seed=5)
    loader = ResumableDataLoader(ds, num_workers=2)
    whole = []
    for batch in loader:
        ids = batch["i"].tolist()
        assert batch["x"][:, 0].tolist() == [float(i) for i in ids]
        whole += ids
    assert sorted(whole) == list(range(n))

    # Stop after 3 batches; a loader of another worker count finishes.
    first = ResumableDataLoader(
        data.BetonDataset(path, fields=["i"]).iterable(3, seed=5), num_workers=2
    )
    read = []
    for step, batch in enumerate(first):
        read += batch["i"].tolist()
        if step == 2:
            break
    state = first.state_dict()
    assert state["position"] == 9
    rest = ResumableDataLoader(
        data.BetonDataset(path, fields=["i"]).iterable(3, seed=5), num_workers=1
    )
    rest.load_state_dict(state)
    read += [i for batch in rest for i in batch["i"].tolist()]
    assert sorted(read) == list(range(n))
