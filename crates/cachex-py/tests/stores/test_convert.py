"""The one conversion of Python values (src/convert.rs), through both
classes that put values: SegmentStore and cachex.open's Cache. They once
had a copy each and disagreed on bytearray (a blob in one, a uint8 tensor
in the other): a bytearray is a blob, read back as bytes, in both."""

from __future__ import annotations

import numpy as np
import pytest

import cachex


def open_segment(tmp_path):
    return cachex.SegmentStore(tmp_path / "seg")


def open_facade(tmp_path):
    return cachex.open(
        {"backend": "segment-store", "root": str(tmp_path), "name": "f", "create_root": True}
    )


OPENERS = [open_segment, open_facade]


@pytest.mark.parametrize("open_store", OPENERS)
def test_a_bytearray_is_a_blob_read_back_as_bytes(tmp_path, open_store):
    store = open_store(tmp_path)
    store.put_batch({"a": bytearray(b"\x00\x01raw"), "b": bytearray()})
    store.flush()
    (a, b), missing = store.get_batch(["a", "b"])
    assert missing == []
    assert type(a) is bytes and a == b"\x00\x01raw"
    assert type(b) is bytes and b == b""


@pytest.mark.parametrize("open_store", OPENERS)
def test_dicts_tuples_and_lists_of_parts_round_trip(tmp_path, open_store):
    # The first value fixes a store's structure: one store per shape.
    values = {
        "dict": {"x": np.arange(3, dtype=np.int16), "raw": bytearray(b"r")},
        "tuple": (np.ones(2, np.float32), b"t"),
        "list": [np.zeros(1, np.uint8), b"l"],
    }
    for name, value in values.items():
        (tmp_path / name).mkdir()
        store = open_store(tmp_path / name)
        store.put_batch({name: value})
        store.flush()
        (got,), _ = store.get_batch([name])
        assert type(got) is type(value)
        if isinstance(got, dict):
            assert got["x"].tolist() == [0, 1, 2] and got["raw"] == b"r"
            assert isinstance(got["x"].base, cachex.MappedValue)
            assert not got["x"].flags.writeable
        else:
            assert got[0].tolist() == value[0].tolist() and got[1] == value[1]


@pytest.mark.parametrize("open_store", OPENERS)
def test_a_nested_value_is_refused_with_a_typed_error(tmp_path, open_store):
    store = open_store(tmp_path)
    with pytest.raises(cachex.CacheError):
        store.put_batch({"n": {"outer": {"inner": np.ones(2)}}})
        store.flush()
