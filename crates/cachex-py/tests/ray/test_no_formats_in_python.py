"""The package writes no store format and takes no durable step of its own.

Every store's byte layout, every commit protocol (a Ray job's included)
and every fsync and lock are the Rust crates'; the package calls them
through the native module. Python that packs a store's bytes, fsyncs or
takes a store's lock would be a second home for them that a format change
in Rust silently breaks, so this test reads the package's source and
fails on any of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "cachex"

#: Modules whose import means packing bytes or taking a lock by hand.
FORBIDDEN_MODULES = {"struct", "fcntl"}
#: Calls that pack or unpack bytes, make writes durable, or lock a file.
FORBIDDEN_CALLS = {
    "pack",
    "pack_into",
    "unpack",
    "unpack_from",
    "iter_unpack",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "flock",
    "lockf",
}
#: Magic bytes of the stores' binary files (segment-store's index log and
#: its groups, page-alloc's pages), which only their crates write.
FORBIDDEN_TEXT = ("CXSEGIDX", "CXG1")


def offences(source: str, name: str) -> list[str]:
    """Every forbidden construct in ``source`` (the code, not its prose)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        line = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_CALLS:
            found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_CALLS:
            found.append(f"{line}: {node.id}")
    found += [f"{name}: {magic!r}" for magic in FORBIDDEN_TEXT if magic in source]
    return found


def test_the_checker_finds_each_forbidden_construct():
    sample = (
        "import struct\n"
        "import fcntl\n"
        "from struct import pack_into\n"
        "import os\n"
        "head = struct.pack('<II', 3, 4)\n"
        "os.fsync(3)\n"
        "fcntl.flock(3, fcntl.LOCK_EX)\n"
        "MAGIC = b'CXSEGIDX'\n"
        '"""Prose may say fsync and flock."""\n'
    )
    assert offences(sample, "sample.py") == [
        "sample.py:1: import struct",
        "sample.py:2: import fcntl",
        "sample.py:3: from struct import ...",
        "sample.py:5: .pack",
        "sample.py:6: .fsync",
        "sample.py:7: .flock",
        "sample.py: 'CXSEGIDX'",
    ]
    assert offences('"""fsync, flock and struct.pack in prose are fine."""\n', "prose.py") == []


def test_the_package_packs_no_store_format_and_takes_no_durable_step():
    files = sorted(PACKAGE.rglob("*.py"))
    # The whole package, its subpackages included (cachex.ray, cachex.loadit...).
    assert len(files) > 10, files
    assert any(f.parent.name == "ray" for f in files), files
    found = [o for f in files for o in offences(f.read_text(), str(f.relative_to(PACKAGE)))]
    assert found == [], "\n".join(found)
    assert not (PACKAGE / "ray" / "_segment_log.py").exists()
