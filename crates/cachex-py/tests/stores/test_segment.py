"""cachex.SegmentStore: round trips, reopen, peer fixtures, bad input,
corruption, locking across processes, forked readers and view lifetimes."""

from __future__ import annotations

import array
import gc
import multiprocessing as mp
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cachex
import procs
from fixture_values import TORCHCACHEX_MODULES, expected_value

ALL_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.uint32,
    np.int32,
    np.uint64,
    np.int64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
]


def sample(dtype, shape, seed: int) -> np.ndarray:
    """Values that use the dtype's whole bit pattern (so a lossy path shows)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    bits = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    out = bits.view(dt).reshape(shape)
    if dt.kind == "f" or dt == ml_dtypes.bfloat16:
        out = np.where(np.isnan(out.astype(np.float64)), dt.type(1.5), out).astype(dt)
    return out


def assert_same(got, want) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_exactly_across_reopen(tmp_path, dtype):
    values = {f"k{i}": sample(dtype, (3, 5), i) for i in range(10)}
    with cachex.SegmentStore(tmp_path, flush_every=4) as store:
        store.put_batch(values)
        store.flush()
    store = cachex.SegmentStore(tmp_path, read_only=True)
    got, missing = store.get_batch(list(values))
    assert missing == []
    for g, want in zip(got, values.values(), strict=True):
        assert_same(g, want)


@pytest.mark.parametrize("shape", [(), (0,), (7,), (2, 0, 3), (2, 3, 4, 5)])
def test_shapes_are_preserved(tmp_path, shape):
    store = cachex.SegmentStore(tmp_path)
    want = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    store.put_batch({"a": want})
    store.flush()
    store.close()
    got = cachex.SegmentStore(tmp_path).get("a")
    assert_same(got, want)


def test_dict_tuple_list_and_blob_records(tmp_path):
    cases = {
        "dict": {"features": np.ones(4, np.float32), "label": b"cat", "ids": np.arange(3)},
        "tuple": (np.zeros((2, 2), np.float64), np.array([True]), b"\x00\x01"),
        "list": [np.arange(5, dtype=np.int16), np.arange(2, dtype=np.uint64)],
        "blob": b"opaque \x00 bytes",
    }
    for name, value in cases.items():
        with cachex.SegmentStore(tmp_path / name) as store:
            store.put_batch([("x", value)])
        got = cachex.SegmentStore(tmp_path / name, read_only=True).get("x")
        assert type(got) is type(value), name
        if isinstance(value, dict):
            assert list(got) == list(value)
            for k in value:
                if isinstance(value[k], bytes):
                    assert got[k] == value[k]
                else:
                    assert_same(got[k], value[k])
        elif isinstance(value, bytes):
            assert got == value
        else:
            assert len(got) == len(value)
            for g, w in zip(got, value, strict=True):
                if isinstance(w, bytes):
                    assert g == w
                else:
                    assert_same(g, w)


def test_get_batch_reports_missing_positions_and_pending_reads(tmp_path):
    store = cachex.SegmentStore(tmp_path, flush_every=1000)
    store.put_batch({"a": np.ones(2), "b": np.zeros(2)})
    values, missing = store.get_batch(["x", "b", "y", "a"])
    assert missing == [0, 2]
    assert values[0] is None and values[2] is None
    assert_same(values[1], np.zeros(2))
    assert len(store) == 2
    assert "a" in store and "x" not in store
    assert store.stats()["pending"] == 2
    store.flush()
    assert store.stats()["segments"] == 1


def test_writes_accept_buffer_protocol_and_array_interface_objects(tmp_path):
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.arange(6, dtype=np.int64).reshape(2, 3)

    inputs = {
        "strided": (np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2], None),
        "array.array": (array.array("f", [1, 2, 3]), np.array([1, 2, 3], np.float32)),
        "memoryview": (memoryview(np.arange(4, dtype=np.int16)), np.arange(4, dtype=np.int16)),
        "__array__": (ArrayLike(), np.arange(6, dtype=np.int64).reshape(2, 3)),
    }
    for i, (name, (value, want)) in enumerate(inputs.items()):
        store = cachex.SegmentStore(tmp_path / str(i))
        store.put_batch({"x": value})
        want = np.ascontiguousarray(value) if want is None else want
        assert_same(store.get("x"), want), name


def test_returned_arrays_are_read_only_views_that_outlive_the_store(tmp_path):
    store = cachex.SegmentStore(tmp_path, lru_bytes=0)
    want = {f"k{i}": np.full((64,), i, np.float64) for i in range(32)}
    store.put_batch(want)
    store.flush()
    store.close()
    store = cachex.SegmentStore(tmp_path, lru_bytes=0, read_only=True)
    got, _ = store.get_batch(list(want))
    assert isinstance(got[0].base, cachex.MappedValue)
    assert not got[0].flags.writeable
    with pytest.raises(ValueError):
        got[0][0] = 1.0
    store.close()
    del store
    gc.collect()
    for g, (_, w) in zip(got, want.items(), strict=True):
        assert_same(g, w)
    assert_same(np.array(got[3]), want["k3"])


def test_schema_mismatch_writes_nothing_of_the_batch(tmp_path):
    store = cachex.SegmentStore(tmp_path)
    store.put_batch({"a": np.zeros((2, 3), np.float32)})
    bad_batches = [
        {"b": np.zeros((2, 3), np.float32), "c": np.zeros((2, 3), np.float64)},
        {"b": np.zeros((2, 3), np.float32), "c": np.zeros((2, 3, 1), np.float32)},
        {"b": np.zeros((2, 3), np.float32), "c": {"x": np.zeros(3, np.float32)}},
    ]
    for batch in bad_batches:
        with pytest.raises(cachex.SchemaMismatchError, match='"c"'):
            store.put_batch(batch)
        assert len(store) == 1
        assert store.get_batch(["b", "c"])[1] == [0, 1]
    store.flush()
    store.close()
    assert len(cachex.SegmentStore(tmp_path)) == 1


@pytest.mark.parametrize(
    "value",
    [np.zeros(3, np.complex64), np.zeros(3, ">f4"), np.array(["a", "b"]), np.zeros(2, object)],
    ids=["complex", "big-endian", "str", "object"],
)
def test_unsupported_dtypes_are_refused_with_the_dtype_named(tmp_path, value):
    store = cachex.SegmentStore(tmp_path)
    with pytest.raises(cachex.InvalidInputError, match="dtype"):
        store.put_batch({"ok": np.zeros(3, np.float32), "bad": value})
    assert len(store) == 0


def test_non_str_keys_and_read_only_puts_are_refused(tmp_path):
    store = cachex.SegmentStore(tmp_path)
    with pytest.raises(cachex.InvalidInputError, match="str"):
        store.put_batch({1: np.zeros(3)})
    assert isinstance(cachex.InvalidInputError("x"), ValueError)
    store.close()
    reader = cachex.SegmentStore(tmp_path, read_only=True)
    with pytest.raises(cachex.ReadOnlyError):
        reader.put_batch({"a": np.zeros(3)})


def test_closed_store_refuses_calls(tmp_path):
    store = cachex.SegmentStore(tmp_path)
    store.close()
    assert store.closed
    with pytest.raises(cachex.CacheError, match="closed"):
        store.get_batch(["a"])


def test_compact_verify_stats_inspect(tmp_path):
    store = cachex.SegmentStore(tmp_path, flush_every=5)
    for round_ in range(3):
        store.put_batch({f"k{i}": np.full(4, round_, np.int32) for i in range(10)})
    store.flush()
    before = store.stats()["segments"]
    report = store.compact()
    assert report["segments_before"] == before
    assert report["live_rows"] == 10 and report["dropped_rows"] == 20
    assert store.verify() == {"kind": "segment-store", "path": str(tmp_path), "problems": []}
    info = store.inspect()
    assert info["entries"] == 10 and info["structure"] == "tensor"
    assert "torch.int32" in str(info["schema"])
    assert sum(s["live_rows"] for s in info["segments"]) == 10
    assert_same(store.get("k7"), np.full(4, 2, np.int32))


def test_a_corrupt_segment_is_reported_and_its_keys_read_missing(tmp_path):
    with cachex.SegmentStore(tmp_path, flush_every=4) as store:
        store.put_batch({f"k{i}": np.full(256, i, np.float32) for i in range(8)})
    segments = sorted((tmp_path / "segments").glob("*.arrow"))
    assert len(segments) == 2
    raw = bytearray(segments[0].read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\xff" * 64
    segments[0].write_bytes(bytes(raw))
    store = cachex.SegmentStore(tmp_path, read_only=True)
    problems = store.verify()["problems"]
    assert problems, "a flipped segment must be reported"
    assert any(Path(p["path"]).name == segments[0].name for p in problems)
    values, _ = store.get_batch([f"k{i}" for i in range(8)])
    for i in range(4, 8):
        assert_same(values[i], np.full(256, i, np.float32))


def test_a_path_that_is_a_file_raises_an_io_error(tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_bytes(b"x")
    with pytest.raises(cachex.CacheIOError, match="not-a-dir"):
        cachex.SegmentStore(target)


def test_a_second_writer_in_another_process_is_refused(tmp_path):
    store = cachex.SegmentStore(tmp_path)
    store.put_batch({"a": np.zeros(2)})
    store.flush()
    code = (
        "import sys, cachex\n"
        "try:\n"
        "    cachex.SegmentStore(sys.argv[1])\n"
        "except cachex.LockedError as e:\n"
        "    print('locked:', e)\n"
        "    sys.exit(3)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert child.returncode == 3, child.stderr
    assert "segment-store.lock" in child.stdout
    reader = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, cachex; print(len(cachex.SegmentStore(sys.argv[1], read_only=True)))",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert reader.stdout.strip() == "1"
    store.close()
    cachex.SegmentStore(tmp_path).close()  # the lock was released


def _sum_in_child(store, keys, queue) -> None:
    values, missing = store.get_batch(keys)
    queue.put((missing, [float(v.sum()) for v in values]))


def test_forked_children_read_through_inherited_and_pickled_handles(tmp_path):
    store = cachex.SegmentStore(tmp_path, flush_every=16)
    store.put_batch({f"k{i}": np.full(100, i, np.float64) for i in range(64)})
    store.flush()
    keys = [f"k{i}" for i in range(0, 64, 3)]
    want = [100.0 * i for i in range(0, 64, 3)]
    for ctx_name in ("fork", "spawn"):
        ctx = mp.get_context(ctx_name)
        queue = ctx.Queue()
        children = [ctx.Process(target=_sum_in_child, args=(store, keys, queue)) for _ in range(2)]
        with procs.ended(*children):
            for p in children:
                p.start()
            results = [queue.get(timeout=60) for _ in children]
        assert [p.exitcode for p in children] == [0, 0], ctx_name
        assert results == [([], want)] * 2, ctx_name


def test_pickled_handle_reopens_read_only_with_its_options(tmp_path):
    store = cachex.SegmentStore(tmp_path, flush_every=7, lru_bytes=0)
    store.put_batch({"a": np.arange(3)})
    store.flush()
    copy = pickle.loads(pickle.dumps(store))
    assert copy.path == store.path
    assert copy.options == {**store.options, "read_only": True}
    assert_same(copy.get("a"), np.arange(3))
    assert not copy.is_writer


def test_threads_read_concurrently(tmp_path):
    store = cachex.SegmentStore(tmp_path, lru_bytes=0)
    store.put_batch({f"k{i}": np.full(512, i, np.float32) for i in range(500)})
    store.flush()
    errors: list[str] = []

    def reader(offset: int) -> None:
        for start in range(offset, 500, 50):
            keys = [f"k{i}" for i in range(start, min(start + 50, 500))]
            values, missing = store.get_batch(keys)
            if missing or any(float(v[0]) != int(k[1:]) for v, k in zip(values, keys, strict=True)):
                errors.append(f"thread {offset}: wrong values at {start}")

    threads = [threading.Thread(target=reader, args=(o,)) for o in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_bfloat16_falls_back_to_uint16_without_ml_dtypes(tmp_path):
    with cachex.SegmentStore(tmp_path) as store:
        bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)
        store.put_batch({"x": bits.view(ml_dtypes.bfloat16)})
    code = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None\n"
        "import cachex\n"
        "assert not cachex.bfloat16_is_native()\n"
        "s = cachex.SegmentStore(sys.argv[1], read_only=True)\n"
        "v = s.get('x')\n"
        "assert 'torch.bfloat16' in str(s.inspect()['schema'])\n"
        "print(v.dtype, v.tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "uint16 [16256, 16384, 49216]"


def assert_matches_expected(got, want) -> None:
    if isinstance(want, dict) and set(want) == {"dtype", "shape", "data"}:
        assert_same(got, expected_value(want))
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want)
        for k in want:
            assert_matches_expected(got[k], want[k])
    elif isinstance(want, list):
        assert isinstance(got, tuple | list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_matches_expected(g, w)
    else:
        # Non-tensor values are Python pickles written by torchcachex.
        assert isinstance(got, bytes)
        assert pickle.loads(got) == want


@pytest.mark.parametrize("module", TORCHCACHEX_MODULES)
def test_torchcachex_fixtures_read_as_written(fixture_copy, expected, module):
    path: Path = fixture_copy(f"torchcachex/{module}")
    want = expected["torchcachex"]["modules"][module]
    store = cachex.SegmentStore(path)
    values, missing = store.get_batch(list(want))
    assert missing == []
    for got, w in zip(values, want.values(), strict=True):
        assert_matches_expected(got, w)
    assert len(store) == len(want)


def _child_of_an_async_writer(store, queue) -> None:
    values, missing = store.get_batch(["flushed0", "flushed9", "pending0"])
    try:
        store.put_batch({"from_child": np.zeros(8, np.float32)})
        refused = False
    except cachex.ReadOnlyError:
        refused = True
    del store  # must not flush the parent's pending records from here
    gc.collect()
    queue.put((missing, [float(v[0]) for v in values if v is not None], refused))


def test_a_forked_child_of_an_async_writer_reads_and_leaves_the_parents_records_alone(tmp_path):
    store = cachex.SegmentStore(tmp_path, async_write=True, flush_every=1000)
    store.put_batch({f"flushed{i}": np.full(8, i, np.float32) for i in range(10)})
    store.flush()
    store.put_batch({f"pending{i}": np.full(8, 100 + i, np.float32) for i in range(5)})
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_of_an_async_writer, args=(store, queue))
    child.start()
    missing, firsts, refused = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    # The child reopened the directory read-only: flushed records only.
    assert missing == [2] and firsts == [0.0, 9.0] and refused
    store.flush()
    assert store.stats()["segments"] == 2
    store.close()
    reopened = cachex.SegmentStore(tmp_path, read_only=True)
    assert len(reopened) == 15 and reopened.verify()["problems"] == []
    assert "from_child" not in reopened
