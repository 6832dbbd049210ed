"""The staging area of a Ray write job on a local cache, and its commit.

The protocol — the layout of ``<staging>/<job>/``, its lock, the task
attempts, the commit record and the recovery of a job whose driver died —
is remote-cache's (``crates/remote-cache/src/staging.rs`` documents it);
this module hands the native module the paths of a job. ``<staging>`` is
``<cache>/.staging`` for a segment store and ``<parent>/.<name>.staging``
for a page file or a memmap cache.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cachex import _cachex
from cachex.errors import InvalidInputError

#: What a write task returns to the driver for the part it staged.
Part = dict[str, Any]


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


def staging_beside(path: Path) -> Path:
    """The staging directory of the jobs writing the file or directory ``path``."""
    return path.parent / f".{path.name}.staging"


class Job:
    """One write job's staging directory, held by the driver while the job runs.

    Pickled to the write tasks without the driver's lock: they get the paths.
    """

    def __init__(self, staging: Path, job_id: str | None = None) -> None:
        self.id = job_id or uuid.uuid4().hex
        self.staging = staging
        self.dir = staging / self.id
        self._held: _cachex._StagingJob | None = None
        self._started = False

    def start(self) -> None:
        """Create the directory and take the job's lock (driver side)."""
        if self._started:
            raise InvalidInputError(f"{self.dir}: a sink writes one dataset; make a new sink")
        self._started = True
        self._held = _cachex._StagingJob(self.staging, self.id)

    def remove(self) -> None:
        """Delete the job's directory (and the staging root once empty); drop the lock."""
        if self._held is not None:
            self._held.remove()
            self._held = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None, "_started": True}

    def task_attempt(self, task: int) -> Path:
        """A fresh directory for one attempt of write task ``task``."""
        return _cachex._staging_task_attempt(self.dir, task)

    def finish_task(self, task: int, attempt: Path) -> Path:
        """Make an attempt's durable output the task's output (replacing an earlier one's)."""
        return _cachex._staging_finish_task(self.dir, task, attempt)


def task_parts(write_returns: Iterable[Part | None]) -> list[Part]:
    """The parts the write tasks staged (what their ``write`` returned), in
    task order; tasks that wrote nothing returned ``None``."""
    return sorted((r for r in write_returns if r is not None), key=lambda r: r["task"])


def recover(staging: Path) -> list[str]:
    """Finish or remove every dead job under ``staging``; return what was done.

    A job is dead when no process holds its lock (its driver exited or
    was killed); live jobs are left alone. One line per job:
    ``"<job>: commit rolled forward"`` or ``"<job>: removed"``.
    """
    return _cachex._staging_recover(staging)


def commit_rename(staged: Path, target: Path) -> None:
    """Put a merged file or directory in place with one durable rename: the commit."""
    _cachex._staging_commit_rename(staged, target)
