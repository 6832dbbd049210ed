"""The package's metadata as an index shows it: the Python guide as the long
description, the classifiers, and the extras (each declared one installs what
the modules behind it import).

The metadata tests read the *installed* distribution, so they check whatever
built it: ``maturin develop`` under scripts/test, the wheel under
scripts/test-wheel, the sdist under scripts/test-sdist.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "crates" / "cachex-py" / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
GUIDE = REPO / "crates" / "cachex-py" / "README.md"

#: The modules each extra makes importable, and the names they import.
EXTRA_MODULES = {
    "torch": ["cachex.torch", "cachex.torchcachex"],
    "ray": ["cachex.ray"],
    "bf16": ["ml_dtypes"],
}


def test_metadata_long_description_is_the_python_guide():
    meta = md.metadata("cachex")
    assert meta["Description-Content-Type"].startswith("text/markdown")
    body = meta.get_payload() or meta["Description"]
    assert body is not None, "no long description in the installed metadata"
    guide = GUIDE.read_text()
    assert body.strip().splitlines()[0] == guide.strip().splitlines()[0]
    assert len(body) >= 0.95 * len(guide), "the long description is not the whole guide"


def test_metadata_classifiers_and_python_requirement():
    meta = md.metadata("cachex")
    classifiers = meta.get_all("Classifier") or []
    for wanted in (
        "Programming Language :: Rust",
        "Typing :: Typed",
        "Operating System :: POSIX :: Linux",
    ):
        assert wanted in classifiers
    assert meta["Requires-Python"] == ">=3.10"


def test_metadata_declares_every_extra_of_pyproject():
    meta = md.metadata("cachex")
    provided = set(meta.get_all("Provides-Extra") or [])
    assert provided == set(EXTRAS), f"installed extras {provided}, pyproject {set(EXTRAS)}"
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    for extra, reqs in EXTRAS.items():
        for req in reqs:
            name = canonicalize_name(Requirement(req).name)
            assert any(
                canonicalize_name(r.name) == name
                and r.marker is not None
                and r.marker.evaluate({"extra": extra})
                for r in requires
            ), f"{req} of extra {extra!r} missing from Requires-Dist"


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_extra_requirements_are_met_and_its_modules_import(extra):
    """In the test venv, which installs every extra's packages: the versions
    the extra asks for are the ones installed, and the modules behind it
    import."""
    for req in map(Requirement, EXTRAS[extra]):
        installed = md.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), (
            f"extra {extra!r} asks {req}, the test venv has {installed}"
        )
    for module in EXTRA_MODULES[extra]:
        importlib.import_module(module)


def test_the_builtin_extras_install_nothing():
    """Object storage lives in the native module: its extras are empty."""
    for extra in ("s3", "gcs", "azure"):
        assert EXTRAS[extra] == []
    assert Requirement(EXTRAS["all"][0]).extras == {"torch", "ray", "bf16"}
