"""cachex.PageWriter / PageReader / BetonReader / write_beton: round trips,
fill_batch into preallocated buffers, FFCV fixtures, bad input, corruption."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import pickle

import numpy as np
import pytest

import cachex
import procs

FIELDS = {"label": "int", "score": "float", "jpeg": "bytes", "feat": ("float32", (2, 3))}


def sample(i: int) -> dict:
    return {
        "label": i * 7 - 3,
        "score": i / 4,
        "jpeg": bytes(range(i % 50)) * (i % 3 + 1),
        "feat": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
    }


def write_file(path, n: int = 60, **opts) -> None:
    w = cachex.PageWriter(path, FIELDS, **opts)
    w.append(sample(0))
    w.write_many([sample(i) for i in range(1, n)], threads=2)
    assert len(w) == n
    summary = w.finalize()
    assert summary["num_samples"] == n


def check_sample(got: dict, i: int) -> None:
    want = sample(i)
    assert got["label"] == want["label"] and got["score"] == want["score"]
    assert got["jpeg"].dtype == np.uint8 and got["jpeg"].tobytes() == want["jpeg"]
    assert got["feat"].dtype == np.float32 and np.array_equal(got["feat"], want["feat"])


def test_samples_round_trip_as_views(tmp_path):
    path = tmp_path / "train.pages"
    write_file(path, page_size=4096, alignment=64)
    reader = cachex.PageReader(path)
    assert len(reader) == 60
    assert reader.fields == FIELDS
    for i in range(60):
        check_sample(reader.sample(i), i)
    check_sample(reader.sample(-1), 59)
    s = reader.sample(5)
    assert isinstance(s["feat"].base, cachex.MappedValue) and not s["feat"].flags.writeable
    del reader
    gc.collect()
    check_sample(s, 5)
    assert cachex.PageReader(path).verify()["problems"] == []


def test_fill_batch_copies_into_preallocated_buffers(tmp_path):
    path = tmp_path / "train.pages"
    write_file(path)
    reader = cachex.PageReader(path)
    width = reader.max_sizes["jpeg"]
    out = {
        "label": np.empty(8, np.int64),
        "score": np.empty(8, np.float64),
        "jpeg": np.full((8, width), 0xAA, np.uint8),
        "feat": np.empty((8, 2, 3), np.float32),
    }
    order = reader.quasi_random_order(seed=3, window_pages=2)
    assert sorted(order) == list(range(60))
    batch = order[:5]
    reader.prefetch(batch)
    lengths = reader.fill_batch(batch, out)
    for k, i in enumerate(batch):
        want = sample(i)
        assert out["label"][k] == want["label"] and out["score"][k] == want["score"]
        assert lengths["jpeg"][k] == len(want["jpeg"])
        assert out["jpeg"][k, : len(want["jpeg"])].tobytes() == want["jpeg"]
        assert not out["jpeg"][k, len(want["jpeg"]) :].any()
        assert np.array_equal(out["feat"][k], want["feat"])


def test_fill_batch_refuses_buffers_that_do_not_fit(tmp_path):
    path = tmp_path / "train.pages"
    write_file(path, n=10)
    reader = cachex.PageReader(path)
    with pytest.raises(cachex.InvalidInputError, match="label"):
        reader.fill_batch([0, 1, 2], {"label": np.empty(2, np.int64)})
    with pytest.raises(cachex.InvalidInputError, match="feat"):
        reader.fill_batch([0], {"feat": np.empty((1, 3, 2), np.float32)})
    frozen = np.empty(1, np.float64)
    frozen.flags.writeable = False
    with pytest.raises(cachex.InvalidInputError, match="writable"):
        reader.fill_batch([0], {"score": frozen})
    with pytest.raises(cachex.InvalidInputError):
        reader.fill_batch([0, 9], {"jpeg": np.empty((2, 1), np.uint8)})


def test_wrong_values_are_refused_and_nothing_written(tmp_path):
    path = tmp_path / "x.pages"
    w = cachex.PageWriter(path, FIELDS)
    w.append(sample(0))
    bad = [
        {**sample(1), "feat": np.zeros((3, 2), np.float32)},
        {**sample(1), "feat": np.zeros((2, 3), np.float64)},
        {**sample(1), "label": "seven"},
        {k: v for k, v in sample(1).items() if k != "score"},
    ]
    for value in bad:
        with pytest.raises(cachex.InvalidInputError):
            w.append(value)
    with pytest.raises(cachex.InvalidInputError, match="sample 1"):
        w.write_many([sample(1), bad[0]])
    assert len(w) == 1
    w.finalize()
    assert len(cachex.PageReader(path)) == 1


def test_a_damaged_file_raises_corrupt(tmp_path):
    path = tmp_path / "train.pages"
    write_file(path, n=20)
    raw = bytearray(path.read_bytes())
    raw[-8:] = b"\0" * 8
    path.write_bytes(bytes(raw))
    with pytest.raises(cachex.CorruptError, match=r"train\.pages"):
        cachex.PageReader(path)
    report = cachex.verify(path)
    assert report["kind"] == "page-alloc" and report["problems"], report


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "train.pages"
    w = cachex.PageWriter(path, FIELDS)
    with pytest.raises(cachex.LockedError):
        cachex.PageWriter(path, FIELDS)
    w.finalize()


def _labels(reader, queue) -> None:
    queue.put([reader.sample(i)["label"] for i in range(len(reader))])


def test_forked_readers_and_pickle(tmp_path):
    path = tmp_path / "train.pages"
    write_file(path, n=30)
    reader = cachex.PageReader(path)
    want = [sample(i)["label"] for i in range(30)]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_labels, args=(reader, queue))
    with procs.ended(p):
        p.start()
        assert queue.get(timeout=60) == want
    assert p.exitcode == 0
    copy = pickle.loads(pickle.dumps(reader))
    check_sample(copy.sample(11), 11)


def ffcv_expected_check(reader, expected) -> None:
    assert len(reader) == expected["num_samples"]
    for want in expected["samples"]:
        got = reader.sample(want["index"])
        assert got["id"] == want["id"] and got["score"] == want["score"]
        assert got["blob"].tobytes().hex() == want["blob_hex"]
        arr = want["arr"]
        assert np.array_equal(
            got["arr"], np.array(arr["data"], dtype=arr["dtype"]).reshape(arr["shape"])
        )
        assert json.loads(got["meta"]) == want["meta"]


@pytest.mark.parametrize("name", ["small_w1.beton", "small_w2.beton"])
def test_ffcv_fixtures_read_as_written(fixture_copy, expected, name):
    path = fixture_copy(f"ffcv/{name}")
    reader = cachex.BetonReader(path)
    assert reader.fields == {
        "id": "int",
        "score": "float",
        "blob": "bytes",
        "arr": ("float32", (3, 4)),
        "meta": "json",
    }
    ffcv_expected_check(reader, expected["ffcv"])
    assert reader.verify()["problems"] == []


def test_write_beton_reproduces_ffcvs_one_worker_file(fixture_copy, expected, tmp_path):
    src = cachex.BetonReader(fixture_copy("ffcv/small_w1.beton"))
    samples = []
    for i in range(len(src)):
        s = src.sample(i)
        samples.append(
            {
                "id": s["id"],
                "score": s["score"],
                "blob": s["blob"].tobytes(),
                "arr": np.array(s["arr"]),
                "meta": s["meta"],
            }
        )
    out = tmp_path / "again.beton"
    cachex.write_beton(out, src.fields, samples, page_size=expected["ffcv"]["page_size"])
    assert out.read_bytes() == src.path.read_bytes()
    ffcv_expected_check(cachex.BetonReader(out), expected["ffcv"])
