"""cachex.loadit across processes: a writer SIGKILLed mid-shard, two
processes on one root, and interop with the real loadit 0.0.8 both ways."""

from __future__ import annotations

import inspect
import logging
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import procs
from cachex.loadit import LoadIt

N, SHARD = 95, 10


def item(i: int) -> dict:
    return {"i": i, "blob": bytes([i % 251]) * 40, "t": (i, str(i))}


def source():
    """The deterministic source (module level, for spawned processes)."""
    return (item(i) for i in range(N))


DATA = [item(i) for i in range(N)]

KILLED_N, KILLED_AT = 1200, 1005

KILLED_WRITER = """
import sys, time
from pathlib import Path
from cachex.loadit import LoadIt
marker = Path(sys.argv[2])
def source():
    for i in range(1200):
        if i == 1005:
            marker.touch()
            time.sleep(3600)  # killed here, in the middle of shard 1000..1010
        yield {"i": i, "blob": bytes([i % 251]) * 40, "t": (i, str(i))}
loader = LoadIt(sys.argv[1], source, max_shard_length=10)
for x in loader:
    pass
"""


def killed_source():
    return (item(i) for i in range(KILLED_N))


def test_a_writer_killed_mid_shard_leaves_a_root_that_reopens_right(tmp_path):
    root, marker = tmp_path / "root", tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root), str(marker)])
    try:
        deadline = time.monotonic() + 120  # bounds a hang; not a timing assertion
        while not marker.exists():
            assert child.poll() is None, "the writer exited early"
            assert time.monotonic() < deadline, f"the writer never reached item {KILLED_AT}"
            time.sleep(0.01)
    finally:
        left = procs.end(child)  # SIGKILL, by pid, and reaped
    assert not left, left
    assert child.returncode == -signal.SIGKILL
    # Only whole shards, a prefix (the source is read ahead in batches, so
    # the last shards before the kill may not have been written).
    spans = sorted(tuple(map(int, p.name.split(".")[:2])) for p in (root / "shards").iterdir())
    assert spans and spans == [(s, s + SHARD) for s in range(0, spans[-1][1], SHARD)]
    assert spans[-1][1] <= KILLED_AT
    cached = LoadIt(root)
    done = spans[-1][1]
    assert list(cached[:done]) == [item(i) for i in range(done)]
    with pytest.raises(Exception, match="cached"):
        cached[done]
    reopened = LoadIt(root, killed_source, max_shard_length=SHARD)
    assert list(reopened) == [item(i) for i in range(KILLED_N)]
    assert len(reopened) == KILLED_N
    assert list((root / "scratch").iterdir()) == []


def _read_all(root: Path, queue) -> None:
    loader = LoadIt(root, source, max_shard_length=SHARD)
    queue.put([loader[i]["i"] for i in range(N - 1, -1, -7)] + [x["i"] for x in loader])


def test_two_processes_share_one_root(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    readers = [ctx.Process(target=_read_all, args=(tmp_path, queue)) for _ in range(2)]
    with procs.ended(*readers):
        for p in readers:
            p.start()
        results = [queue.get(timeout=120) for _ in readers]
    assert [p.exitcode for p in readers] == [0, 0]
    want = list(range(N - 1, -1, -7)) + list(range(N))
    assert results == [want, want]
    starts = [int(p.name.split(".")[0]) for p in (tmp_path / "shards").iterdir()]
    assert sorted(starts) == list(range(0, N, SHARD))  # each shard once


# Interop with the real loadit 0.0.8 (in the scripts/test venv).
loadit = pytest.importorskip("loadit", reason="the real loadit 0.0.8 is not installed")
logging.getLogger("loadit").setLevel(logging.ERROR)


def _real(root: Path, create_iter=None, **kw):
    loader = loadit.LoadIt(root, create_iter, **kw)
    return loader


def _stop(loader) -> None:
    loader.shards.stop_observer()


def test_signature_matches_loadit():
    params = inspect.signature(LoadIt).parameters
    # cachex's own keywords (a URL root's local tier) come after loadit's,
    # keyword-only, so that no call written for loadit changes meaning.
    extras = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert extras == ["tier_dir", "tier_budget", "storage_options"]
    ours = {n: p for n, p in params.items() if n not in extras}
    theirs = inspect.signature(loadit.LoadIt).parameters
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        if name != "preload_fn":  # ours is cachex's own preload_next_shard
            assert ours[name].default == p.default, name


def test_a_root_written_by_cachex_reads_in_loadit(tmp_path):
    ours = LoadIt(tmp_path, source, max_shard_length=SHARD, info={"from": "cachex"})
    assert list(ours) == DATA
    theirs = _real(tmp_path)
    try:
        assert len(theirs) == N and theirs.info() == {"from": "cachex"}
        assert [theirs[i] for i in range(N)] == DATA and theirs[-1] == DATA[-1]
        assert theirs.all_cached_to_disk()
    finally:
        _stop(theirs)


def test_a_root_written_by_loadit_reads_in_cachex(tmp_path):
    theirs = _real(tmp_path, source, max_shard_length=SHARD)
    try:
        assert [theirs[i] for i in range(N)] == DATA
    finally:
        _stop(theirs)
    ours = LoadIt(tmp_path)
    assert len(ours) == N and list(ours) == DATA and ours[-3] == DATA[-3]
    assert ours.all_cached_to_disk()


def test_a_half_written_loadit_root_is_completed_by_cachex_and_read_back(tmp_path):
    theirs = _real(tmp_path, source, max_shard_length=SHARD)
    try:
        assert theirs[25] == DATA[25]  # loadit writes shards 0..30
    finally:
        _stop(theirs)
    ours = LoadIt(tmp_path, source, max_shard_length="64mb")  # adopts 10
    assert ours[77] == DATA[77] and len(ours) == N
    ours.wait_until_all_cached()
    again = _real(tmp_path)
    try:
        assert [again[i] for i in range(N)] == DATA
    finally:
        _stop(again)
