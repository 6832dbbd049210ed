"""The torchcachex drop-in's in-memory LRU of values (``backend.lru``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

__all__ = ["Lru"]


class Lru:
    """At most ``size`` values by key, least recently used out first, in bulk.

    Two generations of plain dicts: new values and hits go into ``hot``;
    when ``hot`` outgrows half the size it becomes ``cold`` (keeping its
    newest ``size - size // 2``) and the old ``cold`` is dropped. A lookup
    costs one or two dict probes and eviction is amortized O(1), so the LRU
    adds almost nothing per value to a batch (an exact LRU's per-value
    bookkeeping cost more than reading the value from the mapped file).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.hot: dict[str, Any] = {}
        self.cold: dict[str, Any] = {}

    def get_many(self, keys: list[str]) -> tuple[list[Any], list[int]]:
        """Each key's value or None, and the positions of the Nones."""
        out = list(map(self.hot.get, keys))
        need = [i for i, v in enumerate(out) if v is None]
        if need and self.cold:
            cold, hot = self.cold, self.hot
            still = []
            for i in need:
                v = cold.get(keys[i])
                if v is None:
                    still.append(i)
                else:
                    hot[keys[i]] = out[i] = v
            need = still
            self._age()
        return out, need

    def put_many(self, keys: list[str], values: list[Any]) -> None:
        # A stale copy left in `cold` is harmless: `hot` is looked up first
        # and `cold` is dropped whole at the next aging.
        self.hot.update(zip(keys, values, strict=True))
        self._age()

    def _age(self) -> None:
        if len(self.hot) > self.size // 2:
            keep = self.size - self.size // 2
            hot = self.hot
            if len(hot) > keep:
                hot = dict(itertools.islice(hot.items(), len(hot) - keep, None))
            self.cold, self.hot = hot, {}

    def __len__(self) -> int:
        return len(self.hot) + sum(1 for k in self.cold if k not in self.hot)

    def __contains__(self, key: object) -> bool:
        return key in self.hot or key in self.cold

    def __iter__(self) -> Iterator[str]:
        """Keys, least recently used first."""
        yield from (k for k in self.cold if k not in self.hot)
        yield from self.hot

    def get(self, key: str, default: Any = None) -> Any:
        v = self.get_many([key])[0][0]
        return default if v is None else v
