"""Map-style reads of a URL under a tier budget, as ``DataLoader(dataset,
shuffle=True)`` makes them: every sample once an epoch in a random order,
one at a time, no plan registered. A page file written with
``PageWriter(url)``'s defaults is published in blocks of a quarter page,
so a read fetches about its own page, not a block of megabytes that the
next miss evicts (nor a file kept whole over the budget): an epoch fetches
about the file's size, not many times it. The bucket is a ``file://``
directory; the figures are the tier's counters (``cachex.tier_stats``) and
its block map, never times."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import cachex

N = 600  # 1 to 64 KiB each: about 20 MB of samples
EPOCHS = 3


def blob(i: int) -> bytes:
    size = int(np.random.default_rng(i).integers(1024, 65536, endpoint=True))
    return bytes((np.arange(size) * 7 + i).astype(np.uint8))


def write_pages(url: str, tier_dir: Path, **kw) -> None:
    w = cachex.PageWriter(url, {"blob": "bytes"}, tier_dir=tier_dir, **kw)
    w.write_many({"blob": blob(i)} for i in range(N))
    w.finalize()


def block_size(tier_dir: Path) -> int:
    """The block size of the one object read by blocks in ``tier_dir``, from
    its block map (magic, version, then the block size at byte 12:
    remote-tier's ``format.rs``)."""
    sizes = set()
    for path in (tier_dir / "objects").rglob("*"):
        if path.is_file():
            head = path.read_bytes()[:20]
            if head[:8] == b"CXBLKMAP":
                sizes.add(int.from_bytes(head[12:20], "little"))
    (size,) = sizes
    return size


def fetched_per_epoch(url: str, tier_dir: Path, budget_share: float) -> tuple[list[float], float]:
    """Reads every sample once an epoch in a random order through a tier of
    ``budget_share`` of the file: each epoch's bytes fetched over the file's,
    and the tier's most allocated bytes (after every read) over its budget."""
    probe = cachex.PageReader(url, tier_dir=tier_dir, tier_budget=1 << 40)
    size = os.stat(probe.path).st_size
    del probe
    budget = int(budget_share * size)
    reader = cachex.PageReader(url, tier_dir=tier_dir, tier_budget=budget)
    ratios = []
    most = 0
    for epoch in range(EPOCHS):
        before = cachex.tier_stats(tier_dir)["fetched_bytes"]
        for i in np.random.default_rng(epoch).permutation(N).tolist():
            assert bytes(reader.sample(i)["blob"]) == blob(i)
            most = max(most, cachex.tier_stats(tier_dir)["allocated"])
        ratios.append((cachex.tier_stats(tier_dir)["fetched_bytes"] - before) / size)
    assert cachex.tier_stats(tier_dir)["over_budget"] == 0
    return ratios, most / budget


def test_random_samples_of_a_default_page_file_fetch_about_its_size_an_epoch(tmp_path):
    url = f"file://{tmp_path / 'bucket'}/pages/data.pages"
    write_pages(url, tmp_path / "writer")
    # A fresh tier per reading: the first with the budget holding it all.
    whole, _ = fetched_per_epoch(url, tmp_path / "whole", 2.0)
    assert whole[0] <= 1.05 and all(r <= 0.01 for r in whole[1:]), whole
    assert block_size(tmp_path / "whole") == 16 << 10
    # Half the file: a miss fetches its own page's blocks and nothing ahead
    # (the reads jump), and the tier keeps about half of what it read, so an
    # epoch fetches some of the file again (the budget cannot hold what it
    # reads), less than its size. In 8 MiB blocks the file was either held
    # whole over the budget or a 33 KB read fetched 8 MiB, many times the
    # file an epoch; with a window read ahead at every jump, more than it.
    half, most = fetched_per_epoch(url, tmp_path / "half", 0.5)
    assert all(0.1 <= r <= 1.0 for r in half[1:]), half
    # The tier's own allocation, block maps and clocks included, stays
    # within its budget.
    assert most <= 1.0, most


def test_a_writer_chooses_its_tier_block(tmp_path):
    url = f"file://{tmp_path / 'bucket'}/small/data.pages"
    write_pages(url, tmp_path / "writer", page_size=8 << 10, tier_block_size=8 << 10)
    reader = cachex.PageReader(url, tier_dir=tmp_path / "reader")
    assert bytes(reader.sample(N - 1)["blob"]) == blob(N - 1)
    assert block_size(tmp_path / "reader") == 8 << 10
    for bad in (1000, 2 << 10, 32 << 10):
        with pytest.raises(cachex.InvalidInputError, match="tier_block_size"):
            cachex.PageWriter(
                f"file://{tmp_path / 'bucket'}/bad/data.pages",
                {"blob": "bytes"},
                tier_dir=tmp_path / "writer",
                tier_block_size=bad,
            )
