"""Ray Data's sink and source for a segment store (:class:`cachex.SegmentStore`).

Write protocol (:class:`SegmentSink`)
-------------------------------------
Every write task fills a segment store of its own, in a staging attempt
directory ``<cache>/.staging/<job>/task-NNNNNN.attempt-<uuid>``, closes it
(every segment durable) and renames the attempt to ``task-NNNNNN``,
replacing what an earlier attempt of the same task left; a task that fails
leaves only an attempt directory that no commit names. Nothing under
``.staging`` is read by a store: segment-store reads ``segments/``,
``writers/`` and the shared log only.

``on_write_complete`` commits the tasks named by the write results, under
the cache's ``segment-store.lock`` held *shared* (as every multi-writer
holds it: a single writer or a compaction cannot run meanwhile):

1. checks the tasks' ``schema.json`` against each other and the cache's;
2. picks a multi-writer id ``W`` with no log in the cache (from 4095 down)
   and takes its lock, and gives the staged segments new ids in ``W``'s
   residue class above every segment id in the cache, so the commit's
   records win over older ones of the same keys;
3. writes ``W``'s index log (every staged group, renumbered: new
   ``segment_id``, checksum redone) into the staging directory, durable,
   and, for a cache that has no ``schema.json`` yet, the tasks' one;
4. writes the commit record ``commit.json`` (the renames of steps 5-6),
   durable — **the commit is decided**;
5. renames each staged segment into ``segments/`` under its new id: no log
   names them yet, so readers ignore them;
6. renames the log to ``writers/writer-W.log`` — **the commit point**:
   one rename makes every segment of the job visible at once;
7. deletes the job's staging directory.

Each task is a writer of its own while it writes (its own store, its own
segment ids), but the job publishes as *one* multi-writer: a log per task
would take one rename per task to publish, and a crash between two of
them would show part of the job. So a commit uses one writer id of the
4096 a cache has (:meth:`cachex.SegmentStore.compact` folds the writer
logs into the shared log and frees them).

A crash before step 4 leaves the cache as it was; its staging is deleted
by the next sink's ``on_write_start`` (or :func:`recover_segments`). A
crash after step 4 leaves it as it was for every reader until that
recovery replays steps 5-6 (meanwhile ``cachex verify`` lists the segments
already moved as in no index log, ignored). The one gap: a *single* (not multi-) writer
opened natively on the cache between a crash in step 5 and that recovery
adopts the segments already moved, as it adopts any segment newer than
every log; run :func:`recover_segments` before reopening such a cache with
a single writer after a crash.

On a URL (``s3://...``)
-----------------------
A cache on object storage is a commit log, and the job is **one commit**
of it (see :mod:`cachex.ray._objects`): each write task fills a store in
a temporary directory on its own machine, uploads its segments as
content-addressed objects (no commit) and returns their pieces with its
index-log groups and schema; ``on_write_complete`` reads the log's state,
picks a multi-writer id with no log there and segment ids above every
segment there (as steps 2-3 above), uploads the renumbered writer log
(and ``schema.json`` for a new cache) and publishes the segments, the
schema and the log in one commit claimed with a conditional put —
deciding again if another writer took its number. Readers that
``refresh()`` see every record of the job, or none; a failed or retried
task, or a driver that dies before the commit, leaves only objects no
commit names (``cachex gc`` removes them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from ray.data import Dataset, read_datasource
from ray.data.block import Block, BlockMetadata
from ray.data.datasource import Datasink, Datasource, ReadTask, WriteResult

import cachex.ray._segment_log as fmt
from cachex._cachex import SegmentStore
from cachex._remote import is_url
from cachex.errors import CorruptError, LockedError, SchemaMismatchError
from cachex.ray._blocks import (
    keyed_values,
    object_column,
    segment_block,
    segment_parts,
    to_block,
)
from cachex.ray._objects import Files, Remote, piece_path, renamed
from cachex.ray._staging import Job, flock, fsync_dir, local_path, recover, write_durable

STAGING = ".staging"


def recover_segments(path_or_url: str | os.PathLike[str]) -> list[str]:
    """Finish the decided commits and remove the staging of dead write jobs.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The cache directory. A URL has nothing to recover (a job that
        died there left only objects no commit names): ``[]``.

    Returns
    -------
    list of str
        One line per dead job: ``"<job>: commit rolled forward"`` or
        ``"<job>: removed"``.
    """
    if is_url(path_or_url):
        return []
    path = local_path(path_or_url)
    with flock(path / fmt.LOCK_FILE, exclusive=False) as shared:
        if not shared:
            raise LockedError(f"{path}: a single writer or a compaction holds the cache")
        return recover(path / STAGING)


class SegmentSink(Datasink):
    """Writes a dataset into a segment store, committed atomically at the end.

    ``ds.write_datasink(SegmentSink(path, key_column="key"))``: each row
    becomes one record under the key in ``key_column``. Every write task
    writes a store of its own in the cache's staging area; the job's
    records become visible to readers all at once when the job completes
    (see the module's docstring for the protocol). A failed or retried
    task's output is never committed, and a key is written once however
    often Ray retries its task.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The cache directory (created if missing), or its URL (``s3://...``,
        ``gs://``, ``az://``, ``file://``): the job is then one commit of
        the cache's log, and write tasks need no disk shared with the driver.
    key_column : str
        The column of keys (``str``; other values are stored as ``str(key)``).
    columns : str, sequence of str, or None
        A name: each record is that column's value (one tensor or blob).
        A list: each record is a dict of those columns. ``None`` (default):
        a dict of every column but the key. Text is stored as UTF-8 bytes.
    flush_every : int, optional
        Records per segment in each task's store (the store's default 4096).
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.SegmentStore` takes them, on every
        machine (a task stages its part in a temporary directory of its own).

    Raises
    ------
    InvalidInputError
        A column is missing.
    SchemaMismatchError
        Tasks produced records of different schemas, or the cache holds
        another schema (raised by the commit; nothing is committed).
    LockedError
        A single writer or a compaction holds the cache.
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        key_column: str = "key",
        columns: str | Sequence[str] | None = None,
        flush_every: int | None = None,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.remote = Remote.of(
            path_or_url,
            tier_dir=tier_dir,
            tier_budget=tier_budget,
            storage_options=storage_options,
        )
        if self.remote is not None:
            path_or_url = "."
        self.path = local_path(path_or_url)
        self.key_column = key_column
        self.columns = columns if isinstance(columns, str) or columns is None else list(columns)
        self.flush_every = flush_every
        self.job = Job(self.path / STAGING)

    def get_name(self) -> str:
        return "CachexSegments"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if self.remote is not None:
            return
        if not (self.path / fmt.SEGMENTS_DIR).is_dir():
            # An empty store, so that a reader of the path finds a cache.
            SegmentStore(self.path).close()
        recover_segments(self.path)
        self.job.start()

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        if self.remote is not None:
            return self._write_remote(self.remote, blocks, ctx.task_idx)
        attempt = self.job.task_attempt(ctx.task_idx)
        rows = self._fill(attempt, blocks)
        final = self.job.finish_task(ctx.task_idx, attempt)
        return {"task": ctx.task_idx, "dir": final.name, "rows": rows}

    def _fill(self, directory: Path, blocks: Iterable[Block]) -> int:
        """Write the blocks into a new store in ``directory``; return the rows written."""
        rows = 0
        store = SegmentStore(directory, flush_every=self.flush_every, lru_bytes=0)
        try:
            for block in blocks:
                items = keyed_values(block, self.key_column, self.columns)
                store.put_batch(items)
                rows += len(items)
        finally:
            store.close()
        return rows

    def _write_remote(self, remote: Remote, blocks: Iterable[Block], task: int) -> dict[str, Any]:
        """Stage the task's store on this machine, upload its segments (no commit)."""
        staged = Path(tempfile.mkdtemp(prefix="cachex-ray-segments-"))
        try:
            rows = self._fill(staged, blocks)
            if rows == 0:
                return {"task": task, "rows": 0}
            names = sorted(
                n
                for n in os.listdir(staged / fmt.SEGMENTS_DIR)
                if fmt.parse_segment_name(n) is not None
            )
            files = [(f"{fmt.SEGMENTS_DIR}/{n}", staged / fmt.SEGMENTS_DIR / n) for n in names]
            return {
                "task": task,
                "rows": rows,
                "schema": (staged / fmt.SCHEMA_FILE).read_bytes(),
                "log": (staged / fmt.SHARED_LOG).read_bytes(),
                "pieces": remote.upload("segments", files),
            }
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def on_write_complete(self, write_result: WriteResult) -> None:
        tasks = [r for r in write_result.write_returns if r is not None and r["rows"] > 0]
        if self.remote is not None:
            if tasks:
                _commit_remote(self.remote, tasks)
            return
        with flock(self.path / fmt.LOCK_FILE, exclusive=False) as shared:
            if not shared:
                raise LockedError(f"{self.path}: a single writer or a compaction holds the cache")
            if tasks:
                self._commit([self.job.dir / t["dir"] for t in tasks])
        self.job.remove()

    def on_write_failed(self, error: Exception) -> None:
        if self.remote is None:
            self.job.remove()

    def _commit(self, staged: list[Path]) -> None:
        schema = self._check_schema(staged)
        groups = [(d, g) for d in staged for g in fmt.read_groups(d / fmt.SHARED_LOG)]
        writers = self.path / fmt.WRITERS_DIR
        writers.mkdir(exist_ok=True)
        for writer in range(fmt.MAX_WRITER_ID, -1, -1):
            if (writers / fmt.writer_log_name(writer)).exists():
                continue
            with flock(writers / fmt.writer_lock_name(writer)) as mine:
                if not mine or (writers / fmt.writer_log_name(writer)).exists():
                    continue
                self._commit_as(writer, schema, groups)
                return
        raise LockedError(f"{writers}: every multi-writer id is in use (compact the cache)")

    def _check_schema(self, staged: list[Path]) -> bytes:
        first = _one_schema(
            {str(d / fmt.SCHEMA_FILE): (d / fmt.SCHEMA_FILE).read_bytes() for d in staged}
        )
        current = self.path / fmt.SCHEMA_FILE
        if current.exists() and json.loads(current.read_bytes()) != json.loads(first):
            raise SchemaMismatchError(
                f"{current}: the cache's schema differs from the dataset's; nothing was committed"
            )
        return first

    def _commit_as(self, writer: int, schema: bytes, groups: list[tuple[Path, Any]]) -> None:
        segments = self.path / fmt.SEGMENTS_DIR
        existing = [fmt.parse_segment_name(n) for n in os.listdir(segments)]
        above = max((i for i in existing if i is not None), default=-1)
        ids = fmt.writer_ids_after(writer, above, len(groups))
        log = bytearray(fmt.writer_log_header(writer))
        renames = []
        for new_id, (staged, group) in zip(ids, groups, strict=True):
            log += fmt.renumbered(group, new_id)
            renames.append(
                (
                    staged / fmt.SEGMENTS_DIR / fmt.segment_name(group.segment_id),
                    segments / fmt.segment_name(new_id),
                )
            )
        staged_log = self.job.dir / fmt.writer_log_name(writer)
        write_durable(staged_log, bytes(log))
        renames.append((staged_log, self.path / fmt.WRITERS_DIR / fmt.writer_log_name(writer)))
        if not (self.path / fmt.SCHEMA_FILE).exists():
            write_durable(self.path / fmt.SCHEMA_FILE, schema)
        self.job.decide(renames)
        self._before_renames()
        for src, dst in renames[:-1]:
            os.rename(src, dst)
        fsync_dir(segments)
        src, dst = renames[-1]
        os.rename(src, dst)
        fsync_dir(dst.parent)

    def _before_renames(self) -> None:
        """Called once the commit is decided, before its renames (a test's crash point)."""


def _one_schema(texts: dict[str, bytes]) -> bytes:
    """The schema every write task produced (``texts``: whose, and its ``schema.json``)."""
    first = next(iter(texts.values()))
    for name, text in texts.items():
        if json.loads(text) != json.loads(first):
            raise SchemaMismatchError(
                f"{name}: write tasks produced records of different schemas; nothing was committed"
            )
    return first


def _commit_remote(remote: Remote, tasks: list[dict[str, Any]]) -> None:
    """Publish the write tasks' uploaded segments as one commit (see the module's docstring)."""
    tasks = sorted(tasks, key=lambda t: t["task"])
    schema = _one_schema({f"write task {t['task']}'s schema": t["schema"] for t in tasks})
    groups = [
        (t["task"], g)
        for t in tasks
        for g in fmt.parse_groups(t["log"], f"write task {t['task']}'s index log")
    ]
    uploaded = {
        (t["task"], fmt.parse_segment_name(piece_path(p).rsplit("/", 1)[-1])): p
        for t in tasks
        for p in t["pieces"]
    }
    for task, group in groups:
        if (task, group.segment_id) not in uploaded:
            raise CorruptError(
                f"write task {task}: its index log names segment {group.segment_id}, "
                "which it did not upload; nothing was committed"
            )

    def decide(files: Files) -> list[str]:
        if fmt.SCHEMA_FILE in files:
            current = remote.read(fmt.SCHEMA_FILE, files[fmt.SCHEMA_FILE])
            if json.loads(current) != json.loads(schema):
                raise SchemaMismatchError(
                    f"{fmt.SCHEMA_FILE}: the cache's schema differs from the dataset's; "
                    "nothing was committed"
                )
        free = (
            w
            for w in range(fmt.MAX_WRITER_ID, -1, -1)
            if f"{fmt.WRITERS_DIR}/{fmt.writer_log_name(w)}" not in files
        )
        writer = next(free, None)
        if writer is None:
            raise LockedError("every multi-writer id of the cache is in use (compact the cache)")
        prefix = f"{fmt.SEGMENTS_DIR}/"
        existing = [fmt.parse_segment_name(p[len(prefix) :]) for p in files if p.startswith(prefix)]
        above = max((i for i in existing if i is not None), default=-1)
        ids = fmt.writer_ids_after(writer, above, len(groups))
        log = bytearray(fmt.writer_log_header(writer))
        pieces = []
        for new_id, (task, group) in zip(ids, groups, strict=True):
            log += fmt.renumbered(group, new_id)
            path = f"{fmt.SEGMENTS_DIR}/{fmt.segment_name(new_id)}"
            pieces.append(renamed(uploaded[(task, group.segment_id)], path))
        with tempfile.TemporaryDirectory(prefix="cachex-ray-commit-") as tmp:
            local = []
            if fmt.SCHEMA_FILE not in files:
                (Path(tmp) / "schema").write_bytes(schema)
                local.append((fmt.SCHEMA_FILE, Path(tmp) / "schema"))
            # The log last: readers apply pieces in order, segments first.
            (Path(tmp) / "log").write_bytes(bytes(log))
            local.append((f"{fmt.WRITERS_DIR}/{fmt.writer_log_name(writer)}", Path(tmp) / "log"))
            pieces += remote.upload("segments", local)
        return pieces

    remote.publish(decide)


def _segment_id(segment: dict[str, Any]) -> int:
    """The id of a segment of ``SegmentStore.inspect()`` (from its file name,
    ``segment_<id>.arrow``): later ids win for a key written twice."""
    found = fmt.parse_segment_name(str(segment["file"]))
    if found is None:
        raise CorruptError(f"{segment['file']}: not a segment file name")
    return found


@dataclass(frozen=True)
class _SegmentFile:
    """One segment a read task reads: a local file it maps, or on a URL the
    objects of the commit the source was opened at, fetched whole."""

    name: str
    path: Path | None = None
    remote: Remote | None = None
    pieces: tuple[str, ...] = ()

    def table(self) -> pa.Table:
        if self.path is not None:
            return _read_segment(self.path)
        assert self.remote is not None
        data = self.remote.read(f"{fmt.SEGMENTS_DIR}/{self.name}", list(self.pieces))
        return ipc.open_file(pa.py_buffer(data)).read_all()

    def shown(self) -> str:
        return str(self.path) if self.path is not None else f"{fmt.SEGMENTS_DIR}/{self.name}"


class SegmentDatasource(Datasource):
    """Ray Data's source over a segment store: one read task per group of segments.

    Each task maps its segment files and hands their rows to Ray as Arrow
    blocks over the mapped bytes (tensor columns where every row has one
    shape). Rows a later segment overwrote are skipped. With ``keys``,
    tasks look up slices of the key list instead.

    On a URL the source reads the commit that was the last one when it
    was made: each task fetches its segments whole from their objects into
    memory (checked against their BLAKE3; no working directory), or, with
    ``keys``, opens the store on the URL through its own machine's tier and
    looks the keys up by byte ranges.
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        keys: Sequence[str] | None = None,
        *,
        value_column: str = "value",
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.remote = Remote.of(
            path_or_url,
            tier_dir=tier_dir,
            tier_budget=tier_budget,
            storage_options=storage_options,
        )
        self.root: str | Path
        if self.remote is not None:
            self.root = str(path_or_url)
            self.store_kwargs: dict[str, Any] = dict(self.remote.kwargs)
        else:
            self.root = local_path(path_or_url)
            self.store_kwargs = {}
        self.keys = None if keys is None else [str(k) for k in keys]
        self.value_column = value_column
        store = SegmentStore(self.root, read_only=True, **self.store_kwargs)
        try:
            self.inspection = store.inspect()
        finally:
            store.close()
        self.segments = self.inspection["segments"]
        self.files: dict[str, _SegmentFile] = {}
        if keys is None:
            state = self.remote.state()[1] if self.remote is not None else {}
            self.files = {s["file"]: self._file(str(s["file"]), state) for s in self.segments}
        if self.segments and keys is None:
            # A segment without cachex's part metadata (torchcachex's own) is
            # refused here, in the driver, rather than in every read task.
            first = self.files[self.segments[0]["file"]]
            segment_parts(first.table().schema)

    def _file(self, name: str, state: Files) -> _SegmentFile:
        if self.remote is None:
            assert isinstance(self.root, Path)
            return _SegmentFile(name, path=self.root / fmt.SEGMENTS_DIR / name)
        pieces = state.get(f"{fmt.SEGMENTS_DIR}/{name}")
        if not pieces:
            raise CorruptError(
                f"{fmt.SEGMENTS_DIR}/{name}: the store lists it, the cache's last commit "
                "does not (a compaction published meanwhile?); open the source again"
            )
        return _SegmentFile(name, remote=self.remote, pieces=tuple(pieces))

    def get_name(self) -> str:
        return "CachexSegments"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(int(s["bytes"]) for s in self.segments)

    def get_read_tasks(self, parallelism: int, **_: Any) -> list[ReadTask]:
        if self.keys is not None:
            return self._key_tasks(parallelism)
        live = self._live_rows()
        segments = [s for s in self.segments if s["live_rows"] > 0]
        chunks = np.array_split(np.arange(len(segments)), max(1, min(parallelism, len(segments))))
        tasks = []
        for chunk in chunks:
            if not len(chunk):
                continue
            mine = [segments[i] for i in chunk]
            files = [self.files[s["file"]] for s in mine]
            rows = [live.get(_segment_id(s)) for s in mine]
            meta = BlockMetadata(
                num_rows=sum(s["live_rows"] for s in mine),
                size_bytes=sum(int(s["bytes"]) for s in mine),
                input_files=[f.shown() for f in files],
                exec_stats=None,
            )
            tasks.append(ReadTask(_segment_reader(files, rows, self.value_column), meta))
        return tasks

    def _live_rows(self) -> dict[int, np.ndarray]:
        """The rows to keep of each segment that holds overwritten (dead) rows."""
        if all(s["rows"] == s["live_rows"] for s in self.segments):
            return {}
        winner: dict[str, tuple[int, int]] = {}
        for s in sorted(self.segments, key=_segment_id):
            keys = self.files[s["file"]].table()
            for row, key in enumerate(keys.column("key").to_pylist()):
                winner[key] = (_segment_id(s), row)
        live: dict[int, list[int]] = {}
        for seg, row in winner.values():
            live.setdefault(seg, []).append(row)
        return {
            _segment_id(s): np.sort(np.array(live.get(_segment_id(s), []), dtype=np.int64))
            for s in self.segments
            if s["rows"] != s["live_rows"]
        }

    def _key_tasks(self, parallelism: int) -> list[ReadTask]:
        keys = self.keys or []
        n = max(1, min(parallelism, len(keys)))
        tasks = []
        for chunk in np.array_split(np.arange(len(keys)), n):
            if not len(chunk):
                continue
            mine = keys[chunk[0] : chunk[-1] + 1]
            meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
            reader = _key_reader(self.root, self.store_kwargs, mine, self.value_column)
            tasks.append(ReadTask(reader, meta))
        return tasks


def _read_segment(path: Path) -> pa.Table:
    # The Arrow IPC file format maps: columns are views of the mapped file.
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


def _segment_reader(files: list[_SegmentFile], rows: list[np.ndarray | None], value_column: str):
    def read() -> Iterable[Block]:
        for file, keep in zip(files, rows, strict=True):
            table = file.table()
            if keep is not None:
                table = table.take(pa.array(keep))
            yield segment_block(table, value_column)

    return read


def _key_reader(root: str | Path, kwargs: dict[str, Any], keys: list[str], value_column: str):
    def read() -> Iterable[Block]:
        store = SegmentStore(root, read_only=True, lru_bytes=0, **kwargs)
        try:
            values, missing = store.get_batch(keys)
        finally:
            store.close()
        gone = set(missing)
        found = [(k, v) for i, (k, v) in enumerate(zip(keys, values, strict=True)) if i not in gone]
        yield to_block(_values_block(found, value_column))

    return read


def _values_block(found: list[tuple[str, Any]], value_column: str) -> dict[str, Any]:
    """Looked-up values as a numpy batch: ``key`` and one column per part."""
    columns: dict[str, Any] = {"key": object_column([k for k, _ in found])}
    if not found:
        return columns
    first = found[0][1]
    if isinstance(first, dict):
        names = list(first)
        parts = {n: [v[n] for _, v in found] for n in names}
    elif isinstance(first, (tuple, list)):
        parts = {f"item{i}": [v[i] for _, v in found] for i in range(len(first))}
    else:
        parts = {value_column: [v for _, v in found]}
    for name, vals in parts.items():
        if isinstance(vals[0], bytes):
            columns[name] = object_column(vals)
        elif len({np.shape(v) for v in vals}) == 1:
            columns[name] = np.stack(vals)
        else:
            columns[name] = object_column(vals)
    return columns


def read_segments(
    path_or_url: str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    *,
    value_column: str = "value",
    override_num_blocks: int | None = None,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    **read_args: Any,
) -> Dataset:
    """A Ray Dataset of a segment store's records.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The cache directory, or its URL (the dataset reads the cache's last
        commit as of this call; see :class:`SegmentDatasource`).
    keys : sequence of str, optional
        Only these keys (missing ones are skipped), in slices per read
        task. Default: every record, read by whole segments.
    value_column : str
        The column name of a single-tensor (or single-blob) record's value.
    override_num_blocks : int, optional
        Read tasks (at most one per segment, or per key).
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.SegmentStore` takes them.
    **read_args
        Passed to ``ray.data.read_datasource`` (``concurrency``, ``num_cpus``...).

    Returns
    -------
    ray.data.Dataset
        Columns ``key`` and one per record part: a dict's names,
        ``item0``... of a tuple or list, or ``value_column``. Tensors of one
        shape are tensor columns, bytes are binary columns.
    """
    source = SegmentDatasource(
        path_or_url,
        keys,
        value_column=value_column,
        tier_dir=tier_dir,
        tier_budget=tier_budget,
        storage_options=storage_options,
    )
    return read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
