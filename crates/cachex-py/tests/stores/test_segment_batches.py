"""``SegmentStore.get_batch(copy=True)`` and ``get_stacked``: batches as
fresh arrays (writable, owning their bytes)."""

from __future__ import annotations

import numpy as np
import pytest

import cachex


@pytest.fixture
def store(tmp_path):
    s = cachex.SegmentStore(tmp_path)
    s.put_batch({f"k{i}": np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(8)})
    s.flush()
    yield s
    s.close()


def test_copied_values_are_writable_and_own_their_bytes(store):
    views, _ = store.get_batch(["k1", "k2"])
    copies, missing = store.get_batch(["k1", "nope", "k2"], copy=True)
    assert missing == [1] and copies[1] is None
    for v, c in zip(views, (copies[0], copies[2]), strict=True):
        assert c.flags.writeable and c.flags.owndata and c.base is None
        assert c.dtype == v.dtype and np.array_equal(c, v)
    copies[0][:] = -1
    again, _ = store.get_batch(["k1"])
    assert again[0][0, 0] == 1.0  # the file is untouched


def test_stacked_rows_follow_the_keys_and_missing_rows_are_zero(store):
    stacked, missing = store.get_stacked(["k3", "nope", "k0"])
    assert missing == [1]
    assert stacked.shape == (3, 2, 3) and stacked.dtype == np.float32 and stacked.flags.writeable
    assert np.array_equal(stacked[0], np.arange(6, dtype=np.float32).reshape(2, 3) + 3)
    assert not stacked[1].any()
    assert np.array_equal(stacked[2], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert store.get_stacked(["nope"]) == (None, [0])


def test_stacked_dicts_tuples_and_blobs(tmp_path):
    d = cachex.SegmentStore(tmp_path / "d")
    d.put_batch({f"k{i}": {"f": np.full(4, i, np.int16), "tag": b"t%d" % i} for i in range(3)})
    value, missing = d.get_stacked(["k2", "x", "k0"])
    assert missing == [1] and sorted(value) == ["f", "tag"]
    assert value["f"].tolist() == [[2] * 4, [0] * 4, [0] * 4]
    assert value["tag"] == [b"t2", None, b"t0"]
    t = cachex.SegmentStore(tmp_path / "t")
    t.put_batch({f"k{i}": (np.full(2, i, np.uint8), np.full(1, i, np.float64)) for i in range(2)})
    value, _ = t.get_stacked(["k1", "k0"])
    assert isinstance(value, tuple) and value[0].tolist() == [[1, 1], [0, 0]]
    b = cachex.SegmentStore(tmp_path / "b")
    b.put_batch({"a": b"x", "b": b"yz"})
    assert b.get_stacked(["b", "a"]) == ([b"yz", b"x"], [])


def test_stacking_values_of_different_shapes_is_refused(tmp_path):
    s = cachex.SegmentStore(tmp_path)
    s.put_batch({"short": np.zeros(2, np.float32), "long": np.zeros(5, np.float32)})
    with pytest.raises(cachex.InvalidInputError, match="differ in shape"):
        s.get_stacked(["short", "long"])
    values, _ = s.get_batch(["short", "long"])
    assert [v.shape for v in values] == [(2,), (5,)]


def test_keys_may_be_any_iterable_of_str_but_not_one_str(store):
    _, missing = store.get_batch(iter(["k0", "zz"]))
    assert missing == [1]
    with pytest.raises(cachex.InvalidInputError, match="not one str"):
        store.get_batch("k0")
    with pytest.raises(cachex.InvalidInputError, match="must be str"):
        store.get_stacked(["k0", 3])
