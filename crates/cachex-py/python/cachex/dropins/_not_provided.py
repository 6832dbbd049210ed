"""What a drop-in module does with an original's public name it does not keep.

Each drop-in (:mod:`cachex.torchcachex`, :mod:`cachex.loadit`) keeps every
public attribute and method of the class it replaces. Where cachex has no
equivalent (the original's internals: its index dict, its thread pool),
the name still exists on the class and reading it raises
:class:`NotProvidedError`, whose message says what to use instead.
"""

from __future__ import annotations

from typing import Any

from cachex.errors import CacheError

__all__ = ["NotProvidedError", "not_provided"]


class NotProvidedError(CacheError, AttributeError):
    """The original tool's attribute has no equivalent in the drop-in.

    The message names the original attribute and what to use instead. It
    is an ``AttributeError`` too, so ``hasattr`` and ``getattr(obj, name,
    default)`` treat the attribute as absent, as they would anywhere else.
    """


class not_provided:  # noqa: N801 - used like ``property``
    """A class attribute standing for an original's name the drop-in lacks.

    ``name = not_provided("what to use instead")`` lists ``name`` in
    ``dir()`` and makes reading it (on the class or an instance) raise
    :class:`NotProvidedError` naming the replacement.
    """

    def __init__(self, instead: str) -> None:
        self.instead = instead
        self.owner = ""
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner.__qualname__, name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        what = f"{self.owner}.{self.name}"
        raise NotProvidedError(f"{what} is not provided by cachex: {self.instead}")
