"""cachex: ML sample caches on local disk, with a Rust engine underneath.

Stores
------
SegmentStore
    A persistent key -> tensor-record map on immutable Arrow IPC segments
    (torchcachex's layout): ``put_batch``, ``get_batch``, ``flush``.

Arrays read back are read-only numpy views of memory-mapped files; each
view's ``.base`` keeps the mapping alive, so it stays valid after the store
is closed or deleted. Copy one (``np.array(view)``) to get a writable array
that does not keep the file mapped.

:mod:`cachex.torch` has datasets over every store for training loops
(PyTorch ``Dataset`` classes when torch is installed, numpy otherwise),
read in the order of one :mod:`cachex.sampling` plan (partitioned across
ranks and workers, resumable), the resumable DataLoader and every DDP rank
caching into one store. :mod:`cachex.torchcachex` and :mod:`cachex.loadit`
are drop-ins for torchcachex and loadit (their home is
:mod:`cachex.dropins`); :mod:`cachex.ray` has Ray Data sinks and sources.

Layout
------
===================================  ===============================================
``__init__.py``                      the stores (native ``_cachex``), errors, ``open``, ``cached``
``_cachex.pyi``                      stubs of the native module
``errors.py``, ``facade.py``         the error classes; ``cachex.cached``
``ragged.py``                        :class:`Ragged`: variable-size values of a batch
``_remote.py``                       URL roots and the tier keywords
``sampling.py``                      the sampling plan (numpy; no torch)
``streams.py``                       streams of a mixture and their plan (numpy, a native shuffle)
``protocols.py``                     what the plan's readers need of a dataset
``torch/``                           datasets, their plan readers, loaders, batch buffers
``dropins/``                         the torchcachex and loadit drop-ins (and DDP helpers)
``ray/``                             Ray Data sinks and sources
``torchcachex.py``, ``loadit.py``    the drop-ins' import paths (the same modules)
===================================  ===============================================

The modules form layers: the stores (the native module, errors, ``ragged``,
``facade``), then order (``sampling``, ``protocols``, ``streams``), then
``torch``, then ``ray`` and ``dropins``; a module imports from its own
layer or those below, never in a circle, and never inside a function.

Caches in object storage: every class and function that takes a cache
path also takes a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
``file://``), with ``tier_dir=``, ``tier_budget=`` and ``storage_options=``
(credentials stay in the environment and are never shown). The store works
in a directory of its own over the machine's local tier, which every
process and DataLoader worker there shares; writers publish on ``flush()``
/ ``close()``, and on their own as they persist: every few seconds
(``CACHEX_PUBLISH_INTERVAL``, default 5), when dropped, and at the exit
of the interpreter or of a ``multiprocessing`` child (every start method;
a ``Pool`` worker once the pool is closed and joined: ``terminate()``,
which leaving a ``with Pool()`` block calls, kills its workers, which then
lose what they persisted since their last publish). Readers see what was
published with ``refresh()``.

Every error a store raises is a :class:`cachex.CacheError` (see
:mod:`cachex.errors`), with the store's message naming the file and the
problem.
"""

from __future__ import annotations

import atexit as _atexit
import multiprocessing.util as _mp_util
import os as _os

from cachex import _cachex
from cachex._cachex import (
    BetonReader,
    Cache,
    MappedValue,
    MemmapArray,
    MemmapWriter,
    PageReader,
    PageWriter,
    PlanHandle,
    Prefetch,
    SegmentStore,
    ShardStore,
    __version__,
    bfloat16_is_native,
    check_dir,
    compute_fingerprint,
    compute_key,
    memmap_open_or_build,
    open,
    stale_reason,
    tier_stats,
    validate,
    verify,
    write_beton,
)
from cachex.errors import (
    CacheError,
    CacheIOError,
    CorruptError,
    ForkedWriterError,
    InvalidInputError,
    LockedError,
    ReadOnlyError,
    SchemaMismatchError,
    StaleError,
    WorkerError,
)
from cachex.facade import CachedFn, cached
from cachex.ragged import Ragged
from cachex.streams import Stream

# A forked child (a DataLoader worker) marks every live handle: readers
# reopen on first use, writers refuse with ForkedWriterError. See cachex.torch.
_os.register_at_fork(after_in_child=_cachex._after_fork_in_child)

# Writers on a URL publish on a period and when dropped; at exit, those
# Python never drops publish what is left (bounded; failures are warnings).
# A second call publishes nothing: the first took every writer.
_atexit.register(_cachex._publish_at_exit)


def _publish_at_process_exit(_: object = None) -> None:
    """Makes the last publish one of ``multiprocessing``'s exit finalizers.

    A ``multiprocessing`` child (every start method, ``Pool`` workers
    included) runs them as its ``run()`` ends, then a ``fork`` or
    ``forkserver`` child leaves with ``os._exit``, past ``atexit``.
    """
    _mp_util.Finalize(None, _cachex._publish_at_exit, exitpriority=0)


# Registered here for this process and a spawn child, which keeps the
# finalizers it has as it starts; a fork or forkserver child clears those
# it inherited as it starts, then runs the after-fork hooks, which
# register it again (the function is its own anchor in their weak
# registry, alive as long as this module).
_publish_at_process_exit()
_mp_util.register_after_fork(_publish_at_process_exit, _publish_at_process_exit)

__all__ = [
    "BetonReader",
    "Cache",
    "CacheError",
    "CacheIOError",
    "CachedFn",
    "CorruptError",
    "ForkedWriterError",
    "InvalidInputError",
    "LockedError",
    "MappedValue",
    "MemmapArray",
    "MemmapWriter",
    "PageReader",
    "PageWriter",
    "PlanHandle",
    "Prefetch",
    "Ragged",
    "ReadOnlyError",
    "SchemaMismatchError",
    "SegmentStore",
    "ShardStore",
    "StaleError",
    "Stream",
    "WorkerError",
    "__version__",
    "bfloat16_is_native",
    "cached",
    "check_dir",
    "compute_fingerprint",
    "compute_key",
    "memmap_open_or_build",
    "open",
    "stale_reason",
    "tier_stats",
    "validate",
    "verify",
    "write_beton",
]
