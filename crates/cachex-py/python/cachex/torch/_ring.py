"""Batch memory reused across the DataLoader worker boundary (its rings need
torch; the module imports without it).

Without it, every batch a DataLoader worker makes is a new allocation that
crosses to the main process as a new shared-memory segment (torch output)
or a pickled copy (numpy). With ``ResumableDataLoader(..., ring=True)``
each worker fills a ring of ``depth`` slots, each slot the dataset's batch
buffers (``empty_batch(batch_size, shared=True)``: torch tensors in shared
memory), allocated once per worker:

- the worker sends a slot's tensors the first time it uses the slot (and
  again after a ragged values buffer of it grew); the main process maps
  them once and keeps them by ``(ring, slot)``;
- every batch after that crosses the queue as a :class:`RingBatch`: the
  slot, the sample count, each ragged field's total bytes and the small
  per-batch arrays (``<field>_lengths``, beton's JSON and image lists);
- the main process hands the loop views of the slot and, when the loop
  takes the next batch, releases the one before by raising the worker's
  counter in a shared ``(num_workers, 2)`` int64 tensor (``[generation,
  released]``); a worker about to refill a slot waits until the batch it
  held was released, polling with a bounded wait: past ``timeout`` seconds
  (or when the main process is gone) it raises :class:`cachex.WorkerError`.

A ragged field (``ragged=True``) lives in the slots too: a slot's values
buffer starts empty, grows to its first batch's bytes plus a quarter (and
at least doubles when a later batch outgrows it), and the slot is sent
again when it grew, so growth happens in the first batches, not per batch.

So a batch's memory is valid until the loop takes the next batch: keep one
longer with :func:`keep` (a copy that owns its memory). The ring's depth
is ``prefetch_factor + 2``: the batches in flight, the one being filled and
the one the loop holds, so in steady state the worker never waits.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cachex.errors import WorkerError
from cachex.protocols import BuffersBatches
from cachex.ragged import Ragged
from cachex.torch._buffers import as_numpy, torch

__all__ = ["RingBatch", "RingConfig", "RingReader", "WorkerRing", "keep"]


@dataclass
class RingConfig:
    """What a loader gives its dataset for the workers: the ring's depth,
    the shared ``[generation, released]`` counters (one row a worker) and
    the longest wait for a slot, in seconds."""

    depth: int
    acks: torch.Tensor
    timeout: float
    #: This worker process's rings, by worker (made by :meth:`worker_ring`;
    #: never pickled: each worker makes its own).
    rings: dict[int, WorkerRing] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "rings": {}}

    def worker_ring(self, worker: int, dataset: BuffersBatches, batch_size: int) -> WorkerRing:
        """Worker ``worker``'s ring over ``dataset`` (made on first use and
        kept while the worker reads the same dataset and batch size),
        started for a new iteration."""
        ring = self.rings.get(worker)
        if ring is None or ring.dataset is not dataset or ring.batch_size != batch_size:
            ring = WorkerRing(self, worker, dataset, batch_size)
            self.rings[worker] = ring
        ring.start()
        return ring


@dataclass
class RingBatch:
    """One batch as it crosses the queue: where it lies and what is small."""

    ring: str
    worker: int
    generation: int
    seq: int
    slot: int
    n: int
    totals: dict[str, int]
    extras: dict[str, Any]
    #: The slot's buffers, sent the first time the slot is used (or grew).
    buffers: dict[str, Any] | None
    #: Shared buffers this worker's ring allocated so far.
    allocations: int


class WorkerRing:
    """A DataLoader worker's ring of slots over one dataset (kept across
    epochs by a persistent worker)."""

    def __init__(
        self, config: RingConfig, worker: int, dataset: BuffersBatches, batch_size: int
    ) -> None:
        self.config = config
        self.worker = worker
        self.dataset = dataset
        self.batch_size = batch_size
        self.name = f"{os.getpid()}:{secrets.token_hex(4)}"
        self.slots: list[dict[str, Any] | None] = [None] * config.depth
        self.allocations = 0
        self._acks = config.acks.numpy()
        self._parent = os.getppid()
        self.generation = 0
        self.seq = 0

    def start(self) -> None:
        """A new iteration: batches count from 0 in the loader's generation."""
        self.generation = int(self._acks[self.worker, 0])
        self.seq = 0

    def _wait_for(self, released: int) -> None:
        """Waits until the loop released this worker's first ``released``
        batches of this generation (or moved to another generation)."""
        acks = self._acks[self.worker]
        if acks[1] >= released or acks[0] != self.generation:
            return
        deadline = time.monotonic() + self.config.timeout
        pause = 1e-4
        while acks[1] < released and acks[0] == self.generation:
            if os.getppid() != self._parent:
                raise WorkerError(
                    f"DataLoader worker {self.worker}: the main process is gone "
                    "while a batch slot was still held"
                )
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"DataLoader worker {self.worker}: waited {self.config.timeout:g} s "
                    f"for the loop to release batch {released - 1} (ring of "
                    f"{self.config.depth} slots; the loop holds each batch until it "
                    "takes the next; ring_timeout sets the wait)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def put(self, indices: list[int]) -> RingBatch:
        """Fills the next slot with samples ``indices``; the message for it."""
        seq, depth = self.seq, self.config.depth
        slot = seq % depth
        self._wait_for(seq - depth + 1)
        out = self.slots[slot]
        fresh = out is None
        if out is None:
            out = self.dataset.empty_batch(self.batch_size, shared=True)
            self.allocations += len(out)
            self.slots[slot] = out
        before = {name: id(buf) for name, buf in out.items()}
        batch = self.dataset.batch(indices, out=out)
        grown = sum(id(buf) != before[name] for name, buf in out.items())
        self.allocations += grown
        self.seq += 1
        return RingBatch(
            ring=self.name,
            worker=self.worker,
            generation=self.generation,
            seq=seq,
            slot=slot,
            n=len(indices),
            totals={k: len(v.values) for k, v in batch.items() if isinstance(v, Ragged)},
            extras={k: v for k, v in batch.items() if k not in out},
            buffers=out if fresh or grown else None,
            allocations=self.allocations,
        )


@dataclass
class RingReader:
    """The main process's side: the slots it mapped, the views it hands out
    and the releases it writes."""

    config: RingConfig
    numpy_output: bool
    slots: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    #: Slot buffer sets received (each mapped once).
    mapped: int = 0
    #: Shared buffers each ring reported allocating.
    allocations: dict[str, int] = field(default_factory=dict)
    generation: int = 0

    def start(self, forget: bool) -> None:
        """A new iteration: a new generation (releases every slot of the
        last one); ``forget`` drops the slots of workers that are gone."""
        if forget:
            self.slots.clear()
        acks = self.config.acks
        acks[:, 1] = 0
        self.generation = int(acks[0, 0]) + 1 if len(acks) else 1
        acks[:, 0] = self.generation

    def view(self, msg: RingBatch) -> dict[str, Any]:
        """The batch ``msg`` names, as views of its slot."""
        key = (msg.ring, msg.slot)
        if msg.buffers is not None:
            self.slots[key] = msg.buffers
            self.mapped += 1
        self.allocations[msg.ring] = msg.allocations
        buffers = self.slots[key]
        n = msg.n
        batch: dict[str, Any] = {}
        for name, buf in buffers.items():
            if isinstance(buf, Ragged):
                values, offsets = buf.values[: msg.totals[name]], buf.offsets[: n + 1]
                if self.numpy_output:
                    values, offsets = as_numpy(values), as_numpy(offsets)
                batch[name] = Ragged(values, offsets)
            else:
                batch[name] = as_numpy(buf[:n]) if self.numpy_output else buf[:n]
        batch.update(msg.extras)
        return batch

    def release(self, msg: RingBatch) -> None:
        """The loop moved past ``msg``'s batch: its worker may refill the slot."""
        if msg.generation == self.generation:
            row = self.config.acks[msg.worker]
            row[1] = max(int(row[1]), msg.seq + 1)

    def stats(self) -> dict[str, int]:
        """``{"mapped": slot buffer sets received, "allocations": shared
        buffers the workers' rings allocated}``: both stop growing once
        every slot was filled (a ragged values buffer may grow a few times
        early on)."""
        return {"mapped": self.mapped, "allocations": sum(self.allocations.values())}


def keep(batch: Any) -> Any:
    """A copy of ``batch`` (dicts, lists, tuples, :class:`cachex.Ragged`,
    arrays and tensors) that owns its memory: a ring's batch to keep past
    the next one."""
    if isinstance(batch, Ragged):
        return batch.copy()
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {k: keep(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and type(batch) in (list, tuple):
        return type(batch)(keep(v) for v in batch)
    return batch
