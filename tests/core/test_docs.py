"""The tutorials' Python blocks run, in order, as a new user would paste them.

A block whose first line is ``# file: PATH`` is written to PATH (relative to a fresh
folder that is put on ``sys.path`` and ``PYTHONPATH``); every other ``python`` block is
executed in one namespace per page, in page order. ``bash``/``toml`` blocks are shown,
not run (the commands they show are tested in ``test_plugins.py``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TUTORIALS = ["adding-an-environment.md", "strategies.md", "ecosystem.md"]
#: top-level modules the tutorials write (dropped after the page so nothing leaks into other tests)
TUTORIAL_MODULES = ("arith_envs", "my_strategies", "my_skyrl_env", "vf_reverse", "coin_env", "dice_adapter",
                    "thompson_plugin", "my_pilot_commit")


def python_blocks(page: Path) -> list[str]:
    return [m.group(1) for m in BLOCK.finditer(page.read_text())]


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_blocks_run(page, tmp_path, monkeypatch, smollm2_path):
    blocks = python_blocks(DOCS / page)
    assert blocks, f"{page} has no python blocks"
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    namespace: dict = {"__name__": f"docs_{page.replace('-', '_').replace('.', '_')}"}
    ran = 0
    from registry_fixtures import registries_restored

    # the tutorials' modules and registrations must not leak into other tests
    with registries_restored(lambda name, module: name.split(".")[0] in TUTORIAL_MODULES):
        for block in blocks:
            first, _, body = block.partition("\n")
            if first.startswith("# file: "):
                path = tmp_path / first.removeprefix("# file: ").strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
                continue
            exec(compile(block, f"{page} block {ran + 1}", "exec"), namespace)
            ran += 1
    assert ran >= 1


#: a line that is one ALL_CAPS_NAME alone: a generator's placeholder left where its output belongs
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$", re.M)


def test_no_page_ships_a_placeholder():
    pages = [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]
    found = [f"{p.relative_to(DOCS.parent)}: {m.group(0)}" for p in pages for m in PLACEHOLDER.finditer(p.read_text())]
    assert not found, f"placeholders where generated text belongs: {found}"
