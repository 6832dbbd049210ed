"""cachex.open(config) and the CachedFn decorator."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

import cachex


def config(root, **extra) -> dict:
    return {
        "backend": "segment-store",
        "root": str(root),
        "name": "embed",
        "create_root": True,
        **extra,
    }


def test_open_puts_gets_and_names_its_directory_by_key(tmp_path):
    cache = cachex.open(config(tmp_path))
    cache.put_batch({"a": np.arange(3, dtype=np.float32)})
    cache.flush()
    values, missing = cache.get_batch(["a", "b"])
    assert missing == [1] and np.array_equal(values[0], np.arange(3, dtype=np.float32))
    assert cache.path.parent == tmp_path / "embed"
    assert len(cache) == 1 and cache.stats()["hits"] == 1
    other = cachex.open(config(tmp_path, options={"flush_every": 16}))
    assert other.path != cache.path


def test_open_reads_a_json_config_file(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text(json.dumps(config(tmp_path / "root")))
    assert cachex.open(str(path)).path.parent.parent == tmp_path / "root"


def test_bad_configs_are_refused(tmp_path):
    with pytest.raises(cachex.InvalidInputError, match="segment-store"):
        cachex.open({**config(tmp_path), "backend": "nope"})
    with pytest.raises(cachex.InvalidInputError, match="option"):
        cachex.open(config(tmp_path, options={"flush_evry": 3}))
    with pytest.raises(cachex.CacheIOError):
        cachex.open({**config(tmp_path / "missing"), "create_root": False})


def test_a_stale_cache_is_refused_with_the_reason_or_rebuilt(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "labels.csv").write_text("a,1\n")
    sources = {"root": str(src), "paths": ["labels.csv"]}
    cache = cachex.open(config(tmp_path, sources=sources))
    cache.put_batch({"a": np.zeros(2)})
    cache.flush()
    del cache
    (src / "labels.csv").write_text("a,1\nb,2\n")
    with pytest.raises(cachex.StaleError, match=r"labels\.csv"):
        cachex.open(config(tmp_path, sources=sources))
    rebuilt = cachex.open(config(tmp_path, sources=sources, on_stale="rebuild"))
    assert len(rebuilt) == 0


def test_cached_fn_computes_only_misses_once_each_in_order(tmp_path):
    calls: list[list[str]] = []

    @cachex.cached(config(tmp_path), id_of=lambda p: p)
    def embed(paths: list[str]) -> list[np.ndarray]:
        calls.append(list(paths))
        return [np.full(4, len(p), np.float32) for p in paths]

    out = embed(["a", "bb", "a", "ccc"])
    assert [float(o[0]) for o in out] == [1, 2, 1, 3]
    assert calls == [["a", "bb", "ccc"]]
    out = embed(["ccc", "dddd", "bb"])
    assert [float(o[0]) for o in out] == [3, 4, 2]
    assert calls[1] == ["dddd"]
    stats = embed.stats()
    assert stats["hits"] == 2 and stats["computed"] == 4 and stats["deduplicated"] == 1
    assert embed.__name__ == "embed"
    embed.flush()
    del embed  # releases the cache (and its writer lock)
    gc.collect()
    again = cachex.CachedFn(cachex.open(config(tmp_path)), lambda xs: pytest.fail("recomputed"))
    assert float(again(["dddd"], ids=["dddd"])[0][0]) == 4


def test_cached_fn_passes_the_functions_exception_and_caches_nothing(tmp_path):
    cache = cachex.open(config(tmp_path))

    def broken(xs):
        raise KeyError("model missing")

    f = cachex.CachedFn(cache, broken)
    with pytest.raises(KeyError, match="model missing"):
        f([1, 2], ids=["1", "2"])
    assert len(cache) == 0
    wrong_count = cachex.CachedFn(cache, lambda xs: [np.zeros(1)])
    with pytest.raises(cachex.InvalidInputError):
        wrong_count([1, 2], ids=["1", "2"])
    with pytest.raises(cachex.InvalidInputError, match="ids"):
        wrong_count([1])
