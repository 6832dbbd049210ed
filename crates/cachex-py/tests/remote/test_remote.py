"""Caches in object storage from Python: every store and drop-in written
and read over ``s3://`` on the S3 test server (moto) and ``az://`` on the
Azure one (Azurite); every store read on ``gs://`` (fake-gcs-server, which
takes no upload of object_store's: published to ``file://`` and copied
there); every dataset over ``s3://``; each reader on a local tier of its
own (a fresh tier stands for another machine); a writer process publishing
while a reader process refreshes; DataLoader workers (fork,
spawn) over an ``s3://`` page file and segment store; no credential in
any message or repr."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest

import cachex
import procs
from cachex.loadit import LoadIt
from cachex.torch import datasets as data
from cachex.torchcachex import ArrowIPCCacheBackend

TORCH_REASON = "torch is not installed (scripts/test installs it)"
N = 48


def x_of(i: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + i


def squares():
    return ({"i": i, "sq": i * i} for i in range(N))


# --- a round trip per store -----------------------------------------------------


def test_segment_store_round_trip_and_refresh(remote):
    url = remote.url("features")
    with cachex.SegmentStore(url, **remote.tier("writer")) as w:
        assert w.url == url and w.path.is_dir()
        w.put_batch({f"k{i}": x_of(i) for i in range(N)})
        w.flush()
        reader = cachex.SegmentStore(url, read_only=True, **remote.tier("reader"))
        assert len(reader) == N
        values, missing = reader.get_batch(["k3", "nope", "k40"])
        assert missing == [1]
        np.testing.assert_array_equal(values[0], x_of(3))
        np.testing.assert_array_equal(values[2], x_of(40))
        w.put_batch({"late": x_of(99)})
        w.flush()
        assert "late" not in reader
        assert reader.refresh()["commits"] == 1
        np.testing.assert_array_equal(reader.get("late"), x_of(99))
    # close() published what the writer held: a cold tier sees everything.
    cold = cachex.SegmentStore(url, read_only=True, **remote.tier("cold"))
    assert len(cold) == N + 1
    copy = pickle.loads(pickle.dumps(cold))
    assert copy.url == url and len(copy) == N + 1


def test_shard_store_round_trip(remote):
    url = remote.url("squares")
    with cachex.ShardStore(url, squares, max_shard_length=10, **remote.tier("writer")) as w:
        w.wait_until_all_cached()
        assert len(w) == N
    reader = cachex.ShardStore(url, **remote.tier("reader"))
    assert reader.url == url and len(reader) == N
    assert reader[17] == {"i": 17, "sq": 289}
    assert reader.get_many([0, N - 1]) == [{"i": 0, "sq": 0}, {"i": N - 1, "sq": (N - 1) ** 2}]
    assert reader.refresh() == 0


def write_memmap(url: str, tier: dict) -> None:
    w = cachex.MemmapWriter(url, {"x": ("float32", (2, 3)), "i": ("int64", (1,))}, **tier)
    for i in range(N):
        w.write(f"s{i}", {"x": x_of(i), "i": np.array([i])}, meta={"i": i})
    assert w.finalize() == N


def test_memmap_round_trip(remote):
    url = remote.url("arrays")
    write_memmap(url, remote.tier("writer"))
    cache = cachex.MemmapArray(url, **remote.tier("reader"))
    assert cache.url == url and len(cache) == N
    np.testing.assert_array_equal(cache.get_row(5)["x"], x_of(5))
    np.testing.assert_array_equal(cache.get(-1, "x"), x_of(N - 1))
    out = {"x": np.zeros((3, 2, 3), np.float32)}
    cache.fill_batch([7, 30, 2], out)
    np.testing.assert_array_equal(out["x"], np.stack([x_of(7), x_of(30), x_of(2)]))
    assert cache.meta(9) == {"i": 9} and cache.source(9) == "s9"
    assert cache.verify()["problems"] == []
    with pytest.raises(cachex.InvalidInputError, match="load_in_memory"):
        cache.load_in_memory()
    cache.refresh()
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(cache)).get_row(8)["x"], x_of(8))


def write_pages(url: str, tier: dict) -> None:
    w = cachex.PageWriter(url, {"i": "int", "x": ("float32", (2, 3)), "blob": "bytes"}, **tier)
    w.write_many([{"i": i, "x": x_of(i), "blob": bytes([i]) * (i % 7)} for i in range(N)])
    assert w.finalize()["path"] == url


def test_page_round_trip(remote):
    url = remote.url("pages/data.pages")
    write_pages(url, remote.tier("writer"))
    reader = cachex.PageReader(url, **remote.tier("reader"))
    assert reader.url == url and len(reader) == N
    sample = reader.sample(11)
    assert sample["i"] == 11 and bytes(sample["blob"]) == bytes([11]) * 4
    np.testing.assert_array_equal(sample["x"], x_of(11))
    out = {"x": np.zeros((2, 2, 3), np.float32), "i": np.zeros(2, np.int64)}
    reader.fill_batch([40, 3], out)
    assert out["i"].tolist() == [40, 3]
    np.testing.assert_array_equal(out["x"][0], x_of(40))
    assert reader.verify()["problems"] == []
    reader.refresh()
    assert pickle.loads(pickle.dumps(reader)).sample(-1)["i"] == N - 1


def test_beton_round_trip(remote):
    url = remote.url("ffcv/data.beton")
    fields = {"label": "int", "x": ("float32", (2, 3))}
    cachex.write_beton(
        url, fields, [{"label": i, "x": x_of(i)} for i in range(N)], **remote.tier("w")
    )
    reader = cachex.BetonReader(url, **remote.tier("reader"))
    assert reader.url == url and len(reader) == N
    assert reader.sample(6)["label"] == 6
    np.testing.assert_array_equal(reader.sample(6)["x"], x_of(6))
    assert reader.verify()["problems"] == []
    assert pickle.loads(pickle.dumps(reader)).sample(-1)["label"] == N - 1


def test_memmap_open_or_build_round_trip(remote):
    url = remote.url("built")
    arrays = {"x": ("float32", (2, 3))}
    calls = []

    def build(w):
        calls.append(1)
        for i in range(N):
            w.write(f"s{i}", {"x": x_of(i)})

    cache, outcome = cachex.memmap_open_or_build(
        url, "feats", {"v": 1}, build, arrays, **remote.tier("builder")
    )
    assert "built" in outcome and len(cache) == N and calls == [1]
    # Another machine finds it published: a hit, nothing built.
    cache, outcome = cachex.memmap_open_or_build(
        url, "feats", {"v": 1}, build, arrays, **remote.tier("reader")
    )
    assert outcome == "cache hit" and calls == [1]
    assert cache.url is not None and cache.url.startswith(url + "/feats/")
    np.testing.assert_array_equal(cache.get_row(13)["x"], x_of(13))


def test_every_store_published_elsewhere_is_read_on_gcs(gcs, tmp_path):
    # Written to a file:// bucket, copied object by object onto the GCS
    # emulator (which takes no upload of object_store's), read on gs://.
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    local = {"tier_dir": str(tmp_path / "tier-writer"), "tier_budget": "1G"}

    def file_url(prefix: str) -> str:
        return f"file://{bucket}/{prefix}"

    with cachex.SegmentStore(file_url("features"), **local) as w:
        w.put_batch({f"k{i}": x_of(i) for i in range(N)})
    with cachex.ShardStore(file_url("squares"), squares, max_shard_length=10, **local) as w:
        w.wait_until_all_cached()
    write_memmap(file_url("arrays"), local)
    write_pages(file_url("pages/data.pages"), local)
    gcs.upload_tree(bucket)

    segments = cachex.SegmentStore(gcs.url("features"), read_only=True, **gcs.tier("r1"))
    assert len(segments) == N
    np.testing.assert_array_equal(segments.get("k40"), x_of(40))
    shards = cachex.ShardStore(gcs.url("squares"), **gcs.tier("r2"))
    assert len(shards) == N and shards[17] == {"i": 17, "sq": 289}
    arrays = cachex.MemmapArray(gcs.url("arrays"), **gcs.tier("r3"))
    assert len(arrays) == N
    np.testing.assert_array_equal(arrays.get_row(5)["x"], x_of(5))
    pages = cachex.PageReader(gcs.url("pages/data.pages"), **gcs.tier("r4"))
    assert len(pages) == N and pages.sample(11)["i"] == 11
    np.testing.assert_array_equal(pages.sample(11)["x"], x_of(11))


def test_page_url_must_name_a_file(s3):
    with pytest.raises(cachex.InvalidInputError, match="name a file"):
        cachex.PageReader(f"s3://{s3.bucket}", **s3.tier("reader"))


# --- cachex.open and the drop-ins -------------------------------------------------


def test_open_round_trip(remote):
    config = {"backend": "segment-store", "root": remote.url("facade"), "name": "embed"}
    cache = cachex.open({**config, "create_root": True}, **remote.tier("writer"))
    cache.put_batch({f"k{i}": x_of(i) for i in range(5)})
    cache.flush()
    del cache
    reader = cachex.open(config, **remote.tier("reader"))
    values, missing = reader.get_batch(["k4", "k9"])
    assert missing == [1]
    np.testing.assert_array_equal(values[0], x_of(4))
    writer = cachex.open(config, **remote.tier("writer"))
    writer.put_batch({"k9": x_of(9)})
    writer.flush()
    assert reader.get_batch(["k9"])[1] == [0]
    reader.refresh()
    np.testing.assert_array_equal(reader.get_batch(["k9"])[0][0], x_of(9))


def test_torchcachex_backend_round_trip(remote):
    url = remote.url("tcx")
    backend = ArrowIPCCacheBackend(url, "features_v1", async_write=False, **remote.tier("writer"))
    assert backend.url == f"{url}/features_v1"
    backend.put_batch({f"k{i}": x_of(i) for i in range(N)})
    backend.flush()
    assert url in repr(backend)
    backend.close()
    reader = ArrowIPCCacheBackend(url, "features_v1", lru_size=0, **remote.tier("reader"))
    assert reader.schema_path.is_file()
    values, missing = reader.get_batch(["k0", "absent", "k33"])
    assert missing == [1]
    np.testing.assert_array_equal(np.asarray(values[2]), x_of(33))


def test_ranks_write_one_url_cache(s3):
    from cachex.torch import rank_backend, refresh_backend

    url = s3.url("ranks")
    ranks = [
        rank_backend(url, "enc", rank=r, async_write=False, lru_size=0, **s3.tier(f"rank{r}"))
        for r in range(2)
    ]
    for r, backend in enumerate(ranks):
        backend.put_batch({f"r{r}-{i}": x_of(10 * r + i) for i in range(3)})
        backend.flush()
    for backend in ranks:
        refresh_backend(backend)
    for backend in ranks:
        values, missing = backend.get_batch(["r0-2", "r1-1"])
        assert missing == []
        np.testing.assert_array_equal(np.asarray(values[1]), x_of(11))
    for backend in ranks:
        backend.close()


def test_loadit_round_trip(remote):
    url = remote.url("loadit")
    with LoadIt(url, squares, max_shard_length=16, **remote.tier("writer")) as loader:
        loader.wait_until_all_cached()
    assert repr(loader) == f"LoadIt({url!r})"
    reader = LoadIt(url, None, **remote.tier("reader"))
    assert reader.url == url and len(reader) == N
    assert list(reader)[:3] == [{"i": i, "sq": i * i} for i in range(3)]
    assert reader[-1] == {"i": N - 1, "sq": (N - 1) ** 2}


def test_every_dataset_reads_a_url(s3):
    write_memmap(s3.url("arrays"), s3.tier("w1"))
    write_pages(s3.url("pages/data.pages"), s3.tier("w2"))
    keys = [f"k{i}" for i in range(N)]
    with cachex.SegmentStore(s3.url("segments"), **s3.tier("w3")) as w:
        w.put_batch({k: {"i": np.array([i]), "x": x_of(i)} for i, k in enumerate(keys)})
    with cachex.ShardStore(s3.url("shards"), squares, **s3.tier("w4")) as w:
        w.wait_until_all_cached()
    tier = s3.tier("readers")
    parts = {
        "memmap": data.MemmapDataset(s3.url("arrays"), **tier),
        "page": data.PageDataset(s3.url("pages/data.pages"), **tier),
        "segment": data.SegmentDataset(s3.url("segments"), keys, **tier),
    }
    for name, ds in parts.items():
        assert len(ds) == N, name
        batch = ds[[5, 0, 47]]
        np.testing.assert_array_equal(batch["x"], np.stack([x_of(5), x_of(0), x_of(47)]), name)
    shards = data.ShardDataset(s3.url("shards"), **tier)
    assert shards[[3, 4]]["sq"].tolist() == [9, 16]
    pages = data.PageDataset(s3.url("pages/data.pages"), **tier).iterable(8, seed=1)
    assert sorted(i for b in pages for i in b["i"].tolist()) == list(range(N))


# --- a writer process publishing while a reader process refreshes ---------------


def publish_rounds(url: str, tier: dict, rounds: int, published, go) -> None:
    with cachex.SegmentStore(url, **tier) as w:
        for r in range(rounds):
            w.put_batch({f"r{r}-{i}": np.full(3, 10 * r + i, np.int32) for i in range(4)})
            w.flush()
            published.put(r)
            go.get(timeout=120)


def refresh_rounds(url: str, tier: dict, rounds: int, published, go, seen) -> None:
    published.get(timeout=120)
    reader = cachex.SegmentStore(url, read_only=True, **tier)
    counts = [len(reader)]
    for _ in range(1, rounds):
        go.put(True)
        published.get(timeout=120)
        reader.refresh()
        counts.append(len(reader))
    last = reader.get(f"r{rounds - 1}-3")
    go.put(True)
    seen.put((counts, last.tolist()))


def test_writer_process_publishes_while_reader_process_refreshes(s3):
    ctx = mp.get_context("spawn")
    published, go, seen = ctx.Queue(), ctx.Queue(), ctx.Queue()
    url, rounds = s3.url("live"), 3
    writer = ctx.Process(
        target=publish_rounds, args=(url, s3.tier("writer"), rounds, published, go)
    )
    reader = ctx.Process(
        target=refresh_rounds, args=(url, s3.tier("reader"), rounds, published, go, seen)
    )
    with procs.ended(writer, reader):
        writer.start()
        reader.start()
        counts, last = seen.get(timeout=300)
    assert writer.exitcode == 0 and reader.exitcode == 0
    assert counts == [4, 8, 12]
    assert last == [23, 23, 23]


# --- DataLoader workers over s3:// -------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_read_every_sample_of_urls(s3, method):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    write_pages(s3.url("pages/data.pages"), s3.tier("w1"))
    keys = [f"k{i}" for i in range(N)]
    with cachex.SegmentStore(s3.url("segments"), **s3.tier("w2")) as w:
        w.put_batch({k: {"i": np.array([i]), "x": x_of(i)} for i, k in enumerate(keys)})
    tier = s3.tier("machine")
    for ds in (
        data.PageDataset(s3.url("pages/data.pages"), output="torch", **tier),
        data.SegmentDataset(s3.url("segments"), keys, output="torch", **tier),
    ):
        # The parent reads first, so that forked workers inherit open handles.
        assert int(np.asarray(ds[[1]]["i"]).ravel()[0]) == 1
        sampler = BatchSampler(SequentialSampler(range(N)), batch_size=5, drop_last=False)
        loader = DataLoader(
            ds, sampler=sampler, batch_size=None, num_workers=2, multiprocessing_context=method
        )
        seen = []
        for batch in loader:
            ids = batch["i"].reshape(-1).tolist()
            want = torch.from_numpy(np.stack([x_of(i) for i in ids]))
            assert torch.equal(batch["x"], want), (type(ds).__name__, ids)
            seen.extend(ids)
        assert sorted(seen) == list(range(N)), type(ds).__name__


# --- credentials ------------------------------------------------------------------

SECRET = "sEcReT-do-not-show-7f3a"


def test_credentials_never_in_messages_or_reprs(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    options = {**s3.options, "aws_session_token": SECRET}
    tier = {"tier_dir": str(s3.tmp / "tier-secret"), "storage_options": options}
    # A URL carrying credentials and a signed query: errors and reprs name
    # it without them.
    url = f"s3://AKIA:{SECRET}@{s3.bucket}/p?X-Amz-Signature={SECRET}"
    failing = (
        # no published root, and no source to make one
        lambda: cachex.ShardStore(url, **tier),
        # no finished cache there
        lambda: cachex.MemmapArray(url, **tier),
        # no such file
        lambda: cachex.PageReader(url.replace("/p?", "/p/data.pages?"), **tier),
        # an option the store does not know, whose value is a secret
        lambda: cachex.SegmentStore(
            url, **{**tier, "storage_options": {**options, "aws_no_such_option": SECRET}}
        ),
    )
    for make in failing:
        with pytest.raises(cachex.CacheError) as raised:
            make()
        text = f"{raised.value!s} {raised.value!r}"
        assert SECRET not in text and "AKIA" not in text, text
    # Stores that open show neither what they were given nor the environment's.
    with cachex.SegmentStore(url, **tier) as store:
        store.put_batch({"a": x_of(1)})
        reader = cachex.SegmentStore(url, read_only=True, **s3.tier("reader"))
        shown = f"{store!r} {store.url} {store.path} {reader!r} {reader.url}"
        assert "s3://" + s3.bucket + "/p" in shown
    cache = cachex.open({"backend": "segment-store", "root": url, "name": "n"}, **tier)
    shown += f" {cache.path}"
    assert SECRET not in shown and "AKIA" not in shown, shown


def test_tier_keywords_are_checked(s3):
    with pytest.raises(cachex.InvalidInputError, match="tier_budget"):
        cachex.SegmentStore(s3.url("p"), tier_budget="lots")
    with pytest.raises(cachex.InvalidInputError, match="storage_options"):
        cachex.SegmentStore(s3.url("p"), storage_options={"aws_endpoint": object()})
