"""cachex.MemmapWriter / MemmapArray / memmap_open_or_build: round trips,
resume, numpy.memmap interop, bad input, corruption, locking, views."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import pickle
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cachex
import procs

ARRAYS = {
    "data": ("int16", (3, 8)),
    "annotation": (np.int8, (3, 8)),
    "scaler": ("float32", (8,)),
    "mask": ("bool", (2,)),
    "half": (ml_dtypes.bfloat16, (4,)),
}


def row_values(i: int) -> dict[str, np.ndarray]:
    return {
        "data": (np.arange(24, dtype=np.int16).reshape(3, 8) * (i + 1)).astype(np.int16),
        "annotation": np.full((3, 8), i % 100, np.int8),
        "scaler": np.linspace(0, i, 8, dtype=np.float32),
        "mask": np.array([i % 2 == 0, True]),
        "half": np.arange(4).astype(ml_dtypes.bfloat16) + i,
    }


def write_cache(path, n: int = 10, finalize: bool = True) -> None:
    w = cachex.MemmapWriter(
        path, ARRAYS, sidecars=["speaker"], fingerprint={"run": 1}, sync_every=4
    )
    for i in range(n):
        w.write(f"src{i}", row_values(i), sidecars={"speaker": f"spk{i % 3}"}, meta={"i": i})
    if finalize:
        assert w.finalize() == n


def assert_same(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_rows_round_trip_with_index_sidecars_and_meta(tmp_path):
    write_cache(tmp_path)
    cache = cachex.MemmapArray(tmp_path)
    assert len(cache) == 10
    for i in range(10):
        row = cache.get_row(i)
        assert list(row) == list(ARRAYS)
        for name, want in row_values(i).items():
            assert_same(row[name], want)
        assert cache.source(i) == f"src{i}"
        assert cache.meta(i) == {"i": i}
        assert cache.sidecar("speaker", i) == f"spk{i % 3}"
    assert_same(cache.get(-1, "scaler"), row_values(9)["scaler"])
    assert cache.find("src7") == 7 and cache.find("nope") is None
    assert sorted(cache.sidecar_values("speaker")) == ["spk0", "spk1", "spk2"]
    index = cache.index()
    assert index[3] == {
        "row": 3,
        "source": "src3",
        "meta": {"i": 3},
        "sidecars": {"speaker": "spk0"},
    }
    table = cache.index_table()
    assert table.num_rows == 10 and table.column("source").to_pylist()[3] == "src3"
    assert cache.fingerprint == {"run": 1}
    assert cache.schema["arrays"]["data"] == {"dtype": "int16", "shape": (3, 8), "nullable": False}
    with pytest.raises(IndexError):
        cache.get_row(10)


def test_bin_files_read_with_numpy_memmap(tmp_path):
    write_cache(tmp_path)
    data = np.memmap(tmp_path / "data.bin", dtype="<i2", mode="r", shape=(10, 3, 8))
    for i in range(10):
        assert_same(np.asarray(data[i]), row_values(i)["data"])


def test_nullable_arrays_come_back_as_none(tmp_path):
    arrays = {"x": ("float32", (2,)), "y": ("int32", (3,))}
    w = cachex.MemmapWriter(tmp_path, arrays, nullable=["y"])
    w.write("a", {"x": np.ones(2, np.float32), "y": None})
    w.write("b", {"x": np.zeros(2, np.float32), "y": np.arange(3, dtype=np.int32)})
    w.finalize()
    cache = cachex.MemmapArray(tmp_path)
    assert cache.get_row(0)["y"] is None
    assert_same(cache.get_row(1)["y"], np.arange(3, dtype=np.int32))


def test_an_interrupted_build_resumes_after_its_committed_rows(tmp_path):
    write_cache(tmp_path, n=6, finalize=False)
    gc.collect()  # the first writer is dropped: its lock released
    w = cachex.MemmapWriter(tmp_path, ARRAYS, sidecars=["speaker"], fingerprint={"run": 1})
    done = set(w.resume_keys)
    assert done <= {f"src{i}" for i in range(6)} and {"src0", "src3"} <= done
    for i in range(10):
        if f"src{i}" not in done:
            w.write(f"src{i}", row_values(i), sidecars={"speaker": f"spk{i % 3}"}, meta={"i": i})
    w.finalize()
    cache = cachex.MemmapArray(tmp_path)
    sources = sorted(cache.source(i) for i in range(len(cache)))
    assert sources == sorted(f"src{i}" for i in range(10))
    for i in range(len(cache)):
        j = int(cache.source(i)[3:])
        assert_same(cache.get_row(i)["scaler"], row_values(j)["scaler"])


def test_wrong_shape_or_dtype_is_refused_and_nothing_written(tmp_path):
    w = cachex.MemmapWriter(tmp_path, {"x": ("float32", (4,))})
    w.write("ok", {"x": np.zeros(4, np.float32)})
    with pytest.raises(cachex.InvalidInputError, match="bad-shape"):
        w.write("bad-shape", {"x": np.zeros(5, np.float32)})
    with pytest.raises(cachex.InvalidInputError, match="bad-dtype"):
        w.write("bad-dtype", {"x": np.zeros(4, np.float64)})
    with pytest.raises(cachex.InvalidInputError, match="dtype"):
        w.write("complex", {"x": np.zeros(4, np.complex64)})
    with pytest.raises(cachex.InvalidInputError):
        w.write("missing", {})
    assert w.rows == 1
    assert w.finalize() == 1
    assert cachex.MemmapArray(tmp_path).source(0) == "ok"


def test_a_resume_with_another_schema_is_refused(tmp_path):
    write_cache(tmp_path, n=2, finalize=False)
    gc.collect()
    with pytest.raises(cachex.SchemaMismatchError):
        cachex.MemmapWriter(tmp_path, {"other": ("float32", (1,))}, fingerprint={"run": 1})


def test_views_outlive_the_reader_and_are_read_only(tmp_path):
    write_cache(tmp_path)
    cache = cachex.MemmapArray(tmp_path)
    rows = [cache.get_row(i)["data"] for i in range(10)]
    assert isinstance(rows[0].base, cachex.MappedValue)
    assert not rows[0].flags.writeable
    del cache
    gc.collect()
    for i, r in enumerate(rows):
        assert_same(r, row_values(i)["data"])


def test_load_in_memory_and_its_ram_guard(tmp_path):
    write_cache(tmp_path)
    cache = cachex.MemmapArray(tmp_path, load_in_memory=True)
    assert_same(cache.get_row(4)["data"], row_values(4)["data"])
    with pytest.raises(cachex.InvalidInputError, match="RAM"):
        cachex.MemmapArray(tmp_path, load_in_memory=True, ram_fraction=0.0)


def test_inspect_and_verify(tmp_path):
    write_cache(tmp_path)
    cache = cachex.MemmapArray(tmp_path)
    report = cache.inspect()
    assert report["complete"] and report["rows"] == 10
    assert {a["name"] for a in report["arrays"]} == set(ARRAYS)
    assert report["sidecars"][0]["unique_values"] == 3
    assert cache.verify()["problems"] == []
    with open(tmp_path / "data.bin", "ab") as f:
        f.write(b"\0" * 3)
    problems = cache.verify()["problems"]
    assert any(Path(p["path"]).name == "data.bin" for p in problems)
    with pytest.raises(cachex.CorruptError, match=r"data\.bin"):
        cachex.MemmapArray(tmp_path)


def test_an_incomplete_cache_does_not_open(tmp_path):
    write_cache(tmp_path, n=2, finalize=False)
    with pytest.raises(cachex.CacheError, match="_COMPLETE"):
        cachex.MemmapArray(tmp_path)


def test_a_second_writer_in_another_process_is_refused(tmp_path):
    w = cachex.MemmapWriter(tmp_path, {"x": ("float32", (1,))})
    code = (
        "import sys, cachex\n"
        "try:\n"
        "    cachex.MemmapWriter(sys.argv[1], {'x': ('float32', (1,))})\n"
        "except cachex.LockedError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert child.returncode == 3, child.stderr
    assert "lock" in child.stdout
    w.finalize()


def _row_sums(cache, queue) -> None:
    queue.put([int(cache.get_row(i)["data"].sum()) for i in range(len(cache))])


def test_forked_and_spawned_readers(tmp_path):
    write_cache(tmp_path)
    cache = cachex.MemmapArray(tmp_path)
    cache.get_row(0)  # maps data.bin before the fork
    want = [int(row_values(i)["data"].sum()) for i in range(10)]
    for ctx_name in ("fork", "spawn"):
        ctx = mp.get_context(ctx_name)
        queue = ctx.Queue()
        p = ctx.Process(target=_row_sums, args=(cache, queue))
        with procs.ended(p):
            p.start()
            assert queue.get(timeout=60) == want, ctx_name
        assert p.exitcode == 0
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.path == cache.path and len(copy) == 10


def test_open_or_build_builds_hits_and_rebuilds_a_stale_cache(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one")
    calls = []

    def build(writer):
        calls.append(len(writer.resume_keys))
        for i in range(5):
            writer.write(f"s{i}", {"x": np.full(3, i, np.float32)})

    args = dict(arrays={"x": ("float32", (3,))}, sources=[src / "a.txt"])
    cache, outcome = cachex.memmap_open_or_build(src, "feats", {"dim": 3}, build, **args)
    assert outcome == "cache built" and len(cache) == 5
    cache, outcome = cachex.memmap_open_or_build(src, "feats", {"dim": 3}, build, **args)
    assert outcome == "cache hit" and calls == [0]
    (src / "a.txt").write_text("changed!")
    cache, outcome = cachex.memmap_open_or_build(src, "feats", {"dim": 3}, build, **args)
    assert outcome.startswith("cache rebuilt (stale:") and "a.txt" in outcome
    assert_same(cache.get(2, "x"), np.full(3, 2, np.float32))
    # root/<name>/<key>: the layout cachex.open uses for the same name and config.
    assert cache.path.parent == src / "feats" and len(cache.path.name) == 16


def test_open_or_build_passes_the_build_functions_exception_and_closes_the_writer(tmp_path):
    kept = []

    def build(writer):
        kept.append(writer)
        writer.write("s0", {"x": np.zeros(1, np.float32)})
        raise RuntimeError("extractor failed")

    with pytest.raises(RuntimeError, match="extractor failed"):
        cachex.memmap_open_or_build(tmp_path, "feats", {"k": 1}, build, {"x": ("float32", (1,))})
    with pytest.raises(cachex.CacheError, match="closed"):
        kept[0].write("s1", {"x": np.zeros(1, np.float32)})


def test_meta_accepts_json_text_and_values(tmp_path):
    w = cachex.MemmapWriter(tmp_path, {"x": ("uint8", (1,))})
    w.write("a", {"x": np.zeros(1, np.uint8)}, meta=json.dumps({"k": [1, 2]}))
    w.write("b", {"x": np.zeros(1, np.uint8)}, meta={"k": "v"})
    with pytest.raises(cachex.InvalidInputError, match="JSON"):
        w.write("c", {"x": np.zeros(1, np.uint8)}, meta={"k": object()})
    w.finalize()
    cache = cachex.MemmapArray(tmp_path)
    assert cache.meta(0) == {"k": [1, 2]} and cache.meta(1) == {"k": "v"}
