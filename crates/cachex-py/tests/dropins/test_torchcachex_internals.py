"""The torchcachex internals its users' code and tests read, answered from
cachex's state: ``backend.index`` (and ``key_to_idx``), ``index.pkl``
after a flush, ``_load_schema``, ``_parse_arrow_type``,
``_torch_to_arrow_dtype``, ``lru`` with ``lru_size=0``, ``executor``, the
decorator's ``_extract_keys`` / ``_move_like_input``, the
``torchcachex.utils`` helpers and the module paths torchcachex has."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cachex
from cachex.torchcachex import ArrowIPCCacheBackend, WriteQueue

pa = pytest.importorskip("pyarrow", reason="reading the segments' key columns needs pyarrow")


def segment_keys(backend: ArrowIPCCacheBackend) -> dict[str, tuple[int, int]]:
    """Every key of every segment file, read as torchcachex rebuilds its index."""
    index = {}
    for seg in sorted(backend.segments_dir.glob("segment_*.arrow")):
        sid = int(seg.stem.split("_")[1])
        with pa.memory_map(str(seg), "r") as src:
            keys = pa.ipc.open_file(src).read_all().column("key").to_pylist()
        for row, key in enumerate(keys):
            index[key] = (sid, row)
    return index


def test_index_is_torchcachex_s_key_to_segment_and_row_dict(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False, flush_every=4)
    assert b.index == {}
    b.put_batch({f"k{i}": np.full(3, i, np.float32) for i in range(2)})
    assert b.index == {}  # pending until a flush, as in torchcachex
    b.put_batch({f"k{i}": np.full(3, i, np.float32) for i in range(2, 10)})
    b.flush()
    assert b.index == segment_keys(b) and sorted(b.index) == sorted(f"k{i}" for i in range(10))
    assert b.index["k0"] == (0, 0) and b.index["k9"] == (2, 1)  # segments of 4
    assert b.key_to_idx == b.index
    b.index["k0"] = (7, 7)  # a snapshot: the cache is unchanged
    assert b.index["k0"] == (0, 0)
    b.put_batch({"k0": np.zeros(3, np.float32)})  # a newer row wins
    b.flush()
    assert b.index["k0"] == (3, 0) == segment_keys(b)["k0"]
    b.close()


def test_index_pkl_is_written_by_flush_and_close_and_removed_before_new_segments(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    b.flush()
    assert not b.index_path.exists()  # nothing cached: nothing written (as torchcachex)
    b.put_batch({"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)})
    b.flush()
    assert pickle.loads(b.index_path.read_bytes()) == {"a": (0, 0), "b": (0, 1)}
    b.put_batch({"c": np.ones(2, np.float32)})
    assert not b.index_path.exists()  # stale before c's segment lands
    b.close()
    assert pickle.loads(b.index_path.read_bytes()) == {"a": (0, 0), "b": (0, 1), "c": (1, 0)}


def test_index_pkl_is_left_alone_by_several_writers(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False, writer_id=3)
    b.put_batch({"a": np.ones(2, np.float32)})
    b.flush()
    assert not b.index_path.exists()
    assert list(b.index) == ["a"]
    b.close()


def test_a_new_process_reads_the_index_pkl_a_writer_left(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m")
    b.put_batch({f"s{i}": np.full(2, i, np.int64) for i in range(5)})
    b.close()
    code = textwrap.dedent(
        f"""
        import pickle, sys
        print(sorted(pickle.loads(open({str(b.index_path)!r}, "rb").read()).items()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([(f"s{i}", (0, i)) for i in range(5)])


def test_load_schema_and_the_arrow_type_helpers_mean_torchcachex_s(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    with pytest.raises(FileNotFoundError, match=r"schema\.json"):
        b._load_schema()
    b.put_batch({"a": {"x": np.ones(3, np.float16), "tag": "t"}})
    b.flush()
    schema = b._load_schema()
    assert isinstance(schema, pa.Schema) and schema == b.schema
    assert schema.field("x_data").type == pa.list_(pa.float16())
    assert b._parse_arrow_type("list<item: float>") == pa.list_(pa.float32())
    assert b._parse_arrow_type("list<item: halffloat>") == pa.list_(pa.float16())
    assert b._parse_arrow_type("int64") == pa.int64()
    assert b._parse_arrow_type("unknown_type") == pa.string()  # torchcachex's fallback
    b.close()


def test_torch_to_arrow_dtype_is_what_cachex_stores_a_dtype_as(tmp_path):
    torch = pytest.importorskip("torch", reason="the helper maps torch dtypes")
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    assert b._torch_to_arrow_dtype(torch.float32) == pa.float32()
    assert b._torch_to_arrow_dtype(torch.float16) == pa.float16()
    assert b._torch_to_arrow_dtype(torch.int8) == pa.int8()
    assert b._torch_to_arrow_dtype(torch.bool) == pa.bool_()
    assert b._torch_to_arrow_dtype(torch.bfloat16) == pa.uint16()  # bf16 bits
    with pytest.raises(cachex.InvalidInputError, match="complex64"):
        b._torch_to_arrow_dtype(torch.complex64)  # torchcachex said float32, then failed
    b.put_batch({"a": torch.ones(2, dtype=torch.float16)})
    b.flush()
    assert b.schema.field("data").type.value_type == b._torch_to_arrow_dtype(torch.float16)
    b.close()


def test_lru_is_a_dict_that_stays_empty_when_disabled(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", lru_size=0, async_write=False)
    assert type(b.lru) is dict and not b.lru_enabled
    b.put_batch({"a": np.ones(2, np.float32)})
    b.flush()
    _, missing = b.get_batch(["a"])
    assert missing == [] and b.lru == {}
    b.close()
    kept = ArrowIPCCacheBackend(tmp_path, "n", lru_size=8, async_write=False)
    kept.put_batch({"a": np.ones(2, np.float32)})
    assert "a" in kept.lru
    kept.close()


def test_executor_is_the_background_writer_and_shutdown_waits_for_it(tmp_path):
    assert ArrowIPCCacheBackend(tmp_path, "sync", async_write=False).executor is None
    b = ArrowIPCCacheBackend(tmp_path, "m", flush_every=4)
    assert isinstance(b.executor, WriteQueue) and b.executor
    b.put_batch({f"k{i}": np.full(2, i, np.float32) for i in range(10)})
    b.executor.shutdown(wait=True)
    # Written: another handle (read-only, as a second rank) finds every value.
    reader = ArrowIPCCacheBackend(tmp_path, "m", current_rank=1, lru_size=0)
    values, missing = reader.get_batch([f"k{i}" for i in range(10)])
    assert missing == [] and float(np.asarray(values[9])[0]) == 9.0
    b.put_batch({"after": np.ones(2, np.float32)})  # the writer keeps taking writes
    b.executor.shutdown(wait=False)
    b.flush()
    assert "after" in b.index
    b.close()
    reader.close()


def test_the_decorator_s_private_helpers_mean_torchcachex_s(tmp_path):
    torch = pytest.importorskip("torch", reason="CacheModuleDecorator needs torch")
    from cachex.torchcachex import CacheModuleDecorator

    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    d = CacheModuleDecorator(torch.nn.Identity(), b)
    moved = d._move_like_input({"t": torch.ones(2), "n": 3}, None)
    assert moved["t"].device.type == "cpu" and moved["n"] == 3
    assert d._move_like_input([torch.ones(1)], torch.zeros(1))[0].device.type == "cpu"
    assert d._extract_keys((), {"cache_ids": ["a", "b"]}) == (["a", "b"], [0, 1])
    assert d._extract_keys(({"cache_ids": torch.tensor([4, 5])},), {}) == ([4, 5], [0, 1])
    b.close()


def test_utils_helpers_mean_torchcachex_s():
    from cachex.torchcachex.utils import (
        TensorLike,
        _deserialize_sample,
        _serialize_sample,
        _tree_index,
        _tree_stack,
    )

    assert TensorLike is not None
    with pytest.raises(ValueError, match="Cannot stack empty list"):
        _tree_stack([])
    assert _tree_stack(["a", "b"]) == ["a", "b"]
    assert _tree_index({"x": [1, 2], "y": ("p", "q")}, 1) == {"x": [1, 2], "y": ("p", "q")}
    torch = pytest.importorskip("torch", reason="the serializers are torch.save / torch.load")
    batch = _tree_stack([{"t": torch.full((2,), float(i)), "n": i} for i in range(3)])
    assert batch["t"].shape == (3, 2) and batch["n"] == [0, 1, 2]
    assert _tree_index(batch, 2)["t"].tolist() == [2.0, 2.0]
    ragged = _tree_stack([torch.ones(2), torch.ones(3)])
    assert isinstance(ragged, list) and _tree_index(ragged, 1).shape == (3,)
    obj = {"data": [1, 2, 3], "nested": {"key": "value"}, "t": torch.arange(4)}
    back = _deserialize_sample(_serialize_sample(obj))
    assert back["data"] == [1, 2, 3] and back["nested"] == {"key": "value"}
    assert torch.equal(back["t"], torch.arange(4))
    # torch.save bytes: torch.load reads them as it reads torchcachex's.
    import io

    assert torch.equal(torch.load(io.BytesIO(_serialize_sample(torch.ones(2)))), torch.ones(2))


def test_torchcachex_s_module_paths_are_the_drop_in_s_modules():
    for sub in ("backend", "decorator", "utils"):
        short = importlib.import_module(f"cachex.torchcachex.{sub}")
        assert short is importlib.import_module(f"cachex.dropins.torchcachex.{sub}")
    import cachex.torchcachex as tc
    from cachex.torchcachex import backend, decorator

    assert backend.ArrowIPCCacheBackend is tc.ArrowIPCCacheBackend is ArrowIPCCacheBackend
    assert decorator.CacheModuleDecorator is tc.CacheModuleDecorator
    assert tc.__version__ == cachex.__version__
