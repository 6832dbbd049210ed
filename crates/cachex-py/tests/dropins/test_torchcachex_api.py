"""Every public name of torchcachex's classes exists in the drop-in, with
the same meaning or a ``NotProvidedError`` naming what to use instead."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cachex
from cachex.torchcachex import ArrowIPCCacheBackend, NotProvidedError

# The public attributes and methods of torchcachex 0.2.0's
# ArrowIPCCacheBackend (src/torchcachex/backend.py: every non-underscore
# name its __init__ assigns and every method it defines). torchcachex needs
# torch, so the list is written down here rather than read at test time.
TORCHCACHEX_0_2_0_BACKEND = [
    "async_write",
    "cache_dir",
    "current_rank",
    "executor",
    "flush",
    "flush_every",
    "get_batch",
    "index",
    "index_path",
    "lru",
    "lru_enabled",
    "module_id",
    "output_structure",
    "put_batch",
    "schema",
    "schema_path",
    "segments_dir",
    "writer_rank",
]

# Its CacheModuleDecorator's own (src/torchcachex/decorator.py), beside
# every public name of torch.nn.Module, which it subclasses.
TORCHCACHEX_0_2_0_DECORATOR = [
    "cache",
    "enabled",
    "enforce_stateless",
    "forward",
    "key_from_batch_fn",
    "load_state_dict",
    "map_location_on_read",
    "module",
    "state_dict",
]


def test_every_public_name_of_torchcachex_s_backend_exists(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    b.put_batch({"a": np.ones((2, 2), np.float32)})
    for name in TORCHCACHEX_0_2_0_BACKEND:
        assert name in dir(b), name
        getattr(b, name)
    b.close()


def test_submitting_to_the_writer_raises_a_cachex_error_naming_the_replacement(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m")
    with pytest.raises(NotProvidedError, match=r"executor\.submit .*: .*put_batch\(\)"):
        b.executor.submit(print)
    with pytest.raises(cachex.CacheError, match=r"flush\(\)"):
        b.executor.submit(print)
    b.close()


def test_attributes_mean_what_torchcachex_s_do(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "m", lru_size=0, async_write=False)
    assert b.cache_dir == tmp_path / "m"
    assert b.segments_dir == tmp_path / "m" / "segments"
    assert b.index_path == tmp_path / "m" / "index.pkl"
    assert b.schema_path == tmp_path / "m" / "schema.json"
    assert (b.module_id, b.async_write, b.flush_every) == ("m", False, 2048)
    assert (b.writer_rank, b.current_rank) == (0, 0)
    assert b.lru_enabled is False
    assert ArrowIPCCacheBackend(tmp_path, "n").lru_enabled is True
    assert b.output_structure is None
    b.put_batch({"a": {"x": np.ones(3, np.float16), "tag": "t"}})
    assert b.output_structure == "dict"
    assert b.output_structure == json.loads(b.schema_path.read_text())["output_structure"]
    b.close()


def test_schema_is_the_segments_arrow_schema(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="the schema attribute is a pyarrow.Schema")
    b = ArrowIPCCacheBackend(tmp_path, "m", async_write=False)
    assert b.schema is None
    b.put_batch({"a": {"x": np.ones(3, np.float16), "y": np.ones((1, 2)), "tag": "t"}})
    b.flush()
    (segment,) = Path(b.segments_dir).glob("segment_*.arrow")
    with pa.memory_map(str(segment), "r") as src:
        on_disk = pa.ipc.open_file(src).schema
    assert isinstance(b.schema, pa.Schema)
    assert b.schema.names == on_disk.names
    assert b.schema.types == on_disk.types
    assert json.loads(b.schema.metadata[b"tensor_keys"]) == ["x", "y"]
    b.close()


def test_every_public_name_of_torchcachex_s_decorator_exists(tmp_path):
    torch = pytest.importorskip("torch", reason="CacheModuleDecorator needs torch")
    from cachex.torchcachex import CacheModuleDecorator

    b = ArrowIPCCacheBackend(tmp_path, "m")
    d = CacheModuleDecorator(torch.nn.Identity(), b)
    module_names = [n for n in dir(torch.nn.Module()) if not n.startswith("_")]
    for name in TORCHCACHEX_0_2_0_DECORATOR + module_names:
        assert name in dir(d), name
        getattr(d, name)
    assert d.cache is b and isinstance(d.module, torch.nn.Identity)
    assert (d.enabled, d.enforce_stateless, d.map_location_on_read) == (True, True, "cpu")
    assert d.key_from_batch_fn is None
    b.close()
