"""W9 of ``BENCHMARKS.md``: a tier that knows the epoch (the child the Rust
runner starts, ``workload w9``).

    python benches/python/w9.py <config.json>

The runner has published one page file and written its layout (each
sample's checksum, length and run, as little-endian u64s) and the line
matrix into ``config.json``. Each line simulates ``nodes`` nodes, each with
its own tier directory and one ``cachex.torch.PageDataset`` on the URL
with ``tier_budget`` = the line's fraction of a node's share of the file
(the file over ``nodes``), and ``ranks`` rank threads per node, each
iterating ``IterableBatches(dataset, batch, rank=node * ranks + r,
world_size=nodes * ranks, affinity=..., homes=nodes, cross_node=...,
plan_eviction=...)`` after ``set_epoch(e)``, for ``epochs`` epochs. Within
an epoch the nodes read one after another, their ranks at once (the reads
release the GIL). Every batch is checked against the layout's checksums.

Per (line, epoch, node) it prints an ``epoch`` line: the bucket traffic
from ``cachex.tier_stats(tier_dir)`` deltas (``fetched_bytes``,
``fetched_ratio`` over the file's bytes D, ``get_requests``,
``evicted_bytes``, ``punched_blocks``, ``over_budget``), ``secs`` and
``samples_per_s``, ``floor_bytes`` (below), ``max_counted`` (the tier's
counted bytes after every batch), ``max_physical`` (allocated bytes of the
tier's ``objects/``, ``tmp/`` and working directories after every batch,
each file once), ``max_metadata`` (of those, the bytes of files that are
not copies: block maps, touch clocks, the working directories' records),
``budget``, ``bound`` and ``overlap`` (the fraction of
the node's samples it also read the epoch before), ``bookkeeping`` (what
the tier counts against its budget beyond cached bytes, at the epoch's
end: each copy's block map, touch clocks and a page of extent tree; the
count less the allocated bytes of the copies' data files) and
``floor_tier_bytes`` (the floor below, for the budget less that
bookkeeping: what the cached bytes can use).

The floor, from the plan: S = the tier blocks the node reads this epoch,
less the blocks a reader keeps for its life (header and tables, F); B' =
budget - bytes(F); floor = bytes(S) - min(B', bytes(S ∩ blocks the node
read in earlier epochs)); in epoch 0, plus bytes(F) (the open fetches it).

The same samples in a segment store (``config["segments"]``: each
``sample_<i>`` a ``{"blob": bytes}`` record) make the lines whose ``store``
is ``segments``: one ``cachex.torch.SegmentDataset`` per node, read the same
way (its plan covers every segment the node's keys lie in). Their
floor is counted in samples' bytes: bytes(S) - min(budget, bytes(S ∩ the
samples the node read in earlier epochs)), and their ``bound`` allows one
batch's rows per rank (each leased while it is read) beside the budget.

The lines of store ``defaults`` read a page file this child writes first
(``config["defaults"]``), as a user would: the runner's samples read back
and written with ``cachex.PageWriter(url)`` and its defaults (page size,
and the tier block its publish records, read from the reader's block map
for the floor). Lines of policy ``map`` read map-style, as
``DataLoader(dataset, shuffle=True)`` does: every sample once an epoch in
a random order (a permutation per epoch, dealt to the ranks in turn), one
``dataset[i]`` at a time, no plan registered; their floor is the one above
(a lower bound for any order).

Then a ``line`` line per line (epochs after the first: fetched, floor and
tier floor per epoch over D, the largest ``max_physical`` over the budget,
samples/s)
and a ``goal`` line per goal, with the measured ``value``, its
``threshold`` and ``met``; a goal is never retried. A wrong value read prints
``{"wrong_value": ...}`` and exits 1.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import shutil
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import cachex
from cachex.torch import IterableBatches, PageDataset, SegmentDataset

#: Counters of ``cachex.tier_stats`` whose per-epoch deltas each line reports.
DELTAS = ("fetched_bytes", "get_requests", "evicted_bytes", "punched_blocks", "over_budget")


class WrongValueError(Exception):
    """A batch held something other than the samples written."""


def emit(phase: str, **fields: Any) -> None:
    print(json.dumps({"phase": phase, **fields}), flush=True)


def progress(msg: str) -> None:
    print(f"[w9] {msg}", file=sys.stderr, flush=True)


def tier_stats(tier_dir: Path) -> dict[str, int]:
    """The tier's counters; zeros before its first open made them."""
    if not (tier_dir / "tier.state").exists():
        return dict.fromkeys(("allocated", *DELTAS), 0)
    return cachex.tier_stats(tier_dir)


def physical(tier_dir: Path) -> tuple[int, int, int]:
    """Allocated bytes of the tier's ``objects/``, ``tmp/`` and working
    directories (``work/``: a copy there is disk the tier holds too), each
    file once; of those the bytes of files that are not copies of
    objects (block maps, touch clocks, the working directories' records);
    and the bytes of the copies' data files in ``objects/``."""
    seen: set[int] = set()
    total = meta = data = 0
    for sub in ("objects", "tmp", "work"):
        for dirpath, _, names in os.walk(tier_dir / sub):
            for name in names:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # removed by an eviction meanwhile
                if st.st_ino in seen or not stat.S_ISREG(st.st_mode):
                    continue
                seen.add(st.st_ino)
                total += st.st_blocks * 512
                if sub == "objects":
                    is_meta = not name.endswith((".sparse", ".whole"))
                    data += 0 if is_meta else st.st_blocks * 512
                else:
                    is_meta = sub == "work" and ".cachex-remote" in dirpath
                if is_meta:
                    meta += st.st_blocks * 512
    return total, meta, data


@dataclass
class Layout:
    """What the runner wrote: each sample's checksum, length and tier blocks."""

    sums: np.ndarray
    lengths: np.ndarray
    first_block: np.ndarray
    last_block: np.ndarray
    block_bytes: np.ndarray  # of every tier block of the file
    fixed: np.ndarray  # bool per block: kept by a reader for its life

    @classmethod
    def load(cls, config: dict[str, Any]) -> Layout:
        table = np.fromfile(config["layout"], dtype="<u8").reshape(-1, 4).astype(np.int64)
        return cls.of(
            table[:, 0].astype(np.uint64),
            table[:, 1],
            table[:, 2:],
            int(config["block_size"]),
            int(config["dataset_bytes"]),
            config["fixed_ranges"],
        )

    @classmethod
    def of(
        cls,
        sums: np.ndarray,
        lengths: np.ndarray,
        runs: np.ndarray,
        bs: int,
        size: int,
        fixed_ranges: list[list[int]],
    ) -> Layout:
        """Samples' checksums and lengths, each one's run ``[start, end)``,
        in a file of ``size`` bytes read in tier blocks of ``bs``."""
        nblocks = -(-size // bs)
        starts = np.arange(nblocks, dtype=np.int64) * bs
        fixed = np.zeros(nblocks, dtype=bool)
        for lo, hi in fixed_ranges:
            if hi > lo:
                fixed[lo // bs : (hi - 1) // bs + 1] = True
        return cls(
            sums=sums,
            lengths=lengths,
            first_block=runs[:, 0] // bs,
            last_block=(runs[:, 1] - 1) // bs,
            block_bytes=np.minimum(bs, size - starts),
            fixed=fixed,
        )

    def blocks(self, samples: np.ndarray) -> np.ndarray:
        """The tier blocks samples ``samples`` lie in (bool per block)."""
        marks = np.zeros(len(self.block_bytes) + 1, dtype=np.int64)
        np.add.at(marks, self.first_block[samples], 1)
        np.add.at(marks, self.last_block[samples] + 1, -1)
        return np.cumsum(marks)[:-1] > 0

    def bytes_of(self, blocks: np.ndarray) -> int:
        return int(self.block_bytes[blocks].sum())

    def floor(
        self, samples: np.ndarray, seen: np.ndarray, budget: int, epoch: int
    ) -> tuple[int, np.ndarray]:
        """The floor of an epoch reading ``samples`` after the blocks ``seen``
        (empty: none), and the blocks seen after it."""
        wanted = self.blocks(samples) & ~self.fixed
        seen = seen if len(seen) else np.zeros_like(wanted)
        fixed_bytes = self.bytes_of(self.fixed)
        kept = min(max(budget - fixed_bytes, 0), self.bytes_of(wanted & seen))
        floor = self.bytes_of(wanted) - kept + (fixed_bytes if epoch == 0 else 0)
        return floor, seen | wanted

    def check(self, indices: np.ndarray, batch: dict[str, Any], where: str) -> int:
        """Checks a batch against the checksums; the bytes it held."""
        lengths = np.asarray(batch["blob_lengths"], dtype=np.int64)
        data = np.asarray(batch["blob"])[: len(indices)]
        if not np.array_equal(lengths, self.lengths[indices]):
            raise WrongValueError(f"{where}: lengths {lengths} != {self.lengths[indices]}")
        sums = np.array(
            [data[r, :n].sum(dtype=np.uint64) for r, n in enumerate(lengths)], dtype=np.uint64
        )
        bad = np.flatnonzero(sums != self.sums[indices])
        if len(bad):
            i = int(indices[bad[0]])
            raise WrongValueError(f"{where}: sample {i} sums to {sums[bad[0]]}, not {self.sums[i]}")
        return int(lengths.sum())

    def check_item(self, i: int, item: dict[str, Any], where: str) -> int:
        """Checks one ``dataset[i]`` (``blob``: its bytes); the bytes it held."""
        return check_blob(self.sums, self.lengths, i, item["blob"], where)


def check_blob(sums: np.ndarray, lengths: np.ndarray, i: int, blob: Any, where: str) -> int:
    """Checks sample ``i``'s bytes ``blob`` against its checksum and length."""
    data = np.frombuffer(blob, dtype=np.uint8)
    if len(data) != lengths[i] or data.sum(dtype=np.uint64) != sums[i]:
        raise WrongValueError(f"{where}: sample {i} ({len(data)} bytes) is not the one written")
    return len(data)


@dataclass
class SegmentLayout:
    """The segment store's samples: each one's checksum and length."""

    sums: np.ndarray
    lengths: np.ndarray

    @classmethod
    def load(cls, segments: dict[str, Any]) -> SegmentLayout:
        table = np.fromfile(segments["layout"], dtype="<u8").reshape(-1, 2)
        return cls(sums=table[:, 0], lengths=table[:, 1].astype(np.int64))

    def floor(
        self, samples: np.ndarray, seen: np.ndarray, budget: int, epoch: int
    ) -> tuple[int, np.ndarray]:
        """The floor in samples' bytes (see the module docs), and the
        samples seen after this epoch."""
        wanted = np.zeros(len(self.lengths), dtype=bool)
        wanted[samples] = True
        seen = seen if len(seen) else np.zeros_like(wanted)
        kept = min(budget, int(self.lengths[wanted & seen].sum()))
        return int(self.lengths[wanted].sum()) - kept, seen | wanted

    def check(self, indices: np.ndarray, batch: dict[str, Any], where: str) -> int:
        """Checks a batch (``blob``: a list of bytes) against the checksums;
        the bytes it held."""
        blobs = batch["blob"]
        lengths = np.array([len(b) for b in blobs], dtype=np.int64)
        if not np.array_equal(lengths, self.lengths[indices]):
            raise WrongValueError(f"{where}: lengths {lengths} != {self.lengths[indices]}")
        sums = np.array(
            [np.frombuffer(b, dtype=np.uint8).sum(dtype=np.uint64) for b in blobs], dtype=np.uint64
        )
        bad = np.flatnonzero(sums != self.sums[indices])
        if len(bad):
            i = int(indices[bad[0]])
            raise WrongValueError(f"{where}: sample {i} sums to {sums[bad[0]]}, not {self.sums[i]}")
        return int(lengths.sum())

    def check_item(self, i: int, item: dict[str, Any], where: str) -> int:
        """Checks one ``dataset[i]`` (a record whose ``blob`` is its bytes)."""
        return check_blob(self.sums, self.lengths, i, item["blob"], where)


def page_file_layout(path: Path) -> tuple[np.ndarray, list[list[int]], int, int]:
    """Each sample's run ``[start, end)`` in the page file at ``path``, the
    ranges a reader keeps for its life (header, tables), the file's size and
    its page size, from its header and run table (page-alloc's
    ``format.rs``; a reader open on it holds them local)."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        head = f.read(128)
        header_len = int.from_bytes(head[12:16], "little")
        page_size, _, _, data_offset, num_runs, _, meta_offset, runs_offset = (
            int(v) for v in np.frombuffer(head, dtype="<u8", count=8, offset=16)
        )
        f.seek(runs_offset)
        table = np.frombuffer(f.read(num_runs * 72), dtype="<u8").reshape(-1, 9).astype(np.int64)
    starts = data_offset + table[:, 0] * page_size
    ends = starts + table[:, 2]
    per_run = table[:, 4]
    runs = np.stack([np.repeat(starts, per_run), np.repeat(ends, per_run)], axis=1)
    return runs, [[0, min(header_len, size)], [min(meta_offset, size), size]], size, page_size


def block_size_of(tier_dir: Path, size: int) -> int:
    """The tier block of the object of ``size`` bytes a reader opened in
    ``tier_dir`` (its block map: magic, version, then the block size at
    byte 12 and the object's size at 20; remote-tier's ``format.rs``), or
    ``size`` for a copy fetched whole (no map)."""
    for dirpath, _, names in os.walk(tier_dir / "objects"):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                head = f.read(28)
            if head[:8] == b"CXBLKMAP" and int.from_bytes(head[20:28], "little") == size:
                return int.from_bytes(head[12:20], "little")
    return size  # copied whole: one block


def write_defaults(config: dict[str, Any], pages: Layout) -> Layout:
    """Writes the runner's samples into a page file of ``cachex.PageWriter``'s
    defaults at ``config["defaults"]``, and returns its layout (recording
    its size and geometry in ``config["defaults"]``)."""
    d = config["defaults"]
    root = Path(config["root"]) / "defaults-setup"
    source = cachex.PageReader(
        config["url"],
        tier_dir=root / "source",
        tier_budget=1 << 40,
        storage_options=config["storage_options"],
    )
    writer = cachex.PageWriter(
        d["publish_url"],
        {"blob": "bytes"},
        tier_dir=root / "writer",
        storage_options=d["publish_options"],
    )
    writer.write_many({"blob": bytes(source.sample(i)["blob"])} for i in range(len(source)))
    writer.finalize()
    del source, writer
    probe = cachex.PageReader(
        d["url"],
        tier_dir=root / "probe",
        tier_budget=1 << 40,
        storage_options=config["storage_options"],
    )
    runs, fixed, size, page_size = page_file_layout(probe.path)
    block = block_size_of(root / "probe", size)
    del probe
    gc.collect()
    shutil.rmtree(root, ignore_errors=True)
    d.update(
        dataset_bytes=size,
        block_size=block,
        page_size=page_size,
        max_run=int((runs[:, 1] - runs[:, 0]).max()),
    )
    progress(
        f"defaults: PageWriter(url) wrote {size / 1e6:.1f} MB in {page_size >> 10} KiB pages, "
        f"published in {block >> 10} KiB tier blocks"
    )
    return Layout.of(pages.sums, pages.lengths, runs, block, size, fixed)


def bookkeeping(tier_dir: Path) -> int:
    """What the tier counts beyond its copies' data (taken between epochs,
    with no read in flight)."""
    return max(tier_stats(tier_dir)["allocated"] - physical(tier_dir)[2], 0)


@dataclass
class Node:
    """One simulated node: its tier, its dataset and its ranks' iterables."""

    tier: Path
    dataset: Any
    ranks: list[tuple[int, Any]]
    before: dict[str, int]
    seen: np.ndarray  # blocks (samples, for a segment store) read in earlier epochs
    last_samples: np.ndarray | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_counted: int = 0
    max_physical: int = 0
    max_metadata: int = 0

    def measure(self) -> None:
        counted = tier_stats(self.tier)["allocated"]
        total, meta, _ = physical(self.tier)
        with self.lock:
            self.max_counted = max(self.max_counted, counted)
            self.max_physical = max(self.max_physical, total)
            self.max_metadata = max(self.max_metadata, meta)


def open_node(config: dict[str, Any], line: dict[str, Any], k: int, budget: int) -> Node:
    tier = Path(config["root"]) / line["name"] / f"node{k}"
    tier.mkdir(parents=True, exist_ok=True)
    before = tier_stats(tier)
    if line["store"] == "segments":
        ds: Any = SegmentDataset(
            config["segments"]["url"],
            [f"sample_{i}" for i in range(int(config["samples"]))],
            tier_dir=tier,
            tier_budget=budget,
            storage_options=config["storage_options"],
            # Records come from the tier every epoch, not from memory.
            lru_bytes=0,
        )
    else:
        ds = PageDataset(
            config["defaults"]["url"] if line["store"] == "defaults" else config["url"],
            fields=["blob"],
            tier_dir=tier,
            tier_budget=budget,
            storage_options=config["storage_options"],
        )
    m, r = int(line["nodes"]), int(config["ranks"])
    affine = line["affinity"] == "node"
    ranks: list[tuple[int, Any]] = []
    for local in range(r):
        rank = k * r + local
        if line["policy"] == "map":
            ranks.append((rank, None))  # reads dataset[i] itself (`read_map_epoch`)
            continue
        it = IterableBatches(
            ds,
            int(config["batch"]),
            seed=int(config["seed"]),
            rank=rank,
            world_size=m * r,
            reuse_buffers=True,
            affinity=line["affinity"],
            homes=m if affine else None,
            cross_node=float(line["cross_node"]),
            plan_eviction=bool(line["plan_eviction"]),
        )
        ranks.append((rank, it))
    return Node(tier, ds, ranks, before, np.zeros(0, dtype=bool))


def map_order(config: dict[str, Any], n: int, epoch: int) -> np.ndarray:
    """A map-style line's epoch order: a permutation of the samples (each
    rank reads every ``world_size``-th of it from its rank on)."""
    return np.random.default_rng([int(config["seed"]), epoch]).permutation(n)


def node_samples(
    node: Node, config: dict[str, Any], line: dict[str, Any], epoch: int
) -> np.ndarray:
    """The samples ``node``'s ranks read in ``epoch``."""
    if line["policy"] == "map":
        order = map_order(config, len(node.dataset), epoch)
        world = int(line["nodes"]) * int(config["ranks"])
        return np.unique(np.concatenate([order[rank::world] for rank, _ in node.ranks]))
    return np.unique(np.concatenate([it.deal().rank_order(rank) for rank, it in node.ranks]))


def run_threads(loops: list[Any]) -> float:
    """Runs each of ``loops`` (a callable) in a thread of its own at once;
    the seconds until all ended. The first error raised is raised here."""
    errors: list[BaseException] = []

    def guarded(loop: Any) -> None:
        try:
            loop()
        except BaseException as e:  # handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(loop,)) for loop in loops]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    if errors:
        raise errors[0]
    return secs


def read_map_epoch(
    node: Node,
    layout: Layout | SegmentLayout,
    config: dict[str, Any],
    line: dict[str, Any],
    epoch: int,
    where: str,
) -> tuple[int, int, float]:
    """Every rank of ``node`` reads its share of the epoch's permutation at
    once, one ``dataset[i]`` at a time; samples, bytes, seconds."""
    order = map_order(config, len(node.dataset), epoch)
    world = int(line["nodes"]) * int(config["ranks"])
    batch = int(config["batch"])
    counts = [[0, 0] for _ in node.ranks]

    def rank_loop(slot: int, rank: int) -> None:
        for j, i in enumerate(order[rank::world].tolist()):
            item = node.dataset[i]
            counts[slot][1] += layout.check_item(i, item, f"{where} rank {rank} sample {i}")
            counts[slot][0] += 1
            del item  # its lease with it
            if j % batch == batch - 1:
                node.measure()

    loops = [functools.partial(rank_loop, slot, rank) for slot, (rank, _) in enumerate(node.ranks)]
    secs = run_threads(loops)
    return sum(c[0] for c in counts), sum(c[1] for c in counts), secs


def read_epoch(
    node: Node, layout: Layout | SegmentLayout, epoch: int, where: str
) -> tuple[int, int, float]:
    """Every rank of ``node`` reads epoch ``epoch`` at once; samples, bytes, seconds."""
    deals = []
    for rank, it in node.ranks:
        it.set_epoch(epoch)
        deals.append((rank, it, it.deal()))
    counts = [[0, 0] for _ in deals]

    def rank_loop(slot: int, rank: int, it: Any, deal: Any) -> None:
        for j, batch in enumerate(it):
            indices = deal.batch(rank, j)
            counts[slot][1] += layout.check(indices, batch, f"{where} rank {rank} batch {j}")
            counts[slot][0] += len(indices)
            node.measure()

    loops = [
        functools.partial(rank_loop, slot, rank, it, deal)
        for slot, (rank, it, deal) in enumerate(deals)
    ]
    secs = run_threads(loops)
    return sum(c[0] for c in counts), sum(c[1] for c in counts), secs


def run_line(
    config: dict[str, Any], layouts: dict[str, Layout | SegmentLayout], line: dict[str, Any]
) -> list[dict[str, Any]]:
    store = line["store"]
    layout = layouts[store]
    m, ranks = int(line["nodes"]), int(config["ranks"])
    if store == "segments":
        d = int(config["segments"]["dataset_bytes"])
        # One batch's rows per reading thread.
        run = int(config["segments"]["max_run"])
    else:
        geometry = config["defaults"] if store == "defaults" else config
        d = int(geometry["dataset_bytes"])
        # One fetch run per reading thread: the blocks of the largest page.
        run = int(geometry["max_run"]) + 2 * int(geometry["block_size"])
    budget = int(float(line["budget_frac"]) * d / m)
    bound = budget + ranks * run
    nodes = [open_node(config, line, k, budget) for k in range(m)]
    records = []
    try:
        for epoch in range(int(config["epochs"])):
            for k, node in enumerate(nodes):
                samples = node_samples(node, config, line, epoch)
                floor, seen = layout.floor(samples, node.seen, budget, epoch)
                overlap = (
                    float(np.isin(samples, node.last_samples).mean())
                    if node.last_samples is not None
                    else None
                )
                node.max_counted = node.max_physical = node.max_metadata = 0
                where = f"{line['name']} epoch {epoch} node {k}"
                if line["policy"] == "map":
                    n, nbytes, secs = read_map_epoch(node, layout, config, line, epoch, where)
                else:
                    n, nbytes, secs = read_epoch(node, layout, epoch, where)
                kept_back = bookkeeping(node.tier)
                floor_tier, _ = layout.floor(samples, node.seen, max(budget - kept_back, 0), epoch)
                after = tier_stats(node.tier)
                delta = {c: after[c] - node.before[c] for c in DELTAS}
                node.before = after
                node.seen = seen
                node.last_samples = samples
                rec = {
                    "line": line["name"],
                    "store": store,
                    "policy": line["policy"],
                    "nodes": m,
                    "budget_frac": line["budget_frac"],
                    "epoch": epoch,
                    "node": k,
                    "n": n,
                    "bytes": nbytes,
                    "secs": secs,
                    "samples_per_s": n / max(secs, 1e-9),
                    **delta,
                    "fetched_ratio": delta["fetched_bytes"] / d,
                    "floor_bytes": floor,
                    "floor_ratio": floor / d,
                    "over_floor": delta["fetched_bytes"] / floor if floor else None,
                    "bookkeeping": kept_back,
                    "floor_tier_bytes": floor_tier,
                    "over_floor_tier": delta["fetched_bytes"] / floor_tier if floor_tier else None,
                    "max_counted": node.max_counted,
                    "max_physical": node.max_physical,
                    "max_metadata": node.max_metadata,
                    "budget": budget,
                    "bound": bound + node.max_metadata,
                    "overlap": overlap,
                }
                emit("epoch", **rec)
                records.append(rec)
    finally:
        for node in nodes:
            node.ranks.clear()
        nodes.clear()
        gc.collect()
        shutil.rmtree(Path(config["root"]) / line["name"], ignore_errors=True)
    return records


def summarize(line: dict[str, Any], records: list[dict[str, Any]], d: int) -> dict[str, Any]:
    later = [r for r in records if r["epoch"] >= 1]
    epochs = max(len({r["epoch"] for r in later}), 1)
    n = sum(r["n"] for r in later)
    secs = sum(r["secs"] for r in later)
    overlaps = [r["overlap"] for r in later if r["overlap"] is not None]
    summary = {
        "line": line["name"],
        "store": line["store"],
        "policy": line["policy"],
        "nodes": line["nodes"],
        "budget_frac": line["budget_frac"],
        "n": n,
        "bytes": sum(r["bytes"] for r in later),
        "secs": secs,
        "fetched_after_first": sum(r["fetched_bytes"] for r in later),
        "fetched_per_epoch_ratio": sum(r["fetched_bytes"] for r in later) / d / epochs,
        "floor_per_epoch_ratio": sum(r["floor_bytes"] for r in later) / d / epochs,
        "floor_tier_per_epoch_ratio": sum(r["floor_tier_bytes"] for r in later) / d / epochs,
        "bookkeeping": max((r["bookkeeping"] for r in records), default=0),
        "requests_per_epoch": sum(r["get_requests"] for r in later) / epochs,
        "max_physical_over_budget": max(r["max_physical"] / max(r["budget"], 1) for r in records),
        "within_bound": all(r["max_physical"] <= r["bound"] for r in records),
        "samples_per_s": n / max(secs, 1e-9),
        "samples_per_s_all": sum(r["n"] for r in records)
        / max(sum(r["secs"] for r in records), 1e-9),
        "overlap": float(np.mean(overlaps)) if overlaps else None,
    }
    emit("line", **summary)
    return summary


def goals(lines: list[dict[str, Any]], summaries: list[dict[str, Any]], records: list[Any]) -> None:
    """The issue's goals as numbers (``met``), never retried."""

    def goal(name: str, value: float | None, threshold: float | None, met: bool | None, **kw: Any):
        # `threshold`, not `limit`: a runner line's `limit` names a machine limit.
        emit("goal", goal=name, value=value, threshold=threshold, met=met, n=0, secs=0.0, **kw)

    for store in ("pages", "segments", "defaults"):
        by = {
            (s["nodes"], s["policy"], s["budget_frac"]): s for s in summaries if s["store"] == store
        }
        if by:
            store_goals(goal, lines, by, [r for r in records if r["store"] == store], store)

    def within_bound(name: str, recs: list[dict[str, Any]], **kw: Any) -> None:
        """The largest ``max_physical`` over its ``bound`` among ``recs``."""
        worst = max(recs, key=lambda r: r["max_physical"] / max(r["bound"], 1))
        ratio = worst["max_physical"] / max(worst["bound"], 1)
        goal(
            name,
            ratio,
            1.0,
            ratio <= 1.0,
            worst_line=worst["line"],
            max_physical=worst["max_physical"],
            bound=worst["bound"],
            budget=worst["budget"],
            **kw,
        )

    if records:
        within_bound("allocated_within_budget", records)
    seg = [r for r in records if r["store"] == "segments"]
    if seg:
        within_bound("segment_store_within_budget", seg, measured=True)


def store_goals(
    goal: Any,
    lines: list[dict[str, Any]],
    by: dict[tuple[Any, ...], dict[str, Any]],
    records: list[dict[str, Any]],
    store: str,
) -> None:
    """The fetch and throughput goals of one store's lines (``by``: the
    summaries by nodes, policy and budget; ``records``: their epochs)."""
    for (m, policy, b), s in sorted(by.items()):
        if m != 1 or policy != "plan":
            continue
        fetched, floor = s["fetched_per_epoch_ratio"], s["floor_per_epoch_ratio"]
        tier_floor = s["floor_tier_per_epoch_ratio"]
        goal(
            "plan_at_floor",
            fetched,
            1.05 * floor,
            fetched <= 1.05 * floor,
            budget_frac=b,
            store=store,
            floor_ratio=floor,
            issue_floor_ratio=max(1.0 - b, 0.0),
            # The floor for what the budget leaves the cached bytes (the
            # tier's bookkeeping counts too), and the plan over it.
            floor_tier_ratio=tier_floor,
            over_floor_tier=fetched / tier_floor if tier_floor else None,
            bookkeeping=s["bookkeeping"],
        )
        lru = by.get((1, "lru", b))
        if lru is not None and b >= 0.5:
            theirs = lru["fetched_per_epoch_ratio"]
            ratio = fetched / theirs if theirs else None
            met = ratio <= 0.6 if ratio is not None else fetched == 0
            goal(
                "plan_vs_lru",
                ratio,
                0.6,
                met,
                budget_frac=b,
                store=store,
                lru_ratio=theirs,
                # The least any plan could reach: the floor over the LRU.
                floor_vs_lru=floor / theirs if theirs else None,
                floor_tier_vs_lru=tier_floor / theirs if theirs else None,
            )
    for (m, policy, b), s in sorted(by.items()):
        if m > 1 and policy.startswith("affine") and b >= 1.0:
            total = s["fetched_per_epoch_ratio"] * max(
                len({r["epoch"] for r in records if r["line"] == s["line"]}) - 1, 1
            )
            f = next(x["cross_node"] for x in lines if x["name"] == s["line"])
            if f == 0:
                goal(
                    "affine_fetched_once",
                    total,
                    0.05,
                    total <= 0.05,
                    budget_frac=b,
                    store=store,
                    nodes=m,
                )
            else:
                goal(
                    "affine_cross_node_traffic",
                    s["fetched_per_epoch_ratio"],
                    None,
                    None,
                    budget_frac=b,
                    store=store,
                    nodes=m,
                    cross_node=f,
                    expected_per_epoch=f * (1 - 1 / m),
                    overlap=s["overlap"],
                )
    for (m, policy, b), s in sorted(by.items()):
        if policy != "map":
            continue
        fetched = s["fetched_per_epoch_ratio"]
        goal(
            "map_within_d",
            fetched,
            1.0,
            fetched <= 1.0,
            budget_frac=b,
            store=store,
            nodes=m,
            floor_ratio=s["floor_per_epoch_ratio"],
            max_physical_over_budget=s["max_physical_over_budget"],
        )
    for (m, policy, b), s in sorted(by.items()):
        lru = by.get((m, "lru", b))
        if policy in ("lru", "map") or lru is None:
            continue
        ratio = s["samples_per_s_all"] / max(lru["samples_per_s_all"], 1e-9)
        goal(
            "throughput_vs_lru",
            ratio,
            1.0,
            ratio >= 1.0,
            policy=policy,
            nodes=m,
            budget_frac=b,
            store=store,
        )


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[1]).read_text())
    # W9_LINES=m4_lru_b0.9,m4_plan_b0.9 runs only those lines (a line's
    # cost looked at alone); the goals then cover only what ran.
    only = {n for n in os.environ.get("W9_LINES", "").split(",") if n}
    if only:
        config["lines"] = [line for line in config["lines"] if line["name"] in only]
    layouts: dict[str, Layout | SegmentLayout] = {
        "pages": Layout.load(config),
        "segments": SegmentLayout.load(config["segments"]),
    }
    if any(line["store"] == "defaults" for line in config["lines"]):
        pages = layouts["pages"]
        assert isinstance(pages, Layout)
        layouts["defaults"] = write_defaults(config, pages)
    d = int(config["dataset_bytes"])
    progress(
        f"{config['server']}: {config['samples']} samples, {d / 1e6:.1f} MB, "
        f"{len(config['lines'])} lines x {config['epochs']} epochs"
    )
    summaries, records = [], []
    try:
        for line in config["lines"]:
            start = time.perf_counter()
            recs = run_line(config, layouts, line)
            records += recs
            dl = {
                "segments": int(config["segments"]["dataset_bytes"]),
                "defaults": int(config["defaults"].get("dataset_bytes", 0)),
            }.get(line["store"], d)
            s = summarize(line, recs, dl)
            summaries.append(s)
            progress(
                f"{line['name']}: epochs >= 1 fetched {s['fetched_per_epoch_ratio']:.3f} D/epoch "
                f"(floor {s['floor_per_epoch_ratio']:.3f}), max physical "
                f"{s['max_physical_over_budget']:.2f} x budget, {s['samples_per_s']:.0f} samples/s "
                f"({time.perf_counter() - start:.1f} s)"
            )
    except WrongValueError as e:
        print(json.dumps({"wrong_value": str(e)}), flush=True)
        return 1
    goals(config["lines"], summaries, records)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
