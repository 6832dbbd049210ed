"""The fixtures' expected values (``expected.json``), shared by the store
tests and the drop-in interop tests."""

from __future__ import annotations

import numpy as np

#: The torchcachex fixture caches (``crates/test-support/fixtures/torchcachex/``).
TORCHCACHEX_MODULES = ["tensor_f32", "tensor_f16", "tensor_i64", "dict_mixed", "tuple_pair"]


def expected_value(e):
    """An ``expected.json`` entry as the value a reader returns (arrays as numpy)."""
    if isinstance(e, dict) and set(e) == {"dtype", "shape", "data"}:
        return np.array(e["data"], dtype=e["dtype"]).reshape(e["shape"])
    return e
