"""Writers on ``s3://`` that never call a cachex-only method: a ``LoadIt``
and an ``ArrowIPCCacheBackend`` used as loadit's and torchcachex's users
use them (filled, read, dropped; or left open when the interpreter exits)
publish what they wrote, and what they persist reaches the bucket while
they live. Each time another process, on a tier of its own, reads it.
So does a writer a ``multiprocessing`` child (``fork``, ``forkserver``,
``spawn``) or a ``Pool`` worker keeps open until it ends, on ``file://``
and ``s3://``: a ``fork`` or ``forkserver`` child leaves with
``os._exit``, past ``atexit``."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest

import cachex
import procs
from cachex.loadit import LoadIt
from cachex.torchcachex import ArrowIPCCacheBackend

N = 48
#: Bounds a hang of a child process; not a timing assertion.
TIMEOUT = 300


def squares():
    return ({"i": i, "sq": i * i} for i in range(N))


def child(code: str, *args: str) -> str:
    """Runs ``code`` in another interpreter with ``args``; its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


READ_LOADIT = """
import json, sys
from cachex.loadit import LoadIt
loader = LoadIt(sys.argv[1], None, **json.loads(sys.argv[2]))
print(json.dumps([loader[i] for i in range(len(loader))]))
"""


def test_a_loadit_on_s3_filled_read_and_dropped_without_close_is_read_elsewhere(s3):
    url = s3.url("dropped")
    loader = LoadIt(url, squares, max_shard_length=10, **s3.tier("writer"))
    assert [x["sq"] for x in loader] == [i * i for i in range(N)]
    assert loader[17] == {"i": 17, "sq": 289}
    del loader  # as loadit's users do: loadit has no close()
    gc.collect()
    got = json.loads(child(READ_LOADIT, url, json.dumps(s3.tier("reader"))))
    assert got == list(squares())


WRITE_LOADIT_AND_EXIT = """
import json, sys
from cachex.loadit import LoadIt
def squares():
    return ({"i": i, "sq": i * i} for i in range(48))
loader = LoadIt(sys.argv[1], squares, max_shard_length=10, **json.loads(sys.argv[2]))
assert len(loader) == 48 and loader[47]["sq"] == 47 * 47
# No close, no del: the interpreter exits with the writer open.
"""


def test_a_loadit_on_s3_left_open_at_exit_is_read_elsewhere(s3):
    url = s3.url("at-exit")
    child(WRITE_LOADIT_AND_EXIT, url, json.dumps(s3.tier("writer")))
    reader = LoadIt(url, None, **s3.tier("reader"))
    assert [reader[i] for i in range(len(reader))] == list(squares())


WAIT_FOR_ITEM = """
import json, sys, time
from cachex.loadit import LoadIt
url, tier, want = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 120  # bounds a hang; not a timing assertion
while True:
    try:
        loader = LoadIt(url, None, **tier)
        print(json.dumps(loader[want]))
        break
    except Exception as e:
        assert time.monotonic() < deadline, f"never published: {e}"
        time.sleep(0.1)
"""


def test_a_completed_shard_reaches_the_bucket_before_the_writer_closes(s3, monkeypatch):
    monkeypatch.setenv("CACHEX_PUBLISH_INTERVAL", "0.2")
    url = s3.url("live")
    writer = LoadIt(url, squares, max_shard_length=10, **s3.tier("writer"))
    assert writer[5] == {"i": 5, "sq": 25}  # generates the first shard
    got = child(WAIT_FOR_ITEM, url, json.dumps(s3.tier("reader")), "5")
    assert json.loads(got) == {"i": 5, "sq": 25}
    writer.close()


def x_of(i: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + i


READ_BACKEND = """
import json, sys
import numpy as np
from cachex.torchcachex import ArrowIPCCacheBackend
url, tier, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
backend = ArrowIPCCacheBackend(url, "features_v1", lru_size=0, current_rank=1, **tier)
values, missing = backend.get_batch([f"k{i}" for i in range(n)])
sums = [float(np.asarray(v).sum()) for v in values if v is not None]
print(json.dumps({"missing": missing, "sums": sums}))
"""


def read_backend_elsewhere(s3, url: str, n: int) -> dict:
    return json.loads(child(READ_BACKEND, url, json.dumps(s3.tier("reader")), str(n)))


def test_an_arrow_ipc_backend_on_s3_dropped_without_flush_is_read_elsewhere(s3):
    url = s3.url("torchcachex")
    backend = ArrowIPCCacheBackend(
        url, "features_v1", async_write=False, flush_every=16, **s3.tier("writer")
    )
    backend.put_batch({f"k{i}": x_of(i) for i in range(N)})
    values, missing = backend.get_batch(["k3"])
    assert missing == [] and np.array_equal(values[0], x_of(3))
    del backend
    gc.collect()
    got = read_backend_elsewhere(s3, url, N)
    assert got == {"missing": [], "sums": [float(x_of(i).sum()) for i in range(N)]}


WRITE_BACKEND_AND_EXIT = """
import json, sys
import numpy as np
from cachex.torchcachex import ArrowIPCCacheBackend
tier = json.loads(sys.argv[2])
backend = ArrowIPCCacheBackend(sys.argv[1], "features_v1", flush_every=16, **tier)
backend.put_batch({f"k{i}": np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(40)})
# No flush, no close: the interpreter exits with 8 records pending.
"""


def test_an_arrow_ipc_backend_on_s3_left_open_at_exit_is_read_elsewhere(s3):
    url = s3.url("torchcachex-at-exit")
    child(WRITE_BACKEND_AND_EXIT, url, json.dumps(s3.tier("writer")))
    backend = ArrowIPCCacheBackend(
        url, "features_v1", lru_size=0, current_rank=1, **s3.tier("reader")
    )
    values, missing = backend.get_batch([f"k{i}" for i in range(40)])
    assert missing == []
    assert all(np.array_equal(v, x_of(i)) for i, v in enumerate(values))


WAIT_FOR_KEYS = """
import json, sys, time
from cachex.torchcachex import ArrowIPCCacheBackend
url, tier, keys = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(",")
deadline = time.monotonic() + 120  # bounds a hang; not a timing assertion
while True:
    try:
        backend = ArrowIPCCacheBackend(url, "features_v1", lru_size=0, current_rank=1, **tier)
        if backend.get_batch(keys)[1] == []:
            break
        backend.close()
    except Exception as e:
        assert time.monotonic() < deadline, f"never published: {e}"
    assert time.monotonic() < deadline, "never published"
    time.sleep(0.1)
"""


def test_a_flushed_segment_reaches_the_bucket_before_the_backend_closes(s3, monkeypatch):
    monkeypatch.setenv("CACHEX_PUBLISH_INTERVAL", "0.2")
    url = s3.url("torchcachex-live")
    backend = ArrowIPCCacheBackend(
        url, "features_v1", async_write=False, flush_every=16, **s3.tier("writer")
    )
    # Two segments the store flushed on its own; 8 records pending.
    backend.put_batch({f"k{i}": x_of(i) for i in range(40)})
    child(WAIT_FOR_KEYS, url, json.dumps(s3.tier("reader")), "k0,k31")
    backend.close()
    got = read_backend_elsewhere(s3, url, 40)
    assert got["missing"] == []


# --- a writer a multiprocessing child keeps open until it ends -------------------

#: Records each child puts: fewer than a segment store flushes on its own.
RECORDS = 100
METHODS = ["fork", "forkserver", "spawn"]

#: The writers this process keeps until it ends, as a program keeps one in
#: a global: never dropped, so only the process's exit publishes them.
KEPT: list[tuple[str, cachex.SegmentStore]] = []


def open_kept_writer(url: str, tier: dict) -> cachex.SegmentStore:
    """A writer on ``url`` kept in :data:`KEPT`; only its last publish
    publishes (no background ones), whatever environment a forkserver
    hands the child."""
    os.environ["CACHEX_PUBLISH_INTERVAL"] = "0"
    writer = cachex.SegmentStore(url, **tier)
    KEPT.append((url, writer))
    return writer


def put_and_keep(url: str, tier: dict, keys: Iterable[int]) -> None:
    """A child's target: puts ``keys`` and returns with the writer open
    (no flush, no close)."""
    open_kept_writer(url, tier).put_batch({f"k{i}": x_of(i) for i in keys})


def open_writer_of_worker(root: str, tier: dict) -> None:
    """A ``Pool`` initializer: each worker keeps a writer on a URL of its own."""
    open_kept_writer(f"{root}/worker-{os.getpid()}", tier)


def put_on_workers_writer(i: int) -> str:
    """A ``Pool`` task: puts record ``i`` on the worker's writer; its URL."""
    url, writer = KEPT[0]
    writer.put_batch({f"k{i}": x_of(i)})
    return url


def file_bucket(tmp_path: Path) -> tuple[str, Callable[[str], dict]]:
    """A ``file://`` bucket in ``tmp_path`` and the keywords of a store on
    a local tier of its own there."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()

    def tier(name: str) -> dict:
        return {"tier_dir": str(tmp_path / f"tier-{name}"), "tier_budget": "1G"}

    return f"file://{bucket}", tier


def assert_published(url: str, tier: dict, keys: list[int]) -> None:
    """A fresh reader of ``url`` on ``tier`` finds exactly ``keys``."""
    reader = cachex.SegmentStore(url, read_only=True, **tier)
    assert len(reader) == len(keys), f"{url}: {len(reader)} of {len(keys)} records published"
    values, missing = reader.get_batch([f"k{i}" for i in keys])
    assert missing == []
    assert all(np.array_equal(v, x_of(i)) for i, v in zip(keys, values, strict=True))
    reader.close()


def run_child(method: str, url: str, tier: dict) -> None:
    """Runs :func:`put_and_keep` in a child started by ``method`` to its end."""
    child = mp.get_context(method).Process(target=put_and_keep, args=(url, tier, range(RECORDS)))
    with procs.ended(child):
        child.start()
        child.join(TIMEOUT)
    assert child.exitcode == 0


@pytest.mark.parametrize("method", METHODS)
def test_a_writer_a_child_keeps_open_until_it_ends_is_published(tmp_path, method):
    root, tier = file_bucket(tmp_path)
    run_child(method, f"{root}/child", tier("writer"))
    assert_published(f"{root}/child", tier("reader"), list(range(RECORDS)))


def test_a_writer_a_forked_child_keeps_open_on_s3_is_published(s3):
    run_child("fork", s3.url("child"), s3.tier("writer"))
    assert_published(s3.url("child"), s3.tier("reader"), list(range(RECORDS)))


@pytest.mark.parametrize("method", METHODS)
def test_writers_pool_workers_keep_in_a_global_are_published_once_the_pool_joins(tmp_path, method):
    root, tier = file_bucket(tmp_path)
    pool = mp.get_context(method).Pool(
        2, initializer=open_writer_of_worker, initargs=(root, tier("workers"))
    )
    try:
        urls = pool.map(put_on_workers_writer, range(RECORDS), chunksize=10)
        # close() and join(): the workers end their own way. terminate(),
        # as leaving a `with Pool()` block does, would kill them first.
        pool.close()
        pool.join()
    finally:
        pool.terminate()  # ends the workers a failure left running
    keys_of: dict[str, list[int]] = {}
    for i, url in enumerate(urls):
        keys_of.setdefault(url, []).append(i)
    for url, keys in keys_of.items():
        assert_published(url, tier("reader"), keys)
