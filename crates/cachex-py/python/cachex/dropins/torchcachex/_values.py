"""How the torchcachex drop-in's values become store records and back:
tensors (numpy arrays without torch) and the dicts, tuples and lists of
them, anything else pickled, as torchcachex stores them."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import numpy as np

from cachex.errors import InvalidInputError

try:  # torch is optional: without it values are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the numpy-only CI venv
    torch = None  # type: ignore[assignment]

try:
    import ml_dtypes
except ImportError:  # bfloat16 tensors then need it only when one is stored
    ml_dtypes = None  # type: ignore[assignment]

__all__ = ["from_store_batch", "key_of", "to_store", "unstack_batch"]


def key_of(k: Any) -> str:
    """A key as the store's string (numpy and torch scalars by their value)."""
    if isinstance(k, str):
        return k
    item = getattr(k, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(k, "ndim", 0) == 0:
        k = item()
    return str(k)


#: bfloat16 as numpy has it (``ml_dtypes``), None without that package.
_BF16_DTYPE = None if ml_dtypes is None else np.dtype(ml_dtypes.bfloat16)


def _leaf_to_store(v: Any) -> Any:
    """A value part as the store takes it: an array, or a pickle."""
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            if _BF16_DTYPE is None:
                raise InvalidInputError(
                    "a bfloat16 tensor needs the ml_dtypes package (pip install ml_dtypes)"
                )
            return t.view(torch.int16).numpy().view(_BF16_DTYPE)
        return t.resolve_conj().resolve_neg().numpy()
    if isinstance(v, np.ndarray):
        return v
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def to_store(value: Any, blobs: frozenset[str] = frozenset()) -> Any:
    """A whole value as a store record: array, dict, tuple, list, or blob.

    ``blobs`` names the blob columns of the cache's schema (``blob``,
    ``{name}_blob``, ``item{i}_blob``): what goes there is pickled whatever
    it is, as torchcachex pickles what its schema does not hold as a tensor.
    """
    if "blob" in blobs:
        return _pickled(value)
    if isinstance(value, dict):
        return {
            str(k): _pickled(v) if f"{k}_blob" in blobs else _leaf_to_store(v)
            for k, v in value.items()
        }
    if isinstance(value, tuple | list):
        parts = [
            _pickled(v) if f"item{i}_blob" in blobs else _leaf_to_store(v)
            for i, v in enumerate(value)
        ]
        return tuple(parts) if isinstance(value, tuple) else parts
    return _leaf_to_store(value)


def _pickled(v: Any) -> bytes:
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def _own(a: np.ndarray) -> Any:
    """A fresh array the caller owns (``get_batch(copy=True)``) as the user's value type."""
    if torch is None:
        return a
    if a.dtype.kind == "V" and a.dtype == _BF16_DTYPE:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _leaf_from_store(v: Any) -> Any:
    return pickle.loads(v) if isinstance(v, bytes) else _own(v)


def _from_store(v: Any) -> Any:
    """A stored record (fresh arrays, dicts, tuples, lists, pickles) as the user's value."""
    if isinstance(v, np.ndarray):
        return _own(v)
    if isinstance(v, dict):
        return {k: _leaf_from_store(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_leaf_from_store(x) for x in v)
    if isinstance(v, list):
        return [_leaf_from_store(x) for x in v]
    return pickle.loads(v)


def from_store_batch(stored: list[Any], absent: list[int]) -> list[Any]:
    """``get_batch(copy=True)``'s values as user values (None stays None)."""
    if not stored or len(absent) == len(stored):
        return stored
    first = stored[next(i for i in range(len(stored)) if stored[i] is not None)]
    if isinstance(first, np.ndarray) and (torch is None or first.dtype.kind != "V"):
        if torch is None:
            return stored  # fresh, writable arrays already
        if not absent:
            return list(map(torch.from_numpy, stored))
        return [None if v is None else torch.from_numpy(v) for v in stored]
    return [None if v is None else _from_store(v) for v in stored]


def _unstack_column(col: Any) -> Any:
    """One column of ``get_stacked`` as a sequence of per-value parts.

    An array becomes its rows as tensors made by one ``unbind`` call (views
    of the batch's one fresh buffer: writable, none overlapping another); a
    list of pickles becomes the unpickled objects.
    """
    if isinstance(col, np.ndarray):
        return _own(col).unbind(0)
    return [None if b is None else pickle.loads(b) for b in col]


def unstack_batch(stacked: Any, n: int, absent: list[int]) -> list[Any]:
    """``get_stacked``'s batch as ``n`` values (torch only), None where absent.

    ``stacked`` is shaped like one value with a leading batch axis: an
    array, a list of pickles (a whole-value blob: every entry ``bytes`` or
    ``None``), or a dict / tuple / list of such columns.
    """
    if isinstance(stacked, np.ndarray):
        values = list(_unstack_column(stacked))
    elif isinstance(stacked, dict):
        names = list(stacked)
        columns = [_unstack_column(stacked[k]) for k in names]
        values = [dict(zip(names, row, strict=True)) for row in _rows(columns, n)]
    elif isinstance(stacked, tuple):
        values = list(_rows([_unstack_column(c) for c in stacked], n))
    elif stacked and all(b is None or isinstance(b, bytes) for b in stacked):
        values = _unstack_column(stacked)  # whole values pickled
    else:
        values = [list(row) for row in _rows([_unstack_column(c) for c in stacked], n)]
    for i in absent:
        values[i] = None
    return values


def _rows(columns: list[Any], n: int) -> Iterable[tuple[Any, ...]]:
    """The batch's values as tuples of parts (``n`` empty ones without columns)."""
    return zip(*columns, strict=True) if columns else [()] * n
