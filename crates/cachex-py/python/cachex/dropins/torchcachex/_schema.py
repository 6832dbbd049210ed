"""The torchcachex drop-in's ``schema.json``: the schema the store infers
for a first value, the file written durably, and the Arrow types its
strings name."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from cachex import _cachex
from cachex._cachex import SegmentStore
from cachex.errors import CacheError

__all__ = [
    "arrow_type",
    "blob_columns",
    "create_durably",
    "inferred_schema",
    "read_text",
    "replace_durably",
    "without_ranks",
]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def inferred_schema(key: str, first: Any) -> str:
    """The ``schema.json`` segment-store writes for a cache whose first value is ``first``.

    Raises the store's own error when ``first`` cannot be stored.
    """
    with tempfile.TemporaryDirectory(prefix="cachex-schema-") as scratch:
        probe = SegmentStore(scratch, async_write=False, lru_bytes=0, current_rank=0)
        try:
            probe.put_batch([(key, first)])
            return (Path(scratch) / "schema.json").read_text()
        finally:
            probe.close()


def without_ranks(text: str) -> str | None:
    """``schema.json`` text with no tensor rank fixed, or None when none is
    (torchcachex's own files have no ``cachex_parts``) or the file is not
    JSON (the store reports and re-derives a damaged one)."""
    try:
        doc = json.loads(text)
        parts = json.loads(doc["metadata"]["cachex_parts"])
    except (ValueError, KeyError, TypeError):
        return None
    if not any(isinstance(p, dict) and "rank" in p for p in parts):
        return None
    for p in parts:
        p.pop("rank", None)
    doc["metadata"]["cachex_parts"] = json.dumps(parts, separators=(",", ":"))
    return json.dumps(doc, indent=2)


def create_durably(path: Path, text: str) -> bool:
    """Writes ``path`` unless it exists (then False), durably, atomically."""
    return _cachex._durable_write(path, text.encode(), replace=False)


def replace_durably(path: Path, text: str) -> None:
    _cachex._durable_write(path, text.encode())


# torchcachex's type table for schema.json's strings, with pyarrow's
# spelling of float16 (which torchcachex's parser misread as a string).
_ARROW_TYPES = {
    "string": "string",
    "binary": "binary",
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "halffloat": "float16",
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
}


def arrow_type(pa: Any, text: str, unknown: Any = None) -> Any:
    """The pyarrow type a ``schema.json`` type string names; an unknown one
    is ``unknown``, or a :class:`cachex.CacheError` without it."""
    if text.startswith("list<") and text.endswith(">"):
        return pa.list_(arrow_type(pa, text[5:-1].split(": ")[-1], unknown))
    try:
        return getattr(pa, _ARROW_TYPES[text])()
    except KeyError:
        if unknown is not None:
            return unknown
        raise CacheError(f"schema.json: unknown type {text!r}") from None


def blob_columns(schema_json: str | None) -> frozenset[str]:
    """The blob columns ``schema.json`` declares (none when it is missing or damaged)."""
    try:
        fields = json.loads(schema_json or "")["fields"]
        return frozenset(f["name"] for f in fields if f["type"] in ("binary", "large_binary"))
    except (ValueError, KeyError, TypeError):
        return frozenset()
