"""Batch buffers and collation for :mod:`cachex.torch`: numpy arrays, or torch
tensors (in shared memory inside a DataLoader worker, pinned on request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from cachex.errors import InvalidInputError

try:
    import torch
    from torch.utils.data import Dataset as _MapBase
    from torch.utils.data import IterableDataset as _IterableBase
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # numpy-only install
    torch = None

    class _MapBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.Dataset`` when torch is not installed."""

    class _IterableBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.IterableDataset`` when torch is not installed."""

    def _worker_info() -> None:
        return None


#: Whether torch is importable (the dataset classes then subclass its datasets).
HAS_TORCH = torch is not None

Output = Literal["numpy", "torch"]


def _check_output(output: str, pin_memory: bool) -> None:
    if output not in ("numpy", "torch"):
        raise InvalidInputError(f"output {output!r}: give 'numpy' or 'torch'")
    if output == "torch" and torch is None:
        raise InvalidInputError("output='torch' needs torch installed")
    if pin_memory and output != "torch":
        raise InvalidInputError("pin_memory=True needs output='torch'")


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype("<u2")
    return np.dtype(name)


def _torch_dtype(dtype: np.dtype) -> Any:
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _shared(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """An uninitialised torch tensor in shared memory: another process maps
    it when it receives it (a DataLoader worker's batch, a ring slot)."""
    numel = int(np.prod(shape, dtype=np.int64))
    proto = torch.empty(0, dtype=_torch_dtype(dtype))
    storage = proto._typed_storage()._new_shared(numel, device="cpu")
    return proto.new(storage).resize_(shape)


def _empty(shape: tuple[int, ...], dtype: np.dtype, output: Output, pin_memory: bool) -> Any:
    """An uninitialised buffer; in a DataLoader worker a torch one lives in shared memory."""
    if output == "numpy":
        return np.empty(shape, dtype)
    if _worker_info() is not None:
        # As torch's default_collate: the batch goes to the main process
        # through shared memory, so allocate it there and skip the copy.
        return _shared(shape, dtype)
    return torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=pin_memory)


def _like(buf: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """An uninitialised buffer of ``shape`` in the same memory as ``buf``
    (numpy, shared, pinned or plain torch): a grown ragged values buffer."""
    if isinstance(buf, np.ndarray):
        return np.empty(shape, dtype)
    if buf.is_shared():
        return _shared(shape, dtype)
    return torch.empty(shape, dtype=buf.dtype, pin_memory=buf.is_pinned())


def _as_numpy(buf: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.dtype == torch.bfloat16:
            return buf.view(torch.int16).numpy().view(dtype or np.dtype("<u2"))
        return buf.numpy()
    raise InvalidInputError(f"a batch buffer must be a numpy array or CPU tensor, not {type(buf)}")


def _leaf(x: Any) -> np.ndarray | None:
    if isinstance(x, np.ndarray):
        return x
    if torch is not None and isinstance(x, torch.Tensor):
        return _as_numpy(x)
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
        if out is None:
            out = _empty((len(samples), *arr.shape), arr.dtype, output, pin_memory)
        try:
            np.stack(leaves, out=_as_numpy(out, arr.dtype)[: len(samples)])
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
