"""The README's Python session runs as written."""

from __future__ import annotations

import re

from conftest import REPO


def readme_python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_session_runs(tmp_path, monkeypatch):
    blocks = readme_python_blocks()
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "feature-cache" / "segments").is_dir()
    assert len(blocks) >= 2, "README.md lost its cachex.torchcachex block"
    assert list((tmp_path / "tcx-cache" / "features_v1" / "segments").glob("*.arrow"))


def test_readme_loadit_block_runs(tmp_path, monkeypatch):
    blocks = [b for b in readme_python_blocks() if "cachex.loadit" in b]
    assert len(blocks) == 1, "README.md has no cachex.loadit ```python block"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "squares-cache" / "shards" / "0.100.shard.pickle").is_file()
