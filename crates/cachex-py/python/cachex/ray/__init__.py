"""Ray Data sinks and sources for cachex caches (``pip install cachex[ray]``).

Compute on the cluster, train from the cache: a ``map_batches`` pipeline
writes its outputs with ``ds.write_datasink(SegmentSink(path,
key_column="key"))``, and :func:`read_segments` (or a
:class:`cachex.SegmentStore` / :mod:`cachex.torch` dataset) reads them back.

Sinks
-----
SegmentSink
    A keyed segment store; each write task is a writer of its own, and the
    job's records become visible at once when it completes.
PageSink
    A page file (or an FFCV ``.beton``): each task writes a part, merged
    into one file renamed into place when the job completes.
MemmapSink
    A memmap-array cache: each task writes a part, merged into one cache
    directory renamed into place when the job completes.

Sources
-------
read_segments, read_pages, read_memmap
    Ray Datasets over each store, one read task per segment, page range or
    row range.

Every sink and source takes a local path or a URL (``s3://``, ``gs://``,
``az://``, ``file://``, with the stores' ``tier_dir``, ``tier_budget`` and
``storage_options`` keywords). On a path, a sink stages its tasks' output
next to the cache and commits it with one rename at the end (see
:mod:`cachex.ray.segments` for the segment store's protocol). On a URL,
each task stages its output on its own machine and uploads it as objects
that no commit names, and the driver publishes the job as one commit of
the cache's log (:mod:`cachex.ray._objects`); readers see it on their next
``refresh()``. Either way a task that fails or is retried by Ray leaves
nothing a reader sees, and a driver killed before the commit leaves the
cache as its last commit left it.

This module imports ``ray``; ``import cachex`` never does.
"""

from __future__ import annotations

try:
    import ray.data  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cachex.ray needs Ray Data: pip install 'cachex[ray]' (or 'ray[data]')"
    ) from e

from cachex.ray.memmap import MemmapDatasource, MemmapSink, read_memmap
from cachex.ray.pages import PageDatasource, PageSink, read_pages
from cachex.ray.segments import SegmentDatasource, SegmentSink, read_segments, recover_segments

__all__ = [
    "MemmapDatasource",
    "MemmapSink",
    "PageDatasource",
    "PageSink",
    "SegmentDatasource",
    "SegmentSink",
    "read_memmap",
    "read_pages",
    "read_segments",
    "recover_segments",
]
