"""``cachex.torchcachex.ArrowIPCCacheBackend`` used the way torchcachex users use it.

These run with numpy alone and with torch installed (values are then torch
tensors); ``as_np`` compares either way.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing as mp
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cachex
from cachex.torchcachex import ArrowIPCCacheBackend

try:
    import torch
except ImportError:
    torch = None

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 round trips need ml_dtypes")


def as_np(v):
    """A returned value (torch tensor or numpy array) as numpy."""
    if torch is not None and isinstance(v, torch.Tensor):
        if v.dtype == torch.bfloat16:
            return v.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return v.numpy()
    assert isinstance(v, np.ndarray)
    return v


def same(got, want: np.ndarray) -> None:
    g = as_np(got)
    assert g.dtype == want.dtype and g.shape == want.shape
    assert g.tobytes() == want.tobytes()


def backend(tmp_path, **kw) -> ArrowIPCCacheBackend:
    return ArrowIPCCacheBackend(tmp_path, "features_v1", **kw)


def test_constructor_keeps_torchcachex_names_and_defaults():
    params = inspect.signature(ArrowIPCCacheBackend).parameters
    defaults = {n: p.default for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD}
    assert defaults == {
        "cache_dir": inspect.Parameter.empty,
        "module_id": inspect.Parameter.empty,
        "lru_size": 4096,
        "async_write": True,
        "max_workers": 2,
        "flush_every": 2048,
        "writer_rank": 0,
        "current_rank": None,
    }


def test_layout_is_torchcachex_s(tmp_path):
    b = backend(tmp_path)
    b.put_batch({"s0": np.ones(4, np.float32)})
    b.flush()
    root = tmp_path / "features_v1"
    assert b.cache_dir == root and b.segments_dir == root / "segments"
    assert [p.name for p in (root / "segments").iterdir()] == ["segment_000000.arrow"]
    assert (root / "schema.json").is_file()


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", [*DTYPES, "bfloat16"])
def test_every_torchcachex_dtype_and_bfloat16_round_trip_across_reopen(tmp_path, dtype):
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    want = {f"k{i}": (np.arange(12) % 3 + i).astype(dt).reshape(3, 4) for i in range(5)}
    b = backend(tmp_path)
    if torch is not None:
        b.put_batch(
            {
                k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
                if dtype == "bfloat16"
                else torch.from_numpy(v)
                for k, v in want.items()
            }
        )
    else:
        b.put_batch(want)
    b.close()
    values, missing = backend(tmp_path).get_batch(list(want))
    assert missing == []
    for got, w in zip(values, want.values(), strict=True):
        same(got, w)


def test_values_read_from_disk_are_writable_copies(tmp_path):
    b = backend(tmp_path, lru_size=0)
    b.put_batch({f"k{i}": np.full(8, i, np.float32) for i in range(4)})
    b.flush()
    values, _ = b.get_batch(["k0", "k1"])
    v0 = as_np(values[0])
    v0[:] = 99  # must not reach the file or the other values
    assert as_np(values[1])[0] == 1
    again, _ = b.get_batch(["k0"])
    assert as_np(again[0])[0] == 0


def test_structures_dict_tuple_list_and_pickled_objects(tmp_path):
    cases = {
        "dict": lambda i: {"features": np.full(3, i, np.float32), "label": f"cat{i}", "n": i},
        "tuple": lambda i: (np.full(2, i, np.int64), {"meta": i}),
        "list": lambda i: [np.full(2, i, np.float16), np.full(1, i, np.uint8)],
        "blob": lambda i: {"not", "a", "tensor", i},
    }
    for name, make in cases.items():
        b = ArrowIPCCacheBackend(tmp_path, name)
        b.put_batch({f"s{i}": make(i) for i in range(3)})
        b.close()
        values, missing = ArrowIPCCacheBackend(tmp_path, name).get_batch(["s0", "s2"])
        assert missing == []
        for i, got in zip((0, 2), values, strict=True):
            want = make(i)
            if name == "dict":
                same(got["features"], want["features"])
                assert (got["label"], got["n"]) == (want["label"], want["n"])
            elif name == "tuple":
                assert isinstance(got, tuple)
                same(got[0], want[0])
                assert got[1] == want[1]
            elif name == "list":
                assert isinstance(got, list)
                same(got[0], want[0])
                same(got[1], want[1])
            else:
                assert got == want


def test_partial_hits_report_missing_positions_in_input_order(tmp_path):
    b = backend(tmp_path, lru_size=0)
    b.put_batch({"a": np.zeros(2, np.float32), "c": np.ones(2, np.float32)})
    values, missing = b.get_batch(["x", "a", "y", "c"])
    assert missing == [0, 2]
    assert values[0] is None and values[2] is None
    same(values[1], np.zeros(2, np.float32))
    same(values[3], np.ones(2, np.float32))


def test_non_str_keys_are_their_str(tmp_path):
    b = backend(tmp_path)
    b.put_batch({7: np.zeros(1, np.float32), np.int64(8): np.ones(1, np.float32)})
    b.close()
    values, missing = backend(tmp_path).get_batch(["7", 8])
    assert missing == []
    same(values[1], np.ones(1, np.float32))


def test_async_flush_waits_for_every_queued_write(tmp_path):
    b = backend(tmp_path, async_write=True, flush_every=10, max_workers=1)
    for start in range(0, 200, 25):
        b.put_batch({f"k{i}": np.full(16, i, np.float32) for i in range(start, start + 25)})
    b.flush()
    # Another process sees every value the moment flush returned.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import cachex
            s = cachex.SegmentStore({str(b.cache_dir)!r}, read_only=True)
            values, missing = s.get_batch([f"k{{i}}" for i in range(200)])
            assert missing == [], missing
            assert all(int(v[0]) == i for i, v in enumerate(values))
            print(len(s))
        """),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "200"


def test_lru_is_bounded_by_count_and_returns_the_cached_object(tmp_path):
    b = backend(tmp_path, lru_size=4)
    b.put_batch({f"k{i}": np.full(2, i, np.float32) for i in range(10)})
    assert len(b.lru) <= 4 and "k9" in b.lru and "k0" not in b.lru
    first, _ = b.get_batch(["k0"])  # from disk, then kept
    again, _ = b.get_batch(["k0"])
    assert first[0] is again[0]
    rng = np.random.default_rng(0)
    for _ in range(50):
        keys = [f"k{i}" for i in rng.integers(0, 10, 3)]
        values, missing = b.get_batch(keys)
        assert missing == [] and len(b.lru) <= 4
        for k, v in zip(keys, values, strict=True):
            assert float(as_np(v)[0]) == int(k[1:])
    recent = [f"k{i}" for i in rng.integers(0, 10, 2)]
    b.get_batch(recent)
    assert all(k in b.lru for k in recent)  # the most recently used stay


def test_lru_size_zero_keeps_nothing_in_memory(tmp_path):
    # torchcachex 0.2.0 kept every value in an unbounded dict here.
    b = backend(tmp_path, lru_size=0)
    b.put_batch({f"k{i}": np.full(2, i, np.float32) for i in range(50)})
    _, missing = b.get_batch([f"k{i}" for i in range(50)])
    assert missing == [] and len(b.lru) == 0


def test_rank_from_the_environment_and_non_writer_ranks_only_fill_their_lru(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    b = backend(tmp_path)
    assert b.current_rank == 1 and not b.is_writer
    b.put_batch({"k": np.ones(3, np.float32)})
    b.flush()
    _, missing = b.get_batch(["k"])
    assert missing == []  # from its LRU
    assert list(tmp_path.rglob("*.arrow")) == []
    b.close()
    monkeypatch.setenv("RANK", "0")
    writer = backend(tmp_path)
    assert writer.is_writer
    _, missing = writer.get_batch(["k"])
    assert missing == [0]


def test_explicit_current_rank_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    b = backend(tmp_path, writer_rank=3, current_rank=0)
    assert not b.is_writer
    b2 = ArrowIPCCacheBackend(tmp_path, "other", writer_rank=3)
    assert b2.is_writer


def test_schema_drift_raises_and_writes_nothing_of_the_batch(tmp_path):
    # torchcachex 0.2.0 cast such values silently.
    b = backend(tmp_path, lru_size=0)
    b.put_batch({"a": np.zeros(4, np.float32)})
    with pytest.raises(cachex.SchemaMismatchError):
        b.put_batch({"b": np.zeros(4, np.float32), "c": np.zeros(4, np.float64)})
    with pytest.raises(cachex.SchemaMismatchError):
        b.put_batch({"d": {"x": np.zeros(4, np.float32)}})
    b.close()
    _, missing = backend(tmp_path).get_batch(["a", "b", "c", "d"])
    assert missing == [1, 2, 3]


SHAPES = [(), (3,), (2, 3), (1, 2, 2), (0, 4), (5,)]


@pytest.mark.parametrize(
    "make",
    [
        lambda shape, i: np.full(shape, i, np.float32),
        lambda shape, i: {"x": np.full(shape, i, np.int16), "y": np.arange(i + 1), "tag": i},
        lambda shape, i: (np.full(shape, i, np.float64), np.ones(shape[::-1], np.uint8)),
    ],
    ids=["tensor", "dict", "tuple"],
)
def test_values_of_different_ranks_and_shapes_share_one_cache(tmp_path, make):
    # torchcachex stores a shape per row: any shapes share its caches.
    b = backend(tmp_path, lru_size=0, flush_every=2)
    items = {f"k{i}": make(shape, i) for i, shape in enumerate(SHAPES)}
    b.put_batch(dict(list(items.items())[:1]))  # the first value fixes the schema
    with pytest.raises(cachex.LockedError):
        backend(tmp_path)  # the store reopened on it holds the writer lock still
    b.put_batch(dict(list(items.items())[1:3]))  # a batch of two ranks
    b.put_batch(dict(list(items.items())[3:]))
    b.close()
    b = backend(tmp_path, lru_size=0)
    b.put_batch({"after_reopen": make((2, 2, 2, 2), 9)})
    items["after_reopen"] = make((2, 2, 2, 2), 9)
    values, missing = b.get_batch(list(items))
    assert missing == []
    for got, want in zip(values, items.values(), strict=True):
        if isinstance(want, np.ndarray):
            same(got, want)
        elif isinstance(want, dict):
            same(got["x"], want["x"])
            same(got["y"], want["y"])
            assert got["tag"] == want["tag"]
        else:
            same(got[0], want[0])
            same(got[1], want[1])
    b.close()
    assert b.store.closed
    store = cachex.SegmentStore(tmp_path / "features_v1", read_only=True)
    assert store.verify()["problems"] == []


def stored_parts(root) -> list[dict]:
    """segment-store's description of each part, from ``schema.json``."""
    schema = json.loads((root / "schema.json").read_text())
    return json.loads(schema["metadata"]["cachex_parts"])


def test_a_cache_whose_schema_fixes_ranks_takes_other_ranks_through_the_drop_in(tmp_path):
    # segment-store fixes ranks from the first value (an older drop-in's
    # caches have them in schema.json): the drop-in lifts that.
    store = cachex.SegmentStore(tmp_path / "features_v1")
    store.put_batch({"old": np.ones((2, 3), np.float32)})
    with pytest.raises(cachex.SchemaMismatchError, match="rank"):
        store.put_batch({"flat": np.ones(4, np.float32)})
    store.close()
    assert "rank" in stored_parts(tmp_path / "features_v1")[0]
    b = backend(tmp_path, lru_size=0)
    b.put_batch({"flat": np.arange(4, dtype=np.float32)})
    b.flush()
    values, missing = b.get_batch(["old", "flat"])
    assert missing == []
    same(values[0], np.ones((2, 3), np.float32))
    same(values[1], np.arange(4, dtype=np.float32))
    # The dtype stays fixed.
    with pytest.raises(cachex.SchemaMismatchError):
        b.put_batch({"wide": np.ones(4, np.float64)})
    b.close()
    assert "rank" not in stored_parts(tmp_path / "features_v1")[0]


@pytest.mark.parametrize(
    ("first", "later"),
    [
        (
            {"x": np.ones(2, np.float32), "extra": 1},
            {"x": np.zeros(3, np.float32), "extra": np.ones(2)},
        ),
        ((np.ones(2, np.int8), "label"), (np.ones((1, 1), np.int8), np.arange(3))),
        ("a str: the whole value is pickled", np.arange(4)),
    ],
    ids=["dict", "tuple", "whole"],
)
def test_an_array_where_the_schema_holds_a_blob_is_pickled_as_torchcachex_does(
    tmp_path, first, later
):
    # torchcachex pickles whatever its schema does not hold as a tensor.
    b = backend(tmp_path, lru_size=0)
    b.put_batch({"first": first})
    b.put_batch({"later": later})
    b.close()
    values, missing = backend(tmp_path).get_batch(["first", "later"])
    assert missing == []
    got, want = values[1], later
    if isinstance(want, dict):
        same(got["x"], want["x"])
        assert isinstance(got["extra"], np.ndarray) and np.array_equal(got["extra"], want["extra"])
    elif isinstance(want, tuple):
        same(got[0], want[0])
        assert isinstance(got[1], np.ndarray) and np.array_equal(got[1], want[1])
    else:
        assert isinstance(got, np.ndarray) and np.array_equal(got, want)


def test_an_unstorable_first_value_is_refused_and_fixes_no_schema(tmp_path):
    b = backend(tmp_path, lru_size=0)
    with pytest.raises(cachex.InvalidInputError):
        b.put_batch({"c": np.ones(2, np.complex64)})
    assert not (tmp_path / "features_v1" / "schema.json").exists()
    b.put_batch({"a": np.ones((1, 2), np.int8)})
    b.put_batch({"b": np.ones(3, np.int8)})
    b.close()
    values, missing = backend(tmp_path).get_batch(["a", "b", "c"])
    assert missing == [2]
    same(values[1], np.ones(3, np.int8))


def _hold_writer(root, ready, done) -> None:
    b = ArrowIPCCacheBackend(root, "features_v1")
    ready.set()
    done.wait(60)
    b.close()


def test_a_second_writer_process_is_refused_not_clobbered(tmp_path):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_writer, args=(tmp_path, ready, done))
    p.start()
    try:
        assert ready.wait(60)
        with pytest.raises(cachex.LockedError):
            backend(tmp_path)
    finally:
        done.set()
        p.join(60)
    assert p.exitcode == 0


def test_writer_id_lets_several_writers_share_one_cache(tmp_path):
    w0 = backend(tmp_path, writer_id=0, async_write=False)
    w1 = backend(tmp_path, writer_id=1, async_write=False)
    w0.put_batch({f"a{i}": np.full(2, i, np.float32) for i in range(10)})
    w1.put_batch({f"b{i}": np.full(2, -i, np.float32) for i in range(10)})
    w0.close()
    w1.close()
    reader = cachex.SegmentStore(tmp_path / "features_v1", read_only=True)
    _, missing = reader.get_batch([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])
    assert missing == []
    assert len({p.name for p in (tmp_path / "features_v1" / "segments").iterdir()}) == 2


def test_writers_sharing_a_cache_write_values_of_different_ranks(tmp_path):
    # Both open before any schema exists; the second adopts the first's.
    w0 = backend(tmp_path, writer_id=0, async_write=False, lru_size=0)
    w1 = backend(tmp_path, writer_id=1, async_write=False, lru_size=0)
    w0.put_batch({"flat": np.ones(3, np.float32)})
    w1.put_batch({"square": np.ones((2, 2), np.float32)})
    w0.put_batch({"cube": np.ones((1, 1, 1), np.float32)})
    with pytest.raises(cachex.SchemaMismatchError):
        w1.put_batch({"ints": np.ones(3, np.int32)})
    w0.close()
    w1.close()
    values, missing = backend(tmp_path, lru_size=0).get_batch(["flat", "square", "cube"])
    assert missing == [] and [as_np(v).shape for v in values] == [(3,), (2, 2), (1, 1, 1)]


def test_with_block_and_close_flush(tmp_path):
    with backend(tmp_path, flush_every=1000) as b:
        b.put_batch({"k": np.arange(3, dtype=np.int32)})
    values, missing = backend(tmp_path).get_batch(["k"])
    assert missing == []
    same(values[0], np.arange(3, dtype=np.int32))


def _forked_child(b, queue) -> None:
    _, missing = b.get_batch(["flushed", "only_in_child"])
    b.put_batch({"only_in_child": np.ones(2, np.float32)})
    _, missing2 = b.get_batch(["only_in_child"])
    queue.put((missing, missing2, b.is_writer))


def test_a_forked_child_reads_and_its_puts_stay_in_its_lru(tmp_path):
    b = backend(tmp_path)
    b.put_batch({"flushed": np.zeros(2, np.float32)})
    b.flush()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(b, queue))
    child.start()
    missing, missing2, child_writer = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert missing == [1] and missing2 == [] and not child_writer
    b.close()
    _, missing = backend(tmp_path).get_batch(["only_in_child"])
    assert missing == [0]


def test_numpy_only_backend_and_a_typed_error_for_the_decorator(tmp_path):
    """With torch not importable: numpy values, and the decorator says why it cannot work."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # import torch -> ImportError
        import numpy as np
        import cachex
        from cachex.torchcachex import (
            ArrowIPCCacheBackend, CacheModuleDecorator, TorchRequiredError)
        b = ArrowIPCCacheBackend({str(tmp_path)!r}, "np_only")
        b.put_batch({{"a": np.arange(4, dtype=np.float32), "b": np.ones(4, np.float32)}})
        b.close()
        values, missing = ArrowIPCCacheBackend({str(tmp_path)!r}, "np_only").get_batch(["a", "b"])
        assert missing == [] and type(values[0]) is np.ndarray and values[0].flags.writeable
        assert values[0].tolist() == [0, 1, 2, 3]
        try:
            CacheModuleDecorator(object(), b)
        except TorchRequiredError as e:
            assert isinstance(e, cachex.CacheError) and isinstance(e, ImportError)
            print("ok", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ") and "needs PyTorch" in out.stdout
