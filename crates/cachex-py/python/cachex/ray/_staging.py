"""The staging area of a Ray write job, and its commit record.

Layout (``<staging>`` is ``<cache>/.staging`` for a segment store and
``<parent>/.<name>.staging`` for a page file or a memmap cache)::

    <staging>/<job>/job.lock            held by the driver while the job runs
    <staging>/<job>/task-000003/        write task 3's finished output
    <staging>/<job>/task-000003.attempt-<uuid>/   an attempt in progress or failed
    <staging>/<job>/commit.json         the commit, decided (see roll_forward)

A write task writes into a fresh attempt directory and, once its output is
durable, renames it to ``task-NNNNNN`` (replacing what an earlier attempt
of the same task left there), so a retried task's output is the last
attempt's only, and the job commits exactly the task directories that the
write results name.

A job whose ``job.lock`` no process holds is dead: :func:`recover` rolls
its commit forward when ``commit.json`` exists (the commit was decided; its
renames are replayed, each one only if its source is still there) and
deletes the job's directory otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cachex.errors import CacheIOError, InvalidInputError

JOB_LOCK = "job.lock"
COMMIT_RECORD = "commit.json"


def local_path(path_or_url: str | os.PathLike[str]) -> Path:
    """The local path of a cache (callers route URLs elsewhere first).

    Raises
    ------
    InvalidInputError
        ``path_or_url`` is a URL: the staging area of a local job has no
        place there.
    """
    text = os.fspath(path_or_url)
    if "://" in text:
        raise InvalidInputError(f"{text}: a URL, where a local path was expected")
    return Path(text).absolute()


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write a file under a temporary name, fsync it, rename it, fsync the directory."""
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def flock(path: Path, exclusive: bool = True) -> Iterator[bool]:
    """Hold an advisory ``flock`` on ``path`` (created if missing) if it is free.

    Yields whether it was taken; never waits. ``fs2``, which the Rust
    stores lock with, uses the same ``flock`` on Unix, so the two see each
    other's locks.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                yield False
                return
            raise CacheIOError(e.errno, f"{path}: cannot lock: {e.strerror}") from e
        yield True
    finally:
        os.close(fd)


class Job:
    """One write job's staging directory, held by the driver while the job runs."""

    def __init__(self, staging: Path, job_id: str | None = None) -> None:
        self.id = job_id or uuid.uuid4().hex
        self.dir = staging / self.id
        self._lock_fd: int | None = None
        self._started = False

    def start(self) -> None:
        """Create the directory and take the job's lock (driver side).

        The directory is made and locked under a hidden name, then renamed,
        so :func:`recover` never sees it unlocked.
        """
        if self._started:
            raise InvalidInputError(f"{self.dir}: a sink writes one dataset; make a new sink")
        self._started = True
        hidden = self.dir.with_name("." + self.id)
        hidden.mkdir(parents=True)
        fd = os.open(hidden / JOB_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(hidden, self.dir)
        fsync_dir(self.dir.parent)
        self._lock_fd = fd

    def release(self) -> None:
        """Drop the job's lock (after its directory is gone)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def remove(self) -> None:
        """Delete the job's directory (and the staging root once empty); drop the lock."""
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.dir.parent.rmdir()
        self.release()

    def __getstate__(self) -> dict:
        # Write tasks get the paths, never the driver's lock.
        return {"id": self.id, "dir": self.dir, "_lock_fd": None, "_started": True}

    def task_attempt(self, task: int) -> Path:
        """A fresh directory for one attempt of write task ``task``."""
        path = self.dir / f"task-{task:06d}.attempt-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def finish_task(self, task: int, attempt: Path) -> Path:
        """Make an attempt's durable output the task's output (replacing an earlier one's)."""
        final = self.dir / f"task-{task:06d}"
        if final.exists():
            shutil.rmtree(final)
        os.rename(attempt, final)
        fsync_dir(self.dir)
        return final

    def decide(self, renames: list[tuple[Path, Path]]) -> None:
        """Write the commit record: from here on the commit happens, even after a crash."""
        record = {"renames": [[str(s), str(d)] for s, d in renames]}
        write_durable(self.dir / COMMIT_RECORD, json.dumps(record).encode())


def task_parts(write_returns: Iterable[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The parts the write tasks staged (what their ``write`` returned), in
    task order; tasks that wrote nothing returned ``None``."""
    return sorted((r for r in write_returns if r is not None), key=lambda r: r["task"])


def roll_forward(job_dir: Path) -> bool:
    """Replay a decided commit's renames whose source is still there.

    Returns whether the job had a commit record.
    """
    record = job_dir / COMMIT_RECORD
    try:
        renames = json.loads(record.read_text())["renames"]
    except FileNotFoundError:
        return False
    parents = set()
    for src, dst in renames:
        if os.path.lexists(src):
            os.replace(src, dst)
            parents.add(Path(dst).parent)
    for parent in parents:
        fsync_dir(parent)
    return True


def recover(staging: Path) -> list[str]:
    """Finish or remove every dead job under ``staging``; return what was done.

    A job is dead when no process holds its ``job.lock`` (its driver
    exited or was killed). Live jobs are left alone.
    """
    done = []
    if not staging.is_dir():
        return done
    jobs = sorted(p for p in staging.iterdir() if p.is_dir() and not p.name.startswith("."))
    for job_dir in jobs:
        with flock(job_dir / JOB_LOCK) as free:
            if not free:
                continue
            committed = roll_forward(job_dir)
            shutil.rmtree(job_dir, ignore_errors=True)
            done.append(f"{job_dir.name}: {'commit rolled forward' if committed else 'removed'}")
    with contextlib.suppress(OSError):
        staging.rmdir()
    return done


Part = dict[str, Any]


def write_task(
    job: Job,
    task: int,
    write_part: Callable[[Path], Part | None],
    upload: Callable[[Path, Part], None] | None,
    prefix: str,
) -> Part | None:
    """One write task of a page or memmap sink: ``write_part(directory)``
    writes the task's part there. Locally (``upload`` None) into an attempt
    directory of ``job``, renamed to the task's once durable (``"dir"`` in
    the part); for a URL into a temporary directory (``prefix`` names it)
    that ``upload(directory, part)`` uploads from, then removes."""
    if upload is None:
        attempt = job.task_attempt(task)
        part = write_part(attempt)
        if part is not None:
            part["dir"] = job.finish_task(task, attempt).name
        return part
    staged = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        part = write_part(staged)
        if part is not None:
            upload(staged, part)
        return part
    finally:
        shutil.rmtree(staged, ignore_errors=True)
