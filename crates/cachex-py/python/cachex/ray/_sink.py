"""The skeleton every cachex Ray sink shares.

A write job runs in three places: the driver starts it
(``on_write_start``), each write task writes its part (``write``), and
the driver commits the parts the write results name
(``on_write_complete``) or drops them (``on_write_failed``). On a local
path the parts are staged in a job directory beside the cache and
committed by the crates' protocol (:mod:`cachex.ray._staging`); on a URL
each task writes its part in a temporary directory of its own machine
and uploads it as objects no commit names, and the driver publishes the
job as one commit (:mod:`cachex.ray._objects`).

:class:`StagedSink` holds that skeleton; each sink says what differs: how
a task writes its part and uploads it, what the driver checks first, and
how it commits. :class:`MergedSink` is the skeleton of the sinks whose
parts the driver merges into one file or directory (page files, memmap
caches).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ray.data.block import Block
from ray.data.datasource import Datasink, WriteResult

from cachex.errors import SchemaMismatchError
from cachex.ray._objects import Files, Remote
from cachex.ray._staging import Job, Part, commit_rename, task_parts


class StagedSink(Datasink[Any]):
    """A sink whose write tasks stage parts that the driver commits at once.

    Subclasses set ``self.remote`` (``None`` on a local path), ``self.path``
    and ``self.job`` in ``__init__``, and implement :meth:`_write_part`,
    :meth:`_upload`, :meth:`_prepare_local`, :meth:`_commit_local` and
    :meth:`_commit_remote`.
    """

    remote: Remote | None
    path: Path
    job: Job
    #: The prefix of a write task's temporary directory on a URL.
    TEMP_PREFIX = "cachex-ray-"

    def on_write_start(self, schema: Any = None) -> None:
        if self.remote is not None:
            self._check_remote(self.remote)
            return
        self._prepare_local()
        self.job.start()

    def write(self, blocks: Iterable[Block], ctx: Any) -> Part | None:
        task = ctx.task_idx
        if self.remote is None:
            attempt = self.job.task_attempt(task)
            part = self._write_part(attempt, blocks, task)
            if part is not None:
                part["dir"] = self.job.finish_task(task, attempt).name
            return part
        staged = Path(tempfile.mkdtemp(prefix=self.TEMP_PREFIX))
        try:
            part = self._write_part(staged, blocks, task)
            if part is not None:
                self._upload(self.remote, task, staged, part)
            return part
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def on_write_complete(self, write_result: WriteResult[Any]) -> None:
        parts = task_parts(write_result.write_returns)
        if self.remote is not None:
            if parts:
                self._commit_remote(self.remote, parts)
            return
        self._commit_local(parts)
        self.job.remove()

    def on_write_failed(self, error: Exception) -> None:
        if self.remote is None:
            self.job.remove()

    def _check_remote(self, remote: Remote) -> None:
        """Refuse to start a job on the URL (driver side, before any task runs)."""

    def _prepare_local(self) -> None:
        """Check the local target and recover dead jobs before this one starts."""
        raise NotImplementedError

    def _write_part(self, directory: Path, blocks: Iterable[Block], task: int) -> Part | None:
        """Write the task's blocks into ``directory``; ``None`` when there were none."""
        raise NotImplementedError

    def _upload(self, remote: Remote, task: int, staged: Path, part: Part) -> None:
        """Upload the part written in ``staged`` as objects no commit names (into ``part``)."""
        raise NotImplementedError

    def _commit_local(self, parts: list[Part]) -> None:
        """Commit the staged parts (task order) into the local target."""
        raise NotImplementedError

    def _commit_remote(self, remote: Remote, parts: list[Part]) -> None:
        """Publish the uploaded parts (task order) as one commit of the URL's log."""
        raise NotImplementedError


class MergedSink(StagedSink):
    """A sink whose parts the driver merges, in task order, into one file or
    directory, committed whole: one rename on a path, one commit on a URL.

    Subclasses say where a staged part lives (``PART``), what each part
    records of its layout (``SPEC``), and implement :meth:`_merge`,
    :meth:`_fetch_part`, :meth:`_merged_files` and :meth:`_check_published`.
    """

    #: The part a task writes in its directory (a file or a directory).
    PART = "part"
    #: The key of a part's layout in its write result, and the keyword
    #: that fixes it (``"fields"``, ``"arrays"``).
    SPEC = "spec"
    #: The store kind of the uploads (``"pages"``, ``"arrays"``).
    KIND = ""

    def _spec(self, parts: list[Part]) -> Any:
        """The layout every part has (tasks infer it from their own blocks)."""
        spec = parts[0][self.SPEC]
        for p in parts:
            if p[self.SPEC] != spec:
                raise SchemaMismatchError(
                    f"{self.path}: write tasks inferred different {self.SPEC} "
                    f"({spec} and {p[self.SPEC]}); pass {self.SPEC}= explicitly"
                )
        return spec

    def _merged(self, directory: Path) -> Path:
        return directory / ("merged" + self.path.suffix)

    def _commit_local(self, parts: list[Part]) -> None:
        if not parts:
            return
        merged = self._merged(self.job.dir)
        staged = [self.job.dir / p["dir"] / self.PART for p in parts]
        self._merge(staged, self._spec(parts), merged)
        self._before_rename()
        commit_rename(merged, self.path)

    def _commit_remote(self, remote: Remote, parts: list[Part]) -> None:
        """Fetch the uploaded parts, merge them here, publish the result as one commit."""
        spec = self._spec(parts)
        with tempfile.TemporaryDirectory(prefix=self.TEMP_PREFIX) as tmp:
            fetched = [self._fetch_part(remote, p, Path(tmp)) for p in parts]
            merged = self._merged(Path(tmp))
            self._merge(fetched, spec, merged)
            for part in fetched:
                if part.is_dir():
                    shutil.rmtree(part)
                else:
                    part.unlink()
            pieces = remote.upload(self.KIND, self._merged_files(merged))

            def decide(files: Files) -> list[str]:
                self._check_published(files)
                return pieces

            remote.publish(decide)

    def _merge(self, parts: list[Path], spec: Any, merged: Path) -> None:
        """Merge the parts, in order, into ``merged``."""
        raise NotImplementedError

    def _fetch_part(self, remote: Remote, part: Part, directory: Path) -> Path:
        """Fetch an uploaded part into ``directory``; its local path."""
        raise NotImplementedError

    def _merged_files(self, merged: Path) -> list[tuple[str, Path]]:
        """The files to publish: ``(path in the cache, local file)``."""
        raise NotImplementedError

    def _check_published(self, files: Files) -> None:
        """Refuse to commit over what the log's last commit holds."""

    def _before_rename(self) -> None:
        """Called with the merged result written, before the commit's rename (a crash point)."""
