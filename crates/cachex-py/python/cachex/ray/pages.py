"""Ray Data's sink and source for a page file (:class:`cachex.PageWriter`) or a ``.beton``.

Write protocol (:class:`PageSink`): every write task writes its rows into
a page file of its own, ``<parent>/.<name>.staging/<job>/task-NNNNNN``
(written to an attempt directory, renamed when finalized, so a retried
task's part is its last attempt's). When the job completes, the driver
merges the parts named by the write results, in task order, into one file
in the staging directory and renames it, durably, to
the target path: that one rename is the commit, so a reader sees the old
file or the whole new one. A page file is written whole, not appended to:
an existing target is replaced only with ``overwrite=True``.

On a URL (``s3://bucket/prefix/data.pages``, the file ``data.pages`` of
the cache at ``s3://bucket/prefix``) the job is one commit of that cache's
log (see :mod:`cachex.ray._objects`): each task writes its part in a
temporary directory on its own machine and uploads it as an object (no
commit); the driver fetches the parts named by the write results, merges
them into a file in a temporary directory, uploads it and publishes it
under the file's name in one commit. Readers that ``refresh()`` see the
old file or the whole new one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
from ray.data import DataContext, Dataset, read_datasource
from ray.data.block import Block, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from cachex._cachex import BetonReader, PageReader, PageWriter, write_beton
from cachex._remote import is_url, tier_kwargs
from cachex.errors import InvalidInputError
from cachex.ray._blocks import numpy_columns, object_column, to_block
from cachex.ray._objects import Files, Remote
from cachex.ray._sink import MergedSink
from cachex.ray._staging import Job, local_path, recover, staging_beside

FieldSpec = Any


def _split_file_url(url: str, tier: dict[str, Any]) -> tuple[Remote, str]:
    """``s3://bucket/prefix/data.pages`` as the cache at ``s3://bucket/prefix``
    and the file name ``data.pages``."""
    base, sep, query = url.partition("?")
    parent, _, name = base.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/") or parent.endswith(":"):
        raise InvalidInputError(
            "a page file's URL names a file under a prefix (s3://bucket/prefix/data.pages)"
        )
    return Remote(parent + sep + query, **tier), name


def _infer_field(column: np.ndarray) -> FieldSpec:
    if column.dtype == object:
        return "bytes"
    if column.ndim == 1 and np.issubdtype(column.dtype, np.integer):
        return "int"
    if column.ndim == 1 and np.issubdtype(column.dtype, np.floating):
        return "float"
    return (column.dtype.str, list(column.shape[1:]))


def _part_field(spec: FieldSpec) -> FieldSpec:
    # A .beton's JSON fields travel through the parts as bytes.
    return "bytes" if spec == "json" else spec


def _cell(column: np.ndarray, i: int, spec: FieldSpec) -> Any:
    value = column[i]
    if spec in ("bytes", "json"):
        return value.encode() if isinstance(value, str) else bytes(value)
    if spec == "int":
        return int(value)
    if spec == "float":
        return float(value)
    return value


class PageSink(MergedSink):
    """Writes a dataset into one page file (or an FFCV ``.beton``).

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The file to write, or its URL (``s3://bucket/prefix/data.pages``:
        the job is then one commit of the cache at ``s3://bucket/prefix``).
        A name ending in ``.beton`` writes FFCV's format.
    fields : dict, optional
        ``{column: "int" | "float" | "bytes" | "json" | (dtype, shape)}``;
        default: every column, inferred (integers ``"int"``, floats
        ``"float"``, bytes and text ``"bytes"``, tensors ``(dtype, shape)``).
    page_size : int, optional
        The page size (the writer's default otherwise).
    overwrite : bool
        Replace an existing file (atomically, at the commit).
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.PageReader` takes them.
    """

    PART = "part.pages"
    SPEC = "fields"
    KIND = "pages"
    TEMP_PREFIX = "cachex-ray-pages-"

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        fields: Mapping[str, FieldSpec] | None = None,
        *,
        page_size: int | None = None,
        overwrite: bool = False,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.remote: Remote | None = None
        self.name = ""
        if is_url(path_or_url):
            tier = {
                "tier_dir": tier_dir,
                "tier_budget": tier_budget,
                "storage_options": storage_options,
            }
            self.remote, self.name = _split_file_url(str(path_or_url), tier)
            path_or_url = self.name
        self.path = local_path(path_or_url)
        self.fields = None if fields is None else dict(fields)
        self.page_size = page_size
        self.overwrite = overwrite
        self.beton = self.path.suffix == ".beton"
        self.job = Job(staging_beside(self.path))

    def get_name(self) -> str:
        return "CachexPages"

    def _check_remote(self, remote: Remote) -> None:
        if self.name in remote.state()[1] and not self.overwrite:
            raise InvalidInputError(f"{self.name}: exists (pass overwrite=True to replace it)")

    def _prepare_local(self) -> None:
        if self.path.exists() and not self.overwrite:
            raise InvalidInputError(f"{self.path}: exists (pass overwrite=True to replace it)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        recover(staging_beside(self.path))

    def _write_part(
        self, directory: Path, blocks: Iterable[Block], task: int
    ) -> dict[str, Any] | None:
        """Write the blocks into ``directory/part.pages``; ``None`` for no rows."""
        writer = None
        fields = self.fields
        rows = 0
        for block in blocks:
            cols = numpy_columns(block)
            if fields is None:
                fields = {name: _infer_field(col) for name, col in cols.items()}
            if writer is None:
                part_fields = {k: _part_field(v) for k, v in fields.items()}
                writer = PageWriter(directory / self.PART, part_fields, page_size=self.page_size)
            n = len(next(iter(cols.values()))) if cols else 0
            missing = [f for f in fields if f not in cols]
            if missing:
                raise InvalidInputError(f"the fields {missing} are not columns of the dataset")
            writer.write_many(
                ({f: _cell(cols[f], i, spec) for f, spec in fields.items()} for i in range(n)),
                threads=1,
            )
            rows += n
        if writer is None:
            return None
        writer.finalize()
        return {"task": task, "rows": rows, "fields": fields}

    def _upload(self, remote: Remote, task: int, staged: Path, part: dict[str, Any]) -> None:
        # Never committed: the object is only the driver's to fetch.
        name = f"ray-parts/{uuid.uuid4().hex}/task-{task:06d}.pages"
        part["pieces"] = remote.upload("pages", [(name, staged / self.PART)])
        part["part"] = name

    def _fetch_part(self, remote: Remote, part: dict[str, Any], directory: Path) -> Path:
        local = directory / f"task-{part['task']:06d}.pages"
        remote.fetch(part["part"], part["pieces"], local)
        return local

    def _merge(self, parts: list[Path], fields: dict[str, FieldSpec], merged: Path) -> None:
        """Merge the parts, in order, into the file ``merged``."""
        readers = [PageReader(f) for f in parts]
        samples = _merged_samples(readers, fields)
        if self.beton:
            if self.page_size is None:
                write_beton(merged, fields, samples)
            else:
                write_beton(merged, fields, samples, page_size=self.page_size)
        else:
            writer = PageWriter(merged, fields, page_size=self.page_size)
            writer.write_many(samples, threads=1)
            writer.finalize()

    def _merged_files(self, merged: Path) -> list[tuple[str, Path]]:
        return [(self.name, merged)]

    def _check_published(self, files: Files) -> None:
        if self.name in files and not self.overwrite:
            raise InvalidInputError(
                f"{self.name}: another writer published it meanwhile "
                "(pass overwrite=True to replace it)"
            )


def _merged_samples(
    readers: list[PageReader], fields: Mapping[str, FieldSpec]
) -> Iterator[dict[str, Any]]:
    json_fields = [f for f, spec in fields.items() if spec == "json"]
    for reader in readers:
        for i in range(len(reader)):
            sample = reader.sample(i)
            for f in json_fields:
                sample[f] = bytes(sample[f]).decode()
            yield sample


class PageDatasource(Datasource):
    """Ray Data's source over a page file or a ``.beton``: one read task per sample range.

    On a URL each read task opens the file through its own machine's tier
    (:class:`cachex.PageReader` reads the runs of its samples by blocks).
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.root: str | Path
        self.kwargs: dict[str, Any] = {}
        if is_url(path_or_url):
            self.root = str(path_or_url)
            self.kwargs = tier_kwargs(tier_dir, tier_budget, storage_options)
            self.beton = self.root.partition("?")[0].endswith(".beton")
        else:
            self.root = local_path(path_or_url)
            self.beton = self.root.suffix == ".beton"
        self.path = self.root
        reader = self._open()
        self.rows = len(reader)
        self.fields = reader.fields

    def _open(self) -> PageReader | BetonReader:
        return (BetonReader if self.beton else PageReader)(self.root, **self.kwargs)

    def get_name(self) -> str:
        return "CachexPages"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.root.stat().st_size if isinstance(self.root, Path) else None

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
            shown = str(self.root) if isinstance(self.root, Path) else None
            meta = BlockMetadata(
                num_rows=hi - lo,
                size_bytes=None,
                input_files=(shown,) if shown else None,
                exec_stats=None,
            )
            reader = _page_reader(self.root, self.kwargs, self.beton, lo, hi)
            tasks.append(ReadTask(reader, meta))
        return tasks


def _page_reader(
    root: str | Path, kwargs: dict[str, Any], beton: bool, lo: int, hi: int
) -> Callable[[], Iterable[Block]]:
    def read() -> Iterable[Block]:
        if beton:
            yield to_block(_beton_batch(BetonReader(root, **kwargs), lo, hi))
        else:
            yield to_block(_page_batch(PageReader(root, **kwargs), lo, hi))

    return read


def _page_batch(reader: PageReader, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Samples ``lo..hi`` as numpy columns: one copy, made with the GIL released."""
    n = hi - lo
    out: dict[str, np.ndarray] = {}
    widths = reader.max_sizes
    for name, spec in reader.fields.items():
        if spec == "int":
            out[name] = np.empty(n, dtype=np.int64)
        elif spec == "float":
            out[name] = np.empty(n, dtype=np.float64)
        elif spec == "bytes":
            out[name] = np.zeros((n, max(1, widths[name])), dtype=np.uint8)
        else:
            dtype, shape = cast(tuple[str, list[int]], spec)  # an array field
            out[name] = np.empty((n, *shape), dtype=np.dtype(dtype))
    lengths = reader.fill_batch(list(range(lo, hi)), out)
    for name, sizes in lengths.items():
        buf, row_sizes = out[name], cast(list[int], sizes)  # padded: a length per row
        out[name] = object_column([buf[i, : row_sizes[i]].tobytes() for i in range(n)])
    return out


def _beton_batch(reader: BetonReader, lo: int, hi: int) -> dict[str, np.ndarray]:
    samples = [reader.sample(i) for i in range(lo, hi)]
    out: dict[str, np.ndarray] = {}
    for name, spec in reader.fields.items():
        values = [s[name] for s in samples]
        if spec == "bytes":
            # FFCV's bytes field reads as uint8 arrays of their own lengths:
            # bytes here, as a page file's bytes field reads.
            out[name] = object_column([np.asarray(v).tobytes() for v in values])
        elif values and isinstance(values[0], np.ndarray) and len({v.shape for v in values}) == 1:
            out[name] = np.stack(values)
        elif values and isinstance(values[0], (bytes, memoryview, str, dict)):
            out[name] = object_column(
                [bytes(v) if isinstance(v, memoryview) else v for v in values]
            )
        else:
            out[name] = np.array(values)
    return out


def read_pages(
    path_or_url: str | os.PathLike[str],
    *,
    override_num_blocks: int | None = None,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    **read_args: Any,
) -> Dataset:
    """A Ray Dataset of a page file's (or a ``.beton``'s) samples, one column per field.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The file, or its URL (``s3://bucket/prefix/data.pages``); ``.beton``
        reads FFCV's format.
    override_num_blocks : int, optional
        Read tasks, each a contiguous range of samples.
    tier_dir, tier_budget, storage_options
        For a URL: as :class:`cachex.PageReader` takes them.
    **read_args
        Passed to ``ray.data.read_datasource``.
    """
    source = PageDatasource(
        path_or_url, tier_dir=tier_dir, tier_budget=tier_budget, storage_options=storage_options
    )
    dataset: Dataset = read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
    return dataset
