"""Ray Data's sink and source for a page file (:class:`cachex.PageWriter`) or a ``.beton``.

Write protocol (:class:`PageSink`): every write task writes its rows into
a page file of its own, ``<parent>/.<name>.staging/<job>/task-NNNNNN``
(written to an attempt directory, renamed when finalized, so a retried
task's part is its last attempt's). When the job completes, the driver
merges the parts named by the write results, in task order, into one file
in the staging directory (durable: the writer fsyncs it) and renames it to
the target path: that one rename is the commit, so a reader sees the old
file or the whole new one. A page file is written whole, not appended to:
an existing target is replaced only with ``overwrite=True``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from ray.data import Dataset, read_datasource
from ray.data.block import Block, BlockMetadata
from ray.data.datasource import Datasink, Datasource, ReadTask, WriteResult

from cachex._cachex import BetonReader, PageReader, PageWriter, write_beton
from cachex.errors import InvalidInputError, SchemaMismatchError
from cachex.ray._blocks import numpy_columns, object_column, to_block
from cachex.ray._staging import Job, fsync_dir, local_path, recover, task_parts

FieldSpec = Any


def _staging(path: Path) -> Path:
    return path.parent / f".{path.name}.staging"


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


class PageSink(Datasink):
    """Writes a dataset into one page file (or an FFCV ``.beton``).

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The file to write (URLs are not supported yet). A name ending in
        ``.beton`` writes FFCV's format.
    fields : dict, optional
        ``{column: "int" | "float" | "bytes" | "json" | (dtype, shape)}``;
        default: every column, inferred (integers ``"int"``, floats
        ``"float"``, bytes and text ``"bytes"``, tensors ``(dtype, shape)``).
    page_size : int, optional
        The page size (the writer's default otherwise).
    overwrite : bool
        Replace an existing file (atomically, at the commit).
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        fields: Mapping[str, FieldSpec] | None = None,
        *,
        page_size: int | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = local_path(path_or_url)
        self.fields = None if fields is None else dict(fields)
        self.page_size = page_size
        self.overwrite = overwrite
        self.beton = self.path.suffix == ".beton"
        self.job = Job(_staging(self.path))

    def get_name(self) -> str:
        return "CachexPages"

    def on_write_start(self, schema: Any = None) -> None:
        if self.path.exists() and not self.overwrite:
            raise InvalidInputError(f"{self.path}: exists (pass overwrite=True to replace it)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        recover(_staging(self.path))
        self.job.start()

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any] | None:
        attempt = self.job.task_attempt(ctx.task_idx)
        writer = None
        fields = self.fields
        rows = 0
        for block in blocks:
            cols = numpy_columns(block)
            if fields is None:
                fields = {name: _infer_field(col) for name, col in cols.items()}
            if writer is None:
                part_fields = {k: _part_field(v) for k, v in fields.items()}
                writer = PageWriter(attempt / "part.pages", part_fields, page_size=self.page_size)
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
        final = self.job.finish_task(ctx.task_idx, attempt)
        return {"task": ctx.task_idx, "dir": final.name, "rows": rows, "fields": fields}

    def on_write_complete(self, write_result: WriteResult) -> None:
        parts = task_parts(write_result.write_returns)
        if parts:
            fields = parts[0]["fields"]
            for p in parts:
                if p["fields"] != fields:
                    raise SchemaMismatchError(
                        f"{self.path}: write tasks inferred different fields "
                        f"({fields} and {p['fields']}); pass fields= explicitly"
                    )
            merged = self.job.dir / ("merged" + self.path.suffix)
            readers = [PageReader(self.job.dir / p["dir"] / "part.pages") for p in parts]
            samples = _merged_samples(readers, fields)
            if self.beton:
                kwargs = {} if self.page_size is None else {"page_size": self.page_size}
                write_beton(merged, fields, samples, **kwargs)
                with open(merged, "rb+") as f:
                    os.fsync(f.fileno())
            else:
                writer = PageWriter(merged, fields, page_size=self.page_size)
                writer.write_many(samples, threads=1)
                writer.finalize()
            self._before_rename()
            os.replace(merged, self.path)
            fsync_dir(self.path.parent)
        self.job.remove()

    def on_write_failed(self, error: Exception) -> None:
        self.job.remove()

    def _before_rename(self) -> None:
        """Called with the merged file durable, before the commit's rename (a crash point)."""


def _merged_samples(readers: list[PageReader], fields: Mapping[str, FieldSpec]) -> Iterator[dict]:
    json_fields = [f for f, spec in fields.items() if spec == "json"]
    for reader in readers:
        for i in range(len(reader)):
            sample = reader.sample(i)
            for f in json_fields:
                sample[f] = bytes(sample[f]).decode()
            yield sample


class PageDatasource(Datasource):
    """Ray Data's source over a page file or a ``.beton``: one read task per sample range."""

    def __init__(self, path_or_url: str | os.PathLike[str]) -> None:
        self.path = local_path(path_or_url)
        self.beton = self.path.suffix == ".beton"
        reader = BetonReader(self.path) if self.beton else PageReader(self.path)
        self.rows = len(reader)
        self.fields = reader.fields

    def get_name(self) -> str:
        return "CachexPages"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.path.stat().st_size

    def get_read_tasks(self, parallelism: int, **_: Any) -> list[ReadTask]:
        tasks = []
        n = max(1, min(parallelism, self.rows))
        for chunk in np.array_split(np.arange(self.rows), n):
            if not len(chunk):
                continue
            lo, hi = int(chunk[0]), int(chunk[-1]) + 1
            meta = BlockMetadata(
                num_rows=hi - lo, size_bytes=None, input_files=[str(self.path)], exec_stats=None
            )
            tasks.append(ReadTask(_page_reader(self.path, self.beton, lo, hi), meta))
        return tasks


def _page_reader(path: Path, beton: bool, lo: int, hi: int):
    def read() -> Iterable[Block]:
        if beton:
            yield to_block(_beton_batch(BetonReader(path), lo, hi))
        else:
            yield to_block(_page_batch(PageReader(path), lo, hi))

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
            dtype, shape = spec
            out[name] = np.empty((n, *shape), dtype=np.dtype(dtype))
    lengths = reader.fill_batch(list(range(lo, hi)), out)
    for name, sizes in lengths.items():
        buf = out[name]
        out[name] = object_column([buf[i, : sizes[i]].tobytes() for i in range(n)])
    return out


def _beton_batch(reader: BetonReader, lo: int, hi: int) -> dict[str, np.ndarray]:
    samples = [reader.sample(i) for i in range(lo, hi)]
    out: dict[str, np.ndarray] = {}
    for name in reader.fields:
        values = [s[name] for s in samples]
        if values and isinstance(values[0], np.ndarray) and len({v.shape for v in values}) == 1:
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
    **read_args: Any,
) -> Dataset:
    """A Ray Dataset of a page file's (or a ``.beton``'s) samples, one column per field.

    Parameters
    ----------
    path_or_url : str or os.PathLike
        The file (URLs are not supported yet); ``.beton`` reads FFCV's format.
    override_num_blocks : int, optional
        Read tasks, each a contiguous range of samples.
    **read_args
        Passed to ``ray.data.read_datasource``.
    """
    source = PageDatasource(path_or_url)
    return read_datasource(source, override_num_blocks=override_num_blocks, **read_args)
