"""The decorator layer: :func:`cached` / :class:`CachedFn` over any cache
opened with :func:`cachex.open`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from cachex._cachex import Cache, _CachedFn, open
from cachex.errors import InvalidInputError

__all__ = ["CachedFn", "cached"]


class CachedFn:
    """A batch function whose outputs are cached by stable input id.

    Calling it looks every input's id up in the cache, calls the wrapped
    function **once** with the inputs that missed (each distinct id once),
    stores their outputs, and returns every output in the caller's order.

    Parameters
    ----------
    cache : Cache
        A cache from :func:`cachex.open`.
    func : callable
        ``func(list_of_inputs) -> iterable_of_outputs``, one output per
        input; an output is anything :meth:`cachex.SegmentStore.put_batch`
        takes (an array, a dict/tuple/list of arrays and bytes, bytes).
    id_of : callable, optional
        ``id_of(input) -> str``: the stable id of an input, used when a call
        gives no ``ids``.

    Notes
    -----
    The GIL is released while the cache is read and written; ``func`` runs
    with the GIL held. An exception raised by ``func`` propagates
    unchanged, and nothing of that batch is cached. A CachedFn (or Cache)
    made before a fork stores nothing in the forked child: its calls there
    raise :class:`cachex.ForkedWriterError`.
    """

    def __init__(
        self,
        cache: Cache,
        func: Callable[[list[Any]], Iterable[Any]],
        *,
        id_of: Callable[[Any], Hashable] | None = None,
    ) -> None:
        self._cache = cache
        self._native_func = func
        self._native = _CachedFn(cache, func)
        self._id_of = id_of
        functools.update_wrapper(self, func)

    @property
    def cache(self) -> Cache:
        """The cache the outputs live in."""
        return self._cache

    def __call__(self, inputs: Iterable[Any], ids: Sequence[Hashable] | None = None) -> list[Any]:
        """Outputs for ``inputs``: cached ones read, the rest computed and cached.

        Parameters
        ----------
        inputs : iterable
            The batch.
        ids : sequence, optional
            One stable id per input (``str()`` is applied); defaults to
            ``id_of(input)`` for each input.

        Returns
        -------
        list
            One output per input, in order (arrays as read-only views).
        """
        inputs = list(inputs)
        if ids is None:
            if self._id_of is None:
                raise InvalidInputError("give ids=... or build the CachedFn with id_of=...")
            ids = [self._id_of(x) for x in inputs]
        return self._native(inputs, [str(i) for i in ids])

    def stats(self) -> dict[str, int]:
        """Counters: calls, hits, computed, deduplicated, compute_calls."""
        return self._native.stats()

    def flush(self) -> None:
        """Makes every computed output durable."""
        self._native.flush()

    def refresh(self) -> None:
        """Flushes, then reopens the cache from its config, so that it sees
        what other writers committed since it opened.

        For a segment store opened with ``"options": {"multi_writer": True}``
        by every rank of a job (each writes as writer ``RANK``): call it at
        the epoch boundary once every rank flushed, and each rank then hits
        on the keys any rank wrote. Nothing else may hold the cache (the
        ``Cache`` passed in, say): the old handle must close before the new
        one takes this writer's lock.
        """
        self._native.flush()
        config = self._cache.config
        func = self._native_func
        del self._native, self._cache  # closes the store: frees this writer's lock
        self._cache = open(config)
        self._native = _CachedFn(self._cache, func)


def cached(
    config: Cache | dict[str, Any] | str, *, id_of: Callable[[Any], Hashable] | None = None
) -> Callable[[Callable[[list[Any]], Iterable[Any]]], CachedFn]:
    """Decorator: cache a batch function's outputs in the cache ``config`` names.

    Parameters
    ----------
    config : Cache, dict or path
        An open cache, or a config for :func:`cachex.open`.
    id_of : callable, optional
        The stable id of an input (see :class:`CachedFn`).

    Examples
    --------
    >>> @cachex.cached({"backend": "segment-store", "root": "cache",
    ...                 "name": "embed", "create_root": True}, id_of=str)
    ... def embed(paths):
    ...     return [model(load(p)) for p in paths]
    """
    cache = config if isinstance(config, Cache) else open(config)

    def decorate(func: Callable[[list[Any]], Iterable[Any]]) -> CachedFn:
        return CachedFn(cache, func, id_of=id_of)

    return decorate
