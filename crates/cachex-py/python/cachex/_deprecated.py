"""Old names that still work: each read warns (``DeprecationWarning``)
naming what to use instead, then gives the current object.

A module lists its deprecated names in a module ``__getattr__`` made here,
so they stay importable and out of ``__all__`` and ``dir()``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["deprecated_names", "moved_module"]


def _warn(old: str, new: str) -> None:
    # stacklevel 3: past this function and the module __getattr__, at the
    # line of the user's code that read the name.
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def deprecated_names(module: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``'s deprecated ``names``: each
    maps to ``(where it is defined, what to use instead)``."""

    def __getattr__(name: str) -> Any:  # noqa: N807
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, instead = names[name]
        _warn(f"{module}.{name}", instead)
        return getattr(importlib.import_module(home), name)

    return __getattr__


def moved_module(
    old: str, new: str, public: str, instead: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for module ``old``, which moved to
    ``new``: every name of ``new`` is read from there with a warning that
    names ``public`` (the package that exports it) or ``new``, or what
    ``instead`` says for a name that is itself deprecated."""

    def __getattr__(name: str) -> Any:  # noqa: N807
        if name == "__all__":  # for ``from old import *``: each name then warns
            return list(getattr(importlib.import_module(new), "__all__", ()))
        if name.startswith("__"):  # __path__, __wrapped__, ...: not ours to give
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module = importlib.import_module(new)
        try:
            value = getattr(module, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
        exported = getattr(importlib.import_module(public), "__all__", ())
        home = public if name in exported else new
        _warn(f"{old}.{name}", (instead or {}).get(name, f"{home}.{name}"))
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(getattr(importlib.import_module(new), "__all__", ()))

    return __getattr__, __dir__
