"""cachex.torch: map-style datasets over the four stores, the page file's
iterable dataset and its worker shares (the plan itself: test_sampling.py),
batches filled into preallocated buffers; then the same through torch's
DataLoader (skipped, with the reason, where torch is not installed) under
fork, spawn and forkserver, and the resumable loader."""

from __future__ import annotations

import importlib
import itertools
import pickle

import numpy as np
import pytest

import cachex
from cachex.dropins import torchcachex as dropin_torchcachex
from cachex.dropins.loadit import util as dropin_loadit_util
from cachex.torch import datasets as data

N = 96


# --- the four stores, each holding sample i of value i ------------------------
# Module-level so that spawned DataLoader workers can unpickle what uses them.


def x_of(i: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) + i


def shard_items():
    return ({"i": i, "x": x_of(i)} for i in range(N))


def build_memmap(path) -> None:
    w = cachex.MemmapWriter(path, {"x": ("float32", (4,)), "i": ("int64", (1,))}, nullable=["i"])
    for i in range(N):
        w.write(f"s{i}", {"x": x_of(i), "i": None if i % 5 == 4 else np.array([i])})
    w.finalize()


def build_page(path) -> None:
    w = cachex.PageWriter(
        path, {"i": "int", "x": ("float32", (4,)), "blob": "bytes"}, page_size=4096, alignment=8
    )
    w.write_many([{"i": i, "x": x_of(i), "blob": bytes([i % 256]) * (i % 40)} for i in range(N)])
    w.finalize()


def build_segment(path) -> list[str]:
    keys = [f"k{i}" for i in range(N)]
    with cachex.SegmentStore(path, flush_every=32) as store:
        store.put_batch({k: {"i": np.array([i]), "x": x_of(i)} for i, k in enumerate(keys)})
    return keys


def build_shard(path) -> None:
    store = cachex.ShardStore(path, shard_items, max_shard_length=16)
    assert len(store) == N
    store.wait_until_all_cached()


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("stores")
    build_memmap(root / "memmap")
    build_page(root / "train.pages")
    keys = build_segment(root / "segment")
    build_shard(root / "shard")
    return {
        "memmap": root / "memmap",
        "page": root / "train.pages",
        "segment": root / "segment",
        "keys": keys,
        "shard": root / "shard",
    }


def datasets(stores, **kw) -> dict:
    return {
        "memmap": data.MemmapDataset(stores["memmap"], **kw),
        "page": data.PageDataset(stores["page"], **kw),
        "segment": data.SegmentDataset(stores["segment"], stores["keys"], **kw),
        "shard": data.ShardDataset(stores["shard"], **kw),
    }


def check_batch(name: str, batch, indices) -> None:
    """The batch of `indices` holds the right value of every field."""
    idx = np.asarray(indices)
    x = np.asarray(batch["x"])
    assert x.shape == (len(idx), 4)
    assert np.array_equal(x, np.stack([x_of(i) for i in idx]))
    ids = np.asarray(batch["i"]).reshape(len(idx))
    if name == "memmap":
        present = np.asarray(batch["i_present"])
        assert np.array_equal(present, idx % 5 != 4)
        assert np.array_equal(ids, np.where(present, idx, 0))
    else:
        assert np.array_equal(ids, idx)
    if name == "page":
        lengths = np.asarray(batch["blob_lengths"])
        assert np.array_equal(lengths, idx % 40)
        blob = np.asarray(batch["blob"])
        for row, i in enumerate(idx):
            assert blob[row, : i % 40].tolist() == [i % 256] * (i % 40)
            assert not blob[row, i % 40 :].any()


# --- numpy level ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["memmap", "page", "segment", "shard"])
def test_items_and_batches_of_every_store(stores, name):
    ds = datasets(stores)[name]
    assert len(ds) == N
    item = ds[7]
    assert np.array_equal(np.asarray(item["x"]), x_of(7))
    assert np.array_equal(np.asarray(ds[-1]["x"]), x_of(N - 1))
    for indices in ([3, 0, 95, 41, 41], list(range(N)), np.array([10, 5])):
        check_batch(name, ds[indices], indices)
    check_batch(name, ds[10:20:3], list(range(10, 20, 3)))
    with pytest.raises(IndexError):
        ds[N]


@pytest.mark.parametrize("name", ["memmap", "page"])
def test_fill_batch_writes_into_the_callers_buffers(stores, name):
    ds = datasets(stores)[name]
    out = ds.empty_batch(8)
    first = {k: v.copy() for k, v in ds.batch([1, 2, 3, 4, 5, 6, 7, 8], out=out).items()}
    batch = ds.batch([40, 41, 42], out=out)
    check_batch(name, batch, [40, 41, 42])
    check_batch(name, first, [1, 2, 3, 4, 5, 6, 7, 8])
    for k in ("x", "i"):
        assert np.shares_memory(batch[k], out[k])
        assert len(batch[k]) == 3


def test_fill_batch_refuses_buffers_that_do_not_fit(stores):
    cache = cachex.MemmapArray(stores["memmap"])
    with pytest.raises(cachex.InvalidInputError, match="out"):
        cache.fill_batch([0, 1], {"x": np.empty((2, 4), np.float64)})
    with pytest.raises(cachex.InvalidInputError, match="out"):
        cache.fill_batch([0, 1, 2], {"x": np.empty((2, 4), np.float32)})
    with pytest.raises(cachex.InvalidInputError, match="writable"):
        cache.fill_batch([0], {"x": np.empty((4, 4), np.float32)[:, ::2].copy().T})
    with pytest.raises(cachex.InvalidInputError, match="nope"):
        cache.fill_batch([0], {"nope": np.empty((1, 4), np.float32)})
    with pytest.raises(IndexError):
        cache.fill_batch([N], {"x": np.empty((1, 4), np.float32)})


def test_segment_batches_stack_into_given_buffers_and_name_missing_keys(stores):
    ds = data.SegmentDataset(stores["segment"], [*stores["keys"], "absent"])
    out = {"i": np.empty((4, 1), np.int64), "x": np.empty((4, 4), np.float32)}
    batch = ds.batch([5, 6], out=out)
    check_batch("segment", batch, [5, 6])
    assert np.shares_memory(batch["x"], out["x"])
    with pytest.raises(KeyError, match="absent"):
        ds[N]


def test_segment_blocks_are_pieces_of_one_segment_each(tmp_path):
    # Three puts of 100, 40 and 300 rows: three segments; the dataset's keys
    # in a new order that mixes them at the ends, plus a key in none.
    keys = [f"r{i}" for i in range(440)]
    with cachex.SegmentStore(tmp_path / "s", flush_every=1000) as store:
        for part in (keys[:100], keys[100:140], keys[140:]):
            store.put_batch({k: {"i": np.array([int(k[1:])])} for k in part})
            store.flush()
        ids = store.segment_ids(keys)
    assert ids.dtype == np.int64 and len(set(ids.tolist())) == 3
    order = keys[:50] + keys[140:] + ["absent"] + keys[100:140] + keys[50:100]
    ds = data.SegmentDataset(tmp_path / "s", order)
    sizes = ds.blocks(block_size=64)
    assert sizes.sum() == len(order) and sizes.max() <= 64
    # Runs: 50 (segment 0), 300 (segment 2) in pieces of 60, the key in no
    # segment alone, 40 (segment 1), 50 (segment 0 again).
    assert sizes.tolist() == [50, 60, 60, 60, 60, 60, 1, 40, 50]
    seg = ds.store.segment_ids(order)
    at = np.concatenate(([0], np.cumsum(sizes)))
    for a, b in itertools.pairwise(at):
        assert len(set(seg[a:b].tolist())) == 1, (a, b)
    assert seg[350] == -1
    assert ds.blocks(block_size=1000).tolist() == [50, 300, 1, 40, 50]
    with pytest.raises(cachex.InvalidInputError, match="block_size=0"):
        ds.blocks(block_size=0)


def test_datasets_pickle_as_paths_and_reopen(stores):
    for name, ds in datasets(stores).items():
        copy = pickle.loads(pickle.dumps(ds))
        check_batch(name, copy[[9, 2]], [9, 2])


def test_memmap_load_in_memory_method_and_its_ram_guard(stores):
    cache = cachex.MemmapArray(stores["memmap"])
    view = cache.get_row(3)["x"]
    assert not cache.in_memory
    with pytest.raises(cachex.InvalidInputError, match="RAM"):
        cache.load_in_memory(ram_fraction=0.0)
    assert not cache.in_memory
    cache.load_in_memory()
    assert cache.in_memory
    assert np.array_equal(cache.get_row(3)["x"], x_of(3))
    assert np.array_equal(view, x_of(3))  # the earlier view keeps its mapping
    assert pickle.loads(pickle.dumps(cache)).in_memory
    ds = data.MemmapDataset(stores["memmap"], load_in_memory=True)
    check_batch("memmap", ds[[0, 4, 9]], [0, 4, 9])


def test_page_shares_are_disjoint_and_complete_for_every_epoch(stores):
    ds = data.PageDataset(stores["page"]).iterable(8, seed=3)
    orders = {}
    for epoch in (0, 1):
        for world in (1, 2, 3):
            for workers in (1, 2, 5):
                ranks = [
                    data.PageDataset(stores["page"]).iterable(8, seed=3, rank=r, world_size=world)
                    for r in range(world)
                ]
                for r in ranks:
                    r.set_epoch(epoch)
                parts = [r.order(w, workers) for r in ranks for w in range(workers)]
                assert sorted(i for part in parts for i in part) == list(range(N))
        ds.set_epoch(epoch)
        orders[epoch] = ds.order()
    assert orders[0] != orders[1] and orders[0] != list(range(N))
    ds.set_epoch(0)
    assert ds.order() == orders[0]


def test_page_iterable_yields_every_sample_once(stores):
    ds = data.PageDataset(stores["page"]).iterable(10, seed=1)
    seen = []
    for batch in ds:
        check_batch("page", batch, batch["i"])
        seen.extend(batch["i"].tolist())
    assert sorted(seen) == list(range(N))
    ds = data.PageDataset(stores["page"]).iterable(10, policy="drop_last", shuffle=False)
    batches = list(ds)
    assert [len(b["i"]) for b in batches] == [10] * (N // 10)
    assert np.concatenate([b["i"] for b in batches]).tolist() == list(range(N // 10 * 10))
    singles = list(data.PageDataset(stores["page"]).iterable(None, shuffle=False))
    assert [s["i"] for s in singles] == list(range(N))


def test_page_iterable_reuses_its_buffers_when_asked(stores):
    ds = data.PageDataset(stores["page"]).iterable(16, reuse_buffers=True, seed=2)
    seen, bases = [], set()
    for batch in ds:
        check_batch("page", batch, batch["i"])
        seen.extend(batch["i"].tolist())
        bases.add(batch["x"].__array_interface__["data"][0])
    assert sorted(seen) == list(range(N)) and len(bases) == 1


def test_plain_batches_without_a_loader(stores):
    ds = data.MemmapDataset(stores["memmap"])
    seen = []
    for indices in data.batch_indices(len(ds), 10, shuffle=True, seed=4):
        check_batch("memmap", ds[indices], indices)
        seen.extend(indices)
    assert sorted(seen) == list(range(N))
    assert data.worker_share() == (0, 1)
    assert data.worker_share(1, 4) == (1, 4)


def test_bad_dataset_arguments_are_typed_errors(stores):
    with pytest.raises(cachex.InvalidInputError, match="nope"):
        data.MemmapDataset(stores["memmap"], arrays=["nope"])
    with pytest.raises(cachex.InvalidInputError, match="nope"):
        data.PageDataset(stores["page"], fields=["nope"])
    with pytest.raises(cachex.InvalidInputError, match="output"):
        data.PageDataset(stores["page"], output="jax")
    with pytest.raises(cachex.InvalidInputError, match="pin_memory"):
        data.PageDataset(stores["page"], pin_memory=True)
    with pytest.raises(cachex.InvalidInputError, match="batch_size"):
        data.PageDataset(stores["page"]).iterable(0)


# --- torch ----------------------------------------------------------------------

TORCH_REASON = "torch is not installed (scripts/test installs it)"


def need_torch():
    return pytest.importorskip("torch", reason=TORCH_REASON)


class AllStores:
    """One batch of the same indices from every store (one DataLoader run covers all four)."""

    def __init__(self, stores, **kw) -> None:
        self.parts = datasets(stores, **kw)

    def __len__(self) -> int:
        return N

    def __getitem__(self, indices):
        return {name: ds[indices] for name, ds in self.parts.items()}


def test_torch_classes_subclass_torchs_datasets(stores):
    torch = need_torch()
    assert data.HAS_TORCH
    for ds in datasets(stores).values():
        assert isinstance(ds, torch.utils.data.Dataset)
    assert isinstance(
        data.PageDataset(stores["page"]).iterable(None), torch.utils.data.IterableDataset
    )


@pytest.mark.parametrize("name", ["memmap", "page", "segment", "shard"])
def test_torch_output_fills_preallocated_tensors(stores, name):
    torch = need_torch()
    ds = datasets(stores, output="torch")[name]
    batch = ds[[4, 9, 14]]
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.float32
    check_batch(
        name, {k: v.numpy() if hasattr(v, "numpy") else v for k, v in batch.items()}, [4, 9, 14]
    )
    if name in ("memmap", "page"):
        out = {k: v.clone() for k, v in ds.empty_batch(4).items()}
        ptr = out["x"].data_ptr()
        batch = ds.batch([1, 2], out=out)
        assert batch["x"].data_ptr() == ptr
        assert torch.equal(out["x"][:2], torch.from_numpy(np.stack([x_of(1), x_of(2)])))


def test_pinned_batches(stores):
    torch = need_torch()
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs a CUDA device; this machine has none")
    ds = data.PageDataset(stores["page"], output="torch", pin_memory=True)
    batch = ds[[0, 1, 2]]
    assert batch["x"].is_pinned() and batch["blob"].is_pinned()
    check_batch("page", {k: np.asarray(v) for k, v in batch.items()}, [0, 1, 2])


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_see_every_sample_once(stores, method):
    torch = need_torch()
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    ds = AllStores(stores, output="torch")
    sampler = BatchSampler(RandomSampler(range(N)), batch_size=12, drop_last=False)
    loader = DataLoader(
        ds, sampler=sampler, batch_size=None, num_workers=2, multiprocessing_context=method
    )
    seen = {name: [] for name in ds.parts}
    for batch in loader:
        for name, part in batch.items():
            numpy_part = {
                k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in part.items()
            }
            check_batch(name, numpy_part, numpy_part["x"][:, 0].astype(int))
            seen[name].extend(numpy_part["x"][:, 0].astype(int).tolist())
    for name, ids in seen.items():
        assert sorted(ids) == list(range(N)), name

    pages = data.PageDataset(stores["page"], output="torch").iterable(8, seed=5)
    pages.set_epoch(2)
    loader = DataLoader(pages, batch_size=None, num_workers=2, multiprocessing_context=method)
    got = [b["i"].tolist() for b in loader]
    flat = sorted(i for b in got for i in b)
    assert flat == list(range(N))
    per_worker = [pages.order(k, 2) for k in range(2)]
    assert not set(per_worker[0]) & set(per_worker[1])
    assert sorted(per_worker[0] + per_worker[1]) == flat


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(stores, method):
    need_torch()
    from torch.utils.data import DataLoader

    pages = data.PageDataset(stores["page"]).iterable(8, seed=9)
    loader = DataLoader(
        pages,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=method,
    )
    streams = []
    for epoch in (0, 1):
        pages.set_epoch(epoch)
        got = [b["i"].tolist() for b in loader]
        # The loader takes batches from its workers in turn; worker k reads
        # share k of this epoch's order.
        chunks = [
            [o[j : j + 8] for j in range(0, len(o), 8)]
            for o in (pages.order(k, 2) for k in range(2))
        ]
        want = []
        for j in range(max(map(len, chunks))):
            want.extend(c[j] for c in chunks if j < len(c))
        assert got == want, epoch
        streams.append(got)
    assert streams[0] != streams[1]


@pytest.mark.parametrize("form", ["sampler", "iterable"])
def test_resumable_loader_restarts_with_another_worker_count(stores, form):
    need_torch()
    from cachex.torch import ResumableDataLoader

    def loader(workers: int):
        ds = data.MemmapDataset(stores["memmap"])
        if form == "sampler":
            return ResumableDataLoader(ds, sampler=ds.sampler(8, seed=6), num_workers=workers)
        return ResumableDataLoader(ds.iterable(8, seed=6, blocks=[32] * 3), num_workers=workers)

    def ids(batch) -> list[int]:
        return batch["x"][:, 0].numpy().astype(int).tolist()

    first = loader(2)
    read = []
    for k, batch in enumerate(first, 1):
        read += ids(batch)
        if k == 5:
            state = first.state_dict()
            break
    assert len(read) == 40 and state["position"] == 40
    again = loader(3)
    again.load_state_dict(state)
    assert len(again) == (N - 40) // 8
    read += [i for batch in again for i in ids(batch)]
    assert sorted(read) == list(range(N))
    again.set_epoch(1)
    assert sorted(i for batch in again for i in ids(batch)) == list(range(N))


def test_the_drop_ins_import_paths_are_the_drop_in_modules():
    # The drop-ins' import paths are the drop-in modules themselves.
    assert importlib.import_module("cachex.torchcachex") is dropin_torchcachex
    assert importlib.import_module("cachex.loadit.util") is dropin_loadit_util
