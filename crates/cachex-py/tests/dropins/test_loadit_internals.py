"""The loadit internals its users' code reads, answered from the engine:
``loader.shards`` (``size()``, ``get_all_shards()``, ``observer``,
``_cache_miss_count``), ``loader.memory_cache``, ``loader.writer_pool``,
``loader.finalize()``, ``loader.preload_fn`` and a float ``memory_limit``.

The scenarios and expected numbers are loadit 0.0.8's own tests'
(``test_caching``, ``test_uses_multiple_writers``,
``test_set_length_from_shards``); where the real loadit runs the same
scenario, its answer is compared too.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from cachex.loadit import LoadIt, ShardInfo, ShardObserver, preload_next_shard

SHARD = 16
N = 1600


def items(n: int = N):
    # Equal-sized items, so that every full shard pickles to the same size.
    return lambda: (f"item-{i:06d}" for i in range(n))


def shard_bytes(tmp_path: Path) -> int:
    probe = LoadIt(tmp_path / "probe", items(), max_shard_length=SHARD)
    probe[0]
    (info,) = probe.shards.get_all_shards()
    return info.size


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_memory_limit_takes_a_float_and_bounds_the_shard_files(tmp_path):
    limit = 3.5 * shard_bytes(tmp_path)
    loader = LoadIt(tmp_path / "r", items(), max_shard_length=SHARD, memory_limit=limit)
    assert loader.shards.max_size == math.floor(limit)
    for i in range(0, 10 * SHARD, SHARD):
        assert loader[i] == f"item-{i:06d}"
        assert loader.shards.size() <= limit
    assert len(loader.shards.get_all_shards()) == 3
    assert loader[0] == "item-000000"  # evicted, generated again


@pytest.mark.parametrize(
    ("bad", "error"),
    [(math.nan, ValueError), (math.inf, ValueError), (-1.0, ValueError), ("1e6", TypeError)],
)
def test_memory_limit_refuses_what_is_no_byte_count(tmp_path, bad, error):
    with pytest.raises(error, match="memory_limit"):
        LoadIt(tmp_path, items(), max_shard_length=SHARD, memory_limit=bad)


# A disk budget (however large) keeps the shards a replay passes unwritten,
# as loadit does: only the shards read are on disk.
BIG = 1e9


def test_size_and_get_all_shards_describe_the_shard_files(tmp_path):
    loader = LoadIt(tmp_path, items(100), max_shard_length=SHARD, memory_limit=BIG)
    assert loader.shards.size() == 0 and loader.shards.get_all_shards() == []
    loader[40], loader[99], loader[3]
    shards = loader.shards.get_all_shards()
    assert [(s.start, s.end) for s in shards] == [(0, 16), (32, 48), (96, 100)]
    for s in shards:
        assert isinstance(s, ShardInfo) and s.path.parent == tmp_path / "shards"
        assert s.path.name == f"{s.start}.{s.end}.shard.pickle"
        assert s.size == s.path.stat().st_size > 0
    assert loader.shards.size() == sum(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    assert loader.shards.shard_dir == tmp_path / "shards"


def test_compressed_shards_are_listed_and_counted(tmp_path):
    loader = LoadIt(
        tmp_path, items(100), max_shard_length=SHARD, compression="zstd", memory_limit=BIG
    )
    loader[50]
    (s,) = loader.shards.get_all_shards()
    assert s.path.name == "48.64.shard.pickle.zstd"
    assert loader.shards.size() == s.size == s.path.stat().st_size


def test_shards_agree_with_the_real_loadit_s_on_the_same_items(tmp_path):
    loadit = pytest.importorskip("loadit", reason="the real loadit 0.0.8 is not installed")
    ours = LoadIt(tmp_path / "ours", items(100), max_shard_length=SHARD, memory_limit=BIG)
    theirs = loadit.LoadIt(
        str(tmp_path / "theirs"), items(100), max_shard_length=SHARD, memory_limit=BIG
    )
    try:
        for loader in (ours, theirs):
            loader[40], loader[99], loader[3]

        def described(loader):
            got = sorted(loader.shards.get_all_shards(), key=lambda s: s.start)
            return [(Path(s.path).name, s.start, s.end, s.size) for s in got]

        assert described(ours) == described(theirs)
        assert ours.shards.size() == theirs.shards.size()
    finally:
        theirs.shards.stop_observer()


def test_the_observer_is_inert_and_loadit_s_clean_up_runs(tmp_path):
    loader = LoadIt(tmp_path, items(100), max_shard_length=SHARD)
    observer = loader.shards.observer
    assert isinstance(observer, ShardObserver) and not observer.is_alive()
    # loadit's users stop it like this (its suite's fixture teardown).
    observer.unschedule_all()
    observer.stop()
    observer.join()
    observer.join(timeout=1.0)
    loader.shards.stop_observer()
    assert loader[70] == "item-000070" and not observer.is_alive()


def test_memory_cache_size_is_the_decoded_shards_held(tmp_path):
    loader = LoadIt(tmp_path, items(), max_shard_length=SHARD, max_cache_size=3)
    assert loader.memory_cache.size() == 0 and loader.memory_cache.max_size == 3
    for k in range(6):
        loader[k * SHARD]
        assert loader.memory_cache.size() == min(k + 1, 3)
        assert k * SHARD in loader.memory_cache
    assert 0 not in loader.memory_cache and 5 * SHARD in loader.memory_cache
    assert 5 not in loader.memory_cache  # not a shard start


def test_miss_counts_follow_loadit_s_caching_test(tmp_path):
    # loadit's test_caching: 21 shards, a memory cache of 10, a disk budget of 20.
    budget = 20.5 * shard_bytes(tmp_path)
    loader = LoadIt(
        tmp_path / "r",
        items(),
        max_shard_length=SHARD,
        max_cache_size=10,
        max_workers=5,
        iterator_thread_safe=True,
        memory_limit=budget,
    )
    loader.preload_fn = None
    starts = list(range(0, SHARD * 21, SHARD))
    for i in starts:
        loader[i]
    assert loader.memory_cache._cache_miss_count == 21
    assert loader.shards._cache_miss_count == 21
    for i in starts[::-1]:
        loader[i]
    # The 10 newest were in memory; of the other 11, shard 0 was evicted from disk.
    assert loader.memory_cache._cache_miss_count == 21 + 11
    assert loader.shards._cache_miss_count == 21 + 1


def test_writer_pool_shows_how_far_each_replay_of_the_source_got(tmp_path):
    # loadit's test_uses_multiple_writers.
    loader = LoadIt(
        tmp_path,
        items(),
        max_shard_length=SHARD,
        max_workers=5,
        iterator_thread_safe=True,
        memory_limit=1e9,
    )
    loader.preload_fn = None
    writers = loader.writer_pool.writers
    assert len(writers) == 5 and all(w.current_idx == -1 for w in writers)
    loader[11 * SHARD]
    assert writers[0].current_idx == 12 * SHARD - 1 and writers[1].current_idx == -1
    loader[SHARD]  # behind the first replay: a second one starts
    assert writers[0].current_idx == 12 * SHARD - 1
    assert writers[1].current_idx == 2 * SHARD - 1
    assert not any(w.finished for w in writers)
    loader[-1]
    assert any(w.finished and w.current_idx == N - 1 for w in writers)
    assert LoadIt(tmp_path, None, max_shard_length=None).writer_pool is None


def test_finalize_makes_the_shards_on_disk_the_whole_length(tmp_path):
    # loadit's test_set_length_from_shards.
    loader = LoadIt(
        tmp_path, items(), max_shard_length=SHARD, max_workers=10, iterator_thread_safe=True
    )
    loader.preload_fn = None
    for i in range(SHARD):
        loader[i]
    assert loader.finalize() is None
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert (meta["length"], meta["length_final"]) == (SHARD, True)
    assert len(LoadIt(tmp_path, None, max_shard_length=None)) == SHARD
    assert (tmp_path / "completed").exists()  # every shard of that length is there


def test_finalize_keeps_a_length_already_final(tmp_path):
    loader = LoadIt(tmp_path, items(100), max_shard_length=SHARD)
    assert len(loader) == 100
    loader.finalize()
    assert len(LoadIt(tmp_path, None, max_shard_length=None)) == 100


def test_a_finalized_root_reads_in_the_real_loadit(tmp_path):
    loadit = pytest.importorskip("loadit", reason="the real loadit 0.0.8 is not installed")
    loader = LoadIt(tmp_path, items(), max_shard_length=SHARD)
    loader[2 * SHARD]
    loader.finalize()
    theirs = loadit.LoadIt(str(tmp_path), None, max_shard_length=None)
    try:
        assert len(theirs) == 3 * SHARD and theirs[40] == "item-000040"
    finally:
        theirs.shards.stop_observer()


def test_preload_fn_is_loadit_s_and_assigning_it_takes_effect(tmp_path):
    loader = LoadIt(
        tmp_path, items(), max_shard_length=SHARD, max_workers=10, iterator_thread_safe=True
    )
    assert loader.preload_fn is preload_next_shard
    # preload_next_shard names max_workers // 2 - 1 = 4 shards after the one read.
    assert preload_next_shard(loader, 0) == [[k * SHARD] for k in range(1, 5)]
    loader[0]
    wait_for(lambda: all(k * SHARD in loader.memory_cache for k in range(1, 5)))
    assert [s.start for s in loader.shards.get_all_shards()] == [k * SHARD for k in range(5)]
    loader.preload_fn = None
    assert loader.preload_fn is None
    before = loader.memory_cache._cache_miss_count
    for k in range(20, 25):
        loader[k * SHARD]  # nothing ahead was loaded: each read misses
    assert loader.memory_cache._cache_miss_count == before + 5
    assert {s.start for s in loader.shards.get_all_shards()} >= {k * SHARD for k in range(20, 25)}
    assert 25 * SHARD not in loader.memory_cache


def test_iteration_keeps_the_memory_cache_within_its_size(tmp_path):
    # loadit's verify_sizes, checked at every step of an iteration.
    loader = LoadIt(tmp_path, items(300), max_shard_length=SHARD, max_cache_size=5)
    for i, x in enumerate(loader):
        assert x == f"item-{i:06d}"
        assert loader.memory_cache.size() <= 5
