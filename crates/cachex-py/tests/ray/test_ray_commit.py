"""cachex.ray's commit: retried tasks, failed jobs, a killed driver: no trace a reader sees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import procs
from ray_support import (
    cachex_verify,
    keyed_dataset,
    require_ray,
    run_cachex_verify,
    start_cluster,
)

ray = require_ray()

import cachex  # noqa: E402
import cachex.ray as cray  # noqa: E402

N = 400
BLOCKS = 4


@pytest.fixture(scope="module", autouse=True)
def cluster():
    yield from start_cluster(ray, __name__)


def dataset(n: int = N, start: int = 0):
    return keyed_dataset(ray, n, start, BLOCKS)


def check_values(path: Path, ids: range) -> None:
    store = cachex.SegmentStore(path, read_only=True)
    assert len(store) == len(ids)
    values, missing = store.get_batch([f"k{i}" for i in ids])
    assert missing == []
    for i, v in zip(ids, values, strict=True):
        np.testing.assert_array_equal(v, np.arange(i, i + 4, dtype=np.float32))


def rows_on_disk(path: Path) -> int:
    """Rows of every segment the store uses, dead or alive: each key written once adds one."""
    info = cachex.SegmentStore(path, read_only=True).inspect()
    return sum(s["rows"] for s in info["segments"])


def flaky_sink(path: Path, markers: Path, **kw):
    """A SegmentSink whose task 1 writes a block, then raises, on its first attempt only."""

    class FlakySink(cray.SegmentSink):
        def write(self, blocks, ctx):
            marker = markers / f"task-{ctx.task_idx}"
            if ctx.task_idx == 1 and not marker.exists():
                marker.touch()

                def first_then_fail():
                    yield next(iter(blocks))
                    raise RuntimeError("injected failure of a write task's first attempt")

                return super().write(first_then_fail(), ctx)
            return super().write(blocks, ctx)

    return FlakySink(path, **kw)


def test_retried_task_commits_every_key_once(tmp_path):
    path, markers = tmp_path / "cache", tmp_path / "markers"
    markers.mkdir()
    dataset().write_datasink(
        flaky_sink(path, markers, key_column="key", columns="value", flush_every=16),
        ray_remote_args={"max_retries": 2, "retry_exceptions": True},
    )
    assert (markers / "task-1").exists(), "the injected failure did not run"
    check_values(path, range(N))
    assert rows_on_disk(path) == N
    assert not (path / ".staging").exists()
    cachex_verify(path)


def test_failed_job_leaves_last_commit_and_no_staging(tmp_path):
    path, markers = tmp_path / "cache", tmp_path / "markers"
    markers.mkdir()
    dataset().write_datasink(cray.SegmentSink(path, key_column="key", columns="value"))
    with pytest.raises(Exception, match="injected failure"):
        dataset(N, N).write_datasink(
            flaky_sink(path, markers, key_column="key", columns="value"),
            ray_remote_args={"max_retries": 0},
        )
    check_values(path, range(N))
    assert rows_on_disk(path) == N
    assert not (path / ".staging").exists()
    cachex_verify(path)


DRIVER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import ray
    import cachex.ray as cray

    path, address, start, hook = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ray.init(address=address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False

    def extract(b):
        ids = b["id"] + start
        return {
            "key": np.array([f"k{i}" for i in ids], dtype=object),
            "value": (ids[:, None] + np.arange(4)[None, :]).astype(np.float32),
        }

    def stop_here():
        print("READY", flush=True)
        time.sleep(600)

    class Sink(cray.SegmentSink):
        pass

    if hook == "before_commit":
        Sink.on_write_complete = lambda self, result: stop_here()
    else:
        Sink._before_renames = lambda self: stop_here()
    ds = ray.data.range(N, override_num_blocks=BLOCKS).map_batches(extract)
    ds.write_datasink(Sink(path, key_column="key", columns="value"))
    """
).replace("N, override_num_blocks=BLOCKS", f"{N}, override_num_blocks={BLOCKS}")


def run_driver_until_ready(tmp_path: Path, path: Path, start: int, hook: str) -> None:
    """A second driver writes keys ``start..start+N`` and is SIGKILLed at ``hook``."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), address, str(start), hook],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", f"driver ended early: {line}{proc.stderr.read()}"
    finally:
        left = procs.end(proc)  # the driver and anything it started, by pid
    assert not left, left
    assert proc.returncode == -signal.SIGKILL


def test_driver_killed_before_commit_leaves_last_commit(tmp_path):
    path = tmp_path / "cache"
    dataset().write_datasink(cray.SegmentSink(path, key_column="key", columns="value"))
    run_driver_until_ready(tmp_path, path, N, "before_commit")

    # Every task's store is staged; none is visible.
    assert any((path / ".staging").glob("*/task-*"))
    check_values(path, range(N))
    assert rows_on_disk(path) == N
    cachex_verify(path)

    assert [line.split(": ")[1] for line in cray.recover_segments(path)] == ["removed"]
    assert not (path / ".staging").exists()
    check_values(path, range(N))
    # The cache takes the next job as if nothing had happened.
    dataset(N, N).write_datasink(cray.SegmentSink(path, key_column="key", columns="value"))
    check_values(path, range(2 * N))
    assert rows_on_disk(path) == 2 * N
    cachex_verify(path)


def test_driver_killed_after_commit_decided_rolls_forward(tmp_path):
    path = tmp_path / "cache"
    dataset().write_datasink(cray.SegmentSink(path, key_column="key", columns="value"))
    run_driver_until_ready(tmp_path, path, N, "after_decided")

    # Decided but not yet renamed: readers still see the last commit.
    [record] = (path / ".staging").glob("*/commit.json")
    check_values(path, range(N))
    cachex_verify(path)
    # As if the crash came after the first segment's rename: readers ignore
    # a segment that no log names; verify reports it as unindexed, and only it.
    src, dst = json.loads(record.read_text())["renames"][0]
    os.rename(src, dst)
    check_values(path, range(N))
    run = run_cachex_verify(path)
    problems = [line for line in run.stdout.splitlines() if line.startswith("problem")]
    assert problems and all(Path(dst).name in line for line in problems), run.stdout

    assert [line.split(": ")[1] for line in cray.recover_segments(path)] == [
        "commit rolled forward"
    ]
    check_values(path, range(2 * N))
    assert rows_on_disk(path) == 2 * N
    cachex_verify(path)


def test_page_sink_killed_before_rename_keeps_old_file(tmp_path):
    path = tmp_path / "s.pages"
    fields = {"label": "int", "value": ("<f4", [4])}
    ds = dataset().map_batches(lambda b: {"label": np.arange(len(b["key"])), "value": b["value"]})
    ds.write_datasink(cray.PageSink(path, fields))
    before = path.read_bytes()

    class CrashError(Exception):
        pass

    class CrashingSink(cray.PageSink):
        def _before_rename(self):
            raise CrashError("stop before the commit's rename")

    with pytest.raises(Exception, match="stop before the commit"):
        dataset(N // 2).map_batches(
            lambda b: {"label": np.arange(len(b["key"])), "value": b["value"]}
        ).write_datasink(CrashingSink(path, fields, overwrite=True))
    assert path.read_bytes() == before
    assert not (tmp_path / ".s.pages.staging").exists()
