"""Conversions between Ray Data blocks and cachex values.

Writing: a block becomes numpy columns (Ray's own ``BlockAccessor`` does
that, tensor columns included), then one value per row. Reading: a
segment's Arrow columns (torchcachex's ``data``/``shape`` list columns)
become Ray tensor columns over the same buffers when every row has one
shape, so a read task hands Ray the mapped segment without a copy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
from ray.data._internal.tensor_extensions.arrow import (
    ArrowTensorArray,
    ArrowVariableShapedTensorArray,
)
from ray.data.block import Block, BlockAccessor

from cachex.errors import InvalidInputError

try:
    import ml_dtypes
except ImportError:  # bfloat16 columns come back as raw uint16
    ml_dtypes = None  # type: ignore[assignment]


def numpy_columns(block: Block) -> dict[str, np.ndarray]:
    """A block's columns as numpy arrays (``(n, *shape)`` for tensor columns)."""
    return BlockAccessor.for_block(block).to_batch_format("numpy")


def to_block(batch: dict[str, np.ndarray]) -> Block:
    """A numpy batch as a Ray block (Arrow, tensor columns for n-d arrays)."""
    return BlockAccessor.batch_to_block(batch)


def _part(value: Any) -> Any:
    # A part is an array or bytes: text is stored as its UTF-8 bytes.
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return value


def keyed_values(
    block: Block, key_column: str, columns: str | Sequence[str] | None
) -> list[tuple[str, Any]]:
    """``(key, value)`` pairs of a block's rows, for ``SegmentStore.put_batch``.

    ``columns`` a name: each value is that column's entry (one tensor or
    one blob). A list, or ``None`` for every column but the key: each value
    is a dict of those columns' entries.
    """
    cols = numpy_columns(block)
    if key_column not in cols:
        raise InvalidInputError(f"the key column {key_column!r} is not in the dataset")
    keys = [str(k) for k in cols[key_column].tolist()]
    if isinstance(columns, str):
        if columns not in cols:
            raise InvalidInputError(f"the value column {columns!r} is not in the dataset")
        arr = cols[columns]
        if arr.dtype == object:
            return [(k, _part(v)) for k, v in zip(keys, arr, strict=True)]
        # arr[i, ...] is a 0-d array where arr[i] would be a numpy scalar,
        # which the stores take for a one-element vector.
        return [(k, arr[i, ...]) for i, k in enumerate(keys)]
    names = [c for c in cols if c != key_column] if columns is None else list(columns)
    missing = [c for c in names if c not in cols]
    if missing:
        raise InvalidInputError(f"the columns {missing} are not in the dataset")
    if not names:
        raise InvalidInputError("the dataset has no column besides the key to store")
    arrays = [cols[c] for c in names]
    objects = [a.dtype == object for a in arrays]
    columns_ = list(zip(names, arrays, objects, strict=True))
    return [
        (k, {n: (_part(a[i]) if obj else a[i, ...]) for n, a, obj in columns_})
        for i, k in enumerate(keys)
    ]


def segment_parts(schema: pa.Schema) -> list[dict[str, Any]]:
    """The ``cachex_parts`` list of a segment's schema metadata."""
    meta = schema.metadata or {}
    raw = meta.get(b"cachex_parts")
    if raw is None:
        raise InvalidInputError(
            "the segment has no cachex_parts metadata (written by torchcachex, "
            "not by cachex): read it with cachex.SegmentStore"
        )
    parts: list[dict[str, Any]] = json.loads(raw)
    return parts


def _values_of(list_array: pa.Array) -> pa.Array:
    """The flat values of a list array, cut to the rows it holds."""
    offsets = list_array.offsets
    start, end = offsets[0].as_py(), offsets[len(list_array)].as_py()
    return list_array.values.slice(start, end - start)


def _numpy_dtype(dtype: str) -> np.dtype[Any]:
    if dtype == "bfloat16":
        bf16: np.dtype[Any] = np.dtype(np.uint16 if ml_dtypes is None else ml_dtypes.bfloat16)
        return bf16
    return np.dtype(dtype)


def tensor_column(data: pa.ChunkedArray, shape: pa.ChunkedArray, dtype: str, rank: int) -> Any:
    """One tensor part as a Ray column: a tensor column over the segment's buffer
    when every row has one shape, a variable-shaped tensor column otherwise."""
    data_arr = data.combine_chunks()
    shape_arr = shape.combine_chunks()
    n = len(data_arr)
    values = _values_of(data_arr)
    if pa.types.is_boolean(values.type):
        flat = values.to_numpy(zero_copy_only=False)
    else:
        flat = values.to_numpy(zero_copy_only=True)
    flat = flat.view(_numpy_dtype(dtype)) if dtype == "bfloat16" else flat
    dims = _values_of(shape_arr).to_numpy(zero_copy_only=True).reshape(n, rank)
    if n and (dims == dims[0]).all():
        if rank == 0:
            return pa.array(flat)
        return ArrowTensorArray.from_numpy(flat.reshape((n, *dims[0].tolist())))
    offsets = data_arr.offsets.to_numpy() - data_arr.offsets[0].as_py()
    tensors = [flat[offsets[i] : offsets[i + 1]].reshape(dims[i].tolist()) for i in range(n)]
    return ArrowVariableShapedTensorArray.from_numpy(object_column(tensors))


def segment_block(table: pa.Table, value_column: str) -> pa.Table:
    """A segment's rows as a Ray block: ``key`` then one column per part.

    Part names: a dict's own names; ``item0``, ``item1``, ... for a tuple
    or list; ``value_column`` for a single tensor or blob.
    """
    parts = segment_parts(table.schema)
    columns = {"key": table.column("key")}
    for part in parts:
        name = part.get("name") or ""
        prefix = f"{name}_" if name else ""
        out = name or value_column
        if part.get("blob"):
            columns[out] = table.column(f"{prefix}blob")
        else:
            columns[out] = tensor_column(
                table.column(f"{prefix}data"),
                table.column(f"{prefix}shape"),
                part["dtype"],
                int(part["rank"]),
            )
    return pa.table(columns)


def object_column(values: list[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (bytes, text, arrays of any shape or ``None``)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
