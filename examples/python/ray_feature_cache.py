"""Compute on the cluster, train from the cache: Ray Data fills a cachex cache.

    pip install 'cachex[ray]'
    python examples/python/ray_feature_cache.py [CACHE_DIR | s3://bucket/prefix]

A ``map_batches`` feature extractor (here a fixed random projection; on a
cluster, a model on GPUs) runs over a Ray Dataset, and its outputs go into
a segment store through ``cachex.ray.SegmentSink``: each write task writes
its own staged store, and the job's records become visible at once when it
completes. A training loop then reads the cache through
``cachex.torch.SegmentDataset`` (a ``torch.utils.data.Dataset`` when torch is
installed: hand it to a ``DataLoader``), and Ray reads it back with
``cachex.ray.read_segments``. Set ``RAY_ADDRESS`` to use a running cluster.

Given a URL, the cache lives in object storage: each write task uploads its
segments from its own machine and the job is published as one commit when
it completes; every node reads the bucket's credentials (and, for a server
other than AWS, ``AWS_ENDPOINT`` and ``AWS_ALLOW_HTTP``) from its
environment.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import ray

import cachex.ray
from cachex.torch import SegmentDataset

N, DIM, FEATURES = 2_000, 64, 16


class Extractor:
    """The expensive model: built once per worker, called per batch."""

    def __init__(self) -> None:
        self.weights = (
            np.random.default_rng(0).standard_normal((DIM, FEATURES)).astype(np.float32)
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["id"]
        inputs = np.sin(ids[:, None] * 0.01 + np.arange(DIM)[None, :]).astype(
            np.float32
        )
        return {
            "key": np.array([f"sample_{i}" for i in ids], dtype=object),
            "features": inputs @ self.weights,
            "label": (ids % 10).astype(np.int64),
        }


def main(cache: str | Path) -> None:
    if "RAY_ADDRESS" in os.environ:
        ray.init()
    else:
        ray.init(num_cpus=2)
    ray.data.DataContext.get_current().enable_progress_bars = False

    # 1. Compute on the cluster, write into the cache.
    ds = ray.data.range(N, override_num_blocks=8).map_batches(Extractor, concurrency=2)
    ds.write_datasink(cachex.ray.SegmentSink(cache, key_column="key"))

    # 2. Train from the cache (a torch Dataset when torch is installed).
    train = SegmentDataset(cache, [f"sample_{i}" for i in range(N)])
    batch = train[[0, 1, 2, 3]]  # one batch: {"features": (4, 16), "label": (4,)}
    assert batch["features"].shape == (4, FEATURES)
    assert batch["label"].tolist() == [0, 1, 2, 3]
    expected = Extractor()({"id": np.arange(4)})["features"]
    assert np.allclose(batch["features"], expected)

    # 3. Or read it back into Ray, one read task per segment.
    back = cachex.ray.read_segments(cache)
    assert back.count() == N
    print(f"{N} records cached in {cache}; columns {back.columns()}")
    ray.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1] if "://" in sys.argv[1] else Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "features")
