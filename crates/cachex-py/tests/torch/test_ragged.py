"""cachex.Ragged and ragged batches: a bytes field of a page or ``.beton``
file batched as its values end to end plus offsets (``ragged=True``),
filled by the binding's ``fill_batch`` into a values buffer that grows and
is then reused; the same batches as the padded layout, value for value."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import cachex
from cachex import Ragged
from cachex.torch import BetonDataset, PageDataset

N = 64
TORCH_REASON = "torch is not installed (scripts/test installs it)"


def blob(i: int) -> bytes:
    """Sample ``i``'s value: 0 to 300 bytes, empty for every seventh."""
    return (
        np.random.default_rng(i)
        .integers(0, 256, (i * 37) % 301 if i % 7 else 0, np.uint8)
        .tobytes()
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("ragged") / "r.pages"
    w = cachex.PageWriter(path, {"i": "int", "blob": "bytes", "x": ("float32", (2,))})
    w.write_many([{"i": i, "blob": blob(i), "x": np.full(2, i, np.float32)} for i in range(N)])
    w.finalize()
    return path


@pytest.fixture(scope="module")
def beton(tmp_path_factory):
    path = tmp_path_factory.mktemp("ragged") / "r.beton"
    fields = {"i": "int", "blob": "bytes", "meta": "json"}
    cachex.write_beton(
        path, fields, [{"i": i, "blob": blob(i), "meta": {"i": i}} for i in range(N)]
    )
    return path


def test_ragged_indexes_pads_and_copies_its_values():
    r = Ragged(np.frombuffer(b"abcdef", np.uint8), np.array([0, 2, 2, 6]))
    assert (
        len(r) == 3 and bytes(r[0]) == b"ab" and bytes(r.item(1)) == b"" and bytes(r[-1]) == b"cdef"
    )
    assert r.lengths.tolist() == [2, 0, 4]
    assert r.padded().tolist() == [[97, 98, 0, 0], [0, 0, 0, 0], [99, 100, 101, 102]]
    assert r.padded(5).shape == (3, 5)
    with pytest.raises(cachex.InvalidInputError, match="wider than width 3"):
        r.padded(3)
    with pytest.raises(IndexError, match="value 3 out of range"):
        r[3]
    values, offsets = r
    assert values is r.values and offsets is r.offsets
    back = pickle.loads(pickle.dumps(r))
    assert isinstance(back, Ragged) and back.offsets.tolist() == [0, 2, 2, 6]
    kept = Ragged(np.zeros(10, np.uint8), np.array([0, 3])).copy()
    assert kept.values.shape == (3,)
    empty = Ragged(np.zeros(0, np.uint8), np.zeros(1, np.int64))
    assert len(empty) == 0 and empty.padded().shape == (0, 0)


def test_ragged_of_tensors_converts_and_nests():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    from torch.utils.data._utils.collate import default_collate, default_convert

    r = Ragged(np.frombuffer(b"abcdef", np.uint8).copy(), np.array([0, 2, 2, 6]))
    t = default_convert(r)
    assert isinstance(t, Ragged) and isinstance(t.values, torch.Tensor)
    assert isinstance(t.offsets, torch.Tensor) and t[2].tolist() == [99, 100, 101, 102]
    assert torch.equal(t.padded(), torch.from_numpy(r.padded()))
    nested = t.to_nested()
    assert nested.layout == torch.jagged
    assert [v.tolist() for v in nested.unbind()] == [[97, 98], [], [99, 100, 101, 102]]
    assert nested.values().data_ptr() == t.values.data_ptr()  # no copy
    stacked = default_collate([t, t])
    assert isinstance(stacked, Ragged) and stacked.values.shape == (2, 6)
    assert t.copy().values.data_ptr() != t.values.data_ptr()


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_ragged_page_batches_hold_the_padded_batches_values(page, output):
    if output == "torch":
        pytest.importorskip("torch", reason=TORCH_REASON)
    padded = PageDataset(page, output=output)
    ragged = PageDataset(page, output=output, ragged=True)
    indices = [5, 0, 7, 63, 14, 1]
    p, r = padded[indices], ragged[indices]
    assert set(r) == {"i", "blob", "x"}  # no blob_lengths
    blobs = r["blob"]
    assert isinstance(blobs, Ragged) and len(blobs) == len(indices)
    assert np.array_equal(np.asarray(blobs.lengths), np.asarray(p["blob_lengths"]))
    width = int(np.asarray(p["blob_lengths"]).max())
    assert np.array_equal(np.asarray(blobs.padded()), np.asarray(p["blob"])[:, :width])
    assert [bytes(np.asarray(blobs[k])) for k in range(len(indices))] == [blob(i) for i in indices]
    # A batch of its own holds exactly its values.
    assert len(blobs.values) == sum(len(blob(i)) for i in indices)
    assert np.array_equal(np.asarray(r["x"]), np.asarray(p["x"]))
    # Values of no bytes at all are still the output's type.
    empty = ragged[[0, 7]]["blob"]
    assert type(empty.values) is type(r["x"]) and len(empty.values) == 0 and len(empty) == 2


def test_a_reused_ragged_buffer_grows_then_stays(page):
    ds = PageDataset(page, ragged=True)
    out = ds.empty_batch(8)
    assert len(out["blob"].values) == 0 and out["blob"].offsets.shape == (9,)
    buffers = set()
    for start in range(0, N, 8):
        indices = list(range(start, start + 8))
        batch = ds.batch(indices, out=out)
        assert [bytes(batch["blob"][k]) for k in range(8)] == [blob(i) for i in indices]
        assert np.shares_memory(batch["blob"].values, out["blob"].values) or not len(
            batch["blob"].values
        )
        buffers.add(out["blob"].values.__array_interface__["data"][0])
    # Grown when a batch outgrew it (at least doubling), reused otherwise.
    assert len(buffers) <= 3
    assert len(out["blob"].values) >= max(
        sum(len(blob(i)) for i in range(s, s + 8)) for s in range(0, N, 8)
    )


def test_fill_batch_reports_a_short_values_buffer_and_writes_only_offsets(page):
    reader = cachex.PageReader(page)
    values, offsets = np.full(4, 255, np.uint8), np.zeros(4, np.int64)
    i_out = np.full(3, -1, np.int64)
    got = reader.fill_batch([1, 2, 3], {"i": i_out, "blob": (values, offsets)})
    total = sum(len(blob(i)) for i in (1, 2, 3))
    assert got == {"blob": total}
    assert offsets.tolist() == np.cumsum([0, *(len(blob(i)) for i in (1, 2, 3))]).tolist()
    assert values.tolist() == [255] * 4 and i_out.tolist() == [-1] * 3  # nothing else copied
    values = np.zeros(total, np.uint8)
    assert reader.fill_batch([1, 2, 3], {"i": i_out, "blob": (values, offsets)}) == {"blob": total}
    assert values.tobytes() == blob(1) + blob(2) + blob(3) and i_out.tolist() == [1, 2, 3]


def test_fill_batch_refuses_ragged_pairs_that_do_not_fit(page):
    reader = cachex.PageReader(page)
    v, o = np.zeros(100, np.uint8), np.zeros(5, np.int64)
    with pytest.raises(cachex.InvalidInputError, match="pair is for a bytes field"):
        reader.fill_batch([0], {"i": (v, o)})
    with pytest.raises(cachex.InvalidInputError, match="offsets must be 1-D int64 of at least 6"):
        reader.fill_batch(list(range(5)), {"blob": (v, o)})
    with pytest.raises(cachex.InvalidInputError, match="values must be 1-D uint8"):
        reader.fill_batch([0], {"blob": (np.zeros(100, np.int32), o)})
    with pytest.raises(cachex.InvalidInputError, match="writable"):
        reader.fill_batch([0], {"blob": (v, np.zeros(5, np.int64)[::-1])})


def test_ragged_beton_batches(beton):
    ds = BetonDataset(beton, ragged=True)
    indices = [3, 9, 0, 42]
    batch = ds[indices]
    assert isinstance(batch["blob"], Ragged) and "blob_lengths" not in batch
    assert [bytes(batch["blob"][k]) for k in range(4)] == [blob(i) for i in indices]
    assert [json.loads(m) for m in batch["meta"]] == [{"i": i} for i in indices]
    assert batch["i"].tolist() == indices
    padded = BetonDataset(beton)[indices]
    assert np.array_equal(batch["blob"].lengths, padded["blob_lengths"])
