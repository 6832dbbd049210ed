"""Every public name of loadit's ``LoadIt`` exists in the drop-in, with the
same meaning or a ``NotProvidedError`` naming what to use instead.

The names are read from the real loadit (0.0.8, pinned in
scripts/interop-requirements.txt) at test time: a class and an instance of
it, so attributes set in ``__init__`` count too.
"""

from __future__ import annotations

import inspect

import pytest

import cachex
from cachex.loadit import LoadIt, NotProvidedError

loadit = pytest.importorskip("loadit", reason="the real loadit 0.0.8 is not installed")

# loadit's thread pool, which cachex's engine replaces (see cachex.loadit's docs).
NOT_PROVIDED = {"executor"}


def source():
    return iter(range(50))


def public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


@pytest.fixture
def theirs(tmp_path):
    return loadit.LoadIt(str(tmp_path / "theirs"), source, max_shard_length=8)


@pytest.fixture
def ours(tmp_path):
    return LoadIt(tmp_path / "ours", source, max_shard_length=8)


def test_every_public_name_of_loadit_s_loadit_exists(theirs, ours):
    names = public(loadit.LoadIt) | public(theirs)
    assert {"get", "info", "shards", "max_workers"} <= names  # the real one was read
    assert not names - public(ours), "missing in cachex.loadit.LoadIt"
    for name in sorted(names):
        if name in NOT_PROVIDED:
            with pytest.raises(NotProvidedError, match=f"LoadIt.{name} .*: .+"):
                getattr(ours, name)
        else:
            getattr(ours, name)


def test_methods_keep_loadit_s_signatures():
    for name in public(loadit.LoadIt) - NOT_PROVIDED:
        mine, real = getattr(LoadIt, name), getattr(loadit.LoadIt, name)
        if callable(real):
            assert [p for p in inspect.signature(mine).parameters] == [
                p for p in inspect.signature(real).parameters
            ], name


def test_public_values_mean_what_loadit_s_do(theirs, ours):
    for loader in (theirs, ours):
        assert loader.max_workers == 1 and loader.manual_length is None
        assert loader.shards.max_shard_length == 8
        assert not loader.all_cached_to_disk()
        assert loader.get_start_idx(13) == 8 and loader.get(13) == 13
        assert loader.count(7) == 1 and loader.index(7) == 7  # both read every item
        assert loader.all_cached_to_disk()
        loader.set_info({"k": 1})
        assert loader.info() == {"k": 1}
        assert loader.preload_fn is None or callable(loader.preload_fn)


def test_not_provided_names_raise_a_cachex_error_naming_the_replacement(ours):
    with pytest.raises(cachex.CacheError, match="load_async"):
        ours.executor  # noqa: B018
    assert getattr(ours, "executor", None) is None
    assert not hasattr(ours, "executor")
