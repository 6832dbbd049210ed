"""A Ray job's writes to a cache on object storage, published as one commit.

A cache on a URL is a commit log (``objects/<blake3>`` + ``commits/<seq>.json``,
see the ``remote-cache`` crate). A sink writes it in two steps:

1. each write task stages its part in a local temporary directory on its
   own machine, uploads the files as content-addressed objects
   (:meth:`Remote.upload`: no commit, so no reader sees them), deletes the
   directory and returns the pieces that name the objects — small JSON
   records — in its write result;
2. the driver (``on_write_complete``) reads the log's state, decides the
   files to add against it (names free in the cache, the small files it
   must build, such as a segment store's writer log, uploaded the same
   way) and publishes every piece as **one** commit, claimed with a
   conditional put (:meth:`Remote.publish`). When another writer took the
   number meanwhile, it decides again against the newer state.

Readers see the job's records all at once, or none of them. A task that
fails, or a retried task's earlier attempt, leaves only objects that no
commit names (``cachex gc`` deletes them after its grace period); a
driver that dies before step 2 leaves the cache at its last commit. No
step relies on a disk shared by the driver and the tasks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cachex import _cachex
from cachex._remote import is_url, tier_kwargs
from cachex.errors import CacheIOError

#: How often :meth:`Remote.publish` decides again when others take its number.
MAX_COMMIT_RACES = 64

#: The pieces of each file of a log's state: ``{path: [piece as JSON text]}``.
Files = dict[str, list[str]]


class Remote:
    """A cache URL and the tier keywords every task and the driver open it with."""

    def __init__(
        self,
        url: str,
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.kwargs = tier_kwargs(tier_dir, tier_budget, storage_options)

    @classmethod
    def of(
        cls,
        path_or_url: str | os.PathLike[str],
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> Remote | None:
        """The cache at ``path_or_url`` with these tier keywords when it is a
        URL; ``None`` for a local path."""
        if not is_url(path_or_url):
            return None
        return cls(
            str(path_or_url),
            tier_dir=tier_dir,
            tier_budget=tier_budget,
            storage_options=storage_options,
        )

    def upload(self, kind: str, files: Sequence[tuple[str, Path]]) -> list[str]:
        """Upload ``(path in the cache, local file)`` pairs as objects (no commit).

        ``kind`` is the store's (``"segments"``, ``"pages"``, ``"arrays"``):
        it decides which files get a hash per block for readers that read
        them by blocks.
        """
        return _cachex._staged_upload(
            self.url, kind, [(p, str(f)) for p, f in files], **self.kwargs
        )

    def state(self) -> tuple[int, Files]:
        """The log's last commit number and its files' pieces."""
        return _cachex._staged_state(self.url, **self.kwargs)

    def read(self, path: str, pieces: list[str]) -> bytes:
        """The bytes of ``path`` made of ``pieces`` (from :meth:`state`), checked."""
        return _cachex._staged_read(self.url, path, pieces, **self.kwargs)

    def fetch(self, path: str, pieces: list[str], dest: Path) -> int:
        """Write ``path``, made of ``pieces``, into the local file ``dest``
        through the local tier (checked; disk, not memory); return its size."""
        return _cachex._staged_fetch(self.url, path, pieces, str(dest), **self.kwargs)

    def publish(self, decide: Callable[[Files], list[str]]) -> int:
        """Publish what ``decide(files)`` returns as one commit; return its number.

        ``decide`` gets the log's files and returns the pieces to commit,
        in the order readers apply them; it runs again when another writer
        took the number it was decided for.
        """

        def decided() -> tuple[int, list[str]]:
            seq, files = self.state()
            return seq, decide(files)

        return self.publish_decided(decided)

    def publish_decided(self, decide: Callable[[], tuple[int, list[str]]]) -> int:
        """Publish as one commit what ``decide()`` returns: the number of the
        commit it was decided against and the pieces to commit after it.

        ``decide`` runs again when another writer took the next number.
        """
        for _ in range(MAX_COMMIT_RACES):
            seq, pieces = decide()
            self._before_commit()
            done = _cachex._staged_commit(self.url, seq, pieces, [], **self.kwargs)
            if done is not None:
                return done
        raise CacheIOError(
            None,
            f"{MAX_COMMIT_RACES} commit numbers in a row were taken by other writers; "
            "nothing was committed",
        )

    def _before_commit(self) -> None:
        """Called once the commit is decided, before it is claimed (a test's crash point)."""


def piece_path(piece: str) -> str:
    """The path a piece writes."""
    return str(json.loads(piece)["path"])
