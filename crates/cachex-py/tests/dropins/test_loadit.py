"""cachex.loadit.LoadIt used the way loadit users use it, and each loadit
0.0.8 bug we fix (the test says which)."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

import cachex
from cachex.loadit import LoadIt, LoaditView, chunk_shuffle

N, SHARD = 95, 10
DATA = [{"i": i, "blob": bytes([i % 251]) * 40} for i in range(N)]


def source():
    """The deterministic source (module level: it pickles)."""
    return iter(DATA)


class CountingSource:
    """A source that counts how often it was started."""

    def __init__(self, n: int = N) -> None:
        self.n, self.calls = n, 0

    def __call__(self):
        self.calls += 1
        return iter(DATA[: self.n])


def shard_files(root: Path) -> list[str]:
    return sorted((root / "shards").iterdir(), key=lambda p: int(p.name.split(".")[0]))


def shard_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "shards").iterdir())


@pytest.fixture
def loader(tmp_path):
    return LoadIt(tmp_path / "root", source, max_shard_length=SHARD)


def test_defaults_and_layout(tmp_path):
    loader = LoadIt(tmp_path, source)  # "64mb": one shard holds everything
    assert loader[3] == DATA[3] and len(loader) == N
    assert [p.name for p in shard_files(tmp_path)] == [f"0.{N}.shard.pickle"]
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["length_final"] is True and meta["version"] == 4 and meta["length"] == N
    assert (tmp_path / "completed").exists() and (tmp_path / "locks").is_dir()
    with open(shard_files(tmp_path)[0], "rb") as f:
        assert pickle.load(f) == DATA  # loadit's shard format: a pickled list


def test_integer_indexing(loader):
    assert loader[0] == DATA[0] and loader[94] == DATA[94]
    assert loader[-1] == DATA[-1] and loader[-N] == DATA[0]
    assert loader[np.int64(7)] == DATA[7] and loader.get(8) == DATA[8]
    for bad in (N, -N - 1, 10**9):
        with pytest.raises(IndexError):
            loader[bad]


SLICES = [
    slice(None),
    slice(3, 17),
    slice(5, None, 3),
    slice(None, None, -1),  # loadit 0.0.8: empty
    slice(50, 5, -7),
    slice(-20, -3),
    slice(None, 0),  # loadit 0.0.8: the whole loader
    slice(0, 0),
    slice(90, 200),
    slice(200, 300),
    slice(-300, 4),
]


@pytest.mark.parametrize("s", SLICES, ids=str)
def test_slices_follow_python(tmp_path, s):
    fresh = LoadIt(tmp_path, source, max_shard_length=SHARD)  # length unknown
    view = fresh[s]
    assert isinstance(view, LoaditView)
    assert len(view) == len(DATA[s]) and list(view) == DATA[s]
    if DATA[s]:
        assert view[0] == DATA[s][0] and view[-1] == DATA[s][-1]


def test_index_sequences_give_lazy_views(loader):
    for idx in ([4, 0, -1, 4], (1, 2, 3), range(10, 30, 5), np.array([93, 2])):
        view = loader[idx]
        assert isinstance(view, LoaditView)
        assert list(view) == [DATA[i] for i in idx]
    view = loader[[5, 6, 7, 8, 9]]
    assert list(view[1:4]) == DATA[6:9] and list(view[[4, 0]]) == [DATA[9], DATA[5]]
    assert list(view[::-1]) == DATA[5:10][::-1]
    with pytest.raises(IndexError):
        list(loader[[N]])


def test_iteration_writes_and_reads(tmp_path):
    src = CountingSource()
    loader = LoadIt(tmp_path, src, max_shard_length=SHARD)
    assert list(loader) == DATA
    assert src.calls == 1 and len(shard_files(tmp_path)) == 10
    assert list(LoadIt(tmp_path)) == DATA  # from the cache alone
    # A source that ends exactly at a shard boundary.
    exact = LoadIt(tmp_path / "exact", CountingSource(90), max_shard_length=SHARD)
    assert list(exact) == DATA[:90] and len(exact) == 90
    assert [x["i"] for x in loader if x["i"] % 30 == 0] == [0, 30, 60, 90]


def test_len_uses_the_given_length(tmp_path):
    # loadit 0.0.8 ignored `length` and iterated the whole source.
    src = CountingSource()
    loader = LoadIt(tmp_path, src, max_shard_length=SHARD, length=N)
    calls = src.calls
    assert len(loader) == N and src.calls == calls
    assert shard_files(tmp_path) == []
    assert loader[-1] == DATA[-1]


def test_info_and_set_info(tmp_path):
    loader = LoadIt(tmp_path, source, max_shard_length=SHARD, info={"url": "x"})
    assert loader.info() == {"url": "x"}
    loader.set_info({"url": "www.mydataset.com/data", "contact": "Tarzan"})
    assert LoadIt(tmp_path).info() == {"url": "www.mydataset.com/data", "contact": "Tarzan"}
    with pytest.raises(cachex.CacheError):
        loader.set_info({"not json": object()})


def test_memory_limit_evicts_and_regenerates(tmp_path):
    full = LoadIt(tmp_path / "full", source, max_shard_length=SHARD)
    list(full)
    one_shard = shard_bytes(tmp_path / "full") // 10
    limit = int(one_shard * 3.5)
    src = CountingSource()
    loader = LoadIt(
        tmp_path / "budget", src, max_shard_length=SHARD, memory_limit=limit, max_cache_size=1
    )
    order = np.random.default_rng(0).permutation(N).tolist() * 2
    for i in order:
        assert loader[i] == DATA[i]
        assert shard_bytes(tmp_path / "budget") <= limit
    assert src.calls > 1  # evicted shards came back from the source
    assert not loader.all_cached_to_disk()


def test_memory_limit_below_one_shard_keeps_the_shard_read(tmp_path):
    # loadit 0.0.8 deleted the shard it had just written: nothing stayed cached.
    loader = LoadIt(tmp_path, source, max_shard_length=SHARD, memory_limit=10, max_cache_size=1)
    for i in (5, 55, 94, 5):
        assert loader[i] == DATA[i]
        assert [p.name for p in shard_files(tmp_path)] == [
            f"{i - i % 10}.{min(i - i % 10 + 10, N)}.shard.pickle"
        ]


def test_compression_and_its_size_accounting(tmp_path):
    big = [bytes(1000) + bytes([i]) for i in range(60)]  # compresses ~50x

    def make():
        return iter(big)

    loader = LoadIt(tmp_path / "z", make, max_shard_length=6, compression="zstd")
    assert list(loader) == big
    names = [p.name for p in shard_files(tmp_path / "z")]
    assert names[0] == "0.6.shard.pickle.zstd" and len(names) == 10
    compressed = shard_bytes(tmp_path / "z")
    assert compressed < 60 * 1000 // 4
    # A reopen with compression=None adopts the root's (as loadit).
    assert LoadIt(tmp_path / "z", make, max_shard_length=6)[7] == big[7]
    # The budget counts the compressed files: above their total nothing is
    # evicted; below it, it holds (loadit 0.0.8 globbed *.shard.pickle only
    # and never evicted a compressed cache).
    roomy = LoadIt(
        tmp_path / "roomy",
        make,
        max_shard_length=6,
        compression="zstd",
        memory_limit=compressed + 100,
    )
    assert list(roomy) == big and len(shard_files(tmp_path / "roomy")) == 10
    tight_limit = compressed // 3
    tight = LoadIt(
        tmp_path / "tight",
        make,
        max_shard_length=6,
        compression="zstd",
        memory_limit=tight_limit,
    )
    for i in range(0, 60, 5):
        assert tight[i] == big[i] and shard_bytes(tmp_path / "tight") <= tight_limit
    with pytest.raises(cachex.InvalidInputError):
        LoadIt(tmp_path / "gz", make, compression="gzip")


def test_all_cached_to_disk_after_eviction(tmp_path, loader):
    # loadit 0.0.8 said True with the first shard gone.
    assert not loader.all_cached_to_disk()
    loader.wait_until_all_cached()
    assert loader.all_cached_to_disk()
    (tmp_path / "root" / "shards" / "0.10.shard.pickle").unlink()
    assert not loader.all_cached_to_disk()
    loader.wait_until_all_cached()  # with a source, it fills the gap itself
    assert loader.all_cached_to_disk() and LoadIt(tmp_path / "root")[0] == DATA[0]


def test_background_work_needs_thread_safe_iterators(tmp_path):
    with pytest.raises(ValueError, match="iterator_thread_safe"):
        LoadIt(tmp_path, source, max_workers=2)
    loader = LoadIt(
        tmp_path,
        source,
        max_shard_length=SHARD,
        max_workers=3,
        iterator_thread_safe=True,
        preload_all_async=True,
    )
    loader.wait_until_all_cached()
    assert loader.all_cached_to_disk() and list(loader) == DATA


def test_load_async_caches_in_the_background(tmp_path):
    loader = LoadIt(
        tmp_path,
        source,
        max_shard_length=SHARD,
        max_workers=2,
        iterator_thread_safe=True,
        preload_fn=None,
    )
    loader.load_async([45, -1])
    want = {"40.50.shard.pickle", "90.95.shard.pickle"}
    deadline = time.monotonic() + 60  # a bound on a hang, not a timing assertion
    while not want <= {p.name for p in shard_files(tmp_path)}:
        assert time.monotonic() < deadline, [p.name for p in shard_files(tmp_path)]
        time.sleep(0.01)
    assert loader[45] == DATA[45]
    LoadIt(tmp_path / "w1", source).load_async([3])  # no workers: nothing to do
    assert shard_files(tmp_path / "w1") == []


def test_custom_preload_fn_is_called(tmp_path):
    calls = []

    def preload(loader, idx):
        calls.append(idx)
        return [[idx + loader.shards.max_shard_length]]

    loader = LoadIt(
        tmp_path,
        source,
        max_shard_length=SHARD,
        max_workers=2,
        iterator_thread_safe=True,
        preload_fn=preload,
    )
    assert loader[12] == DATA[12] and loader[-1] == DATA[-1]
    assert calls == [12, N - 1]


def test_reopen_rules(tmp_path, loader):
    assert loader[0] == DATA[0]
    with pytest.raises(cachex.SchemaMismatchError):
        LoadIt(tmp_path / "root", source, max_shard_length=SHARD + 1)
    again = LoadIt(tmp_path / "root", source, max_shard_length="1mb")  # adopts 10
    assert again.shards.max_shard_length == SHARD and again[33] == DATA[33]
    with pytest.raises(cachex.CacheError):
        LoadIt(tmp_path / "missing")  # no source, no cache
    cache_only = LoadIt(tmp_path / "root")
    with pytest.raises(cachex.CacheError, match="cached"):
        cache_only[50]


def test_pickles_for_dataloader_workers(loader):
    assert loader[5] == DATA[5]
    copy = pickle.loads(pickle.dumps(loader))
    assert copy[77] == DATA[77] and list(copy[1:3]) == DATA[1:3]


def test_chunk_shuffle_over_a_loader(loader):
    view = chunk_shuffle(loader, chunk_size=10, seed=4)
    assert isinstance(view, LoaditView) and len(view) == N
    got = list(view)
    for k in range(0, N, 10):
        assert sorted(x["i"] for x in got[k : k + 10]) == list(range(k, min(k + 10, N)))


def test_iterable_create_iter_is_accepted(tmp_path):
    loader = LoadIt(tmp_path, DATA, max_shard_length=SHARD)
    assert loader[50] == DATA[50] and len(loader) == N


def test_a_failing_source_raises_its_error(tmp_path):
    def bad():
        yield 1
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        LoadIt(tmp_path, bad, max_shard_length=SHARD)[5]
    assert os.path.isdir(tmp_path / "shards")


def test_a_source_failing_late_still_serves_the_items_before(tmp_path):
    def late():
        yield from range(100)
        raise RuntimeError("late failure")

    loader = LoadIt(tmp_path, late, max_shard_length=SHARD)
    assert loader[5] == 5 and loader[99] == 99  # the source is read ahead in batches
    with pytest.raises(RuntimeError, match="late failure"):
        loader[100]


def test_a_damaged_metadata_file_is_a_typed_error(tmp_path, loader):
    assert loader[0] == DATA[0]
    (tmp_path / "root" / "metadata.json").write_text("{not json")
    with pytest.raises(cachex.CorruptError, match=r"metadata\.json"):
        LoadIt(tmp_path / "root", source, max_shard_length=SHARD)
