"""Fork safety: the os.register_at_fork hook marks every live handle, readers
reopen their files in the child (never using the parent's descriptors or
mappings), and writers opened before a fork refuse to write in the child
with a typed error naming the file, leaving the parent's cache intact."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time

import numpy as np

import cachex
import procs

FORK = mp.get_context("fork")


def run_in_fork(target, *args):
    """Runs `target(*args)` in a forked child; returns what it returned."""
    queue = FORK.Queue()

    def main():
        try:
            queue.put(("ok", target(*args)))
        except BaseException as e:  # report anything to the parent's assert
            queue.put(("error", f"{type(e).__name__}: {e}"))

    child = FORK.Process(target=main)
    with procs.ended(child):
        child.start()
        status, value = queue.get(timeout=120)
    assert child.exitcode == 0
    assert status == "ok", value
    return value


def refused(call) -> tuple[str, str]:
    """The class name and message of the exception `call()` raises."""
    try:
        call()
    except cachex.CacheError as e:
        return type(e).__name__, str(e)
    return "nothing", ""


def snapshot(root) -> dict:
    """Every file under `root` with its size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def write_pages(path, values) -> None:
    w = cachex.PageWriter(path, {"v": "int"})
    w.write_many([{"v": v} for v in values])
    w.finalize()


def write_memmap(path, values) -> None:
    w = cachex.MemmapWriter(path, {"v": ("int64", (2,))})
    for k, v in enumerate(values):
        w.write(f"s{k}", {"v": np.array([v, v])})
    w.finalize()


def test_readers_reopen_their_files_in_a_forked_child(tmp_path):
    pages = tmp_path / "a.pages"
    write_pages(pages, [1, 2, 3])
    reader = cachex.PageReader(pages)
    memmap = tmp_path / "m"
    write_memmap(memmap, [1, 2, 3])
    array = cachex.MemmapArray(memmap)
    assert reader.sample(0)["v"] == 1 and array.get(0, "v")[0] == 1  # mapped before the fork

    # Replace both on disk: the parent's handles keep the files they mapped.
    write_pages(tmp_path / "b.pages", [10, 20])
    os.replace(tmp_path / "b.pages", pages)
    write_memmap(tmp_path / "m2", [10, 20])
    shutil.move(memmap, tmp_path / "m-old")
    shutil.move(tmp_path / "m2", memmap)
    assert len(reader) == 3 and reader.sample(0)["v"] == 1
    assert len(array) == 3 and array.get(0, "v")[0] == 1

    def child():
        seen = (len(reader), reader.sample(0)["v"], len(array), int(array.get(0, "v")[0]))
        # A grandchild reopens again (the hook marks the child's handles too).
        pid = os.fork()
        if pid == 0:
            ok = reader.sample(1)["v"] == 20 and int(array.get(1, "v")[0]) == 20
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        return seen, os.waitstatus_to_exitcode(status)

    assert run_in_fork(child) == ((2, 10, 2, 10), 0)
    # The parent's handles are untouched by the child's reopen.
    assert len(reader) == 3 and reader.sample(2)["v"] == 3
    assert len(array) == 3 and array.get(2, "v")[1] == 3


def test_a_memmap_writer_refuses_in_a_forked_child_and_the_parent_finishes(tmp_path):
    held = [cachex.MemmapWriter(tmp_path, {"v": ("int64", (2,))})]
    held[0].write("a", {"v": np.array([1, 1])})
    before = snapshot(tmp_path)

    def child():
        w = held.pop()  # the child's only reference: dropped below
        calls = [
            lambda: w.write("child", {"v": np.array([9, 9])}),
            w.flush,
            w.finalize,
            lambda: w.resume_keys,
        ]
        results = [refused(c) for c in calls]
        calls = w = None  # dropping the inherited writer must not commit or unlock
        gc.collect()
        return results

    for name, message in run_in_fork(child):
        assert name == "ForkedWriterError" and str(tmp_path) in message
    assert snapshot(tmp_path) == before
    held[0].write("b", {"v": np.array([2, 2])})
    assert held[0].finalize() == 2
    cache = cachex.MemmapArray(tmp_path)
    assert [cache.source(i) for i in range(len(cache))] == ["a", "b"]
    assert cache.verify()["problems"] == []


def test_a_page_writer_refuses_in_a_forked_child_and_the_parent_finishes(tmp_path):
    path = tmp_path / "p.pages"
    held = [cachex.PageWriter(path, {"v": "int"})]
    held[0].append({"v": 1})
    before = snapshot(tmp_path)

    def child():
        w = held.pop()  # the child's only reference: dropped below
        results = [
            refused(lambda: w.append({"v": 9})),
            refused(lambda: w.write_many([{"v": 9}])),
            refused(w.finalize),
        ]
        w = None  # dropping the inherited writer must not delete the parent's file
        gc.collect()
        return results

    for name, message in run_in_fork(child):
        assert name == "ForkedWriterError" and str(path) in message
    assert snapshot(tmp_path) == before
    held[0].append({"v": 2})
    assert held[0].finalize()["num_samples"] == 2
    reader = cachex.PageReader(path)
    assert [reader.sample(i)["v"] for i in range(len(reader))] == [1, 2]
    assert reader.verify()["problems"] == []


def test_a_segment_writer_refuses_in_a_forked_child_and_reads_read_only(tmp_path):
    store = cachex.SegmentStore(tmp_path, flush_every=2)
    store.put_batch({"a": np.ones(2), "b": np.zeros(2)})
    store.flush()
    store.put_batch({"pending": np.full(2, 5.0)})  # buffered in the parent only

    def child():
        got = store.get("a").tolist()
        calls = [lambda: store.put_batch({"child": np.ones(2)}), store.flush, store.compact]
        return got, [refused(c) for c in calls]

    got, results = run_in_fork(child)
    assert got == [1.0, 1.0]
    for name, message in results:
        assert name == "ForkedWriterError" and str(tmp_path) in message
    store.close()
    reopened = cachex.SegmentStore(tmp_path, read_only=True)
    assert len(reopened) == 3 and "child" not in reopened
    assert reopened.get("pending").tolist() == [5.0, 5.0]


def test_a_facade_cache_and_cached_fn_store_nothing_in_a_forked_child(tmp_path):
    cache = cachex.open(
        {"backend": "segment-store", "root": str(tmp_path), "name": "f", "create_root": True}
    )
    embed = cachex.CachedFn(cache, lambda xs: [np.full(2, float(x)) for x in xs])
    assert [v.tolist() for v in embed([1, 2], ids=["1", "2"])] == [[1.0, 1.0], [2.0, 2.0]]
    path = cache.path
    before = snapshot(path)
    held = [cache, embed]
    del cache, embed

    def child():
        cache, embed = held
        held.clear()  # with these, the child's only references: dropped below
        results = [
            refused(lambda: cache.put_batch({"child": np.ones(2)})),
            refused(cache.flush),
            refused(lambda: embed([3], ids=["3"])),
            refused(embed.flush),
        ]
        cache = embed = None  # dropping the inherited handles must not flush or join
        gc.collect()
        return results

    for name, message in run_in_fork(child):
        assert name == "ForkedWriterError" and str(path) in message
    assert snapshot(path) == before
    cache, embed = held
    embed.flush()
    assert len(cache) == 2
    values, missing = cache.get_batch(["1", "2", "3", "child"])
    assert missing == [2, 3] and values[1].tolist() == [2.0, 2.0]


def test_forked_writer_error_is_a_read_only_error():
    assert issubclass(cachex.ForkedWriterError, cachex.ReadOnlyError)
    assert issubclass(cachex.ForkedWriterError, cachex.CacheError)


def fork_and_wait(child_main, timeout_s: float = 30.0) -> int:
    """Forks; the child runs `child_main()` and exits with its return code.
    Returns the child's exit code, or fails (killing it) if it hangs."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            code = child_main()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"forked child {pid} hung (a lock held by a parent thread?)")


def test_a_fork_while_another_thread_reads_leaves_the_child_usable(tmp_path):
    """A thread of the parent is inside a read with the GIL released when
    the main thread forks: the child's handles must not wait on a lock that
    thread held, since it does not exist in the child."""
    seg = cachex.SegmentStore(tmp_path / "seg")
    keys = [f"k{i}" for i in range(2000)]
    seg.put_batch({k: np.full(256, i, np.float32) for i, k in enumerate(keys)})
    seg.flush()
    shards = cachex.ShardStore(tmp_path / "shards", lambda: iter(range(5000)))
    assert shards[4999] == 4999

    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            seg.get_batch(keys)
            shards.get_many(list(range(0, 5000, 7)))

    readers = [threading.Thread(target=hammer) for _ in range(2)]
    for t in readers:
        t.start()
    try:

        def child() -> int:
            values, missing = seg.get_batch(["k7", "k1999"])
            ok = missing == [] and values[0][0] == 7 and values[1][0] == 1999
            return 0 if ok and shards[123] == 123 else 2

        for _ in range(10):
            time.sleep(0.02)  # let the readers get back into their calls
            assert fork_and_wait(child) == 0
    finally:
        stop.set()
        for t in readers:
            t.join()


def test_a_fork_while_threads_read_through_cachex_open_leaves_the_child_usable(tmp_path):
    """Issue 24 (4): a `cachex.open` handle used by parent threads at the
    moment of a fork. The child reopens the cache read-only instead of
    using the parent's backend, whose locks a parent thread may hold (5 of
    20 children hung before)."""
    cache = cachex.open(
        {"backend": "segment-store", "root": str(tmp_path), "name": "f", "create_root": True}
    )
    keys = [f"k{i}" for i in range(2000)]
    cache.put_batch({k: np.full(256, i, np.float32) for i, k in enumerate(keys)})
    cache.flush()

    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            cache.get_batch(keys)
            len(cache)

    readers = [threading.Thread(target=hammer) for _ in range(2)]
    for t in readers:
        t.start()
    try:

        def child() -> int:
            values, missing = cache.get_batch(["k7", "k1999", "absent"])
            ok = missing == [2] and values[0][0] == 7 and values[1][0] == 1999
            name, _ = refused(lambda: cache.put_batch({"child": np.ones(2)}))
            return 0 if ok and len(cache) == 2000 and name == "ForkedWriterError" else 2

        for _ in range(20):
            time.sleep(0.02)  # let the readers get back into their calls
            assert fork_and_wait(child) == 0
    finally:
        stop.set()
        for t in readers:
            t.join()
    # The parent's handle is untouched and still writes.
    cache.put_batch({"after": np.ones(2, np.float32)})
    cache.flush()
    assert len(cache) == 2001
