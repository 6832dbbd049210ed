"""Ray Data's sink and source for a memmap-array cache (:class:`cachex.MemmapArray`).

Write protocol (:class:`MemmapSink`): every write task writes its rows into
a memmap cache of its own, ``<parent>/.<name>.staging/<job>/task-NNNNNN``
(an attempt directory, renamed when finalized, so a retried task's part is
its last attempt's). When the job completes, the driver merges the parts
named by the write results, in task order, into one finalized cache in the
staging directory and renames that directory to the target path: the one
rename is the commit. A finished memmap cache is immutable, so the target
must not exist yet.

On a URL (``s3://bucket/arrays``) the job is one commit of the cache's log
(see :mod:`cachex.ray._objects`): each task writes its part in a temporary
directory on its own machine and uploads its files as objects (no
commit); the driver fetches the parts named by the write results, merges
them into a finalized cache in a temporary directory, uploads its files
and publishes them all in one commit — refused if the log holds a cache
already.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray.data import DataContext, Dataset, read_datasource
from ray.data.block import Block, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from cachex._cachex import MemmapArray, MemmapWriter
from cachex._remote import is_url, tier_kwargs
from cachex.errors import CorruptError, InvalidInputError
from cachex.ray._blocks import numpy_columns, object_column, to_block
from cachex.ray._objects import Files, Remote, piece_path
from cachex.ray._sink import MergedSink
from cachex.ray._staging import Job, local_path, recover, staging_beside

ArraySpecs = Mapping[str, tuple[Any, Sequence[int]]]


def _cache_files(directory: Path) -> list[tuple[str, Path]]:
    """A finished cache's files, ``/``-separated relative paths; its writer's
    lock is no content and stays behind."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            if not name.endswith(".lock"):
                found.append((rel, path))
    return sorted(found)


class MemmapSink(MergedSink):
    """Writes a dataset into a memmap-array cache (one ``.bin`` per array column).

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The cache directory to create, or its URL (the job is then one
        commit of the cache's log); it must not exist (hold no commit).
    arrays : dict, optional
        ``{column: (dtype, shape)}``; default: every column that is not a
        source, sidecar or meta column, with its dtype and per-row shape.
    source_column : str, optional
        Each row's source id (what ``MemmapArray.find`` looks up); default:
        the row number in the finished cache.
    sidecar_columns : sequence of str
        Text columns stored as deduplicated sidecars.
    meta_column : str, optional
        A column of per-row metadata (stored as JSON).
    nullable : sequence of str
        Array columns whose entries may be ``None``.
    fingerprint : JSON-able, optional
        Stored as the cache's ``fingerprint.json``.
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.MemmapArray` takes them.
    """

    SPEC = "arrays"
    KIND = "arrays"
    TEMP_PREFIX = "cachex-ray-memmap-"

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        arrays: ArraySpecs | None = None,
        *,
        source_column: str | None = None,
        sidecar_columns: Sequence[str] = (),
        meta_column: str | None = None,
        nullable: Sequence[str] = (),
        fingerprint: Any = None,
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
            path_or_url = "arrays"
        self.path = local_path(path_or_url)
        self.arrays = None if arrays is None else {k: (v[0], list(v[1])) for k, v in arrays.items()}
        self.source_column = source_column
        self.sidecar_columns = list(sidecar_columns)
        self.meta_column = meta_column
        self.nullable = list(nullable)
        self.fingerprint = fingerprint
        self.job = Job(staging_beside(self.path))

    def get_name(self) -> str:
        return "CachexMemmap"

    def _check_remote(self, remote: Remote) -> None:
        if remote.state()[1]:
            raise InvalidInputError("the URL holds a cache (a memmap cache is written once)")

    def _prepare_local(self) -> None:
        if self.path.exists():
            raise InvalidInputError(f"{self.path}: exists (a memmap cache is written once)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        recover(staging_beside(self.path))

    def _specs(self, cols: Mapping[str, np.ndarray]) -> dict[str, tuple[str, list[int]]]:
        if self.arrays is not None:
            return self.arrays
        skip = {self.source_column, self.meta_column, *self.sidecar_columns}
        specs = {}
        for name, col in cols.items():
            if name in skip:
                continue
            if col.dtype == object:
                raise InvalidInputError(
                    f"column {name!r} is not a fixed-shape array column: pass arrays= "
                    "or name it as a sidecar or meta column"
                )
            specs[name] = (col.dtype.str, list(col.shape[1:]))
        return specs

    def _writer(self, path: Path, specs: ArraySpecs) -> MemmapWriter:
        return MemmapWriter(
            path,
            specs,
            nullable=self.nullable,
            sidecars=self.sidecar_columns,
            fingerprint=self.fingerprint,
            sync_every=0,
        )

    def _write_part(
        self, directory: Path, blocks: Iterable[Block], task: int
    ) -> dict[str, Any] | None:
        """Write the blocks into the cache ``directory/part``; ``None`` for no rows."""
        writer = None
        specs = None
        rows = 0
        for block in blocks:
            cols = numpy_columns(block)
            if writer is None or specs is None:
                specs = self._specs(cols)
                writer = self._writer(directory / self.PART, specs)
            n = len(next(iter(cols.values()))) if cols else 0
            for i in range(n):
                source = str(cols[self.source_column][i]) if self.source_column else str(rows)
                writer.write(
                    source,
                    {name: cols[name][i, ...] for name in specs},
                    {s: str(cols[s][i]) for s in self.sidecar_columns} or None,
                    cols[self.meta_column][i] if self.meta_column else None,
                )
                rows += 1
        if writer is None:
            return None
        writer.finalize()
        return {"task": task, "rows": rows, "arrays": specs}

    def _upload(self, remote: Remote, task: int, staged: Path, part: dict[str, Any]) -> None:
        # Never committed: the objects are only the driver's to fetch.
        prefix = f"ray-parts/{uuid.uuid4().hex}/task-{task:06d}"
        files = [(f"{prefix}/{rel}", p) for rel, p in _cache_files(staged / self.PART)]
        part["pieces"] = remote.upload("arrays", files)
        part["prefix"] = prefix

    def _fetch_part(self, remote: Remote, part: dict[str, Any], directory: Path) -> Path:
        local = directory / f"task-{part['task']:06d}"
        by_path: dict[str, list[str]] = {}
        for piece in part["pieces"]:
            by_path.setdefault(piece_path(piece), []).append(piece)
        for path, pieces in by_path.items():
            dest = local / path[len(part["prefix"]) + 1 :]
            dest.parent.mkdir(parents=True, exist_ok=True)
            remote.fetch(path, pieces, dest)
        return local

    def _merge(self, parts: list[Path], specs: Any, merged: Path) -> None:
        """Merge the part caches, in order, into the finalized cache ``merged``."""
        writer = self._writer(merged, specs)
        row = 0
        for part_dir in parts:
            part = MemmapArray(part_dir)
            for i in range(len(part)):
                sidecars: dict[str, str] = {}
                for s in self.sidecar_columns:
                    value = part.sidecar(s, i)
                    if value is None:
                        raise CorruptError(f"{part_dir}: row {i} has no {s!r} sidecar value")
                    sidecars[s] = value
                source = part.source(i) if self.source_column else str(row)
                meta = part.meta(i) if self.meta_column else None
                writer.write(source, part.get_row(i), sidecars or None, meta)
                row += 1
        writer.finalize()

    def _merged_files(self, merged: Path) -> list[tuple[str, Path]]:
        return _cache_files(merged)

    def _check_published(self, files: Files) -> None:
        if files:
            raise InvalidInputError(
                "another writer published a cache at the URL meanwhile "
                "(a memmap cache is written once); nothing was committed"
            )


class MemmapDatasource(Datasource):
    """Ray Data's source over a memmap-array cache: one read task per row range.

    On a URL each read task opens the cache through its own machine's tier
    (:class:`cachex.MemmapArray` reads its rows' bytes by blocks).
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        columns: Sequence[str] | None = None,
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.path: str | Path
        self.kwargs: dict[str, Any] = {}
        if is_url(path_or_url):
            self.path = str(path_or_url)
            self.kwargs = tier_kwargs(tier_dir, tier_budget, storage_options)
        else:
            self.path = local_path(path_or_url)
        cache = MemmapArray(self.path, **self.kwargs)
        self.rows = len(cache)
        self.schema = cache.schema["arrays"]
        self.columns = list(self.schema) if columns is None else list(columns)
        unknown = [c for c in self.columns if c not in self.schema]
        if unknown:
            raise InvalidInputError(f"{self.path}: no arrays named {unknown}")

    def get_name(self) -> str:
        return "CachexMemmap"

    def estimate_inmemory_data_size(self) -> int | None:
        total = 0
        for name in self.columns:
            spec = self.schema[name]
            total += int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
        return total * self.rows

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
        tasks = []
        n = max(1, min(parallelism, self.rows))
        for chunk in np.array_split(np.arange(self.rows), n):
            if not len(chunk):
                continue
            lo, hi = int(chunk[0]), int(chunk[-1]) + 1
            meta = BlockMetadata(
                num_rows=hi - lo, size_bytes=None, input_files=None, exec_stats=None
            )
            reader = _row_reader(self.path, self.kwargs, self.columns, self.schema, lo, hi)
            tasks.append(ReadTask(reader, meta))
        return tasks


def _row_reader(
    path: str | Path,
    kwargs: dict[str, Any],
    columns: list[str],
    schema: Mapping[str, Any],
    lo: int,
    hi: int,
) -> Callable[[], Iterable[Block]]:
    def read() -> Iterable[Block]:
        cache = MemmapArray(path, **kwargs)
        n = hi - lo
        out = {
            name: np.empty((n, *schema[name]["shape"]), dtype=np.dtype(schema[name]["dtype"]))
            for name in columns
        }
        present = cache.fill_batch(list(range(lo, hi)), out)
        batch: dict[str, Any] = {"source": object_column([cache.source(i) for i in range(lo, hi)])}
        for name in columns:
            if name in present:
                batch[name] = object_column(
                    [out[name][i] if ok else None for i, ok in enumerate(present[name])]
                )
            else:
                batch[name] = out[name]
        yield to_block(batch)

    return read


def read_memmap(
    path_or_url: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    override_num_blocks: int | None = None,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    **read_args: Any,
) -> Dataset:
    """A Ray Dataset of a memmap-array cache's rows.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The cache directory, or its URL.
    columns : sequence of str, optional
        The arrays to read (default: all).
    override_num_blocks : int, optional
        Read tasks, each a contiguous range of rows.
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.MemmapArray` takes them.
    **read_args
        Passed to ``ray.data.read_datasource``.

    Returns
    -------
    ray.data.Dataset
        ``source`` and one column per array (``None`` where a nullable row
        lacks it).
    """
    source = MemmapDatasource(
        path_or_url,
        columns,
        tier_dir=tier_dir,
        tier_budget=tier_budget,
        storage_options=storage_options,
    )
    dataset: Dataset = read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
    return dataset
