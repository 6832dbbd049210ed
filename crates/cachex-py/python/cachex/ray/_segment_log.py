"""Reading and re-numbering the index-log groups of a segment store.

The byte layout is segment-store's (``crates/segment-store/src/format.rs``
documents it; this module follows it and checks every group it reads). A
commit of :class:`~cachex.ray.SegmentSink` gives the staged segments new
ids in one multi-writer's residue class, so each group is re-encoded with
its new ``segment_id`` and the checksum that covers it; the segment files
themselves, their length and their content hash do not change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import blake3

from cachex.errors import CorruptError

INDEX_MAGIC = b"CXSEGIDX"
SHARED_LOG_VERSION = 2
WRITER_LOG_VERSION = 3
HEADER_LEN = 16
GROUP_MAGIC = b"CXG1"
GROUP_HEADER_LEN = 40
WRITER_STRIDE = 4096
MAX_WRITER_ID = WRITER_STRIDE - 1
SEGMENTS_DIR = "segments"
WRITERS_DIR = "writers"
SHARED_LOG = "segment-index.log"
SCHEMA_FILE = "schema.json"
LOCK_FILE = "segment-store.lock"


def segment_name(segment_id: int) -> str:
    """The file name of segment ``segment_id``."""
    return f"segment_{segment_id:06d}.arrow"


def parse_segment_name(name: str) -> int | None:
    """The id of a segment file name, or ``None`` for any other name."""
    if not (name.startswith("segment_") and name.endswith(".arrow")):
        return None
    digits = name[len("segment_") : -len(".arrow")]
    return int(digits) if digits.isdigit() else None


def writer_log_name(writer: int) -> str:
    """The file name of multi-writer ``writer``'s index log."""
    return f"writer-{writer:04d}.log"


def writer_lock_name(writer: int) -> str:
    """The file name of multi-writer ``writer``'s lock."""
    return f"writer-{writer:04d}.lock"


@dataclass(frozen=True)
class Group:
    """One segment's group: its id and the rest of its bytes as read."""

    segment_id: int
    header: bytes
    hashes: bytes


def _checksum(head32: bytes, hashes: bytes) -> bytes:
    h = blake3.blake3(head32)
    h.update(hashes)
    return h.digest()[:8]


def read_groups(log: Path) -> list[Group]:
    """Every group of an index log, each checked against its checksum.

    Raises
    ------
    CorruptError
        A bad header, a short group or a checksum that does not match: a
        staged store is complete when its task returned, so any of these
        means the staging area was damaged.
    """
    return parse_groups(log.read_bytes(), str(log))


def parse_groups(data: bytes, name: str) -> list[Group]:
    """Every group of the index log ``data`` (``name`` says whose, in errors),
    each checked against its checksum (see :func:`read_groups`)."""
    if len(data) < HEADER_LEN or data[:8] != INDEX_MAGIC:
        raise CorruptError(f"{name}: not a segment-store index log (bad header)")
    pos = HEADER_LEN
    groups = []
    while pos < len(data):
        head = data[pos : pos + GROUP_HEADER_LEN]
        if len(head) < GROUP_HEADER_LEN or head[:4] != GROUP_MAGIC:
            raise CorruptError(f"{name}: group at offset {pos} is short or has a bad magic")
        segment_id, count = struct.unpack_from("<II", head, 4)
        end = pos + GROUP_HEADER_LEN + 8 * count
        hashes = data[pos + GROUP_HEADER_LEN : end]
        if end > len(data) or _checksum(head[:32], hashes) != head[32:40]:
            raise CorruptError(f"{name}: group at offset {pos} is torn or fails its checksum")
        groups.append(Group(segment_id, head, hashes))
        pos = end
    return groups


def renumbered(group: Group, segment_id: int) -> bytes:
    """The bytes of ``group`` for segment ``segment_id``, with its checksum redone."""
    head = bytearray(group.header)
    struct.pack_into("<I", head, 4, segment_id)
    head[32:40] = _checksum(bytes(head[:32]), group.hashes)
    return bytes(head) + group.hashes


def writer_log_header(writer: int) -> bytes:
    """The header of multi-writer ``writer``'s index log."""
    return INDEX_MAGIC + struct.pack("<II", WRITER_LOG_VERSION, writer)


def writer_ids_after(writer: int, above: int, count: int) -> list[int]:
    """``count`` ids of ``writer``'s residue class, all greater than ``above``."""
    k = (above + 1 - writer + WRITER_STRIDE - 1) // WRITER_STRIDE if above >= writer else 0
    first = writer + WRITER_STRIDE * k
    ids = [first + WRITER_STRIDE * i for i in range(count)]
    if ids and ids[-1] > 0xFFFF_FFFF:
        raise CorruptError(f"segment ids of writer {writer} are exhausted above {above}")
    return ids
