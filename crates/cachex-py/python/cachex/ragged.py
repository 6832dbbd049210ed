"""A batch of variable-size values: :class:`Ragged`, the values concatenated
plus their offsets (numpy arrays or torch tensors; torch optional)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from cachex.errors import InvalidInputError

__all__ = ["Ragged"]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


class Ragged(NamedTuple):
    """``n`` values of varying size as one buffer: ``values`` holds them
    end to end (1-D; uint8 for a bytes field) and ``offsets`` (int64,
    ``n + 1`` entries, ``offsets[0] == 0``) where each starts and ends:
    value ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    Both are numpy arrays, or both torch tensors. A ``NamedTuple``, so
    torch's ``default_collate``, ``default_convert`` and ``pin_memory``
    convert and pin both parts, and ``values, offsets = batch["data"]``
    unpacks it. ``len()`` and indexing count the values, not the two parts.

    Examples
    --------
    >>> import numpy as np
    >>> r = Ragged(np.frombuffer(b"abcdef", np.uint8), np.array([0, 2, 2, 6]))
    >>> len(r), bytes(r[2])
    (3, b'cdef')
    >>> r.padded().tolist()
    [[97, 98, 0, 0], [0, 0, 0, 0], [99, 100, 101, 102]]
    """

    values: Any
    offsets: Any

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def __getitem__(self, i: Any) -> Any:
        return self.item(i)

    def item(self, i: int) -> Any:
        """Value ``i`` (negative from the end): a view of ``values``, no copy."""
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"value {i} out of range ({n} values)")
        start, end = int(self.offsets[j]), int(self.offsets[j + 1])
        return self.values[start:end]

    @property
    def lengths(self) -> Any:
        """Each value's size (int64, ``offsets[1:] - offsets[:-1]``)."""
        return self.offsets[1:] - self.offsets[:-1]

    def padded(self, width: int | None = None) -> Any:
        """The values as rows ``(n, width)`` zero-padded (a new array or
        tensor; ``width`` defaults to the longest value, a longer value is
        refused); with :attr:`lengths` this is the padded layout."""
        n = len(self)
        lengths = np.asarray(self.lengths.cpu() if _is_torch(self.lengths) else self.lengths)
        longest = int(lengths.max()) if n else 0
        width = longest if width is None else int(width)
        if longest > width:
            raise InvalidInputError(f"a value holds {longest} items, wider than width {width}")
        starts = np.asarray(self.offsets.cpu() if _is_torch(self.offsets) else self.offsets)[:-1]
        # One gather: row i takes values[starts[i] + c] where c < lengths[i].
        cols = np.arange(width, dtype=np.int64)
        mask = cols[None, :] < lengths[:, None]
        flat = (starts[:, None] + cols[None, :])[mask]
        if _is_torch(self.values):
            import torch

            out = torch.zeros((n, width), dtype=self.values.dtype, device=self.values.device)
            out[torch.from_numpy(mask).to(out.device)] = self.values[
                torch.from_numpy(flat).to(out.device)
            ]
            return out
        out_np = np.zeros((n, width), dtype=self.values.dtype)
        out_np[mask] = np.asarray(self.values)[flat]
        return out_np

    def to_nested(self) -> Any:
        """A torch nested tensor of the jagged layout over the same memory
        (``torch.nested.nested_tensor_from_jagged``; needs torch)."""
        try:
            import torch
        except ImportError as e:
            raise InvalidInputError("Ragged.to_nested() needs torch installed") from e
        values = self.values if _is_torch(self.values) else torch.from_numpy(self.values)
        offsets = self.offsets if _is_torch(self.offsets) else torch.from_numpy(self.offsets)
        return torch.nested.nested_tensor_from_jagged(values, offsets.to(torch.int64))

    def copy(self) -> Ragged:
        """A copy that owns its memory (of exactly the values, not a buffer's capacity)."""
        end = int(self.offsets[-1])
        if _is_torch(self.values):
            return Ragged(self.values[:end].clone(), self.offsets.clone())
        return Ragged(np.array(self.values[:end]), np.array(self.offsets))
