"""Cache roots that are URLs, as the Python layers pass them on.

The native classes (:class:`cachex.SegmentStore`, :class:`cachex.ShardStore`,
:class:`cachex.MemmapArray`, :class:`cachex.PageReader`, ...) take a URL
(``s3://``, ``gs://``, ``az://``, ``file://``) wherever they take a path,
with the keywords ``tier_dir``, ``tier_budget`` and ``storage_options``;
the drop-ins and datasets only hand them on. Credentials stay in the
environment: nothing here shows a URL but the stores' own redacted
``url``.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["TierBudget", "is_url", "join", "tier_kwargs"]

#: A local tier's budget: bytes, or a size such as ``"20G"``.
TierBudget = int | str

_SCHEME = re.compile(r"^[A-Za-z0-9+.\-]+://")


def is_url(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is a URL (``scheme://...``) rather than a path."""
    return isinstance(root, str) and _SCHEME.match(root) is not None


def join(root: str | os.PathLike[str], name: str) -> str | os.PathLike[str]:
    """``root/name``: a URL joined with ``/``, a path with :func:`os.path.join`."""
    if is_url(root):
        return f"{str(root).rstrip('/')}/{name}"
    return os.path.join(root, name)


def tier_kwargs(
    tier_dir: str | os.PathLike[str] | None,
    tier_budget: TierBudget | None,
    storage_options: dict[str, Any] | None,
) -> dict[str, Any]:
    """The tier keywords that were given, for a store's constructor."""
    given = {
        "tier_dir": tier_dir,
        "tier_budget": tier_budget,
        "storage_options": storage_options,
    }
    return {k: v for k, v in given.items() if v is not None}
