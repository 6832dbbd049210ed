"""Ray Data's sink and source for a segment store (:class:`cachex.SegmentStore`).

Write protocol (:class:`SegmentSink`)
-------------------------------------
Every write task fills a segment store of its own, in a staging attempt
directory ``<cache>/.staging/<job>/task-NNNNNN.attempt-<token>``, closes
it (every segment durable) and renames the attempt to ``task-NNNNNN``; a
task that fails leaves only an attempt directory that no commit names.
Nothing under ``.staging`` is read by a store.

``on_write_complete`` commits the tasks named by the write results as
*one* multi-writer of the cache: the staged segments get new ids in that
writer's residue class above every segment of the cache, the renames are
decided in a durable commit record, the segments are renamed into
``segments/`` and the writer's index log renamed last — **the commit
point**: one rename makes every segment of the job visible at once. A
crash before the decision leaves the cache as it was; one after it is
rolled forward by the next sink's ``on_write_start`` or by
:func:`recover_segments` (run it before reopening a crashed cache with a
single writer, which would adopt segments already moved). The protocol,
the index-log format and every lock and fsync are the crates':
``remote_cache::decide_staged_segments`` (``crates/remote-cache/src/
staged_segments.rs``) and ``segment_store::adopt_staged``.

On a URL (``s3://...``)
-----------------------
A cache on object storage is a commit log, and the job is **one commit**
of it (see :mod:`cachex.ray._objects`): each write task fills a store in
a temporary directory on its own machine, uploads its segments as
content-addressed objects (no commit) and returns their pieces with its
index log and schema; ``on_write_complete`` decides the commit against
the log's last one (``remote_cache::decide_remote_segments``: a free
writer id, segment ids above every segment there, the renumbered writer
log uploaded) and publishes it claimed with a conditional put — deciding
again if another writer took its number. Readers that ``refresh()`` see
every record of the job, or none; a failed or retried task, or a driver
that dies before the commit, leaves only objects no commit names
(``cachex gc`` removes them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.ipc as ipc  # type: ignore[import-untyped]
from ray.data import DataContext, Dataset, read_datasource
from ray.data.block import Block, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from cachex import _cachex
from cachex._cachex import SegmentStore
from cachex._remote import is_url
from cachex.errors import CorruptError
from cachex.ray._blocks import (
    keyed_values,
    object_column,
    segment_block,
    segment_parts,
    to_block,
)
from cachex.ray._objects import Files, Remote
from cachex.ray._sink import StagedSink
from cachex.ray._staging import Job, local_path

STAGING = ".staging"
SEGMENTS_DIR = "segments"


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

    Raises
    ------
    LockedError
        A single writer or a compaction holds the cache.
    """
    if is_url(path_or_url):
        return []
    return _cachex._segments_recover(local_path(path_or_url))


class SegmentSink(StagedSink):
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

    TEMP_PREFIX = "cachex-ray-segments-"

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

    def _prepare_local(self) -> None:
        if not (self.path / SEGMENTS_DIR).is_dir():
            # An empty store, so that a reader of the path finds a cache.
            SegmentStore(self.path).close()
        recover_segments(self.path)

    def _write_part(
        self, directory: Path, blocks: Iterable[Block], task: int
    ) -> dict[str, Any] | None:
        """Write the blocks into a new store in ``directory``; ``None`` for no rows."""
        rows = 0
        store = SegmentStore(directory, flush_every=self.flush_every, lru_bytes=0)
        try:
            for block in blocks:
                items = keyed_values(block, self.key_column, self.columns)
                store.put_batch(items)
                rows += len(items)
        finally:
            store.close()
        return {"task": task, "rows": rows} if rows else None

    def _upload(self, remote: Remote, task: int, staged: Path, part: dict[str, Any]) -> None:
        """Upload the task's segments (no commit); its schema and index log travel in ``part``."""
        segments = staged / SEGMENTS_DIR
        names = sorted(n for n in os.listdir(segments) if _segment_id_of(n) is not None)
        files = [(f"{SEGMENTS_DIR}/{n}", segments / n) for n in names]
        part["schema"] = (staged / "schema.json").read_bytes()
        part["log"] = (staged / "segment-index.log").read_bytes()
        part["pieces"] = remote.upload("segments", files)

    def _commit_local(self, parts: list[dict[str, Any]]) -> None:
        commit = _cachex._segments_decide(
            self.path, self.job.dir, [self.job.dir / p["dir"] for p in parts]
        )
        try:
            if parts:
                self._before_renames()
            commit.apply()
        finally:
            commit.close()

    def _commit_remote(self, remote: Remote, parts: list[dict[str, Any]]) -> None:
        """Publish the write tasks' uploaded segments as one commit (see the module's docstring)."""
        tasks = [(p["task"], p["schema"], p["log"], p["pieces"]) for p in parts]
        remote.publish_decided(
            lambda: _cachex._staged_segments_decide(remote.url, tasks, **remote.kwargs)
        )

    def _before_renames(self) -> None:
        """Called once the commit is decided, before its renames (a test's crash point)."""


def _segment_id_of(name: str) -> int | None:
    """The id in a segment file's name (``segment_<id>.arrow``), or ``None``
    for another file."""
    digits = name.removeprefix("segment_").removesuffix(".arrow")
    if len(digits) + len("segment_.arrow") != len(name) or not digits.isdigit():
        return None
    return int(digits)


def _segment_id(segment: dict[str, Any]) -> int:
    """The id of a segment of ``SegmentStore.inspect()`` (from its file name,
    ``segment_<id>.arrow``): later ids win for a key written twice."""
    found = _segment_id_of(str(segment["file"]))
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
        data = self.remote.read(f"{SEGMENTS_DIR}/{self.name}", list(self.pieces))
        return ipc.open_file(pa.py_buffer(data)).read_all()

    def shown(self) -> str:
        return str(self.path) if self.path is not None else f"{SEGMENTS_DIR}/{self.name}"


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
            return _SegmentFile(name, path=self.root / SEGMENTS_DIR / name)
        pieces = state.get(f"{SEGMENTS_DIR}/{name}")
        if not pieces:
            raise CorruptError(
                f"{SEGMENTS_DIR}/{name}: the store lists it, the cache's last commit "
                "does not (a compaction published meanwhile?); open the source again"
            )
        return _SegmentFile(name, remote=self.remote, pieces=tuple(pieces))

    def get_name(self) -> str:
        return "CachexSegments"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(int(s["bytes"]) for s in self.segments)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
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
                input_files=tuple(f.shown() for f in files),
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


def _segment_reader(
    files: list[_SegmentFile], rows: list[np.ndarray | None], value_column: str
) -> Callable[[], Iterable[Block]]:
    def read() -> Iterable[Block]:
        for file, keep in zip(files, rows, strict=True):
            table = file.table()
            if keep is not None:
                table = table.take(pa.array(keep))
            yield segment_block(table, value_column)

    return read


def _key_reader(
    root: str | Path, kwargs: dict[str, Any], keys: list[str], value_column: str
) -> Callable[[], Iterable[Block]]:
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
    dataset: Dataset = read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
    return dataset
