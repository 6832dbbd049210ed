"""The Python package as its layout says (``cachex/__init__.py``, the guide's
"Package layout"): modules in layers (the stores, then order, then
``torch``, then ``ray`` and the drop-ins), no module importing one of a
layer above it, no import circle, no import of the package inside a
function; and ``mypy --strict`` over the package finds nothing."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

#: The package's source tree (what the wheel ships).
SOURCE = REPO / "crates" / "cachex-py" / "python"

#: Each layer's modules, lowest first; a module name or a package (``x.*``).
LAYERS: list[tuple[str, set[str]]] = [
    (
        "stores",
        {"cachex._cachex", "cachex.errors", "cachex._remote", "cachex.ragged", "cachex.facade"},
    ),
    ("order", {"cachex.sampling", "cachex.protocols", "cachex.streams"}),
    # The root package gathers the stores and order for `import cachex`.
    ("root", {"cachex"}),
    ("torch", {"cachex.torch", "cachex.torch.*"}),
    ("ray", {"cachex.ray", "cachex.ray.*"}),
    (
        "dropins",
        {"cachex.dropins", "cachex.dropins.*", "cachex.torchcachex", "cachex.loadit"},
    ),
]

#: Imports that cross the layers upward, each with its reason.
UPWARD_ALLOWED = {
    # cachex.torch names the torchcachex drop-in's DDP helpers where the
    # guide and its users import them (`from cachex.torch import
    # rank_backend`); the drop-in imports nothing of cachex.torch.
    ("cachex.torch", "cachex.dropins.torchcachex.ddp"),
}


def modules() -> dict[str, Path]:
    """Every module of the package by name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((SOURCE / "cachex").rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    for rank, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member or (member.endswith(".*") and module.startswith(member[:-1])):
                return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def imports() -> list[tuple[str, str, bool]]:
    """``(importer, imported, inside a function)`` for every import of a
    module of the package by another (``from a import b`` names ``a.b``
    when that is a module)."""
    names = set(modules()) | {"cachex._cachex"}

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module.split(".")
                    if path.name != "__init__.py":
                        package.pop()
                    package = package[: len(package) - node.level + 1]
                    base = ".".join([*package, base] if base else package)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                resolved = resolve(target) if target.split(".")[0] == "cachex" else None
                if resolved is not None and resolved != module:
                    found.append((module, resolved, id(node) in in_function))
    return found


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_read_whole():
    found = imports()
    importers = {a for a, _, _ in found}
    # Every layer imports something of the package: a parser that missed
    # imports would pass the other tests vacuously.
    assert {"cachex", "cachex.streams", "cachex.torch.iterable", "cachex.ray.pages"} <= importers
    assert ("cachex.torch.iterable", "cachex.streams", False) in found
    assert len(found) > 100


def test_no_module_imports_the_package_inside_a_function():
    inside = sorted(f"{a} -> {b}" for a, b, in_function in imports() if in_function)
    assert inside == [], "imports inside functions (import at module level): " + ", ".join(inside)


def test_the_package_has_no_import_circle():
    found = cycles({(a, b) for a, b, _ in imports()})
    assert found == [], f"modules importing each other: {found}"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
        for a, b, _ in imports()
        if layer_of(b) > layer_of(a) and (a, b) not in UPWARD_ALLOWED
    )
    assert upward == [], "upward imports: " + ", ".join(upward)
    # ray and the drop-ins sit side by side: neither imports the other.
    across = sorted(
        f"{a} -> {b}"
        for a, b, _ in imports()
        if {LAYERS[layer_of(a)][0], LAYERS[layer_of(b)][0]} == {"ray", "dropins"}
    )
    assert across == [], "imports between ray and the drop-ins: " + ", ".join(across)
    assert UPWARD_ALLOWED <= {(a, b) for a, b, _ in imports()}, "an allowance no longer used"


def test_every_module_of_the_package_has_a_layer():
    for module in modules():
        layer_of(module)


def test_the_package_type_checks_strictly(tmp_path):
    """`mypy --strict` over the package's own source (this tree's, whatever
    the venv has installed), against the native module's stubs."""
    env = {**os.environ, "MYPYPATH": str(SOURCE)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "-p",
            "cachex",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
