"""verify() and inspect() of every store class: the command line's JSON
shapes (``cachex verify --json``, ``cachex inspect --json``), compared with
what the ``cachex`` binary prints for the same cache, sound and corrupt.

The binary is ``target/debug/cachex`` (``cargo build -p cachex-cli``;
``scripts/test`` builds it with the workspace's tests before pytest), or
``$CACHEX_CLI``."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cachex

REPO = Path(__file__).resolve().parents[4]
CLI = Path(
    os.environ.get(
        "CACHEX_CLI",
        Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "cachex",
    )
)
PROBLEM_KINDS = {
    "missing",
    "truncated",
    "checksum-mismatch",
    "structure",
    "stale",
    "foreign-version",
    "unindexed",
    "interrupted",
    "io",
}


def cli(command: str, path: Path) -> dict[str, Any]:
    assert CLI.is_file(), f"{CLI} is missing: build it with `cargo build -p cachex-cli`"
    out = subprocess.run(
        [str(CLI), command, str(path), "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.stdout, f"cachex {command} {path}: {out.stderr}"
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


# Each builder makes a sound cache under `tmp` and returns (path, open,
# corrupt): `open` opens it with the class, `corrupt` damages it on disk.
Built = tuple[Path, Callable[[], Any], Callable[[], None]]


def segment_store(tmp: Path) -> Built:
    path = tmp / "segments"
    with cachex.SegmentStore(path, flush_every=4) as s:
        s.put_batch({f"k{i}": np.full((3,), i, np.float32) for i in range(8)})
        s.flush()

    def corrupt() -> None:
        seg = sorted((path / "segments").iterdir())[0]
        flip_byte(seg, seg.stat().st_size // 2)

    return path, lambda: cachex.SegmentStore(path, read_only=True), corrupt


def shard_store(tmp: Path) -> Built:
    root = tmp / "shards"
    store = cachex.ShardStore(root, lambda: iter(range(25)), max_shard_length=10)
    assert len(store) == 25 and store[24] == 24
    del store

    def corrupt() -> None:
        shard = sorted((root / "shards").glob("*.shard.pickle"))[0]
        shard.write_bytes(shard.read_bytes()[:-5])

    return root, lambda: cachex.ShardStore(root), corrupt


def memmap_array(tmp: Path) -> Built:
    path = tmp / "arrays"
    w = cachex.MemmapWriter(path, {"x": ("float32", (2,))}, sidecars=["label"])
    for i in range(6):
        w.write(f"s{i}", {"x": np.full((2,), i, np.float32)}, sidecars={"label": str(i % 2)})
    w.finalize()

    def corrupt() -> None:
        with open(path / "x.bin", "ab") as f:
            f.write(b"\0" * 3)

    return path, lambda: cachex.MemmapArray(path), corrupt


def page_file(tmp: Path) -> Built:
    path = tmp / "train.pages"
    w = cachex.PageWriter(path, {"label": "int", "jpeg": "bytes"}, page_size=4096)
    w.write_many([{"label": i, "jpeg": bytes(range(i % 40))} for i in range(30)])
    w.finalize()
    return path, lambda: cachex.PageReader(path), lambda: flip_byte(path, 4096 + 10)


def beton_file(tmp: Path) -> Built:
    path = tmp / "train.beton"
    fields = {"label": "int", "feat": ("float32", (2,))}
    samples = [{"label": i, "feat": np.full((2,), i, np.float32)} for i in range(10)]
    cachex.write_beton(path, fields, samples)

    def corrupt() -> None:
        # The last allocation-table row: its sample id points nowhere.
        raw = bytearray(path.read_bytes())
        raw[-24:-16] = (10**6).to_bytes(8, "little")
        path.write_bytes(bytes(raw))

    return path, lambda: cachex.BetonReader(path), corrupt


STORES = {
    "segment-store": segment_store,
    "shard-store": shard_store,
    "memmap-array": memmap_array,
    "page-alloc": page_file,
    "beton": beton_file,
}


@pytest.mark.parametrize("kind", STORES)
def test_verify_and_inspect_are_the_command_lines(tmp_path, kind):
    path, open_store, corrupt = STORES[kind](tmp_path)
    store = open_store()

    sound = store.verify()
    assert sound == {"kind": kind, "path": str(path), "problems": []}
    assert sound == cli("verify", path)
    summary = store.inspect()
    assert summary["kind"] == kind and summary["path"] == str(path)
    assert summary == cli("inspect", path)

    # Damaged under the open handle (some damage stops a fresh open).
    corrupt()
    found = store.verify()
    assert found == cli("verify", path)
    assert found["kind"] == kind and found["problems"], found
    for p in found["problems"]:
        assert set(p) == {"path", "kind", "detail"}
        assert p["kind"] in PROBLEM_KINDS
        assert p["path"].startswith(str(path))


def test_a_checksum_mismatch_is_named_as_the_command_line_names_it(tmp_path):
    _, open_store, corrupt = segment_store(tmp_path)
    store = open_store()
    corrupt()
    # Rust's variant name was `ChecksumMismatch`; the command line's is this.
    assert {p["kind"] for p in store.verify()["problems"]} == {"checksum-mismatch"}


@pytest.mark.parametrize("kind", STORES)
def test_verify_by_path_is_the_command_line_s_sound_or_damaged(tmp_path, kind):
    path, open_store, corrupt = STORES[kind](tmp_path)
    open_store()
    assert cachex.verify(path) == {"kind": kind, "path": str(path), "problems": []}
    # Damaged, whether or not the store could still open: the same report
    # as the command line's.
    corrupt()
    found = cachex.verify(path)
    assert found == cli("verify", path)
    assert found["kind"] == kind and found["problems"], found


def test_verify_by_path_names_a_path_that_is_no_cache(tmp_path):
    (tmp_path / "notes.txt").write_text("not a cache")
    with pytest.raises(cachex.InvalidInputError, match=r"notes\.txt: no cache"):
        cachex.verify(tmp_path / "notes.txt")
