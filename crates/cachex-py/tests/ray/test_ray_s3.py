"""cachex.ray on ``s3://`` (the S3 test server): one commit per job, nothing
visible before it, nothing from a failed or retried task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ray_support import keyed_dataset, require_ray, start_cluster

ray = require_ray()

import cachex  # noqa: E402
import cachex.ray as cray  # noqa: E402
from cachex import _cachex  # noqa: E402
from cachex.ray._objects import Remote  # noqa: E402

N = 200
BLOCKS = 4


@pytest.fixture(scope="module", autouse=True)
def cluster():
    yield from start_cluster(ray, __name__)


def dataset(n: int = N, start: int = 0):
    return keyed_dataset(ray, n, start, BLOCKS)


def commits(s3, url: str) -> int:
    """The number of the cache's last commit."""
    return _cachex._staged_state(url, **s3.tier("state"))[0]


def check_store(store, ids: range) -> None:
    assert len(store) == len(ids)
    values, missing = store.get_batch([f"k{i}" for i in ids])
    assert missing == []
    for i, v in zip(ids, values, strict=True):
        np.testing.assert_array_equal(v, np.arange(i, i + 4, dtype=np.float32))


def rows_in_segments(store) -> int:
    return sum(s["rows"] for s in store.inspect()["segments"])


def flaky_sink(url: str, markers: Path, **kw):
    """A SegmentSink whose task 1 uploads a block's segment, then raises, on its
    first attempt only."""

    class FlakySink(cray.SegmentSink):
        def write(self, blocks, ctx):
            marker = markers / f"task-{ctx.task_idx}"
            if ctx.task_idx == 1 and not marker.exists():
                marker.touch()
                assert self.remote is not None
                # What the failed attempt uploads stays an object no commit names.
                super().write([next(iter(blocks))], ctx)
                raise RuntimeError("injected failure of a write task's first attempt")
            return super().write(blocks, ctx)

    return FlakySink(url, **kw)


def test_segment_sink_round_trip_is_one_commit_seen_on_refresh(s3):
    url = s3.url("features")
    # A reader opened before the job (on a cache with one record) sees the
    # job's records only once it refreshes, and then all of them.
    with cachex.SegmentStore(url, **s3.tier("seed")) as w:
        w.put_batch([("seed", np.zeros(4, dtype=np.float32))])
    reader = cachex.SegmentStore(url, read_only=True, **s3.tier("reader"))
    assert len(reader) == 1 and commits(s3, url) == 1

    dataset().write_datasink(
        cray.SegmentSink(url, key_column="key", columns="value", flush_every=16, **s3.tier("job"))
    )
    assert commits(s3, url) == 2, "the job is one commit"
    assert len(reader) == 1
    reader.refresh()
    assert len(reader) == N + 1
    values, missing = reader.get_batch([f"k{i}" for i in range(N)])
    assert missing == []
    for i, v in enumerate(values):
        np.testing.assert_array_equal(v, np.arange(i, i + 4, dtype=np.float32))
    reader.close()

    rows = cray.read_segments(url, **s3.tier("ray-read")).take_all()
    got = {r["key"]: r["value"] for r in rows}
    assert len(rows) == N + 1 and set(got) == {f"k{i}" for i in range(N)} | {"seed"}
    for i in range(N):
        np.testing.assert_array_equal(got[f"k{i}"], np.arange(i, i + 4, dtype=np.float32))

    some = [f"k{i}" for i in (0, 7, 199)] + ["absent"]
    rows = cray.read_segments(url, some, **s3.tier("ray-keys")).take_all()
    assert sorted(r["key"] for r in rows) == sorted(some[:3])
    for r in rows:
        i = int(r["key"][1:])
        np.testing.assert_array_equal(r["value"], np.arange(i, i + 4, dtype=np.float32))


def test_second_job_overwrites_and_reads_skip_dead_rows(s3):
    url = s3.url("twice")
    sink = dict(key_column="key", columns="value", flush_every=16, **s3.tier("job"))
    dataset().write_datasink(cray.SegmentSink(url, **sink))
    # Keys k100.. again, with new values (id + 1000 stored under k<id>).
    again = ray.data.range(N, override_num_blocks=BLOCKS).map_batches(
        lambda b: {
            "key": np.array([f"k{i}" for i in b["id"] + 100], dtype=object),
            "value": (b["id"][:, None] + 1100 + np.arange(4)[None, :]).astype(np.float32),
        }
    )
    again.write_datasink(cray.SegmentSink(url, **sink))
    assert commits(s3, url) == 2
    rows = cray.read_segments(url, **s3.tier("ray-read")).take_all()
    got = {r["key"]: r["value"] for r in rows}
    assert len(rows) == N + 100 == len(got)
    for i in range(N + 100):
        first = i if i < 100 else i + 1000
        np.testing.assert_array_equal(got[f"k{i}"], np.arange(first, first + 4, dtype=np.float32))


def test_retried_task_commits_every_key_once(s3, tmp_path):
    url, markers = s3.url("retried"), tmp_path / "markers"
    markers.mkdir()
    dataset().write_datasink(
        flaky_sink(url, markers, key_column="key", columns="value", flush_every=16, **s3.tier("j")),
        ray_remote_args={"max_retries": 2, "retry_exceptions": True},
    )
    assert (markers / "task-1").exists(), "the injected failure did not run"
    assert commits(s3, url) == 1
    with cachex.SegmentStore(url, read_only=True, **s3.tier("reader")) as reader:
        check_store(reader, range(N))
        assert rows_in_segments(reader) == N
        assert reader.verify()["problems"] == []


def test_driver_dying_before_the_commit_leaves_the_last_commit(s3, monkeypatch):
    url = s3.url("crashed")
    sink = dict(key_column="key", columns="value", **s3.tier("job"))
    dataset().write_datasink(cray.SegmentSink(url, **sink))

    def die(self):
        raise SystemExit("the driver dies with the commit decided, not claimed")

    monkeypatch.setattr(Remote, "_before_commit", die)
    with pytest.raises(BaseException, match="the driver dies"):
        dataset(N, N).write_datasink(cray.SegmentSink(url, **sink))
    monkeypatch.undo()
    assert commits(s3, url) == 1
    with cachex.SegmentStore(url, read_only=True, **s3.tier("reader")) as reader:
        check_store(reader, range(N))
        assert reader.get_batch([f"k{N}"])[1] == [0]


def test_a_commit_taken_meanwhile_is_decided_again(s3, monkeypatch):
    url = s3.url("raced")
    taken = []

    def another_writer_publishes_first(self):
        # Between the job's decision and its claim, another writer publishes.
        if not taken:
            taken.append(True)
            with cachex.SegmentStore(url, **s3.tier("other")) as other:
                other.put_batch([("other", np.ones(4, dtype=np.float32))])

    monkeypatch.setattr(Remote, "_before_commit", another_writer_publishes_first)
    dataset().write_datasink(
        cray.SegmentSink(url, key_column="key", columns="value", flush_every=64, **s3.tier("job"))
    )
    assert taken and commits(s3, url) == 2
    with cachex.SegmentStore(url, read_only=True, **s3.tier("reader")) as reader:
        assert len(reader) == N + 1
        np.testing.assert_array_equal(reader.get("other"), np.ones(4, dtype=np.float32))
        values, missing = reader.get_batch([f"k{i}" for i in range(N)])
        assert missing == []
        for i, v in enumerate(values):
            np.testing.assert_array_equal(v, np.arange(i, i + 4, dtype=np.float32))
        assert reader.verify()["problems"] == []


def test_recover_segments_has_nothing_to_do_on_a_url(s3):
    assert cray.recover_segments(s3.url("nothing")) == []


def samples(n: int, shift: float):
    return ray.data.range(n, override_num_blocks=BLOCKS).map_batches(
        lambda b: {
            "label": b["id"].astype(np.int64),
            "vec": (b["id"][:, None] + shift + np.arange(3)[None, :]).astype(np.float32),
            "name": np.array([f"n{i}".encode() * (1 + i % 3) for i in b["id"]], dtype=object),
        }
    )


def check_pages(rows: list[dict], n: int, shift: float) -> None:
    assert len(rows) == n
    assert sorted(int(r["label"]) for r in rows) == list(range(n))
    for r in rows:
        i = int(r["label"])
        np.testing.assert_array_equal(r["vec"], i + shift + np.arange(3, dtype=np.float32))
        assert bytes(r["name"]) == f"n{i}".encode() * (1 + i % 3)


def reader_rows(reader) -> list[dict]:
    return [reader.sample(i) for i in range(len(reader))]


def test_page_sink_round_trip_and_overwrite_seen_on_refresh(s3):
    url = s3.url("pages/data.pages")
    samples(N, 0.0).write_datasink(cray.PageSink(url, page_size=1 << 16, **s3.tier("job")))
    assert commits(s3, url.rsplit("/", 1)[0]) == 1
    check_pages(cray.read_pages(url, override_num_blocks=3, **s3.tier("ray")).take_all(), N, 0.0)
    reader = cachex.PageReader(url, **s3.tier("reader"))
    check_pages(reader_rows(reader), N, 0.0)

    with pytest.raises(Exception, match="exists"):
        samples(10, 1.0).write_datasink(cray.PageSink(url, **s3.tier("job")))
    samples(N // 2, 0.5).write_datasink(cray.PageSink(url, overwrite=True, **s3.tier("job")))
    assert commits(s3, url.rsplit("/", 1)[0]) == 2
    check_pages(reader_rows(reader), N, 0.0)
    reader.refresh()
    check_pages(reader_rows(reader), N // 2, 0.5)


def test_beton_sink_round_trip(s3):
    url = s3.url("ffcv/data.beton")
    fields = {"label": "int", "vec": ("<f4", [3]), "name": "bytes"}
    samples(N, 0.0).write_datasink(cray.PageSink(url, fields, **s3.tier("job")))
    check_pages(cray.read_pages(url, override_num_blocks=2, **s3.tier("ray")).take_all(), N, 0.0)


def test_memmap_sink_round_trip_is_one_commit_written_once(s3, tmp_path, monkeypatch):
    url = s3.url("arrays")
    ds = ray.data.range(N, override_num_blocks=BLOCKS).map_batches(
        lambda b: {
            "key": np.array([f"s{i}" for i in b["id"]], dtype=object),
            "value": (b["id"][:, None, None] + np.arange(8).reshape(1, 2, 4)).astype(np.float32),
            "tag": np.array([f"t{i % 3}" for i in b["id"]], dtype=object),
        }
    )

    # A driver that dies before the commit leaves the URL without a cache.
    def die(self):
        raise SystemExit("the driver dies with the commit decided, not claimed")

    monkeypatch.setattr(Remote, "_before_commit", die)
    with pytest.raises(BaseException, match="the driver dies"):
        ds.write_datasink(
            cray.MemmapSink(url, source_column="key", sidecar_columns=["tag"], **s3.tier("job"))
        )
    monkeypatch.undo()
    assert commits(s3, url) == 0

    ds.write_datasink(
        cray.MemmapSink(url, source_column="key", sidecar_columns=["tag"], **s3.tier("job"))
    )
    assert commits(s3, url) == 1
    cache = cachex.MemmapArray(url, **s3.tier("reader"))
    assert len(cache) == N
    for i in range(N):
        row = cache.find(f"s{i}")
        assert row is not None
        np.testing.assert_array_equal(
            cache.get(row, "value"), i + np.arange(8, dtype=np.float32).reshape(2, 4)
        )
        assert cache.sidecar("tag", row) == f"t{i % 3}"

    rows = cray.read_memmap(url, override_num_blocks=3, **s3.tier("ray")).take_all()
    assert sorted(r["source"] for r in rows) == sorted(f"s{i}" for i in range(N))
    for r in rows:
        i = int(r["source"][1:])
        np.testing.assert_array_equal(r["value"], i + np.arange(8, dtype=np.float32).reshape(2, 4))

    with pytest.raises(Exception, match="holds a cache"):
        ds.write_datasink(cray.MemmapSink(url, source_column="key", **s3.tier("job")))


def test_failed_job_leaves_nothing_visible(s3, tmp_path):
    url, markers = s3.url("failed"), tmp_path / "markers"
    markers.mkdir()
    with pytest.raises(Exception, match="injected failure"):
        dataset().write_datasink(
            flaky_sink(url, markers, key_column="key", columns="value", **s3.tier("job")),
            ray_remote_args={"max_retries": 0},
        )
    assert commits(s3, url) == 0


def test_retried_page_task_commits_every_sample_once(s3, tmp_path):
    url, markers = s3.url("pages/retried.pages"), tmp_path / "markers"
    markers.mkdir()

    class FlakyPages(cray.PageSink):
        def write(self, blocks, ctx):
            marker = markers / f"task-{ctx.task_idx}"
            if ctx.task_idx == 2 and not marker.exists():
                marker.touch()
                super().write([next(iter(blocks))], ctx)  # uploads a part no commit names
                raise RuntimeError("injected failure of a write task's first attempt")
            return super().write(blocks, ctx)

    samples(N, 0.0).write_datasink(
        FlakyPages(url, **s3.tier("job")),
        ray_remote_args={"max_retries": 2, "retry_exceptions": True},
    )
    assert (markers / "task-2").exists(), "the injected failure did not run"
    assert commits(s3, url.rsplit("/", 1)[0]) == 1
    check_pages(reader_rows(cachex.PageReader(url, **s3.tier("reader"))), N, 0.0)
