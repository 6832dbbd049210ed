"""A drop-in for torchcachex 0.2.0 over cachex's Rust segment store.

Change one import and keep the cache directories::

    # from torchcachex import ArrowIPCCacheBackend, CacheModuleDecorator
    from cachex.torchcachex import ArrowIPCCacheBackend, CacheModuleDecorator

:class:`ArrowIPCCacheBackend` keeps torchcachex's constructor, defaults and
methods (``put_batch``, ``get_batch``, ``flush``) and its on-disk layout::

    <cache_dir>/<module_id>/
      segments/segment_000000.arrow   Arrow IPC files: key, data, shape, ... columns
      schema.json                     {"fields", "metadata", "output_structure"}
      index.pkl                       torchcachex's index {key: (segment id, row)},
                                      rewritten by flush() and close()
      segment-index.log               cachex's index (key hashes, appended per flush)
      segment-store.lock              the writer's lock

:class:`CacheModuleDecorator` (needs torch) wraps a stateless
``nn.Module`` exactly as torchcachex's does.

Values are torch tensors when torch is importable, numpy arrays otherwise
(the backend works with numpy alone). Tensors read from disk are CPU
copies the caller owns (writable, independent of the mapped files). With
torch, one ``get_batch`` copies each tensor part of its values into one
fresh buffer and cuts it into the values' tensors with one ``unbind``
(a third to a half less time than a tensor per value): a value's tensor
is a view that shares that buffer with the other values read in the
same call, never overlapping them, so writing into one changes no other.
What shares a buffer stays alive together: one value kept (by the caller
or the LRU) keeps its batch's buffer, and ``torch.save`` of one value
writes the whole buffer; ``.clone()`` a value to keep it on its own.
Non-tensor values (inside dicts, tuples and lists, or whole) are pickled
as torchcachex pickles them: **opening a cache unpickles its blobs**, so
open only caches you trust.

Differences from torchcachex (deliberate)
-----------------------------------------
* ``flush()`` waits for every write queued before it, including async
  ones, and raises their errors; torchcachex's returned while queued
  writes were still in its thread pool and lost their errors.
* Every write is durable when ``flush()`` returns: segments are fsynced
  and renamed, then the index log is appended and fsynced. torchcachex did
  no fsync.
* A value whose structure, names or dtypes differ from the cache's schema
  raises :class:`cachex.SchemaMismatchError` and nothing of its batch is
  written; torchcachex cast it silently (or wrote garbage). Shapes and
  ranks are free, as in torchcachex (a shape per row): values of any
  shapes share one cache. The first value fixes the schema, as in
  torchcachex, even when the rest of its batch is refused.
* bfloat16 is kept as bfloat16 (numpy side: ``ml_dtypes.bfloat16``);
  torchcachex declared it float32 and failed converting it.
* ``lru_size=0`` means no in-memory LRU; torchcachex then kept *every*
  value in an unbounded dict. The LRU holds at most ``lru_size`` values
  and evicts the least recently used in bulk (two generations of
  ``lru_size / 2``), which costs a dict probe per value instead of
  per-value reordering.
* Two writer processes: the writer rank takes a lock, so a second writer
  on the same directory gets :class:`cachex.LockedError` instead of both
  numbering segments from the same id and overwriting each other's. To let
  several processes write at once pass ``writer_id`` (say, the rank): each
  then writes its own segment ids and index log (segment-store's
  multi-writer mode).
* When a non-tensor first argument makes the decorator run the whole
  batch, outputs are taken at each miss's position in the batch;
  torchcachex took them at the position in the list of misses (caching
  other samples' outputs under those keys).
* Keys that are not ``str`` (ints, numpy or torch scalars) are stored as
  ``str(key)`` (torchcachex could not persist them).
* ``index.pkl`` is removed before the first new segment of a batch lands
  and written again, from cachex's index, by ``flush()`` and ``close()``
  (torchcachex rewrote it after every segment): torchcachex, which trusts
  that file, reads either a true index or none (then it rebuilds its index
  from the segments), never a stale one. Writing it costs time in the
  number of keys, as torchcachex's did. Not with ``writer_id`` (several
  writers, each knowing only what it has read) nor a URL ``cache_dir``.
* In a forked child (a DataLoader worker) of the writer, puts fill the
  LRU only, as on a non-writer rank; the child reads the directory
  read-only. ``max_workers`` bounds how many flushes may queue for the one
  background writer thread (segments are written in order).
* numpy arrays are stored as tensors (torchcachex pickled them). Where
  the cache's schema holds a blob (a dict member or tuple item that was
  no tensor in the first value, or a whole value that was neither tensor,
  dict, tuple nor list), anything is pickled, as torchcachex does.
* A batch's tensors are views of one buffer per tensor part (see above);
  torchcachex copied each value's tensor on its own.
* ``cache_dir`` may be a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
  ``file://``; torchcachex took local directories only), with the
  keyword-only ``tier_dir``, ``tier_budget`` and ``storage_options``: the
  cache is read and written in a working directory over the machine's
  local tier, ``flush()`` / ``close()`` publish, ``refresh()`` applies
  what other writers published. Without them, what the writer persists
  still reaches the bucket: each segment it flushes within a few seconds
  (``CACHEX_PUBLISH_INTERVAL``, default 5), the rest when the backend is
  dropped or the interpreter exits; a killed writer loses at most its last
  interval.

Attributes: torchcachex 0.2.0's public ones all exist. ``schema`` is a
``pyarrow.Schema`` read from ``schema.json`` as torchcachex reads it (it
needs pyarrow, which cachex does not). ``lru`` is cachex's own two-generation
LRU (``len``, ``in``, ``get``; torchcachex had a ``cachetools.LRUCache``),
a plain empty ``dict`` with ``lru_size=0``. ``index`` is torchcachex's
``{key: (segment_id, row)}`` dict, built from cachex's index on each read
(a snapshot: changing it changes nothing; pending values appear once
flushed, as in torchcachex); ``key_to_idx`` is the same (the name
torchcachex's own scale tests read). The private helpers torchcachex's
users and tests call are kept with their meanings: ``_load_schema()``,
``_parse_arrow_type()``, ``_torch_to_arrow_dtype()`` (the Arrow type
cachex stores a dtype as; a dtype cachex cannot store raises
:class:`cachex.InvalidInputError`, where torchcachex said float32), and
the decorator's ``_extract_keys()`` and ``_move_like_input()``.
:mod:`cachex.torchcachex.utils` has torchcachex's ``_tree_index``,
``_tree_stack``, ``_serialize_sample`` and ``_deserialize_sample``;
the modules ``cachex.torchcachex.backend``, ``.decorator`` and ``.utils``
are where torchcachex has them.

``executor`` stands for torchcachex's write thread pool: it is the
store's background writer (:class:`WriteQueue`; None with
``async_write=False``, as torchcachex): ``shutdown(wait=True)`` returns once
the values put so far are written. Its ``submit`` raises
:class:`NotProvidedError` (a :class:`cachex.CacheError` and an
``AttributeError``) naming what to use instead, as the writer runs the
store's segment writes only.

cachex adds ``lru_size``, ``store`` (the :class:`cachex.SegmentStore`),
``is_writer``, ``url``, ``refresh()``, ``close()`` and the context-manager
protocol.
:class:`CacheModuleDecorator` keeps every public name of torchcachex's
(it is the same kind of ``nn.Module``).
"""

from __future__ import annotations

from cachex._cachex import __version__
from cachex.dropins._not_provided import NotProvidedError
from cachex.dropins.torchcachex import backend, decorator, utils
from cachex.dropins.torchcachex.backend import ArrowIPCCacheBackend, WriteQueue
from cachex.dropins.torchcachex.decorator import CacheModuleDecorator
from cachex.dropins.torchcachex.utils import TorchRequiredError

__all__ = [
    "ArrowIPCCacheBackend",
    "CacheModuleDecorator",
    "NotProvidedError",
    "TorchRequiredError",
    "WriteQueue",
    "__version__",
    "backend",
    "decorator",
    "utils",
]
