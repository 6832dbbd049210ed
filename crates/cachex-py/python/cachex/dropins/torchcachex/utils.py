"""torchcachex 0.2.0's ``torchcachex.utils``: the helpers over nested
structures of tensors (``_tree_index``, ``_tree_stack``) and the sample
serializers (``_serialize_sample``, ``_deserialize_sample``), with the same
names, arguments and results, plus what the drop-in's backend and decorator
share (moving values between devices).

They work without torch on everything but tensors; ``_serialize_sample``
and ``_deserialize_sample`` are ``torch.save`` / ``torch.load`` and raise
:class:`TorchRequiredError` without it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cachex.errors import CacheError

try:  # torch is optional: without it values are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the numpy-only CI venv
    torch = None  # type: ignore[assignment]

__all__ = ["TensorLike", "TorchRequiredError"]

logger = logging.getLogger(__name__)

TensorLike = Sequence | Mapping if torch is None else torch.Tensor | Sequence | Mapping
"""A nested structure of tensors: a tensor, a sequence or a mapping of them."""


class TorchRequiredError(CacheError, ImportError):
    """The call needs PyTorch (``CacheModuleDecorator``) and torch is not importable."""


def _is_tensor(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _tree_index(x: Any, i: int) -> Any:
    """The ``i``-th sample of a batch: row ``i`` of each tensor, item ``i``
    of a list of per-sample tensors (what :func:`_tree_stack` returns for
    shapes that differ), recursing through lists, tuples and dicts; any
    other leaf is returned as it is."""
    if _is_tensor(x):
        return x[i]
    if isinstance(x, list):
        if x and _is_tensor(x[0]):
            return x[i]  # a list of per-sample tensors (variable shapes)
        return [_tree_index(v, i) for v in x]
    if isinstance(x, tuple):
        return tuple(_tree_index(v, i) for v in x)
    if isinstance(x, dict):
        return {k: _tree_index(v, i) for k, v in x.items()}
    return x


def _tree_stack(samples: list[Any]) -> Any:
    """A batch of ``samples`` (the inverse of :func:`_tree_index`): tensors
    of one shape stacked on a new first axis, tensors of different shapes
    kept as a list, lists, tuples and dicts stacked member by member, other
    leaves returned as the list they are.

    Raises
    ------
    ValueError
        ``samples`` is empty.
    """
    if not samples:
        raise ValueError("Cannot stack empty list of samples")
    x0 = samples[0]
    if _is_tensor(x0):
        if all(s.shape == x0.shape for s in samples):
            return torch.stack(samples, dim=0)
        return samples  # variable shapes: a list keeps each one
    if isinstance(x0, list):
        return [_tree_stack([s[j] for s in samples]) for j in range(len(x0))]
    if isinstance(x0, tuple):
        return tuple(_tree_stack([s[j] for s in samples]) for j in range(len(x0)))
    if isinstance(x0, dict):
        return {k: _tree_stack([s[k] for s in samples]) for k in x0}
    return samples


def _require_torch(what: str) -> None:
    if torch is None:
        raise TorchRequiredError(
            f"cachex.torchcachex.utils.{what} is torch.save / torch.load and needs "
            "PyTorch, which is not importable"
        )


def _serialize_sample(obj: Any) -> bytes:
    """``obj`` (a tensor or a nested structure) as ``torch.save`` bytes, its
    tensors moved to the CPU first (torchcachex's serializer)."""
    _require_torch("_serialize_sample")
    buf = io.BytesIO()
    torch.save(_cpu(obj), buf)
    return buf.getvalue()


def _deserialize_sample(blob: bytes, map_location: str = "cpu") -> Any:
    """A sample from :func:`_serialize_sample`'s bytes, tensors on
    ``map_location``. Unpickles (``weights_only=False``, as torchcachex):
    only read bytes you trust."""
    _require_torch("_deserialize_sample")
    return torch.load(io.BytesIO(blob), map_location=map_location, weights_only=False)


def _map_tensors(obj: Any, fn: Any) -> Any:
    """``obj`` with ``fn`` applied to each of its tensors, through dicts,
    tuples and lists; other leaves as they are."""
    if _is_tensor(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_map_tensors(v, fn) for v in obj)
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    return obj


def _move(obj: Any, device: Any) -> Any:
    """``obj``'s tensors on ``device`` (non-blocking except to MPS, which
    can hang on it); nothing moves without torch or a device."""
    if torch is None or device is None:
        return obj
    non_blocking = torch.device(device).type != "mps"
    return _map_tensors(obj, lambda t: t.to(device=device, non_blocking=non_blocking))


def _cpu(obj: Any) -> Any:
    """``obj``'s tensors detached and on the CPU."""
    return _map_tensors(obj, lambda t: t.detach().cpu())


def _leaves(obj: Any) -> list[Any]:
    """The tensors of a nested structure."""
    if _is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _leaves(v)]
    if isinstance(obj, tuple | list):
        return [t for v in obj for t in _leaves(v)]
    return []
