"""``cachex.torchcachex`` and torchcachex's own directories, both ways, and
recovery after a SIGKILLed writer.

``TorchcachexLayoutReader`` reads a cache the way torchcachex 0.2.0 does
(pyarrow only): it trusts ``index.pkl`` when present, else rebuilds the
index from the first record batch of every ``segment_*.arrow``, parses
``schema.json`` with torchcachex's type table, and rebuilds values from the
``*_data`` / ``*_shape`` / ``*_blob`` columns.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cachex.torchcachex import ArrowIPCCacheBackend
from fixture_values import TORCHCACHEX_MODULES, expected_value
from test_torchcachex import as_np

pa = pytest.importorskip("pyarrow", reason="the torchcachex layout reader needs pyarrow")

# The schema.json type strings torchcachex 0.2.0 writes (``str()`` of the
# pyarrow type: float16 is "halffloat", which its own parser then misreads
# as string; it only uses schema.json to write, never to read values).
TORCHCACHEX_TYPES = {
    "string",
    "binary",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "halffloat",
    "float",
    "double",
    "bool",
}


class TorchcachexLayoutReader:
    def __init__(self, root: Path) -> None:
        self.root = root
        schema = json.loads((root / "schema.json").read_text())
        for f in schema["fields"]:
            t = f["type"]
            inner = t[5:-1].split(": ")[-1] if t.startswith("list<") else t
            assert inner in TORCHCACHEX_TYPES, f"torchcachex cannot parse {t!r}"
        self.structure = schema["output_structure"]
        self.tensor_keys = json.loads(schema["metadata"].get("tensor_keys", "[]"))
        index_pkl = root / "index.pkl"
        if index_pkl.exists():
            self.index = pickle.loads(index_pkl.read_bytes())
        else:
            self.index = {}
            for seg in sorted((root / "segments").glob("segment_*.arrow")):
                sid = int(seg.stem.split("_")[1])
                with pa.memory_map(str(seg), "r") as src:
                    keys = pa.ipc.open_file(src).get_batch(0).column("key").to_pylist()
                for off, k in enumerate(keys):
                    self.index[k] = (sid, off)

    def get(self, key: str):
        sid, off = self.index[key]
        with pa.memory_map(str(self.root / "segments" / f"segment_{sid:06d}.arrow"), "r") as src:
            table = pa.ipc.open_file(src).read_all()
        row = {name: table[name][off] for name in table.column_names}

        def tensor(prefix: str) -> np.ndarray:
            data = row[f"{prefix}_data"].values.to_numpy(zero_copy_only=False)
            return data.reshape(row[f"{prefix}_shape"].as_py())

        if self.structure == "tensor":
            data = row["data"].values.to_numpy(zero_copy_only=False)
            return data.reshape(row["shape"].as_py())
        if self.structure == "dict":
            out = {name: tensor(name) for name in self.tensor_keys}
            for col in row:
                if col.endswith("_blob"):
                    out[col[:-5]] = pickle.loads(row[col].as_py())
            return out
        if self.structure in ("tuple", "list"):
            items, i = [], 0
            while f"item{i}_data" in row or f"item{i}_blob" in row:
                if f"item{i}_data" in row:
                    items.append(tensor(f"item{i}"))
                else:
                    items.append(pickle.loads(row[f"item{i}_blob"].as_py()))
                i += 1
            return tuple(items) if self.structure == "tuple" else items
        return pickle.loads(row["blob"].as_py())


def matches(got, want) -> None:
    """``got`` (from the drop-in) equals ``want`` (expected.json's form)."""
    if isinstance(want, dict) and set(want) == {"dtype", "shape", "data"}:
        w = expected_value(want)
        g = as_np(got)
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want)
        for k in want:
            matches(got[k], want[k])
    elif isinstance(want, list):
        assert isinstance(got, tuple | list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            matches(g, w)
    else:
        assert got == want  # a pickle torchcachex wrote, unpickled


@pytest.mark.parametrize("module", TORCHCACHEX_MODULES)
def test_caches_written_by_torchcachex_open_in_the_drop_in(fixture_copy, expected, module):
    root: Path = fixture_copy(f"torchcachex/{module}")
    want = expected["torchcachex"]["modules"][module]
    b = ArrowIPCCacheBackend(root.parent, module)
    values, missing = b.get_batch(list(want))
    assert missing == []
    for got, w in zip(values, want.values(), strict=True):
        matches(got, w)


def test_a_torchcachex_cache_extended_by_the_drop_in_stays_readable_by_torchcachex(
    fixture_copy, expected
):
    root: Path = fixture_copy("torchcachex/dict_mixed")
    want = expected["torchcachex"]["modules"]["dict_mixed"]
    assert (root / "index.pkl").exists()
    b = ArrowIPCCacheBackend(root.parent, "dict_mixed", async_write=False)
    new = {
        f"new_{i}": {
            "features": np.full(4, i, np.float32),
            "logits": np.full(3, i, np.float16),
            "label": i,
        }
        for i in range(5)
    }
    b.put_batch(new)
    # The stale index.pkl is gone before the new segment can land ...
    assert not (root / "index.pkl").exists()
    b.close()
    # ... and written again, from cachex's index, with the new keys.
    index = pickle.loads((root / "index.pkl").read_bytes())
    assert set(index) == set(want) | set(new)
    reader = TorchcachexLayoutReader(root)
    for key, w in want.items():
        got = reader.get(key)
        matches(got, w)
    for key, w in new.items():
        got = reader.get(key)
        assert got["label"] == w["label"]
        assert np.array_equal(got["features"], w["features"])
        assert got["logits"].dtype == np.float16


@pytest.mark.parametrize(
    ("module", "make"),
    [
        ("tensor", lambda i: np.arange(6, dtype=np.float32).reshape(2, 3) * i),
        ("ints", lambda i: np.arange(4, dtype=np.int64) - i),
        (
            "dict",
            lambda i: {
                "features": np.full(5, i, np.float32),
                "logits": np.full(2, i, np.float16),
                "tag": f"t{i}",
            },
        ),
        ("tuple", lambda i: (np.full(3, i, np.float64), np.full(1, i, np.uint8), {"i": i})),
        ("blob", lambda i: {"anything": [i, str(i)]}),
    ],
)
def test_a_cache_written_by_the_drop_in_reads_in_torchcachex_s_layout(tmp_path, module, make):
    b = ArrowIPCCacheBackend(tmp_path, module, flush_every=4)
    items = {f"sample_{i}": make(i) for i in range(10)}
    b.put_batch(items)
    b.close()
    reader = TorchcachexLayoutReader(tmp_path / module)
    for key, want in items.items():
        got = reader.get(key)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype and np.array_equal(got, want)
        elif isinstance(want, dict) and module == "dict":
            assert np.array_equal(got["features"], want["features"]) and got["tag"] == want["tag"]
            assert got["logits"].dtype == np.float16
        elif isinstance(want, tuple):
            assert np.array_equal(got[0], want[0]) and got[1].dtype == np.uint8
            assert got[2] == want[2]
        else:
            assert got == want


WRITER = """
import sys
import numpy as np
from cachex.torchcachex import ArrowIPCCacheBackend
b = ArrowIPCCacheBackend(sys.argv[1], "killed", async_write=True, flush_every=64)
i = 0
while True:
    b.put_batch({f"k{j}": np.full(32, j, np.float32) for j in range(i, i + 50)})
    i += 50
    if i % 200 == 0:
        b.flush()
        print(i, flush=True)  # every key below i is durable
"""


def test_values_flushed_before_a_sigkill_survive_it(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    durable = 0
    try:
        for line in proc.stdout:
            durable = int(line)
            if durable >= 2000:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL and durable >= 2000
    b = ArrowIPCCacheBackend(tmp_path, "killed", lru_size=0)
    keys = [f"k{j}" for j in range(durable)]
    values, missing = b.get_batch(keys)
    assert missing == []
    assert all(float(as_np(v)[0]) == j for j, v in enumerate(values))
    # The reopened writer goes on where the killed one stopped.
    b.put_batch({"after": np.zeros(32, np.float32)})
    b.flush()
    assert b.store.verify()["problems"] == []


def test_real_torchcachex_reads_a_drop_in_cache(tmp_path):
    tcx = pytest.importorskip(
        "torchcachex",
        reason="real torchcachex not importable (put torchcachex 0.2.0 on PYTHONPATH to run)",
    )
    torch = pytest.importorskip("torch", reason="torchcachex needs torch")
    b = ArrowIPCCacheBackend(tmp_path, "mod", flush_every=3)
    items = {f"s{i}": torch.full((2, 3), float(i)) for i in range(7)}
    b.put_batch(items)
    b.close()
    theirs = tcx.ArrowIPCCacheBackend(str(tmp_path), "mod", async_write=False)
    values, missing = theirs.get_batch(list(items))
    assert missing == []
    for got, want in zip(values, items.values(), strict=True):
        assert torch.equal(got, want)


RANKED = [(), (4,), (2, 3), (3, 1, 2), (0,), (1, 1, 1, 1)]


def test_a_cache_of_mixed_ranks_reads_in_torchcachex_s_layout(tmp_path):
    b = ArrowIPCCacheBackend(tmp_path, "ranks", flush_every=4)
    items = {
        f"s{i}": {
            "x": (np.arange(int(np.prod(shape)), dtype=np.float32) + i).reshape(shape),
            "n": np.full(shape[::-1], i, np.int64),
            "tag": f"t{i}",
        }
        for i, shape in enumerate(RANKED)
    }
    b.put_batch(dict(list(items.items())[:2]))
    b.put_batch(dict(list(items.items())[2:]))
    b.close()
    reader = TorchcachexLayoutReader(tmp_path / "ranks")
    for key, want in items.items():
        got = reader.get(key)
        for name in ("x", "n"):
            assert got[name].dtype == want[name].dtype
            assert got[name].shape == want[name].shape
            assert np.array_equal(got[name], want[name])
        assert got["tag"] == want["tag"]


def test_real_torchcachex_reads_a_drop_in_cache_of_mixed_ranks(tmp_path):
    tcx = pytest.importorskip(
        "torchcachex",
        reason="real torchcachex not importable (put torchcachex 0.2.0 on PYTHONPATH to run)",
    )
    torch = pytest.importorskip("torch", reason="torchcachex needs torch")
    b = ArrowIPCCacheBackend(tmp_path, "mod", flush_every=2)
    items = {
        f"s{i}": torch.arange(float(np.prod(shape))).reshape(shape) * i
        for i, shape in enumerate(RANKED)
    }
    b.put_batch(items)
    b.close()
    theirs = tcx.ArrowIPCCacheBackend(str(tmp_path), "mod", async_write=False, lru_size=0)
    values, missing = theirs.get_batch(list(items))
    assert missing == []
    for got, want in zip(values, items.values(), strict=True):
        assert got.shape == want.shape and torch.equal(got, want)


def test_a_real_torchcachex_cache_of_mixed_ranks_opens_and_grows_in_the_drop_in(tmp_path):
    tcx = pytest.importorskip(
        "torchcachex",
        reason="real torchcachex not importable (put torchcachex 0.2.0 on PYTHONPATH to run)",
    )
    torch = pytest.importorskip("torch", reason="torchcachex needs torch")
    theirs = tcx.ArrowIPCCacheBackend(str(tmp_path), "mod", async_write=False, flush_every=2)
    items = {f"s{i}": torch.full(shape, float(i)) for i, shape in enumerate(RANKED)}
    theirs.put_batch(items)
    theirs.flush()
    b = ArrowIPCCacheBackend(tmp_path, "mod", lru_size=0)
    more = {"more": torch.ones(2, 2, 2), "flat": torch.zeros(7)}
    b.put_batch(more)
    b.close()
    items.update(more)
    values, missing = ArrowIPCCacheBackend(tmp_path, "mod").get_batch(list(items))
    assert missing == []
    for got, want in zip(values, items.values(), strict=True):
        assert got.shape == want.shape and torch.equal(got, want)
