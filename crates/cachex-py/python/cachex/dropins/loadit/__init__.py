"""``cachex.loadit``: a drop-in for loadit 0.0.8, on cachex's Rust engine.

Change ``import loadit`` / ``from loadit import LoadIt`` to
``import cachex.loadit as loadit`` / ``from cachex.loadit import LoadIt``:
same names, arguments, defaults and directory layout, so existing roots
open as they are and roots written here stay readable by loadit. The
utilities live where loadit has them too (``cachex.loadit.util``,
``cachex.loadit.loadit``).

>>> import tempfile
>>> from cachex.loadit import LoadIt, chunk_shuffle
>>> root = tempfile.mkdtemp()
>>> loader = LoadIt(root, lambda: (i * i for i in range(1000)), max_shard_length=100)
>>> loader[12], loader[-1], len(loader)
(144, 998001, 1000)
>>> list(loader[3:0:-1])
[9, 4, 1]
>>> sorted(chunk_shuffle(loader, chunk_size=10, seed=1)[:10])
[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]

What is the engine's
--------------------
Shards are pickled with Python's ``pickle`` (any picklable item, as
loadit); the Rust ``ShardStore`` writes them to ``scratch/``, fsyncs,
renames them into ``shards/`` under ``locks/writer_lock.lock`` (the lock
loadit takes), keeps decoded shards in memory, evicts under
``memory_limit`` and regenerates from ``create_iter``. A writer killed
mid-shard leaves no partial shard: reopening gives the right items.
**Opening a root unpickles its shards** — open only roots you trust.

Differences from loadit
-----------------------
Kept where loadit was right; changed where it was wrong:

- **memory_limit below one shard**: the shard being read is kept (the
  budget is exceeded by at most that one shard) and every other shard is
  evicted; loadit deleted the shard it had just written, so nothing
  stayed cached.
- **Size accounting with compression**: the budget counts the compressed
  files (``*.shard.pickle.zstd``); loadit's size and eviction globbed
  ``*.shard.pickle`` only, so a compressed cache was never evicted.
- **Reversed and empty slices**: ``loader[::-1]`` and ``loader[:0]``
  follow Python's slice rules; loadit returned an empty view for a
  negative step with default bounds and treated ``stop=0`` as the end. A slice
  returns a lazy view (``LoaditView``), as loadit; iterating it reads in
  batches.
- **all_cached_to_disk after eviction**: ``False`` as soon as any shard
  is missing; loadit said ``True`` with the first shard gone.
- **length**: ``len(loader)`` returns the given ``length`` until the true
  one is known; loadit stored it and ignored it (iterating the whole
  source to find the length).
- **wait_until_all_cached** caches the missing shards itself when this
  loader has a source and no background filler, instead of waiting
  forever; under a budget too small for everything it returns after the
  pass.
- **Compression**: ``None`` or ``"zstd"`` (loadit accepted any fsspec
  codec); another codec raises ``cachex.InvalidInputError``.
- **Roots in object storage** (cachex only): ``root_dir`` may be a URL
  (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file://``), read
  through the machine's local tier; keyword-only ``tier_dir``,
  ``tier_budget`` and ``storage_options`` after loadit's arguments, and
  ``flush()`` / ``close()`` (publish what was generated) and
  ``refresh()`` (apply what others published). Without them, shards still
  reach the bucket as loadit persists them: every few seconds
  (``CACHEX_PUBLISH_INTERVAL``, default 5), when the ``LoadIt`` is dropped
  and at the interpreter's exit; a killed writer loses at most its last
  interval. loadit's own fsspec roots are not read this way.
- **Utilities**: see :mod:`cachex.loadit.util` (``InterleaveSequences``
  fixed, ``ConcatableSequence.__add__`` fixed, ``RepeatSequence`` length,
  ``chunk_shuffle_idx`` permutations come from shard-store's generator).
- ``memory_limit`` takes an int or a float, as loadit (a float is
  rounded down to whole bytes).
- ``preload_next_shard`` (the default ``preload_fn``) is run by the engine
  and loads the shards loadit's function names (``max_workers // 2 - 1``
  of them); assigning ``loader.preload_fn`` (``None`` to stop preloading)
  takes effect from the next access, as in loadit.
- Not provided: loadit's internal classes (``ShardedDataset``,
  ``DictCache``, ``WriterPool``, ``AsyncCacheBase``, ``size_estimator``);
  ``mode`` is accepted and ignored.
- The internals loadit users read are answered from the engine's state:
  ``loader.shards`` (``size()``: bytes of the shard files; ``get_all_shards()``:
  :class:`ShardInfo` ``(path, start, end, size)`` each; ``length()``,
  ``info()``, ``set_info()``, ``all_present()``, ``max_shard_length``,
  ``_cache_miss_count``: shards generated because no file held them),
  ``loader.shards.observer`` (:class:`ShardObserver`: no watchdog thread
  runs, so ``unschedule_all()``, ``stop()`` and ``join()`` return at once),
  ``loader.memory_cache`` (``size()``: decoded shards in memory,
  ``_cache_miss_count``: reads whose shard was not in memory),
  ``loader.writer_pool.writers[k].current_idx`` (how far the engine's
  ``k``-th replay of the source has got) and ``loader.finalize()`` (the
  end of the furthest shard on disk becomes the final length).
- Every public name of loadit's ``LoadIt`` exists. One is loadit's thread
  pool, which the engine replaces; reading it raises
  :class:`NotProvidedError` (a :class:`cachex.CacheError` and an
  ``AttributeError``) naming what to use instead: ``executor`` (the
  engine's workers; schedule loads with ``load_async``).
- Errors from the store (corrupt shard, option mismatch on reopen, an
  uncached index without a source) are :class:`cachex.CacheError`
  subclasses naming the file; loadit raised ``AssertionError`` /
  ``KeyError``.
"""

from __future__ import annotations

from cachex.dropins._not_provided import NotProvidedError
from cachex.dropins.loadit.loadit import (
    LoadIt,
    LoaditView,
    PreloadType,
    ShardInfo,
    ShardObserver,
    preload_next_shard,
)
from cachex.dropins.loadit.util import (
    ConcatableSequence,
    InterleaveSequences,
    RepeatSequence,
    SequenceView,
    chunk_shuffle,
    chunk_shuffle_idx,
    is_sequence,
)

__all__ = [
    "ConcatableSequence",
    "InterleaveSequences",
    "LoadIt",
    "LoaditView",
    "NotProvidedError",
    "PreloadType",
    "RepeatSequence",
    "SequenceView",
    "ShardInfo",
    "ShardObserver",
    "chunk_shuffle",
    "chunk_shuffle_idx",
    "is_sequence",
    "preload_next_shard",
]
