"""cachex.ray: every sink's output read back by its source and by the store, value by value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ray_support import REPO, cachex_verify, require_ray, start_cluster

ray = require_ray()

import cachex  # noqa: E402
import cachex.ray as cray  # noqa: E402

N = 600
BLOCKS = 4


@pytest.fixture(scope="module", autouse=True)
def cluster():
    yield from start_cluster(ray, __name__)


def features(ids: np.ndarray) -> np.ndarray:
    return (ids[:, None] * 10 + np.arange(8)[None, :]).astype(np.float32)


def extract(batch: dict) -> dict:
    """A stand-in feature extractor (what ``map_batches`` runs on the cluster)."""
    ids = batch["id"]
    return {
        "key": np.array([f"sample_{i}" for i in ids], dtype=object),
        "value": features(ids),
        "label": (ids % 7).astype(np.int64),
        "score": ids.astype(np.float64) / 3,
        "name": np.array([f"n{i}".encode() * (1 + i % 3) for i in ids], dtype=object),
    }


def dataset(n: int = N, start: int = 0):
    """Rows ``start .. start + n`` of the extractor, in ``BLOCKS`` blocks (one write task each)."""
    return ray.data.range(n, override_num_blocks=BLOCKS).map_batches(
        lambda b: extract({"id": b["id"] + start})
    )


def test_segment_sink_single_tensor_round_trip(tmp_path):
    path = tmp_path / "cache"
    dataset().write_datasink(cray.SegmentSink(path, key_column="key", columns="value"))

    store = cachex.SegmentStore(path, read_only=True)
    keys = [f"sample_{i}" for i in range(N)]
    values, missing = store.get_batch(keys)
    assert missing == []
    want = features(np.arange(N))
    for i, v in enumerate(values):
        np.testing.assert_array_equal(v, want[i])
    assert len(store) == N
    assert not (path / ".staging").exists()
    cachex_verify(path)

    rows = cray.read_segments(path).take_all()
    assert sorted(r["key"] for r in rows) == sorted(keys)
    for r in rows:
        i = int(r["key"].split("_")[1])
        np.testing.assert_array_equal(r["value"], want[i])
        assert r["value"].dtype == np.float32

    some = keys[5:40]
    picked = cray.read_segments(path, keys=[*some, "absent"], override_num_blocks=3).take_all()
    assert sorted(r["key"] for r in picked) == sorted(some)
    for r in picked:
        np.testing.assert_array_equal(r["value"], want[int(r["key"].split("_")[1])])


def test_segment_sink_dict_records_round_trip(tmp_path):
    path = tmp_path / "cache"
    dataset().write_datasink(cray.SegmentSink(path, key_column="key", flush_every=64))
    info = cachex.SegmentStore(path, read_only=True).inspect()
    assert len(info["segments"]) > BLOCKS  # several segments per task
    cachex_verify(path)

    ds = cray.read_segments(path)
    assert ds.count() == N
    for r in ds.take_all():
        i = int(r["key"].split("_")[1])
        np.testing.assert_array_equal(r["value"], features(np.array([i]))[0])
        assert int(r["label"]) == i % 7
        assert float(r["score"]) == i / 3
        assert bytes(r["name"]) == f"n{i}".encode() * (1 + i % 3)


def test_second_commit_overwrites_and_adds(tmp_path):
    path = tmp_path / "cache"
    sink = lambda: cray.SegmentSink(path, key_column="key", columns="value")  # noqa: E731
    dataset().write_datasink(sink())
    # Keys N/2 .. 3N/2: half overwrite the first job's, half are new.
    dataset(N, N // 2).map_batches(
        lambda b: {"key": b["key"], "value": b["value"] + 0.5}
    ).write_datasink(sink())

    cachex_verify(path)
    rows = cray.read_segments(path, override_num_blocks=16).take_all()
    assert len(rows) == N + N // 2
    got = {r["key"]: r["value"] for r in rows}
    assert len(got) == len(rows)
    for i in range(N + N // 2):
        want = features(np.array([i]))[0] + (0.5 if i >= N // 2 else 0.0)
        np.testing.assert_array_equal(got[f"sample_{i}"], want)
    store = cachex.SegmentStore(path, read_only=True)
    assert len(store) == N + N // 2
    np.testing.assert_array_equal(store.get(f"sample_{N}"), features(np.array([N]))[0] + 0.5)


def test_page_sink_round_trip(tmp_path):
    path = tmp_path / "samples.pages"
    ds = dataset().map_batches(lambda b: {k: v for k, v in b.items() if k != "key"})
    ds.write_datasink(cray.PageSink(path, page_size=1 << 16))
    reader = cachex.PageReader(path)
    assert len(reader) == N
    assert reader.fields["label"] == "int" and reader.fields["name"] == "bytes"
    assert cachex.PageReader(path).verify()["problems"] == []

    rows = cray.read_pages(path, override_num_blocks=5).take_all()
    assert len(rows) == N
    seen = set()
    for r in rows:
        i = round(r["score"] * 3)
        seen.add(i)
        np.testing.assert_array_equal(r["value"], features(np.array([i]))[0])
        assert r["label"] == i % 7
        assert bytes(r["name"]) == f"n{i}".encode() * (1 + i % 3)
    assert seen == set(range(N))


def test_beton_sink_round_trip(tmp_path):
    path = tmp_path / "samples.beton"
    fields = {"label": "int", "score": "float", "value": ("<f4", [8]), "meta": "json"}
    ds = dataset().map_batches(
        lambda b: {
            "label": b["label"],
            "score": b["score"],
            "value": b["value"],
            "meta": np.array([json.dumps({"k": str(k)}) for k in b["key"]], dtype=object),
        }
    )
    ds.write_datasink(cray.PageSink(path, fields))
    assert cachex.BetonReader(path).verify()["problems"] == []
    reader = cachex.BetonReader(path)
    assert len(reader) == N
    rows = cray.read_pages(path, override_num_blocks=3).take_all()
    seen = set()
    for r in rows:
        i = round(r["score"] * 3)
        seen.add(i)
        np.testing.assert_array_equal(r["value"], features(np.array([i]))[0])
        assert r["label"] == i % 7
        assert json.loads(r["meta"]) == {"k": f"sample_{i}"}
    assert seen == set(range(N))


def test_memmap_sink_round_trip(tmp_path):
    path = tmp_path / "arrays"
    ds = dataset().map_batches(
        lambda b: {
            "key": b["key"],
            "value": b["value"].reshape(-1, 2, 4),
            "label": b["label"].astype(np.int16),
        }
    )
    ds.write_datasink(cray.MemmapSink(path, source_column="key"))
    cache = cachex.MemmapArray(path)
    assert len(cache) == N
    assert cachex.MemmapArray(path).verify()["problems"] == []
    for i in range(N):
        row = cache.find(f"sample_{i}")
        assert row is not None
        np.testing.assert_array_equal(
            cache.get(row, "value"), features(np.array([i]))[0].reshape(2, 4)
        )
        assert cache.get(row, "label") == i % 7

    rows = cray.read_memmap(path, override_num_blocks=4).take_all()
    assert len(rows) == N
    for r in rows:
        i = int(r["source"].split("_")[1])
        np.testing.assert_array_equal(r["value"], features(np.array([i]))[0].reshape(2, 4))
        assert r["label"] == i % 7
    assert {r["source"] for r in rows} == {f"sample_{i}" for i in range(N)}


def test_example_runs(tmp_path):
    """examples/python/ray_feature_cache.py, joined to this module's cluster."""
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    example = REPO / "examples" / "python" / "ray_feature_cache.py"
    run = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "features")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "2000 records cached" in run.stdout
    cachex_verify(tmp_path / "features")


def test_torchcachex_segments_are_refused_by_the_driver(fixture_copy):
    path = fixture_copy("torchcachex/tensor_f32")
    with pytest.raises(cachex.InvalidInputError, match="cachex_parts"):
        cray.read_segments(path)
