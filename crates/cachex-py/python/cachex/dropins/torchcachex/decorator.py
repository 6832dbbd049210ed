"""torchcachex 0.2.0's ``torchcachex.decorator``: :class:`CacheModuleDecorator`,
a read-through per-sample cache around a stateless ``nn.Module`` (needs
torch; without it, constructing one raises :class:`TorchRequiredError`).
See :mod:`cachex.torchcachex` for where it differs from torchcachex's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cachex.dropins.torchcachex.backend import ArrowIPCCacheBackend
from cachex.dropins.torchcachex.utils import (
    TorchRequiredError,
    _cpu,
    _leaves,
    _move,
    _tree_index,
    _tree_stack,
)

try:  # torch is optional: without it values are numpy arrays.
    import torch
    import torch.nn as nn
except ImportError:  # pragma: no cover - exercised in the numpy-only CI venv
    torch = None  # type: ignore[assignment]
    nn = None  # type: ignore[assignment]

__all__ = ["CacheModuleDecorator"]


if nn is not None:

    class CacheModuleDecorator(nn.Module):
        """Read-through cache around a stateless module, per sample (torchcachex's).

        Calls look every sample's ``cache_ids`` up, run ``module`` only on
        the misses (rows of the first argument when it is a tensor), cache
        their outputs (detached, on CPU) and return the whole batch in
        input order, stacked, on the first argument's device.

        Parameters
        ----------
        module : nn.Module
            The computation; no trainable parameters while training unless
            ``enforce_stateless=False``.
        cache_backend : ArrowIPCCacheBackend
            Where outputs live.
        enabled : bool
            False runs ``module`` directly (True).
        key_from_batch_fn : callable, optional
            ``fn(*args, **kwargs) -> ids`` when calls carry no ``cache_ids``.
        enforce_stateless : bool
            Raise RuntimeError when the module has trainable parameters in
            training mode (True).
        map_location_on_read : str
            Where cached tensors are read to before moving to the input's
            device ("cpu").
        """

        def __init__(
            self,
            module: nn.Module,
            cache_backend: ArrowIPCCacheBackend,
            enabled: bool = True,
            key_from_batch_fn: Callable[..., list[str]] | None = None,
            enforce_stateless: bool = True,
            map_location_on_read: str = "cpu",
        ) -> None:
            super().__init__()
            self.module = module
            self.cache = cache_backend
            self.enabled = enabled
            self.key_from_batch_fn = key_from_batch_fn
            self.enforce_stateless = enforce_stateless
            self.map_location_on_read = map_location_on_read

        def _extract_keys(
            self, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[list[Any], list[int]]:
            """The batch's cache keys and their positions (``0..n``), from
            ``cache_ids=``, a batch dict's ``"cache_ids"`` or
            ``key_from_batch_fn``, in that order (torchcachex's)."""
            ids = kwargs.get("cache_ids")
            if ids is None and args and isinstance(args[0], dict) and "cache_ids" in args[0]:
                ids = args[0]["cache_ids"]
            if ids is None and self.key_from_batch_fn is not None:
                ids = self.key_from_batch_fn(*args, **kwargs)
            if ids is None:
                raise ValueError(
                    "CacheModuleDecorator requires `cache_ids` in kwargs or batch dict, "
                    "or provide `key_from_batch_fn` to derive per-sample keys."
                )
            if isinstance(ids, torch.Tensor):
                ids = ids.tolist()
            ids = list(ids)
            return ids, list(range(len(ids)))

        def _move_like_input(self, obj: Any, ref: Any) -> Any:
            """``obj``'s tensors on ``ref``'s device (the CPU when ``ref`` is
            no tensor), non-blocking except to MPS (torchcachex's)."""
            device = ref.device if isinstance(ref, torch.Tensor) else torch.device("cpu")
            return _move(obj, device)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            """The module's output for the batch, cached per sample."""
            clean = {k: v for k, v in kwargs.items() if k != "cache_ids"}
            if not self.enabled:
                return self.module(*args, **clean)
            keys, _ = self._extract_keys(args, kwargs)
            cached, missing = self.cache.get_batch(keys, map_location=self.map_location_on_read)
            if self.enforce_stateless and self.training:
                for p in self.module.parameters(recurse=True):
                    if p.requires_grad:
                        raise RuntimeError(
                            "CacheModuleDecorator: wrapped module has trainable parameters "
                            "while caching is enabled. Set enforce_stateless=False to allow."
                        )
            ref = args[0] if args else None
            device = ref.device if isinstance(ref, torch.Tensor) else torch.device("cpu")
            if not missing:
                return _tree_stack([_move(v, device) for v in cached])
            sub_batch = isinstance(ref, torch.Tensor)
            if isinstance(ref, torch.Tensor):
                idx = torch.tensor(missing, dtype=torch.long, device=ref.device)
                call_args = (ref.index_select(0, idx), *args[1:])
            else:
                call_args = args  # the whole batch runs; outputs indexed by position
            with torch.no_grad():
                out = self.module(*call_args, **clean)
            if any(t.device.type == "mps" for t in _leaves(out)):
                torch.mps.synchronize()
            fresh: dict[int, Any] = {}
            for j, pos in enumerate(missing):
                fresh[pos] = _tree_index(out, j if sub_batch else pos)
            self.cache.put_batch({keys[pos]: _cpu(v) for pos, v in fresh.items()})
            merged = [fresh[i] if i in fresh else cached[i] for i in range(len(keys))]
            return _tree_stack([_move(v, device) for v in merged])

        def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
            """The wrapped module's state dict (the cache lives on disk, not in it)."""
            return self.module.state_dict(*args, **kwargs)

        def load_state_dict(
            self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
        ) -> Any:
            """Loads into the wrapped module."""
            return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

else:

    class CacheModuleDecorator:  # type: ignore[no-redef]
        """torchcachex's module decorator; needs PyTorch (not importable here)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TorchRequiredError(
                "cachex.torchcachex.CacheModuleDecorator wraps a torch.nn.Module and needs "
                "PyTorch, which is not importable; ArrowIPCCacheBackend works without it"
            )
