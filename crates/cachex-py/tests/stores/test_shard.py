"""cachex.ShardStore: random access over an iterator factory in loadit's
layout, Python objects pickled by Python, eviction, locks, loadit fixture."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import pickle
from fractions import Fraction

import pytest

import cachex


class Point:
    """A user class: items are any picklable object."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x


def records(n: int = 500):
    """A deterministic source (module level, so it pickles)."""
    return ({"id": i, "payload": bytes([i % 256]) * 20} for i in range(n))


def test_random_access_in_loadits_layout(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=64)
    assert store[123] == {"id": 123, "payload": bytes([123]) * 20}
    assert store[-1]["id"] == 499
    assert len(store) == 500
    assert [r["id"] for r in store[10:20:3]] == [10, 13, 16, 19]
    assert [r["id"] for r in store.get_many([499, 0, 250])] == [499, 0, 250]
    names = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert "0.64.shard.pickle" in names and "448.500.shard.pickle" in names
    with pytest.raises(IndexError):
        store[500]
    shard = pickle.loads((tmp_path / "shards" / "64.128.shard.pickle").read_bytes())
    assert shard[0] == {"id": 64, "payload": bytes([64]) * 20}


def test_any_picklable_object_round_trips(tmp_path):
    values = [Point(1), Fraction(1, 3), datetime.date(2026, 11, 23), {1, 2}, None, (1, "a")]
    store = cachex.ShardStore(tmp_path, lambda: iter(values), max_shard_length=4)
    assert [store[i] for i in range(len(values))] == values
    cached = cachex.ShardStore(tmp_path)
    assert cached[0] == Point(1) and cached[5] == (1, "a")


def test_a_decoded_shard_hands_out_the_same_objects_on_every_read(tmp_path):
    cachex.ShardStore(tmp_path, records, max_shard_length=64)[499]  # writes every shard
    cached = cachex.ShardStore(tmp_path)
    first = cached[70]
    assert first == {"id": 70, "payload": bytes([70]) * 20}
    assert cached[70] is first and cached[-430] is first
    many = cached.get_many([70, 71, 70, 499])
    assert many[0] is first and many[2] is first and many[1]["id"] == 71
    assert cached[10:0:-30][0] is cached[10] and cached[499] is many[3]


def test_reopen_without_a_source_reads_the_cache(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=100, info={"note": "w3"})
    assert len(store) == 500
    cached = cachex.ShardStore(tmp_path)
    assert cached[321]["id"] == 321 and cached.info == {"note": "w3"}
    assert cached.all_cached_to_disk()


def test_the_disk_budget_evicts_and_regenerates(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=50, memory_limit=4000)
    for i in list(range(0, 500, 7)) + list(range(499, 0, -13)):
        assert store[i]["id"] == i
    on_disk = sum(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    assert on_disk <= 4000


def test_zstd_compression(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=100, compression="zstd")
    assert store[250]["id"] == 250
    assert any(p.name.endswith(".zstd") for p in (tmp_path / "shards").iterdir())
    with pytest.raises(cachex.InvalidInputError):
        cachex.ShardStore(tmp_path / "x", records, compression="gzip")


def test_a_failing_source_raises_its_own_exception(tmp_path):
    def broken():
        yield {"id": 0}
        raise RuntimeError("decoder crashed")

    store = cachex.ShardStore(tmp_path, broken, max_shard_length=10)
    with pytest.raises(RuntimeError, match="decoder crashed"):
        store[5]


def test_a_corrupt_shard_without_a_source_is_an_error_and_with_one_is_regenerated(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=100)
    assert len(store) == 500
    del store
    shard = tmp_path / "shards" / "100.200.shard.pickle"
    shard.write_bytes(shard.read_bytes()[:50])
    with pytest.raises(cachex.CorruptError, match=r"100\.200"):
        cachex.ShardStore(tmp_path)[150]
    assert cachex.ShardStore(tmp_path, records, max_shard_length=100)[150]["id"] == 150


def _read_all(root, queue) -> None:
    store = cachex.ShardStore(root, records, max_shard_length=32)
    queue.put([store[i]["id"] for i in range(0, 500, 11)])


def test_two_processes_generate_one_root(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(tmp_path, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results == [list(range(0, 500, 11))] * 2


def test_pickled_handle_reopens_with_its_source(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=64)
    copy = pickle.loads(pickle.dumps(store))
    assert copy[77]["id"] == 77 and copy.max_shard_length == 64


def test_loadit_fixture_reads_as_written(fixture_copy, expected):
    want = expected["loadit"]
    root = fixture_copy(want["root"])
    store = cachex.ShardStore(root)
    assert len(store) == want["length"] and store.max_shard_length == want["max_shard_length"]
    for i, item in enumerate(want["items"]):
        got = store[i]
        raw = item.pop("raw_hex")
        assert got["raw"].hex() == raw
        assert {k: got[k] for k in item} == item


def _child_reads(store, queue) -> None:
    queue.put([store[i]["id"] for i in (0, 250, 499)])
    del store  # must not wait for the parent's worker threads


def test_a_forked_child_of_a_store_with_workers_reads_through_its_own_handle(tmp_path):
    store = cachex.ShardStore(tmp_path, records, max_shard_length=50, max_workers=3)
    assert store[10]["id"] == 10  # workers are running and preloading
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(store, queue))
    child.start()
    assert queue.get(timeout=60) == [0, 250, 499]
    child.join(timeout=60)
    assert child.exitcode == 0
    assert store[499]["id"] == 499
