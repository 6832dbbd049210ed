"""Issue 24 (11): dropping a ShardStore (or a LoadIt) whose background
workers are running the Python iterator never hangs: the binding never
joins them while holding the GIL they wait for. Each scenario runs many
times in a child interpreter with a bounded timeout, dropping loaders
mid-preload from the main thread and from the garbage collector (a
reference cycle collected by ``gc.collect``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCENARIO = textwrap.dedent(
    """
    import gc, sys
    import cachex
    from cachex.loadit import LoadIt

    def slow_items():
        # Python work per item, so workers are inside the iterator (wanting
        # the GIL) when the loader goes.
        for i in range(100_000):
            yield sum(range(200)) + i

    root = sys.argv[1]
    how = sys.argv[2]
    for k in range(int(sys.argv[3])):
        if how.startswith("loadit"):
            loader = LoadIt(f"{root}/{how}{k}", slow_items, max_shard_length=64,
                            max_workers=10, preload_all_async=True,
                            iterator_thread_safe=True)
            loader[0]
        else:
            loader = cachex.ShardStore(f"{root}/{how}{k}", slow_items,
                                       max_shard_length=64, max_workers=10,
                                       preload_all_async=True)
            loader[0]
        if how.endswith("gc"):
            cycle = [loader]
            cycle.append(cycle)
            del loader, cycle
            gc.collect()
        else:
            del loader
    print("done")
    """
)


@pytest.mark.parametrize("how", ["store", "store-gc", "loadit", "loadit-gc"])
def test_dropping_a_loader_mid_preload_never_hangs(tmp_path, how):
    try:
        out = subprocess.run(
            [sys.executable, "-c", SCENARIO, str(tmp_path), how, "20"],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"dropping loaders ({how}) hung: {e}") from None
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
