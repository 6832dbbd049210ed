"""Batch buffers and collation for :mod:`cachex.torch`: numpy arrays, or torch
tensors (in shared memory inside a DataLoader worker, pinned on request),
and the bases the datasets build on whether or not torch is installed."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from cachex.errors import InvalidInputError
from cachex.protocols import Output
from cachex.ragged import Ragged

try:
    import ml_dtypes
except ImportError:  # bfloat16 arrays come back as raw uint16
    ml_dtypes = None  # type: ignore[assignment]

try:
    import torch
    from torch.utils.data import Dataset as MapBase
    from torch.utils.data import IterableDataset as IterableBase
    from torch.utils.data import get_worker_info as worker_info
except ImportError:  # numpy-only install
    torch = None  # type: ignore[assignment]

    _T = TypeVar("_T")

    class MapBase(Generic[_T]):  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.Dataset`` when torch is not installed."""

    class IterableBase(Generic[_T]):  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.IterableDataset`` when torch is not installed."""

    def worker_info() -> None:
        return None


__all__ = [
    "HAS_TORCH",
    "BatchLayout",
    "IterableBase",
    "MapBase",
    "Output",
    "as_numpy",
    "check_output",
    "collate",
    "empty",
    "indices_of",
    "like",
    "numpy_dtype",
    "shared",
    "torch",
    "worker_info",
]

#: Whether torch is importable (the dataset classes then subclass its datasets).
HAS_TORCH = torch is not None

#: How a buffer of a shape and dtype is allocated.
Allocator = Callable[[tuple[int, ...], np.dtype[Any]], Any]


@dataclass(frozen=True)
class BatchLayout:
    """The buffers of a dataset's batches as its reader fills them
    (``fill_batch``): each buffered name's dtype and the shape of one
    sample (``specs``); the names batched as :class:`cachex.Ragged`, whose
    spec is the values' dtype (``ragged``); and the suffix and dtype of
    what the fill reports per name (``extra``: ``("_lengths", int64)`` for
    the bytes fields of a page file, ``("_present", bool)`` for a memmap
    array's nullable arrays)."""

    specs: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]
    extra: tuple[str, np.dtype[Any]]
    ragged: tuple[str, ...] = field(default=())

    def buffers(self, n: int, alloc: Allocator, values: Allocator) -> dict[str, Any]:
        """Buffers for ``n`` samples from ``alloc``; a ragged name's empty
        values buffer from ``values``."""
        out: dict[str, Any] = {}
        for name, (dtype, shape) in self.specs.items():
            if name in self.ragged:
                out[name] = Ragged(values((0,), dtype), alloc((n + 1,), np.dtype(np.int64)))
            else:
                out[name] = alloc((n, *shape), dtype)
        return out


def indices_of(index: Any, n: int) -> list[int]:
    """The sample indices of ``dataset[index]`` for a batch: a slice of
    ``range(n)``, or a list, array or tensor of indices."""
    if isinstance(index, slice):
        return list(range(*index.indices(n)))
    if torch is not None and isinstance(index, torch.Tensor):
        index = index.tolist()
    return [operator.index(i) for i in np.asarray(index).reshape(-1).tolist()]


def check_output(output: str, pin_memory: bool) -> None:
    """Refuses an output that is not ``"numpy"`` or ``"torch"`` (or torch
    without torch installed), and ``pin_memory`` without torch output."""
    if output not in ("numpy", "torch"):
        raise InvalidInputError(f"output {output!r}: give 'numpy' or 'torch'")
    if output == "torch" and torch is None:
        raise InvalidInputError("output='torch' needs torch installed")
    if pin_memory and output != "torch":
        raise InvalidInputError("pin_memory=True needs output='torch'")


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype a store names (bfloat16: ``ml_dtypes``' when installed,
    else raw ``<u2``)."""
    if name == "bfloat16":
        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16 if ml_dtypes is not None else "<u2")
        return bf16
    return np.dtype(name)


def _torch_dtype(dtype: np.dtype[Any]) -> Any:
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def shared(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """An uninitialised torch tensor in shared memory: another process maps
    it when it receives it (a DataLoader worker's batch, a ring slot)."""
    numel = int(np.prod(shape, dtype=np.int64))
    proto = torch.empty(0, dtype=_torch_dtype(dtype))
    storage = proto._typed_storage()._new_shared(numel, device="cpu")  # type: ignore[no-untyped-call]
    return proto.new(storage).resize_(shape)


def empty(shape: tuple[int, ...], dtype: np.dtype[Any], output: Output, pin_memory: bool) -> Any:
    """An uninitialised buffer; in a DataLoader worker a torch one lives in shared memory."""
    if output == "numpy":
        return np.empty(shape, dtype)
    if worker_info() is not None:
        # As torch's default_collate: the batch goes to the main process
        # through shared memory, so allocate it there and skip the copy.
        return shared(shape, dtype)
    return torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=pin_memory)


def like(buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """An uninitialised buffer of ``shape`` in the same memory as ``buf``
    (numpy, shared, pinned or plain torch): a grown ragged values buffer."""
    if isinstance(buf, np.ndarray):
        return np.empty(shape, dtype)
    if buf.is_shared():
        return shared(shape, dtype)
    return torch.empty(shape, dtype=buf.dtype, pin_memory=buf.is_pinned())


def as_numpy(buf: Any, dtype: np.dtype[Any] | None = None) -> np.ndarray[Any, Any]:
    """A numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.dtype == torch.bfloat16:
            return buf.view(torch.int16).numpy().view(dtype or np.dtype("<u2"))
        array: np.ndarray[Any, Any] = buf.numpy()
        return array
    raise InvalidInputError(f"a batch buffer must be a numpy array or CPU tensor, not {type(buf)}")


def _leaf(x: Any) -> np.ndarray[Any, Any] | None:
    if isinstance(x, np.ndarray):
        return x
    if torch is not None and isinstance(x, torch.Tensor):
        return as_numpy(x)
    return None


def collate(
    samples: Sequence[Any],
    *,
    out: Any = None,
    output: Output = "numpy",
    pin_memory: bool = False,
) -> Any:
    """Stacks items into one batch: arrays into one buffer each (``out``'s
    when given, with the same structure), numbers into one array, dicts,
    tuples and lists field by field; anything else stays a list."""
    if not samples:
        raise InvalidInputError("cannot collate an empty batch")
    first = samples[0]
    arr = _leaf(first)
    if arr is not None:
        leaves = [_leaf(s) for s in samples]
        arrays = [leaf for leaf in leaves if leaf is not None]
        if len(arrays) != len(leaves):
            raise InvalidInputError("cannot stack the batch's arrays: a sample is not an array")
        if out is None:
            out = empty((len(samples), *arr.shape), arr.dtype, output, pin_memory)
        try:
            np.stack(arrays, out=as_numpy(out, arr.dtype)[: len(samples)])
        except (ValueError, TypeError) as e:
            raise InvalidInputError(f"cannot stack the batch's arrays: {e}") from e
        return out[: len(samples)]
    if isinstance(first, (bool, int, float, np.number)):
        values = np.asarray(samples)
        if output == "torch":
            return torch.as_tensor(values)
        return values
    if isinstance(first, dict):
        return {
            k: collate(
                [s[k] for s in samples],
                out=None if out is None else out[k],
                output=output,
                pin_memory=pin_memory,
            )
            for k in first
        }
    if isinstance(first, (tuple, list)):
        parts = [
            collate(
                [s[j] for s in samples],
                out=None if out is None else out[j],
                output=output,
                pin_memory=pin_memory,
            )
            for j in range(len(first))
        ]
        return type(first)(parts) if type(first) in (tuple, list) else parts
    return list(samples)
